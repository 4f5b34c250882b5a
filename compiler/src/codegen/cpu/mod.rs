//! The CPU back end: a [`KernelSpec`] compiled with Cranelift into native
//! code, run over slices, split across threads with rayon.
//!
//! ```
//! use adjoint_compiler::codegen::cpu::compile_cached;
//! use adjoint_compiler::codegen::kernel::*;
//!
//! // y = exp(x) * 2
//! let mut body = BodyBuilder::new();
//! let x = body.input(0);
//! let e = body.unary(UnaryOp::Exp, x);
//! let two = body.constant(2.0);
//! let y = body.binary(BinaryOp::Mul, e, two);
//! let spec = KernelSpec {
//!     dtype: KDType::F32,
//!     shape: vec![3],
//!     inputs: vec![InputSpec::contiguous(&[3])],
//!     body: body.body,
//!     outputs: vec![y],
//!     reduce: None,
//! };
//! let kernel = compile_cached(&spec).unwrap();
//! let mut out = vec![0.0f32; 3];
//! kernel.run(&[&[0.0f32, 1.0, 2.0][..]], &mut [&mut out[..]]).unwrap();
//! assert_eq!(out[0], 2.0);
//! ```
//!
//! The compiled function has the C signature
//! `fn(inputs: *const *const u8, outputs: *const *mut u8, begin: usize, end: usize)`
//! ([`KernelFn`]) and runs one range of the outermost parallel loop; see
//! [`CompiledKernel::raw`].
//!
//! # Determinism
//!
//! Results do not depend on the number of threads: threads split only
//! loops whose iterations write distinct output elements, the vector loop
//! and its scalar tail compute bit-identical values, and each output of a
//! reduction is accumulated in an order fixed by the spec alone.
//!
//! # Reductions
//!
//! Reductions accumulate in the kernel's dtype. When the reduced axes are
//! innermost, each output keeps `unroll` vector accumulators of
//! interleaved partial results (plus one scalar for the tail) that are
//! combined in a fixed order at the end; otherwise each output element
//! accumulates in index order. `max` and `min` propagate NaN; which of two
//! equal values (such as -0.0 and 0.0) they return is unspecified. A
//! reduction to a single element is cut into blocks of [`SPLIT_BLOCK`]
//! elements ([`SPLIT_BLOCK_F32`] for f32; fixed by the spec, not the
//! thread count) whose results are combined in order, in f64; a reduction to a few elements (fewer than the
//! threads) uses at most that many threads.

mod avx2;
mod emit;
pub(crate) mod libcalls;
mod math;
mod nest;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use rayon::prelude::*;

use super::kernel::{BinaryOp, KDType, KernelSpec, ReduceOp, SpecError, UnaryOp};
use nest::{LoopNest, Mode};

/// The native entry point of a compiled kernel: `inputs` and `outputs`
/// point to arrays of buffer pointers (in the spec's order); the function
/// runs the parallel loop over `[begin, end)`.
pub type KernelFn = unsafe extern "C" fn(
    inputs: *const *const u8,
    outputs: *const *mut u8,
    begin: usize,
    end: usize,
);

/// Element counts at or above this run on several threads.
pub const PARALLEL_THRESHOLD: usize = 1 << 15;

/// The block size, in elements, of a reduction to a single element: blocks
/// are reduced separately (in parallel when large) and their results
/// combined in order.
pub const SPLIT_BLOCK: usize = 1 << 16;

/// [`SPLIT_BLOCK`] for f32: each block's accumulators then add up few
/// enough elements that the rounding error of an f32 sum stays near that
/// of a pairwise sum; the blocks' results are combined in f64.
pub const SPLIT_BLOCK_F32: usize = 1 << 11;

/// Whether a map computing `op` on `dtype` runs it through a 256-bit
/// routine with the default options (in chunks; only maps do). Fusion
/// keeps such maps out of reductions.
pub fn has_wide_routine(op: UnaryOp, dtype: KDType) -> bool {
    avx2::routine(op, dtype).is_some()
}

/// Why compiling or running a kernel failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// The spec is malformed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The host is unsupported or Cranelift rejected the function.
    #[error("code generation failed: {0}")]
    Backend(String),
    /// The element type of the buffers is not the kernel's.
    #[error("kernel of {expected} called with {got} buffers")]
    DType {
        /// The kernel's dtype.
        expected: &'static str,
        /// The buffers' dtype.
        got: &'static str,
    },
    /// Wrong number or length of buffers.
    #[error("{0}")]
    Buffers(String),
}

/// Options for [`compile_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Vectors per step of the innermost loop (`None`: chosen from the
    /// body's cost, 1 to 4).
    pub unroll: Option<usize>,
    /// Whether `a * b + c` steps of the polynomials are fused
    /// multiply-adds (`None`: when the host has FMA; `Some(true)` on a
    /// host without it is ignored). Results differ in the last bit between
    /// the two, but not between runs or thread counts.
    pub fma: Option<bool>,
    /// Whether a map's `tanh`, `sigmoid` and `exp` run through the 256-bit
    /// routines (module `avx2`), the innermost loop in chunks around them
    /// (`None`: when the host has AVX2 and FMA). Same bits either way.
    pub avx2: Option<bool>,
    /// Keep the machine code as text ([`CompiledKernel::disassembly`]).
    pub disasm: bool,
}

/// How [`CompiledKernel::run_with`] uses threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallelism {
    /// One call on the current thread.
    Serial,
    /// Several chunks on rayon's current pool when the kernel has at least
    /// [`PARALLEL_THRESHOLD`] elements and the pool has several threads.
    Auto,
    /// Exactly this many chunks (at most the parallel loop's extent), run
    /// on rayon's current pool.
    Chunks(usize),
}

/// A float type that kernels run on.
pub trait KernelElem: Copy + Send + Sync + 'static + private::Sealed {
    /// The matching kernel dtype.
    const DTYPE: KDType;
    /// `x` converted from f64.
    fn from_f64(x: f64) -> Self;
    /// `self` converted to f64 (exactly).
    fn to_f64(self) -> f64;
    /// The elements per block of a reduction to one element.
    const SPLIT_BLOCK: usize;
    /// `a op b` for combining partial reductions, with the compiled code's
    /// semantics (`max`/`min` propagate NaN).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
}

macro_rules! combine {
    () => {
        fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
            match op {
                ReduceOp::Sum => a + b,
                ReduceOp::Prod => a * b,
                _ if a.is_nan() || b.is_nan() => Self::NAN,
                ReduceOp::Max => a.max(b),
                ReduceOp::Min => a.min(b),
            }
        }
    };
}

impl KernelElem for f32 {
    const DTYPE: KDType = KDType::F32;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const SPLIT_BLOCK: usize = SPLIT_BLOCK_F32;
    combine!();
}

impl KernelElem for f64 {
    const DTYPE: KDType = KDType::F64;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
    const SPLIT_BLOCK: usize = SPLIT_BLOCK;
    combine!();
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// Owns the JIT memory of one kernel.
pub(crate) struct Code(pub(crate) Option<JITModule>);

// SAFETY: the module is never used after the function is finalized, except
// to free its memory on drop, which needs exclusive access.
unsafe impl Send for Code {}
unsafe impl Sync for Code {}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: the function pointer lives in the `CompiledKernel` that
            // owns this `Code`, so nothing can call it any more.
            unsafe { m.free_memory() };
        }
    }
}

/// A kernel compiled to native code.
pub struct CompiledKernel {
    spec: KernelSpec,
    nest: Option<LoopNest>,
    func: Option<KernelFn>,
    compile_time: Duration,
    code_size: usize,
    unroll: usize,
    fma: bool,
    avx2: bool,
    disasm: Option<String>,
    _code: Code,
}

impl std::fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledKernel")
            .field("spec", &self.spec)
            .field("compile_time", &self.compile_time)
            .field("code_size", &self.code_size)
            .finish()
    }
}

fn isa() -> Result<OwnedTargetIsa, CodegenError> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| make_isa(false, false))
        .clone()
        .map_err(CodegenError::Backend)
}

/// The ISA for code with tail calls, which Cranelift implements with
/// frame pointers.
/// `quick`: with the single-pass register allocator, which compiles long
/// functions many times faster than the default one and makes code about
/// a quarter slower (scalar programs' first tier, `scalar::native`).
pub(crate) fn tail_call_isa(quick: bool) -> Result<OwnedTargetIsa, CodegenError> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    static QUICK: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    let cell = if quick { &QUICK } else { &ISA };
    cell.get_or_init(|| make_isa(true, quick))
        .clone()
        .map_err(CodegenError::Backend)
}

fn make_isa(frame_pointers: bool, quick: bool) -> Result<OwnedTargetIsa, String> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v).map_err(|e| format!("setting {k}: {e}"))
    };
    set(&mut flags, "opt_level", "speed")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    if frame_pointers {
        set(&mut flags, "preserve_frame_pointers", "true")?;
    }
    if quick {
        set(&mut flags, "regalloc_algorithm", "single_pass")?;
    }
    let builder = cranelift_native::builder().map_err(|e| e.to_string())?;
    builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| e.to_string())
}

/// Compiles `spec` with default options (no cache).
pub fn compile(spec: &KernelSpec) -> Result<CompiledKernel, CodegenError> {
    compile_with(spec, &CompileOptions::default())
}

/// Compiles `spec` (no cache).
pub fn compile_with(
    spec: &KernelSpec,
    options: &CompileOptions,
) -> Result<CompiledKernel, CodegenError> {
    spec.validate()?;
    let _s = stage!("Cranelift: kernel");
    let t0 = Instant::now();
    let spec = spec.canonical();
    let unroll = options
        .unroll
        .unwrap_or_else(|| emit::default_unroll(&spec))
        .clamp(1, 8);
    if spec.num_elements() == 0 {
        return Ok(CompiledKernel {
            spec,
            nest: None,
            func: None,
            compile_time: t0.elapsed(),
            code_size: 0,
            unroll,
            fma: false,
            avx2: false,
            disasm: None,
            _code: Code(None),
        });
    }
    let nest = LoopNest::new(&spec);
    let isa = isa()?;
    let fma = options.fma.unwrap_or(true) && isa.has_native_fma();
    let mut builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    for lc in UnaryOp::all()
        .iter()
        .filter_map(|&op| libcalls::unary_libcall(op, spec.dtype))
        .chain(
            BinaryOp::ALL
                .iter()
                .filter_map(|&op| libcalls::binary_libcall(op, spec.dtype)),
        )
    {
        builder.symbol(lc.symbol, lc.ptr);
    }
    let use_avx2 = options.avx2.unwrap_or(true) && avx2::available();
    if use_avx2 {
        for (symbol, f) in avx2::all() {
            builder.symbol(symbol, f as *const u8);
        }
    }
    let mut module = JITModule::new(builder);
    let (id, code_size, disasm, chunked) = emit::define(
        &mut module,
        &spec,
        &nest,
        unroll,
        fma,
        use_avx2,
        options.disasm,
    )
    .map_err(CodegenError::Backend)?;
    module
        .finalize_definitions()
        .map_err(|e| CodegenError::Backend(e.to_string()))?;
    let ptr = module.get_finalized_function(id);
    // SAFETY: the function was defined with the `KernelFn` signature.
    let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
    Ok(CompiledKernel {
        spec,
        nest: Some(nest),
        func: Some(func),
        compile_time: t0.elapsed(),
        code_size,
        unroll,
        fma,
        avx2: chunked,
        disasm,
        _code: Code(Some(module)),
    })
}

type Cache = Mutex<HashMap<(KernelSpec, CompileOptions), Arc<CompiledKernel>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Compiles `spec` once per process: later calls with an equivalent spec
/// (the same [`KernelSpec::canonical`] form) return the same kernel.
pub fn compile_cached(spec: &KernelSpec) -> Result<Arc<CompiledKernel>, CodegenError> {
    compile_cached_with(spec, &CompileOptions::default())
}

/// [`compile_cached`] with options (part of the cache key).
pub fn compile_cached_with(
    spec: &KernelSpec,
    options: &CompileOptions,
) -> Result<Arc<CompiledKernel>, CodegenError> {
    spec.validate()?;
    let key = (spec.canonical(), options.clone());
    if let Some(k) = cache().lock().unwrap().get(&key) {
        return Ok(k.clone());
    }
    let k = Arc::new(compile_with(&key.0, options)?);
    Ok(cache().lock().unwrap().entry(key).or_insert(k).clone())
}

/// The number of kernels in the process-wide cache.
pub fn cache_len() -> usize {
    cache().lock().unwrap().len()
}

/// Empties the process-wide cache (kernels in use stay alive with the
/// programs holding them).
pub fn clear_cache() {
    cache().lock().unwrap().clear();
}

/// Raw buffer pointers that may cross threads: the chunks write disjoint
/// output elements.
/// The addresses of input buffers.
fn in_ptrs<T>(inputs: &[&[T]]) -> Vec<*const u8> {
    inputs.iter().map(|x| x.as_ptr() as *const u8).collect()
}

struct Ptrs {
    inputs: Vec<*const u8>,
    outputs: Vec<*mut u8>,
}
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

impl Ptrs {
    /// The same inputs with one output.
    fn with_output(&self, out: *mut u8) -> Ptrs {
        Ptrs {
            inputs: self.inputs.clone(),
            outputs: vec![out],
        }
    }

    /// # Safety
    ///
    /// As for [`CompiledKernel::raw`].
    unsafe fn call(&self, func: KernelFn, begin: usize, end: usize) {
        unsafe { func(self.inputs.as_ptr(), self.outputs.as_ptr(), begin, end) }
    }
}

impl CompiledKernel {
    /// The canonical spec this kernel computes.
    pub fn spec(&self) -> &KernelSpec {
        &self.spec
    }

    /// How long compiling took (canonicalising, planning, Cranelift, and
    /// linking).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The size of the machine code in bytes.
    pub fn code_size(&self) -> usize {
        self.code_size
    }

    /// The number of vectors per step of the innermost loop.
    pub fn unroll(&self) -> usize {
        self.unroll
    }

    /// Whether the polynomials use fused multiply-adds.
    pub fn uses_fma(&self) -> bool {
        self.fma
    }

    /// Whether the innermost loop runs in chunks around 256-bit routines
    /// ([`CompileOptions::avx2`]).
    pub fn uses_avx2(&self) -> bool {
        self.avx2
    }

    /// The machine code as text, when compiled with
    /// [`CompileOptions::disasm`].
    pub fn disassembly(&self) -> Option<&str> {
        self.disasm.as_deref()
    }

    /// Whether the innermost loop is vectorised.
    pub fn is_vectorized(&self) -> bool {
        self.nest.as_ref().is_some_and(|p| p.vector)
    }

    /// Whether the kernel is a single flat loop (every input contiguous or
    /// a broadcast scalar, no reduction).
    pub fn is_flat(&self) -> bool {
        self.nest
            .as_ref()
            .is_some_and(|p| p.dims.len() == 1 && p.mode == Mode::Map)
    }

    /// The extent of the parallel loop: the `[begin, end)` range a raw call
    /// may cover is within `0..outer_extent()` (0 for an empty kernel).
    pub fn outer_extent(&self) -> usize {
        self.nest.as_ref().map_or(0, |p| p.par_extent())
    }

    /// The native function, `None` for an empty iteration space.
    ///
    /// # Safety of calling it
    ///
    /// `inputs` must point to one pointer per spec input, each to a buffer
    /// of at least [`KernelSpec::input_len`] elements of the dtype;
    /// `outputs` to one pointer per output, each to
    /// [`KernelSpec::output_len_of`] elements, not overlapping the inputs;
    /// `begin <= end <= outer_extent()`. Calls with disjoint ranges may run
    /// concurrently.
    ///
    /// A reduction to a single element is the exception: its range is over
    /// the outermost reduced loop, and each call stores the reduction of
    /// its range alone to `outputs[0][0]`; [`CompiledKernel::run`] reduces
    /// blocks of [`SPLIT_BLOCK`] elements this way and combines them.
    pub fn raw(&self) -> Option<KernelFn> {
        self.func
    }

    /// Runs the kernel, on several threads for large kernels
    /// ([`Parallelism::Auto`]).
    pub fn run<T: KernelElem>(
        &self,
        inputs: &[&[T]],
        outputs: &mut [&mut [T]],
    ) -> Result<(), CodegenError> {
        self.run_with(inputs, outputs, Parallelism::Auto)
    }

    /// Runs the kernel on the current thread.
    pub fn run_serial<T: KernelElem>(
        &self,
        inputs: &[&[T]],
        outputs: &mut [&mut [T]],
    ) -> Result<(), CodegenError> {
        self.run_with(inputs, outputs, Parallelism::Serial)
    }

    /// Runs a kernel into outputs that are not initialised yet, on
    /// several threads for large kernels. A map kernel writes every
    /// element of its outputs and reads none; so does a reduction that
    /// keeps some dimension (an outer reduction fills its output rows with
    /// the identity before it accumulates into them). A reduction to one
    /// element ([`CompiledKernel::reduces_to_one`]) needs
    /// [`CompiledKernel::run`]. Checks as [`CompiledKernel::run_with`].
    pub fn run_uninit<T: KernelElem>(
        &self,
        inputs: &[&[T]],
        outputs: &mut [&mut [std::mem::MaybeUninit<T>]],
    ) -> Result<(), CodegenError> {
        if self.reduces_to_one() {
            return Err(CodegenError::Buffers(
                "a reduction to one element needs initialised outputs".into(),
            ));
        }
        self.check::<T>(inputs, outputs.iter().map(|y| y.len()))?;
        let Some((nest, func)) = self.nest.as_ref().zip(self.func) else {
            // An empty iteration space: a reduction's outputs (over
            // nonempty kept dimensions) are its identity.
            if let Some(r) = &self.spec.reduce {
                let id = T::from_f64(r.op.identity());
                for y in outputs.iter_mut().take(1) {
                    y.iter_mut().for_each(|v| {
                        v.write(id);
                    });
                }
            }
            return Ok(());
        };
        let out_ptrs = outputs
            .iter_mut()
            .map(|y| y.as_mut_ptr() as *mut u8)
            .collect();
        self.run_map(nest, func, in_ptrs(inputs), out_ptrs, Parallelism::Auto);
        Ok(())
    }

    /// Whether this is a reduction whose nest splits the reduced loop
    /// across calls ([`CompiledKernel::raw`]'s exception): its output is
    /// combined from partial results.
    pub fn reduces_to_one(&self) -> bool {
        self.nest.as_ref().is_some_and(|p| p.is_split())
    }

    /// Whether input `i` of a map kernel is read at the output's own index
    /// (dense, same shape): its buffer can then be the output's.
    pub fn reads_in_place(&self, i: usize) -> bool {
        let spec = &self.spec;
        spec.reduce.is_none()
            && spec.inputs.get(i).is_some_and(|x| {
                let dense = crate::codegen::kernel::InputSpec::contiguous(&spec.shape).strides;
                x.strides
                    .iter()
                    .zip(&dense)
                    .zip(&spec.shape)
                    .all(|((s, d), n)| *n == 1 || s == d)
            })
    }

    /// Runs a map kernel with its first output written over input `alias`
    /// (`buf`, which holds that input's elements and receives the output;
    /// `inputs[alias]` is not read). The other outputs are `others`.
    /// Needs [`CompiledKernel::reads_in_place`] for `alias`: each element
    /// is then read before the same element is written, and by the same
    /// iteration.
    pub fn run_in_place<T: KernelElem>(
        &self,
        inputs: &[&[T]],
        alias: usize,
        buf: &mut [T],
        others: &mut [&mut [std::mem::MaybeUninit<T>]],
    ) -> Result<(), CodegenError> {
        if !self.reads_in_place(alias) {
            return Err(CodegenError::Buffers(format!(
                "input {alias} is not read in place"
            )));
        }
        let n_out = self.spec.output_len();
        let mut lens: Vec<usize> = vec![buf.len()];
        lens.extend(others.iter().map(|y| y.len()));
        {
            let mut checked: Vec<&[T]> = inputs.to_vec();
            checked[alias] = &*buf;
            self.check::<T>(&checked, lens.into_iter())?;
        }
        if buf.len() != n_out {
            return Err(CodegenError::Buffers(
                "in-place buffer has the wrong length".into(),
            ));
        }
        let Some((nest, func)) = self.nest.as_ref().zip(self.func) else {
            return Ok(());
        };
        let out = buf.as_mut_ptr() as *mut u8;
        let mut ins = in_ptrs(inputs);
        ins[alias] = out as *const u8;
        let mut out_ptrs = vec![out];
        out_ptrs.extend(others.iter_mut().map(|y| y.as_mut_ptr() as *mut u8));
        self.run_map(nest, func, ins, out_ptrs, Parallelism::Auto);
        Ok(())
    }

    /// Checks the dtype, the number of buffers, that every input is long
    /// enough and every output (of lengths `out_lens`) has exactly
    /// [`KernelSpec::output_len_of`] elements.
    fn check<T: KernelElem>(
        &self,
        inputs: &[&[T]],
        out_lens: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), CodegenError> {
        let spec = &self.spec;
        if T::DTYPE != spec.dtype {
            return Err(CodegenError::DType {
                expected: spec.dtype.name(),
                got: T::DTYPE.name(),
            });
        }
        let n_outputs = out_lens.len();
        if inputs.len() != spec.inputs.len() || n_outputs != spec.outputs.len() {
            return Err(CodegenError::Buffers(format!(
                "kernel takes {} inputs and {} outputs, got {} and {}",
                spec.inputs.len(),
                spec.outputs.len(),
                inputs.len(),
                n_outputs
            )));
        }
        for (i, x) in inputs.iter().enumerate() {
            let need = spec.input_len(i);
            if x.len() < need {
                return Err(CodegenError::Buffers(format!(
                    "input {i} has {} elements, the kernel reads {need}",
                    x.len()
                )));
            }
        }
        for (i, len) in out_lens.enumerate() {
            let n_out = spec.output_len_of(i);
            if len != n_out {
                return Err(CodegenError::Buffers(format!(
                    "output {i} has {len} elements, expected {n_out}"
                )));
            }
        }
        Ok(())
    }

    /// Runs the kernel after checking the dtype, the number of buffers, that
    /// every input is long enough and every output has exactly
    /// [`KernelSpec::output_len`] elements.
    pub fn run_with<T: KernelElem>(
        &self,
        inputs: &[&[T]],
        outputs: &mut [&mut [T]],
        parallelism: Parallelism,
    ) -> Result<(), CodegenError> {
        let spec = &self.spec;
        self.check::<T>(inputs, outputs.iter().map(|y| y.len()))?;
        let (Some(nest), Some(func)) = (&self.nest, self.func) else {
            // An empty iteration space: reductions give their identity.
            if let Some(r) = &spec.reduce {
                for y in outputs.iter_mut() {
                    y.fill(T::from_f64(r.op.identity()));
                }
            }
            return Ok(());
        };
        if nest.is_split() {
            return self.run_split(nest, func, inputs, outputs, parallelism);
        }
        let out_ptrs = outputs
            .iter_mut()
            .map(|y| y.as_mut_ptr() as *mut u8)
            .collect();
        self.run_map(nest, func, in_ptrs(inputs), out_ptrs, parallelism);
        Ok(())
    }

    /// Runs a kernel that is not split into blocks over its parallel loop,
    /// with outputs at `out_ptrs` (checked by the caller).
    fn run_map(
        &self,
        nest: &LoopNest,
        func: KernelFn,
        in_ptrs: Vec<*const u8>,
        out_ptrs: Vec<*mut u8>,
        parallelism: Parallelism,
    ) {
        let spec = &self.spec;
        let ptrs = Ptrs {
            inputs: in_ptrs,
            outputs: out_ptrs,
        };
        let extent = nest.par_extent();
        let chunks = match parallelism {
            Parallelism::Serial => 1,
            Parallelism::Chunks(n) => n.clamp(1, extent),
            Parallelism::Auto => {
                let threads = rayon::current_num_threads();
                let n = spec.num_elements();
                if n < PARALLEL_THRESHOLD || threads < 2 {
                    1
                } else {
                    // A few chunks per thread for balance, each of at least
                    // half the threshold.
                    (threads * 4)
                        .min(n / (PARALLEL_THRESHOLD / 2))
                        .clamp(1, extent)
                }
            }
        };
        let call = |begin: usize, end: usize| {
            // SAFETY: the buffers were checked by the caller against the
            // spec, the outputs are distinct buffers, and chunks are
            // disjoint ranges of the parallel loop, whose iterations write
            // disjoint output elements.
            unsafe { ptrs.call(func, begin, end) }
        };
        if chunks <= 1 {
            call(0, extent);
            return;
        }
        // Chunk boundaries on multiples of 16 when the parallel loop is the
        // vectorised one, so that vector loops cover almost everything.
        let align = if nest.par_dim == nest.dims.len() - 1 && nest.vector {
            16
        } else {
            1
        };
        let per = extent.div_ceil(chunks).next_multiple_of(align);
        let ranges: Vec<(usize, usize)> = (0..extent)
            .step_by(per)
            .map(|b| (b, (b + per).min(extent)))
            .collect();
        ranges.par_iter().for_each(|&(b, e)| call(b, e));
    }

    /// A reduction to one element: the reduced range is cut into blocks of
    /// about [`SPLIT_BLOCK`] elements (a function of the spec alone), each
    /// block is reduced on its own, possibly in parallel, and the partial
    /// results are combined in block order.
    fn run_split<T: KernelElem>(
        &self,
        nest: &LoopNest,
        func: KernelFn,
        inputs: &[&[T]],
        outputs: &mut [&mut [T]],
        parallelism: Parallelism,
    ) -> Result<(), CodegenError> {
        let Mode::InnerReduce(op) = nest.mode else {
            unreachable!("split plans are inner reductions")
        };
        let extent = nest.par_extent();
        let per = T::SPLIT_BLOCK.div_ceil(nest.inner_elements()).max(1);
        let blocks = extent.div_ceil(per);
        let base = Ptrs {
            inputs: inputs.iter().map(|x| x.as_ptr() as *const u8).collect(),
            outputs: vec![],
        };
        let mut partials = vec![T::from_f64(op.identity()); blocks];
        let parallel = match parallelism {
            Parallelism::Serial => false,
            Parallelism::Chunks(n) => n > 1,
            Parallelism::Auto => {
                self.spec.num_elements() >= PARALLEL_THRESHOLD && rayon::current_num_threads() > 1
            }
        };
        let block = |j: usize, out: &mut T| {
            let ptrs = base.with_output(out as *mut T as *mut u8);
            let (b, e) = (j * per, ((j + 1) * per).min(extent));
            // SAFETY: the inputs were checked against the spec; each block
            // writes only its own partial.
            unsafe { ptrs.call(func, b, e) }
        };
        if parallel {
            partials
                .par_iter_mut()
                .enumerate()
                .for_each(|(j, out)| block(j, out));
        } else {
            for (j, out) in partials.iter_mut().enumerate() {
                block(j, out);
            }
        }
        // Partial results are combined in f64 and rounded once.
        let total = partials
            .into_iter()
            .map(T::to_f64)
            .reduce(|a, b| f64::combine(op, a, b))
            .unwrap_or(op.identity());
        outputs[0][0] = T::from_f64(total);
        Ok(())
    }
}
