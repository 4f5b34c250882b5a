//! Which values may have lanes (`vmap`, `adjoint_runtime::batch`).
//!
//! A fused kernel is compiled for one lane's shapes; given operands with
//! lanes the VM would run it once per lane. Fusion leaves out the nodes
//! that may see lanes, so they run as primitives, each batched whole.
//!
//! A node depends on the levels (the `vmap_level` nodes) its inputs depend
//! on; `vmap_in` adds its level, `vmap_out` and `vmap_sum` remove theirs.
//! Parameters of a graph called by name take the levels of its arguments
//! at every call; a call whose callee is not known by name passes levels
//! to the parameters of every graph used as a value. Solved to a fixpoint.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::ir::{Const, GraphId, Module, NodeId, NodeKind};
use crate::prim::Prim;

/// Levels of an unknown callee's arguments: never removed.
const UNKNOWN: NodeId = NodeId(u32::MAX);

type Levels = BTreeSet<NodeId>;

/// The nodes of `graphs` that may hold values with lanes, and the graphs
/// holding any of them. Empty when no graph maps a function.
pub fn lane_nodes(
    m: &Module,
    graphs: &[GraphId],
    bodies: &HashMap<GraphId, Vec<NodeId>>,
) -> (HashSet<NodeId>, HashSet<GraphId>) {
    let uses_vmap = graphs.iter().any(|g| {
        bodies[g]
            .iter()
            .any(|n| m.applied_prim(*n) == Some(Prim::VmapLevel))
    });
    if !uses_vmap {
        return Default::default();
    }
    let in_set: HashSet<GraphId> = graphs.iter().copied().collect();
    // Graphs used as values (not only called by name).
    let mut as_value: HashSet<GraphId> = HashSet::new();
    for g in graphs {
        for &n in &bodies[g] {
            if let NodeKind::Apply(inputs) = &m.node(n).kind {
                for &i in &inputs[1..] {
                    if let Some(Const::Graph(h)) = m.as_const(i) {
                        as_value.insert(*h);
                    }
                }
            }
        }
    }
    let mut dep: HashMap<NodeId, Levels> = HashMap::new();
    let mut params: HashMap<(GraphId, usize), Levels> = HashMap::new();
    let known_callee = |m: &Module, c: NodeId| -> Option<GraphId> {
        if let Some(Const::Graph(h)) = m.as_const(c) {
            return Some(*h);
        }
        if m.applied_prim(c) == Some(Prim::VmapFn) {
            if let Some(Const::Graph(h)) = m.as_const(m.inputs(c)[1]) {
                return Some(*h);
            }
        }
        None
    };
    let mut changed = true;
    let mut rounds = 0;
    while changed && rounds < 50 {
        changed = false;
        rounds += 1;
        let mut unknown_call = Levels::new();
        let mut param_updates: Vec<((GraphId, usize), Levels)> = Vec::new();
        for g in graphs {
            for &n in &bodies[g] {
                let node = m.node(n);
                let new: Levels = match &node.kind {
                    NodeKind::Param { index } => params
                        .get(&(*g, *index as usize))
                        .cloned()
                        .unwrap_or_default(),
                    NodeKind::Const(_) => Levels::new(),
                    NodeKind::Apply(inputs) => {
                        let get = |i: NodeId| match (&m.node(i).kind, m.node(i).graph) {
                            (NodeKind::Param { index }, Some(pg)) => params
                                .get(&(pg, *index as usize))
                                .cloned()
                                .unwrap_or_default(),
                            _ => dep.get(&i).cloned().unwrap_or_default(),
                        };
                        let union = |ins: &[NodeId]| {
                            ins.iter().fold(Levels::new(), |mut a, i| {
                                a.extend(get(*i));
                                a
                            })
                        };
                        match m.applied_prim(n) {
                            Some(Prim::VmapIn) => {
                                let mut s = get(inputs[1]);
                                s.insert(inputs[3]);
                                s
                            }
                            Some(Prim::VmapOut) => {
                                let mut s = get(inputs[1]);
                                s.remove(&inputs[3]);
                                s
                            }
                            Some(Prim::VmapSum) => {
                                let mut s = get(inputs[1]);
                                s.remove(&inputs[2]);
                                s
                            }
                            Some(_) => union(&inputs[1..]),
                            None => {
                                let args = union(&inputs[1..]);
                                let mut s = args.clone();
                                s.extend(get(inputs[0]));
                                match known_callee(m, inputs[0]) {
                                    Some(h) if in_set.contains(&h) => {
                                        for (k, a) in inputs[1..].iter().enumerate() {
                                            param_updates.push(((h, k), get(*a)));
                                        }
                                        if let Some(o) = m.graph(h).output {
                                            s.extend(get(o));
                                        }
                                    }
                                    _ => unknown_call.extend(args),
                                }
                                s
                            }
                        }
                    }
                };
                let old = dep.entry(n).or_default();
                if !new.is_subset(old) {
                    old.extend(new);
                    changed = true;
                }
            }
        }
        for (key, levels) in param_updates {
            let p = params.entry(key).or_default();
            if !levels.is_subset(p) {
                p.extend(levels);
                changed = true;
            }
        }
        if !unknown_call.is_empty() {
            for h in &as_value {
                for k in 0..m.graph(*h).params.len() {
                    let p = params.entry((*h, k)).or_default();
                    if !p.contains(&UNKNOWN) {
                        p.insert(UNKNOWN);
                        changed = true;
                    }
                }
            }
        }
    }
    let nodes: HashSet<NodeId> = dep
        .into_iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(n, _)| n)
        .collect();
    let graphs_with = graphs
        .iter()
        .copied()
        .filter(|g| bodies[g].iter().any(|n| nodes.contains(n)))
        .collect();
    (nodes, graphs_with)
}
