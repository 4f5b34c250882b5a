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
pub trait Float: Num {
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
                self.powf(o)
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
