//! Type and shape inference on hand-built IR (the shapes lowering produces:
//! `if` as `switch(c, @then, @else)()`, loops as header/body/after graphs
//! with tail calls, IO threaded through a state token).

use std::time::{Duration, Instant};

use adjoint_compiler::infer::{
    infer_module, infer_module_with, AbsVal, InferError, InferOptions, Types,
};
use adjoint_compiler::ir::{Const, GraphId, Loc, Module, NodeId};
use adjoint_compiler::prim::Prim;
use adjoint_runtime::tensor::DType::{self, *};

/// A small builder over [`Module`]: every node gets its own location, so
/// tests can check where errors point.
#[derive(Default)]
struct Ir {
    m: Module,
    next: u32,
}

impl Ir {
    fn loc(&mut self) -> Loc {
        self.next += 1;
        Loc {
            file: 0,
            lo: self.next,
            hi: self.next + 1,
        }
    }
    fn graph(&mut self, name: &str, params: &[&str]) -> (GraphId, Vec<NodeId>) {
        let loc = self.loc();
        let g = self.m.add_graph(name, loc);
        let ps = params
            .iter()
            .map(|p| {
                let loc = self.loc();
                self.m.add_param(g, *p, loc)
            })
            .collect();
        (g, ps)
    }
    fn konst(&mut self, c: Const) -> NodeId {
        let loc = self.loc();
        self.m.add_const(c, loc)
    }
    fn int(&mut self, v: i64) -> NodeId {
        self.konst(Const::Int(v))
    }
    fn float(&mut self, v: f64) -> NodeId {
        self.konst(Const::Float(v))
    }
    fn unit(&mut self) -> NodeId {
        self.konst(Const::Unit)
    }
    fn string(&mut self, s: &str) -> NodeId {
        self.konst(Const::Str(s.into()))
    }
    fn gref(&mut self, g: GraphId) -> NodeId {
        self.konst(Const::Graph(g))
    }
    fn prim(&mut self, g: GraphId, p: Prim, args: &[NodeId]) -> NodeId {
        let loc = self.loc();
        self.m.add_prim(g, p, args, loc)
    }
    fn call(&mut self, g: GraphId, f: NodeId, args: &[NodeId]) -> NodeId {
        let loc = self.loc();
        let mut inputs = vec![f];
        inputs.extend_from_slice(args);
        self.m.add_apply(g, inputs, loc)
    }
    /// `c ? then : else` as lowering writes it: `switch(c, @then, @else)()`.
    fn if_(&mut self, g: GraphId, c: NodeId, then: GraphId, els: GraphId) -> NodeId {
        let (t, e) = (self.gref(then), self.gref(els));
        let s = self.prim(g, Prim::Switch, &[c, t, e]);
        self.call(g, s, &[])
    }
    fn ret(&mut self, g: GraphId, n: NodeId) {
        self.m.set_output(g, n);
    }
    fn loc_of(&self, n: NodeId) -> Loc {
        self.m.node(n).loc
    }
    fn infer(&self, entry: GraphId, args: &[AbsVal]) -> Result<Types, InferError> {
        infer_module(&self.m, entry, args)
    }
    fn ty(&self, types: &Types, n: NodeId) -> String {
        types.type_of(n).unwrap_or_else(|| "<none>".into())
    }
}

fn t(d: DType, shape: &[usize]) -> AbsVal {
    AbsVal::tensor(d, shape)
}

#[test]
fn straight_line_arithmetic_with_broadcasting_and_weak_literals() {
    let mut ir = Ir::default();
    let (g, p) = ir.graph("main", &["x", "b"]);
    let two = ir.float(2.0);
    let y = ir.prim(g, Prim::Mul, &[p[0], two]);
    let z = ir.prim(g, Prim::Add, &[y, p[1]]);
    let one = ir.int(1);
    let w = ir.prim(g, Prim::Sub, &[one, z]);
    let e = ir.prim(g, Prim::Exp, &[w]);
    ir.ret(g, e);
    let types = ir.infer(g, &[t(F32, &[3, 4]), t(F32, &[4])]).unwrap();
    assert_eq!(ir.ty(&types, y), "f32[3, 4]");
    assert_eq!(ir.ty(&types, z), "f32[3, 4]");
    assert_eq!(ir.ty(&types, w), "f32[3, 4]");
    assert_eq!(types.result().to_string(), "f32[3, 4]");
    assert_eq!(ir.ty(&types, two), "<none>");
    // a literal alone is weak f64; weak with weak stays weak
    let mut ir = Ir::default();
    let (g, _) = ir.graph("main", &[]);
    let (a, b) = (ir.float(1.5), ir.int(2));
    let s = ir.prim(g, Prim::Mul, &[a, b]);
    ir.ret(g, s);
    let types = ir.infer(g, &[]).unwrap();
    assert_eq!(types.result(), &AbsVal::weak_scalar(F64));
}

#[test]
fn dtype_and_shape_mismatches_point_at_the_operation() {
    let mut ir = Ir::default();
    let (g, p) = ir.graph("main", &["a", "b"]);
    let mm = ir.prim(g, Prim::Matmul, &[p[0], p[1]]);
    ir.ret(g, mm);
    let err = ir
        .infer(g, &[t(F32, &[3, 4]), t(F32, &[5, 2])])
        .unwrap_err();
    assert_eq!(
        err.message,
        "`@` of f32[3, 4] and f32[5, 2]: inner dimensions 4 and 5 differ"
    );
    assert_eq!(err.loc, ir.loc_of(mm));
    let types = ir.infer(g, &[t(F32, &[7, 3, 4]), t(F32, &[4, 2])]).unwrap();
    assert_eq!(types.result().to_string(), "f32[7, 3, 2]");
    // Strong dtypes promote, as in JAX.
    let types = ir.infer(g, &[t(F32, &[3, 4]), t(F64, &[4, 2])]).unwrap();
    assert_eq!(types.result().to_string(), "f64[3, 2]");
}

#[test]
fn reductions_with_axes_and_keepdims() {
    let mut ir = Ir::default();
    let (g, p) = ir.graph("main", &["x"]);
    let (u, f, tr) = (
        ir.unit(),
        ir.konst(Const::Bool(false)),
        ir.konst(Const::Bool(true)),
    );
    let all = ir.prim(g, Prim::Sum, &[p[0], u, f]);
    let ax = ir.int(1);
    let rows = ir.prim(g, Prim::Mean, &[p[0], ax, tr]);
    let (a0, a2) = (ir.int(0), ir.int(-1));
    let axes = ir.prim(g, Prim::MakeTuple, &[a0, a2]);
    let mx = ir.prim(g, Prim::Max, &[p[0], axes, f]);
    let am = ir.prim(g, Prim::Argmax, &[p[0], a2, f]);
    let out = ir.prim(g, Prim::MakeTuple, &[all, rows, mx, am]);
    ir.ret(g, out);
    let types = ir.infer(g, &[t(F32, &[2, 3, 4])]).unwrap();
    assert_eq!(
        types.result().to_string(),
        "(f32[], f32[2, 1, 4], f32[3], i64[2, 3])"
    );
}

#[test]
fn switch_on_an_unknown_condition_joins_the_branches() {
    let mut ir = Ir::default();
    let (g, p) = ir.graph("main", &["c", "x"]);
    let (then, _) = ir.graph("main.then", &[]);
    let two = ir.float(2.0);
    let y = ir.prim(then, Prim::Mul, &[p[1], two]);
    ir.ret(then, y);
    let (els, _) = ir.graph("main.else", &[]);
    ir.ret(els, p[1]);
    let r = ir.if_(g, p[0], then, els);
    ir.ret(g, r);
    let types = ir.infer(g, &[AbsVal::scalar(Bool), t(F32, &[3])]).unwrap();
    assert_eq!(ir.ty(&types, r), "f32[3]");
    // both branches were specialised
    assert_eq!(types.specs_of(then).len(), 1);
    assert_eq!(types.specs_of(els).len(), 1);
}

#[test]
fn switch_branches_of_different_types_name_both_branches() {
    let mut ir = Ir::default();
    let (g, p) = ir.graph("main", &["c", "x", "y"]);
    let (then, _) = ir.graph("main.then", &[]);
    let one = ir.float(1.0);
    let a = ir.prim(then, Prim::Add, &[p[1], one]);
    ir.ret(then, a);
    let (els, _) = ir.graph("main.else", &[]);
    let b = ir.prim(els, Prim::Neg, &[p[2]]);
    ir.ret(els, b);
    let r = ir.if_(g, p[0], then, els);
    ir.ret(g, r);
    let args = [AbsVal::scalar(Bool), t(F32, &[3]), t(F32, &[4])];
    let err = ir.infer(g, &args).unwrap_err();
    assert_eq!(
        err.message,
        "if branches have different types: f32[3] and f32[4]"
    );
    assert_eq!(err.loc, ir.loc_of(r));
    assert_eq!(
        err.secondary,
        vec![
            (ir.loc_of(a), "this branch has type f32[3]".to_string()),
            (ir.loc_of(b), "this branch has type f32[4]".to_string()),
        ]
    );
    // A weak literal in one branch adopts the other branch's dtype.
    let (g2, q) = ir.graph("main2", &["c", "x"]);
    let (th, _) = ir.graph("main2.then", &[]);
    ir.ret(th, q[1]);
    let (el, _) = ir.graph("main2.else", &[]);
    let z = ir.float(0.0);
    ir.ret(el, z);
    let r2 = ir.if_(g2, q[0], th, el);
    ir.ret(g2, r2);
    let types = ir.infer(g2, &[AbsVal::scalar(Bool), t(F32, &[])]).unwrap();
    assert_eq!(types.result(), &AbsVal::scalar(F32));
}

#[test]
fn switch_on_a_constant_takes_one_branch() {
    // fn main(x, n) = if n < 2 { x } else { x @ x }, specialised on n = 1
    let mut ir = Ir::default();
    let (g, p) = ir.graph("main", &["x", "n"]);
    let (then, _) = ir.graph("main.then", &[]);
    ir.ret(then, p[0]);
    let (els, _) = ir.graph("main.else", &[]);
    // ill-typed, but never taken
    let bad = ir.prim(els, Prim::Matmul, &[p[0], p[0]]);
    ir.ret(els, bad);
    let two = ir.int(2);
    let c = ir.prim(g, Prim::Lt, &[p[1], two]);
    let r = ir.if_(g, c, then, els);
    ir.ret(g, r);
    let types = ir
        .infer(g, &[t(F32, &[3, 4]), AbsVal::int(1, false)])
        .unwrap();
    assert_eq!(types.result().to_string(), "f32[3, 4]");
    assert!(types.specs_of(els).is_empty());
    assert_eq!(ir.ty(&types, bad), "<none>");
}

/// `fn main(x) { let mut acc = 0.0; for i in 0..n { acc = acc + x; } acc }`
/// as header/body/after graphs. Returns the module, main, header.
fn counted_loop(n: i64) -> (Ir, GraphId, GraphId, NodeId) {
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x"]);
    let (header, h) = ir.graph("main.for_header", &["i", "acc"]);
    let (body, _) = ir.graph("main.for_body", &[]);
    let (after, _) = ir.graph("main.for_after", &[]);
    let bound = ir.int(n);
    let c = ir.prim(header, Prim::Lt, &[h[0], bound]);
    let r = ir.if_(header, c, body, after);
    ir.ret(header, r);
    let one = ir.int(1);
    let next = ir.prim(body, Prim::Add, &[h[0], one]);
    let acc = ir.prim(body, Prim::Add, &[h[1], p[0]]);
    let hr = ir.gref(header);
    let tail = ir.call(body, hr, &[next, acc]);
    ir.ret(body, tail);
    ir.ret(after, h[1]);
    let (zero, fzero) = (ir.int(0), ir.float(0.0));
    let hr = ir.gref(header);
    let start = ir.call(main, hr, &[zero, fzero]);
    ir.ret(main, start);
    (ir, main, header, acc)
}

#[test]
fn a_loop_of_a_million_iterations_terminates_quickly() {
    let (ir, main, header, acc) = counted_loop(1_000_000);
    let start = Instant::now();
    let types = ir.infer(main, &[t(F32, &[3])]).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    // the weak 0.0 adopts f32 from the first iteration on
    assert_eq!(types.result().to_string(), "f32[3]");
    assert_eq!(ir.ty(&types, acc), "f32[3]");
    let n = types.specs_of(header).len();
    assert!(n <= 40, "{n} specialisations of the loop header");
    // the widened header has an unknown counter but keeps the weak type
    let widened = types
        .specs_of(header)
        .iter()
        .map(|s| &types.spec(*s).args[0])
        .find(|a| a.const_int().is_none())
        .expect("a widened specialisation");
    assert_eq!(widened, &AbsVal::weak_scalar(I64));
}

#[test]
fn a_loop_on_data_is_not_specialised_per_iteration() {
    // while x < 10.0 { i += 1; x = x * 2.0 }: the counter's values are
    // not followed (the loop may stop at any of them), so the header has
    // the call with i = 0 and one with i unknown, not one per iteration.
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x"]);
    let (header, h) = ir.graph("main.while", &["i", "x"]);
    let (body, _) = ir.graph("main.body", &[]);
    let (after, _) = ir.graph("main.after", &[]);
    let ten = ir.float(10.0);
    let c = ir.prim(header, Prim::Lt, &[h[1], ten]);
    let r = ir.if_(header, c, body, after);
    ir.ret(header, r);
    let one = ir.int(1);
    let next = ir.prim(body, Prim::Add, &[h[0], one]);
    let two = ir.float(2.0);
    let x2 = ir.prim(body, Prim::Mul, &[h[1], two]);
    let hr = ir.gref(header);
    let tail = ir.call(body, hr, &[next, x2]);
    ir.ret(body, tail);
    ir.ret(after, h[0]);
    let zero = ir.int(0);
    let hr = ir.gref(header);
    let start = ir.call(main, hr, &[zero, p[0]]);
    ir.ret(main, start);
    let types = ir.infer(main, &[t(F64, &[])]).unwrap();
    let counters: Vec<Option<i64>> = types
        .specs_of(header)
        .iter()
        .map(|s| types.spec(*s).args[0].const_int())
        .collect();
    assert_eq!(counters, vec![Some(0), None]);
}

#[test]
fn a_short_loop_is_specialised_per_iteration() {
    let (ir, main, header, _) = counted_loop(3);
    let types = ir.infer(main, &[t(F32, &[])]).unwrap();
    assert_eq!(types.result().to_string(), "f32[]");
    let counters: Vec<Option<i64>> = types
        .specs_of(header)
        .iter()
        .map(|s| types.spec(*s).args[0].const_int())
        .collect();
    assert_eq!(counters, vec![Some(0), Some(1), Some(2), Some(3)]);
}

/// `fn f(n, x) = if n == 0 { x } else { f(n - 1, x * 2.0) }`.
fn countdown() -> (Ir, GraphId) {
    let mut ir = Ir::default();
    let (f, p) = ir.graph("f", &["n", "x"]);
    let zero = ir.int(0);
    let c = ir.prim(f, Prim::Eq, &[p[0], zero]);
    let (then, _) = ir.graph("f.then", &[]);
    ir.ret(then, p[1]);
    let (els, _) = ir.graph("f.else", &[]);
    let one = ir.int(1);
    let n1 = ir.prim(els, Prim::Sub, &[p[0], one]);
    let two = ir.float(2.0);
    let x2 = ir.prim(els, Prim::Mul, &[p[1], two]);
    let fr = ir.gref(f);
    let rec = ir.call(els, fr, &[n1, x2]);
    ir.ret(els, rec);
    let r = ir.if_(f, c, then, els);
    ir.ret(f, r);
    (ir, f)
}

#[test]
fn recursion_with_a_constant_argument_of_ten_thousand_terminates() {
    let (mut ir, f) = countdown();
    let (main, p) = ir.graph("main", &["x"]);
    let n = ir.int(10_000);
    let fr = ir.gref(f);
    let call = ir.call(main, fr, &[n, p[0]]);
    ir.ret(main, call);
    let start = Instant::now();
    let types = ir.infer(main, &[t(F64, &[2, 2])]).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(types.result().to_string(), "f64[2, 2]");
    assert!(types.specs_of(f).len() <= 40);
    // with an unknown argument it is one specialisation
    let types = ir.infer(f, &[AbsVal::scalar(I64), t(F32, &[])]).unwrap();
    assert_eq!(types.result().to_string(), "f32[]");
    assert_eq!(types.specs_of(f).len(), 1);
}

#[test]
fn double_recursion_is_memoised() {
    // fib(n) = if n < 2 { 1.0 } else { fib(n - 1) + fib(n - 2) }
    let mut ir = Ir::default();
    let (f, p) = ir.graph("fib", &["n"]);
    let two = ir.int(2);
    let c = ir.prim(f, Prim::Lt, &[p[0], two]);
    let (then, _) = ir.graph("fib.then", &[]);
    let one_f = ir.float(1.0);
    ir.ret(then, one_f);
    let (els, _) = ir.graph("fib.else", &[]);
    let (one, two2) = (ir.int(1), ir.int(2));
    let a = ir.prim(els, Prim::Sub, &[p[0], one]);
    let b = ir.prim(els, Prim::Sub, &[p[0], two2]);
    let fr = ir.gref(f);
    let fa = ir.call(els, fr, &[a]);
    let fb = ir.call(els, fr, &[b]);
    let s = ir.prim(els, Prim::Add, &[fa, fb]);
    ir.ret(els, s);
    let r = ir.if_(f, c, then, els);
    ir.ret(f, r);
    let (main, _) = ir.graph("main", &[]);
    let n = ir.int(60);
    let fr = ir.gref(f);
    let call = ir.call(main, fr, &[n]);
    ir.ret(main, call);
    let start = Instant::now();
    let types = ir.infer(main, &[]).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(types.result(), &AbsVal::weak_scalar(F64));
}

#[test]
fn mutual_recursion_reaches_a_fixpoint() {
    // even(n) = if n == 0 { true } else { odd(n - 1) }
    // odd(n)  = if n == 0 { false } else { even(n - 1) }
    let mut ir = Ir::default();
    let (even, pe) = ir.graph("even", &["n"]);
    let (odd, po) = ir.graph("odd", &["n"]);
    for (g, p, base, other) in [(even, pe[0], true, odd), (odd, po[0], false, even)] {
        let zero = ir.int(0);
        let c = ir.prim(g, Prim::Eq, &[p, zero]);
        let (then, _) = ir.graph("then", &[]);
        let b = ir.konst(Const::Bool(base));
        ir.ret(then, b);
        let (els, _) = ir.graph("else", &[]);
        let one = ir.int(1);
        let n1 = ir.prim(els, Prim::Sub, &[p, one]);
        let o = ir.gref(other);
        let rec = ir.call(els, o, &[n1]);
        ir.ret(els, rec);
        let r = ir.if_(g, c, then, els);
        ir.ret(g, r);
    }
    let types = ir.infer(even, &[AbsVal::scalar(I64)]).unwrap();
    assert_eq!(types.result().to_string(), "bool[]");
    // with a constant, the answer is folded all the way down
    let types = ir.infer(even, &[AbsVal::int(7, false)]).unwrap();
    assert_eq!(types.result(), &AbsVal::bool(false));
    let types = ir.infer(even, &[AbsVal::int(100, false)]).unwrap();
    assert_eq!(types.result().to_string(), "bool[]");
}

#[test]
fn recursion_whose_type_keeps_changing_is_an_error_not_a_crash() {
    // f(c, x) = if c { x } else { f(c, expand_dims(x, 0)) }
    let mut ir = Ir::default();
    let (f, p) = ir.graph("f", &["c", "x"]);
    let (then, _) = ir.graph("f.then", &[]);
    ir.ret(then, p[1]);
    let (els, _) = ir.graph("f.else", &[]);
    let zero = ir.int(0);
    let x1 = ir.prim(els, Prim::ExpandDims, &[p[1], zero]);
    let fr = ir.gref(f);
    let rec = ir.call(els, fr, &[p[0], x1]);
    ir.ret(els, rec);
    let r = ir.if_(f, p[0], then, els);
    ir.ret(f, r);
    let err = ir
        .infer(f, &[AbsVal::scalar(Bool), t(F32, &[])])
        .unwrap_err();
    assert_eq!(err.message, "program too deeply nested for type inference");
}

#[test]
fn closures_capture_values() {
    // fn main(x) { let a = x * 2.0; let f = |y| y + a; f(x) }
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x"]);
    let two = ir.float(2.0);
    let a = ir.prim(main, Prim::Mul, &[p[0], two]);
    let (lam, q) = ir.graph("main.lambda", &["y"]);
    let s = ir.prim(lam, Prim::Add, &[q[0], a]);
    ir.ret(lam, s);
    let fr = ir.gref(lam);
    let call = ir.call(main, fr, &[p[0]]);
    ir.ret(main, call);
    let types = ir.infer(main, &[t(F32, &[5])]).unwrap();
    assert_eq!(types.result().to_string(), "f32[5]");
    let spec = types.spec(types.specs_of(lam)[0]);
    assert_eq!(spec.captures[..], [t(F32, &[5])]);
}

#[test]
fn closures_returned_and_chosen_by_an_if() {
    // fn adder(a) = |y| y + a;
    // fn main(c, x) { let f = if c { adder(x) } else { |y| y * 2.0 }; f(x) }
    let mut ir = Ir::default();
    let (adder, pa) = ir.graph("adder", &["a"]);
    let (lam, q) = ir.graph("adder.lambda", &["y"]);
    let s = ir.prim(lam, Prim::Add, &[q[0], pa[0]]);
    ir.ret(lam, s);
    let lr = ir.gref(lam);
    ir.ret(adder, lr);
    let (main, p) = ir.graph("main", &["c", "x"]);
    let (then, _) = ir.graph("main.then", &[]);
    let ar = ir.gref(adder);
    let made = ir.call(then, ar, &[p[1]]);
    ir.ret(then, made);
    let (els, _) = ir.graph("main.else", &[]);
    let (dbl, d) = ir.graph("main.double", &["y"]);
    let two = ir.float(2.0);
    let m2 = ir.prim(dbl, Prim::Mul, &[d[0], two]);
    ir.ret(dbl, m2);
    let dr = ir.gref(dbl);
    ir.ret(els, dr);
    let f = ir.if_(main, p[0], then, els);
    let call = ir.call(main, f, &[p[1]]);
    ir.ret(main, call);
    let types = ir
        .infer(main, &[AbsVal::scalar(Bool), t(F32, &[2])])
        .unwrap();
    assert_eq!(ir.ty(&types, f), "fn");
    assert_eq!(types.result().to_string(), "f32[2]");
    // the call reaches both closures
    let main_spec = types.spec(types.entry());
    assert_eq!(main_spec.calls[&call].len(), 2);
}

#[test]
fn calling_errors() {
    let mut ir = Ir::default();
    let (f, _) = ir.graph("f", &["a", "b"]);
    let z = ir.float(0.0);
    ir.ret(f, z);
    let (main, p) = ir.graph("main", &["x"]);
    let fr = ir.gref(f);
    let bad = ir.call(main, fr, &[p[0], p[0], p[0]]);
    ir.ret(main, bad);
    let err = ir.infer(main, &[t(F32, &[])]).unwrap_err();
    assert_eq!(err.message, "`f` takes 2 arguments, but 3 were given");
    assert_eq!(err.loc, ir.loc_of(bad));

    let (main2, p2) = ir.graph("main2", &["x"]);
    let call = ir.call(main2, p2[0], &[p2[0]]);
    ir.ret(main2, call);
    let err = ir.infer(main2, &[t(F32, &[])]).unwrap_err();
    assert_eq!(err.message, "cannot call a value of type f32[]");
    assert_eq!(err.loc, ir.loc_of(call));

    // the error inside a called function points inside it
    let (g, q) = ir.graph("g", &["a"]);
    let e = ir.prim(g, Prim::Matmul, &[q[0], q[0]]);
    ir.ret(g, e);
    let (main3, p3) = ir.graph("main3", &["x"]);
    let gr = ir.gref(g);
    let c3 = ir.call(main3, gr, &[p3[0]]);
    ir.ret(main3, c3);
    let err = ir.infer(main3, &[t(F32, &[3, 4])]).unwrap_err();
    assert_eq!(err.loc, ir.loc_of(e));

    let err = ir.infer(main3, &[]).unwrap_err();
    assert_eq!(err.message, "`main3` takes 1 argument, but 0 were given");
}

#[test]
fn tuples_and_records() {
    // fn main(w, b, x) { let p = {w: w, b: b}; (x @ p.w + p.b, shape(p.w).1) }
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["w", "b", "x"]);
    let (nw, nb) = (ir.string("w"), ir.string("b"));
    let rec = ir.prim(main, Prim::MakeRecord, &[nw, p[0], nb, p[1]]);
    let w = ir.prim(main, Prim::RecordGet, &[rec, nw]);
    let b = ir.prim(main, Prim::RecordGet, &[rec, nb]);
    let xw = ir.prim(main, Prim::Matmul, &[p[2], w]);
    let y = ir.prim(main, Prim::Add, &[xw, b]);
    let sh = ir.prim(main, Prim::Shape, &[w]);
    let one = ir.int(1);
    let d = ir.prim(main, Prim::TupleGet, &[sh, one]);
    let out = ir.prim(main, Prim::MakeTuple, &[y, d, rec]);
    ir.ret(main, out);
    let types = ir
        .infer(main, &[t(F32, &[4, 3]), t(F32, &[3]), t(F32, &[8, 4])])
        .unwrap();
    assert_eq!(
        types.result().to_string(),
        "(f32[8, 3], i64[], {w: f32[4, 3], b: f32[3]})"
    );
    assert_eq!(types.value_of(d).unwrap().const_int(), Some(3));
    // a missing field
    let nx = ir.string("x");
    let (bad, _) = ir.graph("bad", &[]);
    let z = ir.float(0.0);
    let r2 = ir.prim(bad, Prim::MakeRecord, &[nw, z]);
    let g = ir.prim(bad, Prim::RecordGet, &[r2, nx]);
    ir.ret(bad, g);
    let err = ir.infer(bad, &[]).unwrap_err();
    assert_eq!(err.message, "record {w: f64[]} has no field `x`");
    assert_eq!(err.loc, ir.loc_of(g));
}

#[test]
fn iterating_over_a_heterogeneous_tuple() {
    // fn main(io, t) { let mut n = 0; for e in t { print(e); n = n + size(e); } (io, n) }
    // as lowering writes it: a counted loop over tuple_len(t) with tuple_get.
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["t", "io"]);
    let (header, h) = ir.graph("main.for_header", &["i", "n", "io"]);
    let (body, _) = ir.graph("main.for_body", &[]);
    let (after, _) = ir.graph("main.for_after", &[]);
    let len = ir.prim(header, Prim::TupleLen, &[p[0]]);
    let c = ir.prim(header, Prim::Lt, &[h[0], len]);
    let r = ir.if_(header, c, body, after);
    ir.ret(header, r);
    let e = ir.prim(body, Prim::TupleGet, &[p[0], h[0]]);
    let io = ir.prim(body, Prim::Print, &[h[2], e]);
    let sz = ir.prim(body, Prim::Size, &[e]);
    let n = ir.prim(body, Prim::Add, &[h[1], sz]);
    let one = ir.int(1);
    let i1 = ir.prim(body, Prim::Add, &[h[0], one]);
    let hr = ir.gref(header);
    let tail = ir.call(body, hr, &[i1, n, io]);
    ir.ret(body, tail);
    let res = ir.prim(after, Prim::MakeTuple, &[h[2], h[1]]);
    ir.ret(after, res);
    let zero = ir.int(0);
    let hr = ir.gref(header);
    let start = ir.call(main, hr, &[zero, zero, p[1]]);
    ir.ret(main, start);
    let tuple = AbsVal::Tuple(vec![t(F32, &[3]), AbsVal::scalar(I64), t(Bool, &[2, 2])]);
    let types = ir.infer(main, &[tuple, AbsVal::Io]).unwrap();
    assert_eq!(types.result().to_string(), "(io, i64[])");
    // the sizes are constants: 3 + 1 + 4
    let AbsVal::Tuple(items) = types.result() else {
        panic!()
    };
    assert_eq!(items[1].const_int(), Some(8));
    assert_eq!(ir.ty(&types, e), "f32[3] | i64[] | bool[2, 2]");
}

#[test]
fn io_is_threaded_through_the_state_token() {
    // fn main(x, io) { let io = print(io, x); let (io, d) = load_npy(io, "d.npy"); (io, d @ x) }
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "io"]);
    let io1 = ir.prim(main, Prim::Print, &[p[1], p[0]]);
    let path = ir.string("d.npy");
    let loaded = ir.prim(main, Prim::LoadNpy, &[io1, path]);
    let (zero, one) = (ir.int(0), ir.int(1));
    let io2 = ir.prim(main, Prim::TupleGet, &[loaded, zero]);
    let d = ir.prim(main, Prim::TupleGet, &[loaded, one]);
    let y = ir.prim(main, Prim::Matmul, &[d, p[0]]);
    let out = ir.prim(main, Prim::MakeTuple, &[io2, y]);
    ir.ret(main, out);
    let args = [t(F32, &[3]), AbsVal::Io];
    // without a loader, the data's type is known only at run time
    let types = ir.infer(main, &args).unwrap();
    assert_eq!(types.result().to_string(), "(io, ?)");
    let load = |p: Prim, path: &str| -> Result<AbsVal, String> {
        assert_eq!((p, path), (Prim::LoadNpy, "d.npy"));
        Ok(AbsVal::tensor(F32, &[10, 3]))
    };
    let opts = InferOptions {
        load_type: Some(&load),
        ..InferOptions::default()
    };
    let types = infer_module_with(&ir.m, main, &args, &opts).unwrap();
    assert_eq!(types.result().to_string(), "(io, f32[10])");
    assert_eq!(ir.ty(&types, io1), "io");
    // printing without the token is an internal error of lowering
    let (bad, q) = ir.graph("bad", &["x"]);
    let pr = ir.prim(bad, Prim::Print, &[q[0]]);
    ir.ret(bad, pr);
    let err = ir.infer(bad, &[t(F32, &[])]).unwrap_err();
    assert!(err.message.contains("io token"), "{}", err.message);
}

#[test]
fn shapes_must_be_known_at_compile_time() {
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["n"]);
    let three = ir.int(3);
    let shape = ir.prim(main, Prim::TensorLiteral, &[p[0], three]);
    let u = ir.unit();
    let z = ir.prim(main, Prim::Zeros, &[shape, u]);
    ir.ret(main, z);
    let err = ir.infer(main, &[AbsVal::scalar(I64)]).unwrap_err();
    assert_eq!(
        err.message,
        "the shape of zeros must be known at compile time"
    );
    assert_eq!(err.loc, ir.loc_of(z));
    // a constant argument is specialised on
    let types = ir.infer(main, &[AbsVal::int(2, false)]).unwrap();
    assert_eq!(types.result().to_string(), "f32[2, 3]");
}

#[test]
fn a_constant_loop_bound_stays_known_inside_the_widened_loop() {
    // fn main(n) { let mut acc = zeros([n]); for i in 0..1000 { acc = acc + zeros([n]); } acc }
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["n"]);
    let (header, h) = ir.graph("h", &["i", "acc"]);
    let (body, _) = ir.graph("b", &[]);
    let (after, _) = ir.graph("a", &[]);
    let bound = ir.int(1000);
    let c = ir.prim(header, Prim::Lt, &[h[0], bound]);
    let r = ir.if_(header, c, body, after);
    ir.ret(header, r);
    let shape = ir.prim(body, Prim::TensorLiteral, &[p[0]]);
    let u = ir.unit();
    let z = ir.prim(body, Prim::Zeros, &[shape, u]);
    let acc = ir.prim(body, Prim::Add, &[h[1], z]);
    let one = ir.int(1);
    let i1 = ir.prim(body, Prim::Add, &[h[0], one]);
    let hr = ir.gref(header);
    let tail = ir.call(body, hr, &[i1, acc]);
    ir.ret(body, tail);
    ir.ret(after, h[1]);
    let shape0 = ir.prim(main, Prim::TensorLiteral, &[p[0]]);
    let z0 = ir.prim(main, Prim::Zeros, &[shape0, u]);
    let zero = ir.int(0);
    let hr = ir.gref(header);
    let start = ir.call(main, hr, &[zero, z0]);
    ir.ret(main, start);
    let types = ir.infer(main, &[AbsVal::int(7, false)]).unwrap();
    assert_eq!(types.result().to_string(), "f32[7]");
}

#[test]
fn dynamic_slices_of_static_size() {
    // for b in 0..100 { x[b * 4 : b * 4 + 4] } with the counter widened
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "b"]);
    let four = ir.int(4);
    let lo = ir.prim(main, Prim::Mul, &[p[1], four]);
    let lo2 = ir.prim(main, Prim::Mul, &[p[1], four]);
    let hi = ir.prim(main, Prim::Add, &[lo2, four]);
    let sl = ir.prim(main, Prim::MakeTuple, &[lo, hi]);
    let y = ir.prim(main, Prim::Index, &[p[0], sl]);
    ir.ret(main, y);
    let types = ir
        .infer(main, &[t(F32, &[400, 3]), AbsVal::scalar(I64)])
        .unwrap();
    assert_eq!(types.result().to_string(), "f32[4, 3]");
    let types = ir
        .infer(main, &[t(F32, &[400, 3]), AbsVal::int(2, false)])
        .unwrap();
    assert_eq!(types.result().to_string(), "f32[4, 3]");
    // a window longer than the axis
    let err = ir
        .infer(main, &[t(F32, &[3, 3]), AbsVal::scalar(I64)])
        .unwrap_err();
    assert_eq!(
        err.message,
        "slice of length 4 is out of range for axis 0 of size 3"
    );
    // bounds of unrelated dynamic values
    let (g, q) = ir.graph("g", &["x", "a", "b"]);
    let sl = ir.prim(g, Prim::MakeTuple, &[q[1], q[2]]);
    let y = ir.prim(g, Prim::Index, &[q[0], sl]);
    ir.ret(g, y);
    let err = ir
        .infer(g, &[t(F32, &[8]), AbsVal::scalar(I64), AbsVal::scalar(I64)])
        .unwrap_err();
    assert!(err.message.contains("`e : e + c`"), "{}", err.message);
    assert_eq!(err.loc, ir.loc_of(y));
}

#[test]
fn tree_map_calls_its_function_per_leaf() {
    // tree_map(|w, g| w - 0.1 * g, params, grads)
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["p", "g"]);
    let (upd, q) = ir.graph("main.lambda", &["w", "g"]);
    let lr = ir.float(0.1);
    let s = ir.prim(upd, Prim::Mul, &[lr, q[1]]);
    let d = ir.prim(upd, Prim::Sub, &[q[0], s]);
    ir.ret(upd, d);
    let f = ir.gref(upd);
    let m = ir.prim(main, Prim::TreeMap, &[f, p[0], p[1]]);
    ir.ret(main, m);
    let params = AbsVal::Record(vec![
        ("w".into(), t(F32, &[4, 3])),
        ("b".into(), AbsVal::Tuple(vec![t(F32, &[3])])),
    ]);
    let types = ir.infer(main, &[params.clone(), params.clone()]).unwrap();
    assert_eq!(types.result(), &params);
    assert_eq!(types.specs_of(upd).len(), 2);
    let other = AbsVal::Record(vec![("w".into(), t(F32, &[4, 3]))]);
    let err = ir.infer(main, &[params, other]).unwrap_err();
    assert!(
        err.message
            .starts_with("tree_map: trees have different structures"),
        "{}",
        err.message
    );
}

#[test]
fn type_of_joins_over_specialisations() {
    let mut ir = Ir::default();
    let (id, q) = ir.graph("id", &["x"]);
    let one = ir.int(1);
    let y = ir.prim(id, Prim::Mul, &[q[0], one]);
    ir.ret(id, y);
    let (main, p) = ir.graph("main", &["a", "b"]);
    let fr = ir.gref(id);
    let ca = ir.call(main, fr, &[p[0]]);
    let cb = ir.call(main, fr, &[p[1]]);
    let out = ir.prim(main, Prim::MakeTuple, &[ca, cb]);
    ir.ret(main, out);
    let types = ir.infer(main, &[t(F32, &[3]), t(F32, &[4])]).unwrap();
    assert_eq!(types.specs_of(id).len(), 2);
    assert_eq!(ir.ty(&types, y), "f32[3] | f32[4]");
    let types = ir.infer(main, &[t(F32, &[3]), t(F32, &[3])]).unwrap();
    assert_eq!(types.specs_of(id).len(), 1);
    assert_eq!(ir.ty(&types, y), "f32[3]");
}

#[test]
fn an_if_on_a_literal_condition_still_needs_branches_of_one_type() {
    // let c = true; let v = if c { 1.0 } else { (1.0, 2.0) };
    let mut ir = Ir::default();
    let (main, _) = ir.graph("main", &[]);
    let (then, _) = ir.graph("main.then", &[]);
    let one = ir.float(1.0);
    ir.ret(then, one);
    let (els, _) = ir.graph("main.else", &[]);
    let (a, b) = (ir.float(1.0), ir.float(2.0));
    let pair = ir.prim(els, Prim::MakeTuple, &[a, b]);
    ir.ret(els, pair);
    let c = ir.konst(Const::Bool(true));
    let r = ir.if_(main, c, then, els);
    ir.ret(main, r);
    let err = ir.infer(main, &[]).unwrap_err();
    assert_eq!(
        err.message,
        "if branches have different types: f64[] and (f64[], f64[])"
    );
    assert_eq!(err.loc, ir.loc_of(r));
    assert_eq!(err.secondary.len(), 2);
    assert_eq!(err.secondary[1].0, ir.loc_of(pair));
    // with joinable branches the result is the taken branch's, constants kept
    let mut ir = Ir::default();
    let (main, _) = ir.graph("main", &[]);
    let (then, _) = ir.graph("main.then", &[]);
    let three = ir.int(3);
    ir.ret(then, three);
    let (els, _) = ir.graph("main.else", &[]);
    let four = ir.int(4);
    ir.ret(els, four);
    let (one, two) = (ir.int(1), ir.int(2));
    let c = ir.prim(main, Prim::Gt, &[one, two]);
    let r = ir.if_(main, c, then, els);
    ir.ret(main, r);
    let types = ir.infer(main, &[]).unwrap();
    assert_eq!(types.result(), &AbsVal::int(4, true));
    assert_eq!(types.specs_of(then).len(), 1);
}

/// `let mut i = 0; while i < 10 { use(x, i); i += 1; }` with `use` given.
fn counter_loop(
    ir: &mut Ir,
    main: GraphId,
    x: NodeId,
    body_use: impl Fn(&mut Ir, GraphId, NodeId) -> NodeId,
) {
    let (header, h) = ir.graph("main.while", &["i", "io"]);
    let (body, _) = ir.graph("main.body", &[]);
    let (after, _) = ir.graph("main.after", &[]);
    let ten = ir.int(10);
    let c = ir.prim(header, Prim::Lt, &[h[0], ten]);
    let r = ir.if_(header, c, body, after);
    ir.ret(header, r);
    let v = body_use(ir, body, h[0]);
    let io = ir.prim(body, Prim::Print, &[h[1], v]);
    let one = ir.int(1);
    let i1 = ir.prim(body, Prim::Add, &[h[0], one]);
    let hr = ir.gref(header);
    let tail = ir.call(body, hr, &[i1, io]);
    ir.ret(body, tail);
    let u = ir.unit();
    let res = ir.prim(after, Prim::MakeTuple, &[h[1], u]);
    ir.ret(after, res);
    let _ = x;
    let zero = ir.int(0);
    let hr = ir.gref(header);
    let io0 = ir.m.graph(main).params[1];
    let start = ir.call(main, hr, &[zero, io0]);
    ir.ret(main, start);
}

#[test]
fn an_index_from_a_loop_counter_is_checked_at_run_time() {
    // print(x[i]) for i in 0..10 with x of 3 elements: a run-time error
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "io"]);
    counter_loop(&mut ir, main, p[0], |ir, body, i| {
        ir.prim(body, Prim::Index, &[p[0], i])
    });
    let types = ir.infer(main, &[t(F64, &[3]), AbsVal::Io]).unwrap();
    assert_eq!(types.result().to_string(), "(io, ())");
    // a literal index out of range is a compile-time error
    let (g, q) = ir.graph("g", &["x"]);
    let three = ir.int(3);
    let e = ir.prim(g, Prim::Index, &[q[0], three]);
    ir.ret(g, e);
    let err = ir.infer(g, &[t(F64, &[3])]).unwrap_err();
    assert_eq!(err.message, "index 3 is out of range for axis 0 of size 3");
    assert_eq!(err.loc, ir.loc_of(e));
}

#[test]
fn a_slice_offset_from_a_loop_counter_is_checked_at_run_time() {
    // sum(x[b * 2 : b * 2 + 2]) for b in 0..10 with x of 5 elements
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "io"]);
    counter_loop(&mut ir, main, p[0], |ir, body, b| {
        let two = ir.int(2);
        let lo = ir.prim(body, Prim::Mul, &[b, two]);
        let lo2 = ir.prim(body, Prim::Mul, &[b, two]);
        let hi = ir.prim(body, Prim::Add, &[lo2, two]);
        let sl = ir.prim(body, Prim::MakeTuple, &[lo, hi]);
        ir.prim(body, Prim::Index, &[p[0], sl])
    });
    let types = ir.infer(main, &[t(F64, &[5]), AbsVal::Io]).unwrap();
    assert_eq!(types.result().to_string(), "(io, ())");
    // but the slice's length must fit
    let err = ir.infer(main, &[t(F64, &[1]), AbsVal::Io]).unwrap_err();
    assert_eq!(
        err.message,
        "slice of length 2 is out of range for axis 0 of size 1"
    );
}

#[test]
fn data_of_unknown_type_is_checked_at_run_time() {
    // let (io, d) = load_npy(io, path); print(io, d * 2.0, x + 1.0)
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "path", "io"]);
    let loaded = ir.prim(main, Prim::LoadNpy, &[p[2], p[1]]);
    let (zero, one) = (ir.int(0), ir.int(1));
    let io = ir.prim(main, Prim::TupleGet, &[loaded, zero]);
    let d = ir.prim(main, Prim::TupleGet, &[loaded, one]);
    let two = ir.float(2.0);
    let d2 = ir.prim(main, Prim::Mul, &[d, two]);
    let fl = ir.float(1.0);
    let x1 = ir.prim(main, Prim::Add, &[p[0], fl]);
    let io2 = ir.prim(main, Prim::Print, &[io, d2, x1]);
    let out = ir.prim(main, Prim::MakeTuple, &[io2, d2]);
    ir.ret(main, out);
    let types = ir
        .infer(main, &[t(F32, &[2]), AbsVal::Str(None), AbsVal::Io])
        .unwrap();
    assert_eq!(types.result().to_string(), "(io, ?)");
    assert_eq!(ir.ty(&types, x1), "f32[2]");
}

#[test]
fn arange_of_a_float_literal() {
    let mut ir = Ir::default();
    let (main, _) = ir.graph("main", &[]);
    let n = ir.float(3.0);
    let u = ir.unit();
    let a = ir.prim(main, Prim::Arange, &[n, u]);
    ir.ret(main, a);
    let types = ir.infer(main, &[]).unwrap();
    assert_eq!(types.result().to_string(), "f32[3]");
}

#[test]
fn dead_code_is_typed_too() {
    // fn main(x) { let unused = x * 2.0; let bad = x @ x; x }
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x"]);
    let two = ir.float(2.0);
    let unused = ir.prim(main, Prim::Mul, &[p[0], two]);
    ir.ret(main, p[0]);
    let types = ir.infer(main, &[t(F32, &[3, 4])]).unwrap();
    assert_eq!(ir.ty(&types, unused), "f32[3, 4]");
    let bad = ir.prim(main, Prim::Matmul, &[p[0], p[0]]);
    let err = ir.infer(main, &[t(F32, &[3, 4])]).unwrap_err();
    assert_eq!(err.loc, ir.loc_of(bad));
}

#[test]
fn differentiation_helpers_on_tensors() {
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "b", "idx"]);
    let (x, b, idx) = (p[0], p[1], p[2]);
    let (zero_i, one, two, u) = (ir.int(0), ir.int(1), ir.int(2), ir.unit());
    let no = ir.konst(Const::Bool(false));
    let st = ir.prim(main, Prim::StopGradient, &[x]);
    let mt = ir.prim(main, Prim::MatrixT, &[x]);
    let dg = ir.prim(main, Prim::Digamma, &[x]);
    let dg2 = ir.prim(main, Prim::Digamma, &[two]);
    let s = ir.prim(main, Prim::SumTo, &[x, b]);
    let sb = ir.prim(main, Prim::SumTo, &[x, x]);
    let mask = ir.prim(main, Prim::ExtremumMask, &[x, one, no]);
    let mask_all = ir.prim(main, Prim::ExtremumMask, &[x, u, no]);
    let perm = ir.prim(main, Prim::TensorLiteral, &[one, zero_i]);
    let tg = ir.prim(main, Prim::TransposeGrad, &[mt, perm]);
    let tg2 = ir.prim(main, Prim::TransposeGrad, &[mt, u]);
    let xs = ir.prim(main, Prim::MakeTuple, &[x, mt]);
    let xs2 = ir.prim(main, Prim::MakeTuple, &[x, x]);
    let c = ir.prim(main, Prim::Concat, &[xs2, zero_i]);
    let sp = ir.prim(main, Prim::SplitLike, &[c, xs2, zero_i]);
    let un = ir.prim(main, Prim::Unstack, &[x, one]);
    let tk = ir.prim(main, Prim::Take, &[x, idx, one]);
    let tkg = ir.prim(main, Prim::TakeGrad, &[x, idx, one, tk]);
    let tkf = ir.prim(main, Prim::Take, &[x, idx, u]);
    let tkfg = ir.prim(main, Prim::TakeGrad, &[x, idx, u, tkf]);
    let ix = ir.prim(main, Prim::Index, &[x, one]);
    let ixg = ir.prim(main, Prim::IndexGrad, &[x, ix, one]);
    let slice = ir.prim(main, Prim::MakeTuple, &[zero_i, two]);
    let all = ir.prim(main, Prim::MakeTuple, &[u, u]);
    let ix2 = ir.prim(main, Prim::Index, &[x, all, slice]);
    let ixg2 = ir.prim(main, Prim::IndexGrad, &[x, ix2, all, slice]);
    let out = ir.prim(main, Prim::MakeTuple, &[st, xs, sp]);
    ir.ret(main, out);
    let types = ir
        .infer(main, &[t(F32, &[2, 3]), t(F32, &[3]), t(I64, &[4])])
        .unwrap();
    let cases = [
        (st, "f32[2, 3]"),
        (mt, "f32[3, 2]"),
        (dg, "f32[2, 3]"),
        (dg2, "f64[]"),
        (s, "f32[3]"),
        (sb, "f32[2, 3]"),
        (mask, "f32[2, 3]"),
        (mask_all, "f32[2, 3]"),
        (tg, "f32[2, 3]"),
        (tg2, "f32[2, 3]"),
        (sp, "(f32[2, 3], f32[2, 3])"),
        (un, "(f32[2], f32[2], f32[2])"),
        (tk, "f32[2, 4]"),
        (tkg, "f32[2, 3]"),
        (tkf, "f32[4]"),
        (tkfg, "f32[2, 3]"),
        (ixg, "f32[2, 3]"),
        (ix2, "f32[2, 2]"),
        (ixg2, "f32[2, 3]"),
    ];
    for (n, want) in cases {
        assert_eq!(ir.ty(&types, n), want);
    }
    assert_eq!(types.value_of(dg2), Some(AbsVal::weak_scalar(F64)));
    // The gradients of an int tensor keep its dtype; weak stays weak.
    let mut ir = Ir::default();
    let (g, q) = ir.graph("ints", &["x", "b", "idx"]);
    let one = ir.int(1);
    let s = ir.prim(g, Prim::SumTo, &[q[0], q[1]]);
    let sw = ir.prim(g, Prim::SumTo, &[q[1], q[1]]);
    let tk = ir.prim(g, Prim::Take, &[q[0], q[2], one]);
    let tkg = ir.prim(g, Prim::TakeGrad, &[q[0], q[2], one, tk]);
    let out = ir.prim(g, Prim::MakeTuple, &[s, sw, tkg]);
    ir.ret(g, out);
    let w = AbsVal::Tensor(adjoint_compiler::infer::AbsTensor::new(I64, vec![3], true));
    let types = ir.infer(g, &[t(I64, &[2, 3]), w, t(I64, &[4])]).unwrap();
    assert_eq!(types.result().to_string(), "(i64[3], i64[3], i64[2, 3])");
    assert!(!types.value_of(s).unwrap().as_tensor().unwrap().weak);
    assert!(types.value_of(sw).unwrap().as_tensor().unwrap().weak);
}

#[test]
fn differentiation_helpers_report_shape_errors() {
    let check = |build: &dyn Fn(&mut Ir, GraphId, &[NodeId]) -> NodeId, want: &str| {
        let mut ir = Ir::default();
        let (main, p) = ir.graph("main", &["x", "b"]);
        let n = build(&mut ir, main, &p);
        ir.ret(main, n);
        let err = ir
            .infer(main, &[t(F32, &[2, 3]), t(F32, &[2])])
            .unwrap_err();
        assert_eq!(err.message, want);
        assert_eq!(err.loc, ir.loc_of(n));
    };
    check(
        &|ir, g, p| ir.prim(g, Prim::SumTo, &[p[0], p[1]]),
        "sum_to: cannot sum f32[2, 3] to the shape of f32[2]",
    );
    check(
        &|ir, g, p| ir.prim(g, Prim::MatrixT, &[p[1]]),
        "mT: expected at least 2 dimensions, got f32[2]",
    );
    check(
        &|ir, g, p| {
            let i = ir.int(0);
            let idx = ir.prim(g, Prim::TensorLiteral, &[i]);
            ir.prim(g, Prim::TakeGrad, &[p[0], idx, i, p[1]])
        },
        "take_grad: the gradient f32[2] does not match the shape [1, 3] of take",
    );
    check(
        &|ir, g, p| {
            let i = ir.int(1);
            ir.prim(g, Prim::IndexGrad, &[p[0], p[1], i])
        },
        "index_grad: the gradient f32[2] does not match the shape [3] of the index",
    );
    check(
        &|ir, g, p| {
            let i = ir.int(2);
            ir.prim(g, Prim::IndexGrad, &[p[0], p[1], i])
        },
        "index 2 is out of range for axis 0 of size 2",
    );
    check(
        &|ir, g, p| {
            let xs = ir.prim(g, Prim::MakeTuple, &[p[0], p[0]]);
            let i = ir.int(1);
            ir.prim(g, Prim::SplitLike, &[p[0], xs, i])
        },
        "split_like: the pieces have 6 elements along axis 1, but f32[2, 3] has 3",
    );
    check(
        &|ir, g, p| {
            let i = ir.int(2);
            ir.prim(g, Prim::Unstack, &[p[0], i])
        },
        "unstack: axis 2 is out of range for f32[2, 3]",
    );
    check(
        &|ir, g, p| {
            let i = ir.int(0);
            ir.prim(g, Prim::TransposeGrad, &[p[0], i])
        },
        "transpose_grad: [0] is not a permutation of the 2 axes of f32[2, 3]",
    );
    check(
        &|ir, g, p| {
            let t = ir.prim(g, Prim::MakeTuple, &[p[0]]);
            let i = ir.int(1);
            ir.prim(g, Prim::TupleGrad, &[t, i, p[1]])
        },
        "tuple_grad: index 1 is out of range for a tuple of 1",
    );
    check(
        &|ir, g, p| {
            let t = ir.prim(g, Prim::MakeTuple, &[p[0]]);
            ir.prim(g, Prim::TreeFill, &[t, p[1]])
        },
        "tree_fill: expected a scalar, got f32[2]",
    );
}

#[test]
fn cotangent_structures_and_symbolic_zeros() {
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x", "b", "s"]);
    let (x, b, s) = (p[0], p[1], p[2]);
    let (nw, nb, name) = (ir.string("w"), ir.string("b"), ir.string("name"));
    let (one, neg1) = (ir.int(1), ir.int(-1));
    let z = ir.prim(main, Prim::Zero, &[]);
    let isz = ir.prim(main, Prim::IsZero, &[z]);
    let isx = ir.prim(main, Prim::IsZero, &[x]);
    let a1 = ir.prim(main, Prim::GAdd, &[z, x]);
    let a2 = ir.prim(main, Prim::GAdd, &[x, z]);
    let a3 = ir.prim(main, Prim::GAdd, &[z, z]);
    let a4 = ir.prim(main, Prim::GAdd, &[x, b]);
    let lit = ir.float(1.0);
    let a5 = ir.prim(main, Prim::GAdd, &[lit, x]);
    let t1 = ir.prim(main, Prim::MakeTuple, &[x, z]);
    let t2 = ir.prim(main, Prim::MakeTuple, &[z, b]);
    let a6 = ir.prim(main, Prim::GAdd, &[t1, t2]);
    let r1 = ir.prim(main, Prim::MakeRecord, &[nw, x, nb, z]);
    let r2 = ir.prim(main, Prim::MakeRecord, &[nb, b, nw, z]);
    let a7 = ir.prim(main, Prim::GAdd, &[r1, r2]);
    // Structures that do not match are left to the kernel.
    let a8 = ir.prim(main, Prim::GAdd, &[x, t1]);
    let e1 = ir.prim(main, Prim::EnvSetitem, &[z, one, x]);
    let e2 = ir.prim(main, Prim::EnvGetitem, &[e1, one]);
    let fwd = ir.prim(main, Prim::MakeRecord, &[nw, x, nb, b, name, s]);
    let tup = ir.prim(main, Prim::MakeTuple, &[x, fwd, s]);
    let f1 = ir.prim(main, Prim::GradFinalize, &[z, tup]);
    let f2 = ir.prim(main, Prim::GradFinalize, &[a1, x]);
    let tg = ir.prim(main, Prim::TupleGrad, &[tup, one, b]);
    let tg2 = ir.prim(main, Prim::TupleGrad, &[tup, neg1, b]);
    let rg = ir.prim(main, Prim::RecordGrad, &[fwd, nb, b]);
    let u = ir.unit();
    let no = ir.konst(Const::Bool(false));
    let total = ir.prim(main, Prim::Sum, &[x, u, no]);
    let params = ir.prim(main, Prim::MakeRecord, &[nw, x, nb, b]);
    let fill = ir.prim(main, Prim::TreeFill, &[params, total]);
    let fill_z = ir.prim(main, Prim::TreeFill, &[params, z]);
    let out = ir.prim(main, Prim::MakeTuple, &[a1, f1, fill]);
    ir.ret(main, out);
    let types = ir
        .infer(main, &[t(F32, &[2, 3]), t(F32, &[3]), AbsVal::Str(None)])
        .unwrap();
    let cases = [
        (z, "zero"),
        (isz, "bool[]"),
        (isx, "bool[]"),
        (a1, "f32[2, 3]"),
        (a2, "f32[2, 3]"),
        (a3, "zero"),
        (a4, "f32[2, 3]"),
        (a5, "f32[2, 3]"),
        (a6, "(f32[2, 3], f32[3])"),
        (a7, "{w: f32[2, 3], b: f32[3]}"),
        (a8, "?"),
        (e1, "?"),
        (e2, "?"),
        (f1, "(f32[2, 3], {w: f32[2, 3], b: f32[3], name: ()}, ())"),
        (f2, "f32[2, 3]"),
        (tg, "(zero, f32[3], zero)"),
        (tg2, "(zero, zero, f32[3])"),
        (rg, "{w: zero, b: f32[3], name: zero}"),
        (fill, "{w: f32[2, 3], b: f32[3]}"),
        (fill_z, "?"),
    ];
    for (n, want) in cases {
        assert_eq!(ir.ty(&types, n), want);
    }
    // is_zero folds: true of the symbolic zero, false of a known tensor.
    assert_eq!(types.value_of(isz).unwrap().const_int(), Some(1));
    assert_eq!(types.value_of(isx).unwrap().const_int(), Some(0));
    // A cotangent of unknown type may add to any part of a structure.
    assert_eq!(ir.ty(&types, a6), "(f32[2, 3], f32[3])");
}

#[test]
fn unknown_values_flow_without_false_errors() {
    // fn main(c, x) {
    //   let d = if c { zero() } else { x };
    //   (d, gadd(d, x), tuple_get(zero(), 0), record_get(zero(), "w"),
    //    zero()(x), tree_sum((d, x)), concat((d, x)), grad_finalize(d, x))
    // }
    // A part of the symbolic zero is the symbolic zero, as in the kernels.
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["c", "x"]);
    let (then, _) = ir.graph("main.then", &[]);
    let z = ir.prim(then, Prim::Zero, &[]);
    ir.ret(then, z);
    let (els, _) = ir.graph("main.else", &[]);
    ir.ret(els, p[1]);
    let d = ir.if_(main, p[0], then, els);
    let sum = ir.prim(main, Prim::GAdd, &[d, p[1]]);
    let z2 = ir.prim(main, Prim::Zero, &[]);
    let zero_i = ir.int(0);
    let tg = ir.prim(main, Prim::TupleGet, &[z2, zero_i]);
    let nw = ir.string("w");
    let rg = ir.prim(main, Prim::RecordGet, &[z2, nw]);
    let called = ir.call(main, z2, &[p[1]]);
    let pair = ir.prim(main, Prim::MakeTuple, &[d, p[1]]);
    let ts = ir.prim(main, Prim::TreeSum, &[pair]);
    let cat = ir.prim(main, Prim::Concat, &[pair, zero_i]);
    let fin = ir.prim(main, Prim::GradFinalize, &[d, p[1]]);
    let mul = ir.prim(main, Prim::Mul, &[d, p[1]]);
    let out = ir.prim(
        main,
        Prim::MakeTuple,
        &[d, sum, tg, rg, called, ts, cat, fin, mul],
    );
    ir.ret(main, out);
    let types = ir
        .infer(main, &[AbsVal::scalar(Bool), t(F32, &[3])])
        .unwrap();
    assert_eq!(
        types.result().to_string(),
        "(?, f32[3], zero, zero, ?, ?, ?, f32[3], ?)"
    );
    // With the condition known, the taken branch's type is kept.
    let types = ir
        .infer(main, &[AbsVal::bool(false), t(F32, &[3])])
        .unwrap();
    assert_eq!(ir.ty(&types, d), "f32[3]");
    assert_eq!(ir.ty(&types, ts), "f32[]");
}

/// Closures hidden with `ad_hide` (a reversed loop's records) are
/// evaluated on arguments of unknown type after the entry: their values
/// hold for every call (`covers_all_calls`), typed from what they capture
/// and from `grad_finalize`. One whose evaluation fails, or that is also
/// made where it is not hidden, is left escaped, and inference of the
/// program still succeeds.
#[test]
fn hidden_closures_are_typed_for_every_call() {
    let mut ir = Ir::default();
    let (main, p) = ir.graph("main", &["x"]);
    let e = ir.prim(main, Prim::Exp, &[p[0]]);
    // B(d) = grad_finalize(d[1], x) * e
    let (b, bp) = ir.graph("B.step", &["dcall"]);
    let one = ir.int(1);
    let d1 = ir.prim(b, Prim::TupleGet, &[bp[0], one]);
    let dense = ir.prim(b, Prim::GradFinalize, &[d1, p[0]]);
    let m = ir.prim(b, Prim::Mul, &[dense, e]);
    ir.ret(b, m);
    // C(d) = e * "text": an error on any call.
    let (c, _) = ir.graph("B.bad", &["dcall"]);
    let text = ir.string("text");
    let bad = ir.prim(c, Prim::Mul, &[e, text]);
    ir.ret(c, bad);
    let unit = ir.unit();
    let (bref, cref) = (ir.gref(b), ir.gref(c));
    let pushed = ir.prim(main, Prim::MakeTuple, &[bref, unit]);
    let hidden = ir.prim(main, Prim::AdHide, &[pushed]);
    let pushed2 = ir.prim(main, Prim::MakeTuple, &[cref, hidden]);
    let hidden2 = ir.prim(main, Prim::AdHide, &[pushed2]);
    // D is made at two places, one of them not hidden: inference cannot
    // know every closure of it.
    let (dg, dp) = ir.graph("B.twice", &["dcall"]);
    let dm = ir.prim(dg, Prim::Mul, &[dp[0], e]);
    ir.ret(dg, dm);
    let (dref, dref2) = (ir.gref(dg), ir.gref(dg));
    let pushed3 = ir.prim(main, Prim::MakeTuple, &[dref, unit]);
    let hidden3 = ir.prim(main, Prim::AdHide, &[pushed3]);
    let out = ir.prim(main, Prim::MakeTuple, &[e, hidden2, hidden3, dref2]);
    ir.ret(main, out);
    let types = ir.infer(main, &[t(F32, &[3])]).unwrap();
    assert!(!types.covers_all_calls(dg));
    assert!(types.is_escaped(b) && types.covers_all_calls(b));
    assert_eq!(ir.ty(&types, dense), "f32[3]");
    assert_eq!(ir.ty(&types, m), "f32[3]");
    assert!(types.is_escaped(c) && !types.covers_all_calls(c));
    assert!(!types.covers_all_calls(main));
}
