//! Second derivatives of a gradient by its symmetry: reverse or forward
//! mode of `grad(f)` as the gradient of a directional derivative.
//!
//! `g = grad(f)` (with respect to the arguments `x` of `argnums`, the
//! others `a`) has the Hessian of `f` for Jacobian, and second partial
//! derivatives commute, so both transforms of `g` are a gradient of
//! `h_t(q) = <grad f(q), t>`, the tangent `F(f)(q; t)` gives:
//!
//! - reverse: the backpropagator of `g` at `p` takes the cotangent `c`
//!   (shaped like the gradient) to `grad h_t(p)`, every argument's, with
//!   `t` = `c` on `x` and zero on `a`;
//! - forward: the tangent of `g` at `p` along `dp` is the `x` part of
//!   `grad h_dp(p)`.
//!
//! Built this way, `grad(grad(f))`, `jvp(grad(f))` and deeper nests
//! differentiate a forward-mode graph in reverse (a loop stays a loop of
//! scalars, which reverse mode runs as native code) instead of reversing
//! a reverse pass (a stack of closures per iteration, interpreted).
//!
//! Only for a closed `f` that reaches no custom rule (forward mode does
//! not use `bprop` definitions, so the two would differ where a rule is
//! not the derivative of its function) and no run-time transform, and for
//! `grad`, not `value_and_grad`; otherwise the transforms apply
//! mechanically.

use std::collections::HashSet;

use super::{Ad, AdKind, AdRequest, R};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs};
use crate::ir::{Const, GraphId, GraphRole, Loc, NodeId};
use crate::prim::Prim;

/// A `grad` target the symmetric transforms apply to: its source and the
/// differentiated argument positions.
#[derive(Clone, Debug)]
pub(super) struct GradTarget {
    source: GraphId,
    argnums: super::Argnums,
}

impl GradTarget {
    /// The differentiated argument positions.
    fn which(&self) -> Vec<usize> {
        self.argnums.which()
    }

    /// The target of `req`, if the transforms of it may use symmetry.
    pub(super) fn of(ad: &Ad<'_>, req: &AdRequest) -> Option<GradTarget> {
        let AdKind::Grad {
            argnums,
            with_value: false,
        } = &req.kind
        else {
            return None;
        };
        // (The free variables of the graphs before this request, which
        // the source and what it reaches are.)
        let fv = &ad.fv;
        if !fv.get(req.source).is_empty() {
            return None;
        }
        let reached = reachable_graphs(ad.m, &[req.source]);
        let rules: HashSet<GraphId> = ad.rules.user.iter().flat_map(|(f, r)| [*f, *r]).collect();
        for g in &reached {
            if rules.contains(g) || ad.effectful.contains(g) {
                return None;
            }
            let dynamic = graph_body_with(ad.m, *g, fv)
                .iter()
                .any(|n| matches!(ad.m.applied_prim(*n), Some(Prim::AdDyn | Prim::AdLift)));
            if dynamic {
                return None;
            }
        }
        Some(GradTarget {
            source: req.source,
            argnums: argnums.clone(),
        })
    }
}

impl Ad<'_> {
    /// In graph `g`: `h_t` as a closure over the tangents `ts` (one per
    /// argument of the source), J-transformed and called on `args`; the
    /// gradient it gives, `(env, d_arg..)`. `h` is simplified before it is
    /// differentiated ([`Ad::simplified`]).
    fn directional_gradient(
        &mut self,
        g: GraphId,
        t: &GradTarget,
        ts: &[NodeId],
        args: &[NodeId],
        loc: Loc,
    ) -> R<NodeId> {
        let ff = self.fwd_graph(t.source, loc)?;
        let names = self.m.graph(t.source).param_names.clone();
        let h = self
            .m
            .add_graph(format!("tangent.{}", self.m.graph(t.source).name), loc);
        let mut ins: Vec<_> = names
            .iter()
            .map(|nm| self.m.add_param(h, nm.clone(), loc))
            .collect();
        // A differentiated argument's tangent (a float value, never a
        // function: not lifted) is made concrete (`grad_finalize` gives a
        // symbolic zero its argument's shape), so that the simplifier
        // resolves the zero guards of the rules it meets; a symbolic zero
        // given is made inside `h`.
        let which = t.which();
        for (i, &ti) in ts.iter().enumerate() {
            let ti = if self.m.applied_prim(ti) == Some(Prim::Zero) {
                self.zero(h, loc)
            } else if which.contains(&i) {
                self.plain.insert(ti);
                self.prim(h, Prim::GradFinalize, &[ti, ins[i]], loc)
            } else {
                ti
            };
            ins.push(ti);
        }
        let ffr = self.gref(ff, loc);
        let r = self.call(h, ffr, &ins, loc);
        let dy = self.get(h, r, 1, loc);
        self.m.set_output(h, dy);
        // The new graphs' free variables, and the new loops among them.
        self.fv = free_variables(self.m);
        self.tail_set = None;
        let h = self.simplified(h);
        let jh = self.j_graph(h, loc)?;
        let jhr = self.gref(jh, loc);
        let r = self.call(g, jhr, args, loc);
        let bh = self.get(g, r, 1, loc);
        let one = self.konst(Const::Float(1.0), loc);
        Ok(self.call(g, bh, &[one], loc))
    }

    /// In the transform `tg` of `g` being built: parameters like `g`'s,
    /// and the value, `g` called on them.
    fn call_target(&mut self, g: GraphId, tg: GraphId, loc: Loc) -> (Vec<NodeId>, NodeId) {
        let names = self.m.graph(g).param_names.clone();
        let ps: Vec<_> = names
            .iter()
            .map(|nm| self.m.add_param(tg, nm.clone(), loc))
            .collect();
        let gr = self.gref(g, loc);
        let value = self.call(tg, gr, &ps, loc);
        (ps, value)
    }

    /// `J(g)` for `g = grad(f)` by symmetry (see the module's comment).
    pub(super) fn j_grad_target(&mut self, g: GraphId, jg: GraphId, t: &GradTarget) -> R<()> {
        let loc = self.m.graph(g).loc;
        let (ps, value) = self.call_target(g, jg, loc);
        let name = self.m.graph(g).name.clone();
        let b = self
            .m
            .add_graph_as(format!("B.{name}"), loc, GraphRole::Backprop);
        let c = self.m.add_param(b, "dout", loc);
        // The rule for a concrete cotangent (a zero one gives zeros).
        let rule = self
            .m
            .add_graph_as(format!("B.{name}.rule"), loc, GraphRole::Backprop);
        let which = t.which();
        let mut ts = Vec::with_capacity(ps.len());
        for i in 0..ps.len() {
            let ti = match which.iter().position(|&k| k == i) {
                Some(pos) if t.argnums.tupled() => self.get(rule, c, pos, loc),
                Some(_) => c,
                None => self.zero(rule, loc),
            };
            ts.push(ti);
        }
        let d = self.directional_gradient(rule, t, &ts, &ps, loc)?;
        // The environment: none (`f` is closed; `t` is not differentiated).
        let mut outs = vec![self.zero(rule, loc)];
        for i in 0..ps.len() {
            outs.push(self.get(rule, d, i + 1, loc));
        }
        self.output_tuple(rule, &outs, loc);
        self.zero_guarded(b, c, rule, ps.len(), &name, loc);
        let br = self.gref(b, loc);
        self.output_tuple(jg, &[value, br], loc);
        Ok(())
    }

    /// `F(g)` for `g = grad(f)` by symmetry (see the module's comment).
    pub(super) fn f_grad_target(&mut self, g: GraphId, fg: GraphId, t: &GradTarget) -> R<()> {
        let loc = self.m.graph(g).loc;
        let (ps, value) = self.call_target(g, fg, loc);
        let names = self.m.graph(g).param_names.clone();
        let dps: Vec<_> = names
            .iter()
            .map(|nm| self.m.add_param(fg, format!("d{nm}"), loc))
            .collect();
        let d = self.directional_gradient(fg, t, &dps, &ps, loc)?;
        let which = t.which();
        let mut parts = Vec::with_capacity(which.len());
        for &i in &which {
            let di = self.get(fg, d, i + 1, loc);
            parts.push(self.prim(fg, Prim::GradFinalize, &[di, ps[i]], loc));
        }
        let tangent = if t.argnums.tupled() {
            self.prim(fg, Prim::MakeTuple, &parts, loc)
        } else {
            parts[0]
        };
        self.output_tuple(fg, &[value, tangent], loc);
        Ok(())
    }
}
