//! The graph optimiser: inlining and local simplification to a capped
//! fixpoint, run on a copy of the module after differentiation.
//!
//! Reverse-mode AD leaves a program made of small graphs that return
//! `(value, backpropagator)` pairs, backpropagator closures, environments
//! of free-variable cotangents, symbolic zeros and `switch`es that skip a
//! rule when its cotangent is zero. This pass removes that machinery where
//! control flow is static:
//!
//! - **inline** every call of a known, non-recursive graph, cloning the
//!   graphs nested in it (its closures) with their free variables remapped,
//!   so a backpropagator built by an inlined `J` graph becomes a closure of
//!   the caller — and a direct call once `tuple_get` of `make_tuple` has
//!   exposed it, which is inlined in turn;
//! - **simplify** locally ([`simplify`]): get-of-make on tuples and
//!   records, environment get-of-set, `is_zero` of values that cannot be
//!   the symbolic zero, `switch` on a constant or between equal branches,
//!   `gadd` with a zero, `grad_finalize` of a tensor, `stop_gradient`;
//! - **CSE** of pure primitive applications within a graph;
//! - dead code disappears because a graph's body is what its output
//!   depends on; nodes left dead are detached from their graphs.
//!
//! For straight-line and statically controlled programs (an MLP loss and
//! its gradient) the result is one first-order graph of primitives with no
//! closure left. Loops stay recursive graphs.
//!
//! Nodes copied by inlining from the standard library (or made by AD, with
//! no location) take the location of the user's call they were inlined
//! at, so errors still point at the user's source.

pub(crate) mod dead;
mod dense;
mod inline;
mod prune;
mod simplify;
mod specialize;
mod typed;
mod unroll;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::ir::analysis::FreeVars;
use crate::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use dead::{detach_dead_then_snapshot, Snapshot};

/// Limits of the optimiser.
#[derive(Clone, Debug)]
pub struct Options {
    /// Rounds of inline + simplify at most.
    pub max_rounds: usize,
    /// No inlining once the module holds this many nodes.
    pub node_budget: usize,
    /// Nor once inlining has added this many nodes per live node of the
    /// input (higher-order derivatives can grow without bound).
    pub growth: f64,
    /// A graph (with the graphs nested in it) larger than this is not
    /// inlined.
    pub max_inline_size: usize,
    /// Source files of the standard library: their locations are replaced
    /// by the user's call site when inlined.
    pub internal_files: Vec<u32>,
    /// The entry graph and the abstract values of its arguments: when
    /// given, inference runs on the optimised module once the untyped
    /// rewrites are done, and shapes known statically are folded.
    pub entry: Option<(GraphId, Vec<crate::infer::AbsVal>)>,
    /// Typed passes at most.
    pub max_typed_passes: usize,
    /// How the typed passes' inference types loaded data.
    pub load_type: Option<LoadType>,
    /// The result will be differentiated again (reverse mode simplifies
    /// a derivative before it differentiates it, `ad::run`): keep
    /// `stop_gradient`, keep every slot of a branch's result (each branch
    /// of a `switch` must give the same type to be differentiated), and
    /// keep loops (reverse mode makes one copy of a loop's step, but one
    /// of each unrolled step).
    pub to_differentiate: bool,
}

/// The types of loaded data for the typed passes (see
/// [`crate::infer::LoadTypeFn`]).
#[derive(Clone)]
pub struct LoadType(pub std::sync::Arc<crate::infer::LoadTypeFn>);

impl std::fmt::Debug for LoadType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadType(..)")
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_rounds: 64,
            node_budget: 2_000_000,
            growth: 1.0,
            max_inline_size: 5_000,
            internal_files: Vec::new(),
            entry: None,
            max_typed_passes: 4,
            load_type: None,
            to_differentiate: false,
        }
    }
}

/// What the optimiser did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub rounds: usize,
    pub inlined: usize,
    /// Steps of recursion unrolled (calls of recursive graphs inlined).
    pub unrolled: usize,
    /// Calls redirected to a copy of the callee specialised on a
    /// function-valued argument.
    pub specialized: usize,
    pub simplified: usize,
    pub cse: usize,
    /// Live application nodes reachable from the roots, before and after.
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Graphs reachable from the roots, before and after.
    pub graphs_before: usize,
    pub graphs_after: usize,
    /// What the egg rewrites did after the optimiser (when the entry's
    /// types were known; see [`crate::rewrite`]).
    pub rewrite: Option<crate::rewrite::Stats>,
}

/// Optimises the graphs reachable from `roots` in place.
pub fn optimize(m: &mut Module, roots: &[GraphId], opts: &Options) -> Stats {
    let mut stats = Stats::default();
    let t0 = std::time::Instant::now();
    let mut snap = {
        let _s = stage!("dead code");
        detach_dead_then_snapshot(m, roots)
    };
    (stats.nodes_before, stats.graphs_before) = snapshot_size(&snap);
    let budget = opts
        .node_budget
        .min(m.nodes.len() + (stats.nodes_before as f64 * opts.growth) as usize + 20_000);
    let mut typed_passes = 0;
    // What the last typed pass changed: another one (a whole-module
    // inference) runs only if that was at least one node in
    // `TYPED_PASS_PAYOFF` of the live ones (on large modules of deep
    // derivatives, later passes fold a handful of nodes each, and each
    // costs seconds).
    const TYPED_PASS_PAYOFF: usize = 1000;
    let mut typed_changed = usize::MAX;
    let mut memo = specialize::Memo::default();
    for _ in 0..opts.max_rounds {
        stats.rounds += 1;
        let round = stage!("round");
        let (fv, graphs, bodies) = snap;
        let recursive = recursive_graphs(m, &graphs, &bodies);
        let children = nested_children(m, &fv);
        let graphs_at_start = m.graphs.len();
        let dead_keys = dead_env_keys(m, &graphs, &bodies);
        let mut rw = Rewriter {
            m,
            opts,
            fv: &fv,
            bodies: &bodies,
            recursive: &recursive,
            children,
            fwd: HashMap::default(),
            dirty: HashSet::default(),
            graphs_at_start,
            budget,
            changed: 0,
            stats: &mut stats,
            memo: &mut memo,
            dead_keys,
        };
        for g in &graphs {
            for &n in &bodies[g] {
                rw.visit(*g, n);
            }
            rw.cse(*g, &bodies[g]);
        }
        let changed = rw.changed;
        rw.apply_forwarding();
        drop(round);
        snap = {
            let _s = stage!("dead code");
            detach_dead_then_snapshot(m, roots)
        };
        if tracing::enabled!(target: "adjoint::ir", tracing::Level::DEBUG) {
            let text = crate::ir::print::print_module(m, roots, None);
            tracing::debug!(target: "adjoint::ir", "{text}");
        }
        if tracing::enabled!(target: "adjoint::opt", tracing::Level::DEBUG) {
            let (n, gs) = snapshot_size(&snap);
            tracing::debug!(
                target: "adjoint::opt",
                "opt round {}: {changed} changes (so far {} inlined, {} unrolled, {} specialised, {} simplified, {} merged), {n} live nodes in {gs} graphs, {} nodes and {} graphs in the arena, {:?} elapsed",
                stats.rounds,
                stats.inlined,
                stats.unrolled,
                stats.specialized,
                stats.simplified,
                stats.cse,
                m.nodes.len(),
                m.graphs.len(),
                t0.elapsed()
            );
        }
        if changed == 0 {
            // At a fixpoint, what no rewrite reaches: the unread slots of
            // branch results (escaped backpropagators' rules), then
            // another round to clean up after them.
            let pruned = if opts.to_differentiate {
                0
            } else {
                let _s = stage!("prune branch results");
                prune::prune_branch_results(m, &snap)
            };
            if pruned > 0 {
                let _s = stage!("dead code");
                snap = detach_dead_then_snapshot(m, roots);
                continue;
            }
            let Some((entry, args)) = &opts.entry else {
                break;
            };
            let live = snapshot_size(&snap).0;
            if typed_passes >= opts.max_typed_passes
                || typed_changed.saturating_mul(TYPED_PASS_PAYOFF) < live
            {
                break;
            }
            typed_passes += 1;
            typed_changed = {
                let _s = stage!("typed pass");
                typed_pass(m, &snap, opts, *entry, args, budget, &mut stats)
            };
            if typed_changed == 0 {
                break;
            }
            let _s = stage!("dead code");
            snap = detach_dead_then_snapshot(m, roots);
        }
    }
    (stats.nodes_after, stats.graphs_after) = snapshot_size(&snap);
    stats
}

/// Live application nodes and graphs of a snapshot.
fn snapshot_size((_, graphs, bodies): &Snapshot) -> (usize, usize) {
    (bodies.values().map(Vec::len).sum(), graphs.len())
}

/// Runs inference on the module as it is and applies the typed rewrites;
/// returns how many were made.
#[allow(clippy::too_many_arguments)]
fn typed_pass(
    m: &mut Module,
    (fv, graphs, bodies): &Snapshot,
    opts: &Options,
    entry: GraphId,
    args: &[crate::infer::AbsVal],
    budget: usize,
    stats: &mut Stats,
) -> usize {
    // The program was checked before; if inference fails on the optimised
    // module all the same, the typed rewrites are skipped, not reported.
    let iopts = crate::infer::InferOptions {
        only_taken_branches: true,
        load_type: opts.load_type.as_ref().map(|l| &*l.0),
        ..crate::infer::InferOptions::default()
    };
    let types = match {
        let _s = stage!("inference");
        crate::infer::infer_module_with(m, entry, args, &iopts)
    } {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(
                target: "adjoint::opt",
                "opt: inference of the optimised module failed: {e}"
            );
            return 0;
        }
    };
    let recursive = HashSet::default();
    let graphs_at_start = m.graphs.len();
    let mut memo = specialize::Memo::default();
    let dead_keys = dead_env_keys(m, graphs, bodies);
    let children = nested_children(m, fv);
    let mut rw = Rewriter {
        m,
        opts,
        fv,
        bodies,
        recursive: &recursive,
        children,
        fwd: HashMap::default(),
        dirty: HashSet::default(),
        graphs_at_start,
        budget,
        changed: 0,
        stats,
        memo: &mut memo,
        dead_keys,
    };
    if tracing::enabled!(target: "adjoint::opt", tracing::Level::DEBUG) {
        let n = graphs
            .iter()
            .filter(|g| !types.holds_for_every_call(**g))
            .count();
        tracing::debug!(
            target: "adjoint::opt",
            "opt: typed pass skips {n} of {} graphs (escaped)",
            graphs.len()
        );
    }
    // First: copying needs graphs no rewrite has touched yet.
    rw.split_by_signature(graphs, &types);
    rw.densify_loop_tangents(graphs, &types);
    rw.densify_backpropagators(graphs, &types);
    for g in graphs {
        // Inference's values of an escaped graph hold only for the calls
        // it saw (unless it also evaluated the graph for any call);
        // rewriting on them would specialise the graph for those.
        if !types.holds_for_every_call(*g) {
            for &n in &bodies[g] {
                rw.visit_escaped(*g, n, &types);
            }
            continue;
        }
        let hidden = types.is_escaped(*g);
        for &n in &bodies[g] {
            rw.visit_typed(*g, n, &types);
            // A hidden backpropagator typed for any call: its shape-only
            // reads of forward scalars become constants all the same.
            if hidden {
                rw.visit_escaped(*g, n, &types);
            }
        }
    }
    // Last: it adds graphs the snapshot's analyses do not know.
    rw.merge_constant_records(graphs, &types);
    let changed = rw.changed;
    rw.apply_forwarding();
    changed
}

/// The environment keys (of free variables) whose entries are zero on
/// every run: an entry is made only by `env_setitem` (adding environments
/// merges the entries they have), so a key is *live* when some reachable
/// `env_setitem(e, key, v)` stores a `v` that may be nonzero, where
/// `zero()` is not and `env_getitem(_, k)` is only for a live `k` (least
/// fixpoint). A loop's counter and bound are keys of this kind: their
/// cotangents go round the loop's environments and are never made. Empty
/// when run-time differentiation may make environments the module does
/// not show, or a key is not a constant.
fn dead_env_keys(
    m: &Module,
    graphs: &[GraphId],
    bodies: &HashMap<GraphId, Vec<NodeId>>,
) -> HashSet<i64> {
    use crate::prim::Prim;
    let key = |n: NodeId| match m.as_const(n) {
        Some(Const::Int(k)) => Some(*k),
        _ => None,
    };
    let mut all: HashSet<i64> = HashSet::default();
    // (key stored, key it is read from: None for anything else).
    let mut stores: Vec<(i64, Option<Option<i64>>)> = Vec::new();
    for g in graphs {
        for &n in &bodies[g] {
            let ins = m.inputs(n);
            match m.applied_prim(n) {
                Some(Prim::AdDyn | Prim::AdLift) => return HashSet::default(),
                Some(Prim::EnvSetitem) if ins.len() == 4 => {
                    let Some(k) = key(ins[2]) else {
                        return HashSet::default();
                    };
                    all.insert(k);
                    let v = ins[3];
                    let from = match m.applied_prim(v) {
                        Some(Prim::Zero) => None,
                        Some(Prim::EnvGetitem) => Some(m.inputs(v).get(2).and_then(|k| key(*k))),
                        _ => Some(None),
                    };
                    stores.push((k, from));
                }
                Some(Prim::EnvGetitem) if ins.len() == 3 => match key(ins[2]) {
                    Some(k) => {
                        all.insert(k);
                    }
                    None => return HashSet::default(),
                },
                _ => {}
            }
        }
    }
    let mut live: HashSet<i64> = HashSet::default();
    loop {
        let before = live.len();
        for (k, from) in &stores {
            let nonzero = match from {
                None => false,
                Some(Some(src)) => live.contains(src),
                Some(None) => true,
            };
            if nonzero {
                live.insert(*k);
            }
        }
        if live.len() == before {
            break;
        }
    }
    all.retain(|k| !live.contains(k));
    all
}

/// For each graph, the graphs with a free variable it owns (the closures
/// lexically nested in it, one level down).
fn nested_children(m: &Module, fv: &FreeVars) -> HashMap<GraphId, Vec<GraphId>> {
    let mut out: HashMap<GraphId, Vec<GraphId>> = HashMap::default();
    for k in m.graph_ids() {
        let mut owners = HashSet::default();
        for &v in fv.get(k) {
            if let Some(o) = m.node(v).graph {
                if o != k && owners.insert(o) {
                    out.entry(o).or_default().push(k);
                }
            }
        }
    }
    out
}

/// Graphs in a cycle of the call graph (through graph constants their live
/// bodies use): loops and recursive functions. These are not inlined.
fn recursive_graphs(
    m: &Module,
    graphs: &[GraphId],
    bodies: &HashMap<GraphId, Vec<NodeId>>,
) -> HashSet<GraphId> {
    use petgraph::graph::DiGraph;
    let mut index = HashMap::default();
    let mut cg: DiGraph<GraphId, ()> = DiGraph::new();
    for g in graphs {
        index.insert(*g, cg.add_node(*g));
    }
    for g in graphs {
        let mut refs = HashSet::default();
        let mut note = |n: NodeId| {
            if let Some(Const::Graph(h)) = m.as_const(n) {
                refs.insert(*h);
            }
        };
        for &n in &bodies[g] {
            for &i in m.inputs(n) {
                note(i);
            }
        }
        if let Some(o) = m.graph(*g).output {
            note(o);
        }
        for h in refs {
            if let Some(hi) = index.get(&h) {
                cg.add_edge(index[g], *hi, ());
            }
        }
    }
    let mut rec = HashSet::default();
    for scc in petgraph::algo::tarjan_scc(&cg) {
        let cyclic = scc.len() > 1 || cg.contains_edge(scc[0], scc[0]);
        if cyclic {
            rec.extend(scc.iter().map(|i| cg[*i]));
        }
    }
    rec
}

pub(crate) struct Rewriter<'a> {
    pub m: &'a mut Module,
    pub opts: &'a Options,
    pub fv: &'a FreeVars,
    pub bodies: &'a HashMap<GraphId, Vec<NodeId>>,
    pub recursive: &'a HashSet<GraphId>,
    pub children: HashMap<GraphId, Vec<GraphId>>,
    /// Node replaced → its replacement (within one round).
    pub fwd: HashMap<NodeId, NodeId>,
    /// Graphs changed in this round: not inlined until the next one.
    pub dirty: HashSet<GraphId>,
    pub graphs_at_start: usize,
    /// No inlining once the arena holds this many nodes.
    pub budget: usize,
    pub changed: usize,
    pub stats: &'a mut Stats,
    /// Specialisations made so far (they outlive a round).
    pub memo: &'a mut specialize::Memo,
    /// Environment keys whose entries are always zero ([`dead_env_keys`]).
    pub dead_keys: HashSet<i64>,
}

impl Rewriter<'_> {
    pub fn resolve(&self, mut n: NodeId) -> NodeId {
        while let Some(r) = self.fwd.get(&n) {
            n = *r;
        }
        n
    }

    fn replace(&mut self, g: GraphId, n: NodeId, by: NodeId) {
        if n != by {
            self.fwd.insert(n, by);
            self.dirty.insert(g);
            self.changed += 1;
        }
    }

    fn visit(&mut self, g: GraphId, n: NodeId) {
        let NodeKind::Apply(inputs) = &self.m.node(n).kind else {
            return;
        };
        if self.fwd.contains_key(&n) {
            return;
        }
        let resolved: Vec<NodeId> = inputs.iter().map(|i| self.resolve(*i)).collect();
        if &resolved != inputs {
            self.m.node_mut(n).kind = NodeKind::Apply(resolved.clone());
            self.dirty.insert(g);
        }
        match self.m.as_const(resolved[0]).cloned() {
            Some(Const::Graph(h)) => {
                let nargs = resolved.len() - 1;
                if self.can_inline(h, nargs) {
                    let out = self.inline(g, n, h, &resolved[1..]);
                    self.stats.inlined += 1;
                    self.replace(g, n, out);
                } else if self.recursive.contains(&h)
                    && !self.opts.to_differentiate
                    && self.can_inline_body(h, nargs)
                    && self.can_unroll(h, &resolved[1..])
                {
                    let out = self.inline(g, n, h, &resolved[1..]);
                    self.stats.unrolled += 1;
                    self.replace(g, n, out);
                } else if let Some(by) = self.specialize(g, n, h, &resolved[1..]) {
                    self.stats.specialized += 1;
                    self.replace(g, n, by);
                }
            }
            Some(Const::Prim(p)) => {
                if let Some(by) = self.simplify(g, n, p, &resolved[1..]) {
                    self.stats.simplified += 1;
                    self.replace(g, n, by);
                }
            }
            _ => {}
        }
    }

    /// Common-subexpression elimination of pure primitive applications
    /// within graph `g` (every node of a graph's body runs when the graph
    /// does, so any of two equal nodes can stand for both).
    fn cse(&mut self, g: GraphId, body: &[NodeId]) {
        let mut seen: HashMap<Vec<Key>, NodeId> = HashMap::default();
        for &n in body {
            if self.fwd.contains_key(&n) {
                continue;
            }
            let Some(p) = self.m.applied_prim(n) else {
                continue;
            };
            if p.category() == crate::prim::Category::Io {
                continue;
            }
            let key: Vec<Key> = self
                .m
                .inputs(n)
                .iter()
                .map(|i| Key::of(self.m, self.resolve(*i)))
                .collect();
            match seen.get(&key) {
                Some(first) => {
                    let first = *first;
                    self.stats.cse += 1;
                    self.replace(g, n, first);
                }
                None => {
                    seen.insert(key, n);
                }
            }
        }
    }

    /// Rewrites every use of a replaced node, then forgets the table.
    fn apply_forwarding(&mut self) {
        if self.fwd.is_empty() {
            return;
        }
        for i in 0..self.m.nodes.len() {
            if let NodeKind::Apply(inputs) = &self.m.nodes[i].kind {
                if inputs.iter().any(|x| self.fwd.contains_key(x)) {
                    let new: Vec<NodeId> = inputs.iter().map(|x| self.resolve(*x)).collect();
                    self.m.nodes[i].kind = NodeKind::Apply(new);
                }
            }
        }
        for gi in 0..self.m.graphs.len() {
            if let Some(o) = self.m.graphs[gi].output {
                let r = self.resolve(o);
                self.m.graphs[gi].output = Some(r);
            }
        }
        self.fwd.clear();
    }

    /// The location a copied node gets when inlined at `site`.
    pub fn relocate(&self, own: Loc, site: Loc) -> Loc {
        let internal = |l: Loc| l.is_none() || self.opts.internal_files.contains(&l.file);
        if internal(own) && !internal(site) {
            site
        } else {
            own
        }
    }
}

/// A hashable stand-in for a node when comparing applications: constants
/// by value, everything else by id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Node(u32),
    Int(i64),
    Float(u64),
    Bool(bool),
    Str(std::sync::Arc<str>),
    Unit,
    DType(String),
    Prim(crate::prim::Prim),
    Graph(GraphId),
}

impl Key {
    fn of(m: &Module, n: NodeId) -> Key {
        match m.as_const(n) {
            Some(Const::Int(i)) => Key::Int(*i),
            Some(Const::Float(f)) => Key::Float(f.to_bits()),
            Some(Const::Bool(b)) => Key::Bool(*b),
            Some(Const::Str(s)) => Key::Str(s.clone()),
            Some(Const::Unit) => Key::Unit,
            Some(Const::DType(d)) => Key::DType(format!("{d:?}")),
            Some(Const::Prim(p)) => Key::Prim(*p),
            Some(Const::Graph(h)) => Key::Graph(*h),
            _ => Key::Node(n.0),
        }
    }
}

// The optimiser's tests are IR filetests: tests/ir/opt/*.ir (IR in,
// optimised IR out; `cargo test --test ir_filetests`).
