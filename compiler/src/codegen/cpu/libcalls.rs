//! Rust functions the compiled kernels call per element for operations
//! without an inline implementation. They are the runtime's own scalar
//! functions, so results match the reference kernels exactly.

use adjoint_runtime::kernels::num::{Float, Num};

use crate::codegen::kernel::{BinaryOp, KDType, UnaryOp};

macro_rules! unary {
    ($name:ident, $t:ty, $f:expr) => {
        extern "C" fn $name(x: $t) -> $t {
            ($f)(x)
        }
    };
}
macro_rules! binary {
    ($name:ident, $t:ty, $f:expr) => {
        extern "C" fn $name(x: $t, y: $t) -> $t {
            ($f)(x, y)
        }
    };
}

unary!(sin_f32, f32, <f32 as Float>::sin);
unary!(sin_f64, f64, <f64 as Float>::sin);
unary!(cos_f32, f32, <f32 as Float>::cos);
unary!(cos_f64, f64, <f64 as Float>::cos);
unary!(erf_f32, f32, <f32 as Float>::erf);
unary!(erf_f64, f64, <f64 as Float>::erf);
binary!(pow_f32, f32, <f32 as Num>::pow);
binary!(pow_f64, f64, <f64 as Num>::pow);
binary!(rem_f32, f32, <f32 as Num>::rem);
binary!(rem_f64, f64, <f64 as Num>::rem);

/// An imported function: its symbol, arity and address.
pub(crate) struct Libcall {
    pub symbol: &'static str,
    pub arity: usize,
    pub ptr: *const u8,
}

/// The libcall for a unary operation, if it needs one.
pub(crate) fn unary_libcall(op: UnaryOp, dtype: KDType) -> Option<Libcall> {
    let f32 = dtype == KDType::F32;
    let (symbol, ptr) = match (op, f32) {
        (UnaryOp::Sin, true) => ("adjoint_sin_f32", sin_f32 as *const u8),
        (UnaryOp::Sin, false) => ("adjoint_sin_f64", sin_f64 as *const u8),
        (UnaryOp::Cos, true) => ("adjoint_cos_f32", cos_f32 as *const u8),
        (UnaryOp::Cos, false) => ("adjoint_cos_f64", cos_f64 as *const u8),
        (UnaryOp::Erf, true) => ("adjoint_erf_f32", erf_f32 as *const u8),
        (UnaryOp::Erf, false) => ("adjoint_erf_f64", erf_f64 as *const u8),
        _ => return None,
    };
    Some(Libcall {
        symbol,
        arity: 1,
        ptr,
    })
}

/// The libcall for a binary operation, if it needs one.
pub(crate) fn binary_libcall(op: BinaryOp, dtype: KDType) -> Option<Libcall> {
    let f32 = dtype == KDType::F32;
    let (symbol, ptr) = match (op, f32) {
        (BinaryOp::Pow, true) => ("adjoint_pow_f32", pow_f32 as *const u8),
        (BinaryOp::Pow, false) => ("adjoint_pow_f64", pow_f64 as *const u8),
        (BinaryOp::Rem, true) => ("adjoint_rem_f32", rem_f32 as *const u8),
        (BinaryOp::Rem, false) => ("adjoint_rem_f64", rem_f64 as *const u8),
        _ => return None,
    };
    Some(Libcall {
        symbol,
        arity: 2,
        ptr,
    })
}
