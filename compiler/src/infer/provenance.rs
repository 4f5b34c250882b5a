//! Where a value comes from, read off the IR: whether an expression is
//! fixed by the program text or only by the values a specialisation was
//! made for.
//!
//! Specialisation makes loop counters and recursion arguments constants,
//! but the language still treats them as dynamic: `x[i]` with a counter
//! `i` past the end is a run-time error, not a compile-time one, and an
//! `if` on a counter takes one branch per iteration. Expressions built
//! from literals alone (and, for indices, from shape queries) are *static*:
//! their errors are compile-time errors, and an `if` on a literal condition
//! still requires both branches to have one type.

use std::collections::HashSet;

use crate::ir::{Module, NodeId, NodeKind};
use crate::prim::{Category, Prim};

/// Nodes visited before an expression is declared not static.
const BUDGET: usize = 4096;

/// Whether `n` is computed from literal constants alone: no parameters,
/// captured values, calls of functions, shape queries or IO.
pub fn is_literal(m: &Module, n: NodeId) -> bool {
    walk(m, n, false)
}

/// Whether `n` is computed from literal constants and queries of types
/// (`shape`, `size`, `tuple_len`, `dtype`), which are fixed for a
/// specialisation by its signature's types rather than its values.
pub fn is_static(m: &Module, n: NodeId) -> bool {
    walk(m, n, true)
}

/// Whether a primitive computes its value from its arguments alone, so a
/// result from static arguments is static.
fn pure(p: Prim) -> bool {
    match p.category() {
        Category::Map
        | Category::Reindex
        | Category::Reduce
        | Category::Contract
        | Category::Create
        | Category::Struct => true,
        Category::Control => p == Prim::Switch,
        Category::Io => false,
    }
}

fn walk(m: &Module, root: NodeId, queries: bool) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        if seen.len() > BUDGET {
            return false;
        }
        match &m.node(n).kind {
            NodeKind::Const(crate::ir::Const::Graph(_)) => return false,
            NodeKind::Const(_) => {}
            NodeKind::Param { .. } => return false,
            NodeKind::Apply(inputs) => {
                let Some(p) = m.applied_prim(n) else {
                    return false;
                };
                if queries && matches!(p, Prim::Shape | Prim::Size | Prim::TupleLen | Prim::DTypeOf)
                {
                    continue;
                }
                if !pure(p) {
                    return false;
                }
                stack.extend_from_slice(&inputs[1..]);
            }
        }
    }
    true
}

pub use crate::ir::analysis::same_expr;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Const, Loc};

    #[test]
    fn literals_queries_and_parameters() {
        let mut m = Module::new();
        let g = m.add_graph("f", Loc::NONE);
        let x = m.add_param(g, "x", Loc::NONE);
        let one = m.add_const(Const::Int(1), Loc::NONE);
        let two = m.add_const(Const::Int(2), Loc::NONE);
        let lit = m.add_prim(g, Prim::Add, &[one, two], Loc::NONE);
        let from_param = m.add_prim(g, Prim::Add, &[x, one], Loc::NONE);
        let shape = m.add_prim(g, Prim::Shape, &[x], Loc::NONE);
        let dim = m.add_prim(g, Prim::TupleGet, &[shape, one], Loc::NONE);
        assert!(is_literal(&m, lit) && is_static(&m, lit));
        assert!(!is_literal(&m, from_param) && !is_static(&m, from_param));
        assert!(!is_literal(&m, dim) && is_static(&m, dim));
        let again = m.add_prim(g, Prim::Add, &[x, one], Loc::NONE);
        assert!(same_expr(&m, from_param, again, 8));
        assert!(!same_expr(&m, from_param, lit, 8));
    }
}
