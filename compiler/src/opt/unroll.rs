//! Unrolling recursion whose trip count is known at compile time, and the
//! constant folding of integer and boolean scalars it relies on.
//!
//! A recursive graph `h` (a loop header, a tail-recursive function, the
//! `unwind` loop reverse mode builds) is inlined at a call site like any
//! other graph when its *guard* — the condition of the `switch` that picks
//! between the branch that recurses and the one that does not — can be
//! evaluated from the call's arguments, and the whole recursion from that
//! call ends within [`MAX_TRIPS`] steps. The check simulates the recursion
//! on a small abstract domain ([`SVal`]): integer and boolean constants,
//! and tuples of known length (a reverse-mode stack built with
//! `make_tuple`). Each unrolled step leaves the next call with arguments
//! the simplifier folds, so the next round unrolls it in turn; the loop
//! becomes straight-line code that the other rewrites then take apart
//! (with reverse mode, the stack of backpropagators disappears). Loops
//! that do IO are not unrolled.

use rustc_hash::FxHashMap as HashMap;

use super::Rewriter;
use crate::ir::{Const, GraphId, Module, NodeId, NodeKind};
use crate::prim::Prim;

/// Recursions longer than this are not unrolled.
pub const MAX_TRIPS: usize = 16;

/// Nor when the copies would add more than this many nodes.
pub const MAX_UNROLLED_NODES: usize = 4_000;

/// Integer and boolean constant folding: `p` applied to `args`, when all
/// are constants of those types and the result is exact (no overflow).
pub fn fold_scalar(p: Prim, args: &[&Const]) -> Option<Const> {
    use Const::{Bool, Int};
    Some(match (p, args) {
        (Prim::Add, [Int(a), Int(b)]) => Int(a.checked_add(*b)?),
        (Prim::Sub, [Int(a), Int(b)]) => Int(a.checked_sub(*b)?),
        (Prim::Mul, [Int(a), Int(b)]) => Int(a.checked_mul(*b)?),
        (Prim::Neg, [Int(a)]) => Int(a.checked_neg()?),
        (Prim::Lt, [Int(a), Int(b)]) => Bool(a < b),
        (Prim::Le, [Int(a), Int(b)]) => Bool(a <= b),
        (Prim::Gt, [Int(a), Int(b)]) => Bool(a > b),
        (Prim::Ge, [Int(a), Int(b)]) => Bool(a >= b),
        (Prim::Eq, [Int(a), Int(b)]) => Bool(a == b),
        (Prim::Ne, [Int(a), Int(b)]) => Bool(a != b),
        (Prim::Eq, [Bool(a), Bool(b)]) => Bool(a == b),
        (Prim::Ne, [Bool(a), Bool(b)]) => Bool(a != b),
        (Prim::Not, [Bool(a)]) => Bool(!a),
        (Prim::And, [Bool(a), Bool(b)]) => Bool(*a && *b),
        (Prim::Or, [Bool(a), Bool(b)]) => Bool(*a || *b),
        _ => return None,
    })
}

/// What the unroller knows of a value.
#[derive(Clone, Debug, PartialEq)]
pub enum SVal {
    Int(i64),
    Bool(bool),
    /// A tuple of this many elements.
    Tuple(Vec<SVal>),
    /// Anything else.
    Opaque,
}

impl SVal {
    fn of_const(c: &Const) -> SVal {
        match c {
            Const::Int(i) => SVal::Int(*i),
            Const::Bool(b) => SVal::Bool(*b),
            Const::Unit => SVal::Tuple(Vec::new()),
            _ => SVal::Opaque,
        }
    }

    fn to_const(&self) -> Option<Const> {
        match self {
            SVal::Int(i) => Some(Const::Int(*i)),
            SVal::Bool(b) => Some(Const::Bool(*b)),
            _ => None,
        }
    }
}

/// Nesting of tuples (and of expressions) the evaluator follows.
const MAX_DEPTH: usize = 64;

/// Evaluates node `n` given the values of some nodes (`env`: parameters of
/// the recursive graph); other nodes are evaluated from their inputs.
fn eval(m: &Module, n: NodeId, env: &HashMap<NodeId, SVal>, depth: usize) -> SVal {
    eval_memo(m, n, env, &mut HashMap::default(), depth)
}

/// [`eval`], each node once: the graph is a DAG (`y = f(y) * g(y)` repeated
/// k times reaches `y` 2^k ways as a tree).
fn eval_memo(
    m: &Module,
    n: NodeId,
    env: &HashMap<NodeId, SVal>,
    memo: &mut HashMap<NodeId, SVal>,
    depth: usize,
) -> SVal {
    if let Some(v) = env.get(&n).or_else(|| memo.get(&n)) {
        return v.clone();
    }
    let v = eval_node(m, n, env, memo, depth);
    memo.insert(n, v.clone());
    v
}

fn eval_node(
    m: &Module,
    n: NodeId,
    env: &HashMap<NodeId, SVal>,
    memo: &mut HashMap<NodeId, SVal>,
    depth: usize,
) -> SVal {
    if depth > MAX_DEPTH {
        return SVal::Opaque;
    }
    let NodeKind::Apply(inputs) = &m.node(n).kind else {
        return m.as_const(n).map_or(SVal::Opaque, SVal::of_const);
    };
    let Some(p) = m.applied_prim(n) else {
        return SVal::Opaque;
    };
    // Only structure and integer and boolean arithmetic are followed: the
    // operands of anything else (float arithmetic) are never needed.
    // (The primitives of `fold_scalar` and the structural ones.)
    let followed = matches!(
        p,
        Prim::MakeTuple
            | Prim::AdHide
            | Prim::AdKey
            | Prim::TupleLen
            | Prim::TupleGet
            | Prim::Add
            | Prim::Sub
            | Prim::Mul
            | Prim::Neg
            | Prim::Lt
            | Prim::Le
            | Prim::Gt
            | Prim::Ge
            | Prim::Eq
            | Prim::Ne
            | Prim::Not
            | Prim::And
            | Prim::Or
    );
    if !followed {
        return SVal::Opaque;
    }
    let args: Vec<SVal> = inputs[1..]
        .iter()
        .map(|a| eval_memo(m, *a, env, memo, depth + 1))
        .collect();
    match (p, args.as_slice()) {
        (Prim::MakeTuple, _) => SVal::Tuple(args),
        (Prim::AdHide, [x]) | (Prim::AdKey, [x, _]) => x.clone(),
        (Prim::TupleLen, [SVal::Tuple(items)]) => SVal::Int(items.len() as i64),
        (Prim::TupleGet, [SVal::Tuple(items), SVal::Int(i)]) => usize::try_from(*i)
            .ok()
            .and_then(|i| items.get(i))
            .cloned()
            .unwrap_or(SVal::Opaque),
        _ => {
            let consts: Option<Vec<Const>> = args.iter().map(SVal::to_const).collect();
            consts
                .and_then(|cs| fold_scalar(p, &cs.iter().collect::<Vec<_>>()))
                .map_or(SVal::Opaque, |c| SVal::of_const(&c))
        }
    }
}

/// The shape of a recursive graph's control: one call `switch(c, a, b)(..)`
/// in its body, with the recursive calls in exactly one branch.
struct Guard {
    cond: NodeId,
    /// Whether the branch taken when `cond` holds is the recursive one.
    recurse_when: bool,
    /// The argument lists of the calls of `h` in the recursive branch.
    calls: Vec<Vec<NodeId>>,
}

impl Rewriter<'_> {
    /// Whether the recursion starting with the call `h(args..)` (arguments
    /// resolved, in graph `g`) ends within [`MAX_TRIPS`] steps that the
    /// evaluator can follow, and unrolling it fits the size limits.
    pub(super) fn can_unroll(&self, h: GraphId, args: &[NodeId]) -> bool {
        let Some(guard) = self.guard(h) else {
            return false;
        };
        // A loop that does IO (a training loop printing its progress, a
        // benchmark's timed iterations) is left a loop: its iterations are
        // meant to run one after the other, and copying a large body pays
        // nothing.
        let nest = self.nest(h);
        let bodies = || {
            nest.iter()
                .flat_map(|k| self.bodies.get(k).into_iter().flatten())
        };
        let does_io = bodies().any(|&n| {
            self.m
                .applied_prim(n)
                .is_some_and(|p| p.category() == crate::prim::Category::Io)
        });
        if does_io {
            return false;
        }
        let params = self.m.graph(h).params.clone();
        if params.len() != args.len() {
            return false;
        }
        let mut state: Vec<SVal> = args
            .iter()
            .map(|a| eval(self.m, *a, &HashMap::default(), 0))
            .collect();
        let size = bodies().count();
        for trip in 0..=MAX_TRIPS {
            let env: HashMap<NodeId, SVal> = params.iter().copied().zip(state.clone()).collect();
            let recurse = match eval(self.m, guard.cond, &env, 0) {
                SVal::Bool(c) => c == guard.recurse_when,
                _ => return false,
            };
            if !recurse {
                return trip > 0 || size * 2 <= MAX_UNROLLED_NODES;
            }
            if (trip + 1) * size > MAX_UNROLLED_NODES {
                return false;
            }
            // Every recursive call must lead to the same next state.
            let mut next: Option<Vec<SVal>> = None;
            for call in &guard.calls {
                let s: Vec<SVal> = call.iter().map(|a| eval(self.m, *a, &env, 0)).collect();
                match &next {
                    None => next = Some(s),
                    Some(prev) if *prev == s => {}
                    Some(_) => return false,
                }
            }
            match next {
                Some(s) => state = s,
                None => return false,
            }
        }
        false
    }

    /// The guard of recursive graph `h`, when it has the expected shape.
    fn guard(&self, h: GraphId) -> Option<Guard> {
        // The one `switch` of `h`'s body whose result is called.
        let mut switches = self.bodies.get(&h)?.iter().filter_map(|&n| {
            let callee = self.resolve(*self.m.inputs(n).first()?);
            (self.m.applied_prim(callee) == Some(Prim::Switch)).then_some(callee)
        });
        let callee = switches.next()?;
        if switches.any(|other| other != callee) {
            return None;
        }
        let &[_, c, a, b] = self.m.inputs(callee) else {
            return None;
        };
        let (c, a, b) = (self.resolve(c), self.resolve(a), self.resolve(b));
        let (Some(Const::Graph(ga)), Some(Const::Graph(gb))) =
            (self.m.as_const(a).cloned(), self.m.as_const(b).cloned())
        else {
            return None;
        };
        let (ca, cb) = (self.calls_of(ga, h)?, self.calls_of(gb, h)?);
        let (recurse_when, calls) = match (ca.is_empty(), cb.is_empty()) {
            (false, true) => (true, ca),
            (true, false) => (false, cb),
            _ => return None,
        };
        Some(Guard {
            cond: c,
            recurse_when,
            calls,
        })
    }

    /// The argument lists of the calls of `h` in graph `k` and the graphs
    /// nested in it; `h` must appear nowhere else there (not as a value).
    fn calls_of(&self, k: GraphId, h: GraphId) -> Option<Vec<Vec<NodeId>>> {
        let mut out = Vec::new();
        for x in self.nest(k) {
            for &n in self.bodies.get(&x).into_iter().flatten() {
                let ins: Vec<NodeId> = self.m.inputs(n).iter().map(|i| self.resolve(*i)).collect();
                for (j, i) in ins.iter().enumerate() {
                    if self.m.as_const(*i) == Some(&Const::Graph(h)) {
                        if j > 0 {
                            // Passed as a value: the recursion is not a
                            // plain call chain.
                            return None;
                        }
                        out.push(ins[1..].to_vec());
                    }
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_integer_and_boolean_scalars() {
        let f = |p, a: &[Const]| fold_scalar(p, &a.iter().collect::<Vec<_>>());
        assert_eq!(
            f(Prim::Add, &[Const::Int(2), Const::Int(3)]),
            Some(Const::Int(5))
        );
        assert_eq!(
            f(Prim::Lt, &[Const::Int(2), Const::Int(3)]),
            Some(Const::Bool(true))
        );
        assert_eq!(f(Prim::Not, &[Const::Bool(true)]), Some(Const::Bool(false)));
        assert_eq!(f(Prim::Add, &[Const::Int(i64::MAX), Const::Int(1)]), None);
        assert_eq!(f(Prim::Add, &[Const::Float(1.0), Const::Int(1)]), None);
    }
}
