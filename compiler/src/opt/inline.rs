//! Inlining a call of a known graph, with the closures nested in it.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::Rewriter;
use crate::ir::analysis::graph_body_with;
use crate::ir::{Const, GraphId, NodeId};

impl Rewriter<'_> {
    /// The graph `h` and the graphs nested in it (transitively: graphs with
    /// a free variable owned by one of them), parents before children.
    pub(super) fn nest(&self, h: GraphId) -> Vec<GraphId> {
        let mut set = vec![h];
        let mut seen: HashSet<GraphId> = [h].into_iter().collect();
        let mut i = 0;
        while i < set.len() {
            if let Some(cs) = self.children.get(&set[i]) {
                for &c in cs {
                    if seen.insert(c) {
                        set.push(c);
                    }
                }
            }
            i += 1;
        }
        // Order so that the owner of every free variable comes first.
        let mut order = Vec::with_capacity(set.len());
        let mut placed: HashSet<GraphId> = HashSet::default();
        while order.len() < set.len() {
            let before = order.len();
            for &k in &set {
                if placed.contains(&k) {
                    continue;
                }
                let ready = self.fv.get(k).iter().all(|v| match self.m.node(*v).graph {
                    Some(o) => o == k || !seen.contains(&o) || placed.contains(&o),
                    None => true,
                });
                if ready {
                    placed.insert(k);
                    order.push(k);
                }
            }
            if order.len() == before {
                // Not expected for lexically nested graphs; keep going in
                // discovery order.
                for &k in &set {
                    if placed.insert(k) {
                        order.push(k);
                    }
                }
            }
        }
        order
    }

    /// Whether a call of `h` with `nargs` arguments may be inlined now.
    pub(super) fn can_inline(&self, h: GraphId, nargs: usize) -> bool {
        !self.recursive.contains(&h) && self.can_inline_body(h, nargs)
    }

    /// [`Self::can_inline`] but for recursion: whether copying `h` here is
    /// possible and within the size limits.
    pub(super) fn can_inline_body(&self, h: GraphId, nargs: usize) -> bool {
        if h.index() >= self.graphs_at_start {
            return false;
        }
        let g = self.m.graph(h);
        if g.output.is_none() || g.params.len() != nargs {
            return false;
        }
        if self.m.nodes.len() > self.budget {
            return false;
        }
        let nest = self.nest(h);
        let mut size = 0;
        for k in &nest {
            if self.dirty.contains(k) || k.index() >= self.graphs_at_start {
                return false;
            }
            size += self.body(*k).len();
        }
        size <= self.opts.max_inline_size
    }

    fn body(&self, k: GraphId) -> Vec<NodeId> {
        match self.bodies.get(&k) {
            Some(b) => b.clone(),
            None => graph_body_with(self.m, k, self.fv),
        }
    }

    /// Copies the body of `h` into `g` in place of call `call` (whose
    /// arguments are `args`), cloning the graphs nested in `h`. Returns the
    /// node standing for the call's result.
    pub(super) fn inline(
        &mut self,
        g: GraphId,
        call: NodeId,
        h: GraphId,
        args: &[NodeId],
    ) -> NodeId {
        let site = self.m.node(call).loc;
        self.inline_at(g, site, h, args)
    }

    /// [`Self::inline`] with the location of the call given: copied
    /// standard-library nodes take it.
    pub(super) fn inline_at(
        &mut self,
        g: GraphId,
        site: crate::ir::Loc,
        h: GraphId,
        args: &[NodeId],
    ) -> NodeId {
        let nest = self.nest(h);
        let mut nmap: HashMap<NodeId, NodeId> = HashMap::default();
        let mut gmap: HashMap<GraphId, GraphId> = HashMap::default();
        for (p, a) in self.m.graph(h).params.clone().iter().zip(args) {
            nmap.insert(*p, *a);
        }
        for &k in &nest[1..] {
            let kg = self.m.graph(k).clone();
            let loc = self.relocate(kg.loc, site);
            let k2 = self.m.add_graph_as(kg.name.clone(), loc, kg.role);
            gmap.insert(k, k2);
            for (p, nm) in kg.params.iter().zip(&kg.param_names) {
                let ploc = self.m.node(*p).loc;
                let p2 = self.m.add_param(k2, nm.clone(), ploc);
                nmap.insert(*p, p2);
            }
        }
        let mut gconst: HashMap<GraphId, NodeId> = HashMap::default();
        for &k in &nest {
            let target = if k == h { g } else { gmap[&k] };
            for n in self.body(k) {
                let inputs: Vec<NodeId> = self.m.inputs(n).to_vec();
                let mut new_inputs = Vec::with_capacity(inputs.len());
                for i in inputs {
                    let i = self.resolve(i);
                    new_inputs.push(self.map_node(i, &nmap, &gmap, &mut gconst));
                }
                let loc = self.relocate(self.m.node(n).loc, site);
                let n2 = self.m.add_apply(target, new_inputs, loc);
                nmap.insert(n, n2);
            }
            if k != h {
                let out = self.m.graph(k).output.expect("checked by can_inline");
                let out = self.resolve(out);
                let o2 = self.map_node(out, &nmap, &gmap, &mut gconst);
                self.m.set_output(gmap[&k], o2);
            }
        }
        self.dirty.insert(g);
        let out = self.m.graph(h).output.expect("checked by can_inline");
        let out = self.resolve(out);
        self.map_node(out, &nmap, &gmap, &mut gconst)
    }

    fn map_node(
        &mut self,
        n: NodeId,
        nmap: &HashMap<NodeId, NodeId>,
        gmap: &HashMap<GraphId, GraphId>,
        gconst: &mut HashMap<GraphId, NodeId>,
    ) -> NodeId {
        if let Some(x) = nmap.get(&n) {
            return *x;
        }
        if let Some(Const::Graph(k)) = self.m.as_const(n) {
            if let Some(k2) = gmap.get(k) {
                let k2 = *k2;
                let loc = self.m.node(n).loc;
                return *gconst
                    .entry(k2)
                    .or_insert_with(|| self.m.add_const(Const::Graph(k2), loc));
            }
        }
        n
    }
}
