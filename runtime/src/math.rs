//! The table of element-wise math functions: one row per function of one
//! float argument, and everything about it as data.
//!
//! A row gives the function's name (what programs call it and the IR
//! prints), its value on `f32` and `f64` (the reference kernels, the
//! compiled kernels' per-element calls and the scalar compiler's calls all
//! use these same functions, so every path gives the same bits), its CUDA
//! name, a rough cost, and its derivative. Every other part of Adjoint
//! derives from the row: the compiler's primitive (`Prim::Math`), type
//! rule, fused CPU and CUDA kernels, scalar-loop code, and the reverse,
//! forward and scalar-loop derivatives. Adding a function is adding a row
//! to [`for_each_math_fn!`] (and testing it).
//!
//! The derivative is an Adjoint expression in `x` (the argument), `out`
//! (the result) and `d` (a tangent of `x`, or the cotangent of `out`),
//! linear in `d`: the tangent of the result. Reverse mode uses it as
//! `bprop f(x, out, d) = (RULE,)`, forward mode as `jvp_f(x, out, d) =
//! RULE`, and the scalar-loop compiler as scalar operations. It may use
//! numbers, `+ - * /`, parentheses, comparisons inside `where(c, a, b)`,
//! and calls of element-wise functions of one argument (this table's, or
//! the compiler's built-in ones such as `sqrt` and `exp`).

/// One row of the table.
#[derive(Debug)]
pub struct MathRow {
    pub name: &'static str,
    pub f32: extern "C" fn(f32) -> f32,
    pub f64: extern "C" fn(f64) -> f64,
    /// The symbols compiled code imports the two functions under.
    pub symbol_f32: &'static str,
    pub symbol_f64: &'static str,
    /// The CUDA math function on `double`; the `float` one adds `f`.
    pub cuda: &'static str,
    /// Work per element relative to an addition, for the kernel compiler's
    /// unrolling heuristic.
    pub cost: usize,
    /// Where the function is smooth (where tests check its derivative).
    pub domain: Domain,
    /// The derivative rule (see the module documentation).
    pub derivative: &'static str,
}

/// An interval on which a function of the table is smooth.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Domain {
    /// Every real number.
    Real,
    /// `x > 0`.
    Positive,
    /// `-1 < x < 1`.
    Unit,
    /// `x > 1`.
    AboveOne,
}

/// The rows of the table, for a macro `$m` to expand: each row is
/// `Variant = "name", |x| value, cuda "name", cost N, on DOMAIN, d "rule";`,
/// where `value` is an expression of `x` valid for both `f32` and `f64`
/// and `DOMAIN` a [`Domain`].
#[macro_export]
macro_rules! for_each_math_fn {
    ($m:ident) => {
        $m! {
            /// Sine.
            Sin = "sin", |x| x.sin(), cuda "sin", cost 40, on Real, d "d * cos(x)";
            /// Cosine.
            Cos = "cos", |x| x.cos(), cuda "cos", cost 40, on Real, d "-(d * sin(x))";
            /// Tangent.
            Tan = "tan", |x| x.tan(), cuda "tan", cost 40, on Unit, d "d * (1.0 + out * out)";
            /// Inverse tangent.
            Atan = "atan", |x| x.atan(), cuda "atan", cost 40, on Real, d "d / (1.0 + x * x)";
            /// Inverse sine (NaN outside [-1, 1]).
            Asin = "asin", |x| x.asin(), cuda "asin", cost 40, on Unit, d "d / sqrt(1.0 - x * x)";
            /// Inverse cosine (NaN outside [-1, 1]).
            Acos = "acos", |x| x.acos(), cuda "acos", cost 40, on Unit, d "-(d / sqrt(1.0 - x * x))";
            /// Hyperbolic sine.
            Sinh = "sinh", |x| x.sinh(), cuda "sinh", cost 40, on Real, d "d * cosh(x)";
            /// Hyperbolic cosine.
            Cosh = "cosh", |x| x.cosh(), cuda "cosh", cost 40, on Real, d "d * sinh(x)";
            /// Inverse hyperbolic sine.
            Asinh = "asinh", |x| x.asinh(), cuda "asinh", cost 40, on Real, d "d / sqrt(x * x + 1.0)";
            /// Inverse hyperbolic cosine (NaN below 1).
            Acosh = "acosh", |x| x.acosh(), cuda "acosh", cost 40, on AboveOne, d "d / sqrt(x * x - 1.0)";
            /// Inverse hyperbolic tangent (NaN outside [-1, 1]).
            Atanh = "atanh", |x| x.atanh(), cuda "atanh", cost 40, on Unit, d "d / (1.0 - x * x)";
            /// Base-2 logarithm.
            Log2 = "log2", |x| x.log2(), cuda "log2", cost 40, on Positive, d "d / (x * 0.6931471805599453)";
            /// Base-10 logarithm.
            Log10 = "log10", |x| x.log10(), cuda "log10", cost 40, on Positive, d "d / (x * 2.302585092994046)";
            /// `e^x - 1`, accurate near 0.
            Expm1 = "expm1", |x| x.exp_m1(), cuda "expm1", cost 40, on Real, d "d * (out + 1.0)";
            /// `2^x`.
            Exp2 = "exp2", |x| x.exp2(), cuda "exp2", cost 40, on Real, d "d * (out * 0.6931471805599453)";
            /// Cube root (real, odd: `cbrt(-8) = -2`).
            Cbrt = "cbrt", |x| x.cbrt(), cuda "cbrt", cost 40, on Positive, d "d / (3.0 * (out * out))";
        }
    };
}

macro_rules! define_math {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, |$x:ident| $value:expr,
        cuda $cuda:literal, cost $cost:literal, on $domain:ident, d $rule:literal; )*) => {
        /// An element-wise math function: a row of [`TABLE`].
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum MathFn {
            $( $(#[$doc])* $variant ),*
        }

        impl MathFn {
            /// Every function, in table order.
            pub const ALL: &'static [MathFn] = &[$(MathFn::$variant),*];
        }

        /// The value of every function on `f32` and `f64`, with the C ABI
        /// compiled code calls.
        #[allow(non_snake_case)]
        mod shims {
            $(
                pub mod $variant {
                    pub extern "C" fn f32($x: f32) -> f32 {
                        $value
                    }
                    pub extern "C" fn f64($x: f64) -> f64 {
                        $value
                    }
                }
            )*
        }

        /// The rows, in the order of [`MathFn`].
        pub static TABLE: &[MathRow] = &[$(
            MathRow {
                name: $name,
                f32: shims::$variant::f32,
                f64: shims::$variant::f64,
                symbol_f32: concat!("adjoint_math_", $name, "_f32"),
                symbol_f64: concat!("adjoint_math_", $name, "_f64"),
                cuda: $cuda,
                cost: $cost,
                domain: Domain::$domain,
                derivative: $rule,
            }
        ),*];
    };
}

for_each_math_fn!(define_math);

impl MathFn {
    pub fn row(self) -> &'static MathRow {
        &TABLE[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The function called `name`, if the table has one.
    pub fn from_name(name: &str) -> Option<MathFn> {
        MathFn::ALL.iter().copied().find(|f| f.name() == name)
    }

    pub fn eval_f32(self, x: f32) -> f32 {
        (self.row().f32)(x)
    }

    pub fn eval_f64(self, x: f64) -> f64 {
        (self.row().f64)(x)
    }
}

/// Float element types the table's functions apply to.
pub trait MathFloat: Copy {
    /// The function of `f` on this type.
    fn math(f: MathFn) -> extern "C" fn(Self) -> Self;
}

impl MathFloat for f32 {
    fn math(f: MathFn) -> extern "C" fn(f32) -> f32 {
        f.row().f32
    }
}

impl MathFloat for f64 {
    fn math(f: MathFn) -> extern "C" fn(f64) -> f64 {
        f.row().f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_in_enum_order_with_unique_names() {
        for (i, f) in MathFn::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
            assert_eq!(MathFn::from_name(f.name()), Some(*f));
            assert!(f.row().symbol_f64.ends_with("_f64"));
        }
    }

    #[test]
    fn values_on_both_types() {
        assert_eq!(MathFn::Tan.eval_f64(0.5), 0.5f64.tan());
        assert_eq!(MathFn::Cbrt.eval_f64(-8.0), -2.0);
        assert_eq!(MathFn::Sinh.eval_f32(1.0), 1.0f32.sinh());
        assert!(MathFn::Acosh.eval_f64(0.5).is_nan());
        assert_eq!(<f64 as MathFloat>::math(MathFn::Log2)(8.0), 3.0);
    }
}
