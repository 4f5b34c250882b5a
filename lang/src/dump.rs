//! A readable S-expression dump of the AST (`adjoint emit --stage ast`).
//!
//! ```text
//! (fn power @3:1
//!   (params x (n : i64))
//!   (block
//!     (let mut acc 1.0)
//!     (for i (range 0 n) (block (= acc (* acc x))))
//!     (tail acc)))
//! ```
//!
//! Forms: literals print as written; `(op lhs rhs)` for binary operators,
//! `(neg x)` / `(not x)`; `(call f args..)` with keyword arguments as
//! `(kw name value)`; `(index x i (slice lo hi))` with `_` for an omitted
//! bound; `(field p w)`, `(get t 0)`; `(tuple ..)`, `(record (w e) ..)`,
//! `(tensor ..)`; `(lambda (params ..) body)`; `(block stmts.. (tail e))`;
//! `(if c then else)`; statements `(let [mut] pat [: ty] e)`, `(= x e)`,
//! `(+= x e)`, `(expr e)` (with `;`), `(stmt e)` (`if`/block without `;`),
//! `(for pat iter body)` with `(range lo hi)` / `(progress lo hi)`,
//! `(while c body)`, `(break)`, `(continue)`, `(return [e])`. Types print in
//! source syntax. Items carry their `@line:col`.

use crate::ast::*;
use crate::span::SourceMap;

/// An S-expression under construction.
enum S {
    Atom(String),
    List(Vec<S>),
}

fn atom(s: impl Into<String>) -> S {
    S::Atom(s.into())
}

fn list(head: &str, rest: impl IntoIterator<Item = S>) -> S {
    let mut v = vec![atom(head)];
    v.extend(rest);
    S::List(v)
}

const WIDTH: usize = 72;

impl S {
    /// The single-line form, or `None` if longer than `budget`.
    fn flat(&self, budget: usize) -> Option<String> {
        let mut out = String::new();
        self.flat_into(&mut out, budget).then_some(out)
    }

    fn flat_into(&self, out: &mut String, budget: usize) -> bool {
        match self {
            S::Atom(a) => out.push_str(a),
            S::List(items) => {
                out.push('(');
                for (i, it) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    if !it.flat_into(out, budget) {
                        return false;
                    }
                    if out.len() > budget {
                        return false;
                    }
                }
                out.push(')');
            }
        }
        out.len() <= budget
    }

    fn render(&self, indent: usize, out: &mut String) {
        if let Some(f) = self.flat(WIDTH.saturating_sub(indent).max(24)) {
            out.push_str(&f);
            return;
        }
        let S::List(items) = self else {
            unreachable!("atoms always fit")
        };
        out.push('(');
        // Keep the head and leading atoms on the first line.
        let mut i = 0;
        while i < items.len() {
            if let S::Atom(a) = &items[i] {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(a);
                i += 1;
            } else {
                break;
            }
        }
        for it in &items[i..] {
            out.push('\n');
            out.push_str(&" ".repeat(indent + 2));
            it.render(indent + 2, out);
        }
        out.push(')');
    }
}

/// Dumps a whole module, one item after another.
pub fn dump(module: &Module, sources: &SourceMap) -> String {
    let mut out = String::new();
    for item in &module.items {
        let (line, col) = sources.line_col(item.span());
        let loc = format!("@{line}:{col}");
        let s = match item {
            Item::Fn(f) => fn_s("fn", f, Some(loc)),
            Item::Bprop(f) => fn_s("bprop", f, Some(loc)),
            Item::Import(i) => {
                let mut v = vec![atom("import"), atom(loc)];
                v.push(match &i.module {
                    ImportPath::Name(n) => atom(&n.name),
                    ImportPath::File { path, .. } => atom(format!("{path:?}")),
                });
                if let Some(a) = &i.alias {
                    v.push(atom("as"));
                    v.push(atom(&a.name));
                }
                S::List(v)
            }
        };
        s.render(0, &mut out);
        out.push('\n');
    }
    out
}

/// Dumps one expression (no locations).
pub fn dump_expr(e: &Expr) -> String {
    let mut out = String::new();
    expr_s(e).render(0, &mut out);
    out
}

fn fn_s(head: &str, f: &FnDef, loc: Option<String>) -> S {
    let mut v = vec![atom(head), atom(&f.name.name)];
    if let Some(l) = loc {
        v.push(atom(l));
    }
    v.push(list("params", f.params.iter().map(param_s)));
    if let Some(r) = &f.ret {
        v.push(atom(format!("-> {}", type_str(r))));
    }
    v.push(expr_s(&f.body));
    S::List(v)
}

fn param_s(p: &Param) -> S {
    if p.ty.is_none() && p.default.is_none() {
        return atom(&p.name.name);
    }
    let mut v = vec![atom(&p.name.name)];
    if let Some(t) = &p.ty {
        v.push(atom(":"));
        v.push(atom(type_str(t)));
    }
    if let Some(d) = &p.default {
        v.push(atom("="));
        v.push(expr_s(d));
    }
    S::List(v)
}

/// A type in source syntax.
pub fn type_str(t: &TypeExpr) -> String {
    match &t.kind {
        TypeKind::Tensor { dtype, dims: None } => dtype.name.clone(),
        TypeKind::Tensor {
            dtype,
            dims: Some(d),
        } => {
            let d: Vec<String> = d.iter().map(|x| x.to_string()).collect();
            format!("{}[{}]", dtype.name, d.join(", "))
        }
        TypeKind::Tuple(ts) if ts.len() == 1 => format!("({},)", type_str(&ts[0])),
        TypeKind::Tuple(ts) => {
            let v: Vec<String> = ts.iter().map(type_str).collect();
            format!("({})", v.join(", "))
        }
        TypeKind::Record(fs) => {
            let v: Vec<String> = fs
                .iter()
                .map(|(n, t)| format!("{}: {}", n.name, type_str(t)))
                .collect();
            format!("{{ {} }}", v.join(", "))
        }
    }
}

fn pattern_s(p: &Pattern) -> S {
    match &p.kind {
        PatternKind::Name(n) => atom(n),
        PatternKind::MutName(n) => list("mut", [atom(n)].into_iter()),
        PatternKind::Wildcard => atom("_"),
        PatternKind::Tuple(ps) => list("tuple", ps.iter().map(pattern_s)),
        PatternKind::Record(fs) => list(
            "record",
            fs.iter().map(|f| match &f.pattern {
                None => atom(&f.name.name),
                Some(p) => S::List(vec![atom(&f.name.name), pattern_s(p)]),
            }),
        ),
    }
}

fn block_s(b: &Block) -> S {
    let mut v = vec![atom("block")];
    v.extend(b.stmts.iter().map(stmt_s));
    if let Some(t) = &b.tail {
        v.push(list("tail", [expr_s(t)]));
    }
    S::List(v)
}

fn stmt_s(s: &Stmt) -> S {
    match &s.kind {
        StmtKind::Let {
            pattern,
            mutable,
            ty,
            value,
        } => {
            let mut v = vec![atom("let")];
            if *mutable {
                v.push(atom("mut"));
            }
            v.push(pattern_s(pattern));
            if let Some(t) = ty {
                v.push(atom(":"));
                v.push(atom(type_str(t)));
            }
            v.push(expr_s(value));
            S::List(v)
        }
        StmtKind::Assign { target, op, value } => {
            let head = match op {
                None => "=".to_string(),
                Some(op) => format!("{}=", op.symbol()),
            };
            list(&head, [pattern_s(target), expr_s(value)])
        }
        StmtKind::Expr { expr, semi } => list(if *semi { "expr" } else { "stmt" }, [expr_s(expr)]),
        StmtKind::Fn(f) => fn_s("fn", f, None),
        StmtKind::For {
            pattern,
            iter,
            body,
        } => {
            let it = match iter {
                ForIter::Range { lo, hi } => list("range", [expr_s(lo), expr_s(hi)]),
                ForIter::Progress { lo, hi, .. } => list("progress", [expr_s(lo), expr_s(hi)]),
                ForIter::Expr(e) => expr_s(e),
            };
            list("for", [pattern_s(pattern), it, block_s(body)])
        }
        StmtKind::While { cond, body } => list("while", [expr_s(cond), block_s(body)]),
        StmtKind::Break => list("break", []),
        StmtKind::Continue => list("continue", []),
        StmtKind::Return(e) => list("return", e.iter().map(expr_s)),
    }
}

fn if_s(i: &IfExpr) -> S {
    let mut v = vec![atom("if"), expr_s(&i.cond), block_s(&i.then)];
    match &i.else_ {
        None => {}
        Some(Else::Block(b)) => v.push(block_s(b)),
        Some(Else::If(e)) => v.push(expr_s(e)),
    }
    S::List(v)
}

fn expr_s(e: &Expr) -> S {
    match &*e.kind {
        ExprKind::Int(v) => atom(v.to_string()),
        ExprKind::Float { text, .. } => atom(text),
        ExprKind::Bool(b) => atom(b.to_string()),
        ExprKind::Str(s) => atom(format!("{s:?}")),
        ExprKind::Name(n) => atom(n),
        ExprKind::Tuple(es) => list("tuple", es.iter().map(expr_s)),
        ExprKind::Record(fs) => list(
            "record",
            fs.iter()
                .map(|f| S::List(vec![atom(&f.name.name), expr_s(&f.value)])),
        ),
        ExprKind::Tensor(es) => list("tensor", es.iter().map(expr_s)),
        ExprKind::Unary { op, operand } => list(
            match op {
                UnOp::Neg => "neg",
                UnOp::Not => "not",
            },
            [expr_s(operand)],
        ),
        ExprKind::Binary { op, lhs, rhs, .. } => list(op.symbol(), [expr_s(lhs), expr_s(rhs)]),
        ExprKind::Call { callee, args } => {
            let mut v = vec![atom("call"), expr_s(callee)];
            v.extend(args.iter().map(|a| match &a.name {
                None => expr_s(&a.value),
                Some(n) => list("kw", [atom(&n.name), expr_s(&a.value)]),
            }));
            S::List(v)
        }
        ExprKind::Index { base, indices } => {
            let mut v = vec![atom("index"), expr_s(base)];
            v.extend(indices.iter().map(|c| match c {
                IndexComp::Expr(e) => expr_s(e),
                IndexComp::Slice { lo, hi, .. } => {
                    let b = |x: &Option<Expr>| x.as_ref().map_or(atom("_"), expr_s);
                    list("slice", [b(lo), b(hi)])
                }
            }));
            S::List(v)
        }
        ExprKind::Field { base, name } => list("field", [expr_s(base), atom(&name.name)]),
        ExprKind::TupleIndex { base, index, .. } => {
            list("get", [expr_s(base), atom(index.to_string())])
        }
        ExprKind::Lambda { params, body } => list(
            "lambda",
            [list("params", params.iter().map(param_s)), expr_s(body)],
        ),
        ExprKind::Block(b) => block_s(b),
        ExprKind::If(i) => if_s(i),
        ExprKind::Range { lo, hi } => list("range", [expr_s(lo), expr_s(hi)]),
        ExprKind::Error => list("error", []),
    }
}
