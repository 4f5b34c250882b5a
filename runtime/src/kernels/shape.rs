//! Shape kernels: `reshape transpose broadcast_to concat stack expand_dims
//! squeeze shape size dtype`.
//!
//! Reshapes share the input's buffer; the others copy.

use super::args::{arity, int, ints, opt_ints, rule, shape as shape_arg, tensor, tuple, typed};
use super::ctx::Ctx;
use super::strided::{broadcast_tensor, remap_strided};
use crate::error::RtError;
use crate::shape::{self, TensorTy};
use crate::tensor::{Element, Tensor};
use crate::value::Value;
use crate::{dispatch_all, dtype};

/// `reshape(x, shape)`: the same elements in a new shape; one dimension may be -1.
pub fn reshape(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "reshape";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let target = ints(op, &args[1], "shape")?;
    let out = rule(shape::reshape(x.ty(), &target))?;
    Ok(Value::Tensor(x.reshape(&out)?))
}

/// `transpose(x, perm)`: axes permuted; `perm` omitted reverses them.
pub fn transpose(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "transpose";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let perm = opt_ints(op, &args[1], "perm")?;
    Ok(Value::Tensor(transpose_tensor(x, perm.as_deref())?))
}

/// `x` with its axes permuted by `perm` (reversed when `None`).
pub fn transpose_tensor(x: &Tensor, perm: Option<&[i64]>) -> Result<Tensor, RtError> {
    let perm = rule(shape::transpose_perm(x.ty(), perm))?;
    let out: Vec<usize> = perm.iter().map(|&a| x.shape()[a]).collect();
    let st = shape::strides(x.shape());
    let pst: Vec<usize> = perm.iter().map(|&a| st[a]).collect();
    remap_strided(x, &out, &pst)
}

/// `broadcast_to(x, shape)`: NumPy broadcasting to exactly `shape`.
pub fn broadcast_to(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "broadcast_to";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let target = shape_arg(op, &args[1])?;
    let out = rule(shape::broadcast_to(op, x.ty(), &target))?;
    Ok(Value::Tensor(broadcast_tensor(x, &out)?))
}

/// The tensors of a tuple argument, converted to their common dtype.
fn common_tensors(op: &str, v: &Value) -> Result<(Vec<Tensor>, bool), RtError> {
    let items = tuple(op, v, "the tensors")?;
    let ts: Vec<&Tensor> = items
        .iter()
        .map(|x| tensor(op, x, "each element"))
        .collect::<Result<_, _>>()?;
    let kinds: Vec<(crate::DType, bool)> = ts.iter().map(|t| (t.dtype(), t.weak)).collect();
    let (dt, weak) = rule(dtype::promote_all(op, &kinds))?;
    Ok((ts.iter().map(|t| t.cast(dt)).collect(), weak))
}

/// Interleaves blocks: for each of `outer` rows, `chunks[i]` elements of part `i`.
fn join<T: Element>(parts: &[&[T]], chunks: &[usize], outer: usize) -> Vec<T> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (p, &c) in parts.iter().zip(chunks) {
            out.extend_from_slice(&p[o * c..(o + 1) * c]);
        }
    }
    out
}

/// Joins tensors of a common dtype whose shapes agree before `axis`.
fn join_tensors(ts: &[Tensor], axis: usize, out: &[usize], weak: bool) -> Result<Tensor, RtError> {
    let outer: usize = out[..axis].iter().product();
    let chunks: Vec<usize> = ts
        .iter()
        .map(|t| shape::size(&t.shape()[axis.min(t.ndim())..]))
        .collect();
    let dt = ts.first().map(|t| t.dtype()).unwrap_or(crate::DType::F64);
    let buf = dispatch_all!(dt, T => {
        let parts: Vec<&[T]> = ts.iter().map(typed::<T>).collect::<Result<_, _>>()?;
        T::wrap(join(&parts, &chunks, outer))
    });
    Ok(Tensor::new(buf, out)?.with_weak(weak))
}

/// `concat(xs, axis)`: joins a tuple of tensors along an existing axis.
pub fn concat(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "concat";
    arity(op, args, 2)?;
    let (ts, weak) = common_tensors(op, &args[0])?;
    let axis = int(op, &args[1], "axis")?;
    let tys: Vec<TensorTy> = ts.iter().map(Tensor::ty).collect();
    let out = rule(shape::concat(&tys, axis))?;
    let ax = rule(shape::axis(op, axis, out.len(), &tys[0]))?;
    Ok(Value::Tensor(join_tensors(&ts, ax, &out, weak)?))
}

/// `stack(xs, axis)`: joins a tuple of equal-shape tensors along a new axis.
pub fn stack(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "stack";
    arity(op, args, 2)?;
    let (ts, weak) = common_tensors(op, &args[0])?;
    let axis = int(op, &args[1], "axis")?;
    let tys: Vec<TensorTy> = ts.iter().map(Tensor::ty).collect();
    let out = rule(shape::stack(&tys, axis))?;
    let ax = rule(shape::axis(op, axis, out.len(), &tys[0]))?;
    Ok(Value::Tensor(join_tensors(&ts, ax, &out, weak)?))
}

/// `expand_dims(x, axis)`: a new axis of size 1.
pub fn expand_dims(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "expand_dims";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let axis = int(op, &args[1], "axis")?;
    let out = rule(shape::expand_dims(x.ty(), axis))?;
    Ok(Value::Tensor(x.reshape(&out)?))
}

/// `squeeze(x, axis)`: removes the given size-1 axes, or all of them.
pub fn squeeze(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "squeeze";
    arity(op, args, 2)?;
    let x = tensor(op, &args[0], "x")?;
    let axes = opt_ints(op, &args[1], "axis")?;
    let out = rule(shape::squeeze(x.ty(), axes.as_deref()))?;
    Ok(Value::Tensor(x.reshape(&out)?))
}

/// `shape(x)`: a tuple of ints. They are weakly typed i64 scalars, like
/// literals: `shape`'s values are compile-time constants.
pub fn shape(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "shape";
    arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    Ok(Value::tuple(
        x.shape()
            .iter()
            .map(|&d| Value::Tensor(Tensor::weak_i64(d as i64)))
            .collect(),
    ))
}

/// `size(x)`: the number of elements, a weakly typed i64 scalar (see [`shape`]).
pub fn size(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "size";
    arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    Ok(Value::Tensor(Tensor::weak_i64(x.len() as i64)))
}

/// `dtype(x)`: the dtype value.
pub fn dtype(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "dtype";
    arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    Ok(Value::DType(x.dtype()))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, i64s, shape_of, v};
    use super::*;
    use crate::DType;

    fn m() -> Value {
        v(Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]).unwrap())
    }

    fn ints_lit(xs: &[i64]) -> Value {
        v(Tensor::vector(xs.to_vec()).with_weak(true))
    }

    fn int(x: i64) -> Value {
        v(Tensor::weak_i64(x))
    }

    #[test]
    fn reshapes() {
        let r = call("reshape", &[m(), ints_lit(&[3, 2])]);
        assert_eq!(shape_of(&r), vec![3, 2]);
        assert_eq!(f32s(&r), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let r = call("reshape", &[m(), ints_lit(&[-1])]);
        assert_eq!(shape_of(&r), vec![6]);
        let shape_tuple = Value::tuple(vec![int(1), int(6)]);
        assert_eq!(shape_of(&call("reshape", &[m(), shape_tuple])), vec![1, 6]);
        assert_eq!(
            call_err("reshape", &[m(), ints_lit(&[4])]),
            "reshape: cannot reshape f32[2, 3] (6 elements) into [4]"
        );
        assert!(
            call_err("reshape", &[m(), v(Tensor::vector(vec![1.0f32]))]).contains("expected ints")
        );
    }

    #[test]
    fn transposes() {
        let r = call("transpose", &[m(), Value::unit()]);
        assert_eq!(shape_of(&r), vec![3, 2]);
        assert_eq!(f32s(&r), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let x = v(Tensor::from_vec((0..24).collect::<Vec<i64>>(), &[2, 3, 4]).unwrap());
        let r = call("transpose", &[x, ints_lit(&[1, 0, 2])]);
        assert_eq!(shape_of(&r), vec![3, 2, 4]);
        assert_eq!(&i64s(&r)[..8], &[0, 1, 2, 3, 12, 13, 14, 15]);
        assert!(call_err("transpose", &[m(), ints_lit(&[0])]).contains("not a permutation"));
    }

    #[test]
    fn broadcasts() {
        let r = call(
            "broadcast_to",
            &[v(Tensor::vector(vec![1i64, 2])), ints_lit(&[2, 2])],
        );
        assert_eq!(i64s(&r), vec![1, 2, 1, 2]);
        assert_eq!(
            call_err("broadcast_to", &[m(), ints_lit(&[3])]),
            "broadcast_to: cannot broadcast f32[2, 3] to [3]"
        );
    }

    #[test]
    fn concats_and_stacks() {
        let a = v(Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]).unwrap());
        let b = v(Tensor::from_vec(vec![3.0f32, 4.0, 5.0, 6.0], &[2, 2]).unwrap());
        let r = call(
            "concat",
            &[Value::tuple(vec![a.clone(), b.clone()]), int(0)],
        );
        assert_eq!(shape_of(&r), vec![3, 2]);
        assert_eq!(f32s(&r), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let c = v(Tensor::from_vec(vec![9.0f32], &[1, 1]).unwrap());
        let r = call("concat", &[Value::tuple(vec![a.clone(), c]), int(-1)]);
        assert_eq!(f32s(&r), vec![1.0, 2.0, 9.0]);
        assert!(call_err(
            "concat",
            &[Value::tuple(vec![a.clone(), b.clone()]), int(1)]
        )
        .contains("differ outside axis 1"));
        let x = v(Tensor::vector(vec![1.0f32, 2.0]));
        let y = v(Tensor::vector(vec![3.0f32, 4.0]));
        let r = call("stack", &[Value::tuple(vec![x.clone(), y.clone()]), int(0)]);
        assert_eq!(f32s(&r), vec![1.0, 2.0, 3.0, 4.0]);
        let r = call("stack", &[Value::tuple(vec![x.clone(), y.clone()]), int(1)]);
        assert_eq!(shape_of(&r), vec![2, 2]);
        assert_eq!(f32s(&r), vec![1.0, 3.0, 2.0, 4.0]);
        // A weak literal joins an f32 tensor as f32.
        let w = v(Tensor::vector(vec![5i64, 6]).with_weak(true));
        let r = call("stack", &[Value::tuple(vec![x.clone(), w]), int(0)]);
        assert_eq!(f32s(&r), vec![1.0, 2.0, 5.0, 6.0]);
        let d = v(Tensor::vector(vec![1.0f64, 2.0]));
        assert_eq!(
            call("stack", &[Value::tuple(vec![x, d]), int(0)]),
            v(Tensor::from_vec(vec![1.0f64, 2.0, 1.0, 2.0], &[2, 2]).unwrap())
        );
        assert!(call_err("concat", &[Value::unit(), int(0)]).contains("at least one"));
    }

    #[test]
    fn dims() {
        let x = v(Tensor::vector(vec![1.0f32, 2.0]));
        assert_eq!(
            shape_of(&call("expand_dims", &[x.clone(), int(0)])),
            vec![1, 2]
        );
        assert_eq!(
            shape_of(&call("expand_dims", &[x.clone(), int(-1)])),
            vec![2, 1]
        );
        let y = v(Tensor::zeros(DType::F32, &[1, 3, 1]).unwrap());
        assert_eq!(
            shape_of(&call("squeeze", &[y.clone(), Value::unit()])),
            vec![3]
        );
        assert_eq!(
            shape_of(&call("squeeze", &[y.clone(), int(-1)])),
            vec![1, 3]
        );
        assert!(call_err("squeeze", &[y.clone(), int(1)]).contains("not 1"));
        let s = call("shape", std::slice::from_ref(&y));
        assert_eq!(s.to_string(), "(1, 3, 1)");
        assert_eq!(
            call("size", std::slice::from_ref(&y)),
            v(Tensor::weak_i64(3))
        );
        assert_eq!(call("dtype", &[y]), Value::DType(DType::F32));
        assert_eq!(
            call("size", &[v(Tensor::scalar_f64(1.0))]),
            v(Tensor::weak_i64(1))
        );
        assert_eq!(call("shape", &[v(Tensor::scalar_f64(1.0))]), Value::unit());
    }

    mod props {
        use super::super::super::testing::{call, v};
        use crate::tensor::Tensor;
        use crate::value::Value;
        use proptest::prelude::*;

        fn lit(xs: &[usize]) -> Value {
            v(Tensor::vector(xs.iter().map(|&d| d as i64).collect::<Vec<i64>>()).with_weak(true))
        }

        proptest! {
            #[test]
            fn reshape_round_trip(shape in prop::collection::vec(0usize..4, 0..4), other in prop::collection::vec(1usize..4, 0..3)) {
                let n: usize = shape.iter().product();
                let x = v(Tensor::from_vec((0..n as i64).collect::<Vec<i64>>(), &shape).unwrap());
                let flat = call("reshape", &[x.clone(), v(Tensor::vector(vec![-1i64]).with_weak(true))]);
                prop_assert_eq!(flat.as_tensor().unwrap().shape(), &[n][..]);
                let back = call("reshape", &[flat, lit(&shape)]);
                prop_assert_eq!(&back, &x);
                // Through a second shape of the same size (with the rest in a -1).
                let m: usize = other.iter().product();
                if m > 0 && n.is_multiple_of(m) {
                    let mut target: Vec<i64> = other.iter().map(|&d| d as i64).collect();
                    target.push(-1);
                    let y = call("reshape", &[x.clone(), v(Tensor::vector(target).with_weak(true))]);
                    prop_assert_eq!(call("reshape", &[y, lit(&shape)]), x);
                }
            }

            #[test]
            fn transpose_inverse_round_trip(shape in prop::collection::vec(1usize..4, 0..4), seed in any::<u64>()) {
                let n: usize = shape.iter().product();
                let x = v(Tensor::from_vec((0..n as i64).collect::<Vec<i64>>(), &shape).unwrap());
                // A permutation from the seed.
                let mut perm: Vec<usize> = (0..shape.len()).collect();
                let mut s = seed;
                for i in (1..perm.len()).rev() {
                    perm.swap(i, (s % (i as u64 + 1)) as usize);
                    s /= i as u64 + 1;
                }
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                let y = call("transpose", &[x.clone(), lit(&perm)]);
                prop_assert_eq!(call("transpose", &[y, lit(&inv)]), x);
            }
        }
    }
}
