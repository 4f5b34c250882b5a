//! Lowering of statements and control flow: blocks, `let`, assignment,
//! `if`, loops, `break`/`continue`/`return`, local functions.
//!
//! Statement sequences are lowered in continuation-passing style where
//! control flow demands it: a loop ends the current graph with a tail call
//! of its header, and the statements after the loop become the loop's
//! `after` graph; an `if` statement that jumps out (`break`, `continue`,
//! `return`) makes the statements after it a `join` graph that each branch
//! tail-calls. Variables reassigned in a loop or branch are passed as
//! parameters of these graphs.

use std::rc::Rc;

use adjoint_lang::ast::{
    self, Block, Expr, ExprKind, FnDef, IfExpr, Pattern, PatternKind, Stmt, StmtKind,
};
use adjoint_lang::{Diagnostic, Span};

use super::scan;
use super::{binop_prim, Binding, Cont, Cx, LocalFn, LoopCx, Lowerer, R};
use crate::ir::{Const, GraphRole, NodeId};
use crate::prim::Prim;

impl Lowerer<'_> {
    /// Lowers a statement sequence and its tail expression. Finishes the
    /// current graph according to `k`; returns the block's value only for
    /// `Cont::Value`.
    pub(super) fn lower_stmts(
        &mut self,
        module: usize,
        cx: &mut Cx,
        stmts: &[Stmt],
        tail: Option<&Expr>,
        end: Span,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        self.enter(end)?;
        let r = self.lower_stmts_inner(module, cx, stmts, tail, end, k);
        self.leave();
        r
    }

    fn lower_stmts_inner(
        &mut self,
        module: usize,
        cx: &mut Cx,
        stmts: &[Stmt],
        tail: Option<&Expr>,
        end: Span,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        for (i, s) in stmts.iter().enumerate() {
            let rest = &stmts[i + 1..];
            match &s.kind {
                StmtKind::Let {
                    pattern,
                    mutable,
                    value,
                    ty,
                } => {
                    let v = self.lower_expr(module, cx, value)?;
                    if let Some(ty) = ty {
                        let what = match &pattern.kind {
                            PatternKind::Name(n) => format!("`{n}`"),
                            _ => "the value".to_string(),
                        };
                        self.checks.push(crate::checks::Check::Annotation {
                            node: v,
                            ty: ty.clone(),
                            what,
                        });
                    }
                    self.bind_pattern(cx, pattern, v, *mutable)?;
                }
                StmtKind::Assign { target, op, value } => {
                    let v = match op {
                        Some(op) => {
                            let PatternKind::Name(n) = &target.kind else {
                                return Err(Diagnostic::error(
                                    "compound assignment needs a single variable",
                                    target.span,
                                ));
                            };
                            let cur = self.lower_name(module, cx, n, target.span)?;
                            let r = self.lower_expr(module, cx, value)?;
                            self.prim(cx, binop_prim(*op), &[cur, r], s.span)
                        }
                        None => self.lower_expr(module, cx, value)?,
                    };
                    self.assign_pattern(module, cx, target, v)?;
                }
                StmtKind::Expr { expr, .. } => match &*expr.kind {
                    ExprKind::If(ifx) if scan::if_jumps_out(ifx) => {
                        return self.lower_if_cps(module, cx, ifx, expr.span, rest, tail, end, k);
                    }
                    _ => {
                        self.lower_expr(module, cx, expr)?;
                    }
                },
                StmtKind::Fn(def) => self.lower_local_fn(module, cx, def)?,
                StmtKind::For {
                    pattern,
                    iter,
                    body,
                } => {
                    return self
                        .lower_for(module, cx, pattern, iter, body, s.span, rest, tail, end, k)
                }
                StmtKind::While { cond, body } => {
                    return self.lower_while(module, cx, cond, body, s.span, rest, tail, end, k)
                }
                StmtKind::Break | StmtKind::Continue => {
                    let is_break = matches!(s.kind, StmtKind::Break);
                    let word = if is_break { "break" } else { "continue" };
                    let Some(l) = cx.loops.last().cloned() else {
                        return Err(match cx.barrier {
                            Some(why) => Diagnostic::error(
                                format!("`{word}` cannot jump out of {why}"),
                                s.span,
                            )
                            .with_note("use the `if` or block as a statement instead"),
                            None => {
                                Diagnostic::error(format!("`{word}` outside of a loop"), s.span)
                            }
                        });
                    };
                    let jump = if is_break {
                        Cont::Jump {
                            graph: l.after,
                            prefix: Vec::new(),
                            vars: l.carried,
                        }
                    } else {
                        Cont::Jump {
                            graph: l.header,
                            prefix: l.next.into_iter().collect(),
                            vars: l.carried,
                        }
                    };
                    let u = self.unit(s.span);
                    self.finish(cx, u, &jump, s.span);
                    return Ok(None);
                }
                StmtKind::Return(e) => {
                    if let Some(why) = cx.barrier {
                        return Err(Diagnostic::error(
                            format!("`return` cannot jump out of {why}"),
                            s.span,
                        )
                        .with_note("use the `if` or block as a statement instead"));
                    }
                    if matches!(k, Cont::Value) {
                        return Err(Diagnostic::error("`return` is not allowed here", s.span));
                    }
                    let v = match e {
                        Some(e) => self.lower_expr(module, cx, e)?,
                        None => self.unit(s.span),
                    };
                    self.explicit_return = true;
                    self.finish(cx, v, &Cont::Return, s.span);
                    return Ok(None);
                }
            }
        }
        self.lower_tail(module, cx, tail, end, k)
    }

    /// Lowers a block's final expression and applies the continuation.
    pub(super) fn lower_tail(
        &mut self,
        module: usize,
        cx: &mut Cx,
        tail: Option<&Expr>,
        end: Span,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        let Some(e) = tail else {
            let u = self.unit(end);
            return Ok(self.finish(cx, u, k, end));
        };
        match &*e.kind {
            ExprKind::If(ifx) if !matches!(k, Cont::Value) => {
                self.lower_if_tail(module, cx, ifx, e.span, k)?;
                Ok(None)
            }
            ExprKind::Block(b) if !(matches!(k, Cont::Value) && scan::block_needs_graph(b)) => {
                self.lower_block(module, cx, b, k)
            }
            _ => {
                let v = self.lower_expr(module, cx, e)?;
                Ok(self.finish(cx, v, k, e.span))
            }
        }
    }

    /// Lowers a block in its own scope.
    pub(super) fn lower_block(
        &mut self,
        module: usize,
        cx: &mut Cx,
        b: &Block,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        self.scopes.push(Vec::new());
        let r = self.lower_stmts(module, cx, &b.stmts, b.tail.as_ref(), b.span, k);
        self.scopes.pop();
        r
    }

    /// A block used as a value: inline when it has no loops or jumps,
    /// otherwise a graph of its own called in place.
    pub(super) fn lower_block_value(&mut self, module: usize, cx: &mut Cx, b: &Block) -> R<NodeId> {
        if !scan::block_needs_graph(b) {
            let v = self.lower_block(module, cx, b, &Cont::Value)?;
            return Ok(v.expect("inline blocks give a value"));
        }
        let vars = self.carried(cx, &scan::assigned_in_block(b));
        let (g, mut gcx, _) = self.join_graph(cx, "block", &[], &[], b.span);
        gcx.loops.clear();
        gcx.barrier = Some("a block used as a value");
        self.lower_block(module, &mut gcx, b, &Cont::Pack(vars.clone()))?;
        let callee = self.graph_ref(g, b.span);
        let r = self.m.add_apply(cx.graph, vec![callee], super::loc(b.span));
        Ok(self.unpack(cx, r, &vars, b.span))
    }

    /// An `if` whose value is used (or a statement `if` that does not jump
    /// out): branches are graphs returning the value and the variables they
    /// reassign.
    pub(super) fn lower_if_value(
        &mut self,
        module: usize,
        cx: &mut Cx,
        ifx: &IfExpr,
        span: Span,
    ) -> R<NodeId> {
        let vars = self.carried(cx, &scan::assigned_in_if(ifx));
        let c = self.lower_expr(module, cx, &ifx.cond)?;
        let k = Cont::Pack(vars.clone());
        let mut bcx = cx.clone();
        bcx.loops.clear();
        bcx.barrier = Some("an `if` whose value is used");
        let (t, e) = self.lower_branches(module, &bcx, ifx, span, &k)?;
        let out = self.switch_call(cx, c, t, e, &[], span);
        Ok(self.unpack(cx, out, &vars, span))
    }

    /// An `if` in tail position: each branch applies the continuation.
    fn lower_if_tail(
        &mut self,
        module: usize,
        cx: &mut Cx,
        ifx: &IfExpr,
        span: Span,
        k: &Cont,
    ) -> R<()> {
        let c = self.lower_expr(module, cx, &ifx.cond)?;
        let (t, e) = self.lower_branches(module, cx, ifx, span, k)?;
        let out = self.switch_call(cx, c, t, e, &[], span);
        self.m.set_output(cx.graph, out);
        Ok(())
    }

    /// An `if` statement that jumps out: the rest of the block becomes a
    /// join graph.
    #[allow(clippy::too_many_arguments)]
    fn lower_if_cps(
        &mut self,
        module: usize,
        cx: &mut Cx,
        ifx: &IfExpr,
        span: Span,
        rest: &[Stmt],
        tail: Option<&Expr>,
        end: Span,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        let vars = self.carried(cx, &scan::assigned_in_if(ifx));
        let c = self.lower_expr(module, cx, &ifx.cond)?;
        let (j, mut jcx, _) = self.join_graph(cx, "join", &[], &vars, span);
        let jump = Cont::Jump {
            graph: j,
            prefix: Vec::new(),
            vars,
        };
        // The branches first: the statements after the `if` may shadow
        // names the branches use.
        let (t, e) = self.lower_branches(module, cx, ifx, span, &jump)?;
        let out = self.switch_call(cx, c, t, e, &[], span);
        self.m.set_output(cx.graph, out);
        self.lower_stmts(module, &mut jcx, rest, tail, end, k)?;
        Ok(None)
    }

    /// Lowers both branches of an `if` into graphs finished by `k`.
    fn lower_branches(
        &mut self,
        module: usize,
        cx: &Cx,
        ifx: &IfExpr,
        span: Span,
        k: &Cont,
    ) -> R<(crate::ir::GraphId, crate::ir::GraphId)> {
        let (t, mut tcx, _) = self.join_graph(cx, "then", &[], &[], ifx.then.span);
        self.lower_block(module, &mut tcx, &ifx.then, k)?;
        let else_span = match &ifx.else_ {
            Some(ast::Else::Block(b)) => b.span,
            Some(ast::Else::If(e)) => e.span,
            None => span,
        };
        let (e, mut ecx, _) = self.join_graph(cx, "else", &[], &[], else_span);
        match &ifx.else_ {
            Some(ast::Else::Block(b)) => {
                self.lower_block(module, &mut ecx, b, k)?;
            }
            Some(ast::Else::If(x)) => {
                self.lower_tail(module, &mut ecx, Some(x), x.span, k)?;
            }
            None => {
                let u = self.unit(span);
                self.finish(&mut ecx, u, k, span);
            }
        }
        Ok((t, e))
    }

    /// `switch(c, @t, @e)(args..)`.
    fn switch_call(
        &mut self,
        cx: &Cx,
        c: NodeId,
        t: crate::ir::GraphId,
        e: crate::ir::GraphId,
        args: &[NodeId],
        span: Span,
    ) -> NodeId {
        let tr = self.graph_ref(t, span);
        let er = self.graph_ref(e, span);
        let f = self.prim(cx, Prim::Switch, &[c, tr, er], span);
        let mut inputs = vec![f];
        inputs.extend_from_slice(args);
        self.m.add_apply(cx.graph, inputs, super::loc(span))
    }

    #[allow(clippy::too_many_arguments)]
    fn lower_while(
        &mut self,
        module: usize,
        cx: &mut Cx,
        cond: &Expr,
        body: &Block,
        span: Span,
        rest: &[Stmt],
        tail: Option<&Expr>,
        end: Span,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        let vars = self.carried(cx, &scan::assigned_in_block(body));
        let (after, mut acx, _) = self.join_graph(cx, "after", &[], &vars, span);
        self.m.graph_mut(after).role = GraphRole::LoopExit;
        let (header, mut hcx, _) = self.join_graph(cx, "while", &[], &vars, span);
        self.m.graph_mut(header).role = GraphRole::LoopHeader;
        let c = self.lower_expr(module, &mut hcx, cond)?;
        let (b, mut bcx, _) = self.join_graph(&hcx, "body", &[], &vars, body.span);
        self.m.graph_mut(b).role = GraphRole::LoopBody;
        bcx.loops.push(LoopCx {
            header,
            after,
            carried: vars.clone(),
            next: None,
        });
        let next = Cont::Jump {
            graph: header,
            prefix: Vec::new(),
            vars: vars.clone(),
        };
        self.lower_block(module, &mut bcx, body, &next)?;
        let args: Vec<NodeId> = vars.iter().map(|v| hcx.vals[v]).collect();
        let out = self.switch_call(&hcx, c, b, after, &args, span);
        self.m.set_output(header, out);
        let enter = Cont::Jump {
            graph: header,
            prefix: Vec::new(),
            vars,
        };
        let u = self.unit(span);
        self.finish(cx, u, &enter, span);
        // The statements after the loop last: they may shadow names the
        // loop uses.
        self.lower_stmts(module, &mut acx, rest, tail, end, k)?;
        Ok(None)
    }

    #[allow(clippy::too_many_arguments)]
    fn lower_for(
        &mut self,
        module: usize,
        cx: &mut Cx,
        pattern: &Pattern,
        iter: &ast::ForIter,
        body: &Block,
        span: Span,
        rest: &[Stmt],
        tail: Option<&Expr>,
        end: Span,
        k: &Cont,
    ) -> R<Option<NodeId>> {
        let (lo, hi, tuple) = match iter {
            ast::ForIter::Range { lo, hi } | ast::ForIter::Progress { lo, hi, .. } => {
                let (lo_span, hi_span) = (lo.span, hi.span);
                let lo = self.lower_expr(module, cx, lo)?;
                let hi = self.lower_expr(module, cx, hi)?;
                for (node, span) in [(lo, lo_span), (hi, hi_span)] {
                    self.checks
                        .push(crate::checks::Check::RangeBound { node, span });
                }
                (lo, hi, None)
            }
            ast::ForIter::Expr(e) => {
                let t = self.lower_expr(module, cx, e)?;
                self.checks.push(crate::checks::Check::ForTuple {
                    node: t,
                    span: e.span,
                });
                let lo = self.konst(Const::Int(0), span);
                let hi = self.prim(cx, Prim::TupleLen, &[t], span);
                (lo, hi, Some(t))
            }
        };
        // `progress(lo..hi)` in a function that performs IO tells the host
        // when the loop starts, each iteration and the end (it draws a bar).
        let progress = match (iter, cx.io) {
            (ast::ForIter::Progress { .. }, Some(io)) => {
                let tok = self.prim(cx, Prim::ProgressStart, &[cx.vals[&io], lo, hi], span);
                cx.vals.insert(io, tok);
                Some(io)
            }
            _ => None,
        };
        let vars = self.carried(cx, &scan::assigned_in_block(body));
        let (after, mut acx, _) = self.join_graph(cx, "after", &[], &vars, span);
        self.m.graph_mut(after).role = GraphRole::LoopExit;
        let (header, mut hcx, extra) = self.join_graph(cx, "for", &["i"], &vars, span);
        self.m.graph_mut(header).role = GraphRole::LoopHeader;
        let i = extra[0];
        let c = self.prim(&hcx, Prim::Lt, &[i, hi], pattern.span);
        let (b, mut bcx, _) = self.join_graph(&hcx, "body", &[], &vars, body.span);
        self.m.graph_mut(b).role = GraphRole::LoopBody;
        let one = self.konst(Const::Int(1), pattern.span);
        let next = self.prim(&bcx, Prim::Add, &[i, one], pattern.span);
        bcx.loops.push(LoopCx {
            header,
            after,
            carried: vars.clone(),
            next: Some(next),
        });
        self.scopes.push(Vec::new());
        let elem = match tuple {
            Some(t) => self.prim(&bcx, Prim::TupleGet, &[t, i], pattern.span),
            None => i,
        };
        if let Some(io) = progress {
            let tok = self.prim(&bcx, Prim::ProgressStep, &[bcx.vals[&io], i], pattern.span);
            bcx.vals.insert(io, tok);
        }
        let bound = self.bind_pattern(&mut bcx, pattern, elem, false);
        let cont = Cont::Jump {
            graph: header,
            prefix: vec![next],
            vars: vars.clone(),
        };
        let r = bound.and_then(|_| self.lower_block(module, &mut bcx, body, &cont));
        self.scopes.pop();
        r?;
        let args: Vec<NodeId> = vars.iter().map(|v| hcx.vals[v]).collect();
        let out = self.switch_call(&hcx, c, b, after, &args, span);
        self.m.set_output(header, out);
        let _ = &mut hcx;
        let enter = Cont::Jump {
            graph: header,
            prefix: vec![lo],
            vars,
        };
        let u = self.unit(span);
        self.finish(cx, u, &enter, span);
        if let Some(io) = progress {
            let tok = self.prim(&acx, Prim::ProgressEnd, &[acx.vals[&io]], span);
            acx.vals.insert(io, tok);
        }
        self.lower_stmts(module, &mut acx, rest, tail, end, k)?;
        Ok(None)
    }

    fn lower_local_fn(&mut self, module: usize, cx: &mut Cx, def: &FnDef) -> R<()> {
        let effectful = scan::calls_in(&def.body).iter().any(|t| match t {
            scan::CallTarget::Name(n) => {
                matches!(self.lookup(n), Some(Binding::LocalFn(f)) if f.effectful)
                    || (self.lookup(n).is_none() && self.target_effectful(module, t))
            }
            _ => self.target_effectful(module, t),
        });
        if effectful && cx.io.is_none() {
            return Err(super::Diagnostic::error(
                format!(
                    "local function `{}` performs IO, which is not allowed here",
                    def.name.name
                ),
                def.name.span,
            ));
        }
        let parent = self.m.graph(cx.graph).name.clone();
        let base = parent.split('.').next().unwrap_or(&parent).to_string();
        let g = self.m.add_graph(
            format!("{base}.{}", def.name.name),
            super::loc(def.name.span),
        );
        let def_rc = Rc::new(def.clone());
        if !effectful && def.params.iter().any(|p| p.default.is_some()) {
            self.with_defaults.insert(g, (def_rc.clone(), None));
        }
        self.bind(
            &def.name.name,
            Binding::LocalFn(LocalFn {
                graph: g,
                def: def_rc,
                effectful,
            }),
        );
        self.lower_fn_body(module, g, def, effectful, cx.vals.clone())
    }

    pub(super) fn bind_pattern(
        &mut self,
        cx: &mut Cx,
        pat: &Pattern,
        value: NodeId,
        mutable: bool,
    ) -> R<()> {
        match &pat.kind {
            PatternKind::MutName(n) => {
                let v = self.new_var(cx.fn_id);
                cx.vals.insert(v, value);
                self.bind(n, Binding::Var(v));
            }
            PatternKind::Name(n) => {
                if mutable {
                    let v = self.new_var(cx.fn_id);
                    cx.vals.insert(v, value);
                    self.bind(n, Binding::Var(v));
                } else {
                    self.bind(n, Binding::Val(value));
                }
            }
            PatternKind::Wildcard => {}
            PatternKind::Tuple(ps) => {
                self.checks.push(crate::checks::Check::TupleArity {
                    node: value,
                    len: ps.len(),
                    span: pat.span,
                });
                for (i, p) in ps.iter().enumerate() {
                    let x = self.tuple_get(cx, value, i, p.span);
                    self.bind_pattern(cx, p, x, mutable)?;
                }
            }
            PatternKind::Record(fields) => {
                for f in fields {
                    let name = self.konst(
                        Const::Str(std::sync::Arc::from(f.name.name.as_str())),
                        f.name.span,
                    );
                    let x = self.prim(cx, Prim::RecordGet, &[value, name], f.span);
                    match &f.pattern {
                        Some(p) => self.bind_pattern(cx, p, x, mutable)?,
                        None => {
                            let p = Pattern {
                                kind: PatternKind::Name(f.name.name.clone()),
                                span: f.name.span,
                            };
                            self.bind_pattern(cx, &p, x, mutable)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn assign_pattern(
        &mut self,
        module: usize,
        cx: &mut Cx,
        pat: &Pattern,
        value: NodeId,
    ) -> R<()> {
        match &pat.kind {
            PatternKind::Name(n) => match self.lookup(n).cloned() {
                Some(Binding::Var(v)) if self.vars[v.0 as usize].fn_id == cx.fn_id => {
                    if let Some(old) = cx.vals.get(&v).copied() {
                        self.checks.push(crate::checks::Check::Assign {
                            name: n.clone(),
                            old,
                            new: value,
                            span: pat.span,
                        });
                    }
                    cx.vals.insert(v, value);
                    Ok(())
                }
                Some(Binding::Var(_)) => Err(Diagnostic::error(
                    format!("cannot assign to `{n}` here: it belongs to an enclosing function"),
                    pat.span,
                )
                .with_note("closures capture the values of variables when they are made, not the variables")),
                Some(_) => Err(Diagnostic::error(
                    format!("cannot assign twice to immutable variable `{n}`"),
                    pat.span,
                )
                .with_note(format!("declare it with `let mut {n}` to make it assignable"))),
                None => Err(self.unknown_name(module, n, pat.span)),
            },
            PatternKind::MutName(n) => Err(Diagnostic::error(
                format!("`mut {n}` declares a variable; an assignment takes just `{n}`"),
                pat.span,
            )),
            PatternKind::Wildcard => Ok(()),
            PatternKind::Tuple(ps) => {
                self.checks.push(crate::checks::Check::TupleArity {
                    node: value,
                    len: ps.len(),
                    span: pat.span,
                });
                for (i, p) in ps.iter().enumerate() {
                    let x = self.tuple_get(cx, value, i, p.span);
                    self.assign_pattern(module, cx, p, x)?;
                }
                Ok(())
            }
            PatternKind::Record(_) => Err(Diagnostic::error(
                "a record pattern cannot be assigned to",
                pat.span,
            )),
        }
    }
}
