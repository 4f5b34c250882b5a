//! Dead nodes: the application nodes no reachable graph's output depends on
//! are detached from their graphs, so that they no longer count as uses
//! when free variables are computed. The optimiser does it after every
//! round, the egg rewrites ([`crate::rewrite`]) after writing back.

use rustc_hash::FxHashMap as HashMap;

use crate::ir::analysis::{
    free_variables_with, graph_body_with, owned_nodes, reachable_graphs_with, FreeVars,
};
use crate::ir::{Const, GraphId, Module, NodeId, NodeKind};

/// Free variables, the graphs reachable from `roots`, and their bodies:
/// what a round reads (and must recompute after changing the module).
pub(crate) type Snapshot = (FreeVars, Vec<GraphId>, HashMap<GraphId, Vec<NodeId>>);

fn snapshot(m: &Module, roots: &[GraphId]) -> Snapshot {
    let owned = owned_nodes(m);
    let fv = free_variables_with(m, &owned);
    let graphs = reachable_graphs_with(m, roots, &owned);
    let bodies = graphs
        .iter()
        .map(|g| (*g, graph_body_with(m, *g, &fv)))
        .collect();
    (fv, graphs, bodies)
}

/// Detaches application nodes that no reachable graph's output depends on
/// (they would otherwise still count as uses when free variables are
/// computed), and the nodes of unreachable graphs.
pub(crate) fn detach_dead(m: &mut Module, roots: &[GraphId]) {
    detach_dead_then_snapshot(m, roots);
}

/// [`detach_dead`], returning the [`snapshot`] of the module it leaves.
///
/// One marking pass from the roots' outputs finds what is live: a node is
/// live if a live node uses it, and a graph constant that is live makes
/// its graph's output live (so the nodes a closure captures are live
/// through the nested graph's own live nodes). Every application node
/// owned by a graph that this leaves unmarked is detached, also in graphs
/// no longer reachable. That is the least fixpoint of detaching what the
/// snapshot's bodies leave out (a body counts the free variables of every
/// graph it names, and those are computed from every node the graph
/// owns, dead or not, so detaching one round can make more nodes dead);
/// the loop below checks it and detaches more only if the two differ.
pub(crate) fn detach_dead_then_snapshot(m: &mut Module, roots: &[GraphId]) -> Snapshot {
    let live = mark_live(m, roots);
    detach_where(m, |i| !live[i]);
    loop {
        let snap = snapshot(m, roots);
        let mut in_body = vec![false; m.nodes.len()];
        for n in snap.2.values().flatten() {
            in_body[n.index()] = true;
        }
        if detach_where(m, |i| !in_body[i]) == 0 {
            return snap;
        }
    }
}

/// Which nodes (by index) the outputs of `roots` depend on, through the
/// inputs of nodes and the outputs of the graphs that live graph
/// constants name.
fn mark_live(m: &Module, roots: &[GraphId]) -> Vec<bool> {
    let mut live = vec![false; m.nodes.len()];
    let mut graph_seen = vec![false; m.graphs.len()];
    let mut stack: Vec<NodeId> = Vec::new();
    let mut visit_graph = |g: GraphId, stack: &mut Vec<NodeId>| {
        if !std::mem::replace(&mut graph_seen[g.index()], true) {
            stack.extend(m.graph(g).output);
        }
    };
    for &r in roots {
        visit_graph(r, &mut stack);
    }
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut live[n.index()], true) {
            continue;
        }
        match &m.node(n).kind {
            NodeKind::Apply(inputs) => stack.extend(inputs.iter().copied()),
            NodeKind::Const(Const::Graph(h)) => visit_graph(*h, &mut stack),
            _ => {}
        }
    }
    live
}

/// Detaches the application nodes owned by a graph whose index satisfies
/// `dead`; returns how many.
fn detach_where(m: &mut Module, dead: impl Fn(usize) -> bool) -> usize {
    let mut removed = 0;
    for (i, node) in m.nodes.iter_mut().enumerate() {
        if matches!(node.kind, NodeKind::Apply(_)) && node.graph.is_some() && dead(i) {
            node.kind = NodeKind::Const(Const::Unit);
            node.graph = None;
            removed += 1;
        }
    }
    removed
}
