//! Fusion: chains of element-wise primitives over float tensors of one
//! static shape, optionally ended by one reduction, become one compiled
//! kernel ([`crate::codegen::kernel::KernelSpec`], compiled by the CPU back
//! end).
//!
//! The pass reads the optimised module and the types inference gives it;
//! it does not change the IR. Its result, a [`Plan`], tells the VM compiler
//! ([`crate::vmgen`]) which nodes a native kernel computes: the members of
//! a group are not run one by one; one `Native` instruction computes the
//! group's outputs (the members used outside it) from its inputs.
//!
//! A node joins the group of one of its operands when it is element-wise,
//! has the same shape and float dtype, and none of its other operands
//! depends on that group (which would make a cycle). Operands from
//! outside a group are kernel inputs, read with broadcast strides; weak
//! literal scalars are constants of the kernel. A reduction (`sum`, `max`,
//! `min`, `prod`, `sum_to`) of a group's member closes the group; members
//! used outside it are then the reduction's side outputs, written
//! unreduced by the same kernel (not beside a reduction to one element,
//! nor in a group running 256-bit routines, which only maps run). Groups over
//! fewer than [`MIN_ELEMENTS`] elements with fewer than
//! [`MIN_SMALL_MEMBERS`] members are left to the reference kernels: for
//! small tensors one call costs about what it saves.
//!
//! A kernel may also *recompute* a node from outside the group instead of
//! reading its value: the comparison that is a `where`'s condition (a bool
//! tensor cannot be a kernel input; the kernel compares the comparison's
//! operands itself), `zeros_like` / `ones_like` (constants), and views
//! (`broadcast_to`, `reshape`, `expand_dims`, `squeeze`: read from the
//! viewed tensor's buffer through strides). Matrix products of a
//! transpose in the same graph ([`matmul`]) are groups too, and recompute
//! the transpose by reading its operand in place. A recomputed node that
//! nothing else uses is *absorbed*: exec does not emit it.

pub mod epilogue;
pub mod form;
pub(crate) mod lanes;
pub mod matmul;
pub mod order;
mod reverse;
pub(crate) use reverse::{loop_test, steps_by_one, threads_stack};
pub mod regions;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use adjoint_runtime::error::RtError;
use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;

use crate::codegen::cpu::CompiledKernel;
use crate::codegen::kernel::{
    BinaryOp, InputSpec, KDType, KExpr, KId, KernelSpec, ReduceOp, ReduceSpec, UnaryOp,
};
use crate::infer::{AbsVal, Types};
use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs, FreeVars};
use crate::ir::{Const, GraphId, Module, NodeId};
use crate::prim::Prim;

/// Groups smaller than this many elements are compiled only when they
/// have at least [`MIN_SMALL_MEMBERS`] members.
pub const MIN_ELEMENTS: usize = 4096;

/// The fewest members a group over fewer than [`MIN_ELEMENTS`] elements
/// needs to be compiled. On small tensors a kernel call costs about what
/// a reference kernel does (measured: one `mul` over 16–256 f32 in a
/// loop, 0.2 µs a step slower; two operations, even), so a kernel pays
/// when it replaces three or more calls and the tensors between them (a
/// 3000-step loop of `tanh(y) * 0.9 + exp(-y * y) * 0.1` over 1000 f32:
/// 36 ms to 11 ms).
pub const MIN_SMALL_MEMBERS: usize = 3;

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
    /// Nodes outside the group that the kernel computes itself from their
    /// operands (which are among `inputs`) instead of reading them.
    pub recomputed: Vec<NodeId>,
    pub kernel: Arc<dyn NativeKernel>,
    /// What the kernel does, for `--stage kernels`.
    pub description: String,
    /// The kernel in device-independent form (what other back ends
    /// compile: `codegen::cuda::retarget`).
    pub form: form::KernelForm,
    /// A call the VM makes with the kernel's results, whose result is the
    /// group's output (a loop compiled up to its exit: [`scalar`]).
    pub then: Option<Continuation>,
    /// The nodes whose operations may stop the kernel with an error of
    /// their own (an integer division by zero in a native loop); the
    /// kernel's errors name them by index ([`RtError::site`]).
    pub sites: Vec<NodeId>,
}

/// The call that follows a kernel: `callee(args..)`.
#[derive(Clone, Debug)]
pub struct Continuation {
    /// A graph constant node (its closure is made where the group runs).
    pub callee: NodeId,
    pub args: Vec<ContArg>,
}

/// An argument of a [`Continuation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContArg {
    /// A value of the graph the group runs in.
    Node(NodeId),
    /// Element `k` of the kernel's result (a tuple).
    Result(usize),
}

/// What fusion decided for a module.
#[derive(Default)]
pub struct Plan {
    pub groups: Vec<Group>,
    /// Member node → its group's index.
    pub member_of: HashMap<NodeId, usize>,
    /// Recomputed nodes used by nothing but the groups that recompute
    /// them: not computed on their own.
    pub absorbed: HashSet<NodeId>,
    /// Run after every `load_npy` with its result and path: checks the
    /// data has the type the program was specialised to.
    pub load_check: Option<Arc<dyn NativeKernel>>,
}

impl Plan {
    /// A summary per group, for `--stats` and tests.
    pub fn describe(&self) -> Vec<String> {
        self.groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut line = format!("kernel {i} in @{}: {}", g.graph_name, g.description);
                // A loop over scalars: its functions, indented.
                if let form::KernelForm::Scalar(p) = &g.form {
                    for l in p.to_string().lines() {
                        line.push_str("\n    ");
                        line.push_str(l);
                    }
                }
                line
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
    /// The shape of each output (a reduction's side outputs have the
    /// iteration shape).
    out_shapes: Vec<Vec<usize>>,
    /// Which outputs are weakly typed (a tensor literal's descendants,
    /// which adopt the dtype of a strong operand later, as in eager mode).
    out_weak: Vec<bool>,
}

/// The error of a kernel called with the wrong number of inputs.
pub(crate) fn check_arity(name: &str, expected: usize, got: usize) -> Result<(), RtError> {
    if expected == got {
        return Ok(());
    }
    Err(RtError::internal(format!(
        "{name}: expected {expected} inputs, got {got}"
    )))
}

impl NativeKernel for FusedKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        check_arity(&self.name, self.input_types.len(), args.len())?;
        let mut owned: Vec<Tensor> = Vec::with_capacity(args.len());
        for (a, (shape, _)) in args.into_iter().zip(&self.input_types) {
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
                t
            } else {
                t.cast(self.dtype)
            });
        }
        let outs: Vec<Tensor> = match self.dtype {
            DType::F32 => self.run::<f32>(owned)?,
            _ => self.run::<f64>(owned)?,
        };
        let mut outs = outs
            .into_iter()
            .zip(&self.out_weak)
            .map(|(t, &weak)| Value::Tensor(if weak { t.with_weak(true) } else { t }));
        Ok(if self.out_shapes.len() == 1 {
            outs.next().expect("one output")
        } else {
            Value::tuple(outs.collect())
        })
    }
}

impl FusedKernel {
    fn run<T>(&self, mut inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RtError>
    where
        T: crate::codegen::cpu::KernelElem + adjoint_runtime::tensor::Element + Default,
    {
        let fail =
            |e: crate::codegen::cpu::CodegenError| RtError::internal(format!("{}: {e}", self.name));
        let map = self.kernel.spec().reduce.is_none();
        let lens: Vec<usize> = self.out_shapes.iter().map(|s| s.iter().product()).collect();
        let n = lens[0];
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // An input that dies here, read at the output's own index and as
        // long as the output: the first output is written over it.
        let mut reused: Option<(usize, Vec<T>)> = None;
        if map && n > 0 {
            for (i, input) in inputs.iter_mut().enumerate() {
                if input.len() != n || !self.kernel.reads_in_place(i) {
                    continue;
                }
                let t = std::mem::replace(input, Tensor::scalar_f64(0.0));
                match t.into_vec::<T>() {
                    Ok(v) => {
                        reused = Some((i, v));
                        IN_PLACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                    Err(t) => *input = t,
                }
            }
        }
        let ins: Vec<&[T]> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| match &reused {
                Some((a, _)) if *a == i => Ok(&[][..]),
                _ => t
                    .slice::<T>()
                    .ok_or_else(|| RtError::internal("fused kernel: bad buffer")),
            })
            .collect::<Result<_, _>>()?;
        let bufs: Vec<Vec<T>> = if !self.kernel.reduces_to_one() {
            // The kernel writes every output element: no need to fill the
            // buffers first.
            let first = usize::from(reused.is_some());
            let mut bufs: Vec<Vec<T>> = lens[first..]
                .iter()
                .map(|&len| Vec::with_capacity(len))
                .collect();
            {
                let mut outs: Vec<&mut [std::mem::MaybeUninit<T>]> = bufs
                    .iter_mut()
                    .zip(&lens[first..])
                    .map(|(b, &len)| &mut b.spare_capacity_mut()[..len])
                    .collect();
                match reused.as_mut() {
                    Some((a, buf)) => self
                        .kernel
                        .run_in_place(&ins, *a, buf, &mut outs)
                        .map_err(fail)?,
                    None => self.kernel.run_uninit(&ins, &mut outs).map_err(fail)?,
                }
            }
            for (b, &len) in bufs.iter_mut().zip(&lens[first..]) {
                // SAFETY: the kernel succeeded, so it wrote all `len`
                // elements of every output.
                unsafe { b.set_len(len) };
            }
            if let Some((_, buf)) = reused {
                bufs.insert(0, buf);
            }
            bufs
        } else {
            let mut bufs: Vec<Vec<T>> = lens.iter().map(|&len| vec![T::default(); len]).collect();
            let mut outs: Vec<&mut [T]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            self.kernel.run(&ins, &mut outs).map_err(fail)?;
            bufs
        };
        bufs.into_iter()
            .zip(&self.out_shapes)
            .map(|(b, s)| Tensor::from_vec(b, s))
            .collect()
    }
}

static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static IN_PLACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Calls of fused kernels in this process so far, and how many of them
/// wrote their result over an input that died there.
pub fn kernel_calls() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (CALLS.load(Relaxed), IN_PLACE.load(Relaxed))
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
    if let Some(u) = UnaryOp::of_prim(p) {
        return Some(Op::Unary(u));
    }
    BinaryOp::of_prim(p).map(Op::Binary)
}

fn reduce_of(p: Prim) -> Option<ReduceOp> {
    match p {
        // sum_to(x, like): a sum over the axes broadcasting added or
        // stretched (from the static shapes).
        Prim::Sum | Prim::SumTo => Some(ReduceOp::Sum),
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
/// Element-wise groups need the module's types; without them only the
/// matrix products of transposes are planned.
pub fn plan(
    m: &Module,
    roots: &[GraphId],
    types: Option<&Types>,
    opts: &crate::options::CompilerOptions,
) -> Plan {
    let fv = free_variables(m);
    let graphs = reachable_graphs(m, roots);
    let bodies: HashMap<GraphId, Vec<NodeId>> = graphs
        .iter()
        .map(|g| (*g, graph_body_with(m, *g, &fv)))
        .collect();
    // Uses of every node: applications, graph outputs, captures.
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    let mut escapes: HashSet<NodeId> = HashSet::new();
    for g in &graphs {
        for &n in &bodies[g] {
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
    // Values with lanes (vmap) run as batched primitives, not as kernels
    // compiled for one lane.
    let (lane_nodes, lane_graphs) = lanes::lane_nodes(m, &graphs, &bodies);
    let loop_graphs: Vec<GraphId> = graphs
        .iter()
        .copied()
        .filter(|g| !lane_graphs.contains(g))
        .collect();
    if let (Some(types), true) = (types, opts.scalar_jit) {
        reverse::reverse_groups(
            m,
            &loop_graphs,
            types,
            &fv,
            &users,
            &escapes,
            &mut plan,
            opts,
        );
        regions::scalar_groups(m, &loop_graphs, types, &fv, &mut plan);
    }
    for g in &graphs {
        let kept: Vec<NodeId>;
        let body = if lane_graphs.contains(g) {
            kept = bodies[g]
                .iter()
                .copied()
                .filter(|n| !lane_nodes.contains(n))
                .collect();
            &kept
        } else {
            &bodies[g]
        };
        // Inference's types of an escaped graph hold only for the calls it
        // saw: a kernel compiled for their shapes could be given others.
        if let Some(types) = types.filter(|t| t.holds_for_every_call(*g)) {
            let cx = Cx {
                m,
                types,
                graph: *g,
                opts,
            };
            epilogue_groups(&cx, body, &users, &escapes, &mut plan);
            elementwise_groups(&cx, body, &fv, &users, &escapes, &mut plan);
        }
        matmul_groups(m, *g, body, &mut plan);
    }
    order::break_cycles(m, &fv, &bodies, &mut plan);
    // Recomputed nodes that only their recomputing groups use.
    let mut recomputed_by: HashMap<NodeId, HashSet<usize>> = HashMap::new();
    for (gi, group) in plan.groups.iter().enumerate() {
        for &r in &group.recomputed {
            recomputed_by.entry(r).or_default().insert(gi);
        }
    }
    for (r, gs) in recomputed_by {
        if escapes.contains(&r) || plan.member_of.contains_key(&r) {
            continue;
        }
        let only = users.get(&r).is_none_or(|us| {
            us.iter()
                .all(|u| plan.member_of.get(u).is_some_and(|gi| gs.contains(gi)))
        });
        if only {
            plan.absorbed.insert(r);
        }
    }
    plan
}

/// A matrix product of a transpose made in the same graph: one kernel
/// that reads the transpose's operand in place.
fn matmul_groups(m: &Module, g: GraphId, body: &[NodeId], plan: &mut Plan) {
    use matmul::{MatmulKernel, View};
    for &n in body {
        if m.applied_prim(n) != Some(Prim::Matmul) || plan.member_of.contains_key(&n) {
            continue;
        }
        let ins = &m.inputs(n)[1..];
        if ins.len() != 2 {
            continue;
        }
        let (va, vb, inputs, recomputed) = matmul::operands(m, g, ins);
        if va == View::Plain && vb == View::Plain {
            continue;
        }
        let kernel = MatmulKernel::new(va, vb);
        debug_assert_eq!(kernel.arity(), inputs.len());
        let description = format!(
            "{}: {} inputs, 1 outputs",
            adjoint_runtime::vm::NativeKernel::name(&kernel),
            inputs.len()
        );
        let gi = plan.groups.len();
        plan.member_of.insert(n, gi);
        plan.groups.push(Group {
            graph: g,
            graph_name: m.graph(g).name.clone(),
            members: vec![n],
            inputs,
            outputs: vec![n],
            recomputed,
            kernel: Arc::new(kernel),
            description,
            form: form::KernelForm::Matmul(va, vb),
            then: None,
            sites: Vec::new(),
        });
    }
}

/// GEMM epilogues ([`epilogue`]): a matrix product of floats whose only
/// use is the addition of a bias row, and/or that (or the sum) feeds an
/// activation, becomes one kernel. Runs before element-wise grouping,
/// which leaves the nodes it took.
fn epilogue_groups(
    cx: &Cx,
    body: &[NodeId],
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
    plan: &mut Plan,
) {
    use epilogue::{Act, EpilogueKernel};
    let m = cx.m;
    let g = cx.graph;
    let in_graph = |x: NodeId| m.node(x).graph == Some(g);
    for &n in body {
        if m.applied_prim(n) != Some(Prim::Matmul) || plan.member_of.contains_key(&n) {
            continue;
        }
        let ins = &m.inputs(n)[1..];
        if ins.len() != 2 {
            continue;
        }
        let Some((shape, dtype, false)) = tensor_type(cx.types, n) else {
            continue;
        };
        let two_d = |x: NodeId| {
            tensor_type(cx.types, x).is_some_and(|(s, d, _)| s.len() == 2 && d == dtype)
        };
        if shape.len() != 2
            || kdtype(dtype).is_none()
            || shape.iter().product::<usize>() < MIN_ELEMENTS
            || !two_d(ins[0])
            || !two_d(ins[1])
        {
            continue;
        }
        let same_type = |x: NodeId| {
            tensor_type(cx.types, x).is_some_and(|(s, d, w)| s == shape && d == dtype && !w)
        };
        let sole_user = |x: NodeId| -> Option<NodeId> {
            match users.get(&x).map(|v| v.as_slice()) {
                Some([u]) if !escapes.contains(&x) && in_graph(*u) => Some(*u),
                _ => None,
            }
        };
        let mut members = vec![n];
        let mut cur = n;
        // A bias row: computed before the product (so not from it).
        let mut bias = None;
        if let Some(u) = sole_user(n).filter(|u| m.applied_prim(*u) == Some(Prim::Add)) {
            let uin = &m.inputs(u)[1..];
            let other = if uin[0] == n { uin[1] } else { uin[0] };
            let row = tensor_type(cx.types, other)
                .is_some_and(|(s, d, w)| s == [shape[1]] && d == dtype && !w);
            let independent = !reaches(m, g, other, n);
            if other != n && row && independent && same_type(u) && !plan.member_of.contains_key(&u)
            {
                bias = Some(other);
                members.push(u);
                cur = u;
            }
        }
        // An activation of the result (which may have other uses).
        let acts: Vec<NodeId> = users
            .get(&cur)
            .map(|us| {
                us.iter()
                    .copied()
                    .filter(|u| {
                        in_graph(*u)
                            && m.applied_prim(*u).and_then(Act::of).is_some()
                            && same_type(*u)
                            && !plan.member_of.contains_key(u)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut act = None;
        if let [a] = acts[..] {
            act = m.applied_prim(a).and_then(Act::of);
            members.push(a);
        }
        if bias.is_none() && act.is_none() {
            continue;
        }
        let keep_pre = act.is_some()
            && (escapes.contains(&cur)
                || users
                    .get(&cur)
                    .is_some_and(|us| us.iter().any(|u| !members.contains(u))));
        let (va, vb, mut inputs, recomputed) = matmul::operands(m, g, ins);
        inputs.extend(bias);
        let kernel = EpilogueKernel::new(va, vb, bias.is_some(), act, keep_pre, dtype);
        debug_assert_eq!(kernel.arity(), inputs.len());
        let outputs = match (act, keep_pre) {
            (Some(_), true) => vec![cur, *members.last().expect("an activation")],
            _ => vec![*members.last().expect("a member")],
        };
        debug_assert_eq!(kernel.outputs(), outputs.len());
        let description = format!(
            "epilogue {}: {} inputs, {} outputs",
            adjoint_runtime::vm::NativeKernel::name(&kernel),
            inputs.len(),
            outputs.len()
        );
        let gi = plan.groups.len();
        for &mbr in &members {
            plan.member_of.insert(mbr, gi);
        }
        plan.groups.push(Group {
            graph: g,
            graph_name: m.graph(g).name.clone(),
            members,
            inputs,
            outputs,
            recomputed,
            kernel: Arc::new(kernel),
            description,
            form: form::KernelForm::Epilogue,
            then: None,
            sites: Vec::new(),
        });
    }
}

/// Whether `from` may depend on `to` through the operands of nodes of
/// graph `g` (a call of a graph counts as depending on anything: its
/// closure may capture `to`).
fn reaches(m: &Module, g: GraphId, from: NodeId, to: NodeId) -> bool {
    let mut stack = vec![from];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if x == to {
            return true;
        }
        if !seen.insert(x) || m.node(x).graph != Some(g) {
            continue;
        }
        let ins = m.inputs(x);
        if let Some(Const::Graph(_)) = ins.first().and_then(|c| m.as_const(*c)) {
            return true;
        }
        stack.extend_from_slice(ins);
    }
    false
}

/// What the element-wise grouping of one graph reads.
struct Cx<'a> {
    m: &'a Module,
    types: &'a Types,
    graph: GraphId,
    opts: &'a crate::options::CompilerOptions,
}

impl Cx<'_> {
    /// The comparison `c` when a kernel of `dtype` over `shape` can compute
    /// it from its operands (as the condition of a `where`): a comparison
    /// in this graph of two operands readable as inputs, computed in
    /// `dtype`. Returns its operation and operands.
    fn condition(
        &self,
        c: NodeId,
        shape: &[usize],
        dtype: DType,
    ) -> Option<(BinaryOp, NodeId, NodeId)> {
        let m = self.m;
        if m.node(c).graph != Some(self.graph) {
            return None;
        }
        let Op::Binary(op) = op_of(m.applied_prim(c)?)? else {
            return None;
        };
        if !op.is_comparison() {
            return None;
        }
        let ins = &m.inputs(c)[1..];
        let (a, b) = (ins[0], ins[1]);
        // At least one operand is a (non-weak) tensor of the kernel's
        // dtype, so the reference kernel compares in that dtype too.
        let strong =
            |o: NodeId| tensor_type(self.types, o).is_some_and(|(_, d, weak)| d == dtype && !weak);
        if !(strong(a) || strong(b)) {
            return None;
        }
        let (cs, _, _) = tensor_type(self.types, c)?;
        InputSpec::broadcast(&cs, shape)?;
        let readable = |o: NodeId| {
            matches!(m.as_const(o), Some(Const::Float(_) | Const::Int(_)))
                || tensor_type(self.types, o).is_some_and(|(s, d, weak)| {
                    (d == dtype || weak) && InputSpec::broadcast(&s, shape).is_some()
                })
        };
        (readable(a) && readable(b)).then_some((op, a, b))
    }

    /// The constant value of `o` in a kernel of `dtype` over `shape`, when
    /// it is `zeros_like` / `ones_like` in this graph with that dtype.
    fn constant(&self, o: NodeId, shape: &[usize], dtype: DType) -> Option<f64> {
        let m = self.m;
        if m.node(o).graph != Some(self.graph) {
            return None;
        }
        let v = match m.applied_prim(o)? {
            Prim::ZerosLike => 0.0,
            Prim::OnesLike | Prim::GradSeed => 1.0,
            _ => return None,
        };
        let (s, d, _) = tensor_type(self.types, o)?;
        (d == dtype && InputSpec::broadcast(&s, shape).is_some()).then_some(v)
    }

    /// When `o` is a chain of views of a tensor `x` in this graph — any
    /// `broadcast_to`s of any `reshape` / `expand_dims` / `squeeze`s, none
    /// of which moves an element in row-major order — that a kernel over
    /// `shape` in `dtype` can read straight from `x`'s buffer: `x`, its
    /// shape, the strides to read it with, and the view nodes.
    fn view_of(
        &self,
        o: NodeId,
        shape: &[usize],
        dtype: DType,
    ) -> Option<(NodeId, Vec<usize>, InputSpec, Vec<NodeId>)> {
        let m = self.m;
        let in_graph = |n: NodeId| m.node(n).graph == Some(self.graph);
        let typed =
            |n: NodeId| tensor_type(self.types, n).filter(|(_, d, weak)| *d == dtype && !weak);
        let mut views = Vec::new();
        let mut cur = o;
        while in_graph(cur) && m.applied_prim(cur) == Some(Prim::BroadcastTo) {
            let x = m.inputs(cur)[1];
            typed(x)?;
            views.push(cur);
            cur = x;
        }
        // The logical shape the strides come from: contiguous data.
        let (logical, _, _) = typed(cur)?;
        while in_graph(cur)
            && matches!(
                m.applied_prim(cur),
                Some(Prim::Reshape | Prim::ExpandDims | Prim::Squeeze)
            )
        {
            let x = m.inputs(cur)[1];
            typed(x)?;
            views.push(cur);
            cur = x;
        }
        if views.is_empty() {
            return None;
        }
        let (xs, _, _) = typed(cur)?;
        let spec = InputSpec::broadcast(&logical, shape)?;
        Some((cur, xs, spec, views))
    }

    /// The operands a member reads for dependence purposes: a `where`'s
    /// recomputed condition stands for the comparison's operands.
    fn operands(&self, n: NodeId, shape: &[usize], dtype: DType) -> Vec<NodeId> {
        let m = self.m;
        let ins = &m.inputs(n)[1..];
        if m.applied_prim(n) == Some(Prim::Where) && ins.len() == 3 {
            if let Some((_, a, b)) = self.condition(ins[0], shape, dtype) {
                return vec![a, b, ins[1], ins[2]];
            }
        }
        ins.to_vec()
    }
}

fn elementwise_groups(
    cx: &Cx,
    body: &[NodeId],
    fv: &FreeVars,
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
    plan: &mut Plan,
) {
    let m = cx.m;
    let types = cx.types;
    let mut forming: Vec<Forming> = Vec::new();
    // Union-find over group ids: merged groups point to the survivor.
    let mut parent: Vec<usize> = Vec::new();
    let mut group_of: HashMap<NodeId, usize> = HashMap::new();
    // The groups each node depends on through nodes outside them.
    let mut depends: HashMap<NodeId, HashSet<usize>> = HashMap::new();
    for &n in body {
        let real = &m.inputs(n)[1..];
        let ins: Vec<NodeId> = match tensor_type(types, n) {
            Some((shape, dtype, _)) => cx.operands(n, &shape, dtype),
            None => real.to_vec(),
        };
        let ins = &ins[..];
        let gview: HashMap<NodeId, usize> = ins
            .iter()
            .filter_map(|i| group_of.get(i).map(|g| (*i, find(&parent, *g))))
            .collect();
        // Nodes an earlier kind of group (a GEMM epilogue) computes.
        let taken = plan.member_of.contains_key(&n);
        let joined = if taken {
            None
        } else {
            joinable(
                cx, n, ins, &gview, &depends, &parent, &forming, users, escapes,
            )
        };
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
                            cx.operands(*mbr, &forming[a].shape, forming[a].dtype)
                                .iter()
                                .any(|x| {
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
        } else if let Some((shape, dtype)) = starts_group(cx, n).filter(|_| !taken) {
            forming.push(Forming {
                graph: cx.graph,
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
        // What `n` needs: its operands, its callee, and the free variables
        // of the graphs it names (a `switch` of branches needs what they
        // capture, and a call of it needs the `switch`), so that no group
        // is formed around a call that needs one of its members.
        let mut needs: Vec<NodeId> = m.inputs(n).iter().chain(ins).copied().collect();
        for &i in m.inputs(n) {
            if let Some(h) = m.as_graph(i) {
                needs.extend(fv.get(h).iter().copied());
            }
        }
        let mut dep: HashSet<usize> = HashSet::new();
        for i in &needs {
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
        if let Some(group) = build(cx, f, users, escapes) {
            let gi = plan.groups.len();
            for &mbr in &group.members {
                plan.member_of.insert(mbr, gi);
            }
            plan.groups.push(group);
        }
    }
}

/// Whether `n` can start a group: an element-wise operation (or a
/// reduction) producing a float tensor of a static shape. Comparisons do
/// not (their bool result cannot leave a kernel); a `where` whose
/// condition the kernel can recompute does.
fn starts_group(cx: &Cx, n: NodeId) -> Option<(Vec<usize>, DType)> {
    let (m, types) = (cx.m, cx.types);
    let p = m.applied_prim(n)?;
    let ins = &m.inputs(n)[1..];
    if let Some(_r) = reduce_of(p) {
        let (shape, dtype, _) = tensor_type(types, ins[0])?;
        kdtype(dtype)?;
        return Some((shape, dtype));
    }
    let op = op_of(p)?;
    let (shape, dtype, _) = tensor_type(types, n)?;
    match op {
        Op::Binary(b) if b.is_comparison() => return None,
        Op::Select => {
            cx.condition(ins[0], &shape, dtype)?;
        }
        _ => {}
    }
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
/// groups' current ids; `ins` are its operands as [`Cx::operands`] gives
/// them).
#[allow(clippy::too_many_arguments)]
fn joinable(
    cx: &Cx,
    n: NodeId,
    ins: &[NodeId],
    group_of: &HashMap<NodeId, usize>,
    depends: &HashMap<NodeId, HashSet<usize>>,
    parent: &[usize],
    forming: &[Forming],
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
) -> Option<usize> {
    let (m, types) = (cx.m, cx.types);
    let p = m.applied_prim(n)?;
    let is_reduce = reduce_of(p).is_some();
    if !is_reduce {
        match op_of(p)? {
            Op::Binary(b) if b.is_comparison() => return None,
            _ => {}
        }
    }
    let (shape, dtype, _) = tensor_type(types, n)?;
    let real = &m.inputs(n)[1..];
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
            // Members used outside the group become side outputs of the
            // reduction, which a reduction to one element cannot have.
            let only = f.members.iter().all(|mbr| {
                !escapes.contains(mbr)
                    && users.get(mbr).is_none_or(|us| {
                        us.iter()
                            .all(|u| *u == n || group_of_any(*u, forming, parent) == Some(gi))
                    })
            });
            if !only
                && (shape.iter().product::<usize>() <= 1
                    || wide_routines(cx, f)
                    || !cx.opts.side_outputs)
            {
                continue;
            }
        } else {
            if shape != f.shape || dtype != f.dtype {
                continue;
            }
            if matches!(op_of(p)?, Op::Select) && cx.condition(real[0], &f.shape, f.dtype).is_none()
            {
                continue;
            }
        }
        // No other operand may depend on this group.
        let cycle = ins.iter().any(|o| {
            group_of.get(o) != Some(&gi)
                && cx.constant(*o, &f.shape, f.dtype).is_none()
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
            input_ok(cx, *o, &f.shape, f.dtype)
        });
        if ok {
            return Some(gi);
        }
    }
    None
}

/// Whether a member of `f` runs through a 256-bit routine
/// ([`crate::codegen::cpu::has_wide_routine`]): only map kernels run
/// them, so such a group stays a map rather than take in a reduction with
/// side outputs (measured on GMM's gradient: the exponential of its
/// log-sum-exp cost more inside the reduction's loop than the reduction's
/// second pass over the map's result).
fn wide_routines(cx: &Cx, f: &Forming) -> bool {
    let Some(dtype) = kdtype(f.dtype) else {
        return false;
    };
    f.members.iter().any(|mbr| {
        matches!(
            cx.m.applied_prim(*mbr).and_then(op_of),
            Some(Op::Unary(u)) if cx.opts.avx2 && crate::codegen::cpu::has_wide_routine(u, dtype)
        )
    })
}

/// The group a node belongs to, looked up in the members lists.
fn group_of_any(n: NodeId, forming: &[Forming], parent: &[usize]) -> Option<usize> {
    forming
        .iter()
        .position(|f| f.members.contains(&n))
        .map(|g| find(parent, g))
}

/// Whether `o` can be read by a kernel over `shape` in `dtype`.
fn input_ok(cx: &Cx, o: NodeId, shape: &[usize], dtype: DType) -> bool {
    if matches!(cx.m.as_const(o), Some(Const::Float(_) | Const::Int(_))) {
        return true;
    }
    if cx.constant(o, shape, dtype).is_some() {
        return true;
    }
    match tensor_type(cx.types, o) {
        Some((s, d, weak)) => {
            (d == dtype || (weak && d.is_numeric())) && InputSpec::broadcast(&s, shape).is_some()
        }
        None => false,
    }
}

/// A kernel body while it is being built.
#[derive(Default)]
struct KernelBuilder {
    body: Vec<KExpr>,
    id_of: HashMap<NodeId, KId>,
    /// Values read by the kernel, their access and their types.
    inputs: Vec<NodeId>,
    input_specs: Vec<InputSpec>,
    input_types: Vec<(Vec<usize>, DType)>,
    recomputed: Vec<NodeId>,
}

impl KernelBuilder {
    fn push(&mut self, e: KExpr) -> KId {
        self.body.push(e);
        KId(self.body.len() as u32 - 1)
    }

    /// The body value of operand `o` of a member: an earlier value, a
    /// constant, or a new input.
    fn operand(&mut self, cx: &Cx, f: &Forming, o: NodeId) -> Option<KId> {
        if let Some(id) = self.id_of.get(&o) {
            return Some(*id);
        }
        match cx.m.as_const(o) {
            Some(Const::Float(x)) => return Some(self.push(KExpr::Const(*x))),
            Some(Const::Int(x)) => return Some(self.push(KExpr::Const(*x as f64))),
            _ => {}
        }
        if let Some(v) = cx.constant(o, &f.shape, f.dtype) {
            self.recomputed.push(o);
            let id = self.push(KExpr::Const(v));
            self.id_of.insert(o, id);
            return Some(id);
        }
        let (s, d, _) = tensor_type(cx.types, o)?;
        let spec = InputSpec::broadcast(&s, &f.shape)?;
        // A broadcast or reshape of a tensor is read from that tensor's
        // buffer through strides, without the copy.
        let (x, s, spec, views) = match cx.view_of(o, &f.shape, f.dtype) {
            Some((x, xs, spec, views)) => (x, xs, spec, views),
            None => (o, s, spec, Vec::new()),
        };
        self.recomputed.extend(views);
        self.inputs.push(x);
        self.input_specs.push(spec);
        self.input_types.push((s, d));
        let id = self.push(KExpr::Input(self.inputs.len() - 1));
        self.id_of.insert(o, id);
        Some(id)
    }
}

/// Builds and compiles the kernel of a formed group.
fn build(
    cx: &Cx,
    f: Forming,
    users: &HashMap<NodeId, Vec<NodeId>>,
    escapes: &HashSet<NodeId>,
) -> Option<Group> {
    let (m, types) = (cx.m, cx.types);
    if f.shape.iter().product::<usize>() < MIN_ELEMENTS && f.members.len() < MIN_SMALL_MEMBERS {
        return None;
    }
    let members: HashSet<NodeId> = f.members.iter().copied().collect();
    let mut k = KernelBuilder::default();
    let mut reduce = None;
    for &n in &f.members {
        let p = m.applied_prim(n)?;
        let ins = &m.inputs(n)[1..];
        if let Some(op) = reduce_of(p) {
            let x = k.operand(cx, &f, ins[0])?;
            k.id_of.insert(n, x);
            let rank = f.shape.len();
            if p == Prim::SumTo {
                let (like, _, _) = tensor_type(types, ins[1])?;
                let axes = sum_to_axes(&f.shape, &like)?;
                // The result has `like`'s shape: the kept axes in order,
                // the same row-major data as keeping every axis.
                reduce = Some((
                    n,
                    ReduceSpec {
                        op,
                        axes,
                        keepdims: true,
                    },
                ));
                continue;
            }
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
            Op::Unary(u) => KExpr::Unary(u, k.operand(cx, &f, ins[0])?),
            Op::Binary(b) => {
                let a = k.operand(cx, &f, ins[0])?;
                let c = k.operand(cx, &f, ins[1])?;
                KExpr::Binary(b, a, c)
            }
            Op::Select => {
                let c = match k.id_of.get(&ins[0]) {
                    Some(id) => *id,
                    None => {
                        let (op, x, y) = cx.condition(ins[0], &f.shape, f.dtype)?;
                        let x = k.operand(cx, &f, x)?;
                        let y = k.operand(cx, &f, y)?;
                        let id = k.push(KExpr::Binary(op, x, y));
                        k.id_of.insert(ins[0], id);
                        k.recomputed.push(ins[0]);
                        id
                    }
                };
                let a = k.operand(cx, &f, ins[1])?;
                let b = k.operand(cx, &f, ins[2])?;
                KExpr::Select(c, a, b)
            }
        };
        let id = k.push(e);
        k.id_of.insert(n, id);
    }
    let KernelBuilder {
        body,
        id_of,
        inputs,
        input_specs,
        input_types,
        mut recomputed,
    } = k;
    // Outputs: members used outside the group. They must be tensors of
    // the kernel's dtype.
    let mut outputs = Vec::new();
    let mut out_ids = Vec::new();
    let mut out_shapes = Vec::new();
    let reduced = reduce.as_ref().map(|(r, _)| *r);
    let spec_reduce;
    if let Some((r, rs)) = reduce {
        // The reduced value first; members used outside are its side
        // outputs (`joinable` let the reduction in only when its result
        // keeps more than one element).
        let (s, d, _) = tensor_type(types, r)?;
        if d != f.dtype {
            return None;
        }
        outputs.push(r);
        out_ids.push(id_of[&r]);
        out_shapes.push(s);
        spec_reduce = Some(rs);
    } else {
        spec_reduce = None;
    }
    for &n in &f.members {
        if reduced == Some(n) {
            continue;
        }
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
            out_shapes.push(f.shape.clone());
        }
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
    let options = crate::codegen::cpu::CompileOptions {
        avx2: (!cx.opts.avx2).then_some(false),
        ..Default::default()
    };
    let kernel = crate::codegen::cpu::compile_cached_with(&spec, &options).ok()?;
    let names: Vec<&str> = f
        .members
        .iter()
        .filter_map(|n| m.applied_prim(*n).map(|p| p.name()))
        .collect();
    let name = format!("fused[{}]", names.join(","));
    let description = format!(
        "{} over {:?} {}{}: {} inputs, {} outputs",
        name,
        spec.shape,
        spec.dtype.name(),
        spec.reduce
            .as_ref()
            .map(|r| format!(", then {} over {:?}", r.op.name(), r.axes))
            .unwrap_or_default(),
        inputs.len(),
        outputs.len()
    );
    recomputed.sort();
    recomputed.dedup();
    Some(Group {
        graph: f.graph,
        graph_name: m.graph(f.graph).name.clone(),
        members: f.members,
        inputs,
        outputs: outputs.clone(),
        recomputed,
        kernel: Arc::new(FusedKernel {
            kernel,
            name,
            input_types,
            dtype: f.dtype,
            out_weak: outputs
                .iter()
                .map(|&o| tensor_type(types, o).is_some_and(|(_, _, weak)| weak))
                .collect(),
            out_shapes,
        }),
        description,
        form: form::KernelForm::Fused(spec),
        then: None,
        sites: Vec::new(),
    })
}

/// The axes `sum_to` of a tensor of shape `x` to shape `like` sums over:
/// the leading axes `like` lacks and those where it has 1 and `x` not.
/// `None` when `like` does not broadcast to `x` or nothing is summed.
fn sum_to_axes(x: &[usize], like: &[usize]) -> Option<Vec<usize>> {
    let lead = x.len().checked_sub(like.len())?;
    let mut axes = Vec::new();
    for (i, &d) in x.iter().enumerate() {
        if i < lead || (like[i - lead] == 1 && d != 1) {
            axes.push(i);
        } else if like[i - lead] != d {
            return None;
        }
    }
    (!axes.is_empty()).then_some(axes)
}

fn norm_axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}
