//! Loops over scalars differentiated whole: reverse mode with a typed
//! tape instead of a chain of closures.
//!
//! Reverse mode turns a loop into `J'` graphs ([`crate::ad`]) that push a
//! backpropagator closure per iteration onto a stack, and `unwind`, which
//! pops and calls them; the VM runs both with a heap allocation per step.
//! When the loop is over scalars, its `J'` graphs with the pushes left out
//! are a scalar region computing the loop itself ([`super::regions`], with
//! the stack as [`Shape::Stack`]). This pass finds the call that starts
//! such a loop, `r = J'(args.., ())`, whose stack `tuple_get(r, 1)` goes
//! only to one `unwind(stack, seed)`, and replaces both calls with native
//! kernels made by [`crate::scalar::ad`]: the first runs the loop
//! and records a tape (an i64 tensor), the second runs it backwards from
//! the seed and gives `unwind`'s result, `(env, d_args..)`.
//!
//! Besides the cotangents of the loop's arguments, the backward kernel
//! computes those of the free variables reverse mode marked with
//! `ad_key`, returned in `unwind`'s environment under their keys. Loops
//! whose values are not all scalars keep their closures.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use adjoint_runtime::error::RtError;
use adjoint_runtime::tensor::Tensor;
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;

use super::regions::{
    add_call_group, buffer_args, callees, compilable, flat_args, program_of, region, scalar_args,
    Cx, Shape, Stacks,
};
use super::Plan;
use crate::infer::Types;
use crate::ir::analysis::{graph_body_with, FreeVars};
use crate::ir::{Const, GraphId, GraphRole, Module, NodeId};
use crate::prim::Prim;
use crate::scalar::ad::reverse;
use crate::scalar::native::{compile_scalar_cached, CompiledScalar};
use crate::scalar::{SOp, Scalar, ScalarProgram};

/// The stacks of the `J'` graphs among `graphs`: their last parameter
/// `stack`, and the pushes `ad_hide((@B, stack))`.
fn find_stacks(m: &Module, graphs: &[GraphId], fv: &FreeVars) -> Stacks {
    let mut st = Stacks::default();
    for &g in graphs {
        if threads_stack(m, g) {
            let p = *m.graph(g).params.last().expect("a named parameter");
            st.param.insert(g, p);
            st.nodes.insert(p);
        }
    }
    // `J` graphs that return `(value, @B)`: the `if`s a loop's body calls.
    for &g in graphs {
        let graph = m.graph(g);
        if graph.role != GraphRole::Reverse || st.param.contains_key(&g) {
            continue;
        }
        let Some(out) = graph.output else { continue };
        let ins = m.inputs(out);
        if m.applied_prim(out) != Some(Prim::MakeTuple) || ins.len() != 3 {
            continue;
        }
        if let Some(Const::Graph(b)) = m.as_const(ins[2]) {
            if m.graph(*b).role == GraphRole::Backprop {
                st.nodes.insert(ins[2]);
                st.closures.insert(g);
            }
        }
    }
    for &g in st.param.keys().copied().collect::<Vec<_>>().iter() {
        for n in graph_body_with(m, g, fv) {
            let ins = m.inputs(n);
            let pushed = match m.applied_prim(n) {
                Some(Prim::MakeTuple) => {
                    ins.len() == 3
                        && matches!(m.as_const(ins[1]), Some(Const::Graph(_)))
                        && st.nodes.contains(&ins[2])
                }
                Some(Prim::AdHide) => ins.len() == 2 && st.nodes.contains(&ins[1]),
                _ => false,
            };
            if pushed {
                st.nodes.insert(n);
            }
        }
    }
    st
}

/// The uses fusion already collected ([`super::plan`]): the users of each
/// node, and the nodes that escape (graph outputs, captured values).
struct Uses<'a> {
    m: &'a Module,
    users: &'a HashMap<NodeId, Vec<NodeId>>,
    escapes: &'a HashSet<NodeId>,
}

impl Uses<'_> {
    /// Every use of `x` as (user, input position); `None` if it escapes.
    fn of(&self, x: NodeId) -> Option<Vec<(NodeId, usize)>> {
        if self.escapes.contains(&x) {
            return None;
        }
        let mut users: Vec<NodeId> = self.users.get(&x).cloned().unwrap_or_default();
        users.sort_unstable_by_key(|u| u.0);
        users.dedup();
        Some(
            users
                .into_iter()
                .flat_map(|u| {
                    let ins = self.m.inputs(u);
                    (0..ins.len())
                        .filter(move |k| ins[*k] == x)
                        .map(move |k| (u, k))
                })
                .collect(),
        )
    }
}

/// Whether the stacks are used only as stacks: pushed, passed on as a
/// `J'` call's last argument, or returned beside the value. A graph
/// where one is used otherwise loses its stack (and stays with the VM).
fn check_stacks(m: &Module, stacks: &mut Stacks, uses: &Uses) {
    let mut bad: HashSet<GraphId> = HashSet::new();
    for &s in &stacks.nodes {
        let Some(list) = uses.of(s) else {
            bad.extend(m.node(s).graph);
            continue;
        };
        for (n, k) in list {
            // The graph the use is in (a backpropagator constant has none
            // of its own).
            let Some(g) = m.node(s).graph.or(m.node(n).graph) else {
                continue;
            };
            let ins = m.inputs(n);
            let last = k == ins.len() - 1;
            let output = m.graph(g).output == Some(n);
            let ok = stacks.nodes.contains(&n)
                // A tail call of J' graphs.
                || (last && output && m.applied_prim(n).is_none() && {
                    let callees = callees(m, ins[0]);
                    !callees.is_empty() && callees.iter().all(|h| stacks.param.contains_key(h))
                })
                // `(value, stack)` returned.
                || (last && output && m.applied_prim(n) == Some(Prim::MakeTuple));
            if !ok {
                bad.insert(g);
            }
        }
    }
    for g in bad {
        if let Some(p) = stacks.param.remove(&g) {
            stacks.nodes.remove(&p);
        }
        if stacks.closures.remove(&g) {
            if let Some(out) = m.graph(g).output {
                stacks.nodes.remove(&m.inputs(out)[2]);
            }
        }
    }
}

/// Whether `args` (a stack's `()` last) have the scalar types of the
/// parameters `params` (the stack last).
/// (A symbolic zero matches a parameter that is always one.)
fn arguments_match(cx: &Cx, args: &[NodeId], params: &[NodeId]) -> bool {
    let ty = |n: NodeId| match cx.shape(n)? {
        Shape::Zero => Some(None),
        s => Some(Some((s.elem()?.0, s.dims()?.to_vec()))),
    };
    args.len() == params.len()
        && args[..args.len() - 1]
            .iter()
            .zip(params)
            .all(|(a, p)| ty(*a).is_some() && ty(*a) == ty(*p))
}

/// Whether `g` is reverse mode's `unwind` ([`crate::ad`] makes it, with
/// no source location).
fn is_unwind(m: &Module, g: GraphId) -> bool {
    m.graph(g).role == GraphRole::Unwind
}

/// Adds the two kernels of every loop over scalars whose gradient the VM
/// would otherwise run with closures.
pub(super) fn reverse_groups(
    m: &Module,
    graphs: &[GraphId],
    types: &Types,
    fv: &FreeVars,
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
    plan: &mut Plan,
    opts: &crate::options::CompilerOptions,
) {
    let stacks = find_stacks(m, graphs, fv);
    if stacks.param.is_empty() {
        return;
    }
    let uses = Uses { m, users, escapes };
    let mut stacks = stacks;
    check_stacks(m, &mut stacks, &uses);
    let cx = Cx {
        m,
        types,
        fv,
        stacks: &stacks,
        keys: Vec::new(),
    };
    let trace = tracing::enabled!(target: "adjoint::scalar", tracing::Level::DEBUG);
    let ok = compilable(&cx, graphs);
    // Per entry and the keys its `unwind`'s environment is read at.
    type Site = (GraphId, Option<Vec<i64>>);
    let mut built: HashMap<Site, Option<Arc<Built>>> = HashMap::new();
    for &h in graphs {
        if cx.stacks.param.contains_key(&h) {
            continue;
        }
        for n in graph_body_with(m, h, fv) {
            let ins = m.inputs(n);
            let Some(Const::Graph(g)) = m.as_const(ins[0]).cloned() else {
                continue;
            };
            if !ok.contains_key(&g)
                || !cx.stacks.param.contains_key(&g)
                || m.as_const(*ins.last().expect("a callee")) != Some(&Const::Unit)
                || plan.member_of.contains_key(&n)
                || !arguments_match(&cx, &ins[1..], &m.graph(g).params)
            {
                continue;
            }
            let Some((stack, unwind, seed)) = stack_use(&cx, &uses, n) else {
                if trace {
                    tracing::debug!(
                        target: "adjoint::scalar",
                        "scalar: reverse @{}: its stack is not only unwound",
                        m.graph(g).name
                    );
                }
                continue;
            };
            let read = env_reads(&uses, unwind);
            let b = built
                .entry((g, read.clone()))
                .or_insert_with(|| {
                    let r = build(&cx, &ok, g, read.as_deref(), opts.max_tape_slots);
                    if trace {
                        tracing::debug!(
                        target: "adjoint::scalar",
                            "scalar: reverse @{}: {}",
                            m.graph(g).name,
                            match &r {
                                Ok(b) => match b.count {
                                    Some(c) => format!("compiled; it counts ({c:?})"),
                                    None => "compiled".to_string(),
                                },
                                Err(e) => format!("not compiled ({e})"),
                            }
                        );
                    }
                    r.ok().map(Arc::new)
                })
                .clone();
            let Some(b) = b else { continue };
            // The seed must be the cotangent of the value.
            if !cx.shape(seed).is_some_and(|s| seed_fits(&s, &b.value)) {
                if trace {
                    tracing::debug!(
                        target: "adjoint::scalar",
                        "scalar: reverse @{}: the seed's type differs",
                        m.graph(g).name
                    );
                }
                continue;
            }
            // (The symbolic zeros have no machine value.)
            let mut inputs: Vec<NodeId> = ins[1..ins.len() - 1]
                .iter()
                .copied()
                .filter(|a| cx.shape(*a) != Some(Shape::Zero))
                .collect();
            inputs.extend(
                fv.get(g)
                    .iter()
                    .copied()
                    .filter(|u| cx.shape(*u) != Some(Shape::Zero)),
            );
            inputs.extend(b.key_inputs.iter().copied());
            let name = &m.graph(g).name;
            let ms = |c: &CompiledScalar| c.compile_time().as_secs_f64() * 1e3;
            add_call_group(
                plan,
                m,
                h,
                n,
                inputs,
                format!(
                    "scalar loop @{name} recording its tape for reverse mode, compiled in {:.2} ms",
                    ms(&b.forward)
                ),
                &b.forward,
                Arc::new(Forward(b.clone())),
                None,
            );
            add_call_group(
                plan,
                m,
                h,
                unwind,
                vec![stack, seed],
                format!(
                    "reverse of scalar loop @{name} from its tape, compiled in {:.2} ms",
                    ms(&b.backward)
                ),
                &b.backward,
                Arc::new(Backward(b.clone())),
                None,
            );
        }
    }
}

/// For the call `n` that starts a loop's stack: the stack node, the
/// `unwind` call that is its only use, and the seed; `None` unless only
/// `tuple_get`s read `n` and the unwind's result.
fn stack_use(cx: &Cx, uses: &Uses, n: NodeId) -> Option<(NodeId, NodeId, NodeId)> {
    let m = cx.m;
    let get_index = |u: NodeId| -> Option<i64> {
        if m.applied_prim(u) != Some(Prim::TupleGet) {
            return None;
        }
        match m.as_const(m.inputs(u)[2]) {
            Some(Const::Int(k)) => Some(*k),
            _ => None,
        }
    };
    let users = |x: NodeId| uses.of(x);
    let mut stack = None;
    for (u, k) in users(n)? {
        (k == 1).then_some(())?;
        match get_index(u)? {
            0 => {}
            1 if stack.is_none() => stack = Some(u),
            _ => return None,
        }
    }
    let stack = stack?;
    let [(unwind, 1)] = users(stack)?[..] else {
        return None;
    };
    let ins = m.inputs(unwind);
    let Some(Const::Graph(uw)) = m.as_const(ins[0]) else {
        return None;
    };
    (ins.len() == 3 && is_unwind(m, *uw) && m.node(unwind).graph == m.node(n).graph)
        .then_some(())?;
    for (u, k) in users(unwind)? {
        (k == 1 && get_index(u)? >= 0).then_some(())?;
    }
    Some((stack, unwind, ins[2]))
}

/// The keys at which the environment of `unwind`'s result is read,
/// sorted; `None` when it is used otherwise (passed on, merged), so any
/// key may be.
fn env_reads(uses: &Uses, unwind: NodeId) -> Option<Vec<i64>> {
    let m = uses.m;
    let mut keys = Vec::new();
    for (u, _) in uses.of(unwind)? {
        if m.applied_prim(u) != Some(Prim::TupleGet)
            || m.as_const(m.inputs(u)[2]) != Some(&Const::Int(0))
        {
            continue;
        }
        for (r, k) in uses.of(u)? {
            if m.applied_prim(r) != Some(Prim::EnvGetitem) || k != 1 {
                return None;
            }
            let Some(Const::Int(key)) = m.as_const(m.inputs(r)[2]) else {
                return None;
            };
            keys.push(*key);
        }
    }
    keys.sort_unstable();
    keys.dedup();
    Some(keys)
}

/// A loop's two compiled programs.
struct Built {
    name: String,
    forward: Arc<CompiledScalar>,
    backward: Arc<CompiledScalar>,
    /// The loop's value (the first element of `J'`'s result).
    value: Shape,
    /// Per parameter of the `J'` entry but the stack: its shape if it is
    /// a float (its cotangent is computed), else `None`.
    params: Vec<Option<Shape>>,
    /// The shapes of the forward kernel's inputs: the entry's arguments
    /// (but zeros), its free variables, then the keys' values.
    inputs: Vec<Shape>,
    /// Where each parameter's cotangent goes in `unwind`'s result, which
    /// has one per parameter of the graph the entry was specialised from
    /// (after the environment): `len` slots.
    slots: Vec<usize>,
    len: usize,
    /// The environment keys of the loop's marked free variables (inputs
    /// after the entry's arguments and free variables): `unwind`'s
    /// environment holds their cotangents.
    keys: Vec<(i64, Shape)>,
    key_inputs: Vec<NodeId>,
    /// The scalars of the entry's float free variables (their cotangents,
    /// which the keys' stand for, are skipped).
    fv_floats: usize,
    /// The length of the last tape recorded: the next one starts with
    /// that capacity (a loop called again, in a training loop, usually
    /// runs as long), so it is not copied as it grows.
    last_len: std::sync::atomic::AtomicUsize,
    /// When the loop counts up to a bound: the tape is made as long as
    /// the count says from the start.
    count: Option<Count>,
    /// The most values the tape may hold.
    max_tape_slots: u64,
}

/// The longest reverse program compiled (instructions, all functions).
const MAX_BACKWARD_INSTS: usize = 12_000;

/// The most slots a tape is made with from a trip count (1 GiB); a
/// longer one grows as it fills. (An early `break` makes the count an
/// upper bound, which should not reserve the whole tape limit.)
const MAX_RESERVED: u64 = 1 << 27;

/// A counting loop: the entry's parameter `param` is compared with
/// `lt(param, bound)` to choose the body, and every call of the entry
/// from inside the loop passes `param + 1`; one trip pushes at most
/// `per_trip` values.
#[derive(Clone, Copy, Debug)]
struct Count {
    param: usize,
    bound: Bound,
    per_trip: usize,
}

#[derive(Clone, Copy, Debug)]
enum Bound {
    Const(i64),
    /// One of the kernel's inputs (a free variable of the entry).
    Input(usize),
}

impl Count {
    /// The most values a run with these inputs pushes (an upper bound
    /// when the loop may leave early).
    fn slots(&self, inputs: &[Scalar]) -> Option<u64> {
        let int = |i: usize| match inputs.get(i) {
            Some(Scalar::I64(v)) => Some(*v),
            _ => None,
        };
        let bound = match self.bound {
            Bound::Const(b) => b,
            Bound::Input(i) => int(i)?,
        };
        let trips = bound.saturating_sub(int(self.param)?).max(0) as u64;
        trips.checked_mul(self.per_trip as u64)
    }
}

/// Whether `g` is a graph reverse mode made to thread a stack of
/// backpropagators: `J'(f)`, whose last parameter is the stack.
pub(crate) fn threads_stack(m: &Module, g: GraphId) -> bool {
    m.graph(g).role == GraphRole::ReverseStacked
}

/// The test of a loop entry `g` that chooses its body with `lt(p, bound)`,
/// `p` one of its parameters: `p`'s position, `p`, and the bound (without
/// its `ad_key` mark).
pub(crate) fn loop_test(m: &Module, g: GraphId) -> Option<(usize, NodeId, NodeId)> {
    let graph = m.graph(g);
    let switch = *m.inputs(graph.output?).first()?;
    let (cond, _, _) = m.graph_switch(switch)?;
    if m.node(switch).graph != Some(g) || m.applied_prim(cond) != Some(Prim::Lt) {
        return None;
    }
    let (p, mut bound) = (m.inputs(cond)[1], m.inputs(cond)[2]);
    let param = graph.params.iter().position(|q| *q == p)?;
    if m.applied_prim(bound) == Some(Prim::AdKey) {
        bound = m.inputs(bound)[1];
    }
    Some((param, p, bound))
}

/// Whether `x` is `c + 1` or `1 + c` for a `c` that `counter` accepts.
pub(crate) fn steps_by_one(m: &Module, x: NodeId, counter: impl Fn(NodeId) -> bool) -> bool {
    m.applied_prim(x) == Some(Prim::Add) && {
        let ins = m.inputs(x);
        let one = |y: NodeId| m.as_const(y) == Some(&Const::Int(1));
        (counter(ins[1]) && one(ins[2])) || (counter(ins[2]) && one(ins[1]))
    }
}

/// The [`Count`] of loop entry `g`, if it has one. `members` is its
/// region, `forward` the region's recording program (a function that
/// marks the tape and calls the entry, then the members' functions in
/// order). The count's positions are those of the kernel's inputs as
/// scalars (a tensor takes one per element).
fn counting(
    cx: &Cx,
    ok: &HashMap<GraphId, super::regions::Info>,
    members: &[GraphId],
    forward: &ScalarProgram,
    g: GraphId,
) -> Option<Count> {
    let m = cx.m;
    if forward.funcs.len() != members.len() + 1 {
        return None;
    }
    let (param, a, b) = loop_test(m, g)?;
    // The scalars before a node among `nodes` (symbolic zeros take none).
    let before = |nodes: &[NodeId], k: usize| -> Option<usize> {
        nodes[..k]
            .iter()
            .map(|n| cx.shape(*n).map(|s| s.width()))
            .sum()
    };
    let graph = m.graph(g);
    let args = &graph.params[..graph.params.len() - 1];
    let fvs = cx.fv.get(g);
    let bound = match m.as_const(b) {
        Some(Const::Int(v)) => Bound::Const(*v),
        Some(_) => return None,
        None => Bound::Input(
            before(args, args.len())? + before(fvs, fvs.iter().position(|v| *v == b)?)?,
        ),
    };
    let param_at = before(args, param)?;
    // Every call of the entry in the loop steps the counter by one.
    let steps = |x: NodeId| steps_by_one(m, x, |c| c == a);
    let mut calls = 0;
    for &h in members {
        for n in cx.body(h) {
            let ins = m.inputs(n);
            if m.as_const(ins[0]) == Some(&Const::Graph(g)) {
                if !steps(*ins.get(1 + param)?) {
                    return None;
                }
                calls += 1;
            }
        }
    }
    if calls == 0 {
        return None;
    }
    // What one trip pushes at most: the records of every function on the
    // way back to the entry, once each.
    let mut cycle: HashSet<GraphId> = HashSet::new();
    while let Some(h) = members.iter().find(|h| {
        !cycle.contains(*h)
            && ok[*h]
                .calls
                .iter()
                .any(|(c, _)| *c == g || cycle.contains(c))
    }) {
        cycle.insert(*h);
    }
    let per_trip = (members.iter().zip(&forward.funcs[1..]))
        .filter(|(h, _)| cycle.contains(*h))
        .flat_map(|(_, f)| &f.body)
        .map(|i| match &i.op {
            SOp::Push(vals) => vals.len(),
            _ => 0,
        })
        .sum();
    Some(Count {
        param: param_at,
        bound,
        per_trip,
    })
}

fn build(
    cx: &Cx,
    ok: &HashMap<GraphId, super::regions::Info>,
    g: GraphId,
    read: Option<&[i64]>,
    max_tape_slots: u64,
) -> Result<Built, String> {
    let (m, fv) = (cx.m, cx.fv);
    let r = region(ok, g);
    if !r.exits.is_empty() {
        return Err("the loop leaves through graphs outside it".into());
    }
    let out = m.graph(g).output.ok_or("no output")?;
    let Some(Shape::Tuple(items)) = cx.shape(out) else {
        return Err("the result is not (value, stack)".into());
    };
    let [value, Shape::Stack] = &items[..] else {
        return Err("the result is not (value, stack)".into());
    };
    // The marked free variables: one value per key, from outside the loop.
    let members: HashSet<GraphId> = r.order.iter().copied().collect();
    let mut marks: HashMap<i64, (NodeId, Shape)> = HashMap::new();
    let mut unread: HashSet<NodeId> = HashSet::new();
    for &h in &r.order {
        for n in cx.body(h) {
            if m.applied_prim(n) != Some(Prim::AdKey) {
                continue;
            }
            let ins = m.inputs(n);
            let Some(Const::Int(k)) = m.as_const(ins[2]) else {
                return Err("a key that is not a constant".into());
            };
            let x = ins[1];
            // A value made inside the loop (marked by a loop nested in
            // it) is differentiated with the rest of the program: its
            // mark is the value itself ([`Cx::keys`]).
            if m.node(x).graph.is_some_and(|o| members.contains(&o)) {
                continue;
            }
            // A large tensor read in place has no cotangent here: its
            // mark must be one nobody reads.
            if matches!(cx.shape(n), Some(Shape::Buffer(..))) {
                if read.is_some_and(|r| !r.contains(k)) {
                    unread.insert(x);
                    continue;
                }
                return Err("the cotangent of a large tensor it reads is used".into());
            }
            let sh = cx
                .shape(n)
                .filter(|s| s.elem().is_some())
                .ok_or("a marked value that is not a scalar or a small tensor")?;
            match marks.insert(*k, (x, sh)) {
                Some((y, _)) if y != x => return Err("one key, two values".into()),
                _ => {}
            }
        }
    }
    let mut keys: Vec<(i64, Shape)> = marks.iter().map(|(k, (_, s))| (*k, s.clone())).collect();
    keys.sort_by_key(|(k, _)| *k);
    // The entry's float free variables must be the marks' values: any
    // other would be a cotangent this kernel does not give.
    let marked: HashSet<NodeId> = marks.values().map(|(x, _)| *x).collect();
    let mut fv_floats = 0;
    // Every graph of the region is checked: the entry's table may not list
    // what a member uses from outside (a member lifted, say).
    let mut outside: Vec<NodeId> = fv.get(g).to_vec();
    for &h in &r.order {
        for &u in fv.get(h) {
            let inside = m.node(u).graph.is_some_and(|o| members.contains(&o));
            if !inside && !outside.contains(&u) {
                outside.push(u);
            }
        }
    }
    for &u in fv.get(g) {
        if let Some(sh) = cx.shape(u).filter(|_| marked.contains(&u)) {
            if sh.elem().is_some_and(|(t, _)| t.is_float()) {
                fv_floats += sh.width();
            }
        }
    }
    for u in outside {
        if marked.contains(&u) || unread.contains(&u) {
            continue;
        }
        // Unmarked, it must be known not to be a float (a use inside a
        // closure made in the loop is not marked, and a value of unknown
        // type may be one).
        match cx.shape(u).and_then(|s| s.elem()) {
            Some((t, _)) if !t.is_float() => {}
            Some(_) => return Err("a float free variable without a key".into()),
            None => return Err("a free variable of unknown type".into()),
        }
    }
    let key_inputs: Vec<NodeId> = keys.iter().map(|(k, _)| marks[k].0).collect();
    let rcx = Cx {
        m,
        types: cx.types,
        fv,
        stacks: cx.stacks,
        keys: keys.clone(),
    };
    let program = program_of(&rcx, &r.order, None).ok_or("no scalar program")?;
    let rev = reverse(&program)?;
    // Cranelift's time grows faster than the code (register allocation
    // over long straight lines of many live values; the quick first tier,
    // `scalar::native::compile_tiered`, takes about 0.1 s for 8,000
    // instructions): a reverse too long to compile quickly is left to the
    // VM.
    let insts: usize = rev.backward.funcs.iter().map(|f| f.body.len()).sum();
    if insts > MAX_BACKWARD_INSTS {
        return Err(format!(
            "its reverse has {insts} instructions, more than {MAX_BACKWARD_INSTS}"
        ));
    }
    let counts = counting(cx, ok, &r.order, &rev.forward, g);
    let forward = compile_scalar_cached(&rev.forward).map_err(|e| e.to_string())?;
    let backward = compile_scalar_cached(&rev.backward).map_err(|e| e.to_string())?;
    let graph = m.graph(g);
    let arg_shapes = graph.params[..graph.params.len() - 1]
        .iter()
        .map(|p| {
            cx.shape(*p)
                .filter(|s| *s == Shape::Zero || s.elem().is_some())
        })
        .collect::<Option<Vec<_>>>()
        .ok_or("a parameter is not a scalar or a small tensor")?;
    let params = arg_shapes
        .iter()
        .map(|sh| sh.elem().filter(|(t, _)| t.is_float()).map(|_| sh.clone()))
        .collect();
    let mut inputs: Vec<Shape> = arg_shapes
        .into_iter()
        .filter(|s| *s != Shape::Zero)
        .collect();
    for &u in fv.get(g) {
        match cx.shape(u).ok_or("a free variable of unknown type")? {
            // (no machine value)
            Shape::Zero => {}
            sh => inputs.push(sh),
        }
    }
    inputs.extend(keys.iter().map(|(_, s)| s.clone()));
    let (orig, count) = m.original_params(g);
    // The stack is the last parameter, in the copy as in the original.
    if orig.last() != Some(&(count - 1)) {
        return Err("the stack is not the original's last parameter".into());
    }
    Ok(Built {
        keys,
        key_inputs,
        fv_floats,
        last_len: std::sync::atomic::AtomicUsize::new(1024),
        count: counts,
        slots: orig[..orig.len() - 1].iter().map(|i| i + 1).collect(),
        len: count,
        name: graph.name.clone(),
        forward,
        backward,
        value: value.clone(),
        params,
        inputs,
        max_tape_slots,
    })
}

/// Runs the loop and records its tape: `(value, tape)`.
struct Forward(Arc<Built>);

impl NativeKernel for Forward {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        let b = &self.0;
        super::check_arity(&b.name, b.inputs.len(), args.len())?;
        let scalars = flat_args(&b.name, &args, &b.inputs)?;
        let last = b.last_len.load(std::sync::atomic::Ordering::Relaxed);
        let counted = b.count.and_then(|c| {
            let slots = c.slots(&scalars)?.saturating_add(64);
            Some(slots.min(MAX_RESERVED).min(b.max_tape_slots) as usize)
        });
        let mut tape = Vec::new();
        // Reserving more than memory allows is not an error: the tape
        // then grows as it fills, up to its limit.
        if tape.try_reserve_exact(counted.unwrap_or(last)).is_err() {
            tape.try_reserve(1024)
                .map_err(|_| RtError::new("out of memory for the tape"))?;
        }
        let buffers = buffer_args(&b.name, &args, &b.inputs)?;
        let out = b
            .forward
            .call_with(&scalars, &buffers, &mut tape, b.max_tape_slots)?;
        let value = b.value.value(&mut out.into_iter())?;
        let n = tape.len();
        b.last_len
            .store(n.max(1024), std::sync::atomic::Ordering::Relaxed);
        let tape = Tensor::from_vec(
            tape.into_iter().map(|x| x as i64).collect::<Vec<i64>>(),
            &[n],
        )?;
        Ok(Value::tuple(vec![value, Value::Tensor(tape)]))
    }
}

/// Runs the loop backwards from the tape and the seed: `(env, d_args..)`
/// as `unwind` gives it, the environment a zero.
struct Backward(Arc<Built>);

impl NativeKernel for Backward {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        let b = &self.0;
        super::check_arity(&b.name, 2, args.len())?;
        let bad_tape = || RtError::internal(format!("{}: the tape is not a tape", b.name));
        let Value::Tensor(t) = &args[0] else {
            return Err(bad_tape());
        };
        let tape: &[i64] = t.as_i64().ok_or_else(bad_tape)?;
        // SAFETY: i64 and u64 have one size and alignment.
        let tape: &[u64] =
            unsafe { std::slice::from_raw_parts(tape.as_ptr() as *const u64, tape.len()) };
        // The seed's float scalars, depth first.
        let mut seed = Vec::new();
        flatten_floats(&args[1], &b.value, &mut seed).ok_or_else(|| {
            RtError::internal(format!("{}: the seed is not the value's cotangent", b.name))
        })?;
        let d = b.backward.call_popping(&seed, tape)?;
        let mut d = d.into_iter();
        let few = || RtError::internal("too few cotangents");
        let mut out = vec![Value::Zero; b.len];
        for (p, slot) in b.params.iter().zip(&b.slots) {
            if let Some(sh) = p {
                out[*slot] = sh.value(&mut d)?;
            }
        }
        for _ in 0..b.fv_floats {
            d.next().ok_or_else(few)?;
        }
        let mut env = Vec::new();
        for (k, sh) in &b.keys {
            let cotangent = match sh {
                Shape::Scalar(t, _) if t.is_float() => Shape::Scalar(*t, false),
                Shape::Tensor(t, _, dims) if t.is_float() => Shape::Tensor(*t, false, dims.clone()),
                _ => continue,
            };
            env.push((*k as u64, cotangent.value(&mut d)?));
        }
        if !env.is_empty() {
            out[0] = Value::Env(Arc::new(env));
        }
        Ok(Value::tuple(out))
    }
}

/// Whether a seed of shape `seed` is a cotangent of a value of shape
/// `value` (a symbolic zero is the cotangent of anything).
fn seed_fits(seed: &Shape, value: &Shape) -> bool {
    match (seed, value) {
        (Shape::Zero, _) => true,
        (Shape::Scalar(a, _), Shape::Scalar(b, _)) => a == b,
        (Shape::Tensor(a, _, x), Shape::Tensor(b, _, y)) => a == b && x == y,
        (Shape::Tuple(xs), Shape::Tuple(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| seed_fits(x, y))
        }
        _ => false,
    }
}

/// Appends the float scalars of `v`, whose structure is `shape`.
fn flatten_floats(v: &Value, shape: &Shape, out: &mut Vec<Scalar>) -> Option<()> {
    match (shape, v) {
        (Shape::Scalar(t, _), Value::Tensor(_)) => {
            if t.is_float() {
                out.extend(scalar_args("seed", std::slice::from_ref(v), &[*t]).ok()?);
            }
            Some(())
        }
        (Shape::Scalar(t, _), Value::Zero) => {
            if t.is_float() {
                out.push(Scalar::from_bits(*t, 0));
            }
            Some(())
        }
        (Shape::Tensor(t, _, _), Value::Tensor(_)) => {
            if t.is_float() {
                out.extend(flat_args("seed", std::slice::from_ref(v), &[shape.clone()]).ok()?);
            }
            Some(())
        }
        (Shape::Tensor(t, _, dims), Value::Zero) => {
            if t.is_float() {
                out.extend(std::iter::repeat_n(
                    Scalar::from_bits(*t, 0),
                    dims.iter().product(),
                ));
            }
            Some(())
        }
        (Shape::Tuple(items), Value::Tuple(vs)) if items.len() == vs.len() => {
            for (s, x) in items.iter().zip(vs.iter()) {
                flatten_floats(x, s, out)?;
            }
            Some(())
        }
        (Shape::Tuple(items), Value::Zero) => {
            for s in items {
                flatten_floats(&Value::Zero, s, out)?;
            }
            Some(())
        }
        _ => None,
    }
}
