//! `vmap`, `jacobian` (`jacrev`), `jacfwd`, `hessian` and `hvp`.
//!
//! `vmap(f, in_axes = .., out_axes = ..)` becomes a function that numbers
//! its call's lanes (`vmap_level`), measures the mapped axes
//! (`vmap_size`), makes them the lanes of every mapped argument
//! (`vmap_in`), calls `f` and puts the lanes of the result back
//! (`vmap_out`). `f` is typed and differentiated as one lane; the runtime
//! runs it on whole batches (`adjoint_runtime::batch`). Derivatives of a
//! mapped function go through the rules of those primitives.
//!
//! The Jacobians are `vmap` over `vjp` (one row per basis cotangent) and
//! over `jvp` (one column per basis tangent), as in JAX; `hessian(f)` is
//! `jacfwd(jacobian(f))` and `hvp(f, x, v)` is `jvp(grad(f), (x,), (v,))`'s
//! tangent.

use super::*;
use crate::span::loc;

/// An axis of `in_axes` / `out_axes`: mapped at this axis, or not at all.
type Axis = Option<i64>;

/// One axis for every argument (or leaf of the result), or one each.
enum Axes {
    All(Axis),
    Each(Vec<Axis>),
}

fn static_axis(e: &Expr) -> R<Axis> {
    let bad = || {
        Diagnostic::error(
            "an axis of `vmap` is written as an int, or `None` for a value that is not mapped",
            e.span,
        )
    };
    match &*e.kind {
        ExprKind::Int(i) => Ok(Some(*i)),
        ExprKind::Unary {
            op: ast::UnOp::Neg,
            operand,
        } => match &*operand.kind {
            ExprKind::Int(i) => Ok(Some(-*i)),
            _ => Err(bad()),
        },
        ExprKind::Name(n) if n == "None" => Ok(None),
        ExprKind::Tuple(items) if items.is_empty() => Ok(None),
        _ => Err(bad()),
    }
}

fn static_axes(e: &Expr) -> R<Axes> {
    match &*e.kind {
        ExprKind::Tuple(items) if !items.is_empty() => {
            Ok(Axes::Each(items.iter().map(static_axis).collect::<R<_>>()?))
        }
        _ => Ok(Axes::All(static_axis(e)?)),
    }
}

/// The names this module lowers.
pub(super) const VMAP_NAMES: &[&str] = &["vmap", "jacobian", "jacrev", "jacfwd", "hessian", "hvp"];

/// What a Jacobian is built of: the graph of `f`, its parameter count,
/// and the argument it is taken with respect to.
#[derive(Clone, Copy)]
struct JacOf {
    g: GraphId,
    arity: usize,
    argnum: usize,
}

impl JacOf {
    fn new(g: GraphId, arity: usize, argnum: usize) -> JacOf {
        JacOf { g, arity, argnum }
    }
}

impl Lowerer<'_> {
    /// The number of parameters of graph `g`, looking through the targets
    /// of `grad` (built later, with the source's parameters).
    fn arity_of(&self, g: GraphId) -> usize {
        if let Some(r) = self.ad_requests.iter().find(|r| r.target == g) {
            return self.arity_of(r.source);
        }
        // A function whose body is not lowered yet: its definition.
        if let Some(key) = self
            .fn_graphs
            .iter()
            .find(|(_, v)| **v == g)
            .map(|(k, _)| *k)
        {
            return self.fn_def(key).params.len();
        }
        self.m.graph(g).params.len()
    }

    /// `vmap(..)`, `jacobian(..)`, `jacrev(..)`, `jacfwd(..)`,
    /// `hessian(..)` (function values) and `hvp(f, x, v)` (a call).
    /// `called`: how many positional arguments the result is called with
    /// at once (`jacobian(f)(x)`), when known.
    pub(super) fn lower_vmap(
        &mut self,
        module: usize,
        cx: &mut Cx,
        which: &str,
        args: &[ast::Arg],
        span: Span,
        called: Option<usize>,
    ) -> R<NodeId> {
        let Some(first) = args.first().filter(|a| a.name.is_none()) else {
            return Err(Diagnostic::error(
                format!("`{which}` needs the function as its first argument"),
                span,
            ));
        };
        if which == "hvp" {
            return self.lower_hvp(module, cx, args, span);
        }
        let mut in_axes = None;
        let mut out_axes = None;
        let mut argnums = None;
        for a in &args[1..] {
            match &a.name {
                Some(k) if which != "vmap" && k.name == "argnums" => {
                    argnums = Some((super::static_argnums(&a.value)?, a.span));
                }
                Some(k) if which == "vmap" && k.name == "in_axes" => {
                    in_axes = Some(static_axes(&a.value)?)
                }
                Some(k) if which == "vmap" && k.name == "out_axes" => {
                    out_axes = Some(static_axes(&a.value)?)
                }
                Some(k) => {
                    return Err(Diagnostic::error(
                        format!("`{which}` has no parameter named `{}`", k.name),
                        k.span,
                    ))
                }
                None => {
                    return Err(Diagnostic::error(
                        format!(
                        "`{which}(f)` takes only the function; call the result: `{which}(f)(x)`"
                    ),
                        a.span,
                    ))
                }
            }
        }
        let called = match &in_axes {
            Some(Axes::Each(v)) => Some(v.len()),
            _ => called,
        };
        let target = self.resolve_fn_called(module, cx, &first.value, Called::With(called))?;
        let (callee, arity, name) = match target {
            DiffTarget::Static(g, name) => (self.graph_ref(g, span), Some(self.arity_of(g)), name),
            DiffTarget::Value(v) => (v, None, "fn".to_string()),
        };
        match which {
            "vmap" => {
                let in_axes = in_axes.unwrap_or(Axes::All(Some(0)));
                let arity = match (&in_axes, arity) {
                    (Axes::Each(v), Some(n)) if v.len() != n => {
                        return Err(Diagnostic::error(
                            format!(
                                "`in_axes` has {} entries but `{name}` takes {n} argument{}",
                                v.len(),
                                if n == 1 { "" } else { "s" }
                            ),
                            span,
                        ))
                    }
                    (_, Some(n)) => n,
                    (Axes::Each(v), None) => v.len(),
                    (Axes::All(_), None) => {
                        return Err(Diagnostic::error(
                            "`vmap` of a function value needs `in_axes = (..)` with one entry per argument",
                            span,
                        ))
                    }
                };
                let axes = match in_axes {
                    Axes::All(a) => vec![a; arity],
                    Axes::Each(v) => v,
                };
                let out = out_axes.unwrap_or(Axes::All(Some(0)));
                Ok(self.build_vmap(callee, &axes, &out, &name, span))
            }
            _ => {
                let Some(arity) = arity.filter(|&n| n > 0) else {
                    return Err(Diagnostic::error(
                        format!("`{which}` needs a function known by name or a lambda, with at least one argument"),
                        span,
                    ));
                };
                let DiffTarget::Static(g, _) = self.resolve_static(callee) else {
                    unreachable!("a known function")
                };
                let (nums, tupled) = match &argnums {
                    None => (vec![0], false),
                    Some((crate::ad::Argnums::One(i), _)) => (vec![*i], false),
                    Some((many, at)) => {
                        if which == "hessian" {
                            return Err(Diagnostic::error(
                                "`hessian` takes one argument number (`argnums = 1`); for mixed second derivatives, nest `jacfwd(jacobian(f, argnums = i), argnums = j)`",
                                *at,
                            ));
                        }
                        (many.which(), true)
                    }
                };
                if let Some(&bad) = nums.iter().find(|&&i| i >= arity) {
                    return Err(Diagnostic::error(
                        format!(
                            "argnums asks for argument {bad} of {}, which takes {arity}",
                            crate::ir::source_phrase(&name)
                        ),
                        argnums.map_or(span, |(_, at)| at),
                    ));
                }
                let mut outs = Vec::new();
                for &i in &nums {
                    outs.push(match which {
                        "jacfwd" => self.build_jacfwd(JacOf::new(g, arity, i), &name, span),
                        "hessian" => {
                            let j = self.build_jacrev(JacOf::new(g, arity, i), &name, span);
                            let jg = self.m.as_graph(j).expect("a graph");
                            self.build_jacfwd(JacOf::new(jg, arity, i), &name, span)
                        }
                        _ => self.build_jacrev(JacOf::new(g, arity, i), &name, span),
                    });
                }
                if !tupled {
                    return Ok(outs[0]);
                }
                // A tuple of Jacobians, one per argument number (JAX's).
                let l = loc(span);
                let (w, ps) = self.graph_of_params(format!("{which}.{name}"), arity, l);
                let items: Vec<NodeId> = outs
                    .into_iter()
                    .map(|j| {
                        let mut inputs = vec![j];
                        inputs.extend(&ps);
                        self.m.add_apply(w, inputs, l)
                    })
                    .collect();
                let out = self.m.add_prim(w, Prim::MakeTuple, &items, l);
                self.m.set_output(w, out);
                Ok(self.graph_ref(w, span))
            }
        }
    }

    fn resolve_static(&self, callee: NodeId) -> DiffTarget {
        match self.m.as_const(callee) {
            Some(Const::Graph(g)) => DiffTarget::Static(*g, String::new()),
            _ => DiffTarget::Value(callee),
        }
    }

    /// A new graph that maps `callee` over the axes `in_axes` of its
    /// arguments, putting the lanes at `out_axes` of the result.
    fn build_vmap(
        &mut self,
        callee: NodeId,
        in_axes: &[Axis],
        out_axes: &Axes,
        name: &str,
        span: Span,
    ) -> NodeId {
        let l = loc(span);
        let (w, ps) = self.graph_of_params(format!("vmap.{name}"), in_axes.len(), l);
        let axis_node = |s: &mut Self, a: Axis| match a {
            Some(i) => s.konst(Const::Int(i), span),
            None => s.konst(Const::Unit, span),
        };
        let axes: Vec<NodeId> = in_axes.iter().map(|&a| axis_node(self, a)).collect();
        let xs = self.m.add_prim(w, Prim::MakeTuple, &ps, l);
        let axes_t = self.m.add_prim(w, Prim::MakeTuple, &axes, l);
        let n = self.m.add_prim(w, Prim::VmapSize, &[xs, axes_t], l);
        let level = self.m.add_prim(w, Prim::VmapLevel, &[xs], l);
        let mut inputs = vec![self.m.add_prim(w, Prim::VmapFn, &[callee, level, n], l)];
        for (p, a) in ps.iter().zip(&axes) {
            inputs.push(self.m.add_prim(w, Prim::VmapIn, &[*p, *a, level, n], l));
        }
        let y = self.m.add_apply(w, inputs, l);
        let out = match out_axes {
            Axes::All(a) => {
                let a = axis_node(self, *a);
                self.m.add_prim(w, Prim::VmapOut, &[y, a, level, n], l)
            }
            Axes::Each(v) => {
                let mut items = Vec::with_capacity(v.len());
                for (i, a) in v.iter().enumerate() {
                    let k = self.konst(Const::Int(i as i64), span);
                    let yi = self.m.add_prim(w, Prim::TupleGet, &[y, k], l);
                    let a = axis_node(self, *a);
                    items.push(self.m.add_prim(w, Prim::VmapOut, &[yi, a, level, n], l));
                }
                self.m.add_prim(w, Prim::MakeTuple, &items, l)
            }
        };
        self.m.set_output(w, out);
        self.graph_ref(w, span)
    }

    /// An empty graph that `ad` builds as `kind` of `source`.
    fn ad_target(
        &mut self,
        source: GraphId,
        kind: AdKind,
        which: &str,
        name: &str,
        span: Span,
    ) -> GraphId {
        let target = self.m.add_graph(format!("{which}.{name}"), loc(span));
        self.ad_requests.push(AdRequest {
            target,
            source,
            kind,
            loc: loc(span),
            name: name.to_string(),
        });
        target
    }

    /// `jacobian(f)`: `x, rest.. -> J` with `J[i.., j..] = d y[i..] / d x[j..]`,
    /// one row per element of `y` by a mapped `vjp`.
    fn build_jacrev(&mut self, of: JacOf, name: &str, span: Span) -> NodeId {
        let l = loc(span);
        let argnum = of.argnum;
        let vjp = self.ad_target(of.g, AdKind::Vjp, "vjp", name, span);
        let (w, ps) = self.jacobian_graph(of, "jacobian", name, l);
        let mut inputs = vec![self.graph_ref(vjp, span)];
        inputs.extend(&ps);
        let r = self.m.add_apply(w, inputs, l);
        let (k0, k1) = (
            self.konst(Const::Int(0), span),
            self.konst(Const::Int(1), span),
        );
        let y = self.m.add_prim(w, Prim::TupleGet, &[r, k0], l);
        let pb = self.m.add_prim(w, Prim::TupleGet, &[r, k1], l);
        // One row: the argument's cotangent for a basis cotangent.
        let row = self.m.add_graph(format!("jacobian.{name}.row"), l);
        let d = self.m.add_param(row, "dy", l);
        let cots = self.m.add_apply(row, vec![pb, d], l);
        let ki = self.konst(Const::Int(argnum as i64), span);
        let first = self.m.add_prim(row, Prim::TupleGet, &[cots, ki], l);
        self.m.set_output(row, first);
        let row_ref = self.graph_ref(row, span);
        let mapped = self.build_vmap(row_ref, &[Some(0)], &Axes::All(Some(0)), name, span);
        let basis = self.m.add_prim(w, Prim::JacBasis, &[y], l);
        let rows = self.m.add_apply(w, vec![mapped, basis], l);
        let rev = self.konst(Const::Bool(false), span);
        let out = self
            .m
            .add_prim(w, Prim::JacReshape, &[rows, y, ps[argnum], rev], l);
        self.m.set_output(w, out);
        self.graph_ref(w, span)
    }

    /// A new graph of `n` parameters `x0, x1, ..`.
    fn graph_of_params(
        &mut self,
        name: String,
        n: usize,
        l: crate::ir::Loc,
    ) -> (GraphId, Vec<NodeId>) {
        let w = self.m.add_graph(name, l);
        let ps = (0..n)
            .map(|i| self.m.add_param(w, format!("x{i}"), l))
            .collect();
        (w, ps)
    }

    /// The graph of `which(f)` (`jacobian`, `jacfwd`) with `f`'s
    /// parameters. The argument a Jacobian is taken with respect to must
    /// be made of floats, as `grad`'s (JAX refuses ints too).
    fn jacobian_graph(
        &mut self,
        of: JacOf,
        which: &str,
        name: &str,
        l: crate::ir::Loc,
    ) -> (GraphId, Vec<NodeId>) {
        let (w, ps) = self.graph_of_params(format!("{which}.{name}"), of.arity, l);
        let which_arg = match of.argnum {
            0 => "the first argument".to_string(),
            i => format!("argument {i}"),
        };
        self.checks.push(Check::DiffArg {
            node: ps[of.argnum],
            what: format!("{which_arg} of `{which}({name})`"),
            loc: l,
        });
        (w, ps)
    }

    /// `jacfwd(f)`: the same Jacobian, one column per element of `x` by a
    /// mapped `jvp`.
    fn build_jacfwd(&mut self, of: JacOf, name: &str, span: Span) -> NodeId {
        let l = loc(span);
        let JacOf { g, arity, argnum } = of;
        let jvp = self.ad_target(g, AdKind::Jvp, "jvp", name, span);
        let (w, ps) = self.jacobian_graph(of, "jacfwd", name, l);
        let primals = self.m.add_prim(w, Prim::MakeTuple, &ps, l);
        let k1 = self.konst(Const::Int(1), span);
        // One column: the output's tangent for a basis tangent of `x`.
        let col = self.m.add_graph(format!("jacfwd.{name}.col"), l);
        let t = self.m.add_param(col, "dx", l);
        let mut tangents = Vec::with_capacity(arity);
        for i in 0..arity {
            tangents.push(if i == argnum {
                t
            } else {
                self.m.add_prim(col, Prim::Zero, &[], l)
            });
        }
        let tangents = self.m.add_prim(col, Prim::MakeTuple, &tangents, l);
        let jvp_ref = self.graph_ref(jvp, span);
        let r = self.m.add_apply(col, vec![jvp_ref, primals, tangents], l);
        let dy = self.m.add_prim(col, Prim::TupleGet, &[r, k1], l);
        self.m.set_output(col, dy);
        let col_ref = self.graph_ref(col, span);
        let mapped = self.build_vmap(col_ref, &[Some(0)], &Axes::All(Some(-1)), name, span);
        let mut inputs = vec![self.graph_ref(g, span)];
        inputs.extend(&ps);
        let y = self.m.add_apply(w, inputs, l);
        let basis = self.m.add_prim(w, Prim::JacBasis, &[ps[argnum]], l);
        let cols = self.m.add_apply(w, vec![mapped, basis], l);
        let fwd = self.konst(Const::Bool(true), span);
        let out = self
            .m
            .add_prim(w, Prim::JacReshape, &[cols, y, ps[argnum], fwd], l);
        self.m.set_output(w, out);
        self.graph_ref(w, span)
    }

    /// `hvp(f, x, v)`: `jvp(grad(f), (x,), (v,))`'s tangent, the product of
    /// `f`'s Hessian at `x` with `v`.
    fn lower_hvp(
        &mut self,
        module: usize,
        cx: &mut Cx,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        if args.len() != 3 || args.iter().any(|a| a.name.is_some()) {
            return Err(Diagnostic::error(
                "`hvp` takes the function, a point `x` and a vector `v`: `hvp(f, x, v)`",
                span,
            ));
        }
        let arg = |e: Expr| ast::Arg {
            name: None,
            span: e.span,
            value: e,
        };
        let name = |n: &str| Expr::new(ExprKind::Name(n.into()), span);
        let g = Expr::new(
            ExprKind::Call {
                callee: name("grad"),
                args: vec![args[0].clone()],
            },
            span,
        );
        let x = Expr::new(ExprKind::Tuple(vec![args[1].value.clone()]), args[1].span);
        let v = Expr::new(ExprKind::Tuple(vec![args[2].value.clone()]), args[2].span);
        let pair = self.lower_diff(
            module,
            cx,
            "jvp",
            &[arg(g), arg(x), arg(v)],
            span,
            Called::AsDefined,
        )?;
        Ok(self.tuple_get(cx, pair, 1, span))
    }
}
