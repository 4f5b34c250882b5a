//! Graph mode's optimiser on whole programs: statically controlled
//! gradients become one first-order graph of primitives, and graph mode
//! prints what eager mode prints (to rounding where a kernel adds in
//! another order).

use adjoint::{Mode, Session, SessionError};

/// An MLP's loss and its gradient over a parameter record, as in the
/// digits example (smaller shapes).
const MLP: &str = "\
fn loss(p, x, y) {
    let h = relu(x @ p.w1 + p.b1);
    let h2 = relu(h @ p.w2 + p.b2);
    let logits = h2 @ p.w3 + p.b3;
    let m = max(logits, axis = 1, keepdims = true);
    let lse = log(sum(exp(logits - m), axis = 1, keepdims = true)) + m;
    -mean(sum((logits - lse) * y, axis = 1))
}
fn main() {
    let p = {w1: randn((64, 32), seed = 1) * 0.1, b1: zeros((32,)),
             w2: randn((32, 32), seed = 2) * 0.1, b2: zeros((32,)),
             w3: randn((32, 10), seed = 3) * 0.1, b3: zeros((10,))};
    let x = rand((16, 64), seed = 4);
    let y = one_hot(i64(rand((16,), seed = 5) * 10.0), 10);
    let (l, g) = value_and_grad(loss)(p, x, y);
    print(l, sum(g.w1), sum(g.b1), sum(g.w2), sum(g.b2), sum(g.w3), sum(g.b3));
}
";

fn run(mode: Mode, src: &str) -> String {
    let s = Session::new(mode).load_source("mlp.adj", src).unwrap();
    let mut out = Vec::new();
    s.run_main(&mut out)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    String::from_utf8(out).unwrap()
}

/// Runs `main` of `src` in `mode`: what it printed, and the run's
/// statistics.
fn run_with_stats(mode: Mode, src: &str) -> (String, adjoint::RunStats) {
    let s = Session::new(mode).load_source("loop.adj", src).unwrap();
    let mut out = Vec::new();
    let stats = s
        .run_main_with_stats(&mut out)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    (String::from_utf8(out).unwrap(), stats)
}

/// Runs `main` of `src` (loaded as `name`), which must fail: what it
/// printed first, and the error.
fn run_failing(mode: Mode, name: &str, src: &str) -> (String, SessionError) {
    let s = Session::new(mode).load_source(name, src).unwrap();
    let mut out = Vec::new();
    let err = s.run_main(&mut out).unwrap_err();
    (String::from_utf8(out).unwrap(), err)
}

/// The optimised IR of `main` of `src` (loaded as `name`).
/// The kernels graph mode compiles for `main` of `src`.
fn kernels_of(name: &str, src: &str) -> String {
    Session::new(Mode::Graph)
        .load_source(name, src)
        .unwrap()
        .emit_kernels("main")
        .unwrap()
}

fn opt_ir(name: &str, src: &str) -> String {
    let s = Session::new(Mode::Graph).load_source(name, src).unwrap();
    s.emit_opt(Some("main")).unwrap()
}

/// The optimised IR of `main`, checked to be one graph with none of AD's
/// machinery (nor the extra names in `gone`) left.
fn assert_closure_free(name: &str, src: &str, gone: &[&str]) -> String {
    let ir = opt_ir(name, src);
    let graphs = ir.lines().filter(|l| l.starts_with("graph ")).count();
    assert_eq!(graphs, 1, "{ir}");
    let machinery = ["J.", "B.", "env_", "is_zero", "switch", "zero()", "gadd"];
    for g in machinery.iter().chain(gone) {
        assert!(!ir.contains(g), "`{g}` left in\n{ir}");
    }
    ir
}

#[test]
fn mlp_gradient_optimises_to_one_closure_free_graph() {
    let ir = assert_closure_free(
        "mlp.adj",
        MLP,
        &["record_grad", "grad_finalize", "= shape(", "tuple_len"],
    );
    // The three weight gradients are matrix products.
    assert!(ir.matches("matmul(").count() >= 3 + 5, "{ir}");
}

#[test]
fn mlp_graph_and_eager_agree() {
    let g = run(Mode::Graph, MLP);
    let e = run(Mode::Eager, MLP);
    // To f32 rounding: the softmax's gradient and its sum over the batch
    // (the last bias's gradient) are one kernel, whose f32 sums add in
    // f32 where the reference kernels add in f64. The bias gradients'
    // sums nearly cancel (about 1e-7 against terms near 1).
    assert_close(&g, &e, 1e-5);
    assert!(g.split_whitespace().count() == 7, "{g}");
}

/// ADBench's GMM objective from `examples/gmm.adj`, with inputs of known
/// shapes (d = 3, K = 4, n = 50) made in the program.
fn gmm_program() -> String {
    let example = include_str!("../examples/gmm.adj");
    let functions = example.split("fn main()").next().unwrap();
    format!(
        "{functions}
fn main() {{
    let alphas = randn((4,), seed = 1, dtype = f64);
    let means = randn((4, 3), seed = 2, dtype = f64);
    let icf = randn((4, 6), seed = 3, dtype = f64) * 0.3;
    let x = randn((50, 3), seed = 4, dtype = f64);
    let (v, g) = value_and_grad(gmm_objective, argnums = (0, 1, 2))(alphas, means, icf, x, 1.0, 0.0);
    print(v, sum(g.0), sum(g.1), sum(g.2));
}}
"
    )
}

#[test]
fn gmm_gradient_optimises_to_one_closure_free_graph() {
    let src = gmm_program();
    assert_closure_free("gmm.adj", &src, &["tuple_grad"]);
    // Chains of three or more element-wise operations are fused kernels
    // even over these small shapes; their `exp` and fused multiply-adds
    // round differently from eager mode's operations, within the parity
    // tolerance.
    assert_close(&run(Mode::Graph, &src), &run(Mode::Eager, &src), 1e-10);
}

/// One SGD step of a ReLU network, large enough for kernels: the dense
/// layers' bias and ReLU become GEMM epilogues, the relu
/// derivatives (`where` of a comparison) and the SGD update (`tree_map`)
/// become fused kernels, the products of transposes read their operand in
/// place, and nothing changes in what is printed.
const TRAIN_STEP: &str = "\
fn loss(p, x, y) {
    let h = relu(x @ p.l1.w + p.l1.b);
    let h2 = relu(h @ p.l2.w + p.l2.b);
    let logits = h2 @ p.l3.w + p.l3.b;
    cross_entropy(logits, y)
}
fn main() {
    let p = {l1: {w: randn((96, 80), seed = 1) * 0.1, b: zeros((80,))},
             l2: {w: randn((80, 72), seed = 2) * 0.1, b: zeros((72,))},
             l3: {w: randn((72, 10), seed = 3) * 0.1, b: zeros((10,))}};
    let x = rand((64, 96), seed = 4);
    let y = i64(floor(rand((64,), seed = 5) * 10.0));
    let (l, g) = value_and_grad(loss)(p, x, y);
    let q = tree_map(|w, dw| w - 0.1 * dw, p, g);
    print(l, sum(q.l1.w), sum(q.l1.b), sum(q.l2.w), sum(q.l2.b), sum(q.l3.w), sum(q.l3.b));
}
";

#[test]
fn a_training_step_runs_in_kernels() {
    let s = Session::new(Mode::Graph)
        .load_source("step.adj", TRAIN_STEP)
        .unwrap();
    let ir = s.emit_opt(Some("main")).unwrap();
    assert!(!ir.contains("tree_map("), "{ir}");
    let kernels = s.emit_kernels("main").unwrap();
    for k in [
        // The dense layers' bias and ReLU run in the product's kernel (the
        // sum before the ReLU is an output too: its derivative uses it).
        "epilogue relu(matmul[a, b] + bias): 3 inputs, 2 outputs",
        // The ReLU's derivative masks the gradient, which the weights'
        // product reads and the bias's gradient sums: one pass.
        "fused[where,sum_to] over [64, 80] f32, then sum over [0]: 2 inputs, 2 outputs",
        "fused[mul,sub,sum] over [96, 80] f32",
        "matmul[mT(a), b]",
        "matmul[a, mT(b)]",
    ] {
        assert!(kernels.contains(k), "no `{k}` in\n{kernels}");
    }
    // Fused f32 reductions accumulate in f32, the reference kernels in f64.
    assert_close(
        &run(Mode::Graph, TRAIN_STEP),
        &run(Mode::Eager, TRAIN_STEP),
        1e-5,
    );
}

/// A value that a reduction reads and that is needed elsewhere too is
/// written by the reduction's kernel as a side output, in the same pass;
/// a reduction to one element keeps its own kernel.
#[test]
fn reductions_write_the_values_others_need_as_side_outputs() {
    let src = "
fn main() {
    let x = rand((64, 80), seed = 1) - 0.5;
    let y = rand((64, 80), seed = 2);
    let w = rand((64, 8), seed = 3);
    let d = (x * y + 0.25) * x;
    let cols = sum(d, axis = 0);
    let p = matmul(transpose(d), w);
    let rows = sum(d * y, axis = 1);
    let total = sum(d * w[:, 0:1]);
    print(sum(cols * cols), sum(p), sum(rows), d[3, 5], total);
}
";
    let s = Session::new(Mode::Graph)
        .load_source("side.adj", src)
        .unwrap();
    let kernels = s.emit_kernels("main").unwrap();
    // `d` feeds the product and the column sums: one kernel writes both.
    assert!(
        kernels.contains(
            "fused[sub,mul,add,mul,sum] over [64, 80] f32, then sum over [0]: 2 inputs, 2 outputs"
        ),
        "{kernels}"
    );
    // The total over every element reads `d` from memory.
    assert!(kernels.contains("then sum over [0, 1]"), "{kernels}");
    // f32 sums add in f32 in kernels, in f64 in the reference kernels.
    assert_close(&run(Mode::Graph, src), &run(Mode::Eager, src), 1e-5);
}

/// Two lines of numbers that agree to a relative `tol`.
fn assert_close(a: &str, b: &str, tol: f64) {
    let nums = |s: &str| -> Vec<f64> { s.split_whitespace().map(|w| w.parse().unwrap()).collect() };
    let (x, y) = (nums(a), nums(b));
    assert_eq!(x.len(), y.len(), "{a} vs {b}");
    for (p, q) in x.iter().zip(&y) {
        assert!((p - q).abs() <= tol * q.abs().max(1.0), "{a} vs {b}");
    }
}

/// A writer for kernels called directly.
struct NoCtx(Vec<u8>);

impl adjoint_runtime::Ctx for NoCtx {
    fn call(
        &mut self,
        _: &adjoint::Value,
        _: &[adjoint::Value],
    ) -> Result<adjoint::Value, adjoint_runtime::RtError> {
        unreachable!()
    }
    fn stdout(&mut self) -> &mut dyn std::io::Write {
        &mut self.0
    }
}

/// Saves `x` as an .npy file at `path`.
fn save(path: &std::path::Path, x: adjoint_runtime::Tensor) {
    let save = adjoint_runtime::lookup("save_npy").unwrap();
    let p = path.to_str().unwrap();
    save(
        &mut NoCtx(Vec::new()),
        &[adjoint::Value::Io, adjoint::Value::str(p), x.into()],
    )
    .unwrap();
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("adjoint-graph-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Graph mode specialises a program to the shapes of the .npy files it
/// loads (read from their headers), so loaded data is fused too.
#[test]
fn loaded_data_is_specialised_to_its_shape() {
    let d = temp_dir("load");
    let path = d.join("x.npy");
    let data: Vec<f64> = (0..64 * 80).map(|i| (i % 17) as f64 * 0.25 - 2.0).collect();
    save(
        &path,
        adjoint_runtime::Tensor::from_vec(data, &[64, 80]).unwrap(),
    );
    let src = format!(
        "fn main() {{\n    let x = load_npy({:?});\n    let y = tanh(2.0 * x + 1.0) - x / 3.0;\n    print(y[3, 7], sum(y, axis = 1)[5]);\n}}\n",
        path.display().to_string()
    );
    let s = Session::new(Mode::Graph)
        .load_source("l.adj", &src)
        .unwrap();
    let kernels = s.emit_kernels("main").unwrap();
    assert!(
        kernels.contains("fused[mul,add,tanh,div,sub,sum] over [64, 80] f64"),
        "{kernels}"
    );
    // The fused sum adds in another order.
    assert_close(&run(Mode::Graph, &src), &run(Mode::Eager, &src), 1e-12);
    let _ = std::fs::remove_dir_all(&d);
}

/// IO elsewhere in a program does not change how its loads compile (issue
/// 23 #10): a training loop over loaded data followed by a checkpoint
/// `save_npy` gets the same fused kernels as without the save. A load of
/// a path the program may write (here through a helper, so any literal
/// it is given) is not specialised, so loading what it wrote is right.
#[test]
fn io_after_a_training_loop_keeps_loads_specialised() {
    let d = temp_dir("io");
    let path = d.join("x.npy");
    let data: Vec<f64> = (0..64 * 80).map(|i| (i % 13) as f64 * 0.1 - 0.6).collect();
    save(
        &path,
        adjoint_runtime::Tensor::from_vec(data, &[64, 80]).unwrap(),
    );
    let out = d.join("w.npy");
    let program = |tail: &str| {
        format!(
            "fn loss(w, x) = sum(tanh(x * w + 1.0) * x)\n\
             fn main() {{\n\
             \x20   let x = load_npy({:?});\n\
             \x20   let mut w = f64(ones((80,))) * 0.5;\n\
             \x20   for i in 0..3 {{ w = w - 0.01 * grad(loss)(w, x); }}\n\
             \x20   print(sum(w));\n{tail}}}\n",
            path.display().to_string()
        )
    };
    let plain = program("");
    let saving = program(&format!(
        "    save_npy({:?}, w);\n",
        out.display().to_string()
    ));
    let kernels = |src: &str| {
        Session::new(Mode::Graph)
            .load_source("io.adj", src)
            .unwrap()
            .emit_kernels("main")
            .unwrap()
    };
    let (k_plain, k_saving) = (kernels(&plain), kernels(&saving));
    assert!(k_plain.contains("over [64, 80] f64"), "{k_plain}");
    // The loop's kernels are the same; only the last update, which the
    // save also reads, is no longer fused into `print`'s sum.
    let over_data = |k: &str| -> Vec<String> {
        k.lines()
            .filter(|l| l.contains("over [64, 80]"))
            .map(String::from)
            .collect()
    };
    assert_eq!(over_data(&k_plain).len(), 9, "{k_plain}");
    assert_eq!(over_data(&k_plain), over_data(&k_saving));
    assert_close(&run(Mode::Graph, &saving), &run(Mode::Eager, &plain), 1e-12);
    assert!(out.exists());

    // A helper may write any path it is given: the load of the path it
    // wrote reads the new [2] file, not the [64, 80] one compilation saw.
    let p = path.display().to_string();
    let rewrite = format!(
        "fn put(p, v) = save_npy(p, v)\n\
         fn main() {{\n\
         \x20   let x = load_npy({p:?});\n\
         \x20   put({p:?}, [sum(x), 1.0]);\n\
         \x20   let y = load_npy({p:?});\n\
         \x20   print(y * 2.0);\n}}\n"
    );
    let got = run(Mode::Graph, &rewrite);
    assert!(got.ends_with(", 2.0]\n"), "{got}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The data a program was specialised to is checked when it is loaded: a
/// file whose shape changed since compilation is an error, not wrong
/// results.
#[test]
fn a_load_that_changed_since_compilation_is_an_error() {
    use adjoint_compiler::pipeline::{Mode as M, Program};
    struct Files;
    impl adjoint_compiler::lower::SourceLoader for Files {
        fn load(&self, path: &std::path::Path) -> std::io::Result<String> {
            std::fs::read_to_string(path)
        }
    }
    let d = temp_dir("check");
    let path = d.join("x.npy");
    save(
        &path,
        adjoint_runtime::Tensor::from_vec(vec![1.0f64; 6], &[2, 3]).unwrap(),
    );
    let p = path.display().to_string();
    let src = format!("fn main() {{\n    let x = load_npy({p:?});\n    print(sum(x * 2.0));\n}}\n");
    let mut sources = adjoint_lang::SourceMap::new();
    let root = sources.add_file("c.adj", src);
    let mut program = Program::load(&mut sources, root, None, &Files).unwrap();
    // The compiler is told the file holds f64[4, 5]; it holds f64[2, 3].
    program.set_npy_types(Box::new(|_| {
        Some((adjoint_runtime::DType::F64, vec![4, 5]))
    }));
    let ex = program.prepare_main(M::Graph).unwrap();
    let mut out = Vec::new();
    let err = program.execute_main(&ex, &mut out).unwrap_err();
    assert!(
        err[0]
            .message
            .contains("holds f64[2, 3] now, but f64[4, 5] when the program was compiled"),
        "{}",
        err[0].message
    );
    // Told the truth, it runs.
    let mut program = Program::load(&mut sources, root, None, &Files).unwrap();
    program.set_npy_types(Box::new(|_| {
        Some((adjoint_runtime::DType::F64, vec![2, 3]))
    }));
    let ex = program.prepare_main(M::Graph).unwrap();
    let mut out = Vec::new();
    program.execute_main(&ex, &mut out).unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), "12.0\n");
    let _ = std::fs::remove_dir_all(&d);
}

/// A network whose layers are applied by a loop with a static trip count,
/// and a recursive helper on a constant depth: both are unrolled, and the
/// gradient through them (with the reverse-mode stack the loop threads)
/// becomes one closure-free graph.
const UNROLLED: &str = "\
fn power(x, n) = if n == 0 { 1.0 } else { x * power(x, n - 1) }
fn loss(w, x) {
    let mut h = x;
    for i in 0..4 {
        h = tanh(h @ w + 0.1);
    }
    sum(h * h) + power(sum(w), 3)
}
fn main() {
    let w = randn((8, 8), seed = 1) * 0.3;
    let x = rand((5, 8), seed = 2);
    let (l, g) = value_and_grad(loss)(w, x);
    print(l, sum(g), sum(g * g));
}
";

#[test]
fn loops_with_static_trip_counts_unroll_to_a_closure_free_graph() {
    let ir = assert_closure_free(
        "unrolled.adj",
        UNROLLED,
        &["unwind", "ad_hide", "tuple_len"],
    );
    // Four forward products and, for each, two in the backward pass.
    assert!(ir.matches("matmul(").count() >= 4 + 4, "{ir}");
    assert_eq!(run(Mode::Graph, UNROLLED), run(Mode::Eager, UNROLLED));
}

/// A trip count beyond the unrolling limit keeps the loop.
#[test]
fn long_loops_stay_loops() {
    let src = UNROLLED.replace("0..4", "0..100");
    let ir = opt_ir("long.adj", &src);
    assert!(ir.contains("unwind"), "{ir}");
    assert_eq!(run(Mode::Graph, &src), run(Mode::Eager, &src));
}

/// A recursive higher-order function called with a known function is
/// specialised on it: the copy calls `step` directly (then inlines it), in
/// the forward pass and in the gradient's.
#[test]
fn recursion_specialises_on_a_function_argument() {
    let src = "\
fn fold(f, acc, n) = if n == 0 { acc } else { fold(f, f(acc), n - 1) }
fn step(x) = sin(x) * x + 0.5
fn run(x) = fold(step, x, 100)
fn main() {
    print(run(0.3), grad(run)(0.3));
}
";
    let ir = opt_ir("fold.adj", src);
    assert!(ir.contains("graph @\"fold[step]\"("), "{ir}");
    assert!(ir.contains("graph @\"J.fold[J.step]\"("), "{ir}");
    // No call of the function parameter is left.
    assert!(!ir.contains("@fold("), "{ir}");
    assert!(!ir.contains("@step("), "{ir}");
    assert_eq!(run(Mode::Graph, src), run(Mode::Eager, src));
}

/// Loops over scalars: a `while` carrying a tuple of f32, i64 and bool
/// values with an `if` inside, a nested counted loop, casts and a float
/// `maximum`; and recursion that needs a stack (`fib`).
const SCALAR_LOOPS: &str = "\
fn inner(x, n) {
    let mut y = x;
    for j in 0..n {
        y = y * 0.5 + f32(j);
    }
    y
}
fn walk(x0, steps) {
    let mut x = x0;
    let mut k = 0;
    let mut flips = 0;
    let mut up = true;
    while k < steps {
        if up {
            x = maximum(x * 1.5 - 0.25, inner(x, 3));
        } else {
            x = where(x > 0.0, sin(x), -x) + f32(k) / 100.0;
            flips = flips + 1;
        }
        up = x < 2.0;
        k = k + 1;
    }
    (x, flips, up)
}
fn fib(n) = if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
fn count(n) {
    let mut s = 0;
    let mut i = 0;
    while i < n {
        s = s + i;
        i = i + 1;
    }
    s
}
fn main() {
    print(walk(f32(0.1), 50));
    print(walk(f32(3.0), 7));
    print(fib(15));
    print(count(1000000));
    let mut a = 1.0;
    let mut n = 0;
    while a < 1000.0 {
        a = a * 1.5 + 0.25;
        n = n + 1;
    }
    print(a, n);
}
";

#[test]
fn scalar_loops_compile_to_native_code() {
    let s = Session::new(Mode::Graph)
        .load_source("loops.adj", SCALAR_LOOPS)
        .unwrap();
    let kernels = s.emit_kernels("main").unwrap();
    // Both calls of `walk` run its loop (with the inner loop) natively,
    // and `count` too; `fib` recurses through non-tail calls and stays
    // with the VM. The loop in `main` carries the IO token: it runs
    // natively up to its exit, and the VM prints.
    assert_eq!(kernels.matches("scalar loop over").count(), 4, "{kernels}");
    assert!(kernels.contains("then @main.after on the VM"), "{kernels}");
    assert!(
        kernels.contains("scalar loop over f32, i64, i64, bool"),
        "{kernels}"
    );
    assert!(!kernels.contains("@fib"), "{kernels}");
    // The same bits as the VM's reference kernels.
    let graph = run(Mode::Graph, SCALAR_LOOPS);
    assert_eq!(graph, run(Mode::Eager, SCALAR_LOOPS));
    let lines: Vec<&str> = graph.lines().collect();
    assert_eq!(lines[2], "610");
    assert_eq!(lines[3], "499999500000");
    assert_eq!(lines[4], "1477.3918800354004 17");
}

/// A reversed loop's backpropagators keep only the forward values they
/// compute with: operands read only for their type (the loop counter for
/// `sum_to`, the step's result) are constants in the optimised program.
#[test]
fn reversed_loop_backpropagators_capture_only_what_they_use() {
    const SRC: &str = "\
fn iterate(x, steps) {
    let mut x = x;
    for i in 0..steps {
        x = sin(x) * x + 0.5;
    }
    x
}
fn main() {
    print(grad(iterate)(0.3, 1000));
}
";
    let ir = opt_ir("loop.adj", SRC);
    let shape_reads: Vec<&str> = ir
        .lines()
        .filter(|l| l.contains("sum_to(") || l.contains("grad_finalize("))
        .filter(|l| {
            // The second operand is a node (`%n`), not a constant.
            let args = &l[l.find('(').unwrap() + 1..];
            args.split(", ").nth(1).is_some_and(|a| a.starts_with('%'))
        })
        .collect();
    assert!(shape_reads.is_empty(), "{shape_reads:?}\n{ir}");
    assert_eq!(run(Mode::Graph, SRC), run(Mode::Eager, SRC));
}

/// Loops over scalars differentiated whole: reverse mode's stack of
/// closures becomes a tape that a native forward loop records and a
/// native backward loop pops (`fuse::reverse`), for loops that use the
/// enclosing function's parameters (their cotangents come back through
/// the environment), loops that leave early, and f32 loops.
const REVERSED_LOOPS: &str = "\
fn iterate(x, steps) {
    let mut x = x;
    for i in 0..steps {
        x = sin(x) * x + 0.5;
    }
    x
}
fn decay(x, a, n) {
    let mut s = 0.0;
    let mut y = x;
    for i in 0..n {
        y = y * a + 0.1 * sin(y);
        s = s + y * y;
    }
    s
}
fn until(x) {
    let mut y = x;
    let mut k = 0;
    while y < 100.0 {
        if k < 3 { y = y * 1.5 + 1.0; } else { y = exp(y * 0.1) + y; }
        k += 1;
    }
    y
}
fn small(x) {
    let mut y = x;
    for i in 0..50 {
        y = tanh(y) * f32(1.1) + f32(0.01);
    }
    y
}
fn main() {
    let n = 20;
    print(grad(iterate)(0.3, n));
    let h = 1e-6;
    print((iterate(0.3 + h, n) - iterate(0.3 - h, n)) / (2.0 * h));
    let (gx, ga) = grad(decay, argnums = (0, 1))(0.5, 0.9, 200);
    print(gx, ga);
    print((decay(0.5 + h, 0.9, 200) - decay(0.5 - h, 0.9, 200)) / (2.0 * h),
          (decay(0.5, 0.9 + h, 200) - decay(0.5, 0.9 - h, 200)) / (2.0 * h));
    print(grad(until)(0.7));
    print((until(0.7 + h) - until(0.7 - h)) / (2.0 * h));
    print(grad(small)(f32(0.2)));
}
";

#[test]
fn scalar_loop_gradients_run_natively_from_a_tape() {
    let s = Session::new(Mode::Graph)
        .load_source("reversed.adj", REVERSED_LOOPS)
        .unwrap();
    let kernels = s.emit_kernels("main").unwrap();
    // Every gradient's loop: one kernel records, one reverses.
    for f in ["iterate", "decay", "until", "small"] {
        let has = |head: &str, tail: &str| {
            kernels
                .lines()
                .any(|l| l.contains(head) && l.contains(tail))
        };
        assert!(
            has(&format!("scalar loop @J.{f}."), "recording its tape"),
            "{f}: {kernels}"
        );
        assert!(
            has(&format!("reverse of scalar loop @J.{f}."), "from its tape"),
            "{f}: {kernels}"
        );
    }
    assert_eq!(
        kernels.matches("reverse of scalar loop").count(),
        4,
        "{kernels}"
    );
    let graph = run(Mode::Graph, REVERSED_LOOPS);
    let eager = run(Mode::Eager, REVERSED_LOOPS);
    let nums = |out: &str| -> Vec<f64> {
        out.split_whitespace()
            .map(|w| w.parse::<f64>().unwrap())
            .collect()
    };
    let (g, e) = (nums(&graph), nums(&eager));
    assert_eq!(g.len(), 9, "{graph}");
    // Graph mode agrees with eager mode's closures...
    for (a, b) in g.iter().zip(&e) {
        assert!(
            (a - b).abs() <= 1e-10 * b.abs().max(1e-300),
            "{graph}\nvs\n{eager}"
        );
    }
    // ... and with finite differences.
    let close = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol * b.abs().max(1.0);
    assert!(close(g[0], g[1], 1e-5), "{graph}");
    assert!(
        close(g[2], g[4], 1e-5) && close(g[3], g[5], 1e-5),
        "{graph}"
    );
    assert!(close(g[6], g[7], 1e-5), "{graph}");
    assert!(g[8].is_finite() && g[8] != 0.0, "{graph}");
}

/// Graph mode lambda-lifts the graphs that are only called (a loop's
/// header, body and exit, `unwind`'s two branches, the branches of the
/// backpropagators' zero tests), and keeps reverse mode's stack of
/// backpropagators as a tape: each iteration of a loop over tensors
/// appends the values its backward step reads to one buffer, and the
/// backward loop runs each record from there, so the gradient makes no
/// closure per iteration, where eager mode makes several. Both print the
/// same.
#[test]
fn loops_over_tensors_save_their_values_on_a_tape() {
    const SRC: &str = "\
fn iterate(x, n) {
    let mut y = x;
    let mut i = 0;
    while i < n {
        y = sin(y) * y + 0.5;
        i = i + 1;
    }
    sum(y)
}
fn main() {
    let x = randn([4], seed = 1) * 0.5;
    print(grad(iterate)(x, 500));
}
";
    let closures = |mode: Mode| {
        let (out, stats) = run_with_stats(mode, SRC);
        (out, stats.closures_made)
    };
    let (graph_out, graph) = closures(Mode::Graph);
    let (eager_out, eager) = closures(Mode::Eager);
    let plain = |s: &str| s.replace(['[', ']', ','], " ");
    assert_close(&plain(&graph_out), &plain(&eager_out), 1e-10);
    assert!(graph < 10, "graph mode made {graph} closures");
    assert!(eager >= 4 * 500, "eager mode made {eager} closures");
}

/// A backpropagator that unwinds a tape may run more than once, and a
/// loop's forward pass may be run again from a shorter stack: popping
/// leaves the tape as it was, and a push onto a stack that is not the top
/// of its buffer copies it. `vjp`'s pullback of a loop over tensors,
/// called with two cotangents, gives what eager mode gives for each.
#[test]
fn a_tape_can_be_unwound_twice() {
    const SRC: &str = "\
fn iterate(x, n) {
    let mut y = x;
    for i in 0..n {
        y = y + 0.1 * tanh(y) * exp(-y * y);
    }
    y
}
fn main() {
    let x = randn([5], seed = 3);
    let (y, back) = vjp(iterate, x, 50);
    let (a, _) = back(ones_like(y));
    let (b, _) = back(y * 2.0);
    let (c, _) = back(ones_like(y));
    print(a);
    print(b);
    print(c);
    print(sum(a - c));
}
";
    let graph = run(Mode::Graph, SRC);
    let eager = run(Mode::Eager, SRC);
    let plain = |s: &str| s.replace(['[', ']', ','], " ");
    assert_close(&plain(&graph), &plain(&eager), 1e-5);
    let lines: Vec<&str> = graph.lines().collect();
    assert_eq!(lines[0], lines[2], "the same cotangent twice: {graph}");
    assert_ne!(lines[0], lines[1], "{graph}");
}

/// Two loops for the tape-sizing tests: one counts to a bound computed at
/// run time, the other's end depends on its data. `OUT` is what they return.
const COUNTING_LOOPS: &str = "\
fn counted(x, n) {
    let mut y = x;
    for i in 0..n {
        y = y * 0.9999 + sin(y) * 0.0001;
    }
    OUT
}
fn open_ended(x, n) {
    let mut y = x;
    let mut i = 0;
    while i * 2 < n {
        y = y * 0.9999 + sin(y) * 0.0001;
        i = i + 1;
    }
    OUT
}
fn float_counter(x, n) {
    let mut y = x;
    let mut t = 0.5;
    let m = f64(n);
    while t < m {
        y = y * 0.9999 + sin(y) * 0.0001;
        t = t + 1;
    }
    OUT
}
";

/// Reverse mode's tape is made long enough from the start when the loop
/// counts up to a bound known at the call (`for i in 0..n`, `n` computed
/// at run time): the recording loop never grows it. A loop whose end
/// depends on its data starts small and grows.
#[test]
fn a_counting_loop_sizes_its_tape_from_its_trip_count() {
    let src = COUNTING_LOOPS.replace("OUT", "y")
        + "fn main() {
    let n = 19000 + i64(sum(rand([2], seed = 1)) * 1000.0);
    print(grad(F)(0.3, n));
}
";
    use adjoint_compiler::scalar::native::tape_growths;
    let growths = |f: &str| {
        let src = src.replace("grad(F)", &format!("grad({f})"));
        let s = Session::new(Mode::Graph)
            .load_source("loop.adj", &src)
            .unwrap();
        let kernels = s.emit_kernels("main").unwrap();
        assert!(kernels.contains("recording its tape"), "{kernels}");
        let before = tape_growths();
        let out = run(Mode::Graph, &src);
        assert_close(&out, &run(Mode::Eager, &src), 1e-10);
        tape_growths() - before
    };
    assert_eq!(growths("counted"), 0);
    assert!(growths("open_ended") > 0);
}

/// The same for loops over tensors, whose tape the VM keeps (tensors too
/// large to run natively lane by lane): a counting
/// loop starts on a tape with room for all its trips, so the first
/// evaluation never grows it, and makes no closure.
#[test]
fn a_counting_tensor_loop_sizes_its_tape_from_its_trip_count() {
    let src = COUNTING_LOOPS.replace("OUT", "sum(y)")
        + "fn main() {
    let n = 3000 + i64(sum(rand([2], seed = 1)) * 1000.0);
    print(grad(F)(randn([600], seed = 2), n));
}
";
    use adjoint_runtime::tape::tape_growths;
    let growths = |f: &str| {
        let src = src.replace("grad(F)", &format!("grad({f})"));
        let before = tape_growths();
        let (out, stats) = run_with_stats(Mode::Graph, &src);
        let grew = tape_growths() - before;
        assert_eq!(stats.closures_made, 0, "{f}");
        let plain = |s: &str| s.replace(['[', ']', ','], " ");
        assert_close(&plain(&out), &plain(&run(Mode::Eager, &src)), 1e-5);
        grew
    };
    assert_eq!(growths("counted"), 0);
    assert!(growths("open_ended") > 0);
    // A float counter stepped by 1 is sized the same way.
    assert_eq!(growths("float_counter"), 0);
}

/// Loops that divide integers (`/` rounds toward zero, `%` keeps the
/// dividend's sign, `MIN / -1` wraps) or raise them to powers (wrapping)
/// compile to native code and give eager mode's values; a division by
/// zero or a negative exponent inside one stops the run with eager mode's
/// message, at the loop.
#[test]
fn integer_division_and_powers_in_native_loops() {
    const SRC: &str = "\
fn collatz(n) {
    let mut x = n;
    let mut steps = 0;
    while x != 1 {
        x = if x % 2 == 0 { x / 2 } else { 3 * x + 1 };
        steps += 1;
    }
    steps
}
fn mix(a, b, n) {
    let mut s = 0;
    for i in 0..n {
        s = s + (a - i) / b + (a - 3 * i) % b + (-9223372036854775807 - 1) / (i - i - 1) % 7;
    }
    s
}
fn divide_down(x, n) {
    let mut s = 0;
    for i in 0..n {
        s = s + x / (n - 1 - i);
    }
    s
}
fn powers(n) {
    let mut s = 0;
    for i in 0..n {
        s = s + i ** 2 - (i - 7) ** 3 + 3 ** (i % 70);
    }
    s
}
fn main() {
    let n = 50 + i64(sum(rand([3], seed = 1)));
    print(collatz(27), collatz(n + 47));
    print(mix(100, 7, n), mix(-100, -7, n), mix(5, -3, n));
    print(powers(n), powers(3 * n));
    print(divide_down(10, n));
}
";
    let s = Session::new(Mode::Graph)
        .load_source("div.adj", SRC)
        .unwrap();
    let kernels = s.emit_kernels("main").unwrap();
    for f in [
        "@collatz.while",
        "@mix.for",
        "@divide_down.for",
        "@powers.for",
    ] {
        assert!(kernels.contains(f), "{f} not native:\n{kernels}");
    }
    let (graph, graph_err) = run_failing(Mode::Graph, "div.adj", SRC);
    let (eager, eager_err) = run_failing(Mode::Eager, "div.adj", SRC);
    assert_eq!(graph, eager);
    assert_eq!(graph.lines().count(), 3, "{graph}");
    for e in [&graph_err, &eager_err] {
        assert!(
            e.summary().contains("`/`: integer division by zero"),
            "{}",
            e.render(false)
        );
    }
    // Both modes point at the division, not at the loop around it.
    assert_eq!(graph_err.location(), eager_err.location());
    assert_eq!(graph_err.location().map(|l| l.1), Some(20));
    // A negative exponent in a native loop, with its value in the message.
    let src = SRC.replace("print(divide_down(10, n));", "print(down(n));")
        + "fn down(n) {\n    let mut s = 0;\n    for i in 0..n {\n        s = s + 2 ** (n - 11 - i);\n    }\n    s\n}\n";
    for mode in [Mode::Graph, Mode::Eager] {
        let s = Session::new(mode).load_source("pow.adj", &src).unwrap();
        if mode == Mode::Graph {
            let kernels = s.emit_kernels("main").unwrap();
            assert!(kernels.contains("@down.for"), "{kernels}");
        }
        let err = s.run_main(&mut Vec::new()).unwrap_err();
        assert!(
            err.summary()
                .contains("`**`: negative exponent -1 for an integer power"),
            "{}",
            err.render(false)
        );
        // At the power: the 4th line of `down`.
        let line = src.lines().position(|l| l.contains("2 ** (n - 11 - i)"));
        assert_eq!(err.location().map(|l| l.1 as usize), line.map(|k| k + 1));
    }
}

/// A fault inside a loop that reverse mode records natively (an integer
/// division by zero on the loop's counter) is reported at the division,
/// as in eager mode, and the first gradient, whose loop stops before the
/// zero, is printed in both modes.
#[test]
fn faults_in_recorded_loops_point_at_the_operation() {
    const SRC: &str = "\
fn f(x, n) {
    let mut y = x;
    for i in 0..n {
        let k = 10 / (5 - i);
        y = y * 0.5 + f64(k) * sin(y);
    }
    y
}
fn main() {
    let n = i64(sum(ones([40])));
    print(grad(f)(0.3, n / 10));
    print(grad(f)(0.3, n / 5));
}
";
    let graph = Session::new(Mode::Graph)
        .load_source("fault.adj", SRC)
        .unwrap();
    let kernels = graph.emit_kernels("main").unwrap();
    assert!(kernels.contains("recording its tape"), "{kernels}");
    let (graph_out, graph_err) = run_failing(Mode::Graph, "fault.adj", SRC);
    let (eager_out, eager_err) = run_failing(Mode::Eager, "fault.adj", SRC);
    assert_close(&graph_out, &eager_out, 1e-10);
    assert_eq!(graph_out.lines().count(), 1, "{graph_out}");
    for e in [&graph_err, &eager_err] {
        assert!(
            e.summary().contains("`/`: integer division by zero"),
            "{}",
            e.render(false)
        );
        assert_eq!(
            e.location(),
            Some(("fault.adj".to_string(), 4, 17)),
            "{}",
            e.render(false)
        );
    }
}

/// A loop of `y + 0.01 * tanh(y) * exp(-y * y)` over 1000 f32, `steps`
/// steps (a number the optimiser does not know, so the loop stays one),
/// differentiated.
fn tanh_loop(steps: usize) -> String {
    format!(
        "\
fn iterate(x, steps) {{
    let mut y = x;
    for i in 0..steps {{
        y = y + 0.01 * tanh(y) * exp(-y * y);
    }}
    sum(y)
}}
fn main() {{
    let x = randn([1000], seed = 3) * 0.5;
    let n = i64(sum(ones([{steps}])));
    let g = grad(iterate)(x, n);
    print(sum(g), g[0], g[999]);
}}
"
    )
}

/// A rule's cotangents for constants go nowhere, and the optimiser drops
/// them: the cotangent of the `0.01` in `0.01 * tanh(y)` (a product and a
/// reduction over the tensor per step) is not computed in the loop's
/// backpropagators, and the gradient is eager mode's. (`opt/prune.rs`
/// does this for rules left in branches; here `opt/dense.rs` inlines
/// them, and dead-code elimination does it.)
#[test]
fn loop_backpropagators_skip_cotangents_nobody_reads() {
    let src = tanh_loop(30);
    let ir = opt_ir("loop.adj", &src);
    // Still a loop with escaping backpropagators...
    assert!(ir.contains("graph @B."), "{ir}");
    // ...that do not sum a cotangent down to the constant's shape.
    assert!(
        !ir.lines()
            .any(|l| l.contains("sum_to(") && l.ends_with(", 0.01)")),
        "{ir}"
    );
    let g = run(Mode::Graph, &src);
    let e = run(Mode::Eager, &src);
    assert_close(&g, &e, 1e-5);
}

/// The body of graph `@name` in printed IR.
fn graph_text<'a>(ir: &'a str, name: &str) -> &'a str {
    let start = ir
        .find(&format!("graph @{name}("))
        .unwrap_or_else(|| panic!("no @{name} in\n{ir}"));
    let end = ir[start..].find("\n}").map_or(ir.len(), |e| start + e);
    &ir[start..end]
}

/// A reversed loop over a tensor: the backpropagator each iteration
/// records gets a dense cotangent, so its derivative rules inline into one
/// straight-line graph with no zero test left, which inference types and
/// fusion compiles: one kernel per step forward and one backward. It
/// computes the step's cheap values (`0.01 * t`, `-y`) again instead of
/// keeping them, and one record per step is pushed, not two.
#[test]
fn reversed_tensor_loops_run_one_kernel_per_backward_step() {
    let src = tanh_loop(200);
    let ir = opt_ir("loop.adj", &src);
    // The header's record, which only routes cotangents, is merged into
    // the body's.
    assert!(!ir.contains("@B.iterate.for"), "{ir}");
    let body = graph_text(&ir, "B.iterate.body.then");
    for gone in ["is_zero(", "switch(", "gadd(", "@B.mul", "@B.tanh"] {
        assert!(!body.contains(gone), "`{gone}` left in\n{body}");
    }
    assert!(body.contains("grad_finalize("), "{body}");
    assert!(body.contains("mul(0.01, "), "{body}");
    let (graph_out, graph) = run_with_stats(Mode::Graph, &src);
    let (eager_out, _) = run_with_stats(Mode::Eager, &src);
    assert_close(&graph_out, &eager_out, 1e-5);
    assert!(
        (400..=410).contains(&graph.kernel_calls),
        "{} kernel calls for 200 steps",
        graph.kernel_calls
    );
}

/// A loop state whose result nobody reads has a symbolic zero cotangent
/// at every step; made dense, it is zeros, and the gradient is the other
/// state's alone.
#[test]
fn reversed_tensor_loops_with_an_unread_state() {
    const SRC: &str = "\
fn iterate(x, steps) {
    let mut y = x;
    let mut z = x * 2.0;
    for i in 0..steps {
        y = y * 1.1 + tanh(y);
        z = z * 0.9;
    }
    sum(z)
}
fn main() {
    let x = randn([8], seed = 1);
    let n = i64(sum(ones([3])));
    print(grad(iterate)(x, n));
}
";
    let graph = run(Mode::Graph, SRC);
    let eager = run(Mode::Eager, SRC);
    let plain = |s: &str| s.replace(['[', ']', ','], " ");
    assert_close(&plain(&graph), &plain(&eager), 1e-6);
    // f32: 2 * 0.9^3.
    let want = format!("{} ", 2.0 * 0.9f64.powi(3)).repeat(8);
    assert_close(&plain(&graph), &want, 1e-6);
}

/// A loop whose state is a record: its cotangent is made dense as a
/// whole, and the per-field cotangent builders merge, so the backward step
/// is one kernel too.
#[test]
fn reversed_loops_over_a_record_state() {
    const SRC: &str = "\
fn iterate(x, steps) {
    let mut s = {y: x, k: 2};
    for i in 0..steps {
        s = {y: s.y + 0.01 * tanh(s.y) * exp(-s.y * s.y), k: s.k + 1};
    }
    sum(s.y) * f32(s.k)
}
fn main() {
    let x = randn([1000], seed = 3) * 0.5;
    let n = i64(sum(ones([30])));
    let g = grad(iterate)(x, n);
    print(sum(g), g[0], g[999]);
}
";
    let (graph_out, graph) = run_with_stats(Mode::Graph, SRC);
    let (eager_out, _) = run_with_stats(Mode::Eager, SRC);
    assert_close(&graph_out, &eager_out, 1e-5);
    let kernels = graph.kernel_calls;
    assert!((60..=62).contains(&kernels), "{kernels} kernel calls");
}

/// Reversed loops whose cotangents go through environments and nesting:
/// a float the loop captures (its cotangent comes back through the
/// loop's environments, which must stay), nested loops, a `while` whose
/// counter feeds a float, f32 and f64 copies of one loop, and a second
/// derivative through a loop. Graph mode agrees with eager mode.
#[test]
fn reversed_loops_with_captured_floats_nesting_and_second_derivatives() {
    const SRC: &str = "\
fn f(x, w, n) {
    let mut y = x;
    for i in 0..n {
        y = y * w + 0.1 * tanh(y);
    }
    sum(y)
}
fn g(x, n) {
    let mut y = x;
    for i in 0..n {
        let mut z = y;
        for j in 0..n {
            z = z * 0.9 + sin(z) * 0.05;
        }
        y = y + 0.1 * z;
    }
    sum(y * y)
}
fn h(x, n) {
    let mut y = x;
    let mut k = 0;
    while k < n {
        y = y - 0.05 * exp(-y) * f64(k);
        k = k + 1;
    }
    sum(y)
}
fn main() {
    let n = i64(sum(ones([7])));
    let x = randn([5], seed = 2) * 0.3;
    let w = randn([5], seed = 3) * 0.2 + 1.0;
    print(grad(f, argnums = (0, 1))(x, w, n));
    print(grad(f, argnums = (0, 1))(f64(x), f64(w), n));
    print(grad(g)(x, n));
    print(grad(h)(f64(x), n));
    print(grad(|x| sum(grad(f)(x, w, n) * x))(x));
}
";
    let plain = |s: &str| s.replace(['[', ']', ',', '(', ')'], " ");
    let graph = plain(&run(Mode::Graph, SRC));
    let eager = plain(&run(Mode::Eager, SRC));
    assert_eq!(graph.split_whitespace().count(), 35, "{graph}");
    assert_close(&graph, &eager, 1e-5);
}

/// Passes recognise the graphs of lowering and AD by their roles
/// (`ir::GraphRole`), never by their names: renaming every graph, even to
/// names AD itself uses, changes neither the values printed nor how the
/// program runs (the closures the VM makes: a reversed loop compiled to
/// native code or a stack of records makes none per step).
#[test]
fn passes_read_graph_roles_not_names() {
    use adjoint_compiler::pipeline::{Mode as M, Program};
    struct NoFiles;
    impl adjoint_compiler::lower::SourceLoader for NoFiles {
        fn load(&self, path: &std::path::Path) -> std::io::Result<String> {
            Err(std::io::Error::other(format!("no file {}", path.display())))
        }
    }
    let programs = [
        // A scalar loop's gradient: two native loops (fuse/reverse.rs).
        "fn f(x) {\n    let mut s = x;\n    for i in 0..100 { s = sin(s) * 1.01 + x; }\n    s\n}\n\
         fn main() { print(grad(f)(0.3), grad(grad(f))(0.3)); }\n",
        // A loop over tensors whose trip count depends on data: the
        // reversed loop's stack of records (opt/dense.rs, vmgen/mod.rs).
        "fn f(w) {\n    let mut h = w;\n    let mut i = 0;\n    while sum(h * h) < 50.0 && i < 30 {\n        h = tanh(h) * 1.5 + w;\n        i = i + 1;\n    }\n    sum(h)\n}\n\
         fn main() { print(grad(f)([0.1, 0.2, 0.3])); }\n",
        // A closure made inside a loop, and `if` inside the body.
        "fn f(x) {\n    let mut acc = 1.0;\n    for i in 0..7 {\n        let g = |z| if z > 1.0 { z * x } else { z + x };\n        acc = g(acc) * 0.9;\n    }\n    acc\n}\n\
         fn main() { print(value_and_grad(f)(0.7), jvp(f, (0.7,), (1.0,))); }\n",
    ];
    let run = |src: &str, mode: M, names: Option<&dyn Fn(usize) -> String>| {
        let mut sources = adjoint_lang::SourceMap::new();
        let root = sources.add_file("roles.adj", src.to_string());
        let mut program = Program::load(&mut sources, root, None, &NoFiles).unwrap();
        if let Some(name) = names {
            for (i, g) in program.lowered.module.graphs.iter_mut().enumerate() {
                g.name = name(i);
            }
        }
        let ex = program.prepare_main(mode).unwrap();
        let mut out = Vec::new();
        let closures = adjoint_runtime::vm::closures_made();
        program.execute_main(&ex, &mut out).unwrap();
        let closures = adjoint_runtime::vm::closures_made() - closures;
        (String::from_utf8(out).unwrap(), closures)
    };
    let plain = |i: usize| format!("g{i}");
    let misleading = |i: usize| ["unwind", "J.f", "B.f", "F.f", "unwind.step"][i % 5].to_string();
    for src in programs {
        for mode in [M::Graph, M::Eager] {
            let expected = run(src, mode, None);
            assert_eq!(run(src, mode, Some(&plain)), expected, "{mode:?}\n{src}");
            assert_eq!(
                run(src, mode, Some(&misleading)),
                expected,
                "{mode:?}\n{src}"
            );
        }
    }
}

/// A loop that indexes a tensor too large to carry lane by lane reads it
/// in place: the loop and its reverse still compile to native loops
/// (`Shape::Buffer`), when the large tensor's own gradient is not asked
/// for; when it is, the loop keeps its closures. Both agree with eager
/// mode (tests/programs/r082 checks the values).
#[test]
fn loops_read_large_tensors_in_place() {
    const SRC: &str = "\
fn walk(seq, w) {
    let mut h = w;
    let mut total = 0.0;
    for t in 0..shape(seq).0 {
        h = tanh(h * seq[t] + w * seq[-1 - t]);
        total = total + sum(h * h);
    }
    total
}
fn main() {
    let seq = reshape(sin(arange(2000, dtype = f64) * 0.37), (1000, 2));
    let w = [0.5, -0.3];
    print(walk(seq, w));
    print(grad(walk, argnums = (1,))(seq, w));
}
";
    let kernels = kernels_of("in_place.adj", SRC);
    assert!(
        kernels.contains("f64[1000, 2] in place"),
        "the forward loop: {kernels}"
    );
    assert!(
        kernels.contains("reverse of scalar loop @J.walk."),
        "the gradient's loop: {kernels}"
    );
    assert_eq!(run(Mode::Graph, SRC), run(Mode::Eager, SRC));
}

/// A loop called with different types (f64, f32, a vector) from one
/// program: the typed pass gives each signature its own copy of the
/// loop's graphs (`opt::specialize`, `split_by_signature`), so each
/// compiles natively, forward and reverse, where the shared exit graph
/// with three signatures kept them on the VM before.
#[test]
fn a_loop_called_with_several_types_compiles_for_each() {
    const SRC: &str = "\
fn f(x, n) {
    let mut s = x;
    for i in 0..n {
        s = sin(s) * s + 0.5;
    }
    s
}
fn main() {
    let n = i64(sum(zeros(3)) + 1000.0);
    print(f(0.3, n));
    print(f(f32(0.3), n));
    print(f([0.1, 0.2, 0.3], n));
    print(grad(|x| f(x, n))(0.3), grad(|x| sum(f(x, n)))([0.1, 0.2]));
}
";
    let kernels = kernels_of("signatures.adj", SRC);
    assert_eq!(
        kernels.matches("reverse of scalar loop").count(),
        2,
        "{kernels}"
    );
    assert!(!kernels.contains("then @f.after on the VM"), "{kernels}");
    assert_eq!(kernels.matches("scalar loop over").count(), 3, "{kernels}");
    assert_eq!(run(Mode::Graph, SRC), run(Mode::Eager, SRC));
}

/// A loop called directly and under `vmap`: the `vmap` call's lanes no
/// longer reach the direct call's graphs (the typed pass splits the
/// loop's graphs by whether their arguments have lanes, and the lane
/// analysis follows a `switch`'s two graphs instead of every graph used
/// as a value), so the direct call is a native loop again.
#[test]
fn a_loop_also_called_under_vmap_stays_native() {
    const SRC: &str = "\
fn f(seq, w) {
    let mut acc = 0.0;
    for t in 0..shape(seq).0 {
        acc = acc * 0.9 + tanh(w * seq[t]);
    }
    acc
}
fn main() {
    let seq = sin(arange(1000, dtype = f64));
    print(f(seq, 0.3));
    print(vmap(|w| f(seq, w))([0.1, 0.2]));
}
";
    let kernels = kernels_of("vmapped.adj", SRC);
    assert!(kernels.contains("scalar loop over"), "{kernels}");
    assert_eq!(run(Mode::Graph, SRC), run(Mode::Eager, SRC));
}

/// Forward mode through a loop with a nested loop over a captured large
/// tensor, whose carry starts at a constant (a symbolic-zero tangent on
/// entry, a dense one after the first trip: the typed pass makes the
/// entry's zero dense): the tangent loop compiles natively (symbolic-zero
/// free variables, `zeros_like` and `grad_finalize` of scalars in scalar
/// regions), and agrees with eager mode.
#[test]
fn forward_mode_through_nested_loops_runs_natively() {
    const SRC: &str = "\
fn f(seq, w) {
    let mut acc = 0.0;
    for t in 0..shape(seq).0 {
        let mut h = w;
        for j in 0..3 {
            h = h * 0.5 + seq[t, j] * w;
        }
        acc = acc + tanh(h);
    }
    acc
}
fn main() {
    let seq = reshape(sin(arange(3000, dtype = f64)), (1000, 3));
    print(jvp(|w| f(seq, w), (0.3,), (1.0,)));
}
";
    let kernels = kernels_of("tangent_loops.adj", SRC);
    assert!(kernels.contains("scalar loop over"), "{kernels}");
    assert!(kernels.contains("@F.f.for"), "{kernels}");
    assert_eq!(run(Mode::Graph, SRC), run(Mode::Eager, SRC));
}

/// A derivative differentiated again is simplified before it is
/// (`ad::run`): the sixth derivative of `sin` is one small graph, where
/// transforming the transforms' own machinery made 673,357 lines of
/// optimised IR and took 16 s to compile.
#[test]
fn derivatives_of_high_order_stay_the_size_of_their_arithmetic() {
    let src = "fn main() { print(grad(grad(grad(grad(grad(grad(sin))))))(0.3)); }";
    let ir = assert_closure_free("d6.adj", src, &[]);
    let nodes = ir
        .lines()
        .filter(|l| l.trim_start().starts_with('%'))
        .count();
    assert!(nodes < 120, "{nodes} nodes:\n{ir}");
    assert_eq!(run(Mode::Graph, src), "-0.29552020666133955\n");
    assert_eq!(run(Mode::Eager, src), "-0.29552020666133955\n");
}

/// `is_unit` and `is_tuple` of a literal fold before the typed pass: the
/// gradient of `flip` (whose `axis = ()` picks a branch) unrolled the loop
/// of its dead branch in every round of the optimiser.
#[test]
fn default_argument_branches_fold_without_types() {
    let src = "fn main() { print(grad(|x| sum(flip(x) * [1.0, 2.0, 3.0]))([0.1, 0.2, 0.3])); }";
    let ir = assert_closure_free("flip.adj", src, &[]);
    assert!(!ir.contains("is_unit"), "{ir}");
    assert_eq!(run(Mode::Graph, src), "[3.0, 2.0, 1.0]\n");
}
