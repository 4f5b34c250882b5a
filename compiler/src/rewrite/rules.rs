//! The rewrite table: every rule, by name, grouped by topic.
//!
//! **Every rule is typed.** A rule only joins two classes whose types
//! (dtype, shape, weak flag) are equal, as the analysis computes them with
//! the primitives' inference rules. So no rule needs its own condition
//! about broadcasting or promotion: `(mul ?x 1.0)` is `?x` for an `f32`
//! tensor, but the rule does nothing for an int tensor (the product is a
//! float) or when the `1.0` is a tensor of a larger shape.
//!
//! **Every rule preserves values** — for IEEE floats including NaN, the
//! infinities and the sign of zero — except the two broadcast→reduce rules,
//! which are exact in `f32` and within rounding in `f64`, and
//! `sum-to-matmul`, which reassociates sums (see their notes). Rules that are only true of real numbers are not here: `x * 0 =
//! 0` (NaN and ±inf), `x - x = 0` (NaN, ±inf), `x + 0 = x` (`-0 + 0` is
//! `+0`), `-(a - b) = b - a` (`+0` vs `-0` when `a = b`), reassociation.

use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

use super::lang::{Dims, Lit, Meta, MetaGraph, Types};

/// What a rule is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Topic {
    /// Identities of arithmetic.
    Algebra,
    /// What differentiation leaves behind: products with ones, sums of
    /// broadcasts, double negations.
    AdCleanup,
    /// Moves of elements: transposes, reshapes, broadcasts.
    Layout,
}

/// The right-hand side of a rule.
pub enum Rhs {
    /// A pattern over the left-hand side's variables.
    Pat(&'static str),
    /// Nodes built from the match (for values computed from it: a count,
    /// a composed permutation); `None` when the rule does not apply.
    Build(fn(&mut MetaGraph, &Subst) -> Option<Id>),
}

/// When a rule applies, besides the equality of types.
pub enum When {
    Always,
    /// The variable's class is this constant (every element, bit for bit).
    Const(&'static str, f64),
}

/// One rule of the table.
pub struct RuleDef {
    pub name: &'static str,
    pub topic: Topic,
    pub lhs: &'static str,
    pub rhs: Rhs,
    pub when: When,
}

const fn rule(name: &'static str, topic: Topic, lhs: &'static str, rhs: Rhs) -> RuleDef {
    RuleDef {
        name,
        topic,
        lhs,
        rhs,
        when: When::Always,
    }
}

const fn rule_if(
    name: &'static str,
    topic: Topic,
    lhs: &'static str,
    rhs: Rhs,
    when: When,
) -> RuleDef {
    RuleDef {
        name,
        topic,
        lhs,
        rhs,
        when,
    }
}

use Rhs::{Build, Pat};
use Topic::{AdCleanup, Algebra, Layout};

/// The rules.
pub const RULES: &[RuleDef] = &[
    // ---- algebra: IEEE identities (exact for NaN, ±inf and ±0) ----
    // x·1 and x/1 are x exactly; the constant may be a literal or a
    // `ones_like`.
    rule_if(
        "mul-one",
        Algebra,
        "(mul ?x ?c)",
        Pat("?x"),
        When::Const("?c", 1.0),
    ),
    rule_if(
        "mul-one-left",
        Algebra,
        "(mul ?c ?x)",
        Pat("?x"),
        When::Const("?c", 1.0),
    ),
    rule_if(
        "div-one",
        Algebra,
        "(div ?x ?c)",
        Pat("?x"),
        When::Const("?c", 1.0),
    ),
    // x − (+0) is x, also for x = −0 (unlike x + 0).
    rule_if(
        "sub-zero",
        Algebra,
        "(sub ?x ?c)",
        Pat("?x"),
        When::Const("?c", 0.0),
    ),
    // x·(−1) is −x: multiplying by −1 only flips the sign bit.
    rule_if(
        "mul-minus-one",
        Algebra,
        "(mul ?x ?c)",
        Pat("(neg ?x)"),
        When::Const("?c", -1.0),
    ),
    // IEEE defines a − b as a + (−b).
    rule("sub-neg", Algebra, "(sub ?x (neg ?y))", Pat("(add ?x ?y)")),
    rule("add-neg", Algebra, "(add ?x (neg ?y))", Pat("(sub ?x ?y)")),
    // Rounding is symmetric about zero.
    rule(
        "mul-neg-neg",
        Algebra,
        "(mul (neg ?x) (neg ?y))",
        Pat("(mul ?x ?y)"),
    ),
    rule("where-same", Algebra, "(where ?c ?x ?x)", Pat("?x")),
    rule("relu-relu", Algebra, "(relu (relu ?x))", Pat("(relu ?x)")),
    rule("abs-neg", Algebra, "(abs (neg ?x))", Pat("(abs ?x)")),
    rule("abs-abs", Algebra, "(abs (abs ?x))", Pat("(abs ?x)")),
    // ---- AD clean-up ----
    rule("neg-neg", AdCleanup, "(neg (neg ?x))", Pat("?x")),
    // sum_to(broadcast_to(x, s), shape of x) = x · n, n the number of
    // copies. Exact in f32 (the reference adds in f64, where n copies of
    // an f32 add exactly, then rounds once, as the product does); in f64
    // within n roundings.
    rule(
        "sum-to-broadcast",
        AdCleanup,
        "(sum_to (broadcast ?x ?s) ?t)",
        Build(sum_to_broadcast),
    ),
    // The sum of every element of a scalar broadcast to s: x · size(s)
    // (same accuracy).
    rule(
        "sum-broadcast-scalar",
        AdCleanup,
        "(sum (broadcast ?x ?s) ?a)",
        Build(sum_broadcast_scalar),
    ),
    rule("sum-to-same", AdCleanup, "(sum_to ?x ?t)", Pat("?x")),
    // The derivative of a subtraction negates a cotangent that is then
    // summed down: negate the (smaller) sum instead. Rounding is
    // symmetric, so the sum of the negated terms is the negated sum, in
    // any order of summation.
    rule(
        "sum-to-neg",
        AdCleanup,
        "(sum_to (neg ?x) ?t)",
        Pat("(neg (sum_to ?x ?t))"),
    ),
    // A product summed over the rows of its left factor: sum those rows
    // first, Σ_i (A B)_ij = (Σ_i A_i) B, one row through the product
    // instead of all. The gradient of `x - mean` fed through a matrix
    // (GMM's means) has this form. The sums are reassociated: within
    // rows · inner roundings of the product's.
    rule(
        "sum-to-matmul",
        AdCleanup,
        "(sum_to (matmul ?a ?b) ?t)",
        Build(sum_to_matmul),
    ),
    rule(
        "sum-neg",
        AdCleanup,
        "(sum (neg ?x) ?a)",
        Pat("(neg (sum ?x ?a))"),
    ),
    rule(
        "sumk-neg",
        AdCleanup,
        "(sumk (neg ?x) ?a)",
        Pat("(neg (sumk ?x ?a))"),
    ),
    // ---- layout: moves of elements, which never change a value ----
    rule(
        "transpose-transpose",
        Layout,
        "(transpose (transpose ?x ?p) ?q)",
        Build(transpose_transpose),
    ),
    rule(
        "transpose-identity",
        Layout,
        "(transpose ?x ?p)",
        Build(transpose_identity),
    ),
    rule(
        "reshape-reshape",
        Layout,
        "(reshape (reshape ?x ?a) ?b)",
        Pat("(reshape ?x ?b)"),
    ),
    rule("reshape-same", Layout, "(reshape ?x ?s)", Pat("?x")),
    rule(
        "broadcast-broadcast",
        Layout,
        "(broadcast (broadcast ?x ?a) ?b)",
        Pat("(broadcast ?x ?b)"),
    ),
    rule("broadcast-same", Layout, "(broadcast ?x ?s)", Pat("?x")),
    // A reshape that only puts axes of size 1 in front is what
    // broadcasting does anyway (the mean's derivative makes these).
    rule(
        "broadcast-unit-reshape",
        Layout,
        "(broadcast (reshape ?x ?a) ?b)",
        Build(broadcast_unit_reshape),
    ),
    // (AB)ᵀ = BᵀAᵀ for matrices, in both directions: extraction picks the
    // form that moves fewer bytes. Each element is the same products
    // summed in the same order over k.
    rule(
        "transpose-matmul",
        Layout,
        "(transpose (matmul ?a ?b) [1,0])",
        Pat("(matmul (transpose ?b [1,0]) (transpose ?a [1,0]))"),
    ),
    rule(
        "matmul-transposes",
        Layout,
        "(matmul (transpose ?a [1,0]) (transpose ?b [1,0]))",
        Pat("(transpose (matmul ?b ?a) [1,0])"),
    ),
];

fn var(name: &str) -> Var {
    name.parse().expect("a pattern variable")
}

fn dims_of(g: &MetaGraph, id: Id) -> Option<Vec<usize>> {
    g[id].data.dims.clone()
}

fn shape_of(g: &MetaGraph, id: Id) -> Option<Vec<usize>> {
    g[id].data.ty.as_ref().map(|t| t.shape.clone())
}

/// `?x · n` for a float `n`: a weak literal, so the product keeps `?x`'s
/// dtype.
fn times(g: &mut MetaGraph, x: Id, n: usize) -> Option<Id> {
    if n == 0 {
        return None;
    }
    let c = g.add(Meta::Lit(Lit::float(n as f64)));
    Some(g.add(Meta::Map(
        super::lang::MapOp(crate::prim::Prim::Mul),
        vec![x, c],
    )))
}

fn sum_to_broadcast(g: &mut MetaGraph, s: &Subst) -> Option<Id> {
    let x = s[var("?x")];
    let xs = shape_of(g, x)?;
    let to = dims_of(g, s[var("?s")])?;
    if dims_of(g, s[var("?t")])? != xs {
        return None;
    }
    let n = to.iter().product::<usize>() / xs.iter().product::<usize>().max(1);
    times(g, x, n)
}

fn sum_to_matmul(g: &mut MetaGraph, s: &Subst) -> Option<Id> {
    let (a, b) = (s[var("?a")], s[var("?b")]);
    let (sa, sb) = (shape_of(g, a)?, shape_of(g, b)?);
    let t = dims_of(g, s[var("?t")])?;
    let r = sa.len();
    // `a` has every axis of the product but its last (no broadcasting of
    // `a`'s batch axes), `b` is a matrix or a batch of them, and the sum
    // keeps every axis of the product but its rows, which it reduces to 1.
    if r < 2 || sb.len() < 2 || sb.len() > r || t.len() != r {
        return None;
    }
    let batch_b = &sb[..sb.len() - 2];
    let fits = t[..r - 2] == sa[..r - 2]
        && sa[r - 2 - batch_b.len()..r - 2] == *batch_b
        && t[r - 2] == 1
        && sa[r - 2] > 1
        && t[r - 1] == sb[sb.len() - 1];
    if !fits {
        return None;
    }
    let mut rows = sa.clone();
    rows[r - 2] = 1;
    let d = g.add(Meta::Dims(Dims(rows)));
    let summed = g.add(Meta::SumTo([a, d]));
    Some(g.add(Meta::Matmul([summed, b])))
}

fn sum_broadcast_scalar(g: &mut MetaGraph, s: &Subst) -> Option<Id> {
    let x = s[var("?x")];
    if !shape_of(g, x)?.is_empty() {
        return None;
    }
    let to = dims_of(g, s[var("?s")])?;
    let axes = dims_of(g, s[var("?a")])?;
    if axes != (0..to.len()).collect::<Vec<_>>() {
        return None;
    }
    times(g, x, to.iter().product())
}

fn broadcast_unit_reshape(g: &mut MetaGraph, s: &Subst) -> Option<Id> {
    let x = s[var("?x")];
    let xs = shape_of(g, x)?;
    let a = dims_of(g, s[var("?a")])?;
    let lead = a.len().checked_sub(xs.len())?;
    if a[..lead].iter().any(|d| *d != 1) || a[lead..] != xs[..] {
        return None;
    }
    let b = s[var("?b")];
    Some(g.add(Meta::Broadcast([x, b])))
}

fn transpose_transpose(g: &mut MetaGraph, s: &Subst) -> Option<Id> {
    let x = s[var("?x")];
    let p = dims_of(g, s[var("?p")])?;
    let q = dims_of(g, s[var("?q")])?;
    if p.len() != q.len() {
        return None;
    }
    // transpose(transpose(x, p), q)[axis i] is axis q[i] of the inner
    // one, which is axis p[q[i]] of x.
    let composed: Vec<usize> = q
        .iter()
        .map(|&i| p.get(i).copied())
        .collect::<Option<_>>()?;
    if composed.iter().enumerate().all(|(i, &a)| i == a) {
        return Some(x);
    }
    let d = g.add(Meta::Dims(Dims(composed)));
    Some(g.add(Meta::Transpose([x, d])))
}

fn transpose_identity(g: &mut MetaGraph, s: &Subst) -> Option<Id> {
    let p = dims_of(g, s[var("?p")])?;
    p.iter()
        .enumerate()
        .all(|(i, &a)| i == a)
        .then(|| s[var("?x")])
}

/// A rule's right-hand side, applied only where both sides have one type.
struct Typed {
    rhs: Typedrhs,
    when: Option<(Var, f64)>,
}

enum Typedrhs {
    Pat(PatternAst<Meta>, Vec<Var>),
    Build(fn(&mut MetaGraph, &Subst) -> Option<Id>),
}

impl Applier<Meta, Types> for Typed {
    fn apply_one(
        &self,
        egraph: &mut MetaGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&PatternAst<Meta>>,
        _rule_name: Symbol,
    ) -> Vec<Id> {
        if let Some((v, c)) = self.when {
            match egraph[subst[v]].data.constant {
                Some(k) if k.to_bits() == c.to_bits() => {}
                _ => return vec![],
            }
        }
        let new = match &self.rhs {
            Typedrhs::Pat(ast, _) => egraph.add_instantiation(ast, subst),
            Typedrhs::Build(f) => match f(egraph, subst) {
                Some(id) => id,
                None => return vec![],
            },
        };
        let same = match (&egraph[eclass].data.ty, &egraph[new].data.ty) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        };
        if same && egraph.union(eclass, new) {
            vec![eclass]
        } else {
            vec![]
        }
    }

    fn vars(&self) -> Vec<Var> {
        match &self.rhs {
            Typedrhs::Pat(_, vars) => vars.clone(),
            Typedrhs::Build(_) => Vec::new(),
        }
    }
}

/// The table as egg rewrites.
pub fn rewrites() -> Vec<Rewrite<Meta, Types>> {
    RULES.iter().map(rewrite).collect()
}

fn rewrite(r: &RuleDef) -> Rewrite<Meta, Types> {
    let lhs: Pattern<Meta> = r.lhs.parse().expect("a rule's left-hand side parses");
    let rhs = match r.rhs {
        Rhs::Pat(p) => {
            let p: Pattern<Meta> = p.parse().expect("a rule's right-hand side parses");
            let vars = p.vars();
            Typedrhs::Pat(p.ast, vars)
        }
        Rhs::Build(f) => Typedrhs::Build(f),
    };
    let when = match r.when {
        When::Always => None,
        When::Const(v, c) => Some((var(v), c)),
    };
    Rewrite::new(r.name, lhs, Typed { rhs, when }).expect("a valid rewrite")
}
