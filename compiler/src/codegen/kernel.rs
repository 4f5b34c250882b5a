//! The description of a fused element-wise kernel: the contract between the
//! fusion pass (which builds these from the IR) and the back ends (which
//! compile them).
//!
//! A [`KernelSpec`] is a map chain over one iteration shape, optionally
//! followed by a single reduction:
//!
//! - every input is a dense buffer of the kernel's float [`KDType`] read
//!   through element strides, one per iteration dimension (0 where the input
//!   is broadcast; a scalar has all-zero strides);
//! - the body is a list of [`KExpr`] in SSA form: an expression refers to
//!   earlier ones by [`KId`] (its index in the list);
//! - a map kernel writes each of its `outputs` to a dense row-major buffer
//!   of the iteration shape;
//! - a reducing kernel (with [`ReduceSpec`]) has as its first output the
//!   reduction of that body value over the given axes, written row-major
//!   over the kept dimensions; its further outputs, if any, are *side
//!   outputs*: body values written unreduced, like a map's outputs, in
//!   the same pass (a value the reduction reads that is also needed
//!   elsewhere is then not written by one kernel and read back by
//!   another). A reduction to a single element has no side outputs.
//!
//! Comparisons produce 1.0 or 0.0 and `Select` tests its condition for
//! nonzero, so every value in a kernel is a float of the kernel's dtype.
//!
//! [`KernelSpec::eval_reference`] is a plain interpreter with the semantics
//! of the runtime's reference kernels (`adjoint_runtime::kernels`); the
//! tests of the back ends compare against it.

use std::fmt;
use std::hash::{Hash, Hasher};

use adjoint_runtime::kernels::num::Float;
use adjoint_runtime::math::MathFn;

use crate::prim::Prim;

/// The element type of a kernel: every input, intermediate and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KDType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
}

impl KDType {
    /// The size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            KDType::F32 => 4,
            KDType::F64 => 8,
        }
    }

    /// The name used in the language (`f32`, `f64`).
    pub fn name(self) -> &'static str {
        match self {
            KDType::F32 => "f32",
            KDType::F64 => "f64",
        }
    }
}

/// The id of a body expression: its index in [`KernelSpec::body`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KId(pub u32);

impl KId {
    /// The index in the body.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A unary element-wise operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// `ln(1 + x)`.
    Log1p,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `max(x, 0)`, NaN stays NaN.
    Relu,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `|x|`.
    Abs,
    /// -1, 0 or 1; NaN and -0.0 are kept.
    Sign,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
    /// The error function.
    Erf,
    /// A function of the math table (`adjoint_runtime::math`), computed
    /// by the table's own function (a call per element on the CPU).
    Math(MathFn),
}

impl UnaryOp {
    const BUILT_IN: &'static [UnaryOp] = &[
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Erf,
    ];

    /// Every operation: the built-in ones, then the math table's.
    pub fn all() -> &'static [UnaryOp] {
        static ALL: std::sync::OnceLock<Vec<UnaryOp>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            let math = MathFn::ALL.iter().map(|f| UnaryOp::Math(*f));
            UnaryOp::BUILT_IN.iter().copied().chain(math).collect()
        })
    }

    /// The primitive's name (as in `prim.rs` and the runtime kernels).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Erf => "erf",
            UnaryOp::Math(f) => f.name(),
        }
    }

    /// The primitive the operation computes.
    pub fn prim(self) -> Prim {
        match self {
            UnaryOp::Neg => Prim::Neg,
            UnaryOp::Exp => Prim::Exp,
            UnaryOp::Log => Prim::Log,
            UnaryOp::Log1p => Prim::Log1p,
            UnaryOp::Tanh => Prim::Tanh,
            UnaryOp::Sigmoid => Prim::Sigmoid,
            UnaryOp::Relu => Prim::Relu,
            UnaryOp::Sqrt => Prim::Sqrt,
            UnaryOp::Rsqrt => Prim::Rsqrt,
            UnaryOp::Abs => Prim::Abs,
            UnaryOp::Sign => Prim::Sign,
            UnaryOp::Floor => Prim::Floor,
            UnaryOp::Ceil => Prim::Ceil,
            UnaryOp::Erf => Prim::Erf,
            UnaryOp::Math(f) => Prim::Math(f),
        }
    }

    /// The operation computing primitive `p`, if it is one of these.
    pub fn of_prim(p: Prim) -> Option<UnaryOp> {
        UnaryOp::all().iter().copied().find(|op| op.prim() == p)
    }
}

impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

crate::prim::op_enum! {
    /// A binary element-wise operation.
    BinaryOp {
        /// `a + b`.
        Add,
        /// `a - b`.
        Sub,
        /// `a * b`.
        Mul,
        /// `a / b`.
        Div,
        /// `a ^ b` (`powf`).
        Pow,
        /// Remainder with the dividend's sign (C `fmod`, Rust `%`).
        Rem,
        /// The larger; NaN wins (`a` if `a` is NaN or `a >= b`, else `b`).
        Maximum,
        /// The smaller; NaN wins (`a` if `a` is NaN or `a <= b`, else `b`).
        Minimum,
        /// `a == b` as 1.0 / 0.0.
        Eq,
        /// `a != b` as 1.0 / 0.0 (true when either is NaN).
        Ne,
        /// `a < b` as 1.0 / 0.0.
        Lt,
        /// `a <= b` as 1.0 / 0.0.
        Le,
        /// `a > b` as 1.0 / 0.0.
        Gt,
        /// `a >= b` as 1.0 / 0.0.
        Ge,
    }
}

impl BinaryOp {
    /// Whether the operation is a comparison (its result is 1.0 or 0.0).
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }
}

crate::prim::op_enum! {
    /// The operation of a reduction.
    ReduceOp {
        /// Sum (identity 0).
        Sum,
        /// Maximum, NaN wins (identity -inf).
        Max,
        /// Minimum, NaN wins (identity +inf).
        Min,
        /// Product (identity 1).
        Prod,
    }
}

impl ReduceOp {
    /// The value of the reduction of no elements.
    pub fn identity(self) -> f64 {
        match self {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
        }
    }
}

/// One expression of a kernel body.
///
/// Equality and hashing compare constants by their bits, so specs can key a
/// cache.
#[derive(Clone, Copy, Debug)]
pub enum KExpr {
    /// The current element of input `i`.
    Input(usize),
    /// A constant (rounded to the kernel's dtype).
    Const(f64),
    /// A unary operation.
    Unary(UnaryOp, KId),
    /// A binary operation.
    Binary(BinaryOp, KId, KId),
    /// `Select(c, a, b)`: `a` where `c` is nonzero (NaN counts as nonzero),
    /// else `b`.
    Select(KId, KId, KId),
}

impl KExpr {
    /// The body expressions this one reads.
    pub fn operands(&self) -> Vec<KId> {
        match *self {
            KExpr::Input(_) | KExpr::Const(_) => vec![],
            KExpr::Unary(_, a) => vec![a],
            KExpr::Binary(_, a, b) => vec![a, b],
            KExpr::Select(c, a, b) => vec![c, a, b],
        }
    }

    fn map_operands(&self, f: impl Fn(KId) -> KId) -> KExpr {
        match *self {
            e @ (KExpr::Input(_) | KExpr::Const(_)) => e,
            KExpr::Unary(op, a) => KExpr::Unary(op, f(a)),
            KExpr::Binary(op, a, b) => KExpr::Binary(op, f(a), f(b)),
            KExpr::Select(c, a, b) => KExpr::Select(f(c), f(a), f(b)),
        }
    }
}

impl PartialEq for KExpr {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (KExpr::Input(a), KExpr::Input(b)) => a == b,
            (KExpr::Const(a), KExpr::Const(b)) => a.to_bits() == b.to_bits(),
            (KExpr::Unary(o, a), KExpr::Unary(p, b)) => o == p && a == b,
            (KExpr::Binary(o, a, b), KExpr::Binary(p, c, d)) => o == p && a == c && b == d,
            (KExpr::Select(a, b, c), KExpr::Select(d, e, f)) => a == d && b == e && c == f,
            _ => false,
        }
    }
}

impl Eq for KExpr {}

impl Hash for KExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            KExpr::Input(i) => i.hash(state),
            KExpr::Const(c) => c.to_bits().hash(state),
            KExpr::Unary(o, a) => (o, a).hash(state),
            KExpr::Binary(o, a, b) => (o, a, b).hash(state),
            KExpr::Select(c, a, b) => (c, a, b).hash(state),
        }
    }
}

/// How a kernel reads one input.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InputSpec {
    /// The stride in elements for each iteration dimension; 0 where the
    /// input is broadcast. Element `idx` of the iteration space reads
    /// `buffer[Σ idx[d] * strides[d]]`.
    pub strides: Vec<isize>,
}

impl InputSpec {
    /// A dense row-major input of the iteration shape.
    pub fn contiguous(shape: &[usize]) -> Self {
        let mut strides = vec![0isize; shape.len()];
        let mut s = 1isize;
        for d in (0..shape.len()).rev() {
            strides[d] = s;
            s *= shape[d] as isize;
        }
        InputSpec { strides }
    }

    /// A scalar broadcast over an iteration space of `ndim` dimensions.
    pub fn scalar(ndim: usize) -> Self {
        InputSpec {
            strides: vec![0; ndim],
        }
    }

    /// A dense row-major input of shape `input` broadcast (NumPy rules:
    /// aligned at the right, size-1 dimensions repeat) to `output`. `None`
    /// when the shapes do not broadcast.
    pub fn broadcast(input: &[usize], output: &[usize]) -> Option<Self> {
        if input.len() > output.len() {
            return None;
        }
        let dense = InputSpec::contiguous(input).strides;
        let lead = output.len() - input.len();
        let mut strides = vec![0isize; output.len()];
        for (k, &d) in input.iter().enumerate() {
            let o = output[lead + k];
            if d == o && d != 1 {
                strides[lead + k] = dense[k];
            } else if d != 1 {
                return None;
            }
        }
        Some(InputSpec { strides })
    }
}

/// A reduction over some iteration axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReduceSpec {
    /// The reduction.
    pub op: ReduceOp,
    /// The reduced iteration axes (distinct, in range).
    pub axes: Vec<usize>,
    /// Whether the output shape keeps the reduced axes as size 1 (the
    /// buffer layout is the same either way).
    pub keepdims: bool,
}

/// A fused element-wise kernel; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    /// The element type of everything in the kernel.
    pub dtype: KDType,
    /// The iteration shape (the output shape of a map kernel).
    pub shape: Vec<usize>,
    /// How each input is read.
    pub inputs: Vec<InputSpec>,
    /// The expressions, in SSA order.
    pub body: Vec<KExpr>,
    /// The body values written out. With a reduction, the first is the
    /// reduced one and the others are side outputs (written unreduced).
    pub outputs: Vec<KId>,
    /// The reduction applied to the single output, if any.
    pub reduce: Option<ReduceSpec>,
}

/// Why a [`KernelSpec`] is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid kernel spec: {0}")]
pub struct SpecError(pub String);

fn spec_err<T>(msg: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError(msg.into()))
}

impl KernelSpec {
    /// A map over one dense 1-D input of length `n` writing `outputs`.
    pub fn map_1d(dtype: KDType, n: usize, body: Vec<KExpr>, outputs: Vec<KId>) -> Self {
        KernelSpec {
            dtype,
            shape: vec![n],
            inputs: vec![InputSpec::contiguous(&[n])],
            body,
            outputs,
            reduce: None,
        }
    }

    /// The side-by-side benchmark's kernel `y = tanh(2x + 1) * sigmoid(x) -
    /// x / 3` over `n` elements. Its body ids, in order: `x`, the constants
    /// 2, 1 and 3, `2x`, `2x + 1`, `tanh`, `sigmoid`, the product, `x / 3`
    /// and `y`.
    pub fn tanh_sigmoid_map(dtype: KDType, n: usize) -> Self {
        let mut b = BodyBuilder::new();
        let x = b.input(0);
        let two = b.constant(2.0);
        let one = b.constant(1.0);
        let three = b.constant(3.0);
        let t = b.binary(BinaryOp::Mul, two, x);
        let t = b.binary(BinaryOp::Add, t, one);
        let t = b.unary(UnaryOp::Tanh, t);
        let s = b.unary(UnaryOp::Sigmoid, x);
        let p = b.binary(BinaryOp::Mul, t, s);
        let q = b.binary(BinaryOp::Div, x, three);
        let y = b.binary(BinaryOp::Sub, p, q);
        Self::map_1d(dtype, n, b.body, vec![y])
    }

    /// The number of elements of the iteration space.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The shape of each output: the iteration shape, or with a reduction
    /// the kept dimensions (reduced ones as 1 with `keepdims`).
    pub fn output_shape(&self) -> Vec<usize> {
        match &self.reduce {
            None => self.shape.clone(),
            Some(r) => self
                .shape
                .iter()
                .enumerate()
                .filter_map(|(d, &n)| match (r.axes.contains(&d), r.keepdims) {
                    (false, _) => Some(n),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect(),
        }
    }

    /// The number of elements of each output buffer (of the first, when
    /// a reduction has side outputs).
    pub fn output_len(&self) -> usize {
        self.output_shape().iter().product()
    }

    /// Whether a reduction also writes body values unreduced.
    pub fn has_side_outputs(&self) -> bool {
        self.reduce.is_some() && self.outputs.len() > 1
    }

    /// The number of elements of output `k`'s buffer: a side output has
    /// one per point of the iteration space.
    pub fn output_len_of(&self, k: usize) -> usize {
        if k > 0 && self.reduce.is_some() {
            self.num_elements()
        } else {
            self.output_len()
        }
    }

    /// The smallest length of input `i`'s buffer: one past the largest
    /// offset the kernel reads (0 for an empty iteration space).
    pub fn input_len(&self, i: usize) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        let max: isize = self.inputs[i]
            .strides
            .iter()
            .zip(&self.shape)
            .map(|(&s, &n)| s * (n as isize - 1))
            .sum();
        max as usize + 1
    }

    /// Checks that the spec is well formed: strides match the rank and are
    /// non-negative, every reference points backwards into the body, inputs
    /// exist, outputs exist, a reduction has distinct axes in range, and a
    /// reduction to a single element has no side outputs.
    pub fn validate(&self) -> Result<(), SpecError> {
        let nd = self.shape.len();
        for (i, inp) in self.inputs.iter().enumerate() {
            if inp.strides.len() != nd {
                return spec_err(format!(
                    "input {i} has {} strides for a rank-{nd} iteration space",
                    inp.strides.len()
                ));
            }
            if inp
                .strides
                .iter()
                .zip(&self.shape)
                .any(|(&s, &n)| s < 0 && n > 1)
            {
                return spec_err(format!("input {i} has a negative stride"));
            }
        }
        for (k, e) in self.body.iter().enumerate() {
            if let KExpr::Input(i) = e {
                if *i >= self.inputs.len() {
                    return spec_err(format!("expression {k} reads missing input {i}"));
                }
            }
            if let Some(bad) = e.operands().iter().find(|a| a.index() >= k) {
                return spec_err(format!(
                    "expression {k} uses {} which is not defined before it",
                    bad.0
                ));
            }
        }
        if self.outputs.is_empty() {
            return spec_err("a kernel needs an output");
        }
        if let Some(bad) = self.outputs.iter().find(|o| o.index() >= self.body.len()) {
            return spec_err(format!("output {} is not in the body", bad.0));
        }
        if let Some(r) = &self.reduce {
            if self.outputs.len() > 1 && self.output_len() == 1 {
                return spec_err("a reduction to one element cannot have side outputs");
            }
            for (k, &a) in r.axes.iter().enumerate() {
                if a >= nd {
                    return spec_err(format!("reduction axis {a} out of range for rank {nd}"));
                }
                if r.axes[..k].contains(&a) {
                    return spec_err(format!("reduction axis {a} repeated"));
                }
            }
        }
        Ok(())
    }

    /// The canonical form used as a cache key: squares made products (see
    /// [`KernelSpec::squares_as_products`]), dead expressions removed,
    /// common subexpressions merged, constants rounded to the dtype (NaNs
    /// made one NaN), reduction axes sorted. It computes the same function
    /// as `self`. The spec must be valid.
    pub fn canonical(&self) -> KernelSpec {
        let (src, outputs) = self.squares_as_products();
        // Live expressions, walking back from the outputs.
        let mut live = vec![false; src.len()];
        for o in &outputs {
            live[o.index()] = true;
        }
        for k in (0..src.len()).rev() {
            if live[k] {
                for a in src[k].operands() {
                    live[a.index()] = true;
                }
            }
        }
        let mut body: Vec<KExpr> = Vec::new();
        let mut seen: std::collections::HashMap<KExpr, KId> = Default::default();
        let mut remap = vec![KId(u32::MAX); src.len()];
        for (k, e) in src.iter().enumerate() {
            if !live[k] {
                continue;
            }
            let mut e = e.map_operands(|a| remap[a.index()]);
            if let KExpr::Const(c) = &mut e {
                *c = self.round(*c);
                if c.is_nan() {
                    *c = f64::NAN;
                }
            }
            let id = *seen.entry(e).or_insert_with(|| {
                body.push(e);
                KId(body.len() as u32 - 1)
            });
            remap[k] = id;
        }
        let reduce = self.reduce.as_ref().map(|r| {
            let mut axes = r.axes.clone();
            axes.sort_unstable();
            ReduceSpec {
                op: r.op,
                axes,
                keepdims: r.keepdims,
            }
        });
        KernelSpec {
            dtype: self.dtype,
            shape: self.shape.clone(),
            inputs: self.inputs.clone(),
            body,
            outputs: outputs.iter().map(|o| remap[o.index()]).collect(),
            reduce,
        }
    }

    /// The body and outputs with `x ** 2` as `x * x` and `x ** 1` as `x`
    /// (its uses read `x`), as the runtime's `pow` computes them
    /// ([`adjoint_runtime::kernels::num::Num::pow`]): a product in the
    /// vector loop instead of a library call per lane. The exponents'
    /// constants are left for the dead-code pass.
    fn squares_as_products(&self) -> (Vec<KExpr>, Vec<KId>) {
        let mut body = self.body.clone();
        let mut alias: Vec<KId> = (0..body.len() as u32).map(KId).collect();
        for k in 0..body.len() {
            let e = body[k].map_operands(|a| alias[a.index()]);
            body[k] = match e {
                KExpr::Binary(BinaryOp::Pow, a, y) => match body[y.index()] {
                    KExpr::Const(2.0) => KExpr::Binary(BinaryOp::Mul, a, a),
                    KExpr::Const(1.0) => {
                        alias[k] = a;
                        e
                    }
                    _ => e,
                },
                _ => e,
            };
        }
        let outputs = self.outputs.iter().map(|o| alias[o.index()]).collect();
        (body, outputs)
    }

    /// `x` rounded to the kernel's dtype.
    fn round(&self, x: f64) -> f64 {
        match self.dtype {
            KDType::F32 => x as f32 as f64,
            KDType::F64 => x,
        }
    }

    /// Evaluates the kernel with plain Rust, element by element, with the
    /// semantics of the runtime's reference kernels: every operation rounds
    /// to the kernel's dtype (the inputs are rounded to it first), sums and
    /// products accumulate in f64 in row-major order and round once, `max`
    /// and `min` keep the first NaN. Returns one buffer per output. The spec
    /// must be valid and the inputs long enough ([`KernelSpec::input_len`]).
    pub fn eval_reference(&self, inputs: &[&[f64]]) -> Vec<Vec<f64>> {
        match self.dtype {
            KDType::F32 => self.eval_typed::<f32>(inputs),
            KDType::F64 => self.eval_typed::<f64>(inputs),
        }
    }

    fn eval_typed<T: Float>(&self, inputs: &[&[f64]]) -> Vec<Vec<f64>> {
        let n = self.num_elements();
        let nd = self.shape.len();
        let consts: Vec<T> = self
            .body
            .iter()
            .map(|e| match e {
                KExpr::Const(c) => T::cast_from(*c),
                _ => T::zero(),
            })
            .collect();
        let mut vals = vec![T::zero(); self.body.len()];
        let mut idx = vec![0usize; nd];
        let mut results: Vec<Vec<f64>> = vec![Vec::with_capacity(n); self.outputs.len()];
        for flat in 0..n {
            if flat > 0 {
                for d in (0..nd).rev() {
                    idx[d] += 1;
                    if idx[d] < self.shape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
            for (k, e) in self.body.iter().enumerate() {
                vals[k] = match *e {
                    KExpr::Input(i) => {
                        let off: isize = self.inputs[i]
                            .strides
                            .iter()
                            .zip(&idx)
                            .map(|(&s, &j)| s * j as isize)
                            .sum();
                        T::cast_from(inputs[i][off as usize])
                    }
                    KExpr::Const(_) => consts[k],
                    KExpr::Unary(op, a) => eval_unary(op, vals[a.index()]),
                    KExpr::Binary(op, a, b) => eval_binary(op, vals[a.index()], vals[b.index()]),
                    KExpr::Select(c, a, b) => {
                        if vals[c.index()] != T::zero() {
                            vals[a.index()]
                        } else {
                            vals[b.index()]
                        }
                    }
                };
            }
            for (r, o) in results.iter_mut().zip(&self.outputs) {
                r.push(vals[o.index()].to_f64());
            }
        }
        match &self.reduce {
            None => results,
            Some(r) => {
                // The reduced output, then the side outputs as they are.
                let reduced = reduce_reference::<T>(&self.shape, r, &results[0]);
                std::iter::once(reduced).chain(results.drain(1..)).collect()
            }
        }
    }
}

/// Reduces the row-major `values` of `shape` over `r.axes`.
fn reduce_reference<T: Float>(shape: &[usize], r: &ReduceSpec, values: &[f64]) -> Vec<f64> {
    let nd = shape.len();
    // Dense strides of the output over the kept dimensions.
    let mut out_strides = vec![0usize; nd];
    let mut s = 1;
    for d in (0..nd).rev() {
        if !r.axes.contains(&d) {
            out_strides[d] = s;
            s *= shape[d];
        }
    }
    let n_out = s;
    let mut acc = vec![r.op.identity(); n_out];
    let mut first = vec![true; n_out];
    let mut idx = vec![0usize; nd];
    for (flat, &v) in values.iter().enumerate() {
        if flat > 0 {
            for d in (0..nd).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        let o: usize = idx.iter().zip(&out_strides).map(|(i, s)| i * s).sum();
        let a = &mut acc[o];
        match r.op {
            ReduceOp::Sum => *a += v,
            ReduceOp::Prod => *a *= v,
            ReduceOp::Max | ReduceOp::Min => {
                // The runtime's rule: replace when strictly better or the
                // first NaN.
                let less = r.op == ReduceOp::Min;
                let better = !a.is_nan() && (v.is_nan() || if less { v < *a } else { v > *a });
                if first[o] || better {
                    *a = v;
                }
            }
        }
        first[o] = false;
    }
    acc.into_iter().map(|a| T::cast_from(a).to_f64()).collect()
}

/// One unary operation with the runtime's semantics.
pub fn eval_unary<T: Float>(op: UnaryOp, x: T) -> T {
    match op {
        UnaryOp::Neg => x.neg(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => x.sigmoid(),
        UnaryOp::Relu => x.relu(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => x.rsqrt(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sign => x.sign(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Erf => x.erf(),
        UnaryOp::Math(f) => T::math(f)(x),
    }
}

/// One binary operation with the runtime's semantics (comparisons give 1
/// or 0).
pub fn eval_binary<T: Float>(op: BinaryOp, a: T, b: T) -> T {
    let flag = |c: bool| if c { T::one() } else { T::zero() };
    match op {
        BinaryOp::Add => a.add(b),
        BinaryOp::Sub => a.sub(b),
        BinaryOp::Mul => a.mul(b),
        BinaryOp::Div => a.div(b),
        BinaryOp::Pow => a.pow(b),
        BinaryOp::Rem => a.rem(b),
        BinaryOp::Maximum => a.maximum(b),
        BinaryOp::Minimum => a.minimum(b),
        BinaryOp::Eq => flag(a == b),
        BinaryOp::Ne => flag(a != b),
        BinaryOp::Lt => flag(a < b),
        BinaryOp::Le => flag(a <= b),
        BinaryOp::Gt => flag(a > b),
        BinaryOp::Ge => flag(a >= b),
    }
}

/// A small builder for kernel bodies: each method appends an expression
/// and returns its id.
#[derive(Clone, Debug, Default)]
pub struct BodyBuilder {
    /// The expressions so far.
    pub body: Vec<KExpr>,
}

impl BodyBuilder {
    /// An empty body.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `e` and returns its id.
    pub fn push(&mut self, e: KExpr) -> KId {
        self.body.push(e);
        KId(self.body.len() as u32 - 1)
    }

    /// Input `i`'s current element.
    pub fn input(&mut self, i: usize) -> KId {
        self.push(KExpr::Input(i))
    }

    /// A constant.
    pub fn constant(&mut self, c: f64) -> KId {
        self.push(KExpr::Const(c))
    }

    /// A unary operation.
    pub fn unary(&mut self, op: UnaryOp, a: KId) -> KId {
        self.push(KExpr::Unary(op, a))
    }

    /// A binary operation.
    pub fn binary(&mut self, op: BinaryOp, a: KId, b: KId) -> KId {
        self.push(KExpr::Binary(op, a, b))
    }

    /// `a` where `c` is nonzero, else `b`.
    pub fn select(&mut self, c: KId, a: KId, b: KId) -> KId {
        self.push(KExpr::Select(c, a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(body: Vec<KExpr>, outputs: Vec<KId>) -> KernelSpec {
        KernelSpec {
            dtype: KDType::F32,
            shape: vec![2, 3],
            inputs: vec![InputSpec::contiguous(&[2, 3])],
            body,
            outputs,
            reduce: None,
        }
    }

    /// Checks that valid `s` canonicalises to `body` and `outputs`, and
    /// that the canonical form is its own; returns it.
    fn assert_canonical(s: &KernelSpec, body: Vec<KExpr>, outputs: Vec<KId>) -> KernelSpec {
        s.validate().unwrap();
        let c = s.canonical();
        assert_eq!(c.body, body);
        assert_eq!(c.outputs, outputs);
        assert_eq!(c.canonical(), c);
        c
    }

    #[test]
    fn canonical_squares_are_products() {
        let s = spec(
            vec![
                KExpr::Input(0),
                KExpr::Const(2.0),
                KExpr::Binary(BinaryOp::Pow, KId(0), KId(1)),
                KExpr::Const(1.0),
                KExpr::Binary(BinaryOp::Pow, KId(2), KId(3)),
                KExpr::Const(3.0),
                KExpr::Binary(BinaryOp::Pow, KId(4), KId(5)),
            ],
            vec![KId(4), KId(6)],
        );
        let c = assert_canonical(
            &s,
            vec![
                KExpr::Input(0),
                KExpr::Binary(BinaryOp::Mul, KId(0), KId(0)),
                KExpr::Const(3.0),
                KExpr::Binary(BinaryOp::Pow, KId(1), KId(2)),
            ],
            vec![KId(1), KId(3)],
        );
        // The reference evaluator (the runtime's `pow`) agrees bit for bit.
        for x in [0.3f64, -1.7, 1e20, -0.0, f64::INFINITY, f64::NAN, 1e-30] {
            let x = x as f32 as f64;
            let input = [x; 6];
            let a = s.eval_reference(&[&input]);
            let b = c.eval_reference(&[&input]);
            for (p, q) in a.iter().zip(&b) {
                assert_eq!(p[0].to_bits(), q[0].to_bits(), "x = {x}");
            }
        }
    }

    #[test]
    fn canonical_removes_dead_code_and_merges() {
        let s = spec(
            vec![
                KExpr::Input(0),
                KExpr::Const(0.1),
                KExpr::Unary(UnaryOp::Exp, KId(0)),
                KExpr::Const(0.1),
                KExpr::Binary(BinaryOp::Add, KId(0), KId(3)),
                KExpr::Binary(BinaryOp::Add, KId(0), KId(1)),
                KExpr::Binary(BinaryOp::Mul, KId(4), KId(5)),
            ],
            vec![KId(6)],
        );
        assert_canonical(
            &s,
            vec![
                KExpr::Input(0),
                KExpr::Const(0.1f32 as f64),
                KExpr::Binary(BinaryOp::Add, KId(0), KId(1)),
                KExpr::Binary(BinaryOp::Mul, KId(2), KId(2)),
            ],
            vec![KId(3)],
        );
    }

    #[test]
    fn validation() {
        let bad = spec(vec![KExpr::Unary(UnaryOp::Exp, KId(0))], vec![KId(0)]);
        assert!(bad.validate().is_err());
        let bad = spec(vec![KExpr::Input(1)], vec![KId(0)]);
        assert!(bad.validate().is_err());
        let mut s = spec(vec![KExpr::Input(0)], vec![KId(0), KId(0)]);
        s.validate().unwrap();
        s.reduce = Some(ReduceSpec {
            op: ReduceOp::Sum,
            axes: vec![1],
            keepdims: false,
        });
        // A side output: the value written unreduced too.
        s.validate().unwrap();
        assert!(s.has_side_outputs());
        assert_eq!(
            (s.output_len_of(0), s.output_len_of(1)),
            (2, s.num_elements())
        );
        // Not beside a reduction to one element.
        s.reduce.as_mut().unwrap().axes = vec![0, 1];
        assert!(s.validate().is_err());
        s.reduce.as_mut().unwrap().axes = vec![1];
        s.outputs.pop();
        s.validate().unwrap();
        assert!(!s.has_side_outputs());
        assert_eq!(s.output_shape(), vec![2]);
        s.reduce.as_mut().unwrap().keepdims = true;
        assert_eq!(s.output_shape(), vec![2, 1]);
        s.reduce.as_mut().unwrap().axes = vec![1, 1];
        assert!(s.validate().is_err());
    }

    #[test]
    fn broadcast_strides() {
        assert_eq!(
            InputSpec::broadcast(&[3], &[2, 3]).unwrap().strides,
            vec![0, 1]
        );
        assert_eq!(
            InputSpec::broadcast(&[2, 1], &[2, 3]).unwrap().strides,
            vec![1, 0]
        );
        assert!(InputSpec::broadcast(&[4], &[2, 3]).is_none());
    }

    #[test]
    fn reference_reduction() {
        let s = KernelSpec {
            dtype: KDType::F64,
            shape: vec![2, 3],
            inputs: vec![InputSpec::contiguous(&[2, 3])],
            body: vec![KExpr::Input(0)],
            outputs: vec![KId(0)],
            reduce: Some(ReduceSpec {
                op: ReduceOp::Sum,
                axes: vec![0],
                keepdims: false,
            }),
        };
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(s.eval_reference(&[&x]), vec![vec![5.0, 7.0, 9.0]]);
        let mut m = s.clone();
        m.reduce = Some(ReduceSpec {
            op: ReduceOp::Max,
            axes: vec![1],
            keepdims: true,
        });
        assert_eq!(m.eval_reference(&[&x]), vec![vec![3.0, 6.0]]);
    }
}
