//! Copying a closed set of graphs from one module into another: the graphs
//! reachable from some roots, with new ids in the destination.
//!
//! Reverse mode uses it to differentiate a simplified copy of a derivative
//! (see `ad::run`): the copy is made in a module of its own, optimised
//! there, and copied back.

use rustc_hash::FxHashMap as HashMap;

use super::analysis::owned_nodes;
use super::{Const, GraphId, Module, NodeId, NodeKind};

/// Copies the graphs reachable from `roots` in `src` (with every node they
/// own, dead or not) into `dst`; returns where each copied graph went, and
/// the free variables of the whole set (nodes it uses that a graph outside
/// it owns), in the order the copy of `roots[0]` takes them as parameters
/// after its own: with `lift_free`, each becomes one; without, the copy
/// fails (`None`) unless the set is closed. The graphs of `keep` are not
/// copied (nor what only they reach): uses of them name the graph of `dst`
/// they map to.
pub fn copy_reachable(
    src: &Module,
    roots: &[GraphId],
    dst: &mut Module,
    lift_free: bool,
    keep: &HashMap<GraphId, GraphId>,
) -> Option<(HashMap<GraphId, GraphId>, Vec<NodeId>)> {
    let owned = owned_nodes(src);
    let graphs = reachable_except(src, roots, &owned, keep);
    let mut gmap: HashMap<GraphId, GraphId> = keep.clone();
    for &g in &graphs {
        let sg = src.graph(g);
        gmap.insert(g, dst.add_graph_as(sg.name.clone(), sg.loc, sg.role));
    }
    let mut nmap: HashMap<NodeId, NodeId> = HashMap::default();
    for &g in &graphs {
        let sg = src.graph(g);
        for (p, name) in sg.params.iter().zip(&sg.param_names) {
            let p2 = dst.add_param(gmap[&g], name.clone(), src.node(*p).loc);
            nmap.insert(*p, p2);
        }
        for &n in &owned[g.index()] {
            if matches!(src.node(n).kind, NodeKind::Apply(_)) {
                let n2 = dst.add_apply(gmap[&g], Vec::new(), src.node(n).loc);
                nmap.insert(n, n2);
            }
        }
    }
    // Constants are copied once each (graph constants renamed).
    let mut free = Vec::new();
    let mut map_input = |dst: &mut Module, i: NodeId| -> Option<NodeId> {
        if let Some(j) = nmap.get(&i) {
            return Some(*j);
        }
        let node = src.node(i);
        let NodeKind::Const(c) = &node.kind else {
            if !lift_free {
                return None;
            }
            let p = dst.add_param(gmap[&roots[0]], "", node.loc);
            free.push(i);
            nmap.insert(i, p);
            return Some(p);
        };
        let c = match c {
            Const::Graph(h) => Const::Graph(*gmap.get(h)?),
            c => c.clone(),
        };
        let j = dst.add_const(c, node.loc);
        nmap.insert(i, j);
        Some(j)
    };
    for &g in &graphs {
        for &n in &owned[g.index()] {
            let NodeKind::Apply(inputs) = &src.node(n).kind else {
                continue;
            };
            let mut ins = Vec::with_capacity(inputs.len());
            for &i in inputs {
                ins.push(map_input(dst, i)?);
            }
            let n2 = map_input(dst, n)?;
            dst.node_mut(n2).kind = NodeKind::Apply(ins);
        }
        if let Some(out) = src.graph(g).output {
            let out2 = map_input(dst, out)?;
            dst.set_output(gmap[&g], out2);
        }
    }
    for k in keep.keys() {
        gmap.remove(k);
    }
    Some((gmap, free))
}

/// The graphs reachable from `roots` without passing through `keep`.
fn reachable_except(
    m: &Module,
    roots: &[GraphId],
    owned: &[Vec<NodeId>],
    keep: &HashMap<GraphId, GraphId>,
) -> Vec<GraphId> {
    let mut seen: rustc_hash::FxHashSet<GraphId> = keep.keys().copied().collect();
    let mut order = Vec::new();
    let mut stack: Vec<GraphId> = roots.to_vec();
    while let Some(g) = stack.pop() {
        if !seen.insert(g) {
            continue;
        }
        order.push(g);
        for &n in &owned[g.index()] {
            for &i in m.inputs(n) {
                if let Some(Const::Graph(h)) = m.as_const(i) {
                    stack.push(*h);
                }
            }
        }
        if let Some(Const::Graph(h)) = m.graph(g).output.and_then(|o| m.as_const(o)) {
            stack.push(*h);
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prim::Prim;

    #[test]
    fn copies_a_closure_with_its_captures_and_refuses_an_open_set() {
        let mut m = Module::default();
        let loc = crate::ir::Loc::default();
        let f = m.add_graph("f", loc);
        let x = m.add_param(f, "x", loc);
        let sq = m.add_prim(f, Prim::Mul, &[x, x], loc);
        let k = m.add_graph("k", loc);
        let y = m.add_param(k, "y", loc);
        let s = m.add_prim(k, Prim::Add, &[y, sq], loc);
        m.set_output(k, s);
        let kc = m.add_const(Const::Graph(k), loc);
        let call = m.add_apply(f, vec![kc, x], loc);
        m.set_output(f, call);
        let mut dst = Module::default();
        let (gmap, free) =
            copy_reachable(&m, &[f], &mut dst, false, &HashMap::default()).expect("closed");
        assert!(free.is_empty());
        assert_eq!(gmap.len(), 2);
        let text = crate::ir::print::print_module(&dst, &[gmap[&f]], None);
        assert!(text.contains("mul("), "{text}");
        crate::ir::verify::verify_reachable(&dst, &[gmap[&f]]).expect("valid copy");
        // `k` alone captures `f`'s node: not closed, unless it becomes a
        // parameter of the copy.
        assert!(
            copy_reachable(&m, &[k], &mut Module::default(), false, &HashMap::default()).is_none()
        );
        let mut dst = Module::default();
        let (gmap, free) =
            copy_reachable(&m, &[k], &mut dst, true, &HashMap::default()).expect("lifted");
        assert_eq!(free, vec![sq]);
        assert_eq!(dst.graph(gmap[&k]).params.len(), 2);
    }
}
