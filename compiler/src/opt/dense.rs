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

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::Rewriter;
use crate::infer::{AbsVal, Types};
use crate::ir::{Const, GraphId, GraphRole, NodeId};
use crate::prim::Prim;

impl Rewriter<'_> {
    /// Applies the rewrite to the loops among `graphs`; gives how many
    /// cotangents it made dense.
    pub(super) fn densify_backpropagators(&mut self, graphs: &[GraphId], types: &Types) -> usize {
        // A `B` built at one site only, so that the arguments it now
        // captures are in its scope.
        let uses = self.graph_uses(graphs);
        let mut made = 0;
        for &j in graphs {
            if !types.holds_for_every_call(j) {
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

    /// How often each graph constant is used in the bodies of `graphs`.
    fn graph_uses(&self, graphs: &[GraphId]) -> HashMap<GraphId, usize> {
        let mut uses: HashMap<GraphId, usize> = HashMap::default();
        for g in graphs {
            for &n in &self.bodies[g] {
                for &i in self.m.inputs(n) {
                    if let Some(h) = self.m.as_graph(i) {
                        *uses.entry(h).or_default() += 1;
                    }
                }
            }
        }
        uses
    }

    /// `@B` and `stack` for `hide = ad_hide(make_tuple(@B, stack))`: a
    /// record pushed on a reversed loop's stack.
    fn hidden_push(&self, hide: NodeId) -> Option<(GraphId, NodeId)> {
        if self.m.applied_prim(hide) != Some(Prim::AdHide) || self.fwd.contains_key(&hide) {
            return None;
        }
        let pair = self.resolve(*self.m.inputs(hide).get(1)?);
        let items = self.m.inputs(pair);
        if self.m.applied_prim(pair) != Some(Prim::MakeTuple) || items.len() != 3 {
            return None;
        }
        let b = self.m.as_graph(items[1])?;
        // (A graph made in this pass is one of ours, done already.)
        if b.index() >= self.graphs_at_start || self.m.graph(b).role != GraphRole::Backprop {
            return None;
        }
        Some((b, self.resolve(items[2])))
    }

    /// The call of a graph in `j` that is the only use of `n` (no graph
    /// nested in `j` reads it either).
    fn sole_call(&self, j: GraphId, n: NodeId) -> Option<NodeId> {
        let (users, nested) = self.uses_in(n, &[j]);
        let [call] = users[..] else { return None };
        (!nested && self.m.applied_prim(call).is_none()).then_some(call)
    }

    /// For a record `hide` pushed in `j` (see [`Self::hidden_push`]) whose
    /// only use is as the last argument of a call in `j`: `B` and the call.
    fn pushed_backpropagator(
        &self,
        j: GraphId,
        hide: NodeId,
        uses: &HashMap<GraphId, usize>,
    ) -> Option<(GraphId, NodeId)> {
        let (b, _) = self.hidden_push(hide)?;
        if self.m.graph(b).params.len() != 1 || uses.get(&b) != Some(&1) {
            return None;
        }
        let call = self.sole_call(j, hide)?;
        let ins = self.m.inputs(call);
        if ins.len() < 2 || self.resolve(ins[ins.len() - 1]) != hide {
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
        let Some(slot_args) = self.slot_arguments(&ins) else {
            return 0;
        };
        let body = &self.bodies[&b];
        let tested: HashSet<NodeId> = body
            .iter()
            .filter(|&&u| self.m.applied_prim(u) == Some(Prim::IsZero))
            .filter_map(|&u| self.m.inputs(u).get(1).map(|i| self.resolve(*i)))
            .collect();
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
            let Some(&Some(arg)) = slot_args.get(k) else {
                continue;
            };
            if k + 1 >= slot_args.len() || !tested.contains(&n) {
                continue;
            }
            let ty = types.value_of(arg);
            match ty.as_ref().and_then(floats) {
                Some(true) => {
                    todo.push((n, k, Some(self.same_type_operand(arg, &ty, types))));
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
    /// For each slot of the cotangent of the call `ins` (`ins[0]` the
    /// callee), the argument it is the cotangent of. The slots follow the
    /// parameters of the graph as differentiated, while a callee the
    /// optimiser specialised to a constant argument takes fewer
    /// ([`crate::ir::Module::original_params`]): the slot of a dropped
    /// parameter has no argument. `None` when the callee is a choice of
    /// graphs that dropped different parameters.
    fn slot_arguments(&self, ins: &[NodeId]) -> Option<Vec<Option<NodeId>>> {
        let callees = match self.m.as_graph(ins[0]) {
            Some(g) => vec![g],
            None => match self.m.graph_switch(ins[0]) {
                Some((_, a, b)) => vec![a, b],
                None => return None,
            },
        };
        let mut layouts = callees.iter().map(|&g| self.m.original_params(g));
        let (orig, count) = layouts.next()?;
        if layouts.any(|l| l != (orig.clone(), count)) || orig.len() + 1 != ins.len() {
            return None;
        }
        // The cotangent `B` starts from is what the callee's first
        // backpropagator gives: the record it pushes right on its stack
        // parameter. Once a record of the caller's was merged into the
        // callee's ([`Self::merge_record`]), that result is the cotangent
        // of another call than this one, with other slots.
        for &g in &callees {
            if self.pushed_result_len(g) != Some(count) {
                return None;
            }
        }
        let mut slots = vec![None; count + 1];
        slots[0] = Some(ins[0]);
        for (p, &o) in orig.iter().enumerate() {
            slots[o + 1] = Some(ins[p + 1]);
        }
        Some(slots)
    }

    /// The number of values the backpropagator that `g` pushes right on
    /// its stack parameter returns (`None` when `g` pushes none, or more
    /// than one there, or it returns something else than a tuple made
    /// where it is).
    fn pushed_result_len(&self, g: GraphId) -> Option<usize> {
        let stack = *self.m.graph(g).params.last()?;
        let (uses, _) = self.uses_in(stack, &[g]);
        let [make] = uses[..] else { return None };
        let parts = self.m.inputs(make);
        if self.m.applied_prim(make) != Some(Prim::MakeTuple) || parts.len() != 3 {
            return None;
        }
        let bx = self.m.as_graph(self.resolve(parts[1]))?;
        let out = self.resolve(self.m.graph(bx).output?);
        (self.m.applied_prim(out) == Some(Prim::MakeTuple)).then(|| self.m.inputs(out).len() - 1)
    }

    /// `grad_finalize` reads only its operand's type: rather than a cheap
    /// element-wise result (which the backpropagator would compute again,
    /// or keep), an operand of it with the same type.
    pub(super) fn same_type_operand(
        &self,
        x: NodeId,
        ty: &Option<AbsVal>,
        types: &Types,
    ) -> NodeId {
        // Types compared exactly, per specialisation: a joined type hides
        // a loop variable that starts as a weak int (`let mut s = 0;`) and
        // holds a float after (found by an outside probe: the first
        // iteration's gradient was lost).
        if ty.is_none() || types.exact_value_of(x) != *ty {
            return x;
        }
        let mut x = x;
        for _ in 0..16 {
            if !cheap(self.m.applied_prim(x)) {
                break;
            }
            let same = self.m.inputs(x)[1..]
                .iter()
                .map(|w| self.resolve(*w))
                .find(|w| self.m.as_const(*w).is_none() && types.exact_value_of(*w) == *ty);
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
        let mut nested: HashSet<NodeId> = HashSet::default();
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
        let mut again: HashSet<NodeId> = HashSet::default();
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
                if nested.contains(&v) || !cheap(self.m.applied_prim(v)) {
                    continue;
                }
                // Operands available, or cheap and computable from
                // available ones (one level).
                let mut extra = Vec::new();
                let ok = self.m.inputs(v)[1..].iter().all(|&w| {
                    let w = self.resolve(w);
                    if available(w, &kept, &again) {
                        return true;
                    }
                    let sub = cheap(self.m.applied_prim(w))
                        && self.m.inputs(w)[1..]
                            .iter()
                            .all(|&x| available(x, &kept, &again));
                    if sub {
                        extra.push(w);
                    }
                    sub
                });
                if !ok {
                    continue;
                }
                again.extend(extra);
                kept.remove(&v);
                again.insert(v);
                changed = true;
            }
        }
        let captured: HashSet<NodeId> = self.fv.get(b).iter().copied().collect();
        let dropped = again.iter().filter(|v| captured.contains(v)).count();
        if dropped == 0 {
            return 0;
        }
        // Copies in `b`, operands first.
        let mut roots: Vec<NodeId> = again.iter().copied().collect();
        roots.sort();
        let mut copy: HashMap<NodeId, NodeId> = HashMap::default();
        let mut order: Vec<NodeId> = Vec::new();
        let mut seen: HashSet<NodeId> = HashSet::default();
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
        for v in roots {
            visit(self, v, &again, &mut seen, &mut order);
        }
        // Inputs of `n` with the copies in place of what they copy.
        let remap = |rw: &Self, n: NodeId, copy: &HashMap<NodeId, NodeId>| -> Vec<NodeId> {
            rw.m.inputs(n)
                .iter()
                .map(|&w| {
                    let w = rw.resolve(w);
                    copy.get(&w).copied().unwrap_or(w)
                })
                .collect()
        };
        for v in order {
            let ins = remap(self, v, &copy);
            let loc = self.m.node(v).loc;
            let c = self.m.add_apply(b, ins, loc);
            copy.insert(v, c);
        }
        for &n in &self.bodies[&b] {
            let ins = self.m.inputs(n);
            if ins.iter().any(|w| copy.contains_key(&self.resolve(*w))) {
                let new = remap(self, n, &copy);
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

    /// Merges a loop's constant records into the ones pushed on top of
    /// them: `h = ad_hide(make_tuple(@Bf, s))` in `j`, with `Bf`
    /// capturing nothing, passed (only) to a call of a graph or an `if`
    /// between graphs each of which pushes its own record `@Bx` on that
    /// stack parameter and does nothing else with it. `unwind` pops `Bx`,
    /// then `Bf` on its result; the call now gets `s` itself, and each
    /// callee pushes `Bx.then(d) = Bf(Bx(d))`, which the rounds inline. A
    /// loop's header (`Bf` only routes cotangents from the body's call to
    /// its own) then costs no record per iteration. Loops over scalars and
    /// small tensors are left to `fuse::reverse`, which reads their
    /// records as they are.
    pub(super) fn merge_constant_records(&mut self, graphs: &[GraphId], types: &Types) -> usize {
        let uses = self.graph_uses(graphs);
        let mut merged = 0;
        for &j in graphs {
            if !types.holds_for_every_call(j) {
                continue;
            }
            let body = self.bodies[&j].clone();
            for h in body {
                if self.merge_record(j, h, types, &uses) {
                    merged += 1;
                }
            }
        }
        merged
    }

    /// Uses of `n` in the bodies of `graphs` (as an input), and whether a
    /// graph nested in them reads it as a free variable.
    fn uses_in(&self, n: NodeId, graphs: &[GraphId]) -> (Vec<NodeId>, bool) {
        let mut uses = Vec::new();
        let mut nested = false;
        for g in graphs {
            for &u in &self.bodies[g] {
                if self.fwd.contains_key(&u) {
                    continue;
                }
                let ins = self.m.inputs(u);
                if ins.iter().any(|&i| self.resolve(i) == n) {
                    uses.push(u);
                }
                for &i in ins {
                    if let Some(k) = self.m.as_graph(i) {
                        let known = k.index() < self.graphs_at_start;
                        if !graphs.contains(&k) && (!known || self.fv.get(k).contains(&n)) {
                            nested = true;
                        }
                    }
                }
            }
        }
        (uses, nested)
    }

    fn merge_record(
        &mut self,
        j: GraphId,
        h: NodeId,
        types: &Types,
        graph_uses: &HashMap<GraphId, usize>,
    ) -> bool {
        let Some((bf, s)) = self.hidden_push(h) else {
            return false;
        };
        if self.m.graph(bf).params.len() != 1 || !self.fv.get(bf).is_empty() {
            return false;
        }
        let Some(call) = self.sole_call(j, h) else {
            return false;
        };
        let ins: Vec<NodeId> = self
            .m
            .inputs(call)
            .iter()
            .map(|i| self.resolve(*i))
            .collect();
        let Some(pos) = ins.iter().position(|&i| i == h) else {
            return false;
        };
        if pos == 0 || ins[1..].iter().filter(|&&i| i == h).count() != 1 {
            return false;
        }
        // Loops over scalars and small tensors are fuse::reverse's.
        let over_tensors = ins[1..pos].iter().any(
            |&a| matches!(types.value_of(a), Some(AbsVal::Tensor(t)) if !crate::fuse::regions::runs_lane_by_lane(&t)),
        );
        if !over_tensors {
            return false;
        }
        // The callee is this call's alone.
        let callee = ins[0];
        if self.m.as_const(callee).is_none() {
            let (uses, nested) = self.uses_in(callee, &[j]);
            if nested || uses != [call] {
                return false;
            }
        }
        let targets: Vec<GraphId> = match (self.m.as_graph(callee), self.m.graph_switch(callee)) {
            (Some(g), _) => vec![g],
            (None, Some((_, a, b))) => vec![a, b],
            _ => return false,
        };
        // Each callee pushes its record right on the stack parameter.
        let mut pushes = Vec::new();
        for &g in &targets {
            if !self.bodies.contains_key(&g) {
                return false;
            }
            let Some(&p) = self.m.graph(g).params.get(pos - 1) else {
                return false;
            };
            let (uses, nested) = self.uses_in(p, &[g]);
            let [make] = uses[..] else { return false };
            let parts = self.m.inputs(make);
            if nested
                || self.m.applied_prim(make) != Some(Prim::MakeTuple)
                || parts.len() != 3
                || self.resolve(parts[2]) != p
            {
                return false;
            }
            let Some(bx) = self.m.as_graph(parts[1]) else {
                return false;
            };
            let (made, _) = self.uses_in(make, &[g]);
            let hidden = matches!(made[..], [u] if self.m.applied_prim(u) == Some(Prim::AdHide));
            if !hidden || self.m.graph(bx).params.len() != 1 {
                return false;
            }
            pushes.push((g, make, bx));
        }
        // The callees must be this call's alone (their stack parameter
        // gets `s` now).
        let alone = targets.iter().all(|t| {
            graph_uses.get(t).copied().unwrap_or(0) == targets.iter().filter(|u| *u == t).count()
        });
        if !alone {
            return false;
        }
        for (g, make, bx) in pushes {
            let loc = self.m.node(make).loc;
            let name = format!("{}.then", self.m.graph(bx).name);
            let merged = self
                .m
                .add_graph_as(name, self.m.graph(bx).loc, GraphRole::Backprop);
            let d = self.m.add_param(merged, "dcall", loc);
            let bx_ref = self.m.add_const(Const::Graph(bx), loc);
            let r = self.m.add_apply(merged, vec![bx_ref, d], loc);
            let bf_ref = self.m.add_const(Const::Graph(bf), loc);
            let out = self.m.add_apply(merged, vec![bf_ref, r], loc);
            self.m.set_output(merged, out);
            let merged_ref = self.m.add_const(Const::Graph(merged), loc);
            let p = self.m.inputs(make)[2];
            let by = self.m.add_prim(g, Prim::MakeTuple, &[merged_ref, p], loc);
            self.replace(g, make, by);
        }
        let mut new_ins = self.m.inputs(call).to_vec();
        new_ins[pos] = s;
        let loc = self.m.node(call).loc;
        let by = self.m.add_apply(j, new_ins, loc);
        self.replace(j, call, by);
        true
    }
}
