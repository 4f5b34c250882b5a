//! Structural kernels: tuples, records and tensor literals.

use super::args::{arity, int, rule, string, tensor, typed};
use super::ctx::Ctx;
use crate::error::RtError;
use crate::tensor::{DType, Element, Tensor};
use crate::value::Value;
use crate::{dispatch_all, dtype};

/// `make_tuple(a, b, ..)`: `(a, b, ..)`.
pub fn make_tuple(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    Ok(Value::tuple(args.to_vec()))
}

/// `tuple_get(t, i)`: `t.i` (a negative `i` counts from the end). Every
/// element of the symbolic zero `zero()` is `zero()`.
pub fn tuple_get(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "tuple_get";
    arity(op, args, 2)?;
    if matches!(args[0], Value::Zero) {
        int(op, &args[1], "the index")?;
        return Ok(Value::Zero);
    }
    if let Value::Tape(t) = &args[0] {
        // The list `(top, rest)` the tape stands for.
        let i = int(op, &args[1], "the index")?;
        let n = t.list_len();
        return match (i, t.top()) {
            (0 | -2, Some(top)) => Ok(top),
            (1 | -1, Some(_)) => Ok(Value::Tape(t.rest())),
            _ => Err(RtError::new(format!(
                "index {i} is out of range for a tuple of {n} elements"
            ))),
        };
    }
    let items = super::args::tuple(op, &args[0], "t")?;
    let i = int(op, &args[1], "the index")?;
    let n = items.len() as i64;
    let j = if i < 0 { i + n } else { i };
    if (0..n).contains(&j) {
        Ok(items[j as usize].clone())
    } else {
        Err(RtError::new(format!(
            "index {i} is out of range for a tuple of {n} elements"
        )))
    }
}

/// `tuple_len(t)`: the number of elements of `t`, as a weak i64 (used by
/// `for x in t`).
pub fn tuple_len(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "tuple_len";
    arity(op, args, 1)?;
    let n = match &args[0] {
        Value::Tape(t) => t.list_len(),
        other => super::args::tuple(op, other, "t")?.len(),
    };
    Ok(Value::Tensor(Tensor::weak_i64(n as i64)))
}

/// `make_record(name0, v0, name1, v1, ..)`: `{name0: v0, name1: v1, ..}`,
/// fields in that order; names are strings and must differ.
pub fn make_record(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "make_record";
    if !args.len().is_multiple_of(2) {
        return Err(RtError::new(format!(
            "{op}: expected name and value pairs, got {} arguments",
            args.len()
        )));
    }
    let mut fields: Vec<(std::sync::Arc<str>, Value)> = Vec::with_capacity(args.len() / 2);
    for pair in args.chunks(2) {
        let name = string(op, &pair[0], "a field name")?;
        if fields.iter().any(|(n, _)| &**n == name) {
            return Err(RtError::new(format!("{op}: field `{name}` is repeated")));
        }
        fields.push((name.into(), pair[1].clone()));
    }
    Ok(Value::record(fields))
}

/// `record_get(r, name)`: `r.name`. Every field of the symbolic zero
/// `zero()` is `zero()`.
pub fn record_get(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "record_get";
    arity(op, args, 2)?;
    let name = string(op, &args[1], "the field name")?;
    if matches!(args[0], Value::Zero) {
        return Ok(Value::Zero);
    }
    let Value::Record(r) = &args[0] else {
        return Err(RtError::new(format!(
            "{op}: expected a record, got {}",
            args[0].kind()
        )));
    };
    r.get(name).cloned().ok_or_else(|| {
        let names: Vec<&str> = r.fields.iter().map(|(n, _)| &**n).collect();
        RtError::new(format!(
            "{op}: the record {{{}}} has no field `{name}`",
            names.join(", ")
        ))
    })
}

/// `tensor_literal(e0, e1, ..)`: `[e0, e1, ..]`, the elements (scalars or
/// tensors of one shape) stacked along a new axis 0. The dtype follows the
/// promotion rule; the result is weak iff every element is (so `[1, 2.5]`
/// is a weak f64). `[]` is a weak f64 of shape `[0]`.
pub fn tensor_literal(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "tensor literal";
    let ts: Vec<&Tensor> = args
        .iter()
        .map(|v| tensor(op, v, "each element"))
        .collect::<Result<_, _>>()?;
    let Some(first) = ts.first() else {
        return Ok(Value::Tensor(
            Tensor::zeros(DType::F64, &[0])?.with_weak(true),
        ));
    };
    for t in &ts[1..] {
        if t.shape() != first.shape() {
            return Err(RtError::new(format!(
                "{op}: elements have different shapes {} and {}",
                first.type_string(),
                t.type_string()
            )));
        }
    }
    let kinds: Vec<(DType, bool)> = ts.iter().map(|t| (t.dtype(), t.weak)).collect();
    let (dt, weak) = rule(dtype::promote_all(op, &kinds))?;
    let cast: Vec<Tensor> = ts.iter().map(|t| t.cast(dt)).collect();
    let mut shape = vec![ts.len()];
    shape.extend_from_slice(first.shape());
    let buf = dispatch_all!(dt, T => {
        let mut out: Vec<T> = Vec::with_capacity(crate::shape::size(&shape));
        for t in &cast {
            out.extend_from_slice(typed::<T>(t)?);
        }
        T::wrap(out)
    });
    Ok(Value::Tensor(Tensor::new(buf, &shape)?.with_weak(weak)))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, v};
    use super::*;

    #[test]
    fn tuples() {
        let one = v(Tensor::weak_i64(1));
        let t = call("make_tuple", &[one.clone(), Value::str("s")]);
        assert_eq!(t.to_string(), "(1, s)");
        assert_eq!(call("tuple_get", &[t.clone(), v(Tensor::weak_i64(0))]), one);
        assert_eq!(
            call("tuple_get", &[t.clone(), v(Tensor::weak_i64(-1))]),
            Value::str("s")
        );
        assert_eq!(
            call_err("tuple_get", &[t, v(Tensor::weak_i64(2))]),
            "index 2 is out of range for a tuple of 2 elements"
        );
        assert_eq!(call("make_tuple", &[]), Value::unit());
    }

    #[test]
    fn records() {
        let r = call(
            "make_record",
            &[
                Value::str("w"),
                v(Tensor::scalar_f32(1.0)),
                Value::str("b"),
                v(Tensor::scalar_f32(2.0)),
            ],
        );
        assert_eq!(r.to_string(), "{w: 1.0, b: 2.0}");
        assert_eq!(
            call("record_get", &[r.clone(), Value::str("b")]),
            v(Tensor::scalar_f32(2.0))
        );
        assert_eq!(
            call_err("record_get", &[r, Value::str("c")]),
            "record_get: the record {w, b} has no field `c`"
        );
        assert!(call_err("make_record", &[Value::str("w")]).contains("pairs"));
        let dup = [
            Value::str("w"),
            Value::unit(),
            Value::str("w"),
            Value::unit(),
        ];
        assert!(call_err("make_record", &dup).contains("repeated"));
    }

    #[test]
    fn literals() {
        let r = call(
            "tensor_literal",
            &[v(Tensor::weak_f64(1.0)), v(Tensor::weak_f64(2.0))],
        );
        assert_eq!(r, v(Tensor::vector(vec![1.0f64, 2.0]).with_weak(true)));
        let row = |a: i64, b: i64| {
            call(
                "tensor_literal",
                &[v(Tensor::weak_i64(a)), v(Tensor::weak_i64(b))],
            )
        };
        let m = call("tensor_literal", &[row(1, 2), row(3, 4)]);
        assert_eq!(m.to_string(), "[[1, 2], [3, 4]]");
        assert_eq!(m.as_tensor().unwrap().type_string(), "i64[2, 2]");
        assert!(m.as_tensor().unwrap().weak);
        // Mixed weak int and float: a weak float.
        let r = call(
            "tensor_literal",
            &[v(Tensor::weak_i64(1)), v(Tensor::weak_f64(2.5))],
        );
        assert_eq!(r, v(Tensor::vector(vec![1.0f64, 2.5]).with_weak(true)));
        // A strong element makes the literal strong, of its dtype.
        let r = call(
            "tensor_literal",
            &[v(Tensor::scalar_f32(1.0)), v(Tensor::weak_i64(2))],
        );
        assert_eq!(r, v(Tensor::vector(vec![1.0f32, 2.0])));
        let r = call(
            "tensor_literal",
            &[v(Tensor::scalar_bool(true)), v(Tensor::scalar_bool(false))],
        );
        assert_eq!(r, v(Tensor::vector(vec![true, false])));
        let empty = call("tensor_literal", &[]);
        assert_eq!(empty.as_tensor().unwrap().shape(), &[0]);
        assert!(
            call_err("tensor_literal", &[row(1, 2), v(Tensor::weak_i64(3))])
                .contains("different shapes")
        );
        assert_eq!(
            call(
                "tensor_literal",
                &[v(Tensor::scalar_f32(1.0)), v(Tensor::scalar_f64(2.0))]
            ),
            v(Tensor::vector(vec![1.0f64, 2.0]))
        );
    }
}
