//! The abstract interpreter.
//!
//! Calling a graph with abstract arguments *specialises* it: the graph's
//! body is evaluated once per signature (graph, arguments, captured
//! values), and the result is cached. A `switch` on a condition known
//! through specialisation takes only the chosen branch; on an unknown
//! condition both branches are evaluated and their results joined; on a
//! condition computed from literals alone (`if true`) both are evaluated,
//! must have one type, and the taken one gives the result. Dead code (a
//! value computed and never used) is typed too.
//!
//! **Recursion.** A call that reaches a specialisation still in progress
//! gets that specialisation's current approximation (`Bottom` at first);
//! the specialisation is then evaluated again until its result is stable.
//! Specialisations that used the approximation of an enclosing one are
//! *provisional*: they are evaluated again when next needed, until the
//! enclosing one is stable.
//!
//! **Termination.** Recursion on constant ints (loop counters, `n - 1`)
//! would make a new specialisation per value. Once a graph has
//! [`WIDEN_AFTER`] specialisations in progress (or the nesting is deeper
//! than [`WIDEN_DEPTH`]), the constants of a new call that differ from
//! those of the calls in progress are forgotten, so the call meets a
//! specialisation in progress and the recursion closes; constants that do
//! not vary (a loop bound, a shape) are kept. Nesting deeper than
//! [`MAX_DEPTH`] is an error. Inference runs on a thread with a large
//! stack, so that depth is safe.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::domain::{generalize_all, join, AbsTensor, AbsVal, Closure, MAX_VALUE_PARTS};
use super::error::InferError;
use super::provenance;
pub use super::rules::LoadTypeFn;
use super::rules::{self, Calls, RuleCtx, RuleError};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs, FreeVars};
use crate::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use crate::prim::Prim;
use adjoint_runtime::tensor::DType;

/// Specialisations of one graph in progress before varying constants of
/// new calls are widened.
pub const WIDEN_AFTER: usize = 16;
/// Nesting of specialisations beyond which varying constants are always
/// widened.
pub const WIDEN_DEPTH: usize = 200;
/// Nesting of specialisations beyond which inference gives up.
pub const MAX_DEPTH: usize = 2000;
/// Evaluations of one specialisation before a fixpoint is declared unreachable.
const MAX_ITERATIONS: usize = 64;
/// Specialisations in all before inference gives up.
const MAX_SPECS: usize = 200_000;
/// Stack of the inference thread.
const STACK_BYTES: usize = 256 << 20;
/// Nesting limit when no thread could be started (the caller's stack).
const MAX_DEPTH_INLINE: usize = 100;

/// Options of [`infer_module_with`].
#[derive(Clone, Copy, Default)]
pub struct InferOptions<'a> {
    /// How to type loads; without it, loaded data is [`AbsVal::Unknown`]
    /// (checked when the program runs).
    pub load_type: Option<&'a LoadTypeFn>,
    /// Files whose code is not the user's (the standard library): an error
    /// inside them is reported at the user's call into them.
    pub internal_files: &'a [u32],
    /// Do not require both branches of an `if` on a literal condition to
    /// have one type (the optimiser's typed pass runs inference on
    /// programs where derivative rules were inlined into literal code).
    pub only_taken_branches: bool,
}

/// Identifies a specialisation in [`Types`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpecId(pub u32);

impl SpecId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for SpecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One specialisation of a graph: its signature, the value of each of its
/// nodes, and the specialisations its calls reach.
#[derive(Clone, Debug)]
pub struct Spec {
    pub graph: GraphId,
    pub args: Vec<AbsVal>,
    /// The values of the graph's free variables, in the order of
    /// [`FreeVars`].
    pub captures: Arc<[AbsVal]>,
    pub result: AbsVal,
    /// Parameters, captured free variables and applications of the graph.
    pub values: HashMap<NodeId, AbsVal>,
    /// For each application that calls graphs, the specialisations called
    /// (several when the callee may be one of several closures).
    pub calls: HashMap<NodeId, Vec<SpecId>>,
}

/// The result of inference: every specialisation reachable from the entry.
#[derive(Clone, Debug)]
pub struct Types {
    specs: Vec<Spec>,
    by_graph: HashMap<GraphId, Vec<SpecId>>,
    by_node: HashMap<NodeId, Vec<SpecId>>,
    entry: SpecId,
    escaped: HashSet<GraphId>,
    general: HashSet<GraphId>,
}

impl Types {
    /// The specialisation of the entry graph.
    pub fn entry(&self) -> SpecId {
        self.entry
    }

    /// The entry's result.
    pub fn result(&self) -> &AbsVal {
        &self.specs[self.entry.index()].result
    }

    pub fn spec(&self, id: SpecId) -> &Spec {
        &self.specs[id.index()]
    }

    /// Every specialisation, the entry first.
    pub fn specs(&self) -> impl Iterator<Item = (SpecId, &Spec)> {
        self.specs
            .iter()
            .enumerate()
            .map(|(i, s)| (SpecId(i as u32), s))
    }

    /// Whether graph `g` may run on arguments inference did not see: a
    /// closure of it was stored where inference cannot follow it (an
    /// environment, a run-time transform, a captured closure nested too
    /// deep), or it is reachable from such a graph. Its values hold only
    /// for the calls inference saw, so rewrites must not specialise it on
    /// them.
    pub fn is_escaped(&self, g: GraphId) -> bool {
        self.escaped.contains(&g)
    }

    /// Whether graph `g`, escaped or not, was also evaluated on arguments
    /// of unknown type: the closures hidden on a reversed loop's stack
    /// (`ad_hide`), whose calls inference cannot follow, are evaluated so
    /// after the entry. The values of such a graph hold for every call
    /// (they are joined with that general evaluation's), so rewrites may
    /// use them even when the graph is escaped.
    pub fn covers_all_calls(&self, g: GraphId) -> bool {
        self.general.contains(&g)
    }

    /// Whether what inference knows of graph `g` holds for every call of
    /// it, so rewrites may specialise `g` on it: `g` is not escaped, or
    /// it was evaluated for any call too ([`Self::covers_all_calls`]).
    pub fn holds_for_every_call(&self, g: GraphId) -> bool {
        !self.is_escaped(g) || self.covers_all_calls(g)
    }

    /// The specialisations of graph `g` (none if it is never called).
    pub fn specs_of(&self, g: GraphId) -> &[SpecId] {
        self.by_graph.get(&g).map_or(&[], |v| v)
    }

    /// The value of `n` in every specialisation of its graph, joined;
    /// `None` if it was never evaluated or the values do not join.
    pub fn value_of(&self, n: NodeId) -> Option<AbsVal> {
        let mut acc: Option<AbsVal> = None;
        for id in self.by_node.get(&n)? {
            let v = &self.specs[id.index()].values[&n];
            acc = Some(match acc {
                None => v.clone(),
                Some(a) => join(&a, v)?,
            });
        }
        acc
    }

    /// The value of node `n` when every specialisation of its graph gives
    /// it the same one (no join: a loop variable that is a weak int on the
    /// first iteration and a float after it has none). Rewrites that put
    /// one node in place of another of the same type must use this.
    pub fn exact_value_of(&self, n: NodeId) -> Option<AbsVal> {
        let mut ids = self.by_node.get(&n)?.iter();
        let first = &self.specs[ids.next()?.index()].values[&n];
        ids.all(|id| self.specs[id.index()].values[&n] == *first)
            .then(|| first.clone())
    }

    /// The type of node `n` (a parameter or an application) as text
    /// (`f32[3, 4]`), joined over the specialisations of its graph; types
    /// that do not join are listed (`f32[3] | f32[4]`). `None` for
    /// constants and for nodes never evaluated (dead code, untaken
    /// branches).
    pub fn type_of(&self, n: NodeId) -> Option<String> {
        if let Some(v) = self.value_of(n) {
            return Some(v.to_string());
        }
        let mut seen: Vec<String> = Vec::new();
        for id in self.by_node.get(&n)? {
            let s = self.specs[id.index()].values[&n].to_string();
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        Some(seen.join(" | "))
    }
}

/// How deeply closures captured by closures are tracked.
const MAX_CLOSURE_DEPTH: usize = 3;

/// The abstract value of a constant other than a graph.
fn const_value(c: &Const) -> Option<AbsVal> {
    Some(match c {
        Const::Int(i) => AbsVal::int(*i, true),
        Const::Float(_) => AbsVal::weak_scalar(adjoint_runtime::tensor::DType::F64),
        Const::Bool(b) => AbsVal::bool(*b),
        Const::Str(s) => AbsVal::Str(Some(s.clone())),
        Const::Unit => AbsVal::unit(),
        Const::DType(d) => AbsVal::DType(*d),
        Const::Tensor(t) => AbsVal::from_tensor(t),
        Const::Prim(p) => AbsVal::Func(vec![Closure::Prim(*p)]),
        Const::Graph(_) => return None,
    })
}

/// Infers the types of everything reachable from `entry` called with
/// `args`. See [`infer_module_with`].
pub fn infer_module(m: &Module, entry: GraphId, args: &[AbsVal]) -> Result<Types, InferError> {
    infer_module_with(m, entry, args, &InferOptions::default())
}

/// Infers the types of everything reachable from `entry` called with
/// `args`. Runs in place on a thread of [`crate::stack::with_stack`] with
/// enough stack left, else on a new thread with a large stack, so that
/// deeply nested specialisations cannot overflow the caller's stack.
pub fn infer_module_with(
    m: &Module,
    entry: GraphId,
    args: &[AbsVal],
    opts: &InferOptions,
) -> Result<Types, InferError> {
    infer_module_partial(m, entry, args, opts).map_err(|(e, _)| e)
}

/// [`infer_module_with`], which on an error also gives what inference
/// had found before it: the values of the nodes evaluated so far, in
/// every specialisation made (none after an internal error). Checks that
/// explain a mistake better than the operation it broke read them
/// (`checks::run`).
pub fn infer_module_partial(
    m: &Module,
    entry: GraphId,
    args: &[AbsVal],
    opts: &InferOptions,
) -> Result<Types, (InferError, Option<Types>)> {
    if entry.index() >= m.graphs.len() {
        return Err((
            InferError::new(Loc::NONE, format!("no graph {entry}")),
            None,
        ));
    }
    let message = |panic: Box<dyn std::any::Any + Send>| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err((
            InferError::new(
                m.graph(entry).loc,
                format!("internal error in type inference: {what}"),
            ),
            None,
        ))
    };
    // On a compiler thread with room to spare, in place: a new thread's
    // stack pages are faulted in again at every start.
    if crate::stack::stack_left().is_some_and(|left| left >= STACK_BYTES + (STACK_BYTES >> 2)) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(m, entry, args, opts, MAX_DEPTH)
        }));
        return r.unwrap_or_else(message);
    }
    match crate::stack::with_stack("adjoint-infer", STACK_BYTES, || {
        run(m, entry, args, opts, MAX_DEPTH)
    }) {
        Ok(r) => r.unwrap_or_else(message),
        // No thread: run here (the depth limit still applies).
        Err(_) => run(m, entry, args, opts, MAX_DEPTH_INLINE),
    }
}

fn run(
    m: &Module,
    entry: GraphId,
    args: &[AbsVal],
    opts: &InferOptions,
    max_depth: usize,
) -> Result<Types, (InferError, Option<Types>)> {
    let mut interp = Interp {
        m,
        opts,
        max_depth,
        fv: free_variables(m),
        bodies: HashMap::default(),
        owned: HashMap::default(),
        dead: HashMap::default(),
        specs: Vec::new(),
        cache: rustc_hash::FxHashMap::default(),
        frames: Vec::new(),
        in_progress: HashMap::default(),
        speculating: false,
        epoch: 0,
        escaped: RefCell::new(HashSet::default()),
        partial: HashMap::default(),
    };
    let graph = m.graph(entry);
    if args.len() != graph.params.len() {
        return Err((
            InferError::new(
                graph.loc,
                arity_message(&graph.name, graph.params.len(), args.len()),
            ),
            None,
        ));
    }
    let captures: Arc<[AbsVal]> = Arc::new([]);
    if !interp.fv.get(entry).is_empty() {
        return Err((
            InferError::new(
                graph.loc,
                format!(
                    "internal error: entry graph @{} has free variables ({})",
                    graph.name,
                    interp
                        .fv
                        .get(entry)
                        .iter()
                        .take(4)
                        .map(|n| format!(
                            "%{} of @{}",
                            n.index(),
                            m.node(*n)
                                .graph
                                .map_or("?".into(), |g| m.graph(g).name.clone())
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            None,
        ));
    }
    let (_, id) = match interp.call_graph(entry, args.to_vec(), captures, None) {
        Ok(r) => r,
        Err(e) => return Err((e, interp.finish_partial())),
    };
    let (general, covered) = interp.type_hidden_closures(id);
    Ok(interp.finish(id, &general, covered))
}

/// The state of a specialisation during inference.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    /// Being evaluated by the frame at this position of the stack.
    InProgress(usize),
    /// Evaluated with the approximation of a specialisation in progress:
    /// evaluated again when next called.
    Provisional,
    Done,
}

struct Entry {
    spec: Spec,
    state: State,
    /// The evaluation counter when it was last evaluated.
    evaluated_at: u64,
}

/// A specialisation being evaluated.
struct Frame {
    spec: usize,
    /// Stack positions of the enclosing specialisations in progress whose
    /// approximations this evaluation used (directly or through calls).
    deps: BTreeSet<usize>,
    /// Whether the current round used this specialisation's own
    /// approximation (a recursive call).
    self_dep: bool,
    /// Specialisations that became provisional while this one was evaluated.
    provisional: Vec<usize>,
    /// Whether this call is one of several alternatives (a branch of an
    /// `if` on a condition not known statically): the program may never
    /// make it.
    speculative: bool,
}

type Key = (GraphId, Vec<AbsVal>, Arc<[AbsVal]>);

struct Interp<'a> {
    m: &'a Module,
    opts: &'a InferOptions<'a>,
    /// Nesting of specialisations beyond which inference gives up.
    max_depth: usize,
    fv: FreeVars,
    bodies: HashMap<GraphId, Rc<[NodeId]>>,
    /// Applications by owning graph, and the dead ones of each graph.
    owned: HashMap<GraphId, Vec<NodeId>>,
    dead: HashMap<GraphId, Rc<[NodeId]>>,
    specs: Vec<Entry>,
    cache: rustc_hash::FxHashMap<Key, usize>,
    frames: Vec<Frame>,
    /// For each graph, its specialisations in progress, outermost first.
    in_progress: HashMap<GraphId, Vec<usize>>,
    /// Set just before [`Interp::call_graph`] for a call that is one of
    /// several alternatives (see [`Frame::speculative`]); taken by it.
    speculating: bool,
    epoch: u64,
    /// Graphs of closures that inference lost track of (see
    /// [`Types::is_escaped`]).
    escaped: RefCell<HashSet<GraphId>>,
    /// For the specialisations whose evaluation failed: the values of the
    /// nodes evaluated before the error (see [`infer_module_partial`]).
    partial: HashMap<usize, HashMap<NodeId, AbsVal>>,
}

impl<'a> Interp<'a> {
    fn loc(&self, n: NodeId) -> Loc {
        self.m.node(n).loc
    }

    /// The applications owned by `g` that its output does not depend on
    /// (dead code: a value computed and never used), in creation order.
    fn dead(&mut self, g: GraphId) -> Rc<[NodeId]> {
        if self.owned.is_empty() {
            for (i, node) in self.m.nodes.iter().enumerate() {
                if let (Some(h), NodeKind::Apply(_)) = (node.graph, &node.kind) {
                    self.owned.entry(h).or_default().push(NodeId(i as u32));
                }
            }
        }
        if let Some(d) = self.dead.get(&g) {
            return d.clone();
        }
        let live: std::collections::HashSet<NodeId> = self.body(g).iter().copied().collect();
        let d: Rc<[NodeId]> = self
            .owned
            .get(&g)
            .map(|all| all.iter().copied().filter(|n| !live.contains(n)).collect())
            .unwrap_or_default();
        self.dead.insert(g, d.clone());
        d
    }

    /// Whether every input of `n` has a value here (dead code may use
    /// values its graph does not capture).
    fn inputs_available(&self, n: NodeId, values: &HashMap<NodeId, AbsVal>) -> bool {
        self.m.inputs(n).iter().all(|i| match self.m.as_const(*i) {
            Some(Const::Graph(h)) => self.fv.get(*h).iter().all(|v| values.contains_key(v)),
            Some(_) => true,
            None => values.contains_key(i),
        })
    }

    fn body(&mut self, g: GraphId) -> Rc<[NodeId]> {
        if let Some(b) = self.bodies.get(&g) {
            return b.clone();
        }
        let b: Rc<[NodeId]> = graph_body_with(self.m, g, &self.fv).into();
        self.bodies.insert(g, b.clone());
        b
    }

    /// Forgets the constants of a call of `g` that vary between it and the
    /// calls of `g` in progress, once there are many of those, the nesting
    /// is deep, or the recursion goes through a branch taken on a condition
    /// known only at run time (a `while` on data, a recursion that stops on
    /// a float): following its constants step by step would specialise
    /// iterations the program may never run (and report their errors, such
    /// as a slice out of range at a counter value never reached), and
    /// nested such loops would multiply their specialisations.
    fn widen(
        &self,
        g: GraphId,
        args: Vec<AbsVal>,
        captures: Arc<[AbsVal]>,
        speculative: bool,
    ) -> (Vec<AbsVal>, Arc<[AbsVal]>) {
        let Some(ancestors) = self.in_progress.get(&g) else {
            return (args, captures);
        };
        let Some(&nearest) = ancestors.last() else {
            return (args, captures);
        };
        let through_branch = speculative
            || match self.specs[nearest].state {
                State::InProgress(pos) => self.frames[pos + 1..].iter().any(|f| f.speculative),
                _ => false,
            };
        if !through_branch && ancestors.len() < WIDEN_AFTER && self.frames.len() < WIDEN_DEPTH {
            return (args, captures);
        }
        let (mut args, mut captures) = (args, captures);
        for &a in ancestors {
            let spec = &self.specs[a].spec;
            args = generalize_all(&args, &spec.args);
            captures = generalize_all(&captures, &spec.captures).into();
        }
        (args, captures)
    }

    /// Calls graph `g`; `site` is the calling application (for messages).
    fn call_graph(
        &mut self,
        g: GraphId,
        args: Vec<AbsVal>,
        captures: Arc<[AbsVal]>,
        site: Option<NodeId>,
    ) -> Result<(AbsVal, usize), InferError> {
        // Taken first, so that no return leaves it set for another call.
        let speculative = std::mem::take(&mut self.speculating);
        let graph = self.m.graph(g);
        let site_loc = site.map_or(graph.loc, |n| self.loc(n));
        if args.len() != graph.params.len() {
            return Err(InferError::new(
                site_loc,
                arity_message(&graph.name, graph.params.len(), args.len()),
            ));
        }
        let (args, captures) = self.widen(g, args, captures, speculative);
        let key: Key = (g, args, captures);
        let id = match self.cache.get(&key) {
            Some(&id) => match self.specs[id].state {
                State::Done => return Ok((self.specs[id].spec.result.clone(), id)),
                State::InProgress(pos) => {
                    let top_pos = self.frames.len() - 1;
                    let top = self
                        .frames
                        .last_mut()
                        .expect("a spec in progress has a frame");
                    if pos == top_pos {
                        top.self_dep = true;
                    } else {
                        top.deps.insert(pos);
                    }
                    return Ok((self.specs[id].spec.result.clone(), id));
                }
                State::Provisional => id,
            },
            None => {
                if self.specs.len() >= MAX_SPECS {
                    return Err(InferError::new(
                        site_loc,
                        "program needs too many specialisations for type inference",
                    ));
                }
                let id = self.specs.len();
                let (g, args, captures) = key.clone();
                self.specs.push(Entry {
                    spec: Spec {
                        graph: g,
                        args,
                        captures,
                        result: AbsVal::Bottom,
                        values: HashMap::default(),
                        calls: HashMap::default(),
                    },
                    state: State::Provisional,
                    evaluated_at: 0,
                });
                self.cache.insert(key, id);
                id
            }
        };
        if self.frames.len() >= self.max_depth {
            return Err(InferError::new(
                site_loc,
                "program too deeply nested for type inference",
            ));
        }
        self.run_spec(id, speculative).map(|v| (v, id))
    }

    /// Evaluates specialisation `id` to a fixpoint.
    fn run_spec(&mut self, id: usize, speculative: bool) -> Result<AbsVal, InferError> {
        let g = self.specs[id].spec.graph;
        let pos = self.frames.len();
        self.frames.push(Frame {
            spec: id,
            deps: BTreeSet::new(),
            self_dep: false,
            provisional: Vec::new(),
            speculative,
        });
        self.in_progress.entry(g).or_default().push(id);
        self.specs[id].state = State::InProgress(pos);
        let outcome = self.fixpoint(id, pos);
        let frame = self.frames.pop().expect("frame pushed above");
        debug_assert_eq!(frame.spec, id);
        if let Some(v) = self.in_progress.get_mut(&g) {
            v.pop();
        }
        let (result, last_epoch) = match outcome {
            Ok(r) => r,
            Err(e) => {
                self.specs[id].state = State::Provisional;
                return Err(e);
            }
        };
        self.specs[id].spec.result = result.clone();
        if frame.deps.is_empty() {
            self.specs[id].state = State::Done;
            // What was evaluated during the last (stable) round is final.
            for p in frame.provisional {
                if self.specs[p].state == State::Provisional
                    && self.specs[p].evaluated_at >= last_epoch
                {
                    self.specs[p].state = State::Done;
                }
            }
        } else {
            // Used the approximation of an enclosing specialisation.
            self.specs[id].state = State::Provisional;
            let parent_pos = pos - 1;
            let parent = self.frames.last_mut().expect("a dependency is enclosing");
            for d in frame.deps {
                if d == parent_pos {
                    parent.self_dep = true;
                } else {
                    parent.deps.insert(d);
                }
            }
            parent.provisional.extend(frame.provisional);
            parent.provisional.push(id);
        }
        Ok(result)
    }

    /// Evaluates the body of `id` until its result no longer changes; gives
    /// the result and the epoch at which the last round started.
    fn fixpoint(&mut self, id: usize, pos: usize) -> Result<(AbsVal, u64), InferError> {
        let mut approx = self.specs[id].spec.result.clone();
        for _ in 0..MAX_ITERATIONS {
            self.epoch += 1;
            let epoch = self.epoch;
            self.specs[id].evaluated_at = epoch;
            self.specs[id].spec.result = approx.clone();
            self.frames[pos].self_dep = false;
            let (result, values, calls) = self.eval_body(id)?;
            let spec = &mut self.specs[id].spec;
            spec.values = values;
            spec.calls = calls;
            let joined = join(&approx, &result).ok_or_else(|| {
                let graph = self.m.graph(spec.graph);
                let loc = graph.output.map_or(graph.loc, |o| self.m.node(o).loc);
                InferError::new(
                    loc,
                    format!(
                        "recursive calls of @{} give different types: {approx} and {result}",
                        graph.name
                    ),
                )
            })?;
            if !self.frames[pos].self_dep || joined == approx {
                return Ok((joined, epoch));
            }
            approx = joined;
        }
        let graph = self.m.graph(self.specs[id].spec.graph);
        Err(InferError::new(
            graph.loc,
            format!("type inference of @{} does not converge", graph.name),
        ))
    }

    /// Evaluates the body of a specialisation once.
    #[allow(clippy::type_complexity)]
    fn eval_body(
        &mut self,
        id: usize,
    ) -> Result<
        (
            AbsVal,
            HashMap<NodeId, AbsVal>,
            HashMap<NodeId, Vec<SpecId>>,
        ),
        InferError,
    > {
        let g = self.specs[id].spec.graph;
        let graph = self.m.graph(g);
        let Some(out) = graph.output else {
            return Err(InferError::new(
                graph.loc,
                format!("internal error: graph @{} has no output", graph.name),
            ));
        };
        let mut values: HashMap<NodeId, AbsVal> = HashMap::default();
        let spec = &self.specs[id].spec;
        for (p, v) in graph.params.iter().zip(&spec.args) {
            values.insert(*p, v.clone());
        }
        for (n, v) in self.fv.get(g).iter().zip(spec.captures.iter()) {
            values.insert(*n, v.clone());
        }
        let mut calls = HashMap::default();
        let body = self.body(g);
        let dead = self.dead(g);
        let result = self
            .eval_nodes(&body, false, &mut values, &mut calls)
            .and_then(|_| self.value_of(out, &values, g))
            // Dead code is typed too: its errors are errors, and later
            // checks (the dtype of reassigned variables) read its types.
            .and_then(|r| {
                self.eval_nodes(&dead, true, &mut values, &mut calls)
                    .map(|_| r)
            });
        match result {
            Ok(r) => Ok((r, values, calls)),
            Err(e) => {
                self.partial.insert(id, values);
                Err(e)
            }
        }
    }

    /// Evaluates `nodes` in order into `values` (with the calls each
    /// made); with `if_available`, skips a node whose inputs have no value.
    fn eval_nodes(
        &mut self,
        nodes: &[NodeId],
        if_available: bool,
        values: &mut HashMap<NodeId, AbsVal>,
        calls: &mut HashMap<NodeId, Vec<SpecId>>,
    ) -> Result<(), InferError> {
        for &n in nodes {
            if if_available && !self.inputs_available(n, values) {
                continue;
            }
            let (v, called) = self.eval_apply(n, values)?;
            self.check_size(n, &v)?;
            if !called.is_empty() {
                calls.insert(n, called);
            }
            values.insert(n, v);
        }
        Ok(())
    }

    /// Rejects a value with more than [`MAX_VALUE_PARTS`] parts.
    fn check_size(&self, n: NodeId, v: &AbsVal) -> Result<(), InferError> {
        if v.exceeds_parts(MAX_VALUE_PARTS) {
            return Err(InferError::new(
                self.loc(n),
                format!(
                    "this value is too large for type inference: more than {MAX_VALUE_PARTS} parts (tuple elements, record fields, tensors)"
                ),
            ));
        }
        Ok(())
    }

    /// The value of node `n` used in graph `g`.
    fn value_of(
        &self,
        n: NodeId,
        values: &HashMap<NodeId, AbsVal>,
        g: GraphId,
    ) -> Result<AbsVal, InferError> {
        if let Some(v) = values.get(&n) {
            return Ok(v.clone());
        }
        match &self.m.node(n).kind {
            NodeKind::Const(Const::Graph(h)) => {
                let mut captures = Vec::with_capacity(self.fv.get(*h).len());
                for v in self.fv.get(*h) {
                    match values.get(v) {
                        Some(AbsVal::Bottom) => return Ok(AbsVal::Bottom),
                        Some(x) => captures.push(x.clone()),
                        None => {
                            return Err(InferError::new(
                                self.loc(n),
                                format!(
                                "internal error: free variable {v} of @{} is not available in @{}",
                                self.m.graph(*h).name,
                                self.m.graph(g).name
                            ),
                            ))
                        }
                    }
                }
                // Closures that capture closures (backpropagators of loop
                // iterations, say) could nest without end: past a small
                // depth, a captured function is only known at run time.
                let truncated: Vec<AbsVal> = captures
                    .iter()
                    .map(|c| c.truncate_funcs(MAX_CLOSURE_DEPTH))
                    .collect();
                if truncated != captures {
                    let mut lost = HashSet::default();
                    for c in &captures {
                        c.truncated_graphs(MAX_CLOSURE_DEPTH, &mut lost);
                    }
                    self.escaped.borrow_mut().extend(lost);
                }
                let captures = truncated.into();
                Ok(AbsVal::Func(vec![Closure::Graph {
                    graph: *h,
                    captures,
                }]))
            }
            NodeKind::Const(c) => Ok(const_value(c).expect("graph constants handled above")),
            _ => Err(InferError::new(
                self.loc(n),
                format!(
                    "internal error: node {n} is used in @{} but not available there",
                    self.m.graph(g).name
                ),
            )),
        }
    }

    /// Evaluates application `n`; gives its value and the specialisations
    /// it called.
    fn eval_apply(
        &mut self,
        n: NodeId,
        values: &HashMap<NodeId, AbsVal>,
    ) -> Result<(AbsVal, Vec<SpecId>), InferError> {
        let m = self.m;
        let g = m.node(n).graph.expect("applications belong to a graph");
        let inputs = m.inputs(n);
        let Some((&callee_node, arg_nodes)) = inputs.split_first() else {
            return Err(InferError::new(
                self.loc(n),
                "internal error: application without callee",
            ));
        };
        let callee = self.value_of(callee_node, values, g)?;
        let mut args = Vec::with_capacity(arg_nodes.len());
        for &a in arg_nodes {
            args.push(self.value_of(a, values, g)?);
        }
        let value_of = |id: NodeId| -> Option<AbsVal> {
            values
                .get(&id)
                .cloned()
                .or_else(|| m.as_const(id).and_then(const_value))
        };
        if let Some((cond, a, b)) = self.literal_switch(callee_node, values, g)? {
            return self.call_both(n, cond, &a, &b, args, arg_nodes, &value_of);
        }
        self.call_value(&callee, args, arg_nodes, n, &value_of)
            .map_err(|e| self.relocate(e, n))
    }

    /// For a callee `switch(c, a, b)` whose condition is computed from
    /// literals alone (`if true`, `while true`), the condition and both
    /// branches: such an `if` still needs branches of one type. A condition
    /// known only through specialisation (a loop counter, a recursion
    /// argument) selects one branch, so recursion on constants ends.
    #[allow(clippy::type_complexity)]
    fn literal_switch(
        &self,
        callee: NodeId,
        values: &HashMap<NodeId, AbsVal>,
        g: GraphId,
    ) -> Result<Option<(bool, AbsVal, AbsVal)>, InferError> {
        if self.m.applied_prim(callee) != Some(Prim::Switch) {
            return Ok(None);
        }
        let &[_, c, a, b] = self.m.inputs(callee) else {
            return Ok(None);
        };
        if self.opts.only_taken_branches || !provenance::is_literal(self.m, c) {
            return Ok(None);
        }
        let cond = match values.get(&callee) {
            Some(AbsVal::Func(_)) => self.value_of(c, values, g)?,
            _ => return Ok(None),
        };
        let Some(AbsTensor {
            dtype: DType::Bool,
            value: Some(v),
            ..
        }) = cond.as_tensor()
        else {
            return Ok(None);
        };
        let cond = v.first().is_some_and(|&v| v != 0);
        Ok(Some((
            cond,
            self.value_of(a, values, g)?,
            self.value_of(b, values, g)?,
        )))
    }

    /// Calls both branches of an `if` on a literal condition; gives the
    /// taken branch's result once both are known to have one type.
    #[allow(clippy::too_many_arguments)]
    fn call_both(
        &mut self,
        site: NodeId,
        cond: bool,
        a: &AbsVal,
        b: &AbsVal,
        args: Vec<AbsVal>,
        arg_nodes: &[NodeId],
        value_of: &dyn Fn(NodeId) -> Option<AbsVal>,
    ) -> Result<(AbsVal, Vec<SpecId>), InferError> {
        let (ra, mut called) = self.call_value(a, args.clone(), arg_nodes, site, value_of)?;
        let (rb, cb) = self.call_value(b, args, arg_nodes, site, value_of)?;
        called.extend(cb);
        if join(&ra, &rb).is_none() {
            let graph_of = |f: &AbsVal| match f {
                AbsVal::Func(cs) if cs.len() == 1 => match cs[0] {
                    Closure::Graph { graph, .. } => Some(graph),
                    Closure::Prim(_) => None,
                },
                _ => None,
            };
            return Err(self.branch_error(site, &[(ra, graph_of(a))], &rb, graph_of(b)));
        }
        Ok((if cond { ra } else { rb }, called))
    }

    /// An error raised inside standard-library code (or code that
    /// differentiation generated, which has no location) is reported at the
    /// user's call `site`, with the inner location as a secondary label.
    fn relocate(&self, e: InferError, site: NodeId) -> InferError {
        let internal = |l: Loc| l.is_none() || self.opts.internal_files.contains(&l.file);
        let at = self.loc(site);
        if !internal(e.loc) || internal(at) {
            return e;
        }
        let mut secondary = e.secondary;
        if !e.loc.is_none() {
            secondary.insert(
                0,
                (
                    e.loc,
                    "while checking this part of the standard library".to_string(),
                ),
            );
        }
        InferError {
            loc: at,
            message: e.message,
            secondary,
        }
    }

    /// Calls function value `f` at application `site`.
    fn call_value(
        &mut self,
        f: &AbsVal,
        args: Vec<AbsVal>,
        arg_nodes: &[NodeId],
        site: NodeId,
        value_of: &dyn Fn(NodeId) -> Option<AbsVal>,
    ) -> Result<(AbsVal, Vec<SpecId>), InferError> {
        let closures = match f {
            AbsVal::Func(cs) => cs,
            AbsVal::Bottom => return Ok((AbsVal::Bottom, Vec::new())),
            AbsVal::Unknown | AbsVal::Zero => {
                self.lose(&args, &[]);
                return Ok((AbsVal::Unknown, Vec::new()));
            }
            other => {
                return Err(InferError::new(
                    self.loc(site),
                    format!("cannot call a value of type {other}"),
                ))
            }
        };
        let mut called = Vec::new();
        let mut results: Vec<(AbsVal, Option<GraphId>)> = Vec::with_capacity(closures.len());
        for c in closures {
            match c {
                Closure::Prim(p) => {
                    let ctx = RuleCtx {
                        module: self.m,
                        loc: self.loc(site),
                        arg_nodes,
                        value_of,
                        load_type: self.opts.load_type,
                    };
                    let mut nested = SiteCalls {
                        interp: self,
                        site,
                        called: Vec::new(),
                    };
                    let r = rules::apply(*p, &ctx, &args, &mut nested);
                    called.extend(nested.called);
                    match r {
                        Ok(v) => {
                            // A primitive whose result is (partly) of
                            // unknown type may have stored the closures it
                            // was given there (an environment, a run-time
                            // transform): those are lost to inference, but
                            // for the function `tree_map` calls where
                            // inference sees it. Projections (`switch`,
                            // `tuple_get`) lose nothing: what they do not
                            // return is still where it was.
                            let projection =
                                matches!(p, Prim::Switch | Prim::TupleGet | Prim::RecordGet);
                            if !projection && v.contains_unknown() {
                                let mut out = vec![v.clone()];
                                if *p == Prim::TreeMap {
                                    out.push(args[0].clone());
                                }
                                self.lose(&args, &out);
                            }
                            results.push((v, None))
                        }
                        Err(RuleError::Msg(msg)) => return Err(InferError::new(ctx.loc, msg)),
                        Err(RuleError::Nested(e)) => return Err(e),
                    }
                }
                Closure::Graph { graph, captures } => {
                    if args.iter().any(AbsVal::is_bottom) {
                        results.push((AbsVal::Bottom, Some(*graph)));
                        continue;
                    }
                    self.speculating = closures.len() > 1;
                    let (v, id) =
                        self.call_graph(*graph, args.clone(), captures.clone(), Some(site))?;
                    called.push(SpecId(id as u32));
                    results.push((v, Some(*graph)));
                }
            }
        }
        let mut acc = AbsVal::Bottom;
        for (i, (v, g)) in results.iter().enumerate() {
            match join(&acc, v) {
                Some(j) => acc = j,
                None => return Err(self.branch_error(site, &results[..i], v, *g)),
            }
        }
        Ok((acc, called))
    }

    /// Records as escaped the graphs of the closures in `before` that are
    /// not in `after`: inference will not see where they are called.
    fn lose(&self, before: &[AbsVal], after: &[AbsVal]) {
        let mut had = HashSet::default();
        for v in before {
            v.collect_graphs(&mut had);
        }
        if had.is_empty() {
            return;
        }
        let mut kept = HashSet::default();
        for v in after {
            v.collect_graphs(&mut kept);
        }
        self.escaped
            .borrow_mut()
            .extend(had.difference(&kept).copied());
    }

    /// The error for a call of a set of closures whose results do not join:
    /// the branches of an `if` when the callee is a `switch`.
    fn branch_error(
        &self,
        site: NodeId,
        before: &[(AbsVal, Option<GraphId>)],
        v: &AbsVal,
        g: Option<GraphId>,
    ) -> InferError {
        let first = before
            .iter()
            .find(|(w, _)| !w.is_bottom() && join(w, v).is_none())
            .or(before.first());
        let (a, ga) = first.map_or((AbsVal::Bottom, None), |(a, ga)| (a.clone(), *ga));
        let callee = self.m.inputs(site).first().copied();
        let is_if = callee.and_then(|c| self.m.applied_prim(c)) == Some(Prim::Switch);
        let (ua, uv) = (a.user_view(), v.user_view());
        let message = if is_if {
            format!("if branches have different types: {ua} and {uv}")
        } else {
            format!("the functions called here return different types: {ua} and {uv}")
        };
        let mut e = InferError::new(self.loc(site), message);
        for (graph, ty) in [(ga, &a), (g, v)] {
            if let Some(h) = graph {
                let graph = self.m.graph(h);
                let loc = graph.output.map_or(graph.loc, |o| self.m.node(o).loc);
                let what = if is_if {
                    "this branch"
                } else {
                    "this function"
                };
                e.secondary
                    .push((loc, format!("{what} has type {}", ty.user_view())));
            }
        }
        e
    }

    /// The specialisations reachable from `roots` (distinct) through
    /// calls, in order of discovery (call sites in node order, so the
    /// order is the same on every run).
    fn reachable_specs(&self, roots: &[usize]) -> Vec<usize> {
        let mut seen: HashSet<usize> = roots.iter().copied().collect();
        let mut order: Vec<usize> = roots.to_vec();
        let mut i = 0;
        while i < order.len() {
            let calls = &self.specs[order[i]].spec.calls;
            let mut sites: Vec<&NodeId> = calls.keys().collect();
            sites.sort();
            for site in sites {
                for c in &calls[site] {
                    if seen.insert(c.index()) {
                        order.push(c.index());
                    }
                }
            }
            i += 1;
        }
        order
    }

    /// Evaluates the closures that the specialisations reachable from
    /// `entry` hide with `ad_hide` (the backpropagators a reversed loop
    /// pushes on its stack) on arguments of unknown type, as the calls
    /// inference cannot see would. Gives the specialisations made, and the
    /// graphs whose every closure was evaluated so (see
    /// [`Types::covers_all_calls`]): those made at one place only,
    /// `ad_hide(make_tuple(@g, ..))`, none of whose evaluations failed. A
    /// failed evaluation leaves nothing behind.
    fn type_hidden_closures(&mut self, entry: usize) -> (Vec<usize>, HashSet<GraphId>) {
        /// Hidden closures evaluated at most (nested loops hide more).
        const MAX_HIDDEN: usize = 4096;
        let mut general: Vec<usize> = Vec::new();
        let mut failed: HashSet<GraphId> = HashSet::default();
        let mut done: HashSet<(GraphId, Arc<[AbsVal]>)> = HashSet::default();
        // The `make_tuple` nodes whose closures are hidden.
        let mut sites: HashSet<NodeId> = HashSet::default();
        let mut scanned: HashSet<usize> = HashSet::default();
        let mut roots = vec![entry];
        loop {
            let mut hidden: Vec<(GraphId, Arc<[AbsVal]>)> = Vec::new();
            for id in self.reachable_specs(&roots) {
                if !scanned.insert(id) {
                    continue;
                }
                let spec = &self.specs[id].spec;
                let mut nodes: Vec<NodeId> = spec
                    .values
                    .keys()
                    .copied()
                    .filter(|n| self.m.applied_prim(*n) == Some(Prim::AdHide))
                    .collect();
                nodes.sort();
                for n in nodes {
                    let Some(&x) = self.m.inputs(n).get(1) else {
                        continue;
                    };
                    let Some(v) = spec.values.get(&x) else {
                        continue;
                    };
                    sites.insert(x);
                    let items = match v {
                        AbsVal::Tuple(items) => items.as_slice(),
                        other => std::slice::from_ref(other),
                    };
                    for item in items {
                        let AbsVal::Func(cs) = item else { continue };
                        for c in cs {
                            if let Closure::Graph { graph, captures } = c {
                                if captures.iter().any(AbsVal::is_bottom) {
                                    failed.insert(*graph);
                                    continue;
                                }
                                let key = (*graph, captures.clone());
                                if done.insert(key.clone()) {
                                    hidden.push(key);
                                }
                            }
                        }
                    }
                }
            }
            if hidden.is_empty() {
                break;
            }
            if done.len() > MAX_HIDDEN {
                failed.extend(hidden.iter().map(|(g, _)| *g));
                break;
            }
            roots.clear();
            for (graph, captures) in hidden {
                let arity = self.m.graph(graph).params.len();
                let before = self.specs.len();
                match self.call_graph(graph, vec![AbsVal::Unknown; arity], captures, None) {
                    Ok((_, id)) => {
                        general.push(id);
                        roots.push(id);
                    }
                    Err(_) => {
                        failed.insert(graph);
                        self.partial.clear();
                        self.specs.truncate(before);
                        self.cache.retain(|_, id| *id < before);
                        for e in &mut self.specs {
                            for ids in e.spec.calls.values_mut() {
                                ids.retain(|id| id.index() < before);
                            }
                        }
                    }
                }
            }
        }
        if general.is_empty() {
            return (general, HashSet::default());
        }
        // Where each evaluated graph's closures are made.
        let mut made: HashMap<GraphId, Vec<NodeId>> = HashMap::default();
        let evaluated: HashSet<GraphId> = general
            .iter()
            .map(|&id| self.specs[id].spec.graph)
            .collect();
        for (i, node) in self.m.nodes.iter().enumerate() {
            let (Some(_), NodeKind::Apply(inputs)) = (node.graph, &node.kind) else {
                continue;
            };
            for &x in inputs {
                if let Some(Const::Graph(g)) = self.m.as_const(x) {
                    if evaluated.contains(g) {
                        made.entry(*g).or_default().push(NodeId(i as u32));
                    }
                }
            }
        }
        let covered = evaluated
            .into_iter()
            .filter(|g| {
                !failed.contains(g)
                    && matches!(made.get(g).map(Vec::as_slice), Some([site]) if sites.contains(site)
                        && self.m.applied_prim(*site) == Some(Prim::MakeTuple)
                        && self.m.inputs(*site).get(1).and_then(|x| self.m.as_const(*x))
                            == Some(&Const::Graph(*g)))
            })
            .collect();
        (general, covered)
    }

    /// Builds the result table: the specialisations reachable from the
    /// entry (and from `general`, see [`Self::type_hidden_closures`])
    /// through calls, renumbered in order of discovery.
    /// What was found before an error: every specialisation made, with
    /// the values its last evaluation reached.
    fn finish_partial(mut self) -> Option<Types> {
        if self.specs.is_empty() {
            return None;
        }
        for (id, values) in std::mem::take(&mut self.partial) {
            self.specs[id].spec.values.extend(values);
        }
        let all: Vec<usize> = (0..self.specs.len()).collect();
        Some(self.finish_in(all, HashSet::default()))
    }

    fn finish(self, entry: usize, general: &[usize], covered: HashSet<GraphId>) -> Types {
        let mut roots = vec![entry];
        for &g in general {
            if !roots.contains(&g) {
                roots.push(g);
            }
        }
        let order = self.reachable_specs(&roots);
        self.finish_in(order, covered)
    }

    /// Types of the specialisations `order` (the entry's first), numbered
    /// in that order.
    fn finish_in(self, order: Vec<usize>, covered: HashSet<GraphId>) -> Types {
        let new_id: HashMap<usize, u32> = order
            .iter()
            .enumerate()
            .map(|(k, &old)| (old, k as u32))
            .collect();
        let mut entries: Vec<Option<Entry>> = self.specs.into_iter().map(Some).collect();
        let mut specs = Vec::with_capacity(order.len());
        let mut by_graph: HashMap<GraphId, Vec<SpecId>> = HashMap::default();
        let mut by_node: HashMap<NodeId, Vec<SpecId>> = HashMap::default();
        for (k, old) in order.iter().enumerate() {
            let mut spec = entries[*old].take().expect("each spec once").spec;
            for ids in spec.calls.values_mut() {
                for id in ids.iter_mut() {
                    *id = SpecId(new_id[&id.index()]);
                }
            }
            let id = SpecId(k as u32);
            by_graph.entry(spec.graph).or_default().push(id);
            let mut nodes: Vec<NodeId> = spec.values.keys().copied().collect();
            nodes.sort();
            for n in nodes {
                by_node.entry(n).or_default().push(id);
            }
            specs.push(spec);
        }
        // Closures inference lost track of may be called with any
        // arguments, and so may every graph they reach: what inference
        // knows of those graphs holds only for the calls it saw.
        let mut escaped: HashSet<GraphId> = HashSet::default();
        // (One traversal per round for the whole frontier: each call of
        // `reachable_graphs` scans the module.)
        let mut frontier: Vec<GraphId> = self.escaped.into_inner().into_iter().collect();
        while !frontier.is_empty() {
            let reached = reachable_graphs(self.m, &frontier);
            frontier.clear();
            for g in reached {
                if !escaped.insert(g) {
                    continue;
                }
                for id in by_graph.get(&g).into_iter().flatten() {
                    for callees in specs[id.index()].calls.values() {
                        frontier.extend(
                            callees
                                .iter()
                                .map(|c| specs[c.index()].graph)
                                .filter(|c| !escaped.contains(c)),
                        );
                    }
                }
            }
        }
        if tracing::enabled!(target: "adjoint::opt", tracing::Level::DEBUG) {
            let values: usize = specs.iter().map(|s| s.values.len()).sum();
            let mut most: Vec<(usize, GraphId)> =
                by_graph.iter().map(|(g, v)| (v.len(), *g)).collect();
            most.sort_by(|a, b| b.cmp(a));
            let most: Vec<String> = most
                .iter()
                .take(6)
                .map(|(k, g)| format!("{} {k}", self.m.graph(*g).name))
                .collect();
            tracing::debug!(
                target: "adjoint::opt",
                "infer: {} specialisations of {} graphs, {values} values; most: {}",
                specs.len(),
                by_graph.len(),
                most.join(", ")
            );
        }
        Types {
            specs,
            by_graph,
            by_node,
            entry: SpecId(0),
            escaped,
            general: covered,
        }
    }
}

/// Calls made by a primitive's rule (`tree_map`), attributed to its site.
struct SiteCalls<'i, 'a> {
    interp: &'i mut Interp<'a>,
    site: NodeId,
    called: Vec<SpecId>,
}

impl Calls for SiteCalls<'_, '_> {
    fn call(&mut self, f: &AbsVal, args: Vec<AbsVal>) -> Result<AbsVal, InferError> {
        let (v, ids) = self.interp.call_value(f, args, &[], self.site, &|_| None)?;
        self.called.extend(ids);
        Ok(v)
    }
}

/// `f takes 2 arguments, but 1 was given`, with the callee named as the
/// user wrote it: `grad(f)` for the graph lowering named `grad.f`, the
/// pullback of a `vjp`, a lambda.
fn arity_message(graph: &str, want: usize, got: usize) -> String {
    let who = if let Some(f) = graph.strip_prefix("pullback.") {
        match crate::ir::source_name(f) {
            Some(f) => format!("the pullback of `{f}`"),
            None => "this pullback".to_string(),
        }
    } else {
        crate::ir::source_phrase(graph)
    };
    format!(
        "{who} takes {want} argument{}, but {got} {} given",
        if want == 1 { "" } else { "s" },
        if got == 1 { "was" } else { "were" }
    )
}
