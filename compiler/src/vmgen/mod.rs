//! Turns graph IR into the runtime's executable form ([`Program`]).
//!
//! Each reachable graph becomes one code object. Its slots are its
//! parameters, then its free variables (the closure's captures), then one
//! slot per application in dependency order. A graph constant whose graph
//! has free variables becomes a `MakeClosure` instruction; an application in
//! output position that calls a function becomes a tail call, so loops run
//! in constant stack.
//!
//! # Lambda lifting
//!
//! In graph mode a graph with free variables that is only ever called
//! (directly, or as a branch of a `switch` whose result is only called)
//! takes its free variables as extra parameters instead of captures: its
//! call sites pass them, and its function value is a constant made once,
//! so a loop no longer allocates a closure per iteration for its body, its
//! exit and their `switch`. The branches of one `switch` take the same
//! extra parameters (the union of their free variables). The slot layout
//! is the one a closure would have (parameters, then free variables), so
//! nested closures made in a lifted graph capture from the same slots.

mod moves;

use adjoint_runtime::batch::BatchRule;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use adjoint_runtime::kernels;
use adjoint_runtime::tensor::Tensor;
use adjoint_runtime::value::{Closure, CodeId, Value};
use adjoint_runtime::vm::{Code, Instr, LocIndex, Operand, Program};

use crate::fuse::order::Unit;
use crate::fuse::{loop_test, steps_by_one, threads_stack};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs, FreeVars};
use crate::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use crate::options::CompilerOptions;
use crate::prim::Prim;

/// A program and the tables that relate it back to the IR.
pub struct Executable {
    pub program: Program,
    pub code_of: HashMap<GraphId, CodeId>,
    /// Source location of every `LocIndex` used by instructions.
    pub locs: Vec<Loc>,
    /// Differentiation of function values at run time, when the program
    /// needs it (the same hook as `program.dynamic`).
    pub dynamic: Option<Arc<dyn RuntimeLocs>>,
}

/// The source locations of code compiled while the program runs (by
/// `ad::dynamic::DynAd`, which this module does not know).
pub trait RuntimeLocs: Send + Sync {
    /// The source location of location index `i`.
    fn loc(&self, i: LocIndex) -> Loc;
}

impl Executable {
    pub fn loc(&self, i: LocIndex) -> Loc {
        match self.locs.get(i as usize) {
            Some(l) => *l,
            None => match &self.dynamic {
                Some(d) => d.loc(i),
                None => Loc::NONE,
            },
        }
    }
    /// The function value of a graph without free variables.
    pub fn function(&self, g: GraphId) -> Option<Value> {
        self.code_of.get(&g).map(|c| {
            Value::Func(Arc::new(Closure {
                code: *c,
                captures: Vec::new(),
            }))
        })
    }
}

/// An internal inconsistency found while compiling (never user input: the
/// verifier and inference run before).
#[derive(Debug, Clone)]
pub struct ExecError {
    pub message: String,
    pub loc: Loc,
}

/// The run-time value of a non-graph, non-primitive constant.
pub fn const_value(c: &Const) -> Option<Value> {
    Some(match c {
        Const::Int(i) => Value::Tensor(Tensor::weak_i64(*i)),
        Const::Float(f) => Value::Tensor(Tensor::weak_f64(*f)),
        Const::Bool(b) => Value::Tensor(Tensor::scalar_bool(*b)),
        Const::Str(s) => Value::Str(s.clone()),
        Const::Unit => Value::unit(),
        Const::DType(d) => Value::DType(*d),
        Const::Tensor(t) => Value::Tensor(t.clone()),
        Const::Prim(_) | Const::Graph(_) => return None,
    })
}

/// Compiles for eager mode: every graph with free variables is a closure.
pub fn compile(
    m: &Module,
    roots: &[GraphId],
    opts: &CompilerOptions,
) -> Result<Executable, ExecError> {
    compile_graphs(m, roots, None, false, opts)
}

/// Compiles for graph mode, with the groups of a fusion plan run as native
/// kernels and graphs that are only called lambda-lifted (unless the
/// program differentiates function values at run time).
pub fn compile_with(
    m: &Module,
    roots: &[GraphId],
    plan: Option<&crate::fuse::Plan>,
    opts: &CompilerOptions,
) -> Result<Executable, ExecError> {
    compile_graphs(m, roots, plan, true, opts)
}

/// Whether code reachable from `roots` differentiates function values at
/// run time.
pub(crate) fn uses_dynamic_ad(m: &Module, roots: &[GraphId]) -> bool {
    !dynamic_ad_ops(m, &reachable_graphs(m, roots)).is_empty()
}

/// The run-time transforms (`ad_lift`, `ad_dyn`) in `graphs`, with
/// whether each is nested inside differentiated code (its nesting code is
/// not the constant 0).
pub(crate) fn dynamic_ad_ops(m: &Module, graphs: &[GraphId]) -> Vec<bool> {
    let graphs: HashSet<GraphId> = graphs.iter().copied().collect();
    (0..m.nodes.len())
        .map(|i| NodeId(i as u32))
        .filter(|n| m.node(*n).graph.is_some_and(|g| graphs.contains(&g)))
        .filter_map(|n| {
            let wrap = match m.applied_prim(n)? {
                Prim::AdDyn => m.inputs(n).get(4),
                Prim::AdLift => m.inputs(n).get(3),
                _ => return None,
            };
            Some(wrap.and_then(|w| m.as_const(*w)) != Some(&Const::Int(0)))
        })
        .collect()
}

/// Whether `graphs` map functions over lanes (`vmap`).
pub(crate) fn uses_vmap(m: &Module, graphs: &[GraphId]) -> bool {
    let graphs: HashSet<GraphId> = graphs.iter().copied().collect();
    (0..m.nodes.len())
        .map(|i| NodeId(i as u32))
        .filter(|n| m.node(*n).graph.is_some_and(|g| graphs.contains(&g)))
        .any(|n| m.applied_prim(n) == Some(Prim::VmapLevel))
}

fn compile_graphs(
    m: &Module,
    roots: &[GraphId],
    plan: Option<&crate::fuse::Plan>,
    lift: bool,
    opts: &CompilerOptions,
) -> Result<Executable, ExecError> {
    let graphs = reachable_graphs(m, roots);
    let fv = free_variables(m);
    let bodies: Vec<Vec<NodeId>> = graphs.iter().map(|g| graph_body_with(m, *g, &fv)).collect();
    // The hook that differentiates function values reads closures'
    // captures: no lifting for programs that use it.
    // Nor for programs that use `vmap`: a branch taken by some lanes only
    // is called with its captures cut down to those lanes, so branches
    // must stay closures of no arguments, and stacks plain values.
    let lift = lift && !uses_vmap(m, &graphs);
    let lifted = if lift && dynamic_ad_ops(m, &graphs).is_empty() {
        lifted_graphs(m, &graphs, &bodies, roots, &fv, plan)
    } else {
        Lifted::default()
    };
    // Tapes where the closures' captures are not read at run time (by the
    // hook that differentiates function values), in graph mode unless
    // switched off (to measure what they save).
    let tapes = (lift && dynamic_ad_ops(m, &graphs).is_empty() && opts.tapes)
        .then(|| Tapes::find(m, &fv, &bodies, &lifted, plan));
    let code_of: HashMap<GraphId, CodeId> = graphs
        .iter()
        .enumerate()
        .map(|(i, g)| (*g, CodeId(i as u32)))
        .collect();
    let mut ex = Executable {
        program: Program::default(),
        code_of,
        locs: Vec::new(),
        dynamic: None,
    };
    for (&g, body) in graphs.iter().zip(&bodies) {
        let mut t = Tables {
            code_of: &ex.code_of,
            locs: &mut ex.locs,
            loc_base: 0,
            lifted: &lifted,
            tapes: tapes.as_ref(),
            release_early: opts.release_early,
        };
        let code = compile_graph(m, g, body, &fv, &mut t, plan)?;
        if tracing::enabled!(target: "adjoint::vm", tracing::Level::DEBUG) {
            let mut text = format!(
                "code {} `{}` ({} params, {} captures):",
                ex.program.codes.len(),
                code.name,
                code.n_params,
                code.n_captures
            );
            for i in &code.instrs {
                text.push_str(&format!("\n    {i:?}"));
            }
            text.push_str(&format!("\n    return {:?}", code.ret));
            tracing::debug!(target: "adjoint::vm", "{text}");
        }
        ex.program.codes.push(code);
    }
    Ok(ex)
}

/// Compiles the graphs reachable from `roots` that `code_of` does not
/// have yet, numbering them from `next` (code made at run time, after a
/// program's own). Their locations are appended to `locs`, whose first
/// entry has index `loc_base`.
pub fn compile_more(
    m: &Module,
    roots: &[GraphId],
    fv: &FreeVars,
    code_of: &mut HashMap<GraphId, CodeId>,
    next: u32,
    locs: &mut Vec<Loc>,
    loc_base: u32,
    release_early: bool,
) -> Result<Vec<Code>, ExecError> {
    let graphs: Vec<GraphId> = reachable_graphs(m, roots)
        .into_iter()
        .filter(|g| !code_of.contains_key(g))
        .collect();
    for (i, g) in graphs.iter().enumerate() {
        code_of.insert(*g, CodeId(next + i as u32));
    }
    let mut out = Vec::with_capacity(graphs.len());
    let lifted = Lifted::default();
    for g in graphs {
        let mut t = Tables {
            code_of,
            locs,
            loc_base,
            lifted: &lifted,
            tapes: None,
            release_early,
        };
        let body = graph_body_with(m, g, fv);
        out.push(compile_graph(m, g, &body, fv, &mut t, None)?);
    }
    Ok(out)
}

/// What compiling one graph reads (the code ids of the others) and adds
/// to (the location table).
struct Tables<'t> {
    code_of: &'t HashMap<GraphId, CodeId>,
    locs: &'t mut Vec<Loc>,
    loc_base: u32,
    lifted: &'t Lifted,
    /// Reverse mode's stacks as tapes ([`Tapes`]); `None` leaves them lists
    /// of closures.
    tapes: Option<&'t Tapes>,
    /// Whether values are released after their last use (else when their
    /// function returns).
    release_early: bool,
}

/// The pushes onto reverse mode's stacks of backpropagators, and the calls
/// of a stack's top, that compile to tape instructions
/// ([`adjoint_runtime::tape`]): a reversed loop then saves each step's
/// values in one buffer instead of making a closure and a list cell, and
/// the backward loop calls each record straight from that buffer.
#[derive(Default)]
struct Tapes {
    /// `ad_hide(t)` with `t = make_tuple(@B, stack)` used only there: the
    /// backpropagator's graph and the stack.
    pushes: HashMap<NodeId, (GraphId, NodeId)>,
    /// `call(b, args..)` with `b = tuple_get(stack, 0)` used only there:
    /// the stack.
    first_calls: HashMap<NodeId, NodeId>,
    /// The `make_tuple` and `tuple_get` nodes those replace.
    skipped: HashSet<NodeId>,
    /// Calls that start a counting loop on an empty stack: the tape they
    /// start with has room for the loop's trips.
    starts: HashMap<NodeId, Start>,
}

/// A call `J'(args.., ())` of a loop's entry that counts its parameter
/// `param` up by one to `bound`: `tape_new` sizes the tape it starts.
struct Start {
    param: usize,
    bound: NodeId,
    records_per_trip: usize,
    values_per_trip: usize,
}

impl Tapes {
    /// The [`Start`] of a call of `g` with these arguments, if `g` is a
    /// counting loop's entry whose pushes are all in `pushes`.
    fn start(
        m: &Module,
        fv: &FreeVars,
        pushes: &HashMap<NodeId, (GraphId, NodeId)>,
        g: GraphId,
    ) -> Option<Start> {
        let (param, p, bound) = loop_test(m, g)?;
        // The graphs one trip may run: those the entry's graphs name, that
        // thread the stack too, or are nested in them; and their bodies.
        let mut family = vec![g];
        let mut bodies: Vec<Vec<NodeId>> = Vec::new();
        let mut seen: HashSet<GraphId> = [g].into_iter().collect();
        while bodies.len() < family.len() {
            let body = graph_body_with(m, family[bodies.len()], fv);
            for &n in &body {
                for &x in m.inputs(n) {
                    if let Some(h) = m.as_graph(x) {
                        let nested = fv.get(h).iter().any(|v| m.node(*v).graph == Some(g));
                        if (threads_stack(m, h) || nested) && seen.insert(h) {
                            family.push(h);
                        }
                    }
                }
            }
            bodies.push(body);
        }
        // The counter: `p`, and the parameters of the graphs the family
        // calls that receive it (a `while` loop's body takes the loop's
        // variables as arguments).
        let mut counter: HashSet<NodeId> = [p].into_iter().collect();
        loop {
            let before = counter.len();
            for &n in bodies.iter().flatten() {
                let ins = m.inputs(n);
                let callees = match m.graph_switch(ins[0]) {
                    Some((_, a, b)) => vec![a, b],
                    None => m.as_graph(ins[0]).into_iter().collect(),
                };
                for (j, x) in ins[1..].iter().enumerate() {
                    if counter.contains(x) {
                        for h in &callees {
                            if let Some(q) = m.graph(*h).params.get(j) {
                                counter.insert(*q);
                            }
                        }
                    }
                }
            }
            if counter.len() == before {
                break;
            }
        }
        // Each call of the entry steps the counter by one.
        let steps = |x: NodeId| steps_by_one(m, x, |c| counter.contains(&c));
        let mut calls = 0;
        for body in &bodies {
            for &n in body {
                let ins = m.inputs(n);
                if m.as_graph(ins[0]) == Some(g) {
                    if !steps(*ins.get(1 + param)?) {
                        return None;
                    }
                    calls += 1;
                }
            }
        }
        // A trip runs graphs from which the entry is named again: count
        // their pushes (the exit's record is the one more `tape_new` adds).
        let names = |body: &[NodeId]| -> Vec<GraphId> {
            body.iter()
                .flat_map(|n| m.inputs(*n).iter().filter_map(|x| m.as_graph(*x)))
                .collect()
        };
        let named: Vec<Vec<GraphId>> = bodies.iter().map(|b| names(b)).collect();
        let mut cycle: HashSet<GraphId> = [g].into_iter().collect();
        loop {
            let before = cycle.len();
            for (h, hs) in family.iter().zip(&named) {
                if hs.iter().any(|x| cycle.contains(x)) {
                    cycle.insert(*h);
                }
            }
            if cycle.len() == before {
                break;
            }
        }
        let (mut records, mut values) = (0, 0);
        for (h, body) in family.iter().zip(&bodies) {
            if !cycle.contains(h) {
                continue;
            }
            for n in body {
                if let Some((b, _)) = pushes.get(n) {
                    records += 1;
                    values += fv.get(*b).len();
                }
            }
        }
        (calls > 0).then_some(Start {
            param,
            bound,
            records_per_trip: records,
            values_per_trip: values,
        })
    }

    fn find(
        m: &Module,
        fv: &FreeVars,
        bodies: &[Vec<NodeId>],
        lifted: &Lifted,
        plan: Option<&crate::fuse::Plan>,
    ) -> Tapes {
        // How often each node is read: as an input, an output, or by a
        // fused group or its continuation.
        let mut reads: HashMap<NodeId, usize> = HashMap::new();
        let mut graphs_seen = HashSet::new();
        for body in bodies {
            for &n in body {
                for &i in m.inputs(n) {
                    *reads.entry(i).or_default() += 1;
                }
                if let Some(g) = m.node(n).graph {
                    graphs_seen.insert(g);
                }
            }
        }
        for g in graphs_seen {
            if let Some(out) = m.graph(g).output {
                *reads.entry(out).or_default() += 1;
            }
        }
        for group in plan.map(|p| p.groups.as_slice()).unwrap_or_default() {
            for &x in &group.inputs {
                *reads.entry(x).or_default() += 1;
            }
            if let Some(then) = &group.then {
                *reads.entry(then.callee).or_default() += 1;
                for a in &then.args {
                    if let crate::fuse::ContArg::Node(x) = a {
                        *reads.entry(*x).or_default() += 1;
                    }
                }
            }
        }
        let in_group = |n: NodeId| plan.is_some_and(|p| p.member_of.contains_key(&n));
        let once = |n: NodeId| reads.get(&n) == Some(&1) && !in_group(n);
        let mut t = Tapes::default();
        for body in bodies {
            for &n in body {
                if in_group(n) {
                    continue;
                }
                let ins = m.inputs(n);
                match m.applied_prim(n) {
                    Some(Prim::AdHide) if ins.len() == 2 => {
                        let tup = ins[1];
                        let ti = m.inputs(tup);
                        if m.applied_prim(tup) != Some(Prim::MakeTuple)
                            || ti.len() != 3
                            || !once(tup)
                        {
                            continue;
                        }
                        let Some(b) = m.as_graph(ti[1]) else { continue };
                        if lifted.extra.contains_key(&b) {
                            continue;
                        }
                        t.pushes.insert(n, (b, ti[2]));
                        t.skipped.insert(tup);
                    }
                    // In reverse mode's `unwind` only (its stack's top is
                    // the backpropagator to run).
                    None if !ins.is_empty()
                        && m.node(n).graph.is_some_and(|g| {
                            let graph = m.graph(g);
                            graph.role.is_unwind() && graph.output != Some(n)
                        }) =>
                    {
                        let b = ins[0];
                        let bi = m.inputs(b);
                        let first = m.applied_prim(b) == Some(Prim::TupleGet)
                            && bi.len() == 3
                            && matches!(m.as_const(bi[2]), Some(Const::Int(0)));
                        if first && once(b) && m.node(b).graph == m.node(n).graph {
                            t.first_calls.insert(n, bi[1]);
                            t.skipped.insert(b);
                        }
                    }
                    _ => {}
                }
            }
        }
        for body in bodies {
            for &n in body {
                let ins = m.inputs(n);
                let Some(g) = ins.first().and_then(|c| m.as_graph(*c)) else {
                    continue;
                };
                let empty = ins.last().and_then(|x| m.as_const(*x)) == Some(&Const::Unit);
                if ins.len() > 1 && empty && threads_stack(m, g) && !in_group(n) {
                    if let Some(start) = Tapes::start(m, fv, &t.pushes, g) {
                        t.starts.insert(n, start);
                    }
                }
            }
        }
        t
    }
}

/// The lambda-lifted graphs and the values each takes after its own
/// parameters.
#[derive(Default)]
struct Lifted {
    extra: HashMap<GraphId, Vec<NodeId>>,
    /// Graphs without free variables that a `switch` pairs with lifted
    /// graphs: they drop the extra arguments.
    lenient: HashSet<GraphId>,
}

impl Lifted {
    /// The extra arguments of a call whose callee is node `callee`: a
    /// lifted graph's constant or a `switch` between lifted graphs.
    fn of_callee(&self, m: &Module, callee: NodeId) -> Option<&[NodeId]> {
        if self.extra.is_empty() {
            return None;
        }
        let named = match m.graph_switch(callee) {
            Some((_, a, b)) => vec![a, b],
            None => m.as_graph(callee).into_iter().collect(),
        };
        named
            .iter()
            .find_map(|h| self.extra.get(h))
            .map(Vec::as_slice)
    }
}

/// Finds the graphs to lift: those with free variables whose every use is
/// the callee of a call, or a branch of a `switch` (among graphs only)
/// that is only the callee of calls in its own graph. The branches of a
/// `switch` that have free variables are lifted together or not at all;
/// those without (such as the zero branches of backpropagators, shared by
/// many switches) take no part, and drop the extra arguments.
fn lifted_graphs(
    m: &Module,
    graphs: &[GraphId],
    bodies: &[Vec<NodeId>],
    roots: &[GraphId],
    fv: &FreeVars,
    plan: Option<&crate::fuse::Plan>,
) -> Lifted {
    let index: HashMap<GraphId, usize> = graphs.iter().enumerate().map(|(i, g)| (*g, i)).collect();
    // Union-find over the branches of each switch.
    let mut parent: Vec<usize> = (0..graphs.len()).collect();
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut bad: HashSet<GraphId> = roots.iter().copied().collect();
    // A value use of `n`: a graph or the graphs of a switch escape. (The
    // graphs of a switch between anything else escape as its inputs.)
    let escape = |n: NodeId, bad: &mut HashSet<GraphId>| {
        if let Some(h) = m.as_graph(n) {
            bad.insert(h);
        } else if let Some((_, a, b)) = m.graph_switch(n) {
            bad.extend([a, b]);
        }
    };
    // Each call of a graph or of a switch of graphs: the caller and the
    // graphs named there.
    let mut sites: Vec<(GraphId, Vec<GraphId>)> = Vec::new();
    let mut lenient = HashSet::new();
    for (&g, body) in graphs.iter().zip(bodies) {
        for &n in body {
            let inputs = m.inputs(n);
            if let Some((c, a, b)) = m.graph_switch(n) {
                // The branches with free variables are joined; those
                // without take any extra arguments.
                match (fv.get(a).is_empty(), fv.get(b).is_empty()) {
                    (false, false) => {
                        if let (Some(&a), Some(&b)) = (index.get(&a), index.get(&b)) {
                            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                            parent[ra] = rb;
                        }
                    }
                    (true, false) => _ = lenient.insert(a),
                    (false, true) => _ = lenient.insert(b),
                    (true, true) => {}
                }
                escape(c, &mut bad);
                continue;
            }
            for (i, &x) in inputs.iter().enumerate() {
                if i == 0 {
                    // A callee: fine in the graph that made it; a switch
                    // made elsewhere does not have the branches' free
                    // variables at hand here.
                    if let Some(h) = m.as_graph(x) {
                        sites.push((g, vec![h]));
                    } else if let Some((_, a, b)) = m.graph_switch(x) {
                        if m.node(x).graph == Some(g) {
                            sites.push((g, vec![a, b]));
                        } else {
                            escape(x, &mut bad);
                        }
                    }
                } else {
                    escape(x, &mut bad);
                }
            }
        }
        if let Some(out) = m.graph(g).output {
            escape(out, &mut bad);
        }
    }
    for group in plan.map(|p| p.groups.as_slice()).unwrap_or_default() {
        for &x in &group.inputs {
            escape(x, &mut bad);
        }
        if let Some(then) = &group.then {
            // The continuation is called where the kernel runs.
            match m.as_graph(then.callee) {
                Some(h) => sites.push((group.graph, vec![h])),
                None => escape(then.callee, &mut bad),
            }
            for a in &then.args {
                if let crate::fuse::ContArg::Node(x) = a {
                    escape(*x, &mut bad);
                }
            }
        }
    }
    // Gather the classes; a class is lifted when none of its members
    // escapes, its free variables are not owned by a member, and it has
    // some.
    let mut classes: HashMap<usize, Vec<GraphId>> = HashMap::new();
    for (i, &g) in graphs.iter().enumerate() {
        let r = find(&mut parent, i);
        classes.entry(r).or_default().push(g);
    }
    let mut extra: HashMap<GraphId, Vec<NodeId>> = HashMap::new();
    for members in classes.into_values() {
        if members.iter().any(|g| bad.contains(g)) {
            continue;
        }
        let mut list: Vec<NodeId> = Vec::new();
        let mut seen = HashSet::new();
        for &g in &members {
            for &v in fv.get(g) {
                if seen.insert(v) {
                    list.push(v);
                }
            }
        }
        let owned_inside = list
            .iter()
            .any(|v| m.node(*v).graph.is_some_and(|o| members.contains(&o)));
        if list.is_empty() || owned_inside {
            continue;
        }
        for g in members {
            extra.insert(g, list.clone());
        }
    }
    // A call site passes what the callee's class takes: the caller must
    // have each of those values, as a free variable of its own or of a
    // graph it names there (which orders its computation before the
    // call). Whether it does depends on free variables only, so one pass
    // decides.
    let mut dropped = HashSet::new();
    for (caller, named) in &sites {
        let Some((h, list)) = named.iter().find_map(|h| extra.get(h).map(|l| (*h, l))) else {
            continue;
        };
        let at_hand = |v: &NodeId| {
            fv.get(*caller).contains(v) || named.iter().any(|h| fv.get(*h).contains(v))
        };
        if !list.iter().all(at_hand) {
            dropped.insert(find(&mut parent, index[&h]));
        }
    }
    extra.retain(|g, _| !dropped.contains(&find(&mut parent, index[g])));
    Lifted { extra, lenient }
}

impl Tables<'_> {
    fn push_loc(&mut self, l: Loc) -> LocIndex {
        self.locs.push(l);
        self.loc_base + self.locs.len() as LocIndex - 1
    }
}

struct CodeBuilder<'a> {
    m: &'a Module,
    g: GraphId,
    fv: &'a FreeVars,
    slot_of: HashMap<NodeId, u32>,
    n_slots: u32,
    consts: Vec<Value>,
    instrs: Vec<Instr>,
}

impl CodeBuilder<'_> {
    /// Emits `tuple_get(slot, k)` into a new slot, which it returns.
    fn tuple_get(&mut self, slot: u32, k: usize, loc: LocIndex) -> u32 {
        let get = kernels::lookup("tuple_get").expect("tuple_get kernel");
        let idx = self.constant(Value::Tensor(Tensor::weak_i64(k as i64)));
        let d = self.n_slots;
        self.n_slots += 1;
        self.instrs.push(Instr::Prim {
            dst: d,
            name: "tuple_get",
            kernel: get,
            inplace: None,
            args: vec![Operand::Slot(slot), idx],
            loc,
            batch: BatchRule::Opaque,
        });
        d
    }

    /// Appends to a call's `args` the free variables a lifted callee
    /// takes after its parameters.
    fn lifted_args(
        &mut self,
        callee: NodeId,
        args: &mut Vec<Operand>,
        ex: &Tables,
    ) -> Result<(), ExecError> {
        if let Some(extra) = ex.lifted.of_callee(self.m, callee) {
            for &v in extra {
                args.push(self.operand(v, ex)?);
            }
        }
        Ok(())
    }

    fn constant(&mut self, v: Value) -> Operand {
        self.consts.push(v);
        Operand::Const(self.consts.len() as u32 - 1)
    }

    fn operand(&mut self, n: NodeId, ex: &Tables) -> Result<Operand, ExecError> {
        if let Some(s) = self.slot_of.get(&n) {
            return Ok(Operand::Slot(*s));
        }
        let node = self.m.node(n);
        match &node.kind {
            NodeKind::Const(Const::Graph(h)) => {
                let code = *ex.code_of.get(h).ok_or_else(|| ExecError {
                    message: format!("graph {h} is not compiled"),
                    loc: node.loc,
                })?;
                let fvs = self.fv.get(*h);
                if fvs.is_empty() || ex.lifted.extra.contains_key(h) {
                    return Ok(self.constant(Value::Func(Arc::new(Closure {
                        code,
                        captures: Vec::new(),
                    }))));
                }
                let mut captures = Vec::with_capacity(fvs.len());
                for &v in fvs {
                    captures.push(self.operand(v, ex)?);
                }
                let dst = self.n_slots;
                self.n_slots += 1;
                self.instrs.push(Instr::MakeClosure {
                    dst,
                    code,
                    captures,
                });
                Ok(Operand::Slot(dst))
            }
            NodeKind::Const(Const::Prim(p)) => Err(ExecError {
                message: format!("primitive `{p}` used as a value"),
                loc: node.loc,
            }),
            NodeKind::Const(c) => {
                let v = const_value(c).expect("plain constant");
                Ok(self.constant(v))
            }
            _ => Err(ExecError {
                message: format!("node {n} is used by graph {} before it is computed", self.g),
                loc: node.loc,
            }),
        }
    }

    /// The code of a fusion group: its kernel, then the call its results
    /// go on to, if any. Returns whether that call is the graph's tail
    /// call (the group computes `output`).
    fn group(
        &mut self,
        group: &crate::fuse::Group,
        output: NodeId,
        ex: &mut Tables,
    ) -> Result<bool, ExecError> {
        let m = self.m;
        let loc = ex.push_loc(m.node(*group.outputs.last().expect("an output")).loc);
        let mut args = Vec::with_capacity(group.inputs.len());
        for &i in &group.inputs {
            args.push(self.operand(i, ex)?);
        }
        let sites = group
            .sites
            .iter()
            .map(|&s| (s.0, ex.push_loc(m.node(s).loc)))
            .collect();
        let dst = self.n_slots;
        self.n_slots += 1;
        self.instrs.push(Instr::Native {
            dst,
            kernel: group.kernel.clone(),
            args,
            loc,
            sites,
        });
        let Some(then) = &group.then else {
            if group.outputs.len() == 1 {
                self.slot_of.insert(group.outputs[0], dst);
            } else {
                for (k, &o) in group.outputs.iter().enumerate() {
                    let d = self.tuple_get(dst, k, loc);
                    self.slot_of.insert(o, d);
                }
            }
            return Ok(false);
        };
        // The call that takes the kernel's results on: a tail call when
        // the group's output is the graph's.
        let mut args = Vec::with_capacity(then.args.len());
        for a in &then.args {
            args.push(match *a {
                crate::fuse::ContArg::Node(x) => self.operand(x, ex)?,
                crate::fuse::ContArg::Result(k) => Operand::Slot(self.tuple_get(dst, k, loc)),
            });
        }
        let callee = self.operand(then.callee, ex)?;
        self.lifted_args(then.callee, &mut args, ex)?;
        let out = group.outputs[0];
        if out == output {
            self.instrs.push(Instr::TailCall { callee, args, loc });
            return Ok(true);
        }
        let d = self.n_slots;
        self.n_slots += 1;
        self.instrs.push(Instr::Call {
            dst: d,
            callee,
            args,
            loc,
        });
        self.slot_of.insert(out, d);
        Ok(false)
    }

    /// The tape instruction node `n` became, if it is a push of a
    /// backpropagator or the first call of a reversed loop on its tape
    /// (into slot `dst`); returns whether it was one.
    fn tape_instr(
        &mut self,
        n: NodeId,
        dst: u32,
        loc: LocIndex,
        ex: &mut Tables,
    ) -> Result<bool, ExecError> {
        let Some(tapes) = ex.tapes else {
            return Ok(false);
        };
        let (fv, inputs) = (self.fv, self.m.inputs(n));
        if let Some(&(bg, stack)) = tapes.pushes.get(&n) {
            let code = *ex.code_of.get(&bg).ok_or_else(|| ExecError {
                message: format!("graph {bg} is not compiled"),
                loc: self.m.node(n).loc,
            })?;
            let stack = self.operand(stack, ex)?;
            let mut captures = Vec::with_capacity(fv.get(bg).len());
            for &v in fv.get(bg) {
                captures.push(self.operand(v, ex)?);
            }
            self.instrs.push(Instr::TapePush {
                dst,
                stack,
                code,
                captures,
                hint: Default::default(),
            });
        } else if let Some(&stack) = tapes.first_calls.get(&n) {
            let of = self.operand(stack, ex)?;
            let mut args = Vec::with_capacity(inputs.len() - 1);
            for &i in &inputs[1..] {
                args.push(self.operand(i, ex)?);
            }
            self.instrs.push(Instr::CallFirst { dst, of, args, loc });
        } else {
            return Ok(false);
        }
        self.slot_of.insert(n, dst);
        Ok(true)
    }

    /// The instruction of application `n` (into slot `dst`): a switch, a
    /// primitive's reference kernel, or a call (a tail call when `n` is
    /// the graph's output).
    fn node_instr(
        &mut self,
        n: NodeId,
        dst: u32,
        loc: LocIndex,
        output: NodeId,
        ex: &mut Tables,
    ) -> Result<Instr, ExecError> {
        let m = self.m;
        let node = m.node(n);
        let inputs = m.inputs(n);
        let operands = |b: &mut Self, ex: &mut Tables| -> Result<Vec<Operand>, ExecError> {
            let mut args = Vec::with_capacity(inputs.len() - 1);
            for &i in &inputs[1..] {
                args.push(b.operand(i, ex)?);
            }
            Ok(args)
        };
        Ok(match m.as_const(inputs[0]) {
            Some(Const::Prim(Prim::Switch)) => {
                if inputs.len() != 4 {
                    return Err(ExecError {
                        message: "switch takes three arguments".into(),
                        loc: node.loc,
                    });
                }
                let cond = self.operand(inputs[1], ex)?;
                let a = self.operand(inputs[2], ex)?;
                let b = self.operand(inputs[3], ex)?;
                Instr::Switch {
                    dst,
                    cond,
                    a,
                    b,
                    loc,
                }
            }
            Some(Const::Prim(p)) => {
                let kernel = kernels::lookup(p.name()).ok_or_else(|| ExecError {
                    message: format!("primitive `{p}` has no reference kernel"),
                    loc: node.loc,
                })?;
                Instr::Prim {
                    dst,
                    name: p.name(),
                    kernel,
                    inplace: kernels::lookup_inplace(p.name()),
                    args: operands(self, ex)?,
                    loc,
                    batch: p.batch_rule(),
                }
            }
            _ => {
                let callee = self.operand(inputs[0], ex)?;
                let mut args = operands(self, ex)?;
                if let Some(start) = ex.tapes.and_then(|t| t.starts.get(&n)) {
                    self.start_tape(start, &mut args, loc, ex);
                }
                self.lifted_args(inputs[0], &mut args, ex)?;
                if n == output {
                    Instr::TailCall { callee, args, loc }
                } else {
                    Instr::Call {
                        dst,
                        callee,
                        args,
                        loc,
                    }
                }
            }
        })
    }

    /// Starts a reversed loop on a tape with room for its trips: `args`
    /// (the loop's call) get a new tape in place of the empty stack.
    fn start_tape(&mut self, start: &Start, args: &mut [Operand], loc: LocIndex, ex: &mut Tables) {
        let Ok(bound) = self.operand(start.bound, ex) else {
            return;
        };
        let per = |b: &mut Self, k: usize| b.constant(Value::Tensor(Tensor::weak_i64(k as i64)));
        let tape_args = vec![
            args[start.param],
            bound,
            per(self, start.records_per_trip),
            per(self, start.values_per_trip),
        ];
        let tape = self.n_slots;
        self.n_slots += 1;
        self.instrs.push(Instr::Prim {
            dst: tape,
            name: "tape_new",
            kernel: adjoint_runtime::tape::tape_new,
            inplace: None,
            args: tape_args,
            loc,
            batch: BatchRule::Opaque,
        });
        *args.last_mut().expect("the stack") = Operand::Slot(tape);
    }

    /// After a `load_npy` (node `n`, result in `dst`): the check that the
    /// data has the dtype and shape graph mode was specialised to.
    fn check_load(
        &mut self,
        n: NodeId,
        dst: u32,
        loc: LocIndex,
        check: &Arc<dyn adjoint_runtime::vm::NativeKernel>,
        ex: &mut Tables,
    ) -> Result<(), ExecError> {
        let inputs = self.m.inputs(n);
        if !matches!(
            self.m.as_const(inputs[0]),
            Some(&Const::Prim(Prim::LoadNpy | Prim::LoadCsv))
        ) {
            return Ok(());
        }
        let path = self.operand(inputs[2], ex)?;
        let checked = self.n_slots;
        self.n_slots += 1;
        self.instrs.push(Instr::Native {
            dst: checked,
            kernel: check.clone(),
            args: vec![Operand::Slot(dst), path],
            loc,
            sites: Vec::new(),
        });
        self.slot_of.insert(n, checked);
        Ok(())
    }
}

/// The body in an order where each fused group is one step
/// ([`crate::fuse::order`]): every unit after the units it needs,
/// otherwise in body order. A call of a lifted graph passes the free
/// variables of its whole class, so it needs them all.
fn schedule(
    m: &Module,
    g: GraphId,
    body: &[NodeId],
    fv: &FreeVars,
    lifted: &Lifted,
    plan: Option<&crate::fuse::Plan>,
) -> Vec<Unit> {
    let Some(plan) = plan.filter(|p| body.iter().any(|n| p.member_of.contains_key(n))) else {
        return body.iter().map(|n| Unit::Node(*n)).collect();
    };
    match crate::fuse::order::units(m, g, body, fv, Some(&lifted.extra), plan).order() {
        Ok(order) => order,
        Err(left) => {
            // Fusion leaves no cycle it can see; one through a lifted
            // class runs this graph without its kernels, every node on
            // its own, in body order.
            tracing::debug!(
                target: "adjoint::fuse",
                "fuse: @{}: {} steps need each other; the graph runs without kernels",
                m.graph(g).name,
                left.len()
            );
            body.iter().map(|n| Unit::Node(*n)).collect()
        }
    }
}

/// Compiles graph `g`, whose body ([`graph_body_with`]) is `body`.
fn compile_graph(
    m: &Module,
    g: GraphId,
    body: &[NodeId],
    fv: &FreeVars,
    ex: &mut Tables,
    plan: Option<&crate::fuse::Plan>,
) -> Result<Code, ExecError> {
    let graph = m.graph(g);
    let mut b = CodeBuilder {
        m,
        g,
        fv,
        slot_of: HashMap::new(),
        n_slots: 0,
        consts: Vec::new(),
        instrs: Vec::new(),
    };
    for &p in &graph.params {
        b.slot_of.insert(p, b.n_slots);
        b.n_slots += 1;
    }
    // A lifted graph takes its free variables (those of its switch
    // siblings too) as parameters, in the slots captures would have had.
    let extra = ex.lifted.extra.get(&g);
    let captures = extra.map(Vec::as_slice).unwrap_or(fv.get(g));
    for &c in captures {
        b.slot_of.insert(c, b.n_slots);
        b.n_slots += 1;
    }
    let output = graph.output.ok_or_else(|| ExecError {
        message: format!("graph @{} has no output", graph.name),
        loc: graph.loc,
    })?;
    let order = schedule(m, g, body, fv, ex.lifted, plan);
    let mut tail = false;
    for unit in order {
        let n = match unit {
            Unit::Node(n) => n,
            Unit::Group(gi) => {
                let group = &plan.expect("groups come from a plan").groups[gi];
                tail |= b.group(group, output, ex)?;
                continue;
            }
        };
        if ex.tapes.is_some_and(|t| t.skipped.contains(&n)) {
            // Made part of a tape instruction below.
            continue;
        }
        let loc = ex.push_loc(m.node(n).loc);
        let dst = b.n_slots;
        b.n_slots += 1;
        if b.tape_instr(n, dst, loc, ex)? {
            continue;
        }
        let instr = b.node_instr(n, dst, loc, output, ex)?;
        tail |= matches!(instr, Instr::TailCall { .. });
        b.instrs.push(instr);
        b.slot_of.insert(n, dst);
        // Data graph mode was specialised to is checked as it is loaded.
        if let Some(check) = plan.and_then(|p| p.load_check.as_ref()) {
            b.check_load(n, dst, loc, check, ex)?;
        }
    }
    let ret = if tail {
        Operand::Slot(0)
    } else {
        b.operand(output, ex)?
    };
    let mut code = Code {
        name: graph.name.clone(),
        n_params: (graph.params.len() + extra.map_or(0, Vec::len)) as u32,
        n_captures: if extra.is_some() {
            0
        } else {
            captures.len() as u32
        },
        n_slots: b.n_slots,
        consts: b.consts,
        instrs: b.instrs,
        ret,
        extra_args: ex.lifted.lenient.contains(&g),
    };
    // Off, every value is kept until its function returns (to measure
    // what releasing them early saves).
    if ex.release_early {
        moves::move_last_uses(&mut code);
    }
    Ok(code)
}
