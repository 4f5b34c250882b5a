//! Scalar arithmetic per element type, so that each element-wise kernel is
//! written once and instantiated for every dtype.
//!
//! Integer arithmetic wraps on overflow (never panics); the kernels check
//! division by zero and negative integer exponents before calling these.

use crate::tensor::Element;

/// Arithmetic shared by every numeric dtype.
pub trait Num: Element {
    /// 0.
    fn zero() -> Self;
    /// 1.
    fn one() -> Self;
    /// `self + o` (ints wrap).
    fn add(self, o: Self) -> Self;
    /// `self - o` (ints wrap).
    fn sub(self, o: Self) -> Self;
    /// `self * o` (ints wrap).
    fn mul(self, o: Self) -> Self;
    /// Division; ints truncate toward zero (the divisor is nonzero).
    fn div(self, o: Self) -> Self;
    /// Remainder with the dividend's sign (the divisor of ints is nonzero).
    fn rem(self, o: Self) -> Self;
    /// Power; for ints the exponent is non-negative.
    fn pow(self, o: Self) -> Self;
    /// The larger; NaN wins.
    fn maximum(self, o: Self) -> Self;
    /// The smaller; NaN wins.
    fn minimum(self, o: Self) -> Self;
    /// `-self` (ints wrap).
    fn neg(self) -> Self;
    /// `|self|` (ints wrap).
    fn abs(self) -> Self;
    /// -1, 0 or 1 (NaN stays NaN, -0.0 stays -0.0).
    fn sign(self) -> Self;
    /// `max(x, 0)`; NaN stays NaN.
    fn relu(self) -> Self;
    /// Rounds down (identity for ints).
    fn floor(self) -> Self;
    /// Rounds up (identity for ints).
    fn ceil(self) -> Self;
    /// Whether the value is negative (for the int `pow` check).
    fn is_negative(self) -> bool;
}

/// Functions of float dtypes only.
pub trait Float: Num + crate::math::MathFloat {
    /// `e^x`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// `ln(1 + x)`, accurate near 0.
    fn ln_1p(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// `1 / (1 + e^-x)`, computed without overflow.
    fn sigmoid(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// `1 / sqrt(x)`.
    fn rsqrt(self) -> Self;
    /// `ln |Γ(x)|` (from `libm`).
    fn lgamma(self) -> Self;
    /// The error function (from `libm`).
    fn erf(self) -> Self;
    /// The digamma function `ψ(x) = d/dx ln Γ(x)` (computed in f64).
    fn digamma(self) -> Self;
    /// The trigamma function `ψ'(x)` (computed in f64).
    fn trigamma(self) -> Self;
}

/// `ψ'(x)` in f64: the reflection formula `ψ'(1 - x) + ψ'(x) = π² / sin²(πx)`
/// below 0.5, the recurrence `ψ'(x) = ψ'(x + 1) + 1/x²` up to 10, then the
/// asymptotic series. Poles (x = 0, -1, ..) give `inf`.
pub fn trigamma_f64(x: f64) -> f64 {
    use std::f64::consts::PI;
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x == f64::INFINITY {
        return 0.0;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::INFINITY;
    }
    if x < 0.5 {
        let s = (PI * x).sin();
        return PI * PI / (s * s) - trigamma_f64(1.0 - x);
    }
    let mut x = x;
    let mut acc = 0.0;
    while x < 10.0 {
        acc += 1.0 / (x * x);
        x += 1.0;
    }
    // 1/x + 1/(2x²) + Σ B_2k / x^(2k+1)
    let f = 1.0 / (x * x);
    let series = 1.0 / x
        + f / 2.0
        + (1.0 / x)
            * f
            * (1.0 / 6.0
                - f * (1.0 / 30.0
                    - f * (1.0 / 42.0
                        - f * (1.0 / 30.0
                            - f * (5.0 / 66.0 - f * (691.0 / 2730.0 - f * 7.0 / 6.0))))));
    acc + series
}

/// `ψ(x)` in f64: the reflection formula below 0.5, the recurrence
/// `ψ(x) = ψ(x + 1) - 1/x` up to 10, then the asymptotic series (its
/// truncation error is below 1e-17 there). Poles: `ψ(0) = -inf`, NaN at negative integers.
pub fn digamma_f64(x: f64) -> f64 {
    use std::f64::consts::PI;
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x == f64::INFINITY {
        return f64::INFINITY;
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        };
    }
    if x < 0.0 && x == x.floor() {
        return f64::NAN;
    }
    if x < 0.5 {
        // ψ(x) = ψ(1 - x) - π / tan(πx); 1 - x >= 0.5, so no recursion loop.
        return digamma_f64(1.0 - x) - PI / (PI * x).tan();
    }
    let mut x = x;
    let mut acc = 0.0;
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    // ln x - 1/(2x) - Σ B_2k / (2k x^2k)
    let f = 1.0 / (x * x);
    let series = f
        * (1.0 / 12.0
            - f * (1.0 / 120.0
                - f * (1.0 / 252.0
                    - f * (1.0 / 240.0
                        - f * (1.0 / 132.0
                            - f * (691.0 / 32760.0 - f * (1.0 / 12.0 - f * (3617.0 / 8160.0))))))));
    acc + x.ln() - 0.5 / x - series
}

/// The largest order [`Polygamma`] computes: beyond it the coefficients
/// of the reflection formula overflow f64 (and `ψ⁽ⁿ⁾(x)` itself overflows
/// for every `x` below about `n / e`).
pub const POLYGAMMA_MAX_ORDER: u32 = 100;

/// The Bernoulli numbers B_2, B_4, .., B_40.
const BERNOULLI: [f64; 20] = [
    1.0 / 6.0,
    -1.0 / 30.0,
    1.0 / 42.0,
    -1.0 / 30.0,
    5.0 / 66.0,
    -691.0 / 2730.0,
    7.0 / 6.0,
    -3617.0 / 510.0,
    43867.0 / 798.0,
    -174611.0 / 330.0,
    854513.0 / 138.0,
    -236364091.0 / 2730.0,
    8553103.0 / 6.0,
    -23749461029.0 / 870.0,
    8615841276005.0 / 14322.0,
    -7709321041217.0 / 510.0,
    2577687858367.0 / 6.0,
    -26315271553053477373.0 / 1919190.0,
    2929993913841559.0 / 6.0,
    -261082718496449122051.0 / 13530.0,
];

/// The polygamma function `ψ⁽ⁿ⁾(x) = dⁿ/dxⁿ ψ(x)` of one order `n`, in f64,
/// with what depends on `n` alone computed once (a kernel applies one order
/// to a whole tensor).
///
/// Order 0 is [`digamma_f64`] and order 1 [`trigamma_f64`]. For `n >= 1`
/// and `x > 0`, `ψ⁽ⁿ⁾(x) = (-1)^(n+1) n! ζ(n + 1, x)` with the Hurwitz zeta
/// function summed directly, `Σ 1/(x + k)^(n+1)`, while `x + k` is below
/// `10 + n/2` (the recurrence `ψ⁽ⁿ⁾(x) = ψ⁽ⁿ⁾(x + 1) - (-1)ⁿ n!/x^(n+1)`),
/// stopping early once the rest is negligible, and the tail by the
/// Euler–Maclaurin (asymptotic) series with Bernoulli numbers. The sums are
/// scaled by `x^(n+1)` so that no intermediate value overflows. For
/// `x < 0`, the reflection formula
/// `ψ⁽ⁿ⁾(x) = (-1)ⁿ ψ⁽ⁿ⁾(1 - x) - π dⁿ/dxⁿ cot(πx)`, with the derivatives
/// of `cot` as polynomials in `cot`. At the poles (`x = 0, -1, -2, ..`) the
/// result is `(-1)^(n+1) ∞`, as in SciPy.
#[derive(Clone, Debug)]
pub struct Polygamma {
    n: u32,
    /// `B_2j (n + 1)(n + 2)..(n + 2j - 1) / (2j)!` for `j = 1..=20`: the
    /// coefficients of the Euler–Maclaurin series, without the powers of `x`.
    series: Vec<f64>,
    /// `P` with `dⁿ/dyⁿ cot(y) = P(cot y)`, coefficients lowest first.
    cot: Vec<f64>,
    /// The direct sum runs while `x + k` is below this.
    shift_to: f64,
}

impl Polygamma {
    /// The function of order `n` (at most [`POLYGAMMA_MAX_ORDER`]).
    pub fn new(n: u32) -> Polygamma {
        assert!(n <= POLYGAMMA_MAX_ORDER, "polygamma order {n} is too large");
        let nf = n as f64;
        let mut series = Vec::with_capacity(BERNOULLI.len());
        // rising = (n + 1)..(n + 2j - 1), fact = (2j)!
        let mut rising = 1.0;
        let mut fact = 1.0;
        for (j, b) in BERNOULLI.iter().enumerate() {
            let j = (j + 1) as f64;
            if j > 1.0 {
                rising *= (nf + 2.0 * j - 2.0) * (nf + 2.0 * j - 1.0);
            } else {
                rising = nf + 1.0;
            }
            fact *= (2.0 * j - 1.0) * (2.0 * j);
            series.push(b * rising / fact);
        }
        // P_0(c) = c; P_{k+1}(c) = -(1 + c²) P_k'(c).
        let mut cot = vec![0.0, 1.0];
        for _ in 0..n {
            let mut next = vec![0.0; cot.len() + 1];
            for (i, a) in cot.iter().enumerate().skip(1) {
                let d = -(i as f64) * a;
                next[i - 1] += d;
                next[i + 1] += d;
            }
            cot = next;
        }
        Polygamma {
            n,
            series,
            cot,
            shift_to: 10.0 + nf / 2.0,
        }
    }

    /// `ψ⁽ⁿ⁾(x)`.
    pub fn eval(&self, x: f64) -> f64 {
        match self.n {
            0 => digamma_f64(x),
            1 => trigamma_f64(x),
            _ => self.general(x),
        }
    }

    /// `(-1)^(n+1)`.
    fn sign(&self) -> f64 {
        if !self.n.is_multiple_of(2) {
            1.0
        } else {
            -1.0
        }
    }

    /// `ψ⁽ⁿ⁾(x)` for `n >= 1` without the special cases of orders 0 and 1.
    fn general(&self, x: f64) -> f64 {
        use std::f64::consts::PI;
        debug_assert!(self.n >= 1);
        if x.is_nan() || x == f64::NEG_INFINITY {
            return f64::NAN;
        }
        if x == f64::INFINITY {
            return 0.0;
        }
        if x <= 0.0 && x == x.floor() {
            return self.sign() * f64::INFINITY;
        }
        if x < 0.0 {
            // cot has period π: reduce first, so that πx loses nothing; near
            // r = ±1/2 use cot(πr) = ±tan(π(1/2 - |r|)), exactly 0 there.
            let r = x - x.round();
            let c = if r.abs() < 0.25 {
                1.0 / (PI * r).tan()
            } else {
                r.signum() * (PI * (0.5 - r.abs())).tan()
            };
            let p = self.cot.iter().rev().fold(0.0, |acc, a| acc * c + a);
            let reflected = self.general(1.0 - x);
            let even = self.n.is_multiple_of(2);
            let pi_pow = PI.powi(self.n as i32 + 1);
            return if even { reflected } else { -reflected } - pi_pow * p;
        }
        let s = self.n as i32 + 1;
        let nf = self.n as f64;
        // z = x^s ζ(s, x), summed directly while x + k < shift_to.
        let mut z = 0.0;
        let mut a = x;
        let mut done = false;
        while a < self.shift_to {
            let term = (x / a).powi(s);
            z += term;
            // The rest is at most ∫ (x/(a + t))^s dt = term · a / n.
            if term * a / nf < 1e-17 * z {
                done = true;
                break;
            }
            a += 1.0;
        }
        if !done {
            // Σ_{k≥0} (a + k)^-s ≈ a^(1-s)/(s-1) + a^-s/2
            //     + Σ_j B_2j/(2j)! s(s+1)..(s+2j-2) a^(1-s-2j), times x^s.
            let f = 1.0 / (a * a);
            let mut tail = a / nf + 0.5;
            let mut pow = a;
            for c in &self.series {
                pow *= f;
                let t = c * pow;
                tail += t;
                if t.abs() < 1e-17 * tail.abs() {
                    break;
                }
            }
            z += (x / a).powi(s) * tail;
        }
        // n!/x^n, as a product that neither overflows nor underflows early.
        let mut scale = 1.0;
        for i in 1..=self.n {
            scale *= i as f64 / x;
        }
        self.sign() * scale * (z / x)
    }
}

macro_rules! float_num {
    ($t:ty, $lgamma:path, $erf:path) => {
        impl Num for $t {
            fn zero() -> Self {
                0.0
            }
            fn one() -> Self {
                1.0
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn rem(self, o: Self) -> Self {
                self % o
            }
            fn pow(self, o: Self) -> Self {
                // The common squares (and the `x ** 1` of their
                // derivative) exactly as a correctly rounded `pow` gives
                // them (special values included: NaN, ±0, ±inf), without a
                // library call; compiled kernels do the same in vector
                // code (`codegen::kernel::KernelSpec::canonical`).
                if o == 2.0 {
                    self * self
                } else if o == 1.0 {
                    self
                } else {
                    self.powf(o)
                }
            }
            fn maximum(self, o: Self) -> Self {
                if self.is_nan() || self >= o {
                    self
                } else {
                    o
                }
            }
            fn minimum(self, o: Self) -> Self {
                if self.is_nan() || self <= o {
                    self
                } else {
                    o
                }
            }
            fn neg(self) -> Self {
                -self
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn sign(self) -> Self {
                if self > 0.0 {
                    1.0
                } else if self < 0.0 {
                    -1.0
                } else {
                    self
                }
            }
            fn relu(self) -> Self {
                if self > 0.0 || self.is_nan() {
                    self
                } else {
                    0.0
                }
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            fn is_negative(self) -> bool {
                self < 0.0
            }
        }

        impl Float for $t {
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn sigmoid(self) -> Self {
                // Stable on both sides: never exp of a large positive number.
                if self >= 0.0 {
                    1.0 / (1.0 + (-self).exp())
                } else {
                    let e = self.exp();
                    e / (1.0 + e)
                }
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn rsqrt(self) -> Self {
                1.0 / <$t>::sqrt(self)
            }
            fn lgamma(self) -> Self {
                $lgamma(self)
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn digamma(self) -> Self {
                digamma_f64(self as f64) as $t
            }
            fn trigamma(self) -> Self {
                trigamma_f64(self as f64) as $t
            }
        }
    };
}

float_num!(f32, libm::lgammaf, libm::erff);
float_num!(f64, libm::lgamma, libm::erf);

macro_rules! int_num {
    ($t:ty, $abs:expr, $sign:expr, $neg:expr) => {
        impl Num for $t {
            fn zero() -> Self {
                0
            }
            fn one() -> Self {
                1
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn div(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_div(o)
                }
            }
            fn rem(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_rem(o)
                }
            }
            fn pow(self, o: Self) -> Self {
                // Exponentiation by squaring with wrapping multiplication.
                let mut e = o.to_i64().max(0) as u64;
                let mut base = self;
                let mut acc: $t = 1;
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
            fn maximum(self, o: Self) -> Self {
                if self >= o {
                    self
                } else {
                    o
                }
            }
            fn minimum(self, o: Self) -> Self {
                if self <= o {
                    self
                } else {
                    o
                }
            }
            fn neg(self) -> Self {
                ($neg)(self)
            }
            fn abs(self) -> Self {
                ($abs)(self)
            }
            fn sign(self) -> Self {
                ($sign)(self)
            }
            fn relu(self) -> Self {
                if self > 0 {
                    self
                } else {
                    0
                }
            }
            fn floor(self) -> Self {
                self
            }
            fn ceil(self) -> Self {
                self
            }
            #[allow(unused_comparisons)]
            fn is_negative(self) -> bool {
                self < 0
            }
        }
    };
}

int_num!(i32, i32::wrapping_abs, i32::signum, i32::wrapping_neg);
int_num!(i64, i64::wrapping_abs, i64::signum, i64::wrapping_neg);
int_num!(u8, |x: u8| x, |x: u8| (x > 0) as u8, u8::wrapping_neg);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_wrap_and_truncate() {
        assert_eq!(Num::div(-7i64, 2), -3);
        assert_eq!(Num::rem(-7i64, 2), -1);
        assert_eq!(Num::rem(7i64, -2), 1);
        assert_eq!(Num::add(i64::MAX, 1), i64::MIN);
        assert_eq!(Num::div(i64::MIN, -1), i64::MIN);
        assert_eq!(Num::pow(3i64, 4), 81);
        assert_eq!(Num::pow(2i32, 0), 1);
        assert_eq!(Num::neg(1u8), 255);
        assert_eq!(Num::sign(-5i32), -1);
    }

    #[test]
    fn floats() {
        assert_eq!(Num::sign(0.0f64), 0.0);
        assert!(Num::sign(f64::NAN).is_nan());
        assert!(Num::maximum(f64::NAN, 1.0).is_nan());
        assert!(Num::maximum(1.0, f64::NAN).is_nan());
        assert_eq!(Num::relu(-2.0f32), 0.0);
        assert!((Float::sigmoid(0.0f64) - 0.5).abs() < 1e-15);
        assert!(Float::sigmoid(-1000.0f64) >= 0.0);
        assert_eq!(Float::sigmoid(1000.0f32), 1.0);
        assert!((Float::lgamma(5.0f64) - 24f64.ln()).abs() < 1e-12);
        assert!((Float::erf(0.5f64) - 0.520_499_877_813_046_5).abs() < 1e-12);
        assert!((Float::erf(0.5f32) - 0.520_499_9).abs() < 1e-6);
    }

    #[test]
    fn trigamma() {
        // Reference values: SciPy polygamma(1, x).
        for (x, want) in [
            (0.7f64, 2.8340491566946113),
            (1.0, 1.6449340668482264),
            (2.5, 0.4903577561002349),
            (12.0, 0.0869018728717684),
            (-0.5, 8.934802200544705),
        ] {
            let got = Float::trigamma(x);
            assert!(
                (got - want).abs() < 1e-12 * want.abs().max(1.0),
                "trigamma({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn polygamma_closed_forms() {
        use std::f64::consts::PI;
        // ψ⁽ⁿ⁾(1) = (-1)^(n+1) n! ζ(n + 1).
        let zeta3 = 1.2020569031595942;
        for (n, want) in [
            (1, PI * PI / 6.0),
            (2, -2.0 * zeta3),
            (2, -2.4041138063191885),
            (3, PI.powi(4) / 15.0),
        ] {
            let got = Polygamma::new(n).eval(1.0);
            assert!(
                (got - want).abs() < 1e-14 * want.abs(),
                "ψ({n})(1) = {got}, want {want}"
            );
        }
        // ψ⁽ⁿ⁾(1/2) = (-1)^(n+1) n! (2^(n+1) - 1) ζ(n + 1).
        let got = Polygamma::new(2).eval(0.5);
        assert!((got - -14.0 * zeta3).abs() < 1e-13 * 14.0 * zeta3);
        // Order 0 and 1 are digamma and trigamma.
        for x in [0.3, 1.0, 7.5, -2.5] {
            assert_eq!(Polygamma::new(0).eval(x), digamma_f64(x));
            assert_eq!(Polygamma::new(1).eval(x), trigamma_f64(x));
        }
    }

    #[test]
    fn polygamma_values() {
        // Reference values: mpmath.polygamma(n, x) at 40 digits.
        let cases: &[(u32, f64, f64)] = &[
            (2, 0.5, -1.682879664423432e+1),
            (2, 1.0, -2.4041138063191885),
            (2, 2.5, -2.362040516417274e-1),
            (2, 10.0, -0.011049834970802067),
            (2, 100.0, -1.0100499983335e-4),
            (2, 0.001, -2000000002.3976324),
            (2, 0.1, -2.001861457378344e+3),
            (2, 30.0, -0.0011487652037286),
            (2, 1e4, -1.000100005e-8),
            (2, 3.3, -0.1237511852649427),
            (2, -0.5, -8.2879664423432e-1),
            (2, -2.3, 68.71379252927017),
            (2, -7.7, -68.8523609916503),
            (2, -0.01, 1999997.5296818328),
            (3, 0.5, 97.40909103400244),
            (3, 1.0, 6.493939402266829),
            (3, 2.5, 0.22390584881725206),
            (3, 10.0, 0.0023199013042898686),
            (3, 100.0, 2.030199990001333e-6),
            (3, 0.001, 6000000000006.469),
            (3, 30.0, 7.78600366473613e-05),
            (3, 1e4, 2.00030002e-12),
            (3, -0.5, 193.40909103400244),
            (3, -2.3, 768.9350646661405),
            (3, -7.7, 769.0173136215717),
            (4, 0.5, -771.4742498266672),
            (4, 2.5, -0.3137559995067314),
            (4, 10.0, -0.0007299311682352867),
            (4, 100.0, -6.120999930011997e-08),
            (4, -0.5, -3.4742498266672253),
            (4, -2.3, 9.738671736569222e+3),
            (4, -0.01, 239999999973.85577),
            (5, 0.1, 120000069.30751097),
            (5, 3.3, 0.12084171431847719),
            (5, 30.0, 1.0726994936161623e-06),
            (5, -7.7, 165660.17381776415),
            (10, 0.5, -7.431824508858769e+9),
            (10, 2.5, -156.229596593233),
            (10, 10.0, -5.7675966863222595e-05),
            (10, 100.0, -3.8135655355681386e-15),
            (10, 1e4, -3.6306147326399916e-35),
            (10, -0.5, -42108.85876897549),
            (10, -2.3, 2.048284893010931e+12),
            (10, 3.3, -7.616805535818372),
            (25, 0.5, 1.0409396852737428e+33),
            (25, 1.0, 1.5511210274472133e+25),
            (25, 10.0, 0.1696806104135773),
            (25, 30.0, 1.0808587375381878e-13),
            (25, 100.0, 7.013609883155048e-27),
            (25, -2.3, 6.102292998575742e+38),
        ];
        for &(n, x, want) in cases {
            let got = Polygamma::new(n).eval(x);
            let err = (got - want).abs() / want.abs();
            assert!(
                err < 1e-12,
                "ψ({n})({x}) = {got}, want {want} (error {err:e})"
            );
        }
    }

    #[test]
    fn polygamma_consistency() {
        // The general method at order 1 agrees with trigamma.
        for x in [1e-3, 0.4, 1.0, 2.5, 9.99, 10.5, 31.0, 1e3, -0.3, -4.6] {
            let got = Polygamma::new(1).general(x);
            let want = trigamma_f64(x);
            assert!(
                (got - want).abs() < 1e-13 * want.abs(),
                "ψ(1)({x}) = {got}, trigamma {want}"
            );
        }
        for n in [1u32, 2, 3, 4, 7, 12, 30] {
            let (p, q) = (Polygamma::new(n - 1), Polygamma::new(n));
            for x in [
                0.05, 0.5, 1.5, 4.25, 9.5, 10.7, 14.9, 15.1, 26.0, 80.0, -0.35, -3.6,
            ] {
                let here = q.eval(x);
                // The recurrence, across the point where the sum switches
                // to the series.
                let up = q.eval(x + 1.0);
                let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
                let fact: f64 = (1..=n).map(|i| i as f64).product();
                let step = sign * fact / x.powi(n as i32 + 1);
                let err = (here - (up - step)).abs() / here.abs().max(step.abs());
                assert!(err < 1e-13, "recurrence of ψ({n}) at {x}: error {err:e}");
                // The derivative of the order below, by central differences.
                // A step well inside the distance to the nearest pole.
                let pole = if x > 0.0 { x } else { (x - x.round()).abs() };
                let h = 1e-4 * pole / n as f64;
                let fd = (p.eval(x + h) - p.eval(x - h)) / (2.0 * h);
                let err = (fd - here).abs() / here.abs();
                assert!(err < 1e-6, "d/dx ψ({})({x}) = {fd}, ψ({n}) = {here}", n - 1);
            }
        }
    }

    #[test]
    fn polygamma_special_points() {
        let (p2, p3) = (Polygamma::new(2), Polygamma::new(3));
        // Poles: (-1)^(n+1) ∞, as SciPy.
        assert_eq!(p2.eval(0.0), f64::NEG_INFINITY);
        assert_eq!(p2.eval(-3.0), f64::NEG_INFINITY);
        assert_eq!(p3.eval(-0.0), f64::INFINITY);
        assert_eq!(p3.eval(-1.0), f64::INFINITY);
        assert!(p2.eval(f64::NAN).is_nan());
        assert!(p3.eval(f64::NEG_INFINITY).is_nan());
        assert_eq!(p2.eval(f64::INFINITY), 0.0);
        // Far out on both sides, and the largest order (mpmath).
        assert!(p2.eval(1e300).abs() < 1e-300);
        for (n, x, want) in [
            (3, -1e6 - 0.5, 194.81818206800486),
            (POLYGAMMA_MAX_ORDER, 200.0, -9.356913302040697e-75),
            (POLYGAMMA_MAX_ORDER, 60.3, -1.7786089911232043e-22),
            (POLYGAMMA_MAX_ORDER, 1.0, -9.332621544394415e+157),
            (POLYGAMMA_MAX_ORDER, -0.5, -1.5303349262176004e+140),
        ] {
            let got = Polygamma::new(n).eval(x);
            let err = (got - want).abs() / want.abs();
            assert!(
                err < 1e-11,
                "ψ({n})({x}) = {got}, want {want} (error {err:e})"
            );
        }
    }

    /// `x ** 2` and `x ** 1` skip the library call: the same values as a
    /// correctly rounded `pow`, special values included.
    #[test]
    fn squares_are_exact_products() {
        let xs = [
            0.0f64,
            -0.0,
            1.5,
            -3.25,
            1e200,
            -1e-200,
            f64::MIN_POSITIVE / 3.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for x in xs {
            let sq = <f64 as Num>::pow(x, 2.0);
            let want = x.powf(2.0);
            assert!(
                sq.to_bits() == want.to_bits() || (sq.is_nan() && want.is_nan()),
                "{x}"
            );
            assert_eq!(<f64 as Num>::pow(x, 1.0).to_bits(), x.to_bits());
            let xf = x as f32;
            let sqf = <f32 as Num>::pow(xf, 2.0);
            let wantf = xf.powf(2.0);
            assert!(
                sqf.to_bits() == wantf.to_bits() || (sqf.is_nan() && wantf.is_nan()),
                "{xf}"
            );
        }
        assert_eq!(<f64 as Num>::pow(3.0, 3.0), 27.0);
    }

    #[test]
    fn digamma() {
        // Reference values (mpmath, rounded to f64).
        let cases = [
            (1.0f64, -0.5772156649015329f64),
            (0.5, -1.9635100260214235),
            (0.1, -10.423754940411078),
            (2.5, 0.7031566406452432),
            (5.9, 1.6878194259079582),
            (6.0, 1.7061176684318005),
            (10.0, 2.251752589066721),
            (100.0, 4.600161852738087),
            (1e-8, -100000000.57721564),
            (-0.5, 0.03648997397857652),
            (-2.3, 3.31732315756182),
            (-7.7, -0.1777484437189667),
        ];
        for (x, want) in cases {
            let got = Float::digamma(x);
            let err = (got - want).abs() / want.abs().max(1.0);
            assert!(err < 1e-12, "digamma({x}) = {got}, want {want}");
        }
        // ψ(x + 1) = ψ(x) + 1/x across the switch points.
        for x in [0.25f64, 0.49, 0.51, 3.3, 5.5, 5.999, 17.0] {
            let d = Float::digamma(x + 1.0) - Float::digamma(x) - 1.0 / x;
            assert!(d.abs() < 1e-12, "recurrence at {x}: {d}");
        }
        assert_eq!(Float::digamma(0.0f64), f64::NEG_INFINITY);
        assert!(Float::digamma(-3.0f64).is_nan());
        assert!(Float::digamma(f64::NAN).is_nan());
        assert_eq!(Float::digamma(f64::INFINITY), f64::INFINITY);
        assert!((Float::digamma(1.0f32) + 0.577_215_7).abs() < 1e-6);
    }
}
