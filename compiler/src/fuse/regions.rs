//! Scalar regions: loops and recursion over scalars, compiled whole.
//!
//! A loop lowers to a family of graphs (header, body, exit, the `if`s
//! inside) that call each other; the VM runs each iteration as calls on
//! heap-allocated 0-d tensors. When inference types every value of such a
//! family as a scalar (f32, f64, i64 or bool, or tuples of them), the
//! family is a [`ScalarProgram`]: one function per graph, whose parameters
//! are the graph's, then its free variables (the lambda lifting the VM does
//! with closures, done statically), and whose tail calls stay tail calls.
//! The call that enters the family from VM code becomes one native
//! kernel ([`ScalarKernel`]).
//!
//! A graph belongs to a region when
//! - inference saw all its calls (it is not *escaped*) and every parameter,
//!   free variable and node of it has a static scalar type;
//! - every node is an element-wise primitive with a native form (integer
//!   division, remainder and powers too: their faults are reported as the
//!   reference kernels report them), `cast`, `where`, a
//!   `switch` on values, tuple building and projection, a call of a graph of the
//!   region, or a `switch` between two graphs of the region that is then
//!   called (an `if`, a loop's test);
//! - it is not on a cycle of non-tail calls: recursion that needs a stack
//!   (`fib`) stays with the VM, whose frames are on the heap, so native
//!   stack depth is bounded by the number of functions.
//!
//! Only a region with a cycle (a loop) is worth a kernel; straight-line
//! scalar code is left to the VM.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use adjoint_runtime::dtype::{self, WeakDType};
use adjoint_runtime::error::RtError;
use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;
use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;

use super::{form, ContArg, Continuation, Group, Plan};
use crate::infer::{AbsVal, Types};
use crate::ir::analysis::{graph_body_with, FreeVars};
use crate::ir::{Const, GraphId, Module, NodeId};
use crate::prim::Prim;
use crate::scalar::native::{compile_scalar_cached, BufRef, CompiledScalar};
use crate::scalar::{
    FuncIdx, SBinary, SBuffer, SCall, SFunc, SInst, SOp, STerm, SType, SUnary, SVal, Scalar,
    ScalarProgram,
};

/// Tensors with at most this many elements join a region as one scalar
/// per element ([`Shape::Tensor`]).
const MAX_LANES: usize = 512;

/// A region whose functions have more instructions than this in all is
/// left to the VM (tensors of many lanes and many operations make long
/// straight-line code, slow to compile).
const MAX_INSTS: usize = 12_000;

/// A region with more scalar instructions than this per operation of its
/// graphs, on average, is left to the VM: its tensors are wide enough
/// that the VM's fused vector kernels, a few per step, beat one scalar
/// instruction per lane. (Measured on a loop of `tanh`/`sigmoid` steps
/// over a vector, forward and reverse, 20,000 steps: native 3.4 times
/// faster at 16 lanes, 2.5 at 32, even at 64, where it makes 45
/// instructions per operation.)
const MAX_LANE_OPS: usize = 48;

/// Whether a tensor of this type joins a region as scalars: a scalar, or
/// a tensor of at most [`MAX_LANES`] elements ([`Shape::Tensor`]).
pub fn runs_lane_by_lane(t: &crate::infer::AbsTensor) -> bool {
    SType::of(t.dtype).is_some()
        && (t.shape.is_empty() || (1..=MAX_LANES).contains(&numel(&t.shape)))
}

/// The number of elements of a tensor of shape `dims`.
fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// For every element of a tensor of shape `dst` (row-major), the element
/// of a tensor of shape `src` that broadcasts to it; `None` if `src` does
/// not broadcast to `dst`.
fn broadcast_map(src: &[usize], dst: &[usize]) -> Option<Vec<usize>> {
    let off = dst.len().checked_sub(src.len())?;
    for (k, &d) in src.iter().enumerate() {
        if d != 1 && d != dst[off + k] {
            return None;
        }
    }
    // Row-major strides of `src` on the axes of `dst`, 0 where it
    // broadcasts.
    let mut strides = vec![0; dst.len()];
    let mut acc = 1;
    for k in (0..src.len()).rev() {
        if src[k] != 1 {
            strides[off + k] = acc;
        }
        acc *= src[k];
    }
    let n = numel(dst);
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; dst.len()];
    for _ in 0..n {
        out.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for k in (0..dst.len()).rev() {
            idx[k] += 1;
            if idx[k] < dst[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    Some(out)
}

/// The row-major block that literal index components `is` select among
/// the first `is.len()` axes of `dims` (negative ones count from the
/// end); `None` if one is out of range (left to the VM's error).
fn static_block(is: &[i64], dims: &[usize]) -> Option<usize> {
    is.iter().enumerate().try_fold(0, |b, (axis, &i)| {
        let j = adjoint_runtime::shape::resolve_at(i, axis, dims[axis]).ok()?;
        Some(b * dims[axis] + j)
    })
}

/// For every element of a tensor of shape `dims` (row-major), the
/// element of its sum over `axis` (`None`: all axes) it adds to.
fn reduce_targets(dims: &[usize], axis: Option<usize>) -> Vec<usize> {
    let n = numel(dims);
    let Some(a) = axis else {
        return vec![0; n];
    };
    // Position `i` is (outer, along, inner) around axis `a`; its sum is at
    // (outer, inner).
    let inner = numel(&dims[a + 1..]);
    let d = dims[a];
    (0..n)
        .map(|i| (i / (d * inner)) * inner + i % inner)
        .collect()
}

/// The structure of a value made of scalars.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Shape {
    Scalar(SType, bool),
    /// A small tensor of static shape (at least one axis, at most
    /// [`MAX_LANES`] elements): one scalar per element, row-major, so
    /// element-wise operations run lane by lane and indexing with a
    /// run-time position selects among the lanes.
    Tensor(SType, bool, Vec<usize>),
    /// A larger tensor of static shape from outside the region (a free
    /// variable of its graphs), read in place: indexing it loads the
    /// elements it selects ([`SOp::Load`]). It is no machine value, and
    /// its only use is as the tensor `index` reads; it has no cotangent.
    Buffer(SType, Vec<usize>),
    Tuple(Vec<Shape>),
    /// The IO token, passed through unchanged: no machine value.
    Io,
    /// Reverse mode's stack of backpropagators in a loop differentiated
    /// whole ([`super::reverse`]): the program's tape, no machine value.
    Stack,
    /// The symbolic zero (the tangent of a loop's counter in forward
    /// mode): passed on, no machine value.
    Zero,
}

impl Shape {
    pub(super) fn of(v: &AbsVal) -> Option<Shape> {
        match v {
            AbsVal::Tensor(t) if t.shape.is_empty() => {
                Some(Shape::Scalar(SType::of(t.dtype)?, t.weak))
            }
            AbsVal::Tensor(t) if runs_lane_by_lane(t) => {
                Some(Shape::Tensor(SType::of(t.dtype)?, t.weak, t.shape.clone()))
            }
            AbsVal::Tensor(t) => match SType::of(t.dtype)? {
                SType::Bool => None,
                ty => Some(Shape::Buffer(ty, t.shape.clone())),
            },
            AbsVal::Tuple(items) => items
                .iter()
                .map(Shape::of)
                .collect::<Option<_>>()
                .map(Shape::Tuple),
            AbsVal::Io => Some(Shape::Io),
            AbsVal::Zero => Some(Shape::Zero),
            _ => None,
        }
    }

    /// The scalar types, depth first.
    pub(super) fn flat(&self) -> Vec<SType> {
        let mut out = Vec::new();
        self.flatten(&mut out);
        out
    }

    fn flatten(&self, out: &mut Vec<SType>) {
        match self {
            Shape::Scalar(t, _) => out.push(*t),
            Shape::Tensor(t, _, dims) => out.extend(std::iter::repeat_n(*t, numel(dims))),
            Shape::Tuple(items) => items.iter().for_each(|s| s.flatten(out)),
            Shape::Io | Shape::Stack | Shape::Zero | Shape::Buffer(..) => {}
        }
    }

    pub(super) fn scalar(&self) -> Option<(SType, bool)> {
        match self {
            Shape::Scalar(t, w) => Some((*t, *w)),
            _ => None,
        }
    }

    /// The element type of a scalar or a tensor.
    pub(super) fn elem(&self) -> Option<(SType, bool)> {
        match self {
            Shape::Scalar(t, w) | Shape::Tensor(t, w, _) => Some((*t, *w)),
            _ => None,
        }
    }

    /// The axes of a scalar (none) or a tensor.
    pub(super) fn dims(&self) -> Option<&[usize]> {
        match self {
            Shape::Scalar(..) => Some(&[]),
            Shape::Tensor(_, _, dims) => Some(dims),
            _ => None,
        }
    }

    fn has_io(&self) -> bool {
        match self {
            Shape::Io => true,
            Shape::Tuple(items) => items.iter().any(Shape::has_io),
            Shape::Scalar(..) | Shape::Tensor(..) | Shape::Stack | Shape::Zero => false,
            Shape::Buffer(..) => false,
        }
    }

    /// Whether it is made of scalars and small tensors only (a value a
    /// region's functions take as parameters).
    pub(super) fn is_value(&self) -> bool {
        match self {
            Shape::Scalar(..) | Shape::Tensor(..) => true,
            Shape::Tuple(items) => items.iter().all(Shape::is_value),
            _ => false,
        }
    }

    /// Whether values of shapes `self` and `other` have the same scalars
    /// in the same order (types and axes; weak types aside).
    pub(super) fn same_layout(&self, other: &Shape) -> bool {
        match (self, other) {
            (Shape::Scalar(x, _), Shape::Scalar(y, _)) => x == y,
            (Shape::Tensor(x, _, d), Shape::Tensor(y, _, e)) => x == y && d == e,
            (Shape::Tuple(xs), Shape::Tuple(ys)) => {
                xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| x.same_layout(y))
            }
            (Shape::Io, Shape::Io) | (Shape::Zero, Shape::Zero) => true,
            _ => false,
        }
    }

    /// Whether it is or holds a [`Shape::Buffer`].
    pub(super) fn has_buffer(&self) -> bool {
        match self {
            Shape::Buffer(..) => true,
            Shape::Tuple(items) => items.iter().any(Shape::has_buffer),
            _ => false,
        }
    }

    pub(super) fn width(&self) -> usize {
        match self {
            Shape::Scalar(..) => 1,
            Shape::Tensor(_, _, dims) => numel(dims),
            Shape::Tuple(items) => items.iter().map(Shape::width).sum(),
            Shape::Io | Shape::Stack | Shape::Zero | Shape::Buffer(..) => 0,
        }
    }

    /// Builds the runtime value from flattened scalars.
    pub(super) fn value(&self, vals: &mut impl Iterator<Item = Scalar>) -> Result<Value, RtError> {
        Ok(match self {
            Shape::Scalar(_, weak) => {
                let s = vals
                    .next()
                    .ok_or_else(|| RtError::internal("scalar kernel: too few results"))?;
                let t = match s {
                    Scalar::F32(x) => Tensor::scalar_f32(x),
                    Scalar::F64(x) => Tensor::scalar_f64(x),
                    Scalar::I64(x) => Tensor::scalar_i64(x),
                    Scalar::Bool(x) => Tensor::scalar_bool(x),
                };
                Value::Tensor(t.with_weak(*weak && s.ty() != SType::Bool))
            }
            Shape::Tensor(t, weak, dims) => {
                let n = numel(dims);
                let lanes: Vec<Scalar> = vals.take(n).collect();
                if lanes.len() != n {
                    return Err(RtError::internal("scalar kernel: too few results"));
                }
                if lanes.iter().any(|s| s.ty() != *t) {
                    return Err(RtError::internal("scalar kernel: a lane of another type"));
                }
                // Every lane has type `t`, so each arm keeps them all.
                macro_rules! typed {
                    ($get:ident) => {
                        Tensor::from_vec(lanes.iter().filter_map(|s| s.$get()).collect(), dims)?
                    };
                }
                let x = match t {
                    SType::F32 => typed!(as_f32),
                    SType::F64 => typed!(as_f64),
                    SType::I64 => typed!(as_i64),
                    SType::Bool => typed!(as_bool),
                };
                Value::Tensor(x.with_weak(*weak && *t != SType::Bool))
            }
            Shape::Tuple(items) => Value::tuple(
                items
                    .iter()
                    .map(|s| s.value(vals))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Shape::Io => Value::Io,
            Shape::Zero => Value::Zero,
            Shape::Stack | Shape::Buffer(..) => {
                return Err(RtError::internal("scalar kernel: a stack or buffer result"))
            }
        })
    }
}

/// The graphs a call with callee `head` may call: a graph constant, or
/// the two graphs of a `switch` (none otherwise).
pub(super) fn callees(m: &Module, head: NodeId) -> Vec<GraphId> {
    match m.as_const(head) {
        Some(Const::Graph(h)) => vec![*h],
        _ => m
            .graph_switch(head)
            .map(|(_, a, b)| vec![a, b])
            .unwrap_or_default(),
    }
}

/// Adds a group that computes call `n` (in graph `h`) with the compiled
/// scalar program of `kernel`, reading `inputs`.
#[allow(clippy::too_many_arguments)]
pub(super) fn add_call_group(
    plan: &mut Plan,
    m: &Module,
    h: GraphId,
    n: NodeId,
    inputs: Vec<NodeId>,
    description: String,
    program: &CompiledScalar,
    kernel: Arc<dyn NativeKernel>,
    then: Option<Continuation>,
) {
    plan.member_of.insert(n, plan.groups.len());
    plan.groups.push(Group {
        graph: h,
        graph_name: m.graph(h).name.clone(),
        members: vec![n],
        inputs,
        outputs: vec![n],
        recomputed: Vec::new(),
        description,
        form: form::KernelForm::Scalar(program.program().clone()),
        kernel,
        then,
        sites: program
            .program()
            .fault_sites()
            .into_iter()
            .map(NodeId)
            .collect(),
    });
}

/// The type of a literal as an operand, and its value.
fn literal(c: &Const) -> Option<(Scalar, WeakDType)> {
    Some(match c {
        Const::Int(i) => (Scalar::I64(*i), (DType::I64, true)),
        Const::Float(x) => (Scalar::F64(*x), (DType::F64, true)),
        Const::Bool(b) => (Scalar::Bool(*b), (DType::Bool, false)),
        _ => return None,
    })
}

/// What the analysis learnt about a graph that may join a region.
pub(super) struct Info {
    /// Graphs it calls, with whether the call is its tail call.
    pub(super) calls: Vec<(GraphId, bool)>,
}

pub(super) struct Cx<'a> {
    pub(super) m: &'a Module,
    pub(super) types: &'a Types,
    pub(super) fv: &'a FreeVars,
    /// Reverse mode's stacks, when loops are differentiated whole
    /// ([`super::reverse`]); empty otherwise.
    pub(super) stacks: &'a Stacks,
    /// The environment keys of the region being built (`ad_key` marks of
    /// values from outside it), with their shapes: every function takes
    /// one more parameter per key, after its free variables, for the value
    /// the key stands for. A mark of a value made inside the region is
    /// that value.
    pub(super) keys: Vec<(i64, Shape)>,
}

/// The stacks of the reverse-mode loops in a module: the graphs that pass
/// one on (`J'` graphs, [`crate::ad`]) with their stack parameter, and the
/// nodes that are stacks (those parameters, and `ad_hide((@B, stack))`
/// pushes with the tuple inside).
#[derive(Default)]
pub(super) struct Stacks {
    pub(super) param: HashMap<GraphId, NodeId>,
    /// Also the backpropagators that `J` graphs called from a loop (the
    /// `if`s in its body) return beside their value.
    pub(super) nodes: HashSet<NodeId>,
    /// Those `J` graphs.
    pub(super) closures: HashSet<GraphId>,
}

impl Cx<'_> {
    /// The nodes of `g` to compile: its body, but in a graph with a stack
    /// only what its result needs apart from the pushes (the
    /// backpropagators and what only they use are reverse mode's, which
    /// the region's own reverse replaces).
    pub(super) fn body(&self, g: GraphId) -> Vec<NodeId> {
        let body = graph_body_with(self.m, g, self.fv);
        if !self.erased(g) {
            return body;
        }
        let Some(out) = self.m.graph(g).output else {
            return body;
        };
        let mut live: HashSet<NodeId> = HashSet::new();
        let mut todo = vec![out];
        while let Some(n) = todo.pop() {
            if self.stacks.nodes.contains(&n) {
                continue;
            }
            // A graph it calls or chooses needs its free variables.
            if let Some(h) = self.graph_const(n) {
                todo.extend(self.fv.get(h).iter().copied());
                continue;
            }
            if self.m.node(n).graph != Some(g) || !live.insert(n) {
                continue;
            }
            todo.extend(self.m.inputs(n).iter().copied());
        }
        body.into_iter().filter(|n| live.contains(n)).collect()
    }

    /// Whether `g` returns its value beside a stack or a backpropagator.
    fn erased(&self, g: GraphId) -> bool {
        self.stacks.param.contains_key(&g) || self.stacks.closures.contains(&g)
    }

    /// Whether node `n` is a call that returns `(value, stack)` (its last
    /// argument is a stack: a tail call between `J'` graphs, or the call
    /// that starts a loop's stack) or `(value, backpropagator)` (a call of
    /// `J` graphs in [`Stacks::closures`]).
    fn passes_stack(&self, n: NodeId) -> bool {
        let ins = self.m.inputs(n);
        if self.stacks.param.is_empty() || ins.is_empty() || self.m.applied_prim(n).is_some() {
            return false;
        }
        if ins.len() >= 2 && self.stacks.nodes.contains(ins.last().expect("checked")) {
            return true;
        }
        let callees = callees(self.m, ins[0]);
        !callees.is_empty() && callees.iter().all(|h| self.stacks.closures.contains(h))
    }

    /// The shape of the value `J'` graph `g` returns beside its stack: a
    /// `(value, stack)` it builds, or what the `J'` graphs it tail-calls
    /// return (graphs in `seen` are being looked at: their results join
    /// the others').
    fn stacked_value(&self, g: GraphId, seen: &mut HashSet<GraphId>) -> Option<Shape> {
        if !self.erased(g) || !seen.insert(g) {
            return None;
        }
        let out = self.m.graph(g).output?;
        let ins = self.m.inputs(out);
        if self.m.applied_prim(out) == Some(Prim::MakeTuple) {
            let [_, v, s] = ins else {
                return None;
            };
            return self
                .stacks
                .nodes
                .contains(s)
                .then(|| self.shape(*v))
                .flatten();
        }
        if !self.passes_stack(out) {
            return None;
        }
        self.called_value(ins[0], seen)
    }

    /// What the `J'` or `J` graphs a call with callee `head` may call
    /// return beside their stack or backpropagator (the same for all;
    /// graphs in `seen` are being looked at and add nothing new).
    fn called_value(&self, head: NodeId, seen: &mut HashSet<GraphId>) -> Option<Shape> {
        let mut value = None;
        for h in callees(self.m, head) {
            // A callee already being looked at adds nothing new.
            let Some(v) = self.stacked_value(h, seen) else {
                if seen.contains(&h) {
                    continue;
                }
                return None;
            };
            if value.as_ref().is_some_and(|w| *w != v) {
                return None;
            }
            value = Some(v);
        }
        value
    }

    pub(super) fn shape(&self, n: NodeId) -> Option<Shape> {
        if self.stacks.nodes.contains(&n) {
            return Some(Shape::Stack);
        }
        if !self.stacks.param.is_empty() {
            // `(value, stack)`: what `J'` graphs return.
            if self.m.applied_prim(n) == Some(Prim::MakeTuple)
                && self
                    .m
                    .inputs(n)
                    .last()
                    .is_some_and(|l| self.stacks.nodes.contains(l))
            {
                let items: Option<Vec<Shape>> = self.m.inputs(n)[1..]
                    .iter()
                    .map(|i| self.shape(*i))
                    .collect();
                return items.map(Shape::Tuple);
            }
            if self.passes_stack(n) {
                let value = self.called_value(self.m.inputs(n)[0], &mut HashSet::new())?;
                return Some(Shape::Tuple(vec![value, Shape::Stack]));
            }
        }
        match self.m.as_const(n) {
            Some(Const::Unit) => Some(Shape::Tuple(Vec::new())),
            Some(c) => literal(c).map(|(s, _)| Shape::Scalar(s.ty(), s.ty() != SType::Bool)),
            None => Shape::of(&self.types.value_of(n)?),
        }
    }

    /// The operand type of `n` for the promotion rules.
    fn weak_dtype(&self, n: NodeId) -> Option<WeakDType> {
        match self.m.as_const(n) {
            Some(c) => literal(c).map(|(_, w)| w),
            None => self.shape(n)?.scalar().map(|(t, w)| (t.dtype(), w)),
        }
    }

    /// The element type of a scalar or tensor operand `n`.
    fn elem_dtype(&self, n: NodeId) -> Option<WeakDType> {
        match self.m.as_const(n) {
            Some(c) => literal(c).map(|(_, w)| w),
            None => self.shape(n)?.elem().map(|(t, w)| (t.dtype(), w)),
        }
    }

    /// The axes of a scalar or tensor operand `n` (none for a literal).
    fn dims_of(&self, n: NodeId) -> Option<Vec<usize>> {
        match self.m.as_const(n) {
            Some(c) => literal(c).map(|_| Vec::new()),
            None => self.shape(n)?.dims().map(<[usize]>::to_vec),
        }
    }

    /// Whether operand `n` broadcasts to `dims`.
    fn broadcasts(&self, n: NodeId, dims: &[usize]) -> Option<()> {
        broadcast_map(&self.dims_of(n)?, dims).map(|_| ())
    }

    /// The values of `nodes` if all are int literals.
    fn literal_ints(&self, nodes: &[NodeId]) -> Option<Vec<i64>> {
        nodes
            .iter()
            .map(|i| match self.m.as_const(*i) {
                Some(Const::Int(v)) => Some(*v),
                _ => None,
            })
            .collect()
    }

    /// The int literals of a tuple of index components built in the graph.
    fn const_ints(&self, n: NodeId) -> Option<Vec<i64>> {
        (self.m.applied_prim(n) == Some(Prim::MakeTuple))
            .then(|| self.literal_ints(&self.m.inputs(n)[1..]))
            .flatten()
    }

    pub(super) fn graph_const(&self, n: NodeId) -> Option<GraphId> {
        match self.m.as_const(n) {
            Some(Const::Graph(h)) => Some(*h),
            _ => None,
        }
    }

    /// `switch(c, @a, @b)`: the two graphs.
    fn choice(&self, n: NodeId) -> Option<(NodeId, GraphId, GraphId)> {
        self.m.graph_switch(n)
    }

    /// The local conditions on `g`; `None` if it cannot join a region.
    fn analyze(&self, g: GraphId) -> Option<Info> {
        let (m, types) = (self.m, self.types);
        if types.is_escaped(g) || types.specs_of(g).is_empty() {
            return None;
        }
        let graph = m.graph(g);
        let out = graph.output?;
        for &p in &graph.params {
            let sh = self.shape(p)?;
            (sh.is_value() || matches!(sh, Shape::Io | Shape::Stack | Shape::Zero)).then_some(())?;
            // A tuple whose items change type from one call to the next
            // (weak ints on a loop's first trip, floats after it: `adopt`
            // makes only bare literals floats) has a joined type no one
            // call has.
            if let Shape::Tuple(_) = sh {
                for &id in types.specs_of(g) {
                    let v = types.spec(id).values.get(&p).and_then(Shape::of)?;
                    v.same_layout(&sh).then_some(())?;
                }
            }
        }
        for &p in self.fv.get(g) {
            let sh = self.shape(p)?;
            // (A symbolic zero, forward mode's tangent of a constant, is
            // no machine value.)
            (sh.elem().is_some() || matches!(sh, Shape::Buffer(..) | Shape::Zero)).then_some(())?;
        }
        (!self.shape(out)?.has_buffer()).then_some(())?;
        let body = self.body(g);
        let choices: HashSet<NodeId> = body
            .iter()
            .copied()
            .filter(|n| self.choice(*n).is_some())
            .collect();
        let mut calls = Vec::new();
        for &n in &body {
            let ins = m.inputs(n);
            let &head = ins.first()?;
            // A buffer is only indexed (or marked by reverse mode, which
            // then checks that its cotangent is not read); nothing made
            // here is one.
            let p = m.applied_prim(n);
            let mark = p == Some(Prim::AdKey) && !self.stacks.param.is_empty();
            if !mark && self.shape(n).is_some_and(|s| s.has_buffer()) {
                return None;
            }
            for (k, &i) in ins.iter().enumerate() {
                let read = k == 1 && (p == Some(Prim::Index) || mark);
                if !read && self.shape(i).is_some_and(|s| s.has_buffer()) {
                    return None;
                }
            }
            // Graph constants and choices may only be called (or chosen).
            for (k, &i) in ins.iter().enumerate() {
                let chosen = choices.contains(&n) && k >= 2;
                let erased = self.stacks.nodes.contains(&i);
                if (self.graph_const(i).is_some() || choices.contains(&i))
                    && k != 0
                    && !chosen
                    && !erased
                {
                    return None;
                }
            }
            if choices.contains(&n) {
                if self.weak_dtype(ins[1])?.0 != DType::Bool {
                    return None;
                }
                continue;
            }
            if let Some(h) = self.graph_const(head) {
                calls.push((h, n == out));
                continue;
            }
            if let Some((_, a, b)) = choices.contains(&head).then(|| self.choice(head)).flatten() {
                calls.push((a, n == out));
                calls.push((b, n == out));
                continue;
            }
            let p = m.applied_prim(n)?;
            // The IO token is only passed on.
            if ins[1..]
                .iter()
                .any(|i| self.shape(*i).is_some_and(|s| s.has_io()))
            {
                return None;
            }
            self.check_prim(n, p)?;
        }
        if choices.contains(&out) || self.graph_const(out).is_some() {
            return None;
        }
        Some(Info { calls })
    }

    /// Whether primitive application `n` has a native scalar form.
    fn check_prim(&self, n: NodeId, p: Prim) -> Option<()> {
        let ins = &self.m.inputs(n)[1..];
        let result = self.shape(n)?;
        match p {
            Prim::MakeTuple => {
                for &i in ins {
                    self.shape(i)?;
                }
            }
            Prim::TupleGet => {
                let Shape::Tuple(items) = self.shape(ins[0])? else {
                    return None;
                };
                let k = self.const_index(ins[1])?;
                (k < items.len()).then_some(())?;
            }
            Prim::Switch => {
                let (r, _) = result.elem()?;
                if self.weak_dtype(ins[0])?.0 != DType::Bool {
                    return None;
                }
                for &i in &ins[1..] {
                    if self.elem_dtype(i)?.0 != r.dtype() {
                        return None;
                    }
                    self.broadcasts(i, result.dims()?)?;
                }
            }
            Prim::Cast => {
                result.elem()?;
                self.elem_dtype(ins[0])?;
                (self.dims_of(ins[0])? == result.dims()?).then_some(())?;
            }
            Prim::Index => {
                let (Shape::Tensor(t, _, dims) | Shape::Buffer(t, dims)) = self.shape(ins[0])?
                else {
                    return None;
                };
                let comps = &ins[1..];
                if comps.is_empty() || comps.len() > dims.len() {
                    return None;
                }
                for (axis, &c) in comps.iter().enumerate() {
                    match self.m.as_const(c) {
                        Some(Const::Int(i)) => {
                            static_block(&[*i], &dims[axis..=axis])?;
                        }
                        Some(_) => return None,
                        None => (self.shape(c)?.scalar()?.0 == SType::I64).then_some(())?,
                    }
                }
                let (r, _) = result.elem()?;
                (r == t && result.dims()? == &dims[comps.len()..]).then_some(())?;
            }
            Prim::IndexSet => {
                let Shape::Tensor(t, _, dims) = self.shape(ins[0])? else {
                    return None;
                };
                let Shape::Tuple(items) = self.shape(ins[1])? else {
                    return None;
                };
                if items.is_empty() || items.len() > dims.len() {
                    return None;
                }
                for item in &items {
                    (item.scalar()?.0 == SType::I64).then_some(())?;
                }
                if let Some(is) = self.const_ints(ins[1]) {
                    static_block(&is, &dims)?;
                }
                self.elem_dtype(ins[2])?;
                self.broadcasts(ins[2], &dims[items.len()..])?;
                (result == Shape::Tensor(t, result.elem()?.1, dims)).then_some(())?;
            }
            Prim::Sum => {
                let Shape::Tensor(t, _, dims) = self.shape(ins[0])? else {
                    return None;
                };
                (t != SType::Bool).then_some(())?;
                let (_, kept) = self.reduced(n, &dims)?;
                let (r, _) = result.elem()?;
                (r == t && numel(result.dims()?) == numel(&kept)).then_some(())?;
            }
            Prim::Shape => {
                let dims = self.dims_of(ins[0])?;
                (result == Shape::Tuple(vec![Shape::Scalar(SType::I64, false); dims.len()]))
                    .then_some(())?;
            }
            Prim::Reshape => {
                let x = self.shape(ins[0])?;
                (x.elem()?.0 == result.elem()?.0 && x.width() == result.width()).then_some(())?;
            }
            Prim::Zero => (result == Shape::Zero).then_some(())?,
            // A derivative made concrete for a value of the result's type
            // (the runtime's `finalize`): zeros for a symbolic zero or a
            // value without derivatives, else the derivative cast.
            Prim::GradFinalize => {
                let (r, _) = result.elem()?;
                let x = self.shape(ins[1])?;
                (x.elem()?.0 == r && x.dims()? == result.dims()?).then_some(())?;
                if self.shape(ins[0]) != Some(Shape::Zero) {
                    self.elem_dtype(ins[0])?;
                    (self.dims_of(ins[0])? == result.dims()?).then_some(())?;
                }
            }
            // Constants of the operand's type (forward mode's dense zero
            // tangents).
            Prim::ZerosLike | Prim::OnesLike => {
                let (r, _) = result.elem()?;
                (self.elem_dtype(ins[0])?.0 == r.dtype()
                    && self.dims_of(ins[0])? == result.dims()?)
                .then_some(())?;
            }
            // A marked free variable of a reversed loop: the key's
            // parameter.
            Prim::AdKey if !self.stacks.param.is_empty() => {
                (result.elem().is_some() || matches!(result, Shape::Buffer(..))).then_some(())?;
                self.const_index(ins[1])?;
            }
            Prim::Where => {
                let (r, _) = result.elem()?;
                let (c, a, b) = (
                    self.elem_dtype(ins[0])?,
                    self.elem_dtype(ins[1])?,
                    self.elem_dtype(ins[2])?,
                );
                let (d, _) = dtype::where_result(c, a, b).ok()?;
                (d == r.dtype()).then_some(())?;
                for &i in &ins[..3] {
                    self.broadcasts(i, result.dims()?)?;
                }
            }
            _ => {
                let (r, _) = result.elem()?;
                for &i in ins {
                    self.broadcasts(i, result.dims()?)?;
                }
                if let Some(op) = SUnary::of_prim(p) {
                    let x = self.elem_dtype(*ins.first()?)?;
                    let (d, _) = dtype::unary_result(op.name(), x).ok()?;
                    (ins.len() == 1 && d == r.dtype()).then_some(())?;
                } else if let Some(op) = SBinary::of_prim(p) {
                    if ins.len() != 2 {
                        return None;
                    }
                    let (a, b) = (self.elem_dtype(ins[0])?, self.elem_dtype(ins[1])?);
                    let (c, _) = dtype::binary_operands(op.name(), a, b).ok()?;
                    let (d, _) = dtype::binary_result(op.name(), a, b).ok()?;
                    (op.accepts(SType::of(c)?) && d == r.dtype()).then_some(())?;
                } else {
                    return None;
                }
            }
        }
        Some(())
    }

    /// The axis `sum(x, axis, keepdims)` (node `n`, `x` of shape `dims`)
    /// reduces (`None`: all of them) and the axes it keeps; `None` unless
    /// its axis is `()` or an int literal and `keepdims` a literal.
    fn reduced(&self, n: NodeId, dims: &[usize]) -> Option<(Option<usize>, Vec<usize>)> {
        let ins = &self.m.inputs(n)[1..];
        let [_, axis, keep] = ins else {
            return None;
        };
        matches!(self.m.as_const(*keep), Some(Const::Bool(_))).then_some(())?;
        match self.m.as_const(*axis)? {
            Const::Unit => Some((None, Vec::new())),
            Const::Int(a) => {
                let a = if *a < 0 { a + dims.len() as i64 } else { *a };
                let a = usize::try_from(a).ok().filter(|a| *a < dims.len())?;
                let mut kept = dims.to_vec();
                kept.remove(a);
                Some((Some(a), kept))
            }
            _ => None,
        }
    }

    fn const_index(&self, n: NodeId) -> Option<usize> {
        match self.m.as_const(n) {
            Some(Const::Int(i)) => usize::try_from(*i).ok(),
            _ => None,
        }
    }
}

/// The graphs that can be compiled, closed under calls, with no cycle of
/// non-tail calls.
pub(super) fn compilable(cx: &Cx, graphs: &[GraphId]) -> HashMap<GraphId, Info> {
    let mut ok: HashMap<GraphId, Info> = graphs
        .iter()
        .filter_map(|g| cx.analyze(*g).map(|i| (*g, i)))
        .collect();
    loop {
        let before = ok.len();
        // Closed under calls, except tail calls out of the region (its
        // exits, see `region`).
        let bad: Vec<GraphId> = ok
            .iter()
            .filter(|(_, i)| i.calls.iter().any(|(h, tail)| !tail && !ok.contains_key(h)))
            .map(|(g, _)| *g)
            .collect();
        for g in bad {
            ok.remove(&g);
        }
        // No recursion through non-tail calls.
        let mut dg: DiGraph<GraphId, bool> = DiGraph::new();
        let mut idx = HashMap::new();
        let mut keys: Vec<GraphId> = ok.keys().copied().collect();
        keys.sort_by_key(|g| g.0);
        for g in &keys {
            idx.insert(*g, dg.add_node(*g));
        }
        for g in &keys {
            for (h, tail) in &ok[g].calls {
                if let Some(&j) = idx.get(h) {
                    dg.add_edge(idx[g], j, *tail);
                }
            }
        }
        let mut scc_of = HashMap::new();
        for (k, scc) in tarjan_scc(&dg).into_iter().enumerate() {
            for n in scc {
                scc_of.insert(dg[n], k);
            }
        }
        let bad: HashSet<usize> = keys
            .iter()
            .flat_map(|g| {
                ok[g]
                    .calls
                    .iter()
                    .filter(|(h, tail)| !tail && ok.contains_key(h) && scc_of[h] == scc_of[g])
                    .map(|_| scc_of[g])
                    .collect::<Vec<_>>()
            })
            .collect();
        ok.retain(|g, _| !bad.contains(&scc_of[g]));
        if ok.len() == before {
            return ok;
        }
    }
}

/// The graphs a region entered at `g` runs.
pub(super) struct Region {
    /// `g` first.
    pub(super) order: Vec<GraphId>,
    /// Whether some graph of it reaches itself (a loop).
    pub(super) cyclic: bool,
    /// Graphs outside the region that graphs of it tail-call: where the
    /// loop hands over to the VM.
    pub(super) exits: Vec<GraphId>,
}

pub(super) fn region(ok: &HashMap<GraphId, Info>, g: GraphId) -> Region {
    let mut order = vec![g];
    let mut seen: HashSet<GraphId> = HashSet::from([g]);
    let mut exits = Vec::new();
    let mut k = 0;
    while k < order.len() {
        for (h, _) in &ok[&order[k]].calls {
            if !ok.contains_key(h) {
                if !exits.contains(h) {
                    exits.push(*h);
                }
            } else if seen.insert(*h) {
                order.push(*h);
            }
        }
        k += 1;
    }
    let inside = |x: &GraphId| ok.contains_key(x);
    // A cycle: some graph reaches itself.
    let cyclic = order.iter().any(|&s| {
        let mut stack: Vec<GraphId> = ok[&s]
            .calls
            .iter()
            .map(|(h, _)| *h)
            .filter(inside)
            .collect();
        let mut visited = HashSet::new();
        while let Some(x) = stack.pop() {
            if x == s {
                return true;
            }
            if visited.insert(x) {
                stack.extend(ok[&x].calls.iter().map(|(h, _)| *h).filter(inside));
            }
        }
        false
    });
    Region {
        order,
        cyclic,
        exits,
    }
}

/// How a region that exits to the VM ends: every graph reached from the
/// entry through tail calls (`chain`) returns the arguments of the exit's
/// call, through the function `func` (the last of the program).
pub(super) struct Exit {
    graph: GraphId,
    chain: HashSet<GraphId>,
    /// The exit call's arguments: their shapes (`Shape::Io` for the token).
    shapes: Vec<Shape>,
    /// A graph-constant node of the exit graph, for the VM's call.
    callee: NodeId,
    func: u32,
}

impl Exit {
    /// The kernel's result: the exit's arguments but the token.
    fn result(&self) -> Shape {
        Shape::Tuple(
            self.shapes
                .iter()
                .filter(|s| **s != Shape::Io)
                .cloned()
                .collect(),
        )
    }
}

/// The exit of region `r` entered at `g`, if it has a usable one.
fn exit_of(cx: &Cx, ok: &HashMap<GraphId, Info>, r: &Region) -> Option<Exit> {
    let [x] = r.exits[..] else {
        return None;
    };
    let g = r.order[0];
    // The graphs the entry reaches through tail calls.
    let mut chain: HashSet<GraphId> = HashSet::from([g]);
    let mut stack = vec![g];
    while let Some(a) = stack.pop() {
        for (h, tail) in &ok[&a].calls {
            if *tail && ok.contains_key(h) && chain.insert(*h) {
                stack.push(*h);
            }
        }
    }
    let members: HashSet<GraphId> = r.order.iter().copied().collect();
    let mut shapes: Option<Vec<Shape>> = None;
    let mut callee = None;
    for &a in &r.order {
        for (h, tail) in &ok[&a].calls {
            // A chain graph is only ever tail-called (it returns the exit's
            // arguments), and only chain graphs exit.
            if !tail && chain.contains(h) {
                return None;
            }
            if *h == x && !chain.contains(&a) {
                return None;
            }
        }
        if !chain.contains(&a) {
            continue;
        }
        // The exit calls in `a`, with the same argument shapes everywhere.
        let out = cx.m.graph(a).output?;
        let head = cx.m.inputs(out).first().copied();
        let node = match head.and_then(|h| cx.graph_const(h).map(|k| (h, k))) {
            Some((hn, k)) if k == x => Some(hn),
            _ => head.and_then(|h| {
                let (_, p, q) = cx.choice(h)?;
                let ins = cx.m.inputs(h);
                if p == x {
                    Some(ins[2])
                } else if q == x {
                    Some(ins[3])
                } else {
                    None
                }
            }),
        };
        let Some(node) = node else {
            continue;
        };
        let here: Vec<Shape> = cx.m.inputs(out)[1..]
            .iter()
            .map(|v| cx.shape(*v))
            .collect::<Option<_>>()?;
        // (The continuation passes on the token, not a zero.)
        if here.contains(&Shape::Zero) {
            return None;
        }
        match &shapes {
            None => shapes = Some(here),
            Some(s) if *s == here => {}
            Some(_) => return None,
        }
        callee = Some(node);
    }
    // The exit's closure is made where the kernel runs: none of its free
    // variables may belong to the region.
    if cx
        .fv
        .get(x)
        .iter()
        .any(|u| cx.m.node(*u).graph.is_some_and(|o| members.contains(&o)))
    {
        return None;
    }
    Some(Exit {
        graph: x,
        chain,
        shapes: shapes?,
        callee: callee?,
        func: r.order.len() as u32,
    })
}

/// A compiled region and its exit, shared by the calls that enter it.
type Built = Arc<(Arc<ScalarKernel>, Option<Exit>)>;

/// Adds a group for every call from VM code into a loop over scalars.
pub(super) fn scalar_groups(
    m: &Module,
    graphs: &[GraphId],
    types: &Types,
    fv: &FreeVars,
    plan: &mut Plan,
) {
    let stacks = Stacks::default();
    let cx = Cx {
        m,
        types,
        fv,
        stacks: &stacks,
        keys: Vec::new(),
    };
    let ok = compilable(&cx, graphs);
    let trace = tracing::enabled!(target: "adjoint::scalar", tracing::Level::DEBUG);
    if trace {
        let mut names: Vec<&str> = ok.keys().map(|g| m.graph(*g).name.as_str()).collect();
        names.sort();
        tracing::debug!(target: "adjoint::scalar", "scalar: compilable graphs: {}", names.join(" "));
    }
    if ok.is_empty() {
        return;
    }
    let mut native: HashSet<GraphId> = HashSet::new();
    let mut programs: HashMap<GraphId, Option<Built>> = HashMap::new();
    // VM code first, then compilable graphs that no region runs (reached
    // through closures the VM calls).
    for pass in 0..2 {
        for &h in graphs {
            if (pass == 0) == ok.contains_key(&h) || native.contains(&h) {
                continue;
            }
            for n in graph_body_with(m, h, fv) {
                let Some(g) = m.inputs(n).first().and_then(|c| cx.graph_const(*c)) else {
                    continue;
                };
                if !ok.contains_key(&g) || plan.member_of.contains_key(&n) {
                    continue;
                }
                let r = region(&ok, g);
                if !r.cyclic || !entry_types_match(&cx, n, g) {
                    continue;
                }
                let built = programs
                    .entry(g)
                    .or_insert_with(|| {
                        let exit = if r.exits.is_empty() {
                            None
                        } else {
                            Some(exit_of(&cx, &ok, &r)?)
                        };
                        let kernel = build(&cx, &r.order, exit.as_ref());
                        if trace {
                            tracing::debug!(
                                target: "adjoint::scalar",
                                "scalar: region @{} ({} graphs, exits {:?}): {}",
                                m.graph(g).name,
                                r.order.len(),
                                r.exits
                                    .iter()
                                    .map(|x| &m.graph(*x).name)
                                    .collect::<Vec<_>>(),
                                if kernel.is_some() {
                                    "compiled"
                                } else {
                                    "not compiled"
                                }
                            );
                        }
                        Some(Arc::new((Arc::new(kernel?), exit)))
                    })
                    .clone();
                let Some(built) = built else {
                    continue;
                };
                let (kernel, exit) = &*built;
                let args = &m.inputs(n)[1..];
                let io: Vec<NodeId> = args
                    .iter()
                    .copied()
                    .filter(|a| cx.shape(*a) == Some(Shape::Io))
                    .collect();
                let then = match exit {
                    None => None,
                    Some(e) => {
                        // The token inside the region is the one passed in.
                        let token = match (io.as_slice(), e.shapes.contains(&Shape::Io)) {
                            ([t], _) => Some(*t),
                            (_, false) => None,
                            _ => continue,
                        };
                        let mut k = 0;
                        let mut cargs = Vec::new();
                        for sh in &e.shapes {
                            if *sh == Shape::Io {
                                cargs.push(ContArg::Node(token.expect("a token")));
                            } else {
                                cargs.push(ContArg::Result(k));
                                k += 1;
                            }
                        }
                        Some(Continuation {
                            callee: e.callee,
                            args: cargs,
                        })
                    }
                };
                native.extend(r.order.iter().copied());
                let inputs: Vec<NodeId> = args
                    .iter()
                    .chain(fv.get(g))
                    .copied()
                    .filter(|a| !matches!(cx.shape(*a), Some(Shape::Io | Shape::Zero)))
                    .collect();
                add_call_group(
                    plan,
                    m,
                    h,
                    n,
                    inputs,
                    kernel.describe(exit.as_ref().map(|e| m.graph(e.graph).name.as_str())),
                    &kernel.compiled,
                    kernel.clone(),
                    then,
                );
            }
        }
    }
}

/// Whether the arguments of call `n` have the parameter types of `g`.
pub(super) fn entry_types_match(cx: &Cx, n: NodeId, g: GraphId) -> bool {
    let args = &cx.m.inputs(n)[1..];
    let params = &cx.m.graph(g).params;
    args.len() == params.len()
        && args.iter().zip(params).all(|(a, p)| {
            if let Some(sh @ (Shape::Io | Shape::Zero)) = cx.shape(*p) {
                return cx.shape(*a) == Some(sh);
            }
            if let Some(sh @ Shape::Tuple(_)) = cx.shape(*p) {
                return cx.shape(*a).is_some_and(|s| s.same_layout(&sh));
            }
            match (cx.elem_dtype(*a), cx.elem_dtype(*p)) {
                (Some(x), Some(y)) => x.0 == y.0 && cx.dims_of(*a) == cx.dims_of(*p),
                _ => false,
            }
        })
}

/// The program of a region: one function per graph, `order[0]` first.
pub(super) fn program_of(cx: &Cx, order: &[GraphId], exit: Option<&Exit>) -> Option<ScalarProgram> {
    let index: HashMap<GraphId, u32> = order
        .iter()
        .enumerate()
        .map(|(i, g)| (*g, i as u32))
        .collect();
    // The buffers, in the order of the entry's free variables (the
    // kernel's inputs after its arguments); a member reading one the
    // entry does not list cannot be given it.
    let mut slots: HashMap<NodeId, u32> = HashMap::new();
    let mut buffers = Vec::new();
    for &u in cx.fv.get(order[0]) {
        if let Some(Shape::Buffer(ty, dims)) = cx.shape(u) {
            slots.insert(u, buffers.len() as u32);
            buffers.push(SBuffer {
                ty,
                len: numel(&dims),
            });
        }
    }
    let mut funcs = Vec::new();
    for &g in order {
        let f = FuncBuilder::new(cx, g, &index, exit, &slots).and_then(FuncBuilder::build);
        if f.is_none() {
            tracing::debug!(
                target: "adjoint::scalar",
                "scalar: @{} has no scalar function",
                cx.m.graph(g).name
            );
        }
        funcs.push(f?);
    }
    if let Some(e) = exit {
        // Returns the exit call's arguments.
        let tys: Vec<SType> = e.shapes.iter().flat_map(Shape::flat).collect();
        funcs.push(SFunc {
            name: format!("exit to @{}", cx.m.graph(e.graph).name),
            params: tys.clone(),
            results: tys.clone(),
            body: Vec::new(),
            term: STerm::Return((0..tys.len() as u32).map(SVal).collect()),
        });
    }
    let insts: usize = funcs.iter().map(|f| f.body.len()).sum();
    let nodes: usize = order.iter().map(|g| cx.body(*g).len()).sum();
    if insts > MAX_LANE_OPS * nodes.max(1) {
        tracing::debug!(
            target: "adjoint::scalar",
            "scalar: @{} makes {insts} instructions for {nodes} operations: \
             its tensors are wide enough for the VM's vector kernels",
            cx.m.graph(order[0]).name
        );
        return None;
    }
    if insts > MAX_INSTS {
        tracing::debug!(
            target: "adjoint::scalar",
            "scalar: @{} makes {insts} instructions, more than {MAX_INSTS}",
            cx.m.graph(order[0]).name
        );
        return None;
    }
    Some(ScalarProgram { funcs, buffers })
}

/// Builds and compiles the program of a region.
fn build(cx: &Cx, order: &[GraphId], exit: Option<&Exit>) -> Option<ScalarKernel> {
    let program = program_of(cx, order, exit)?;
    // Compilation validates the program first.
    let compiled = match compile_scalar_cached(&program) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(
                target: "adjoint::fuse",
                "scalar region @{}: {e}",
                cx.m.graph(order[0]).name
            );
            return None;
        }
    };
    let g = order[0];
    // The kernel's arguments: the entry's parameters but the token and
    // zeros, then its free variables.
    let graph = cx.m.graph(g);
    let inputs: Vec<Shape> = graph
        .params
        .iter()
        .chain(cx.fv.get(g))
        .map(|p| cx.shape(*p))
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .filter(|s| !matches!(s, Shape::Io | Shape::Zero | Shape::Stack))
        .collect();
    let result = match exit {
        Some(e) => e.result(),
        None => cx.shape(cx.m.graph(g).output?)?,
    };
    Some(ScalarKernel {
        name: format!("scalar loop @{}", cx.m.graph(g).name),
        graphs: order.iter().map(|g| cx.m.graph(*g).name.clone()).collect(),
        inputs,
        result,
        compiled,
    })
}

struct FuncBuilder<'a, 'c> {
    cx: &'a Cx<'c>,
    g: GraphId,
    index: &'a HashMap<GraphId, u32>,
    exit: Option<&'a Exit>,
    params: Vec<SType>,
    body: Vec<SInst>,
    next: u32,
    vals: HashMap<NodeId, Vec<SVal>>,
    /// The parameters of the region's keys ([`Cx::keys`]).
    keys: HashMap<i64, Vec<SVal>>,
    /// The program's buffer of each free variable read in place.
    buffers: &'a HashMap<NodeId, u32>,
}

impl<'a, 'c> FuncBuilder<'a, 'c> {
    fn new(
        cx: &'a Cx<'c>,
        g: GraphId,
        index: &'a HashMap<GraphId, u32>,
        exit: Option<&'a Exit>,
        buffers: &'a HashMap<NodeId, u32>,
    ) -> Option<Self> {
        let mut b = FuncBuilder {
            cx,
            g,
            index,
            exit,
            params: Vec::new(),
            body: Vec::new(),
            next: 0,
            vals: HashMap::new(),
            keys: HashMap::new(),
            buffers,
        };
        let graph = cx.m.graph(g);
        for &p in graph.params.iter().chain(cx.fv.get(g)) {
            if matches!(cx.shape(p)?, Shape::Buffer(..)) {
                buffers.get(&p)?;
            }
            if matches!(cx.shape(p)?, Shape::Io | Shape::Stack | Shape::Zero) {
                b.vals.insert(p, Vec::new());
                continue;
            }
            let vs = b.param(&cx.shape(p)?);
            b.vals.insert(p, vs);
        }
        for (k, sh) in &cx.keys {
            let vs = b.param(sh);
            b.keys.insert(*k, vs);
        }
        Some(b)
    }

    /// New parameters holding a value of shape `sh`, one per scalar.
    fn param(&mut self, sh: &Shape) -> Vec<SVal> {
        let tys = sh.flat();
        let vs = (0..tys.len() as u32).map(|k| SVal(self.next + k)).collect();
        self.next += tys.len() as u32;
        self.params.extend(tys);
        vs
    }

    fn push(&mut self, op: SOp, results: Vec<SType>) -> Vec<SVal> {
        let vs: Vec<SVal> = (0..results.len())
            .map(|k| SVal(self.next + k as u32))
            .collect();
        self.next += results.len() as u32;
        self.body.push(SInst::new(op, results));
        vs
    }

    /// The flattened values of `n` with the types of `shape` (literals
    /// are made of that type).
    fn values(&mut self, n: NodeId, shape: &Shape) -> Option<Vec<SVal>> {
        if *shape == Shape::Stack {
            return Some(Vec::new());
        }
        if *shape == Shape::Zero {
            return (self.cx.shape(n)? == Shape::Zero).then(Vec::new);
        }
        if let Some(c) = self.cx.m.as_const(n) {
            if *c == Const::Unit {
                return (*shape == Shape::Tuple(Vec::new())).then(Vec::new);
            }
            let (s, _) = literal(c)?;
            let (t, _) = shape.scalar()?;
            return Some(self.push(SOp::Const(s.cast(t)), vec![t]));
        }
        let vs = self.vals.get(&n)?.clone();
        (vs.len() == shape.width()).then_some(vs)
    }

    /// The single value of `n` converted to `t` (the promotion rules'
    /// conversion of an operand).
    fn operand(&mut self, n: NodeId, t: SType) -> Option<SVal> {
        if let Some(c) = self.cx.m.as_const(n) {
            let (s, _) = literal(c)?;
            return Some(self.push(SOp::Const(s.cast(t)), vec![t])[0]);
        }
        let (have, _) = self.cx.shape(n)?.scalar()?;
        let v = *self.vals.get(&n)?.first()?;
        if have == t {
            Some(v)
        } else {
            Some(self.push(SOp::Cast(v), vec![t])[0])
        }
    }

    /// The lanes of operand `n` converted to `t` and broadcast to `dims`
    /// (a literal or a scalar is repeated).
    fn lanes(&mut self, n: NodeId, t: SType, dims: &[usize]) -> Option<Vec<SVal>> {
        let (src, from) = if self.cx.m.as_const(n).is_some() {
            (vec![self.operand(n, t)?], Vec::new())
        } else {
            let sh = self.cx.shape(n)?;
            let (have, _) = sh.elem()?;
            let from = sh.dims()?.to_vec();
            let vs = self.vals.get(&n)?.clone();
            (vs.len() == numel(&from)).then_some(())?;
            let vs = if have == t {
                vs
            } else {
                vs.into_iter()
                    .map(|v| self.push(SOp::Cast(v), vec![t])[0])
                    .collect()
            };
            (vs, from)
        };
        Some(
            broadcast_map(&from, dims)?
                .into_iter()
                .map(|k| src[k])
                .collect(),
        )
    }

    fn int(&mut self, i: i64) -> SVal {
        self.push(SOp::Const(Scalar::I64(i)), vec![SType::I64])[0]
    }

    /// For each row-major block of the first `comps.len()` axes of `dims`,
    /// whether index components `comps` (i64 values, checked and counted
    /// from the end as indexing does) select it.
    fn block(&mut self, comps: &[SVal], dims: &[usize]) -> Vec<SVal> {
        let at = self.block_at(comps, dims);
        (0..numel(&dims[..comps.len()]))
            .map(|r| {
                let k = self.int(r as i64);
                self.push(SOp::Binary(SBinary::Eq, at, k), vec![SType::Bool])[0]
            })
            .collect()
    }

    /// The row-major number of the block of the first `comps.len()` axes
    /// of `dims` that index components `comps` select (each checked and
    /// counted from the end as indexing does).
    fn block_at(&mut self, comps: &[SVal], dims: &[usize]) -> SVal {
        let mut at = None;
        for (axis, &c) in comps.iter().enumerate() {
            let j = self.push(
                SOp::Bound {
                    index: c,
                    size: dims[axis] as u32,
                    axis: axis as u32,
                },
                vec![SType::I64],
            )[0];
            at = Some(match at {
                None => j,
                Some(a) => {
                    let d = self.int(dims[axis] as i64);
                    let scaled = self.push(SOp::Binary(SBinary::Mul, a, d), vec![SType::I64])[0];
                    self.push(SOp::Binary(SBinary::Add, scaled, j), vec![SType::I64])[0]
                }
            });
        }
        at.expect("at least one component")
    }

    /// The index components of `index(x, c..)` as i64 values (literals
    /// made constants).
    fn components(&mut self, comps: &[NodeId]) -> Option<Vec<SVal>> {
        comps
            .iter()
            .map(|&c| match self.cx.m.as_const(c) {
                Some(Const::Int(i)) => Some(self.int(*i)),
                Some(_) => None,
                None => self.vals.get(&c)?.first().copied(),
            })
            .collect()
    }

    /// A call of `h` with the arguments `args` (an exit: of the exit
    /// function).
    fn call(&mut self, h: GraphId, args: &[NodeId]) -> Option<SCall> {
        let m = self.cx.m;
        if let Some(e) = self.exit.filter(|e| e.graph == h) {
            let mut vs = Vec::new();
            for (&a, sh) in args.iter().zip(&e.shapes) {
                vs.extend(self.values(a, sh)?);
            }
            return Some(SCall {
                func: FuncIdx(e.func),
                args: vs,
            });
        }
        let callee = m.graph(h);
        if callee.params.len() != args.len() {
            return None;
        }
        let mut vs = Vec::new();
        for (&a, &p) in args.iter().zip(&callee.params) {
            let shape = self.cx.shape(p)?;
            if shape == Shape::Io {
                (self.cx.shape(a)? == Shape::Io).then_some(())?;
                continue;
            }
            if shape == Shape::Stack {
                // Within the region; the entry's `()` is passed by the
                // kernel's caller.
                (self.cx.shape(a)? == Shape::Stack).then_some(())?;
                continue;
            }
            if shape == Shape::Zero {
                (self.cx.shape(a)? == Shape::Zero).then_some(())?;
                continue;
            }
            if let Shape::Tuple(_) = shape {
                // Scalar by scalar, in the parameter's layout.
                self.cx.shape(a)?.same_layout(&shape).then_some(())?;
                vs.extend(self.values(a, &shape)?);
                continue;
            }
            let (t, _) = shape.elem()?;
            let v = self.values(a, &shape)?;
            // An argument is passed as it is: its type must be the
            // parameter's.
            match m.as_const(a) {
                Some(c) => (literal(c)?.0.ty() == t).then_some(())?,
                None => {
                    let sh = self.cx.shape(a)?;
                    (sh.elem()?.0 == t && sh.dims() == shape.dims()).then_some(())?
                }
            }
            vs.extend(v);
        }
        for &u in self.cx.fv.get(h) {
            vs.extend(self.vals.get(&u)?.iter().copied());
        }
        for (k, _) in &self.cx.keys {
            vs.extend(self.keys[k].iter().copied());
        }
        Some(SCall {
            func: FuncIdx(*self.index.get(&h)?),
            args: vs,
        })
    }

    /// The results of graph `h` as a function of the program.
    fn results_of(&self, h: GraphId) -> Option<Vec<SType>> {
        match self.exit {
            Some(e) if e.graph == h || e.chain.contains(&h) => {
                Some(e.shapes.iter().flat_map(Shape::flat).collect())
            }
            _ => Some(self.cx.shape(self.cx.m.graph(h).output?)?.flat()),
        }
    }

    fn build(mut self) -> Option<SFunc> {
        let (cx, m, g) = (self.cx, self.cx.m, self.g);
        let out = m.graph(g).output?;
        let results = self.results_of(g)?;
        let mut term = None;
        for n in cx.body(g) {
            let ins = m.inputs(n).to_vec();
            if cx.choice(n).is_some() || cx.stacks.nodes.contains(&n) {
                continue;
            }
            // Calls.
            let callees: Option<(Option<NodeId>, GraphId, Option<GraphId>)> =
                if let Some(h) = cx.graph_const(ins[0]) {
                    Some((None, h, None))
                } else {
                    cx.choice(ins[0]).map(|(c, a, b)| (Some(c), a, Some(b)))
                };
            if let Some((cond, a, b)) = callees {
                let rs = self.results_of(a)?;
                if let Some(b) = b {
                    (self.results_of(b)? == rs).then_some(())?;
                }
                let ca = self.call(a, &ins[1..])?;
                let cb = match b {
                    Some(b) => Some(self.call(b, &ins[1..])?),
                    None => None,
                };
                let cond = match cond {
                    Some(c) => Some(self.operand(c, SType::Bool)?),
                    None => None,
                };
                if n == out {
                    (rs == results).then_some(())?;
                    term = Some(match (cond, cb) {
                        (Some(c), Some(cb)) => STerm::TailCallIf(c, ca, cb),
                        _ => STerm::TailCall(ca),
                    });
                } else {
                    (cx.shape(n)?.flat() == rs).then_some(())?;
                    let op = match (cond, cb) {
                        (Some(c), Some(cb)) => SOp::CallIf(c, ca, cb),
                        _ => SOp::Call(ca),
                    };
                    let vs = self.push(op, rs);
                    self.vals.insert(n, vs);
                }
                continue;
            }
            let p = m.applied_prim(n)?;
            let shape = cx.shape(n)?;
            let first = self.body.len();
            let vs = match p {
                Prim::MakeTuple => {
                    let Shape::Tuple(items) = &shape else {
                        return None;
                    };
                    let mut vs = Vec::new();
                    for (&i, s) in ins[1..].iter().zip(items) {
                        vs.extend(self.values(i, s)?);
                    }
                    vs
                }
                Prim::TupleGet => {
                    let Shape::Tuple(items) = cx.shape(ins[1])? else {
                        return None;
                    };
                    let k = cx.const_index(ins[2])?;
                    let start: usize = items[..k].iter().map(Shape::width).sum();
                    let all = self.vals.get(&ins[1])?.clone();
                    all[start..start + items[k].width()].to_vec()
                }
                Prim::Switch => {
                    let (t, _) = shape.elem()?;
                    let dims = shape.dims()?.to_vec();
                    let c = self.operand(ins[1], SType::Bool)?;
                    let a = self.lanes(ins[2], t, &dims)?;
                    let b = self.lanes(ins[3], t, &dims)?;
                    a.into_iter()
                        .zip(b)
                        .map(|(a, b)| self.push(SOp::Select(c, a, b), vec![t])[0])
                        .collect()
                }
                Prim::Index if matches!(cx.shape(ins[1])?, Shape::Buffer(..)) => {
                    let Shape::Buffer(t, dims) = cx.shape(ins[1])? else {
                        return None;
                    };
                    // (A mark of a buffer, whose cotangent nobody reads, is
                    // the buffer.)
                    let src = match m.applied_prim(ins[1]) {
                        Some(Prim::AdKey) => m.inputs(ins[1])[1],
                        _ => ins[1],
                    };
                    let buf = *self.buffers.get(&src)?;
                    let k = ins.len() - 2;
                    let inner = numel(&dims[k..]);
                    let first = match cx.literal_ints(&ins[2..]) {
                        Some(is) => self.int((static_block(&is, &dims)? * inner) as i64),
                        None => {
                            let comps = self.components(&ins[2..])?;
                            let at = self.block_at(&comps, &dims);
                            let w = self.int(inner as i64);
                            self.push(SOp::Binary(SBinary::Mul, at, w), vec![SType::I64])[0]
                        }
                    };
                    (0..inner)
                        .map(|j| {
                            let offset = if j == 0 {
                                first
                            } else {
                                let d = self.int(j as i64);
                                self.push(SOp::Binary(SBinary::Add, first, d), vec![SType::I64])[0]
                            };
                            self.push(SOp::Load { buf, offset }, vec![t])[0]
                        })
                        .collect()
                }
                Prim::Index => {
                    let Shape::Tensor(_, _, dims) = cx.shape(ins[1])? else {
                        return None;
                    };
                    let xs = self.vals.get(&ins[1])?.clone();
                    let k = ins.len() - 2;
                    let inner = numel(&dims[k..]);
                    let (t, _) = shape.elem()?;
                    match cx.literal_ints(&ins[2..]) {
                        Some(is) => {
                            let b = static_block(&is, &dims)?;
                            xs[b * inner..(b + 1) * inner].to_vec()
                        }
                        None => {
                            let comps = self.components(&ins[2..])?;
                            let hits = self.block(&comps, &dims);
                            // Row 0 unless a later row is hit.
                            (0..inner)
                                .map(|j| {
                                    let mut v = xs[j];
                                    for (r, &hit) in hits.iter().enumerate().skip(1) {
                                        v = self
                                            .push(SOp::Select(hit, xs[r * inner + j], v), vec![t])
                                            [0];
                                    }
                                    v
                                })
                                .collect()
                        }
                    }
                }
                Prim::IndexSet => {
                    let Shape::Tensor(t, _, dims) = cx.shape(ins[1])? else {
                        return None;
                    };
                    let xs = self.vals.get(&ins[1])?.clone();
                    let comps = self.vals.get(&ins[2])?.clone();
                    let k = comps.len();
                    let inner = numel(&dims[k..]);
                    let vs = self.lanes(ins[3], t, &dims[k..])?;
                    match cx.const_ints(ins[2]) {
                        Some(is) => {
                            let b = static_block(&is, &dims)?;
                            let mut out = xs;
                            out[b * inner..(b + 1) * inner].copy_from_slice(&vs);
                            out
                        }
                        None => {
                            let hits = self.block(&comps, &dims);
                            xs.iter()
                                .enumerate()
                                .map(|(lane, &old)| {
                                    let (r, j) = (lane / inner, lane % inner);
                                    self.push(SOp::Select(hits[r], vs[j], old), vec![t])[0]
                                })
                                .collect()
                        }
                    }
                }
                Prim::Sum => {
                    let Shape::Tensor(t, _, dims) = cx.shape(ins[1])? else {
                        return None;
                    };
                    let xs = self.vals.get(&ins[1])?.clone();
                    let (axis, kept) = cx.reduced(n, &dims)?;
                    // Row-major over the input, as the runtime adds: floats
                    // in f64 from 0, rounded once; ints wrapping.
                    let acc_t = if t.is_float() { SType::F64 } else { SType::I64 };
                    let zero = match acc_t {
                        SType::F64 => Scalar::F64(0.0),
                        _ => Scalar::I64(0),
                    };
                    let mut acc: Vec<Option<SVal>> = vec![None; numel(&kept)];
                    let to_out = reduce_targets(&dims, axis);
                    for (lane, &x) in xs.iter().enumerate() {
                        let x = if t == acc_t {
                            x
                        } else {
                            self.push(SOp::Cast(x), vec![acc_t])[0]
                        };
                        let o = to_out[lane];
                        let a = match acc[o] {
                            Some(a) => a,
                            None => self.push(SOp::Const(zero), vec![acc_t])[0],
                        };
                        acc[o] = Some(self.push(SOp::Binary(SBinary::Add, a, x), vec![acc_t])[0]);
                    }
                    acc.into_iter()
                        .map(|a| {
                            let a = a?;
                            Some(if t == acc_t {
                                a
                            } else {
                                self.push(SOp::Cast(a), vec![t])[0]
                            })
                        })
                        .collect::<Option<Vec<_>>>()?
                }
                Prim::Shape => {
                    let dims = cx.dims_of(ins[1])?;
                    dims.iter().map(|d| self.int(*d as i64)).collect()
                }
                Prim::Reshape => self.vals.get(&ins[1])?.clone(),
                Prim::AdKey => {
                    let k = cx.const_index(ins[2])? as i64;
                    match self.keys.get(&k) {
                        Some(vs) => vs.clone(),
                        // A mark of a value made inside the region.
                        None => {
                            let x = ins[1];
                            (m.node(x).graph.is_some() && cx.m.as_const(x).is_none())
                                .then_some(())?;
                            self.values(x, &shape)?
                        }
                    }
                }
                Prim::Zero => Vec::new(),
                Prim::GradFinalize => {
                    let (t, _) = shape.elem()?;
                    let dims = shape.dims()?.to_vec();
                    if cx.shape(ins[1]) == Some(Shape::Zero) || !t.is_float() {
                        let zero = self.push(SOp::Const(Scalar::F64(0.0).cast(t)), vec![t])[0];
                        vec![zero; shape.width()]
                    } else {
                        self.lanes(ins[1], t, &dims)?
                    }
                }
                Prim::ZerosLike | Prim::OnesLike => {
                    let (t, _) = shape.elem()?;
                    let one = if p == Prim::OnesLike { 1.0 } else { 0.0 };
                    let c = self.push(SOp::Const(Scalar::F64(one).cast(t)), vec![t])[0];
                    vec![c; shape.width()]
                }
                Prim::Cast => {
                    let (t, _) = shape.elem()?;
                    let dims = shape.dims()?.to_vec();
                    let from = match cx.m.as_const(ins[1]) {
                        Some(c) => literal(c)?.0.ty(),
                        None => cx.shape(ins[1])?.elem()?.0,
                    };
                    let xs = self.lanes(ins[1], from, &dims)?;
                    xs.into_iter()
                        .map(|x| self.push(SOp::Cast(x), vec![t])[0])
                        .collect()
                }
                Prim::Where => {
                    let (t, _) = shape.elem()?;
                    let dims = shape.dims()?.to_vec();
                    let c = self.lanes(ins[1], SType::Bool, &dims)?;
                    let a = self.lanes(ins[2], t, &dims)?;
                    let b = self.lanes(ins[3], t, &dims)?;
                    (0..c.len())
                        .map(|k| self.push(SOp::Select(c[k], a[k], b[k]), vec![t])[0])
                        .collect()
                }
                _ => {
                    let (t, _) = shape.elem()?;
                    let dims = shape.dims()?.to_vec();
                    if let Some(op) = SUnary::of_prim(p) {
                        let xs = self.lanes(ins[1], t, &dims)?;
                        xs.into_iter()
                            .map(|x| self.push(SOp::Unary(op, x), vec![t])[0])
                            .collect()
                    } else {
                        let op = SBinary::of_prim(p)?;
                        let (a, b) = (cx.elem_dtype(ins[1])?, cx.elem_dtype(ins[2])?);
                        let (c, _) = dtype::binary_operands(op.name(), a, b).ok()?;
                        let c = SType::of(c)?;
                        let xs = self.lanes(ins[1], c, &dims)?;
                        let ys = self.lanes(ins[2], c, &dims)?;
                        xs.into_iter()
                            .zip(ys)
                            .map(|(x, y)| self.push(SOp::Binary(op, x, y), vec![t])[0])
                            .collect()
                    }
                }
            };
            // A fault of these instructions is reported at `n`.
            for inst in &mut self.body[first..] {
                inst.site = Some(n.index() as u32);
            }
            self.vals.insert(n, vs);
        }
        let term = match term {
            Some(t) => t,
            None => {
                // A chain graph must end in a call (it returns the exit's
                // arguments, not its own value).
                if self.exit.is_some_and(|e| e.chain.contains(&g)) {
                    return None;
                }
                let shape = cx.shape(out)?;
                STerm::Return(self.values(out, &shape)?)
            }
        };
        Some(SFunc {
            name: m.graph(g).name.clone(),
            params: self.params,
            results,
            body: self.body,
            term,
        })
    }
}

/// A compiled scalar region as the VM sees it.
pub struct ScalarKernel {
    name: String,
    graphs: Vec<String>,
    /// The shapes of its arguments.
    inputs: Vec<Shape>,
    result: Shape,
    compiled: Arc<CompiledScalar>,
}

impl ScalarKernel {
    fn describe(&self, exit: Option<&str>) -> String {
        format!(
            "scalar loop over {} (@{}){}, compiled in {:.2} ms",
            self.inputs
                .iter()
                .map(|s| match s {
                    Shape::Tensor(t, _, dims) => {
                        format!("{t}{}", adjoint_runtime::shape::fmt_shape(dims))
                    }
                    Shape::Buffer(t, dims) => {
                        format!("{t}{} in place", adjoint_runtime::shape::fmt_shape(dims))
                    }
                    s => s
                        .flat()
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
                .collect::<Vec<_>>()
                .join(", "),
            self.graphs.join(", @"),
            exit.map(|x| format!(", then @{x} on the VM"))
                .unwrap_or_default(),
            self.compiled.compile_time().as_secs_f64() * 1e3
        )
    }
}

impl NativeKernel for ScalarKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        super::check_arity(&self.name, self.inputs.len(), args.len())?;
        let scalars = flat_args(&self.name, &args, &self.inputs)?;
        let buffers = buffer_args(&self.name, &args, &self.inputs)?;
        let out = self
            .compiled
            .call_with(&scalars, &buffers, &mut Vec::new(), u64::MAX)?;
        self.result.value(&mut out.into_iter())
    }
}

/// The scalars of arguments `args` of shapes `shapes` (scalars and
/// tensors), in order, a tensor's row-major.
pub(super) fn flat_args(
    name: &str,
    args: &[Value],
    shapes: &[Shape],
) -> Result<Vec<Scalar>, RtError> {
    let mut out = Vec::new();
    for (a, sh) in args.iter().zip(shapes) {
        let wrong = || RtError::internal(format!("{name}: an argument is not a {sh:?}"));
        match sh {
            Shape::Tuple(items) => {
                let Value::Tuple(vs) = a else {
                    return Err(wrong());
                };
                if vs.len() != items.len() {
                    return Err(wrong());
                }
                out.extend(flat_args(name, vs, items)?);
            }
            Shape::Scalar(t, _) => out.extend(scalar_args(name, std::slice::from_ref(a), &[*t])?),
            Shape::Tensor(t, _, dims) => {
                let Value::Tensor(x) = a else {
                    return Err(wrong());
                };
                if x.dtype() != t.dtype() || x.shape() != dims.as_slice() {
                    return Err(wrong());
                }
                macro_rules! lanes {
                    ($get:ident, $make:path) => {
                        out.extend(x.$get().ok_or_else(wrong)?.iter().map(|v| $make(*v)))
                    };
                }
                match t {
                    SType::F32 => lanes!(as_f32, Scalar::F32),
                    SType::F64 => lanes!(as_f64, Scalar::F64),
                    SType::I64 => lanes!(as_i64, Scalar::I64),
                    SType::Bool => lanes!(as_bool, Scalar::Bool),
                }
            }
            Shape::Buffer(..) => {}
            _ => return Err(wrong()),
        }
    }
    Ok(out)
}

/// The elements of the arguments `args` of shapes `shapes` that are
/// buffers ([`Shape::Buffer`]), in order.
pub(super) fn buffer_args<'a>(
    name: &str,
    args: &'a [Value],
    shapes: &[Shape],
) -> Result<Vec<BufRef<'a>>, RtError> {
    let mut out = Vec::new();
    for (a, sh) in args.iter().zip(shapes) {
        let Shape::Buffer(t, dims) = sh else {
            continue;
        };
        let wrong = || RtError::internal(format!("{name}: an argument is not a {sh:?}"));
        let Value::Tensor(x) = a else {
            return Err(wrong());
        };
        if x.dtype() != t.dtype() || x.shape() != dims.as_slice() {
            return Err(wrong());
        }
        out.push(match t {
            SType::F32 => BufRef::F32(x.as_f32().ok_or_else(wrong)?),
            SType::F64 => BufRef::F64(x.as_f64().ok_or_else(wrong)?),
            SType::I64 => BufRef::I64(x.as_i64().ok_or_else(wrong)?),
            SType::Bool => return Err(wrong()),
        });
    }
    Ok(out)
}

/// The values of 0-d tensor arguments `args` of types `params`.
pub(super) fn scalar_args(
    name: &str,
    args: &[Value],
    params: &[SType],
) -> Result<Vec<Scalar>, RtError> {
    let mut scalars = Vec::with_capacity(args.len());
    for (a, t) in args.iter().zip(params) {
        let wrong = || RtError::internal(format!("{name}: expected a {t} scalar"));
        let Value::Tensor(x) = a else {
            return Err(wrong());
        };
        if !x.is_scalar() || x.dtype() != t.dtype() {
            return Err(wrong());
        }
        scalars.push(match t {
            SType::F32 => Scalar::F32(x.as_f32().ok_or_else(wrong)?[0]),
            SType::F64 => Scalar::F64(x.as_f64().ok_or_else(wrong)?[0]),
            SType::I64 => Scalar::I64(x.as_i64().ok_or_else(wrong)?[0]),
            SType::Bool => Scalar::Bool(x.as_bool().ok_or_else(wrong)?[0]),
        });
    }
    Ok(scalars)
}
