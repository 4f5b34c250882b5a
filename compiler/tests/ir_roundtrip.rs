//! The IR text format: exact printed text of hand-built modules, print →
//! parse → print identity, parse errors with line:col, the verifier on
//! broken modules, and a property test over random modules.

use std::collections::HashMap;
use std::sync::Arc;

use adjoint_compiler::ir::parse::{parse_module, parse_module_with_types, ParseError};
use adjoint_compiler::ir::print::{layout, print_graph, print_module};
use adjoint_compiler::ir::verify::{verify, verify_reachable};
use adjoint_compiler::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use adjoint_compiler::prim::Prim;
use adjoint_runtime::tensor::{DType, Tensor};

const L: Loc = Loc::NONE;

fn c(m: &mut Module, v: Const) -> NodeId {
    m.add_const(v, L)
}

fn gc(m: &mut Module, g: GraphId) -> NodeId {
    m.add_const(Const::Graph(g), L)
}

/// Prints, checks that the module verifies, that the text parses back to a
/// module that verifies and prints to the same text; returns the text.
fn roundtrip(m: &Module, roots: &[GraphId]) -> String {
    verify(m).unwrap_or_else(|e| panic!("verify: {e:#?}"));
    let text = print_module(m, roots, None);
    let (m2, roots2) = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    verify(&m2).unwrap_or_else(|e| panic!("verify after parse: {e:#?}\n{text}"));
    assert_eq!(print_module(&m2, &roots2, None), text);
    text
}

/// The same with a types side table: the types print and parse back.
fn roundtrip_typed(m: &Module, roots: &[GraphId], types: &HashMap<NodeId, String>) -> String {
    let tf = |n: NodeId| types.get(&n).cloned();
    let text = print_module(m, roots, Some(&tf));
    let p = parse_module_with_types(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let tf2 = |n: NodeId| p.types.get(&n).cloned();
    assert_eq!(print_module(&p.module, &p.graphs, Some(&tf2)), text);
    assert_eq!(p.to_string(), text);
    text
}

fn parse_err(text: &str) -> ParseError {
    match parse_module(text) {
        Ok(_) => panic!("parsed:\n{text}"),
        Err(e) => e,
    }
}

fn verify_err(m: &Module) -> String {
    match verify(m) {
        Ok(()) => panic!(
            "verified:\n{}",
            print_module(m, &m.graph_ids().collect::<Vec<_>>(), None)
        ),
        Err(es) => es.join("\n"),
    }
}

// ---------------------------------------------------------------------------
// Printing hand-built modules

/// `loss(x, y) = sum(x * y)`.
fn straight_line() -> (Module, GraphId, HashMap<NodeId, String>) {
    let mut m = Module::new();
    let g = m.add_graph("loss", L);
    let x = m.add_param(g, "x", L);
    let y = m.add_param(g, "y", L);
    let p = m.add_prim(g, Prim::Mul, &[x, y], L);
    let axis = c(&mut m, Const::Unit);
    let keep = c(&mut m, Const::Bool(false));
    let s = m.add_prim(g, Prim::Sum, &[p, axis, keep], L);
    m.set_output(g, s);
    let mut types = HashMap::new();
    types.insert(x, "f32[4]".to_string());
    types.insert(y, "f32[4]".to_string());
    types.insert(p, "f32[4]".to_string());
    types.insert(s, "f32[]".to_string());
    (m, g, types)
}

#[test]
fn straight_line_prints() {
    let (m, g, types) = straight_line();
    assert_eq!(
        roundtrip(&m, &[g]),
        "\
graph @loss(%0 x, %1 y) {
  %2 = mul(%0, %1)
  %3 = sum(%2, (), false)
  return %3
}
"
    );
    assert_eq!(
        roundtrip_typed(&m, &[g], &types),
        "\
graph @loss(%0 x: f32[4], %1 y: f32[4]) -> f32[] {
  %2 = mul(%0, %1) : f32[4]
  %3 = sum(%2, (), false) : f32[]
  return %3
}
"
    );
}

#[test]
fn numbering_does_not_depend_on_arena_order() {
    // The same graph built in another order prints the same.
    let mut m = Module::new();
    let g = m.add_graph("loss", L);
    let axis = c(&mut m, Const::Unit);
    let keep = c(&mut m, Const::Bool(false));
    let x = m.add_param(g, "x", L);
    let y = m.add_param(g, "y", L);
    let s = m.add_apply(g, vec![], L);
    let p = m.add_prim(g, Prim::Mul, &[x, y], L);
    let sum = c(&mut m, Const::Prim(Prim::Sum));
    m.node_mut(s).kind = NodeKind::Apply(vec![sum, p, axis, keep]);
    m.set_output(g, s);
    let (m0, g0, _) = straight_line();
    assert_eq!(roundtrip(&m, &[g]), print_module(&m0, &[g0], None));
}

/// `f(x) { let y = x * 2.0; let k = || y + x; k() }`: the closure `k`
/// uses `y` and `x` of `f` as free variables.
fn closure() -> (Module, GraphId, GraphId) {
    let mut m = Module::new();
    let f = m.add_graph("f", L);
    let k = m.add_graph("f.k", L);
    let x = m.add_param(f, "x", L);
    let two = c(&mut m, Const::Float(2.0));
    // `k`'s node is made first: the printer orders by dependency, not id.
    let z = m.add_apply(k, vec![], L);
    let y = m.add_prim(f, Prim::Mul, &[x, two], L);
    let add = c(&mut m, Const::Prim(Prim::Add));
    m.node_mut(z).kind = NodeKind::Apply(vec![add, y, x]);
    m.set_output(k, z);
    let kc = gc(&mut m, k);
    let call = m.add_apply(f, vec![kc], L);
    m.set_output(f, call);
    (m, f, k)
}

#[test]
fn closure_with_free_variables() {
    let (m, f, k) = closure();
    // `y` is only used inside `k`, yet it is scheduled in `f`, before the
    // closure is made.
    assert_eq!(
        roundtrip(&m, &[f]),
        "\
graph @f(%0 x) {
  %1 = mul(%0, 2.0)
  %2 = @f.k()
  return %2
}

graph @f.k() {
  %3 = add(%1, %0)
  return %3
}
"
    );
    // Printed from the nested graph, the graph owning its free variables
    // comes along (after it: a forward reference).
    assert_eq!(
        roundtrip(&m, &[k]),
        "\
graph @f.k() {
  %0 = add(%2, %1)
  return %0
}

graph @f(%1 x) {
  %2 = mul(%1, 2.0)
  %3 = @f.k()
  return %3
}
"
    );
    assert_eq!(
        print_graph(&m, k, None),
        "\
graph @f.k() {
  %0 = add(%2, %1)
  return %0
}
"
    );
}

#[test]
fn closure_returned_as_value_and_nested_twice() {
    // outer(a) { let b = a + 1; || (|| a * b) }: the innermost graph uses
    // nodes of `outer` through `middle`, which it does not own.
    let mut m = Module::new();
    let outer = m.add_graph("outer", L);
    let middle = m.add_graph("middle", L);
    let inner = m.add_graph("inner", L);
    let a = m.add_param(outer, "a", L);
    let one = c(&mut m, Const::Int(1));
    let b = m.add_prim(outer, Prim::Add, &[a, one], L);
    let p = m.add_prim(inner, Prim::Mul, &[a, b], L);
    m.set_output(inner, p);
    let ic = gc(&mut m, inner);
    m.set_output(middle, ic);
    let mc = gc(&mut m, middle);
    m.set_output(outer, mc);
    assert_eq!(
        roundtrip(&m, &[outer]),
        "\
graph @outer(%0 a) {
  %1 = add(%0, 1)
  return @middle
}

graph @middle() {
  return @inner
}

graph @inner() {
  %2 = mul(%0, %1)
  return %2
}
"
    );
}

/// `fn pow2(n) { let mut i = 0; let mut acc = 1.0; while i < n { acc = acc
/// * 2.0; i = i + 1; } acc }` with the loop as a recursive header graph.
fn while_loop() -> (Module, GraphId) {
    let mut m = Module::new();
    let main = m.add_graph("pow2", L);
    let header = m.add_graph("pow2.while_header", L);
    let body = m.add_graph("pow2.while_body", L);
    let after = m.add_graph("pow2.while_after", L);
    let n = m.add_param(main, "n", L);
    // header(i, acc) = switch(i < n, body, after)()
    let i = m.add_param(header, "i", L);
    let acc = m.add_param(header, "acc", L);
    let cond = m.add_prim(header, Prim::Lt, &[i, n], L);
    let bc = gc(&mut m, body);
    let ac = gc(&mut m, after);
    let sw = m.add_prim(header, Prim::Switch, &[cond, bc, ac], L);
    let call = m.add_apply(header, vec![sw], L);
    m.set_output(header, call);
    // body() = header(i + 1, acc * 2.0)
    let one = c(&mut m, Const::Int(1));
    let i2 = m.add_prim(body, Prim::Add, &[i, one], L);
    let two = c(&mut m, Const::Float(2.0));
    let acc2 = m.add_prim(body, Prim::Mul, &[acc, two], L);
    let hc = gc(&mut m, header);
    let rec = m.add_apply(body, vec![hc, i2, acc2], L);
    m.set_output(body, rec);
    // after() = acc
    m.set_output(after, acc);
    // pow2(n) = header(0, 1.0)
    let hc2 = gc(&mut m, header);
    let zero = c(&mut m, Const::Int(0));
    let onef = c(&mut m, Const::Float(1.0));
    let start = m.add_apply(main, vec![hc2, zero, onef], L);
    m.set_output(main, start);
    (m, main)
}

#[test]
fn recursive_loop_graph() {
    let (m, main) = while_loop();
    assert_eq!(
        roundtrip(&m, &[main]),
        "\
graph @pow2(%0 n) {
  %1 = @pow2.while_header(0, 1.0)
  return %1
}

graph @pow2.while_header(%2 i, %3 acc) {
  %4 = lt(%2, %0)
  %5 = switch(%4, @pow2.while_body, @pow2.while_after)
  %6 = %5()
  return %6
}

graph @pow2.while_body() {
  %7 = add(%2, 1)
  %8 = mul(%3, 2.0)
  %9 = @pow2.while_header(%7, %8)
  return %9
}

graph @pow2.while_after() {
  return %3
}
"
    );
}

#[test]
fn switch_and_io_token() {
    // main(x, io) { if x > 0.0 { print("pos", x) } else { print("neg") }; x }
    let mut m = Module::new();
    let main = m.add_graph("main", L);
    let then = m.add_graph("main.then", L);
    let els = m.add_graph("main.else", L);
    let x = m.add_param(main, "x", L);
    let io = m.add_param(main, "io", L);
    let zero = c(&mut m, Const::Float(0.0));
    let cond = m.add_prim(main, Prim::Gt, &[x, zero], L);
    let tc = gc(&mut m, then);
    let ec = gc(&mut m, els);
    let sw = m.add_prim(main, Prim::Switch, &[cond, tc, ec], L);
    let io2 = m.add_apply(main, vec![sw], L);
    let out = m.add_prim(main, Prim::MakeTuple, &[io2, x], L);
    m.set_output(main, out);
    let pos = c(&mut m, Const::Str("pos".into()));
    let p1 = m.add_prim(then, Prim::Print, &[io, pos, x], L);
    m.set_output(then, p1);
    let neg = c(&mut m, Const::Str("neg".into()));
    let p2 = m.add_prim(els, Prim::Print, &[io, neg], L);
    m.set_output(els, p2);
    assert_eq!(
        roundtrip(&m, &[main]),
        "\
graph @main(%0 x, %1 io) {
  %2 = gt(%0, 0.0)
  %3 = switch(%2, @main.then, @main.else)
  %4 = %3()
  %5 = make_tuple(%4, %0)
  return %5
}

graph @main.then() {
  %6 = print(%1, \"pos\", %0)
  return %6
}

graph @main.else() {
  %7 = print(%1, \"neg\")
  return %7
}
"
    );
}

#[test]
fn every_constant_kind() {
    let mut m = Module::new();
    let g = m.add_graph("consts", L);
    let h = m.add_graph("helper", L);
    let hp = m.add_param(h, "", L);
    m.set_output(h, hp);
    let t = |v: Vec<f32>, s: &[usize]| Tensor::from_vec(v, s).unwrap();
    let values = vec![
        Const::Int(3),
        Const::Int(-7),
        Const::Int(i64::MIN),
        Const::Float(1.0),
        Const::Float(-0.0),
        Const::Float(1e-7),
        Const::Float(0.1),
        Const::Float(1e300),
        Const::Float(f64::MIN_POSITIVE / 4.0),
        Const::Float(f64::INFINITY),
        Const::Float(f64::NEG_INFINITY),
        Const::Float(f64::NAN),
        Const::Bool(true),
        Const::Str(Arc::from("a \"quoted\" \\ line\nnext\ttab \u{1} é")),
        Const::Unit,
        Const::DType(DType::F32),
        Const::DType(DType::U8),
        Const::Tensor(t(vec![1.0, 2.5], &[2])),
        Const::Tensor(t(vec![0.1, -0.0, 1e-30, f32::NAN, 3.0, 1e20], &[2, 3])),
        Const::Tensor(Tensor::weak_f64(2.5)),
        Const::Tensor(Tensor::from_vec(vec![1i64, -2], &[2, 1]).unwrap()),
        Const::Tensor(Tensor::from_vec(vec![7i32], &[]).unwrap()),
        Const::Tensor(Tensor::from_vec(vec![0u8, 255], &[2]).unwrap()),
        Const::Tensor(Tensor::from_vec(vec![true, false], &[2]).unwrap()),
        Const::Tensor(Tensor::from_vec(Vec::<f64>::new(), &[0, 3]).unwrap()),
        Const::Prim(Prim::Add),
        Const::Prim(Prim::DTypeOf),
        Const::Graph(h),
    ];
    let args: Vec<NodeId> = values.into_iter().map(|v| c(&mut m, v)).collect();
    let tup = m.add_prim(g, Prim::MakeTuple, &args, L);
    m.set_output(g, tup);
    assert_eq!(
        roundtrip(&m, &[g]),
        "\
graph @consts() {
  %0 = make_tuple(3, -7, -9223372036854775808, 1.0, -0.0, 1e-7, 0.1, 1e300, \
5.562684646268003e-309, inf, -inf, nan, true, \
\"a \\\"quoted\\\" \\\\ line\\nnext\\ttab \\u{1} é\", (), f32, u8, \
tensor<f32[2]>[1.0, 2.5], tensor<f32[2, 3]>[0.1, -0.0, 1e-30, nan, 3.0, 1e20], \
tensor<weak f64[]>[2.5], tensor<i64[2, 1]>[1, -2], tensor<i32[]>[7], \
tensor<u8[2]>[0, 255], tensor<bool[2]>[true, false], tensor<f64[0, 3]>[], \
prim.add, prim.dtype, @helper)
  return %0
}

graph @helper(%1) {
  return %1
}
"
    );
    // The values read back exactly.
    let text = print_module(&m, &[g], None);
    let (m2, roots) = parse_module(&text).unwrap();
    let out = m2.graph(roots[0]).output.unwrap();
    let consts: Vec<Const> = m2.inputs(out)[1..]
        .iter()
        .map(|&n| m2.as_const(n).unwrap().clone())
        .collect();
    let orig: Vec<Const> = m.inputs(tup)[1..]
        .iter()
        .map(|&n| m.as_const(n).unwrap().clone())
        .collect();
    for (a, b) in orig.iter().zip(&consts) {
        match (a, b) {
            (Const::Float(x), Const::Float(y)) => {
                assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
            }
            (Const::Graph(_), Const::Graph(y)) => assert_eq!(m2.graph(*y).name, "helper"),
            (Const::Tensor(x), Const::Tensor(y)) if x.dtype() == DType::F32 => {
                assert_eq!(x.shape(), y.shape());
                let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
                for (p, q) in x.iter().zip(y) {
                    assert!(p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()));
                }
            }
            _ => assert_eq!(a, b),
        }
    }
}

#[test]
fn repeated_and_odd_names() {
    let mut m = Module::new();
    let main = m.add_graph("main", L);
    let a = m.add_graph("lambda", L);
    let b = m.add_graph("lambda", L);
    let d = m.add_graph("lambda.1", L);
    let e = m.add_graph("my graph", L);
    for g in [a, b, d, e] {
        let p = m.add_param(g, "a b", L);
        m.set_output(g, p);
    }
    let args: Vec<NodeId> = [a, b, d, e].iter().map(|&g| gc(&mut m, g)).collect();
    let t = m.add_prim(main, Prim::MakeTuple, &args, L);
    m.set_output(main, t);
    assert_eq!(
        roundtrip(&m, &[main]),
        "\
graph @main() {
  %0 = make_tuple(@lambda, @lambda.1, @lambda.1.1, @\"my graph\")
  return %0
}

graph @lambda(%1 \"a b\") {
  return %1
}

graph @lambda.1(%2 \"a b\") {
  return %2
}

graph @lambda.1.1(%3 \"a b\") {
  return %3
}

graph @\"my graph\"(%4 \"a b\") {
  return %4
}
"
    );
}

#[test]
fn types_with_brackets_round_trip() {
    let (m, main) = while_loop();
    let mut types = HashMap::new();
    for (i, node) in m.nodes.iter().enumerate() {
        if !matches!(node.kind, NodeKind::Const(_)) {
            let t = match i % 4 {
                0 => "(f32[2, 3], {w: f32[4], b: (i64, bool)})",
                1 => "fn(f32, f32) -> f32",
                2 => "f64[]",
                _ => "io",
            };
            types.insert(NodeId(i as u32), t.to_string());
        }
    }
    let text = roundtrip_typed(&m, &[main], &types);
    assert!(text.contains("graph @pow2.while_header(%2 i: "));
    assert!(text.contains("-> "));
}

#[test]
fn multiple_roots_and_shared_graphs() {
    let (mut m, main) = while_loop();
    let other = m.add_graph("other", L);
    let hc = gc(&mut m, GraphId(1));
    let z = c(&mut m, Const::Int(0));
    let call = m.add_apply(other, vec![hc, z, z], L);
    m.set_output(other, call);
    let text = roundtrip(&m, &[other, main]);
    assert!(text.starts_with("graph @other() {\n  %0 = @pow2.while_header(0, 0)\n"));
}

// ---------------------------------------------------------------------------
// Parsing hand-written text

#[test]
fn parses_hand_written_text() {
    // Numbers need not be dense; references may point forwards, into
    // graphs defined later; comments and blank lines are allowed.
    let text = "\
// a comment
graph @f(%10 x: f32[3], %11) -> f32 {   // trailing comment

  %20 = @g(%10)   : f32
  return %20
}
graph @g(%30 y) {
  %31 = mul(%30, %11)
  %32 = add(%31, prim.add)
  return %31
}
";
    let p = parse_module_with_types(text).unwrap();
    let m = &p.module;
    verify(m).unwrap();
    assert_eq!(p.graphs.len(), 2);
    assert_eq!(m.graph(p.graphs[0]).param_names, vec!["x", ""]);
    let f_out = m.graph(p.graphs[0]).output.unwrap();
    assert_eq!(p.types[&f_out], "f32");
    assert_eq!(p.types[&m.graph(p.graphs[0]).params[0]], "f32[3]");
    assert_eq!(
        print_module(m, &p.graphs, None),
        "\
graph @f(%0 x, %1) {
  %2 = @g(%0)
  return %2
}

graph @g(%3 y) {
  %4 = mul(%3, %1)
  return %4
}
"
    );
}

#[test]
fn parse_errors_have_line_and_column() {
    let cases: &[(&str, u32, u32, &str)] = &[
        (
            "graph @f() {\n  return %3\n}\n",
            2,
            10,
            "node `%3` is not defined",
        ),
        (
            "graph @f() {\n  %0 = @g()\n  return %0\n}\n",
            2,
            8,
            "graph `@g` is not defined",
        ),
        (
            "graph @f() {\n  %0 = frobnicate(1)\n  return %0\n}\n",
            2,
            8,
            "unknown name `frobnicate`",
        ),
        (
            "graph @f(%0) {\n  %1 = add(%0, add)\n  return %1\n}\n",
            2,
            16,
            "written `prim.add`",
        ),
        (
            "graph @f(%0) {\n  %1 = add(%0 %0)\n}\n",
            2,
            15,
            "expected `,` or `)`",
        ),
        (
            "graph @f(%0) {\n  %0 = neg(%0)\n  return %0\n}\n",
            2,
            3,
            "`%0` is defined twice",
        ),
        (
            "graph @f() {\n  return 1\n}\ngraph @f() {\n  return 2\n}\n",
            4,
            1,
            "`@f` is defined twice",
        ),
        (
            "graph @f() {\n  return \"abc\n}\n",
            2,
            10,
            "unterminated string",
        ),
        (
            "graph @f() {\n  return tensor<f32[3]>[1.0, 2.0]\n}\n",
            2,
            10,
            "needs 3 elements, found 2",
        ),
        (
            "graph @f() {\n  return tensor<i32[1]>[1.5]\n}\n",
            2,
            25,
            "bad i32 element `1.5`",
        ),
        (
            "graph @f() {\n  return 99999999999999999999\n}\n",
            2,
            10,
            "out of range",
        ),
        (
            "graph @f() {\n  return 1\n  %1 = neg(1)\n}\n",
            3,
            3,
            "expected `}` after `return`",
        ),
        ("graph @f() {\n  return 1\n", 1, 1, "not closed"),
        ("grph @f() {}\n", 1, 1, "expected `graph`"),
        (
            "graph @f() {\n  %1 = neg(1) :\n}\n",
            2,
            16,
            "expected a type",
        ),
        (
            "graph @f() {\n\t%1 = neg(1x)\n}\n",
            2,
            12,
            "unexpected letter",
        ),
        (
            "graph @f() {\n  return \"\\q\"\n}\n",
            2,
            11,
            "unknown escape",
        ),
        ("graph @é() {}\n", 1, 8, "expected a graph name"),
    ];
    for &(text, line, col, msg) in cases {
        let e = parse_err(text);
        assert!(
            e.line == line && e.col == col && e.message.contains(msg),
            "for {text:?}: got {e}, expected {line}:{col}: ..{msg}.."
        );
        assert!(e.to_string().starts_with(&format!("{line}:{col}: ")));
    }
}

// ---------------------------------------------------------------------------
// The verifier

#[test]
fn verifier_accepts_the_examples() {
    verify(&straight_line().0).unwrap();
    verify(&closure().0).unwrap();
    verify(&while_loop().0).unwrap();
}

#[test]
fn verifier_rejects_input_out_of_range() {
    let (mut m, g, _) = straight_line();
    let s = m.graph(g).output.unwrap();
    if let NodeKind::Apply(inputs) = &mut m.node_mut(s).kind {
        inputs[1] = NodeId(999);
    }
    let e = verify_err(&m);
    assert!(
        e.contains("graph @loss: %") && e.contains("input 1 is %999, out of range"),
        "{e}"
    );
}

#[test]
fn verifier_rejects_apply_without_callee() {
    let (mut m, g, _) = straight_line();
    let s = m.graph(g).output.unwrap();
    m.node_mut(s).kind = NodeKind::Apply(vec![]);
    let e = verify_err(&m);
    assert!(e.contains("application has no callee"), "{e}");
}

#[test]
fn verifier_rejects_owned_constant_and_ownerless_apply() {
    let (mut m, g, _) = straight_line();
    let k = c(&mut m, Const::Int(1));
    m.node_mut(k).graph = Some(g);
    let n = m.add_prim(g, Prim::Neg, &[k], L);
    m.node_mut(n).graph = None;
    let e = verify_err(&m);
    assert!(e.contains("is a constant but belongs to a graph"), "{e}");
    assert!(e.contains("application belongs to no graph"), "{e}");
}

#[test]
fn verifier_rejects_bad_parameters() {
    let (mut m, g, _) = straight_line();
    m.graph_mut(g).params.swap(0, 1);
    let e = verify_err(&m);
    assert!(e.contains("is not its graph's parameter 0"), "{e}");
    assert!(e.contains("graph @loss: parameter 0 is %1"), "{e}");

    let (mut m, g, _) = straight_line();
    m.graph_mut(g).param_names.pop();
    let e = verify_err(&m);
    assert!(
        e.contains("graph @loss: 1 parameter names for 2 parameters"),
        "{e}"
    );

    let (mut m, g, _) = straight_line();
    let p = m.graph(g).params[0];
    m.graph_mut(g).params.push(p);
    m.graph_mut(g).param_names.push("again".into());
    let e = verify_err(&m);
    assert!(e.contains("listed twice"), "{e}");
}

#[test]
fn verifier_rejects_missing_output() {
    let (mut m, _, _) = straight_line();
    m.add_graph("empty", L);
    let e = verify_err(&m);
    assert!(e.contains("graph @empty: no output"), "{e}");
    // .. unless the graph is dead and only reachable graphs are checked.
    verify_reachable(&m, &[GraphId(0)]).unwrap();
    assert!(verify_reachable(&m, &[GraphId(1)]).is_err());
}

#[test]
fn verifier_rejects_foreign_free_variable() {
    // `g` uses a node of `f`, but `f` does not refer to `g`.
    let mut m = Module::new();
    let f = m.add_graph("f", L);
    let g = m.add_graph("g", L);
    let x = m.add_param(f, "x", L);
    let y = m.add_prim(f, Prim::Neg, &[x], L);
    m.set_output(f, y);
    let z = m.add_prim(g, Prim::Exp, &[y], L);
    m.set_output(g, z);
    let e = verify_err(&m);
    assert!(
        e.contains(
            "graph @g: %4 (exp): input 1 is %2 (neg), a node of @f, which does not refer to @g"
        ),
        "{e}"
    );
    // Once `f` refers to `g` (even through another graph), it is a closure.
    let mid = m.add_graph("mid", L);
    let gcn = gc(&mut m, g);
    m.set_output(mid, gcn);
    let mcn = gc(&mut m, mid);
    let t = m.add_prim(f, Prim::MakeTuple, &[y, mcn], L);
    m.set_output(f, t);
    verify(&m).unwrap();
    // A graph's output is checked too.
    let mut m2 = Module::new();
    let f = m2.add_graph("f", L);
    let g = m2.add_graph("g", L);
    let x = m2.add_param(f, "x", L);
    m2.set_output(f, x);
    m2.set_output(g, x);
    let e = verify_err(&m2);
    assert!(
        e.contains("graph @g: output is %0 (param 0 `x`), a node of @f"),
        "{e}"
    );
}

#[test]
fn verifier_checks_primitive_arity() {
    let mut m = Module::new();
    let g = m.add_graph("g", L);
    let x = m.add_param(g, "x", L);
    let one = c(&mut m, Const::Int(1));
    let a = m.add_prim(g, Prim::Add, &[x], L); // needs 2
    let s = m.add_prim(g, Prim::Sum, &[x, one, one, one], L); // 1 to 3
    let s1 = m.add_prim(g, Prim::Sum, &[x], L); // fine
    let p = m.add_prim(g, Prim::Print, &[], L); // at least 1
    let t = m.add_prim(g, Prim::MakeTuple, &[], L); // fine
    let i = m.add_prim(g, Prim::Index, &[x, one, one, one], L); // fine
    let out = m.add_prim(g, Prim::MakeTuple, &[a, s, s1, p, t, i], L);
    m.set_output(g, out);
    let e = verify_err(&m);
    assert!(e.contains("(add): `add` takes 2 arguments, got 1"), "{e}");
    assert!(
        e.contains("(sum): `sum` takes 1 to 3 arguments, got 4"),
        "{e}"
    );
    assert!(
        e.contains("(print): `print` takes at least 1 arguments, got 0"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 3, "{e}");
}

#[test]
fn verifier_rejects_cycles() {
    let mut m = Module::new();
    let g = m.add_graph("g", L);
    let x = m.add_param(g, "x", L);
    let a = m.add_prim(g, Prim::Neg, &[x], L);
    let b = m.add_prim(g, Prim::Exp, &[a], L);
    let neg = m.inputs(a)[0];
    m.node_mut(a).kind = NodeKind::Apply(vec![neg, b]);
    m.set_output(g, b);
    let e = verify_err(&m);
    assert!(e.contains("graph @g: cycle among its applications"), "{e}");
    // The printer does not loop on it either.
    let _ = print_module(&m, &[g], None);
}

#[test]
fn verifier_rejects_graph_constant_out_of_range() {
    let (mut m, g, _) = straight_line();
    let bad = c(&mut m, Const::Graph(GraphId(42)));
    let s = m.graph(g).output.unwrap();
    let t = m.add_prim(g, Prim::MakeTuple, &[s, bad], L);
    m.set_output(g, t);
    let e = verify_err(&m);
    assert!(e.contains("refers to graph @g42, out of range"), "{e}");
    let _ = print_module(&m, &[g], None);
}

// ---------------------------------------------------------------------------
// Random modules

mod random {
    use super::*;
    use proptest::prelude::*;

    /// One operation of a generated graph; indices pick among the values
    /// in scope (modulo their number).
    #[derive(Clone, Debug)]
    pub enum Op {
        Unary(usize, usize),
        Binary(usize, usize, usize),
        Const(Const),
        Tuple(Vec<usize>),
        /// `switch(c, @then, @else)()`, both branches closures over the
        /// enclosing scope.
        Branch(usize, Vec<Op>, Vec<Op>),
        /// A call of a nested graph with parameters.
        Call(Vec<usize>, Vec<Op>),
    }

    const UNARY: &[Prim] = &[Prim::Neg, Prim::Exp, Prim::Tanh, Prim::Not];
    const BINARY: &[Prim] = &[Prim::Add, Prim::Mul, Prim::Lt, Prim::Maximum];

    fn constant() -> impl Strategy<Value = Const> {
        prop_oneof![
            any::<i64>().prop_map(Const::Int),
            any::<f64>().prop_map(Const::Float),
            any::<bool>().prop_map(Const::Bool),
            ".{0,8}".prop_map(|s: String| Const::Str(Arc::from(s))),
            Just(Const::Unit),
            (0..6usize).prop_map(|i| Const::DType(DType::ALL[i])),
            (0..Prim::all().len()).prop_map(|i| Const::Prim(Prim::all()[i])),
            (prop::collection::vec(any::<f32>(), 0..6), any::<bool>()).prop_map(|(v, two)| {
                let n = v.len();
                let shape: Vec<usize> = if two && n % 2 == 0 {
                    vec![2, n / 2]
                } else {
                    vec![n]
                };
                Const::Tensor(Tensor::from_vec(v, &shape).unwrap())
            }),
            any::<f64>().prop_map(|x| Const::Tensor(Tensor::weak_f64(x))),
            prop::collection::vec(any::<i64>(), 0..4)
                .prop_map(|v| Const::Tensor(Tensor::vector(v))),
            prop::collection::vec(any::<bool>(), 0..4)
                .prop_map(|v| Const::Tensor(Tensor::vector(v))),
        ]
    }

    fn ops(depth: u32) -> BoxedStrategy<Vec<Op>> {
        let leaf = prop_oneof![
            (0..UNARY.len(), any::<usize>()).prop_map(|(p, a)| Op::Unary(p, a)),
            (0..BINARY.len(), any::<usize>(), any::<usize>())
                .prop_map(|(p, a, b)| Op::Binary(p, a, b)),
            constant().prop_map(Op::Const),
            prop::collection::vec(any::<usize>(), 0..4).prop_map(Op::Tuple),
        ];
        let op = if depth == 0 {
            leaf.boxed()
        } else {
            prop_oneof![
                4 => leaf,
                1 => (any::<usize>(), ops(depth - 1), ops(depth - 1))
                    .prop_map(|(c, t, e)| Op::Branch(c, t, e)),
                1 => (prop::collection::vec(any::<usize>(), 0..3), ops(depth - 1))
                    .prop_map(|(a, b)| Op::Call(a, b)),
            ]
            .boxed()
        };
        prop::collection::vec(op, 0..6).boxed()
    }

    /// Builds `ops` into graph `g` with `scope` (values visible, including
    /// free variables of enclosing graphs); sets the output.
    pub fn build(m: &mut Module, g: GraphId, mut scope: Vec<NodeId>, ops: &[Op]) {
        let pick = |scope: &Vec<NodeId>, i: usize| scope[i % scope.len()];
        for op in ops {
            let v = match op {
                Op::Unary(p, a) => {
                    let a = pick(&scope, *a);
                    m.add_prim(g, UNARY[*p], &[a], L)
                }
                Op::Binary(p, a, b) => {
                    let (a, b) = (pick(&scope, *a), pick(&scope, *b));
                    m.add_prim(g, BINARY[*p], &[a, b], L)
                }
                Op::Const(k) => m.add_const(k.clone(), L),
                Op::Tuple(xs) => {
                    let xs: Vec<NodeId> = xs.iter().map(|&i| pick(&scope, i)).collect();
                    m.add_prim(g, Prim::MakeTuple, &xs, L)
                }
                Op::Branch(cnd, t, e) => {
                    let then = m.add_graph("then", L);
                    let els = m.add_graph("else", L);
                    build(m, then, scope.clone(), t);
                    build(m, els, scope.clone(), e);
                    let cnd = pick(&scope, *cnd);
                    let (tc, ec) = (gc(m, then), gc(m, els));
                    let sw = m.add_prim(g, Prim::Switch, &[cnd, tc, ec], L);
                    m.add_apply(g, vec![sw], L)
                }
                Op::Call(args, body) => {
                    let h = m.add_graph("fn", L);
                    let mut inner = scope.clone();
                    for k in 0..args.len() {
                        inner.push(m.add_param(h, format!("p{k}"), L));
                    }
                    build(m, h, inner, body);
                    let mut inputs = vec![gc(m, h)];
                    inputs.extend(args.iter().map(|&i| pick(&scope, i)));
                    m.add_apply(g, inputs, L)
                }
            };
            scope.push(v);
        }
        let out = *scope.last().unwrap();
        m.set_output(g, out);
    }

    pub fn module(nparams: usize, ops: &[Op]) -> (Module, GraphId) {
        let mut m = Module::new();
        let main = m.add_graph("main", L);
        let mut scope = vec![m.add_const(Const::Float(1.0), L)];
        for k in 0..nparams {
            scope.push(m.add_param(main, format!("x{k}"), L));
        }
        build(&mut m, main, scope, ops);
        (m, main)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn random_modules_round_trip(nparams in 0..3usize, ops in ops(2), typed in any::<bool>()) {
            let (m, main) = module(nparams, &ops);
            verify(&m).unwrap();
            let text = roundtrip(&m, &[main]);
            if typed {
                let types: HashMap<NodeId, String> = (0..m.nodes.len())
                    .map(|i| (NodeId(i as u32), format!("t{}[{}]", i % 3, i % 5)))
                    .collect();
                roundtrip_typed(&m, &[main], &types);
            }
            // Printing a nested graph alone also round trips (graphs that
            // only dead code refers to are not printed from `main`, and are
            // left out: printed alone, their owner's reference is lost).
            for g in layout(&m, &[main]).graphs.into_iter().skip(1) {
                roundtrip(&m, &[g]);
            }
            prop_assert!(text.starts_with("graph @main("));
        }
    }
}

#[test]
fn long_and_deep_modules_do_not_overflow_the_stack() {
    // A long chain of applications, and a long chain of nested closures
    // each using the previous graph's value.
    let mut m = Module::new();
    let main = m.add_graph("main", L);
    let x = m.add_param(main, "x", L);
    let mut v = x;
    for _ in 0..50_000 {
        v = m.add_prim(main, Prim::Neg, &[v], L);
    }
    let mut g = main;
    let mut last = v;
    for k in 0..3_000 {
        let h = m.add_graph(format!("nest{k}"), L);
        let hc = gc(&mut m, h);
        let t = m.add_prim(g, Prim::MakeTuple, &[last, hc], L);
        m.set_output(g, t);
        last = m.add_prim(h, Prim::Exp, &[last], L);
        g = h;
    }
    m.set_output(g, last);
    let text = roundtrip(&m, &[main]);
    assert_eq!(text.matches("graph @").count(), 3_001);
}

#[test]
fn examples_in_docs_round_trip() {
    let doc = include_str!("../../docs/ir.md");
    let mut blocks = 0;
    for block in doc.split("```").skip(1).step_by(2) {
        let text = block.trim_start_matches('\n');
        if !text.starts_with("graph @") {
            continue;
        }
        let p = parse_module_with_types(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        verify(&p.module).unwrap_or_else(|e| panic!("{e:#?}\n{text}"));
        assert_eq!(p.to_string(), text);
        blocks += 1;
    }
    assert_eq!(blocks, 2);
}
