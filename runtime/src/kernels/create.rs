//! Creation kernels: `zeros ones full zeros_like ones_like arange eye one_hot`.
//!
//! The dtype argument defaults to f32 when omitted, except `arange` of an
//! int (i64) and `full` of a strongly typed value (that value's dtype).
//! Results are strong, except `zeros_like`/`ones_like`, which copy their
//! argument's type exactly.

use super::args::{arity, dtype_or, int, rule, shape as shape_arg, tensor};
use super::ctx::Ctx;
use super::strided::broadcast_tensor;
use crate::error::RtError;
use crate::shape;
use crate::tensor::{Buffer, DType, Tensor};
use crate::value::Value;

/// A tensor of `shape` filled with `v`, converted to `dtype`.
fn filled(shape: &[usize], v: f64, dtype: DType) -> Result<Tensor, RtError> {
    let n = shape::size(shape);
    Tensor::new(
        Buffer::F64(std::sync::Arc::new(vec![v; n])).cast(dtype),
        shape,
    )
}

/// `zeros(shape, dtype)`.
pub fn zeros(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "zeros";
    arity(op, args, 2)?;
    let s = shape_arg(op, &args[0])?;
    let dt = dtype_or(op, &args[1], DType::F32)?;
    Ok(Value::Tensor(Tensor::zeros(dt, &s)?))
}

/// `ones(shape, dtype)`.
pub fn ones(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "ones";
    arity(op, args, 2)?;
    let s = shape_arg(op, &args[0])?;
    let dt = dtype_or(op, &args[1], DType::F32)?;
    Ok(Value::Tensor(filled(&s, 1.0, dt)?))
}

/// `full(shape, v, dtype)`: `v` (a scalar, or a tensor that broadcasts to
/// `shape`) repeated. Without a dtype: `v`'s dtype if `v` is strong, else f32.
pub fn full(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "full";
    arity(op, args, 3)?;
    let s = shape_arg(op, &args[0])?;
    let v = tensor(op, &args[1], "the fill value")?;
    let default = if v.weak { DType::F32 } else { v.dtype() };
    let dt = dtype_or(op, &args[2], default)?;
    rule(shape::broadcast_to(op, v.ty(), &s))?;
    let t = broadcast_tensor(&v.cast(dt), &s)?;
    Ok(Value::Tensor(t.with_weak(false)))
}

/// `zeros_like(x)`: zeros of `x`'s dtype, shape and weakness.
pub fn zeros_like(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "zeros_like";
    arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    Ok(Value::Tensor(
        Tensor::zeros(x.dtype(), x.shape())?.with_weak(x.weak),
    ))
}

/// `ones_like(x)`: ones of `x`'s dtype, shape and weakness.
pub fn ones_like(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "ones_like";
    arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    Ok(Value::Tensor(
        filled(x.shape(), 1.0, x.dtype())?.with_weak(x.weak),
    ))
}

/// `grad_seed(y)`: `ones_like(y)` for a float scalar `y`; the seed of a
/// `grad` of a function value, whose result no type check saw.
pub fn grad_seed(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("grad_seed", args, 1)?;
    match &args[0] {
        Value::Tensor(t) if t.shape().is_empty() && t.dtype().is_float() => ones_like(ctx, args),
        Value::Tensor(t) => Err(RtError::new(format!(
            "`grad` needs the function to return a float scalar, but it returns {}; use `vjp` for functions with non-scalar results",
            t.ty()
        ))),
        other => Err(RtError::new(format!(
            "`grad` needs the function to return a float scalar, but it returns a {}",
            other.kind()
        ))),
    }
}

/// `arange(n, dtype)`: `0, 1, .., n-1` (`ceil(n)` values for a float `n`).
/// Default dtype: i64 for an int `n`, f32 for a float.
pub fn arange(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "arange";
    arity(op, args, 2)?;
    let n = tensor(op, &args[0], "n")?;
    let bad = || {
        RtError::new(format!(
            "arange: expected a scalar number for n, got {}",
            n.type_string()
        ))
    };
    if let Some(k) = n.to_i64_scalar() {
        rule(shape::check_alloc(op, k.max(0) as usize))?;
        let dt = dtype_or(op, &args[1], DType::I64)?;
        let t = Tensor::vector((0..k.max(0)).collect::<Vec<i64>>());
        return Ok(Value::Tensor(t.cast(dt)));
    }
    let x = n
        .to_f64_scalar()
        .filter(|_| n.dtype().is_float())
        .ok_or_else(bad)?;
    if !x.is_finite() || x > (1u64 << 40) as f64 {
        return Err(RtError::new(format!("arange: invalid length {x}")));
    }
    let count = x.ceil().max(0.0) as usize;
    let dt = dtype_or(op, &args[1], DType::F32)?;
    let t = Tensor::vector((0..count).map(|i| i as f64).collect::<Vec<f64>>());
    Ok(Value::Tensor(t.cast(dt)))
}

/// `eye(n, dtype)`: the `n×n` identity.
pub fn eye(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "eye";
    arity(op, args, 2)?;
    let n = int(op, &args[0], "n")?;
    let n = usize::try_from(n).map_err(|_| RtError::new(format!("eye: invalid size {n}")))?;
    let dt = dtype_or(op, &args[1], DType::F32)?;
    let size = n
        .checked_mul(n)
        .ok_or_else(|| RtError::new(format!("eye: size {n} is too large")))?;
    rule(shape::check_alloc(op, size))?;
    let mut v = vec![0.0f64; size];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    Ok(Value::Tensor(Tensor::from_vec(v, &[n, n])?.cast(dt)))
}

/// `one_hot(labels, n, dtype)`: `labels.shape ++ [n]`, 1 at each label.
pub fn one_hot(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "one_hot";
    arity(op, args, 3)?;
    let labels = tensor(op, &args[0], "labels")?;
    let n = int(op, &args[1], "n")?;
    let dt = dtype_or(op, &args[2], DType::F32)?;
    let out = rule(shape::one_hot(labels.ty(), n))?;
    let classes = n as usize;
    rule(shape::check_alloc(op, shape::size(&out)))?;
    let mut v = vec![0.0f64; shape::size(&out)];
    for (row, label) in labels.as_i64_vec().into_iter().enumerate() {
        if !(0..n).contains(&label) {
            return Err(RtError::new(format!(
                "one_hot: label {label} is out of range for {n} classes"
            )));
        }
        v[row * classes + label as usize] = 1.0;
    }
    Ok(Value::Tensor(Tensor::from_vec(v, &out)?.cast(dt)))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, f64s, i64s, shape_of, v};
    use super::*;

    fn lit(xs: &[i64]) -> Value {
        v(Tensor::vector(xs.to_vec()).with_weak(true))
    }

    #[test]
    fn constants() {
        let u = Value::unit();
        let z = call("zeros", &[lit(&[2, 3]), u.clone()]);
        assert_eq!(z, v(Tensor::zeros(DType::F32, &[2, 3]).unwrap()));
        let o = call("ones", &[lit(&[2]), Value::DType(DType::F64)]);
        assert_eq!(o, v(Tensor::vector(vec![1.0f64, 1.0])));
        let f = call("full", &[lit(&[2]), v(Tensor::weak_f64(2.5)), u.clone()]);
        assert_eq!(f, v(Tensor::vector(vec![2.5f32, 2.5])));
        let f = call("full", &[lit(&[2]), v(Tensor::scalar_i32(7)), u.clone()]);
        assert_eq!(f, v(Tensor::vector(vec![7i32, 7])));
        let f = call(
            "full",
            &[
                lit(&[2, 2]),
                v(Tensor::vector(vec![1.0f64, 2.0])),
                u.clone(),
            ],
        );
        assert_eq!(f64s(&f), vec![1.0, 2.0, 1.0, 2.0]);
        assert!(call_err(
            "full",
            &[lit(&[2]), v(Tensor::vector(vec![1.0f64; 3])), u.clone()]
        )
        .contains("cannot broadcast"));
        let s = Value::tuple(vec![v(Tensor::weak_i64(3))]);
        assert_eq!(shape_of(&call("zeros", &[s, u.clone()])), vec![3]);
        assert_eq!(
            shape_of(&call("zeros", &[Value::unit(), u.clone()])),
            Vec::<usize>::new()
        );
        assert!(call_err("zeros", &[lit(&[-1]), u.clone()]).contains("invalid dimension -1"));
        assert!(
            call_err("zeros", &[lit(&[2]), v(Tensor::weak_i64(1))]).contains("expected a dtype")
        );
        let x = v(Tensor::vector(vec![1i32, 2]));
        assert_eq!(
            call("zeros_like", std::slice::from_ref(&x)),
            v(Tensor::vector(vec![0i32, 0]))
        );
        assert_eq!(call("ones_like", &[x]), v(Tensor::vector(vec![1i32, 1])));
        assert_eq!(
            call("ones_like", &[v(Tensor::weak_f64(3.0))]),
            v(Tensor::weak_f64(1.0))
        );
    }

    #[test]
    fn ranges() {
        let u = Value::unit();
        assert_eq!(
            i64s(&call("arange", &[v(Tensor::weak_i64(4)), u.clone()])),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            f32s(&call(
                "arange",
                &[v(Tensor::weak_i64(3)), Value::DType(DType::F32)]
            )),
            vec![0.0, 1.0, 2.0]
        );
        assert_eq!(
            f32s(&call("arange", &[v(Tensor::weak_f64(2.5)), u.clone()])),
            vec![0.0, 1.0, 2.0]
        );
        assert_eq!(
            i64s(&call("arange", &[v(Tensor::weak_i64(-2)), u.clone()])),
            Vec::<i64>::new()
        );
        assert!(
            call_err("arange", &[v(Tensor::vector(vec![1i64])), u.clone()])
                .contains("scalar number")
        );
        let e = call("eye", &[v(Tensor::weak_i64(2)), u.clone()]);
        assert_eq!(f32s(&e), vec![1.0, 0.0, 0.0, 1.0]);
        assert!(call_err("eye", &[v(Tensor::weak_i64(-2)), u]).contains("invalid size"));
    }

    #[test]
    fn one_hots() {
        let labels = v(Tensor::vector(vec![2i64, 0]));
        let r = call(
            "one_hot",
            &[labels.clone(), v(Tensor::weak_i64(3)), Value::unit()],
        );
        assert_eq!(shape_of(&r), vec![2, 3]);
        assert_eq!(f32s(&r), vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(
            call_err("one_hot", &[labels, v(Tensor::weak_i64(2)), Value::unit()]),
            "one_hot: label 2 is out of range for 2 classes"
        );
    }
}
