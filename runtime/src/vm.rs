//! The virtual machine: runs a [`Program`] — code objects made from IR
//! graphs — with closures, tail calls and an explicit frame stack, so deep
//! recursion and long loops use heap memory, never the Rust stack.
//!
//! A code object's slots hold, in order: its parameters, the values its
//! closure captured, then one slot per instruction result.

use std::io::Write;
use std::sync::Arc;

use crate::error::RtError;
use crate::kernels::ctx::DynOp;
use crate::kernels::{Ctx, InplaceKernel, Kernel};
use crate::tape::{Tape, TapeHint};
use crate::value::{Closure, CodeId, Value};

/// An instruction operand: a slot of the current frame or a constant of the
/// current code object.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Operand {
    Slot(u32),
    /// A slot read for the last time: its value is moved out, so that it
    /// is released as soon as the instruction is done with it and a kernel
    /// may find it unshared (and reuse its buffer).
    Move(u32),
    Const(u32),
}

impl Operand {
    /// The slot read, if any.
    pub fn slot(self) -> Option<u32> {
        match self {
            Operand::Slot(s) | Operand::Move(s) => Some(s),
            Operand::Const(_) => None,
        }
    }
}

/// Machine code made by a backend for part of a graph (a fused kernel):
/// the VM calls it like a primitive. The runtime defines the interface;
/// the compiler's code generators implement it.
pub trait NativeKernel: Send + Sync {
    /// A short name for traces and debugging output.
    fn name(&self) -> &str;
    /// Runs the kernel. The arguments are owned: an argument no one else
    /// holds may give its buffer to the result.
    fn call(&self, args: Vec<Value>) -> Result<Value, RtError>;
}

/// The compiler's side of run-time differentiation.
pub trait Dynamic: Send + Sync {
    /// A code object made by [`Dynamic::transform`] (ids past the
    /// program's own).
    fn code(&self, id: CodeId) -> Option<Arc<Code>>;
    /// Transforms function value `f`.
    fn transform(&self, f: &Value, op: &DynOp) -> Result<Value, String>;
}

/// The hook as a program holds it.
#[derive(Clone)]
pub struct DynamicHook(pub Arc<dyn Dynamic>);

impl std::fmt::Debug for DynamicHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DynamicHook")
    }
}

/// Index into [`Program::locs`]: where in the source an instruction came
/// from. The meaning of a location is up to the producer of the program.
pub type LocIndex = u32;

#[derive(Clone)]
pub enum Instr {
    /// `dst = kernel(args..)`.
    Prim {
        dst: u32,
        name: &'static str,
        kernel: Kernel,
        /// The kernel's variant that may consume the values read
        /// (`kernels::lookup_inplace`): called instead of `kernel`, so a
        /// moved operand reaches it as the only reference.
        inplace: Option<InplaceKernel>,
        args: Vec<Operand>,
        loc: LocIndex,
        /// What the primitive does with operands that have lanes
        /// (`vmap`; [`crate::batch`]).
        batch: crate::batch::BatchRule,
    },
    /// `dst = kernel(args..)` for compiled code.
    Native {
        dst: u32,
        kernel: Arc<dyn NativeKernel>,
        args: Vec<Operand>,
        loc: LocIndex,
        /// The locations of the kernel's sites ([`RtError::site`]); an
        /// error at another site, or at none, is reported at `loc`.
        sites: Vec<(u32, LocIndex)>,
    },
    /// `dst = if cond { a } else { b }` (a and b are already evaluated).
    Switch {
        dst: u32,
        cond: Operand,
        a: Operand,
        b: Operand,
        loc: LocIndex,
    },
    /// `dst = closure of code capturing these values`.
    MakeClosure {
        dst: u32,
        code: CodeId,
        captures: Vec<Operand>,
    },
    /// `dst = callee(args..)`.
    Call {
        dst: u32,
        callee: Operand,
        args: Vec<Operand>,
        loc: LocIndex,
    },
    /// `dst = stack` with the function `code` of `captures` pushed on top
    /// (`make_tuple(closure, stack)`, kept as a [`Tape`] when `stack` is
    /// one or `()`: the captures are appended to the tape's buffer and no
    /// closure is made).
    TapePush {
        dst: u32,
        stack: Operand,
        code: CodeId,
        captures: Vec<Operand>,
        /// How long this site's last tape grew.
        hint: Arc<TapeHint>,
    },
    /// `dst = tuple_get(of, 0)(args..)`: calls the first element of a
    /// tuple, or the top of a tape straight from its buffer.
    CallFirst {
        dst: u32,
        of: Operand,
        args: Vec<Operand>,
        loc: LocIndex,
    },
    /// Returns `callee(args..)`, replacing the current frame.
    TailCall {
        callee: Operand,
        args: Vec<Operand>,
        loc: LocIndex,
    },
}

impl std::fmt::Debug for Instr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Instr::Prim {
                dst, name, args, ..
            } => write!(f, "s{dst} = {name}{args:?}"),
            Instr::Native {
                dst, kernel, args, ..
            } => write!(f, "s{dst} = native {}{args:?}", kernel.name()),
            Instr::TapePush {
                dst,
                stack,
                code,
                captures,
                ..
            } => write!(f, "s{dst} = tape_push({stack:?}, {code:?}{captures:?})"),
            Instr::CallFirst { dst, of, args, .. } => {
                write!(f, "s{dst} = call_first({of:?}){args:?}")
            }
            Instr::Switch {
                dst, cond, a, b, ..
            } => {
                write!(f, "s{dst} = switch({cond:?}, {a:?}, {b:?})")
            }
            Instr::MakeClosure {
                dst,
                code,
                captures,
            } => {
                write!(f, "s{dst} = closure({}, {captures:?})", code.0)
            }
            Instr::Call {
                dst, callee, args, ..
            } => write!(f, "s{dst} = call {callee:?}{args:?}"),
            Instr::TailCall { callee, args, .. } => write!(f, "tailcall {callee:?}{args:?}"),
        }
    }
}

/// One compiled graph.
#[derive(Clone, Debug)]
pub struct Code {
    pub name: String,
    pub n_params: u32,
    pub n_captures: u32,
    pub n_slots: u32,
    pub consts: Vec<Value>,
    pub instrs: Vec<Instr>,
    /// The result, when the code does not end in a tail call.
    pub ret: Operand,
    /// Calls may pass arguments after the parameters, which are dropped (a
    /// function without captures that a `switch` pairs with functions
    /// taking extra arguments).
    pub extra_args: bool,
}

/// An executable program.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub codes: Vec<Code>,
    /// Differentiation of function values at run time, when the program
    /// needs it: code objects past `codes` come from here.
    pub dynamic: Option<DynamicHook>,
}

impl Program {
    /// A code object of the program itself (not one made at run time).
    pub fn code(&self, id: CodeId) -> &Code {
        &self.codes[id.0 as usize]
    }

    /// Any code object: the program's own, or one made at run time.
    fn code_any(&self, id: CodeId) -> Result<CodeRef<'_>, VmError> {
        if let Some(c) = self.codes.get(id.0 as usize) {
            return Ok(CodeRef::Static(c));
        }
        if id == crate::batch::SELECT_CODE {
            return Ok(CodeRef::Dynamic(SELECT.clone()));
        }
        if id == crate::batch::LANES_CALL_CODE {
            return Ok(CodeRef::Dynamic(LANES_CALL.clone()));
        }
        match self.dynamic.as_ref().and_then(|d| d.0.code(id)) {
            Some(c) => Ok(CodeRef::Dynamic(c)),
            None => Err(VmError {
                message: format!("internal error: no code object {}", id.0),
                loc: None,
                trace: Vec::new(),
            }),
        }
    }
}

/// A code object, borrowed from the program or shared with the run-time
/// transform that made it.
enum CodeRef<'a> {
    Static(&'a Code),
    Dynamic(Arc<Code>),
}

impl std::ops::Deref for CodeRef<'_> {
    type Target = Code;
    fn deref(&self) -> &Code {
        match self {
            CodeRef::Static(c) => c,
            CodeRef::Dynamic(c) => c,
        }
    }
}

/// A run-time error, with the location of the instruction that failed.
#[derive(Clone, Debug)]
pub struct VmError {
    pub message: String,
    pub loc: Option<LocIndex>,
    /// The call sites of the frames that were running, innermost first.
    pub trace: Vec<LocIndex>,
}

impl std::fmt::Display for VmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for VmError {}

struct Frame {
    code: CodeId,
    pc: usize,
    slots: Vec<Option<Value>>,
    /// Where this frame was called from.
    call_loc: Option<LocIndex>,
    /// For a frame a tail call put in place of another: where the first
    /// frame of that chain of tail calls was called from (the call whose
    /// result this frame gives), so that an error's trace still names it.
    tail_of: Option<LocIndex>,
    /// Slot of the caller that receives this frame's result; `None` for the
    /// bottom frame of a [`Vm::call`].
    ret_dst: Option<u32>,
}

/// Limits that turn runaway programs into errors.
#[derive(Copy, Clone, Debug)]
pub struct Limits {
    /// Maximum number of nested (non-tail) calls.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_depth: 1_000_000,
        }
    }
}

/// Set to stop every running program at its next call: a host that
/// catches Ctrl-C (the REPL) sets it, and clears it before running more.
static INTERRUPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks running programs to stop with an "interrupted" error at their next
/// call (safe to call from a signal handler: one atomic store).
pub fn request_interrupt() {
    INTERRUPT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Withdraws an interrupt request (before running the next input).
pub fn clear_interrupt() {
    INTERRUPT.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Whether an interrupt was requested and not withdrawn.
pub fn interrupt_requested() -> bool {
    INTERRUPT.load(std::sync::atomic::Ordering::Relaxed)
}

/// The address of the interrupt flag (one byte, non-zero when set), for
/// compiled code that polls it.
pub fn interrupt_flag_address() -> *const u8 {
    INTERRUPT.as_ptr() as *const u8
}

fn interrupted(loc: LocIndex) -> Result<(), VmError> {
    if INTERRUPT.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(VmError {
            message: "interrupted".to_string(),
            loc: Some(loc),
            trace: Vec::new(),
        });
    }
    Ok(())
}

/// Runs programs. Output of `print` goes to the writer given at creation.
pub struct Vm<'a> {
    program: &'a Program,
    out: &'a mut dyn Write,
    frames: Vec<Frame>,
    limits: Limits,
    /// Location of the innermost call being made by a kernel (for errors
    /// raised inside callbacks such as `tree_map`).
    pending: Option<VmError>,
    /// Reused buffers: a primitive's arguments, and the slots of returned
    /// frames (an interpreted loop would otherwise allocate both at every
    /// step).
    scratch: Vec<Value>,
    spare_slots: Vec<Vec<Option<Value>>>,
    /// The processes collectives run between.
    comm: &'a dyn crate::comm::Communicator,
}

/// How many returned frames' slot buffers are kept for reuse.
const SPARE_SLOTS: usize = 64;

thread_local! {
    static CLOSURES_MADE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many closures (with captures) VMs have made on this thread so far:
/// what lambda lifting saves shows here (`adjoint run --stats`).
pub fn closures_made() -> u64 {
    CLOSURES_MADE.with(|c| c.get())
}

impl<'a> Vm<'a> {
    pub fn new(program: &'a Program, out: &'a mut dyn Write) -> Vm<'a> {
        Vm {
            program,
            out,
            frames: Vec::new(),
            limits: Limits::default(),
            pending: None,
            scratch: Vec::new(),
            spare_slots: Vec::new(),
            comm: &crate::comm::Single,
        }
    }

    /// The VM with collectives running between the processes of `comm`.
    pub fn with_comm(mut self, comm: &'a dyn crate::comm::Communicator) -> Vm<'a> {
        self.comm = comm;
        self
    }

    pub fn with_limits(mut self, limits: Limits) -> Vm<'a> {
        self.limits = limits;
        self
    }

    /// Makes a closure of `code` with no captures (a top-level graph).
    pub fn function(code: CodeId) -> Value {
        Value::Func(Arc::new(Closure {
            code,
            captures: Vec::new(),
        }))
    }

    /// Calls function value `f` with `args` and runs it to completion.
    pub fn call(&mut self, f: &Value, args: Vec<Value>) -> Result<Value, VmError> {
        let base = self.frames.len();
        self.push_frame(f, args, None, None)?;
        let mut result = self.run(base);
        if let Err(e) = &mut result {
            if e.trace.is_empty() {
                e.trace = self.frames[base.min(self.frames.len())..]
                    .iter()
                    .rev()
                    .flat_map(|f| [f.call_loc, f.tail_of])
                    .flatten()
                    .collect();
            }
            self.frames.truncate(base);
        }
        result
    }

    fn push_frame(
        &mut self,
        f: &Value,
        args: Vec<Value>,
        ret_dst: Option<u32>,
        loc: Option<LocIndex>,
    ) -> Result<(), VmError> {
        let mut slots = self.spare_slots.pop().unwrap_or_default();
        slots.clear();
        slots.extend(args.into_iter().map(Some));
        let frame = self.make_frame(f, ret_dst, loc, slots)?;
        self.check_depth(self.frames.len(), loc)?;
        self.frames.push(frame);
        Ok(())
    }

    /// A frame for calling `f`, its slots in `slots`, which holds the
    /// arguments (and may have capacity for more).
    fn make_frame(
        &self,
        f: &Value,
        ret_dst: Option<u32>,
        loc: Option<LocIndex>,
        slots: Vec<Option<Value>>,
    ) -> Result<Frame, VmError> {
        if let Value::Lanes(_) = f {
            // One function per lane: called lane by lane.
            return self.frame_of(
                crate::batch::LANES_CALL_CODE,
                std::slice::from_ref(f),
                ret_dst,
                loc,
                slots,
            );
        }
        let Value::Func(closure) = f else {
            return Err(VmError {
                message: format!("cannot call a value of type {}", f.kind()),
                loc,
                trace: Vec::new(),
            });
        };
        self.frame_of(closure.code, &closure.captures, ret_dst, loc, slots)
    }

    /// A frame for calling `code` with these captures; `slots` holds the
    /// arguments.
    fn frame_of(
        &self,
        code_id: CodeId,
        captures: &[Value],
        ret_dst: Option<u32>,
        loc: Option<LocIndex>,
        mut slots: Vec<Option<Value>>,
    ) -> Result<Frame, VmError> {
        let code = self.program.code_any(code_id)?;
        if code_id == crate::batch::SELECT_CODE || code_id == crate::batch::LANES_CALL_CODE {
            // A branch on a condition with lanes takes any arguments: they
            // reach it as one tuple.
            let args: Vec<Value> = slots.drain(..).flatten().collect();
            slots.push(Some(Value::tuple(args)));
        }
        if code.extra_args && slots.len() > code.n_params as usize {
            slots.truncate(code.n_params as usize);
        }
        if slots.len() != code.n_params as usize {
            return Err(VmError {
                message: format!(
                    "function `{}` expects {} argument{}, got {}",
                    display_name(&code.name),
                    code.n_params,
                    if code.n_params == 1 { "" } else { "s" },
                    slots.len()
                ),
                loc,
                trace: Vec::new(),
            });
        }
        slots.reserve(code.n_slots as usize - slots.len());
        slots.extend(captures.iter().cloned().map(Some));
        slots.resize(code.n_slots as usize, None);
        Ok(Frame {
            code: code_id,
            pc: 0,
            slots,
            call_loc: loc,
            tail_of: None,
            ret_dst,
        })
    }

    /// An error when `depth` frames are as many as the limits allow.
    fn check_depth(&self, depth: usize, loc: Option<LocIndex>) -> Result<(), VmError> {
        if depth >= self.limits.max_depth {
            return Err(VmError {
                message: format!(
                    "recursion too deep: more than {} nested calls",
                    self.limits.max_depth
                ),
                loc,
                trace: Vec::new(),
            });
        }
        Ok(())
    }

    fn run(&mut self, base: usize) -> Result<Value, VmError> {
        let program = self.program;
        loop {
            let depth = self.frames.len();
            let frame = self.frames.last_mut().expect("a frame is running");
            let code_ref = program.code_any(frame.code)?;
            let code: &Code = &code_ref;
            if frame.pc == code.instrs.len() {
                let value = read(frame, code, code.ret);
                let ret_dst = frame.ret_dst;
                if let Some(done) = self.frames.pop() {
                    recycle(&mut self.spare_slots, done.slots);
                }
                if self.frames.len() == base {
                    return Ok(value);
                }
                let caller = self.frames.last_mut().expect("caller frame");
                caller.slots[ret_dst.expect("nested frames have a destination") as usize] =
                    Some(value);
                continue;
            }
            let instr = &code.instrs[frame.pc];
            frame.pc += 1;
            match instr {
                Instr::Prim {
                    dst,
                    name,
                    kernel,
                    inplace,
                    args,
                    loc,
                    batch,
                } => {
                    let mut values = std::mem::take(&mut self.scratch);
                    values.extend(args.iter().map(|a| read(frame, code, *a)));
                    let dst = *dst;
                    let loc = *loc;
                    let batched = crate::batch::active()
                        && *batch != crate::batch::BatchRule::Itself
                        && values.iter().any(crate::batch::has_batched)
                        && (*batch != crate::batch::BatchRule::Opaque
                            || values.iter().any(crate::batch::is_lanes));
                    let result = if batched {
                        crate::batch::apply(self, *batch, name, *kernel, &values)
                    } else {
                        match inplace {
                            Some(k) => k(self, &mut values),
                            None => kernel(self, &values),
                        }
                    };
                    values.clear();
                    self.scratch = values;
                    match result {
                        Ok(v) => {
                            let frame = self.frames.last_mut().expect("frame");
                            frame.slots[dst as usize] = Some(v);
                        }
                        Err(e) => {
                            return Err(self.pending.take().unwrap_or(VmError {
                                message: e.to_string(),
                                loc: Some(loc),
                                trace: Vec::new(),
                            }))
                        }
                    }
                }
                Instr::Native {
                    dst,
                    kernel,
                    args,
                    loc,
                    sites,
                } => {
                    let values: Vec<Value> = args.iter().map(|a| read(frame, code, *a)).collect();
                    let (dst, loc) = (*dst, *loc);
                    let result =
                        if crate::batch::active() && values.iter().any(crate::batch::has_batched) {
                            // Compiled for one lane: run once per lane.
                            let k = kernel.clone();
                            crate::batch::per_lane_deep(self, &mut |a| k.call(a), &values)
                        } else {
                            kernel.call(values)
                        };
                    match result {
                        Ok(v) => {
                            let frame = self.frames.last_mut().expect("frame");
                            frame.slots[dst as usize] = Some(v);
                        }
                        Err(e) => {
                            let at = sites.iter().find(|(s, _)| Some(*s) == e.site);
                            return Err(VmError {
                                loc: Some(at.map_or(loc, |&(_, l)| l)),
                                message: e.message,
                                trace: Vec::new(),
                            });
                        }
                    }
                }
                Instr::Switch {
                    dst,
                    cond,
                    a,
                    b,
                    loc,
                } => {
                    let c = read(frame, code, *cond);
                    if let Value::Batched(cb) = &c {
                        let (va, vb) = (read(frame, code, *a), read(frame, code, *b));
                        let (dst, loc) = (*dst, *loc);
                        match crate::batch::switch_value(self, cb, va, vb) {
                            Ok(v) => {
                                let frame = self.frames.last_mut().expect("frame");
                                frame.slots[dst as usize] = Some(v);
                            }
                            Err(e) => {
                                return Err(self.pending.take().unwrap_or(VmError {
                                    message: e.to_string(),
                                    loc: Some(loc),
                                    trace: Vec::new(),
                                }))
                            }
                        }
                        continue;
                    }
                    let take = match c.as_tensor().and_then(|t| t.to_bool_scalar()) {
                        Some(v) => v,
                        None => {
                            return Err(VmError {
                                message: format!(
                                    "a condition must be a bool scalar, got {}",
                                    c.kind()
                                ),
                                loc: Some(*loc),
                                trace: Vec::new(),
                            })
                        }
                    };
                    let v = read(frame, code, if take { *a } else { *b });
                    frame.slots[*dst as usize] = Some(v);
                }
                Instr::MakeClosure {
                    dst,
                    code: target,
                    captures,
                } => {
                    CLOSURES_MADE.with(|c| c.set(c.get() + 1));
                    let captures = captures.iter().map(|a| read(frame, code, *a)).collect();
                    frame.slots[*dst as usize] = Some(Value::Func(Arc::new(Closure {
                        code: *target,
                        captures,
                    })));
                }
                Instr::Call {
                    dst,
                    callee,
                    args,
                    loc,
                } => {
                    let f = read(frame, code, *callee);
                    let slots = arg_slots(&mut self.spare_slots, frame, code, args);
                    let (dst, loc) = (*dst, *loc);
                    interrupted(loc)?;
                    self.check_depth(depth, Some(loc))?;
                    let new = self.make_frame(&f, Some(dst), Some(loc), slots)?;
                    self.frames.push(new);
                }
                Instr::TapePush {
                    dst,
                    stack,
                    code: target,
                    captures,
                    hint,
                } => {
                    let s = read(frame, code, *stack);
                    let caps = captures.iter().map(|a| read(frame, code, *a));
                    let v = match Tape::push(&s, *target, caps, hint) {
                        Some(t) => t,
                        None => {
                            // A list of tuples: push a cell on it.
                            CLOSURES_MADE.with(|c| c.set(c.get() + 1));
                            let captures = captures.iter().map(|a| read(frame, code, *a)).collect();
                            let f = Value::Func(Arc::new(Closure {
                                code: *target,
                                captures,
                            }));
                            Value::tuple(vec![f, s])
                        }
                    };
                    frame.slots[*dst as usize] = Some(v);
                }
                Instr::CallFirst { dst, of, args, loc } => {
                    let s = read(frame, code, *of);
                    let slots = arg_slots(&mut self.spare_slots, frame, code, args);
                    let (dst, loc) = (*dst, *loc);
                    interrupted(loc)?;
                    self.check_depth(depth, Some(loc))?;
                    let new = match &s {
                        Value::Tape(t) if !t.is_empty() => t
                            .with_top(|c, caps| self.frame_of(c, caps, Some(dst), Some(loc), slots))
                            .expect("the tape is not empty")?,
                        _ => {
                            let zero = Value::Tensor(crate::tensor::Tensor::weak_i64(0));
                            let first = if crate::batch::is_lanes(&s) {
                                crate::batch::per_lane(
                                    self,
                                    &mut |ctx, a| crate::kernels::structural::tuple_get(ctx, &a),
                                    &[s, zero],
                                )
                            } else {
                                crate::kernels::structural::tuple_get(self, &[s, zero])
                            }
                            .map_err(|e| VmError {
                                message: e.to_string(),
                                loc: Some(loc),
                                trace: Vec::new(),
                            })?;
                            self.make_frame(&first, Some(dst), Some(loc), slots)?
                        }
                    };
                    self.frames.push(new);
                }
                Instr::TailCall { callee, args, loc } => {
                    interrupted(*loc)?;
                    let f = read(frame, code, *callee);
                    let slots = arg_slots(&mut self.spare_slots, frame, code, args);
                    let ret_dst = frame.ret_dst;
                    // The caller's slots are done with: its buffer goes to
                    // the spares.
                    let old = std::mem::take(&mut frame.slots);
                    let tail_of = frame.tail_of.or(frame.call_loc);
                    let mut new = self.make_frame(&f, ret_dst, Some(*loc), slots)?;
                    new.tail_of = tail_of;
                    *self.frames.last_mut().expect("frame") = new;
                    recycle(&mut self.spare_slots, old);
                }
            }
        }
    }
}

/// A slot buffer for a call's frame, from the spares, holding the call's
/// arguments read from `frame`.
fn arg_slots(
    spare: &mut Vec<Vec<Option<Value>>>,
    frame: &mut Frame,
    code: &Code,
    args: &[Operand],
) -> Vec<Option<Value>> {
    let mut slots = spare.pop().unwrap_or_default();
    slots.clear();
    slots.extend(args.iter().map(|a| Some(read(frame, code, *a))));
    slots
}

/// Keeps a finished frame's slot buffer for a later call (emptied).
fn recycle(spare: &mut Vec<Vec<Option<Value>>>, mut slots: Vec<Option<Value>>) {
    if spare.len() < SPARE_SLOTS {
        slots.clear();
        spare.push(slots);
    }
}

fn read(frame: &mut Frame, code: &Code, op: Operand) -> Value {
    match op {
        Operand::Slot(s) => frame.slots[s as usize]
            .clone()
            .expect("the compiler orders instructions after their operands"),
        Operand::Move(s) => frame.slots[s as usize]
            .take()
            .expect("the compiler reads a moved slot last"),
        Operand::Const(c) => code.consts[c as usize].clone(),
    }
}

fn display_name(name: &str) -> &str {
    name
}

impl Ctx for Vm<'_> {
    fn call(&mut self, f: &Value, args: &[Value]) -> Result<Value, RtError> {
        match Vm::call(self, f, args.to_vec()) {
            Ok(v) => Ok(v),
            Err(e) => {
                let msg = e.message.clone();
                self.pending = Some(e);
                Err(RtError::new(msg))
            }
        }
    }
    fn stdout(&mut self) -> &mut dyn Write {
        self.out
    }
    fn comm(&self) -> &dyn crate::comm::Communicator {
        self.comm
    }
    fn transform(&mut self, f: &Value, op: &DynOp) -> Result<Value, RtError> {
        match &self.program.dynamic {
            Some(d) => d.0.transform(f, op).map_err(RtError::new),
            None => Err(RtError::new(
                "this program cannot differentiate function values at run time",
            )),
        }
    }
}

/// The code object behind [`crate::batch::SELECT_CODE`]: it captures the condition and
/// the two branches, and calls [`crate::batch::select_call`].
static SELECT: std::sync::LazyLock<Arc<Code>> = std::sync::LazyLock::new(|| {
    Arc::new(Code {
        name: "if (batched)".into(),
        n_params: 1,
        n_captures: 3,
        n_slots: 5,
        consts: Vec::new(),
        instrs: vec![Instr::Prim {
            dst: 4,
            name: "switch",
            kernel: crate::batch::select_call,
            inplace: None,
            args: vec![
                Operand::Slot(1),
                Operand::Slot(2),
                Operand::Slot(3),
                Operand::Slot(0),
            ],
            loc: 0,
            batch: crate::batch::BatchRule::Itself,
        }],
        ret: Operand::Slot(4),
        extra_args: false,
    })
});

/// The code object behind [`crate::batch::LANES_CALL_CODE`].
static LANES_CALL: std::sync::LazyLock<Arc<Code>> = std::sync::LazyLock::new(|| {
    Arc::new(Code {
        name: "call (per lane)".into(),
        n_params: 1,
        n_captures: 1,
        n_slots: 3,
        consts: Vec::new(),
        instrs: vec![Instr::Prim {
            dst: 2,
            name: "call",
            kernel: crate::batch::lanes_value_call,
            inplace: None,
            args: vec![Operand::Slot(1), Operand::Slot(0)],
            loc: 0,
            batch: crate::batch::BatchRule::Itself,
        }],
        ret: Operand::Slot(2),
        extra_args: false,
    })
});
