//! Rust functions the compiled kernels (and scalar programs) call per
//! element for operations without an inline implementation. They are the runtime's own scalar
//! functions, so results match the reference kernels exactly.

use adjoint_runtime::kernels::num::{Float, Num};

use crate::codegen::kernel::{BinaryOp, KDType, UnaryOp};

/// `extern "C"` wrappers of the runtime's scalar functions, for compiled
/// code to call.
macro_rules! shims {
    ($($name:ident: fn($($a:ident),*) -> $t:ty = $f:expr;)*) => {
        $(pub(crate) extern "C" fn $name($($a: $t),*) -> $t { ($f)($($a),*) })*
    };
}

shims! {
    exp_f32: fn(x) -> f32 = <f32 as Float>::exp;
    exp_f64: fn(x) -> f64 = <f64 as Float>::exp;
    log_f32: fn(x) -> f32 = <f32 as Float>::ln;
    log_f64: fn(x) -> f64 = <f64 as Float>::ln;
    log1p_f32: fn(x) -> f32 = <f32 as Float>::ln_1p;
    log1p_f64: fn(x) -> f64 = <f64 as Float>::ln_1p;
    tanh_f32: fn(x) -> f32 = <f32 as Float>::tanh;
    tanh_f64: fn(x) -> f64 = <f64 as Float>::tanh;
    sigmoid_f32: fn(x) -> f32 = <f32 as Float>::sigmoid;
    sigmoid_f64: fn(x) -> f64 = <f64 as Float>::sigmoid;
    rsqrt_f32: fn(x) -> f32 = <f32 as Float>::rsqrt;
    rsqrt_f64: fn(x) -> f64 = <f64 as Float>::rsqrt;
    lgamma_f32: fn(x) -> f32 = <f32 as Float>::lgamma;
    lgamma_f64: fn(x) -> f64 = <f64 as Float>::lgamma;
    erf_f32: fn(x) -> f32 = <f32 as Float>::erf;
    erf_f64: fn(x) -> f64 = <f64 as Float>::erf;
    digamma_f32: fn(x) -> f32 = <f32 as Float>::digamma;
    digamma_f64: fn(x) -> f64 = <f64 as Float>::digamma;
    trigamma_f32: fn(x) -> f32 = <f32 as Float>::trigamma;
    trigamma_f64: fn(x) -> f64 = <f64 as Float>::trigamma;
    sign_f32: fn(x) -> f32 = <f32 as Num>::sign;
    sign_f64: fn(x) -> f64 = <f64 as Num>::sign;
    sign_i64: fn(x) -> i64 = <i64 as Num>::sign;
    relu_f32: fn(x) -> f32 = <f32 as Num>::relu;
    relu_f64: fn(x) -> f64 = <f64 as Num>::relu;
    relu_i64: fn(x) -> i64 = <i64 as Num>::relu;
    abs_i64: fn(x) -> i64 = <i64 as Num>::abs;
    pow_f32: fn(x, y) -> f32 = <f32 as Num>::pow;
    pow_f64: fn(x, y) -> f64 = <f64 as Num>::pow;
    pow_i64: fn(x, y) -> i64 = <i64 as Num>::pow;
    rem_f32: fn(x, y) -> f32 = <f32 as Num>::rem;
    rem_f64: fn(x, y) -> f64 = <f64 as Num>::rem;
    max_f32: fn(x, y) -> f32 = <f32 as Num>::maximum;
    max_f64: fn(x, y) -> f64 = <f64 as Num>::maximum;
    min_f32: fn(x, y) -> f32 = <f32 as Num>::minimum;
    min_f64: fn(x, y) -> f64 = <f64 as Num>::minimum;
}

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
        (UnaryOp::Erf, true) => ("adjoint_erf_f32", erf_f32 as *const u8),
        (UnaryOp::Erf, false) => ("adjoint_erf_f64", erf_f64 as *const u8),
        (UnaryOp::Math(f), true) => (f.row().symbol_f32, f.row().f32 as *const u8),
        (UnaryOp::Math(f), false) => (f.row().symbol_f64, f.row().f64 as *const u8),
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
