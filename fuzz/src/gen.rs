//! The program generator: random, well-typed Adjoint programs with one
//! differentiable function `f` of float arguments returning an f64 scalar,
//! helpers, and a `main` that prints everything the oracles need, one
//! labelled value a line (`print("label", value)`).
//!
//! Every statement is on a line of its own, so the shrinker can delete
//! lines; blocks open with `{` at the end of a line and close with a line
//! holding `}` (possibly followed by `else {`).

use crate::rng::Rng;
use std::collections::BTreeSet;

/// The types the generator tracks.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    /// f64 scalar.
    S,
    /// f64 vector of n elements.
    V(usize),
    /// f64 matrix.
    M(usize, usize),
    Int,
    Bool,
    Tup(Vec<Ty>),
    Rec(Vec<(&'static str, Ty)>),
    /// A function value from f64 to f64.
    Fn1,
}

impl Ty {
    fn is_tensor(&self) -> bool {
        matches!(self, Ty::V(_) | Ty::M(..))
    }
    fn annotation(&self) -> String {
        match self {
            Ty::S => "f64".into(),
            Ty::V(n) => format!("f64[{n}]"),
            Ty::M(a, b) => format!("f64[{a}, {b}]"),
            Ty::Int => "i64".into(),
            Ty::Bool => "bool".into(),
            Ty::Tup(ts) => format!(
                "({})",
                ts.iter()
                    .map(|t| t.annotation())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Ty::Rec(fs) => format!(
                "{{ {} }}",
                fs.iter()
                    .map(|(n, t)| format!("{n}: {}", t.annotation()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Ty::Fn1 => unreachable!(),
        }
    }
}

/// A concrete argument value (main's literals, directions, perturbed points).
#[derive(Clone, Debug)]
pub enum Val {
    S(f64),
    T(Vec<usize>, Vec<f64>),
    Tup(Vec<Val>),
    Rec(Vec<(&'static str, Val)>),
}

/// A float literal the language reads back to the same f64.
pub fn fmt_f64(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

impl Val {
    pub fn random(ty: &Ty, rng: &mut Rng, lo: f64, hi: f64, digits: i32) -> Val {
        match ty {
            Ty::S => Val::S(rng.float(lo, hi, digits)),
            Ty::V(n) => Val::T(
                vec![*n],
                (0..*n).map(|_| rng.float(lo, hi, digits)).collect(),
            ),
            Ty::M(a, b) => Val::T(
                vec![*a, *b],
                (0..a * b).map(|_| rng.float(lo, hi, digits)).collect(),
            ),
            Ty::Tup(ts) => Val::Tup(
                ts.iter()
                    .map(|t| Val::random(t, rng, lo, hi, digits))
                    .collect(),
            ),
            Ty::Rec(fs) => Val::Rec(
                fs.iter()
                    .map(|(n, t)| (*n, Val::random(t, rng, lo, hi, digits)))
                    .collect(),
            ),
            _ => unreachable!("not a float type"),
        }
    }

    pub fn lit(&self) -> String {
        match self {
            Val::S(x) => fmt_f64(*x),
            Val::T(shape, xs) => {
                if shape.len() == 1 {
                    format!(
                        "[{}]",
                        xs.iter()
                            .map(|x| fmt_f64(*x))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    let cols = shape[1];
                    let rows: Vec<String> = xs
                        .chunks(cols)
                        .map(|r| {
                            format!(
                                "[{}]",
                                r.iter().map(|x| fmt_f64(*x)).collect::<Vec<_>>().join(", ")
                            )
                        })
                        .collect();
                    format!("[{}]", rows.join(", "))
                }
            }
            Val::Tup(vs) => format!(
                "({})",
                vs.iter().map(|v| v.lit()).collect::<Vec<_>>().join(", ")
            ),
            Val::Rec(fs) => format!(
                "{{{}}}",
                fs.iter()
                    .map(|(n, v)| format!("{n}: {}", v.lit()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    pub fn flatten(&self, out: &mut Vec<f64>) {
        match self {
            Val::S(x) => out.push(*x),
            Val::T(_, xs) => out.extend_from_slice(xs),
            Val::Tup(vs) => vs.iter().for_each(|v| v.flatten(out)),
            Val::Rec(fs) => fs.iter().for_each(|(_, v)| v.flatten(out)),
        }
    }

    /// self + h * d (same structure).
    pub fn axpy(&self, h: f64, d: &Val) -> Val {
        match (self, d) {
            (Val::S(x), Val::S(y)) => Val::S(x + h * y),
            (Val::T(s, xs), Val::T(_, ys)) => Val::T(
                s.clone(),
                xs.iter().zip(ys).map(|(x, y)| x + h * y).collect(),
            ),
            (Val::Tup(xs), Val::Tup(ys)) => {
                Val::Tup(xs.iter().zip(ys).map(|(x, y)| x.axpy(h, y)).collect())
            }
            (Val::Rec(xs), Val::Rec(ys)) => Val::Rec(
                xs.iter()
                    .zip(ys)
                    .map(|((n, x), (_, y))| (*n, x.axpy(h, y)))
                    .collect(),
            ),
            _ => unreachable!("axpy of different structures"),
        }
    }
}

/// What the checker needs to know about a generated program.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// Flattened direction of the jvp and the finite differences.
    pub v: Vec<f64>,
    /// Flattened second direction (Hessian symmetry).
    pub w: Vec<f64>,
    /// The pullback's cotangent.
    pub u: f64,
    /// Step sizes of the finite differences, small first.
    pub hs: Vec<f64>,
    /// Number of float arguments of `f` (they come first).
    pub n_float: usize,
    /// Number of int / bool arguments (after the float ones).
    pub n_nondiff: usize,
    /// The program uses `stop_gradient`: its derivatives are not those of
    /// the function's values, so the finite-difference checks do not apply.
    pub stop_gradient: bool,
}

#[derive(Clone, Debug)]
pub struct Program {
    pub source: String,
    pub features: BTreeSet<&'static str>,
    pub meta: Meta,
}

#[derive(Clone)]
struct Var {
    name: String,
    ty: Ty,
}

/// A callable with a known signature available to expressions.
#[derive(Clone)]
enum Callable {
    /// name(S) -> S
    S1(String),
    /// name(S, S) -> S
    S2(String),
    /// name(S, int) -> S (static / int-argument recursion depth)
    SK(String),
    /// name(V3) -> S
    VS(String),
    /// name(V3) -> V3
    VV(String),
    /// name(V3, int) -> V3
    VK(String),
}

pub struct Gen {
    rng: Rng,
    features: BTreeSet<&'static str>,
    out: Vec<String>,
    ind: usize,
    env: Vec<Var>,
    callables: Vec<Callable>,
    /// Names of global functions f64 -> f64 (usable as function values).
    fn_values: Vec<String>,
    counter: usize,
    /// Nested transforms still allowed in the program.
    transforms_left: u32,
    /// Higher-order helpers defined (apply2, compose, mk_scale, dapply).
    ho: Vec<&'static str>,
    /// Inside a lambda or local fn body: no `return`, and fewer statements.
    lambda_depth: u32,
    /// Added to early `return` values (a smooth term in the arguments).
    ret_tail: String,
    /// Smaller programs (fewer statements and helpers, shallower
    /// expressions): they compile faster.
    small: bool,
}

const FLOAT_ARG_TYPES: usize = 6;

fn float_arg_type(i: usize) -> Ty {
    match i {
        0 => Ty::S,
        1 => Ty::V(3),
        2 => Ty::M(2, 3),
        3 => Ty::Tup(vec![Ty::S, Ty::V(3)]),
        4 => Ty::Rec(vec![("w", Ty::V(3)), ("b", Ty::S)]),
        _ => Ty::Tup(vec![Ty::S, Ty::S]),
    }
}

const TENSOR_TYPES: [Ty; 5] = [Ty::V(2), Ty::V(3), Ty::V(6), Ty::M(2, 3), Ty::M(3, 2)];

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            features: BTreeSet::new(),
            out: Vec::new(),
            ind: 0,
            env: Vec::new(),
            callables: Vec::new(),
            fn_values: Vec::new(),
            counter: 0,
            transforms_left: 0,
            ho: Vec::new(),
            lambda_depth: 0,
            ret_tail: String::new(),
            small: false,
        }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    fn line(&mut self, s: impl AsRef<str>) {
        let pad = "    ".repeat(self.ind);
        self.out.push(format!("{pad}{}", s.as_ref()));
    }

    fn feat(&mut self, f: &'static str) {
        self.features.insert(f);
    }

    fn lit(&mut self, lo: f64, hi: f64) -> String {
        let x = self.rng.float(lo, hi, 2);
        if x < 0.0 {
            format!("({})", fmt_f64(x))
        } else {
            fmt_f64(x)
        }
    }

    fn pos_lit(&mut self, lo: f64, hi: f64) -> String {
        fmt_f64(self.rng.float(lo, hi, 2))
    }

    fn tensor_lit(&mut self, ty: &Ty) -> String {
        Val::random(ty, &mut self.rng, -1.0, 1.0, 2).lit()
    }

    // ---------------------------------------------------------------
    // The environment.

    /// Variables and their one-level fields, with types.
    fn items(&self) -> Vec<(String, Ty)> {
        let mut out: Vec<(String, Ty)> = Vec::new();
        // later bindings shadow earlier ones of the same name
        let mut seen = BTreeSet::new();
        for v in self.env.iter().rev() {
            if !seen.insert(v.name.clone()) {
                continue;
            }
            out.push((v.name.clone(), v.ty.clone()));
            match &v.ty {
                Ty::Tup(ts) => {
                    for (i, t) in ts.iter().enumerate() {
                        out.push((format!("{}.{i}", v.name), t.clone()));
                    }
                }
                Ty::Rec(fs) => {
                    for (n, t) in fs {
                        out.push((format!("{}.{n}", v.name), t.clone()));
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn items_of(&self, ty: &Ty) -> Vec<String> {
        self.items()
            .into_iter()
            .filter(|(_, t)| t == ty)
            .map(|(n, _)| n)
            .collect()
    }

    fn push_var(&mut self, name: &str, ty: Ty) {
        self.env.push(Var {
            name: name.to_string(),
            ty,
        });
    }

    // ---------------------------------------------------------------
    // Expressions.

    fn expr(&mut self, ty: &Ty, d: u32) -> String {
        match ty {
            Ty::S => self.expr_s(d),
            Ty::V(_) | Ty::M(..) => self.expr_t(ty, d),
            Ty::Int => self.int_expr(),
            Ty::Bool => self.cond(d),
            Ty::Tup(ts) => {
                let parts: Vec<String> = ts.clone().iter().map(|t| self.expr(t, d)).collect();
                format!("({})", parts.join(", "))
            }
            Ty::Rec(fs) => {
                let parts: Vec<String> = fs
                    .clone()
                    .iter()
                    .map(|(n, t)| format!("{n}: {}", self.expr(t, d)))
                    .collect();
                format!("{{{}}}", parts.join(", "))
            }
            Ty::Fn1 => self.fn_value(d),
        }
    }

    fn int_expr(&mut self) -> String {
        let ints = self.items_of(&Ty::Int);
        if !ints.is_empty() && self.rng.chance(0.5) {
            let i = self.rng.pick(&ints).clone();
            format!("({i} % 3)")
        } else {
            self.rng.int(0, 3).to_string()
        }
    }

    fn leaf_s(&mut self) -> String {
        let items = self.items();
        let ss: Vec<&String> = items
            .iter()
            .filter(|(_, t)| *t == Ty::S)
            .map(|(n, _)| n)
            .collect();
        let ts: Vec<&(String, Ty)> = items.iter().filter(|(_, t)| t.is_tensor()).collect();
        let ints: Vec<&String> = items
            .iter()
            .filter(|(_, t)| *t == Ty::Int)
            .map(|(n, _)| n)
            .collect();
        let r = self.rng.unit();
        if !ss.is_empty() && r < 0.75 {
            return self.rng.pick(&ss).to_string();
        }
        if !ts.is_empty() && r < 0.9 {
            let n = self.rng.pick(&ts).0.clone();
            let op = *self.rng.pick(&["sum", "mean", "max", "min"]);
            return format!("{op}({n})");
        }
        if !ints.is_empty() && r < 0.95 {
            let i = self.rng.pick(&ints).to_string();
            self.feat("int_to_float");
            return format!("(0.25 * f64({i}))");
        }
        self.lit(-1.0, 1.0)
    }

    fn leaf_t(&mut self, ty: &Ty) -> String {
        let its = self.items_of(ty);
        if !its.is_empty() && self.rng.chance(0.8) {
            return self.rng.pick(&its).clone();
        }
        if self.rng.chance(0.7) {
            let s = self.leaf_s();
            let c = self.tensor_lit(ty);
            return format!("({s} * {c})");
        }
        self.tensor_lit(ty)
    }

    /// An element-wise function applied to `x`, kept in a safe domain.
    fn unary(&mut self, x: &str) -> String {
        match self.rng.below(17) {
            0 => format!("sin({x})"),
            1 => format!("cos({x})"),
            2 => format!("tanh({x})"),
            3 => format!("sigmoid({x})"),
            4 => {
                self.feat("kink");
                format!("relu({x})")
            }
            5 => {
                self.feat("kink");
                format!("abs({x})")
            }
            6 => format!("exp(tanh({x}))"),
            7 => format!("log(1.0 + {x} * {x})"),
            8 => format!("sqrt(1.0 + {x} * {x})"),
            9 => format!("(-{x})"),
            10 => {
                self.feat("pow");
                format!("({x} ** 2)")
            }
            11 => {
                self.feat("pow");
                format!("(tanh({x}) ** 3)")
            }
            12 => format!("log1p({x} * {x})"),
            13 => format!("erf({x})"),
            14 if self.rng.chance(0.3) => {
                self.feat("stop_gradient");
                format!("stop_gradient({x})")
            }
            14 | 16 => format!("sin({x} * 0.7)"),
            _ => format!("(0.5 * {x})"),
        }
    }

    fn binary(&mut self, a: &str, b: &str) -> String {
        match self.rng.below(7) {
            0 | 1 => format!("({a} + {b})"),
            2 => format!("({a} - {b})"),
            3 | 4 => format!("({a} * {b})"),
            5 => format!("({a} / (1.5 + tanh({b})))"),
            _ => {
                self.feat("kink");
                if self.rng.chance(0.5) {
                    format!("maximum({a}, {b})")
                } else {
                    format!("minimum({a}, {b})")
                }
            }
        }
    }

    fn expr_s(&mut self, d: u32) -> String {
        if d == 0 || self.rng.chance(0.15) {
            return self.leaf_s();
        }
        let has_fn = !self.items_of(&Ty::Fn1).is_empty();
        let weights = [
            2,                                             // 0 leaf
            4,                                             // 1 unary
            5,                                             // 2 binary
            3,                                             // 3 reduction
            1,                                             // 4 index
            1,                                             // 5 if expression
            if self.callables.is_empty() { 0 } else { 3 }, // 6 call
            if self.transforms_left > 0 && d >= 2 {
                2
            } else {
                0
            }, // 7 nested transform
            if has_fn { 2 } else { 0 },                    // 8 call a function value
            if self.ho.is_empty() { 0 } else { 1 },        // 9 higher-order helper
        ];
        match self.rng.weighted(&weights) {
            0 => self.leaf_s(),
            1 => {
                let x = self.expr_s(d - 1);
                self.unary(&x)
            }
            2 => {
                let a = self.expr_s(d - 1);
                let b = self.expr_s(d - 1);
                self.binary(&a, &b)
            }
            3 => self.reduction(d),
            4 => self.index_s(d),
            5 => {
                self.feat("if_expr");
                let c = self.cond(d - 1);
                let a = self.expr_s(d - 1);
                let b = self.expr_s(d - 1);
                format!("(if {c} {{ {a} }} else {{ {b} }})")
            }
            6 => self.call_s(d),
            7 => self.transform_s(d),
            8 => {
                let fs = self.items_of(&Ty::Fn1);
                let f = self.rng.pick(&fs).clone();
                let a = self.expr_s(d - 1);
                self.feat("call_fn_value");
                format!("{f}({a})")
            }
            _ => self.ho_call(d),
        }
    }

    fn reduction(&mut self, d: u32) -> String {
        let ty = self.rng.pick(&TENSOR_TYPES).clone();
        let t = self.expr_t(&ty, d - 1);
        match self.rng.below(12) {
            0 | 1 => format!("sum({t})"),
            2 => format!("mean({t})"),
            3 => {
                self.feat("max_min_reduce");
                format!("max({t})")
            }
            4 => {
                self.feat("max_min_reduce");
                format!("min({t})")
            }
            5 => {
                self.feat("prod");
                if self.rng.chance(0.7) {
                    format!("prod(tanh({t}))")
                } else {
                    format!("prod({t})")
                }
            }
            6 => {
                if let Ty::V(_) = ty {
                    let u = self.expr_t(&ty, d - 1);
                    self.feat("dot");
                    if self.rng.chance(0.5) {
                        format!("dot({t}, {u})")
                    } else {
                        format!("({t} @ {u})")
                    }
                } else {
                    format!("sum({t} * {t})")
                }
            }
            7 => {
                // a reduction over an axis, then over the rest
                if let Ty::M(..) = ty {
                    self.feat("axis_reduce");
                    let ax = self.rng.below(2);
                    let op = *self.rng.pick(&["sum", "mean", "max", "min"]);
                    let op2 = *self.rng.pick(&["sum", "mean"]);
                    format!("{op2}({op}({t}, axis = {ax}))")
                } else {
                    format!("mean({t})")
                }
            }
            9 => {
                // running sums and products (NumPy's cumsum, cumprod)
                self.feat("scan");
                let w = self.tensor_lit(&ty);
                let axis = match ty {
                    Ty::M(..) => format!(", axis = {}", self.rng.below(2)),
                    _ => String::new(),
                };
                if self.rng.chance(0.5) {
                    format!("sum(cumsum({t}{axis}) * {w})")
                } else {
                    format!("sum(cumprod(tanh({t}){axis}) * {w})")
                }
            }
            10 => {
                // reorderings: sort (kinks at ties), flip, roll
                let w = self.tensor_lit(&ty);
                match self.rng.below(3) {
                    0 => {
                        self.feat("sort");
                        self.feat("kink");
                        format!("sum(sort({t}) * {w})")
                    }
                    1 => format!("sum(flip({t}) * {w})"),
                    _ => format!("sum(roll({t}, {}) * {w})", self.rng.below(3) as i64 - 1),
                }
            }
            11 if matches!(ty, Ty::M(..)) && self.rng.chance(0.4) => {
                // einsum: a matrix product and a transposed weighting
                self.feat("einsum");
                let Ty::M(r, c) = ty else { unreachable!() };
                let u = self.expr_t(&Ty::M(c, r), d - 1);
                let w = self.tensor_lit(&Ty::M(c, r));
                if self.rng.chance(0.5) {
                    format!("sum(einsum(\"ij,jk->ik\", {t}, {u}))")
                } else {
                    format!("einsum(\"ij,ji->\", {t}, {w})")
                }
            }
            11 => {
                // statistics and norms away from their square roots' zero
                self.feat("stats");
                let w = self.tensor_lit(&ty);
                match self.rng.below(3) {
                    0 => format!("var({t})"),
                    1 => format!("std({t} + {w})"),
                    _ => format!("norm(1.0 + {t} * {t})"),
                }
            }
            _ => {
                if let Ty::M(..) = ty {
                    self.feat("keepdims");
                    format!("sum({t} - mean({t}, axis = 1, keepdims = true))")
                } else {
                    format!("sum(sin({t}))")
                }
            }
        }
    }

    fn index_s(&mut self, d: u32) -> String {
        self.feat("index");
        // index a variable or a parenthesised expression
        let ty = self.rng.pick(&[Ty::V(3), Ty::M(2, 3), Ty::V(2)]).clone();
        let t = self.paren_t(&ty, d - 1);
        match ty {
            Ty::V(n) => {
                let ints = self.items_of(&Ty::Int);
                if !ints.is_empty() && self.rng.chance(0.4) {
                    self.feat("dynamic_index");
                    let i = self.rng.pick(&ints).clone();
                    format!("{t}[{i} % {n}]")
                } else if self.rng.chance(0.2) {
                    format!("{t}[-1]")
                } else {
                    format!("{t}[{}]", self.rng.below(n))
                }
            }
            _ => format!("{t}[{}, {}]", self.rng.below(2), self.rng.below(3)),
        }
    }

    fn call_s(&mut self, d: u32) -> String {
        let c = self.rng.pick(&self.callables).clone();
        match c {
            Callable::S1(n) => {
                let a = self.expr_s(d - 1);
                format!("{n}({a})")
            }
            Callable::S2(n) => {
                let a = self.expr_s(d - 1);
                let b = self.expr_s(d - 1);
                format!("{n}({a}, {b})")
            }
            Callable::SK(n) => {
                let a = self.expr_s(d - 1);
                let k = self.int_expr();
                format!("{n}({a}, {k})")
            }
            Callable::VS(n) => {
                let a = self.expr_t(&Ty::V(3), d - 1);
                format!("{n}({a})")
            }
            Callable::VV(n) => {
                let a = self.expr_t(&Ty::V(3), d - 1);
                format!("sum({n}({a}))")
            }
            Callable::VK(n) => {
                let a = self.expr_t(&Ty::V(3), d - 1);
                let k = self.int_expr();
                format!("mean({n}({a}, {k}))")
            }
        }
    }

    /// A function value f64 -> f64: a global function, a builtin, a
    /// function-valued variable, or a lambda capturing the environment.
    fn fn_value(&mut self, d: u32) -> String {
        let vars = self.items_of(&Ty::Fn1);
        let r = self.rng.below(10);
        if r < 3 && !vars.is_empty() {
            return self.rng.pick(&vars).clone();
        }
        if r < 5 && !self.fn_values.is_empty() {
            return self.rng.pick(&self.fn_values).clone();
        }
        if r < 6 {
            self.feat("builtin_as_value");
            return self
                .rng
                .pick(&["sin", "tanh", "sigmoid", "cos"])
                .to_string();
        }
        self.lambda(d)
    }

    fn lambda(&mut self, d: u32) -> String {
        let y = self.fresh("y");
        let mark = self.env.len();
        self.push_var(&y, Ty::S);
        self.lambda_depth += 1;
        // make sure the parameter is used
        let body = self.expr_s(d.saturating_sub(1).max(1));
        let body = if body.contains(&y) {
            body
        } else {
            format!("({body} * sin({y}))")
        };
        self.lambda_depth -= 1;
        self.env.truncate(mark);
        self.feat("lambda");
        format!("|{y}| {body}")
    }

    fn transform_s(&mut self, d: u32) -> String {
        self.transforms_left -= 1;
        self.feat("nested_transform");
        let f = self.fn_value(d - 1);
        let a = self.expr_s(d - 1);
        match self.rng.below(7) {
            0 | 1 => {
                self.feat("nested_grad");
                format!("grad({f})({a})")
            }
            2 => {
                self.feat("nested_value_and_grad");
                let k = self.rng.below(2);
                format!("value_and_grad({f})({a}).{k}")
            }
            3 => {
                self.feat("nested_jvp");
                let t = self.lit(-1.0, 1.0);
                let k = self.rng.below(2);
                format!("jvp({f}, ({a},), ({t},)).{k}")
            }
            4 => {
                self.feat("nested_vjp");
                let u = self.lit(-1.0, 1.0);
                format!("vjp({f}, {a}).1({u}).0")
            }
            5 => {
                self.feat("nested_grad_grad");
                format!("grad(grad({f}))({a})")
            }
            _ => {
                // gradient of a tensor function, reduced
                self.feat("nested_grad_tensor");
                let z = self.fresh("z");
                let c = self.expr_s(1);
                let v = self.expr_t(&Ty::V(3), d - 1);
                format!("sum(grad(|{z}| sum(tanh({z} * {c}) * {z}))({v}))")
            }
        }
    }

    fn ho_call(&mut self, d: u32) -> String {
        let h = *self.rng.pick(&self.ho);
        self.feat("higher_order");
        match h {
            "apply2" => {
                let f = self.fn_value(d - 1);
                let a = self.expr_s(d - 1);
                format!("apply2({f}, {a})")
            }
            "compose" => {
                let f = self.fn_value(d - 1);
                let g = self.fn_value(d - 1);
                let a = self.expr_s(d - 1);
                self.feat("returned_closure");
                format!("compose({f}, {g})({a})")
            }
            "mk_scale" => {
                let a = self.expr_s(d - 1);
                let b = self.expr_s(d - 1);
                self.feat("returned_closure");
                format!("mk_scale({a})({b})")
            }
            _ => {
                // dapply differentiates a function value
                if self.transforms_left == 0 {
                    return self.expr_s(d - 1);
                }
                self.transforms_left -= 1;
                self.feat("grad_of_fn_value");
                let f = self.fn_value(d - 1);
                let a = self.expr_s(d - 1);
                format!("dapply({f}, {a})")
            }
        }
    }

    fn expr_t(&mut self, ty: &Ty, d: u32) -> String {
        if d == 0 || self.rng.chance(0.15) {
            return self.leaf_t(ty);
        }
        let v3 = *ty == Ty::V(3);
        let has_vv = self
            .callables
            .iter()
            .any(|c| matches!(c, Callable::VV(_) | Callable::VK(_)));
        let weights = [
            2,                                // 0 leaf
            4,                                // 1 unary
            3,                                // 2 binary same type
            2,                                // 3 binary with a scalar
            1,                                // 4 where
            4,                                // 5 construct
            if v3 && has_vv { 2 } else { 0 }, // 6 tensor helpers
            if v3 && self.transforms_left > 0 && d >= 2 {
                1
            } else {
                0
            }, // 7 grad of a tensor fn
        ];
        match self.rng.weighted(&weights) {
            0 => self.leaf_t(ty),
            1 => {
                let x = self.expr_t(ty, d - 1);
                self.unary(&x)
            }
            2 => {
                let a = self.expr_t(ty, d - 1);
                let b = self.expr_t(ty, d - 1);
                self.binary(&a, &b)
            }
            3 => {
                self.feat("broadcast_scalar");
                let a = self.expr_t(ty, d - 1);
                let b = self.expr_s(d - 1);
                if self.rng.chance(0.5) {
                    self.binary(&a, &b)
                } else {
                    self.binary(&b, &a)
                }
            }
            4 => {
                self.feat("where");
                let a = self.expr_t(ty, d - 1);
                let b = self.expr_t(ty, d - 1);
                let c = self.expr_s(d - 1);
                format!("where({a} > {c}, {a}, {b})")
            }
            5 => self.construct(ty, d),
            6 => {
                let cs: Vec<Callable> = self
                    .callables
                    .iter()
                    .filter(|c| matches!(c, Callable::VV(_) | Callable::VK(_)))
                    .cloned()
                    .collect();
                let a = self.expr_t(ty, d - 1);
                match self.rng.pick(&cs).clone() {
                    Callable::VV(n) => format!("{n}({a})"),
                    Callable::VK(n) => {
                        let k = self.int_expr();
                        format!("{n}({a}, {k})")
                    }
                    _ => unreachable!(),
                }
            }
            _ => {
                self.transforms_left -= 1;
                self.feat("nested_transform");
                self.feat("nested_grad_tensor");
                let z = self.fresh("z");
                let c = self.expr_s(1);
                let v = self.expr_t(ty, d - 1);
                format!("grad(|{z}| sum(sin({z}) * {c}) + {z}[0] * {z}[2])({v})")
            }
        }
    }

    /// Type-specific constructions: shape operations, slices, products.
    fn construct(&mut self, ty: &Ty, d: u32) -> String {
        let d1 = d - 1;
        match ty {
            Ty::V(3) => match self.rng.below(10) {
                0 => {
                    let a = self.expr_s(d1);
                    let b = self.expr_s(d1);
                    let c = self.expr_s(d1);
                    self.feat("tensor_of_exprs");
                    format!("[{a}, {b}, {c}]")
                }
                1 => {
                    self.feat("axis_reduce");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    let op = *self.rng.pick(&["sum", "mean", "max", "min"]);
                    format!("{op}({m}, axis = 0)")
                }
                2 => {
                    self.feat("matmul");
                    let m = self.expr_t(&Ty::M(3, 2), d1);
                    let v = self.expr_t(&Ty::V(2), d1);
                    format!("({m} @ {v})")
                }
                3 => {
                    self.feat("matmul");
                    let v = self.expr_t(&Ty::V(2), d1);
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    format!("({v} @ {m})")
                }
                4 => {
                    self.feat("concat");
                    let v = self.expr_t(&Ty::V(2), d1);
                    let s = self.expr_s(d1);
                    format!("concat(({v}, [{s}]), axis = 0)")
                }
                5 => {
                    self.feat("stack");
                    let a = self.expr_s(d1);
                    let b = self.expr_s(d1);
                    let c = self.expr_s(d1);
                    format!("stack(({a}, {b}, {c}), axis = 0)")
                }
                6 => {
                    self.feat("take");
                    let v = self.expr_t(&Ty::V(3), d1);
                    let idx: Vec<String> = (0..3).map(|_| self.rng.below(3).to_string()).collect();
                    format!("take({v}, [{}])", idx.join(", "))
                }
                7 => {
                    self.feat("static_slice");
                    let v = self.paren_t(&Ty::V(6), d1);
                    let a = self.rng.below(4);
                    format!("{v}[{a}:{}]", a + 3)
                }
                8 => {
                    let m = self.paren_t(&Ty::M(2, 3), d1);
                    self.feat("index_row");
                    format!("{m}[{}]", self.rng.below(2))
                }
                _ => {
                    self.feat("transpose");
                    let m = self.paren_t(&Ty::M(3, 2), d1);
                    format!("transpose({m})[{}]", self.rng.below(2))
                }
            },
            Ty::V(2) => match self.rng.below(8) {
                0 => {
                    self.feat("axis_reduce");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    let op = *self.rng.pick(&["sum", "mean", "max", "min"]);
                    format!("{op}({m}, axis = 1)")
                }
                1 => {
                    self.feat("matmul");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    let v = self.expr_t(&Ty::V(3), d1);
                    format!("({m} @ {v})")
                }
                2 => {
                    self.feat("static_slice");
                    let m = self.paren_t(&Ty::M(2, 3), d1);
                    format!("{m}[:, {}]", self.rng.below(3))
                }
                3 => {
                    self.feat("static_slice");
                    let v = self.paren_t(&Ty::V(3), d1);
                    if self.rng.chance(0.5) {
                        format!("{v}[1:3]")
                    } else {
                        format!("{v}[:2]")
                    }
                }
                4 => {
                    let ints = self.items_of(&Ty::Int);
                    if ints.is_empty() {
                        let v = self.paren_t(&Ty::V(3), d1);
                        return format!("{v}[1:]");
                    }
                    // a dynamic slice needs the offset bound to a name
                    let i = self.rng.pick(&ints).clone();
                    let v = self.paren_t(&Ty::V(3), d1);
                    self.feat("dynamic_slice");
                    format!("{v}[{i} % 2 : {i} % 2 + 2]")
                }
                5 => {
                    self.feat("take");
                    let v = self.expr_t(&Ty::V(3), d1);
                    format!("take({v}, [{}, {}])", self.rng.below(3), self.rng.below(3))
                }
                6 => {
                    let a = self.expr_s(d1);
                    let b = self.expr_s(d1);
                    self.feat("tensor_of_exprs");
                    format!("[{a}, {b}]")
                }
                _ => {
                    self.feat("matmul");
                    let m = self.expr_t(&Ty::M(3, 2), d1);
                    let v = self.expr_t(&Ty::V(3), d1);
                    format!("({v} @ {m})")
                }
            },
            Ty::V(6) => match self.rng.below(3) {
                0 => {
                    self.feat("reshape");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    format!("reshape({m}, [6])")
                }
                1 => {
                    self.feat("concat");
                    let a = self.expr_t(&Ty::V(3), d1);
                    let b = self.expr_t(&Ty::V(3), d1);
                    format!("concat(({a}, {b}), axis = 0)")
                }
                _ => {
                    self.feat("concat");
                    let a = self.expr_t(&Ty::V(2), d1);
                    let b = self.expr_t(&Ty::V(2), d1);
                    let c = self.expr_t(&Ty::V(2), d1);
                    format!("concat(({a}, {b}, {c}), axis = 0)")
                }
            },
            Ty::M(2, 3) => match self.rng.below(7) {
                0 => {
                    self.feat("stack");
                    let a = self.expr_t(&Ty::V(3), d1);
                    let b = self.expr_t(&Ty::V(3), d1);
                    format!("stack(({a}, {b}), axis = 0)")
                }
                1 => {
                    self.feat("reshape");
                    let v = self.expr_t(&Ty::V(6), d1);
                    format!("reshape({v}, [2, 3])")
                }
                2 => {
                    self.feat("transpose");
                    let m = self.expr_t(&Ty::M(3, 2), d1);
                    format!("transpose({m})")
                }
                3 => {
                    self.feat("outer");
                    let a = self.expr_t(&Ty::V(2), d1);
                    let b = self.expr_t(&Ty::V(3), d1);
                    format!("outer({a}, {b})")
                }
                4 => {
                    self.feat("broadcast_row");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    let v = self.expr_t(&Ty::V(3), d1);
                    format!("({m} * {v})")
                }
                5 => {
                    self.feat("broadcast_col");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    let v = self.expr_t(&Ty::V(2), d1);
                    format!("({m} + reshape({v}, [2, 1]))")
                }
                _ => {
                    self.feat("take");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    format!(
                        "take({m}, [{}, {}], axis = 0)",
                        self.rng.below(2),
                        self.rng.below(2)
                    )
                }
            },
            Ty::M(3, 2) => match self.rng.below(4) {
                0 => {
                    self.feat("transpose");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    format!("transpose({m})")
                }
                1 => {
                    self.feat("reshape");
                    let v = self.expr_t(&Ty::V(6), d1);
                    format!("reshape({v}, [3, 2])")
                }
                2 => {
                    self.feat("stack");
                    let a = self.expr_t(&Ty::V(3), d1);
                    let b = self.expr_t(&Ty::V(3), d1);
                    format!("stack(({a}, {b}), axis = 1)")
                }
                _ => {
                    self.feat("transpose");
                    let m = self.expr_t(&Ty::M(2, 3), d1);
                    format!("transpose({m}, perm = [1, 0])")
                }
            },
            _ => self.leaf_t(ty),
        }
    }

    /// A tensor expression that may be followed by a postfix index.
    fn paren_t(&mut self, ty: &Ty, d: u32) -> String {
        let t = self.expr_t(ty, d);
        if t.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
            || t.starts_with('(') && matching_paren_is_last(&t)
        {
            t
        } else {
            format!("({t})")
        }
    }

    fn cond(&mut self, d: u32) -> String {
        let bools = self.items_of(&Ty::Bool);
        let ints = self.items_of(&Ty::Int);
        let r = self.rng.below(10);
        if r == 0 && !bools.is_empty() {
            let b = self.rng.pick(&bools).clone();
            return if self.rng.chance(0.5) {
                b
            } else {
                format!("!{b}")
            };
        }
        if r == 1 && !ints.is_empty() {
            let i = self.rng.pick(&ints).clone();
            return format!("{i} > {}", self.rng.int(0, 2));
        }
        if r == 2 && d > 0 {
            let a = self.cond(0);
            let b = self.cond(0);
            let op = if self.rng.chance(0.5) { "&&" } else { "||" };
            return format!("({a}) {op} ({b})");
        }
        let t = self.lit(-0.5, 0.5);
        let x = if self.rng.chance(0.7) {
            self.expr_s(d.min(1))
        } else {
            let ty = self.rng.pick(&TENSOR_TYPES).clone();
            let t = self.expr_t(&ty, d.min(1));
            format!("sum({t})")
        };
        let op = if self.rng.chance(0.5) { ">" } else { "<" };
        format!("{x} {op} {t}")
    }

    // ---------------------------------------------------------------
    // Statements.

    fn any_value_ty(&mut self) -> Ty {
        match self.rng.below(10) {
            0..=4 => Ty::S,
            5 => Ty::V(3),
            6 => Ty::V(2),
            7 => Ty::M(2, 3),
            8 => Ty::V(6),
            _ => Ty::M(3, 2),
        }
    }

    fn let_stmt(&mut self, d: u32) {
        let ty = self.any_value_ty();
        let name = self.fresh("t");
        let e = self.expr(&ty, d);
        self.line(format!("let {name} = {e};"));
        self.push_var(&name, ty);
    }

    /// One statement of a function body. `nest`: loop nesting; `ret`: a
    /// `return` is allowed here.
    fn stmt(&mut self, nest: u32, ret: bool, in_loop: bool) {
        let lam = self.lambda_depth > 0;
        let weights = [
            6,                                               // 0 let
            if nest < 2 && !lam { 3 } else { 0 },            // 1 loop
            if !lam { 2 } else { 0 },                        // 2 if statement
            if ret && self.rng.chance(0.5) { 1 } else { 0 }, // 3 early return
            if in_loop { 4 } else { 2 },                     // 4 closure
            if !lam { 1 } else { 0 },                        // 5 local fn
            1,                                               // 6 function chosen by if
            1,                                               // 7 tuple of functions
            1,                                               // 8 tree_map
            1,                                               // 9 destructuring
            if in_loop { 3 } else { 0 },                     // 10 dynamic slice with a loop index
            if in_loop { 2 } else { 0 },                     // 11 break / continue
        ];
        match self.rng.weighted(&weights) {
            0 => self.let_stmt(if self.small { 2 } else { 3 }),
            1 => self.loop_stmt(nest, ret),
            2 => self.if_stmt(nest, ret, in_loop),
            3 => {
                self.feat("early_return");
                if in_loop {
                    self.feat("return_in_loop");
                }
                let c = self.cond(1);
                let e = self.expr_s(2);
                self.line(format!("if {c} {{"));
                self.ind += 1;
                let tail = self.ret_tail.clone();
                self.line(format!("return tanh({e}){tail};"));
                self.ind -= 1;
                self.line("}");
            }
            4 => {
                let name = self.fresh("c");
                let l = self.lambda(2);
                self.feat("closure");
                if in_loop {
                    self.feat("closure_in_loop");
                }
                self.line(format!("let {name} = {l};"));
                self.push_var(&name, Ty::Fn1);
            }
            5 => self.local_fn(),
            6 => {
                self.feat("fn_chosen_by_if");
                let name = self.fresh("fv");
                let c = self.cond(1);
                let a = self.fn_value(2);
                let b = self.fn_value(2);
                self.line(format!("let {name} = if {c} {{ {a} }} else {{ {b} }};"));
                self.push_var(&name, Ty::Fn1);
            }
            7 => {
                self.feat("fn_in_tuple");
                let name = self.fresh("fs");
                let a = self.fn_value(2);
                let b = self.fn_value(2);
                self.line(format!("let {name} = ({a}, {b});"));
                self.push_var(&name, Ty::Tup(vec![Ty::Fn1, Ty::Fn1]));
            }
            8 => self.tree_map_stmt(),
            9 => self.destructure(),
            10 => self.dyn_slice_stmt(),
            _ => {
                let c = self.cond(1);
                if self.rng.chance(0.5) {
                    self.feat("break");
                    self.line(format!("if {c} {{"));
                    self.ind += 1;
                    self.line("break;");
                } else {
                    self.feat("continue");
                    self.line(format!("if {c} {{"));
                    self.ind += 1;
                    self.line("continue;");
                }
                self.ind -= 1;
                self.line("}");
            }
        }
    }

    fn dyn_slice_stmt(&mut self) {
        let ints = self.items_of(&Ty::Int);
        if ints.is_empty() {
            return self.let_stmt(2);
        }
        let i = self.rng.pick(&ints).clone();
        let j = self.fresh("j");
        let name = self.fresh("sl");
        self.feat("dynamic_slice");
        if self.rng.chance(0.5) {
            let v = self.leaf_t(&Ty::V(3));
            let v = if v.starts_with('[') || v.contains(' ') {
                format!("({v})")
            } else {
                v
            };
            self.line(format!("let {j} = {i} % 2;"));
            self.line(format!("let {name} = {v}[{j} : {j} + 2];"));
            self.push_var(&name, Ty::V(2));
        } else {
            let v = self.leaf_t(&Ty::V(6));
            let v = if v.starts_with('[') || v.contains(' ') {
                format!("({v})")
            } else {
                v
            };
            self.line(format!("let {j} = {i} % 4;"));
            self.line(format!("let {name} = {v}[{j} : {j} + 3];"));
            self.push_var(&name, Ty::V(3));
        }
        if self.rng.chance(0.3) {
            let v = self.leaf_t(&Ty::V(3));
            let v = if v.starts_with('[') || v.contains(' ') {
                format!("({v})")
            } else {
                v
            };
            self.feat("dynamic_index");
            let name = self.fresh("di");
            self.line(format!("let {name} = {v}[{i} % 3];"));
            self.push_var(&name, Ty::S);
        }
    }

    fn tree_map_stmt(&mut self) {
        self.feat("tree_map");
        let tys = [
            Ty::Tup(vec![Ty::S, Ty::V(3)]),
            Ty::Rec(vec![("w", Ty::V(3)), ("b", Ty::S)]),
            Ty::Tup(vec![Ty::S, Ty::S]),
        ];
        let ty = self.rng.pick(&tys).clone();
        let its = self.items_of(&ty);
        let src = if !its.is_empty() && self.rng.chance(0.6) {
            self.rng.pick(&its).clone()
        } else {
            self.expr(&ty, 1)
        };
        let name = self.fresh("tm");
        let e = self.fresh("e");
        let c = self.expr_s(1);
        if self.rng.chance(0.7) {
            let body = match self.rng.below(3) {
                0 => format!("tanh({e} * {c})"),
                1 => format!("sin({e}) + {c}"),
                _ => format!("{e} * sigmoid({c})"),
            };
            self.line(format!("let {name} = tree_map(|{e}| {body}, {src});"));
        } else {
            let e2 = self.fresh("e");
            let src2 = self.expr(&ty, 1);
            self.feat("tree_map2");
            self.line(format!(
                "let {name} = tree_map(|{e}, {e2}| tanh({e} * {e2} + {c}), {src}, {src2});"
            ));
        }
        self.push_var(&name, ty);
        if self.rng.chance(0.3) {
            self.feat("tree_sum");
            let s = self.fresh("ts");
            // tree_sum adds the leaves; sum the tensor leaves first
            self.line(format!(
                "let {s} = tree_sum(tree_map(|{e}| sum({e}), {name}));"
            ));
            self.push_var(&s, Ty::S);
        }
    }

    fn destructure(&mut self) {
        let items = self.items();
        let tups: Vec<(String, Ty)> = items
            .iter()
            .filter(|(n, t)| {
                !n.contains('.')
                    && match t {
                        Ty::Tup(ts) => ts.iter().all(|t| *t != Ty::Fn1),
                        Ty::Rec(_) => true,
                        _ => false,
                    }
            })
            .cloned()
            .collect();
        if tups.is_empty() {
            return self.let_stmt(2);
        }
        let (n, ty) = self.rng.pick(&tups).clone();
        self.feat("destructure");
        match ty {
            Ty::Tup(ts) => {
                let names: Vec<String> = ts.iter().map(|_| self.fresh("p")).collect();
                self.line(format!("let ({}) = {n};", names.join(", ")));
                for (nm, t) in names.iter().zip(ts) {
                    self.push_var(nm, t);
                }
            }
            Ty::Rec(fs) => {
                let names: Vec<&str> = fs.iter().map(|(f, _)| *f).collect();
                self.line(format!("let {{ {} }} = {n};", names.join(", ")));
                for (f, t) in fs {
                    self.push_var(f, t);
                }
            }
            _ => unreachable!(),
        }
    }

    fn local_fn(&mut self) {
        self.feat("local_fn");
        let name = self.fresh("lf");
        let y = self.fresh("y");
        if self.rng.chance(0.3) {
            // a local recursive function capturing the environment
            self.feat("local_recursive_fn");
            let k = self.fresh("k");
            let c = self.expr_s(1);
            self.line(format!(
                "fn {name}({y}, {k}) = if {k} <= 0 {{ {y} }} else {{ {name}(tanh({y} * {c} + 0.3), {k} - 1) }};"
            ));
            let a = self.expr_s(2);
            let kk = self.int_expr();
            let t = self.fresh("t");
            self.line(format!("let {t} = {name}({a}, {kk});"));
            self.push_var(&t, Ty::S);
            return;
        }
        let mark = self.env.len();
        self.push_var(&y, Ty::S);
        self.lambda_depth += 1;
        if self.rng.chance(0.5) {
            let b = self.expr_s(2);
            self.env.truncate(mark);
            self.line(format!("fn {name}({y}) = {b} + {y} * 0.5;"));
        } else {
            self.line(format!("fn {name}({y}) {{"));
            self.ind += 1;
            let inner = self.env.len();
            for _ in 0..self.rng.int(1, 2) {
                self.let_stmt(2);
            }
            let e = self.expr_s(2);
            self.line(format!("{e} + {y}"));
            self.env.truncate(inner);
            self.ind -= 1;
            self.line("}");
            self.env.truncate(mark);
        }
        self.lambda_depth -= 1;
        self.push_var(&name, Ty::Fn1);
    }

    fn if_stmt(&mut self, nest: u32, ret: bool, in_loop: bool) {
        self.feat("if_stmt");
        let m = self.fresh("m");
        let ty = if self.rng.chance(0.75) {
            Ty::S
        } else {
            Ty::V(3)
        };
        let e = self.expr(&ty, 2);
        self.line(format!("let mut {m} = {e};"));
        self.push_var(&m, ty.clone());
        let c = self.cond(2);
        self.line(format!("if {c} {{"));
        self.branch(&m, &ty, nest, ret, in_loop);
        if self.rng.chance(0.3) {
            self.feat("else_if");
            let c2 = self.cond(1);
            self.line(format!("}} else if {c2} {{"));
            self.branch(&m, &ty, nest, ret, in_loop);
        }
        if self.rng.chance(0.7) {
            self.line("} else {");
            self.branch(&m, &ty, nest, ret, in_loop);
        }
        self.line("}");
    }

    fn branch(&mut self, m: &str, ty: &Ty, nest: u32, ret: bool, in_loop: bool) {
        self.ind += 1;
        let mark = self.env.len();
        if self.rng.chance(0.4) {
            self.stmt(nest + 1, ret, in_loop);
        }
        let e = self.expr(ty, 2);
        self.line(format!("{m} = tanh({e});"));
        self.env.truncate(mark);
        self.ind -= 1;
    }

    fn loop_stmt(&mut self, nest: u32, ret: bool) {
        self.feat("loop");
        let a = self.fresh("acc");
        let init = self.expr_s(2);
        self.line(format!("let mut {a} = {init};"));
        self.push_var(&a, Ty::S);
        // an extra structured carry
        let carry = match self.rng.below(4) {
            0 => {
                self.feat("tuple_carry");
                let st = self.fresh("st");
                let ty = Ty::Tup(vec![Ty::S, Ty::V(3)]);
                let e = self.expr(&ty, 1);
                self.line(format!("let mut {st} = {e};"));
                self.push_var(&st, ty.clone());
                Some((st, ty))
            }
            1 => {
                self.feat("record_carry");
                let st = self.fresh("rc");
                let ty = Ty::Rec(vec![("w", Ty::V(3)), ("b", Ty::S)]);
                let e = self.expr(&ty, 1);
                self.line(format!("let mut {st} = {e};"));
                self.push_var(&st, ty.clone());
                Some((st, ty))
            }
            2 => {
                self.feat("tensor_carry");
                let st = self.fresh("vc");
                let e = self.expr(&Ty::V(3), 1);
                self.line(format!("let mut {st} = {e};"));
                self.push_var(&st, Ty::V(3));
                Some((st, Ty::V(3)))
            }
            _ => None,
        };
        let i = self.fresh("i");
        let ints = self.items_of(&Ty::Int);
        let mut is_while = false;
        let mut counter = String::new();
        match self.rng.below(10) {
            0..=3 => {
                self.feat("for_const");
                let n = self.rng.int(1, 4);
                self.line(format!("for {i} in 0..{n} {{"));
            }
            4 | 5 => {
                self.feat("for_data_dependent");
                let s = self.expr_s(1);
                let k = self.rng.int(3, 4);
                self.line(format!("for {i} in 0..i64(abs({s}) * 3.0) % {k} {{"));
            }
            6 if !ints.is_empty() => {
                self.feat("for_int_arg");
                let n = self.rng.pick(&ints).clone();
                self.line(format!("for {i} in 0..{n} % 4 {{"));
            }
            _ => {
                self.feat("while");
                is_while = true;
                counter = self.fresh("k");
                let n = self.rng.int(1, 4);
                let lim = self.pos_lit(0.3, 0.9);
                self.line(format!("let mut {counter} = 0;"));
                self.push_var(&counter, Ty::Int);
                self.line(format!("while {counter} < {n} && {a} < {lim} {{"));
            }
        }
        self.ind += 1;
        let mark = self.env.len();
        if is_while {
            self.line(format!("let {i} = {counter};"));
            self.line(format!("{counter} += 1;"));
        }
        self.push_var(&i, Ty::Int);
        let n = self.rng.int(1, 3);
        for _ in 0..n {
            self.stmt(nest + 1, ret, true);
        }
        if nest > 0 {
            self.feat("nested_loops");
        }
        let e = self.expr_s(2);
        let e = if e.contains(&a) {
            e
        } else {
            format!("{e} + {a}")
        };
        self.line(format!("{a} = 0.6 * {a} + 0.4 * tanh({e});"));
        if let Some((st, ty)) = &carry {
            match ty {
                Ty::Tup(_) => {
                    let x = self.expr_s(1);
                    let v = self.expr_t(&Ty::V(3), 1);
                    self.line(format!(
                        "{st} = (0.5 * {st}.0 + 0.5 * tanh({x}), 0.5 * {st}.1 + 0.5 * tanh({v} * {st}.0));"
                    ));
                }
                Ty::Rec(_) => {
                    let x = self.expr_s(1);
                    let v = self.expr_t(&Ty::V(3), 1);
                    self.line(format!(
                        "{st} = {{w: 0.5 * {st}.w + 0.5 * sin({v}), b: tanh({st}.b + {x})}};"
                    ));
                }
                _ => {
                    let v = self.expr_t(&Ty::V(3), 1);
                    self.line(format!("{st} = tanh({st} * 0.8 + {v} * {a});"));
                }
            }
        }
        self.env.truncate(mark);
        self.ind -= 1;
        self.line("}");
    }

    // ---------------------------------------------------------------
    // Global helpers.

    fn helpers(&mut self) {
        let mut lines: Vec<String> = Vec::new();
        // custom bprop rules (correct ones)
        if self.rng.chance(0.35) {
            self.feat("custom_bprop");
            let k = self.rng.below(6);
            let n = self.fresh("cb");
            match k {
                0 => {
                    lines.push(format!("fn {n}(x) = x * x"));
                    lines.push(format!("bprop {n}(x, out, dout) = (dout * 2.0 * x,);"));
                    self.callables.push(Callable::S1(n.clone()));
                    self.fn_values.push(n);
                }
                1 => {
                    lines.push(format!("fn {n}(x) = sin(x)"));
                    lines.push(format!("bprop {n}(x, out, dout) = (dout * cos(x),);"));
                    self.callables.push(Callable::S1(n.clone()));
                    self.fn_values.push(n);
                }
                2 => {
                    lines.push(format!("fn {n}(x) = tanh(x)"));
                    lines.push(format!(
                        "bprop {n}(x, out, dout) = (dout * (1.0 - out * out),);"
                    ));
                    self.callables.push(Callable::S1(n.clone()));
                    self.fn_values.push(n);
                }
                3 => {
                    lines.push(format!("fn {n}(a, b) = a * b"));
                    lines.push(format!(
                        "bprop {n}(a, b, out, dout) = (dout * b, dout * a);"
                    ));
                    self.callables.push(Callable::S2(n));
                }
                4 => {
                    lines.push(format!("fn {n}(v) = v * v"));
                    lines.push(format!("bprop {n}(v, out, dout) = (dout * 2.0 * v,);"));
                    self.callables.push(Callable::VV(n));
                }
                _ => {
                    lines.push(format!("fn {n}(x) = exp(tanh(x))"));
                    lines.push(format!("bprop {n}(x, out, dout) {{"));
                    lines.push("    let t = tanh(x);".into());
                    lines.push("    (dout * out * (1.0 - t * t),)".into());
                    lines.push("}".into());
                    self.callables.push(Callable::S1(n.clone()));
                    self.fn_values.push(n);
                }
            }
        }
        // recursion
        if self.rng.chance(0.3) {
            self.feat("recursion");
            let n = self.fresh("rec");
            let a = self.pos_lit(0.5, 1.2);
            let b = self.lit(-0.5, 0.5);
            lines.push(format!(
                "fn {n}(x, k) = if k <= 0 {{ x }} else {{ {n}(tanh(x * {a} + {b}), k - 1) }}"
            ));
            self.callables.push(Callable::SK(n));
        }
        if self.rng.chance(0.15) {
            self.feat("recursion_data_dependent");
            let n = self.fresh("dd");
            lines.push(format!(
                "fn {n}(x) = if x > 0.6 {{ x * 0.5 }} else {{ {n}(x + 0.3 + 0.1 * sin(x)) }}"
            ));
            let w = self.fresh("ddw");
            lines.push(format!("fn {w}(x) = {n}(tanh(x))"));
            self.callables.push(Callable::S1(w.clone()));
            self.fn_values.push(w);
        }
        if self.rng.chance(0.15) {
            self.feat("mutual_recursion");
            let e = self.fresh("ev");
            let o = self.fresh("od");
            lines.push(format!(
                "fn {e}(x, k) = if k <= 0 {{ x }} else {{ {o}(sin(x) * 0.9, k - 1) }}"
            ));
            lines.push(format!(
                "fn {o}(x, k) = if k <= 0 {{ tanh(x) }} else {{ {e}(x * x * 0.5 + 0.1, k - 1) }}"
            ));
            self.callables.push(Callable::SK(e));
        }
        if self.rng.chance(0.15) {
            self.feat("recursion_tensor");
            let n = self.fresh("vrec");
            lines.push(format!(
                "fn {n}(v, k) = if k <= 0 {{ v }} else {{ {n}(tanh(v * 0.8 + 0.1), k - 1) }}"
            ));
            self.callables.push(Callable::VK(n));
        }
        // higher-order helpers
        if self.rng.chance(0.3) {
            lines.push("fn apply2(g, x) = g(g(x))".into());
            self.ho.push("apply2");
        }
        if self.rng.chance(0.25) {
            lines.push("fn compose(g, h) = |x| g(h(x))".into());
            self.ho.push("compose");
        }
        if self.rng.chance(0.25) {
            lines.push("fn mk_scale(a) = |x| tanh(x * a)".into());
            self.ho.push("mk_scale");
        }
        if self.rng.chance(0.3) {
            lines.push("fn dapply(g, x) = grad(g)(x)".into());
            self.ho.push("dapply");
        }
        // generated scalar helpers
        let nh = self.rng.int(0, if self.small { 1 } else { 2 });
        for _ in 0..nh {
            let n = self.fresh("h");
            self.env.clear();
            self.push_var("x", Ty::S);
            self.ret_tail = " + 0.1 * x".into();
            self.out.clear();
            self.ind = 1;
            if self.rng.chance(0.5) {
                let e = self.expr_s(3);
                lines.push(format!("fn {n}(x) = {e} + 0.1 * x"));
            } else {
                lines.push(format!("fn {n}(x) {{"));
                for _ in 0..self.rng.int(1, 3) {
                    self.stmt(1, true, false);
                }
                let e = self.expr_s(2);
                self.line(format!("tanh({e}) + 0.1 * x"));
                lines.append(&mut self.out);
                lines.push("}".into());
            }
            self.callables.push(Callable::S1(n.clone()));
            self.fn_values.push(n);
        }
        if self.rng.chance(0.3) {
            let n = self.fresh("vh");
            self.env.clear();
            self.push_var("v", Ty::V(3));
            let e = self.expr_s(2);
            lines.push(format!("fn {n}(v) = {e} + sum(v * v) * 0.1"));
            self.callables.push(Callable::VS(n));
        }
        self.env.clear();
        self.out = lines;
        self.ind = 0;
    }

    // ---------------------------------------------------------------
    // The program.

    pub fn program(mut self) -> Program {
        self.transforms_left = if self.rng.chance(0.6) {
            self.rng.int(1, 3) as u32
        } else {
            0
        };
        self.helpers();
        let helper_lines = std::mem::take(&mut self.out);
        // f's signature
        let n_float = self.rng.int(1, 3) as usize;
        let mut arg_tys: Vec<Ty> = Vec::new();
        for _ in 0..n_float {
            arg_tys.push(float_arg_type(self.rng.below(FLOAT_ARG_TYPES)));
        }
        for t in &arg_tys {
            match t {
                Ty::Tup(_) => self.feat("tuple_arg"),
                Ty::Rec(_) => self.feat("record_arg"),
                Ty::V(_) | Ty::M(..) => self.feat("tensor_arg"),
                _ => {}
            }
        }
        let has_int = self.rng.chance(0.35);
        let has_bool = self.rng.chance(0.2);
        if has_int {
            self.feat("int_arg");
        }
        if has_bool {
            self.feat("bool_arg");
        }
        let annotate = self.rng.chance(0.2);
        if annotate {
            self.feat("annotations");
        }
        let mut params: Vec<String> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (i, t) in arg_tys.iter().enumerate() {
            let n = format!("a{i}");
            params.push(if annotate {
                format!("{n}: {}", t.annotation())
            } else {
                n.clone()
            });
            self.push_var(&n, t.clone());
            names.push(n);
        }
        if has_int {
            params.push(if annotate {
                "n: i64".into()
            } else {
                "n".into()
            });
            self.push_var("n", Ty::Int);
            names.push("n".into());
        }
        if has_bool {
            params.push(if annotate {
                "flag: bool".into()
            } else {
                "flag".into()
            });
            self.push_var("flag", Ty::Bool);
            names.push("flag".into());
        }
        let ret_ann = if annotate { " -> f64" } else { "" };
        self.line(format!("fn f({}){ret_ann} {{", params.join(", ")));
        self.ind = 1;
        let mut arg_terms: Vec<String> = Vec::new();
        for (i, t) in arg_tys.iter().enumerate() {
            let c = self.pos_lit(0.1, 0.5);
            let n = &names[i];
            arg_terms.push(match t {
                Ty::S => format!("{c} * sin({n})"),
                Ty::V(_) | Ty::M(..) => format!("{c} * sum(sin({n}))"),
                Ty::Tup(ts) if ts[1] == Ty::S => format!("{c} * sin({n}.0 * {n}.1)"),
                Ty::Tup(_) => format!("{c} * sum(sin({n}.1 * {n}.0))"),
                _ => format!("{c} * sum(sin({n}.w + {n}.b))"),
            });
        }
        self.ret_tail = format!(" + {}", arg_terms.join(" + "));
        let n_stmts = if self.small {
            self.rng.int(1, 4)
        } else {
            self.rng.int(2, 7)
        };
        for _ in 0..n_stmts {
            self.stmt(0, true, false);
        }
        // the result: the latest scalars plus a smooth term in every argument
        let ss = self.items_of(&Ty::S);
        let mut terms: Vec<String> = Vec::new();
        for s in ss.iter().take(4) {
            terms.push(format!("tanh({s})"));
        }
        terms.extend(arg_terms);
        let e = self.expr_s(2);
        terms.push(format!("0.5 * tanh({e})"));
        self.line(terms.join(" + "));
        self.ind = 0;
        self.line("}");
        let f_lines = std::mem::take(&mut self.out);

        // main
        // five digits: ties between elements (kinks of max, min, abs at the
        // point itself, which finite differences cannot see) are unlikely
        let xs: Vec<Val> = arg_tys
            .iter()
            .map(|t| Val::random(t, &mut self.rng, -1.0, 1.0, 5))
            .collect();
        let vs: Vec<Val> = arg_tys
            .iter()
            .map(|t| Val::random(t, &mut self.rng, -1.0, 1.0, 2))
            .collect();
        let ws: Vec<Val> = arg_tys
            .iter()
            .map(|t| Val::random(t, &mut self.rng, -1.0, 1.0, 2))
            .collect();
        let u = self.rng.float(-2.0, 2.0, 2);
        let u = if u == 0.0 { 0.5 } else { u };
        let n_val = self.rng.int(0, 3);
        let flag_val = self.rng.chance(0.5);
        let mut main: Vec<String> = vec!["fn main() {".into()];
        let xnames: Vec<String> = (0..n_float).map(|i| format!("x{i}")).collect();
        for (i, x) in xs.iter().enumerate() {
            main.push(format!("    let x{i} = {};", x.lit()));
        }
        let mut extra: Vec<String> = Vec::new();
        if has_int {
            main.push(format!("    let n = {n_val};"));
            extra.push("n".into());
        }
        if has_bool {
            main.push(format!("    let flag = {flag_val};"));
            extra.push("flag".into());
        }
        let all_args = |xs: &[String]| -> String {
            let mut a: Vec<String> = xs.to_vec();
            a.extend(extra.iter().cloned());
            a.join(", ")
        };
        let argnums = format!(
            "({})",
            (0..n_float)
                .map(|i| format!("{i},"))
                .collect::<Vec<_>>()
                .join(" ")
                .trim_end_matches(',')
        );
        let argnums = if n_float == 1 {
            "(0,)".to_string()
        } else {
            argnums
        };
        let pnames: Vec<String> = (0..n_float).map(|i| format!("p{i}")).collect();
        let ptuple = |xs: &[String]| -> String {
            if xs.len() == 1 {
                format!("({},)", xs[0])
            } else {
                format!("({})", xs.join(", "))
            }
        };
        let vals_tuple = |vals: &[Val]| -> String {
            let l: Vec<String> = vals.iter().map(|v| v.lit()).collect();
            ptuple(&l)
        };
        // the gradient and the Hessian-vector product as top-level functions,
        // so that each is specialised once however many times main calls it
        let qnames: Vec<String> = (0..n_float).map(|i| format!("q{i}")).collect();
        let dnames: Vec<String> = (0..n_float).map(|i| format!("d{i}")).collect();
        let mut pre: Vec<String> = Vec::new();
        pre.push(format!(
            "fn df({}) = grad(f, argnums = {argnums})({})",
            all_args(&pnames),
            all_args(&pnames)
        ));
        let mut hargs = all_args(&pnames);
        hargs.push_str(", ");
        hargs.push_str(&dnames.join(", "));
        pre.push(format!(
            "fn hvp({hargs}) = jvp(|{}| df({}), {}, {}).1",
            qnames.join(", "),
            all_args(&qnames),
            ptuple(&pnames),
            ptuple(&dnames)
        ));
        let with_dirs = |vals: &[Val]| -> String {
            let mut a = all_args(&xnames);
            for v in vals {
                a.push_str(", ");
                a.push_str(&v.lit());
            }
            a
        };
        main.push(format!("    print(\"f\", f({}));", all_args(&xnames)));
        main.push(format!("    print(\"grad\", df({}));", all_args(&xnames)));
        main.push(format!(
            "    print(\"jvp\", jvp(|{}| f({}), {}, {}).1);",
            pnames.join(", "),
            all_args(&pnames),
            ptuple(&xnames),
            vals_tuple(&vs)
        ));
        main.push(format!("    let (vy, pb) = vjp(f, {});", all_args(&xnames)));
        main.push("    print(\"vjp_y\", vy);".into());
        main.push(format!("    print(\"vjp\", pb({}));", fmt_f64(u)));
        let hs = [1e-4, 1e-3];
        for (hi, h) in hs.iter().enumerate() {
            for (sign, tag) in [(1.0, "p"), (-1.0, "m")] {
                let pts: Vec<String> = xs
                    .iter()
                    .zip(&vs)
                    .map(|(x, v)| x.axpy(sign * h, v).lit())
                    .collect();
                main.push(format!(
                    "    print(\"fd{hi}{tag}\", f({}));",
                    all_args(&pts)
                ));
            }
        }
        main.push(format!("    print(\"hvp_v\", hvp({}));", with_dirs(&vs)));
        main.push(format!("    print(\"hvp_w\", hvp({}));", with_dirs(&ws)));
        for (hi, h) in hs.iter().enumerate() {
            for (sign, tag) in [(1.0, "p"), (-1.0, "m")] {
                let pts: Vec<String> = xs
                    .iter()
                    .zip(&vs)
                    .map(|(x, v)| x.axpy(sign * h, v).lit())
                    .collect();
                main.push(format!(
                    "    print(\"gfd{hi}{tag}\", df({}));",
                    all_args(&pts)
                ));
            }
        }
        // vmap over three points (x and the h = 1e-3 finite-difference
        // points), against the same function at each point.
        let rows: Vec<String> = (0..n_float)
            .map(|i| {
                let pts: Vec<String> = [1.0, -1.0]
                    .iter()
                    .map(|sign| xs[i].axpy(sign * hs[1], &vs[i]).lit())
                    .collect();
                format!(
                    "tree_map(|a, b, c| stack((a, b, c)), x{i}, {}, {})",
                    pts[0], pts[1]
                )
            })
            .collect();
        let lam = |callee: &str| format!("|{}| {callee}({})", pnames.join(", "), all_args(&pnames));
        main.push(format!(
            "    let vf = vmap({})({});",
            lam("f"),
            rows.join(", ")
        ));
        main.push(format!(
            "    let vg = vmap({})({});",
            lam("df"),
            rows.join(", ")
        ));
        for k in 0..3 {
            main.push(format!("    print(\"vmap{k}\", vf[{k}]);"));
            main.push(format!(
                "    print(\"vgrad{k}\", tree_map(|t| t[{k}], vg));"
            ));
        }
        main.push("}".into());

        let uses_sg = helper_lines
            .iter()
            .chain(&f_lines)
            .any(|l| l.contains("stop_gradient"));
        let mut src = String::new();
        src.push_str("// generated by adjoint-fuzz\n");
        for l in helper_lines.iter().chain(&f_lines).chain(&pre) {
            src.push_str(l);
            src.push('\n');
        }
        for l in &main {
            src.push_str(l);
            src.push('\n');
        }
        if self
            .features
            .iter()
            .any(|f| f.starts_with("nested_") || *f == "grad_of_fn_value")
        {
            self.feat("order3");
        }
        let mut v = Vec::new();
        vs.iter().for_each(|x| x.flatten(&mut v));
        let mut w = Vec::new();
        ws.iter().for_each(|x| x.flatten(&mut w));
        Program {
            source: src,
            features: self.features,
            meta: Meta {
                v,
                w,
                u,
                hs: hs.to_vec(),
                n_float,
                n_nondiff: extra.len(),
                stop_gradient: uses_sg,
            },
        }
    }
}

/// Whether the parenthesis opening `s` closes at its last character.
fn matching_paren_is_last(s: &str) -> bool {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return i == s.len() - 1;
                }
            }
            _ => {}
        }
    }
    false
}

/// The program with index `index` of a run with seed `seed`.
pub fn generate(seed: u64, index: u64) -> Program {
    Gen::new(crate::rng::program_seed(seed, index)).program()
}

/// Like [`generate`], smaller programs when `small` (a different program
/// for the same seed and index).
pub fn generate_sized(seed: u64, index: u64, small: bool) -> Program {
    let mut g = Gen::new(crate::rng::program_seed(seed, index));
    g.small = small;
    g.program()
}
