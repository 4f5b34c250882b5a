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
            // ad_lift(x) → x when x certainly holds no function: a constant
            // other than a graph, or the result of a primitive that makes
            // tensors (the arguments of a `grad`, once inlined).
            Prim::AdLift if args.len() == 3 => {
                let x = args[0];
                let plain = match self.m.as_const(x) {
                    Some(c) => !matches!(c, Const::Graph(_)),
                    None => self.m.applied_prim(x).is_some_and(|q| {
                        matches!(
                            q.category(),
                            Category::Map
                                | Category::Reindex
                                | Category::Reduce
                                | Category::Contract
                                | Category::Create
                        )
                    }),
                };
                plain.then_some(x)
            }
            // tuple_get(make_tuple(x0, x1, ..), i) → xi; of zero() → zero();
            // record_get likewise; both pushed through cotangent builders.
            Prim::TupleGet | Prim::RecordGet if args.len() == 2 => self.get_of(g, n, p, args),
            // env_getitem(env_setitem(e, k, v), k) → v, skipping other keys;
            // env_getitem(zero(), k) → zero().
            Prim::EnvGetitem if args.len() == 2 => {
                let Some(Const::Int(key)) = self.m.as_const(args[1]).cloned() else {
                    return None;
                };
                // A key nothing stores a nonzero cotangent under.
                if self.dead_keys.contains(&key) {
                    let loc = self.m.node(n).loc;
                    return Some(self.m.add_prim(g, Prim::Zero, &[], loc));
                }
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
            // env_setitem(e, k, zero()) → e when e certainly has no entry
            // for k (a missing key reads as zero()); env_setitem(e, k, d)
            // → e when k's entries are always zero.
            Prim::EnvSetitem if args.len() == 3 => {
                let Some(Const::Int(key)) = self.m.as_const(args[1]).cloned() else {
                    return None;
                };
                if self.dead_keys.contains(&key) {
                    return Some(args[0]);
                }
                if self.m.applied_prim(args[2]) != Some(Prim::Zero) {
                    return None;
                }
                let mut e = args[0];
                loop {
                    match self.m.applied_prim(e) {
                        Some(Prim::Zero) => return Some(args[0]),
                        Some(Prim::EnvSetitem) => {
                            let ins = self.m.inputs(e);
                            match self.m.as_const(ins[2]) {
                                Some(Const::Int(k)) if *k != key => e = self.resolve(ins[1]),
                                _ => return None,
                            }
                        }
                        _ => return None,
                    }
                }
            }
            // is_unit / is_tuple of a value whose kind is plain in the IR
            // (a default argument `()`, a literal, a tuple built here): the
            // branches of `flip`'s `axis` and the like, resolved before the
            // typed pass (a loop in a dead branch was unrolled for ever).
            Prim::IsUnit | Prim::IsTuple if args.len() == 1 => {
                let x = args[0];
                let kind = match self.m.as_const(x) {
                    Some(Const::Unit) => Some((true, true)),
                    Some(_) => Some((false, false)),
                    None => match self.m.applied_prim(x) {
                        Some(Prim::MakeTuple) => Some((self.m.inputs(x).len() == 1, true)),
                        Some(Prim::MakeRecord) => Some((false, false)),
                        Some(q) if self.tensor_valued(x) && q != Prim::Zero => Some((false, false)),
                        _ => None,
                    },
                };
                kind.map(|(unit, tuple)| {
                    let b = if p == Prim::IsUnit { unit } else { tuple };
                    let loc = self.m.node(n).loc;
                    self.m.add_const(Const::Bool(b), loc)
                })
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
            // The zero cotangent of a float literal (weak f64) is `0.0`.
            Prim::GradFinalize
                if args.len() == 2
                    && self.m.applied_prim(args[0]) == Some(Prim::Zero)
                    && matches!(self.m.as_const(args[1]), Some(Const::Float(_))) =>
            {
                let loc = self.m.node(n).loc;
                Some(self.m.add_const(Const::Float(0.0), loc))
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
                    // Two cotangents of one field (element) of one record
                    // (tuple): one builder of their sum, also across a
                    // chain `gadd(gadd(x, rg), rg')`.
                    let loc = self.m.node(n).loc;
                    if let Some(m) = self.merge_builders(g, args[0], args[1], loc) {
                        return Some(m);
                    }
                    if self.m.applied_prim(args[0]) != Some(Prim::GAdd) {
                        return None;
                    }
                    let ins = self.m.inputs(args[0]);
                    let (x, y) = (self.resolve(ins[1]), self.resolve(ins[2]));
                    for (keep, other) in [(x, y), (y, x)] {
                        if let Some(m) = self.merge_builders(g, other, args[1], loc) {
                            return Some(self.m.add_prim(g, Prim::GAdd, &[keep, m], loc));
                        }
                    }
                    None
                }
            }
            // After differentiation, stop_gradient is the identity.
            Prim::StopGradient if args.len() == 1 && !self.opts.to_differentiate => Some(args[0]),
            // tuple_len of a tuple built here (or of `()`).
            Prim::TupleLen if args.len() == 1 => {
                let t = self.see_through_hide(args[0]);
                let len = match (self.m.as_const(t), self.m.applied_prim(t)) {
                    (Some(Const::Unit), _) => 0,
                    (_, Some(Prim::MakeTuple)) => self.m.inputs(t).len() - 1,
                    _ => return None,
                };
                let loc = self.m.node(n).loc;
                Some(self.m.add_const(Const::Int(len as i64), loc))
            }
            // Integer and boolean arithmetic on constants.
            _ => {
                let consts: Option<Vec<&Const>> =
                    args.iter().map(|a| self.m.as_const(*a)).collect();
                let c = super::unroll::fold_scalar(p, &consts?)?;
                let loc = self.m.node(n).loc;
                Some(self.m.add_const(c, loc))
            }
        }
    }

    /// `gadd(a, b)` as one builder when `a` and `b` build the cotangents
    /// of one field (element) of one record (tuple):
    /// `record_grad(r, k, gadd(da, db))`.
    fn merge_builders(
        &mut self,
        g: GraphId,
        a: NodeId,
        b: NodeId,
        loc: crate::ir::Loc,
    ) -> Option<NodeId> {
        let p = self.m.applied_prim(a);
        if p != self.m.applied_prim(b) || !matches!(p, Some(Prim::RecordGrad | Prim::TupleGrad)) {
            return None;
        }
        let (x, y) = (self.m.inputs(a), self.m.inputs(b));
        if x.len() != 4 || y.len() != 4 || self.resolve(x[1]) != self.resolve(y[1]) {
            return None;
        }
        let (kx, ky) = (self.resolve(x[2]), self.resolve(y[2]));
        if self.m.as_const(kx).is_none() || self.m.as_const(kx) != self.m.as_const(ky) {
            return None;
        }
        let (r, k, da, db) = (x[1], x[2], x[3], y[3]);
        let sum = self.m.add_prim(g, Prim::GAdd, &[da, db], loc);
        Some(self.m.add_prim(g, p?, &[r, k, sum], loc))
    }

    /// `x` for `ad_hide(x)` (the identity, which only hides `x`'s type
    /// from inference), else `t`.
    fn see_through_hide(&self, t: NodeId) -> NodeId {
        if self.m.applied_prim(t) == Some(Prim::AdHide) {
            self.resolve(self.m.inputs(t)[1])
        } else {
            t
        }
    }

    /// `tuple_get` / `record_get` (`p`) of `args[0]` at key `args[1]`.
    fn get_of(&mut self, g: GraphId, n: NodeId, p: Prim, args: &[NodeId]) -> Option<NodeId> {
        let (t, k) = (args[0], args[1]);
        let loc = self.m.node(n).loc;
        let same_key = |m: &crate::ir::Module, a: NodeId| -> Option<bool> {
            match (m.as_const(a)?, m.as_const(k)?) {
                (Const::Int(x), Const::Int(y)) => Some(x == y),
                (Const::Str(x), Const::Str(y)) => Some(x == y),
                _ => None,
            }
        };
        let t = if p == Prim::TupleGet {
            self.see_through_hide(t)
        } else {
            t
        };
        let ins = self.m.inputs(t).to_vec();
        match self.m.applied_prim(t)? {
            Prim::Zero => Some(t),
            Prim::MakeTuple if p == Prim::TupleGet => {
                let Some(Const::Int(i)) = self.m.as_const(k) else {
                    return None;
                };
                usize::try_from(*i)
                    .ok()
                    .and_then(|i| ins[1..].get(i))
                    .copied()
            }
            Prim::MakeRecord if p == Prim::RecordGet => {
                let mut found = None;
                for kv in ins[1..].chunks(2) {
                    if same_key(self.m, kv[0]) == Some(true) {
                        found = Some(kv[1]);
                    }
                }
                found
            }
            // tuple_grad(t, j, d) has d at j and zeros elsewhere.
            Prim::TupleGrad if p == Prim::TupleGet => match same_key(self.m, ins[2])? {
                true => Some(ins[3]),
                false => Some(self.m.add_prim(g, Prim::Zero, &[], loc)),
            },
            Prim::RecordGrad if p == Prim::RecordGet => match same_key(self.m, ins[2])? {
                true => Some(ins[3]),
                false => Some(self.m.add_prim(g, Prim::Zero, &[], loc)),
            },
            // get(gadd(x, y), k) → gadd(get(x, k), get(y, k)) when that
            // reaches a cotangent builder.
            Prim::GAdd if ins[1..].iter().any(|x| self.builds_cotangent(*x)) => {
                let a = self.m.add_prim(g, p, &[ins[1], k], loc);
                let b = self.m.add_prim(g, p, &[ins[2], k], loc);
                Some(self.m.add_prim(g, Prim::GAdd, &[a, b], loc))
            }
            // get(grad_finalize(d, x), k) → grad_finalize(get(d, k), get(x, k)).
            Prim::GradFinalize => {
                let a = self.m.add_prim(g, p, &[ins[1], k], loc);
                let b = self.m.add_prim(g, p, &[ins[2], k], loc);
                Some(self.m.add_prim(g, Prim::GradFinalize, &[a, b], loc))
            }
            _ => None,
        }
    }

    /// Whether `n` builds a structured cotangent whose parts the rules
    /// above can take apart.
    pub(super) fn builds_cotangent(&self, n: NodeId) -> bool {
        matches!(
            self.m.applied_prim(n),
            Some(
                Prim::Zero
                    | Prim::GAdd
                    | Prim::TupleGrad
                    | Prim::RecordGrad
                    | Prim::MakeTuple
                    | Prim::MakeRecord
            )
        )
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
                | Prim::TreeMap
                | Prim::TreeGAdd
                | Prim::AdLift
                | Prim::AdDyn
                | Prim::AdHide
                | Prim::AdKey => return false,
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
                Category::Map | Category::Reduce => true,
                Category::Contract => !matches!(p, Prim::Slogdet | Prim::Eigh | Prim::Qr),
                Category::Reindex => !matches!(p, Prim::SplitLike | Prim::Unstack),
                _ => false,
            },
            None => false,
        }
    }
}
