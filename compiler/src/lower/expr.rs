//! Lowering of expressions: names, literals, lambdas, calls of
//! functions, primitives and function values, and the differentiation
//! operators (`grad`, `jvp`, ...).

use super::*;

impl Lowerer<'_> {
    pub(super) fn lower_expr(&mut self, module: usize, cx: &mut Cx, e: &Expr) -> R<NodeId> {
        self.enter(e.span)?;
        let r = self.lower_expr_inner(module, cx, e);
        self.leave();
        r
    }

    pub(super) fn lower_expr_inner(&mut self, module: usize, cx: &mut Cx, e: &Expr) -> R<NodeId> {
        let span = e.span;
        match &*e.kind {
            ExprKind::Int(i) => Ok(self.konst(Const::Int(*i), span)),
            ExprKind::Float { value, .. } => Ok(self.konst(Const::Float(*value), span)),
            ExprKind::Bool(b) => Ok(self.konst(Const::Bool(*b), span)),
            ExprKind::Str(s) => Ok(self.konst(Const::Str(Arc::from(s.as_str())), span)),
            ExprKind::Name(n) => self.lower_name(module, cx, n, span),
            ExprKind::Tuple(es) => {
                if es.is_empty() {
                    return Ok(self.unit(span));
                }
                let items = self.lower_all(module, cx, es)?;
                Ok(self.prim(cx, Prim::MakeTuple, &items, span))
            }
            ExprKind::Record(fields) => {
                let mut args = Vec::new();
                let mut seen = HashSet::new();
                for f in fields {
                    if !seen.insert(f.name.name.clone()) {
                        return Err(Diagnostic::error(
                            format!("field `{}` is given twice", f.name.name),
                            f.name.span,
                        ));
                    }
                    let v = self.lower_expr(module, cx, &f.value)?;
                    args.push(self.konst(Const::Str(Arc::from(f.name.name.as_str())), f.name.span));
                    args.push(v);
                }
                Ok(self.prim(cx, Prim::MakeRecord, &args, span))
            }
            ExprKind::Tensor(es) => {
                let items = self.lower_all(module, cx, es)?;
                Ok(self.prim(cx, Prim::TensorLiteral, &items, span))
            }
            ExprKind::Unary { op, operand } => {
                match (op, &*operand.kind) {
                    (ast::UnOp::Neg, ExprKind::Int(i)) => {
                        return Ok(self.konst(Const::Int(i.wrapping_neg()), span))
                    }
                    (ast::UnOp::Neg, ExprKind::Float { value, .. }) => {
                        return Ok(self.konst(Const::Float(-value), span))
                    }
                    _ => {}
                }
                let x = self.lower_expr(module, cx, operand)?;
                let p = match op {
                    ast::UnOp::Neg => Prim::Neg,
                    ast::UnOp::Not => Prim::Not,
                };
                Ok(self.prim(cx, p, &[x], span))
            }
            ExprKind::Binary { op, lhs, rhs, .. } => {
                let a = self.lower_expr(module, cx, lhs)?;
                let b = self.lower_expr(module, cx, rhs)?;
                Ok(self.prim(cx, binop_prim(*op), &[a, b], span))
            }
            ExprKind::Call { callee, args } => self.lower_call(module, cx, callee, args, span),
            ExprKind::Index { base, indices } => {
                let x = self.lower_expr(module, cx, base)?;
                self.lower_index_read(module, cx, x, indices, span)
            }
            ExprKind::Field { base, name } => {
                if let ExprKind::Name(m) = &*base.kind {
                    if self.lookup(m).is_none() {
                        if let Some(target) = self.mods[module].imports.get(m).copied() {
                            return self.module_member_value(target, m, name, span);
                        }
                    }
                }
                let r = self.lower_expr(module, cx, base)?;
                let n = self.konst(Const::Str(Arc::from(name.name.as_str())), name.span);
                Ok(self.prim(cx, Prim::RecordGet, &[r, n], span))
            }
            ExprKind::TupleIndex { base, index, .. } => {
                let t = self.lower_expr(module, cx, base)?;
                Ok(self.tuple_get(cx, t, *index as usize, span))
            }
            ExprKind::Lambda { params, body } => self.lower_lambda(module, cx, params, body, span),
            ExprKind::Block(b) => self.lower_block_value(module, cx, b),
            ExprKind::If(i) => self.lower_if_value(module, cx, i, span),
            ExprKind::Range { .. } => Err(Diagnostic::error(
                "a range `a..b` may appear only in a `for` header or as the argument of `progress`",
                span,
            )),
            ExprKind::Error => Err(Diagnostic::error("invalid expression", span)),
        }
    }

    pub(super) fn lower_all(&mut self, module: usize, cx: &mut Cx, es: &[Expr]) -> R<Vec<NodeId>> {
        es.iter().map(|e| self.lower_expr(module, cx, e)).collect()
    }

    /// Function `name` of module `target` (imported as `alias`).
    fn module_member(&self, target: usize, alias: &str, name: &ast::Ident) -> R<FnKey> {
        match self.mods[target].fns.get(&name.name) {
            Some(&item) => Ok(FnKey {
                module: target,
                item,
            }),
            None => Err(Diagnostic::error(
                format!("module `{alias}` has no function `{}`", name.name),
                name.span,
            )),
        }
    }

    pub(super) fn module_member_value(
        &mut self,
        target: usize,
        alias: &str,
        name: &ast::Ident,
        span: Span,
    ) -> R<NodeId> {
        let key = self.module_member(target, alias, name)?;
        if self.effectful.contains(&key) {
            return Err(effectful_value_error(&name.name, span));
        }
        let g = self.fn_graph(key);
        Ok(self.graph_ref(g, span))
    }

    pub(super) fn lower_name(
        &mut self,
        module: usize,
        cx: &mut Cx,
        n: &str,
        span: Span,
    ) -> R<NodeId> {
        match self.lookup(n).cloned() {
            Some(Binding::Val(v)) => return Ok(v),
            Some(Binding::Var(v)) => {
                return cx.vals.get(&v).copied().ok_or_else(|| {
                    Diagnostic::error(format!("variable `{n}` is not available here"), span)
                })
            }
            Some(Binding::LocalFn(f)) => {
                if f.effectful {
                    return Err(effectful_value_error(n, span));
                }
                return Ok(self.graph_ref(f.graph, span));
            }
            None => {}
        }
        if let Some(key) = self.global_fn(module, n) {
            if self.effectful.contains(&key) {
                return Err(effectful_value_error(n, span));
            }
            let g = self.fn_graph(key);
            return Ok(self.graph_ref(g, span));
        }
        if let Some(d) = DType::from_name(n) {
            return Ok(self.konst(Const::DType(d), span));
        }
        // Constants, as weakly typed float literals (names in scope and
        // functions of the same name come first).
        let constant = match n {
            "pi" => Some(std::f64::consts::PI),
            "inf" => Some(f64::INFINITY),
            "nan" => Some(f64::NAN),
            _ => None,
        };
        if let Some(c) = constant {
            return Ok(self.konst(Const::Float(c), span));
        }
        if let Some(p) = self.prim_named(module, n) {
            if p.category() == prim::Category::Io {
                return Err(effectful_value_error(n, span));
            }
            let g = self.prim_value(p, span);
            return Ok(self.graph_ref(g, span));
        }
        if self.mods[module].imports.contains_key(n) {
            return Err(Diagnostic::error(
                format!("module `{n}` is not a value; use one of its members, as in `{n}.name`"),
                span,
            ));
        }
        Err(self.unknown_name(module, n, span))
    }

    /// The error for a name that is no value here; a transform's name
    /// (`grad`, `hvp`) is one only when called.
    pub(super) fn unknown_name(&self, module: usize, n: &str, span: Span) -> Diagnostic {
        if DIFF_NAMES.contains(&n) || vmap::VMAP_NAMES.contains(&n) {
            return Diagnostic::error(
                format!("`{n}` is a transform, not a value: call it with the function, as in `{n}(f)`, or wrap that call in a lambda"),
                span,
            );
        }
        let mut d = Diagnostic::error(format!("unknown name `{n}`"), span)
            .with_label("not found in this scope");
        let mut candidates: Vec<String> = self
            .scopes
            .iter()
            .flat_map(|s| s.iter().map(|(k, _)| k.clone()))
            .collect();
        candidates.extend(self.mods[module].fns.keys().cloned());
        // The transforms are names too (`grd` is `grad`, not `pad`).
        candidates.extend(DIFF_NAMES.iter().map(|s| s.to_string()));
        candidates.extend(vmap::VMAP_NAMES.iter().map(|s| s.to_string()));
        if let Some(p) = self.prelude {
            candidates.extend(self.mods[p].fns.keys().cloned());
        }
        // Only the primitives this module may call: suggesting an internal
        // one (`cast`, `gadd`) would name something the user cannot use.
        candidates.extend(
            Prim::all()
                .iter()
                .filter(|p| self.prim_named(module, p.name()).is_some())
                .map(|p| p.name().to_string()),
        );
        if let Some(best) = candidates
            .iter()
            .filter(|c| c.as_str() != n)
            .filter(|c| edit_distance(c, n) <= 2.min(n.len().saturating_sub(1)).max(1))
            // the same on every run: ties go to the first in name order
            .min_by_key(|c| (edit_distance(c, n), c.to_string()))
        {
            d = d.with_note(format!("a similar name exists: `{best}`"));
        }
        d
    }

    /// A graph that calls primitive `p` with its required parameters, used
    /// when a primitive is passed as a value (`tree_map(exp, t)`).
    pub(super) fn prim_value(&mut self, p: Prim, span: Span) -> GraphId {
        if let Some(g) = self.prim_values.get(&p) {
            return *g;
        }
        let info = p.info();
        let g = self.m.add_graph(format!("prim.{}", info.name), Loc::NONE);
        let mut args = Vec::new();
        for param in info.params {
            match param.default {
                None => args.push(self.m.add_param(g, param.name, Loc::NONE)),
                Some(d) => args.push(self.m.add_const(default_const(d), Loc::NONE)),
            }
        }
        let out = self.m.add_prim(g, p, &args, loc(span));
        self.m.set_output(g, out);
        self.prim_values.insert(p, g);
        g
    }

    pub(super) fn lower_lambda(
        &mut self,
        module: usize,
        cx: &mut Cx,
        params: &[ast::Param],
        body: &Expr,
        span: Span,
    ) -> R<NodeId> {
        let parent = self.m.graph(cx.graph).name.clone();
        let base = parent.split('.').next().unwrap_or(&parent).to_string();
        let g = self.m.add_graph(format!("{base}.lambda"), loc(span));
        let def = FnDef {
            name: ast::Ident {
                name: "lambda".into(),
                span,
            },
            params: params.to_vec(),
            ret: None,
            body: body.clone(),
            span,
        };
        self.lower_fn_body(module, g, &def, false, cx.vals.clone())?;
        Ok(self.graph_ref(g, span))
    }

    // ----- calls ---------------------------------------------------------

    /// The components of an index `x[c0, c1, ..]`: an int expression, or
    /// a slice `make_tuple(lo, hi)` with `()` for an omitted bound.
    fn lower_index_comps(
        &mut self,
        module: usize,
        cx: &mut Cx,
        indices: &[ast::IndexComp],
    ) -> R<Vec<NodeId>> {
        let mut comps = Vec::with_capacity(indices.len());
        for c in indices {
            match c {
                ast::IndexComp::Expr(i) => comps.push(self.lower_expr(module, cx, i)?),
                ast::IndexComp::Slice { lo, hi, span } => {
                    let lo = match lo {
                        Some(l) => self.lower_expr(module, cx, l)?,
                        None => self.unit(*span),
                    };
                    let hi = match hi {
                        Some(h) => self.lower_expr(module, cx, h)?,
                        None => self.unit(*span),
                    };
                    // `e : e + c` also carries its length `c`, which
                    // stays a constant where `e` is not, even through the
                    // parameters of differentiated code (see `docs/ir.md`).
                    let len = crate::ir::analysis::window_len(&self.m, lo, hi);
                    let parts: &[NodeId] = match &len {
                        Some(c) => &[lo, hi, *c],
                        None => &[lo, hi],
                    };
                    comps.push(self.prim(cx, Prim::MakeTuple, parts, *span));
                }
            }
        }
        Ok(comps)
    }

    /// `x.at[idx].set(v)` and its siblings (`add mul min max`): the update
    /// primitive applied to `x`, the components of `idx` as one tuple, and
    /// `v` (`v[i] = e` statements are parsed into this form).
    fn lower_at_update(
        &mut self,
        module: usize,
        cx: &mut Cx,
        at: AtUpdate<'_>,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        let method = &at.method.name;
        let p = match method.as_str() {
            "set" => Prim::IndexSet,
            "add" => Prim::IndexAdd,
            "mul" => Prim::IndexMul,
            "min" => Prim::IndexMin,
            "max" => Prim::IndexMax,
            other => {
                return Err(Diagnostic::error(
                    format!("unknown update `.at[..].{other}`"),
                    at.method.span,
                )
                .with_note("the updates are `set`, `add`, `mul`, `min` and `max`"))
            }
        };
        let x = self.lower_expr(module, cx, at.x)?;
        let comps = self.lower_index_comps(module, cx, at.indices)?;
        let idx = self.prim(cx, Prim::MakeTuple, &comps, at.idx_span);
        let what = format!(".at[..].{method}");
        let v = self.positional_only(module, cx, args, 1, &what, span)?;
        // The call's span starts at `x`: errors of the update (an index
        // out of range) point there, as those of a read do.
        Ok(self.prim(cx, p, &[x, idx, v[0]], span))
    }

    pub(super) fn lower_call(
        &mut self,
        module: usize,
        cx: &mut Cx,
        callee: &Expr,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        if let Some(at) = AtUpdate::of(callee) {
            return self.lower_at_update(module, cx, at, args, span);
        }
        match &*callee.kind {
            ExprKind::Name(n) => match self.lookup(n).cloned() {
                Some(Binding::LocalFn(f)) => {
                    let g = f.graph;
                    let effectful = f.effectful;
                    return self.call_def(module, cx, g, &f.def, effectful, args, span);
                }
                Some(_) => {}
                None => {
                    if let Some(key) = self.global_fn(module, n) {
                        let g = self.fn_graph(key);
                        let def = self.fn_def(key);
                        let eff = self.effectful.contains(&key);
                        return self.call_def(module, cx, g, &def, eff, args, span);
                    }
                    if let Some(d) = DType::from_name(n) {
                        let x = self.positional_only(module, cx, args, 1, n, span)?;
                        let dt = self.konst(Const::DType(d), callee.span);
                        return Ok(self.prim(cx, Prim::Cast, &[x[0], dt], span));
                    }
                    if DIFF_NAMES.contains(&n.as_str()) {
                        return self.lower_diff(module, cx, n, args, span, Called::AsDefined);
                    }
                    if vmap::VMAP_NAMES.contains(&n.as_str()) {
                        return self.lower_vmap(module, cx, n, args, span, None);
                    }
                    if n == "einsum" {
                        return self.lower_einsum(module, cx, args, span);
                    }
                    if let Some(p) = self.prim_named(module, n) {
                        return self.call_prim(module, cx, p, args, span);
                    }
                    if n == "progress" {
                        return Err(Diagnostic::error(
                            "`progress(a..b)` may appear only as the range of a `for` loop",
                            span,
                        ));
                    }
                }
            },
            ExprKind::Field { base, name } => {
                if let ExprKind::Name(m) = &*base.kind {
                    if self.lookup(m).is_none() {
                        if let Some(target) = self.mods[module].imports.get(m).copied() {
                            let key = self.module_member(target, m, name)?;
                            let g = self.fn_graph(key);
                            let def = self.fn_def(key);
                            let eff = self.effectful.contains(&key);
                            return self.call_def(module, cx, g, &def, eff, args, span);
                        }
                    }
                }
            }
            _ => {}
        }
        // `grad(f)(x, k = ..)`: the gradient takes f's parameters, so its
        // call resolves keywords and defaults against f's definition.
        if let ExprKind::Call {
            callee: inner,
            args: inner_args,
        } = &*callee.kind
        {
            if let ExprKind::Name(d) = &*inner.kind {
                let is_grad = (d == "grad" || d == "value_and_grad") && self.lookup(d).is_none();
                if let (true, Some(first)) = (is_grad, inner_args.first()) {
                    if let Some(def) = self.static_fn_def(module, &first.value) {
                        let g = self.lower_expr(module, cx, callee)?;
                        let Some(Const::Graph(target)) = self.m.as_const(g).cloned() else {
                            unreachable!("grad(..) lowers to a graph constant")
                        };
                        return self.call_def(module, cx, target, &def, false, args, span);
                    }
                }
            }
        }
        // `jacobian(f)(x)`: the transform learns how many arguments its
        // result gets (for `f`'s defaults).
        let mut transformed = None;
        if let ExprKind::Call {
            callee: inner,
            args: inner_args,
        } = &*callee.kind
        {
            if let ExprKind::Name(d) = &*inner.kind {
                if vmap::VMAP_NAMES.contains(&d.as_str()) && d != "hvp" && self.lookup(d).is_none()
                {
                    let n = args.iter().filter(|a| a.name.is_none()).count();
                    transformed =
                        Some(self.lower_vmap(module, cx, d, inner_args, callee.span, Some(n))?);
                }
            }
        }
        let f = match transformed {
            Some(f) => f,
            None => self.lower_expr(module, cx, callee)?,
        };
        // A function with defaults known here, through a name or a nest of
        // `grad`s: its definition resolves the arguments.
        if let Some(Const::Graph(g)) = self.m.as_const(f).cloned() {
            if let Some((def, key)) = self.with_defaults.get(&g).cloned() {
                let effectful = key.is_some_and(|k| self.effectful.contains(&k));
                return self.call_def(module, cx, g, &def, effectful, args, span);
            }
        }
        let mut vals = Vec::new();
        for a in args {
            if let Some(k) = &a.name {
                return Err(Diagnostic::error(
                    format!(
                        "keyword argument `{}` needs a function known by name; \
                         this call goes through a value",
                        k.name
                    ),
                    k.span,
                ));
            }
            vals.push(self.lower_expr(module, cx, &a.value)?);
        }
        self.call(cx, f, vals, false, span)
    }

    /// `grad(f, argnums = ..)`, `value_and_grad(f, ..)` (function values),
    /// `vjp(f, x..)` and `jvp(f, (x..), (dx..))` (calls). For `grad` and
    /// `value_and_grad`, `called` says how the gradient will be called
    /// (see [`Self::resolve_fn_called`]).
    pub(super) fn lower_diff(
        &mut self,
        module: usize,
        cx: &mut Cx,
        which: &str,
        args: &[ast::Arg],
        span: Span,
        called: Called,
    ) -> R<NodeId> {
        let Some(first) = args.first().filter(|a| a.name.is_none()) else {
            return Err(Diagnostic::error(
                format!("`{which}` needs the function to differentiate as its first argument"),
                span,
            ));
        };
        let called = match which {
            "vjp" => Called::With(Some(
                args.iter().skip(1).filter(|a| a.name.is_none()).count(),
            )),
            "jvp" => Called::With(args.get(1).and_then(|a| match &*a.value.kind {
                ExprKind::Tuple(items) => Some(items.len()),
                _ => None,
            })),
            _ => called,
        };
        let target_fn = self.resolve_fn_called(module, cx, &first.value, called)?;
        let mut argnums = None;
        let mut rest = Vec::new();
        for a in &args[1..] {
            match &a.name {
                Some(k) if k.name == "argnums" && which != "vjp" && which != "jvp" => {
                    argnums = Some(static_argnums(&a.value)?);
                }
                Some(k) => {
                    return Err(Diagnostic::error(
                        format!("`{which}` has no parameter named `{}`", k.name),
                        k.span,
                    ))
                }
                None => rest.push(a),
            }
        }
        let kind = match which {
            "grad" | "value_and_grad" => {
                if !rest.is_empty() {
                    return Err(Diagnostic::error(
                        format!("`{which}(f)` takes only the function; call the result: `{which}(f)(x)`"),
                        span,
                    ));
                }
                AdKind::Grad {
                    argnums: argnums.clone().unwrap_or(crate::ad::Argnums::One(0)),
                    with_value: which == "value_and_grad",
                }
            }
            "vjp" => AdKind::Vjp,
            _ => {
                if rest.len() != 2 {
                    return Err(Diagnostic::error(
                        "`jvp` takes the function, a tuple of primals and a tuple of tangents",
                        span,
                    ));
                }
                AdKind::Jvp
            }
        };
        let (source, name) = match target_fn {
            DiffTarget::Static(g, name) => (g, name),
            DiffTarget::Value(f) => {
                // A function value: differentiated when the program runs.
                self.dynamic_ad = true;
                let nums = argnums.as_ref().map(|a| a.encode()).unwrap_or_default();
                let args = [
                    f,
                    self.konst(Const::Str(which.into()), span),
                    self.konst(Const::Str(nums.into()), span),
                    self.konst(Const::Int(0), span),
                ];
                let d = self.m.add_prim(cx.graph, Prim::AdDyn, &args, loc(span));
                if which == "grad" || which == "value_and_grad" {
                    return Ok(d);
                }
                let mut vals = Vec::new();
                for a in rest {
                    vals.push(self.lower_expr(module, cx, &a.value)?);
                }
                return self.call(cx, d, vals, false, span);
            }
        };
        let target = self.m.add_graph(format!("{which}.{name}"), loc(span));
        if which == "grad" || which == "value_and_grad" {
            // The gradient takes the function's parameters.
            if let Some((def, _)) = self.with_defaults.get(&source).cloned() {
                self.with_defaults.insert(target, (def, None));
            }
        }
        let fname = name.clone();
        self.ad_requests.push(AdRequest {
            target,
            source,
            kind,
            loc: loc(span),
            name,
        });
        let callee = self.graph_ref(target, span);
        if which == "grad" || which == "value_and_grad" {
            return Ok(callee);
        }
        let mut vals: Vec<NodeId> = Vec::new();
        for (k, a) in rest.iter().enumerate() {
            let v = self.lower_expr(module, cx, &a.value)?;
            if which == "jvp" {
                let what = if k == 0 { "primals" } else { "tangents" };
                self.checks.push(Check::JvpTuple {
                    node: v,
                    graph: source,
                    primals: if k == 1 { vals.first().copied() } else { None },
                    what,
                    name: fname.clone(),
                    span: a.value.span,
                });
            }
            vals.push(v);
        }
        self.call(cx, callee, vals, false, span)
    }

    /// `x[indices]`. `None` adds an axis of size 1 where it stands
    /// (NumPy's `x[:, None]`): the index without it, then `expand_dims` at
    /// its place among the result's axes.
    fn lower_index_read(
        &mut self,
        module: usize,
        cx: &mut Cx,
        x: NodeId,
        indices: &[ast::IndexComp],
        span: Span,
    ) -> R<NodeId> {
        let is_new_axis = |c: &ast::IndexComp| {
            matches!(c, ast::IndexComp::Expr(e)
                if matches!(&*e.kind, ExprKind::Name(n) if n == "None"))
        };
        let new_axes = if self.lookup("None").is_none() {
            let mut out = 0i64;
            let mut axes = Vec::new();
            for c in indices.iter() {
                if is_new_axis(c) {
                    axes.push(out);
                    out += 1;
                } else if matches!(c, ast::IndexComp::Slice { .. }) {
                    out += 1;
                }
            }
            axes
        } else {
            Vec::new()
        };
        let kept: std::borrow::Cow<[ast::IndexComp]> = if new_axes.is_empty() {
            indices.into()
        } else {
            indices
                .iter()
                .filter(|c| !is_new_axis(c))
                .cloned()
                .collect()
        };
        let mut v = if kept.is_empty() {
            x
        } else {
            let mut args = vec![x];
            args.extend(self.lower_index_comps(module, cx, &kept)?);
            self.prim(cx, Prim::Index, &args, span)
        };
        for a in new_axes {
            let axis = self.konst(Const::Int(a), span);
            v = self.prim(cx, Prim::ExpandDims, &[v, axis], span);
        }
        Ok(v)
    }

    /// The definition of the function `e` names, a global or local one or
    /// a module's member (`nn.mlp`).
    fn named_fn_def(&mut self, module: usize, e: &Expr) -> Option<Rc<FnDef>> {
        if let ExprKind::Field { base, name } = &*e.kind {
            let ExprKind::Name(m) = &*base.kind else {
                return None;
            };
            if self.lookup(m).is_some() {
                return None;
            }
            let target = self.mods[module].imports.get(m).copied()?;
            let key = self.module_member(target, m, name).ok()?;
            return Some(self.fn_def(key));
        }
        self.static_fn_def(module, e)
    }

    /// The definition of a function named by `e`, when it is one (for
    /// keyword arguments and defaults).
    pub(super) fn static_fn_def(&self, module: usize, e: &Expr) -> Option<Rc<FnDef>> {
        let ExprKind::Name(n) = &*e.kind else {
            return None;
        };
        match self.lookup(n) {
            Some(Binding::LocalFn(f)) => Some(f.def.clone()),
            Some(_) => None,
            None => self.global_fn(module, n).map(|k| self.fn_def(k)),
        }
    }

    /// What `grad(e)` differentiates: the graph of a function known at
    /// compile time (a function name, a lambda, a module member, another
    /// `grad(..)`), or else the function value `e` evaluates to.
    pub(super) fn resolve_fn(&mut self, module: usize, cx: &mut Cx, e: &Expr) -> R<DiffTarget> {
        self.resolve_fn_called(module, cx, e, Called::AsDefined)
    }

    /// [`Self::resolve_fn`] for a transform whose result is called with
    /// `called` positional arguments: a function with default parameters
    /// becomes a lambda of that many (its required ones when the count is
    /// not known) that calls it, so that `jacobian(softmax)(x)` and
    /// `vmap(nn.mlp, in_axes = (None, 0))(p, x)` use the defaults as a
    /// direct call would.
    pub(super) fn resolve_fn_called(
        &mut self,
        module: usize,
        cx: &mut Cx,
        e: &Expr,
        called: Called,
    ) -> R<DiffTarget> {
        if let (Called::With(_), ExprKind::Call { callee, args }) = (called, &*e.kind) {
            if let ExprKind::Name(d) = &*callee.kind {
                if (d == "grad" || d == "value_and_grad") && self.lookup(d).is_none() {
                    let node = self.lower_diff(module, cx, d, args, e.span, called)?;
                    return Ok(match self.m.as_const(node) {
                        Some(Const::Graph(g)) => {
                            DiffTarget::Static(*g, self.m.graph(*g).name.clone())
                        }
                        _ => DiffTarget::Value(node),
                    });
                }
            }
        }
        if let (Called::With(n), Some(def)) = (called, self.named_fn_def(module, e)) {
            let required = def.params.iter().filter(|p| p.default.is_none()).count();
            let total = def.params.len();
            let keep = n.unwrap_or(required).clamp(required, total);
            if keep < total {
                let span = e.span;
                let names: Vec<String> = (0..keep).map(|i| format!("__default_arg{i}")).collect();
                let params = names
                    .iter()
                    .map(|n| ast::Param {
                        name: ast::Ident {
                            name: n.clone(),
                            span,
                        },
                        ty: None,
                        default: None,
                        span,
                    })
                    .collect();
                let args = names
                    .iter()
                    .map(|n| ast::Arg {
                        name: None,
                        span,
                        value: Expr::new(ExprKind::Name(n.clone()), span),
                    })
                    .collect();
                let body = Expr::new(
                    ExprKind::Call {
                        callee: e.clone(),
                        args,
                    },
                    span,
                );
                let lambda = Expr::new(ExprKind::Lambda { params, body }, span);
                let name = def.name.name.clone();
                return Ok(match self.resolve_fn(module, cx, &lambda)? {
                    DiffTarget::Static(g, _) => DiffTarget::Static(g, name),
                    v => v,
                });
            }
        }
        let io = |n: &str| {
            let mut d = Diagnostic::error(
                format!("IO inside a transformed function: `{n}` prints or reads/writes files"),
                e.span,
            )
            .with_note(
                "`grad`, `jvp`, `vjp` and `vmap` take functions without IO: move the IO out of the function",
            );
            // Show the IO itself when the function is a global one.
            if let Some(def) = self.global_fn(module, n).map(|k| self.fn_def(k)) {
                if let Some(at) = first_io_call(&def.body) {
                    d = d.with_secondary(at, "the IO happens here");
                }
            }
            d
        };
        match &*e.kind {
            ExprKind::Name(n) => {
                match self.lookup(n).cloned() {
                    Some(Binding::LocalFn(f)) => {
                        if f.effectful {
                            return Err(io(n));
                        }
                        return Ok(DiffTarget::Static(f.graph, n.clone()));
                    }
                    Some(Binding::Val(v)) => {
                        return Ok(match self.m.as_const(v) {
                            Some(Const::Graph(g)) => DiffTarget::Static(*g, n.clone()),
                            _ => DiffTarget::Value(v),
                        })
                    }
                    Some(Binding::Var(v)) => {
                        return match cx.vals.get(&v).copied() {
                            Some(x) => Ok(match self.m.as_const(x) {
                                Some(Const::Graph(g)) => DiffTarget::Static(*g, n.clone()),
                                _ => DiffTarget::Value(x),
                            }),
                            None => Ok(DiffTarget::Value(self.lower_expr(module, cx, e)?)),
                        }
                    }
                    None => {}
                }
                if let Some(key) = self.global_fn(module, n) {
                    if self.effectful.contains(&key) {
                        return Err(io(n));
                    }
                    return Ok(DiffTarget::Static(self.fn_graph(key), n.clone()));
                }
                if let Some(p) = self.prim_named(module, n) {
                    if p.category() != prim::Category::Io {
                        return Ok(DiffTarget::Static(self.prim_value(p, e.span), n.clone()));
                    }
                    return Err(io(n));
                }
                Err(self.unknown_name(module, n, e.span))
            }
            ExprKind::Field { .. } | ExprKind::Lambda { .. } | ExprKind::Call { .. } => {
                let node = self.lower_expr(module, cx, e)?;
                let name = match &*e.kind {
                    ExprKind::Field { name, .. } => name.name.clone(),
                    ExprKind::Lambda { .. } => "lambda".to_string(),
                    // A transform (`grad(f)`) is named by its graph.
                    _ => match self.m.as_const(node) {
                        Some(Const::Graph(g)) => self.m.graph(*g).name.clone(),
                        _ => "fn".to_string(),
                    },
                };
                Ok(match self.m.as_const(node) {
                    Some(Const::Graph(g)) => DiffTarget::Static(*g, name),
                    _ => DiffTarget::Value(node),
                })
            }
            _ => Ok(DiffTarget::Value(self.lower_expr(module, cx, e)?)),
        }
    }

    pub(super) fn positional_only(
        &mut self,
        module: usize,
        cx: &mut Cx,
        args: &[ast::Arg],
        n: usize,
        what: &str,
        span: Span,
    ) -> R<Vec<NodeId>> {
        if args.len() != n || args.iter().any(|a| a.name.is_some()) {
            return Err(Diagnostic::error(
                format!(
                    "`{what}` takes {n} positional argument{}, got {}",
                    if n == 1 { "" } else { "s" },
                    args.len()
                ),
                span,
            ));
        }
        args.iter()
            .map(|a| self.lower_expr(module, cx, &a.value))
            .collect()
    }

    /// A direct call of a function known by name: keyword arguments and
    /// defaults are resolved against its definition.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn call_def(
        &mut self,
        module: usize,
        cx: &mut Cx,
        g: GraphId,
        def: &FnDef,
        effectful: bool,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        let name = &def.name.name;
        let mut slots: Vec<Option<NodeId>> = vec![None; def.params.len()];
        let mut positional = 0;
        if let Some(bad) = positional_after_keyword(args) {
            return Err(bad);
        }
        for a in args {
            let idx = match &a.name {
                None => {
                    if positional >= def.params.len() {
                        return Err(Diagnostic::error(
                            format!(
                                "`{name}` takes {} argument{}, got {}",
                                def.params.len(),
                                if def.params.len() == 1 { "" } else { "s" },
                                args.len()
                            ),
                            span,
                        )
                        .with_secondary(def.name.span, "defined here"));
                    }
                    positional += 1;
                    positional - 1
                }
                Some(k) => match def.params.iter().position(|p| p.name.name == k.name) {
                    Some(i) => i,
                    None => {
                        return Err(Diagnostic::error(
                            format!("`{name}` has no parameter named `{}`", k.name),
                            k.span,
                        )
                        .with_secondary(def.name.span, "defined here"))
                    }
                },
            };
            if slots[idx].is_some() {
                return Err(Diagnostic::error(
                    format!("argument `{}` is given twice", def.params[idx].name.name),
                    a.span,
                ));
            }
            slots[idx] = Some(self.lower_expr(module, cx, &a.value)?);
        }
        let mut vals = Vec::new();
        for (i, s) in slots.into_iter().enumerate() {
            match s {
                Some(v) => vals.push(v),
                None => match &def.params[i].default {
                    Some(d) => vals.push(self.lower_expr(module, cx, d)?),
                    None => {
                        return Err(Diagnostic::error(
                            format!(
                                "missing argument `{}` in call to `{name}`",
                                def.params[i].name.name
                            ),
                            span,
                        )
                        .with_secondary(def.name.span, "defined here"))
                    }
                },
            }
        }
        let callee = self.graph_ref(g, span);
        self.call(cx, callee, vals, effectful, span)
    }

    pub(super) fn call_prim(
        &mut self,
        module: usize,
        cx: &mut Cx,
        p: Prim,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        let info = p.info();
        let is_io = info.category == prim::Category::Io;
        // The IO token is supplied here, not by the caller.
        let params: Vec<_> = info.params.iter().skip(usize::from(is_io)).collect();
        let mut slots: Vec<Option<NodeId>> = vec![None; params.len()];
        let mut extra = Vec::new();
        let mut positional = 0;
        if let Some(bad) = positional_after_keyword(args) {
            return Err(bad);
        }
        for a in args {
            match &a.name {
                None => {
                    if positional < params.len() {
                        slots[positional] = Some(self.lower_expr(module, cx, &a.value)?);
                    } else if info.variadic {
                        extra.push(self.lower_expr(module, cx, &a.value)?);
                    } else {
                        return Err(Diagnostic::error(
                            format!(
                                "`{}` takes at most {} argument{}, got {}",
                                info.name,
                                params.len(),
                                if params.len() == 1 { "" } else { "s" },
                                args.len()
                            ),
                            span,
                        ));
                    }
                    positional += 1;
                }
                Some(k) => {
                    let Some(i) = params.iter().position(|q| q.name == k.name) else {
                        let names: Vec<_> = params.iter().map(|q| q.name).collect();
                        return Err(Diagnostic::error(
                            format!("`{}` has no parameter named `{}`", info.name, k.name),
                            k.span,
                        )
                        .with_note(format!("its parameters are: {}", names.join(", "))));
                    };
                    if slots[i].is_some() {
                        return Err(Diagnostic::error(
                            format!("argument `{}` is given twice", k.name),
                            a.span,
                        ));
                    }
                    slots[i] = Some(self.lower_expr(module, cx, &a.value)?);
                }
            }
        }
        let mut vals = Vec::new();
        for (i, s) in slots.into_iter().enumerate() {
            match s {
                Some(v) => vals.push(v),
                None => match params[i].default {
                    Some(d) => vals.push(self.konst(default_const(d), span)),
                    None => {
                        return Err(Diagnostic::error(
                            format!(
                                "missing argument `{}` in call to `{}`",
                                params[i].name, info.name
                            ),
                            span,
                        ))
                    }
                },
            }
        }
        vals.extend(extra);
        if !is_io {
            return Ok(self.prim(cx, p, &vals, span));
        }
        let io_var = self.io_var(cx, span)?;
        let mut all = vec![cx.vals[&io_var]];
        all.extend(vals);
        let r = self.prim(cx, p, &all, span);
        if p.returns_io_pair() {
            let io = self.tuple_get(cx, r, 0, span);
            cx.vals.insert(io_var, io);
            Ok(self.tuple_get(cx, r, 1, span))
        } else {
            cx.vals.insert(io_var, r);
            Ok(self.unit(span))
        }
    }
}

/// The parts of a callee `x.at[idx].method`.
struct AtUpdate<'a> {
    x: &'a Expr,
    indices: &'a [ast::IndexComp],
    method: &'a ast::Ident,
    idx_span: Span,
}

impl<'a> AtUpdate<'a> {
    fn of(callee: &'a Expr) -> Option<AtUpdate<'a>> {
        let ExprKind::Field { base, name } = &*callee.kind else {
            return None;
        };
        let ExprKind::Index { base: at, indices } = &*base.kind else {
            return None;
        };
        match &*at.kind {
            ExprKind::Field { base: x, name: a } if a.name == "at" => Some(AtUpdate {
                x,
                indices,
                method: name,
                idx_span: base.span,
            }),
            _ => None,
        }
    }
}
