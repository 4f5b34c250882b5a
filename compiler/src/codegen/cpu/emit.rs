//! Cranelift IR for a kernel's loop nest.
//!
//! The function is `fn(inputs: *const *const u8, outputs: *const *mut u8,
//! begin: usize, end: usize)`; it runs the loop `plan.par_dim` over
//! `[begin, end)` and every other loop over its full extent. The innermost
//! loop runs `unroll` vectors per step, then single vectors, then scalars.

use cranelift_codegen::ir::{types, AbiParam, BlockArg, InstBuilder, MemFlagsData, Value};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};

use super::libcalls::{binary_libcall, unary_libcall, Libcall};
use super::math::{Calls, Mask, Ty, E};
use super::plan::{Mode, Plan};
use crate::codegen::kernel::{BinaryOp, KDType, KExpr, KernelSpec, ReduceOp, UnaryOp};

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
            UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Erf => 40,
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
/// code size in bytes and, with `disasm`, the machine code as text.
pub(crate) fn define(
    module: &mut JITModule,
    spec: &KernelSpec,
    plan: &Plan,
    unroll: usize,
    fma: bool,
    disasm: bool,
) -> Result<(FuncId, usize, Option<String>), String> {
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

    let mut ctx = module.make_context();
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
                KExpr::Unary(UnaryOp::Sin, _) => calls.sin = r,
                KExpr::Unary(UnaryOp::Cos, _) => calls.cos = r,
                KExpr::Unary(UnaryOp::Erf, _) => calls.erf = r,
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
            plan,
            es: spec.dtype.size_bytes() as i64,
            sh: if spec.dtype == KDType::F32 { 2 } else { 3 },
            st: Ty::new(spec.dtype, false),
            vt: Ty::new(spec.dtype, true),
            unroll: if plan.vector { unroll.max(1) } else { 1 },
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
        };
        // Inputs read at one place only: load once.
        for &i in &g.used.clone() {
            if plan.in_strides[i].iter().all(|&s| s == 0) {
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
    Ok((id, size, text))
}

struct Gen<'s> {
    spec: &'s KernelSpec,
    plan: &'s Plan,
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
}

/// A value loaded once for a whole row: scalar and splatted.
type Pair = (Value, Value);

impl<'s> Gen<'s> {
    fn load_invariant(&self, b: &mut FunctionBuilder, p: Value) -> Pair {
        let s = b.ins().load(self.st.f, self.flags, p, 0);
        let v = if self.plan.vector {
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
        if l == self.plan.par_dim {
            (self.begin, self.end)
        } else {
            let z = self.iconst(b, 0);
            let n = self.iconst(b, self.plan.dims[l] as i64);
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

    fn is_first_reduced(&self, l: usize) -> bool {
        self.plan.mode != Mode::Map && self.plan.reduced[l] && (l == 0 || !self.plan.reduced[l - 1])
    }

    fn level(&mut self, b: &mut FunctionBuilder, l: usize, inp: &[Value], outp: &[Value]) {
        let wrap = self.is_first_reduced(l);
        if wrap {
            self.pre_reduce(b, outp);
        }
        let last = self.plan.dims.len() - 1;
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
                    .map(|(j, &p)| g.offset(b, p, i, g.plan.in_strides[j][l]))
                    .collect();
                let op: Vec<Value> = outp
                    .iter()
                    .map(|&p| g.offset(b, p, i, g.plan.out_strides[l]))
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
        match self.plan.mode {
            Mode::Map => {}
            Mode::InnerReduce(op) => {
                if self.acc_s.is_none() {
                    self.acc_s = Some(b.declare_var(self.st.f));
                    if self.plan.vector {
                        self.acc_vec = (0..self.unroll).map(|_| b.declare_var(self.vt.f)).collect();
                    }
                }
                let s = self.identity(b, self.st, op);
                b.def_var(self.acc_s.unwrap(), s);
                if self.plan.vector {
                    let v = self.identity(b, self.vt, op);
                    for &a in &self.acc_vec {
                        b.def_var(a, v);
                    }
                }
            }
            Mode::OuterReduce(op) => {
                let last = self.plan.dims.len() - 1;
                let (start, stop) = self.range(b, last);
                let out = outp[0];
                let s = self.identity(b, self.st, op);
                let mut i = start;
                if self.plan.vector {
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
        let Mode::InnerReduce(op) = self.plan.mode else {
            return;
        };
        let mut s = b.use_var(self.acc_s.unwrap());
        if self.plan.vector {
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
        let last = self.plan.dims.len() - 1;
        let (start, stop) = self.range(b, last);
        // Inputs constant along the row: load at the row start.
        let mut row_const: Vec<Option<Pair>> = self.invariant.clone();
        for &j in &self.used {
            if row_const[j].is_none() && self.plan.in_strides[j][last] == 0 {
                row_const[j] = Some(self.load_invariant(b, inp[j]));
            }
        }
        let mut i = start;
        if self.plan.vector {
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
        let last = self.plan.dims.len() - 1;
        let addrs: Vec<Option<Value>> = (0..inp.len())
            .map(|j| {
                if row_const[j].is_some() || !self.used.contains(&j) {
                    None
                } else {
                    Some(self.offset(b, inp[j], i, self.plan.in_strides[j][last]))
                }
            })
            .collect();
        let out_addrs: Vec<Value> = match self.plan.mode {
            Mode::InnerReduce(_) => vec![],
            _ => outp.iter().map(|&p| self.offset(b, p, i, 1)).collect(),
        };
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
            match self.plan.mode {
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
                }
                Mode::InnerReduce(op) => {
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
