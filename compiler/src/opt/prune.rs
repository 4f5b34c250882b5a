//! Dead slots of a branch's result.
//!
//! A backpropagator calls a primitive's rule through
//! `switch(is_zero(d), @zero, @rule)()` and reads only some of the
//! cotangents the rule returns: those of operands that are constants (the
//! `0.5` of `x + 0.5`) or integers (a loop counter) go nowhere. When the
//! backpropagator escapes (a loop's record), the optimiser cannot inline
//! the rule, so the rule computed them anyway: a product and a reduction
//! over the whole tensor per step for the constant of `0.01 * y`. Here,
//! when every use of such a call takes a constant slot of its tuple, and a
//! branch graph is used by that `switch` alone and returns a fresh tuple,
//! the slots nobody reads become `()` in that branch, and dead-code
//! elimination removes what computed them.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::ir::{Const, GraphId, Module, NodeId};
use crate::prim::Prim;

use super::Snapshot;

/// Replaces the unread slots of branch results; the number of branches
/// changed.
pub(super) fn prune_branch_results(m: &mut Module, (fv, graphs, bodies): &Snapshot) -> usize {
    // Uses of every node, references to every graph, and what must be
    // kept whole: outputs and captured values.
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    let mut refs: HashMap<GraphId, usize> = HashMap::default();
    let mut kept: HashSet<NodeId> = HashSet::default();
    let mut captured: HashSet<NodeId> = HashSet::default();
    for g in graphs {
        for &n in &bodies[g] {
            for &i in m.inputs(n) {
                users.entry(i).or_default().push(n);
                if let Some(h) = m.as_graph(i) {
                    *refs.entry(h).or_default() += 1;
                }
            }
        }
        if let Some(o) = m.graph(*g).output {
            kept.insert(o);
            if let Some(h) = m.as_graph(o) {
                *refs.entry(h).or_default() += 1;
            }
        }
        captured.extend(fv.get(*g).iter().copied());
    }
    kept.extend(captured.iter().copied());
    let mut changed = 0;
    for g in graphs {
        for &s in &bodies[g] {
            let Some((_, a, b)) = m.graph_switch(s) else {
                continue;
            };
            // The switch is only called, once, and the call's result is
            // only taken apart.
            let [call] = users.get(&s).map(Vec::as_slice).unwrap_or_default() else {
                continue;
            };
            if m.inputs(*call)[0] != s || kept.contains(call) || kept.contains(&s) {
                continue;
            }
            let Some(read) = slots_read(m, *call, &users) else {
                continue;
            };
            for h in [a, b] {
                if refs.get(&h) == Some(&1) && prune(m, h, &read, &users, &captured) {
                    changed += 1;
                }
            }
        }
    }
    changed
}

/// The slots of `call`'s result its users read, when every user is a
/// `tuple_get` with a constant index.
fn slots_read(
    m: &Module,
    call: NodeId,
    users: &HashMap<NodeId, Vec<NodeId>>,
) -> Option<HashSet<usize>> {
    let mut read = HashSet::default();
    for &u in users.get(&call).map(Vec::as_slice).unwrap_or_default() {
        let ins = m.inputs(u);
        if m.applied_prim(u) != Some(Prim::TupleGet) || ins.len() != 3 || ins[1] != call {
            return None;
        }
        match m.as_const(ins[2]) {
            Some(Const::Int(k)) if *k >= 0 => read.insert(*k as usize),
            _ => return None,
        };
    }
    Some(read)
}

/// Makes the slots of `h`'s result outside `read` `()`, when its output
/// is a `make_tuple` nothing else uses; whether anything changed.
fn prune(
    m: &mut Module,
    h: GraphId,
    read: &HashSet<usize>,
    users: &HashMap<NodeId, Vec<NodeId>>,
    captured: &HashSet<NodeId>,
) -> bool {
    let Some(o) = m.graph(h).output else {
        return false;
    };
    if m.applied_prim(o) != Some(Prim::MakeTuple) || users.contains_key(&o) || captured.contains(&o)
    {
        return false;
    }
    let mut ins = m.inputs(o).to_vec();
    let loc = m.node(o).loc;
    let mut unit = None;
    let mut changed = false;
    for (k, i) in ins.iter_mut().enumerate().skip(1) {
        if read.contains(&(k - 1)) || matches!(m.as_const(*i), Some(Const::Unit)) {
            continue;
        }
        *i = *unit.get_or_insert_with(|| m.add_const(Const::Unit, loc));
        changed = true;
    }
    if changed {
        m.node_mut(o).kind = crate::ir::NodeKind::Apply(ins);
    }
    changed
}
