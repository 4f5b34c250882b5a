//! Structural invariants of a [`Module`], checked after every pass in debug
//! builds and in tests.
//!
//! - every id (node, graph, input, parameter, output) is in range;
//! - constants belong to no graph; parameters and applications belong to
//!   one, and a parameter's graph lists it at its index; `param_names` is
//!   parallel to `params`;
//! - an application has a callee (`inputs[0]`);
//! - every graph has an output;
//! - a node of graph `g` (and `g`'s output) only uses constants, nodes of
//!   `g`, and nodes of graphs that refer to `g`, directly or through other
//!   graphs, by graph constants (free variables a closure can capture);
//! - a call of a primitive passes as many arguments as its row of the
//!   primitive table allows;
//! - the applications of a graph form no cycle.
//!
//! Messages name the graph (`@name`) and the node (its arena id, `%12`,
//! with what it is), so they can be matched with the output of
//! [`super::print`] only loosely: the printer renumbers.

use std::collections::{HashMap, HashSet};

use super::print::DisplayConst;
use super::{Const, GraphId, Module, NodeId, NodeKind};

/// Checks the whole module: every node and every graph.
pub fn verify(m: &Module) -> Result<(), Vec<String>> {
    let scope = vec![true; m.graphs.len()];
    Checker::new(m, scope).run()
}

/// Checks only the graphs printed for `roots` (those reachable from them
/// through graph constants, and the owners of the free variables they
/// use), and the nodes they own: for modules in which a pass left dead
/// graphs behind.
pub fn verify_reachable(m: &Module, roots: &[GraphId]) -> Result<(), Vec<String>> {
    let mut scope = vec![false; m.graphs.len()];
    for g in super::print::layout(m, roots).graphs {
        scope[g.index()] = true;
    }
    for &r in roots {
        if r.index() >= m.graphs.len() {
            return Err(vec![format!(
                "root graph {} is out of range ({} graphs)",
                r,
                m.graphs.len()
            )]);
        }
    }
    Checker::new(m, scope).run()
}

struct Checker<'a> {
    m: &'a Module,
    scope: Vec<bool>,
    errors: Vec<String>,
    /// Graphs referred to by graph constants used in each graph.
    refs: Vec<Vec<GraphId>>,
    /// Answers of [`Checker::refers_to`] so far.
    known: HashMap<(GraphId, GraphId), bool>,
    /// Search marks: `mark[g] == stamp` when the current search met `g`.
    mark: Vec<u32>,
    stamp: u32,
}

impl<'a> Checker<'a> {
    fn new(m: &'a Module, scope: Vec<bool>) -> Checker<'a> {
        Checker {
            m,
            scope,
            errors: Vec::new(),
            refs: Vec::new(),
            known: HashMap::new(),
            mark: vec![0; m.graphs.len()],
            stamp: 0,
        }
    }

    fn run(mut self) -> Result<(), Vec<String>> {
        self.nodes();
        self.graphs();
        if self.errors.is_empty() {
            // The checks below follow ids, so they need them in range.
            self.compute_refs();
            self.uses();
            self.cycles();
        }
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors)
        }
    }

    fn node_ok(&self, n: NodeId) -> bool {
        n.index() < self.m.nodes.len()
    }

    fn gname(&self, g: GraphId) -> String {
        match self.m.graphs.get(g.index()) {
            Some(graph) => format!("@{}", graph.name),
            None => format!("{g} (out of range)"),
        }
    }

    /// `%12 (add)`, `%3 (param 0 `x` of @f)`, `%5 (constant 1.0)`.
    fn describe(&self, n: NodeId) -> String {
        let Some(node) = self.m.nodes.get(n.index()) else {
            return format!("{n} (out of range)");
        };
        match &node.kind {
            NodeKind::Param { index } => {
                let name = node
                    .graph
                    .and_then(|g| self.m.graphs.get(g.index()))
                    .and_then(|g| g.param_names.get(*index as usize))
                    .map(|s| format!(" `{s}`"))
                    .unwrap_or_default();
                format!("{n} (param {index}{name})")
            }
            NodeKind::Const(c) => format!(
                "{n} (constant {})",
                DisplayConst {
                    module: self.m,
                    value: c
                }
            ),
            NodeKind::Apply(inputs) => {
                let what = match inputs.first().and_then(|c| self.m.nodes.get(c.index())) {
                    Some(callee) => match &callee.kind {
                        NodeKind::Const(Const::Prim(p)) => p.name().to_string(),
                        NodeKind::Const(Const::Graph(g)) => format!("call of {}", self.gname(*g)),
                        _ => "call".to_string(),
                    },
                    None => "apply".to_string(),
                };
                format!("{n} ({what})")
            }
        }
    }

    fn in_scope(&self, owner: Option<GraphId>) -> bool {
        match owner {
            None => true,
            Some(g) => self.scope.get(g.index()).copied().unwrap_or(true),
        }
    }

    /// Node-local facts: ownership, ids in range, callee present.
    fn nodes(&mut self) {
        let m = self.m;
        let ng = m.graphs.len();
        for (i, node) in m.nodes.iter().enumerate() {
            let n = NodeId(i as u32);
            if !self.in_scope(node.graph) {
                continue;
            }
            if let Some(g) = node.graph {
                if g.index() >= ng {
                    self.errors.push(format!(
                        "{}: owner graph {g} is out of range ({ng} graphs)",
                        self.describe(n)
                    ));
                    continue;
                }
            }
            match &node.kind {
                NodeKind::Const(c) => {
                    if let Some(g) = node.graph {
                        self.errors.push(format!(
                            "graph {}: {} is a constant but belongs to a graph (constants belong to none)",
                            self.gname(g),
                            self.describe(n)
                        ));
                    }
                    if let Const::Graph(h) = c {
                        if h.index() >= ng {
                            self.errors.push(format!(
                                "{n}: constant refers to graph {h}, out of range ({ng} graphs)"
                            ));
                        }
                    }
                }
                NodeKind::Param { index } => {
                    let Some(g) = node.graph else {
                        self.errors.push(format!(
                            "{}: parameter belongs to no graph",
                            self.describe(n)
                        ));
                        continue;
                    };
                    if m.graph(g).params.get(*index as usize) != Some(&n) {
                        self.errors.push(format!(
                            "graph {}: {} is not its graph's parameter {index} ({} parameters)",
                            self.gname(g),
                            self.describe(n),
                            m.graph(g).params.len()
                        ));
                    }
                }
                NodeKind::Apply(inputs) => {
                    let owner = match node.graph {
                        Some(g) => self.gname(g),
                        None => {
                            self.errors.push(format!(
                                "{}: application belongs to no graph",
                                self.describe(n)
                            ));
                            continue;
                        }
                    };
                    if inputs.is_empty() {
                        self.errors.push(format!(
                            "graph {owner}: {}: application has no callee",
                            self.describe(n)
                        ));
                    }
                    let mut ok = !inputs.is_empty();
                    for (pos, &u) in inputs.iter().enumerate() {
                        if !self.node_ok(u) {
                            ok = false;
                            self.errors.push(format!(
                                "graph {owner}: {}: input {pos} is {u}, out of range ({} nodes)",
                                self.describe(n),
                                m.nodes.len()
                            ));
                        }
                    }
                    if ok {
                        self.arity(n, &owner);
                    }
                }
            }
        }
    }

    /// A call of a primitive passes an allowed number of arguments.
    fn arity(&mut self, n: NodeId, owner: &str) {
        let Some(p) = self.m.applied_prim(n) else {
            return;
        };
        let info = p.info();
        let got = self.m.inputs(n).len() - 1;
        let required = info.params.iter().filter(|p| p.default.is_none()).count();
        let max = info.params.len();
        let ok = got >= required && (info.variadic || got <= max);
        if !ok {
            let expected = if info.variadic {
                format!("at least {required}")
            } else if required == max {
                format!("{max}")
            } else {
                format!("{required} to {max}")
            };
            self.errors.push(format!(
                "graph {owner}: {}: `{}` takes {expected} arguments, got {got}",
                self.describe(n),
                p.name()
            ));
        }
    }

    /// Graph-level facts: parameter lists and outputs.
    fn graphs(&mut self) {
        let m = self.m;
        for (gi, graph) in m.graphs.iter().enumerate() {
            let g = GraphId(gi as u32);
            if !self.scope[gi] {
                continue;
            }
            let name = self.gname(g);
            if graph.param_names.len() != graph.params.len() {
                self.errors.push(format!(
                    "graph {name}: {} parameter names for {} parameters",
                    graph.param_names.len(),
                    graph.params.len()
                ));
            }
            let mut seen = HashSet::new();
            for (k, &p) in graph.params.iter().enumerate() {
                if !self.node_ok(p) {
                    self.errors.push(format!(
                        "graph {name}: parameter {k} is {p}, out of range ({} nodes)",
                        m.nodes.len()
                    ));
                    continue;
                }
                if !seen.insert(p) {
                    self.errors
                        .push(format!("graph {name}: {p} is listed twice as a parameter"));
                }
                let node = m.node(p);
                let index_ok =
                    matches!(node.kind, NodeKind::Param { index } if index as usize == k);
                if !index_ok || node.graph != Some(g) {
                    self.errors.push(format!(
                        "graph {name}: parameter {k} is {}, which is not a parameter of {name} at index {k}",
                        self.describe(p)
                    ));
                }
            }
            match graph.output {
                None => self.errors.push(format!("graph {name}: no output")),
                Some(o) if !self.node_ok(o) => self.errors.push(format!(
                    "graph {name}: output {o} is out of range ({} nodes)",
                    m.nodes.len()
                )),
                Some(_) => {}
            }
        }
    }

    fn compute_refs(&mut self) {
        let m = self.m;
        let mut refs: Vec<Vec<GraphId>> = vec![Vec::new(); m.graphs.len()];
        let graph_const = |u: NodeId| match m.as_const(u) {
            Some(Const::Graph(h)) => Some(*h),
            _ => None,
        };
        for node in &m.nodes {
            if let (NodeKind::Apply(inputs), Some(g)) = (&node.kind, node.graph) {
                refs[g.index()].extend(inputs.iter().filter_map(|&u| graph_const(u)));
            }
        }
        for (gi, graph) in m.graphs.iter().enumerate() {
            if let Some(h) = graph.output.and_then(graph_const) {
                refs[gi].push(h);
            }
        }
        for r in &mut refs {
            r.sort();
            r.dedup();
        }
        self.refs = refs;
    }

    /// Whether `h` refers to `g` through graph constants (transitively).
    /// A search from `h` that stops at `g`: usually `h` is `g`'s parent, and
    /// the answer is found in one step.
    fn refers_to(&mut self, h: GraphId, g: GraphId) -> bool {
        if let Some(&known) = self.known.get(&(h, g)) {
            return known;
        }
        self.stamp += 1;
        let stamp = self.stamp;
        let mut stack = vec![h];
        let mut found = false;
        'search: while let Some(k) = stack.pop() {
            for &r in &self.refs[k.index()] {
                if r == g {
                    found = true;
                    break 'search;
                }
                if self.mark[r.index()] != stamp {
                    self.mark[r.index()] = stamp;
                    stack.push(r);
                }
            }
        }
        self.known.insert((h, g), found);
        found
    }

    /// `user` (owned by `g`, or `g`'s output when `user` is `None`) may use
    /// `u` only if `u` is a constant, is `g`'s, or is a free variable that
    /// a closure of `g` can capture.
    fn check_use(&mut self, g: GraphId, user: Option<(NodeId, usize)>, u: NodeId) {
        let node = self.m.node(u);
        let h = match (&node.kind, node.graph) {
            (NodeKind::Const(_), _) => return,
            (_, Some(h)) if h == g => return,
            (_, Some(h)) => h,
            (_, None) => return, // reported by `nodes`
        };
        if self.refers_to(h, g) {
            return;
        }
        let who = match user {
            Some((n, pos)) => format!("{}: input {pos}", self.describe(n)),
            None => "output".to_string(),
        };
        self.errors.push(format!(
            "graph {}: {who} is {}, a node of {}, which does not refer to {} (it cannot be captured as a free variable)",
            self.gname(g),
            self.describe(u),
            self.gname(h),
            self.gname(g),
        ));
    }

    fn uses(&mut self) {
        let m = self.m;
        for (i, node) in m.nodes.iter().enumerate() {
            if let (NodeKind::Apply(inputs), Some(g)) = (&node.kind, node.graph) {
                if !self.scope[g.index()] {
                    continue;
                }
                for (pos, &u) in inputs.iter().enumerate() {
                    self.check_use(g, Some((NodeId(i as u32), pos)), u);
                }
            }
        }
        for (gi, graph) in m.graphs.iter().enumerate() {
            if let (true, Some(o)) = (self.scope[gi], graph.output) {
                self.check_use(GraphId(gi as u32), None, o);
            }
        }
    }

    /// No cycle among the applications of one graph (iterative DFS).
    fn cycles(&mut self) {
        let m = self.m;
        // 0: unvisited, 1: on the stack, 2: done.
        let mut color = vec![0u8; m.nodes.len()];
        let mut reported: HashSet<GraphId> = HashSet::new();
        for start in 0..m.nodes.len() {
            let node = &m.nodes[start];
            let Some(g) = node.graph else { continue };
            if color[start] != 0
                || !matches!(node.kind, NodeKind::Apply(_))
                || !self.scope[g.index()]
            {
                continue;
            }
            let mut stack: Vec<(NodeId, usize)> = vec![(NodeId(start as u32), 0)];
            color[start] = 1;
            while let Some((n, i)) = stack.last_mut() {
                let n = *n;
                let inputs = m.inputs(n);
                if *i >= inputs.len() {
                    color[n.index()] = 2;
                    stack.pop();
                    continue;
                }
                let u = inputs[*i];
                *i += 1;
                let un = m.node(u);
                if un.graph != Some(g) || !matches!(un.kind, NodeKind::Apply(_)) {
                    continue;
                }
                match color[u.index()] {
                    0 => {
                        color[u.index()] = 1;
                        stack.push((u, 0));
                    }
                    1 if reported.insert(g) => {
                        let from = stack.iter().position(|(s, _)| *s == u).unwrap_or(0);
                        let cycle: Vec<String> = stack[from..]
                            .iter()
                            .map(|(s, _)| self.describe(*s))
                            .collect();
                        self.errors.push(format!(
                            "graph {}: cycle among its applications: {}",
                            self.gname(g),
                            cycle.join(" -> ")
                        ));
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Loc;
    use crate::prim::Prim;

    #[test]
    fn empty_module_verifies() {
        assert_eq!(verify(&Module::new()), Ok(()));
    }

    #[test]
    fn node_owner_out_of_range() {
        let mut m = Module::new();
        let g = m.add_graph("g", Loc::NONE);
        let x = m.add_param(g, "x", Loc::NONE);
        let n = m.add_prim(g, Prim::Neg, &[x], Loc::NONE);
        m.set_output(g, n);
        m.node_mut(n).graph = Some(GraphId(7));
        let e = verify(&m).unwrap_err().join("\n");
        assert!(e.contains("owner graph @g7 is out of range"), "{e}");
    }

    #[test]
    fn free_variable_of_recursive_graph() {
        // g refers to itself and to h; h uses g's parameter: fine.
        let mut m = Module::new();
        let g = m.add_graph("g", Loc::NONE);
        let h = m.add_graph("h", Loc::NONE);
        let x = m.add_param(g, "x", Loc::NONE);
        let gc = m.add_const(Const::Graph(g), Loc::NONE);
        let hc = m.add_const(Const::Graph(h), Loc::NONE);
        let t = m.add_prim(g, Prim::MakeTuple, &[gc, hc], Loc::NONE);
        m.set_output(g, t);
        let y = m.add_prim(h, Prim::Neg, &[x], Loc::NONE);
        m.set_output(h, y);
        assert_eq!(verify(&m), Ok(()));
        assert_eq!(verify_reachable(&m, &[h]), Ok(()));
    }
}
