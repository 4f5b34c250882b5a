//! Automatic differentiation as IR-to-IR transforms: reverse mode here,
//! forward mode in `forward.rs`.
//!
//! `J` maps every graph `f` to a graph `J(f)` with the same parameters that
//! returns `(value, backpropagator)`. The backpropagator is an ordinary
//! closure graph `B(f)` from the output cotangent to
//! `(env, d_param0, d_param1, ..)`, where `env` holds the cotangents of the
//! free variables of `f`, keyed by the original node each stands for
//! ([`env_key`]; the Myia / MindSpore environment). Function values inside
//! `J(f)` are themselves J-transformed closures, so closures, higher-order
//! functions, `switch` (only the taken branch runs, forward and backward)
//! and recursion (loops are recursive graphs) need no special case.
//!
//! Primitives get their rule from `bprop` definitions in
//! `stdlib/bprop.adj`, written in Adjoint and lowered like any function, so
//! they are differentiated in turn (second and higher derivatives). A
//! missing contribution is the symbolic zero `zero()`; each primitive's
//! backpropagator returns zeros at once when its output cotangent is zero.
//! The variadic structural primitives and `tree_map` (a higher-order
//! primitive: its function argument arrives J-transformed) have rules
//! generated here.
//!
//! Forward mode (`jvp`) is a separate transform on the same IR, in
//! `forward.rs`: each graph `f` becomes `F(f)`, which computes values and
//! tangents together, with the tangent rules of `stdlib/jvp.adj`. Both
//! share the request queue, the checks and the rule table ([`Rules`]).

pub mod dynamic;
mod forward;
mod symmetric;

use std::collections::{HashMap, HashSet};

use crate::checks::Check;
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs, FreeVars};
use crate::ir::{Const, GraphId, GraphRole, Loc, Module, NodeId, NodeKind};
use crate::prim::{Category, Prim};

/// The arguments `grad` differentiates, as JAX takes them: one (an int,
/// or none given: the first), whose gradient is the result, or a tuple,
/// whose gradients come in a tuple.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Argnums {
    One(usize),
    Many(Vec<usize>),
}

impl Argnums {
    /// The differentiated argument positions.
    pub fn which(&self) -> Vec<usize> {
        match self {
            Argnums::One(i) => vec![*i],
            Argnums::Many(v) => v.clone(),
        }
    }

    /// Whether the gradients come in a tuple.
    pub fn tupled(&self) -> bool {
        matches!(self, Argnums::Many(_))
    }

    /// The form `ad_dyn` carries: `""` for the first argument, `"=k"`
    /// for argument `k` alone, `"i,j"` for a tuple.
    pub fn encode(&self) -> String {
        match self {
            Argnums::One(0) => String::new(),
            Argnums::One(k) => format!("={k}"),
            Argnums::Many(v) => v
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The inverse of [`Argnums::encode`].
    pub fn decode(s: &str) -> Result<Argnums, String> {
        let bad = || format!("bad argnums `{s}`");
        if s.is_empty() {
            return Ok(Argnums::One(0));
        }
        if let Some(k) = s.strip_prefix('=') {
            return k.parse().map(Argnums::One).map_err(|_| bad());
        }
        s.split(',')
            .map(|a| a.trim().parse::<usize>().map_err(|_| bad()))
            .collect::<Result<_, _>>()
            .map(Argnums::Many)
    }
}

/// What the user asked for.
#[derive(Clone, Debug)]
pub enum AdKind {
    /// `grad(f)` (the first argument's gradient), `grad(f, argnums = k)`
    /// (argument `k`'s) or `grad(f, argnums = (..))` (a tuple of them);
    /// `value_and_grad` pairs the value.
    Grad { argnums: Argnums, with_value: bool },
    /// `vjp(f, x..)`: `(y, pullback)`.
    Vjp,
    /// `jvp(f, (x..), (dx..))`: `(y, dy)`.
    Jvp,
}

/// A graph with free variables, and what each of them stands for in the
/// transform being built (`None`: not mapped yet).
type Scoped = (GraphId, Vec<Option<NodeId>>);

/// A graph to build: `target` is an empty graph that lowering already
/// refers to; it becomes the requested transform of `source`.
#[derive(Clone, Debug)]
pub struct AdRequest {
    pub target: GraphId,
    pub source: GraphId,
    pub kind: AdKind,
    pub loc: Loc,
    /// The name of the differentiated function, for messages.
    pub name: String,
}

pub use forward::{missing_tangent_rules, tangent_is_generated};

/// Derivative rules: lowered `bprop` graphs for primitives and for user
/// functions with a custom rule (reverse mode), and lowered `jvp_*`
/// functions of `stdlib/jvp.adj` for primitives (forward mode).
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub prims: HashMap<Prim, GraphId>,
    pub user: HashMap<GraphId, GraphId>,
    /// Tangent rules, `jvp_p(inputs.., out, tangents..)`.
    pub tangents: HashMap<Prim, GraphId>,
}

#[derive(Clone, Debug)]
pub struct AdError {
    pub loc: Loc,
    pub message: String,
    pub note: Option<String>,
}

type R<T> = Result<T, AdError>;

/// Differentiable primitives that have no rule yet: differentiating
/// through them is a compile-time error at the user's expression. Empty:
/// every differentiable primitive has both rules. A primitive added here
/// is exempt from the start-up checks ([`missing_rules`],
/// [`missing_tangent_rules`]) and from the finite-difference table of
/// `tests/gradcheck.rs`, which instead requires the error.
pub const NO_RULE_YET: &[Prim] = &[];

/// Checks the rule table: every differentiable primitive has a rule, is
/// generated here, or is listed in [`NO_RULE_YET`].
pub fn missing_rules(rules: &Rules) -> Vec<Prim> {
    Prim::all()
        .iter()
        .copied()
        .filter(|p| p.info().differentiable)
        .filter(|p| !rule_is_generated(*p) && !NO_RULE_YET.contains(p))
        .filter(|p| !rules.prims.contains_key(p))
        .collect()
}

/// The primitives whose rule the transform writes itself (variadic ones).
pub fn rule_is_generated(p: Prim) -> bool {
    matches!(
        p,
        Prim::MakeTuple
            | Prim::MakeRecord
            | Prim::TensorLiteral
            | Prim::Index
            | Prim::IndexGrad
            | Prim::TreeMap
            | Prim::AdLift
            | Prim::AdDyn
            | Prim::AdHide
            | Prim::AdKey
    )
}

/// Where the transforms' graphs came from, for differentiating function
/// values at run time ([`dynamic`]): each `J`/`F` graph's source and mode,
/// and for each forward node the original node it stands for.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    /// `J(f)` → (1, f); `F(f)` → (2, f).
    pub graphs: HashMap<GraphId, (u8, GraphId)>,
    /// A node of a `J`/`F` graph → the original node whose (primal) value
    /// it is.
    pub origin: HashMap<NodeId, NodeId>,
    /// A tangent node of an `F` graph → the original node it is the
    /// tangent of.
    pub tangent_origin: HashMap<NodeId, NodeId>,
    /// The nodes of `origin` that `J` made: reverse mode carries values
    /// through unchanged, so [`env_key`] leaves their steps out.
    pub j_origin: HashSet<NodeId>,
    /// Forward graphs built at run time take the tangents of their
    /// captured values as free variables too: placeholder nodes (params of
    /// the graph `holder`), by the value each stands for, and back. That
    /// value is a captured node and a path: the steps from the node's
    /// value, one per forward level (innermost first, `true` for a
    /// tangent, `false` for a value carried through; `J` levels, which
    /// only carry values, are not counted), ending with the placeholder's
    /// own, `true`. In `F(F(g))` built at run time the captured `x` has
    /// three: `[true]` (the inner tangent, which the outer level carries),
    /// `[false, true]` and `[true, true]`.
    pub placeholder: HashMap<(NodeId, Vec<bool>), NodeId>,
    pub placeholder_of: HashMap<NodeId, (NodeId, Vec<bool>)>,
    pub holder: Option<GraphId>,
}

/// The environment key under which a backpropagator gives the cotangent
/// of free variable `n` of the closure it belongs to, a closure of a graph
/// with `f_level` forward transforms (only graphs built at run time need
/// it: they take tangents as placeholders).
///
/// It names the value `n` holds, not the node: the original node it comes
/// from ([`Provenance::origin`]), and the forward steps between (a value
/// carried through, or a tangent: [`Provenance::tangent_origin`],
/// [`Provenance::placeholder_of`]), counted from the outermost forward
/// transform inwards, without `J`'s steps (reverse mode carries values
/// unchanged) and without the steps below the innermost tangent step
/// (values carried, or captured as they were and lifted inside). A
/// closure transformed at compile time captures the enclosing transform's
/// nodes (`J(f)`'s `x`), one built at run time ([`dynamic`]) the
/// original's (`f`'s `x`, and placeholders for its tangents), and lifting
/// a closure at run time adds an innermost level; keying all alike lets
/// the cotangents of captures flow between them at every order. Within
/// one closure the keys stay distinct: its free variables are its
/// transform's nodes for distinct original values.
///
/// A key is the original node's id when no tangent step is taken, else
/// the forward steps from the outermost inwards (1 for a tangent, 0 for a
/// value carried through) as bits under a leading 1, above the node's id.
pub fn env_key(prov: &Provenance, n: NodeId, f_level: usize) -> i64 {
    let mut k = n;
    // Outermost first.
    let mut steps: Vec<bool> = Vec::new();
    loop {
        if let Some(o) = prov.origin.get(&k) {
            if !prov.j_origin.contains(&k) {
                steps.push(false);
            }
            k = *o;
        } else if let Some(o) = prov.tangent_origin.get(&k) {
            steps.push(true);
            k = *o;
        } else if let Some((o, path)) = prov.placeholder_of.get(&k) {
            // The path counts levels from the innermost, `below` of them.
            let below = f_level.saturating_sub(steps.len()).max(path.len());
            steps.extend(
                (0..below)
                    .rev()
                    .map(|l| path.get(l).copied().unwrap_or(false)),
            );
            k = *o;
        } else {
            break;
        }
    }
    let inner = steps.iter().rev().take_while(|t| !**t).count();
    let path = &steps[..steps.len() - inner];
    if path.is_empty() {
        return k.0 as i64;
    }
    // Outermost first. Past 27 bits (never reached: each transform
    // multiplies the code's size) the outermost steps are dropped, so such
    // keys may coincide.
    let mut code: u64 = 1;
    for t in path.iter() {
        code = (code << 1) | u64::from(*t);
        if code >= 1 << 28 {
            code = (code & ((1 << 27) - 1)) | (1 << 27);
        }
    }
    ((code << 32) | u64::from(k.0)) as i64
}

/// Simplifies the graphs reachable from a root, in a module of their own
/// (the optimiser's untyped rounds: the pipeline passes it down).
pub type Simplify<'a> = &'a dyn Fn(&mut Module, GraphId);

/// Builds every requested graph. Returns checks that need types (the
/// differentiated arguments must be floats; `grad` needs a scalar result).
///
/// With `simplify`, a derivative that is differentiated again (a built
/// request's target, a directional derivative of the symmetric
/// transforms) is differentiated as a simplified copy: transforming the
/// transforms' own machinery (zero guards, environments, tuples of
/// backpropagators) multiplied the size of each further order by about
/// five; the simplified copy of a derivative is about the size of the
/// derivative's arithmetic.
pub fn run(
    m: &mut Module,
    requests: &[AdRequest],
    rules: &Rules,
    effectful: &HashSet<GraphId>,
    prov: &mut Provenance,
    simplify: Option<Simplify<'_>>,
) -> Result<Vec<Check>, AdError> {
    let mut ad = Ad::new(m, rules, effectful, prov);
    ad.simplify = simplify;
    ad.requests = requests.iter().map(|r| (r.target, r.clone())).collect();
    // A request may differentiate a function that contains another request's
    // target: build the inner ones first.
    let mut pending: Vec<usize> = (0..requests.len()).collect();
    while !pending.is_empty() {
        let targets: HashSet<GraphId> = pending.iter().map(|i| requests[*i].target).collect();
        let ready = pending.iter().position(|i| {
            let r = &requests[*i];
            reachable_graphs(ad.m, &[r.source])
                .iter()
                .all(|g| !targets.contains(g))
        });
        let Some(pos) = ready else {
            let r = &requests[pending[0]];
            return Err(AdError {
                loc: r.loc,
                message: "differentiation requests depend on each other in a cycle".into(),
                note: None,
            });
        };
        let i = pending.remove(pos);
        ad.build(&requests[i])?;
        ad.built.insert(requests[i].target);
    }
    Ok(ad.checks)
}

struct Ad<'a> {
    m: &'a mut Module,
    rules: &'a Rules,
    effectful: &'a HashSet<GraphId>,
    prov: &'a mut Provenance,
    fv: FreeVars,
    /// Whether values from outside the transformed graphs are lifted with
    /// `ad_lift` (compile-time requests, whose closures capture them as
    /// they are) or used as they are (graphs built at run time for a
    /// closure, whose captures arrive lifted).
    lift_outside: bool,
    /// Whether a request differentiates its source through `ad_lift` of
    /// the source's closure (requests built at run time).
    lift_source: bool,
    /// The forward level of the forward graphs built at run time (how
    /// many forward transforms the transformed graph already has): the
    /// tangent step a placeholder takes ([`Provenance::placeholder`]).
    f_level: usize,
    /// `ad_lift(n, mode)` made in a graph, by (graph, n, mode).
    lifted: HashMap<(GraphId, NodeId, u8), NodeId>,
    /// Graphs on (or reached from) a cycle of tail calls: loops and tail
    /// recursion. Their J threads a stack of backpropagators ([`Ad::j_stacked`]).
    tail_set: Option<HashSet<GraphId>>,
    /// The stack-threading J of graphs in `tail_set` (with free variables:
    /// within one request, per mapping of them, see [`Scoped`]; closed:
    /// shared).
    jk_graphs: HashMap<Scoped, GraphId>,
    jk_closed: HashMap<GraphId, GraphId>,
    /// `unwind(stack, d)`, which runs a stack of backpropagators.
    unwind: Option<GraphId>,
    /// J of graphs with free variables: valid within one request only (the
    /// free variables map to that request's forward nodes), and only where
    /// they map to the same nodes ([`Scoped`]).
    j_graphs: HashMap<Scoped, GraphId>,
    /// J of graphs without free variables, shared by all requests.
    j_closed: HashMap<GraphId, GraphId>,
    /// Keyed by primitive, arity and whether it is differentiated.
    j_prims: HashMap<(Prim, usize, bool), GraphId>,
    /// Original node → its forward value inside a J graph.
    node_map: HashMap<NodeId, NodeId>,
    /// Forward mode (`forward.rs`): F of graphs with free variables
    /// (within one request), of closed graphs (shared), of primitives.
    f_graphs: HashMap<Scoped, GraphId>,
    f_closed: HashMap<GraphId, GraphId>,
    f_prims: HashMap<(Prim, usize, bool), GraphId>,
    /// Original node → its primal and its tangent inside an F graph.
    f_primal: HashMap<NodeId, NodeId>,
    f_tangent: HashMap<NodeId, NodeId>,
    /// The `zero()` node of each F graph.
    f_zeros: HashMap<GraphId, NodeId>,
    /// `|_, p| p[i]` by `i`, for splitting the results of `tree_map`.
    tree_picks: HashMap<usize, GraphId>,
    /// The keyed free variables (see [`Keyed`]) of the `J'` graphs being
    /// built, innermost last: closures made in a loop mark their uses of
    /// them too, so a use inside such a closure is a use by the loop.
    loop_external: Vec<HashSet<NodeId>>,
    /// The compile-time requests by target: the transforms of a `grad`
    /// target may use symmetry ([`symmetric`]).
    requests: HashMap<GraphId, AdRequest>,
    checks: Vec<Check>,
    /// See [`run`].
    simplify: Option<Simplify<'a>>,
    /// The targets of the requests built so far.
    built: HashSet<GraphId>,
    /// A derivative → the simplified copy differentiated in its place
    /// (itself where none could be made).
    simplified: HashMap<GraphId, GraphId>,
    /// Nodes known to hold no function (the cotangents the symmetric
    /// transforms capture): used as they are from outside, not lifted
    /// (a lift would keep the transforms of the next order from being
    /// simplified).
    plain: HashSet<NodeId>,
}

impl<'a> Ad<'a> {
    fn new(
        m: &'a mut Module,
        rules: &'a Rules,
        effectful: &'a HashSet<GraphId>,
        prov: &'a mut Provenance,
    ) -> Ad<'a> {
        Ad {
            m,
            rules,
            effectful,
            prov,
            fv: FreeVars::default(),
            lift_outside: true,
            lift_source: false,
            f_level: 0,
            lifted: HashMap::new(),
            tail_set: None,
            jk_graphs: HashMap::new(),
            jk_closed: HashMap::new(),
            unwind: None,
            j_graphs: HashMap::new(),
            j_closed: HashMap::new(),
            j_prims: HashMap::new(),
            node_map: HashMap::new(),
            f_graphs: HashMap::new(),
            f_closed: HashMap::new(),
            f_prims: HashMap::new(),
            f_primal: HashMap::new(),
            f_tangent: HashMap::new(),
            f_zeros: HashMap::new(),
            tree_picks: HashMap::new(),
            loop_external: Vec::new(),
            requests: HashMap::new(),
            checks: Vec::new(),
            simplify: None,
            built: HashSet::new(),
            simplified: HashMap::new(),
            plain: HashSet::new(),
        }
    }

    /// The graph to transform in place of `f`: for a built request's
    /// target that the symmetric transforms do not take, its simplified
    /// copy ([`Ad::simplified`]).
    fn substitute(&mut self, f: GraphId) -> GraphId {
        if self.built.contains(&f) && self.grad_target(f).is_none() {
            self.simplified(f)
        } else {
            f
        }
    }

    /// A simplified copy of `f`, a derivative built before (see [`run`]),
    /// or `f` itself: without a simplifier, when what `f` reaches does IO
    /// or differentiates its own values at run time, or when the copy is
    /// not smaller. Free variables of `f` become parameters of the copy;
    /// functions with a custom rule are called, never copied.
    fn simplified(&mut self, f: GraphId) -> GraphId {
        if let Some(c) = self.simplified.get(&f) {
            return *c;
        }
        let c = self.simplified_copy(f).unwrap_or(f);
        self.simplified.insert(f, c);
        c
    }

    fn simplified_copy(&mut self, f: GraphId) -> Option<GraphId> {
        let body_size = |m: &Module, r: GraphId| {
            let fv = free_variables(m);
            reachable_graphs(m, &[r])
                .iter()
                .map(|g| graph_body_with(m, *g, &fv).len())
                .sum::<usize>()
        };
        let simplify = self.simplify?;
        let fv = free_variables(self.m);
        let set: HashSet<GraphId> = reachable_graphs(self.m, &[f]).into_iter().collect();
        // A function with a custom rule stays itself (inlined, it would
        // lose its rule): the copies call it.
        let kept: Vec<GraphId> = set
            .iter()
            .copied()
            .filter(|g| self.rules.user.contains_key(g))
            .collect();
        for &g in &set {
            if self.effectful.contains(&g) {
                return None;
            }
            if self.rules.user.contains_key(&g) && !fv.get(g).is_empty() {
                return None;
            }
            // A transform made at run time (of a function value lifted or
            // differentiated there) reads the provenance of its graph's
            // nodes, which the copies do not have: only values from outside
            // the set may be transformed so.
            let dynamic = graph_body_with(self.m, g, &fv).iter().any(|n| {
                matches!(self.m.applied_prim(*n), Some(Prim::AdDyn | Prim::AdLift)) && {
                    let v = self.m.inputs(*n)[1];
                    match &self.m.node(v).kind {
                        NodeKind::Const(c) => matches!(c, Const::Graph(_)),
                        _ => self.m.node(v).graph.is_none_or(|o| set.contains(&o)),
                    }
                }
            });
            if dynamic {
                return None;
            }
        }
        let mut sub = Module {
            world: self.m.world,
            ..Module::default()
        };
        // The free variables of `f` become parameters of the copy, after
        // its own; `f`'s stand-in passes them (and so captures them as `f`
        // did).
        let mut stubs = rustc_hash::FxHashMap::default();
        let mut originals = rustc_hash::FxHashMap::default();
        for &k in &kept {
            let kg = self.m.graph(k);
            let stub = sub.add_graph_as(kg.name.clone(), kg.loc, kg.role);
            for nm in kg.param_names.clone() {
                sub.add_param(stub, nm, kg.loc);
            }
            stubs.insert(k, stub);
            originals.insert(stub, k);
        }
        let (map, free) = crate::ir::copy::copy_reachable(self.m, &[f], &mut sub, true, &stubs)?;
        let root = map[&f];
        simplify(&mut sub, root);
        let (back, _) = crate::ir::copy::copy_reachable(&sub, &[root], self.m, false, &originals)?;
        let closed = back[&root];
        let c = if free.is_empty() {
            closed
        } else {
            let fg = self.m.graph(f).clone();
            let w = self.m.add_graph_as(fg.name.clone(), fg.loc, fg.role);
            let mut args: Vec<NodeId> = fg
                .params
                .iter()
                .zip(&fg.param_names)
                .map(|(p, nm)| {
                    let ploc = self.m.node(*p).loc;
                    self.m.add_param(w, nm.clone(), ploc)
                })
                .collect();
            args.extend(free);
            let callee = self.gref(closed, fg.loc);
            let mut ins = vec![callee];
            ins.extend(args);
            let out = self.m.add_apply(w, ins, fg.loc);
            self.m.set_output(w, out);
            w
        };
        // Kept only if smaller: inlining can copy a graph used in several
        // places, and what the untyped rounds cannot resolve (zero guards
        // in loops) stays.
        if body_size(self.m, c) >= body_size(self.m, f) {
            return None;
        }
        // The copies' free variables (none outside them), and their loops.
        self.fv = free_variables(self.m);
        self.tail_set = None;
        Some(c)
    }

    /// Node `n` from outside the transformed graphs, as graph `g` of a
    /// transform (mode 1: reverse, 2: forward) uses it: `ad_lift(n)`, or
    /// `n` itself where captures arrive lifted or `n` holds no function
    /// ([`Ad::plain`]).
    fn outside(&mut self, g: GraphId, n: NodeId, mode: u8) -> NodeId {
        if !self.lift_outside || self.plain.contains(&n) {
            return n;
        }
        if let Some(l) = self.lifted.get(&(g, n, mode)) {
            return *l;
        }
        let loc = self.m.node(n).loc;
        let k = self.konst(Const::Int(mode as i64), loc);
        let w = self.konst(Const::Int(0), loc);
        let l = self.prim(g, Prim::AdLift, &[n, k, w], loc);
        self.lifted.insert((g, n, mode), l);
        l
    }

    /// The environment key of free variable `n`, see [`env_key`].
    fn env_key(&mut self, n: NodeId, loc: Loc) -> NodeId {
        let k = env_key(self.prov, n, self.f_level);
        self.konst(Const::Int(k), loc)
    }

    fn konst(&mut self, c: Const, loc: Loc) -> NodeId {
        self.m.add_const(c, loc)
    }
    fn prim(&mut self, g: GraphId, p: Prim, args: &[NodeId], loc: Loc) -> NodeId {
        self.m.add_prim(g, p, args, loc)
    }
    fn get(&mut self, g: GraphId, t: NodeId, i: usize, loc: Loc) -> NodeId {
        let k = self.konst(Const::Int(i as i64), loc);
        self.prim(g, Prim::TupleGet, &[t, k], loc)
    }
    fn gref(&mut self, h: GraphId, loc: Loc) -> NodeId {
        self.konst(Const::Graph(h), loc)
    }
    fn zero(&mut self, g: GraphId, loc: Loc) -> NodeId {
        self.prim(g, Prim::Zero, &[], loc)
    }
    fn call(&mut self, g: GraphId, f: NodeId, args: &[NodeId], loc: Loc) -> NodeId {
        let mut inputs = vec![f];
        inputs.extend_from_slice(args);
        self.m.add_apply(g, inputs, loc)
    }

    fn build(&mut self, req: &AdRequest) -> R<()> {
        self.fv = free_variables(self.m);
        self.tail_set = None;
        self.jk_graphs.clear();
        self.j_graphs.clear();
        self.f_graphs.clear();
        self.f_primal.clear();
        self.f_tangent.clear();
        let src = req.source;
        let loc = req.loc;
        let n = self.m.graph(src).params.len();
        let names = self.m.graph(src).param_names.clone();
        let t = req.target;
        self.m.graph_mut(t).name = format!("{}.{}", kind_name(&req.kind), req.name);
        if let AdKind::Jvp = req.kind {
            return self.build_jvp(t, src, loc);
        }
        let jf = if self.lift_source {
            None
        } else {
            Some(self.j_graph(src, loc)?)
        };
        match &req.kind {
            AdKind::Grad {
                argnums,
                with_value,
            } => {
                let ps: Vec<NodeId> = names
                    .iter()
                    .map(|nm| self.m.add_param(t, nm.clone(), loc))
                    .collect();
                self.fn_arg_checks(&req.kind, &ps, &names, &req.name, loc);
                let (y, bp) = self.forward(t, jf, src, &ps, loc);
                // `ones_like(y)` that says, when `y` is not a float scalar,
                // that `grad` needs one (inference meets it before the
                // checks run, and no check runs on a request built at run
                // time).
                let one = self.prim(t, Prim::GradSeed, &[y], loc);
                let d = self.call(t, bp, &[one], loc);
                let which: Vec<usize> = argnums.which();
                let mut grads = Vec::new();
                for &i in &which {
                    if i >= n {
                        return Err(AdError {
                            loc,
                            message: format!(
                                "argnums asks for argument {i} of {}, which takes {n}",
                                crate::ir::source_phrase(&req.name)
                            ),
                            note: None,
                        });
                    }
                    let di = self.get(t, d, i + 1, loc);
                    grads.push(self.prim(t, Prim::GradFinalize, &[di, ps[i]], loc));
                    self.checks.push(Check::DiffArg {
                        node: ps[i],
                        what: format!(
                            "argument `{}` of {}",
                            names[i],
                            crate::ir::source_phrase(&req.name)
                        ),
                        loc,
                    });
                }
                self.checks.push(Check::ScalarOutput {
                    node: y,
                    what: crate::ir::source_phrase(&req.name),
                    loc,
                });
                let g = if argnums.tupled() {
                    self.prim(t, Prim::MakeTuple, &grads, loc)
                } else {
                    grads[0]
                };
                let out = if *with_value {
                    self.prim(t, Prim::MakeTuple, &[y, g], loc)
                } else {
                    g
                };
                self.m.set_output(t, out);
            }
            AdKind::Vjp => {
                let ps: Vec<NodeId> = names
                    .iter()
                    .map(|nm| self.m.add_param(t, nm.clone(), loc))
                    .collect();
                self.fn_arg_checks(&req.kind, &ps, &names, &req.name, loc);
                let (y, bp) = self.forward(t, jf, src, &ps, loc);
                let pb = self.m.add_graph(format!("pullback.{}", req.name), loc);
                let dy = self.m.add_param(pb, "dy", loc);
                // The cotangent must have the result's structure and
                // shapes (a cotangent that broadcasts would give the
                // derivative of another function, silently).
                let dy = self.prim(pb, Prim::GradFinalize, &[dy, y], loc);
                self.pull_back(pb, bp, dy, &ps, loc);
                let pbr = self.gref(pb, loc);
                let out = self.prim(t, Prim::MakeTuple, &[y, pbr], loc);
                self.m.set_output(t, out);
            }
            AdKind::Jvp => unreachable!("built by build_jvp"),
        }
        Ok(())
    }

    /// Checks that explain a failure to call a function argument of the
    /// transformed function ([`Check::FnArg`]).
    fn fn_arg_checks(
        &mut self,
        kind: &AdKind,
        ps: &[NodeId],
        names: &[String],
        fname: &str,
        loc: Loc,
    ) {
        for (p, nm) in ps.iter().zip(names) {
            self.checks.push(Check::FnArg {
                node: *p,
                what: format!("argument `{nm}` of `{fname}`"),
                transform: kind_name(kind),
                loc,
            });
        }
    }

    /// Finishes graph `g` with `make_tuple(items..)`.
    fn output_tuple(&mut self, g: GraphId, items: &[NodeId], loc: Loc) {
        let o = self.prim(g, Prim::MakeTuple, items, loc);
        self.m.set_output(g, o);
    }

    /// In graph `g`: calls `J(f)` (graph `jf`, or when `None` the run-time
    /// lift of `src`'s closure) on `args`; returns the value and the
    /// backpropagator.
    fn forward(
        &mut self,
        g: GraphId,
        jf: Option<GraphId>,
        src: GraphId,
        args: &[NodeId],
        loc: Loc,
    ) -> (NodeId, NodeId) {
        let jfr = match jf {
            Some(jf) => self.gref(jf, loc),
            None => {
                let f = self.gref(src, loc);
                let one = self.konst(Const::Int(1), loc);
                let w = self.konst(Const::Int(0), loc);
                self.prim(g, Prim::AdLift, &[f, one, w], loc)
            }
        };
        let r = self.call(g, jfr, args, loc);
        let y = self.get(g, r, 0, loc);
        let bp = self.get(g, r, 1, loc);
        (y, bp)
    }

    /// Finishes graph `g` with the input cotangents `bp(dy)` gives for
    /// `inputs`, symbolic zeros made concrete.
    fn pull_back(&mut self, g: GraphId, bp: NodeId, dy: NodeId, inputs: &[NodeId], loc: Loc) {
        let d = self.call(g, bp, &[dy], loc);
        let mut outs = Vec::new();
        for (i, p) in inputs.iter().enumerate() {
            let di = self.get(g, d, i + 1, loc);
            outs.push(self.prim(g, Prim::GradFinalize, &[di, *p], loc));
        }
        self.output_tuple(g, &outs, loc);
    }

    /// [`Ad::jmap`], with uses of the free variables in `keyed.external`
    /// wrapped once per graph in `ad_key(v', key)`.
    fn jmap_keyed(
        &mut self,
        g: GraphId,
        n: NodeId,
        arity: usize,
        at: Loc,
        keyed: &mut Keyed,
    ) -> R<NodeId> {
        if !keyed.external.contains(&n) {
            return self.jmap(g, n, arity, at);
        }
        if let Some(k) = keyed.done.get(&n) {
            return Ok(*k);
        }
        let v = self.jmap(g, n, arity, at)?;
        let key = self.env_key(n, at);
        let k = self.prim(g, Prim::AdKey, &[v, key], at);
        keyed.done.insert(n, k);
        Ok(k)
    }

    /// The forward value standing for `n` inside the J graph being built.
    fn jmap(&mut self, g: GraphId, n: NodeId, arity: usize, at: Loc) -> R<NodeId> {
        match self.m.node(n).kind.clone() {
            NodeKind::Const(Const::Prim(p)) => {
                let g = self.j_prim(p, arity, at)?;
                Ok(self.gref(g, at))
            }
            NodeKind::Const(Const::Graph(h)) => {
                let g = self.j_graph(h, at)?;
                Ok(self.gref(g, at))
            }
            NodeKind::Const(_) => Ok(n),
            _ => match self.node_map.get(&n) {
                Some(v) => Ok(*v),
                None => Ok(self.outside(g, n, 1)),
            },
        }
    }

    /// Whether the transforms of `f` may use symmetry: `f` is a closed
    /// `grad` target (see [`symmetric::GradTarget::of`]).
    fn grad_target(&self, f: GraphId) -> Option<symmetric::GradTarget> {
        let req = self.requests.get(&f)?;
        if !self.fv.get(f).is_empty() {
            return None;
        }
        symmetric::GradTarget::of(self, req)
    }

    /// The key of a transform of `f`, a graph with free variables: `f`
    /// and the nodes its free variables stand for in the transform being
    /// built (`map`). A closure whose enclosing graph is transformed twice
    /// in one request (as `J` and as the stack-threading `J'` of a loop)
    /// gets a transform per enclosing one, each capturing its own nodes.
    fn scoped(&self, f: GraphId, map: &HashMap<NodeId, NodeId>) -> Scoped {
        let fv = self.fv.get(f);
        (f, fv.iter().map(|v| map.get(v).copied()).collect())
    }

    fn j_graph(&mut self, f: GraphId, at: Loc) -> R<GraphId> {
        let f = self.substitute(f);
        let closed = self.fv.get(f).is_empty();
        let key = self.scoped(f, &self.node_map);
        let memo = if closed {
            self.j_closed.get(&f)
        } else {
            self.j_graphs.get(&key)
        };
        if let Some(j) = memo {
            return Ok(*j);
        }
        if self.effectful.contains(&f) {
            return Err(self.io_error(f, at));
        }
        if let Some(rule) = self.rules.user.get(&f).copied() {
            let j = self.j_custom(f, rule)?;
            self.j_closed.insert(f, j);
            return Ok(j);
        }
        if let Some(t) = self.grad_target(f) {
            let name = self.m.graph(f).name.clone();
            let jf =
                self.m
                    .add_graph_as(format!("J.{name}"), self.m.graph(f).loc, GraphRole::Reverse);
            self.prov.graphs.insert(jf, (1, f));
            self.j_closed.insert(f, jf);
            self.j_grad_target(f, jf, &t)?;
            return Ok(jf);
        }
        let name = self.m.graph(f).name.clone();
        let floc = self.m.graph(f).loc;
        let jf = self
            .m
            .add_graph_as(format!("J.{name}"), floc, GraphRole::Reverse);
        self.prov.graphs.insert(jf, (1, f));
        if closed {
            self.j_closed.insert(f, jf);
        } else {
            self.j_graphs.insert(key, jf);
        }
        if self.in_tail_set(f) {
            self.j_wrapper(f, jf, at)?;
        } else {
            self.j_body(f, jf, None)?;
        }
        Ok(jf)
    }

    /// The stack-threading J of graph `f` (a loop or tail recursion):
    /// `J'(f)(params.., stack)`. A tail call `g(args)` of `f` becomes the
    /// tail call `J'(g)(args'.., (B'(f), stack))`, where `B'(f)` maps the
    /// cotangents `(env, d_args..)` of the call to those of `f`'s own
    /// parameters; any other result `y` becomes `(y', (B(f), stack))`. The
    /// forward pass of a loop therefore runs in constant depth, and so
    /// does the backward pass, [`Ad::unwind_graph`] popping the stack.
    fn j_stacked(&mut self, f: GraphId, at: Loc) -> R<GraphId> {
        let closed = self.fv.get(f).is_empty();
        let key = self.scoped(f, &self.node_map);
        let memo = if closed {
            self.jk_closed.get(&f)
        } else {
            self.jk_graphs.get(&key)
        };
        if let Some(j) = memo {
            return Ok(*j);
        }
        if self.effectful.contains(&f) {
            return Err(self.io_error(f, at));
        }
        let name = self.m.graph(f).name.clone();
        let floc = self.m.graph(f).loc;
        let jf = self
            .m
            .add_graph_as(format!("J.{name}"), floc, GraphRole::ReverseStacked);
        if closed {
            self.jk_closed.insert(f, jf);
        } else {
            self.jk_graphs.insert(key, jf);
        }
        self.j_body(f, jf, Some(at))?;
        Ok(jf)
    }

    /// `J(f)` for `f` in the tail set: `J'(f)` on an empty stack, with the
    /// stack's unwinding as the backpropagator.
    fn j_wrapper(&mut self, f: GraphId, jf: GraphId, at: Loc) -> R<()> {
        let floc = self.m.graph(f).loc;
        let name = self.m.graph(f).name.clone();
        let jk = self.j_stacked(f, at)?;
        let params = self.m.graph(f).params.clone();
        let pnames = self.m.graph(f).param_names.clone();
        let mut args = Vec::with_capacity(params.len() + 1);
        for (p, nm) in params.iter().zip(pnames) {
            args.push(self.m.add_param(jf, nm, self.m.node(*p).loc));
        }
        args.push(self.konst(Const::Unit, floc));
        let jkr = self.gref(jk, floc);
        let r = self.call(jf, jkr, &args, floc);
        let y = self.get(jf, r, 0, floc);
        let stack = self.get(jf, r, 1, floc);
        let bf = self
            .m
            .add_graph_as(format!("B.{name}"), floc, GraphRole::Backprop);
        let dout = self.m.add_param(bf, "dout", floc);
        let uw = self.unwind_graph();
        let uwr = self.gref(uw, floc);
        let d = self.call(bf, uwr, &[stack, dout], floc);
        self.m.set_output(bf, d);
        let bfr = self.gref(bf, floc);
        self.output_tuple(jf, &[y, bfr], floc);
        Ok(())
    }

    /// `unwind(stack, d)`: `d` through every backpropagator of `stack`
    /// (`(b, rest)` or `()`), top first, as a loop.
    fn unwind_graph(&mut self) -> GraphId {
        if let Some(g) = self.unwind {
            return g;
        }
        let loc = Loc::NONE;
        let uw = self.m.add_graph_as("unwind", loc, GraphRole::Unwind);
        self.unwind = Some(uw);
        let stack = self.m.add_param(uw, "stack", loc);
        let d = self.m.add_param(uw, "d", loc);
        let done = self
            .m
            .add_graph_as("unwind.done", loc, GraphRole::UnwindDone);
        self.m.set_output(done, d);
        let step = self
            .m
            .add_graph_as("unwind.step", loc, GraphRole::UnwindStep);
        let b = self.get(step, stack, 0, loc);
        let rest = self.get(step, stack, 1, loc);
        let d2 = self.call(step, b, &[d], loc);
        let uwr = self.gref(uw, loc);
        let again = self.call(step, uwr, &[rest, d2], loc);
        self.m.set_output(step, again);
        let len = self.prim(uw, Prim::TupleLen, &[stack], loc);
        let zero = self.konst(Const::Int(0), loc);
        let empty = self.prim(uw, Prim::Eq, &[len, zero], loc);
        let doner = self.gref(done, loc);
        let stepr = self.gref(step, loc);
        let sw = self.prim(uw, Prim::Switch, &[empty, doner, stepr], loc);
        let r = self.call(uw, sw, &[], loc);
        self.m.set_output(uw, r);
        uw
    }

    /// Whether `f` is in the tail set (computed once per request).
    fn in_tail_set(&mut self, f: GraphId) -> bool {
        if self.tail_set.is_none() {
            let set = tail_set(self.m, self.rules, self.effectful);
            self.tail_set = Some(set);
        }
        self.tail_set.as_ref().is_some_and(|s| s.contains(&f))
    }

    /// The body of `J(f)` (`stacked` = None) or of `J'(f)` (`stacked` =
    /// the location asking for it), into the empty graph `jf`.
    fn j_body(&mut self, f: GraphId, jf: GraphId, stacked: Option<Loc>) -> R<()> {
        let floc = self.m.graph(f).loc;
        let params = self.m.graph(f).params.clone();
        let pnames = self.m.graph(f).param_names.clone();
        for (p, nm) in params.iter().zip(pnames) {
            let jp = self.m.add_param(jf, nm, self.m.node(*p).loc);
            self.node_map.insert(*p, jp);
            self.prov.origin.insert(jp, *p);
            self.prov.j_origin.insert(jp);
        }
        if stacked.is_some() {
            self.m.add_param(jf, "stack", floc);
        }
        // In J'(f), uses of the free variables that come from outside the
        // loop are marked with their environment keys (`ad_key`).
        // So are, in a closure made inside such a loop, its uses of them.
        let mut keyed = Keyed::default();
        if stacked.is_some() {
            for &v in self.fv.get(f).to_vec().iter() {
                let owner = self.m.node(v).graph;
                if !owner.is_some_and(|o| self.in_tail_set(o)) {
                    keyed.external.insert(v);
                }
            }
        } else {
            for &v in self.fv.get(f) {
                if self.loop_external.iter().any(|e| e.contains(&v)) {
                    keyed.external.insert(v);
                }
            }
        }
        self.loop_external.push(keyed.external.clone());
        let r = self.j_body_keyed(f, jf, stacked, keyed);
        self.loop_external.pop();
        r
    }

    /// [`Ad::j_body`] once the keyed free variables are known.
    fn j_body_keyed(
        &mut self,
        f: GraphId,
        jf: GraphId,
        stacked: Option<Loc>,
        mut keyed: Keyed,
    ) -> R<()> {
        let name = self.m.graph(f).name.clone();
        let floc = self.m.graph(f).loc;
        let params = self.m.graph(f).params.clone();
        let out = self.m.graph(f).output.expect("lowered graphs have outputs");
        let stack = self
            .m
            .graph(jf)
            .params
            .last()
            .copied()
            .filter(|_| stacked.is_some());
        // In J'(f), the tail call, and the graphs it may call.
        let tail: Option<Vec<GraphId>> = match stacked {
            Some(_) => tail_callees(self.m, f, self.rules, self.effectful),
            None => None,
        };
        let body = graph_body_with(self.m, f, &self.fv);
        let mut bps: HashMap<NodeId, NodeId> = HashMap::new();
        for &y in &body {
            if y == out && tail.is_some() {
                continue;
            }
            let inputs = self.m.inputs(y).to_vec();
            let yloc = self.m.node(y).loc;
            if let Some(Const::Prim(p)) = self.m.as_const(inputs[0]) {
                if p.category() == Category::Io {
                    return Err(io_prim_error(*p, yloc));
                }
            }
            let arity = inputs.len() - 1;
            let mut ins = Vec::with_capacity(inputs.len());
            for &i in &inputs {
                ins.push(self.jmap_keyed(jf, i, arity, yloc, &mut keyed)?);
            }
            // A cast to an int or bool dtype has no derivative: its result
            // carries none, so nothing flows back through it.
            if self.m.as_const(inputs[0]) == Some(&Const::Prim(Prim::Cast))
                && matches!(inputs.get(2).and_then(|d| self.m.as_const(*d)),
                    Some(Const::DType(d)) if !d.is_float())
            {
                let g = self.j_prim_as(Prim::Cast, arity, yloc, false)?;
                ins[0] = self.gref(g, yloc);
            }
            let r = self.m.add_apply(jf, ins, yloc);
            let yv = self.get(jf, r, 0, yloc);
            let bp = self.get(jf, r, 1, yloc);
            self.node_map.insert(y, yv);
            self.prov.origin.insert(yv, y);
            self.prov.j_origin.insert(yv);
            bps.insert(y, bp);
        }
        let out_v = if tail.is_some() {
            None
        } else {
            Some(self.jmap_keyed(jf, out, 0, floc, &mut keyed)?)
        };

        // The backpropagator: from the output's cotangent, or in J'(f)
        // with a tail call, from the call's (env, d_args..).
        let bf = self
            .m
            .add_graph_as(format!("B.{name}"), floc, GraphRole::Backprop);
        let dout = self
            .m
            .add_param(bf, if tail.is_some() { "dcall" } else { "dout" }, floc);
        let mut sens: HashMap<NodeId, NodeId> = HashMap::new();
        if tail.is_none() {
            self.contribute(bf, &mut sens, out, dout, floc);
        }
        for &y in body.iter().rev() {
            let yloc = self.m.node(y).loc;
            let d = if y == out && tail.is_some() {
                dout
            } else {
                let Some(s) = sens.get(&y).copied() else {
                    continue;
                };
                self.call(bf, bps[&y], &[s], yloc)
            };
            let inputs = self.m.inputs(y).to_vec();
            for (i, inp) in inputs.iter().enumerate() {
                if matches!(self.m.node(*inp).kind, NodeKind::Const(Const::Prim(_))) {
                    continue;
                }
                if matches!(self.m.node(*inp).kind, NodeKind::Const(ref c) if !matches!(c, Const::Graph(_)))
                {
                    continue;
                }
                let di = self.get(bf, d, i, yloc);
                self.contribute(bf, &mut sens, *inp, di, yloc);
            }
        }
        let mut env = self.zero(bf, floc);
        for &n in self.fv.get(f).to_vec().iter() {
            if let Some(s) = sens.get(&n).copied() {
                let key = self.env_key(n, floc);
                env = self.prim(bf, Prim::EnvSetitem, &[env, key, s], floc);
            }
        }
        let mut outs = vec![env];
        for p in &params {
            let d = match sens.get(p) {
                Some(s) => *s,
                None => self.zero(bf, floc),
            };
            outs.push(d);
        }
        self.output_tuple(bf, &outs, floc);
        let bfr = self.gref(bf, floc);
        let Some(stack) = stack else {
            let out_v = out_v.expect("J(f) maps its output");
            self.output_tuple(jf, &[out_v, bfr], floc);
            return Ok(());
        };
        let pushed = self.prim(jf, Prim::MakeTuple, &[bfr, stack], floc);
        let pushed = self.prim(jf, Prim::AdHide, &[pushed], floc);
        match tail {
            None => {
                let out_v = out_v.expect("no tail call");
                self.output_tuple(jf, &[out_v, pushed], floc);
            }
            Some(_) => {
                // The tail call, to the stacked J of its callee(s).
                let inputs = self.m.inputs(out).to_vec();
                let at = stacked.unwrap_or(floc);
                let callee = match self.m.as_const(inputs[0]).cloned() {
                    Some(Const::Graph(g)) => {
                        let jg = self.j_stacked(g, at)?;
                        self.gref(jg, floc)
                    }
                    _ => {
                        let sw = self.m.inputs(inputs[0]).to_vec();
                        let (Some(Const::Graph(a)), Some(Const::Graph(b))) = (
                            self.m.as_const(sw[2]).cloned(),
                            self.m.as_const(sw[3]).cloned(),
                        ) else {
                            unreachable!("tail_callees checked the callee")
                        };
                        let c = self.jmap(jf, sw[1], 3, floc)?;
                        let ja = self.j_stacked(a, at)?;
                        let jb = self.j_stacked(b, at)?;
                        let (ra, rb) = (self.gref(ja, floc), self.gref(jb, floc));
                        self.prim(jf, Prim::Switch, &[c, ra, rb], floc)
                    }
                };
                let yloc = self.m.node(out).loc;
                let mut ins = vec![callee];
                for &a in &inputs[1..] {
                    ins.push(self.jmap_keyed(jf, a, inputs.len() - 1, yloc, &mut keyed)?);
                }
                ins.push(pushed);
                let r = self.m.add_apply(jf, ins, yloc);
                self.m.set_output(jf, r);
            }
        }
        Ok(())
    }

    /// Adds cotangent `d` to node `n`; for a graph constant (a closure made
    /// here), `d` is an environment whose entries go to the closure's free
    /// variables.
    fn contribute(
        &mut self,
        bf: GraphId,
        sens: &mut HashMap<NodeId, NodeId>,
        n: NodeId,
        d: NodeId,
        loc: Loc,
    ) {
        match self.m.node(n).kind.clone() {
            NodeKind::Const(Const::Graph(h)) => {
                for &v in self.fv.get(h).to_vec().iter() {
                    let key = self.env_key(v, loc);
                    let e = self.prim(bf, Prim::EnvGetitem, &[d, key], loc);
                    self.contribute(bf, sens, v, e, loc);
                }
            }
            NodeKind::Const(_) => {}
            _ => {
                let v = match sens.get(&n) {
                    Some(s) => self.prim(bf, Prim::GAdd, &[*s, d], loc),
                    None => d,
                };
                sens.insert(n, v);
            }
        }
    }

    fn io_error(&self, f: GraphId, at: Loc) -> AdError {
        // Point at the IO operation itself when there is one in the body.
        let body = graph_body_with(self.m, f, &self.fv);
        let io = body.iter().find(|n| {
            self.m
                .applied_prim(**n)
                .is_some_and(|p| p.category() == Category::Io)
        });
        let loc = io.map(|n| self.m.node(*n).loc).unwrap_or(at);
        AdError {
            loc,
            message: format!(
                "IO inside a transformed function: `{}` prints or reads/writes files",
                self.m.graph(f).name
            ),
            note: Some(
                "`grad`, `jvp`, `vjp` and `vmap` take functions without IO: move the IO out of the function"
                    .into(),
            ),
        }
    }

    /// J of a primitive applied to `arity` arguments.
    fn j_prim(&mut self, p: Prim, arity: usize, at: Loc) -> R<GraphId> {
        self.j_prim_as(p, arity, at, p.info().differentiable)
    }

    /// J of a primitive, differentiated or (where it carries no derivative
    /// at this use, like a cast to an int) with an all-zero backpropagator.
    fn j_prim_as(&mut self, p: Prim, arity: usize, at: Loc, differentiable: bool) -> R<GraphId> {
        let key = (p, arity, differentiable);
        if let Some(g) = self.j_prims.get(&key) {
            return Ok(*g);
        }
        let info = p.info();
        if info.category == Category::Io {
            return Err(io_prim_error(p, at));
        }
        if p == Prim::TreeMap && differentiable {
            return Ok(self.j_tree_map(key, arity));
        }
        let rule = if !differentiable || rule_is_generated(p) {
            None
        } else {
            match self.rules.prims.get(&p) {
                Some(r) => Some(*r),
                None => {
                    return Err(AdError {
                        loc: at,
                        message: format!("`{p}` has no derivative rule"),
                        note: Some("add a `bprop` for it in stdlib/bprop.adj".into()),
                    })
                }
            }
        };
        if let Some(r) = rule {
            let want = arity + 2;
            let have = self.m.graph(r).params.len();
            if have != want {
                return Err(AdError {
                    loc: self.m.graph(r).loc,
                    message: format!(
                        "the rule of `{p}` takes {have} parameters; expected {want} (the inputs, `out` and `dout`)"
                    ),
                    note: None,
                });
            }
        }
        let loc = Loc::NONE;
        let suffix = if differentiable { "" } else { ".nondiff" };
        let jg = self
            .m
            .add_graph_as(format!("J.{}{suffix}", info.name), loc, GraphRole::Reverse);
        self.j_prims.insert(key, jg);
        let xs: Vec<NodeId> = (0..arity)
            .map(|i| self.m.add_param(jg, format!("x{i}"), loc))
            .collect();
        let out = if matches!(p, Prim::AdDyn | Prim::AdLift) {
            // Inside reverse-mode code the result is the J transform of
            // what the plain operation gives: one more level of nesting.
            let mut args = xs.clone();
            let last = args.len() - 1;
            args[last] = nest(self, jg, xs[last], 1);
            self.prim(jg, p, &args, loc)
        } else {
            self.prim(jg, p, &xs, loc)
        };

        let bg = self
            .m
            .add_graph_as(format!("B.{}{suffix}", info.name), loc, GraphRole::Backprop);
        let dout = self.m.add_param(bg, "dout", loc);
        if !differentiable {
            let zs: Vec<NodeId> = (0..=arity).map(|_| self.zero(bg, loc)).collect();
            self.output_tuple(bg, &zs, loc);
        } else {
            let cg = self
                .m
                .add_graph_as(format!("B.{}.rule", info.name), loc, GraphRole::Backprop);
            let mut cots = vec![self.zero(cg, loc)];
            match rule {
                Some(r) => {
                    let rr = self.gref(r, loc);
                    let mut args = xs.clone();
                    args.push(out);
                    args.push(dout);
                    let d = self.call(cg, rr, &args, loc);
                    for i in 0..arity {
                        cots.push(self.get(cg, d, i, loc));
                    }
                }
                None => cots.extend(self.generated_rule(cg, p, &xs, dout)),
            }
            self.output_tuple(cg, &cots, loc);
            self.zero_guarded(bg, dout, cg, arity, info.name, loc);
        }
        let bgr = self.gref(bg, loc);
        self.output_tuple(jg, &[out, bgr], loc);
        Ok(jg)
    }

    /// Finishes backpropagator `bg` with its cotangent `dout`: zero in, zeros
    /// out. A symbolic zero gives the `arity + 1` zeros (the environment's
    /// and each input's) without running `rule`, the graph (of no
    /// parameters) that computes them from a concrete cotangent.
    fn zero_guarded(
        &mut self,
        bg: GraphId,
        dout: NodeId,
        rule: GraphId,
        arity: usize,
        name: &str,
        loc: Loc,
    ) {
        let zg = self
            .m
            .add_graph_as(format!("B.{name}.zero"), loc, GraphRole::Backprop);
        let zs: Vec<NodeId> = (0..=arity).map(|_| self.zero(zg, loc)).collect();
        self.output_tuple(zg, &zs, loc);
        let z = self.prim(bg, Prim::IsZero, &[dout], loc);
        let zr = self.gref(zg, loc);
        let cr = self.gref(rule, loc);
        let sw = self.prim(bg, Prim::Switch, &[z, zr, cr], loc);
        let r = self.call(bg, sw, &[], loc);
        self.m.set_output(bg, r);
    }

    /// `J(tree_map)` applied to `arity` arguments `(jf, t1, .., tk)`. The
    /// function arrives J-transformed (as every function value in a J
    /// graph), so mapping it over the leaves gives a `(y, bp)` pair at each
    /// leaf of `t1` (whose structure decides where the leaves are; the
    /// other trees may be deeper there, see the kernel). Those pairs are
    /// split into the value and a tree of backpropagators. The
    /// backpropagator maps over the backpropagators and the output
    /// cotangent leaf by leaf (a symbolic zero stands for a whole subtree),
    /// giving `(env, d_a1, .., d_ak)` at each leaf: the function's cotangent
    /// is the sum of the environments (`tree_gadd`), each tree's the tree
    /// of its leaves' cotangents. All of it is `tree_map` again, so it is
    /// differentiated by this rule in turn (higher derivatives).
    fn j_tree_map(&mut self, key: (Prim, usize, bool), arity: usize) -> GraphId {
        let loc = Loc::NONE;
        let jg = self.m.add_graph_as("J.tree_map", loc, GraphRole::Reverse);
        self.j_prims.insert(key, jg);
        let xs: Vec<NodeId> = (0..arity)
            .map(|i| self.m.add_param(jg, format!("x{i}"), loc))
            .collect();
        let pairs = self.prim(jg, Prim::TreeMap, &xs, loc);
        let y = self.tree_pick(jg, xs[1], pairs, 0);
        let bps = self.tree_pick(jg, xs[1], pairs, 1);

        let bg = self.m.add_graph_as("B.tree_map", loc, GraphRole::Backprop);
        let dout = self.m.add_param(bg, "dout", loc);
        // Zero in, zeros out.
        let cg = self
            .m
            .add_graph_as("B.tree_map.rule", loc, GraphRole::Backprop);
        let apply = self.m.add_graph("tree_map.apply", loc);
        let bp = self.m.add_param(apply, "bp", loc);
        let d = self.m.add_param(apply, "d", loc);
        let r = self.call(apply, bp, &[d], loc);
        self.m.set_output(apply, r);
        let apply = self.gref(apply, loc);
        let res = self.prim(cg, Prim::TreeMap, &[apply, bps, dout], loc);
        let envs = self.tree_pick(cg, xs[1], res, 0);
        let mut cots = vec![self.zero(cg, loc)];
        cots.push(self.prim(cg, Prim::TreeGAdd, &[envs], loc));
        for i in 1..arity {
            cots.push(self.tree_pick(cg, xs[1], res, i));
        }
        self.output_tuple(cg, &cots, loc);
        self.zero_guarded(bg, dout, cg, arity, "tree_map", loc);
        let bgr = self.gref(bg, loc);
        self.output_tuple(jg, &[y, bgr], loc);
        jg
    }

    /// In graph `g`: `tree_map(|_, p| p[i], like, t)`, element `i` of the
    /// tuples `t` holds at the leaves of tree `like`.
    fn tree_pick(&mut self, g: GraphId, like: NodeId, t: NodeId, i: usize) -> NodeId {
        let loc = Loc::NONE;
        let pick = match self.tree_picks.get(&i) {
            Some(pick) => *pick,
            None => {
                let pick = self.m.add_graph(format!("tree_map.pick{i}"), loc);
                self.m.add_param(pick, "leaf", loc);
                let p = self.m.add_param(pick, "p", loc);
                let o = self.get(pick, p, i, loc);
                self.m.set_output(pick, o);
                self.tree_picks.insert(i, pick);
                pick
            }
        };
        let pr = self.gref(pick, loc);
        self.prim(g, Prim::TreeMap, &[pr, like, t], loc)
    }

    /// Cotangents of the inputs of a variadic primitive.
    fn generated_rule(&mut self, g: GraphId, p: Prim, xs: &[NodeId], dout: NodeId) -> Vec<NodeId> {
        let loc = Loc::NONE;
        let mut cots = Vec::new();
        match p {
            // The cotangent of a transformed closure is that of the
            // closure: an environment keyed by the same free variables.
            Prim::AdLift | Prim::AdDyn | Prim::AdHide | Prim::AdKey => {
                cots.push(dout);
                for _ in 1..xs.len() {
                    cots.push(self.zero(g, loc));
                }
            }
            Prim::MakeTuple => {
                for i in 0..xs.len() {
                    cots.push(self.get(g, dout, i, loc));
                }
            }
            Prim::MakeRecord => {
                for pair in xs.chunks(2) {
                    cots.push(self.zero(g, loc));
                    cots.push(self.prim(g, Prim::RecordGet, &[dout, pair[0]], loc));
                }
            }
            Prim::TensorLiteral => {
                for i in 0..xs.len() {
                    let k = self.konst(Const::Int(i as i64), loc);
                    cots.push(self.prim(g, Prim::Index, &[dout, k], loc));
                }
            }
            Prim::Index => {
                let mut args = vec![xs[0], dout];
                args.extend_from_slice(&xs[1..]);
                cots.push(self.prim(g, Prim::IndexGrad, &args, loc));
                for _ in 1..xs.len() {
                    cots.push(self.zero(g, loc));
                }
            }
            Prim::IndexGrad => {
                cots.push(self.zero(g, loc));
                let mut args = vec![dout];
                args.extend_from_slice(&xs[2..]);
                cots.push(self.prim(g, Prim::Index, &args, loc));
                for _ in 2..xs.len() {
                    cots.push(self.zero(g, loc));
                }
            }
            _ => unreachable!("only variadic primitives have generated rules"),
        }
        cots
    }

    /// J of a function with a user-written `bprop`: the forward runs the
    /// function as is; the backward calls the rule.
    fn j_custom(&mut self, f: GraphId, rule: GraphId) -> R<GraphId> {
        let name = self.m.graph(f).name.clone();
        let loc = self.m.graph(f).loc;
        let n = self.m.graph(f).params.len();
        let have = self.m.graph(rule).params.len();
        if have != n + 2 {
            return Err(AdError {
                loc: self.m.graph(rule).loc,
                message: format!(
                    "the bprop of `{name}` takes {have} parameters; expected {} (the inputs, `out` and `dout`)",
                    n + 2
                ),
                note: None,
            });
        }
        let jg = self
            .m
            .add_graph_as(format!("J.{name}"), loc, GraphRole::Reverse);
        // Provenance, as for any J graph: run-time transforms of a closure
        // of it take the transform off to find `f`.
        self.prov.graphs.insert(jg, (1, f));
        let xs: Vec<NodeId> = (0..n)
            .map(|i| {
                let nm = self.m.graph(f).param_names[i].clone();
                let x = self.m.add_param(jg, nm, loc);
                let orig = self.m.graph(f).params[i];
                self.prov.origin.insert(x, orig);
                self.prov.j_origin.insert(x);
                x
            })
            .collect();
        let fr = self.gref(f, loc);
        let out = self.call(jg, fr, &xs, loc);
        let bg = self
            .m
            .add_graph_as(format!("B.{name}"), loc, GraphRole::Backprop);
        let dout = self.m.add_param(bg, "dout", loc);
        // Guarded as for primitives, so the rule (ordinary code,
        // differentiated again for higher orders) only ever sees a concrete
        // cotangent.
        let cg = self
            .m
            .add_graph_as(format!("B.{name}.rule"), loc, GraphRole::Backprop);
        let rr = self.gref(rule, loc);
        let mut args = xs.clone();
        args.push(out);
        args.push(dout);
        let d = self.call(cg, rr, &args, loc);
        self.checks.push(Check::RuleResult {
            node: d,
            inputs: n,
            name: name.clone(),
            loc: self.m.graph(rule).loc,
        });
        let mut cots = vec![self.zero(cg, loc)];
        for i in 0..n {
            cots.push(self.get(cg, d, i, loc));
        }
        self.output_tuple(cg, &cots, loc);
        self.zero_guarded(bg, dout, cg, n, &name, loc);
        let bgr = self.gref(bg, loc);
        self.output_tuple(jg, &[out, bgr], loc);
        Ok(jg)
    }
}

/// The free variables of a `J'` graph's source that come from outside its
/// loop, and their marked uses made so far.
#[derive(Default)]
struct Keyed {
    external: HashSet<NodeId>,
    done: HashMap<NodeId, NodeId>,
}

/// The error for an IO primitive met while differentiating (both modes).
pub(crate) fn io_prim_error(p: Prim, loc: Loc) -> AdError {
    AdError {
        loc,
        message: format!("`{p}` (IO) inside differentiated code"),
        note: Some("IO is allowed only outside functions that are differentiated".into()),
    }
}

fn kind_name(k: &AdKind) -> &'static str {
    match k {
        AdKind::Grad {
            with_value: true, ..
        } => "value_and_grad",
        AdKind::Grad { .. } => "grad",
        AdKind::Vjp => "vjp",
        AdKind::Jvp => "jvp",
    }
}

/// The graphs `f` ends by calling (its output is a call of a graph
/// constant, or of a `switch` between two), when all of them can take part
/// in stack-threading J: defined here (no custom rule), pure, and taking
/// the call's arguments.
fn tail_callees(
    m: &Module,
    f: GraphId,
    rules: &Rules,
    effectful: &HashSet<GraphId>,
) -> Option<Vec<GraphId>> {
    let out = m.graph(f).output?;
    let NodeKind::Apply(inputs) = &m.node(out).kind else {
        return None;
    };
    let callees = match m.as_const(inputs[0]) {
        Some(Const::Graph(g)) => vec![*g],
        Some(_) => return None,
        None => {
            if m.applied_prim(inputs[0]) != Some(Prim::Switch) {
                return None;
            }
            let sw = m.inputs(inputs[0]);
            match (m.as_const(sw[2]), m.as_const(sw[3])) {
                (Some(Const::Graph(a)), Some(Const::Graph(b))) => vec![*a, *b],
                _ => return None,
            }
        }
    };
    let ok = callees.iter().all(|g| {
        !rules.user.contains_key(g)
            && !effectful.contains(g)
            && m.graph(*g).output.is_some()
            && m.graph(*g).params.len() == inputs.len() - 1
    });
    ok.then_some(callees)
}

/// The graphs on a cycle of tail calls (loops, tail recursion), and those
/// they tail-call: their J threads a stack of backpropagators.
fn tail_set(m: &Module, rules: &Rules, effectful: &HashSet<GraphId>) -> HashSet<GraphId> {
    use petgraph::graph::DiGraph;
    let n = m.graphs.len();
    let mut dg: DiGraph<(), ()> = DiGraph::with_capacity(n, n);
    let idx: Vec<_> = (0..n).map(|_| dg.add_node(())).collect();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (f, out) in edges.iter_mut().enumerate() {
        if let Some(cs) = tail_callees(m, GraphId(f as u32), rules, effectful) {
            for g in cs {
                dg.add_edge(idx[f], idx[g.index()], ());
                out.push(g.index());
            }
        }
    }
    let mut set: HashSet<GraphId> = HashSet::new();
    let mut work: Vec<usize> = Vec::new();
    for scc in petgraph::algo::tarjan_scc(&dg) {
        let cyclic = scc.len() > 1 || dg.contains_edge(scc[0], scc[0]);
        if cyclic {
            work.extend(scc.iter().map(|i| i.index()));
        }
    }
    while let Some(f) = work.pop() {
        if set.insert(GraphId(f as u32)) {
            work.extend(edges[f].iter().copied());
        }
    }
    set
}

/// In graph `g`: the nesting code `wrap` of `ad_dyn` with one more
/// transform (`mode` 1: reverse, 2: forward) around it, `wrap * 3 + mode`.
fn nest(ad: &mut Ad<'_>, g: GraphId, wrap: NodeId, mode: i64) -> NodeId {
    let loc = Loc::NONE;
    let three = ad.konst(Const::Int(3), loc);
    let m = ad.konst(Const::Int(mode), loc);
    let w = ad.prim(g, Prim::Mul, &[wrap, three], loc);
    ad.prim(g, Prim::Add, &[w, m], loc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{Lowered, Lowerer, SourceLoader};
    use adjoint_lang::SourceMap;
    use std::path::Path;

    struct NoFiles;
    impl SourceLoader for NoFiles {
        fn load(&self, _: &Path) -> std::io::Result<String> {
            Err(std::io::ErrorKind::NotFound.into())
        }
    }

    fn lower(src: &str) -> Lowered {
        let mut sources = SourceMap::new();
        let root = sources.add_file("t.adj", src);
        match Lowerer::lower_program(&mut sources, root, None, &NoFiles) {
            Ok(l) => l,
            Err(d) => panic!("{d:?}"),
        }
    }

    /// The key of a captured value is the same whether a compile-time
    /// transform's node or a run-time placeholder holds it, whatever `J`
    /// levels carry it, and after a run-time lift adds an innermost level.
    #[test]
    fn env_keys_name_the_value_and_its_tangent_path() {
        let mut prov = Provenance::default();
        let x = NodeId(1);
        // `F(F(e))` at compile time: the inner level's nodes, then the outer's.
        let (x1, dx1) = (NodeId(10), NodeId(11));
        prov.origin.insert(x1, x);
        prov.tangent_origin.insert(dx1, x);
        let (x2, d_out, dx2, dd) = (NodeId(20), NodeId(21), NodeId(22), NodeId(23));
        prov.origin.insert(x2, x1);
        prov.tangent_origin.insert(d_out, x1);
        prov.origin.insert(dx2, dx1);
        prov.tangent_origin.insert(dd, dx1);
        // `J` over it.
        let j = NodeId(40);
        prov.origin.insert(j, dx2);
        prov.j_origin.insert(j);
        // The placeholders of `F(F(g))` built at run time.
        let ph = |prov: &mut Provenance, id: u32, path: &[bool]| {
            let p = NodeId(id);
            prov.placeholder_of.insert(p, (x, path.to_vec()));
            prov.placeholder.insert((x, path.to_vec()), p);
            p
        };
        let p1 = ph(&mut prov, 30, &[true]);
        let p01 = ph(&mut prov, 31, &[false, true]);
        let p11 = ph(&mut prov, 32, &[true, true]);
        let k = |n: NodeId, f_level: usize| env_key(&prov, n, f_level);
        assert_eq!(k(x2, 0), k(x, 2));
        assert_eq!(k(x2, 0), 1);
        assert_eq!(k(dx2, 0), k(p1, 2));
        assert_eq!(k(d_out, 0), k(p01, 2));
        assert_eq!(k(dd, 0), k(p11, 2));
        assert_eq!(k(j, 0), k(dx2, 0));
        let all = [k(x2, 0), k(dx2, 0), k(d_out, 0), k(dd, 0)];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Lifting `F(g)` (tangent `[true]`) into `F(F(g))` makes it the
        // outer level's tangent `[false, true]`; the new inner one differs.
        assert_eq!(k(p1, 1), k(p01, 2));
        assert_ne!(k(p1, 1), k(p1, 2));
    }

    /// The start-up checks report a rule removed from the tables (lowering
    /// itself passed them with the full tables).
    #[test]
    fn the_start_up_checks_find_a_missing_rule() {
        let l = lower("fn main() { print(grad(|x| x * x)(1.0)); }");
        assert_eq!(missing_rules(&l.ad_rules), Vec::<Prim>::new());
        assert_eq!(missing_tangent_rules(&l.ad_rules), Vec::<Prim>::new());
        let mut rules = l.ad_rules.clone();
        rules.prims.remove(&Prim::Trigamma);
        rules.tangents.remove(&Prim::Polygamma);
        assert_eq!(missing_rules(&rules), vec![Prim::Trigamma]);
        assert_eq!(missing_tangent_rules(&rules), vec![Prim::Polygamma]);
    }

    /// Differentiating through a primitive without a rule, in either mode,
    /// is an error at the user's expression.
    #[test]
    fn a_missing_rule_is_an_error_at_the_use() {
        for (src, tangent) in [
            (
                "fn main() { print(grad(|x| trigamma(x) * 2.0)(1.5)); }",
                false,
            ),
            (
                "fn main() { print(jvp(|x| trigamma(x) * 2.0, (1.5,), (1.0,))); }",
                true,
            ),
        ] {
            let mut l = lower(src);
            let mut rules = l.ad_rules.clone();
            if tangent {
                rules.tangents.remove(&Prim::Trigamma);
            } else {
                rules.prims.remove(&Prim::Trigamma);
            }
            let e = run(
                &mut l.module,
                &l.ad_requests,
                &rules,
                &l.effectful,
                &mut Provenance::default(),
                None,
            )
            .unwrap_err();
            assert_eq!(e.message, "`trigamma` has no derivative rule");
            assert_eq!(&src[e.loc.lo as usize..e.loc.hi as usize], "trigamma(x)");
            let note = e.note.unwrap_or_default();
            let want = if tangent {
                "stdlib/jvp.adj"
            } else {
                "stdlib/bprop.adj"
            };
            assert!(note.contains(want), "{note}");
        }
    }
}
