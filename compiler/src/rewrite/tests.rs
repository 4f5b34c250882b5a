//! The rule table, one line per rule: `before => after`, where `after` is
//! what extraction gives after saturation. Leaves have the types of
//! [`env`].

use std::collections::HashSet;
use std::time::Duration;

use adjoint_runtime::tensor::DType;
use egg::{Extractor, RecExpr, Symbol};

use super::cost::Traffic;
use super::lang::{Meta, MetaGraph};
use super::rules::{rewrites, RULES};
use super::saturate;
use crate::infer::AbsTensor;

/// The leaves' types.
fn env() -> Vec<(&'static str, DType, &'static [usize])> {
    vec![
        ("x", DType::F32, &[4, 3]),
        ("y", DType::F32, &[4, 3]),
        ("v", DType::F32, &[3]),
        ("s", DType::F32, &[]),
        ("c", DType::Bool, &[4, 3]),
        ("i", DType::I64, &[4, 3]),
        ("t", DType::F32, &[2, 3, 4]),
        ("big", DType::F32, &[2, 4, 3]),
        ("p", DType::F32, &[5, 4]),
        ("q", DType::F32, &[3, 5]),
        ("u", DType::F32, &[8, 2]),
        ("w", DType::F32, &[2, 8]),
        ("d", DType::F64, &[4, 3]),
        ("ba", DType::F64, &[2, 5, 3]),
        ("bb", DType::F64, &[2, 3, 4]),
    ]
}

/// (rule, before, after): each rule of the table at work.
const TABLE: &[(&str, &str, &str)] = &[
    ("mul-one", "(mul x 1.0)", "x"),
    ("mul-one", "(mul x (ones_like y))", "x"),
    ("mul-one-left", "(mul 1.0 x)", "x"),
    ("div-one", "(div x 1)", "x"),
    ("sub-zero", "(sub x (zeros_like y))", "x"),
    ("mul-minus-one", "(mul x -1.0)", "(neg x)"),
    ("sub-neg", "(sub x (neg y))", "(add x y)"),
    ("add-neg", "(add x (neg y))", "(sub x y)"),
    ("mul-neg-neg", "(mul (neg x) (neg y))", "(mul x y)"),
    ("where-same", "(where c x x)", "x"),
    ("relu-relu", "(relu (relu x))", "(relu x)"),
    ("abs-neg", "(abs (neg x))", "(abs x)"),
    ("abs-abs", "(abs (abs x))", "(abs x)"),
    ("neg-neg", "(neg (neg x))", "x"),
    (
        "sum-to-broadcast",
        "(sum_to (broadcast v [4,3]) [3])",
        "(mul v 4.0)",
    ),
    (
        "sum-broadcast-scalar",
        "(sum (broadcast s [4,3]) [0,1])",
        "(mul s 12.0)",
    ),
    ("sum-to-same", "(sum_to x [4,3])", "x"),
    ("sum-to-neg", "(sum_to (neg x) [3])", "(neg (sum_to x [3]))"),
    (
        "sum-to-matmul",
        "(sum_to (matmul ba bb) [2,1,4])",
        "(matmul (sum_to ba [2,1,3]) bb)",
    ),
    (
        "sum-to-matmul",
        "(sum_to (matmul q p) [1,4])",
        "(matmul (sum_to q [1,5]) p)",
    ),
    ("sum-neg", "(sum (neg x) [0])", "(neg (sum x [0]))"),
    ("sumk-neg", "(sumk (neg x) [1])", "(neg (sumk x [1]))"),
    (
        "broadcast-unit-reshape",
        "(broadcast (reshape v [1,3]) [4,3])",
        "(broadcast v [4,3])",
    ),
    (
        "transpose-transpose",
        "(transpose (transpose x [1,0]) [1,0])",
        "x",
    ),
    (
        "transpose-transpose",
        "(transpose (transpose t [1,2,0]) [1,2,0])",
        "(transpose t [2,0,1])",
    ),
    ("transpose-identity", "(transpose x [0,1])", "x"),
    (
        "reshape-reshape",
        "(reshape (reshape x [12]) [3,4])",
        "(reshape x [3,4])",
    ),
    ("reshape-same", "(reshape x [4,3])", "x"),
    (
        "broadcast-broadcast",
        "(broadcast (broadcast v [4,3]) [2,4,3])",
        "(broadcast v [2,4,3])",
    ),
    ("broadcast-same", "(broadcast x [4,3])", "x"),
    (
        "transpose-matmul",
        "(transpose (matmul u w) [1,0])",
        "(matmul (transpose w [1,0]) (transpose u [1,0]))",
    ),
    (
        "matmul-transposes",
        "(matmul (transpose p [1,0]) (transpose q [1,0]))",
        "(transpose (matmul q p) [1,0])",
    ),
];

/// Expressions no rule may change: the identities they look like are
/// false for some IEEE values or change a type.
const UNCHANGED: &[&str] = &[
    // int · float is a float: not `i`.
    "(mul i 1.0)",
    // -0 + 0 is +0.
    "(add x 0.0)",
    "(add x (zeros_like y))",
    // x − (−0) turns −0 into +0.
    "(sub x -0.0)",
    // NaN and ±inf.
    "(mul x 0.0)",
    "(sub x x)",
    // The ones are of a larger shape: the product broadcasts.
    "(mul x (ones_like big))",
    // -(a − b) = b − a fails for a = b (+0 vs −0).
    "(neg (sub x y))",
    // A transpose of a square matrix keeps its shape, not its elements.
    "(transpose (reshape x [3,4]) [1,0])",
    // This reshape moves elements to other rows: not a broadcast.
    "(broadcast (reshape x [3,4]) [2,3,4])",
    // Summed over columns, or over the batch `bb` varies along: no
    // factor of the product is summed alone.
    "(sum_to (matmul ba bb) [2,5,1])",
    "(sum_to (matmul ba bb) [1,1,4])",
];

struct Outcome {
    best: String,
    fired: HashSet<String>,
}

fn run(expr: &str) -> Outcome {
    let mut eg = MetaGraph::default();
    for (name, d, shape) in env() {
        eg.analysis
            .leaves
            .insert(Symbol::from(name), AbsTensor::new(d, shape.to_vec(), false));
    }
    let e: RecExpr<Meta> = expr.parse().expect("the test expression parses");
    let root = eg.add_expr(&e);
    let runner = saturate(eg, &rewrites(), 10_000, 10, Duration::from_secs(10));
    let eg = &runner.egraph;
    let (_, best) = Extractor::new(eg, Traffic { egraph: eg }).find_best(root);
    let fired = runner
        .iterations
        .iter()
        .flat_map(|it| it.applied.keys().map(|s| s.to_string()))
        .collect();
    Outcome {
        best: best.to_string(),
        fired,
    }
}

#[test]
fn saturation_stops_at_its_time_limit() {
    let mut eg = MetaGraph::default();
    for (name, d, shape) in env() {
        eg.analysis
            .leaves
            .insert(Symbol::from(name), AbsTensor::new(d, shape.to_vec(), false));
    }
    let e: RecExpr<Meta> = "(transpose (transpose x [1,0]) [1,0])".parse().unwrap();
    eg.add_expr(&e);
    let runner = saturate(eg, &rewrites(), 10_000, 10, Duration::ZERO);
    assert!(
        matches!(&runner.stop_reason, Some(egg::StopReason::Other(s)) if s == "time limit"),
        "{:?}",
        runner.stop_reason
    );
    assert!(runner.iterations.len() <= 1);
}

#[test]
fn each_rule_rewrites_its_example() {
    let mut failures = Vec::new();
    for (rule, before, after) in TABLE {
        let o = run(before);
        if o.best != *after || !o.fired.contains(*rule) {
            failures.push(format!(
                "{rule}: {before} => {} (expected {after}; fired {:?})",
                o.best, o.fired
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unsound_look_alikes_are_left_alone() {
    for e in UNCHANGED {
        let o = run(e);
        assert_eq!(o.best, *e, "rules fired: {:?}", o.fired);
    }
}

#[test]
fn rule_names_are_unique_and_each_is_tested() {
    let mut seen = HashSet::new();
    for r in RULES {
        assert!(seen.insert(r.name), "rule {} twice in the table", r.name);
        assert!(
            TABLE.iter().any(|(n, _, _)| *n == r.name),
            "rule {} has no line in the test table",
            r.name
        );
    }
    for (n, _, _) in TABLE {
        assert!(seen.contains(n), "the test table names unknown rule {n}");
    }
}

#[test]
fn sum_of_broadcast_matches_the_reference_kernels() {
    // `sum-to-broadcast` in f32: the reference kernel's sum of the copies
    // and the product agree exactly.
    use adjoint_runtime::kernels;
    use adjoint_runtime::tensor::Tensor;
    use adjoint_runtime::value::Value;
    let xs: Vec<f32> = vec![0.1, -3.7, 1e-20, 123456.79, f32::MAX / 8.0, 7.0 / 3.0];
    let x = Tensor::from_vec(xs.clone(), &[6]).unwrap();
    let shape = Value::tuple(vec![
        Value::Tensor(Tensor::weak_i64(7)),
        Value::Tensor(Tensor::weak_i64(6)),
    ]);
    struct Nothing(std::io::Sink);
    impl kernels::Ctx for Nothing {
        fn call(&mut self, _: &Value, _: &[Value]) -> Result<Value, adjoint_runtime::RtError> {
            unreachable!()
        }
        fn stdout(&mut self) -> &mut dyn std::io::Write {
            &mut self.0
        }
    }
    let mut cx = Nothing(std::io::sink());
    let b = kernels::lookup("broadcast_to").unwrap()(&mut cx, &[Value::Tensor(x.clone()), shape])
        .unwrap();
    let s = kernels::lookup("sum_to").unwrap()(&mut cx, &[b, Value::Tensor(x.clone())]).unwrap();
    let Value::Tensor(s) = s else {
        panic!("a tensor")
    };
    let got = s.slice::<f32>().unwrap().to_vec();
    let want: Vec<f32> = xs.iter().map(|v| v * 7.0).collect();
    assert_eq!(got, want);
}

/// Whole programs through the pipeline: the rewrites run after the
/// optimiser, and what the program prints does not change.
mod programs {
    use crate::lower::SourceLoader;
    use crate::pipeline::{Mode, Program};
    use adjoint_lang::SourceMap;

    struct NoFiles;
    impl SourceLoader for NoFiles {
        fn load(&self, _: &std::path::Path) -> std::io::Result<String> {
            Err(std::io::ErrorKind::NotFound.into())
        }
    }

    fn load(src: &str) -> Program {
        let mut sources = SourceMap::new();
        let root = sources.add_file("t.adj", src);
        Program::load(&mut sources, root, None, &NoFiles).unwrap_or_else(|d| panic!("{d:?}"))
    }

    fn run(p: &Program, mode: Mode) -> String {
        let mut out = Vec::new();
        p.run_main(mode, &mut out)
            .unwrap_or_else(|d| panic!("{d:?}"));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn rules_fire_in_a_program_and_values_stay() {
        let p = load(
            "fn main() {
    let x = randn([64, 48], seed = 1);
    let y = transpose(transpose(x)) * 1.0;
    let z = -(-(y / 1.0));
    print(sum(z, axis = 0)[3], sum(x - -z));
}
",
        );
        let main = p.function("main").unwrap();
        let (m, stats) = p.optimized(&[main]);
        let rw = stats.rewrite.expect("the rewrites ran");
        let fired: Vec<&str> = rw
            .graphs
            .iter()
            .flat_map(|g| g.fired.iter().map(|f| f.0))
            .collect();
        for r in [
            "transpose-transpose",
            "mul-one",
            "div-one",
            "neg-neg",
            "sub-neg",
        ] {
            assert!(fired.contains(&r), "{r} did not fire: {:?}", rw.describe());
        }
        let ir = crate::ir::print::print_module(&m, &[main], None);
        for gone in ["transpose(", "neg(", "div("] {
            assert!(!ir.contains(gone), "{gone} left in\n{ir}");
        }
        assert_eq!(run(&p, Mode::Graph), run(&p, Mode::Eager));
    }

    #[test]
    fn the_mlp_training_step_is_rewritten() {
        let p = load(&format!(
            "{}\nfn main() {{ run(2) }}\n",
            include_str!("../../../benches/programs/mlp.adj")
        ));
        let main = p.function("main").unwrap();
        let (_, stats) = p.optimized(&[main]);
        let rw = stats.rewrite.expect("the rewrites ran");
        let lines = rw.describe();
        // The graph holding the training step: the loop body, or `main`
        // when the optimiser unrolled the two iterations there.
        let body = rw
            .graphs
            .iter()
            .max_by_key(|g| g.region)
            .expect("a rewritten graph");
        // The training step's tensor code is lowered; the loss's
        // derivative negates cotangents before summing them down.
        assert!(body.region > 50, "{lines:?}");
        assert!(body.fired.iter().any(|f| f.0 == "sum-to-neg"), "{lines:?}");
        assert!(body.replaced > 0, "{lines:?}");
    }
}
