//! Cranelift IR for a kernel's loop nest.
//!
//! The function is `fn(inputs: *const *const u8, outputs: *const *mut u8,
//! begin: usize, end: usize)`; it runs the loop `nest.par_dim` over
//! `[begin, end)` and every other loop over its full extent. The innermost
//! loop runs `unroll` vectors per step, then single vectors, then scalars.

use cranelift_codegen::ir::{
    types, AbiParam, BlockArg, FuncRef, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind,
    Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};

use super::avx2;
use super::libcalls::{binary_libcall, unary_libcall, Libcall};
use super::math::{Calls, Mask, Ty, E};
use super::nest::{LoopNest, Mode};
use crate::codegen::kernel::{BinaryOp, KDType, KExpr, KId, KernelSpec, ReduceOp, UnaryOp};

/// The relative cost of one body expression per element, for choosing the
/// unroll factor.
fn cost(e: &KExpr) -> usize {
    match e {
        KExpr::Input(_) | KExpr::Const(_) => 0,
        KExpr::Unary(op, _) => match op {
            UnaryOp::Exp => 30,
            UnaryOp::Sigmoid => 40,
            UnaryOp::Log => 40,
            UnaryOp::Log1p => 50,
            UnaryOp::Tanh => 50,
            UnaryOp::Erf => 40,
            UnaryOp::Math(f) => f.row().cost,
            UnaryOp::Sqrt | UnaryOp::Rsqrt => 4,
            _ => 1,
        },
        KExpr::Binary(op, _, _) => match op {
            BinaryOp::Pow | BinaryOp::Rem => 40,
            BinaryOp::Div => 4,
            BinaryOp::Maximum | BinaryOp::Minimum => 3,
            _ => 1,
        },
        KExpr::Select(..) => 2,
    }
}

/// The default number of vectors per step of the innermost loop. Even a
/// long element-wise body gains from two vectors in flight, although the
/// second one's constants spill (the 16M `tanh`/`sigmoid` map on one
/// thread: 63.5-64.1 ms with one, 57.8-58.5 with two, alternating in
/// `cargo bench -p adjoint-compiler --bench map_kernel`); a reduction's
/// accumulators (one per vector) set the order of its sums, so long
/// reducing bodies keep one.
pub(crate) fn default_unroll(spec: &KernelSpec) -> usize {
    let c: usize = spec.body.iter().map(cost).sum();
    if c <= 16 {
        4
    } else if c <= 80 || spec.reduce.is_none() {
        2
    } else {
        1
    }
}

/// The libcalls a spec needs.
pub(crate) fn libcalls(spec: &KernelSpec) -> Vec<(KExpr, Libcall)> {
    let mut out: Vec<(KExpr, Libcall)> = Vec::new();
    for e in &spec.body {
        let lc = match *e {
            KExpr::Unary(op, _) => unary_libcall(op, spec.dtype),
            KExpr::Binary(op, _, _) => binary_libcall(op, spec.dtype),
            _ => None,
        };
        if let Some(lc) = lc {
            if !out.iter().any(|(_, l)| l.symbol == lc.symbol) {
                out.push((*e, lc));
            }
        }
    }
    out
}

/// Declares and defines the kernel function in `module`; returns its id,
/// code size in bytes, with `disasm` the machine code as text, and whether
/// its innermost loop runs in chunks around [`avx2`] routines.
pub(crate) fn define(
    module: &mut JITModule,
    spec: &KernelSpec,
    nest: &LoopNest,
    unroll: usize,
    fma: bool,
    use_avx2: bool,
    disasm: bool,
) -> Result<(FuncId, usize, Option<String>, bool), String> {
    let ptr = module.target_config().pointer_type();
    let mut sig = module.make_signature();
    for _ in 0..4 {
        sig.params.push(AbiParam::new(ptr));
    }
    let id = module
        .declare_function("adjoint_kernel", Linkage::Local, &sig)
        .map_err(|e| e.to_string())?;
    let lane = Ty::new(spec.dtype, false).f;
    let mut imports = Vec::new();
    for (e, lc) in libcalls(spec) {
        let mut s = module.make_signature();
        for _ in 0..lc.arity {
            s.params.push(AbiParam::new(lane));
        }
        s.returns.push(AbiParam::new(lane));
        let fid = module
            .declare_function(lc.symbol, Linkage::Import, &s)
            .map_err(|e| e.to_string())?;
        imports.push((e, fid));
    }
    // The 256-bit routines the body can use (with FMA only: they are the
    // fused algorithms).
    let mut routine_ids = Vec::new();
    if use_avx2 && fma && nest.mode == Mode::Map && nest.vector {
        let mut s = module.make_signature();
        s.params.push(AbiParam::new(ptr));
        s.params.push(AbiParam::new(ptr));
        s.params.push(AbiParam::new(types::I64));
        for e in &spec.body {
            if let KExpr::Unary(op, _) = *e {
                if let Some((symbol, _)) = avx2::routine(op, spec.dtype) {
                    if !routine_ids.iter().any(|&(o, _)| o == op) {
                        let fid = module
                            .declare_function(symbol, Linkage::Import, &s)
                            .map_err(|e| e.to_string())?;
                        routine_ids.push((op, fid));
                    }
                }
            }
        }
    }

    let mut ctx = module.make_context();
    let mut chunked = false;
    ctx.set_disasm(disasm);
    ctx.func.signature = sig;
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        let mut calls = Calls {
            fma,
            ..Calls::default()
        };
        for (e, fid) in imports {
            let r = Some(module.declare_func_in_func(fid, b.func));
            match e {
                KExpr::Unary(UnaryOp::Erf, _) => calls.erf = r,
                KExpr::Unary(UnaryOp::Math(f), _) => calls.math.push((f, r.expect("declared"))),
                KExpr::Binary(BinaryOp::Pow, _, _) => calls.pow = r,
                KExpr::Binary(BinaryOp::Rem, _, _) => calls.rem = r,
                _ => unreachable!("no libcall for {e:?}"),
            }
        }
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let params = b.block_params(entry).to_vec();
        let flags = MemFlagsData::new().with_notrap();
        let in_base: Vec<Value> = (0..spec.inputs.len())
            .map(|i| b.ins().load(ptr, flags, params[0], (i * 8) as i32))
            .collect();
        let out_base: Vec<Value> = (0..spec.outputs.len())
            .map(|i| b.ins().load(ptr, flags, params[1], (i * 8) as i32))
            .collect();
        let mut g = Gen {
            spec,
            nest,
            es: spec.dtype.size_bytes() as i64,
            sh: if spec.dtype == KDType::F32 { 2 } else { 3 },
            st: Ty::new(spec.dtype, false),
            vt: Ty::new(spec.dtype, true),
            unroll: if nest.vector { unroll.max(1) } else { 1 },
            calls,
            begin: params[2],
            end: params[3],
            used: spec
                .body
                .iter()
                .filter_map(|e| match e {
                    KExpr::Input(i) => Some(*i),
                    _ => None,
                })
                .collect(),
            invariant: vec![None; spec.inputs.len()],
            acc_vec: Vec::new(),
            acc_s: None,
            flags,
            chunked: None,
        };
        if !routine_ids.is_empty() {
            let routines: Vec<(UnaryOp, FuncRef)> = routine_ids
                .iter()
                .map(|&(op, fid)| (op, module.declare_func_in_func(fid, b.func)))
                .collect();
            g.chunked = Chunked::new(&mut b, spec, nest, &routines, ptr);
            chunked = g.chunked.is_some();
        }
        // Inputs read at one place only: load once.
        for &i in &g.used.clone() {
            if nest.in_strides[i].iter().all(|&s| s == 0) {
                let v = g.load_invariant(&mut b, in_base[i]);
                g.invariant[i] = Some(v);
            }
        }
        g.level(&mut b, 0, &in_base, &out_base);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    module
        .define_function(id, &mut ctx)
        .map_err(|e| format!("{e:?}"))?;
    let size = ctx
        .compiled_code()
        .map(|c| c.code_info().total_size as usize)
        .unwrap_or(0);
    let text = ctx.compiled_code().and_then(|c| c.vcode.clone());
    module.clear_context(&mut ctx);
    Ok((id, size, text, chunked))
}

struct Gen<'s> {
    spec: &'s KernelSpec,
    nest: &'s LoopNest,
    /// Element size in bytes and its log2.
    es: i64,
    sh: i64,
    st: Ty,
    vt: Ty,
    unroll: usize,
    calls: Calls,
    begin: Value,
    end: Value,
    /// Inputs the body reads.
    used: Vec<usize>,
    /// Per input: (scalar, vector) values when it is read at one place
    /// only (all strides 0).
    invariant: Vec<Option<(Value, Value)>>,
    /// Accumulators of an inner reduction: `unroll` vectors and a scalar.
    acc_vec: Vec<Variable>,
    acc_s: Option<Variable>,
    flags: MemFlagsData,
    /// Set when the innermost loop runs in chunks around 256-bit routines.
    chunked: Option<Chunked>,
}

/// Bytes of one scratch buffer of a chunked row: the chunk's length
/// (1 KiB and 1920 bytes measured the same, 4 KiB slower).
const CHUNK_BYTES: i64 = 2048;

/// At most this many scratch buffers (the chunk's working set stays in
/// the first-level cache); bodies needing more run unchunked.
const MAX_SLOTS: usize = 12;

/// How the innermost loop of a map runs in chunks around calls of
/// [`avx2`] routines. The body is cut into stages: stage 0 is Cranelift
/// code over the chunk computing what the first routines read; then the
/// routines run over the chunk; then stage 1 reads their results, and so
/// on. Values that cross from one stage to a later one go through scratch
/// buffers on the stack; inputs are read again where needed, and a
/// routine reads a contiguous input in place. Outputs are all stored by
/// the last stage, after every input read of the chunk, so that an output
/// may share its buffer with an input as in the unchunked loop.
struct Chunked {
    /// Per body expression: the stage that computes it (for a routine's
    /// result, the first stage that can read it).
    stage: Vec<usize>,
    /// The last stage.
    last: usize,
    /// Per body expression: the routine that computes it.
    routine: Vec<Option<FuncRef>>,
    /// Per body expression: the address of its scratch buffer, where it
    /// goes through memory.
    slot: Vec<Option<Value>>,
}

/// [`Chunked`]'s analysis: per expression its stage, routine index and
/// whether it goes through memory; `None` when the body has no routine or
/// needs too many buffers. `direct(i)`: whether input `i` is read
/// contiguously along the row.
pub(crate) fn chunk_stages(
    body: &[KExpr],
    outputs: &[KId],
    has_routine: impl Fn(UnaryOp) -> bool,
    direct: impl Fn(usize) -> bool,
) -> Option<(Vec<usize>, Vec<bool>, Vec<bool>)> {
    let n = body.len();
    let mut stage = vec![0usize; n];
    let mut call = vec![false; n];
    for (k, e) in body.iter().enumerate() {
        stage[k] = match *e {
            KExpr::Input(_) | KExpr::Const(_) => 0,
            KExpr::Unary(op, a) if has_routine(op) => {
                call[k] = true;
                stage[a.index()] + 1
            }
            KExpr::Unary(_, a) => stage[a.index()],
            KExpr::Binary(_, a, x) => stage[a.index()].max(stage[x.index()]),
            KExpr::Select(c, a, x) => stage[c.index()].max(stage[a.index()]).max(stage[x.index()]),
        };
    }
    if !call.iter().any(|&c| c) {
        return None;
    }
    let last = stage.iter().copied().max().unwrap_or(0);
    let leaf = |k: usize| matches!(body[k], KExpr::Input(_) | KExpr::Const(_));
    let operands = |k: usize| -> Vec<usize> {
        match body[k] {
            KExpr::Input(_) | KExpr::Const(_) => vec![],
            KExpr::Unary(_, a) => vec![a.index()],
            KExpr::Binary(_, a, x) => vec![a.index(), x.index()],
            KExpr::Select(c, a, x) => vec![c.index(), a.index(), x.index()],
        }
    };
    // Sink each value into the first stage that reads it, so that a value
    // read only later is computed there instead of going through a buffer
    // (`x / 3` in the benchmark's kernel). A routine's argument stays: it
    // is read from memory.
    let mut read_at = vec![usize::MAX; n];
    for o in outputs {
        read_at[o.index()] = last;
    }
    let mut arg = vec![false; n];
    for k in (0..n).rev() {
        if !call[k] && !leaf(k) && !arg[k] && read_at[k] != usize::MAX {
            stage[k] = stage[k].max(read_at[k]);
        }
        for a in operands(k) {
            let at = if call[k] { stage[k] - 1 } else { stage[k] };
            read_at[a] = read_at[a].min(at);
            arg[a] |= call[k];
        }
    }
    let mut mem = vec![false; n];
    for k in 0..n {
        let operands = operands(k);
        if call[k] {
            mem[k] = true;
            let a = operands[0];
            let in_place = matches!(body[a], KExpr::Input(i) if direct(i));
            if !in_place {
                mem[a] = true;
            }
        } else {
            for a in operands {
                if stage[a] < stage[k] && !leaf(a) {
                    mem[a] = true;
                }
            }
        }
    }
    for o in outputs {
        let o = o.index();
        if stage[o] < last && !leaf(o) {
            mem[o] = true;
        }
    }
    if mem.iter().filter(|&&m| m).count() > MAX_SLOTS {
        return None;
    }
    Some((stage, call, mem))
}

impl Chunked {
    fn new(
        b: &mut FunctionBuilder,
        spec: &KernelSpec,
        nest: &LoopNest,
        routines: &[(UnaryOp, FuncRef)],
        ptr: types::Type,
    ) -> Option<Chunked> {
        let last_dim = nest.dims.len() - 1;
        // Short rows would pay a call per few elements.
        if nest.dims[last_dim] < 16 {
            return None;
        }
        let find = |op: UnaryOp| routines.iter().find(|r| r.0 == op).map(|r| r.1);
        let (stage, call, mem) = chunk_stages(
            &spec.body,
            &spec.outputs,
            |op| find(op).is_some(),
            |i| nest.in_strides[i][last_dim] == 1,
        )?;
        let routine = spec
            .body
            .iter()
            .zip(&call)
            .map(|(e, &c)| match *e {
                KExpr::Unary(op, _) if c => find(op),
                _ => None,
            })
            .collect();
        let count = mem.iter().filter(|&&m| m).count() as u32;
        let stride = CHUNK_BYTES as u32;
        let ss = b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            stride * count,
            6,
        ));
        let mut next = 0;
        let slot = mem
            .iter()
            .map(|&m| {
                m.then(|| {
                    let a = b.ins().stack_addr(ptr, ss, (next * stride) as i32);
                    next += 1;
                    a
                })
            })
            .collect();
        let last = stage.iter().copied().max().unwrap_or(0);
        Some(Chunked {
            stage,
            last,
            routine,
            slot,
        })
    }

    /// Whether stage `s` reads expression `k` from its scratch buffer.
    fn reads_buffer(&self, body: &[KExpr], k: usize, s: usize) -> bool {
        let leaf = matches!(body[k], KExpr::Input(_) | KExpr::Const(_));
        self.routine[k].is_some() || (self.slot[k].is_some() && self.stage[k] < s && !leaf)
    }
}

/// A value loaded once for a whole row: scalar and splatted.
type Pair = (Value, Value);

impl<'s> Gen<'s> {
    fn load_invariant(&self, b: &mut FunctionBuilder, p: Value) -> Pair {
        let s = b.ins().load(self.st.f, self.flags, p, 0);
        let v = if self.nest.vector {
            b.ins().splat(self.vt.f, s)
        } else {
            s
        };
        (s, v)
    }

    fn iconst(&self, b: &mut FunctionBuilder, v: i64) -> Value {
        b.ins().iconst(types::I64, v)
    }

    /// `p + i * stride * es`.
    fn offset(&self, b: &mut FunctionBuilder, p: Value, i: Value, stride: isize) -> Value {
        if stride == 0 {
            return p;
        }
        let bytes = stride as i64 * self.es;
        let o = if bytes == self.es {
            b.ins().ishl_imm_u(i, self.sh)
        } else {
            b.ins().imul_imm_s(i, bytes)
        };
        b.ins().iadd(p, o)
    }

    /// The `[start, stop)` range of loop `l`.
    fn range(&self, b: &mut FunctionBuilder, l: usize) -> (Value, Value) {
        if l == self.nest.par_dim {
            (self.begin, self.end)
        } else {
            let z = self.iconst(b, 0);
            let n = self.iconst(b, self.nest.dims[l] as i64);
            (z, n)
        }
    }

    /// A counted loop `for i in (start..stop).step_by(step)` that runs
    /// while `i + step <= stop`; returns the index after the loop.
    fn counted(
        &mut self,
        b: &mut FunctionBuilder,
        start: Value,
        stop: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, &mut FunctionBuilder, Value),
    ) -> Value {
        let header = b.create_block();
        let i = b.append_block_param(header, types::I64);
        let blk = b.create_block();
        let exit = b.create_block();
        let after = b.append_block_param(exit, types::I64);
        b.ins().jump(header, &[BlockArg::from(start)]);
        b.switch_to_block(header);
        let next = b.ins().iadd_imm_s(i, step);
        let go = b.ins().icmp(
            cranelift_codegen::ir::condcodes::IntCC::UnsignedLessThanOrEqual,
            next,
            stop,
        );
        b.ins().brif(go, blk, &[], exit, &[BlockArg::from(i)]);
        b.switch_to_block(blk);
        body(self, b, i);
        b.ins().jump(header, &[BlockArg::from(next)]);
        b.switch_to_block(exit);
        after
    }

    /// Output `k`'s stride on loop `l`: a reduction's side outputs are
    /// dense over the whole iteration space.
    fn out_stride(&self, k: usize, l: usize) -> isize {
        if k > 0 && self.nest.mode != Mode::Map {
            self.nest.side_strides[l]
        } else {
            self.nest.out_strides[l]
        }
    }

    fn is_first_reduced(&self, l: usize) -> bool {
        self.nest.mode != Mode::Map && self.nest.reduced[l] && (l == 0 || !self.nest.reduced[l - 1])
    }

    fn level(&mut self, b: &mut FunctionBuilder, l: usize, inp: &[Value], outp: &[Value]) {
        let wrap = self.is_first_reduced(l);
        if wrap {
            self.pre_reduce(b, outp);
        }
        let last = self.nest.dims.len() - 1;
        if l == last {
            self.row(b, inp, outp);
        } else {
            let (start, stop) = self.range(b, l);
            let inp = inp.to_vec();
            let outp = outp.to_vec();
            self.counted(b, start, stop, 1, |g, b, i| {
                let ip: Vec<Value> = inp
                    .iter()
                    .enumerate()
                    .map(|(j, &p)| g.offset(b, p, i, g.nest.in_strides[j][l]))
                    .collect();
                let op: Vec<Value> = outp
                    .iter()
                    .enumerate()
                    .map(|(k, &p)| g.offset(b, p, i, g.out_stride(k, l)))
                    .collect();
                g.level(b, l + 1, &ip, &op);
            });
        }
        if wrap {
            self.post_reduce(b, outp);
        }
    }

    fn identity(&self, b: &mut FunctionBuilder, t: Ty, op: ReduceOp) -> Value {
        let mut e = E::new(b, t, &self.calls);
        e.c(op.identity())
    }

    /// Before the reduced loops: zero the accumulators, or fill the output
    /// row with the identity.
    fn pre_reduce(&mut self, b: &mut FunctionBuilder, outp: &[Value]) {
        match self.nest.mode {
            Mode::Map => {}
            Mode::InnerReduce(op) => {
                if self.acc_s.is_none() {
                    self.acc_s = Some(b.declare_var(self.st.f));
                    if self.nest.vector {
                        self.acc_vec = (0..self.unroll).map(|_| b.declare_var(self.vt.f)).collect();
                    }
                }
                let s = self.identity(b, self.st, op);
                b.def_var(self.acc_s.unwrap(), s);
                if self.nest.vector {
                    let v = self.identity(b, self.vt, op);
                    for &a in &self.acc_vec {
                        b.def_var(a, v);
                    }
                }
            }
            Mode::OuterReduce(op) => {
                let last = self.nest.dims.len() - 1;
                let (start, stop) = self.range(b, last);
                let out = outp[0];
                let s = self.identity(b, self.st, op);
                let mut i = start;
                if self.nest.vector {
                    let v = self.identity(b, self.vt, op);
                    let step = self.vt.lanes as i64;
                    i = self.counted(b, i, stop, step, |g, b, i| {
                        let a = g.offset(b, out, i, 1);
                        b.ins().store(g.flags, v, a, 0);
                    });
                }
                self.counted(b, i, stop, 1, |g, b, i| {
                    let a = g.offset(b, out, i, 1);
                    b.ins().store(g.flags, s, a, 0);
                });
            }
        }
    }

    /// After the reduced loops of an inner reduction: combine the
    /// accumulators in a fixed order and store.
    fn post_reduce(&mut self, b: &mut FunctionBuilder, outp: &[Value]) {
        let Mode::InnerReduce(op) = self.nest.mode else {
            return;
        };
        let mut s = b.use_var(self.acc_s.unwrap());
        if self.nest.vector {
            let accs: Vec<Value> = self.acc_vec.iter().map(|&a| b.use_var(a)).collect();
            let mut e = E::new(b, self.vt, &self.calls);
            let mut v = accs[0];
            for &a in &accs[1..] {
                v = e.reduce(op, v, a);
            }
            let mut lanes = (0..self.vt.lanes as u8).map(|l| b.ins().extractlane(v, l));
            let first = lanes.next().unwrap();
            let rest: Vec<Value> = lanes.collect();
            let mut e = E::new(b, self.st, &self.calls);
            let mut h = first;
            for x in rest {
                h = e.reduce(op, h, x);
            }
            s = e.reduce(op, h, s);
        }
        b.ins().store(self.flags, s, outp[0], 0);
    }

    /// The innermost loop.
    fn row(&mut self, b: &mut FunctionBuilder, inp: &[Value], outp: &[Value]) {
        let last = self.nest.dims.len() - 1;
        let (start, stop) = self.range(b, last);
        // Inputs constant along the row: load at the row start.
        let mut row_const: Vec<Option<Pair>> = self.invariant.clone();
        for &j in &self.used {
            if row_const[j].is_none() && self.nest.in_strides[j][last] == 0 {
                row_const[j] = Some(self.load_invariant(b, inp[j]));
            }
        }
        if self.chunked.is_some() {
            self.chunked_row(b, start, stop, inp, outp, &row_const);
            return;
        }
        let mut i = start;
        if self.nest.vector {
            let lanes = self.vt.lanes as i64;
            let vt = self.vt;
            let unroll = self.unroll;
            if unroll > 1 {
                i = self.counted(b, i, stop, lanes * unroll as i64, |g, b, i| {
                    g.step(b, vt, unroll, i, inp, outp, &row_const);
                });
            }
            i = self.counted(b, i, stop, lanes, |g, b, i| {
                g.step(b, vt, 1, i, inp, outp, &row_const);
            });
        }
        let st = self.st;
        self.counted(b, i, stop, 1, |g, b, i| {
            g.step(b, st, 1, i, inp, outp, &row_const);
        });
    }

    /// The innermost loop in chunks (see [`Chunked`]).
    fn chunked_row(
        &mut self,
        b: &mut FunctionBuilder,
        start: Value,
        stop: Value,
        inp: &[Value],
        outp: &[Value],
        row_const: &[Option<Pair>],
    ) {
        use cranelift_codegen::ir::condcodes::IntCC;
        let ck = self.chunked.take().expect("a chunked row");
        let last_dim = self.nest.dims.len() - 1;
        let header = b.create_block();
        let i = b.append_block_param(header, types::I64);
        let blk = b.create_block();
        let exit = b.create_block();
        b.ins().jump(header, &[BlockArg::from(start)]);
        b.switch_to_block(header);
        let go = b.ins().icmp(IntCC::UnsignedLessThan, i, stop);
        b.ins().brif(go, blk, &[], exit, &[]);
        b.switch_to_block(blk);
        let rem = b.ins().isub(stop, i);
        let cap = self.iconst(b, CHUNK_BYTES / self.es);
        let len = b.ins().umin(rem, cap);
        for s in 0..=ck.last {
            self.stage(b, &ck, s, i, len, inp, outp, row_const);
            // The routines whose results stage s + 1 reads first.
            for (k, e) in self.spec.body.iter().enumerate() {
                let (Some(f), KExpr::Unary(_, a)) = (ck.routine[k], *e) else {
                    continue;
                };
                if ck.stage[k] != s + 1 {
                    continue;
                }
                let a = a.index();
                let src = match (ck.slot[a], self.spec.body[a]) {
                    (Some(p), _) => p,
                    (None, KExpr::Input(j)) => {
                        self.offset(b, inp[j], i, self.nest.in_strides[j][last_dim])
                    }
                    _ => unreachable!("a routine's argument is in memory"),
                };
                let dst = ck.slot[k].expect("a routine's result has a buffer");
                b.ins().call(f, &[src, dst, len]);
            }
        }
        let next = b.ins().iadd(i, len);
        b.ins().jump(header, &[BlockArg::from(next)]);
        b.switch_to_block(exit);
        self.chunked = Some(ck);
    }

    /// Stage `s` of a chunked row: Cranelift code over `[base, base +
    /// len)` computing what later stages read (and, in the last stage,
    /// the outputs).
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &mut self,
        b: &mut FunctionBuilder,
        ck: &Chunked,
        s: usize,
        base: Value,
        len: Value,
        inp: &[Value],
        outp: &[Value],
        row_const: &[Option<Pair>],
    ) {
        let body = &self.spec.body;
        let n = body.len();
        // What the stage stores, then everything those need.
        let mut stores: Vec<usize> = (0..n)
            .filter(|&k| ck.routine[k].is_none() && ck.slot[k].is_some() && ck.stage[k] == s)
            .collect();
        let outputs = s == ck.last;
        let mut need = vec![false; n];
        for &k in &stores {
            need[k] = true;
        }
        if outputs {
            for o in &self.spec.outputs {
                need[o.index()] = true;
            }
        }
        if !need.iter().any(|&x| x) {
            return;
        }
        for k in (0..n).rev() {
            if !need[k] || ck.reads_buffer(body, k, s) {
                continue;
            }
            match body[k] {
                KExpr::Unary(_, a) => need[a.index()] = true,
                KExpr::Binary(_, a, x) => {
                    need[a.index()] = true;
                    need[x.index()] = true;
                }
                KExpr::Select(c, a, x) => {
                    need[c.index()] = true;
                    need[a.index()] = true;
                    need[x.index()] = true;
                }
                KExpr::Input(_) | KExpr::Const(_) => {}
            }
        }
        stores.retain(|&k| need[k]);
        let zero = self.iconst(b, 0);
        let mut j = zero;
        let lanes = self.vt.lanes as i64;
        let vt = self.vt;
        let st = self.st;
        let u = self.unroll;
        let stage_args = (ck, s, base, &need[..], &stores[..], outputs);
        if u > 1 {
            j = self.counted(b, j, len, lanes * u as i64, |g, b, j| {
                g.stage_step(b, vt, u, j, stage_args, inp, outp, row_const);
            });
        }
        j = self.counted(b, j, len, lanes, |g, b, j| {
            g.stage_step(b, vt, 1, j, stage_args, inp, outp, row_const);
        });
        self.counted(b, j, len, 1, |g, b, j| {
            g.stage_step(b, st, 1, j, stage_args, inp, outp, row_const);
        });
    }

    /// `u` consecutive elements (scalars or vectors) at chunk index `j` of
    /// one stage.
    #[allow(clippy::too_many_arguments)]
    fn stage_step(
        &mut self,
        b: &mut FunctionBuilder,
        t: Ty,
        u: usize,
        j: Value,
        (ck, s, base, need, stores, outputs): (&Chunked, usize, Value, &[bool], &[usize], bool),
        inp: &[Value],
        outp: &[Value],
        row_const: &[Option<Pair>],
    ) {
        let body = &self.spec.body;
        let last_dim = self.nest.dims.len() - 1;
        let gi = b.ins().iadd(base, j);
        let local = b.ins().ishl_imm_u(j, self.sh);
        // Per expression: its scratch address and, for inputs, where the
        // input is read.
        let mut addr: Vec<Option<Value>> = vec![None; body.len()];
        let mut in_addr: Vec<Option<Value>> = vec![None; body.len()];
        for (k, e) in body.iter().enumerate() {
            if !need[k] {
                continue;
            }
            if ck.reads_buffer(body, k, s) || stores.contains(&k) {
                let p = ck.slot[k].expect("a buffer");
                addr[k] = Some(b.ins().iadd(p, local));
            }
            if let KExpr::Input(x) = *e {
                if row_const[x].is_none() {
                    let stride = self.nest.in_strides[x][last_dim];
                    in_addr[k] = Some(self.offset(b, inp[x], gi, stride));
                }
            }
        }
        let out_addrs: Vec<Value> = if outputs {
            outp.iter().map(|&p| self.offset(b, p, gi, 1)).collect()
        } else {
            vec![]
        };
        let bytes = (t.lanes as i64 * self.es) as i32;
        for kk in 0..u {
            let off = bytes * kk as i32;
            let mut e = E::new(b, t, &self.calls);
            let mut vals: Vec<Option<Value>> = vec![None; body.len()];
            let mut masks: Vec<Option<Mask>> = vec![None; body.len()];
            for (k, expr) in body.iter().enumerate() {
                if !need[k] {
                    continue;
                }
                let v = |k: KId| vals[k.index()].expect("operand computed");
                let (val, m) = if ck.reads_buffer(body, k, s) {
                    let a = addr[k].expect("a buffer");
                    (e.b.ins().load(t.f, self.flags, a, off), None)
                } else {
                    match *expr {
                        KExpr::Input(x) => match row_const[x] {
                            Some((sv, vv)) => (if t.is_vector() { vv } else { sv }, None),
                            None => {
                                let a = in_addr[k].expect("an input address");
                                (e.b.ins().load(t.f, self.flags, a, off), None)
                            }
                        },
                        KExpr::Const(c) => (e.c(c), None),
                        KExpr::Unary(op, a) => (e.unary(op, v(a)), None),
                        KExpr::Binary(op, a, x) => e.binary(op, v(a), v(x)),
                        KExpr::Select(c, a, x) => {
                            let m = match masks[c.index()] {
                                Some(m) => m,
                                None => e.nonzero(v(c)),
                            };
                            (e.sel(m, v(a), v(x)), None)
                        }
                    }
                };
                vals[k] = Some(val);
                masks[k] = m;
            }
            for &k in stores {
                let a = addr[k].expect("a buffer");
                e.b.ins().store(self.flags, vals[k].unwrap(), a, off);
            }
            for (o, &a) in self.spec.outputs.iter().zip(&out_addrs) {
                e.b.ins()
                    .store(self.flags, vals[o.index()].unwrap(), a, off);
            }
        }
    }

    /// `u` consecutive elements (scalars or vectors) at index `i`.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        b: &mut FunctionBuilder,
        t: Ty,
        u: usize,
        i: Value,
        inp: &[Value],
        outp: &[Value],
        row_const: &[Option<Pair>],
    ) {
        let last = self.nest.dims.len() - 1;
        let addrs: Vec<Option<Value>> = (0..inp.len())
            .map(|j| {
                if row_const[j].is_some() || !self.used.contains(&j) {
                    None
                } else {
                    Some(self.offset(b, inp[j], i, self.nest.in_strides[j][last]))
                }
            })
            .collect();
        // Map outputs and side outputs at `i`; a reduced output's address
        // (the row of an outer reduction) is `out_addrs[0]`.
        let out_addrs: Vec<Value> = outp
            .iter()
            .enumerate()
            .map(|(k, &p)| match self.nest.mode {
                Mode::InnerReduce(_) if k == 0 => p,
                Mode::InnerReduce(_) | Mode::OuterReduce(_) if k > 0 => {
                    self.offset(b, p, i, self.out_stride(k, last))
                }
                _ => self.offset(b, p, i, 1),
            })
            .collect();
        let bytes = (t.lanes as i64 * self.es) as i32;
        for k in 0..u {
            let off = bytes * k as i32;
            let vals: Vec<Option<Value>> = (0..inp.len())
                .map(|j| match (row_const[j], addrs[j]) {
                    (Some((s, v)), _) => Some(if t.is_vector() { v } else { s }),
                    (None, Some(a)) => Some(b.ins().load(t.f, self.flags, a, off)),
                    (None, None) => None,
                })
                .collect();
            let outs = self.eval(b, t, &vals);
            match self.nest.mode {
                Mode::Map => {
                    for (v, &a) in outs.iter().zip(&out_addrs) {
                        b.ins().store(self.flags, *v, a, off);
                    }
                }
                Mode::OuterReduce(op) => {
                    let a = out_addrs[0];
                    let old = b.ins().load(t.f, self.flags, a, off);
                    let mut e = E::new(b, t, &self.calls);
                    let new = e.reduce(op, old, outs[0]);
                    b.ins().store(self.flags, new, a, off);
                    self.store_sides(b, &outs, &out_addrs, off);
                }
                Mode::InnerReduce(op) => {
                    self.store_sides(b, &outs, &out_addrs, off);
                    let var = if t.is_vector() {
                        self.acc_vec[k]
                    } else {
                        self.acc_s.unwrap()
                    };
                    let old = b.use_var(var);
                    let mut e = E::new(b, t, &self.calls);
                    let new = e.reduce(op, old, outs[0]);
                    b.def_var(var, new);
                }
            }
        }
    }

    /// A reduction's side outputs (all outputs but the first) at their
    /// addresses plus `off` bytes.
    fn store_sides(&self, b: &mut FunctionBuilder, outs: &[Value], addrs: &[Value], off: i32) {
        for (v, &a) in outs.iter().zip(addrs).skip(1) {
            b.ins().store(self.flags, *v, a, off);
        }
    }

    /// The body at one element (scalar or vector); returns the outputs.
    fn eval(&self, b: &mut FunctionBuilder, t: Ty, inputs: &[Option<Value>]) -> Vec<Value> {
        let mut e = E::new(b, t, &self.calls);
        let mut vals: Vec<Value> = Vec::with_capacity(self.spec.body.len());
        let mut masks: Vec<Option<Mask>> = Vec::with_capacity(self.spec.body.len());
        for expr in &self.spec.body {
            let (v, m) = match *expr {
                KExpr::Input(i) => (inputs[i].expect("input loaded"), None),
                KExpr::Const(c) => (e.c(c), None),
                KExpr::Unary(op, a) => (e.unary(op, vals[a.index()]), None),
                KExpr::Binary(op, a, x) => e.binary(op, vals[a.index()], vals[x.index()]),
                KExpr::Select(c, a, x) => {
                    let m = match masks[c.index()] {
                        Some(m) => m,
                        None => e.nonzero(vals[c.index()]),
                    };
                    (e.sel(m, vals[a.index()], vals[x.index()]), None)
                }
            };
            vals.push(v);
            masks.push(m);
        }
        self.spec.outputs.iter().map(|o| vals[o.index()]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark's kernel `tanh(2x + 1) * sigmoid(x) - x / 3`: `2x + 1`
    /// goes to a buffer for `tanh`, `sigmoid` reads `x` in place, and `x /
    /// 3` is computed in the last stage rather than stored.
    #[test]
    fn chunk_stages_of_the_benchmark_kernel() {
        let spec = KernelSpec::tanh_sigmoid_map(KDType::F32, 64);
        let [x, t, a, th, s, q, y] = [0, 4, 5, 6, 7, 9, 10].map(KId);
        let routine = |op| matches!(op, UnaryOp::Tanh | UnaryOp::Sigmoid);
        let (stage, call, mem) = chunk_stages(&spec.body, &[y], routine, |_| true).unwrap();
        let at = |k: KId| (stage[k.index()], call[k.index()], mem[k.index()]);
        assert_eq!(at(a), (0, false, true));
        assert_eq!(at(t), (0, false, false));
        assert_eq!(at(th), (1, true, true));
        assert_eq!(at(s), (1, true, true));
        assert_eq!(at(q), (1, false, false));
        assert_eq!(at(y), (1, false, false));
        assert_eq!(mem.iter().filter(|&&m| m).count(), 3);
        // Read with a stride, `x` is copied for `sigmoid`.
        let (_, _, mem) = chunk_stages(&spec.body, &[y], routine, |_| false).unwrap();
        assert!(mem[x.index()]);
        // No routine: no chunks.
        assert!(chunk_stages(&spec.body, &[y], |_| false, |_| true).is_none());
    }
}
