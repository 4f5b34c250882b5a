//! Every construct of docs/language.md §1–4 parses, including the example
//! snippets (placeholders such as `...` or `x..` filled in with code).

use adjoint_lang::*;

/// Parses a whole program and asserts there is no diagnostic.
fn ok(src: &str) -> Module {
    let mut sm = SourceMap::new();
    let f = sm.add_file("test.adj", src);
    let (m, diags) = parse(f, src);
    assert!(
        diags.is_empty(),
        "unexpected diagnostics for:\n{src}\n{}",
        render(&diags, &sm, false)
    );
    m
}

/// Parses `body` as the body of a function and returns the dump.
fn ok_body(body: &str) -> String {
    let src = format!("fn main() {{\n{body}\n}}\n");
    let m = ok(&src);
    let sm = SourceMap::new();
    dump(&m, &sm)
}

/// Parses an expression and returns its dump.
fn ok_expr(src: &str) -> String {
    let (e, diags) = parse_expr(FileId(0), src);
    assert!(diags.is_empty(), "{src}: {diags:?}");
    dump_expr(&e.unwrap())
}

const SECTION3: &str = r#"
import nn                 // the standard library module stdlib/nn.adj
import "layers.adj" as ly // a file next to this one

fn square(x) = x * x      // expression body

fn power(x, n: i64) {     // block body: statements, then a final expression
    let mut acc = 1.0;
    for i in 0..n {
        acc = acc * x;
    }
    acc
}

fn main() {
    print(grad(square)(3.0));       // 6
    print(grad(grad(square))(3.0)); // 2
    print(power(2.0, 10));          // 1024
}
"#;

#[test]
fn section3_program() {
    let m = ok(SECTION3);
    assert_eq!(m.items.len(), 5);
    assert!(
        matches!(&m.items[0], Item::Import(Import { module: ImportPath::Name(n), alias: None, .. }) if n.name == "nn")
    );
    assert!(
        matches!(&m.items[1], Item::Import(Import { module: ImportPath::File { path, .. }, alias: Some(a), .. }) if path == "layers.adj" && a.name == "ly")
    );
    let Item::Fn(power) = &m.items[3] else {
        panic!()
    };
    assert_eq!(power.name.name, "power");
    assert_eq!(power.params.len(), 2);
    let ExprKind::Block(b) = &*power.body.kind else {
        panic!()
    };
    assert_eq!(b.stmts.len(), 2);
    assert!(matches!(&*b.tail.as_ref().unwrap().kind, ExprKind::Name(n) if n == "acc"));
}

#[test]
fn lexical_section() {
    ok_body("// line comment\n/* block /* nested */ comment */ let x = 1;");
    ok_body("let _a1 = 0; let b = 42; let c = 1_000;");
    ok_body("let f = [1.0, .5, 1e-3, 2.5e+4];");
    ok_body(r#"print("a\n\tb\"c\\");"#);
    ok_body("let t = (1, (2, 3)); let a = t.0; let b = t.1.0; let c = shape(x).1;");
    ok_body("for i in 0..10 { }");
    // every operator
    ok_body(
        "let a = 1 + 2 - 3 * 4 / 5 % 6 ** 7 @ x;
         let b = a == b || a != b && a < b || a <= b || a > b || a >= b && !c;
         let mut c = 1; c = 2; c += 1; c -= 1; c *= 2; c /= 2;",
    );
    // trailing commas in every list
    ok("fn f(a, b,) { g(a, b,); let (x, y,) = (1, 2,); let { w, b, } = p; [1, 2,]; x[1, 2,]; { w: 1, b: 2, }; |x, y,| x; 0 }");
    ok("fn f(p: { w: f32[4, 3,], b: f32, }, t: (f64, f64,),) = p");
}

#[test]
fn values_and_types_section() {
    ok_body("let a = 3.0; let b = 1e-3; let c = 3; let d = -7; let e = true; let f = x > 0.0;");
    ok_body("let a = [1.0, 2.0]; let b = [[1, 2], [3, 4]]; let c = zeros([3, 4]);");
    ok_body("let a = (a, b); let b = (a,); let c = ();");
    ok_body("let r = { w: w0, b: b0 };");
    ok_body("let f = square; let g = |x| x * a; let h = grad(f);");
    ok_body(r#"let s = "data.npy";"#);
    ok("fn f(x: f32[128, 784], n: i64, p: { w: f32[4, 3], b: f32[3] }, t: (f64, f64)) -> f32 { x }");
    ok("fn s(x: f32[]) -> (f32,) = (x,)");
    ok_body("let mut s = 0.0; s = s + loss;");
    ok_body("let a = f32(x); let b = f64(x); let c = i64(x); let d = i32(x); let e = bool(x);");
}

#[test]
fn programs_section() {
    ok("fn name(a, b) = a + b;");
    ok("fn name(a, b) { a + b }");
    ok("fn f(x, lr = 0.01) = x * lr\nfn g() = f(1.0, lr = 0.1)");
    ok("fn even(n) = if n == 0 { true } else { odd(n - 1) }\nfn odd(n) = if n == 0 { false } else { even(n - 1) }");
    ok_body(
        "fn local(y) { y + x }\nfn fact(n) = if n <= 1 { 1 } else { n * fact(n - 1) };\nlocal(1.0)",
    );
    ok_body("let (a, b) = f(x); let { w, b } = p; let mut x = x;");
    ok_body("let x = { let y = 1; y + 1 }; let u = { f(y); };");
    ok_body("let mut x = 0; x = e; x += e; (a, b) = e;");
    ok_body("let v = if c { a } else { b };");
    ok_body("if c { x = 1; } else if d { x = 2; } else { x = 3; }\nif c { x = 4; }");
    ok_body("for i in a..b { s += i; }");
    ok_body("for i in 1..p + 1 { }");
    ok_body("while c { c = f(c); }");
    ok_body("for i in progress(a..b) { }");
    ok_body("for i in 0..10 { if i == 3 { break; } if i == 4 { continue; } }");
    ok_body("for x in t { print(x); }");
    ok("fn f(x) { if x < 0.0 { return -x; } return x; }");
    ok("fn f(x) { if x { return; } }");
    ok_body("let f = |x| x * a; let g = |x, y| { let z = x + y; z * z }; let h = || a + 1.0;");
    ok_body("let o = -x ** 2 == -(x ** 2); let p = 2 ** 3 ** 2 == 512;");
    ok_body("let c = a @ b; let d = a / b % c;");
    ok_body("x[i]; x[i, j]; x[1:3]; x[:, 0]; x[2:]; x[:, :3]; x[b * 64 : b * 64 + 64]; x[:];");
    ok_body("p.w; t.0; nn.dense(p, x)");
}

#[test]
fn differentiation_section() {
    ok_body("grad(f); grad(f, argnums = (0, 2)); value_and_grad(f); value_and_grad(f, argnums = (0, 1));");
    ok_body("let (y, pullback) = vjp(f, x, y); pullback(dy);");
    ok_body("let (y, dy) = jvp(f, (x, y), (dx, dy));");
    ok_body("stop_gradient(x); grad(grad(f)); jvp(grad(f), (x,), (dx,));");
    ok_body("grad(f, argnums = (1,))");
    ok("bprop name(x, y, out, dout) { (dout * y, dout * x) }");
    ok("bprop name(x, y, out, dout) = (dout * y, dout * x);");
    ok("bprop relu(x, out, dout) = (where(x > 0.0, dout, 0.0),)");
}

#[test]
fn primitives_section() {
    ok_body("where(c, a, b); sum(x, axis = 0); sum(x, axis = (0, 1), keepdims = true); max(x);");
    ok_body(
        "reshape(x, [2, 3]); transpose(x); transpose(x, perm = [1, 0]); concat((a, b), axis = 0);",
    );
    ok_body("stack((a, b), axis = 0); expand_dims(x, 0); squeeze(x); squeeze(x, axis = 1); take(x, idx, axis = 0);");
    ok_body("zeros([3, 4]); full([2], v); arange(n); eye(n); one_hot(labels, n); zeros([3], dtype = f64);");
    ok_body("randn([3], seed = s); rand([3], seed = s); permutation(n, seed = s); tree_map(f, t, u); tree_sum(t);");
    ok_body(
        r#"print(dtype(x), shape(x)); save_npy("x.npy", x); let d = load_safetensors("m.st");"#,
    );
}

#[test]
fn block_tail_rules() {
    // a trailing `if` without `;` is the block's value
    let d = ok_body("if c { 1 } else { 2 }");
    assert!(
        d.contains("(tail (if c (block (tail 1)) (block (tail 2))))"),
        "{d}"
    );
    // with `;` it is a statement
    let d = ok_body("if c { 1 } else { 2 };");
    assert!(d.contains("(expr (if"), "{d}");
    assert!(!d.contains("(tail (if"), "{d}");
    // an `if` statement is not continued by a binary operator (as in Rust)
    let d = ok_body("if c { a } else { b }\n-1");
    assert!(d.contains("(stmt (if"), "{d}");
    assert!(d.contains("(tail (neg 1))"), "{d}");
    // but in expression position it is an operand
    assert_eq!(
        ok_expr("if c { a } else { b } - 1"),
        "(- (if c (block (tail a)) (block (tail b))) 1)"
    );
    // `{}` is an empty block, `{ x }` a block, `{ x: 1 }` a record
    assert_eq!(ok_expr("{}"), "(block)");
    assert_eq!(ok_expr("{ x }"), "(block (tail x))");
    assert_eq!(ok_expr("{ x: 1 }"), "(record (x 1))");
    let d = ok_body("{ w: 1 }.w");
    assert!(d.contains("(tail (field (record (w 1)) w))"), "{d}");
}

#[test]
fn lambdas() {
    assert_eq!(ok_expr("|x| x * a"), "(lambda (params x) (* x a))");
    assert_eq!(ok_expr("|| a + 1.0"), "(lambda (params) (+ a 1.0))");
    assert_eq!(ok_expr("| | 1"), "(lambda (params) 1)");
    assert_eq!(ok_expr("|x: f32, y| x"), "(lambda (params (x : f32) y) x)");
    assert_eq!(ok_expr("f(|x| x, 2)"), "(call f (lambda (params x) x) 2)");
    assert_eq!(
        ok_expr("|x| |y| x + y"),
        "(lambda (params x) (lambda (params y) (+ x y)))"
    );
    // `||` in operator position is logical or
    assert_eq!(ok_expr("a || b"), "(|| a b)");
}

#[test]
fn tuples_records_tensors() {
    assert_eq!(ok_expr("()"), "(tuple)");
    assert_eq!(ok_expr("(a)"), "a");
    assert_eq!(ok_expr("(a,)"), "(tuple a)");
    assert_eq!(ok_expr("(a, b)"), "(tuple a b)");
    assert_eq!(ok_expr("[]"), "(tensor)");
    assert_eq!(
        ok_expr("[[1, 2], [3, 4]]"),
        "(tensor (tensor 1 2) (tensor 3 4))"
    );
    assert_eq!(
        ok_expr("{ w: w0, b: { c: 1 } }"),
        "(record (w w0) (b (record (c 1))))"
    );
}

#[test]
fn patterns() {
    let d = ok_body("let (a, (b, _), ()) = x; let { w, b: (c, d) } = p; let { w: w2 } = p; let _ = 1; let (z) = 2;");
    assert!(d.contains("(let (tuple a (tuple b _) (tuple)) x)"), "{d}");
    assert!(d.contains("(let (record w (b (tuple c d))) p)"), "{d}");
    assert!(d.contains("(let (record (w w2)) p)"), "{d}");
    assert!(d.contains("(let _ 1)"), "{d}");
    assert!(d.contains("(let z 2)"), "{d}");
    let d = ok_body("let x: f32[3] = y; let mut (a, b): (f32, f32) = t;");
    assert!(d.contains("(let x : f32[3] y)"), "{d}");
    assert!(d.contains("(let mut (tuple a b) : (f32, f32) t)"), "{d}");
    let d = ok_body("for (i, x) in t { }");
    assert!(d.contains("(for (tuple i x) t (block))"), "{d}");
    let d = ok_body("(a, _) = f(); ((a, b), c) = g();");
    assert!(d.contains("(= (tuple a _) (call f))"), "{d}");
    assert!(d.contains("(= (tuple (tuple a b) c) (call g))"), "{d}");
}

#[test]
fn for_iterators() {
    let d = ok_body("for i in 0..n { }\nfor i in progress(0..n) { }\nfor x in (a, b) { }\nfor i in 1..p + 1 { }");
    assert!(d.contains("(for i (range 0 n) (block))"), "{d}");
    assert!(d.contains("(for i (progress 0 n) (block))"), "{d}");
    assert!(d.contains("(for x (tuple a b) (block))"), "{d}");
    assert!(d.contains("(for i (range 1 (+ p 1)) (block))"), "{d}");
    // `progress(a..b)` is only special as the whole iterable
    let m = ok("fn f() { for i in progress(0..n) { } }");
    let Item::Fn(f) = &m.items[0] else { panic!() };
    let ExprKind::Block(b) = &*f.body.kind else {
        panic!()
    };
    assert!(b.tail.is_none());
    assert!(matches!(
        &b.stmts[0].kind,
        StmtKind::For {
            iter: ForIter::Progress { .. },
            ..
        }
    ));
}

#[test]
fn calls_fields_indexing() {
    assert_eq!(ok_expr("f(x, lr = 0.1)"), "(call f x (kw lr 0.1))");
    assert_eq!(ok_expr("nn.dense(p, x)"), "(call (field nn dense) p x)");
    assert_eq!(
        ok_expr("f(x)(y)[0].a.1"),
        "(get (field (index (call (call f x) y) 0) a) 1)"
    );
    assert_eq!(ok_expr("x[:, :3]"), "(index x (slice _ _) (slice _ 3))");
    assert_eq!(ok_expr("x[2:]"), "(index x (slice 2 _))");
    assert_eq!(
        ok_expr("x[b * 64 : b * 64 + 64]"),
        "(index x (slice (* b 64) (+ (* b 64) 64)))"
    );
    assert_eq!(ok_expr("t.0.1"), "(get (get t 0) 1)");
    assert_eq!(ok_expr("shape(x).1"), "(get (call shape x) 1)");
}

#[test]
fn items_and_signatures() {
    let m = ok("fn f(x: f32, lr: f32 = 0.01) -> f32 { x }\nbprop f(x, lr, out, dout) { (dout, 0.0) }\nimport nn;\nimport \"a.adj\";");
    assert_eq!(m.items.len(), 4);
    let Item::Fn(f) = &m.items[0] else { panic!() };
    assert!(f.ret.is_some());
    assert!(f.params[1].ty.is_some() && f.params[1].default.is_some());
    assert!(matches!(&m.items[1], Item::Bprop(b) if b.params.len() == 4));
    // an empty file is an empty module
    assert!(ok("").items.is_empty());
    assert!(ok("// only a comment\n").items.is_empty());
}

#[test]
fn spans_point_at_source() {
    let src = "fn f(x) = x + 10";
    let m = ok(src);
    let Item::Fn(f) = &m.items[0] else { panic!() };
    assert_eq!(&src[f.span.range()], src);
    assert_eq!(&src[f.body.span.range()], "x + 10");
    let ExprKind::Binary { op_span, rhs, .. } = &*f.body.kind else {
        panic!()
    };
    assert_eq!(&src[op_span.range()], "+");
    assert_eq!(&src[rhs.span.range()], "10");
    assert_eq!(&src[f.name.span.range()], "f");
    assert_eq!(&src[f.params[0].span.range()], "x");
}
