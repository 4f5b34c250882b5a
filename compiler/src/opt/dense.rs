//! Dense cotangents in a reversed loop's backpropagators.
//!
//! A reversed loop pushes a backpropagator closure per iteration
//! (`ad_hide(make_tuple(@B, stack))`, passed as the last argument of the
//! loop's next call) and `unwind` calls them. Each `B` starts from the
//! cotangent of that call, `dcall = (d callee, d arg1, ..)`, and tests every
//! rule's cotangent with `is_zero`, because a cotangent may be the symbolic
//! zero. Nothing outside `B` is known about `dcall`, so the tests stay
//! dynamic: each rule is a branch of its own, too small to fuse, and the
//! backward step runs primitive by primitive.
//!
//! This pass makes the cotangents of the loop's float arguments (tensors,
//! or tuples and records of them) dense where `B` tests them: `tuple_get(dcall, k)` becomes
//! `grad_finalize(tuple_get(dcall, k), arg_k)` (zeros of `arg_k`'s type
//! when the cotangent is zero, the cotangent itself otherwise, which is
//! what it is in every iteration but a loop whose result nobody reads);
//! the cotangent of an argument with no float in it is `zero()`.
//! Then `is_zero` folds to false, the rules inline into one straight-line
//! graph, and inference (which evaluates hidden closures on arguments of
//! unknown type, [`crate::infer::Types::covers_all_calls`]) types it from
//! `arg_k` and the captured forward values, so the typed rewrites and
//! fusion apply to the backward step as to the forward one.

use std::collections::{HashMap, HashSet};

use super::Rewriter;
use crate::infer::{AbsVal, Types};
use crate::ir::{Const, GraphId, NodeId};
use crate::prim::Prim;

impl Rewriter<'_> {
    /// Applies the rewrite to the loops among `graphs`; gives how many
    /// cotangents it made dense.
    pub(super) fn densify_backpropagators(&mut self, graphs: &[GraphId], types: &Types) -> usize {
        // How often each graph constant is used: a `B` built at one site
        // only, so that the arguments it now captures are in its scope.
        let mut uses: HashMap<GraphId, usize> = HashMap::new();
        for g in graphs {
            for &n in &self.bodies[g] {
                for &i in self.m.inputs(n) {
                    if let Some(h) = self.m.as_graph(i) {
                        *uses.entry(h).or_default() += 1;
                    }
                }
            }
        }
        let mut made = 0;
        for &j in graphs {
            if types.is_escaped(j) && !types.covers_all_calls(j) {
                continue;
            }
            for &hide in &self.bodies[&j] {
                if let Some((b, call)) = self.pushed_backpropagator(j, hide, &uses) {
                    made += self.densify(b, call, types);
                    made += self.rematerialize(b, j);
                }
            }
        }
        made
    }

    /// For `hide = ad_hide(make_tuple(@B, stack))` in `j` whose only use
    /// is as the last argument of a call in `j`: `B` and the call.
    fn pushed_backpropagator(
        &self,
        j: GraphId,
        hide: NodeId,
        uses: &HashMap<GraphId, usize>,
    ) -> Option<(GraphId, NodeId)> {
        if self.m.applied_prim(hide) != Some(Prim::AdHide) || self.fwd.contains_key(&hide) {
            return None;
        }
        let pair = self.resolve(*self.m.inputs(hide).get(1)?);
        let items = self.m.inputs(pair);
        if self.m.applied_prim(pair) != Some(Prim::MakeTuple) || items.len() != 3 {
            return None;
        }
        let b = self.m.as_graph(items[1])?;
        let graph = self.m.graph(b);
        if !graph.name.starts_with("B.") || graph.params.len() != 1 || uses.get(&b) != Some(&1) {
            return None;
        }
        let mut calls = self.bodies[&j].iter().copied().filter(|&n| {
            let ins = self.m.inputs(n);
            ins.iter().any(|&i| self.resolve(i) == hide)
        });
        let call = calls.next()?;
        let ins = self.m.inputs(call);
        if calls.next().is_some()
            || self.m.applied_prim(call).is_some()
            || ins.len() < 2
            || self.resolve(ins[ins.len() - 1]) != hide
        {
            return None;
        }
        Some((b, call))
    }

    /// Makes dense the cotangents in `B` of `call`'s float tensor
    /// arguments that `B` tests for zero.
    fn densify(&mut self, b: GraphId, call: NodeId, types: &Types) -> usize {
        let dcall = self.m.graph(b).params[0];
        let ins: Vec<NodeId> = self
            .m
            .inputs(call)
            .iter()
            .map(|i| self.resolve(*i))
            .collect();
        let body = &self.bodies[&b];
        let tested = |n: NodeId| {
            body.iter().any(|&u| {
                self.m.applied_prim(u) == Some(Prim::IsZero)
                    && self.m.inputs(u).get(1).map(|i| self.resolve(*i)) == Some(n)
            })
        };
        let mut todo = Vec::new();
        for &n in body {
            if self.fwd.contains_key(&n) || self.m.applied_prim(n) != Some(Prim::TupleGet) {
                continue;
            }
            let args = self.m.inputs(n);
            if args.len() != 3 || self.resolve(args[1]) != dcall {
                continue;
            }
            let Some(Const::Int(k)) = self.m.as_const(self.resolve(args[2])) else {
                continue;
            };
            // Slot 0 is the callee's; the last, the stack's.
            let k = *k as usize;
            if k == 0 || k + 1 >= ins.len() {
                continue;
            }
            if !tested(n) {
                continue;
            }
            let ty = types.value_of(ins[k]);
            match ty.as_ref().and_then(floats) {
                Some(true) => {
                    todo.push((n, k, Some(self.same_type_operand(ins[k], &ty, types))));
                }
                // Ints and bools are not differentiable: their cotangent
                // is the symbolic zero.
                Some(false) => todo.push((n, k, None)),
                None => {}
            }
        }
        for &(n, k, x) in &todo {
            let loc = self.m.node(n).loc;
            let by = match x {
                Some(x) => {
                    let key = self.m.add_const(Const::Int(k as i64), loc);
                    let get = self.m.add_prim(b, Prim::TupleGet, &[dcall, key], loc);
                    self.m.add_prim(b, Prim::GradFinalize, &[get, x], loc)
                }
                None => self.m.add_prim(b, Prim::Zero, &[], loc),
            };
            self.replace(b, n, by);
        }
        todo.len()
    }
}

impl Rewriter<'_> {
    /// `grad_finalize` reads only its operand's type: rather than a cheap
    /// element-wise result (which the backpropagator would compute again,
    /// or keep), an operand of it with the same type.
    pub(super) fn same_type_operand(
        &self,
        x: NodeId,
        ty: &Option<AbsVal>,
        types: &Types,
    ) -> NodeId {
        let mut x = x;
        for _ in 0..16 {
            if !cheap(self.m.applied_prim(x)) {
                break;
            }
            let same = self.m.inputs(x)[1..]
                .iter()
                .map(|w| self.resolve(*w))
                .find(|w| self.m.as_const(*w).is_none() && types.value_of(*w) == *ty);
            match same {
                Some(w) => x = w,
                None => break,
            }
        }
        x
    }
}

/// For a value made of tensors only (in tuples and records): whether
/// any of them is a float (has a cotangent). `None` for anything else.
fn floats(v: &AbsVal) -> Option<bool> {
    match v {
        AbsVal::Tensor(t) => Some(t.dtype.is_float()),
        AbsVal::Tuple(items) => items.iter().try_fold(false, |a, v| Some(a | floats(v)?)),
        AbsVal::Record(fields) => fields
            .iter()
            .try_fold(false, |a, (_, v)| Some(a | floats(v)?)),
        _ => None,
    }
}

/// Element-wise primitives cheap enough to compute again in a
/// backpropagator rather than keep their result for every iteration.
fn cheap(p: Option<Prim>) -> bool {
    matches!(
        p,
        Some(
            Prim::Add
                | Prim::Sub
                | Prim::Mul
                | Prim::Div
                | Prim::Neg
                | Prim::Abs
                | Prim::Maximum
                | Prim::Minimum
        )
    )
}

impl Rewriter<'_> {
    /// Computes again in `b` the cheap element-wise values of `j` that it
    /// captures, when their operands are captured anyway (or computed
    /// again in turn): a reversed loop then keeps fewer tensors per
    /// iteration, and its forward step writes fewer. Values that took a
    /// transcendental function or a reduction are kept. Gives how many
    /// values `b` no longer captures.
    fn rematerialize(&mut self, b: GraphId, j: GraphId) -> usize {
        let body = &self.bodies[&b];
        // Values of `j` that closures nested in `b` use stay captured.
        let mut nested: HashSet<NodeId> = HashSet::new();
        for &n in body {
            for &i in self.m.inputs(n) {
                if let Some(h) = self.m.as_graph(i) {
                    nested.extend(self.fv.get(h).iter().copied());
                }
            }
        }
        let owned = |m: &crate::ir::Module, n: NodeId| m.node(n).graph == Some(j);
        let mut kept: HashSet<NodeId> = self
            .fv
            .get(b)
            .iter()
            .copied()
            .filter(|v| owned(self.m, *v) && !self.fwd.contains_key(v))
            .collect();
        let mut again: Vec<NodeId> = Vec::new();
        let mut again_set: HashSet<NodeId> = HashSet::new();
        let available = |n: NodeId, kept: &HashSet<NodeId>, again: &HashSet<NodeId>| {
            let n = self.resolve(n);
            self.m.as_const(n).is_some()
                || !owned(self.m, n)
                || kept.contains(&n)
                || again.contains(&n)
        };
        let mut changed = true;
        while changed {
            changed = false;
            let mut cands: Vec<NodeId> = kept.iter().copied().collect();
            cands.sort();
            for v in cands {
                if nested.contains(&v)
                    || !cheap(self.m.applied_prim(v))
                    || self.m.node(v).graph != Some(j)
                {
                    continue;
                }
                // Operands available, or cheap and computable from
                // available ones (one level).
                let mut extra = Vec::new();
                let ok = self.m.inputs(v)[1..].iter().all(|&w| {
                    let w = self.resolve(w);
                    if available(w, &kept, &again_set) {
                        return true;
                    }
                    let sub = cheap(self.m.applied_prim(w))
                        && self.m.inputs(w)[1..]
                            .iter()
                            .all(|&x| available(x, &kept, &again_set));
                    if sub {
                        extra.push(w);
                    }
                    sub
                });
                if !ok {
                    continue;
                }
                for w in extra {
                    if again_set.insert(w) {
                        again.push(w);
                    }
                }
                kept.remove(&v);
                again_set.insert(v);
                again.push(v);
                changed = true;
            }
        }
        let captured: HashSet<NodeId> = self.fv.get(b).iter().copied().collect();
        let dropped = again.iter().filter(|v| captured.contains(v)).count();
        if dropped == 0 {
            return 0;
        }
        // Copies in `b`, operands first.
        let mut copy: HashMap<NodeId, NodeId> = HashMap::new();
        let mut order: Vec<NodeId> = Vec::new();
        let mut seen: HashSet<NodeId> = HashSet::new();
        fn visit(
            rw: &Rewriter<'_>,
            n: NodeId,
            set: &HashSet<NodeId>,
            seen: &mut HashSet<NodeId>,
            order: &mut Vec<NodeId>,
        ) {
            if !set.contains(&n) || !seen.insert(n) {
                return;
            }
            for &w in &rw.m.inputs(n)[1..] {
                visit(rw, rw.resolve(w), set, seen, order);
            }
            order.push(n);
        }
        for &v in &again {
            visit(self, v, &again_set, &mut seen, &mut order);
        }
        for v in order {
            let ins: Vec<NodeId> = self
                .m
                .inputs(v)
                .iter()
                .map(|&w| {
                    let w = self.resolve(w);
                    copy.get(&w).copied().unwrap_or(w)
                })
                .collect();
            let loc = self.m.node(v).loc;
            let c = self.m.add_apply(b, ins, loc);
            copy.insert(v, c);
        }
        for &n in &self.bodies[&b] {
            let ins = self.m.inputs(n);
            if ins.iter().any(|w| copy.contains_key(&self.resolve(*w))) {
                let new: Vec<NodeId> = ins
                    .iter()
                    .map(|&w| {
                        let w = self.resolve(w);
                        copy.get(&w).copied().unwrap_or(w)
                    })
                    .collect();
                self.m.node_mut(n).kind = crate::ir::NodeKind::Apply(new);
            }
        }
        if let Some(o) = self.m.graph(b).output {
            if let Some(&c) = copy.get(&self.resolve(o)) {
                self.m.graphs[b.index()].output = Some(c);
            }
        }
        self.dirty.insert(b);
        self.changed += dropped;
        dropped
    }
}
