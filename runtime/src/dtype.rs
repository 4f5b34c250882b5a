//! Dtypes: [`DType`] (re-exported as `tensor::DType`), the `dispatch_*`
//! macros that bind a type to a dtype, and the dtype rules: promotion with
//! weakly typed literals, and the result dtype of every element-wise and
//! reducing primitive.
//!
//! These are pure functions over `(dtype, weak)` pairs so that the kernels
//! and the compiler's static type inference share one definition. Errors are
//! lowercase messages naming the operation.
//!
//! Weak values are literals (or values computed only from literals): a weak
//! int is stored as `i64`, a weak float as `f64`. Bool is never weak.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed int.
    I32,
    /// 64-bit signed int.
    I64,
    /// Bool (never weakly typed).
    Bool,
    /// 8-bit unsigned int.
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::U8,
    ];

    /// The name used in source code and messages (`f32`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::U8 => "u8",
        }
    }

    /// The dtype with the given source name, if any.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// `f32` or `f64`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// `i32`, `i64` or `u8`.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8)
    }

    /// Any dtype but `bool`.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool | DType::U8 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<DType, String> {
        DType::from_name(s).ok_or_else(|| format!("unknown dtype `{s}`"))
    }
}

/// Runs `$body` with the type alias `$T` bound to the element type of a
/// numeric dtype; `$other` is evaluated for bool.
#[macro_export]
#[doc(hidden)]
macro_rules! dispatch_numeric {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dt {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::dtype::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::dtype::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::dtype::DType::Bool => $other,
        }
    };
}

/// Runs `$body` with the type alias `$T` bound to the element type of a
/// float dtype; `$other` is evaluated for the others.
#[macro_export]
#[doc(hidden)]
macro_rules! dispatch_float {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dt {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
            _ => $other,
        }
    };
}

/// Runs `$body` with the type alias `$T` bound to the element type of any dtype.
#[macro_export]
#[doc(hidden)]
macro_rules! dispatch_all {
    ($dt:expr, $T:ident => $body:expr) => {
        $crate::dispatch_numeric!($dt, $T => $body, else {
            type $T = bool;
            $body
        })
    };
}

/// A dtype together with its weak flag.
pub type WeakDType = (DType, bool);

/// Normalises a pair: bool is never weak.
fn norm((d, w): WeakDType) -> WeakDType {
    (d, w && d != DType::Bool)
}

/// Whether a weak literal of dtype `weak` may adopt the strong dtype `strong`:
/// a weak int becomes any numeric dtype, a weak float only a float dtype.
pub fn weak_adopts(weak: DType, strong: DType) -> bool {
    if weak.is_float() {
        strong.is_float()
    } else {
        strong.is_numeric()
    }
}

/// The place of a dtype in the promotion chain: bool < u8 < i32 < i64 <
/// f32 < f64. Two strong dtypes promote to the later one.
fn rank(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        DType::U8 => 1,
        DType::I32 => 2,
        DType::I64 => 3,
        DType::F32 => 4,
        DType::F64 => 5,
    }
}

/// The dtype of floats that nothing else decides (creation without a
/// `dtype`, an int meeting a float literal).
pub const DEFAULT_FLOAT: DType = DType::F32;

/// The common dtype of two operands (language.md §2), as JAX promotes:
///
/// - both strong: the later in the chain bool < u8 < i32 < i64 < f32 <
///   f64 (an int with a float gives the float, as in JAX; two floats the
///   wider);
/// - one weak: a weak int adopts any numeric dtype (with a bool it gives
///   i64); a weak float adopts a float dtype, and with an int or bool
///   gives the default float dtype, f32; the result is strong;
/// - both weak: the result is weak; int with float gives f64.
///
/// It never fails; the `Result` is for the callers' uniformity (bool
/// arithmetic is refused by [`binary_operands`]).
pub fn promote(_op: &str, a: WeakDType, b: WeakDType) -> Result<WeakDType, String> {
    let (a, b) = (norm(a), norm(b));
    Ok(match (a, b) {
        ((da, false), (db, false)) => (if rank(da) >= rank(db) { da } else { db }, false),
        ((dw, true), (ds, false)) | ((ds, false), (dw, true)) => {
            let d = if weak_adopts(dw, ds) {
                ds
            } else if dw.is_float() {
                DEFAULT_FLOAT
            } else {
                DType::I64
            };
            (d, false)
        }
        ((da, true), (db, true)) => {
            if da.is_float() || db.is_float() {
                (DType::F64, true)
            } else {
                (DType::I64, true)
            }
        }
    })
}

/// [`promote`] folded over several operands (tensor literals, `concat`,
/// `stack`). No operand gives a weak f64 (the empty literal `[]`).
pub fn promote_all(op: &str, items: &[WeakDType]) -> Result<WeakDType, String> {
    let mut it = items.iter().copied().map(norm);
    let Some(mut acc) = it.next() else {
        return Ok((DType::F64, true));
    };
    for x in it {
        acc = promote(op, acc, x)?;
    }
    Ok(acc)
}

/// The kinds of element-wise unary primitives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum UnaryClass {
    /// Needs a float operand: `exp log log1p sin cos tanh sigmoid sqrt rsqrt
    /// lgamma digamma erf` and the functions of [`crate::math`]. A weak int works in f64 (weak); a strong int is an error.
    Float,
    /// Any numeric operand, same dtype out: `neg abs sign relu floor ceil`.
    Numeric,
    /// Bool in, bool out: `not`.
    Logical,
}

/// The class of a unary primitive, or `None` if `op` is not one.
pub fn unary_class(op: &str) -> Option<UnaryClass> {
    if crate::math::MathFn::from_name(op).is_some() {
        return Some(UnaryClass::Float);
    }
    Some(match op {
        "exp" | "log" | "log1p" | "tanh" | "sigmoid" | "sqrt" | "rsqrt" | "lgamma" | "digamma"
        | "trigamma" | "erf" => UnaryClass::Float,
        "neg" | "abs" | "sign" | "relu" | "floor" | "ceil" => UnaryClass::Numeric,
        "not" => UnaryClass::Logical,
        _ => return None,
    })
}

/// Requires a float operand: floats pass, a weak int becomes a weak f64,
/// anything else asks for a cast. Used by float unary ops and `mean`.
pub fn float_operand(op: &str, x: WeakDType) -> Result<WeakDType, String> {
    let (d, w) = norm(x);
    if d.is_float() {
        Ok((d, w))
    } else if w {
        Ok((DType::F64, true))
    } else {
        Err(format!(
            "{op}: expected a float operand, got {d}; use a cast such as f32(x)"
        ))
    }
}

/// The result dtype of a unary primitive. Results keep the input's weakness.
pub fn unary_result(op: &str, x: WeakDType) -> Result<WeakDType, String> {
    let (d, w) = norm(x);
    match unary_class(op) {
        Some(UnaryClass::Float) => float_operand(op, (d, w)),
        Some(UnaryClass::Numeric) => {
            if d.is_numeric() {
                Ok((d, w))
            } else {
                Err(format!("{op}: expected a numeric operand, got {d}"))
            }
        }
        Some(UnaryClass::Logical) => {
            if d == DType::Bool {
                Ok((d, false))
            } else {
                Err(format!("{op}: expected a bool operand, got {d}"))
            }
        }
        None => Err(format!("{op}: not a unary primitive")),
    }
}

/// The kinds of element-wise binary primitives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BinaryClass {
    /// Numeric operands, promoted dtype out: `add sub mul div pow rem maximum minimum`.
    Arith,
    /// Promoted operands (bool allowed), strong bool out: `eq ne lt le gt ge`.
    Compare,
    /// Bool operands, bool out: `and or`.
    Logical,
}

/// The class of a binary primitive, or `None` if `op` is not one.
pub fn binary_class(op: &str) -> Option<BinaryClass> {
    Some(match op {
        "add" | "sub" | "mul" | "div" | "pow" | "rem" | "maximum" | "minimum" => BinaryClass::Arith,
        "eq" | "ne" | "lt" | "le" | "gt" | "ge" => BinaryClass::Compare,
        "and" | "or" => BinaryClass::Logical,
        _ => return None,
    })
}

/// The dtype both operands of a binary primitive are converted to before
/// the operation (for comparisons this differs from the result).
pub fn binary_operands(op: &str, a: WeakDType, b: WeakDType) -> Result<WeakDType, String> {
    let (a, b) = (norm(a), norm(b));
    match binary_class(op) {
        Some(BinaryClass::Arith) => {
            if a.0 == DType::Bool || b.0 == DType::Bool {
                return Err(format!(
                    "{op}: expected numeric operands, got {} and {}",
                    a.0, b.0
                ));
            }
            promote(op, a, b)
        }
        Some(BinaryClass::Compare) => promote(op, a, b),
        Some(BinaryClass::Logical) => {
            if a.0 == DType::Bool && b.0 == DType::Bool {
                Ok((DType::Bool, false))
            } else {
                Err(format!(
                    "{op}: expected bool operands, got {} and {}",
                    a.0, b.0
                ))
            }
        }
        None => Err(format!("{op}: not a binary primitive")),
    }
}

/// The result dtype of a binary primitive: comparisons give a strong bool.
pub fn binary_result(op: &str, a: WeakDType, b: WeakDType) -> Result<WeakDType, String> {
    let common = binary_operands(op, a, b)?;
    match binary_class(op) {
        Some(BinaryClass::Compare) | Some(BinaryClass::Logical) => Ok((DType::Bool, false)),
        _ => Ok(common),
    }
}

/// The result dtype of `where(c, a, b)`: `c` must be bool; `a` and `b` promote.
pub fn where_result(c: WeakDType, a: WeakDType, b: WeakDType) -> Result<WeakDType, String> {
    if c.0 != DType::Bool {
        return Err(format!(
            "where: expected a bool condition, got {}; use a comparison or bool(x)",
            c.0
        ));
    }
    promote("where", a, b)
}

/// The result dtype of a reduction:
///
/// - `sum`, `prod`: numeric dtypes keep theirs; bool counts in i64;
/// - `mean`: floats only (a weak int works in f64);
/// - `max`, `min`: any dtype;
/// - `argmax`: strong i64.
///
/// Results keep the input's weakness, except `argmax` and bool sums.
pub fn reduce_result(op: &str, x: WeakDType) -> Result<WeakDType, String> {
    let (d, w) = norm(x);
    match op {
        "sum" | "prod" => Ok(if d == DType::Bool {
            (DType::I64, false)
        } else {
            (d, w)
        }),
        "mean" => float_operand(op, (d, w)),
        "max" | "min" => Ok((d, w)),
        "argmax" => Ok((DType::I64, false)),
        _ => Err(format!("{op}: not a reduction")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn strong_strong() {
        assert_eq!(promote("add", (F32, false), (F32, false)), Ok((F32, false)));
        // Along the chain bool < u8 < i32 < i64 < f32 < f64, as JAX does.
        assert_eq!(promote("add", (F32, false), (F64, false)), Ok((F64, false)));
        assert_eq!(promote("add", (I32, false), (I64, false)), Ok((I64, false)));
        assert_eq!(promote("add", (I64, false), (F32, false)), Ok((F32, false)));
        assert_eq!(promote("add", (F32, false), (U8, false)), Ok((F32, false)));
        assert_eq!(promote("eq", (Bool, false), (I32, false)), Ok((I32, false)));
    }

    #[test]
    fn one_weak() {
        assert_eq!(promote("mul", (I64, true), (F32, false)), Ok((F32, false)));
        assert_eq!(promote("mul", (F32, false), (I64, true)), Ok((F32, false)));
        assert_eq!(promote("mul", (I64, true), (U8, false)), Ok((U8, false)));
        assert_eq!(promote("mul", (F64, true), (F32, false)), Ok((F32, false)));
        // An int tensor meeting a float literal: the default float dtype.
        assert_eq!(promote("add", (I64, false), (F64, true)), Ok((F32, false)));
        assert_eq!(promote("add", (U8, false), (F64, true)), Ok((F32, false)));
        assert_eq!(promote("eq", (Bool, false), (I64, true)), Ok((I64, false)));
    }

    #[test]
    fn both_weak() {
        assert_eq!(promote("add", (I64, true), (I64, true)), Ok((I64, true)));
        assert_eq!(promote("add", (I64, true), (F64, true)), Ok((F64, true)));
        assert_eq!(promote("add", (F64, true), (F64, true)), Ok((F64, true)));
        // bool is never weak
        assert_eq!(
            promote("eq", (Bool, true), (Bool, false)),
            Ok((Bool, false))
        );
        assert_eq!(
            promote_all("literal", &[(I64, true), (F64, true), (I64, true)]),
            Ok((F64, true))
        );
        assert_eq!(promote_all("literal", &[]), Ok((F64, true)));
    }

    #[test]
    fn unary() {
        assert_eq!(unary_result("exp", (F32, false)), Ok((F32, false)));
        assert_eq!(unary_result("exp", (I64, true)), Ok((F64, true)));
        assert_eq!(
            unary_result("exp", (I64, false)).unwrap_err(),
            "exp: expected a float operand, got i64; use a cast such as f32(x)"
        );
        assert_eq!(unary_result("neg", (I32, false)), Ok((I32, false)));
        assert_eq!(unary_result("abs", (I64, true)), Ok((I64, true)));
        assert!(unary_result("neg", (Bool, false)).is_err());
        assert_eq!(unary_result("not", (Bool, false)), Ok((Bool, false)));
        assert!(unary_result("not", (I64, true)).is_err());
        assert!(unary_result("frob", (F32, false)).is_err());
    }

    #[test]
    fn binary() {
        assert_eq!(
            binary_result("lt", (F32, false), (F64, true)),
            Ok((Bool, false))
        );
        assert_eq!(
            binary_result("add", (I64, true), (F64, true)),
            Ok((F64, true))
        );
        assert!(binary_result("add", (Bool, false), (Bool, false)).is_err());
        assert_eq!(
            binary_result("and", (Bool, false), (Bool, false)),
            Ok((Bool, false))
        );
        assert!(binary_result("or", (Bool, false), (I64, false)).is_err());
        assert_eq!(
            binary_result("eq", (Bool, false), (Bool, false)),
            Ok((Bool, false))
        );
    }

    #[test]
    fn reductions_and_where() {
        assert_eq!(reduce_result("sum", (Bool, false)), Ok((I64, false)));
        assert_eq!(reduce_result("sum", (F32, false)), Ok((F32, false)));
        assert_eq!(reduce_result("mean", (I64, true)), Ok((F64, true)));
        assert!(reduce_result("mean", (I32, false)).is_err());
        assert_eq!(reduce_result("argmax", (F64, true)), Ok((I64, false)));
        assert_eq!(
            where_result((Bool, false), (F32, false), (F64, true)),
            Ok((F32, false))
        );
        assert!(where_result((F32, false), (F32, false), (F32, false)).is_err());
    }
}
