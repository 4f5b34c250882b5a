//! Local rewrites of one primitive application, given its (already
//! resolved) arguments. Each returns the node that replaces the
//! application, or `None`.

use super::Rewriter;
use crate::ir::{Const, GraphId, NodeId};
use crate::prim::{Category, Prim};

impl Rewriter<'_> {
    pub(super) fn simplify(
        &mut self,
        g: GraphId,
        n: NodeId,
        p: Prim,
        args: &[NodeId],
    ) -> Option<NodeId> {
        match p {
            // tuple_get(make_tuple(x0, x1, ..), i) → xi; of zero() → zero().
            Prim::TupleGet if args.len() == 2 => {
                let t = args[0];
                if self.m.applied_prim(t) == Some(Prim::Zero) {
                    return Some(t);
                }
                let Some(Const::Int(i)) = self.m.as_const(args[1]) else {
                    return None;
                };
                if self.m.applied_prim(t) != Some(Prim::MakeTuple) {
                    return None;
                }
                let items = &self.m.inputs(t)[1..];
                usize::try_from(*i).ok().and_then(|i| items.get(i)).copied()
            }
            // record_get(make_record("a", a, ..), "a") → a.
            Prim::RecordGet if args.len() == 2 => {
                let r = args[0];
                if self.m.applied_prim(r) == Some(Prim::Zero) {
                    return Some(r);
                }
                let Some(Const::Str(name)) = self.m.as_const(args[1]) else {
                    return None;
                };
                if self.m.applied_prim(r) != Some(Prim::MakeRecord) {
                    return None;
                }
                let name = name.clone();
                let fields = &self.m.inputs(r)[1..];
                fields
                    .chunks(2)
                    .find(|kv| matches!(self.m.as_const(kv[0]), Some(Const::Str(s)) if *s == name))
                    .map(|kv| kv[1])
            }
            // env_getitem(env_setitem(e, k, v), k) → v, skipping other keys;
            // env_getitem(zero(), k) → zero().
            Prim::EnvGetitem if args.len() == 2 => {
                let Some(Const::Int(key)) = self.m.as_const(args[1]).cloned() else {
                    return None;
                };
                let mut e = args[0];
                loop {
                    match self.m.applied_prim(e) {
                        Some(Prim::Zero) => return Some(e),
                        Some(Prim::EnvSetitem) => {
                            let ins = self.m.inputs(e);
                            let (e2, k2, v) = (ins[1], ins[2], ins[3]);
                            match self.m.as_const(k2) {
                                Some(Const::Int(k)) if *k == key => return Some(self.resolve(v)),
                                Some(Const::Int(_)) => e = self.resolve(e2),
                                _ => break,
                            }
                        }
                        _ => break,
                    }
                }
                if e == args[0] {
                    None
                } else {
                    let loc = self.m.node(n).loc;
                    Some(self.m.add_prim(g, Prim::EnvGetitem, &[e, args[1]], loc))
                }
            }
            Prim::IsZero if args.len() == 1 => {
                let x = args[0];
                let known = if self.m.applied_prim(x) == Some(Prim::Zero) {
                    Some(true)
                } else if self.never_zero(x) {
                    Some(false)
                } else {
                    None
                };
                known.map(|b| {
                    let loc = self.m.node(n).loc;
                    self.m.add_const(Const::Bool(b), loc)
                })
            }
            Prim::Switch if args.len() == 3 => match self.m.as_const(args[0]) {
                Some(Const::Bool(true)) => Some(args[1]),
                Some(Const::Bool(false)) => Some(args[2]),
                _ if self.same(args[1], args[2]) => Some(args[1]),
                _ => None,
            },
            Prim::GAdd if args.len() == 2 => {
                if self.m.applied_prim(args[0]) == Some(Prim::Zero) {
                    Some(args[1])
                } else if self.m.applied_prim(args[1]) == Some(Prim::Zero) {
                    Some(args[0])
                } else if args
                    .iter()
                    .all(|a| self.tensor_valued(*a) && self.never_zero(*a))
                {
                    // Cotangents of one tensor have one shape: a plain add.
                    let loc = self.m.node(n).loc;
                    Some(self.m.add_prim(g, Prim::Add, args, loc))
                } else {
                    None
                }
            }
            // A tensor cotangent needs no zeros filled in.
            Prim::GradFinalize if args.len() == 2 => {
                (self.tensor_valued(args[0]) && self.never_zero(args[0])).then_some(args[0])
            }
            // After differentiation, stop_gradient is the identity.
            Prim::StopGradient if args.len() == 1 => Some(args[0]),
            _ => None,
        }
    }

    /// Whether two nodes certainly hold the same value.
    fn same(&self, a: NodeId, b: NodeId) -> bool {
        if a == b {
            return true;
        }
        matches!((self.m.as_const(a), self.m.as_const(b)),
            (Some(Const::Graph(x)), Some(Const::Graph(y))) if x == y)
    }

    /// Whether `n` certainly evaluates to something other than the symbolic
    /// zero (a tensor, a tuple, a function, ...).
    pub(super) fn never_zero(&self, n: NodeId) -> bool {
        let mut n = n;
        // Follow the primitives that pass a zero through.
        for _ in 0..64 {
            if let Some(c) = self.m.as_const(n) {
                let _ = c;
                return true;
            }
            let Some(p) = self.m.applied_prim(n) else {
                return false;
            };
            let ins = self.m.inputs(n);
            n = match p {
                Prim::Zero
                | Prim::TupleGet
                | Prim::RecordGet
                | Prim::EnvGetitem
                | Prim::Switch
                | Prim::TreeMap => return false,
                Prim::GAdd => {
                    let (a, b) = (self.resolve(ins[1]), self.resolve(ins[2]));
                    return self.never_zero(a) || self.never_zero(b);
                }
                Prim::SumTo | Prim::MatrixT | Prim::TransposeGrad | Prim::StopGradient => {
                    self.resolve(ins[1])
                }
                Prim::Unstack => self.resolve(ins[1]),
                Prim::TakeGrad => self.resolve(ins[4]),
                Prim::IndexGrad | Prim::TreeFill => self.resolve(ins[2]),
                _ => return true,
            };
        }
        false
    }

    /// Whether `n` is an application whose value is a tensor (when it is
    /// not the symbolic zero).
    pub(super) fn tensor_valued(&self, n: NodeId) -> bool {
        match self.m.applied_prim(n) {
            Some(p) => match p.category() {
                Category::Map | Category::Reduce | Category::Contract => true,
                Category::Reindex => !matches!(p, Prim::SplitLike | Prim::Unstack),
                _ => false,
            },
            None => false,
        }
    }
}
