//! Element-wise kernels: unary and binary maps with broadcasting and the
//! promotion rule, `where` and `cast`.

use super::args::{arity, int, rule, tensor, typed};
use super::ctx::Ctx;
use super::num::{Float, Num, Polygamma, POLYGAMMA_MAX_ORDER};
use super::strided::{broadcast_tensor, zip_broadcast};
use crate::dtype::{self, BinaryClass, UnaryClass};
use crate::error::RtError;
use crate::math::{MathFloat, MathFn};
use crate::shape;
use crate::tensor::{Buffer, DType, Element, Tensor};
use crate::value::Value;
use crate::{dispatch_all, dispatch_float, dispatch_numeric};

fn float_fn<T: Float>(op: &str) -> Result<fn(T) -> T, RtError> {
    Ok(match op {
        "exp" => T::exp,
        "log" => T::ln,
        "log1p" => T::ln_1p,
        "tanh" => T::tanh,
        "sigmoid" => T::sigmoid,
        "sqrt" => T::sqrt,
        "rsqrt" => T::rsqrt,
        "lgamma" => T::lgamma,
        "erf" => T::erf,
        "digamma" => T::digamma,
        "trigamma" => T::trigamma,
        _ => return Err(RtError::internal(format!("{op} is not a float map"))),
    })
}

/// Numeric map `op` of `x`, each operation its own loop (see [`map_vec`]).
fn numeric<T: Num + Element>(op: &str, x: &[T]) -> Result<Buffer, RtError> {
    Ok(match op {
        "neg" => map_vec(x, T::neg),
        "abs" => map_vec(x, T::abs),
        "relu" => map_vec(x, T::relu),
        "sign" => map_vec(x, T::sign),
        "floor" => map_vec(x, T::floor),
        "ceil" => map_vec(x, T::ceil),
        _ => return Err(RtError::internal(format!("{op} is not a numeric map"))),
    })
}

/// `f` of every element. Given a function item (`T::neg`), each use is
/// its own loop, inlined and vectorised; given a pointer, a call per
/// element.
fn map_vec<T: Element>(x: &[T], f: impl Fn(T) -> T) -> Buffer {
    T::wrap(x.iter().map(|&v| f(v)).collect())
}

/// A unary element-wise primitive (`exp`, `neg`, `not`, ...). Float
/// functions of a weak int literal work in f64; results keep the input's
/// weakness.
pub fn unary(op: &str, args: &[Value]) -> Result<Value, RtError> {
    arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    let (dt, weak) = rule(dtype::unary_result(op, (x.dtype(), x.weak)))?;
    let x = x.cast(dt);
    let not_here = || RtError::internal(format!("{op} on {dt}"));
    let buf = match dtype::unary_class(op) {
        Some(UnaryClass::Float) => match MathFn::from_name(op) {
            Some(f) => {
                dispatch_float!(dt, T => {
                    let f = <T as MathFloat>::math(f);
                    map_vec(typed::<T>(&x)?, |v| f(v))
                }, else return Err(not_here()))
            }
            None => {
                dispatch_float!(dt, T => map_vec(typed::<T>(&x)?, float_fn::<T>(op)?), else return Err(not_here()))
            }
        },
        Some(UnaryClass::Numeric) => {
            dispatch_numeric!(dt, T => numeric::<T>(op, typed::<T>(&x)?)?, else return Err(not_here()))
        }
        Some(UnaryClass::Logical) => bool::wrap(typed::<bool>(&x)?.iter().map(|v| !v).collect()),
        None => return Err(not_here()),
    };
    Ok(Value::Tensor(
        Tensor::with_shape_of(buf, &x)?.with_weak(weak),
    ))
}

/// Arithmetic `op` of `x` and `y` broadcast to `out`. Each operation is
/// passed as a function item, so it is its own instance of the loop,
/// which the compiler inlines (and vectorises over contiguous operands)
/// instead of calling a function pointer per element.
fn arith<T: Num>(
    op: &str,
    x: &[T],
    xs: &[usize],
    y: &[T],
    ys: &[usize],
    out: &[usize],
) -> Result<Vec<T>, RtError> {
    Ok(match op {
        "add" => zip_broadcast(x, xs, y, ys, out, T::add),
        "sub" => zip_broadcast(x, xs, y, ys, out, T::sub),
        "mul" => zip_broadcast(x, xs, y, ys, out, T::mul),
        "div" => zip_broadcast(x, xs, y, ys, out, T::div),
        "maximum" => zip_broadcast(x, xs, y, ys, out, T::maximum),
        "minimum" => zip_broadcast(x, xs, y, ys, out, T::minimum),
        "rem" => zip_broadcast(x, xs, y, ys, out, T::rem),
        "pow" => zip_broadcast(x, xs, y, ys, out, T::pow),
        _ => return Err(RtError::internal(format!("{op} is not arithmetic"))),
    })
}

fn compare_fn<T: Element>(op: &str) -> Result<fn(T, T) -> bool, RtError> {
    Ok(match op {
        "eq" => |a, b| a == b,
        "ne" => |a, b| a != b,
        "lt" => |a, b| a < b,
        "le" => |a, b| a <= b,
        "gt" => |a, b| a > b,
        "ge" => |a, b| a >= b,
        _ => return Err(RtError::internal(format!("{op} is not a comparison"))),
    })
}

/// The error of integer `op` with right operand `rhs`, if it is one: `div`
/// or `rem` by zero, `pow` with a negative exponent. (Native loops report
/// theirs with it too.)
pub fn int_operand_error(op: &str, rhs: i64) -> Option<String> {
    match op {
        "div" | "rem" if rhs == 0 => Some(format!("{op}: integer division by zero")),
        "pow" if rhs < 0 => Some(format!(
            "pow: negative exponent {rhs} for an integer power; use a float base"
        )),
        _ => None,
    }
}

/// Integer `div`/`rem` by zero and `pow` with a negative exponent are errors.
fn check_int_operands<T: Num>(op: &str, rhs: &[T], out_len: usize) -> Result<(), RtError> {
    if T::DTYPE.is_float() || out_len == 0 || !matches!(op, "div" | "rem" | "pow") {
        return Ok(());
    }
    match rhs.iter().find_map(|v| int_operand_error(op, v.to_i64())) {
        Some(e) => Err(RtError::new(e)),
        None => Ok(()),
    }
}

/// A binary element-wise primitive with NumPy broadcasting and the
/// promotion rule (`add`, `lt`, `and`, ...).
pub fn binary(op: &str, args: &[Value]) -> Result<Value, RtError> {
    arity(op, args, 2)?;
    // `+` of two strings joins them; `==` and `!=` compare them.
    if let [Value::Str(a), Value::Str(b)] = args {
        match op {
            "add" => return Ok(Value::str(format!("{a}{b}"))),
            "eq" => return Ok(Value::Tensor(Tensor::scalar_bool(a == b))),
            "ne" => return Ok(Value::Tensor(Tensor::scalar_bool(a != b))),
            _ => {}
        }
    }
    if let [Value::Tensor(a), Value::Tensor(b)] = args {
        if let Some(t) = scalar_binary(op, a, b) {
            return Ok(Value::Tensor(t));
        }
    }
    binary_general(op, args)
}

/// [`binary`] without its fast path for scalars.
fn binary_general(op: &str, args: &[Value]) -> Result<Value, RtError> {
    let a = tensor(op, &args[0], "x")?;
    let b = tensor(op, &args[1], "y")?;
    let out = rule(shape::broadcast(op, a.ty(), b.ty()))?;
    let (cdt, _) = rule(dtype::binary_operands(
        op,
        (a.dtype(), a.weak),
        (b.dtype(), b.weak),
    ))?;
    let (rdt, rweak) = rule(dtype::binary_result(
        op,
        (a.dtype(), a.weak),
        (b.dtype(), b.weak),
    ))?;
    let (a, b) = (a.cast(cdt), b.cast(cdt));
    let n = shape::size(&out);
    let not_here = || RtError::internal(format!("{op} on {cdt}"));
    let buf = match dtype::binary_class(op) {
        Some(BinaryClass::Arith) => dispatch_numeric!(cdt, T => {
            let (x, y) = (typed::<T>(&a)?, typed::<T>(&b)?);
            check_int_operands(op, y, n)?;
            T::wrap(arith::<T>(op, x, a.shape(), y, b.shape(), &out)?)
        }, else return Err(not_here())),
        Some(BinaryClass::Compare) => dispatch_all!(cdt, T => {
            let (x, y) = (typed::<T>(&a)?, typed::<T>(&b)?);
            bool::wrap(zip_broadcast(x, a.shape(), y, b.shape(), &out, compare_fn::<T>(op)?))
        }),
        Some(BinaryClass::Logical) => {
            let (x, y) = (typed::<bool>(&a)?, typed::<bool>(&b)?);
            let f: fn(bool, bool) -> bool = if op == "and" {
                |p, q| p && q
            } else {
                |p, q| p || q
            };
            bool::wrap(zip_broadcast(x, a.shape(), y, b.shape(), &out, f))
        }
        None => return Err(not_here()),
    };
    debug_assert_eq!(buf.dtype(), rdt);
    // The result usually has an operand's shape: share it.
    let t = if out == a.shape() {
        Tensor::with_shape_of(buf, &a)?
    } else if out == b.shape() {
        Tensor::with_shape_of(buf, &b)?
    } else {
        Tensor::new(buf, &out)?
    };
    Ok(Value::Tensor(t.with_weak(rweak)))
}

/// [`binary`] on two scalars of one dtype, i64 or f64, for the operations
/// that cannot fail: what a loop's counter and bound go through on the VM
/// at every step, without the general path's dtype rules, broadcast and
/// allocations. The same results: ints wrap, floats are IEEE, the result
/// is weak when both operands are, a comparison gives a strong bool.
/// `None` for anything else.
fn scalar_binary(op: &str, a: &Tensor, b: &Tensor) -> Option<Tensor> {
    if !a.shape().is_empty() || !b.shape().is_empty() || a.dtype() != b.dtype() {
        return None;
    }
    let weak = a.weak && b.weak;
    fn compare<T: PartialOrd>(op: &str, x: T, y: T) -> Option<Tensor> {
        Some(Tensor::scalar_bool(match op {
            "eq" => x == y,
            "ne" => x != y,
            "lt" => x < y,
            "le" => x <= y,
            "gt" => x > y,
            "ge" => x >= y,
            _ => return None,
        }))
    }
    match a.dtype() {
        DType::I64 => {
            let (x, y) = (a.slice::<i64>()?[0], b.slice::<i64>()?[0]);
            let v = match op {
                "add" => x.wrapping_add(y),
                "sub" => x.wrapping_sub(y),
                "mul" => x.wrapping_mul(y),
                _ => return compare(op, x, y),
            };
            Some(Tensor::scalar_i64(v).with_weak(weak))
        }
        DType::F64 => {
            let (x, y) = (a.slice::<f64>()?[0], b.slice::<f64>()?[0]);
            let v = match op {
                "add" => x + y,
                "sub" => x - y,
                "mul" => x * y,
                "div" => x / y,
                _ => return compare(op, x, y),
            };
            Some(Tensor::scalar_f64(v).with_weak(weak))
        }
        _ => None,
    }
}

/// `where(c, a, b)`: `a` where the bool `c` holds, else `b`; all three broadcast.
pub fn where_(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "where";
    arity(op, args, 3)?;
    let c = tensor(op, &args[0], "the condition")?;
    let a = tensor(op, &args[1], "x")?;
    let b = tensor(op, &args[2], "y")?;
    let out = rule(shape::broadcast_all(op, &[c.ty(), a.ty(), b.ty()]))?;
    let (dt, weak) = rule(dtype::where_result(
        (c.dtype(), c.weak),
        (a.dtype(), a.weak),
        (b.dtype(), b.weak),
    ))?;
    let c = broadcast_tensor(c, &out)?;
    let a = broadcast_tensor(&a.cast(dt), &out)?;
    let b = broadcast_tensor(&b.cast(dt), &out)?;
    let cond = typed::<bool>(&c)?;
    let buf = dispatch_all!(dt, T => {
        let (x, y) = (typed::<T>(&a)?, typed::<T>(&b)?);
        T::wrap(cond.iter().zip(x.iter().zip(y)).map(|(&k, (&p, &q))| if k { p } else { q }).collect())
    });
    Ok(Value::Tensor(Tensor::new(buf, &out)?.with_weak(weak)))
}

/// `cast(x, dtype)`: element-wise conversion (float to int truncates toward
/// zero); the result is strong.
pub fn cast(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "cast";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let Value::DType(dt) = &args[1] else {
        return Err(RtError::new(format!(
            "cast: expected a dtype such as f32, got {}",
            args[1].kind()
        )));
    };
    Ok(Value::Tensor(x.cast(*dt).with_weak(false)))
}

/// `polygamma(n, x)`: the polygamma function `ψ⁽ⁿ⁾(x)`, the `n`-th
/// derivative of digamma, element-wise over `x` for one int order `n`
/// (`0 <= n <= 100`). Typed like the float unary maps (computed in f64).
pub fn polygamma(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "polygamma";
    arity(op, args, 2)?;
    let n = int(op, &args[0], "the order n")?;
    let n = u32::try_from(n)
        .ok()
        .filter(|n| *n <= POLYGAMMA_MAX_ORDER)
        .ok_or_else(|| {
            RtError::new(format!(
                "{op}: the order n must be between 0 and {POLYGAMMA_MAX_ORDER}, got {n}"
            ))
        })?;
    let x = tensor(op, &args[1], "x")?;
    let (dt, weak) = rule(dtype::float_operand(op, (x.dtype(), x.weak)))?;
    let x = x.cast(dt);
    let f = Polygamma::new(n);
    let buf = dispatch_float!(dt, T => T::wrap(
        typed::<T>(&x)?.iter().map(|&v| T::cast_from(f.eval(v.to_f64()))).collect()
    ), else return Err(RtError::internal(format!("{op} on {dt}"))));
    Ok(Value::Tensor(Tensor::new(buf, x.shape())?.with_weak(weak)))
}

macro_rules! unary_kernels {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "(x)`, element-wise.")]
        pub fn $name(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
            unary(stringify!($name), args)
        }
    )*};
}

macro_rules! binary_kernels {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "(x, y)`, element-wise with broadcasting.")]
        pub fn $name(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
            binary(stringify!($name), args)
        }
    )*};
}

unary_kernels!(
    neg, exp, log, log1p, tanh, sigmoid, relu, sqrt, rsqrt, abs, sign, floor, ceil, lgamma,
    digamma, trigamma, erf, not
);
binary_kernels!(add, sub, mul, div, pow, rem, maximum, minimum, eq, ne, lt, le, gt, ge, and, or);

/// The kernels of the math table's functions ([`crate::math`]).
macro_rules! math_kernels {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, |$x:ident| $value:expr,
        cuda $cuda:literal, cost $cost:literal, on $domain:ident, d $rule:literal; )*) => {
        #[allow(non_snake_case)]
        mod math_kernels {
            use super::*;
            $(
                pub fn $variant(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
                    unary($name, args)
                }
            )*
        }

        /// The kernel of every function of the math table, by name.
        pub const MATH_KERNELS: &[(&str, super::ctx::Kernel)] = &[$(($name, math_kernels::$variant)),*];
    };
}

crate::for_each_math_fn!(math_kernels);

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, f64s, i64s, v};
    use super::*;
    use crate::tensor::DType;

    /// The fast path for scalars gives what the general path gives: value
    /// bits, dtype and weakness, for ints at the edges of their range,
    /// signed zeros, infinities and NaN, and every weakness combination.
    #[test]
    fn scalar_binary_matches_the_general_path() {
        let ints = [0i64, 1, -1, 7, i64::MAX, i64::MIN];
        let floats = [0.0f64, -0.0, 1.5, -2.25, f64::INFINITY, f64::NAN, 1e308];
        let ops = [
            "add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge",
        ];
        let mut operands: Vec<Tensor> = Vec::new();
        for w in [false, true] {
            operands.extend(ints.iter().map(|&x| Tensor::scalar_i64(x).with_weak(w)));
            operands.extend(floats.iter().map(|&x| Tensor::scalar_f64(x).with_weak(w)));
        }
        let mut fast = 0;
        for op in ops {
            for a in &operands {
                for b in &operands {
                    let Some(got) = scalar_binary(op, a, b) else {
                        continue;
                    };
                    fast += 1;
                    let args = [v(a.clone()), v(b.clone())];
                    let Value::Tensor(want) = binary_general(op, &args).unwrap() else {
                        panic!("{op}: not a tensor");
                    };
                    assert_eq!(got.dtype(), want.dtype(), "{op} {a:?} {b:?}");
                    assert_eq!(got.weak, want.weak, "{op} {a:?} {b:?}");
                    let bits = |t: &Tensor| match t.dtype() {
                        DType::F64 => t.slice::<f64>().unwrap()[0].to_bits(),
                        DType::I64 => t.slice::<i64>().unwrap()[0] as u64,
                        _ => t.slice::<bool>().unwrap()[0] as u64,
                    };
                    assert_eq!(bits(&got), bits(&want), "{op} {a:?} {b:?}");
                }
            }
        }
        // Integer division is not on the fast path (it can fail).
        assert!(scalar_binary("div", &operands[1], &operands[1]).is_none());
        assert!(fast > 1000, "{fast}");
    }

    #[test]
    fn unary_floats() {
        let x = v(Tensor::vector(vec![0.0f32, 1.0]));
        assert_eq!(
            call("exp", std::slice::from_ref(&x)),
            v(Tensor::vector(vec![1.0f32, 1.0f32.exp()]))
        );
        assert_eq!(
            call("neg", std::slice::from_ref(&x)),
            v(Tensor::vector(vec![-0.0f32, -1.0]))
        );
        assert_eq!(
            f64s(&call("sqrt", &[v(Tensor::vector(vec![4.0f64, 9.0]))])),
            vec![2.0, 3.0]
        );
        assert_eq!(
            f64s(&call("rsqrt", &[v(Tensor::vector(vec![4.0f64]))])),
            vec![0.5]
        );
        assert_eq!(f64s(&call("log", &[v(Tensor::scalar_f64(1.0))])), vec![0.0]);
        assert_eq!(
            f64s(&call("log1p", &[v(Tensor::scalar_f64(0.0))])),
            vec![0.0]
        );
        assert_eq!(f64s(&call("sin", &[v(Tensor::scalar_f64(0.0))])), vec![0.0]);
        assert_eq!(f64s(&call("cos", &[v(Tensor::scalar_f64(0.0))])), vec![1.0]);
        assert_eq!(
            f64s(&call("tanh", &[v(Tensor::scalar_f64(0.0))])),
            vec![0.0]
        );
        assert_eq!(
            f64s(&call("sigmoid", &[v(Tensor::scalar_f64(0.0))])),
            vec![0.5]
        );
        assert_eq!(
            f64s(&call("relu", &[v(Tensor::vector(vec![-1.0f64, 2.0]))])),
            vec![0.0, 2.0]
        );
        assert_eq!(
            f64s(&call("abs", &[v(Tensor::vector(vec![-1.5f64, 2.0]))])),
            vec![1.5, 2.0]
        );
        assert_eq!(
            f64s(&call("sign", &[v(Tensor::vector(vec![-1.5f64, 0.0, 3.0]))])),
            vec![-1.0, 0.0, 1.0]
        );
        assert_eq!(
            f64s(&call("floor", &[v(Tensor::vector(vec![-1.5f64, 1.5]))])),
            vec![-2.0, 1.0]
        );
        assert_eq!(
            f64s(&call("ceil", &[v(Tensor::vector(vec![-1.5f64, 1.5]))])),
            vec![-1.0, 2.0]
        );
        let lg = f64s(&call(
            "lgamma",
            &[v(Tensor::vector(vec![1.0f64, 4.0, 0.5]))],
        ));
        assert!(lg[0].abs() < 1e-15 && (lg[1] - 6f64.ln()).abs() < 1e-12);
        assert!((lg[2] - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
        let e = f32s(&call("erf", &[v(Tensor::vector(vec![0.0f32, 1.0]))]));
        assert_eq!(e[0], 0.0);
        assert!((e[1] - 0.842_700_8).abs() < 1e-6);
    }

    #[test]
    fn polygamma() {
        // ψ⁽²⁾(1) = -2 ζ(3); order 1 is trigamma, order 0 digamma.
        let r = f64s(&call(
            "polygamma",
            &[v(Tensor::weak_i64(2)), v(Tensor::vector(vec![1.0f64, 0.5]))],
        ));
        assert!((r[0] - -2.4041138063191885).abs() < 1e-14);
        assert!((r[1] - -16.82879664423432).abs() < 1e-12);
        let x = v(Tensor::vector(vec![0.7f32, 3.0]));
        let n1 = call("polygamma", &[v(Tensor::scalar_i32(1)), x.clone()]);
        assert_eq!(n1, call("trigamma", std::slice::from_ref(&x)));
        let n0 = call("polygamma", &[v(Tensor::scalar_i64(0)), x.clone()]);
        assert_eq!(n0, call("digamma", std::slice::from_ref(&x)));
        // A weak int x works in f64 and stays weak.
        let r = call(
            "polygamma",
            &[v(Tensor::weak_i64(3)), v(Tensor::weak_i64(1))],
        );
        let want = std::f64::consts::PI.powi(4) / 15.0;
        match &r {
            Value::Tensor(t) => {
                assert!(t.weak && t.dtype() == DType::F64);
                assert!((f64s(&r)[0] - want).abs() < 1e-13 * want);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            call_err("polygamma", &[v(Tensor::scalar_f64(1.0)), x.clone()])
                .contains("expected an int for the order n, got")
        );
        assert!(call_err("polygamma", &[v(Tensor::weak_i64(-1)), x.clone()])
            .contains("the order n must be between 0 and 100, got -1"));
        assert!(call_err("polygamma", &[v(Tensor::weak_i64(101)), x]).contains("between 0 and 100"));
        assert!(call_err(
            "polygamma",
            &[v(Tensor::weak_i64(2)), v(Tensor::scalar_i64(1))]
        )
        .contains("use a cast"));
    }

    #[test]
    fn unary_weak_and_ints() {
        // A weak int literal works in f64 and stays weak.
        let r = call("exp", &[v(Tensor::weak_i64(0))]);
        assert_eq!(r, v(Tensor::weak_f64(1.0)));
        assert_eq!(
            call_err("exp", &[v(Tensor::scalar_i64(1))]),
            "exp: expected a float operand, got i64; use a cast such as f32(x)"
        );
        assert_eq!(
            call("neg", &[v(Tensor::vector(vec![3i64]))]),
            v(Tensor::vector(vec![-3i64]))
        );
        assert_eq!(
            call("abs", &[v(Tensor::vector(vec![-3i32]))]),
            v(Tensor::vector(vec![3i32]))
        );
        assert_eq!(
            call("relu", &[v(Tensor::weak_i64(-3))]),
            v(Tensor::weak_i64(0))
        );
        assert_eq!(
            call("not", &[v(Tensor::vector(vec![true, false]))]),
            v(Tensor::vector(vec![false, true]))
        );
        assert!(call_err("not", &[v(Tensor::scalar_f32(1.0))]).starts_with("not: expected a bool"));
        assert!(call_err("neg", &[]).starts_with("neg: expected 1 argument, got 0"));
        assert!(call_err("neg", &[Value::unit()]).contains("expected a tensor"));
    }

    #[test]
    fn binary_broadcast_and_promotion() {
        let x = v(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap());
        let y = v(Tensor::vector(vec![10.0f32, 20.0]));
        assert_eq!(
            f32s(&call("add", &[x.clone(), y.clone()])),
            vec![11.0, 22.0, 13.0, 24.0]
        );
        // A weak int adopts f32; the result is strong f32.
        let r = call("mul", &[x.clone(), v(Tensor::weak_i64(2))]);
        assert_eq!(
            r,
            v(Tensor::from_vec(vec![2.0f32, 4.0, 6.0, 8.0], &[2, 2]).unwrap())
        );
        let r = call("pow", &[x.clone(), v(Tensor::weak_i64(2))]);
        assert_eq!(f32s(&r), vec![1.0, 4.0, 9.0, 16.0]);
        assert_eq!(
            call_err(
                "add",
                &[
                    v(Tensor::vector(vec![1.0f32; 3])),
                    v(Tensor::vector(vec![1.0f32; 4]))
                ]
            ),
            "add: shapes f32[3] and f32[4] cannot be broadcast"
        );
        // Strong dtypes promote along bool < u8 < i32 < i64 < f32 < f64.
        assert_eq!(
            call(
                "add",
                &[v(Tensor::scalar_f32(1.0)), v(Tensor::scalar_f64(1.5))]
            ),
            v(Tensor::scalar_f64(2.5))
        );
        // An int tensor meeting a float literal is the default float, f32.
        assert_eq!(
            call(
                "mul",
                &[v(Tensor::vector(vec![1i64, 2])), v(Tensor::weak_f64(0.5))]
            ),
            v(Tensor::vector(vec![0.5f32, 1.0]))
        );
        // Both weak: int with float gives a weak f64.
        assert_eq!(
            call("add", &[v(Tensor::weak_i64(1)), v(Tensor::weak_f64(0.5))]),
            v(Tensor::weak_f64(1.5))
        );
        assert_eq!(
            call("sub", &[v(Tensor::weak_i64(1)), v(Tensor::weak_i64(3))]),
            v(Tensor::weak_i64(-2))
        );
        assert_eq!(
            f64s(&call(
                "maximum",
                &[
                    v(Tensor::vector(vec![1.0f64, 5.0])),
                    v(Tensor::weak_f64(2.0))
                ]
            )),
            vec![2.0, 5.0]
        );
        assert_eq!(
            f64s(&call(
                "minimum",
                &[
                    v(Tensor::vector(vec![1.0f64, 5.0])),
                    v(Tensor::weak_f64(2.0))
                ]
            )),
            vec![1.0, 2.0]
        );
        assert_eq!(
            f64s(&call(
                "div",
                &[v(Tensor::scalar_f64(1.0)), v(Tensor::scalar_f64(4.0))]
            )),
            vec![0.25]
        );
        assert_eq!(
            f64s(&call(
                "rem",
                &[v(Tensor::scalar_f64(-7.5)), v(Tensor::scalar_f64(2.0))]
            )),
            vec![-1.5]
        );
    }

    #[test]
    fn int_arithmetic() {
        let a = v(Tensor::vector(vec![7i64, -7, 7, -7]));
        let b = v(Tensor::vector(vec![2i64, 2, -2, -2]));
        assert_eq!(
            i64s(&call("div", &[a.clone(), b.clone()])),
            vec![3, -3, -3, 3]
        );
        assert_eq!(
            i64s(&call("rem", &[a.clone(), b.clone()])),
            vec![1, -1, 1, -1]
        );
        assert_eq!(
            call_err("div", &[a.clone(), v(Tensor::weak_i64(0))]),
            "div: integer division by zero"
        );
        assert!(call_err("rem", &[a.clone(), v(Tensor::weak_i64(0))]).contains("division by zero"));
        assert_eq!(
            i64s(&call(
                "pow",
                &[v(Tensor::weak_i64(2)), v(Tensor::weak_i64(10))]
            )),
            vec![1024]
        );
        assert!(
            call_err("pow", &[v(Tensor::weak_i64(2)), v(Tensor::weak_i64(-1))])
                .contains("negative exponent -1")
        );
        // The weak int exponent adopts u8.
        let r = call("pow", &[v(Tensor::scalar_u8(3)), v(Tensor::weak_i64(2))]);
        assert_eq!(r, v(Tensor::scalar_u8(9)));
        assert!(call_err(
            "add",
            &[v(Tensor::scalar_bool(true)), v(Tensor::scalar_bool(true))]
        )
        .starts_with("add: expected numeric operands"));
    }

    #[test]
    fn comparisons_and_logic() {
        let a = v(Tensor::vector(vec![1.0f32, 2.0, 3.0]));
        let two = v(Tensor::weak_f64(2.0));
        let bools = |r: &Value| r.as_tensor().unwrap().as_bool().unwrap().to_vec();
        assert_eq!(
            bools(&call("lt", &[a.clone(), two.clone()])),
            vec![true, false, false]
        );
        assert_eq!(
            bools(&call("le", &[a.clone(), two.clone()])),
            vec![true, true, false]
        );
        assert_eq!(
            bools(&call("gt", &[a.clone(), two.clone()])),
            vec![false, false, true]
        );
        assert_eq!(
            bools(&call("ge", &[a.clone(), two.clone()])),
            vec![false, true, true]
        );
        assert_eq!(
            bools(&call("eq", &[a.clone(), two.clone()])),
            vec![false, true, false]
        );
        assert_eq!(
            bools(&call("ne", &[a.clone(), two.clone()])),
            vec![true, false, true]
        );
        let r = call("eq", &[v(Tensor::weak_i64(1)), v(Tensor::weak_i64(1))]);
        assert_eq!(r, v(Tensor::scalar_bool(true)));
        let p = v(Tensor::vector(vec![true, true, false, false]));
        let q = v(Tensor::vector(vec![true, false, true, false]));
        assert_eq!(
            bools(&call("and", &[p.clone(), q.clone()])),
            vec![true, false, false, false]
        );
        assert_eq!(
            bools(&call("or", &[p.clone(), q.clone()])),
            vec![true, true, true, false]
        );
        assert!(call_err("and", &[p, v(Tensor::weak_i64(1))])
            .starts_with("and: expected bool operands"));
    }

    #[test]
    fn where_and_cast() {
        let c = v(Tensor::vector(vec![true, false, true]));
        let a = v(Tensor::vector(vec![1.0f32, 2.0, 3.0]));
        let r = call("where", &[c.clone(), a.clone(), v(Tensor::weak_i64(0))]);
        assert_eq!(r, v(Tensor::vector(vec![1.0f32, 0.0, 3.0])));
        let c2 = v(Tensor::from_vec(vec![true, false], &[2, 1]).unwrap());
        let r = call("where", &[c2, a.clone(), v(Tensor::scalar_f32(-1.0))]);
        assert_eq!(f32s(&r), vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
        assert!(call_err("where", &[a.clone(), a.clone(), a.clone()]).contains("bool condition"));
        let r = call(
            "cast",
            &[
                v(Tensor::vector(vec![-1.9f64, 2.9])),
                Value::DType(DType::I32),
            ],
        );
        assert_eq!(r, v(Tensor::vector(vec![-1i32, 2])));
        let r = call(
            "cast",
            &[v(Tensor::weak_f64(2.5)), Value::DType(DType::F32)],
        );
        assert_eq!(r, v(Tensor::scalar_f32(2.5)));
        assert!(call_err("cast", &[a, Value::unit()]).contains("expected a dtype"));
    }

    mod props {
        use super::super::super::testing::{call, v};
        use crate::tensor::Tensor;
        use proptest::prelude::*;

        /// A shape, and a second shape that broadcasts with it (a suffix with
        /// some dimensions turned into 1s).
        fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
            prop::collection::vec(1usize..4, 0..4)
                .prop_flat_map(|a| {
                    let n = a.len();
                    (Just(a), 0..=n, prop::collection::vec(any::<bool>(), n))
                })
                .prop_map(|(a, keep, ones)| {
                    let start = a.len() - keep;
                    let b = a[start..]
                        .iter()
                        .zip(&ones[start..])
                        .map(|(&d, &one)| if one { 1 } else { d })
                        .collect();
                    (a, b)
                })
        }

        fn filled(shape: &[usize], seed: f64) -> Tensor {
            let n = shape.iter().product::<usize>();
            let data = (0..n).map(|i| seed * (i as f64 + 1.0) - 3.0).collect();
            Tensor::from_vec::<f64>(data, shape).unwrap()
        }

        proptest! {
            #[test]
            fn broadcasting_add_commutes((sa, sb) in shapes(), x in -5.0f64..5.0, y in -5.0f64..5.0) {
                let a = v(filled(&sa, x));
                let b = v(filled(&sb, y));
                let ab = call("add", &[a.clone(), b.clone()]);
                let ba = call("add", &[b, a]);
                prop_assert_eq!(ab.as_tensor().unwrap().shape(), &sa[..]);
                prop_assert_eq!(ab, ba);
            }

            #[test]
            fn mul_by_one_is_identity((sa, _) in shapes(), x in -5.0f64..5.0) {
                let a = v(filled(&sa, x));
                prop_assert_eq!(call("mul", &[a.clone(), v(Tensor::weak_i64(1))]), a);
            }
        }
    }
}
