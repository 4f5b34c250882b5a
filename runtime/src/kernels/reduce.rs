//! Reductions: `sum mean max min prod argmax` over all axes, one axis or a
//! tuple of axes, with `keepdims`.
//!
//! Elements are visited in row-major order, so results are deterministic.
//! Float sums, means and products accumulate in f64 and round once.

use super::args::{arity, bool_or, opt_ints, rule, tensor, typed};
use super::ctx::Ctx;
use super::strided::{fold_into, offsets};
use crate::error::RtError;
use crate::tensor::{Element, Tensor};
use crate::value::Value;
use crate::{dispatch_all, dispatch_numeric, dtype, shape};

/// For every input element (row-major), the offset of its output element.
pub(crate) fn output_offsets(in_shape: &[usize], reduced: &[usize]) -> super::strided::Offsets {
    offsets(in_shape, &output_strides(in_shape, reduced))
}

/// The strides that map an input position to its output element: the
/// output's row-major strides on kept axes, 0 on reduced ones.
fn output_strides(in_shape: &[usize], reduced: &[usize]) -> Vec<usize> {
    let kept: Vec<usize> = in_shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !reduced.contains(i))
        .map(|(_, &d)| d)
        .collect();
    let kept_strides = shape::strides(&kept);
    let mut k = 0;
    (0..in_shape.len())
        .map(|i| {
            if reduced.contains(&i) {
                0
            } else {
                k += 1;
                kept_strides[k - 1]
            }
        })
        .collect()
}

/// The layout of a reduction: the input's shape and, per input axis, the
/// output stride (0 on reduced axes).
struct Layout<'a> {
    shape: &'a [usize],
    out_strides: Vec<usize>,
    n_out: usize,
}

fn accumulate<T: Element, A: Copy>(x: &[T], l: &Layout, init: A, f: impl Fn(A, T) -> A) -> Vec<A> {
    fold_into(x, l.shape, &l.out_strides, l.n_out, init, f)
}

fn sum_prod<T: Element>(op: &str, x: &[T], l: &Layout) -> Vec<T> {
    let is_sum = op == "sum";
    if T::DTYPE.is_float() {
        let a = if is_sum {
            accumulate(x, l, 0.0f64, |a, v| a + v.to_f64())
        } else {
            accumulate(x, l, 1.0f64, |a, v| a * v.to_f64())
        };
        a.into_iter().map(T::cast_from).collect()
    } else {
        let a = if is_sum {
            accumulate(x, l, 0i64, |a, v| a.wrapping_add(v.to_i64()))
        } else {
            accumulate(x, l, 1i64, |a, v| a.wrapping_mul(v.to_i64()))
        };
        a.into_iter().map(T::cast_from).collect()
    }
}

/// Whether `new` replaces `best` for `max`/`argmax` (`min` with `less`):
/// strictly better, or the first NaN.
pub(crate) fn better<T: Element>(new: T, best: T, less: bool) -> bool {
    if best.is_nan() {
        return false;
    }
    new.is_nan() || if less { new < best } else { new > best }
}

fn extremum<T: Element>(x: &[T], l: &Layout, less: bool) -> Vec<T> {
    let best = accumulate(x, l, None, |b: Option<T>, v| match b {
        Some(b) if !better(v, b, less) => Some(b),
        _ => Some(v),
    });
    // Every output saw at least one element: the caller rejects empty
    // reductions, so the fallback is never used.
    best.into_iter().flatten().collect()
}

fn arg_extremum<T: Element>(x: &[T], offs: super::strided::Offsets, n_out: usize) -> Vec<i64> {
    let mut best: Vec<Option<T>> = vec![None; n_out];
    let mut seen = vec![0i64; n_out];
    let mut arg = vec![0i64; n_out];
    for (&v, o) in x.iter().zip(offs) {
        match best[o] {
            Some(b) if !better(v, b, false) => {}
            _ => {
                best[o] = Some(v);
                arg[o] = seen[o];
            }
        }
        seen[o] += 1;
    }
    arg
}

/// A reduction kernel: `op(x, axis, keepdims)`.
pub fn reduction(op: &str, args: &[Value]) -> Result<Value, RtError> {
    arity(op, args, 3)?;
    let x = tensor(op, &args[0], "x")?;
    let axes = opt_ints(op, &args[1], "axis")?;
    let keepdims = bool_or(op, &args[2], "keepdims", false)?;
    if op == "argmax" {
        if let Some(a) = &axes {
            if a.len() != 1 {
                return Err(RtError::new(format!(
                    "argmax: expected one axis, got {}",
                    a.len()
                )));
            }
        }
    }
    let reduced = rule(shape::reduce_axes(op, x.ty(), axes.as_deref()))?;
    let out_shape = rule(shape::reduce(op, x.ty(), axes.as_deref(), keepdims))?;
    let (rdt, rweak) = rule(dtype::reduce_result(op, (x.dtype(), x.weak)))?;
    let n_out = shape::size(&out_shape);
    let count: usize = reduced.iter().map(|&a| x.shape()[a]).product();
    if count == 0 && n_out > 0 && matches!(op, "max" | "min" | "argmax") {
        return Err(RtError::new(format!(
            "{op}: cannot reduce an empty axis of {}",
            x.type_string()
        )));
    }
    let x = match op {
        "sum" | "prod" | "mean" => x.cast(rdt),
        _ => x.clone(),
    };
    let layout = Layout {
        shape: x.shape(),
        out_strides: output_strides(x.shape(), &reduced),
        n_out,
    };
    let l = &layout;
    let dt = x.dtype();
    let buf = match op {
        "sum" | "prod" => {
            dispatch_numeric!(dt, T => T::wrap(sum_prod(op, typed::<T>(&x)?, l)),
            else return Err(RtError::internal("bool sum")))
        }
        "mean" => dispatch_numeric!(dt, T => {
            let sums = accumulate(typed::<T>(&x)?, l, 0.0f64, |a, v| a + v.to_f64());
            T::wrap(sums.into_iter().map(|s| T::cast_from(s / count as f64)).collect())
        }, else return Err(RtError::internal("bool mean"))),
        "max" | "min" => {
            dispatch_all!(dt, T => T::wrap(extremum(typed::<T>(&x)?, l, op == "min")))
        }
        "argmax" => dispatch_all!(dt, T => {
            let offs = output_offsets(x.shape(), &reduced);
            i64::wrap(arg_extremum(typed::<T>(&x)?, offs, n_out))
        }),
        _ => return Err(RtError::internal(format!("{op} is not a reduction"))),
    };
    debug_assert_eq!(buf.dtype(), rdt);
    Ok(Value::Tensor(
        Tensor::new(buf, &out_shape)?.with_weak(rweak),
    ))
}

macro_rules! reduce_kernels {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "(x, axis, keepdims)`.")]
        pub fn $name(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
            reduction(stringify!($name), args)
        }
    )*};
}

reduce_kernels!(sum, mean, max, min, prod, argmax);

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, f64s, i64s, shape_of, v};
    use super::*;
    use crate::tensor::DType;

    fn m() -> Value {
        v(Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3]).unwrap())
    }

    fn axis(a: i64) -> Value {
        v(Tensor::weak_i64(a))
    }

    fn yes() -> Value {
        v(Tensor::scalar_bool(true))
    }

    #[test]
    fn sums() {
        let u = Value::unit();
        assert_eq!(
            call("sum", &[m(), u.clone(), u.clone()]),
            v(Tensor::scalar_f32(21.0))
        );
        assert_eq!(
            f32s(&call("sum", &[m(), axis(0), u.clone()])),
            vec![5.0, 7.0, 9.0]
        );
        assert_eq!(
            f32s(&call("sum", &[m(), axis(-1), u.clone()])),
            vec![9.0, 12.0]
        );
        let r = call("sum", &[m(), axis(1), yes()]);
        assert_eq!(shape_of(&r), vec![2, 1]);
        let both = Value::tuple(vec![axis(0), axis(1)]);
        assert_eq!(
            call("sum", &[m(), both, u.clone()]),
            v(Tensor::scalar_f32(21.0))
        );
        let r = call(
            "sum",
            &[
                v(Tensor::vector(vec![true, true, false])),
                u.clone(),
                u.clone(),
            ],
        );
        assert_eq!(r, v(Tensor::scalar_i64(2)));
        // Weak inputs give weak results.
        let r = call(
            "sum",
            &[
                v(Tensor::vector(vec![1i64, 2]).with_weak(true)),
                u.clone(),
                u.clone(),
            ],
        );
        assert_eq!(r, v(Tensor::weak_i64(3)));
        assert_eq!(
            call_err("sum", &[m(), axis(2), u.clone()]),
            "sum: axis 2 is out of range for f32[2, 3]"
        );
        assert!(call_err("sum", &[m(), u.clone()]).starts_with("sum: expected 3 arguments"));
        // Empty sums are 0; empty products are 1; empty means are NaN.
        let e = v(Tensor::zeros(DType::F64, &[0]).unwrap());
        assert_eq!(
            f64s(&call("sum", &[e.clone(), u.clone(), u.clone()])),
            vec![0.0]
        );
        assert_eq!(
            f64s(&call("prod", &[e.clone(), u.clone(), u.clone()])),
            vec![1.0]
        );
        assert!(f64s(&call("mean", &[e, u.clone(), u]))
            .first()
            .unwrap()
            .is_nan());
    }

    #[test]
    fn means_and_products() {
        let u = Value::unit();
        assert_eq!(
            f32s(&call("mean", &[m(), axis(0), u.clone()])),
            vec![2.5, 3.5, 4.5]
        );
        assert_eq!(
            f32s(&call("prod", &[m(), axis(1), u.clone()])),
            vec![15.0, 48.0]
        );
        let ints = v(Tensor::vector(vec![2i64, 3, 4]));
        assert_eq!(
            i64s(&call("prod", &[ints.clone(), u.clone(), u.clone()])),
            vec![24]
        );
        assert!(call_err("mean", &[ints, u.clone(), u.clone()]).contains("use a cast"));
        let r = call(
            "mean",
            &[
                v(Tensor::vector(vec![1i64, 2]).with_weak(true)),
                u.clone(),
                u,
            ],
        );
        assert_eq!(r, v(Tensor::weak_f64(1.5)));
    }

    #[test]
    fn extrema() {
        let u = Value::unit();
        assert_eq!(
            f32s(&call("max", &[m(), axis(1), u.clone()])),
            vec![5.0, 6.0]
        );
        assert_eq!(
            f32s(&call("min", &[m(), axis(0), u.clone()])),
            vec![1.0, 2.0, 3.0]
        );
        assert_eq!(
            call("max", &[m(), u.clone(), u.clone()]),
            v(Tensor::scalar_f32(6.0))
        );
        let nan = v(Tensor::vector(vec![1.0f64, f64::NAN, 3.0]));
        assert!(f64s(&call("max", &[nan.clone(), u.clone(), u.clone()]))[0].is_nan());
        assert!(f64s(&call("min", &[nan, u.clone(), u.clone()]))[0].is_nan());
        let e = v(Tensor::zeros(DType::F32, &[0, 2]).unwrap());
        assert_eq!(
            call_err("max", &[e.clone(), axis(0), u.clone()]),
            "max: cannot reduce an empty axis of f32[0, 2]"
        );
        // Reducing the non-empty axis of an empty tensor is fine.
        assert_eq!(shape_of(&call("max", &[e, axis(1), u])), vec![0]);
    }

    #[test]
    fn argmaxes() {
        let u = Value::unit();
        assert_eq!(
            call("argmax", &[m(), u.clone(), u.clone()]),
            v(Tensor::scalar_i64(5))
        );
        assert_eq!(
            i64s(&call("argmax", &[m(), axis(1), u.clone()])),
            vec![1, 2]
        );
        assert_eq!(
            i64s(&call("argmax", &[m(), axis(0), u.clone()])),
            vec![1, 0, 1]
        );
        // The first maximal element wins.
        let t = v(Tensor::vector(vec![3i32, 7, 7, 1]));
        assert_eq!(
            call("argmax", &[t, u.clone(), u.clone()]),
            v(Tensor::scalar_i64(1))
        );
        let r = call("argmax", &[m(), axis(1), yes()]);
        assert_eq!(shape_of(&r), vec![2, 1]);
        let two = Value::tuple(vec![axis(0), axis(1)]);
        assert!(call_err("argmax", &[m(), two, u]).contains("one axis"));
    }
}
