//! Rewrites that need types: with every shape static after inference,
//! queries of shapes fold to constants (so the rank tests in derivative
//! rules fold, and the `switch`es on them), and reshapes, broadcasts and
//! `sum_to`s that do not change a shape disappear.

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
        if !matches!(self.m.as_const(n), Some(_)) {
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
                    // A zero cotangent of a tensor: zeros of its type.
                    (Some(AbsVal::Tensor(t)), _)
                        if !t.weak && self.m.applied_prim(d) == Some(Prim::Zero) =>
                    {
                        Some(self.m.add_prim(g, Prim::ZerosLike, &[x], loc))
                    }
                    // A tensor cotangent of the value's exact type needs
                    // nothing filled in or cast.
                    (Some(AbsVal::Tensor(t)), _) => match types.value_of(d) {
                        Some(AbsVal::Tensor(u))
                            if u.dtype == t.dtype && u.shape == t.shape && u.weak == t.weak =>
                        {
                            Some(d)
                        }
                        _ => None,
                    },
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
