//! Decoding kernel arguments: arity, tensors, ints, axes, shapes, dtypes.
//!
//! Every helper names the operation and the parameter in its error, so a
//! kernel is a few lines of decoding followed by the computation.

use crate::error::RtError;
use crate::tensor::{DType, Element, Tensor};
use crate::value::Value;

/// Exactly `n` arguments.
pub fn arity(op: &str, args: &[Value], n: usize) -> Result<(), RtError> {
    if args.len() == n {
        Ok(())
    } else {
        Err(RtError::new(format!(
            "{op}: expected {n} argument{}, got {}",
            if n == 1 { "" } else { "s" },
            args.len()
        )))
    }
}

/// At least `n` arguments.
pub fn min_arity(op: &str, args: &[Value], n: usize) -> Result<(), RtError> {
    if args.len() >= n {
        Ok(())
    } else {
        Err(RtError::new(format!(
            "{op}: expected at least {n} argument{}, got {}",
            if n == 1 { "" } else { "s" },
            args.len()
        )))
    }
}

/// A tensor argument.
pub fn tensor<'a>(op: &str, v: &'a Value, what: &str) -> Result<&'a Tensor, RtError> {
    v.as_tensor().ok_or_else(|| {
        RtError::new(format!(
            "{op}: expected a tensor for {what}, got {}",
            v.kind()
        ))
    })
}

/// An int scalar argument (i32, i64 or u8; weak or strong).
pub fn int(op: &str, v: &Value, what: &str) -> Result<i64, RtError> {
    v.as_tensor()
        .and_then(Tensor::to_i64_scalar)
        .or_else(|| uniform_int(v))
        .ok_or_else(|| {
            RtError::new(format!(
                "{op}: expected an int for {what}, got {}",
                v.kind()
            ))
        })
}

/// The int every lane of a mapped int scalar holds, when they all hold
/// the same: an index that reached a primitive through a mapped value
/// (a tape recorded under `vmap`) although it never depended on a lane.
fn uniform_int(v: &Value) -> Option<i64> {
    let Value::Batched(b) = v else { return None };
    if !b.logical().is_empty() || b.t.dtype().is_float() {
        return None;
    }
    let all = b.t.as_i64_vec();
    let first = *all.first()?;
    all.iter().all(|&x| x == first).then_some(first)
}

/// An optional int argument: `()` is `None`.
pub fn opt_int(op: &str, v: &Value, what: &str) -> Result<Option<i64>, RtError> {
    if v.is_unit() {
        Ok(None)
    } else {
        int(op, v, what).map(Some)
    }
}

/// A list of ints: an int scalar (one item), a tuple of int scalars, or a
/// 1-d int tensor (the literal `[3, 4]`). An empty tuple or an empty 1-d
/// tensor of any dtype (the literal `[]`) is the empty list.
pub fn ints(op: &str, v: &Value, what: &str) -> Result<Vec<i64>, RtError> {
    let bad = || RtError::new(format!("{op}: expected ints for {what}, got {}", v.kind()));
    match v {
        Value::Tensor(t) if t.is_empty() && t.ndim() == 1 => Ok(Vec::new()),
        Value::Tensor(t) if t.dtype().is_int() && t.ndim() <= 1 => Ok(t.as_i64_vec()),
        Value::Tuple(items) => items
            .iter()
            .map(|x| {
                x.as_tensor()
                    .and_then(Tensor::to_i64_scalar)
                    .ok_or_else(bad)
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// An optional list of ints: `()` is `None`.
pub fn opt_ints(op: &str, v: &Value, what: &str) -> Result<Option<Vec<i64>>, RtError> {
    if v.is_unit() {
        Ok(None)
    } else {
        ints(op, v, what).map(Some)
    }
}

/// A shape: a list of non-negative ints (see [`ints`]).
pub fn shape(op: &str, v: &Value) -> Result<Vec<usize>, RtError> {
    let dims = ints(op, v, "shape")?;
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| RtError::new(format!("{op}: invalid dimension {d} in the shape")))
        })
        .collect::<Result<_, _>>()?;
    let n = crate::shape::checked_size(&shape)
        .ok_or_else(|| RtError::new(format!("{op}: the shape is too large")))?;
    crate::shape::check_alloc(op, n).map_err(RtError::new)?;
    Ok(shape)
}

/// A dtype argument, or `default` for `()`.
pub fn dtype_or(op: &str, v: &Value, default: DType) -> Result<DType, RtError> {
    match v {
        Value::DType(d) => Ok(*d),
        _ if v.is_unit() => Ok(default),
        _ => Err(RtError::new(format!(
            "{op}: expected a dtype such as f32, got {}",
            v.kind()
        ))),
    }
}

/// A bool scalar argument, or `default` for `()`.
pub fn bool_or(op: &str, v: &Value, what: &str, default: bool) -> Result<bool, RtError> {
    if v.is_unit() {
        return Ok(default);
    }
    v.as_tensor()
        .and_then(Tensor::to_bool_scalar)
        .ok_or_else(|| {
            RtError::new(format!(
                "{op}: expected a bool for {what}, got {}",
                v.kind()
            ))
        })
}

/// A string argument.
pub fn string<'a>(op: &str, v: &'a Value, what: &str) -> Result<&'a str, RtError> {
    v.as_str().ok_or_else(|| {
        RtError::new(format!(
            "{op}: expected a string for {what}, got {}",
            v.kind()
        ))
    })
}

/// The IO state token.
pub fn io(op: &str, v: &Value) -> Result<(), RtError> {
    match v {
        Value::Io => Ok(()),
        _ => Err(RtError::new(format!(
            "{op}: expected the io token first, got {}",
            v.kind()
        ))),
    }
}

/// A tuple argument.
pub fn tuple<'a>(op: &str, v: &'a Value, what: &str) -> Result<&'a [Value], RtError> {
    v.as_tuple().ok_or_else(|| {
        RtError::new(format!(
            "{op}: expected a tuple for {what}, got {}",
            v.kind()
        ))
    })
}

/// The typed elements of a tensor already converted to `T`'s dtype; a
/// mismatch is a runtime bug, not a user error.
pub fn typed<T: Element>(t: &Tensor) -> Result<&[T], RtError> {
    t.slice::<T>().ok_or_else(|| {
        RtError::internal(format!(
            "expected a {} buffer, found {}",
            T::DTYPE,
            t.dtype()
        ))
    })
}

/// Wraps a `String` message from a pure rule (shape or dtype) into an error.
pub fn rule<T>(r: Result<T, String>) -> Result<T, RtError> {
    r.map_err(RtError::new)
}
