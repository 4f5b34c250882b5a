//! CUDA C source for a [`KernelSpec`].
//!
//! Each kernel is one `extern "C" __global__` function whose parameters
//! are the input pointers, the output pointers, then `long long` sizes.
//! Shapes and strides are constants in the source: a kernel is compiled
//! per specialisation, and the compiler folds the index arithmetic.
//!
//! Every operation is written to give the value the reference kernels give
//! (`adjoint_runtime::kernels::num`): NaN tests by `x != x`, `maximum` and
//! `minimum` keeping a NaN from either side, `sign` keeping NaN and -0.0,
//! `relu` keeping NaN, a sigmoid that never takes `exp` of a large positive
//! number, `1 / sqrt(x)` rather than the approximate `rsqrt`, and C's
//! `fmod`/`pow` (the semantics Rust's `%`/`powf` have). Constants are
//! written by their bits. NVRTC compiles with `--fmad=false`, so products
//! and sums are rounded one by one as on the CPU. Transcendental functions
//! are CUDA's (within their documented ulp bounds of the correctly rounded
//! result), not the CPU back end's polynomials: results agree to a few ulp,
//! not bit for bit.

use std::fmt::Write;

use super::layout::{collapse, reduce_layouts, Layout, ReduceStrategy, BLOCK};
use crate::codegen::kernel::{BinaryOp, KDType, KExpr, KernelSpec, ReduceOp, UnaryOp};

/// A generated kernel: its entry point's name, the source, and how to
/// launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernel {
    /// The `extern "C"` name: `adj_` and a hash of the canonical spec.
    pub name: String,
    pub source: String,
    pub launch: Launch,
}

/// How many threads a kernel wants and what its size parameters are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// A grid-stride loop over `n` elements, a thread each.
    Map { n: usize },
    /// A reduction to `n_out` elements of `n_red` elements each.
    Reduce {
        n_out: usize,
        n_red: usize,
        strategy: ReduceStrategy,
    },
}

impl Launch {
    /// The `long long` parameters after the pointers.
    pub fn sizes(&self) -> Vec<i64> {
        match *self {
            Launch::Map { n } => vec![n as i64],
            Launch::Reduce { n_out, n_red, .. } => vec![n_out as i64, n_red as i64],
        }
    }

    /// The number of blocks (of [`BLOCK`] threads) to launch, given the
    /// most the device runs at once usefully.
    pub fn grid(&self, max_blocks: usize) -> u32 {
        use super::layout::grid_for;
        match *self {
            Launch::Map { n } => grid_for(n, BLOCK as usize, max_blocks),
            Launch::Reduce {
                n_out,
                strategy: ReduceStrategy::ThreadPerOutput,
                ..
            } => grid_for(n_out, BLOCK as usize, max_blocks),
            Launch::Reduce {
                n_out,
                strategy: ReduceStrategy::BlockPerOutput,
                ..
            } => grid_for(n_out, 1, 1 << 20),
        }
    }

    /// Whether there is nothing to compute (no launch).
    pub fn is_empty(&self) -> bool {
        match *self {
            Launch::Map { n } => n == 0,
            Launch::Reduce { n_out, .. } => n_out == 0,
        }
    }
}

/// The C type of a dtype.
fn ctype(d: KDType) -> &'static str {
    match d {
        KDType::F32 => "float",
        KDType::F64 => "double",
    }
}

/// A constant of the kernel's dtype, exactly: by its bits, with the value
/// as a comment.
pub fn constant(d: KDType, v: f64) -> String {
    match d {
        KDType::F32 => {
            let x = v as f32;
            format!("__int_as_float(0x{:08x}) /* {x:e} */", x.to_bits())
        }
        KDType::F64 => format!("__longlong_as_double(0x{:016x}LL) /* {v:e} */", v.to_bits()),
    }
}

/// The C expression of a unary operation on `x` (an identifier).
fn unary(op: UnaryOp, d: KDType, x: &str) -> String {
    let f = |name: &str| match d {
        KDType::F32 => format!("{name}f({x})"),
        KDType::F64 => format!("{name}({x})"),
    };
    let t = "T";
    match op {
        UnaryOp::Neg => format!("-{x}"),
        UnaryOp::Exp => f("exp"),
        UnaryOp::Log => f("log"),
        UnaryOp::Log1p => f("log1p"),
        UnaryOp::Tanh => f("tanh"),
        UnaryOp::Sigmoid => format!("adj_sigmoid({x})"),
        UnaryOp::Relu => format!("(({x} > ({t})0 || {x} != {x}) ? {x} : ({t})0)"),
        UnaryOp::Sqrt => f("sqrt"),
        UnaryOp::Rsqrt => format!("(({t})1 / {})", f("sqrt")),
        UnaryOp::Abs => f("fabs"),
        UnaryOp::Sign => {
            format!("({x} > ({t})0 ? ({t})1 : ({x} < ({t})0 ? ({t})-1 : {x}))")
        }
        UnaryOp::Floor => f("floor"),
        UnaryOp::Ceil => f("ceil"),
        UnaryOp::Erf => f("erf"),
        UnaryOp::Math(m) => f(m.row().cuda),
    }
}

/// The C expression of a binary operation.
fn binary(op: BinaryOp, d: KDType, a: &str, b: &str) -> String {
    let t = "T";
    let flag = |c: &str| format!("(({a} {c} {b}) ? ({t})1 : ({t})0)");
    let f = |name: &str| match d {
        KDType::F32 => format!("{name}f({a}, {b})"),
        KDType::F64 => format!("{name}({a}, {b})"),
    };
    match op {
        BinaryOp::Add => format!("{a} + {b}"),
        BinaryOp::Sub => format!("{a} - {b}"),
        BinaryOp::Mul => format!("{a} * {b}"),
        BinaryOp::Div => format!("{a} / {b}"),
        BinaryOp::Pow => f("pow"),
        BinaryOp::Rem => f("fmod"),
        BinaryOp::Maximum => format!("adj_maximum({a}, {b})"),
        BinaryOp::Minimum => format!("adj_minimum({a}, {b})"),
        BinaryOp::Eq => flag("=="),
        BinaryOp::Ne => flag("!="),
        BinaryOp::Lt => flag("<"),
        BinaryOp::Le => flag("<="),
        BinaryOp::Gt => flag(">"),
        BinaryOp::Ge => flag(">="),
    }
}

/// The helpers every kernel may use, for type `T`.
fn prelude(d: KDType) -> String {
    let t = ctype(d);
    let e = match d {
        KDType::F32 => "expf",
        KDType::F64 => "exp",
    };
    format!(
        "typedef {t} T;\n\
         // maximum/minimum of the reference kernels: `a` if it is NaN or wins, else `b`\n\
         // (so a NaN on either side is the result).\n\
         __device__ __forceinline__ T adj_maximum(T a, T b) {{ return (a != a || a >= b) ? a : b; }}\n\
         __device__ __forceinline__ T adj_minimum(T a, T b) {{ return (a != a || a <= b) ? a : b; }}\n\
         // Reduction steps: NaN wins, else the larger (smaller); ties keep `a`.\n\
         __device__ __forceinline__ T adj_rmax(T a, T b) {{ return (a != a) ? a : ((b != b || b > a) ? b : a); }}\n\
         __device__ __forceinline__ T adj_rmin(T a, T b) {{ return (a != a) ? a : ((b != b || b < a) ? b : a); }}\n\
         // 1 / (1 + e^-x) without exp of a large positive number.\n\
         __device__ __forceinline__ T adj_sigmoid(T x) {{\n\
         \x20 if (x >= (T)0) return (T)1 / ((T)1 + {e}(-x));\n\
         \x20 T e = {e}(x);\n\
         \x20 return e / ((T)1 + e);\n\
         }}\n"
    )
}

/// The reduction's combining step and identity.
fn combine(op: ReduceOp, a: &str, b: &str) -> String {
    match op {
        ReduceOp::Sum => format!("{a} + {b}"),
        ReduceOp::Prod => format!("{a} * {b}"),
        ReduceOp::Max => format!("adj_rmax({a}, {b})"),
        ReduceOp::Min => format!("adj_rmin({a}, {b})"),
    }
}

/// A stable 64-bit FNV-1a hash of a string (kernel names; the runtime's
/// PTX cache keys hash the full source).
fn fnv(s: &str) -> u64 {
    adjoint_runtime::cuda::nvrtc::fnv1a(&[s.as_bytes()])
}

/// Emits `long long` offsets `o{i}` of every input read, for position
/// `flat` (an expression) of `layout`, at indentation `ind`. `base`
/// gives, per input, an offset expression to add (the kept part of a
/// reduction), or none.
fn emit_offsets(
    out: &mut String,
    layout: &Layout,
    used: &[usize],
    flat: &str,
    prefix: &str,
    base: Option<&str>,
    ind: &str,
) {
    let nd = layout.shape.len();
    for &i in used {
        let init = match base {
            Some(b) => format!("{b}{i}"),
            None => "0".into(),
        };
        let _ = writeln!(out, "{ind}long long {prefix}{i} = {init};");
    }
    if nd == 0 {
        return;
    }
    let _ = writeln!(out, "{ind}{{");
    let _ = writeln!(out, "{ind}  long long r = {flat};");
    for d in (0..nd).rev() {
        let n = layout.shape[d];
        let c = if d == 0 {
            "r".to_string()
        } else {
            let _ = writeln!(out, "{ind}  long long c{d} = r % {n}LL; r /= {n}LL;");
            format!("c{d}")
        };
        for &i in used {
            let s = layout.strides[i][d];
            if s != 0 {
                let _ = writeln!(out, "{ind}  {prefix}{i} += {c} * {s}LL;");
            }
        }
    }
    let _ = writeln!(out, "{ind}}}");
}

/// Emits the body: loads of the inputs at offsets `o{i}`, then one `const
/// T v{k}` per expression.
fn emit_body(out: &mut String, spec: &KernelSpec, ind: &str) {
    for (k, e) in spec.body.iter().enumerate() {
        let v = |id: crate::codegen::kernel::KId| format!("v{}", id.0);
        let rhs = match *e {
            KExpr::Input(i) => format!("in{i}[o{i}]"),
            KExpr::Const(c) => constant(spec.dtype, c),
            KExpr::Unary(op, a) => unary(op, spec.dtype, &v(a)),
            KExpr::Binary(op, a, b) => binary(op, spec.dtype, &v(a), &v(b)),
            KExpr::Select(c, a, b) => format!("({} != (T)0) ? {} : {}", v(c), v(a), v(b)),
        };
        let _ = writeln!(out, "{ind}const T v{k} = {rhs};");
    }
}

/// Emits, inside the loop over outputs `o`, the kept offsets `b{i}`, an
/// accumulator `acc` at the identity, and the loop over reduced elements
/// `j` (from `start`, advancing by `step`) that folds the body's output
/// into it; the loop is left open.
fn accumulate(
    src: &mut String,
    spec: &KernelSpec,
    kept: &Layout,
    red: &Layout,
    used: &[usize],
    start: &str,
    step: &str,
) {
    let r = spec.reduce.as_ref().expect("a reducing spec");
    emit_offsets(src, kept, used, "o", "b", None, "    ");
    let _ = writeln!(
        src,
        "    T acc = {};",
        constant(spec.dtype, r.op.identity())
    );
    let _ = writeln!(src, "    for (long long j = {start}; j < n_red; {step}) {{");
    emit_offsets(src, red, used, "j", "o", Some("b"), "      ");
    emit_body(src, spec, "      ");
    let out = format!("v{}", spec.outputs[0].0);
    let _ = writeln!(src, "      acc = {};", combine(r.op, "acc", &out));
}

/// The inputs the body reads.
fn used_inputs(spec: &KernelSpec) -> Vec<usize> {
    let mut used: Vec<usize> = spec
        .body
        .iter()
        .filter_map(|e| match e {
            KExpr::Input(i) => Some(*i),
            _ => None,
        })
        .collect();
    used.sort_unstable();
    used.dedup();
    used
}

fn signature(spec: &KernelSpec, name: &str, sizes: &[&str]) -> String {
    let mut params: Vec<String> = (0..spec.inputs.len())
        .map(|i| format!("const T* __restrict__ in{i}"))
        .collect();
    params.extend((0..spec.outputs.len()).map(|j| format!("T* __restrict__ out{j}")));
    params.extend(sizes.iter().map(|s| format!("long long {s}")));
    format!(
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}({})",
        params.join(", ")
    )
}

/// The CUDA kernel of a spec (canonicalised first). The spec must be
/// valid.
pub fn generate(spec: &KernelSpec) -> CudaKernel {
    let spec = spec.canonical();
    let name = format!("adj_{:016x}", fnv(&format!("{spec:?}")));
    let mut src = String::new();
    let _ = writeln!(
        src,
        "// Generated by adjoint: {} over {:?}{}",
        spec.dtype.name(),
        spec.shape,
        spec.reduce
            .as_ref()
            .map(|r| format!(", {} over axes {:?}", r.op.name(), r.axes))
            .unwrap_or_default()
    );
    src.push_str(&prelude(spec.dtype));
    let used = used_inputs(&spec);
    let launch = match &spec.reduce {
        None => {
            let strides: Vec<&[isize]> = spec.inputs.iter().map(|i| i.strides.as_slice()).collect();
            let dims: Vec<usize> = (0..spec.shape.len()).collect();
            let layout = collapse(&spec.shape, &strides, &dims);
            let _ = writeln!(src, "{} {{", signature(&spec, &name, &["n"]));
            src.push_str(
                "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n       i += (long long)gridDim.x * blockDim.x) {\n",
            );
            emit_offsets(&mut src, &layout, &used, "i", "o", None, "    ");
            emit_body(&mut src, &spec, "    ");
            for (j, o) in spec.outputs.iter().enumerate() {
                let _ = writeln!(src, "    out{j}[i] = v{};", o.0);
            }
            src.push_str("  }\n}\n");
            Launch::Map {
                n: spec.num_elements(),
            }
        }
        Some(r) => {
            let (kept, red, strategy) = reduce_layouts(&spec);
            let ident = constant(spec.dtype, r.op.identity());
            let _ = writeln!(src, "{} {{", signature(&spec, &name, &["n_out", "n_red"]));
            match strategy {
                ReduceStrategy::ThreadPerOutput => {
                    src.push_str(
                        "  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n_out;\n       o += (long long)gridDim.x * blockDim.x) {\n",
                    );
                    accumulate(&mut src, &spec, &kept, &red, &used, "0", "++j");
                    src.push_str("    }\n    out0[o] = acc;\n  }\n}\n");
                }
                ReduceStrategy::BlockPerOutput => {
                    let _ = writeln!(src, "  __shared__ T partial[{}];", BLOCK / 32);
                    src.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
                    src.push_str("  for (long long o = blockIdx.x; o < n_out; o += gridDim.x) {\n");
                    accumulate(
                        &mut src,
                        &spec,
                        &kept,
                        &red,
                        &used,
                        "threadIdx.x",
                        "j += blockDim.x",
                    );
                    src.push_str("    }\n");
                    // The tree: lanes fold pairwise within a warp, lane 0
                    // of each warp leaves its value in shared memory, warp
                    // 0 folds those. The order is fixed by the block size
                    // alone, so results do not vary between runs.
                    let step = combine(r.op, "acc", "__shfl_down_sync(0xffffffffu, acc, s)");
                    let _ = writeln!(src, "    for (int s = 16; s > 0; s >>= 1) acc = {step};");
                    src.push_str("    if (lane == 0) partial[warp] = acc;\n");
                    src.push_str("    __syncthreads();\n");
                    src.push_str("    if (warp == 0) {\n");
                    let _ = writeln!(
                        src,
                        "      acc = lane < (int)(blockDim.x >> 5) ? partial[lane] : {ident};"
                    );
                    let _ = writeln!(src, "      for (int s = 16; s > 0; s >>= 1) acc = {step};");
                    src.push_str("      if (lane == 0) out0[o] = acc;\n    }\n");
                    src.push_str("    __syncthreads();\n  }\n}\n");
                }
            }
            Launch::Reduce {
                n_out: kept.len(),
                n_red: red.len(),
                strategy,
            }
        }
    };
    CudaKernel {
        name,
        source: src,
        launch,
    }
}
