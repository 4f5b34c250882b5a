//! Which values may have lanes (`vmap`, `adjoint_runtime::batch`).
//!
//! A fused kernel is compiled for one lane's shapes; given operands with
//! lanes the VM would run it once per lane. Fusion leaves out the nodes
//! that may see lanes, so they run as primitives, each batched whole.
//!
//! A node depends on the levels (the `vmap_level` nodes) its inputs depend
//! on; `vmap_in` adds its level, `vmap_out` and `vmap_sum` remove theirs.
//! Parameters of a graph called by name (or chosen by a `switch` that is
//! only called) take the levels of its arguments at every call; a call
//! whose callee is not known so passes levels to the parameters of every
//! graph used as a value. Solved with a worklist: a node is looked at
//! again only when what it reads gained a level, so the cost is about
//! one visit per node even on modules of hundreds of thousands.

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::ir::{Const, GraphId, Module, NodeId, NodeKind};
use crate::prim::Prim;

/// Levels of an unknown callee's arguments: never removed.
const UNKNOWN: NodeId = NodeId(u32::MAX);

type Levels = BTreeSet<NodeId>;

/// The nodes of `graphs` (applications and parameters) that may hold
/// values with lanes, and the graphs applying any of them. Empty when no
/// graph maps a function.
pub fn lane_nodes<S: std::hash::BuildHasher>(
    m: &Module,
    graphs: &[GraphId],
    bodies: &std::collections::HashMap<GraphId, Vec<NodeId>, S>,
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
    // `switch(c, @a, @b)` nodes used other than as a callee (their
    // graphs are then values).
    let mut switch_values: HashSet<NodeId> = HashSet::default();
    for g in graphs {
        switch_values.extend(m.graph(*g).output);
        for &n in &bodies[g] {
            if let NodeKind::Apply(inputs) = &m.node(n).kind {
                switch_values.extend(inputs[1..].iter().copied());
            }
        }
    }
    // Graphs used as values (not only called by name or chosen by a
    // `switch` that is only called).
    let mut as_value: HashSet<GraphId> = HashSet::default();
    for g in graphs {
        for &n in &bodies[g] {
            if m.graph_switch(n).is_some() && !switch_values.contains(&n) {
                continue;
            }
            if let NodeKind::Apply(inputs) = &m.node(n).kind {
                for &i in &inputs[1..] {
                    if let Some(Const::Graph(h)) = m.as_const(i) {
                        as_value.insert(*h);
                    }
                }
            }
        }
    }
    // The graphs a callee may be: by name, mapped, or chosen by a
    // `switch` (none: not known).
    let known_callees = |c: NodeId| -> Vec<GraphId> {
        if let Some(Const::Graph(h)) = m.as_const(c) {
            return vec![*h];
        }
        if m.applied_prim(c) == Some(Prim::VmapFn) {
            if let Some(Const::Graph(h)) = m.as_const(m.inputs(c)[1]) {
                return vec![*h];
            }
        }
        match m.graph_switch(c) {
            Some((_, a, b)) if !switch_values.contains(&c) => vec![a, b],
            _ => Vec::new(),
        }
    };
    // Who to look at again when a node gains levels: the applications
    // reading it, and, for a graph's output, the calls of that graph.
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    let mut callers: HashMap<GraphId, Vec<NodeId>> = HashMap::default();
    // Per call: the graphs it is known to call (none: unknown).
    let mut callees: HashMap<NodeId, Vec<GraphId>> = HashMap::default();
    for g in graphs {
        for &n in &bodies[g] {
            let NodeKind::Apply(inputs) = &m.node(n).kind else {
                continue;
            };
            for &i in inputs.iter() {
                users.entry(i).or_default().push(n);
            }
            if m.applied_prim(n).is_none() {
                let hs = known_callees(inputs[0]);
                for &h in &hs {
                    callers.entry(h).or_default().push(n);
                }
                callees.insert(n, hs);
            }
        }
    }
    let outputs: HashMap<NodeId, Vec<GraphId>> = {
        let mut o: HashMap<NodeId, Vec<GraphId>> = HashMap::default();
        for g in m.graph_ids() {
            if let Some(out) = m.graph(g).output {
                if callers.contains_key(&g) {
                    o.entry(out).or_default().push(g);
                }
            }
        }
        o
    };
    // Level sets are interned (most nodes share one of a few), and each
    // node holds the index of its set: 0, the empty set, for most.
    let mut sets = Sets::default();
    let mut levels: Vec<u32> = vec![0; m.nodes.len()];
    let mut work: Vec<NodeId> = graphs
        .iter()
        .flat_map(|g| bodies[g].iter().copied())
        .collect();
    let mut queued: Vec<bool> = vec![false; m.nodes.len()];
    for n in &work {
        queued[n.index()] = true;
    }
    let mut unknown_done = false;
    // Adds set `new` to the levels of `n`; when they grow, queues what
    // reads `n`.
    let grow = |n: NodeId,
                new: u32,
                sets: &mut Sets,
                levels: &mut Vec<u32>,
                work: &mut Vec<NodeId>,
                queued: &mut Vec<bool>| {
        let old = levels[n.index()];
        let joined = sets.union(old, new);
        if joined == old {
            return;
        }
        levels[n.index()] = joined;
        let next = users.get(&n).into_iter().flatten().copied().chain(
            outputs
                .get(&n)
                .into_iter()
                .flatten()
                .flat_map(|h| callers.get(h).into_iter().flatten().copied()),
        );
        for u in next {
            if !std::mem::replace(&mut queued[u.index()], true) {
                work.push(u);
            }
        }
    };
    while let Some(n) = work.pop() {
        queued[n.index()] = false;
        let NodeKind::Apply(inputs) = &m.node(n).kind else {
            continue;
        };
        let at = |i: NodeId| levels.get(i.index()).copied().unwrap_or(0);
        let new = match m.applied_prim(n) {
            Some(Prim::VmapIn) => sets.with(at(inputs[1]), inputs[3]),
            Some(Prim::VmapOut) => sets.without(at(inputs[1]), inputs[3]),
            Some(Prim::VmapSum) => sets.without(at(inputs[1]), inputs[2]),
            Some(_) => inputs[1..].iter().fold(0, |a, i| sets.union(a, at(*i))),
            None => {
                let args = inputs[1..].iter().fold(0, |a, i| sets.union(a, at(*i)));
                let mut s = sets.union(args, at(inputs[0]));
                let hs = callees.get(&n).cloned().unwrap_or_default();
                let known = !hs.is_empty() && hs.iter().all(|h| in_set.contains(h));
                let mut updates: Vec<(NodeId, u32)> = Vec::new();
                for h in hs.into_iter().filter(|h| in_set.contains(h)) {
                    for (k, a) in inputs[1..].iter().enumerate() {
                        if let Some(&p) = m.graph(h).params.get(k) {
                            updates.push((p, at(*a)));
                        }
                    }
                    if let Some(o) = m.graph(h).output {
                        s = sets.union(s, at(o));
                    }
                }
                for (p, l) in updates {
                    grow(p, l, &mut sets, &mut levels, &mut work, &mut queued);
                }
                if !known && args != 0 && !unknown_done {
                    // Every graph used as a value may be this callee.
                    unknown_done = true;
                    let unknown = sets.with(0, UNKNOWN);
                    for h in &as_value {
                        for &p in &m.graph(*h).params {
                            grow(p, unknown, &mut sets, &mut levels, &mut work, &mut queued);
                        }
                    }
                }
                s
            }
        };
        grow(n, new, &mut sets, &mut levels, &mut work, &mut queued);
    }
    let nodes: HashSet<NodeId> = levels
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != 0)
        .map(|(i, _)| NodeId(i as u32))
        .collect();
    let graphs_with = graphs
        .iter()
        .copied()
        .filter(|g| bodies[g].iter().any(|n| nodes.contains(n)))
        .collect();
    (nodes, graphs_with)
}

/// Interned sets of levels: index 0 is the empty set.
struct Sets {
    sets: Vec<Levels>,
    ids: HashMap<Levels, u32>,
    unions: HashMap<(u32, u32), u32>,
}

impl Default for Sets {
    fn default() -> Sets {
        Sets {
            sets: vec![Levels::new()],
            ids: [(Levels::new(), 0)].into_iter().collect(),
            unions: HashMap::default(),
        }
    }
}

impl Sets {
    fn id(&mut self, s: Levels) -> u32 {
        if let Some(&i) = self.ids.get(&s) {
            return i;
        }
        let i = self.sets.len() as u32;
        self.sets.push(s.clone());
        self.ids.insert(s, i);
        i
    }

    fn union(&mut self, a: u32, b: u32) -> u32 {
        if a == b || b == 0 {
            return a;
        }
        if a == 0 {
            return b;
        }
        let key = (a.min(b), a.max(b));
        if let Some(&u) = self.unions.get(&key) {
            return u;
        }
        let mut s = self.sets[a as usize].clone();
        s.extend(self.sets[b as usize].iter().copied());
        let u = self.id(s);
        self.unions.insert(key, u);
        u
    }

    fn with(&mut self, a: u32, level: NodeId) -> u32 {
        let mut s = self.sets[a as usize].clone();
        s.insert(level);
        self.id(s)
    }

    fn without(&mut self, a: u32, level: NodeId) -> u32 {
        if !self.sets[a as usize].contains(&level) {
            return a;
        }
        let mut s = self.sets[a as usize].clone();
        s.remove(&level);
        self.id(s)
    }
}
