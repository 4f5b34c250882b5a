//! Forward-mode automatic differentiation (`jvp`) as an IR-to-IR transform.
//!
//! `F` maps every graph `f(p1..pn)` to a graph `F(f)(p1..pn, dp1..dpn)`
//! that returns `make_tuple(y, dy)`: the value and its tangent. Inside
//! `F(f)` every node of `f` stands for a pair of nodes, its primal and its
//! tangent:
//!
//! - a parameter maps to the matching primal and tangent parameters;
//! - a constant is its own primal and has the tangent `zero()` (the
//!   symbolic zero); a graph constant `@g` used as a value becomes `@F.g`
//!   (so every function value inside `F(f)` is a forward-transformed one),
//!   also with tangent `zero()`;
//! - a call `h(a..)`, whatever `h` is (a graph constant, a primitive, or a
//!   function value computed at run time: the result of `switch`, a
//!   closure taken out of a tuple, a parameter), becomes
//!   `r = F(h)(a.., da..)` followed by `tuple_get(r, 0)` (the primal) and
//!   `tuple_get(r, 1)` (the tangent). When the call is `f`'s output, `r` is
//!   the output of `F(f)` as it is, so tail calls stay tail calls and loops
//!   run in constant stack. `make_tuple`, `tuple_get` and `record_get` are
//!   written inline instead (the tuple of the tangents, the part of the
//!   tangent), so inference does not specialise a shared rule graph once
//!   per tuple type.
//!
//! Nested graphs (closures) are transformed in turn; their free variables
//! are nodes of an enclosing graph, so in `F` of the nested graph they
//! refer to the primal and tangent nodes of the enclosing `F` graph. `F` of
//! a graph without free variables is shared by all requests; `F` of a
//! closure is valid within one request. Nodes of graphs that are not
//! transformed (the free variables of a differentiated lambda) are their
//! own primal and have the tangent `zero()`. With function values mapped
//! this way, `switch` (only the taken branch runs), recursion and loops
//! (tail-recursive graphs) need no special case.
//!
//! A primitive `p` applied to `k` arguments becomes a small graph
//! `F.p(x1..xk, dx1..dxk)` that computes `out = p(x..)` and, if every
//! tangent is the symbolic zero, returns `(out, zero())` without evaluating
//! the rule; otherwise it calls the tangent rule. Rules are functions
//! `jvp_p(x.., out, dx..)` of `stdlib/jvp.adj`, lowered like any function,
//! and receive concrete tangents (zeros made real by `grad_finalize(dx,
//! x)`); the structural primitives (tuples, records, environments,
//! `switch`, the values of reverse mode) have rules generated here that
//! work on the tangents as they are, symbolic zeros included. So does
//! `tree_map`, whose function argument is itself F-transformed: `F.tree_map`
//! maps it over the leaves of the primals and tangents together and splits
//! the `(y, dy)` pairs. A
//! non-differentiable primitive, a cast to an int or bool dtype and
//! `stop_gradient` have the tangent `zero()`; IO, and a primitive listed
//! in [`NO_RULE_YET`], are errors at the user's expression, as in reverse
//! mode.
//!
//! Because the rules of the primitives reverse mode itself inserts (`gadd`,
//! the environments, `grad_finalize`, `sum_to`, ..) exist, `jvp` of a
//! function that calls `grad` works (forward-over-reverse: Hessian-vector
//! products). And because `F` graphs and the rules are ordinary IR,
//! reverse mode differentiates through them (`grad` of a function that
//! calls `jvp`).
//!
//! A function with a user-written `bprop` is differentiated through its
//! body here: the custom rule gives the reverse derivative only.

use super::{Ad, AdError, Rules, NO_RULE_YET, R};
use crate::ir::analysis::graph_body_with;
use crate::ir::{Const, GraphId, GraphRole, Loc, NodeId, NodeKind};
use crate::prim::{Category, Prim};

/// The primitives whose tangent rule the transform writes itself. They see
/// the tangents as they are: symbolic zeros, or structures (tuples,
/// records, environments) that contain them.
pub fn tangent_is_generated(p: Prim) -> bool {
    matches!(
        p,
        Prim::MakeTuple
            | Prim::MakeRecord
            | Prim::TensorLiteral
            | Prim::Index
            | Prim::IndexGrad
            | Prim::TupleGet
            | Prim::RecordGet
            | Prim::Switch
            | Prim::Zero
            | Prim::GAdd
            | Prim::EnvSetitem
            | Prim::EnvGetitem
            | Prim::GradFinalize
            | Prim::TupleGrad
            | Prim::RecordGrad
            | Prim::TreeFill
            | Prim::TreeGAdd
            | Prim::TreeMap
            | Prim::StopGradient
            | Prim::AdLift
            | Prim::AdDyn
            | Prim::AdHide
            | Prim::AdKey
    )
}

/// Whether a value of `p` carries a tangent: `stop_gradient`'s does not.
fn has_tangent(p: Prim) -> bool {
    p.info().differentiable && p != Prim::StopGradient
}

/// Checks the tangent rule table: every differentiable primitive has a rule
/// in `stdlib/jvp.adj`, has one generated here, or is listed in
/// [`NO_RULE_YET`].
pub fn missing_tangent_rules(rules: &Rules) -> Vec<Prim> {
    Prim::all()
        .iter()
        .copied()
        .filter(|p| p.info().differentiable)
        .filter(|p| !tangent_is_generated(*p) && !NO_RULE_YET.contains(p))
        .filter(|p| !rules.tangents.contains_key(p))
        .collect()
}

impl Ad<'_> {
    /// Fills the target graph of `jvp(f, (x..), (dx..))`: it takes the
    /// tuple of primals and the tuple of tangents and returns
    /// `(y, grad_finalize(dy, y))`.
    pub(super) fn build_jvp(&mut self, t: GraphId, src: GraphId, loc: Loc) -> R<()> {
        let n = self.m.graph(src).params.len();
        let ff = if self.lift_source {
            None
        } else {
            Some(self.fwd_graph(src, loc)?)
        };
        let xs = self.m.add_param(t, "primals", loc);
        let dxs = self.m.add_param(t, "tangents", loc);
        let mut args: Vec<NodeId> = (0..n).map(|i| self.get(t, xs, i, loc)).collect();
        for i in 0..n {
            let d = self.get(t, dxs, i, loc);
            args.push(d);
        }
        let ffr = match ff {
            Some(ff) => self.gref(ff, loc),
            None => {
                let f = self.gref(src, loc);
                let two = self.konst(Const::Int(2), loc);
                let w = self.konst(Const::Int(0), loc);
                self.prim(t, Prim::AdLift, &[f, two, w], loc)
            }
        };
        let r = self.call(t, ffr, &args, loc);
        let y = self.get(t, r, 0, loc);
        let dy = self.get(t, r, 1, loc);
        let dy = self.prim(t, Prim::GradFinalize, &[dy, y], loc);
        self.output_tuple(t, &[y, dy], loc);
        Ok(())
    }

    /// The symbolic zero, made once per graph `g` of the forward transform.
    fn fwd_zero(&mut self, g: GraphId) -> NodeId {
        if let Some(z) = self.f_zeros.get(&g) {
            return *z;
        }
        let z = self.zero(g, Loc::NONE);
        self.f_zeros.insert(g, z);
        z
    }

    /// The primal standing for `n` inside the forward graph being built;
    /// `arity` is that of the call `n` appears in (for a primitive used as
    /// a value).
    fn fwd_primal(&mut self, g: GraphId, n: NodeId, arity: usize, at: Loc) -> R<NodeId> {
        match self.m.node(n).kind.clone() {
            NodeKind::Const(Const::Prim(p)) => {
                let info = p.info();
                let k = if info.variadic {
                    arity
                } else {
                    info.params.len()
                };
                let g = self.fwd_prim(p, k, at)?;
                Ok(self.gref(g, at))
            }
            NodeKind::Const(Const::Graph(h)) => {
                let g = self.fwd_graph(h, at)?;
                Ok(self.gref(g, at))
            }
            NodeKind::Const(_) => Ok(n),
            _ => match self.f_primal.get(&n) {
                Some(v) => Ok(*v),
                None => Ok(self.outside(g, n, 2)),
            },
        }
    }

    /// The tangent of `n` inside forward graph `g`: `zero()` for constants
    /// (functions included) and for nodes outside the transformed graphs;
    /// in a graph built at run time for a closure, the tangent its
    /// captured value comes with (a placeholder free variable).
    fn fwd_tangent(&mut self, g: GraphId, n: NodeId) -> NodeId {
        match self.m.node(n).kind {
            NodeKind::Const(_) => self.fwd_zero(g),
            _ => match self.f_tangent.get(&n) {
                Some(d) => *d,
                None if !self.lift_outside => self.tangent_placeholder(n),
                None => self.fwd_zero(g),
            },
        }
    }

    /// The free variable that holds the tangent of captured value `n` in
    /// forward graphs built at run time, at forward level `self.f_level`.
    /// `n` is a captured node (a free variable of the original) or the
    /// placeholder of a tangent of one from a lower level; the tangent of
    /// its value is keyed by the captured node and the path of tangent
    /// steps ([`super::Provenance::placeholder`]), so each level's tangent
    /// is a free variable of its own.
    fn tangent_placeholder(&mut self, n: NodeId) -> NodeId {
        let (root, mut path) = match self.prov.placeholder_of.get(&n) {
            Some((r, p)) => (*r, p.clone()),
            None => (n, Vec::new()),
        };
        debug_assert!(
            path.len() <= self.f_level,
            "a placeholder from a lower level"
        );
        path.resize(self.f_level, false);
        path.push(true);
        let key = (root, path);
        if let Some(p) = self.prov.placeholder.get(&key) {
            return *p;
        }
        let holder = match self.prov.holder {
            Some(h) => h,
            None => {
                let h = self.m.add_graph("tangents", Loc::NONE);
                let u = self.konst(Const::Unit, Loc::NONE);
                self.m.set_output(h, u);
                self.prov.holder = Some(h);
                h
            }
        };
        let p = self.m.add_param(holder, "", Loc::NONE);
        self.prov.placeholder_of.insert(p, key.clone());
        self.prov.placeholder.insert(key, p);
        p
    }

    /// `F(f)`: `f`'s parameters, then one tangent per parameter; returns
    /// `(value, tangent)`.
    pub(super) fn fwd_graph(&mut self, f: GraphId, at: Loc) -> R<GraphId> {
        let f = self.substitute(f);
        let closed = self.fv.get(f).is_empty();
        // What the free variables stand for: their primal and tangent
        // values in the transform being built.
        let mut key = self.scoped(f, &self.f_primal);
        key.1.extend(self.scoped(f, &self.f_tangent).1);
        let memo = if closed {
            self.f_closed.get(&f)
        } else {
            self.f_graphs.get(&key)
        };
        if let Some(g) = memo {
            return Ok(*g);
        }
        if self.effectful.contains(&f) {
            return Err(self.io_error(f, at));
        }
        let name = self.m.graph(f).name.clone();
        let floc = self.m.graph(f).loc;
        let ff = self
            .m
            .add_graph_as(format!("F.{name}"), floc, GraphRole::Tangent);
        self.prov.graphs.insert(ff, (2, f));
        if closed {
            self.f_closed.insert(f, ff);
        } else {
            self.f_graphs.insert(key, ff);
        }
        if let Some(t) = self.grad_target(f) {
            self.f_grad_target(f, ff, &t)?;
            return Ok(ff);
        }
        let params = self.m.graph(f).params.clone();
        let pnames = self.m.graph(f).param_names.clone();
        for (p, nm) in params.iter().zip(&pnames) {
            let fp = self.m.add_param(ff, nm.clone(), self.m.node(*p).loc);
            self.f_primal.insert(*p, fp);
            self.prov.origin.insert(fp, *p);
        }
        for (p, nm) in params.iter().zip(&pnames) {
            let dname = if nm.is_empty() {
                String::new()
            } else {
                format!("d{nm}")
            };
            let dp = self.m.add_param(ff, dname, self.m.node(*p).loc);
            self.f_tangent.insert(*p, dp);
            self.prov.tangent_origin.insert(dp, *p);
        }
        let body = graph_body_with(self.m, f, &self.fv);
        let out = self.m.graph(f).output.expect("lowered graphs have outputs");
        let mut out_pair = None;
        for &y in &body {
            let inputs = self.m.inputs(y).to_vec();
            let yloc = self.m.node(y).loc;
            let arity = inputs.len() - 1;
            // A choice between two graphs (an `if`, a loop's test) is the
            // choice between their F graphs, inline: its tangent is zero
            // (both are constants), and a call of it in output position
            // stays a tail call of a `switch` between graphs, so F of a
            // loop is a loop again (reverse mode then threads a stack
            // through it instead of nesting closures, see `tail_set`).
            if self.m.applied_prim(y) == Some(Prim::Switch)
                && inputs.len() == 4
                && inputs[2..]
                    .iter()
                    .all(|&b| matches!(self.m.as_const(b), Some(Const::Graph(_))))
            {
                let c = self.fwd_primal(ff, inputs[1], arity, yloc)?;
                let a = self.fwd_primal(ff, inputs[2], arity, yloc)?;
                let b = self.fwd_primal(ff, inputs[3], arity, yloc)?;
                let yp = self.prim(ff, Prim::Switch, &[c, a, b], yloc);
                let dy = self.fwd_zero(ff);
                self.f_primal.insert(y, yp);
                self.prov.origin.insert(yp, y);
                self.f_tangent.insert(y, dy);
                continue;
            }
            // Making a tuple and taking a part of a tuple or record are
            // inline: the tangent is the tuple of the tangents, or the same
            // part of the tangent (a symbolic zero gives zero). A shared
            // `F.tuple_get` graph would be specialised once per tuple type
            // it meets, thousands of times in nested transforms.
            if let Some(Const::Prim(p @ (Prim::TupleGet | Prim::RecordGet | Prim::MakeTuple))) =
                self.m.as_const(inputs[0]).cloned()
            {
                if arity == 2 || p == Prim::MakeTuple {
                    let mut xs = Vec::with_capacity(arity);
                    for &a in &inputs[1..] {
                        xs.push(self.fwd_primal(ff, a, arity, yloc)?);
                    }
                    let dxs: Vec<NodeId> = if p == Prim::MakeTuple {
                        inputs[1..]
                            .iter()
                            .map(|&a| self.fwd_tangent(ff, a))
                            .collect()
                    } else {
                        vec![self.fwd_tangent(ff, inputs[1]), xs[1]]
                    };
                    let yp = self.prim(ff, p, &xs, yloc);
                    let dy = self.prim(ff, p, &dxs, yloc);
                    self.f_primal.insert(y, yp);
                    self.prov.origin.insert(yp, y);
                    self.f_tangent.insert(y, dy);
                    self.prov.tangent_origin.insert(dy, y);
                    continue;
                }
            }
            let callee = match self.m.as_const(inputs[0]) {
                Some(Const::Prim(p)) => {
                    let p = *p;
                    if p.category() == Category::Io {
                        return Err(super::io_prim_error(p, yloc));
                    }
                    // A cast to an int or bool dtype has no derivative.
                    let int_cast = p == Prim::Cast
                        && matches!(inputs.get(2).and_then(|d| self.m.as_const(*d)),
                            Some(Const::DType(d)) if !d.is_float());
                    let g = if int_cast {
                        self.fwd_prim_as(p, arity, yloc, false)?
                    } else {
                        self.fwd_prim(p, arity, yloc)?
                    };
                    self.gref(g, yloc)
                }
                _ => self.fwd_primal(ff, inputs[0], arity, yloc)?,
            };
            let mut ins = Vec::with_capacity(2 * arity + 1);
            ins.push(callee);
            for &a in &inputs[1..] {
                ins.push(self.fwd_primal(ff, a, arity, yloc)?);
            }
            for &a in &inputs[1..] {
                ins.push(self.fwd_tangent(ff, a));
            }
            let r = self.m.add_apply(ff, ins, yloc);
            let yp = self.get(ff, r, 0, yloc);
            let dy = self.get(ff, r, 1, yloc);
            self.f_primal.insert(y, yp);
            self.prov.origin.insert(yp, y);
            self.f_tangent.insert(y, dy);
            self.prov.tangent_origin.insert(dy, y);
            if y == out {
                out_pair = Some(r);
            }
        }
        let o = match out_pair {
            // A call in output position stays a tail call.
            Some(r) => r,
            None => {
                let yp = self.fwd_primal(ff, out, 0, floc)?;
                let dy = self.fwd_tangent(ff, out);
                self.prim(ff, Prim::MakeTuple, &[yp, dy], floc)
            }
        };
        self.m.set_output(ff, o);
        Ok(ff)
    }

    /// `F` of a primitive applied to `arity` arguments.
    fn fwd_prim(&mut self, p: Prim, arity: usize, at: Loc) -> R<GraphId> {
        self.fwd_prim_as(p, arity, at, has_tangent(p))
    }

    /// `F.p(x.., dx..)`, differentiated or (where the result carries no
    /// derivative, like a cast to an int) with the tangent `zero()`.
    fn fwd_prim_as(&mut self, p: Prim, arity: usize, at: Loc, differentiable: bool) -> R<GraphId> {
        let key = (p, arity, differentiable);
        if let Some(g) = self.f_prims.get(&key) {
            return Ok(*g);
        }
        let info = p.info();
        if info.category == Category::Io {
            return Err(super::io_prim_error(p, at));
        }
        if p == Prim::TreeMap && differentiable {
            return Ok(self.fwd_tree_map(key, arity));
        }
        let rule = if !differentiable || tangent_is_generated(p) {
            None
        } else {
            match self.rules.tangents.get(&p) {
                Some(r) => Some(*r),
                None => {
                    return Err(AdError {
                        loc: at,
                        message: format!("`{p}` has no derivative rule"),
                        note: Some(format!(
                            "forward mode needs a tangent rule: add `fn jvp_{p}` in stdlib/jvp.adj"
                        )),
                    })
                }
            }
        };
        if let Some(r) = rule {
            let want = 2 * arity + 1;
            let have = self.m.graph(r).params.len();
            if have != want {
                return Err(AdError {
                    loc: self.m.graph(r).loc,
                    message: format!(
                        "the tangent rule of `{p}` takes {have} parameters; expected {want} (the inputs, `out` and one tangent per input)"
                    ),
                    note: None,
                });
            }
        }
        let loc = Loc::NONE;
        let suffix = if differentiable { "" } else { ".nondiff" };
        let fg = self
            .m
            .add_graph_as(format!("F.{}{suffix}", info.name), loc, GraphRole::Tangent);
        self.f_prims.insert(key, fg);
        let xs: Vec<NodeId> = (0..arity)
            .map(|i| self.m.add_param(fg, format!("x{i}"), loc))
            .collect();
        let dxs: Vec<NodeId> = (0..arity)
            .map(|i| self.m.add_param(fg, format!("dx{i}"), loc))
            .collect();
        let out = if matches!(p, Prim::AdDyn | Prim::AdLift) {
            let mut args = xs.clone();
            let last = args.len() - 1;
            args[last] = super::nest(self, fg, xs[last], 2);
            self.prim(fg, p, &args, loc)
        } else {
            self.prim(fg, p, &xs, loc)
        };
        let dout = if !differentiable || arity == 0 {
            self.zero(fg, loc)
        } else {
            // All tangents zero: no rule to run.
            let zg = self
                .m
                .add_graph_as(format!("F.{}.zero", info.name), loc, GraphRole::Tangent);
            let z = self.zero(zg, loc);
            self.m.set_output(zg, z);
            let rg = self
                .m
                .add_graph_as(format!("F.{}.rule", info.name), loc, GraphRole::Tangent);
            let d = match rule {
                Some(r) => {
                    let mut args = xs.clone();
                    args.push(out);
                    for (dx, x) in dxs.iter().zip(&xs) {
                        let c = self.prim(rg, Prim::GradFinalize, &[*dx, *x], loc);
                        args.push(c);
                    }
                    let rr = self.gref(r, loc);
                    self.call(rg, rr, &args, loc)
                }
                None => self.generated_tangent(rg, p, &xs, &dxs),
            };
            self.m.set_output(rg, d);
            let mut all = self.prim(fg, Prim::IsZero, &[dxs[0]], loc);
            for dx in &dxs[1..] {
                let z = self.prim(fg, Prim::IsZero, &[*dx], loc);
                all = self.prim(fg, Prim::And, &[all, z], loc);
            }
            let zr = self.gref(zg, loc);
            let rr = self.gref(rg, loc);
            let sw = self.prim(fg, Prim::Switch, &[all, zr, rr], loc);
            self.call(fg, sw, &[], loc)
        };
        self.output_tuple(fg, &[out, dout], loc);
        Ok(fg)
    }

    /// `F(tree_map)` applied to `arity` arguments: `F.tree_map(ff, t1..tk,
    /// dff, dt1..dtk)`. The function arrives F-transformed (it takes the
    /// primals, then the tangents), so `tree_map(ff, t1..tk, dt1..dtk)`
    /// applies it leaf by leaf (the tangent trees may be `zero()` as a
    /// whole or in parts: see the kernel) and gives a `(y, dy)` pair at each
    /// leaf of `t1`, split into the value and its tangent. The function's
    /// own tangent is not needed: an F-transformed closure carries the
    /// tangents of what it captures.
    fn fwd_tree_map(&mut self, key: (Prim, usize, bool), arity: usize) -> GraphId {
        let loc = Loc::NONE;
        let fg = self.m.add_graph_as("F.tree_map", loc, GraphRole::Tangent);
        self.f_prims.insert(key, fg);
        let xs: Vec<NodeId> = (0..arity)
            .map(|i| self.m.add_param(fg, format!("x{i}"), loc))
            .collect();
        let dxs: Vec<NodeId> = (0..arity)
            .map(|i| self.m.add_param(fg, format!("dx{i}"), loc))
            .collect();
        let mut args = xs.clone();
        args.extend_from_slice(&dxs[1..]);
        let pairs = self.prim(fg, Prim::TreeMap, &args, loc);
        let y = self.tree_pick(fg, xs[1], pairs, 0);
        let dy = self.tree_pick(fg, xs[1], pairs, 1);
        self.output_tuple(fg, &[y, dy], loc);
        fg
    }

    /// The tangent of a structural primitive's result, in graph `g`, from
    /// its inputs `xs` and their tangents `dxs` as they are.
    fn generated_tangent(&mut self, g: GraphId, p: Prim, xs: &[NodeId], dxs: &[NodeId]) -> NodeId {
        let loc = Loc::NONE;
        let concrete = |ad: &mut Self, i: usize| -> NodeId {
            ad.prim(g, Prim::GradFinalize, &[dxs[i], xs[i]], loc)
        };
        match p {
            Prim::MakeTuple => self.prim(g, Prim::MakeTuple, dxs, loc),
            Prim::MakeRecord => {
                let mut args = Vec::with_capacity(xs.len());
                for (i, x) in xs.iter().enumerate() {
                    args.push(if i % 2 == 0 { *x } else { dxs[i] });
                }
                self.prim(g, Prim::MakeRecord, &args, loc)
            }
            Prim::TensorLiteral => {
                let items: Vec<NodeId> = (0..xs.len()).map(|i| concrete(self, i)).collect();
                self.prim(g, Prim::TensorLiteral, &items, loc)
            }
            Prim::Index => {
                let mut args = vec![concrete(self, 0)];
                args.extend_from_slice(&xs[1..]);
                self.prim(g, Prim::Index, &args, loc)
            }
            Prim::IndexGrad => {
                let mut args = vec![xs[0], dxs[1]];
                args.extend_from_slice(&xs[2..]);
                self.prim(g, Prim::IndexGrad, &args, loc)
            }
            Prim::TupleGet => self.prim(g, Prim::TupleGet, &[dxs[0], xs[1]], loc),
            Prim::RecordGet => self.prim(g, Prim::RecordGet, &[dxs[0], xs[1]], loc),
            Prim::Switch => self.prim(g, Prim::Switch, &[xs[0], dxs[1], dxs[2]], loc),
            Prim::GAdd => self.prim(g, Prim::GAdd, &[dxs[0], dxs[1]], loc),
            Prim::EnvSetitem => self.prim(g, Prim::EnvSetitem, &[dxs[0], xs[1], dxs[2]], loc),
            Prim::EnvGetitem => self.prim(g, Prim::EnvGetitem, &[dxs[0], xs[1]], loc),
            Prim::GradFinalize => self.prim(g, Prim::GradFinalize, &[dxs[0], xs[1]], loc),
            Prim::TupleGrad => self.prim(g, Prim::TupleGrad, &[xs[0], xs[1], dxs[2]], loc),
            Prim::RecordGrad => self.prim(g, Prim::RecordGrad, &[xs[0], xs[1], dxs[2]], loc),
            Prim::TreeFill => self.prim(g, Prim::TreeFill, &[xs[0], dxs[1]], loc),
            Prim::TreeGAdd => self.prim(g, Prim::TreeGAdd, &[dxs[0]], loc),
            // Lifting is the identity on data: the tangent passes through.
            Prim::AdLift => dxs[0],
            Prim::AdHide => self.prim(g, Prim::AdHide, &[dxs[0]], loc),
            Prim::AdKey => dxs[0],
            // A function made at run time carries no tangent (see `dynamic`).
            Prim::Zero | Prim::StopGradient | Prim::AdDyn => self.zero(g, loc),
            _ => unreachable!("only structural primitives have generated tangent rules"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use adjoint_lang::ast::Item;
    use adjoint_lang::FileId;

    /// The `jvp_P` functions of `stdlib/jvp.adj`, by primitive name.
    fn rule_names() -> Vec<String> {
        let src =
            crate::lower::stdlib_text("jvp").expect("jvp.adj is part of the standard library");
        let (module, diags) = adjoint_lang::parse(FileId(0), &src);
        assert!(diags.is_empty(), "stdlib/jvp.adj does not parse: {diags:?}");
        module
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Fn(d) => d.name.name.strip_prefix("jvp_").map(str::to_string),
                _ => None,
            })
            .collect()
    }

    /// Every differentiable primitive has exactly one source of tangent
    /// rule: `stdlib/jvp.adj`, the transform, or `NO_RULE_YET`.
    #[test]
    fn every_differentiable_primitive_has_one_tangent_rule() {
        let names = rule_names();
        for n in &names {
            let p = Prim::from_name(n).unwrap_or_else(|| panic!("`jvp_{n}`: no such primitive"));
            assert!(p.info().differentiable, "`jvp_{n}`: not differentiable");
            assert!(!tangent_is_generated(p), "`jvp_{n}`: the rule is generated");
            assert!(
                !NO_RULE_YET.contains(&p),
                "`jvp_{n}`: listed in NO_RULE_YET"
            );
        }
        for p in Prim::all().iter().filter(|p| p.info().differentiable) {
            let sources = [
                names.iter().any(|n| n == p.name()),
                tangent_is_generated(*p),
                NO_RULE_YET.contains(p),
            ];
            assert_eq!(
                sources.iter().filter(|s| **s).count(),
                1,
                "`{p}`: rule in jvp.adj, generated, in NO_RULE_YET: {sources:?}"
            );
        }
    }

    #[test]
    fn generated_tangent_rules_are_for_differentiable_primitives() {
        for p in Prim::all().iter().filter(|p| tangent_is_generated(**p)) {
            assert!(p.info().differentiable, "{p}");
        }
        assert!(!has_tangent(Prim::StopGradient));
        assert!(!has_tangent(Prim::Lt));
        assert!(has_tangent(Prim::Math(adjoint_runtime::math::MathFn::Sin)));
    }
}
