//! Rewrites that need types: with every shape static after inference,
//! queries of shapes fold to constants (so the rank tests in derivative
//! rules fold, and the `switch`es on them), and reshapes, broadcasts and
//! `sum_to`s that do not change a shape disappear. A `tree_map` over trees
//! of known structure becomes the calls on its leaves.

use super::Rewriter;
use crate::infer::{AbsVal, Types};
use crate::ir::{Const, GraphId, NodeId, NodeKind};
use crate::prim::{Category, Prim};

impl Rewriter<'_> {
    /// One typed rewrite of node `n` of graph `g`, given the types of the
    /// module as it was when inference ran.
    pub(super) fn visit_typed(&mut self, g: GraphId, n: NodeId, types: &Types) {
        let NodeKind::Apply(inputs) = &self.m.node(n).kind else {
            return;
        };
        if self.fwd.contains_key(&n) {
            return;
        }
        let inputs = inputs.clone();
        let Some(p) = self.m.applied_prim(n) else {
            return;
        };
        if p.category() == Category::Io || p == Prim::MakeTuple {
            return;
        }
        let Some(v) = types.value_of(n) else {
            return;
        };
        // A value known in full: a weak int, a bool, or a tuple of those.
        if self.m.as_const(n).is_none() {
            if let Some(c) = self.constant(g, n, &v) {
                self.stats.simplified += 1;
                self.replace(g, n, c);
                return;
            }
        }
        let same_shape = |x: NodeId| -> bool {
            match (types.value_of(x), v.as_tensor()) {
                (Some(AbsVal::Tensor(a)), Some(b)) => a.shape == b.shape && a.dtype == b.dtype,
                _ => false,
            }
        };
        let loc = self.m.node(n).loc;
        let by = match p {
            Prim::SumTo | Prim::Reshape | Prim::BroadcastTo if inputs.len() == 3 => {
                let x = self.resolve(inputs[1]);
                same_shape(x).then_some(x)
            }
            // The cotangent of a record or tuple, field by field, so that
            // the rules on gets take the builders apart.
            Prim::GradFinalize if inputs.len() == 3 => {
                let (d, x) = (self.resolve(inputs[1]), self.resolve(inputs[2]));
                match (types.value_of(x), self.builds_cotangent(d)) {
                    (Some(AbsVal::Record(fields)), true) => {
                        let mut parts = Vec::new();
                        for (name, _) in &fields {
                            let key = self.m.add_const(Const::Str(name.clone()), loc);
                            let dk = self.m.add_prim(g, Prim::RecordGet, &[d, key], loc);
                            let xk = self.m.add_prim(g, Prim::RecordGet, &[x, key], loc);
                            parts.push(key);
                            parts.push(self.m.add_prim(g, Prim::GradFinalize, &[dk, xk], loc));
                        }
                        Some(self.m.add_prim(g, Prim::MakeRecord, &parts, loc))
                    }
                    (Some(AbsVal::Tuple(items)), true) => {
                        let mut parts = Vec::new();
                        for i in 0..items.len() {
                            let key = self.m.add_const(Const::Int(i as i64), loc);
                            let dk = self.m.add_prim(g, Prim::TupleGet, &[d, key], loc);
                            let xk = self.m.add_prim(g, Prim::TupleGet, &[x, key], loc);
                            parts.push(self.m.add_prim(g, Prim::GradFinalize, &[dk, xk], loc));
                        }
                        Some(self.m.add_prim(g, Prim::MakeTuple, &parts, loc))
                    }
                    // A zero cotangent of a tensor, or any cotangent of an
                    // int or bool (they have no derivative): zeros of its type.
                    (Some(AbsVal::Tensor(t)), _)
                        if !t.weak
                            && (self.m.applied_prim(d) == Some(Prim::Zero)
                                || !t.dtype.is_float()) =>
                    {
                        Some(self.m.add_prim(g, Prim::ZerosLike, &[x], loc))
                    }
                    // The zero cotangent of a weak float scalar: the
                    // literal `0.0`.
                    (Some(AbsVal::Tensor(t)), _)
                        if t.shape.is_empty()
                            && t.dtype == adjoint_runtime::tensor::DType::F64
                            && self.m.applied_prim(d) == Some(Prim::Zero) =>
                    {
                        Some(self.m.add_const(Const::Float(0.0), loc))
                    }
                    // (A weak one: `grad_finalize` makes the zeros.)
                    (Some(AbsVal::Tensor(t)), _) if !t.dtype.is_float() => None,
                    // A tensor cotangent of the value's exact type needs
                    // nothing filled in or cast.
                    (Some(AbsVal::Tensor(t)), _) => match types.value_of(d) {
                        Some(AbsVal::Tensor(u))
                            if u.dtype == t.dtype && u.shape == t.shape && u.weak == t.weak =>
                        {
                            Some(d)
                        }
                        // Only `x`'s type is read: an operand of it with
                        // that type will do, and `x` need not be kept or
                        // computed again for it.
                        _ => {
                            let ty = Some(AbsVal::Tensor(t));
                            let w = self.same_type_operand(x, &ty, types);
                            (w != x).then(|| self.m.add_prim(g, Prim::GradFinalize, &[d, w], loc))
                        }
                    },
                    _ => None,
                }
            }
            // tree_map over trees of statically known, equal structure:
            // the leafwise calls, which inlining then turns into code
            // (and fusion into kernels).
            Prim::TreeMap if inputs.len() >= 3 => self.unroll_tree_map(g, n, &inputs[1..], types),
            // Lifting a value with no function in it changes nothing.
            Prim::AdLift if inputs.len() == 4 => {
                let x = self.resolve(inputs[1]);
                match types.value_of(x) {
                    Some(t) if !t.has_function_or_unknown() => Some(x),
                    _ => None,
                }
            }
            // Only floats have cotangents: a key on anything else marks
            // nothing (and would hide a constant from folding).
            Prim::AdKey if inputs.len() == 3 => {
                let x = self.resolve(inputs[1]);
                match (self.m.as_const(x), types.value_of(x)) {
                    (Some(Const::Int(_) | Const::Bool(_)), _) => Some(x),
                    (_, Some(AbsVal::Tensor(t))) if !t.dtype.is_float() => Some(x),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(by) = by {
            self.stats.simplified += 1;
            self.replace(g, n, by);
        }
    }

    /// The typed rewrite allowed in a graph inference marks escaped: its
    /// own values may hold only for the calls inference saw, but a value
    /// it uses from a graph that is not escaped has its inferred type on
    /// every run. `sum_to(d, like)`, `grad_finalize(d, x)`, `zeros_like(x)`
    /// and `ones_like(x)` read only the type of `like`/`x`; when that is a
    /// scalar of a graph that is not escaped, a constant of the same type
    /// stands in for it. A backpropagator then no longer captures forward
    /// values it only needed for their shape (a reversed loop keeps fewer
    /// values per iteration).
    pub(super) fn visit_escaped(&mut self, g: GraphId, n: NodeId, types: &Types) {
        let NodeKind::Apply(inputs) = &self.m.node(n).kind else {
            return;
        };
        if self.fwd.contains_key(&n) {
            return;
        }
        let inputs = inputs.clone();
        let slot = match self.m.applied_prim(n) {
            Some(Prim::SumTo | Prim::GradFinalize) if inputs.len() == 3 => 2,
            Some(Prim::ZerosLike | Prim::OnesLike | Prim::GradSeed) if inputs.len() == 2 => 1,
            _ => return,
        };
        let x = self.resolve(inputs[slot]);
        let Some(owner) = self.m.node(x).graph else {
            return;
        };
        if types.is_escaped(owner) {
            return;
        }
        let Some(AbsVal::Tensor(t)) = types.value_of(x) else {
            return;
        };
        if !t.shape.is_empty() {
            return;
        }
        use adjoint_runtime::tensor::{DType, Tensor};
        let c = match (t.dtype, t.weak) {
            (DType::F64, true) => Const::Float(0.0),
            (DType::I64, true) => Const::Int(0),
            (DType::F64, false) => Const::Tensor(Tensor::scalar_f64(0.0)),
            (DType::F32, false) => Const::Tensor(Tensor::scalar_f32(0.0)),
            (DType::I64, false) => Const::Tensor(Tensor::scalar_i64(0)),
            (DType::Bool, _) => Const::Bool(false),
            _ => return,
        };
        let loc = self.m.node(n).loc;
        let k = self.m.add_const(c, loc);
        let mut new_inputs = inputs;
        new_inputs[slot] = k;
        let by = self.m.add_apply(g, new_inputs, loc);
        self.stats.simplified += 1;
        self.replace(g, n, by);
    }

    /// `tree_map(f, t, t2, ..)` (`args`) as records and tuples of calls
    /// of `f` on the leaves, when every tree's type is known and they
    /// have the first tree's structure down to its leaves, which are
    /// tensors (so the run-time rules for symbolic zeros and prefix trees
    /// do not come into play).
    fn unroll_tree_map(
        &mut self,
        g: GraphId,
        n: NodeId,
        args: &[NodeId],
        types: &Types,
    ) -> Option<NodeId> {
        /// At most this many leaves: each becomes a call to inline.
        const MAX_LEAVES: usize = 256;
        let f = self.resolve(args[0]);
        let trees: Vec<NodeId> = args[1..].iter().map(|t| self.resolve(*t)).collect();
        let tys: Vec<AbsVal> = trees
            .iter()
            .map(|t| types.value_of(*t))
            .collect::<Option<_>>()?;
        let mut leaves = 0;
        if !same_structure(&tys, &mut leaves, MAX_LEAVES) {
            return None;
        }
        let loc = self.m.node(n).loc;
        Some(self.tree_map_calls(g, loc, f, &trees, &tys))
    }

    fn tree_map_calls(
        &mut self,
        g: GraphId,
        loc: crate::ir::Loc,
        f: NodeId,
        trees: &[NodeId],
        tys: &[AbsVal],
    ) -> NodeId {
        match &tys[0] {
            AbsVal::Record(fields) => {
                let mut parts = Vec::with_capacity(2 * fields.len());
                for (i, (name, _)) in fields.iter().enumerate() {
                    let key = self.m.add_const(Const::Str(name.clone()), loc);
                    let subs: Vec<NodeId> = trees
                        .iter()
                        .map(|t| self.m.add_prim(g, Prim::RecordGet, &[*t, key], loc))
                        .collect();
                    let sub_tys: Vec<AbsVal> = tys
                        .iter()
                        .map(|t| match t {
                            AbsVal::Record(fs) => fs[i].1.clone(),
                            _ => unreachable!("checked by same_structure"),
                        })
                        .collect();
                    parts.push(key);
                    parts.push(self.tree_map_calls(g, loc, f, &subs, &sub_tys));
                }
                self.m.add_prim(g, Prim::MakeRecord, &parts, loc)
            }
            AbsVal::Tuple(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for i in 0..items.len() {
                    let key = self.m.add_const(Const::Int(i as i64), loc);
                    let subs: Vec<NodeId> = trees
                        .iter()
                        .map(|t| self.m.add_prim(g, Prim::TupleGet, &[*t, key], loc))
                        .collect();
                    let sub_tys: Vec<AbsVal> = tys
                        .iter()
                        .map(|t| match t {
                            AbsVal::Tuple(xs) => xs[i].clone(),
                            _ => unreachable!("checked by same_structure"),
                        })
                        .collect();
                    parts.push(self.tree_map_calls(g, loc, f, &subs, &sub_tys));
                }
                self.m.add_prim(g, Prim::MakeTuple, &parts, loc)
            }
            _ => {
                let mut ins = Vec::with_capacity(trees.len() + 1);
                ins.push(f);
                ins.extend_from_slice(trees);
                self.m.add_apply(g, ins, loc)
            }
        }
    }

    /// Nodes building the constant `v` in graph `g`, when it is known.
    fn constant(&mut self, g: GraphId, n: NodeId, v: &AbsVal) -> Option<NodeId> {
        let loc = self.m.node(n).loc;
        match v {
            AbsVal::Tensor(t) if t.shape.is_empty() => {
                let x = t.scalar_value()?;
                match t.dtype {
                    adjoint_runtime::tensor::DType::Bool => {
                        Some(self.m.add_const(Const::Bool(x != 0), loc))
                    }
                    adjoint_runtime::tensor::DType::I64 if t.weak => {
                        Some(self.m.add_const(Const::Int(x), loc))
                    }
                    _ => None,
                }
            }
            // The symbolic zero (the `is_zero` tests on it then fold).
            AbsVal::Zero if self.m.applied_prim(n) != Some(Prim::Zero) => {
                Some(self.m.add_prim(g, Prim::Zero, &[], loc))
            }
            AbsVal::Tuple(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for it in items {
                    // Only tuples of scalars (shapes): nested tuples of
                    // known values are rare and not worth the nodes.
                    if !matches!(it, AbsVal::Tensor(t) if t.shape.is_empty()) {
                        return None;
                    }
                    parts.push(self.constant(g, n, it)?);
                }
                Some(self.m.add_prim(g, Prim::MakeTuple, &parts, loc))
            }
            _ => None,
        }
    }
}

/// Whether the trees of types `tys` all have the first one's structure of
/// records and tuples, with tensors at its leaves (at most `max` of them,
/// counted in `leaves`).
fn same_structure(tys: &[AbsVal], leaves: &mut usize, max: usize) -> bool {
    match &tys[0] {
        AbsVal::Record(fields) => {
            type Fields = Vec<(std::sync::Arc<str>, AbsVal)>;
            let subs: Option<Vec<&Fields>> = tys
                .iter()
                .map(|t| match t {
                    AbsVal::Record(fs)
                        if fs.len() == fields.len()
                            && fs.iter().zip(fields).all(|(a, b)| a.0 == b.0) =>
                    {
                        Some(fs)
                    }
                    _ => None,
                })
                .collect();
            let Some(subs) = subs else {
                return false;
            };
            (0..fields.len()).all(|i| {
                let sub: Vec<AbsVal> = subs.iter().map(|fs| fs[i].1.clone()).collect();
                same_structure(&sub, leaves, max)
            })
        }
        AbsVal::Tuple(items) => {
            let subs: Option<Vec<&Vec<AbsVal>>> = tys
                .iter()
                .map(|t| match t {
                    AbsVal::Tuple(xs) if xs.len() == items.len() => Some(xs),
                    _ => None,
                })
                .collect();
            let Some(subs) = subs else {
                return false;
            };
            (0..items.len()).all(|i| {
                let sub: Vec<AbsVal> = subs.iter().map(|xs| xs[i].clone()).collect();
                same_structure(&sub, leaves, max)
            })
        }
        AbsVal::Tensor(_) => {
            *leaves += 1;
            *leaves <= max
        }
        _ => false,
    }
}

impl Rewriter<'_> {
    /// Makes the symbolic zero that enters a forward-mode loop as the
    /// tangent of a carry a dense zero of the tangent's type, when the
    /// loop's own trips pass a dense one.
    ///
    /// `F(loop)(a.., da..)` called from outside with `da_k = zero()`
    /// (`let mut acc = 0.0` before the loop: a constant has no tangent)
    /// and from its body with a float tensor gives the parameter no one
    /// type: the values of the loop's graphs are then unknown, and code
    /// generation leaves the loop to the VM. A dense zero of the body's
    /// type (`cast(zeros_like(a_k), dtype)`) has the same value.
    pub(super) fn densify_loop_tangents(&mut self, graphs: &[GraphId], types: &Types) {
        for &g in graphs {
            if !types.holds_for_every_call(g) {
                continue;
            }
            for &n in &self.bodies[&g] {
                let NodeKind::Apply(inputs) = &self.m.node(n).kind else {
                    continue;
                };
                let Some(Const::Graph(h)) = self.m.as_const(self.resolve(inputs[0])).cloned()
                else {
                    continue;
                };
                let graph = self.m.graph(h);
                let np = graph.params.len();
                if graph.role != crate::ir::GraphRole::Tangent
                    || !np.is_multiple_of(2)
                    || inputs.len() != np + 1
                    || types.is_escaped(h)
                {
                    continue;
                }
                let params = graph.params.clone();
                let mut inputs = inputs.clone();
                let mut changed = false;
                for k in np / 2..np {
                    let arg = self.resolve(inputs[1 + k]);
                    if types.exact_value_of(arg) != Some(AbsVal::Zero)
                        && self.m.applied_prim(arg) != Some(Prim::Zero)
                    {
                        continue;
                    }
                    // The dense type the loop's other calls give it.
                    let mut dense: Option<crate::infer::AbsTensor> = None;
                    let mut one = true;
                    for &id in types.specs_of(h) {
                        match types.spec(id).values.get(&params[k]) {
                            Some(AbsVal::Tensor(t)) if t.dtype.is_float() => match &dense {
                                None => dense = Some(t.clone()),
                                Some(d) => one &= d.dtype == t.dtype && d.shape == t.shape,
                            },
                            Some(AbsVal::Zero) => {}
                            _ => one = false,
                        }
                    }
                    let (Some(t), true) = (dense, one) else {
                        continue;
                    };
                    // The primal it is the tangent of has its shape.
                    let primal = self.resolve(inputs[1 + k - np / 2]);
                    let literal = matches!(
                        self.m.as_const(primal),
                        Some(Const::Float(_) | Const::Int(_))
                    );
                    match types.value_of(primal) {
                        Some(AbsVal::Tensor(p)) if p.shape == t.shape => {}
                        None if literal && t.shape.is_empty() => {}
                        _ => continue,
                    }
                    let loc = self.m.node(n).loc;
                    let z = self.m.add_prim(g, Prim::ZerosLike, &[primal], loc);
                    let d = self.m.add_const(Const::DType(t.dtype), loc);
                    inputs[1 + k] = self.m.add_prim(g, Prim::Cast, &[z, d], loc);
                    changed = true;
                }
                if changed {
                    let loc = self.m.node(n).loc;
                    let call = self.m.add_apply(g, inputs, loc);
                    self.replace(g, n, call);
                    self.stats.simplified += 1;
                }
            }
        }
    }
}
