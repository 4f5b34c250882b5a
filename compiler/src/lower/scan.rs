//! Syntactic scans over the AST that lowering needs before it lowers a
//! construct: which names a block assigns, whether it jumps out, whether it
//! contains loops, and which functions a body calls (for effect analysis).
//!
//! Scans do not descend into lambdas; whether they descend into local
//! `fn` bodies depends on the question asked. Their recursion is bounded by
//! the parser's expression-depth limit.

use adjoint_lang::ast::*;

/// Visits every sub-expression and statement of `e` (pre-order).
/// `into_fns` decides whether local `fn` bodies are visited; lambda bodies
/// never are.
pub(crate) fn walk_expr(e: &Expr, into_fns: bool, f: &mut dyn FnMut(Visit<'_>)) {
    f(Visit::Expr(e));
    match &*e.kind {
        ExprKind::Int(_)
        | ExprKind::Float { .. }
        | ExprKind::Bool(_)
        | ExprKind::Str(_)
        | ExprKind::Name(_)
        | ExprKind::Error
        | ExprKind::Lambda { .. } => {}
        ExprKind::Tuple(es) | ExprKind::Tensor(es) => {
            for x in es {
                walk_expr(x, into_fns, f);
            }
        }
        ExprKind::Record(fs) => {
            for x in fs {
                walk_expr(&x.value, into_fns, f);
            }
        }
        ExprKind::Unary { operand, .. } => walk_expr(operand, into_fns, f),
        ExprKind::Binary { lhs, rhs, .. } => {
            walk_expr(lhs, into_fns, f);
            walk_expr(rhs, into_fns, f);
        }
        ExprKind::Call { callee, args } => {
            walk_expr(callee, into_fns, f);
            for a in args {
                walk_expr(&a.value, into_fns, f);
            }
        }
        ExprKind::Index { base, indices } => {
            walk_expr(base, into_fns, f);
            for c in indices {
                match c {
                    IndexComp::Expr(x) => walk_expr(x, into_fns, f),
                    IndexComp::Slice { lo, hi, .. } => {
                        for x in lo.iter().chain(hi.iter()) {
                            walk_expr(x, into_fns, f);
                        }
                    }
                }
            }
        }
        ExprKind::Field { base, .. } | ExprKind::TupleIndex { base, .. } => {
            walk_expr(base, into_fns, f)
        }
        ExprKind::Block(b) => walk_block(b, into_fns, f),
        ExprKind::If(i) => walk_if(i, into_fns, f),
        ExprKind::Range { lo, hi } => {
            walk_expr(lo, into_fns, f);
            walk_expr(hi, into_fns, f);
        }
    }
}

fn walk_if(i: &IfExpr, into_fns: bool, f: &mut dyn FnMut(Visit<'_>)) {
    walk_expr(&i.cond, into_fns, f);
    walk_block(&i.then, into_fns, f);
    match &i.else_ {
        Some(Else::Block(b)) => walk_block(b, into_fns, f),
        Some(Else::If(e)) => walk_expr(e, into_fns, f),
        None => {}
    }
}

pub(crate) fn walk_block(b: &Block, into_fns: bool, f: &mut dyn FnMut(Visit<'_>)) {
    for s in &b.stmts {
        walk_stmt(s, into_fns, f);
    }
    if let Some(t) = &b.tail {
        walk_expr(t, into_fns, f);
    }
}

pub(crate) fn walk_stmt(s: &Stmt, into_fns: bool, f: &mut dyn FnMut(Visit<'_>)) {
    f(Visit::Stmt(s));
    match &s.kind {
        StmtKind::Let { value, .. } | StmtKind::Assign { value, .. } => {
            walk_expr(value, into_fns, f)
        }
        StmtKind::Expr { expr, .. } => walk_expr(expr, into_fns, f),
        StmtKind::Fn(def) => {
            if into_fns {
                walk_expr(&def.body, into_fns, f);
            }
        }
        StmtKind::For { iter, body, .. } => {
            match iter {
                ForIter::Range { lo, hi } | ForIter::Progress { lo, hi, .. } => {
                    walk_expr(lo, into_fns, f);
                    walk_expr(hi, into_fns, f);
                }
                ForIter::Expr(e) => walk_expr(e, into_fns, f),
            }
            f(Visit::LoopEnter);
            walk_block(body, into_fns, f);
            f(Visit::LoopExit);
        }
        StmtKind::While { cond, body } => {
            walk_expr(cond, into_fns, f);
            f(Visit::LoopEnter);
            walk_block(body, into_fns, f);
            f(Visit::LoopExit);
        }
        StmtKind::Break | StmtKind::Continue => {}
        StmtKind::Return(e) => {
            if let Some(e) = e {
                walk_expr(e, into_fns, f)
            }
        }
    }
}

pub(crate) enum Visit<'a> {
    Expr(&'a Expr),
    Stmt(&'a Stmt),
    LoopEnter,
    LoopExit,
}

fn pattern_names(p: &Pattern, out: &mut Vec<String>) {
    match &p.kind {
        PatternKind::Name(n) | PatternKind::MutName(n) => out.push(n.clone()),
        PatternKind::Wildcard => {}
        PatternKind::Tuple(ps) => {
            for q in ps {
                pattern_names(q, out);
            }
        }
        PatternKind::Record(fs) => {
            for fp in fs {
                match &fp.pattern {
                    Some(q) => pattern_names(q, out),
                    None => out.push(fp.name.name.clone()),
                }
            }
        }
    }
}

/// Names reassigned anywhere in `b` (not in lambdas or local `fn`s).
pub(crate) fn assigned_in_block(b: &Block) -> Vec<String> {
    let mut names = Vec::new();
    walk_block(b, false, &mut |v| {
        if let Visit::Stmt(s) = v {
            if let StmtKind::Assign { target, .. } = &s.kind {
                pattern_names(target, &mut names);
            }
        }
    });
    names
}

/// Names reassigned anywhere in the `if` (both branches).
pub(crate) fn assigned_in_if(i: &IfExpr) -> Vec<String> {
    let mut names = Vec::new();
    walk_if(i, false, &mut |v| {
        if let Visit::Stmt(s) = v {
            if let StmtKind::Assign { target, .. } = &s.kind {
                pattern_names(target, &mut names);
            }
        }
    });
    names
}

/// Whether the `if` contains a `return`, or a `break`/`continue` that
/// leaves it (one not inside a loop nested in the `if`).
pub(crate) fn if_jumps_out(i: &IfExpr) -> bool {
    let mut depth = 0usize;
    let mut jumps = false;
    walk_if(i, false, &mut |v| match v {
        Visit::LoopEnter => depth += 1,
        Visit::LoopExit => depth -= 1,
        Visit::Stmt(s) => match s.kind {
            StmtKind::Return(_) => jumps = true,
            StmtKind::Break | StmtKind::Continue if depth == 0 => jumps = true,
            _ => {}
        },
        Visit::Expr(_) => {}
    });
    jumps
}

/// Whether a block used as a value needs a graph of its own: it contains a
/// loop or a jump.
pub(crate) fn block_needs_graph(b: &Block) -> bool {
    let mut needs = false;
    walk_block(b, false, &mut |v| {
        if let Visit::Stmt(s) = v {
            if matches!(
                s.kind,
                StmtKind::For { .. }
                    | StmtKind::While { .. }
                    | StmtKind::Break
                    | StmtKind::Continue
                    | StmtKind::Return(_)
            ) {
                needs = true;
            }
        }
    });
    needs
}

/// A function called by name: `f(..)` or `m.f(..)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CallTarget {
    Name(String),
    Member(String, String),
}

/// Every function called by name in `body`, including inside local `fn`s
/// (which run as part of the function) but not inside lambdas.
pub(crate) fn calls_in(body: &Expr) -> Vec<CallTarget> {
    let mut out = Vec::new();
    walk_expr(body, true, &mut |v| {
        if let Visit::Expr(e) = v {
            if let ExprKind::Call { callee, .. } = &*e.kind {
                match &*callee.kind {
                    ExprKind::Name(n) => out.push(CallTarget::Name(n.clone())),
                    ExprKind::Field { base, name } => {
                        if let ExprKind::Name(m) = &*base.kind {
                            out.push(CallTarget::Member(m.clone(), name.name.clone()));
                        }
                    }
                    _ => {}
                }
            }
        }
    });
    out
}
