//! Scans and orderings along one axis: `cumsum(x, axis, reverse)`,
//! `cumprod(x, axis, reverse)` and `argsort(x, axis)`. Without an axis
//! (`()`) the tensor is taken flattened, as NumPy does.
//!
//! A lane is the 1-d run of elements along the axis; a tensor of shape
//! `[.., n, ..]` has `outer * inner` of them, element `k` of lane
//! `(o, j)` at `(o * n + k) * inner + j` in row-major order.

use super::args::{arity, bool_or, opt_int, rule, tensor, typed};
use super::ctx::Ctx;
use crate::error::RtError;
use crate::tensor::{Element, Tensor};
use crate::value::Value;
use crate::{dispatch_all, dispatch_numeric, dtype, shape};

/// The lanes of a tensor of shape `dims` along `axis`: (outer, n, inner).
fn lanes(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

/// The positions of the elements of every lane, in lane order (reversed
/// when `reverse`), one lane after another.
fn for_each_lane(
    dims: &[usize],
    axis: usize,
    reverse: bool,
    mut f: impl FnMut(&mut dyn Iterator<Item = usize>),
) {
    let (outer, n, inner) = lanes(dims, axis);
    for o in 0..outer {
        for j in 0..inner {
            let at = move |k: usize| (o * n + k) * inner + j;
            if reverse {
                f(&mut (0..n).rev().map(at));
            } else {
                f(&mut (0..n).map(at));
            }
        }
    }
}

/// Running sums or products along the lanes. Floats accumulate in f64
/// and round each partial result once (as the reductions do); ints wrap.
fn scan<T: Element>(x: &[T], dims: &[usize], axis: usize, reverse: bool, product: bool) -> Vec<T> {
    let mut out = x.to_vec();
    for_each_lane(dims, axis, reverse, |lane| {
        if T::DTYPE.is_float() {
            let mut acc = if product { 1.0f64 } else { 0.0 };
            for i in lane {
                let v = x[i].to_f64();
                acc = if product { acc * v } else { acc + v };
                out[i] = T::cast_from(acc);
            }
        } else {
            let mut acc = i64::from(product);
            for i in lane {
                let v = x[i].to_i64();
                acc = if product {
                    acc.wrapping_mul(v)
                } else {
                    acc.wrapping_add(v)
                };
                out[i] = T::cast_from(acc);
            }
        }
    });
    out
}

/// `cumsum(x, axis, reverse)` and `cumprod(x, axis, reverse)`: element
/// `k` of a lane is the sum (product) of elements `0..=k` (`k..` when
/// `reverse`). A bool tensor scans as i64, as `sum` reduces it.
fn scan_kernel(op: &str, args: &[Value]) -> Result<Value, RtError> {
    arity(op, args, 3)?;
    let x = tensor(op, &args[0], "x")?;
    let axis = opt_int(op, &args[1], "axis")?;
    let reverse = bool_or(op, &args[2], "reverse", false)?;
    let (out_shape, axis) = rule(shape::scan(op, x.ty(), axis))?;
    let reduce_op = if op == "cumsum" { "sum" } else { "prod" };
    let (rdt, rweak) = rule(dtype::reduce_result(reduce_op, (x.dtype(), x.weak)))?;
    let x = x.cast(rdt);
    let product = op == "cumprod";
    let buf = dispatch_numeric!(rdt, T => T::wrap(scan(typed::<T>(&x)?, &out_shape, axis, reverse, product)),
        else return Err(RtError::internal("bool scan")));
    Ok(Value::Tensor(
        Tensor::new(buf, &out_shape)?.with_weak(rweak),
    ))
}

/// `cumsum(x, axis, reverse)`.
pub fn cumsum(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    scan_kernel("cumsum", args)
}

/// `cumprod(x, axis, reverse)`.
pub fn cumprod(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    scan_kernel("cumprod", args)
}

/// The order of `a` and `b` for sorting: ascending, NaN after every
/// number (as NumPy sorts).
fn order<T: Element>(a: T, b: T) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(std::cmp::Ordering::Equal),
    }
}

fn argsort_lanes<T: Element>(x: &[T], dims: &[usize], axis: usize) -> Vec<i64> {
    let mut out = vec![0i64; x.len()];
    let mut lane_pos: Vec<usize> = Vec::new();
    let mut keys: Vec<usize> = Vec::new();
    for_each_lane(dims, axis, false, |lane| {
        lane_pos.clear();
        lane_pos.extend(lane);
        keys.clear();
        keys.extend(0..lane_pos.len());
        // Stable: equal elements keep their order (as JAX's argsort).
        keys.sort_by(|&a, &b| order(x[lane_pos[a]], x[lane_pos[b]]));
        for (k, &from) in keys.iter().enumerate() {
            out[lane_pos[k]] = from as i64;
        }
    });
    out
}

/// `argsort(x, axis)`: per lane, the indices that sort it ascending
/// (stable; NaN last), as i64.
pub fn argsort(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "argsort";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let axis = opt_int(op, &args[1], "axis")?;
    let (out_shape, axis) = rule(shape::scan(op, x.ty(), axis))?;
    let idx = dispatch_all!(x.dtype(), T => argsort_lanes(typed::<T>(x)?, &out_shape, axis));
    Ok(Value::Tensor(Tensor::from_vec(idx, &out_shape)?))
}

/// `is_unit(v)`: whether `v` is `()` (how the standard library tells an
/// omitted `axis` from a given one).
pub fn is_unit(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("is_unit", args, 1)?;
    Ok(Value::Tensor(Tensor::scalar_bool(args[0].is_unit())))
}

/// `is_tuple(v)`: whether `v` is a tuple.
pub fn is_tuple(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("is_tuple", args, 1)?;
    Ok(Value::Tensor(Tensor::scalar_bool(matches!(
        args[0],
        Value::Tuple(_)
    ))))
}

/// `fail(message)`: the error `message`.
pub fn fail(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("fail", args, 1)?;
    Err(RtError::new(
        super::args::string("fail", &args[0], "message")?.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, f64s, i64s, shape_of, v};
    use super::*;

    fn m() -> Value {
        v(Tensor::from_vec(vec![1.0f64, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3]).unwrap())
    }

    fn int(a: i64) -> Value {
        v(Tensor::weak_i64(a))
    }

    fn flag(b: bool) -> Value {
        v(Tensor::scalar_bool(b))
    }

    #[test]
    fn cumsum_along_axes_and_flattened() {
        let r = call("cumsum", &[m(), int(1), flag(false)]);
        assert_eq!(f64s(&r), vec![1.0, 6.0, 9.0, 4.0, 6.0, 12.0]);
        let r = call("cumsum", &[m(), int(0), flag(false)]);
        assert_eq!(f64s(&r), vec![1.0, 5.0, 3.0, 5.0, 7.0, 9.0]);
        let r = call("cumsum", &[m(), Value::unit(), flag(false)]);
        assert_eq!(shape_of(&r), vec![6]);
        assert_eq!(f64s(&r), vec![1.0, 6.0, 9.0, 13.0, 15.0, 21.0]);
        let r = call("cumsum", &[m(), int(-1), flag(true)]);
        assert_eq!(f64s(&r), vec![9.0, 8.0, 3.0, 12.0, 8.0, 6.0]);
    }

    #[test]
    fn cumprod_and_bool_scans() {
        let r = call("cumprod", &[m(), int(1), flag(false)]);
        assert_eq!(f64s(&r), vec![1.0, 5.0, 15.0, 4.0, 8.0, 48.0]);
        let b = v(Tensor::from_vec(vec![true, false, true], &[3]).unwrap());
        let r = call("cumsum", &[b, Value::unit(), flag(false)]);
        assert_eq!(i64s(&r), vec![1, 1, 2]);
    }

    #[test]
    fn argsort_is_stable_with_nan_last() {
        let x = v(Tensor::from_vec(vec![2.0f64, f64::NAN, 1.0, 2.0, -1.0], &[5]).unwrap());
        let r = call("argsort", &[x, int(-1)]);
        assert_eq!(i64s(&r), vec![4, 2, 0, 3, 1]);
        let r = call("argsort", &[m(), int(0)]);
        assert_eq!(i64s(&r), vec![0, 1, 0, 1, 0, 1]);
    }
}
