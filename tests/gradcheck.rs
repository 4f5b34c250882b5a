//! Finite-difference checks of the derivative rules of every
//! differentiable primitive, reverse (`bprop`) and forward (`jvp_*`).
//!
//! The table below has one or more cases per primitive: a scalar loss written
//! in Adjoint over f64 inputs drawn from `randn` (shifted into the domain
//! of the primitive and away from its kinks), usually of the form
//! `sum(OP(x, ..) * w)` with random weights `w`, in several shapes including
//! broadcasting. Every case is checked in both modes, each by a generated
//! program that computes, for every element of every differentiated input,
//! the central difference `(loss(x + eps e_k) - loss(x - eps e_k)) / (2 eps)`,
//! where the perturbation `e_k` is `reshape(one_hot(k, n), shape(x))`, and
//! compares it with
//!
//! - reverse mode: element `k` of `grad(loss, argnums = (..))`;
//! - forward mode: the tangent `jvp(loss, (x..), (e_k, 0..)).1` (the
//!   other inputs' tangents zero); the value `jvp` returns must also be
//!   `loss(x..)`.
//!
//! Each program prints the largest relative error
//! `|ad - fd| / max(1, |ad|, |fd|)`. Programs run in-process (eager mode)
//! and every case must stay below its tolerance (1e-6 unless the case says
//! otherwise).
//!
//! Coverage: every primitive of `Prim::all()` whose `info().differentiable` is
//! set must have a case here (the math table's functions get theirs from
//! their rows, on the domain each row gives), except the few listed in `SKIP`; since every
//! case runs in both modes, that covers forward mode too. A primitive
//! added later without a case makes `every_differentiable_primitive_has_a_case`
//! fail. Primitives listed in `ad::NO_RULE_YET` must fail to compile, in
//! both modes, with "has no derivative rule".
//!
//! All failures are collected and reported together, each with its
//! generated program. `GRADCHECK_FILTER=NAME` runs only the cases of the
//! primitives whose name contains NAME.

use adjoint::{Mode, Session};
use adjoint_compiler::prim::Prim;
use adjoint_runtime::math::{Domain, MathFn};
use std::collections::BTreeSet;

/// Differentiable primitives without a finite-difference case, with the
/// reason. Everything else must be in the table.
const SKIP: &[(&str, &str)] = &[
    // The symbolic zero cotangent: it has no inputs to perturb.
    ("zero", "nullary; the symbolic zero of the AD pass"),
    // Environments of free-variable cotangents, keyed by IR node ids: they
    // have no user-level meaning that a finite difference could check.
    ("env_setitem", "internal AD environment"),
    ("env_getitem", "internal AD environment"),
    // Transforms of function values at run time: their inputs are closures,
    // which a finite difference cannot perturb. Their derivatives (the
    // cotangent of a closure passes through) are checked by
    // tests/programs/g084_nested_dynamic.adj against closed forms.
    ("ad_lift", "transforms a function value"),
    ("ad_dyn", "transforms a function value"),
    // The identity, hiding a type from inference: its derivative is the
    // identity, exercised by every loop gradient of the corpus.
    ("ad_hide", "identity on the stack of a reversed loop"),
    ("ad_key", "identity on a free variable of a reversed loop"),
];

struct Case {
    prim: &'static str,
    label: String,
    /// Differentiated inputs: (name, Adjoint expression of its value).
    diff: Vec<(&'static str, String)>,
    /// Inputs that are not differentiated (weights, indices, ..); their
    /// initialiser may refer to the differentiated inputs' names.
    consts: Vec<(&'static str, String)>,
    /// The loss, over the names of `diff` and `consts`.
    expr: String,
    /// The function whose finite differences the gradient must match, when
    /// it differs from `expr` (for `stop_gradient`).
    fd_expr: Option<String>,
    eps: f64,
    tol: f64,
}

fn case(prim: &'static str, label: impl Into<String>) -> Case {
    Case {
        prim,
        label: label.into(),
        diff: Vec::new(),
        consts: Vec::new(),
        expr: String::new(),
        fd_expr: None,
        eps: 1e-6,
        tol: 1e-6,
    }
}

impl Case {
    fn x(mut self, name: &'static str, init: String) -> Case {
        self.diff.push((name, init));
        self
    }
    fn c(mut self, name: &'static str, init: impl Into<String>) -> Case {
        // The generated program's own names would shadow the constant.
        assert!(
            !["u", "e", "g", "k", "fd", "eps", "err"].contains(&name),
            "constant `{name}` of a `{}` case: the checking program uses that name",
            self.prim
        );
        self.consts.push((name, init.into()));
        self
    }
    /// Random weights `w` of the given shape.
    fn w(self, shape: &str) -> Case {
        self.c("w", rn(shape, 99))
    }
    fn e(mut self, expr: impl Into<String>) -> Case {
        self.expr = expr.into();
        self
    }
    fn fd(mut self, expr: impl Into<String>) -> Case {
        self.fd_expr = Some(expr.into());
        self
    }
    fn step(mut self, eps: f64, tol: f64) -> Case {
        self.eps = eps;
        self.tol = tol;
        self
    }
}

/// Standard normal f64 values of `shape` ("3, 4"; "" for a scalar).
fn rn(shape: &str, seed: u32) -> String {
    format!("randn([{shape}], seed = {seed}, dtype = f64)")
}
/// Values >= 0.5.
fn pos(shape: &str, seed: u32) -> String {
    format!("(abs({}) + 0.5)", rn(shape, seed))
}
/// Values of either sign with |v| >= 0.3 (away from the kink at 0).
fn away(shape: &str, seed: u32) -> String {
    format!(
        "((abs({}) + 0.3) * where(rand([{shape}], seed = {}, dtype = f64) > 0.5, 1.0, -1.0))",
        rn(shape, seed),
        seed + 500
    )
}
/// Values spread over several integers (for floor, ceil, sign).
fn wide(shape: &str, seed: u32) -> String {
    format!("({} * 3.0)", rn(shape, seed))
}

/// Values in (-0.9, 0.9).
fn unit(shape: &str, seed: u32) -> String {
    format!("(tanh({}) * 0.9)", rn(shape, seed))
}
/// Values >= 1.5.
fn above_one(shape: &str, seed: u32) -> String {
    format!("(abs({}) + 1.5)", rn(shape, seed))
}

/// Makes the input of a case: a seed's random tensor, in a domain.
type Input = fn(&str, u32) -> String;

fn cases() -> Vec<Case> {
    let mut v = Vec::new();

    // ----- element-wise, one operand -------------------------------------
    let unary: &[(&str, &str, Input)] = &[
        ("neg", "-x", rn),
        ("exp", "exp(x)", rn),
        ("log", "log(x)", pos),
        ("log1p", "log1p(x)", pos),
        ("sin", "sin(x)", rn),
        ("cos", "cos(x)", rn),
        ("tanh", "tanh(x)", rn),
        ("sigmoid", "sigmoid(x)", rn),
        ("relu", "relu(x)", away),
        ("sqrt", "sqrt(x)", pos),
        ("rsqrt", "rsqrt(x)", pos),
        ("abs", "abs(x)", away),
        ("sign", "sign(x)", away),
        ("floor", "floor(x)", wide),
        ("ceil", "ceil(x)", wide),
        ("lgamma", "lgamma(x)", pos),
        ("erf", "erf(x)", rn),
        ("digamma", "digamma(x)", pos),
        ("trigamma", "trigamma(x)", pos),
    ];
    // The math table's functions, on the domain its rows give.
    let math: Vec<(&str, String, Input)> = MathFn::ALL
        .iter()
        .map(|f| {
            let init: Input = match f.row().domain {
                Domain::Real => rn,
                Domain::Positive => pos,
                Domain::Unit => unit,
                Domain::AboveOne => above_one,
            };
            (f.name(), format!("{}(x)", f.name()), init)
        })
        .collect();
    let unary = unary
        .iter()
        .map(|(p, e, init)| (*p, e.to_string(), *init))
        .chain(math);
    for (i, (p, e, init)) in unary.enumerate() {
        let s = i as u32 * 10;
        v.push(
            case(p, "f64[3, 4]")
                .x("x", init("3, 4", s + 1))
                .w("3, 4")
                .e(format!("sum({e} * w)")),
        );
        v.push(
            case(p, "f64[] scalar")
                .x("x", init("", s + 2))
                .w("")
                .e(format!("{e} * w")),
        );
        v.push(
            case(p, "f64[2, 3, 2], composed with itself")
                .x("x", init("2, 3, 2", s + 3))
                .w("2, 3, 2")
                .e(format!("sum({e} * w) + sum({e} * {e}) * 0.5")),
        );
    }

    // polygamma(n, x): orders 0..3 (order n + 1 is the derivative of order
    // n), the order an int computed at run time.
    for n in 0..=3u32 {
        v.push(
            case("polygamma", format!("order {n}, f64[3, 4]"))
                .x("x", pos("3, 4", 190 + n))
                .w("3, 4")
                .e(format!("sum(polygamma({n}, x) * w)")),
        );
    }
    v.push(
        case("polygamma", "order 2 squared, scalar")
            .x("x", pos("", 195))
            .w("")
            .e("polygamma(2, x) * polygamma(2, x) * w"),
    );
    v.push(
        case("polygamma", "order m + 1 of an int argument m")
            .x("x", pos("2, 3", 196))
            .c("m", "2")
            .w("2, 3")
            .e("sum(polygamma(m + 1, x * 2.0) * w)"),
    );
    v.push(
        case("polygamma", "negative x")
            .x("x", format!("(-0.5 + 0.1 * {})", rn("2, 3", 197)))
            .w("2, 3")
            .e("sum(polygamma(2, x) * w)")
            .step(1e-7, 1e-6),
    );

    // ----- element-wise, two operands, with broadcasting ----------------
    type Init = fn(&str, u32) -> String;
    let binary: &[(&str, &str, Init, Init)] = &[
        ("add", "x + y", rn, rn),
        ("sub", "x - y", rn, rn),
        ("mul", "x * y", rn, rn),
        ("div", "x / y", rn, away),
        ("pow", "x ** y", pos, rn),
        ("rem", "x % y", wide, away),
        ("maximum", "maximum(x, y)", rn, rn),
        ("minimum", "minimum(x, y)", rn, rn),
        ("gadd", "gadd(x, y)", rn, rn),
    ];
    let shapes: &[(&str, &str, &str)] = &[
        ("3, 4", "3, 4", "3, 4"),
        ("3, 4", "4", "3, 4"),
        ("3, 1", "1, 4", "3, 4"),
        ("3, 4", "", "3, 4"),
        ("", "2, 3", "2, 3"),
        ("2, 1, 3", "4, 1", "2, 4, 3"),
    ];
    for (i, (p, e, ix, iy)) in binary.iter().enumerate() {
        for (j, (sx, sy, so)) in shapes.iter().enumerate() {
            // gadd adds cotangents of one structure: no broadcasting.
            if *p == "gadd" && sx != sy {
                continue;
            }
            let s = 200 + (i * 10 + j) as u32 * 2;
            v.push(
                case(p, format!("f64[{sx}] with f64[{sy}]"))
                    .x("x", ix(sx, s))
                    .x("y", iy(sy, s + 1))
                    .w(so)
                    .e(format!("sum(({e}) * w)")),
            );
        }
    }
    // the operands are the same value
    v.push(
        case("mul", "x * x")
            .x("x", rn("3, 4", 400))
            .w("3, 4")
            .e("sum(x * x * w)"),
    );
    v.push(
        case("pow", "x ** 3 (int exponent)")
            .x("x", rn("3, 4", 401))
            .w("3, 4")
            .e("sum(x ** 3 * w)"),
    );
    v.push(
        case("pow", "2 ** x")
            .x("x", rn("3, 4", 402))
            .w("3, 4")
            .e("sum(2.0 ** x * w)"),
    );

    // where(c, a, b): c is not differentiated
    v.push(
        case("where", "same shapes")
            .x("a", rn("3, 4", 410))
            .x("b", rn("3, 4", 411))
            .c("c", format!("{} > 0.0", rn("3, 4", 412)))
            .w("3, 4")
            .e("sum(where(c, a * a, b * 3.0) * w)"),
    );
    v.push(
        case("where", "broadcast operands")
            .x("a", rn("4", 413))
            .x("b", rn("3, 1", 414))
            .c("c", format!("{} > 0.0", rn("3, 4", 415)))
            .w("3, 4")
            .e("sum(where(c, a, b) * w)"),
    );

    // casts
    v.push(
        case("cast", "f64 to f64")
            .x("x", rn("3, 4", 420))
            .w("3, 4")
            .e("sum(f64(x) * w)"),
    );
    // through f32: the finite difference needs a larger step
    v.push(
        case("cast", "f64 to f32 and back")
            .x("x", rn("3, 4", 421))
            .w("3, 4")
            .e("sum(f64(f32(x) * f32(2.0)) * w)")
            .step(1e-2, 1e-4),
    );

    // ----- scans --------------------------------------------------------
    for (i, p) in ["cumsum", "cumprod"].iter().enumerate() {
        let s = 560 + i as u32 * 10;
        v.push(
            case(p, "flattened")
                .x("x", away("3, 4", s))
                .w("12")
                .e(format!("sum({p}(x) * w)")),
        );
        v.push(
            case(p, "axis = 1")
                .x("x", away("3, 4", s + 1))
                .w("3, 4")
                .e(format!("sum({p}(x, axis = 1) * w)")),
        );
        v.push(
            case(p, "axis = 0, reverse")
                .x("x", away("3, 4", s + 2))
                .w("3, 4")
                .e(format!("sum({p}(x, axis = 0, reverse = true) * w)")),
        );
    }
    // a lane with zeros: the rule's pieces before, at and after the first
    v.push(
        case("cumprod", "through zeros")
            .x("x", rn("2, 5", 575))
            .w("2, 5")
            .e("sum(cumprod(x * [1.0, 0.0, 1.0, 0.0, 1.0], axis = 1) * w)"),
    );

    // ----- collectives, in a world of one process ------------------------
    // (several processes: tests/parallel, under mpirun)
    for (i, op) in ["sum", "mean", "max", "min"].iter().enumerate() {
        v.push(
            case("all_reduce", format!("op = {op}"))
                .x("x", rn("3, 4", 580 + i as u32))
                .w("3, 4")
                .e(format!("sum(all_reduce(x * x, op = \"{op}\") * w)")),
        );
    }
    v.push(
        case("all_gather", "axis = 1")
            .x("x", rn("3, 4", 585))
            .w("3, 4")
            .e("sum(all_gather(sin(x), axis = 1) * w)"),
    );
    v.push(
        case("reduce_scatter", "axis = 0")
            .x("x", rn("3, 4", 586))
            .w("3, 4")
            .e("sum(reduce_scatter(x * x, axis = 0) * w)"),
    );
    v.push(
        case("broadcast", "root 0")
            .x("x", rn("3, 4", 587))
            .w("3, 4")
            .e("sum(broadcast(tanh(x), root = 0) * w)"),
    );

    // ----- matrix decompositions ----------------------------------------
    // Well-conditioned matrices: a random part plus a multiple of the
    // identity (positive definite symmetric parts for cholesky and eigh).
    let wellcond =
        |shape: &str, seed: u32| format!("({} * 0.5 + 3.0 * eye(3, dtype = f64))", rn(shape, seed));
    v.push(
        case("solve", "matrix right-hand side")
            .x("a", wellcond("3, 3", 600))
            .x("b", rn("3, 2", 601))
            .w("3, 2")
            .e("sum(solve(a, b) * w)"),
    );
    v.push(
        case("solve", "stack of matrices, one vector")
            .x("a", wellcond("2, 3, 3", 602))
            .x("b", rn("3", 603))
            .w("2, 3")
            .e("sum(solve(a, b) * w)"),
    );
    for (i, lower) in ["true", "false"].iter().enumerate() {
        v.push(
            case("triangular_solve", format!("lower = {lower}"))
                .x("a", wellcond("3, 3", 604 + i as u32))
                .x("b", rn("3, 2", 606 + i as u32))
                .w("3, 2")
                .e(format!("sum(triangular_solve(a, b, lower = {lower}) * w)")),
        );
    }
    // vmap's primitives, through the functions that use them: a mapped
    // argument, an unmapped one (its cotangent summed over the lanes), a
    // value the mapped function captures, and a Jacobian differentiated.
    v.push(
        case("vmap_in", "mapped rows")
            .x("a", rn("3, 2", 620))
            .w("3, 2")
            .e("sum(vmap(|r| sin(r) * r[0])(a) * w)"),
    );
    v.push(
        case("vmap_out", "rows put back at axis 1")
            .x("a", rn("3, 2", 621))
            .w("2, 3")
            .e("sum(vmap(|r| tanh(r) * sum(r), out_axes = 1)(a) * w)"),
    );
    v.push(
        case("vmap_sum", "an unmapped argument")
            .x("a", rn("2", 622))
            .c("b", rn("3, 2", 623))
            .w("3, 2")
            .e("sum(vmap(|r, s| sin(r * s), in_axes = (0, None))(b, a) * w)"),
    );
    v.push(
        case("vmap_fn", "a captured value")
            .x("a", rn("2", 624))
            .c("b", rn("3, 2", 625))
            .w("3, 2")
            .e("sum(vmap(|r| exp(r * a))(b) * w)"),
    );
    v.push(
        case("jac_reshape", "a Jacobian")
            .x("a", rn("3", 626))
            .w("3, 3")
            .e("sum(jacobian(|v| sin(v) * v[1])(a) * w)"),
    );
    v.push(
        case("det", "stack of matrices")
            .x("a", wellcond("2, 3, 3", 608))
            .w("2")
            .e("sum(det(a) * w)"),
    );
    v.push(
        case("slogdet", "a negative determinant")
            .x(
                "a",
                format!("({} * [[1.0], [1.0], [-1.0]])", wellcond("3, 3", 609)),
            )
            .e("slogdet(a).1 + slogdet(a).0"),
    );
    v.push(
        case("cholesky", "stack of matrices")
            .x("a", wellcond("2, 3, 3", 610))
            .w("2, 3, 3")
            .e("sum(cholesky(a) * w)"),
    );
    v.push(
        case("eigh", "values and vectors")
            .x("a", wellcond("3, 3", 611))
            .w("3, 3")
            .c("wv", rn("3", 612))
            .e("sum(eigh(a).1 * w) + sum(eigh(a).0 * wv)"),
    );
    for (i, shape) in ["4, 3", "3, 3"].iter().enumerate() {
        v.push(
            case("qr", format!("[{shape}]"))
                .x("a", rn(shape, 613 + i as u32))
                .c("wq", rn(shape, 615 + i as u32))
                .c("wr", rn("3, 3", 617 + i as u32))
                .e("sum(qr(a).0 * wq) + sum(qr(a).1 * wr)"),
        );
    }

    // ----- reductions ---------------------------------------------------
    for (i, p) in ["sum", "mean", "max", "min", "prod"].iter().enumerate() {
        let s = 500 + i as u32 * 10;
        let init = |shape: &str, seed: u32| {
            if *p == "prod" {
                away(shape, seed)
            } else {
                rn(shape, seed)
            }
        };
        v.push(
            case(p, "all")
                .x("x", init("3, 4", s))
                .w("")
                .e(format!("{p}(x) * w")),
        );
        v.push(
            case(p, "axis = 0")
                .x("x", init("3, 4", s + 1))
                .w("4")
                .e(format!("sum({p}(x, axis = 0) * w)")),
        );
        v.push(
            case(p, "axis = -1, keepdims")
                .x("x", init("3, 4", s + 2))
                .w("3, 1")
                .e(format!("sum({p}(x, axis = -1, keepdims = true) * w)")),
        );
        v.push(
            case(p, "axis = (0, 2) of f64[2, 3, 4]")
                .x("x", init("2, 3, 4", s + 3))
                .w("3")
                .e(format!("sum({p}(x, axis = (0, 2)) * w)")),
        );
        v.push(
            case(p, "axis = 1 of f64[2, 3, 4], squared")
                .x("x", init("2, 3, 4", s + 4))
                .w("2, 4")
                .e(format!("sum({p}(x * x, axis = 1) * w)")),
        );
    }

    // ----- reindexing ---------------------------------------------------
    v.push(
        case("reshape", "[3, 4] to [4, 3]")
            .x("x", rn("3, 4", 600))
            .w("4, 3")
            .e("sum(reshape(x, [4, 3]) * w)"),
    );
    v.push(
        case("reshape", "[2, 6] to [3, 2, 2]")
            .x("x", rn("2, 6", 601))
            .w("3, 2, 2")
            .e("sum(reshape(x, [3, 2, 2]) * w)"),
    );
    v.push(
        case("reshape", "scalar to [1, 1]")
            .x("x", rn("", 602))
            .w("1, 1")
            .e("sum(reshape(x, [1, 1]) * w)"),
    );
    v.push(
        case("transpose", "2-D")
            .x("x", rn("3, 4", 610))
            .w("4, 3")
            .e("sum(transpose(x) * w)"),
    );
    v.push(
        case("transpose", "perm = [2, 0, 1]")
            .x("x", rn("2, 3, 4", 611))
            .w("4, 2, 3")
            .e("sum(transpose(x, perm = [2, 0, 1]) * w)"),
    );
    v.push(
        case("transpose", "3-D default (reverse)")
            .x("x", rn("2, 3, 4", 612))
            .w("4, 3, 2")
            .e("sum(transpose(x) * w)"),
    );
    v.push(
        case("broadcast_to", "[4] to [3, 4]")
            .x("x", rn("4", 620))
            .w("3, 4")
            .e("sum(broadcast_to(x, [3, 4]) * w)"),
    );
    v.push(
        case("broadcast_to", "[3, 1] to [2, 3, 4]")
            .x("x", rn("3, 1", 621))
            .w("2, 3, 4")
            .e("sum(broadcast_to(x, [2, 3, 4]) * w)"),
    );
    v.push(
        case("broadcast_to", "scalar to [2, 2]")
            .x("x", rn("", 622))
            .w("2, 2")
            .e("sum(broadcast_to(x, [2, 2]) * w)"),
    );
    v.push(
        case("full", "scalar fill to [2, 3]")
            .x("x", rn("", 623))
            .w("2, 3")
            .e("sum(full([2, 3], x) * w)"),
    );
    v.push(
        case("full", "row fill to [2, 3], f64")
            .x("x", rn("3", 624))
            .w("2, 3")
            .e("sum(full([2, 3], x, dtype = f64) * w)"),
    );
    v.push(
        case("concat", "axis = 0")
            .x("x", rn("2, 4", 630))
            .x("y", rn("3, 4", 631))
            .w("5, 4")
            .e("sum(concat((x, y), axis = 0) * w)"),
    );
    v.push(
        case("concat", "axis = 1, a piece used twice")
            .x("x", rn("3, 2", 632))
            .x("y", rn("3, 4", 633))
            .w("3, 8")
            .e("sum(concat((x, y, x * x), axis = 1) * w)"),
    );
    v.push(
        case("stack", "axis = 0")
            .x("x", rn("3, 4", 640))
            .x("y", rn("3, 4", 641))
            .w("2, 3, 4")
            .e("sum(stack((x, y), axis = 0) * w)"),
    );
    v.push(
        case("stack", "axis = 2, three pieces")
            .x("x", rn("3, 4", 642))
            .x("y", rn("3, 4", 643))
            .w("3, 4, 3")
            .e("sum(stack((x, y, x * y), axis = 2) * w)"),
    );
    v.push(
        case("expand_dims", "axis = 1")
            .x("x", rn("3, 4", 650))
            .w("3, 1, 4")
            .e("sum(expand_dims(x, 1) * w)"),
    );
    v.push(
        case("expand_dims", "axis = -1")
            .x("x", rn("3, 4", 651))
            .w("3, 4, 1")
            .e("sum(expand_dims(x, -1) * w)"),
    );
    v.push(
        case("squeeze", "all")
            .x("x", rn("3, 1, 4, 1", 660))
            .w("3, 4")
            .e("sum(squeeze(x) * w)"),
    );
    v.push(
        case("squeeze", "axis = 1")
            .x("x", rn("3, 1, 4, 1", 661))
            .w("3, 4, 1")
            .e("sum(squeeze(x, axis = 1) * w)"),
    );
    v.push(
        case("take", "axis = 0, repeated indices")
            .x("x", rn("5, 3", 670))
            .w("4, 3")
            .e("sum(take(x, [4, 0, 4, 2], axis = 0) * w)"),
    );
    v.push(
        case("take", "axis = 1, 2-D indices")
            .x("x", rn("3, 5", 671))
            .w("3, 2, 2")
            .e("sum(take(x, [[1, 1], [0, 4]], axis = 1) * w)"),
    );
    v.push(
        case("take", "no axis (flattened)")
            .x("x", rn("3, 4", 672))
            .w("3")
            .e("sum(take(x, [11, 0, 11]) * w)"),
    );
    v.push(
        case("index", "x[1]")
            .x("x", rn("3, 4", 680))
            .w("4")
            .e("sum(x[1] * w)"),
    );
    v.push(
        case("index", "x[:, 2]")
            .x("x", rn("3, 4", 681))
            .w("3")
            .e("sum(x[:, 2] * w)"),
    );
    v.push(
        case("index", "x[1:3, 1:]")
            .x("x", rn("3, 4", 682))
            .w("2, 3")
            .e("sum(x[1:3, 1:] * w)"),
    );
    v.push(
        case("index", "x[-1, 0] scalar")
            .x("x", rn("3, 4", 683))
            .c("w", "1.5")
            .e("x[-1, 0] * w + x[0, 0] * x[0, 0]"),
    );
    v.push(
        case("index", "dynamic index and slice in a loop")
            .x("x", rn("6, 2", 684))
            .w("6, 2")
            .e("{ let mut s = 0.0; for i in 0..3 { s = s + sum(x[i * 2 : i * 2 + 2] * w[i]) + sum(x[i] * x[i + 3]); } s }"),
    );

    // ----- contractions -------------------------------------------------
    let mm = [
        ("[3, 4] @ [4, 2]", "3, 4", "4, 2", "3, 2"),
        ("[2, 3, 4] @ [4, 5] (batched)", "2, 3, 4", "4, 5", "2, 3, 5"),
        (
            "[2, 1, 3, 4] @ [3, 4, 2] (batch broadcast)",
            "2, 1, 3, 4",
            "3, 4, 2",
            "2, 3, 3, 2",
        ),
        ("[4] @ [4, 2]", "4", "4, 2", "2"),
        ("[3, 4] @ [4]", "3, 4", "4", "3"),
        ("[4] @ [4]", "4", "4", ""),
    ];
    for (i, (label, sx, sy, so)) in mm.iter().enumerate() {
        let s = 700 + i as u32 * 2;
        v.push(
            case("matmul", *label)
                .x("x", rn(sx, s))
                .x("y", rn(sy, s + 1))
                .w(so)
                .e("sum((x @ y) * w)"),
        );
    }
    let dots = [
        ("[3, 4] . [4, 2]", "3, 4", "4, 2", "3, 2"),
        ("[4] . [4, 2]", "4", "4, 2", "2"),
        ("[3, 4] . [4]", "3, 4", "4", "3"),
        ("[4] . [4]", "4", "4", ""),
    ];
    for (i, (label, sx, sy, so)) in dots.iter().enumerate() {
        let s = 720 + i as u32 * 2;
        v.push(
            case("dot", *label)
                .x("x", rn(sx, s))
                .x("y", rn(sy, s + 1))
                .w(so)
                .e("sum(dot(x, y) * w)"),
        );
    }
    v.push(
        case("outer", "[3] x [4]")
            .x("x", rn("3", 730))
            .x("y", rn("4", 731))
            .w("3, 4")
            .e("sum(outer(x, y) * w)"),
    );
    v.push(
        case("outer", "the same vector")
            .x("x", rn("3", 732))
            .w("3, 3")
            .e("sum(outer(x, x) * w)"),
    );
    v.push(
        case("mT", "[2, 3, 4]")
            .x("x", rn("2, 3, 4", 740))
            .w("2, 4, 3")
            .e("sum(mT(x) * w)"),
    );

    // ----- structure ----------------------------------------------------
    v.push(
        case("make_tuple", "pair")
            .x("x", rn("3, 4", 800))
            .x("y", rn("3, 4", 801))
            .w("3, 4")
            .e("{ let t = (x * 2.0, y); sum(t.0 * t.1 * w) }"),
    );
    v.push(
        case("tuple_get", "nested")
            .x("x", rn("3, 4", 802))
            .x("y", rn("4", 803))
            .w("3, 4")
            .e("{ let t = ((x, y), sin(x)); sum(t.0.0 * t.0.1 * t.1 * w) }"),
    );
    v.push(
        case("make_record", "two fields")
            .x("x", rn("3, 4", 810))
            .x("y", rn("3, 4", 811))
            .w("3, 4")
            .e("{ let r = { a: x, b: y * y }; sum(r.a * r.b * w) }"),
    );
    v.push(
        case("record_get", "nested record")
            .x("x", rn("3, 4", 812))
            .x("y", rn("", 813))
            .w("3, 4")
            .e("{ let r = { a: { b: x }, c: y }; sum(r.a.b * r.c * w) }"),
    );
    v.push(
        case("tensor_literal", "rows from vectors")
            .x("x", rn("3", 820))
            .x("y", rn("3", 821))
            .w("2, 3")
            .e("sum([x, y * x] * w)"),
    );
    v.push(
        case("tensor_literal", "from scalars")
            .x("x", rn("3", 822))
            .w("2, 2")
            .e("sum([[x[0], x[1] * x[2]], [x[2], 1.0]] * w)"),
    );

    // ----- control ------------------------------------------------------
    v.push(
        case("switch", "then branch")
            .x("x", rn("3, 4", 900))
            .x("y", rn("3, 4", 901))
            .w("3, 4")
            .e("if sum(x) > -1000.0 { sum(x * y * w) } else { sum(x) }"),
    );
    v.push(
        case("switch", "else branch")
            .x("x", rn("3, 4", 902))
            .x("y", rn("3, 4", 903))
            .w("3, 4")
            .e("if sum(x) > 1000.0 { sum(x) } else { sum(sin(x) * y * w) }"),
    );
    v.push(
        case("tree_map", "over a tuple")
            .x("x", rn("3, 4", 910))
            .x("y", rn("3, 4", 911))
            .w("3, 4")
            .e("tree_sum(tree_map(|a| sum(a * a * w), (x, y)))"),
    );
    v.push(
        case("tree_map", "two trees")
            .x("x", rn("3, 4", 912))
            .x("y", rn("3, 4", 913))
            .w("3, 4")
            .e("tree_sum(tree_map(|a, b| sum(a * b * w), { p: x, q: y }, { p: y, q: x * x }))"),
    );
    v.push(
        case(
            "tree_map",
            "a closure over a differentiated input, nested tree",
        )
        .x("x", rn("3, 4", 914))
        .x("s", rn("", 915))
        .w("3, 4")
        .e("tree_sum(tree_map(|a| sum(a * s * w), (x, (x * x, { k: sin(x) }))))"),
    );
    v.push(
        case("tree_map", "tuples at the leaves, partly used")
            .x("x", rn("3, 4", 916))
            .x("y", rn("3, 4", 917))
            .w("3, 4")
            .e("{ let t = tree_map(|a| (a * a, sin(a)), { p: x, q: (y,) }); sum(t.p.1 * w) + sum(t.q.0.0 * w * x) }"),
    );
    v.push(
        case("tree_map", "the first tree a prefix of the second")
            .x("x", rn("3, 4", 918))
            .x("y", rn("3, 4", 919))
            .w("3, 4")
            .e("tree_sum(tree_map(|a, b| sum(a * b.0 * b.1 * w), (x, y), ((y, x), (x, x))))"),
    );
    v.push(
        case("tree_map", "nested maps")
            .x("x", rn("3, 4", 922))
            .x("y", rn("3, 4", 923))
            .w("3, 4")
            .e("tree_sum(tree_map(|a| tree_sum(tree_map(|b| sum(a * b * w), (a, y))), (x, x * y)))"),
    );
    v.push(
        case("tree_gadd", "tensor leaves")
            .x("x", rn("3, 4", 925))
            .x("y", rn("3, 4", 926))
            .w("3, 4")
            .e("sum(tree_gadd((x, (x * y, { k: y * y }))) * w)"),
    );
    v.push(
        case("tree_sum", "tuple of scalars")
            .x("x", rn("3, 4", 920))
            .x("y", rn("3, 4", 921))
            .w("3, 4")
            .e("tree_sum((sum(x * w), (sum(y * y), { k: sum(x * y) })))"),
    );
    // stop_gradient: the gradient must match the finite differences of the
    // loss with the stopped value held at its unperturbed value.
    v.push(
        case("stop_gradient", "a stopped factor")
            .x("x", rn("3, 4", 930))
            .x("y", rn("3, 4", 931))
            .c("xb", "x")
            .w("3, 4")
            .e("sum(stop_gradient(x) * y * w + x)")
            .fd("sum(xb * y * w + x)"),
    );

    // ----- values made by differentiation (user-callable) ---------------
    v.push(
        case("grad_finalize", "tensor cotangent")
            .x("x", rn("3, 4", 1000))
            .c("like", rn("3, 4", 1001))
            .w("3, 4")
            .e("sum(grad_finalize(x * x, like) * w)"),
    );
    v.push(
        case("sum_to", "[3, 4] to [4]")
            .x("x", rn("3, 4", 1010))
            .c("like", rn("4", 1011))
            .w("4")
            .e("sum(sum_to(x, like) * w)"),
    );
    v.push(
        case("sum_to", "[2, 3, 4] to [3, 1]")
            .x("x", rn("2, 3, 4", 1012))
            .c("like", rn("3, 1", 1013))
            .w("3, 1")
            .e("sum(sum_to(x * x, like) * w)"),
    );
    v.push(
        case("transpose_grad", "perm = [2, 0, 1]")
            .x("x", rn("2, 3, 4", 1020))
            .w("3, 4, 2")
            .e("sum(transpose_grad(x, [2, 0, 1]) * w)"),
    );
    v.push(
        case("split_like", "axis = 0")
            .x("x", rn("5, 4", 1030))
            .c("w0", rn("2, 4", 1031))
            .c("w1", rn("3, 4", 1032))
            .e("{ let t = split_like(x, (w0, w1), 0); sum(t.0 * w0) + sum(t.1 * t.1 * w1) }"),
    );
    v.push(
        case("unstack", "axis = 1")
            .x("x", rn("3, 2", 1040))
            .c("w0", rn("3", 1041))
            .c("w1", rn("3", 1042))
            .e("{ let t = unstack(x, 1); sum(t.0 * w0) + sum(t.1 * t.0 * w1) }"),
    );
    v.push(
        case("take_grad", "repeated indices")
            .x("x", rn("4, 3", 1050))
            .c("like", rn("5, 3", 1051))
            .w("5, 3")
            .e("sum(take_grad(like, [4, 0, 4, 2], 0, x) * w)"),
    );
    v.push(
        case("index_grad", "row")
            .x("x", rn("3", 1060))
            .c("like", rn("5, 3", 1061))
            .w("5, 3")
            .e("sum(index_grad(like, x, 1) * w)"),
    );
    v.push(
        case("index_grad", "slice")
            .x("x", rn("2, 3", 1062))
            .c("like", rn("5, 3", 1063))
            .w("5, 3")
            .e("sum(index_grad(like, x * x, (1, 3)) * w)"),
    );
    v.push(
        case("index_at", "element and dynamic-length window")
            .x("x", rn("4, 3", 1064))
            .w("2")
            .e("sum(index_at(x, (2, (1, 3))) * w) + index_at(x, (0, 0)) * index_at(x, (3, 2))"),
    );
    v.push(
        case("index_set", "row from a broadcast value")
            .x("x", rn("4, 3", 1065))
            .x("v", rn("1", 1066))
            .w("4, 3")
            .e("sum(index_set(x * x, (1,), v * v) * w)"),
    );
    v.push(
        case("index_set", "element")
            .x("x", rn("5", 1067))
            .x("v", rn("", 1068))
            .w("5")
            .e("sum(index_set(x, (3,), v * x[0]) * w)"),
    );
    v.push(
        case("index_add", "slice of rows")
            .x("x", rn("4, 3", 1069))
            .x("v", rn("2, 3", 1090))
            .w("4, 3")
            .e("sum(index_add(x, ((1, 3),), v * x[0]) * w)"),
    );
    v.push(
        case("index_mul", "column, broadcast scalar")
            .x("x", rn("3, 4", 1091))
            .x("v", rn("", 1092))
            .w("3, 4")
            .e("sum(index_mul(x, (((), ()), 2), v) * w * x)"),
    );
    v.push(
        case("index_min", "slice, away from ties")
            .x("x", rn("6", 1093))
            .x("v", rn("3", 1094))
            .w("6")
            .e("sum(index_min(x, ((2, 5),), v + 0.5) * w * x)"),
    );
    v.push(
        case("index_max", "slice, away from ties")
            .x("x", rn("6", 1095))
            .x("v", rn("3", 1096))
            .w("6")
            .e("sum(index_max(x, ((2, 5),), v - 0.5) * w * x)"),
    );
    v.push(
        case("tuple_grad", "second element")
            .x("x", rn("3", 1070))
            .c("like", rn("3", 1071))
            .w("3")
            .e("{ let t = tuple_grad((1.0, like), 1, x); sum(t.1 * w) }"),
    );
    v.push(
        case("record_grad", "field b")
            .x("x", rn("3", 1080))
            .c("like", rn("3", 1081))
            .w("3")
            .e("{ let r = record_grad({ a: 1.0, b: like }, \"b\", x); sum(r.b * r.b * w) }"),
    );
    v.push(
        case("tree_fill", "tuple")
            .x("x", rn("", 1090))
            .c("w0", rn("3", 1091))
            .e("{ let t = tree_fill((1.0, w0), x); t.0 * 2.0 + sum(t.1 * w0) }"),
    );
    v
}

/// Which derivative a generated program checks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum AdMode {
    /// `grad` (reverse mode): every element of the gradient.
    Reverse,
    /// `jvp` (forward mode): the tangent along every unit direction of
    /// every differentiated input (the other inputs' tangents zero), and
    /// the value `jvp` returns.
    Forward,
}

/// The generated program of one case, in one mode.
fn program(c: &Case, mode: AdMode) -> String {
    let mut names: Vec<&str> = c.diff.iter().map(|(n, _)| *n).collect();
    names.extend(c.consts.iter().map(|(n, _)| *n));
    let params = names.join(", ");
    let dnames: Vec<&str> = c.diff.iter().map(|(n, _)| *n).collect();
    let mut s = String::new();
    s.push_str(&format!("fn loss({params}) = {};\n", c.expr));
    s.push_str(&format!(
        "fn loss_fd({params}) = {};\n",
        c.fd_expr.as_deref().unwrap_or(&c.expr)
    ));
    s.push_str("fn relerr(a, f) = abs(a - f) / maximum(1.0, maximum(abs(a), abs(f)));\n");
    s.push_str("fn main() {\n");
    for (n, init) in c.diff.iter().chain(c.consts.iter()) {
        s.push_str(&format!("    let {n} = {init};\n"));
    }
    let lambda = format!("|{}| loss({params})", dnames.join(", "));
    if mode == AdMode::Reverse {
        let argnums: Vec<String> = (0..dnames.len()).map(|i| i.to_string()).collect();
        s.push_str(&format!(
            "    let g = grad({lambda}, argnums = ({},))({});\n",
            argnums.join(", "),
            dnames.join(", ")
        ));
    }
    s.push_str(&format!("    let eps = {:e};\n", c.eps));
    s.push_str("    let mut err = 0.0;\n");
    if mode == AdMode::Forward {
        // The value jvp returns is the function's.
        s.push_str(&format!(
            "    let zs = ({},);\n",
            dnames
                .iter()
                .map(|d| format!("zeros_like({d})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        s.push_str(&format!(
            "    err = maximum(err, relerr(jvp({lambda}, ({},), zs).0, loss({params})));\n",
            dnames.join(", ")
        ));
    }
    for (i, d) in dnames.iter().enumerate() {
        let with = |op: &str| {
            names
                .iter()
                .map(|n| {
                    if n == d {
                        format!("{n} {op} e")
                    } else {
                        n.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        s.push_str(&format!("    let n{i} = size({d});\n"));
        if mode == AdMode::Reverse {
            s.push_str(&format!("    let gf{i} = reshape(g.{i}, [n{i}]);\n"));
        }
        s.push_str(&format!("    for k in 0..n{i} {{\n"));
        s.push_str(&format!(
            "        let u = reshape(one_hot(k, n{i}, dtype = f64), shape({d}));\n"
        ));
        s.push_str("        let e = u * eps;\n");
        s.push_str(&format!(
            "        let fd = (loss_fd({}) - loss_fd({})) / (2.0 * eps);\n",
            with("+"),
            with("-")
        ));
        match mode {
            AdMode::Reverse => s.push_str(&format!(
                "        err = maximum(err, relerr(gf{i}[k], fd));\n"
            )),
            AdMode::Forward => {
                let tangents: Vec<String> = dnames
                    .iter()
                    .map(|n| {
                        if n == d {
                            "u".to_string()
                        } else {
                            format!("zeros_like({n})")
                        }
                    })
                    .collect();
                s.push_str(&format!(
                    "        let t = jvp({lambda}, ({},), ({},)).1;\n",
                    dnames.join(", "),
                    tangents.join(", ")
                ));
                s.push_str("        err = maximum(err, relerr(t, fd));\n");
            }
        }
        s.push_str("    }\n");
    }
    s.push_str("    print(err);\n}\n");
    s
}

/// Runs one program; returns what it printed or the rendered error.
fn run(name: &str, src: &str) -> Result<String, String> {
    let session = Session::new(Mode::Eager)
        .load_source(name, src)
        .map_err(|e| e.render(false))?;
    let mut out = Vec::new();
    session.run_main(&mut out).map_err(|e| e.render(false))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn differentiable() -> BTreeSet<&'static str> {
    Prim::all()
        .iter()
        .filter(|p| p.info().differentiable)
        .map(|p| p.name())
        .collect()
}

#[test]
fn every_differentiable_primitive_has_a_case() {
    let diff = differentiable();
    let skip: BTreeSet<&str> = SKIP.iter().map(|(n, _)| *n).collect();
    let covered: BTreeSet<&str> = cases().iter().map(|c| c.prim).collect();
    let missing: Vec<&&str> = diff
        .iter()
        .filter(|p| !skip.contains(*p) && !covered.contains(*p))
        .collect();
    assert!(
        missing.is_empty(),
        "differentiable primitives without a gradient check case in tests/gradcheck.rs: {missing:?}"
    );
    let unknown: Vec<&&str> = covered
        .iter()
        .chain(skip.iter())
        .filter(|p| !diff.contains(*p))
        .collect();
    assert!(
        unknown.is_empty(),
        "cases or skips for names that are not differentiable primitives: {unknown:?}"
    );
}

/// Runs every case (or those `GRADCHECK_FILTER` selects) in `mode`.
fn check_all(mode: AdMode) {
    let filter = std::env::var("GRADCHECK_FILTER").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for c in cases() {
        if let Some(f) = &filter {
            if !c.prim.contains(f.as_str()) {
                continue;
            }
        }
        ran += 1;
        let src = program(&c, mode);
        let name = format!("gradcheck_{}.adj", c.prim);
        let what = format!("{} ({}, {mode:?} mode)", c.prim, c.label);
        let no_rule = adjoint_compiler::ad::NO_RULE_YET
            .iter()
            .any(|p| p.name() == c.prim);
        if no_rule {
            // Documented as missing: differentiating through it must be a
            // clear compile-time error, never a silent wrong answer.
            match run(&name, &src) {
                Err(e) if e.contains("has no derivative rule") => {}
                other => failures.push(format!(
                    "{what}: listed in ad::NO_RULE_YET, so it must fail with \"has no derivative rule\"; got {other:?}"
                )),
            }
            continue;
        }
        match run(&name, &src) {
            Ok(out) => match out.trim().parse::<f64>() {
                Ok(err) if err < c.tol => {}
                Ok(err) => failures.push(format!(
                    "{what}: max relative error {err:e} >= {:e}\n{src}",
                    c.tol
                )),
                Err(_) => failures.push(format!("{what}: unexpected output {out:?}\n{src}")),
            },
            Err(e) => failures.push(format!("{what}: the program failed:\n{e}\n{src}")),
        }
    }
    assert!(ran > 0, "no case ran");
    assert!(
        failures.is_empty(),
        "{} of {ran} {mode:?}-mode checks failed:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Reverse mode: `grad` against central differences.
#[test]
fn gradients_match_finite_differences() {
    check_all(AdMode::Reverse);
}

/// Forward mode: `jvp` against central differences, for the same table.
#[test]
fn tangents_match_finite_differences() {
    check_all(AdMode::Forward);
}
