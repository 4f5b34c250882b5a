//! Scalar programs ([`ScalarProgram`]) compiled with Cranelift.
//!
//! Every function of the program becomes a native function with
//! Cranelift's `tail` calling convention, so its tail calls (a loop's
//! back edge, the jump to its exit) are native tail calls: a loop runs in
//! constant stack. Values live in registers; nothing is allocated. A
//! trampoline with the platform's calling convention,
//! `fn(args: *const u64, results: *mut u64)`, calls the entry: each
//! argument and result takes 8 bytes (the value in the low bytes).
//!
//! Operations with a short exact machine form are inline (arithmetic,
//! comparisons, conversions, `sqrt`, `floor`, `abs`); the others call the
//! runtime's scalar functions, so results are those of eager mode bit for
//! bit. Each function first reads the runtime's interrupt flag
//! ([`adjoint_runtime::vm::request_interrupt`]): when it is set, it returns
//! at once and the caller reports the interruption, so Ctrl-C stops a
//! compiled loop too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, BlockArg, FuncRef, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind,
    Type, Value,
};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module};

use adjoint_runtime::error::RtError;

use crate::codegen::cpu::libcalls::*;
use crate::codegen::cpu::{tail_call_isa, Code, CodegenError};
use crate::scalar::{
    SBinary, SCall, SInst, SOp, STerm, SType, SUnary, SVal, Scalar, ScalarProgram,
};

/// Functions with more results than this return them through memory: a
/// hidden pointer to 8-byte slots (Cranelift returns only what fits in
/// registers).
const REG_RESULTS: usize = 4;

/// Whether function `f` returns its results through memory.
fn returns_in_memory(f: &crate::scalar::SFunc) -> bool {
    f.results.len() > REG_RESULTS
}

/// The trampoline's signature (`tape` is null for programs without tape
/// operations).
type Trampoline = unsafe extern "C" fn(args: *const u64, results: *mut u64, tape: *mut TapeBuf);

/// The tape as native code sees it: a `Vec<u64>` taken apart, and a fault
/// code. Programs with tape operations pass a pointer to it to every
/// function as a hidden first parameter.
#[repr(C)]
pub(crate) struct TapeBuf {
    ptr: *mut u64,
    len: usize,
    cap: usize,
    /// 0, or one of the fault codes below.
    fault: u64,
    /// What the fault needs to be described (a negative exponent).
    detail: u64,
    /// The site of the instruction that faulted ([`SInst::site`]), or
    /// [`NO_SITE`].
    site: u64,
    /// The most values the tape may grow to (read by `tape_grow` only).
    limit: u64,
    /// More of what the fault needs: an index's axis (high 32 bits) and
    /// that axis's size (low 32 bits).
    extra: u64,
    /// The elements of the program's buffers ([`ScalarProgram::buffers`]),
    /// one pointer each.
    bufs: *const *const u8,
}

impl TapeBuf {
    fn new(ptr: *mut u64, len: usize, cap: usize, limit: u64) -> TapeBuf {
        TapeBuf {
            ptr,
            len,
            cap,
            fault: 0,
            detail: 0,
            site: NO_SITE,
            limit,
            extra: 0,
            bufs: std::ptr::null(),
        }
    }
}

/// The offset of [`TapeBuf::bufs`].
const BUFS_OFFSET: i32 = 64;

/// A buffer a program reads ([`ScalarProgram::buffers`]): a tensor's
/// elements, row-major.
#[derive(Clone, Copy, Debug)]
pub enum BufRef<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I64(&'a [i64]),
}

impl BufRef<'_> {
    fn ty(&self) -> SType {
        match self {
            BufRef::F32(_) => SType::F32,
            BufRef::F64(_) => SType::F64,
            BufRef::I64(_) => SType::I64,
        }
    }

    fn len(&self) -> usize {
        match self {
            BufRef::F32(x) => x.len(),
            BufRef::F64(x) => x.len(),
            BufRef::I64(x) => x.len(),
        }
    }

    fn ptr(&self) -> *const u8 {
        match self {
            BufRef::F32(x) => x.as_ptr() as *const u8,
            BufRef::F64(x) => x.as_ptr() as *const u8,
            BufRef::I64(x) => x.as_ptr() as *const u8,
        }
    }
}

/// Why a compiled scalar program stopped: a message and, for a fault of
/// one of its instructions, that instruction's site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalarError {
    pub message: String,
    pub site: Option<u32>,
}

impl std::fmt::Display for ScalarError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for ScalarError {
    fn from(message: String) -> ScalarError {
        ScalarError {
            message,
            site: None,
        }
    }
}

impl From<ScalarError> for RtError {
    fn from(e: ScalarError) -> RtError {
        RtError::new(e.message).at_site(e.site)
    }
}

/// [`TapeBuf::site`] when the instruction that faulted has no site.
const NO_SITE: u64 = u64::MAX;

const TAPE_UNDERFLOW: u64 = 1;
const TAPE_FULL: u64 = 2;
/// An integer `div` or `rem` by zero.
const DIV_BY_ZERO: u64 = 3;
const REM_BY_ZERO: u64 = 4;
/// An integer `pow` with a negative exponent (in `detail`).
const NEGATIVE_POWER: u64 = 5;
/// An index out of range (the index in `detail`, its axis and size in
/// `extra`).
const INDEX_RANGE: u64 = 6;

thread_local! {
    static TAPE_GROWTHS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many times native code on this thread had to grow a tape (a tape
/// made long enough from the start never grows).
pub fn tape_growths() -> u64 {
    TAPE_GROWTHS.with(|c| c.get())
}

/// Makes room for `n` more values; 0 (and the fault set) when the tape
/// would exceed its limit or memory is short.
extern "C" fn tape_grow(t: *mut TapeBuf, n: u64) -> u8 {
    // SAFETY: native code passes the pointer its trampoline was given,
    // which `CompiledScalar::call_with_tape` made from a live Vec.
    let t = unsafe { &mut *t };
    TAPE_GROWTHS.with(|c| c.set(c.get() + 1));
    let mut v = std::mem::ManuallyDrop::new(unsafe { Vec::from_raw_parts(t.ptr, t.len, t.cap) });
    let fits = (t.len as u64)
        .checked_add(n)
        .is_some_and(|total| total <= t.limit);
    let ok = fits && v.try_reserve(n as usize).is_ok();
    t.ptr = v.as_mut_ptr();
    t.cap = v.capacity();
    if !ok {
        t.fault = TAPE_FULL;
    }
    ok as u8
}

/// A scalar program compiled to native code.
pub struct CompiledScalar {
    program: ScalarProgram,
    /// Whether the program pushes to its tape.
    pushes: bool,
    /// The trampoline of the newest code ([`Trampoline`]).
    func: AtomicPtr<u8>,
    /// Whether `func` is the optimised code.
    optimised: AtomicBool,
    compile_time: Duration,
    /// Every code compiled for it: a run may still be in the first
    /// tier's when the second's is installed.
    codes: Mutex<Vec<Code>>,
}

impl std::fmt::Debug for CompiledScalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledScalar")
            .field("functions", &self.program.funcs.len())
            .field("compile_time", &self.compile_time)
            .finish()
    }
}

impl CompiledScalar {
    fn new(
        program: &ScalarProgram,
        (func, code): (Trampoline, Code),
        optimised: bool,
        t: Duration,
    ) -> CompiledScalar {
        CompiledScalar {
            pushes: program
                .funcs
                .iter()
                .any(|f| f.body.iter().any(|i| matches!(i.op, SOp::Push(_)))),
            program: program.clone(),
            func: AtomicPtr::new(func as *mut u8),
            optimised: AtomicBool::new(optimised),
            compile_time: t,
            codes: Mutex::new(vec![code]),
        }
    }

    /// Whether it runs the optimised code (not the first tier's).
    pub fn optimised(&self) -> bool {
        self.optimised.load(Ordering::Acquire)
    }

    /// Makes `func` (in `code`) the code that runs from now on.
    fn install(&self, func: Trampoline, code: Code) {
        self.codes.lock().expect("scalar codes").push(code);
        self.func.store(func as *mut u8, Ordering::Release);
        self.optimised.store(true, Ordering::Release);
    }

    pub fn program(&self) -> &ScalarProgram {
        &self.program
    }

    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// Runs the entry on `args`, which must have its parameter types.
    /// An error if the arguments do not match or the run was interrupted.
    pub fn call(&self, args: &[Scalar]) -> Result<Vec<Scalar>, ScalarError> {
        self.call_with(args, &[], &mut Vec::new(), u64::MAX)
    }

    /// [`CompiledScalar::call`] for a program with tape operations: they
    /// push to and pop from `tape`.
    pub fn call_with_tape(
        &self,
        args: &[Scalar],
        tape: &mut Vec<u64>,
        limit: u64,
    ) -> Result<Vec<Scalar>, ScalarError> {
        self.call_with(args, &[], tape, limit)
    }

    /// [`CompiledScalar::call_with_tape`] for a program that reads
    /// buffers: `buffers` has one per [`ScalarProgram::buffers`], of its
    /// type and length.
    pub fn call_with(
        &self,
        args: &[Scalar],
        buffers: &[BufRef],
        tape: &mut Vec<u64>,
        limit: u64,
    ) -> Result<Vec<Scalar>, ScalarError> {
        let want = &self.program.buffers;
        if buffers.len() != want.len()
            || buffers
                .iter()
                .zip(want)
                .any(|(b, w)| b.ty() != w.ty || b.len() != w.len)
        {
            return Err(format!(
                "{}: expected buffers {:?}, got {:?}",
                self.program.entry().name,
                want,
                buffers
                    .iter()
                    .map(|b| (b.ty(), b.len()))
                    .collect::<Vec<_>>()
            )
            .into());
        }
        let ptrs: Vec<*const u8> = buffers.iter().map(BufRef::ptr).collect();
        let mut v = std::mem::ManuallyDrop::new(std::mem::take(tape));
        let mut buf = TapeBuf::new(v.as_mut_ptr(), v.len(), v.capacity(), limit);
        buf.bufs = ptrs.as_ptr();
        // SAFETY: `buf` is a live Vec's parts, which native code keeps
        // valid (it grows the Vec only through `tape_grow`, and never pops
        // below empty); they are put back together afterwards. The
        // buffers were checked against the program's, and its loads read
        // offsets checked to be in range; `ptrs` outlives the run.
        let out = unsafe { self.run(args, &mut buf) };
        *tape = unsafe { Vec::from_raw_parts(buf.ptr, buf.len, buf.cap) };
        out
    }

    /// [`CompiledScalar::call`] for a program that only pops (a reverse
    /// pass): it pops from `tape`, which must be used up.
    pub fn call_popping(&self, args: &[Scalar], tape: &[u64]) -> Result<Vec<Scalar>, ScalarError> {
        if self.pushes {
            return Err(format!("{}: the program pushes", self.program.entry().name).into());
        }
        let mut buf = TapeBuf::new(tape.as_ptr() as *mut u64, tape.len(), tape.len(), u64::MAX);
        // SAFETY: a program without pushes only reads the tape (and
        // lowers `len`), so the borrowed slice is never written or grown.
        let out = unsafe { self.run(args, &mut buf) }?;
        if buf.len != 0 {
            return Err(format!(
                "internal error: {} left {} values on the tape",
                self.program.entry().name,
                buf.len
            )
            .into());
        }
        Ok(out)
    }

    /// Runs the entry with tape `buf`.
    ///
    /// # Safety
    /// `buf` must describe memory the program may use as its tape: for a
    /// program that pushes, a Vec's parts.
    unsafe fn run(&self, args: &[Scalar], buf: &mut TapeBuf) -> Result<Vec<Scalar>, ScalarError> {
        let entry = self.program.entry();
        if args.len() != entry.params.len()
            || args.iter().zip(&entry.params).any(|(a, t)| a.ty() != *t)
        {
            return Err(format!(
                "{}: expected arguments of types {:?}, got {:?}",
                entry.name, entry.params, args
            )
            .into());
        }
        let bits: Vec<u64> = args.iter().map(|a| a.to_bits()).collect();
        let mut out = vec![0u64; entry.results.len().max(1)];
        // SAFETY: the trampoline reads one u64 per parameter and writes one
        // per result, and the arguments were checked against the types the
        // code was compiled for; the caller vouches for `buf`.
        let ptr = self.func.load(Ordering::Acquire);
        // SAFETY: `func` always holds a trampoline of this program (made
        // by `emit`), whose code `codes` keeps.
        let func = unsafe { std::mem::transmute::<*mut u8, Trampoline>(ptr) };
        unsafe { func(bits.as_ptr(), out.as_mut_ptr(), buf) };
        if adjoint_runtime::vm::interrupt_requested() {
            return Err(String::from("interrupted").into());
        }
        match buf.fault {
            0 => {}
            TAPE_FULL => {
                return Err(format!(
                    "reverse mode's tape of this loop exceeds {} values of 8 bytes \
                     (or memory ran out)",
                    buf.limit
                )
                .into())
            }
            DIV_BY_ZERO | REM_BY_ZERO | NEGATIVE_POWER => {
                let (op, rhs) = match buf.fault {
                    DIV_BY_ZERO => ("div", 0),
                    REM_BY_ZERO => ("rem", 0),
                    _ => ("pow", buf.detail as i64),
                };
                let e = adjoint_runtime::kernels::map::int_operand_error(op, rhs);
                return Err(ScalarError {
                    message: e.unwrap_or_else(|| format!("internal error: {op} fault on {rhs}")),
                    site: u32::try_from(buf.site).ok(),
                });
            }
            INDEX_RANGE => {
                // The runtime's message for the same index.
                let (axis, size) = (buf.extra >> 32, buf.extra & 0xffff_ffff);
                let e = adjoint_runtime::shape::resolve_at(
                    buf.detail as i64,
                    axis as usize,
                    size as usize,
                );
                return Err(ScalarError {
                    message: e.err().unwrap_or_else(|| {
                        format!(
                            "internal error: index {} faulted in range",
                            buf.detail as i64
                        )
                    }),
                    site: u32::try_from(buf.site).ok(),
                });
            }
            _ => {
                return Err(
                    String::from("internal error: a scalar program popped an empty tape").into(),
                )
            }
        }
        Ok(entry
            .results
            .iter()
            .zip(out)
            .map(|(t, b)| Scalar::from_bits(*t, b))
            .collect())
    }
}

fn clif_type(t: SType) -> Type {
    match t {
        SType::F32 => types::F32,
        SType::F64 => types::F64,
        SType::I64 => types::I64,
        SType::Bool => types::I8,
    }
}

/// The runtime function an operation calls, if it is not inline: its
/// symbol, address and arity.
fn unary_call(op: SUnary, t: SType) -> Option<(&'static str, *const u8)> {
    macro_rules! pick {
        ($f32:ident, $f64:ident) => {
            match t {
                SType::F32 => (
                    concat!("adjoint_scalar_", stringify!($f32)),
                    $f32 as *const u8,
                ),
                _ => (
                    concat!("adjoint_scalar_", stringify!($f64)),
                    $f64 as *const u8,
                ),
            }
        };
    }
    Some(match (op, t) {
        (SUnary::Sign, SType::I64) => ("adjoint_scalar_sign_i64", sign_i64 as *const u8),
        (SUnary::Relu, SType::I64) => ("adjoint_scalar_relu_i64", relu_i64 as *const u8),
        (SUnary::Abs, SType::I64) => ("adjoint_scalar_abs_i64", abs_i64 as *const u8),
        (_, SType::I64 | SType::Bool) => return None,
        (SUnary::Exp, _) => pick!(exp_f32, exp_f64),
        (SUnary::Log, _) => pick!(log_f32, log_f64),
        (SUnary::Log1p, _) => pick!(log1p_f32, log1p_f64),
        (SUnary::Tanh, _) => pick!(tanh_f32, tanh_f64),
        (SUnary::Sigmoid, _) => pick!(sigmoid_f32, sigmoid_f64),
        (SUnary::Rsqrt, _) => pick!(rsqrt_f32, rsqrt_f64),
        (SUnary::Lgamma, _) => pick!(lgamma_f32, lgamma_f64),
        (SUnary::Erf, _) => pick!(erf_f32, erf_f64),
        (SUnary::Digamma, _) => pick!(digamma_f32, digamma_f64),
        (SUnary::Trigamma, _) => pick!(trigamma_f32, trigamma_f64),
        (SUnary::Math(f), SType::F32) => (f.row().symbol_f32, f.row().f32 as *const u8),
        (SUnary::Math(f), _) => (f.row().symbol_f64, f.row().f64 as *const u8),
        (SUnary::Sign, _) => pick!(sign_f32, sign_f64),
        (SUnary::Relu, _) => pick!(relu_f32, relu_f64),
        (
            SUnary::Neg | SUnary::Abs | SUnary::Floor | SUnary::Ceil | SUnary::Sqrt | SUnary::Not,
            _,
        ) => return None,
    })
}

fn binary_call(op: SBinary, t: SType) -> Option<(&'static str, *const u8)> {
    let f32 = t == SType::F32;
    if t == SType::I64 && op == SBinary::Pow {
        // Called once the exponent is known to be non-negative.
        return Some(("adjoint_scalar_pow_i64", pow_i64 as *const u8));
    }
    if !t.is_float() {
        return None;
    }
    Some(match (op, f32) {
        (SBinary::Pow, true) => ("adjoint_scalar_pow_f32", pow_f32 as *const u8),
        (SBinary::Pow, false) => ("adjoint_scalar_pow_f64", pow_f64 as *const u8),
        (SBinary::Rem, true) => ("adjoint_scalar_rem_f32", rem_f32 as *const u8),
        (SBinary::Rem, false) => ("adjoint_scalar_rem_f64", rem_f64 as *const u8),
        (SBinary::Maximum, true) => ("adjoint_scalar_max_f32", max_f32 as *const u8),
        (SBinary::Maximum, false) => ("adjoint_scalar_max_f64", max_f64 as *const u8),
        (SBinary::Minimum, true) => ("adjoint_scalar_min_f32", min_f32 as *const u8),
        (SBinary::Minimum, false) => ("adjoint_scalar_min_f64", min_f64 as *const u8),
        _ => return None,
    })
}

/// A runtime function an operation calls.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Import {
    Unary(SUnary, SType),
    Binary(SBinary, SType),
}

impl Import {
    fn symbol(self) -> Option<(&'static str, *const u8, usize, SType)> {
        match self {
            Import::Unary(op, t) => unary_call(op, t).map(|(s, p)| (s, p, 1, t)),
            Import::Binary(op, t) => binary_call(op, t).map(|(s, p)| (s, p, 2, t)),
        }
    }
}

/// The imports a program needs.
fn imports(p: &ScalarProgram) -> Vec<Import> {
    let mut out = Vec::new();
    for f in &p.funcs {
        let tys = f.value_types();
        for inst in &f.body {
            let im = match &inst.op {
                SOp::Unary(op, x) => Import::Unary(*op, tys[x.0 as usize]),
                SOp::Binary(op, a, _) => Import::Binary(*op, tys[a.0 as usize]),
                _ => continue,
            };
            if im.symbol().is_some() && !out.contains(&im) {
                out.push(im);
            }
        }
    }
    out
}

type Cache = Mutex<HashMap<String, Arc<CompiledScalar>>>;

fn scalar_cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Empties the process-wide cache of [`compile_scalar_cached`] (programs
/// holding compiled code keep it).
pub fn clear_cache() {
    scalar_cache().lock().expect("scalar code cache").clear();
}

/// Compiles `program`, or returns the code compiled for an equal program
/// earlier in the process (a REPL session, or a program run again by an
/// embedder, recompiles nothing).
pub fn compile_scalar_cached(program: &ScalarProgram) -> Result<Arc<CompiledScalar>, CodegenError> {
    let cache = scalar_cache();
    // The printed form is the key: it spells every constant exactly.
    let key = format!("{program:?}");
    if let Some(c) = cache.lock().expect("scalar code cache").get(&key) {
        return Ok(c.clone());
    }
    let compiled = Arc::new(compile_tiered(program)?);
    optimise_later(&compiled);
    cache
        .lock()
        .expect("scalar code cache")
        .insert(key, compiled.clone());
    Ok(compiled)
}

/// Programs with more instructions than this are compiled in two tiers
/// ([`compile_tiered`]).
const TIER_INSTS: usize = 400;

/// Compiles `program` (which must validate) with the optimising register
/// allocator.
pub fn compile_scalar(original: &ScalarProgram) -> Result<CompiledScalar, CodegenError> {
    compile_tier(original, false)
}

/// Compiles `program` (which must validate); a long one first with the
/// quick register allocator, and again with the optimising one on a
/// thread of its own, whose code replaces the first when it is ready
/// (both compute the same bits). Register allocation over long straight
/// code is most of Cranelift's time: the ADBench LSTM's reverse loop
/// compiles in 11 ms quickly and 110 ms optimised, and runs 27% faster
/// optimised.
pub fn compile_tiered(original: &ScalarProgram) -> Result<CompiledScalar, CodegenError> {
    let insts: usize = original.funcs.iter().map(|f| f.body.len()).sum();
    compile_tier(original, insts > TIER_INSTS)
}

/// Compiles `original` with the quick or the optimising register
/// allocator.
fn compile_tier(original: &ScalarProgram, quick: bool) -> Result<CompiledScalar, CodegenError> {
    original.validate().map_err(CodegenError::Backend)?;
    let _s = stage!("Cranelift: scalar loop");
    let t0 = Instant::now();
    let code = emit(original, quick)?;
    Ok(CompiledScalar::new(original, code, !quick, t0.elapsed()))
}

/// [`compile_scalar_cached`]'s second tier for `c`, when it was compiled
/// quickly: the optimised code, on a thread of its own.
fn optimise_later(c: &Arc<CompiledScalar>) {
    if c.optimised() {
        return;
    }
    let c = c.clone();
    let spawned = std::thread::Builder::new()
        .name("adjoint-tier2".into())
        .spawn(move || {
            // A failure leaves the first tier's code, which works.
            if let Ok((func, code)) = emit(&c.program, false) {
                c.install(func, code);
            }
        });
    // No thread: the first tier's code stays.
    drop(spawned);
}

/// The code of `original` and its trampoline.
fn emit(original: &ScalarProgram, quick: bool) -> Result<(Trampoline, Code), CodegenError> {
    // Loop headers copied into their bodies: back edges become jumps.
    let inlined = original.inline_tail_calls(24);
    let program = &inlined;
    let isa = tail_call_isa(quick)?;
    let mut builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    let needed = imports(program);
    for im in &needed {
        let (sym, ptr, _, _) = im.symbol().expect("only imports with symbols");
        builder.symbol(sym, ptr);
    }
    let uses_tape = program.uses_tape();
    if uses_tape {
        builder.symbol("adj_scalar_tape_grow", tape_grow as *const u8);
    }
    // A program that may fault gets the tape pointer too, for the fault
    // code, and checks it after each call.
    let may_fault = program.may_fault();
    // Loads find their buffers through it as well.
    let has_ctx = uses_tape || may_fault || !program.buffers.is_empty();
    let mut module = JITModule::new(builder);
    let ptr = module.target_config().pointer_type();
    let err = |e: &dyn std::fmt::Display| CodegenError::Backend(e.to_string());

    // Declarations.
    let mut ids = Vec::new();
    for (i, f) in program.funcs.iter().enumerate() {
        let mut sig = module.make_signature();
        sig.call_conv = CallConv::Tail;
        if has_ctx {
            sig.params.push(AbiParam::new(ptr));
        }
        if returns_in_memory(f) {
            sig.params.push(AbiParam::new(ptr));
        } else {
            sig.returns
                .extend(f.results.iter().map(|t| AbiParam::new(clif_type(*t))));
        }
        sig.params
            .extend(f.params.iter().map(|t| AbiParam::new(clif_type(*t))));
        let id = module
            .declare_function(&format!("scalar_{i}"), Linkage::Local, &sig)
            .map_err(|e| err(&e))?;
        ids.push(id);
    }
    let mut import_ids: HashMap<Import, FuncId> = HashMap::new();
    for im in &needed {
        let (sym, _, arity, t) = im.symbol().expect("only imports with symbols");
        let mut sig = module.make_signature();
        for _ in 0..arity {
            sig.params.push(AbiParam::new(clif_type(t)));
        }
        sig.returns.push(AbiParam::new(clif_type(t)));
        let id = module
            .declare_function(sym, Linkage::Import, &sig)
            .map_err(|e| err(&e))?;
        import_ids.insert(*im, id);
    }

    let grow_id = if uses_tape {
        let mut sig = module.make_signature();
        sig.params.push(AbiParam::new(ptr));
        sig.params.push(AbiParam::new(types::I64));
        sig.returns.push(AbiParam::new(types::I8));
        Some(
            module
                .declare_function("adj_scalar_tape_grow", Linkage::Import, &sig)
                .map_err(|e| err(&e))?,
        )
    } else {
        None
    };

    let in_memory: Vec<bool> = program.funcs.iter().map(returns_in_memory).collect();
    let mut ctx = module.make_context();
    let mut fbc = FunctionBuilderContext::new();
    for (i, f) in program.funcs.iter().enumerate() {
        ctx.func.signature = module
            .declarations()
            .get_function_decl(ids[i])
            .signature
            .clone();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
            let funcs: Vec<FuncRef> = ids
                .iter()
                .map(|id| module.declare_func_in_func(*id, b.func))
                .collect();
            let calls: HashMap<Import, FuncRef> = import_ids
                .iter()
                .map(|(im, id)| (*im, module.declare_func_in_func(*id, b.func)))
                .collect();
            let grow = grow_id.map(|id| module.declare_func_in_func(id, b.func));
            let fx = FnEmitter {
                funcs: &funcs,
                in_memory: &in_memory,
                calls: &calls,
                grow,
                may_fault,
                has_ctx,
                ptr,
            };
            fx.function(&mut b, i, f);
            b.finalize(module.target_config());
        }
        module
            .define_function(ids[i], &mut ctx)
            .map_err(|e| CodegenError::Backend(format!("{e:?}")))?;
        module.clear_context(&mut ctx);
    }
    let tramp = define_trampoline(&mut module, &mut ctx, &mut fbc, ids[0], program, has_ctx)?;
    module.finalize_definitions().map_err(|e| err(&e))?;
    let ptr = module.get_finalized_function(tramp);
    // SAFETY: the trampoline was defined with the `Trampoline` signature.
    let func = unsafe { std::mem::transmute::<*const u8, Trampoline>(ptr) };
    Ok((func, Code(Some(module))))
}

/// Defines the trampoline, which calls the entry function (`entry`) with
/// the platform's calling convention: arguments and results in arrays of
/// 8-byte slots, then the tape pointer.
fn define_trampoline(
    module: &mut JITModule,
    ctx: &mut cranelift_codegen::Context,
    fbc: &mut FunctionBuilderContext,
    entry: FuncId,
    program: &ScalarProgram,
    has_ctx: bool,
) -> Result<FuncId, CodegenError> {
    let err = |e: &dyn std::fmt::Display| CodegenError::Backend(e.to_string());
    let ptr = module.target_config().pointer_type();
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(ptr));
    sig.params.push(AbiParam::new(ptr));
    sig.params.push(AbiParam::new(ptr));
    let tramp = module
        .declare_function("scalar_entry", Linkage::Local, &sig)
        .map_err(|e| err(&e))?;
    ctx.func.signature = sig;
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, fbc);
        let entry_ref = module.declare_func_in_func(entry, b.func);
        let blk = b.create_block();
        b.append_block_params_for_function_params(blk);
        b.switch_to_block(blk);
        let (args, rets) = (b.block_params(blk)[0], b.block_params(blk)[1]);
        let tape = b.block_params(blk)[2];
        let flags = MemFlagsData::new().with_notrap();
        let e = program.entry();
        let mut params: Vec<Value> = e
            .params
            .iter()
            .enumerate()
            .map(|(k, t)| b.ins().load(clif_type(*t), flags, args, (8 * k) as i32))
            .collect();
        // The entry writes its results into the slots itself when it
        // returns them through memory.
        let in_memory = returns_in_memory(e);
        if in_memory {
            params.insert(0, rets);
        }
        if has_ctx {
            params.insert(0, tape);
        }
        let call = b.ins().call(entry_ref, &params);
        let results = b.inst_results(call).to_vec();
        for (k, r) in results.into_iter().enumerate() {
            b.ins().store(flags, r, rets, (8 * k) as i32);
        }
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    module
        .define_function(tramp, ctx)
        .map_err(|e| CodegenError::Backend(format!("{e:?}")))?;
    module.clear_context(ctx);
    Ok(tramp)
}

/// What the code of every function of a program refers to: the
/// functions, the runtime's functions it imports, and how calls pass the
/// tape pointer.
struct FnEmitter<'a> {
    funcs: &'a [FuncRef],
    /// Which functions return through memory ([`returns_in_memory`]).
    in_memory: &'a [bool],
    calls: &'a HashMap<Import, FuncRef>,
    /// The tape grower, for programs with tape operations.
    grow: Option<FuncRef>,
    /// Whether the program may raise a fault (then every call is followed
    /// by a check).
    may_fault: bool,
    /// Whether functions take the tape pointer first.
    has_ctx: bool,
    ptr: Type,
}

/// The blocks and values of the function being emitted that its
/// instructions need.
struct FnState {
    /// The tape pointer, passed on to every call.
    tp: Option<Value>,
    /// Where the function writes its results, when it returns them
    /// through memory; passed on by its tail calls.
    ret: Option<Value>,
    /// Where the function returns zeros (an interrupt or a fault).
    stop: cranelift_codegen::ir::Block,
}

impl FnEmitter<'_> {
    /// The code of function `i`, `f`: its entry, a loop header that tail
    /// calls of `f` itself jump to, the interrupt check, the body, and the
    /// terminator.
    fn function(&self, b: &mut FunctionBuilder, i: usize, f: &crate::scalar::SFunc) {
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let mut vals: Vec<Value> = b.block_params(entry).to_vec();
        let tp: Option<Value> = self.has_ctx.then(|| vals.remove(0));
        let ret: Option<Value> = self.in_memory[i].then(|| vals.remove(0));
        let header = b.create_block();
        for t in &f.params {
            b.append_block_param(header, clif_type(*t));
        }
        let args: Vec<BlockArg> = vals.iter().map(|v| (*v).into()).collect();
        b.ins().jump(header, &args);
        b.switch_to_block(header);
        let mut vals: Vec<Value> = b.block_params(header).to_vec();
        // The interrupt check: return zeros when the flag is set.
        let flag_addr = adjoint_runtime::vm::interrupt_flag_address() as i64;
        let stop = b.create_block();
        let go = b.create_block();
        let addr = b.ins().iconst(self.ptr, flag_addr);
        let flag = b
            .ins()
            .load(types::I8, MemFlagsData::new().with_notrap(), addr, 0);
        b.ins().brif(flag, stop, &[], go, &[]);
        b.switch_to_block(stop);
        if ret.is_some() {
            b.ins().return_(&[]);
        } else {
            let zeros: Vec<Value> = f.results.iter().map(|t| zero(b, *t)).collect();
            b.ins().return_(&zeros);
        }
        b.switch_to_block(go);
        let st = FnState { tp, ret, stop };
        let tys = f.value_types();
        for inst in &f.body {
            let out = self.inst(b, &st, inst, &vals, &tys);
            vals.extend(out);
        }
        let v = |x: &SVal| vals[x.0 as usize];
        let tail = |b: &mut FunctionBuilder, c: &SCall| {
            if c.func.0 as usize == i {
                let args: Vec<BlockArg> = c.args.iter().map(|x| v(x).into()).collect();
                b.ins().jump(header, &args);
            } else {
                // The callee has this function's results, so it returns
                // them the same way (to the same slots).
                let mut args: Vec<Value> = st.ret.into_iter().collect();
                args.extend(c.args.iter().map(v));
                let args = self.with_tape(&st, args);
                b.ins().return_call(self.funcs[c.func.0 as usize], &args);
            }
        };
        match &f.term {
            STerm::Return(vs) => {
                let rs: Vec<Value> = vs.iter().map(v).collect();
                match st.ret {
                    Some(at) => {
                        let flags = MemFlagsData::new().with_notrap().with_aligned();
                        for (k, r) in rs.into_iter().enumerate() {
                            b.ins().store(flags, r, at, (8 * k) as i32);
                        }
                        b.ins().return_(&[]);
                    }
                    None => {
                        b.ins().return_(&rs);
                    }
                }
            }
            STerm::TailCall(c) => tail(b, c),
            STerm::TailCallIf(c, x, y) => {
                let (bx, by) = (b.create_block(), b.create_block());
                b.ins().brif(v(c), bx, &[], by, &[]);
                b.switch_to_block(bx);
                tail(b, x);
                b.switch_to_block(by);
                tail(b, y);
            }
        }
        b.seal_all_blocks();
    }

    /// `args` with the tape pointer first, when functions take it.
    fn with_tape(&self, st: &FnState, args: Vec<Value>) -> Vec<Value> {
        st.tp.into_iter().chain(args).collect()
    }

    /// Calls function `func` (results of types `results`) with `args`
    /// (values only) and gives its results; a callee that returns through
    /// memory writes them into a stack slot of the caller.
    fn call_values(
        &self,
        b: &mut FunctionBuilder,
        st: &FnState,
        func: usize,
        args: Vec<Value>,
        results: &[SType],
    ) -> Vec<Value> {
        if !self.in_memory[func] {
            let call = b.ins().call(self.funcs[func], &self.with_tape(st, args));
            return b.inst_results(call).to_vec();
        }
        let slot = b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (8 * results.len()) as u32,
            3,
        ));
        let at = b.ins().stack_addr(self.ptr, slot, 0);
        let mut all = vec![at];
        all.extend(args);
        b.ins().call(self.funcs[func], &self.with_tape(st, all));
        results
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let flags = MemFlagsData::new().with_notrap().with_aligned();
                b.ins().load(clif_type(*t), flags, at, (8 * k) as i32)
            })
            .collect()
    }

    /// The code of one instruction; returns its results.
    fn inst(
        &self,
        b: &mut FunctionBuilder,
        st: &FnState,
        inst: &SInst,
        vals: &[Value],
        tys: &[SType],
    ) -> Vec<Value> {
        let v = |x: &SVal| vals[x.0 as usize];
        let ty = |x: &SVal| tys[x.0 as usize];
        let (tp, stop, calls, may_fault, ptr) =
            (st.tp, st.stop, self.calls, self.may_fault, self.ptr);
        match &inst.op {
            SOp::Const(c) => vec![constant(b, *c)],
            SOp::Unary(op, x) => {
                let t = ty(x);
                let r = match calls.get(&Import::Unary(*op, t)) {
                    Some(fr) => {
                        let call = b.ins().call(*fr, &[v(x)]);
                        b.inst_results(call)[0]
                    }
                    None => unary_inline(b, *op, t, v(x)),
                };
                vec![r]
            }
            SOp::Binary(SBinary::Pow, x, y) if ty(x) == SType::I64 => {
                // A negative exponent stops the program with a
                // fault; the others call the runtime's power.
                let tp = tp.expect("programs that may fault have the pointer");
                let neg = b.ins().icmp_imm_s(IntCC::SignedLessThan, v(y), 0);
                let fault = Fault {
                    code: NEGATIVE_POWER,
                    detail: Some(v(y)),
                    site: inst.site,
                    extra: None,
                };
                fault_if(b, neg, tp, fault, stop);
                let fr = calls[&Import::Binary(SBinary::Pow, SType::I64)];
                let call = b.ins().call(fr, &[v(x), v(y)]);
                vec![b.inst_results(call)[0]]
            }
            SOp::Binary(op @ (SBinary::Div | SBinary::Rem), x, y) if ty(x) == SType::I64 => {
                // Zero stops the program with a fault; -1 is
                // handled apart (`MIN / -1` wraps, as in the
                // runtime, where the machine would trap).
                let tp = tp.expect("programs that may fault have the pointer");
                let zero = b.ins().icmp_imm_s(IntCC::Equal, v(y), 0);
                let code = if *op == SBinary::Div {
                    DIV_BY_ZERO
                } else {
                    REM_BY_ZERO
                };
                let fault = Fault {
                    code,
                    detail: None,
                    site: inst.site,
                    extra: None,
                };
                fault_if(b, zero, tp, fault, stop);
                let minus_one = b.ins().icmp_imm_s(IntCC::Equal, v(y), -1);
                let one = b.ins().iconst(types::I64, 1);
                let d = b.ins().select(minus_one, one, v(y));
                let r = if *op == SBinary::Div {
                    let q = b.ins().sdiv(v(x), d);
                    let n = b.ins().ineg(v(x));
                    b.ins().select(minus_one, n, q)
                } else {
                    let r = b.ins().srem(v(x), d);
                    let z = b.ins().iconst(types::I64, 0);
                    b.ins().select(minus_one, z, r)
                };
                vec![r]
            }
            SOp::Binary(op, x, y) => {
                let t = ty(x);
                let r = match calls.get(&Import::Binary(*op, t)) {
                    Some(fr) => {
                        let call = b.ins().call(*fr, &[v(x), v(y)]);
                        b.inst_results(call)[0]
                    }
                    None => binary_inline(b, *op, t, v(x), v(y)),
                };
                vec![r]
            }
            SOp::Cast(x) => vec![cast(b, ty(x), inst.results[0], v(x))],
            SOp::Bound { index, size, axis } => {
                // Negative positions count from the end; anything out of
                // `-size..size` stops the program with a fault.
                let tp = tp.expect("programs that may fault have the pointer");
                let i = v(index);
                let n = i64::from(*size);
                let shifted = b.ins().iadd_imm_s(i, n);
                let neg = b.ins().icmp_imm_s(IntCC::SignedLessThan, i, 0);
                let j = b.ins().select(neg, shifted, i);
                let out = b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, j, n);
                let fault = Fault {
                    code: INDEX_RANGE,
                    detail: Some(i),
                    site: inst.site,
                    extra: Some((u64::from(*axis) << 32) | u64::from(*size)),
                };
                fault_if(b, out, tp, fault, stop);
                vec![j]
            }
            SOp::Select(c, x, y) => vec![b.ins().select(v(c), v(x), v(y))],
            SOp::Load { buf, offset } => {
                let tp = tp.expect("programs with buffers have the pointer");
                let t = inst.results[0];
                // The table and the buffers do not change during a run.
                let table_flags = MemFlagsData::new()
                    .with_notrap()
                    .with_aligned()
                    .with_readonly();
                let table = b.ins().load(ptr, table_flags, tp, BUFS_OFFSET);
                let base = b.ins().load(ptr, table_flags, table, 8 * *buf as i32);
                let size = if t == SType::F32 { 2 } else { 3 };
                let off = b.ins().ishl_imm_u(v(offset), size);
                let at = b.ins().iadd(base, off);
                vec![b.ins().load(clif_type(t), table_flags, at, 0)]
            }
            SOp::Call(c) => {
                let args = c.args.iter().map(v).collect();
                let rs = self.call_values(b, st, c.func.0 as usize, args, &inst.results);
                if may_fault {
                    stop_on_fault(b, tp, stop);
                }
                rs
            }
            SOp::Push(xs) => {
                let tp = tp.expect("tape programs have the tape pointer");
                let grow = self.grow.expect("tape programs import the grower");
                let flags = MemFlagsData::new().with_notrap().with_aligned();
                let n = xs.len() as i64;
                let len = b.ins().load(types::I64, flags, tp, 8);
                let cap = b.ins().load(types::I64, flags, tp, 16);
                let need = b.ins().iadd_imm_s(len, n);
                let over = b.ins().icmp(IntCC::UnsignedGreaterThan, need, cap);
                let (grow_blk, store_blk) = (b.create_block(), b.create_block());
                b.set_cold_block(grow_blk);
                b.ins().brif(over, grow_blk, &[], store_blk, &[]);
                b.switch_to_block(grow_blk);
                let nv = b.ins().iconst(types::I64, n);
                let gc = b.ins().call(grow, &[tp, nv]);
                let ok = b.inst_results(gc)[0];
                b.ins().brif(ok, store_blk, &[], stop, &[]);
                b.switch_to_block(store_blk);
                let base = b.ins().load(ptr, flags, tp, 0);
                let off = b.ins().ishl_imm_u(len, 3);
                let at = b.ins().iadd(base, off);
                for (k, x) in xs.iter().enumerate() {
                    let slot = to_slot(b, tys[x.0 as usize], v(x));
                    b.ins().store(flags, slot, at, (8 * k) as i32);
                }
                b.ins().store(flags, need, tp, 8);
                Vec::new()
            }
            SOp::Pop => {
                let tp = tp.expect("tape programs have the tape pointer");
                let flags = MemFlagsData::new().with_notrap().with_aligned();
                let n = inst.results.len() as i64;
                let len = b.ins().load(types::I64, flags, tp, 8);
                let under = b.ins().icmp_imm_s(IntCC::UnsignedLessThan, len, n);
                let fault = Fault {
                    code: TAPE_UNDERFLOW,
                    detail: None,
                    site: None,
                    extra: None,
                };
                fault_if(b, under, tp, fault, stop);
                let rest = b.ins().iadd_imm_s(len, -n);
                b.ins().store(flags, rest, tp, 8);
                let base = b.ins().load(ptr, flags, tp, 0);
                let off = b.ins().ishl_imm_u(rest, 3);
                let at = b.ins().iadd(base, off);
                inst.results
                    .iter()
                    .enumerate()
                    .map(|(k, t)| {
                        let slot = b.ins().load(types::I64, flags, at, (8 * k) as i32);
                        from_slot(b, *t, slot)
                    })
                    .collect()
            }
            SOp::CallIf(c, x, y) => {
                let (bx, by, join) = (b.create_block(), b.create_block(), b.create_block());
                for t in &inst.results {
                    b.append_block_param(join, clif_type(*t));
                }
                b.ins().brif(v(c), bx, &[], by, &[]);
                for (blk, call) in [(bx, x), (by, y)] {
                    b.switch_to_block(blk);
                    let args = call.args.iter().map(v).collect();
                    let rs = self.call_values(b, st, call.func.0 as usize, args, &inst.results);
                    let rs: Vec<BlockArg> = rs.into_iter().map(BlockArg::from).collect();
                    b.ins().jump(join, &rs);
                }
                b.switch_to_block(join);
                let rs = b.block_params(join).to_vec();
                if may_fault {
                    stop_on_fault(b, tp, stop);
                }
                rs
            }
        }
    }
}

/// A fault to raise: its code, what describes it (a negative exponent)
/// and the site of the instruction that raises it.
struct Fault {
    code: u64,
    detail: Option<Value>,
    site: Option<u32>,
    /// A constant for [`TapeBuf::extra`].
    extra: Option<u64>,
}

/// Stops the function (at `stop`) with `fault` if `cond` holds; code
/// emitted next runs when it does not.
fn fault_if(
    b: &mut FunctionBuilder,
    cond: Value,
    tp: Value,
    fault: Fault,
    stop: cranelift_codegen::ir::Block,
) {
    let flags = MemFlagsData::new().with_notrap().with_aligned();
    let (fault_blk, ok_blk) = (b.create_block(), b.create_block());
    b.set_cold_block(fault_blk);
    b.ins().brif(cond, fault_blk, &[], ok_blk, &[]);
    b.switch_to_block(fault_blk);
    let c = b.ins().iconst(types::I64, fault.code as i64);
    b.ins().store(flags, c, tp, 24);
    if let Some(d) = fault.detail {
        b.ins().store(flags, d, tp, 32);
    }
    if let Some(site) = fault.site {
        let s = b.ins().iconst(types::I64, i64::from(site));
        b.ins().store(flags, s, tp, 40);
    }
    if let Some(extra) = fault.extra {
        let e = b.ins().iconst(types::I64, extra as i64);
        b.ins().store(flags, e, tp, 56);
    }
    b.ins().jump(stop, &[]);
    b.switch_to_block(ok_blk);
}

/// Jumps to `stop` when a callee left a fault code: the caller of a call
/// that faulted returns at once too.
fn stop_on_fault(b: &mut FunctionBuilder, tp: Option<Value>, stop: cranelift_codegen::ir::Block) {
    let tp = tp.expect("programs that may fault have the pointer");
    let flags = MemFlagsData::new().with_notrap().with_aligned();
    let fault = b.ins().load(types::I64, flags, tp, 24);
    let go = b.create_block();
    b.ins().brif(fault, stop, &[], go, &[]);
    b.switch_to_block(go);
}

/// A value as the 8 bytes of its tape slot ([`Scalar::to_bits`]).
fn to_slot(b: &mut FunctionBuilder, t: SType, v: Value) -> Value {
    let flags = MemFlagsData::new();
    match t {
        SType::F64 => b.ins().bitcast(types::I64, flags, v),
        SType::I64 => v,
        SType::F32 => {
            let bits = b.ins().bitcast(types::I32, flags, v);
            b.ins().uextend(types::I64, bits)
        }
        SType::Bool => b.ins().uextend(types::I64, v),
    }
}

/// The value of type `t` in tape slot `slot`.
fn from_slot(b: &mut FunctionBuilder, t: SType, slot: Value) -> Value {
    let flags = MemFlagsData::new();
    match t {
        SType::F64 => b.ins().bitcast(types::F64, flags, slot),
        SType::I64 => slot,
        SType::F32 => {
            let bits = b.ins().ireduce(types::I32, slot);
            b.ins().bitcast(types::F32, flags, bits)
        }
        SType::Bool => b.ins().ireduce(types::I8, slot),
    }
}

fn zero(b: &mut FunctionBuilder, t: SType) -> Value {
    match t {
        SType::F32 => b.ins().f32const(0.0),
        SType::F64 => b.ins().f64const(0.0),
        SType::I64 => b.ins().iconst(types::I64, 0),
        SType::Bool => b.ins().iconst(types::I8, 0),
    }
}

fn constant(b: &mut FunctionBuilder, c: Scalar) -> Value {
    match c {
        Scalar::F32(x) => b.ins().f32const(x),
        Scalar::F64(x) => b.ins().f64const(x),
        Scalar::I64(i) => b.ins().iconst(types::I64, i),
        Scalar::Bool(v) => b.ins().iconst(types::I8, v as i64),
    }
}

fn unary_inline(b: &mut FunctionBuilder, op: SUnary, t: SType, x: Value) -> Value {
    match (op, t) {
        (SUnary::Not, _) => b.ins().bxor_imm_u(x, 1),
        (SUnary::Neg, SType::I64) => b.ins().ineg(x),
        (SUnary::Neg, _) => b.ins().fneg(x),
        (SUnary::Abs, _) => b.ins().fabs(x),
        (SUnary::Floor | SUnary::Ceil, SType::I64) => x,
        (SUnary::Floor, _) => b.ins().floor(x),
        (SUnary::Ceil, _) => b.ins().ceil(x),
        (SUnary::Sqrt, _) => b.ins().sqrt(x),
        _ => unreachable!("{op:?} on {t:?} is a call"),
    }
}

fn binary_inline(b: &mut FunctionBuilder, op: SBinary, t: SType, x: Value, y: Value) -> Value {
    if op.is_comparison() {
        return if t.is_float() {
            let cc = match op {
                SBinary::Eq => FloatCC::Equal,
                SBinary::Ne => FloatCC::NotEqual,
                SBinary::Lt => FloatCC::LessThan,
                SBinary::Le => FloatCC::LessThanOrEqual,
                SBinary::Gt => FloatCC::GreaterThan,
                _ => FloatCC::GreaterThanOrEqual,
            };
            b.ins().fcmp(cc, x, y)
        } else {
            // Bools are 0 and 1: unsigned order is false < true.
            let signed = t == SType::I64;
            let cc = match (op, signed) {
                (SBinary::Eq, _) => IntCC::Equal,
                (SBinary::Ne, _) => IntCC::NotEqual,
                (SBinary::Lt, true) => IntCC::SignedLessThan,
                (SBinary::Le, true) => IntCC::SignedLessThanOrEqual,
                (SBinary::Gt, true) => IntCC::SignedGreaterThan,
                (SBinary::Ge, true) => IntCC::SignedGreaterThanOrEqual,
                (SBinary::Lt, false) => IntCC::UnsignedLessThan,
                (SBinary::Le, false) => IntCC::UnsignedLessThanOrEqual,
                (SBinary::Gt, false) => IntCC::UnsignedGreaterThan,
                _ => IntCC::UnsignedGreaterThanOrEqual,
            };
            b.ins().icmp(cc, x, y)
        };
    }
    match (op, t.is_float()) {
        (SBinary::Add, true) => b.ins().fadd(x, y),
        (SBinary::Sub, true) => b.ins().fsub(x, y),
        (SBinary::Mul, true) => b.ins().fmul(x, y),
        (SBinary::Div, true) => b.ins().fdiv(x, y),
        (SBinary::Add, false) => b.ins().iadd(x, y),
        (SBinary::Sub, false) => b.ins().isub(x, y),
        (SBinary::Mul, false) => b.ins().imul(x, y),
        (SBinary::Maximum, false) => {
            let ge = b.ins().icmp(IntCC::SignedGreaterThanOrEqual, x, y);
            b.ins().select(ge, x, y)
        }
        (SBinary::Minimum, false) => {
            let le = b.ins().icmp(IntCC::SignedLessThanOrEqual, x, y);
            b.ins().select(le, x, y)
        }
        (SBinary::And, _) => b.ins().band(x, y),
        (SBinary::Or, _) => b.ins().bor(x, y),
        _ => unreachable!("{op:?} on {t:?} is a call or not allowed"),
    }
}

/// The runtime's `cast` (Rust `as`; non-zero is `true`).
fn cast(b: &mut FunctionBuilder, from: SType, to: SType, x: Value) -> Value {
    use SType::*;
    match (from, to) {
        _ if from == to => x,
        (F64, F32) => b.ins().fdemote(types::F32, x),
        (F32, F64) => b.ins().fpromote(types::F64, x),
        // Through f64, as the runtime converts.
        (I64, F64) => b.ins().fcvt_from_sint(types::F64, x),
        (I64, F32) => {
            let d = b.ins().fcvt_from_sint(types::F64, x);
            b.ins().fdemote(types::F32, d)
        }
        (Bool, F32 | F64) => {
            let w = b.ins().uextend(types::I64, x);
            b.ins().fcvt_from_sint(clif_type(to), w)
        }
        (F32 | F64, I64) => b.ins().fcvt_to_sint_sat(types::I64, x),
        (Bool, I64) => b.ins().uextend(types::I64, x),
        (I64, Bool) => b.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
        (F32, Bool) => {
            let z = b.ins().f32const(0.0);
            b.ins().fcmp(FloatCC::NotEqual, x, z)
        }
        (F64, Bool) => {
            let z = b.ins().f64const(0.0);
            b.ins().fcmp(FloatCC::NotEqual, x, z)
        }
        _ => unreachable!("cast {from:?} -> {to:?}"),
    }
}
