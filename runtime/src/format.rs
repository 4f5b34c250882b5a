//! The print format of language.md §5 for numbers and tensors.
//!
//! - ints as `6`, bools as `true` / `false`;
//! - floats as the shortest decimal that reads back to the same value *of
//!   their dtype* (`0.1f32` prints `0.1`), with `.0` when integral, in
//!   exponent form like Rust's `{:e}` when `|x| >= 1e16` or
//!   `0 < |x| < 1e-4` (`1e16`, `-1.25e-7`); `nan`, `inf`, `-inf`;
//! - tensors as NumPy-style nested brackets (`[[1.0, 2.5], [3.0, 4.0]]`),
//!   a 0-d tensor as its bare element, a tensor with no element as `[]`.
//!
//! This module writes numbers; `Display` of `Tensor` (`tensor.rs`) and of
//! `Value` (`value.rs`) write with it.

use std::fmt;

/// A float type the printer knows how to write in shortest form.
pub trait PrintFloat: Copy + fmt::Display + fmt::LowerExp {
    /// `|x| >= 1e16 || 0 < |x| < 1e-4`, compared in the type's own precision.
    fn wants_exponent(self) -> bool;
    /// NaN?
    fn nan(self) -> bool;
    /// +inf or -inf?
    fn infinite(self) -> bool;
    /// Sign bit set?
    fn negative(self) -> bool;
}

macro_rules! print_float {
    ($t:ty) => {
        impl PrintFloat for $t {
            fn wants_exponent(self) -> bool {
                let a = self.abs();
                a >= 1e16 || (a > 0.0 && a < 1e-4)
            }
            fn nan(self) -> bool {
                self.is_nan()
            }
            fn infinite(self) -> bool {
                self.is_infinite()
            }
            fn negative(self) -> bool {
                self.is_sign_negative()
            }
        }
    };
}

print_float!(f32);
print_float!(f64);

/// Formats one float in the print format (see the module documentation).
pub fn format_float<F: PrintFloat>(v: F) -> String {
    if v.nan() {
        return "nan".into();
    }
    if v.infinite() {
        return if v.negative() { "-inf" } else { "inf" }.into();
    }
    if v.wants_exponent() {
        // Rust's `{:e}` writes the shortest round-tripping digits: `1e16`, `-1.25e-7`.
        return format!("{v:e}");
    }
    let s = format!("{v}");
    if s.contains('.') {
        s
    } else {
        s + ".0"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use crate::value::Value;

    fn show(t: Tensor) -> String {
        t.to_string()
    }

    #[test]
    fn floats() {
        assert_eq!(format_float(0.1f32), "0.1");
        assert_eq!(format_float(0.1f64), "0.1");
        assert_eq!(format_float(1.0f64), "1.0");
        assert_eq!(format_float(6.0f32), "6.0");
        assert_eq!(format_float(0.5f64), "0.5");
        assert_eq!(format_float(-0.0f64), "-0.0");
        assert_eq!(format_float(1e-7f64), "1e-7");
        assert_eq!(format_float(-1.25e-7f64), "-1.25e-7");
        assert_eq!(format_float(1e16f64), "1e16");
        assert_eq!(format_float(1e16f32), "1e16");
        assert_eq!(format_float(1e15f64), "1000000000000000.0");
        assert_eq!(format_float(0.0001f32), "0.0001");
        assert_eq!(format_float(0.0001f64), "0.0001");
        assert_eq!(format_float(0.00009f64), "9e-5");
        assert_eq!(format_float(1024.0f64), "1024.0");
        assert_eq!(format_float(f64::NAN), "nan");
        assert_eq!(format_float(f32::INFINITY), "inf");
        assert_eq!(format_float(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_float(1.0f32 / 3.0), "0.33333334");
        assert_eq!(format_float(1.0f64 / 3.0), "0.3333333333333333");
    }

    #[test]
    fn scalars() {
        assert_eq!(show(Tensor::scalar_i64(6)), "6");
        assert_eq!(show(Tensor::scalar_i32(-7)), "-7");
        assert_eq!(show(Tensor::scalar_u8(255)), "255");
        assert_eq!(show(Tensor::scalar_bool(true)), "true");
        assert_eq!(show(Tensor::scalar_bool(false)), "false");
        assert_eq!(show(Tensor::scalar_f32(0.1)), "0.1");
        assert_eq!(show(Tensor::weak_f64(2.0)), "2.0");
    }

    #[test]
    fn tensors() {
        let t = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap();
        assert_eq!(show(t), "[[1, 2], [3, 4]]");
        let t = Tensor::from_vec(vec![1.0f32, 2.5, 3.0, 4.0], &[2, 2]).unwrap();
        assert_eq!(show(t), "[[1.0, 2.5], [3.0, 4.0]]");
        assert_eq!(show(Tensor::vector(vec![true, false])), "[true, false]");
        assert_eq!(show(Tensor::vector(Vec::<f32>::new())), "[]");
        assert_eq!(
            show(Tensor::zeros(crate::DType::F32, &[2, 0]).unwrap()),
            "[]"
        );
        let t = Tensor::from_vec(vec![1u8], &[1, 1, 1]).unwrap();
        assert_eq!(show(t), "[[[1]]]");
    }

    #[test]
    fn values() {
        let one = Value::tuple(vec![Value::from(Tensor::scalar_i64(1))]);
        assert_eq!(one.to_string(), "(1,)");
        let pair = Value::tuple(vec![
            Value::from(Tensor::scalar_f64(1.0)),
            Value::from(Tensor::scalar_bool(true)),
        ]);
        assert_eq!(pair.to_string(), "(1.0, true)");
        assert_eq!(Value::unit().to_string(), "()");
        let rec = Value::record(vec![
            ("w", Value::from(Tensor::vector(vec![1.0f32, 2.0]))),
            ("b", Value::from(Tensor::scalar_f32(0.5))),
        ]);
        assert_eq!(rec.to_string(), "{w: [1.0, 2.0], b: 0.5}");
        assert_eq!(Value::DType(crate::DType::F64).to_string(), "f64");
        assert_eq!(Value::str("hi").to_string(), "hi");
    }

    mod props {
        use super::super::format_float;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn f64_prints_round_trip(x in any::<f64>().prop_filter("finite", |x| x.is_finite())) {
                let s = format_float(x);
                prop_assert_eq!(s.parse::<f64>().unwrap(), x, "{}", s);
                prop_assert!(s.contains('.') || s.contains('e'));
            }

            #[test]
            fn f32_prints_round_trip(x in any::<f32>().prop_filter("finite", |x| x.is_finite())) {
                let s = format_float(x);
                prop_assert_eq!(s.parse::<f32>().unwrap(), x, "{}", s);
            }
        }
    }
}
