//! The order of a graph's work once fusion has grouped some of its nodes:
//! each group is one step (a *unit*) that runs after everything its
//! members and recomputed nodes need. **exec** emits code in this order,
//! and fusion checks with the same dependencies that its groups leave the
//! units acyclic.
//!
//! Groups are formed node by node, and each check there sees one node's
//! dependencies; a group as a whole can still end up needing a value that
//! needs the group (two groups of one shape each reading the other through
//! values outside them). [`break_cycles`] finds such cycles among the
//! units (strongly connected components) and dissolves one element-wise
//! group of each until none is left: its nodes then run on their own.

use std::collections::{HashMap, HashSet};

use super::form::KernelForm;
use super::Plan;
use crate::ir::analysis::FreeVars;
use crate::ir::{GraphId, Module, NodeId};

/// One step of a graph's schedule: a node, or a fused group (by index in
/// the plan).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Unit {
    Node(NodeId),
    Group(usize),
}

/// The units of a graph's body, in the order of their first node, and
/// the units each one needs.
pub struct Units {
    pub units: Vec<Unit>,
    pub deps: HashMap<Unit, HashSet<Unit>>,
}

/// The units of graph `g`'s body `body` under `plan`. A node needs its
/// inputs and, for a graph it names, that graph's free variables and the
/// values `extra` lists for it (a lifted graph's class); a group needs
/// what its members need, and the operands of the nodes it recomputes
/// rather than those nodes. Absorbed nodes are not units.
pub fn units(
    m: &Module,
    g: GraphId,
    body: &[NodeId],
    fv: &FreeVars,
    extra: Option<&HashMap<GraphId, Vec<NodeId>>>,
    plan: &Plan,
) -> Units {
    let unit = |n: NodeId| match plan.member_of.get(&n) {
        Some(gi) => Unit::Group(*gi),
        None => Unit::Node(n),
    };
    let body: Vec<NodeId> = body
        .iter()
        .copied()
        .filter(|n| !plan.absorbed.contains(n))
        .collect();
    let here: HashSet<NodeId> = body.iter().copied().collect();
    let mut units = Vec::new();
    let mut deps: HashMap<Unit, HashSet<Unit>> = HashMap::new();
    for &n in &body {
        let u = unit(n);
        if !deps.contains_key(&u) {
            units.push(u);
        }
        let d = deps.entry(u).or_default();
        let recomputed: &[NodeId] = match u {
            Unit::Group(gi) => &plan.groups[gi].recomputed,
            Unit::Node(_) => &[],
        };
        let mut stack: Vec<NodeId> = m.inputs(n).to_vec();
        let mut seen = HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            if recomputed.contains(&x) || plan.absorbed.contains(&x) {
                stack.extend_from_slice(m.inputs(x));
                continue;
            }
            let mut srcs = vec![x];
            if let Some(h) = m.as_graph(x) {
                srcs.extend(fv.get(h).iter().copied());
                srcs.extend(extra.and_then(|e| e.get(&h)).into_iter().flatten());
            }
            for s in srcs {
                if here.contains(&s) && m.node(s).graph == Some(g) {
                    let us = unit(s);
                    if us != u {
                        d.insert(us);
                    }
                }
            }
        }
    }
    Units { units, deps }
}

impl Units {
    /// Every unit after the units it needs, otherwise in body order; the
    /// units left out when some of them need each other.
    pub fn order(&self) -> Result<Vec<Unit>, Vec<Unit>> {
        let index: HashMap<Unit, usize> = self
            .units
            .iter()
            .enumerate()
            .map(|(i, u)| (*u, i))
            .collect();
        let mut indeg = vec![0usize; self.units.len()];
        let mut rdeps: Vec<Vec<usize>> = vec![Vec::new(); self.units.len()];
        for (u, ds) in &self.deps {
            let i = index[u];
            indeg[i] += ds.len();
            for d in ds {
                rdeps[index[d]].push(i);
            }
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
            (0..self.units.len())
                .filter(|&i| indeg[i] == 0)
                .map(std::cmp::Reverse)
                .collect();
        let mut order = Vec::with_capacity(self.units.len());
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            order.push(self.units[i]);
            for &r in &rdeps[i] {
                indeg[r] -= 1;
                if indeg[r] == 0 {
                    ready.push(std::cmp::Reverse(r));
                }
            }
        }
        if order.len() == self.units.len() {
            Ok(order)
        } else {
            let done: HashSet<Unit> = order.into_iter().collect();
            Err(self
                .units
                .iter()
                .filter(|u| !done.contains(u))
                .copied()
                .collect())
        }
    }

    /// The groups on a cycle of units (in a strongly connected component
    /// of more than one unit), one list per cycle.
    fn cyclic_groups(&self) -> Vec<Vec<usize>> {
        use petgraph::graph::DiGraph;
        let mut dg: DiGraph<Unit, ()> = DiGraph::new();
        let ids: HashMap<Unit, _> = self.units.iter().map(|u| (*u, dg.add_node(*u))).collect();
        for (u, ds) in &self.deps {
            for d in ds {
                dg.add_edge(ids[d], ids[u], ());
            }
        }
        petgraph::algo::tarjan_scc(&dg)
            .into_iter()
            .filter(|scc| scc.len() > 1)
            .map(|scc| {
                scc.into_iter()
                    .filter_map(|i| match dg[i] {
                        Unit::Group(gi) => Some(gi),
                        Unit::Node(_) => None,
                    })
                    .collect()
            })
            .collect()
    }
}

/// Dissolves element-wise groups of `plan` until no graph's units form a
/// cycle: of each cycle, the group with the fewest members. `bodies` are
/// the graphs' bodies. Runs before `plan.absorbed` is computed.
pub(super) fn break_cycles(
    m: &Module,
    fv: &FreeVars,
    bodies: &HashMap<GraphId, Vec<NodeId>>,
    plan: &mut Plan,
) {
    // The graphs to check: at first every graph with a group, then those
    // that lost one.
    let mut graphs: Vec<GraphId> = plan.groups.iter().map(|g| g.graph).collect();
    loop {
        graphs.sort();
        graphs.dedup();
        let mut dissolve: Vec<usize> = Vec::new();
        for &g in &graphs {
            let u = units(m, g, &bodies[&g], fv, None, plan);
            for cycle in u.cyclic_groups() {
                let pick = cycle
                    .into_iter()
                    .filter(|gi| matches!(plan.groups[*gi].form, KernelForm::Fused(_)))
                    .min_by_key(|gi| (plan.groups[*gi].members.len(), *gi));
                dissolve.extend(pick);
            }
        }
        if dissolve.is_empty() {
            return;
        }
        dissolve.sort();
        dissolve.dedup();
        graphs = dissolve.iter().map(|gi| plan.groups[*gi].graph).collect();
        for &gi in &dissolve {
            let gr = &plan.groups[gi];
            tracing::debug!(
                target: "adjoint::fuse",
                "fuse: @{}: dissolving a group of {} nodes on a cycle of steps",
                gr.graph_name,
                gr.members.len()
            );
        }
        for gi in dissolve.into_iter().rev() {
            plan.groups.remove(gi);
        }
        plan.member_of = plan
            .groups
            .iter()
            .enumerate()
            .flat_map(|(gi, gr)| gr.members.iter().map(move |n| (*n, gi)))
            .collect();
    }
}
