//! Equality-saturation rewriting of tensor code with `egg`, between the
//! optimiser and fusion.
//!
//! For each graph of the optimised module, the tensor primitives whose
//! types inference knows are lowered to the meta-operators of [`lang`]
//! (map, reindex, reduce, contract); the rest of the graph — parameters,
//! tuples, calls, nodes of other graphs, anything untyped — enters as
//! opaque leaves. The rules of [`rules`] run to saturation or to a bound
//! (nodes, iterations, time: see [`Options`]); then, for every lowered
//! node some part of the IR outside the region uses, the cheapest
//! equivalent expression under the memory-traffic model of [`cost`] is
//! written back into the graph. Nodes whose expression did not change
//! are kept as they are (with their source locations); the others are
//! replaced by new nodes, and nodes left unused are detached.
//!
//! The pass does not change what a program computes (see the notes on
//! soundness in [`rules`]); the verifier runs after it in debug builds,
//! and the program corpus runs in both modes.

pub mod cost;
pub mod lang;
pub mod rules;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use adjoint_runtime::shape;
use adjoint_runtime::shape::TensorTy;
use egg::{Extractor, Id, Language, Runner, Symbol};

use crate::infer::{AbsTensor, AbsVal, Types};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs};
use crate::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use crate::prim::Prim;
use lang::{Dims, Lit, MapOp, Meta, MetaGraph};

/// The bounds of one graph's saturation, which keep it to milliseconds.
#[derive(Clone, Debug)]
pub struct Options {
    /// Stop once the e-graph holds this many nodes.
    pub node_limit: usize,
    /// Rounds of rule application at most.
    pub iter_limit: usize,
    /// Wall-clock time at most, per graph.
    pub time_limit: Duration,
    /// Graphs with more lowered nodes than this are left alone.
    pub max_region: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            node_limit: 20_000,
            iter_limit: 12,
            time_limit: Duration::from_millis(50),
            max_region: 5_000,
        }
    }
}

/// What the pass did to one graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphReport {
    pub graph: String,
    /// Lowered nodes (the region).
    pub region: usize,
    /// Rules that fired, with how often, in table order.
    pub fired: Vec<(&'static str, usize)>,
    /// IR nodes replaced by a cheaper expression.
    pub replaced: usize,
    pub iterations: usize,
    pub egraph_nodes: usize,
    /// Why saturation stopped.
    pub stop: String,
    pub time: Duration,
}

/// What the pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub graphs: Vec<GraphReport>,
    pub time: Duration,
}

impl Stats {
    /// How many IR nodes were replaced in all.
    pub fn replaced(&self) -> usize {
        self.graphs.iter().map(|g| g.replaced).sum()
    }

    /// One line per graph where a rule fired, for `ADJOINT_EGG_TRACE`.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .graphs
            .iter()
            .map(|g| {
                let mut fired: Vec<String> =
                    g.fired.iter().map(|(r, n)| format!("{r}×{n}")).collect();
                if fired.is_empty() {
                    fired.push("nothing".to_string());
                }
                format!(
                    "@{}: {} nodes lowered, {} replaced; {} iterations, {} e-nodes, {} ({:.2?}); fired {}",
                    g.graph,
                    g.region,
                    g.replaced,
                    g.iterations,
                    g.egraph_nodes,
                    g.stop,
                    g.time,
                    fired.join(", ")
                )
            })
            .collect();
        out.push(format!(
            "{} graphs, {} nodes replaced, {:.2?}",
            self.graphs.len(),
            self.replaced(),
            self.time
        ));
        out
    }
}

/// Rewrites the graphs reachable from `roots` in place, given the types
/// inference found for the module as it is. Graphs reachable from `keep`
/// (as well as from `roots`) stay whole: code that is no longer used is
/// detached only outside them.
pub fn rewrite(
    m: &mut Module,
    roots: &[GraphId],
    keep: &[GraphId],
    types: &Types,
    opts: &Options,
) -> Stats {
    let t0 = Instant::now();
    let mut stats = Stats::default();
    let fv = free_variables(m);
    let graphs = reachable_graphs(m, roots);
    // Nodes used by a graph other than their own.
    let captured: HashSet<NodeId> = m.graph_ids().flat_map(|h| fv.get(h).to_vec()).collect();
    // Inference's types of an escaped graph hold only for the calls it
    // saw (a shared derivative rule, say, typed on one caller's shapes but
    // also called with others): rewriting on them would specialise the
    // graph to those calls, as in the optimiser's typed pass and fusion.
    let bodies: Vec<(GraphId, Vec<NodeId>)> = graphs
        .iter()
        .filter(|g| types.holds_for_every_call(**g))
        .map(|g| (*g, graph_body_with(m, *g, &fv)))
        .collect();
    let rewrites = rules::rewrites();
    let mut fwd: HashMap<NodeId, NodeId> = HashMap::new();
    for (g, body) in &bodies {
        if let Some(report) =
            rewrite_graph(m, *g, body, types, &captured, &rewrites, opts, &mut fwd)
        {
            stats.graphs.push(report);
        }
    }
    if !fwd.is_empty() {
        forward(m, &fwd);
        let live: Vec<GraphId> = roots.iter().chain(keep).copied().collect();
        crate::opt::dead::detach_dead(m, &live);
    }
    stats.time = t0.elapsed();
    stats
}

/// Replaces every use of a key of `fwd` by its value.
fn forward(m: &mut Module, fwd: &HashMap<NodeId, NodeId>) {
    let resolve = |mut n: NodeId| {
        while let Some(r) = fwd.get(&n) {
            n = *r;
        }
        n
    };
    for node in &mut m.nodes {
        if let NodeKind::Apply(inputs) = &mut node.kind {
            for i in inputs.iter_mut() {
                *i = resolve(*i);
            }
        }
    }
    for g in &mut m.graphs {
        if let Some(o) = g.output {
            g.output = Some(resolve(o));
        }
    }
}

/// The tensor type of `n`, without known values.
fn tensor_type(types: &Types, n: NodeId) -> Option<AbsTensor> {
    match types.value_of(n)? {
        AbsVal::Tensor(mut t) => {
            t.value = None;
            Some(t)
        }
        _ => None,
    }
}

/// A list of int constants: `()` is `Some(None)`, an int or a
/// `make_tuple` of ints `Some(Some(..))`.
#[allow(clippy::option_option)]
fn const_ints(m: &Module, n: NodeId) -> Option<Option<Vec<i64>>> {
    match m.as_const(n) {
        Some(Const::Unit) => return Some(None),
        Some(Const::Int(i)) => return Some(Some(vec![*i])),
        _ => {}
    }
    if m.applied_prim(n) != Some(Prim::MakeTuple) {
        return None;
    }
    m.inputs(n)[1..]
        .iter()
        .map(|i| match m.as_const(*i) {
            Some(Const::Int(v)) => Some(*v),
            _ => None,
        })
        .collect::<Option<Vec<i64>>>()
        .map(Some)
}

/// A graph's region while it is lowered.
struct Region {
    egraph: MetaGraph,
    class_of: HashMap<NodeId, Id>,
    /// Lowered nodes: their e-node and, per child of it, the IR node it
    /// stands for (`None` for a `Dims` child).
    originals: Vec<(NodeId, Meta, Vec<Option<NodeId>>)>,
    leaf_node: HashMap<Symbol, NodeId>,
    lit_node: HashMap<Lit, NodeId>,
    /// For `sum_to`: a node of each target shape (its `like` operand).
    like_of: HashMap<Vec<usize>, NodeId>,
}

impl Region {
    /// The class of operand `n`: lowered already, a literal, or a leaf.
    fn operand(&mut self, m: &Module, types: &Types, n: NodeId) -> Id {
        if let Some(c) = self.class_of.get(&n) {
            return *c;
        }
        let id = match m.as_const(n) {
            Some(Const::Float(x)) => {
                let l = Lit::float(*x);
                self.lit_node.entry(l).or_insert(n);
                self.egraph.add(Meta::Lit(l))
            }
            Some(Const::Int(i)) => {
                let l = Lit::Int(*i);
                self.lit_node.entry(l).or_insert(n);
                self.egraph.add(Meta::Lit(l))
            }
            _ => {
                let s = Symbol::from(format!("%{}", n.0));
                if let Some(t) = tensor_type(types, n) {
                    self.egraph.analysis.leaves.insert(s, t);
                }
                self.leaf_node.insert(s, n);
                self.egraph.add(Meta::Leaf(s))
            }
        };
        self.class_of.insert(n, id);
        id
    }

    fn dims(&mut self, d: Vec<usize>) -> Id {
        self.egraph.add(Meta::Dims(Dims(d)))
    }

    /// Lowers application `n` when it is a tensor primitive of a known
    /// type; returns whether it was.
    fn lower(&mut self, m: &Module, types: &Types, n: NodeId) -> bool {
        let Some(p) = m.applied_prim(n) else {
            return false;
        };
        let Some(ty) = tensor_type(types, n) else {
            return false;
        };
        let ins = &m.inputs(n)[1..];
        let operand_ty = |i: usize| ins.get(i).and_then(|x| tensor_type(types, *x));
        let mut kids: Vec<Option<NodeId>> = Vec::new();
        let meta = if let Some(op) = MapOp::of(p) {
            let ch = ins.iter().map(|x| self.operand(m, types, *x)).collect();
            kids.extend(ins.iter().map(|x| Some(*x)));
            Meta::Map(op, ch)
        } else {
            match p {
                Prim::ZerosLike | Prim::OnesLike | Prim::GradSeed if ins.len() == 1 => {
                    let x = self.operand(m, types, ins[0]);
                    kids.push(Some(ins[0]));
                    if p == Prim::ZerosLike {
                        Meta::ZerosLike(x)
                    } else {
                        Meta::OnesLike(x)
                    }
                }
                Prim::BroadcastTo | Prim::Reshape | Prim::ExpandDims | Prim::Squeeze
                    if !ins.is_empty() && operand_ty(0).is_some() =>
                {
                    let x = self.operand(m, types, ins[0]);
                    let d = self.dims(ty.shape.clone());
                    kids.extend([Some(ins[0]), None]);
                    if p == Prim::BroadcastTo {
                        Meta::Broadcast([x, d])
                    } else {
                        Meta::Reshape([x, d])
                    }
                }
                Prim::Transpose | Prim::TransposeGrad | Prim::MatrixT => {
                    let Some(xt) = operand_ty(0) else {
                        return false;
                    };
                    let xty = TensorTy::new(xt.dtype, &xt.shape);
                    let perm = match p {
                        Prim::MatrixT => shape::matrix_t_perm(xty).ok(),
                        _ => {
                            let Some(given) = ins.get(1).and_then(|q| const_ints(m, *q)) else {
                                return false;
                            };
                            if p == Prim::Transpose {
                                shape::transpose_perm(xty, given.as_deref()).ok()
                            } else {
                                shape::transpose_grad_perm(xty, given.as_deref()).ok()
                            }
                        }
                    };
                    let Some(perm) = perm else {
                        return false;
                    };
                    let x = self.operand(m, types, ins[0]);
                    let d = self.dims(perm);
                    kids.extend([Some(ins[0]), None]);
                    Meta::Transpose([x, d])
                }
                Prim::Sum if ins.len() == 3 => {
                    let Some(xt) = operand_ty(0) else {
                        return false;
                    };
                    let rank = xt.shape.len() as i64;
                    let axes: Vec<usize> = match const_ints(m, ins[1]) {
                        Some(None) => (0..rank as usize).collect(),
                        Some(Some(a)) => {
                            let mut v = Vec::new();
                            for x in a {
                                let x = if x < 0 { x + rank } else { x };
                                if !(0..rank).contains(&x) {
                                    return false;
                                }
                                v.push(x as usize);
                            }
                            v.sort_unstable();
                            v.dedup();
                            v
                        }
                        None => return false,
                    };
                    let keep = match m.as_const(ins[2]) {
                        Some(Const::Bool(b)) => *b,
                        _ => return false,
                    };
                    let x = self.operand(m, types, ins[0]);
                    let d = self.dims(axes);
                    kids.extend([Some(ins[0]), None]);
                    if keep {
                        Meta::SumKeep([x, d])
                    } else {
                        Meta::Sum([x, d])
                    }
                }
                Prim::SumTo if ins.len() == 2 => {
                    if operand_ty(0).is_none() {
                        return false;
                    }
                    let Some(like) = operand_ty(1) else {
                        return false;
                    };
                    self.like_of.entry(like.shape.clone()).or_insert(ins[1]);
                    let x = self.operand(m, types, ins[0]);
                    let d = self.dims(like.shape);
                    kids.extend([Some(ins[0]), None]);
                    Meta::SumTo([x, d])
                }
                Prim::Matmul if ins.len() == 2 => {
                    let a = self.operand(m, types, ins[0]);
                    let b = self.operand(m, types, ins[1]);
                    kids.extend([Some(ins[0]), Some(ins[1])]);
                    Meta::Matmul([a, b])
                }
                _ => return false,
            }
        };
        let id = self.egraph.add(meta.clone());
        // The analysis must agree with inference, or the node stays opaque.
        if self.egraph[id].data.ty.as_ref() != Some(&ty) {
            return false;
        }
        self.class_of.insert(n, id);
        self.originals.push((n, meta, kids));
        true
    }
}

#[allow(clippy::too_many_arguments)]
fn rewrite_graph(
    m: &mut Module,
    g: GraphId,
    body: &[NodeId],
    types: &Types,
    captured: &HashSet<NodeId>,
    rewrites: &[egg::Rewrite<Meta, lang::Types>],
    opts: &Options,
    fwd: &mut HashMap<NodeId, NodeId>,
) -> Option<GraphReport> {
    let t0 = Instant::now();
    let mut r = Region {
        egraph: MetaGraph::default(),
        class_of: HashMap::new(),
        originals: Vec::new(),
        leaf_node: HashMap::new(),
        lit_node: HashMap::new(),
        like_of: HashMap::new(),
    };
    let mut lowered: HashSet<NodeId> = HashSet::new();
    for &n in body {
        if r.lower(m, types, n) {
            lowered.insert(n);
        }
    }
    if lowered.is_empty() || lowered.len() > opts.max_region {
        return None;
    }
    // Lowered nodes that something outside the region uses.
    let mut roots: Vec<NodeId> = Vec::new();
    let mut is_root: HashSet<NodeId> = HashSet::new();
    let mut note = |n: NodeId, roots: &mut Vec<NodeId>| {
        if lowered.contains(&n) && is_root.insert(n) {
            roots.push(n);
        }
    };
    for &u in body {
        if !lowered.contains(&u) {
            for &i in m.inputs(u) {
                note(i, &mut roots);
            }
        }
    }
    if let Some(o) = m.graph(g).output {
        note(o, &mut roots);
    }
    for &n in body {
        if captured.contains(&n) {
            note(n, &mut roots);
        }
    }
    let runner = saturate(
        std::mem::take(&mut r.egraph),
        rewrites,
        opts.node_limit,
        opts.iter_limit,
        opts.time_limit,
    );
    let mut fired: Vec<(&'static str, usize)> = Vec::new();
    for def in rules::RULES {
        let n: usize = runner
            .iterations
            .iter()
            .filter_map(|it| it.applied.get(&Symbol::from(def.name)))
            .sum();
        if n > 0 {
            fired.push((def.name, n));
        }
    }
    let mut report = GraphReport {
        graph: m.graph(g).name.clone(),
        region: lowered.len(),
        iterations: runner.iterations.len(),
        egraph_nodes: runner.egraph.total_number_of_nodes(),
        stop: match &runner.stop_reason {
            Some(egg::StopReason::Saturated) => "saturated".to_string(),
            Some(egg::StopReason::IterationLimit(_)) => "iteration limit".to_string(),
            Some(egg::StopReason::NodeLimit(_)) => "node limit".to_string(),
            Some(egg::StopReason::TimeLimit(_)) => "time limit".to_string(),
            Some(egg::StopReason::Other(s)) => s.clone(),
            None => "stopped".to_string(),
        },
        fired,
        ..GraphReport::default()
    };
    if report.fired.is_empty() {
        report.time = t0.elapsed();
        return Some(report);
    }
    let egraph = &runner.egraph;
    let extractor = Extractor::new(egraph, cost::Traffic { egraph });
    let originals: HashMap<Meta, (NodeId, Vec<Option<NodeId>>)> = r
        .originals
        .iter()
        .map(|(n, e, kids)| {
            let canon = e.clone().map_children(|c| egraph.find(c));
            (canon, (*n, kids.clone()))
        })
        .collect();
    let mut w = Writer {
        egraph,
        extractor: &extractor,
        originals: &originals,
        region: &r,
        memo: HashMap::new(),
        graph: g,
    };
    for n in roots {
        let loc = m.node(n).loc;
        let class = egraph.find(r.class_of[&n]);
        if let Some(by) = w.emit(m, class, loc) {
            if by != n {
                fwd.insert(n, by);
                report.replaced += 1;
            }
        }
    }
    report.time = t0.elapsed();
    Some(report)
}

/// Runs the rewrites on `egraph` to saturation or a limit.
///
/// egg times its runner with `quanta`, whose clock calibrates itself
/// against the OS clock on first use: 0.5 to 200 ms of spinning (25 ms on
/// the benchmark machine, a third of compiling an MLP training step). The
/// runner gets a mock clock instead, and a hook checks the time limit with
/// std's clock at the start of each iteration, where egg checks its own;
/// the run then stops with `StopReason::Other("time limit")`.
pub(crate) fn saturate(
    egraph: MetaGraph,
    rewrites: &[egg::Rewrite<Meta, lang::Types>],
    node_limit: usize,
    iter_limit: usize,
    time_limit: Duration,
) -> Runner<Meta, lang::Types> {
    let t0 = Instant::now();
    let (clock, _) = quanta::Clock::mock();
    quanta::with_clock(&clock, || {
        Runner::default()
            .with_egraph(egraph)
            .with_node_limit(node_limit)
            .with_iter_limit(iter_limit)
            .with_hook(move |_| {
                if t0.elapsed() > time_limit {
                    Err("time limit".to_string())
                } else {
                    Ok(())
                }
            })
            .run(rewrites)
    })
}

/// Writes extracted expressions back as IR nodes.
struct Writer<'a, 'e> {
    egraph: &'e MetaGraph,
    extractor: &'a Extractor<'e, cost::Traffic<'e>, Meta, lang::Types>,
    originals: &'a HashMap<Meta, (NodeId, Vec<Option<NodeId>>)>,
    region: &'a Region,
    /// Class → the node written for it (`None`: it cannot be written).
    memo: HashMap<Id, Option<NodeId>>,
    graph: GraphId,
}

impl Writer<'_, '_> {
    /// The node computing class `root`'s best expression: an original
    /// node when it is unchanged, new nodes otherwise. Iterative, so deep
    /// expressions do not use the Rust stack.
    fn emit(&mut self, m: &mut Module, root: Id, loc: Loc) -> Option<NodeId> {
        let mut stack: Vec<(Id, bool)> = vec![(root, false)];
        while let Some((c, expanded)) = stack.pop() {
            if self.memo.contains_key(&c) {
                continue;
            }
            let node = self.extractor.find_best_node(c).clone();
            if !expanded {
                stack.push((c, true));
                for ch in node.children() {
                    let ch = self.egraph.find(*ch);
                    if !self.memo.contains_key(&ch) && !matches!(self.best(ch), Meta::Dims(_)) {
                        stack.push((ch, false));
                    }
                }
                continue;
            }
            let out = self.write(m, c, &node, loc);
            self.memo.insert(c, out);
        }
        self.memo.get(&root).copied().flatten()
    }

    fn best(&self, c: Id) -> &Meta {
        self.extractor.find_best_node(c)
    }

    fn dims_of(&self, c: Id) -> Option<Vec<usize>> {
        match self.best(self.egraph.find(c)) {
            Meta::Dims(d) => Some(d.0.clone()),
            _ => None,
        }
    }

    /// Writes e-node `node` of class `c`, its children written already.
    fn write(&mut self, m: &mut Module, _c: Id, node: &Meta, loc: Loc) -> Option<NodeId> {
        let kids: Vec<Option<NodeId>> = node
            .children()
            .iter()
            .map(|ch| {
                let ch = self.egraph.find(*ch);
                match self.best(ch) {
                    Meta::Dims(_) => None,
                    _ => self.memo.get(&ch).copied().flatten(),
                }
            })
            .collect();
        // Every tensor operand must have been written.
        for (ch, k) in node.children().iter().zip(&kids) {
            if k.is_none() && !matches!(self.best(self.egraph.find(*ch)), Meta::Dims(_)) {
                return None;
            }
        }
        if let Some((n, orig_kids)) = self.originals.get(node) {
            if *orig_kids == kids {
                return Some(*n);
            }
        }
        let g = self.graph;
        let k = |i: usize| kids[i].expect("checked above");
        Some(match node {
            Meta::Leaf(s) => *self.region.leaf_node.get(s)?,
            Meta::Lit(l) => match self.region.lit_node.get(l) {
                Some(n) => *n,
                None => m.add_const(
                    match l {
                        Lit::Int(i) => Const::Int(*i),
                        Lit::Float(b) => Const::Float(f64::from_bits(*b)),
                    },
                    loc,
                ),
            },
            Meta::Dims(_) => return None,
            Meta::Map(op, _) => {
                let args: Vec<NodeId> = (0..kids.len()).map(k).collect();
                m.add_prim(g, op.0, &args, loc)
            }
            Meta::ZerosLike(_) => m.add_prim(g, Prim::ZerosLike, &[k(0)], loc),
            Meta::OnesLike(_) => m.add_prim(g, Prim::OnesLike, &[k(0)], loc),
            // A swap of the last two axes is written `mT`, as
            // differentiation writes it.
            Meta::Transpose([_, d]) if is_matrix_t(&self.dims_of(*d)?) => {
                m.add_prim(g, Prim::MatrixT, &[k(0)], loc)
            }
            Meta::Broadcast([_, d]) | Meta::Reshape([_, d]) | Meta::Transpose([_, d]) => {
                let p = match node {
                    Meta::Broadcast(_) => Prim::BroadcastTo,
                    Meta::Reshape(_) => Prim::Reshape,
                    _ => Prim::Transpose,
                };
                let t = ints(m, g, &self.dims_of(*d)?, loc);
                m.add_prim(g, p, &[k(0), t], loc)
            }
            Meta::Sum([_, a]) | Meta::SumKeep([_, a]) => {
                let t = ints(m, g, &self.dims_of(*a)?, loc);
                let keep = m.add_const(Const::Bool(matches!(node, Meta::SumKeep(_))), loc);
                m.add_prim(g, Prim::Sum, &[k(0), t, keep], loc)
            }
            Meta::SumTo([_, d]) => {
                let like = *self.region.like_of.get(&self.dims_of(*d)?)?;
                m.add_prim(g, Prim::SumTo, &[k(0), like], loc)
            }
            Meta::Matmul(_) => m.add_prim(g, Prim::Matmul, &[k(0), k(1)], loc),
        })
    }
}

/// Whether permutation `p` swaps the last two axes and keeps the others.
fn is_matrix_t(p: &[usize]) -> bool {
    let n = p.len();
    n >= 2
        && p[n - 2] == n - 1
        && p[n - 1] == n - 2
        && p[..n - 2].iter().enumerate().all(|(i, a)| i == *a)
}

/// A `make_tuple` of int constants.
fn ints(m: &mut Module, g: GraphId, d: &[usize], loc: Loc) -> NodeId {
    let parts: Vec<NodeId> = d
        .iter()
        .map(|x| m.add_const(Const::Int(*x as i64), loc))
        .collect();
    m.add_prim(g, Prim::MakeTuple, &parts, loc)
}
