//! Element-wise operations as Cranelift IR, written once for scalar and
//! vector types, including polynomial `exp`, `log`, `log1p`, `tanh` and
//! `sigmoid`.
//!
//! Every function here emits the same sequence of IEEE operations for a
//! scalar (`f32`, `f64`) and a vector (`f32x4`, `f64x2`) type, so a vector
//! loop and its scalar tail give bit-identical results; that is what makes
//! results independent of how the iteration space is split across threads.
//!
//! The polynomials follow well-known public-domain designs: `exp` is
//! fdlibm's (f64) and Cephes' `expf` (f32) after a Cody–Waite reduction
//! `x = k ln 2 + r`, with `2^k` applied in two halves so that results
//! near overflow and in the subnormal range are right; `log` is musl's
//! `log`/`logf` (`s = f / (2 + f)` and a polynomial in `s²`); `tanh` is
//! Cephes' (a rational or polynomial below 0.625, `1 - 2 / (e^{2|x|} + 1)`
//! above); `log1p` is `log(1 + x)` corrected by `(x - (u - 1)) / u`;
//! `sigmoid` uses `e^{-|x|}` on both sides.

// The constants are quoted with the digits of their published sources.
#![allow(clippy::excessive_precision)]

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, BlockArg, FuncRef, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;

use crate::codegen::kernel::{BinaryOp, KDType, ReduceOp, UnaryOp};
use adjoint_runtime::math::MathFn;

/// A float type and its companion integer type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ty {
    /// The float type (`f32`, `f64`, `f32x4`, `f64x2`).
    pub f: Type,
    /// The integer type of the same lane layout.
    pub i: Type,
    /// Lanes (1 for scalars).
    pub lanes: u32,
    /// Whether lanes are f64.
    pub wide: bool,
}

impl Ty {
    /// The scalar (`lanes == 1`) or 128-bit vector type of `dtype`.
    pub fn new(dtype: KDType, vector: bool) -> Ty {
        match (dtype, vector) {
            (KDType::F32, false) => Ty {
                f: types::F32,
                i: types::I32,
                lanes: 1,
                wide: false,
            },
            (KDType::F64, false) => Ty {
                f: types::F64,
                i: types::I64,
                lanes: 1,
                wide: true,
            },
            (KDType::F32, true) => Ty {
                f: types::F32X4,
                i: types::I32X4,
                lanes: 4,
                wide: false,
            },
            (KDType::F64, true) => Ty {
                f: types::F64X2,
                i: types::I64X2,
                lanes: 2,
                wide: true,
            },
        }
    }

    pub fn is_vector(self) -> bool {
        self.lanes > 1
    }
}

/// The imported functions of one compiled function, for operations
/// without an inline implementation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Calls {
    /// The math table's functions the body calls.
    pub math: Vec<(MathFn, FuncRef)>,
    pub erf: Option<FuncRef>,
    pub pow: Option<FuncRef>,
    pub rem: Option<FuncRef>,
    /// Whether `a * b + c` is one fused operation (hosts with FMA).
    pub fma: bool,
}

/// A comparison mask: `i8` for scalars, a lane mask of the integer vector
/// type for vectors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mask(pub Value);

/// Constants of the exponential-based functions, shared with the 256-bit
/// routines of `avx2.rs`, which must give the same bits.
pub(crate) mod k {
    /// f64 `e^x`: the clamp, `ln 2` split in two (Cody–Waite), and the
    /// rational approximation's polynomial in `r^2`.
    pub const EXP_F64_RANGE: (f64, f64) = (-746.0, 710.0);
    pub const LN2_HI_F64: f64 = 6.93147180369123816490e-01;
    pub const LN2_LO_F64: f64 = 1.90821492927058770002e-10;
    pub const EXP_F64_P: [f64; 5] = [
        4.13813679705723846039e-08,
        -1.65339022054652515390e-06,
        6.61375632143793436117e-05,
        -2.77777777770155933842e-03,
        1.66666666666666019037e-01,
    ];
    /// f32 `e^x`: the clamp, `ln 2` split in two, the polynomial.
    pub const EXP_F32_RANGE: (f64, f64) = (-104.0, 100.0);
    pub const LN2_HI_F32: f64 = 0.693359375;
    pub const LN2_LO_F32: f64 = -2.12194440e-4;
    pub const EXP_F32_P: [f64; 6] = [
        1.9875691500E-4,
        1.3981999507E-3,
        8.3334519073E-3,
        4.1665795894E-2,
        1.6666665459E-1,
        5.0000001201E-1,
    ];
    /// f32 `e^r - 1`'s Taylor coefficients from `r^8` down to `r^2`.
    pub const EXPM1_F32_P: [f64; 7] = [
        1.0 / 40320.0,
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
    /// Where f32 `tanh` is 1: the clamp of `2|x|`.
    pub const TANH_F32_CLAMP: f64 = 20.0;
    /// `1.5 * 2^52` and `1.5 * 2^23`: adding one rounds to an integer.
    pub const SHIFTER_F64: f64 = 6755399441055744.0;
    pub const SHIFTER_F32: f64 = 12582912.0;
}

/// An emitter for one value type.
pub(crate) struct E<'a, 'f> {
    pub b: &'a mut FunctionBuilder<'f>,
    pub t: Ty,
    pub calls: &'a Calls,
}

impl<'a, 'f> E<'a, 'f> {
    pub fn new(b: &'a mut FunctionBuilder<'f>, t: Ty, calls: &'a Calls) -> Self {
        E { b, t, calls }
    }

    /// A float constant, splatted for vectors.
    pub fn c(&mut self, v: f64) -> Value {
        let s = if self.t.wide {
            self.b.ins().f64const(v)
        } else {
            self.b.ins().f32const(v as f32)
        };
        self.splat(s)
    }

    fn splat(&mut self, s: Value) -> Value {
        if self.t.is_vector() {
            self.b.ins().splat(self.t.f, s)
        } else {
            s
        }
    }

    /// An integer constant of the companion integer type.
    pub fn ci(&mut self, v: i64) -> Value {
        let (st, v) = if self.t.wide {
            (types::I64, v)
        } else {
            (types::I32, (v as u64 & 0xffff_ffff) as i64)
        };
        let s = self.b.ins().iconst(st, v);
        if self.t.is_vector() {
            self.b.ins().splat(self.t.i, s)
        } else {
            s
        }
    }

    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }
    /// `a * b + c`: fused where the host has FMA, else two roundings.
    /// Scalar and vector code make the same choice.
    fn mad(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.calls.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.mul(a, b);
            self.add(p, c)
        }
    }
    /// `a * k + c` for a constant `k`.
    fn madc(&mut self, a: Value, k: f64, c: Value) -> Value {
        let k = self.c(k);
        self.mad(a, k, c)
    }
    fn addc(&mut self, a: Value, c: f64) -> Value {
        let k = self.c(c);
        self.add(a, k)
    }
    fn mulc(&mut self, a: Value, c: f64) -> Value {
        let k = self.c(c);
        self.mul(a, k)
    }

    /// `coeffs[0] * x^(n-1) + ... + coeffs[n-1]` by Estrin's scheme: the
    /// pairs `c x + d` side by side, then pairs of those with `x^2`, and so
    /// on. Its chain of dependent operations is about `log2 n` products
    /// long where Horner's is `n`, and a kernel's polynomials are where
    /// its time goes: the map benchmark's kernel (`tanh` and `sigmoid`,
    /// whose exponentials have degree-5 and degree-7 polynomials) ran
    /// 7–10% faster on one thread (`cargo bench -p adjoint-compiler --bench
    /// map_kernel`), with the same accuracy (the same counts of results
    /// 0, 1 and 2 ulp off, within 0.1%, over a million samples of every
    /// function in both precisions).
    fn poly(&mut self, x: Value, coeffs: &[f64]) -> Value {
        // Lowest degree first: c[0] + c[1] x, c[2] + c[3] x, ...
        let mut terms: Vec<Value> = coeffs
            .rchunks(2)
            .map(|pair| match *pair {
                [hi, lo] => {
                    let lo = self.c(lo);
                    self.madc(x, hi, lo)
                }
                [only] => self.c(only),
                _ => unreachable!("chunks of one or two"),
            })
            .collect();
        let mut power = x;
        while terms.len() > 1 {
            power = self.mul(power, power);
            terms = terms
                .chunks(2)
                .map(|pair| match *pair {
                    [lo, hi] => self.mad(hi, power, lo),
                    [only] => only,
                    _ => unreachable!("chunks of one or two"),
                })
                .collect();
        }
        terms[0]
    }

    pub fn int_bits(&mut self, v: Value) -> Value {
        self.b.ins().bitcast(self.t.i, MemFlagsData::new(), v)
    }
    pub fn float_bits(&mut self, v: Value) -> Value {
        self.b.ins().bitcast(self.t.f, MemFlagsData::new(), v)
    }

    pub fn cmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Mask {
        Mask(self.b.ins().fcmp(cc, a, b))
    }
    pub fn or(&mut self, a: Mask, b: Mask) -> Mask {
        Mask(self.b.ins().bor(a.0, b.0))
    }
    /// `a` where the mask holds, else `b`.
    pub fn sel(&mut self, m: Mask, a: Value, b: Value) -> Value {
        if self.t.is_vector() {
            let m = self.float_bits(m.0);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(m.0, a, b)
        }
    }
    /// 1.0 where the mask holds, else 0.0.
    pub fn mask_to_float(&mut self, m: Mask) -> Value {
        let one = self.c(1.0);
        if self.t.is_vector() {
            let m = self.float_bits(m.0);
            self.b.ins().band(m, one)
        } else {
            let zero = self.c(0.0);
            self.b.ins().select(m.0, one, zero)
        }
    }
    /// `x86 minps`-like `a < b ? a : b` (one instruction; NaN in `b` passes).
    fn pmin(&mut self, a: Value, b: Value) -> Value {
        let m = self.cmp(FloatCC::LessThan, a, b);
        self.sel(m, a, b)
    }
    /// `a > b ? a : b` (one instruction; NaN in `b` passes).
    fn pmax(&mut self, a: Value, b: Value) -> Value {
        let m = self.cmp(FloatCC::LessThan, b, a);
        self.sel(m, a, b)
    }
    /// `x` clamped to `[lo, hi]` (either side optional), NaN kept.
    fn clamp(&mut self, x: Value, lo: Option<f64>, hi: Option<f64>) -> Value {
        let mut x = x;
        if let Some(hi) = hi {
            let h = self.c(hi);
            x = self.pmin(h, x);
        }
        if let Some(lo) = lo {
            let l = self.c(lo);
            x = self.pmax(l, x);
        }
        x
    }
    fn sign_mask(&mut self) -> Value {
        let bits = if self.t.wide { i64::MIN } else { 0x8000_0000 };
        let m = self.ci(bits);
        self.float_bits(m)
    }
    /// `|mag|` with the sign of `sign`.
    fn copysign(&mut self, mag: Value, sign: Value) -> Value {
        let sm = self.sign_mask();
        let s = self.b.ins().band(sign, sm);
        let a = self.b.ins().fabs(mag);
        self.b.ins().bor(a, s)
    }

    /// Calls `f` on every lane.
    fn call_lanes(&mut self, f: Option<FuncRef>, args: &[Value]) -> Value {
        let f = f.expect("libcall declared for this kernel");
        if !self.t.is_vector() {
            let call = self.b.ins().call(f, args);
            return self.b.inst_results(call)[0];
        }
        let mut out = args[0];
        for lane in 0..self.t.lanes as u8 {
            let xs: Vec<Value> = args
                .iter()
                .map(|&a| self.b.ins().extractlane(a, lane))
                .collect();
            let call = self.b.ins().call(f, &xs);
            let r = self.b.inst_results(call)[0];
            out = self.b.ins().insertlane(out, r, lane);
        }
        out
    }

    // ---- the operations ----

    /// One unary operation.
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Rsqrt => {
                let s = self.b.ins().sqrt(x);
                let one = self.c(1.0);
                self.div(one, s)
            }
            UnaryOp::Floor => self.b.ins().floor(x),
            UnaryOp::Ceil => self.b.ins().ceil(x),
            UnaryOp::Relu => {
                // x where x > 0 or x is NaN, else +0.0.
                let zero = self.c(0.0);
                let m = self.cmp(FloatCC::UnorderedOrGreaterThan, x, zero);
                self.sel(m, x, zero)
            }
            UnaryOp::Sign => {
                // ±1 where x is ordered and nonzero, else x (NaN, ±0).
                let zero = self.c(0.0);
                let one = self.c(1.0);
                let lt = self.cmp(FloatCC::LessThan, x, zero);
                let gt = self.cmp(FloatCC::GreaterThan, x, zero);
                let m = self.or(lt, gt);
                let s = self.copysign(one, x);
                self.sel(m, s, x)
            }
            UnaryOp::Exp => self.exp(x),
            UnaryOp::Log => self.log(x),
            UnaryOp::Log1p => self.log1p(x),
            UnaryOp::Tanh => self.tanh(x),
            UnaryOp::Sigmoid => self.sigmoid(x),
            UnaryOp::Erf => self.call_lanes(self.calls.erf, &[x]),
            UnaryOp::Math(f) => {
                let r = self
                    .calls
                    .math
                    .iter()
                    .find(|(g, _)| *g == f)
                    .map(|(_, r)| *r);
                self.call_lanes(r, &[x])
            }
        }
    }

    /// One binary operation; comparisons also return their mask.
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> (Value, Option<Mask>) {
        let cmp = |e: &mut Self, cc: FloatCC| {
            let m = e.cmp(cc, a, b);
            (e.mask_to_float(m), Some(m))
        };
        match op {
            BinaryOp::Add => (self.add(a, b), None),
            BinaryOp::Sub => (self.sub(a, b), None),
            BinaryOp::Mul => (self.mul(a, b), None),
            BinaryOp::Div => (self.div(a, b), None),
            BinaryOp::Pow => (self.call_lanes(self.calls.pow, &[a, b]), None),
            BinaryOp::Rem => (self.call_lanes(self.calls.rem, &[a, b]), None),
            BinaryOp::Maximum => {
                // a if a is NaN or a >= b, else b: `b > a ? b : a`, then a
                // NaN in b wins.
                let m = self.pmax(b, a);
                let nan = self.cmp(FloatCC::Unordered, b, b);
                (self.sel(nan, b, m), None)
            }
            BinaryOp::Minimum => {
                let m = self.pmin(b, a);
                let nan = self.cmp(FloatCC::Unordered, b, b);
                (self.sel(nan, b, m), None)
            }
            BinaryOp::Eq => cmp(self, FloatCC::Equal),
            BinaryOp::Ne => cmp(self, FloatCC::NotEqual),
            BinaryOp::Lt => cmp(self, FloatCC::LessThan),
            BinaryOp::Le => cmp(self, FloatCC::LessThanOrEqual),
            BinaryOp::Gt => cmp(self, FloatCC::GreaterThan),
            BinaryOp::Ge => cmp(self, FloatCC::GreaterThanOrEqual),
        }
    }

    /// The mask "`c` is nonzero" (NaN counts as nonzero).
    pub fn nonzero(&mut self, c: Value) -> Mask {
        let zero = self.c(0.0);
        self.cmp(FloatCC::NotEqual, c, zero)
    }

    /// One step of a reduction: `acc op v`.
    pub fn reduce(&mut self, op: ReduceOp, acc: Value, v: Value) -> Value {
        match op {
            ReduceOp::Sum => self.add(acc, v),
            ReduceOp::Prod => self.mul(acc, v),
            ReduceOp::Max => self.b.ins().fmax(acc, v),
            ReduceOp::Min => self.b.ins().fmin(acc, v),
        }
    }

    /// `2^k` for integers `k` (as the companion integer type) in the normal
    /// exponent range.
    fn pow2i(&mut self, k: Value) -> Value {
        let (bias, shift) = if self.t.wide { (1023, 52) } else { (127, 23) };
        let bias = self.ci(bias);
        let e = self.b.ins().iadd(k, bias);
        let bits = self.b.ins().ishl_imm_u(e, shift);
        self.float_bits(bits)
    }

    /// `x * scale` rounded to the nearest integer as a float `kf` and as
    /// the companion integer `ki` (|x * scale| < 2^22), by the shifter
    /// trick.
    fn round_split(&mut self, x: Value, scale: f64) -> (Value, Value) {
        let shifter = if self.t.wide {
            k::SHIFTER_F64
        } else {
            k::SHIFTER_F32
        };
        let s = self.c(shifter);
        let t = self.madc(x, scale, s);
        let kf = self.sub(t, s);
        let ti = self.int_bits(t);
        let si = self.int_bits(s);
        let ki = self.b.ins().isub(ti, si);
        (kf, ki)
    }

    /// `e^x`.
    pub fn exp(&mut self, x: Value) -> Value {
        self.exp_of(x, true, true)
    }

    /// `e^x`, where the caller may know that `x` is not below (`lo`
    /// false) or above (`hi` false) the range where `e^x` is finite and
    /// nonzero.
    fn exp_of(&mut self, x: Value, lo: bool, hi: bool) -> Value {
        const LOG2E: f64 = std::f64::consts::LOG2_E;
        if self.t.wide {
            let (min, max) = k::EXP_F64_RANGE;
            let x = self.clamp(x, lo.then_some(min), hi.then_some(max));
            let (kf, ki) = self.round_split(x, LOG2E);
            // Cody–Waite: hi - lo = x - k ln2 (k ln2_hi is exact).
            let hi = self.madc(kf, -k::LN2_HI_F64, x);
            let lo = self.mulc(kf, k::LN2_LO_F64);
            let r = self.sub(hi, lo);
            let z = self.mul(r, r);
            let p = self.poly(z, &k::EXP_F64_P);
            let zp = self.mul(z, p);
            let c = self.sub(r, zp);
            // y = 1 - ((lo - r c / (2 - c)) - hi)
            let rc = self.mul(r, c);
            let two = self.c(2.0);
            let d = self.sub(two, c);
            let q = self.div(rc, d);
            let t = self.sub(lo, q);
            let t = self.sub(t, hi);
            let one = self.c(1.0);
            let y = self.sub(one, t);
            self.scale2(y, ki)
        } else {
            let (min, max) = k::EXP_F32_RANGE;
            let x = self.clamp(x, lo.then_some(min), hi.then_some(max));
            let (kf, ki) = self.round_split(x, LOG2E);
            let r = self.madc(kf, -k::LN2_HI_F32, x);
            let r = self.madc(kf, -k::LN2_LO_F32, r);
            let z = self.mul(r, r);
            let p = self.poly(r, &k::EXP_F32_P);
            let p = self.mad(p, z, r);
            let y = self.addc(p, 1.0);
            self.scale2(y, ki)
        }
    }

    /// `y * 2^k`, applying `2^k` in two halves so that `k` may reach the
    /// subnormal and overflow ranges. When every lane's `k` is an exponent
    /// of a normal float (the common case), one product does it instead:
    /// the same rounding (none, or once into the subnormals), so the same
    /// bits, for three operations instead of eight.
    fn scale2(&mut self, y: Value, k: Value) -> Value {
        use cranelift_codegen::ir::condcodes::IntCC;
        let (lo, hi) = if self.t.wide {
            (-1022, 1023)
        } else {
            (-126, 127)
        };
        let (lo, hi) = (self.ci(lo), self.ci(hi));
        let below = self.b.ins().icmp(IntCC::SignedLessThan, k, lo);
        let above = self.b.ins().icmp(IntCC::SignedGreaterThan, k, hi);
        let outside = self.b.ins().bor(below, above);
        let any = if self.t.is_vector() {
            self.b.ins().vany_true(outside)
        } else {
            outside
        };
        let s = self.pow2i(k);
        let one_step = self.mul(y, s);
        let split = self.b.create_block();
        let join = self.b.create_block();
        let result = self.b.append_block_param(join, self.t.f);
        self.b
            .ins()
            .brif(any, split, &[], join, &[BlockArg::from(one_step)]);
        self.b.switch_to_block(split);
        let two_steps = self.scale2_split(y, k);
        self.b.ins().jump(join, &[BlockArg::from(two_steps)]);
        self.b.switch_to_block(join);
        result
    }

    /// [`Self::scale2`] in two products, for any `k`.
    fn scale2_split(&mut self, y: Value, k: Value) -> Value {
        let k1 = self.b.ins().sshr_imm_u(k, 1);
        let k2 = self.b.ins().isub(k, k1);
        let s1 = self.pow2i(k1);
        let s2 = self.pow2i(k2);
        let y = self.mul(y, s1);
        self.mul(y, s2)
    }

    /// Small integers stored in the companion integer type, as floats.
    fn int_to_float(&mut self, k: Value) -> Value {
        let (magic_bits, magic) = if self.t.wide {
            (0x4338_0000_0000_0000i64, k::SHIFTER_F64)
        } else {
            (0x4B40_0000, k::SHIFTER_F32)
        };
        let mb = self.ci(magic_bits);
        let bits = self.b.ins().iadd(k, mb);
        let f = self.float_bits(bits);
        let m = self.c(magic);
        self.sub(f, m)
    }

    /// Natural logarithm.
    pub fn log(&mut self, x: Value) -> Value {
        let wide = self.t.wide;
        // Subnormals: scale into the normal range first.
        let (min_normal, up, up_log2) = if wide {
            (f64::MIN_POSITIVE, 18014398509481984.0, 54.0) // 2^54
        } else {
            (f32::MIN_POSITIVE as f64, 33554432.0, 25.0) // 2^25
        };
        let mn = self.c(min_normal);
        let sub = self.cmp(FloatCC::LessThan, x, mn);
        let xs = self.mulc(x, up);
        let xn = self.sel(sub, xs, x);
        let zero = self.c(0.0);
        let adj = self.c(-up_log2);
        let kadj = self.sel(sub, adj, zero);
        // x = 2^k (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)).
        let ix = self.int_bits(xn);
        let (off, sh, mant, base, bias) = if wide {
            (
                (0x3ff0_0000i64 - 0x3fe6_a09e) << 32,
                52,
                0x000f_ffff_ffff_ffffi64,
                0x3fe6_a09ei64 << 32,
                1023,
            )
        } else {
            (
                0x3f80_0000i64 - 0x3f35_04f3,
                23,
                0x007f_ffff,
                0x3f35_04f3,
                127,
            )
        };
        let offv = self.ci(off);
        let ix = self.b.ins().iadd(ix, offv);
        let e = self.b.ins().ushr_imm_u(ix, sh);
        let biasv = self.ci(bias);
        let k = self.b.ins().isub(e, biasv);
        let mv = self.ci(mant);
        let m = self.b.ins().band(ix, mv);
        let bv = self.ci(base);
        let m = self.b.ins().iadd(m, bv);
        let m = self.float_bits(m);
        let one = self.c(1.0);
        let f = self.sub(m, one);
        let kf = self.int_to_float(k);
        let dk = self.add(kf, kadj);
        let two = self.c(2.0);
        let d = self.add(two, f);
        let s = self.div(f, d);
        let z = self.mul(s, s);
        let w = self.mul(z, z);
        let r = if wide {
            let t1 = self.poly(
                w,
                &[
                    1.531383769920937332e-01,
                    2.222219843214978396e-01,
                    3.999999999940941908e-01,
                ],
            );
            let t1 = self.mul(w, t1);
            let t2 = self.poly(
                w,
                &[
                    1.479819860511658591e-01,
                    1.818357216161805012e-01,
                    2.857142874366239149e-01,
                    6.666666666666735130e-01,
                ],
            );
            let t2 = self.mul(z, t2);
            self.add(t2, t1)
        } else {
            let p24 = (1u64 << 24) as f64;
            let lg1 = 0xaaaaaa as f64 / p24;
            let lg2 = 0xccce13 as f64 / (2.0 * p24);
            let lg3 = 0x91e9ee as f64 / (2.0 * p24);
            let lg4 = 0xf89e26 as f64 / (4.0 * p24);
            let t1 = self.poly(w, &[lg4, lg2]);
            let t1 = self.mul(w, t1);
            let t2 = self.poly(w, &[lg3, lg1]);
            let t2 = self.mul(z, t2);
            self.add(t2, t1)
        };
        let (ln2_hi, ln2_lo) = if wide {
            (6.93147180369123816490e-01, 1.90821492927058770002e-10)
        } else {
            (6.9313812256e-01, 9.0580006145e-06)
        };
        let half = self.c(0.5);
        let hf = self.mul(half, f);
        let hfsq = self.mul(hf, f);
        // s (hfsq + R) + dk ln2_lo - hfsq + f + dk ln2_hi
        let a = self.add(hfsq, r);
        let a = self.mul(s, a);
        let lo = self.mulc(dk, ln2_lo);
        let a = self.add(a, lo);
        let a = self.sub(a, hfsq);
        let a = self.add(a, f);
        let hi = self.mulc(dk, ln2_hi);
        let y = self.add(a, hi);
        // Special values.
        let inf = self.c(f64::INFINITY);
        let is_zero = self.cmp(FloatCC::Equal, x, zero);
        let ninf = self.c(f64::NEG_INFINITY);
        let y = self.sel(is_zero, ninf, y);
        let is_inf = self.cmp(FloatCC::Equal, x, inf);
        let y = self.sel(is_inf, inf, y);
        let bad = self.cmp(FloatCC::UnorderedOrLessThan, x, zero);
        let nan = self.c(f64::NAN);
        self.sel(bad, nan, y)
    }

    /// `ln(1 + x)`.
    pub fn log1p(&mut self, x: Value) -> Value {
        let one = self.c(1.0);
        let u = self.add(one, x);
        let l = self.log(u);
        // The rounding error of u, corrected to first order.
        let um1 = self.sub(u, one);
        let err = self.sub(x, um1);
        let c = self.div(err, u);
        let y = self.add(l, c);
        let exact = self.cmp(FloatCC::Equal, u, one);
        let y = self.sel(exact, x, y);
        let zero = self.c(0.0);
        let at_m1 = self.cmp(FloatCC::Equal, u, zero);
        let ninf = self.c(f64::NEG_INFINITY);
        let y = self.sel(at_m1, ninf, y);
        let inf = self.c(f64::INFINITY);
        let is_inf = self.cmp(FloatCC::Equal, x, inf);
        self.sel(is_inf, inf, y)
    }

    /// `e^u - 1` for f32 `u` in `[0, 20]` (or NaN), accurate where it is
    /// small: `u = k ln2 + r` with `|r| <= ln2 / 2`, `e^r - 1` by its
    /// Taylor series to `r^8` (the first term left out is below 0.2 ulp),
    /// and `2^k (e^r - 1) + (2^k - 1)`, where `2^k` times anything is exact
    /// and `2^k - 1` is exact for `k <= 24`: one rounding.
    fn expm1_f32_nonneg(&mut self, u: Value) -> Value {
        let (kf, ki) = self.round_split(u, std::f64::consts::LOG2_E);
        let r = self.madc(kf, -k::LN2_HI_F32, u);
        let r = self.madc(kf, -k::LN2_LO_F32, r);
        let q = self.poly(r, &k::EXPM1_F32_P);
        let r2 = self.mul(r, r);
        let p = self.mad(r2, q, r);
        let s = self.pow2i(ki);
        let s1 = self.addc(s, -1.0);
        self.mad(s, p, s1)
    }

    /// Hyperbolic tangent (f64; f32 is [`Self::tanh_f32`]): a rational
    /// function below 0.625, `1 - 2 / (e^2|x| + 1)` above.
    pub fn tanh(&mut self, x: Value) -> Value {
        if !self.t.wide {
            return self.tanh_f32(x);
        }
        let ax = self.b.ins().fabs(x);
        let z = self.mul(x, x);
        let small = {
            let p = self.poly(
                z,
                &[
                    -9.64399179425052238628E-1,
                    -9.92877231001918586564E1,
                    -1.61468768441708447952E3,
                ],
            );
            let q = self.poly(
                z,
                &[
                    1.0,
                    1.12811678491632931402E2,
                    2.23548839060100448583E3,
                    4.84406305325125486048E3,
                ],
            );
            let xz = self.mul(x, z);
            let r = self.div(p, q);
            let r = self.mul(xz, r);
            self.add(x, r)
        };
        let two_ax = self.add(ax, ax);
        let e = self.exp_of(two_ax, false, true);
        let e1 = self.addc(e, 1.0);
        let two = self.c(2.0);
        let q = self.div(two, e1);
        let one = self.c(1.0);
        let large = self.sub(one, q);
        let lim = self.c(0.625);
        let is_small = self.cmp(FloatCC::LessThan, ax, lim);
        // Both branches have the sign of x (also for ±0).
        let y = self.sel(is_small, small, large);
        self.copysign(y, x)
    }

    /// f32 `tanh(x) = E / (E + 2)` with `E = e^(2|x|) - 1`, and the sign of
    /// `x`. One exponential-like sequence and one division, where the
    /// two-branch form (a polynomial below 0.625, `1 - 2 / (e^2|x| + 1)`
    /// above, and a select) computes both branches in every lane. On the
    /// non-negative side the quotient does not amplify `E`'s error
    /// (`d log t / d log E = 2 / (E + 2) <= 1`). `2|x|` is clamped to 20,
    /// where `tanh` is 1 in f32, so `E` stays finite; NaN passes.
    ///
    /// The price is the rounding of `E + 2`: over 4M f32 evenly spread in
    /// bits on (0, 10), 92.3% of results are correctly rounded, 7.6% are 1
    /// ulp off and 0.06% 2 ulp (at |x| < 0.5); the two-branch form had
    /// 99.7% and at most 1 ulp. Measured gain: the map benchmark's kernel
    /// (`tanh(2x+1) * sigmoid(x) - x/3`), 10% on one thread. Correcting
    /// the two roundings (the error of `E + 2` by Fast2Sum, the quotient's
    /// by a fused multiply-add, eight operations) gave 97.6% correctly
    /// rounded but made that kernel 20% slower, more than the gain.
    fn tanh_f32(&mut self, x: Value) -> Value {
        let ax = self.b.ins().fabs(x);
        let u = self.add(ax, ax);
        let u = self.clamp(u, None, Some(k::TANH_F32_CLAMP));
        let e = self.expm1_f32_nonneg(u);
        let d = self.addc(e, 2.0);
        let t = self.div(e, d);
        self.copysign(t, x)
    }

    /// `1 / (1 + e^-x)`.
    pub fn sigmoid(&mut self, x: Value) -> Value {
        // -|x| by setting the sign bit.
        let sm = self.sign_mask();
        let nax = self.b.ins().bor(x, sm);
        let e = self.exp_of(nax, true, false);
        let d = self.addc(e, 1.0);
        // 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below: one division.
        let one = self.c(1.0);
        let zero = self.c(0.0);
        let pos = self.cmp(FloatCC::GreaterThanOrEqual, x, zero);
        let num = self.sel(pos, one, e);
        self.div(num, d)
    }
}
