//! 256-bit routines for the costly element-wise functions of kernels.
//!
//! Cranelift's x86-64 back end emits vectors of 128 bits at most: four f32
//! lanes where the hosts we run on have eight (AVX2). A kernel whose body
//! is dominated by `tanh`, `sigmoid` or `exp` is bound by that width, so
//! on hosts with AVX2 and FMA a kernel's innermost loop runs in chunks
//! (see `emit::Chunked`): Cranelift code computes each function's
//! argument for a chunk into a scratch buffer, one of the routines here
//! maps the buffer eight (f32) or four (f64) lanes at a time, and the
//! Cranelift code goes on from the result.
//!
//! Every routine is the same algorithm, operation for operation and with
//! the same constants and fused multiply-adds, as the 128-bit code in
//! `math.rs` (with FMA), so both give the same bits: a kernel's result
//! does not depend on whether it ran in chunks. The tests compare them
//! bit for bit over millions of inputs, which also carries `math.rs`'s
//! accuracy tests against libm over to these routines.

use crate::codegen::kernel::{KDType, UnaryOp};

/// A routine: `dst[i] = f(src[i])` for `i < n`. `src` and `dst` may be
/// the same buffer.
pub(crate) type Routine = unsafe extern "C" fn(src: *const u8, dst: *mut u8, n: usize);

/// Whether this host runs the routines (AVX2 and FMA).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The routine for `op` on `dtype`, with its symbol, where there is one
/// and the host can run it.
pub(crate) fn routine(op: UnaryOp, dtype: KDType) -> Option<(&'static str, Routine)> {
    if !available() {
        return None;
    }
    imp::routine(op, dtype)
}

/// Every routine this host has, for registering their symbols.
pub(crate) fn all() -> Vec<(&'static str, Routine)> {
    let mut v = Vec::new();
    for &op in UnaryOp::all() {
        for dtype in [KDType::F32, KDType::F64] {
            if let Some(r) = routine(op, dtype) {
                v.push(r);
            }
        }
    }
    v
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::Routine;
    use crate::codegen::kernel::{KDType, UnaryOp};
    pub(super) fn routine(_: UnaryOp, _: KDType) -> Option<(&'static str, Routine)> {
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::Routine;
    use crate::codegen::cpu::math::k;
    use crate::codegen::kernel::{KDType, UnaryOp};

    pub(super) fn routine(op: UnaryOp, dtype: KDType) -> Option<(&'static str, Routine)> {
        Some(match (op, dtype) {
            (UnaryOp::Exp, KDType::F32) => ("adjoint_avx2_exp_f32", exp_f32 as Routine),
            (UnaryOp::Tanh, KDType::F32) => ("adjoint_avx2_tanh_f32", tanh_f32 as Routine),
            (UnaryOp::Sigmoid, KDType::F32) => ("adjoint_avx2_sigmoid_f32", sigmoid_f32 as Routine),
            (UnaryOp::Exp, KDType::F64) => ("adjoint_avx2_exp_f64", exp_f64 as Routine),
            (UnaryOp::Sigmoid, KDType::F64) => ("adjoint_avx2_sigmoid_f64", sigmoid_f64 as Routine),
            _ => return None,
        })
    }

    /// A vector of eight f32 or four f64, with the operations the
    /// algorithms use. Each method is one instruction (or a constant).
    trait V: Copy {
        /// The companion integer vector.
        type I: Copy;
        const LANES: usize;
        /// Element size in bytes.
        const BYTES: usize;
        unsafe fn c(v: f64) -> Self;
        unsafe fn load(p: *const u8) -> Self;
        unsafe fn store(self, p: *mut u8);
        unsafe fn add(self, b: Self) -> Self;
        unsafe fn sub(self, b: Self) -> Self;
        unsafe fn mul(self, b: Self) -> Self;
        unsafe fn div(self, b: Self) -> Self;
        /// `self * b + c`, fused.
        unsafe fn fma(self, b: Self, c: Self) -> Self;
        /// `x86 minps`: `self < b ? self : b`.
        unsafe fn pmin(self, b: Self) -> Self;
        /// `x86 maxps`: `self > b ? self : b`.
        unsafe fn pmax(self, b: Self) -> Self;
        unsafe fn and(self, b: Self) -> Self;
        unsafe fn or(self, b: Self) -> Self;
        /// All ones where `self >= b` (ordered), else zero.
        unsafe fn ge(self, b: Self) -> Self;
        /// `b` where `m` is all ones, else `self`.
        unsafe fn blend(self, b: Self, m: Self) -> Self;
        unsafe fn bits(self) -> Self::I;
        unsafe fn from_bits(i: Self::I) -> Self;
        unsafe fn ci(v: i64) -> Self::I;
        unsafe fn isub(a: Self::I, b: Self::I) -> Self::I;
        /// Arithmetic shift right by one.
        unsafe fn sar1(a: Self::I) -> Self::I;
        /// `2^k` for `k` in the normal exponent range.
        unsafe fn pow2i(k: Self::I) -> Self;
        /// Whether any lane of `k` is outside `[lo, hi]`.
        unsafe fn any_outside(k: Self::I, lo: i64, hi: i64) -> bool;
    }

    /// `V`'s two-operand methods, each one intrinsic.
    macro_rules! binary {
        ($t:ident; $($name:ident => $intr:path),* $(,)?) => {
            $(
                #[inline(always)]
                unsafe fn $name(self, b: Self) -> Self {
                    $t($intr(self.0, b.0))
                }
            )*
        };
    }

    #[derive(Clone, Copy)]
    struct F32x8(__m256);
    #[derive(Clone, Copy)]
    struct F64x4(__m256d);

    impl V for F32x8 {
        type I = __m256i;
        const LANES: usize = 8;
        const BYTES: usize = 4;
        #[inline(always)]
        unsafe fn c(v: f64) -> Self {
            F32x8(_mm256_set1_ps(v as f32))
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            F32x8(_mm256_loadu_ps(p as *const f32))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            _mm256_storeu_ps(p as *mut f32, self.0)
        }
        binary! {
            F32x8;
            add => _mm256_add_ps,
            sub => _mm256_sub_ps,
            mul => _mm256_mul_ps,
            div => _mm256_div_ps,
            pmin => _mm256_min_ps,
            pmax => _mm256_max_ps,
            and => _mm256_and_ps,
            or => _mm256_or_ps,
            ge => _mm256_cmp_ps::<_CMP_GE_OQ>,
        }
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            F32x8(_mm256_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn blend(self, b: Self, m: Self) -> Self {
            F32x8(_mm256_blendv_ps(self.0, b.0, m.0))
        }
        #[inline(always)]
        unsafe fn bits(self) -> __m256i {
            _mm256_castps_si256(self.0)
        }
        #[inline(always)]
        unsafe fn from_bits(i: __m256i) -> Self {
            F32x8(_mm256_castsi256_ps(i))
        }
        #[inline(always)]
        unsafe fn ci(v: i64) -> __m256i {
            _mm256_set1_epi32(v as i32)
        }
        #[inline(always)]
        unsafe fn isub(a: __m256i, b: __m256i) -> __m256i {
            _mm256_sub_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn sar1(a: __m256i) -> __m256i {
            _mm256_srai_epi32::<1>(a)
        }
        #[inline(always)]
        unsafe fn pow2i(k: __m256i) -> Self {
            let e = _mm256_add_epi32(k, _mm256_set1_epi32(127));
            F32x8(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
        }
        #[inline(always)]
        unsafe fn any_outside(k: __m256i, lo: i64, hi: i64) -> bool {
            let below = _mm256_cmpgt_epi32(_mm256_set1_epi32(lo as i32), k);
            let above = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(hi as i32));
            let out = _mm256_or_si256(below, above);
            _mm256_testz_si256(out, out) == 0
        }
    }

    impl V for F64x4 {
        type I = __m256i;
        const LANES: usize = 4;
        const BYTES: usize = 8;
        #[inline(always)]
        unsafe fn c(v: f64) -> Self {
            F64x4(_mm256_set1_pd(v))
        }
        #[inline(always)]
        unsafe fn load(p: *const u8) -> Self {
            F64x4(_mm256_loadu_pd(p as *const f64))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut u8) {
            _mm256_storeu_pd(p as *mut f64, self.0)
        }
        binary! {
            F64x4;
            add => _mm256_add_pd,
            sub => _mm256_sub_pd,
            mul => _mm256_mul_pd,
            div => _mm256_div_pd,
            pmin => _mm256_min_pd,
            pmax => _mm256_max_pd,
            and => _mm256_and_pd,
            or => _mm256_or_pd,
            ge => _mm256_cmp_pd::<_CMP_GE_OQ>,
        }
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            F64x4(_mm256_fmadd_pd(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn blend(self, b: Self, m: Self) -> Self {
            F64x4(_mm256_blendv_pd(self.0, b.0, m.0))
        }
        #[inline(always)]
        unsafe fn bits(self) -> __m256i {
            _mm256_castpd_si256(self.0)
        }
        #[inline(always)]
        unsafe fn from_bits(i: __m256i) -> Self {
            F64x4(_mm256_castsi256_pd(i))
        }
        #[inline(always)]
        unsafe fn ci(v: i64) -> __m256i {
            _mm256_set1_epi64x(v)
        }
        #[inline(always)]
        unsafe fn isub(a: __m256i, b: __m256i) -> __m256i {
            _mm256_sub_epi64(a, b)
        }
        #[inline(always)]
        unsafe fn sar1(a: __m256i) -> __m256i {
            // AVX2 has no 64-bit arithmetic shift: a logical one with the
            // sign bit put back.
            let l = _mm256_srli_epi64::<1>(a);
            let sign = _mm256_and_si256(a, _mm256_set1_epi64x(i64::MIN));
            _mm256_or_si256(l, sign)
        }
        #[inline(always)]
        unsafe fn pow2i(k: __m256i) -> Self {
            let e = _mm256_add_epi64(k, _mm256_set1_epi64x(1023));
            F64x4(_mm256_castsi256_pd(_mm256_slli_epi64::<52>(e)))
        }
        #[inline(always)]
        unsafe fn any_outside(k: __m256i, lo: i64, hi: i64) -> bool {
            let below = _mm256_cmpgt_epi64(_mm256_set1_epi64x(lo), k);
            let above = _mm256_cmpgt_epi64(k, _mm256_set1_epi64x(hi));
            let out = _mm256_or_si256(below, above);
            _mm256_testz_si256(out, out) == 0
        }
    }

    /// Whether `V` is f64.
    #[inline(always)]
    fn is_f64<T: V>() -> bool {
        T::BYTES == 8
    }

    #[inline(always)]
    unsafe fn sign_mask<T: V>() -> T {
        if is_f64::<T>() {
            T::from_bits(T::ci(i64::MIN))
        } else {
            T::from_bits(T::ci(0x8000_0000))
        }
    }

    #[inline(always)]
    unsafe fn fabs<T: V>(x: T) -> T {
        let m = if is_f64::<T>() {
            T::from_bits(T::ci(i64::MAX))
        } else {
            T::from_bits(T::ci(0x7fff_ffff))
        };
        x.and(m)
    }

    /// `|mag|` with the sign of `sign`.
    #[inline(always)]
    unsafe fn copysign<T: V>(mag: T, sign: T) -> T {
        let s = sign.and(sign_mask::<T>());
        fabs(mag).or(s)
    }

    /// `math.rs`'s `poly`: Estrin's scheme, highest degree first.
    #[inline(always)]
    unsafe fn poly<T: V>(x: T, coeffs: &[f64]) -> T {
        let mut t = [x; 8];
        let mut n = 0;
        for pair in coeffs.rchunks(2) {
            t[n] = match *pair {
                [hi, lo] => x.fma(T::c(hi), T::c(lo)),
                [only] => T::c(only),
                _ => unreachable!("chunks of one or two"),
            };
            n += 1;
        }
        let mut power = x;
        while n > 1 {
            power = power.mul(power);
            let mut m = 0;
            let mut k = 0;
            while k < n {
                t[m] = if k + 1 < n {
                    t[k + 1].fma(power, t[k])
                } else {
                    t[k]
                };
                m += 1;
                k += 2;
            }
            n = m;
        }
        t[0]
    }

    /// `math.rs`'s `round_split`.
    #[inline(always)]
    unsafe fn round_split<T: V>(x: T, scale: f64) -> (T, T::I) {
        let s = T::c(if is_f64::<T>() {
            k::SHIFTER_F64
        } else {
            k::SHIFTER_F32
        });
        let t = x.fma(T::c(scale), s);
        let kf = t.sub(s);
        let ki = T::isub(t.bits(), s.bits());
        (kf, ki)
    }

    /// `math.rs`'s `scale2`: `y * 2^k`, in two products when some lane's
    /// `k` is outside the normal exponents.
    #[inline(always)]
    unsafe fn scale2<T: V>(y: T, k: T::I) -> T {
        let (lo, hi) = if is_f64::<T>() {
            (-1022, 1023)
        } else {
            (-126, 127)
        };
        if T::any_outside(k, lo, hi) {
            let k1 = T::sar1(k);
            let k2 = T::isub(k, k1);
            y.mul(T::pow2i(k1)).mul(T::pow2i(k2))
        } else {
            y.mul(T::pow2i(k))
        }
    }

    /// `math.rs`'s `exp_of`.
    #[inline(always)]
    unsafe fn exp_of<T: V>(x: T, lo: bool, hi: bool) -> T {
        const LOG2E: f64 = std::f64::consts::LOG2_E;
        let (min, max) = if is_f64::<T>() {
            k::EXP_F64_RANGE
        } else {
            k::EXP_F32_RANGE
        };
        let mut x = x;
        if hi {
            x = T::c(max).pmin(x);
        }
        if lo {
            x = T::c(min).pmax(x);
        }
        let (kf, ki) = round_split(x, LOG2E);
        if is_f64::<T>() {
            let hi = kf.fma(T::c(-k::LN2_HI_F64), x);
            let lo = kf.mul(T::c(k::LN2_LO_F64));
            let r = hi.sub(lo);
            let z = r.mul(r);
            let p = poly(z, &k::EXP_F64_P);
            let zp = z.mul(p);
            let c = r.sub(zp);
            let rc = r.mul(c);
            let d = T::c(2.0).sub(c);
            let q = rc.div(d);
            let t = lo.sub(q).sub(hi);
            let y = T::c(1.0).sub(t);
            scale2(y, ki)
        } else {
            let r = kf.fma(T::c(-k::LN2_HI_F32), x);
            let r = kf.fma(T::c(-k::LN2_LO_F32), r);
            let z = r.mul(r);
            let p = poly(r, &k::EXP_F32_P);
            let p = p.fma(z, r);
            let y = p.add(T::c(1.0));
            scale2(y, ki)
        }
    }

    /// `math.rs`'s `expm1_f32_nonneg`.
    #[inline(always)]
    unsafe fn expm1_f32_nonneg(u: F32x8) -> F32x8 {
        let (kf, ki) = round_split(u, std::f64::consts::LOG2_E);
        let r = kf.fma(F32x8::c(-k::LN2_HI_F32), u);
        let r = kf.fma(F32x8::c(-k::LN2_LO_F32), r);
        let q = poly(r, &k::EXPM1_F32_P);
        let r2 = r.mul(r);
        let p = r2.fma(q, r);
        let s = F32x8::pow2i(ki);
        let s1 = s.add(F32x8::c(-1.0));
        s.fma(p, s1)
    }

    /// `math.rs`'s `tanh_f32`.
    #[inline(always)]
    unsafe fn tanh_v(x: F32x8) -> F32x8 {
        let ax = fabs(x);
        let u = ax.add(ax);
        let u = F32x8::c(k::TANH_F32_CLAMP).pmin(u);
        let e = expm1_f32_nonneg(u);
        let d = e.add(F32x8::c(2.0));
        let t = e.div(d);
        copysign(t, x)
    }

    /// `math.rs`'s `sigmoid`.
    #[inline(always)]
    unsafe fn sigmoid_v<T: V>(x: T) -> T {
        let nax = x.or(sign_mask::<T>());
        let e = exp_of(nax, true, false);
        let d = e.add(T::c(1.0));
        let pos = x.ge(T::c(0.0));
        let num = e.blend(T::c(1.0), pos);
        num.div(d)
    }

    /// `dst[i] = f(src[i])`, a vector at a time; the last partial vector
    /// through a zero-padded copy.
    #[inline(always)]
    unsafe fn map<T: V>(src: *const u8, dst: *mut u8, n: usize, f: impl Fn(T) -> T) {
        let step = T::LANES * T::BYTES;
        let full = n / T::LANES;
        for i in 0..full {
            let o = i * step;
            f(T::load(src.add(o))).store(dst.add(o));
        }
        let rest = n - full * T::LANES;
        if rest > 0 {
            let o = full * step;
            let mut buf = [0u8; 32];
            std::ptr::copy_nonoverlapping(src.add(o), buf.as_mut_ptr(), rest * T::BYTES);
            f(T::load(buf.as_ptr())).store(buf.as_mut_ptr());
            std::ptr::copy_nonoverlapping(buf.as_ptr(), dst.add(o), rest * T::BYTES);
        }
    }

    macro_rules! routines {
        ($($name:ident: $t:ident => $f:expr;)*) => {$(
            /// # Safety
            /// `src` and `dst` hold `n` elements; the host has AVX2 and FMA.
            #[target_feature(enable = "avx2,fma")]
            unsafe extern "C" fn $name(src: *const u8, dst: *mut u8, n: usize) {
                map::<$t>(src, dst, n, $f)
            }
        )*};
    }

    routines! {
        exp_f32: F32x8 => |x| exp_of(x, true, true);
        tanh_f32: F32x8 => |x| tanh_v(x);
        sigmoid_f32: F32x8 => |x| sigmoid_v(x);
        exp_f64: F64x4 => |x| exp_of(x, true, true);
        sigmoid_f64: F64x4 => |x| sigmoid_v(x);
    }
}
