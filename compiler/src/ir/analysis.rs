//! Derived facts about a [`Module`], computed into side tables: the body of
//! each graph in dependency order, the graphs each graph refers to, free
//! variables, and users. All traversals are iterative, so long programs
//! cannot overflow the Rust stack.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::{Const, GraphId, Module, NodeId, NodeKind};

/// The nodes owned by each graph (parameters and applications, dead ones
/// included), from one scan of the arena.
pub fn owned_nodes(m: &Module) -> Vec<Vec<NodeId>> {
    let mut owned = vec![Vec::new(); m.graphs.len()];
    for (i, node) in m.nodes.iter().enumerate() {
        if let Some(g) = node.graph {
            owned[g.index()].push(NodeId(i as u32));
        }
    }
    owned
}

/// The application nodes owned by `g` that its output depends on, in
/// dependency order (every node after the nodes it uses). A graph constant
/// `@h` used by a node depends on the free variables of `h` that `g` owns
/// (a closure is made after what it captures), so a node used only inside
/// a nested graph is part of the body too. Parameters, constants and nodes
/// owned by other graphs are not listed.
pub fn graph_body(m: &Module, g: GraphId) -> Vec<NodeId> {
    graph_body_with(m, g, &free_variables(m))
}

/// [`graph_body`] with precomputed free variables.
pub fn graph_body_with(m: &Module, g: GraphId, fv: &FreeVars) -> Vec<NodeId> {
    let Some(out) = m.graph(g).output else {
        return Vec::new();
    };
    let owned_apply = |n: NodeId| {
        let node = m.node(n);
        node.graph == Some(g) && matches!(node.kind, NodeKind::Apply(_))
    };
    // The dependencies of a node: its inputs, and for each graph constant
    // among them (or the node itself, for the output), that graph's free
    // variables.
    let deps = |n: NodeId| -> Vec<NodeId> {
        let mut d = Vec::new();
        let push_graph = |h: GraphId, d: &mut Vec<NodeId>| {
            d.extend(fv.get(h).iter().copied());
        };
        match &m.node(n).kind {
            NodeKind::Apply(inputs) => {
                for &i in inputs {
                    d.push(i);
                    if let Some(Const::Graph(h)) = m.as_const(i) {
                        push_graph(*h, &mut d);
                    }
                }
            }
            NodeKind::Const(Const::Graph(h)) => push_graph(*h, &mut d),
            _ => {}
        }
        d
    };
    let mut order = Vec::new();
    let mut seen = HashSet::default();
    let mut stack: Vec<(NodeId, Vec<NodeId>, usize)> = Vec::new();
    // The output itself may be a graph constant whose captures are owned here.
    let roots = if owned_apply(out) {
        vec![out]
    } else {
        deps(out)
    };
    for root in roots {
        if !owned_apply(root) || !seen.insert(root) {
            continue;
        }
        stack.push((root, deps(root), 0));
        while let Some((n, ds, i)) = stack.last_mut() {
            if *i < ds.len() {
                let child = ds[*i];
                *i += 1;
                if owned_apply(child) && seen.insert(child) {
                    let cd = deps(child);
                    stack.push((child, cd, 0));
                }
            } else {
                order.push(*n);
                stack.pop();
            }
        }
    }
    order
}

/// The graphs referred to by graph constants that `g`'s nodes use.
pub fn graph_refs(m: &Module, g: GraphId) -> Vec<GraphId> {
    let owned = owned_nodes(m);
    graph_refs_in(m, g, &owned[g.index()])
}

fn graph_refs_in(m: &Module, g: GraphId, owned: &[NodeId]) -> Vec<GraphId> {
    let mut refs = Vec::new();
    let mut seen = HashSet::default();
    for u in used_nodes(m, g, owned) {
        if let Some(Const::Graph(h)) = m.as_const(u) {
            if seen.insert(*h) {
                refs.push(*h);
            }
        }
    }
    refs
}

/// Every node the owned nodes of `g` use as inputs, and its output.
fn used_nodes(m: &Module, g: GraphId, owned: &[NodeId]) -> Vec<NodeId> {
    let mut used = Vec::new();
    for &n in owned {
        used.extend_from_slice(m.inputs(n));
    }
    if let Some(out) = m.graph(g).output {
        used.push(out);
    }
    used
}

/// Side table of free variables: for each graph, the nodes owned by other
/// graphs that it (or a graph it refers to, transitively) uses, in a
/// deterministic order. A closure of graph `g` captures exactly these.
#[derive(Clone, Debug, Default)]
pub struct FreeVars {
    pub of: Vec<Vec<NodeId>>,
}

impl FreeVars {
    pub fn get(&self, g: GraphId) -> &[NodeId] {
        &self.of[g.index()]
    }

    /// [`FreeVars::get`], or `None` for a graph made after the table was
    /// computed (a pass that creates graphs reads a snapshot taken before).
    pub fn try_get(&self, g: GraphId) -> Option<&[NodeId]> {
        self.of.get(g.index()).map(Vec::as_slice)
    }
}

pub fn free_variables(m: &Module) -> FreeVars {
    free_variables_with(m, &owned_nodes(m))
}

/// [`free_variables`] given [`owned_nodes`].
pub fn free_variables_with(m: &Module, owned: &[Vec<NodeId>]) -> FreeVars {
    let n = m.graphs.len();
    let mut of: Vec<Vec<NodeId>> = Vec::with_capacity(n);
    let mut refs: Vec<Vec<GraphId>> = Vec::with_capacity(n);
    for g in m.graph_ids() {
        let mut fv = Vec::new();
        let mut seen = HashSet::default();
        for u in used_nodes(m, g, &owned[g.index()]) {
            let node = m.node(u);
            if !matches!(node.kind, NodeKind::Const(_)) && node.graph != Some(g) && seen.insert(u) {
                fv.push(u);
            }
        }
        of.push(fv);
        refs.push(graph_refs_in(m, g, &owned[g.index()]));
    }
    // Propagate through graph references to a fixpoint.
    let mut sets: Vec<HashSet<NodeId>> = of.iter().map(|v| v.iter().copied().collect()).collect();
    let mut changed = true;
    while changed {
        changed = false;
        for g in 0..n {
            for &h in &refs[g] {
                if h.index() == g {
                    continue;
                }
                let add: Vec<NodeId> = of[h.index()]
                    .iter()
                    .copied()
                    .filter(|v| m.node(*v).graph != Some(GraphId(g as u32)))
                    .filter(|v| !sets[g].contains(v))
                    .collect();
                if !add.is_empty() {
                    changed = true;
                    for v in add {
                        sets[g].insert(v);
                        of[g].push(v);
                    }
                }
            }
        }
    }
    FreeVars { of }
}

/// Users of every node: `(user, input position)` pairs.
pub fn users(m: &Module) -> HashMap<NodeId, Vec<(NodeId, usize)>> {
    let mut map: HashMap<NodeId, Vec<(NodeId, usize)>> = HashMap::default();
    for (i, node) in m.nodes.iter().enumerate() {
        if let NodeKind::Apply(inputs) = &node.kind {
            for (pos, &inp) in inputs.iter().enumerate() {
                map.entry(inp).or_default().push((NodeId(i as u32), pos));
            }
        }
    }
    map
}

/// Graphs reachable from `roots` through graph constants, roots first.
pub fn reachable_graphs(m: &Module, roots: &[GraphId]) -> Vec<GraphId> {
    reachable_graphs_with(m, roots, &owned_nodes(m))
}

/// [`reachable_graphs`] given [`owned_nodes`].
pub fn reachable_graphs_with(m: &Module, roots: &[GraphId], owned: &[Vec<NodeId>]) -> Vec<GraphId> {
    let mut seen: HashSet<GraphId> = HashSet::default();
    let mut order = Vec::new();
    let mut stack: Vec<GraphId> = roots.iter().rev().copied().collect();
    while let Some(g) = stack.pop() {
        if !seen.insert(g) {
            continue;
        }
        order.push(g);
        for h in graph_refs_in(m, g, &owned[g.index()]).into_iter().rev() {
            if !seen.contains(&h) {
                stack.push(h);
            }
        }
    }
    order
}

/// Whether two nodes compute the same value: the same node, equal
/// constants, or the same operation on nodes that compute the same values
/// (the IR has no side effects outside the IO token, which differs between
/// IO operations).
pub fn same_expr(m: &Module, a: NodeId, b: NodeId, depth: u32) -> bool {
    if a == b {
        return true;
    }
    if depth == 0 {
        return false;
    }
    if let (Some(x), Some(y)) = (m.as_const(a), m.as_const(b)) {
        return x == y;
    }
    let (ia, ib) = (m.inputs(a), m.inputs(b));
    !ia.is_empty()
        && ia.len() == ib.len()
        && ia
            .iter()
            .zip(ib)
            .all(|(x, y)| same_expr(m, *x, *y, depth - 1))
}

/// For a slice `lo : hi` whose `hi` is `lo' + c` or `c + lo'`, with `lo'`
/// computing the same value as `lo`: the node `c` (the slice's length).
pub fn window_len(m: &Module, lo: NodeId, hi: NodeId) -> Option<NodeId> {
    if m.applied_prim(hi) != Some(crate::prim::Prim::Add) {
        return None;
    }
    let &[_, x, y] = m.inputs(hi) else {
        return None;
    };
    if same_expr(m, x, lo, 16) {
        Some(y)
    } else if same_expr(m, y, lo, 16) {
        Some(x)
    } else {
        None
    }
}
