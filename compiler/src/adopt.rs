//! Weakly typed values adopt the type of the join they flow into.
//!
//! Inference gives the two paths of an `if` one type: `if x > 0.0 { x }
//! else { 0 }` is `f64` when `x` is (language.md §2: a weak literal adopts
//! the other branch's dtype), and a loop variable started at `0.0` and
//! summed with `f32` values is `f32` even when the loop runs no step. The
//! runtime, which follows its values and not inference, would give the
//! literal path a weak `i64` (or weak `f64`) instead: a function whose
//! result's dtype depends on its data, a `grad` that refuses an int
//! result, `f32` programs that turn `f64`.
//!
//! This pass, run after inference on a copy of the module, makes the
//! runtime agree. At every call inference saw, it compares what the
//! callee returns with what the call site was given (the join of every
//! callee), and what each argument is with the parameter of the callee's
//! specialisation (a loop's header, whose parameter joins the start value
//! with the value of every step). Where a weak tensor meets another dtype
//! or a strong type, the callee's output (or the argument) is converted:
//! a literal becomes a literal of the joined type, any other value a
//! `cast`. A location is converted only when every specialisation wants the
//! same type there (a generic function called with `f32` and with `f64`
//! keeps its literal as it is), and only in graphs whose types hold for
//! every call.
//!
//! Weak values come from literals alone, so they carry no derivative: the
//! pass can run after differentiation without changing any gradient.

use std::collections::HashMap;
use std::sync::Arc;

use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::Value;

use crate::infer::{AbsVal, SpecId, Types};
use crate::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use crate::prim::Prim;

/// Where a value is converted.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Site {
    /// The output of a graph.
    Output(GraphId),
    /// Argument `index` (from 0, after the callee) of call `node`.
    Arg(NodeId, usize),
}

/// The type a tensor must have: dtype, and whether it is weak.
type Target = (DType, bool);

/// What a value needs, leaf by leaf, over the specialisations of the
/// caller (the context: each one's target is listed with it).
#[derive(Clone, Debug, PartialEq)]
enum Need {
    /// A tensor whose targets are `targets`; `convert` when some value is
    /// weak and differs from its target; `bad` when a strong value does
    /// (left alone).
    Leaf {
        targets: Vec<(SpecId, Target)>,
        convert: bool,
        bad: bool,
    },
    Tuple(Vec<Need>),
    Record(Vec<(Arc<str>, Need)>),
    /// Nothing to convert (functions, strings, unknown values).
    Other,
}

impl Need {
    /// What `from` needs to be read as `to` in caller specialisation
    /// `ctx`; `None` when `from` tells nothing (a provisional result).
    fn of(ctx: SpecId, from: &AbsVal, to: &AbsVal) -> Option<Need> {
        Some(match (from, to) {
            (AbsVal::Bottom, _) => return None,
            (AbsVal::Tensor(f), AbsVal::Tensor(t)) if f.shape == t.shape => {
                let differs = (f.dtype, f.weak) != (t.dtype, t.weak);
                Need::Leaf {
                    targets: vec![(ctx, (t.dtype, t.weak))],
                    convert: differs && f.weak,
                    bad: differs && !f.weak,
                }
            }
            (AbsVal::Tuple(fs), AbsVal::Tuple(ts)) if fs.len() == ts.len() => Need::Tuple(
                fs.iter()
                    .zip(ts)
                    .map(|(f, t)| Need::of(ctx, f, t).unwrap_or(Need::Other))
                    .collect(),
            ),
            (AbsVal::Record(fs), AbsVal::Record(ts))
                if fs.len() == ts.len() && fs.iter().zip(ts).all(|(a, b)| a.0 == b.0) =>
            {
                Need::Record(
                    fs.iter()
                        .zip(ts)
                        .map(|((n, f), (_, t))| {
                            (n.clone(), Need::of(ctx, f, t).unwrap_or(Need::Other))
                        })
                        .collect(),
                )
            }
            _ => Need::Other,
        })
    }

    /// Both needs at once (two specialisations of one location).
    fn merge(self, other: Need) -> Need {
        match (self, other) {
            (
                Need::Leaf {
                    targets: mut a,
                    convert: ca,
                    bad: ba,
                },
                Need::Leaf {
                    targets: b,
                    convert: cb,
                    bad: bb,
                },
            ) => {
                a.extend(b);
                Need::Leaf {
                    targets: a,
                    convert: ca || cb,
                    bad: ba || bb,
                }
            }
            (Need::Tuple(a), Need::Tuple(b)) if a.len() == b.len() => {
                Need::Tuple(a.into_iter().zip(b).map(|(x, y)| x.merge(y)).collect())
            }
            (Need::Record(a), Need::Record(b))
                if a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.0 == y.0) =>
            {
                Need::Record(
                    a.into_iter()
                        .zip(b)
                        .map(|((n, x), (_, y))| (n, x.merge(y)))
                        .collect(),
                )
            }
            _ => Need::Other,
        }
    }
}

/// How one tensor is converted.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// To a type known statically.
    To(Target),
    /// To the dtype of a node that is strong and of the target dtype in
    /// every specialisation (a generic function's literal): `cast`.
    CastLike(NodeId),
    /// Promoted with a node that has the target type, weak or not, in
    /// every specialisation: `v - zeros_like(w)` (summed to a scalar when
    /// `w` may not be one), which keeps every value (and the sign of
    /// zero) and promotes as the join does.
    PromoteWith(NodeId, bool),
}

/// What [`convert`] does to a value.
#[derive(Clone, Debug)]
enum Plan {
    Keep,
    Leaf(Action),
    Tuple(Vec<Plan>),
    Record(Vec<(Arc<str>, Plan)>),
}

impl Plan {
    fn converts(&self) -> bool {
        match self {
            Plan::Keep => false,
            Plan::Leaf(_) => true,
            Plan::Tuple(items) => items.iter().any(Plan::converts),
            Plan::Record(fields) => fields.iter().any(|(_, p)| p.converts()),
        }
    }
}

/// A copy of `m` in which the weak values inference joined with other
/// types are converted to the joined type; `None` when there are none.
pub fn weak_joins(m: &Module, types: &Types) -> Option<Module> {
    let mut needs: HashMap<Site, Need> = HashMap::default();
    let mut add = |site: Site, need: Need| {
        let merged = match needs.remove(&site) {
            Some(old) => old.merge(need),
            None => need,
        };
        needs.insert(site, merged);
    };
    for (id, spec) in types.specs() {
        if !types.holds_for_every_call(spec.graph) {
            continue;
        }
        for (&site, callees) in &spec.calls {
            // Primitives that call graphs (`tree_map`) pass their own
            // arguments and shape their own results.
            if m.applied_prim(site).is_some() {
                continue;
            }
            let Some(joined) = spec.values.get(&site) else {
                continue;
            };
            let args = &m.inputs(site)[1..];
            for &c in callees {
                let callee = types.spec(c);
                let g = callee.graph;
                if !types.holds_for_every_call(g) {
                    continue;
                }
                if let Some(need) = Need::of(id, &callee.result, joined) {
                    add(Site::Output(g), need);
                }
                if args.len() != callee.args.len() {
                    continue;
                }
                for (j, (&a, param)) in args.iter().zip(&callee.args).enumerate() {
                    let value = match m.as_const(a) {
                        Some(k) => {
                            crate::vmgen::const_value(k).and_then(|v| AbsVal::from_value(&v))
                        }
                        None => spec.values.get(&a).cloned(),
                    };
                    if let Some(need) = value.and_then(|v| Need::of(id, &v, param)) {
                        add(Site::Arg(site, j), need);
                    }
                }
            }
        }
    }
    let mut sites: Vec<(Site, Need)> = needs.into_iter().collect();
    sites.sort_by_key(|(s, _)| *s);
    let users = graph_users(m);
    let mut plans = Vec::new();
    for (site, need) in sites {
        let home = match site {
            Site::Output(g) => match users.get(&g).map(Vec::as_slice) {
                Some(&[e]) => Some(e),
                _ => None,
            },
            Site::Arg(node, _) => m.node(node).graph,
        };
        let plan = plan(&need, types, m, home);
        if plan.converts() {
            plans.push((site, plan));
        }
    }
    if plans.is_empty() {
        return None;
    }
    let mut out = m.clone();
    for (site, plan) in plans {
        match site {
            Site::Output(g) => {
                let Some(o) = out.graph(g).output else {
                    continue;
                };
                let loc = out.node(o).loc;
                let new = convert(&mut out, g, o, &plan, loc);
                out.set_output(g, new);
            }
            Site::Arg(node, j) => {
                let Some(g) = out.node(node).graph else {
                    continue;
                };
                let a = out.inputs(node)[j + 1];
                let loc = out.node(a).loc;
                let new = convert(&mut out, g, a, &plan, loc);
                if let crate::ir::NodeKind::Apply(inputs) = &mut out.node_mut(node).kind {
                    inputs[j + 1] = new;
                }
            }
        }
    }
    Some(out)
}

/// For each graph, the graphs whose nodes name it (`@g`), without repeats.
fn graph_users(m: &Module) -> HashMap<GraphId, Vec<GraphId>> {
    let mut users: HashMap<GraphId, Vec<GraphId>> = HashMap::default();
    for node in &m.nodes {
        let (NodeKind::Apply(inputs), Some(owner)) = (&node.kind, node.graph) else {
            continue;
        };
        for &i in inputs {
            if let Some(g) = m.as_graph(i) {
                let list = users.entry(g).or_default();
                if !list.contains(&owner) {
                    list.push(owner);
                }
            }
        }
    }
    users
}

/// How to meet `need`. A leaf whose contexts all want one type is
/// converted to it; one whose contexts want different strong dtypes (a
/// generic function) is converted to the dtype of a witness: a parameter
/// or captured value of `home`, the graph of every context, that has the
/// wanted dtype in each.
fn plan(need: &Need, types: &Types, m: &Module, home: Option<GraphId>) -> Plan {
    match need {
        Need::Leaf {
            targets,
            convert: true,
            bad: false,
        } => {
            let first = targets[0].1;
            if targets.iter().all(|(_, t)| *t == first) {
                return Plan::Leaf(Action::To(first));
            }
            witness(targets, types, m, home).map_or(Plan::Keep, Plan::Leaf)
        }
        Need::Leaf { .. } | Need::Other => Plan::Keep,
        Need::Tuple(items) => Plan::Tuple(items.iter().map(|n| plan(n, types, m, home)).collect()),
        Need::Record(fields) => Plan::Record(
            fields
                .iter()
                .map(|(name, n)| (name.clone(), plan(n, types, m, home)))
                .collect(),
        ),
    }
}

/// A node of graph `home` (a parameter) or captured by it whose type in
/// each context of `targets` is the target: with the target dtype and
/// strong in every one ([`Action::CastLike`]), or else with the target
/// dtype and weakness ([`Action::PromoteWith`], a scalar preferred).
fn witness(
    targets: &[(SpecId, Target)],
    types: &Types,
    m: &Module,
    home: Option<GraphId>,
) -> Option<Action> {
    let home = home?;
    let mut want: HashMap<SpecId, Target> = HashMap::default();
    for &(ctx, target) in targets {
        if types.spec(ctx).graph != home || *want.entry(ctx).or_insert(target) != target {
            return None;
        }
    }
    let (&first, _) = want.iter().next()?;
    let mut candidates: Vec<NodeId> = types
        .spec(first)
        .values
        .keys()
        .copied()
        .filter(|&n| !matches!(m.node(n).kind, NodeKind::Apply(_)) || m.node(n).graph != Some(home))
        .collect();
    candidates.sort();
    let fits = |n: NodeId, scalar: bool| {
        want.iter().all(|(ctx, (dtype, weak))| {
            matches!(types.spec(*ctx).values.get(&n), Some(AbsVal::Tensor(t))
                if t.dtype == *dtype
                    && t.weak == *weak
                    && (!scalar || t.shape.is_empty()))
        })
    };
    if want.values().all(|(_, weak)| !weak) {
        if let Some(&w) = candidates.iter().find(|&&n| fits(n, false)) {
            return Some(Action::CastLike(w));
        }
    }
    if let Some(&w) = candidates.iter().find(|&&n| fits(n, true)) {
        return Some(Action::PromoteWith(w, true));
    }
    candidates
        .into_iter()
        .find(|&n| fits(n, false))
        .map(|w| Action::PromoteWith(w, false))
}

/// Node `v` of (or seen from) graph `g` converted as `plan` says.
fn convert(m: &mut Module, g: GraphId, v: NodeId, plan: &Plan, loc: Loc) -> NodeId {
    if !plan.converts() {
        return v;
    }
    match plan {
        Plan::Leaf(Action::To((dtype, weak))) => convert_leaf(m, g, v, *dtype, *weak, loc),
        Plan::Leaf(Action::CastLike(w)) => {
            let d = m.add_prim(g, Prim::DTypeOf, &[*w], loc);
            m.add_prim(g, Prim::Cast, &[v, d], loc)
        }
        Plan::Leaf(Action::PromoteWith(w, scalar)) => {
            let mut zero = m.add_prim(g, Prim::ZerosLike, &[*w], loc);
            if !*scalar {
                let all = m.add_const(Const::Unit, loc);
                let keep = m.add_const(Const::Bool(false), loc);
                zero = m.add_prim(g, Prim::Sum, &[zero, all, keep], loc);
            }
            m.add_prim(g, Prim::Sub, &[v, zero], loc)
        }
        Plan::Tuple(items) => {
            let parts: Vec<NodeId> = match m.applied_prim(v) {
                Some(Prim::MakeTuple) if m.inputs(v).len() == items.len() + 1 => {
                    m.inputs(v)[1..].to_vec()
                }
                _ => (0..items.len())
                    .map(|i| {
                        let k = m.add_const(Const::Int(i as i64), loc);
                        m.add_prim(g, Prim::TupleGet, &[v, k], loc)
                    })
                    .collect(),
            };
            let parts: Vec<NodeId> = parts
                .into_iter()
                .zip(items)
                .map(|(p, n)| convert(m, g, p, n, loc))
                .collect();
            m.add_prim(g, Prim::MakeTuple, &parts, loc)
        }
        Plan::Record(fields) => {
            let mut args = Vec::with_capacity(2 * fields.len());
            for (name, n) in fields {
                let key = m.add_const(Const::Str(name.clone()), loc);
                let part = m.add_prim(g, Prim::RecordGet, &[v, key], loc);
                let part = convert(m, g, part, n, loc);
                let key = m.add_const(Const::Str(name.clone()), loc);
                args.extend([key, part]);
            }
            m.add_prim(g, Prim::MakeRecord, &args, loc)
        }
        Plan::Keep => v,
    }
}

/// A tensor node converted to `dtype` (weak or not): a literal becomes a
/// literal; another value is cast (to a strong dtype) or, for a weak int
/// read as a weak float, added to `0.0` (which keeps it weak).
fn convert_leaf(
    m: &mut Module,
    g: GraphId,
    v: NodeId,
    dtype: DType,
    weak: bool,
    loc: Loc,
) -> NodeId {
    if let Some(Value::Tensor(t)) = m.as_const(v).and_then(crate::vmgen::const_value) {
        let t: Tensor = t.cast(dtype).with_weak(weak);
        let c = match (weak, dtype, t.len()) {
            (true, DType::F64, 1) if t.shape().is_empty() => Const::Float(t.as_f64_vec()[0]),
            _ => Const::Tensor(t),
        };
        return m.add_const(c, loc);
    }
    if !weak {
        let d = m.add_const(Const::DType(dtype), loc);
        return m.add_prim(g, Prim::Cast, &[v, d], loc);
    }
    if dtype == DType::F64 {
        let zero = m.add_const(Const::Float(0.0), loc);
        return m.add_prim(g, Prim::Add, &[v, zero], loc);
    }
    v
}
