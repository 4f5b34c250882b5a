//! Property test: reverse mode, forward mode and finite differences agree.
//!
//! Random scalar programs `fn f(x, y) = ...` are generated from a small
//! grammar (`x`, `y`, constants, `+ - * /`, `sin cos exp tanh`, unary minus,
//! `if e > c { .. } else { .. }` as an expression and as a statement
//! reassigning a `mut` variable, `let` bindings and short `for` loops whose
//! body sees the loop-carried value and the counter). Each is rendered as
//! Adjoint source together with a `main` that prints, at a few points,
//! `f(x, y)`, `grad(f, argnums = (0, 1))`, the two `jvp` directional
//! derivatives and central finite differences. The test compares them
//! (relative 1e-5) and also checks `f` against an evaluator written here,
//! which is how points too near a branch boundary are recognised and
//! skipped.
//!
//! `/` and `exp` are guarded (`a / (1 + b * b)`, `exp(tanh(a))`) so that
//! the programs stay finite and well conditioned.
//!
//! `GRAD_PROPS_SHOW=1 cargo test --test grad_props -- --nocapture` prints
//! every generated program; `PROPTEST_CASES=N` runs more cases.

use adjoint::{Mode, Session};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op1 {
    Neg,
    Sin,
    Cos,
    Exp,
    Tanh,
}

#[derive(Clone, Debug)]
enum Op2 {
    Add,
    Sub,
    Mul,
    Div,
}

/// An expression. `Var(n)` names the `n % len`-th variable in scope, so any
/// generated tree is well scoped.
#[derive(Clone, Debug)]
enum E {
    Var(u8),
    Const(f64),
    Un(Op1, Box<E>),
    Bin(Op2, Box<E>, Box<E>),
    /// `if cond > c { a } else { b }`.
    If(Box<E>, f64, Box<E>, Box<E>),
    /// `{ let mut m = init; if cond > c { m = then; } m }`; `cond` and `then`
    /// see `m`.
    IfStmt(Box<E>, f64, Box<E>, Box<E>),
    /// `{ let v = a; b }`; `b` sees `v`.
    Let(Box<E>, Box<E>),
    /// `{ let mut a = init; for i in 0..k { a = body; } a }`; `body` sees
    /// `a` and `f64(i)`.
    Loop(u8, Box<E>, Box<E>),
}

/// Values at one point, and the smallest distance of a branch condition to
/// its threshold met while evaluating.
struct Eval {
    margin: f64,
}

impl Eval {
    fn eval(&mut self, e: &E, scope: &mut Vec<f64>) -> f64 {
        match e {
            E::Var(n) => scope[*n as usize % scope.len()],
            E::Const(c) => *c,
            E::Un(op, a) => {
                let a = self.eval(a, scope);
                match op {
                    Op1::Neg => -a,
                    Op1::Sin => a.sin(),
                    Op1::Cos => a.cos(),
                    Op1::Exp => a.tanh().exp(),
                    Op1::Tanh => a.tanh(),
                }
            }
            E::Bin(op, a, b) => {
                let a = self.eval(a, scope);
                let b = self.eval(b, scope);
                match op {
                    Op2::Add => a + b,
                    Op2::Sub => a - b,
                    Op2::Mul => a * b,
                    Op2::Div => a / (1.0 + b * b),
                }
            }
            E::If(c, t, a, b) => {
                let cv = self.eval(c, scope);
                self.margin = self.margin.min((cv - t).abs());
                if cv > *t {
                    self.eval(a, scope)
                } else {
                    self.eval(b, scope)
                }
            }
            E::IfStmt(c, t, init, then) => {
                let m = self.eval(init, scope);
                scope.push(m);
                let cv = self.eval(c, scope);
                self.margin = self.margin.min((cv - t).abs());
                let r = if cv > *t { self.eval(then, scope) } else { m };
                scope.pop();
                r
            }
            E::Let(a, b) => {
                let v = self.eval(a, scope);
                scope.push(v);
                let r = self.eval(b, scope);
                scope.pop();
                r
            }
            E::Loop(k, init, body) => {
                let mut acc = self.eval(init, scope);
                for i in 0..*k {
                    scope.push(acc);
                    scope.push(i as f64);
                    acc = self.eval(body, scope);
                    scope.pop();
                    scope.pop();
                }
                acc
            }
        }
    }
}

fn num(c: f64) -> String {
    if c < 0.0 {
        format!("({c:?})")
    } else {
        format!("{c:?}")
    }
}

struct Render {
    next: usize,
}

impl Render {
    fn fresh(&mut self) -> usize {
        self.next += 1;
        self.next
    }

    fn render(&mut self, e: &E, scope: &mut Vec<String>) -> String {
        match e {
            E::Var(n) => scope[*n as usize % scope.len()].clone(),
            E::Const(c) => num(*c),
            E::Un(op, a) => {
                let a = self.render(a, scope);
                match op {
                    Op1::Neg => format!("(-{a})"),
                    Op1::Sin => format!("sin({a})"),
                    Op1::Cos => format!("cos({a})"),
                    Op1::Exp => format!("exp(tanh({a}))"),
                    Op1::Tanh => format!("tanh({a})"),
                }
            }
            E::Bin(op, a, b) => {
                let a = self.render(a, scope);
                let b = self.render(b, scope);
                match op {
                    Op2::Add => format!("({a} + {b})"),
                    Op2::Sub => format!("({a} - {b})"),
                    Op2::Mul => format!("({a} * {b})"),
                    Op2::Div => format!("({a} / (1.0 + {b} * {b}))"),
                }
            }
            E::If(c, t, a, b) => {
                let c = self.render(c, scope);
                let a = self.render(a, scope);
                let b = self.render(b, scope);
                format!("(if ({c}) > {} {{ {a} }} else {{ {b} }})", num(*t))
            }
            E::IfStmt(c, t, init, then) => {
                let m = format!("m{}", self.fresh());
                let init = self.render(init, scope);
                scope.push(m.clone());
                let c = self.render(c, scope);
                let then = self.render(then, scope);
                scope.pop();
                format!(
                    "{{ let mut {m} = {init}; if ({c}) > {} {{ {m} = {then}; }} {m} }}",
                    num(*t)
                )
            }
            E::Let(a, b) => {
                let v = format!("v{}", self.fresh());
                let a = self.render(a, scope);
                scope.push(v.clone());
                let b = self.render(b, scope);
                scope.pop();
                format!("{{ let {v} = {a}; {b} }}")
            }
            E::Loop(k, init, body) => {
                let n = self.fresh();
                let (a, i) = (format!("a{n}"), format!("i{n}"));
                let init = self.render(init, scope);
                scope.push(a.clone());
                scope.push(format!("f64({i})"));
                let body = self.render(body, scope);
                scope.pop();
                scope.pop();
                format!("{{ let mut {a} = {init}; for {i} in 0..{k} {{ {a} = {body}; }} {a} }}")
            }
        }
    }
}

fn expr() -> impl Strategy<Value = E> {
    let leaf = prop_oneof![
        3 => any::<u8>().prop_map(E::Var),
        1 => (-8i32..=8).prop_map(|k| E::Const(k as f64 * 0.25)),
    ];
    leaf.prop_recursive(5, 32, 3, |inner| {
        let op1 = prop_oneof![
            Just(Op1::Neg),
            Just(Op1::Sin),
            Just(Op1::Cos),
            Just(Op1::Exp),
            Just(Op1::Tanh)
        ];
        let op2 = prop_oneof![Just(Op2::Add), Just(Op2::Sub), Just(Op2::Mul), Just(Op2::Div)];
        let thr = (-4i32..=4).prop_map(|k| k as f64 * 0.25);
        prop_oneof![
            3 => (op2, inner.clone(), inner.clone()).prop_map(|(o, a, b)| E::Bin(o, Box::new(a), Box::new(b))),
            2 => (op1, inner.clone()).prop_map(|(o, a)| E::Un(o, Box::new(a))),
            1 => (inner.clone(), thr.clone(), inner.clone(), inner.clone())
                .prop_map(|(c, t, a, b)| E::If(Box::new(c), t, Box::new(a), Box::new(b))),
            1 => (inner.clone(), thr, inner.clone(), inner.clone())
                .prop_map(|(c, t, a, b)| E::IfStmt(Box::new(c), t, Box::new(a), Box::new(b))),
            1 => (inner.clone(), inner.clone()).prop_map(|(a, b)| E::Let(Box::new(a), Box::new(b))),
            1 => (1u8..=3, inner.clone(), inner)
                .prop_map(|(k, a, b)| E::Loop(k, Box::new(a), Box::new(b))),
        ]
    })
}

const H: f64 = 1e-6;

fn program(body: &str, points: &[(f64, f64)]) -> String {
    let mut s = format!("fn f(x, y) = {body};\n\nfn main() {{\n");
    for (x, y) in points {
        let (x, y) = (num(*x), num(*y));
        s.push_str(&format!(
            "    {{\n\
             \x20       let (gx, gy) = grad(f, argnums = (0, 1))({x}, {y});\n\
             \x20       let (v, jx) = jvp(f, ({x}, {y}), (1.0, 0.0));\n\
             \x20       let (v2, jy) = jvp(f, ({x}, {y}), (0.0, 1.0));\n\
             \x20       let h = {H:e};\n\
             \x20       let fx = (f({x} + h, {y}) - f({x} - h, {y})) / (2.0 * h);\n\
             \x20       let fy = (f({x}, {y} + h) - f({x}, {y} - h)) / (2.0 * h);\n\
             \x20       print(f({x}, {y}), v, gx, gy, jx, jy, fx, fy);\n\
             \x20   }}\n"
        ));
    }
    s.push_str("}\n");
    s
}

fn run(src: &str) -> Result<String, String> {
    let session = Session::new(Mode::Eager)
        .load_source("grad_props.adj", src)
        .map_err(|e| e.render(false))?;
    let mut out = Vec::new();
    session.run_main(&mut out).map_err(|e| e.render(false))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / 1f64.max(a.abs()).max(b.abs())
}

fn check(e: &E, pts: &[(f64, f64)]) -> Result<(), TestCaseError> {
    // Keep the points where every branch is decided with a margin, and
    // where the function is moderate (the finite differences stay accurate).
    let mut kept = Vec::new();
    let mut want = Vec::new();
    for &(x, y) in pts {
        let mut ev = Eval {
            margin: f64::INFINITY,
        };
        let v = ev.eval(e, &mut vec![x, y]);
        if ev.margin > 1e-3 && v.is_finite() && v.abs() < 1e4 {
            kept.push((x, y));
            want.push(v);
        }
    }
    prop_assume!(!kept.is_empty());
    let body = Render { next: 0 }.render(e, &mut vec!["x".into(), "y".into()]);
    let src = program(&body, &kept);
    if std::env::var_os("GRAD_PROPS_SHOW").is_some() {
        eprintln!("{src}");
    }
    let out = match run(&src) {
        Ok(o) => o,
        Err(err) => return Err(TestCaseError::fail(format!("{err}\n{src}"))),
    };
    let lines: Vec<&str> = out.lines().collect();
    prop_assert_eq!(lines.len(), kept.len(), "output {:?}\n{}", out, src);
    for ((line, (x, y)), want) in lines.iter().zip(&kept).zip(&want) {
        let v: Vec<f64> = line
            .split(' ')
            .map(|t| t.parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| TestCaseError::fail(format!("bad output line {line:?}\n{src}")))?;
        prop_assert_eq!(v.len(), 8, "bad output line {:?}\n{}", line, src);
        let (f, fv, gx, gy, jx, jy, fx, fy) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        let at = format!("at x = {x}, y = {y}: f = {f}, jvp value = {fv}, grad = ({gx}, {gy}), jvp = ({jx}, {jy}), fd = ({fx}, {fy})\n{src}");
        prop_assert!(
            rel(f, *want) < 1e-9,
            "f differs from the reference evaluator ({}) {}",
            want,
            at
        );
        prop_assert!(rel(f, fv) < 1e-12, "jvp's value differs from f {}", at);
        prop_assert!(
            rel(gx, jx) < 1e-5 && rel(gy, jy) < 1e-5,
            "reverse and forward mode differ {}",
            at
        );
        prop_assert!(
            rel(gx, fx) < 1e-5 && rel(gy, fy) < 1e-5,
            "reverse mode and finite differences differ {}",
            at
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_global_rejects: 4096,
        .. ProptestConfig::default()
    })]

    #[test]
    fn reverse_forward_and_finite_differences_agree(
        e in expr(),
        pts in proptest::collection::vec((-2.0f64..2.0, -2.0f64..2.0), 3),
    ) {
        check(&e, &pts)?;
    }
}

/// A fixed program using every construct of the grammar, so that the
/// property test's machinery is itself checked on a known case.
#[test]
fn fixed_program_agrees() {
    use E::*;
    let x = || Box::new(Var(0));
    let y = || Box::new(Var(1));
    let e = Let(
        Box::new(Bin(Op2::Mul, x(), Box::new(Un(Op1::Sin, y())))),
        Box::new(Loop(
            3,
            Box::new(If(
                x(),
                0.25,
                Box::new(Un(Op1::Exp, y())),
                Box::new(Un(Op1::Tanh, x())),
            )),
            Box::new(IfStmt(
                Box::new(Var(3)),
                0.5,
                Box::new(Bin(Op2::Div, Box::new(Var(3)), Box::new(Var(2)))),
                Box::new(Bin(
                    Op2::Add,
                    Box::new(Var(5)),
                    Box::new(Un(Op1::Cos, Box::new(Var(4)))),
                )),
            )),
        )),
    );
    let r = check(&e, &[(0.7, -1.3), (-1.1, 0.4), (1.9, 1.2)]);
    assert!(r.is_ok(), "{r:?}");
}
