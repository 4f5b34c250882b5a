//! Fusion: chains of element-wise primitives over float tensors of one
//! static shape, optionally ended by one reduction, become one compiled
//! kernel ([`crate::codegen::kernel::KernelSpec`], compiled by the CPU back
//! end).
//!
//! The pass reads the optimised module and the types inference gives it;
//! it does not change the IR. Its result, a [`Plan`], tells the VM compiler
//! ([`crate::exec`]) which nodes a native kernel computes: the members of
//! a group are not run one by one; one `Native` instruction computes the
//! group's outputs (the members used outside it) from its inputs.
//!
//! A node joins the group of one of its operands when it is element-wise,
//! has the same shape and float dtype, and none of its other operands
//! depends on that group (which would make a cycle). Operands from
//! outside a group are kernel inputs, read with broadcast strides; weak
//! literal scalars are constants of the kernel. A reduction (`sum`, `max`,
//! `min`, `prod`) of a group's only result closes the group. Groups over
//! fewer than [`MIN_ELEMENTS`] elements are left to the reference kernels:
//! for small tensors a call costs more than it saves.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use adjoint_runtime::error::RtError;
use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;

use crate::codegen::cpu::{compile_cached, CompiledKernel};
use crate::codegen::kernel::{
    BinaryOp, InputSpec, KDType, KExpr, KId, KernelSpec, ReduceOp, ReduceSpec, UnaryOp,
};
use crate::infer::{AbsVal, Types};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs};
use crate::ir::{Const, GraphId, Module, NodeId};
use crate::prim::Prim;

/// Groups smaller than this many elements are not compiled.
pub const MIN_ELEMENTS: usize = 4096;

/// One compiled group.
pub struct Group {
    pub graph: GraphId,
    pub graph_name: String,
    /// The nodes the kernel computes, in body order.
    pub members: Vec<NodeId>,
    /// Values read by the kernel, in the kernel's input order.
    pub inputs: Vec<NodeId>,
    /// Members used outside the group, in the kernel's output order.
    pub outputs: Vec<NodeId>,
    pub kernel: Arc<FusedKernel>,
}

/// What fusion decided for a module.
#[derive(Default)]
pub struct Plan {
    pub groups: Vec<Group>,
    /// Member node → its group's index.
    pub member_of: HashMap<NodeId, usize>,
}

impl Plan {
    /// A summary per group, for `--stats` and tests.
    pub fn describe(&self) -> Vec<String> {
        self.groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let spec = g.kernel.kernel.spec();
                format!(
                    "kernel {i} in @{}: {} over {:?} {}{}: {} inputs, {} outputs",
                    g.graph_name,
                    g.kernel.name,
                    spec.shape,
                    spec.dtype.name(),
                    spec.reduce
                        .as_ref()
                        .map(|r| format!(", then {} over {:?}", r.op.name(), r.axes))
                        .unwrap_or_default(),
                    g.inputs.len(),
                    g.outputs.len()
                )
            })
            .collect()
    }
}

/// A compiled kernel as the VM sees it: it checks and converts its
/// arguments and wraps its results as tensors.
pub struct FusedKernel {
    kernel: Arc<CompiledKernel>,
    name: String,
    /// The shape and dtype each input must have.
    input_types: Vec<(Vec<usize>, DType)>,
    dtype: DType,
    out_shape: Vec<usize>,
    n_outputs: usize,
}

impl NativeKernel for FusedKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: &[Value]) -> Result<Value, RtError> {
        if args.len() != self.input_types.len() {
            return Err(RtError::internal(format!(
                "{}: expected {} inputs, got {}",
                self.name,
                self.input_types.len(),
                args.len()
            )));
        }
        let mut owned: Vec<Tensor> = Vec::with_capacity(args.len());
        for (a, (shape, _)) in args.iter().zip(&self.input_types) {
            let Value::Tensor(t) = a else {
                return Err(RtError::internal(format!(
                    "{}: expected a tensor, got {}",
                    self.name,
                    a.kind()
                )));
            };
            if t.shape() != shape.as_slice() {
                return Err(RtError::internal(format!(
                    "{}: an input has shape {:?}, the kernel was compiled for {:?}",
                    self.name,
                    t.shape(),
                    shape
                )));
            }
            owned.push(if t.dtype() == self.dtype {
                t.clone()
            } else {
                t.cast(self.dtype)
            });
        }
        let n = self.out_shape.iter().product::<usize>();
        let outs: Vec<Tensor> = match self.dtype {
            DType::F32 => self.run::<f32>(&owned, n)?,
            _ => self.run::<f64>(&owned, n)?,
        };
        Ok(if self.n_outputs == 1 {
            Value::Tensor(outs.into_iter().next().expect("one output"))
        } else {
            Value::tuple(outs.into_iter().map(Value::Tensor).collect())
        })
    }
}

impl FusedKernel {
    fn run<T>(&self, inputs: &[Tensor], n: usize) -> Result<Vec<Tensor>, RtError>
    where
        T: crate::codegen::cpu::KernelElem + adjoint_runtime::tensor::Element + Default,
    {
        let ins: Vec<&[T]> = inputs
            .iter()
            .map(|t| {
                t.slice::<T>()
                    .ok_or_else(|| RtError::internal("fused kernel: bad buffer"))
            })
            .collect::<Result<_, _>>()?;
        let mut bufs: Vec<Vec<T>> = (0..self.n_outputs).map(|_| vec![T::default(); n]).collect();
        {
            let mut outs: Vec<&mut [T]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            self.kernel
                .run(&ins, &mut outs)
                .map_err(|e| RtError::internal(format!("{}: {e}", self.name)))?;
        }
        bufs.into_iter()
            .map(|b| Tensor::from_vec(b, &self.out_shape))
            .collect()
    }
}

/// The static tensor type of `n`, if inference gives one.
fn tensor_type(types: &Types, n: NodeId) -> Option<(Vec<usize>, DType, bool)> {
    match types.value_of(n)? {
        AbsVal::Tensor(t) => Some((t.shape.clone(), t.dtype, t.weak)),
        _ => None,
    }
}

fn kdtype(d: DType) -> Option<KDType> {
    match d {
        DType::F32 => Some(KDType::F32),
        DType::F64 => Some(KDType::F64),
        _ => None,
    }
}

/// How a primitive maps to a kernel expression.
enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
}

fn op_of(p: Prim) -> Option<Op> {
    if p == Prim::Where {
        return Some(Op::Select);
    }
    if let Some(u) = UnaryOp::from_name(p.name()) {
        return Some(Op::Unary(u));
    }
    BinaryOp::from_name(p.name()).map(Op::Binary)
}

fn reduce_of(p: Prim) -> Option<ReduceOp> {
    match p {
        Prim::Sum => Some(ReduceOp::Sum),
        Prim::Max => Some(ReduceOp::Max),
        Prim::Min => Some(ReduceOp::Min),
        Prim::Prod => Some(ReduceOp::Prod),
        _ => None,
    }
}

/// A group while it is being formed.
struct Forming {
    graph: GraphId,
    members: Vec<NodeId>,
    shape: Vec<usize>,
    dtype: DType,
    reduce: Option<NodeId>,
}

/// Decides the groups of the graphs reachable from `roots` and compiles
/// their kernels. A group whose kernel does not compile is left out.
pub fn plan(m: &Module, roots: &[GraphId], types: &Types) -> Plan {
    let fv = free_variables(m);
    let graphs = reachable_graphs(m, roots);
    // Uses of every node: applications, graph outputs, captures.
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    let mut escapes: HashSet<NodeId> = HashSet::new();
    for g in &graphs {
        for n in graph_body_with(m, *g, &fv) {
            for &i in m.inputs(n) {
                users.entry(i).or_default().push(n);
            }
        }
        if let Some(o) = m.graph(*g).output {
            escapes.insert(o);
        }
        escapes.extend(fv.get(*g).iter().copied());
    }

    let mut plan = Plan::default();
    for g in &graphs {
        let body = graph_body_with(m, *g, &fv);
        let mut forming: Vec<Forming> = Vec::new();
        // Union-find over group ids: merged groups point to the survivor.
        let mut parent: Vec<usize> = Vec::new();
        let mut group_of: HashMap<NodeId, usize> = HashMap::new();
        // The groups each node depends on through nodes outside them.
        let mut depends: HashMap<NodeId, HashSet<usize>> = HashMap::new();
        for &n in &body {
            let ins = &m.inputs(n)[1..];
            let gview: HashMap<NodeId, usize> = ins
                .iter()
                .filter_map(|i| group_of.get(i).map(|g| (*i, find(&parent, *g))))
                .collect();
            let joined = joinable(
                m, types, n, ins, &gview, &depends, &parent, &forming, &users, &escapes,
            );
            if let Some(gi) = joined {
                // Operands in other groups of the same kind merge in, when
                // that makes no cycle.
                let p = m.applied_prim(n).expect("a primitive");
                if reduce_of(p).is_none() {
                    for o in ins {
                        let Some(&gj) = gview.get(o) else { continue };
                        let gj = find(&parent, gj);
                        let gi = find(&parent, gi);
                        if gj == gi
                            || forming[gj].reduce.is_some()
                            || forming[gj].shape != forming[gi].shape
                            || forming[gj].dtype != forming[gi].dtype
                        {
                            continue;
                        }
                        let cross = |a: usize, b: usize| {
                            forming[a].members.iter().any(|mbr| {
                                m.inputs(*mbr)[1..].iter().any(|x| {
                                    group_of.get(x).map(|g| find(&parent, *g)) != Some(a)
                                        && depends.get(x).is_some_and(|d| {
                                            d.iter().any(|g| find(&parent, *g) == b)
                                        })
                                })
                            })
                        };
                        if cross(gi, gj) || cross(gj, gi) {
                            continue;
                        }
                        let moved = std::mem::take(&mut forming[gj].members);
                        forming[gi].members.extend(moved);
                        parent[gj] = gi;
                    }
                }
                let gi = find(&parent, gi);
                forming[gi].members.push(n);
                if reduce_of(p).is_some() {
                    forming[gi].reduce = Some(n);
                }
                group_of.insert(n, gi);
            } else if let Some((shape, dtype)) = starts_group(m, types, n) {
                forming.push(Forming {
                    graph: *g,
                    members: vec![n],
                    shape,
                    dtype,
                    reduce: None,
                });
                parent.push(forming.len() - 1);
                let gi = forming.len() - 1;
                if reduce_of(m.applied_prim(n).expect("a primitive")).is_some() {
                    forming[gi].reduce = Some(n);
                }
                group_of.insert(n, gi);
            }
            let mut dep: HashSet<usize> = HashSet::new();
            for i in ins {
                if let Some(d) = depends.get(i) {
                    dep.extend(d.iter().map(|g| find(&parent, *g)));
                }
                if let Some(gi) = group_of.get(i) {
                    dep.insert(find(&parent, *gi));
                }
            }
            if let Some(gi) = group_of.get(&n) {
                dep.remove(&find(&parent, *gi));
            }
            depends.insert(n, dep);
        }
        let pos: HashMap<NodeId, usize> = body.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        for f in &mut forming {
            f.members.sort_by_key(|n| pos[n]);
        }
        for f in forming {
            if f.members.is_empty() {
                continue;
            }
            if let Some(group) = build(m, types, f, &users, &escapes) {
                let gi = plan.groups.len();
                for &mbr in &group.members {
                    plan.member_of.insert(mbr, gi);
                }
                plan.groups.push(group);
            }
        }
    }
    plan
}

/// Whether `n` can start a group: an element-wise operation (or a
/// reduction) producing a float tensor of a static shape.
fn starts_group(m: &Module, types: &Types, n: NodeId) -> Option<(Vec<usize>, DType)> {
    let p = m.applied_prim(n)?;
    let ins = &m.inputs(n)[1..];
    if let Some(_r) = reduce_of(p) {
        let (shape, dtype, _) = tensor_type(types, ins[0])?;
        kdtype(dtype)?;
        return Some((shape, dtype));
    }
    let op = op_of(p)?;
    let (shape, dtype, _) = tensor_type(types, n)?;
    let dtype = match op {
        // A comparison is computed in its operands' dtype.
        Op::Binary(b) if b.is_comparison() => tensor_type(types, ins[0])?.1,
        // The condition of a select must come from inside the group.
        Op::Select => return None,
        _ => dtype,
    };
    kdtype(dtype)?;
    if shape.is_empty() {
        return None;
    }
    Some((shape, dtype))
}

fn find(parent: &[usize], mut g: usize) -> usize {
    while parent[g] != g {
        g = parent[g];
    }
    g
}

/// The group `n` may join, if any (`group_of` maps its operands to their
/// groups' current ids).
#[allow(clippy::too_many_arguments)]
fn joinable(
    m: &Module,
    types: &Types,
    n: NodeId,
    ins: &[NodeId],
    group_of: &HashMap<NodeId, usize>,
    depends: &HashMap<NodeId, HashSet<usize>>,
    parent: &[usize],
    forming: &[Forming],
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
) -> Option<usize> {
    let p = m.applied_prim(n)?;
    let is_reduce = reduce_of(p).is_some();
    if !is_reduce {
        op_of(p)?;
    }
    let (shape, dtype, _) = tensor_type(types, n)?;
    for (k, i) in ins.iter().enumerate() {
        let Some(&gi) = group_of.get(i) else {
            continue;
        };
        let f = &forming[gi];
        if f.reduce.is_some() {
            continue;
        }
        if is_reduce {
            // Only the first operand is reduced; axes and keepdims are
            // constants.
            if k != 0 || f.dtype != tensor_type(types, *i)?.1 {
                continue;
            }
            // The reduced value must be the group's only result.
            let only = f.members.iter().all(|mbr| {
                !escapes.contains(mbr)
                    && users.get(mbr).is_none_or(|us| {
                        us.iter()
                            .all(|u| *u == n || group_of_any(*u, forming, parent) == Some(gi))
                    })
            });
            if !only {
                continue;
            }
        } else {
            let compute = match op_of(p)? {
                Op::Binary(b) if b.is_comparison() => tensor_type(types, ins[0])?.1,
                _ => dtype,
            };
            if shape != f.shape || compute != f.dtype {
                continue;
            }
            if matches!(op_of(p)?, Op::Select) && group_of.get(&ins[0]) != Some(&gi) {
                continue;
            }
        }
        // No other operand may depend on this group.
        let cycle = ins.iter().any(|o| {
            group_of.get(o) != Some(&gi)
                && depends
                    .get(o)
                    .is_some_and(|d| d.iter().any(|g| find(parent, *g) == gi))
        });
        if cycle {
            continue;
        }
        // Other operands must be readable as inputs.
        let ok = ins.iter().enumerate().all(|(j, o)| {
            if group_of.get(o) == Some(&gi) || (is_reduce && j > 0) {
                return true;
            }
            input_ok(m, types, *o, &f.shape, f.dtype)
        });
        if ok {
            return Some(gi);
        }
    }
    None
}

/// The group a node belongs to, looked up in the members lists.
fn group_of_any(n: NodeId, forming: &[Forming], parent: &[usize]) -> Option<usize> {
    forming
        .iter()
        .position(|f| f.members.contains(&n))
        .map(|g| find(parent, g))
}

/// Whether `o` can be read by a kernel over `shape` in `dtype`.
fn input_ok(m: &Module, types: &Types, o: NodeId, shape: &[usize], dtype: DType) -> bool {
    if matches!(m.as_const(o), Some(Const::Float(_) | Const::Int(_))) {
        return true;
    }
    match tensor_type(types, o) {
        Some((s, d, weak)) => {
            (d == dtype || (weak && d.is_numeric())) && InputSpec::broadcast(&s, shape).is_some()
        }
        None => false,
    }
}

/// Builds and compiles the kernel of a formed group.
fn build(
    m: &Module,
    types: &Types,
    f: Forming,
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
) -> Option<Group> {
    if f.shape.iter().product::<usize>() < MIN_ELEMENTS {
        return None;
    }
    let members: HashSet<NodeId> = f.members.iter().copied().collect();
    let mut body: Vec<KExpr> = Vec::new();
    let mut id_of: HashMap<NodeId, KId> = HashMap::new();
    let mut inputs: Vec<NodeId> = Vec::new();
    let mut input_specs: Vec<InputSpec> = Vec::new();
    let mut input_types: Vec<(Vec<usize>, DType)> = Vec::new();
    let push = |body: &mut Vec<KExpr>, e: KExpr| -> KId {
        body.push(e);
        KId(body.len() as u32 - 1)
    };
    let mut reduce = None;
    for &n in &f.members {
        let p = m.applied_prim(n)?;
        let ins = &m.inputs(n)[1..];
        let mut operand = |o: NodeId, body: &mut Vec<KExpr>| -> Option<KId> {
            if let Some(id) = id_of.get(&o) {
                return Some(*id);
            }
            match m.as_const(o) {
                Some(Const::Float(x)) => return Some(push(body, KExpr::Const(*x))),
                Some(Const::Int(x)) => return Some(push(body, KExpr::Const(*x as f64))),
                _ => {}
            }
            let (s, d, _) = tensor_type(types, o)?;
            let spec = InputSpec::broadcast(&s, &f.shape)?;
            inputs.push(o);
            input_specs.push(spec);
            input_types.push((s, d));
            let id = push(body, KExpr::Input(inputs.len() - 1));
            id_of.insert(o, id);
            Some(id)
        };
        if let Some(op) = reduce_of(p) {
            let x = operand(ins[0], &mut body)?;
            id_of.insert(n, x);
            let rank = f.shape.len();
            let axes: Vec<usize> = match m.as_const(ins[1]) {
                Some(Const::Unit) => (0..rank).collect(),
                Some(Const::Int(a)) => vec![norm_axis(*a, rank)?],
                _ if m.applied_prim(ins[1]) == Some(Prim::MakeTuple) => m.inputs(ins[1])[1..]
                    .iter()
                    .map(|a| match m.as_const(*a) {
                        Some(Const::Int(a)) => norm_axis(*a, rank),
                        _ => None,
                    })
                    .collect::<Option<_>>()?,
                _ => return None,
            };
            let keepdims = match m.as_const(ins[2]) {
                Some(Const::Bool(b)) => *b,
                _ => return None,
            };
            reduce = Some((n, ReduceSpec { op, axes, keepdims }));
            continue;
        }
        let e = match op_of(p)? {
            Op::Unary(u) => KExpr::Unary(u, operand(ins[0], &mut body)?),
            Op::Binary(b) => {
                let a = operand(ins[0], &mut body)?;
                let c = operand(ins[1], &mut body)?;
                KExpr::Binary(b, a, c)
            }
            Op::Select => {
                let c = operand(ins[0], &mut body)?;
                let a = operand(ins[1], &mut body)?;
                let b = operand(ins[2], &mut body)?;
                KExpr::Select(c, a, b)
            }
        };
        let id = push(&mut body, e);
        id_of.insert(n, id);
    }
    // Outputs: members used outside the group. They must be tensors of
    // the kernel's dtype (a comparison's bool result cannot leave).
    let mut outputs = Vec::new();
    let mut out_ids = Vec::new();
    let out_shape;
    let spec_reduce;
    if let Some((r, rs)) = reduce {
        // The reduced value must be the group's only result.
        for &n in &f.members {
            if n == r {
                continue;
            }
            let outside = escapes.contains(&n)
                || users
                    .get(&n)
                    .is_some_and(|us| us.iter().any(|u| !members.contains(u)));
            if outside {
                return None;
            }
        }
        let (s, d, _) = tensor_type(types, r)?;
        if d != f.dtype {
            return None;
        }
        outputs.push(r);
        out_ids.push(id_of[&r]);
        out_shape = s;
        spec_reduce = Some(rs);
    } else {
        for &n in &f.members {
            let outside = escapes.contains(&n)
                || users
                    .get(&n)
                    .is_some_and(|us| us.iter().any(|u| !members.contains(u)));
            if outside {
                let (_, d, _) = tensor_type(types, n)?;
                if d != f.dtype {
                    return None;
                }
                outputs.push(n);
                out_ids.push(id_of[&n]);
            }
        }
        out_shape = f.shape.clone();
        spec_reduce = None;
    }
    if outputs.is_empty() {
        return None;
    }
    let spec = KernelSpec {
        dtype: kdtype(f.dtype)?,
        shape: f.shape.clone(),
        inputs: input_specs,
        body,
        outputs: out_ids,
        reduce: spec_reduce,
    };
    let kernel = compile_cached(&spec).ok()?;
    let names: Vec<&str> = f
        .members
        .iter()
        .filter_map(|n| m.applied_prim(*n).map(|p| p.name()))
        .collect();
    Some(Group {
        graph: f.graph,
        graph_name: m.graph(f.graph).name.clone(),
        members: f.members,
        inputs,
        outputs: outputs.clone(),
        kernel: Arc::new(FusedKernel {
            kernel,
            name: format!("fused[{}]", names.join(",")),
            input_types,
            dtype: f.dtype,
            out_shape,
            n_outputs: outputs.len(),
        }),
    })
}

fn norm_axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}
