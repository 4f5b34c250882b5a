//! Tree helpers over nested tuples and records: `tree_map`, `tree_sum`.
//!
//! A tree is a tuple or record whose elements are trees; anything else
//! (normally a tensor) is a leaf.

use super::ad::add_values;
use super::args::{min_arity, rule};
use super::ctx::Ctx;
use super::map::binary;
use super::reduce::reduction;
use crate::error::RtError;
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{dtype, DType};

fn structure(v: &Value) -> String {
    match v {
        Value::Tuple(t) => format!("a tuple of {}", t.len()),
        Value::Record(r) => {
            let names: Vec<&str> = r.fields.iter().map(|(n, _)| &**n).collect();
            format!("a record {{{}}}", names.join(", "))
        }
        other => format!("a leaf ({})", other.kind()),
    }
}

fn mismatch(a: &Value, b: &Value) -> RtError {
    RtError::new(format!(
        "tree_map: the trees differ: {} and {}",
        structure(a),
        structure(b)
    ))
}

fn map_rec(ctx: &mut dyn Ctx, f: &Value, trees: &[&Value]) -> Result<Value, RtError> {
    let first = trees[0];
    match first {
        Value::Tuple(items) => {
            let mut others = Vec::with_capacity(trees.len() - 1);
            for t in &trees[1..] {
                let p = match t {
                    Value::Zero => Some(vec![*t; items.len()]),
                    Value::Tuple(o) if o.len() == items.len() => Some(o.iter().collect()),
                    _ => None,
                };
                others.push(p.ok_or_else(|| mismatch(first, t))?);
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let mut sub = vec![item];
                sub.extend(others.iter().map(|o| o[i]));
                out.push(map_rec(ctx, f, &sub)?);
            }
            Ok(Value::tuple(out))
        }
        Value::Record(rec) => {
            let mut others = Vec::with_capacity(trees.len() - 1);
            for t in &trees[1..] {
                let p = match t {
                    Value::Zero => Some(vec![*t; rec.fields.len()]),
                    Value::Record(o)
                        if o.fields.len() == rec.fields.len()
                            && o.fields.iter().zip(&rec.fields).all(|(a, b)| a.0 == b.0) =>
                    {
                        Some(o.fields.iter().map(|(_, v)| v).collect())
                    }
                    _ => None,
                };
                others.push(p.ok_or_else(|| mismatch(first, t))?);
            }
            let mut out = Vec::with_capacity(rec.fields.len());
            for (i, (name, item)) in rec.fields.iter().enumerate() {
                let mut sub = vec![item];
                sub.extend(others.iter().map(|o| o[i]));
                out.push((name.clone(), map_rec(ctx, f, &sub)?));
            }
            Ok(Value::record(out))
        }
        _ => {
            let leaves: Vec<Value> = trees.iter().map(|&v| v.clone()).collect();
            ctx.call(f, &leaves)
        }
    }
}

/// `tree_map(f, t, t2, ..)`: `f` applied leafwise over trees of the same
/// structure (same tuple lengths, same record fields in the same order).
/// The first tree's structure decides: where it has a leaf, the others may
/// have any value, which `f` receives whole (JAX's rule: the first tree is
/// a prefix of the others); where it has a tuple or record, a symbolic
/// `zero()` in another tree stands for that structure with `zero()` at
/// every leaf (the derivatives of `tree_map` rely on both).
pub fn tree_map(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    min_arity("tree_map", args, 2)?;
    let trees: Vec<&Value> = args[1..].iter().collect();
    map_rec(ctx, &args[0], &trees)
}

/// `tree_gadd(t)`: the `gadd` of every leaf of tree `t`, `zero()` for a
/// tree without leaves (the sum of the environments of a function that
/// `tree_map` applied, in its derivative).
pub fn tree_gadd(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    super::args::arity("tree_gadd", args, 1)?;
    let mut stack = vec![&args[0]];
    let mut total = Value::Zero;
    while let Some(v) = stack.pop() {
        match v {
            // In reverse, so that leaves are added in tree order.
            Value::Tuple(items) => stack.extend(items.iter().rev()),
            Value::Record(r) => stack.extend(r.fields.iter().rev().map(|(_, x)| x)),
            leaf => total = add_values(&total, leaf)?,
        }
    }
    Ok(total)
}

fn leaves<'a>(v: &'a Value, out: &mut Vec<&'a Tensor>) -> Result<(), RtError> {
    match v {
        Value::Tuple(items) => items.iter().try_for_each(|x| leaves(x, out)),
        Value::Record(r) => r.fields.iter().try_for_each(|(_, x)| leaves(x, out)),
        Value::Tensor(t) => {
            out.push(t);
            Ok(())
        }
        // A symbolic zero cotangent contributes nothing.
        Value::Zero => Ok(()),
        other => Err(RtError::new(format!(
            "tree_sum: expected tensors in the tree, got {}",
            other.kind()
        ))),
    }
}

/// `tree_sum(t)`: the sum of every element of every leaf, a scalar of the
/// leaves' common dtype (an empty tree sums to a weak `0.0`). Symbolic
/// zeros (`zero()`) in the tree are skipped.
pub fn tree_sum(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "tree_sum";
    super::args::arity(op, args, 1)?;
    let mut ts = Vec::new();
    leaves(&args[0], &mut ts)?;
    let kinds: Vec<(DType, bool)> = ts
        .iter()
        .map(|t| dtype::reduce_result("sum", (t.dtype(), t.weak)))
        .collect::<Result<_, _>>()
        .map_err(RtError::new)?;
    rule(dtype::promote_all(op, &kinds))?;
    let mut total = Value::Tensor(Tensor::weak_f64(0.0));
    for (i, t) in ts.iter().enumerate() {
        let s = reduction(
            "sum",
            &[Value::Tensor((*t).clone()), Value::unit(), Value::unit()],
        )?;
        total = if i == 0 {
            s
        } else {
            binary("add", &[total, s])?
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, try_call, v, TestCtx};
    use super::*;
    use crate::value::{Closure, CodeId};
    use std::sync::Arc;

    fn func(code: u32) -> Value {
        Value::Func(Arc::new(Closure {
            code: CodeId(code),
            captures: vec![],
        }))
    }

    fn params(w: f32, b: f32) -> Value {
        Value::record(vec![
            ("w", v(Tensor::vector(vec![w, w]))),
            (
                "inner",
                Value::tuple(vec![v(Tensor::scalar_f32(b)), v(Tensor::scalar_f32(b))]),
            ),
        ])
    }

    #[test]
    fn maps() {
        let r = tree_map(
            &mut TestCtx::default(),
            &[func(0), params(1.0, 2.0), params(10.0, 20.0)],
        )
        .unwrap();
        assert_eq!(r, params(11.0, 22.0));
        let r = call("tree_map", &[func(1), params(1.0, 2.0)]);
        assert_eq!(r, params(-1.0, -2.0));
        assert_eq!(call("tree_map", &[func(1), Value::unit()]), Value::unit());
        let other = Value::record(vec![("w", v(Tensor::scalar_f32(1.0)))]);
        assert!(
            call_err("tree_map", &[func(0), params(1.0, 2.0), other]).contains("the trees differ")
        );
        let t1 = Value::tuple(vec![v(Tensor::scalar_f32(1.0))]);
        let t2 = Value::tuple(vec![v(Tensor::scalar_f32(1.0)), v(Tensor::scalar_f32(1.0))]);
        assert!(call_err("tree_map", &[func(0), t1, t2]).contains("a tuple of 1 and a tuple of 2"));
        assert!(try_call("tree_map", &[func(0)]).is_err());
    }

    #[test]
    fn the_first_tree_decides() {
        let s = |x: f32| v(Tensor::scalar_f32(x));
        let pair = |a: Value, b: Value| Value::tuple(vec![a, b]);
        // Where the first tree has a leaf, `f` gets the others' subtrees whole.
        let r = call(
            "tree_map",
            &[
                func(3),
                pair(s(1.0), s(2.0)),
                pair(pair(s(3.0), s(4.0)), s(5.0)),
            ],
        );
        assert_eq!(
            r,
            pair(pair(s(1.0), pair(s(3.0), s(4.0))), pair(s(2.0), s(5.0)))
        );
        // zero() stands for a tree of zeros of the first tree's structure.
        let r = call("tree_map", &[func(3), params(1.0, 2.0), Value::Zero]);
        let z = |x: f32| pair(s(x), Value::Zero);
        let want = Value::record(vec![
            ("w", pair(v(Tensor::vector(vec![1.0f32, 1.0])), Value::Zero)),
            ("inner", pair(z(2.0), z(2.0))),
        ]);
        assert_eq!(r, want);
        // A leaf of the others where the first has a tuple still differs.
        assert!(
            call_err("tree_map", &[func(0), pair(s(1.0), s(2.0)), s(1.0)])
                .contains("the trees differ: a tuple of 2 and a leaf")
        );
    }

    #[test]
    fn gadds() {
        let s = |x: f64| v(Tensor::scalar_f64(x));
        let t = Value::tuple(vec![
            s(1.0),
            Value::Zero,
            Value::record(vec![("a", s(2.0)), ("b", Value::tuple(vec![]))]),
        ]);
        assert_eq!(call("tree_gadd", &[t]), s(3.0));
        assert_eq!(call("tree_gadd", &[Value::unit()]), Value::Zero);
        assert_eq!(call("tree_gadd", &[Value::Zero]), Value::Zero);
        let bad = Value::tuple(vec![s(1.0), Value::str("x")]);
        assert!(try_call("tree_gadd", &[bad]).is_err());
    }

    #[test]
    fn sums() {
        assert_eq!(
            call("tree_sum", &[params(1.0, 2.0)]),
            v(Tensor::scalar_f32(6.0))
        );
        assert_eq!(call("tree_sum", &[Value::unit()]), v(Tensor::weak_f64(0.0)));
        let mixed = Value::tuple(vec![v(Tensor::scalar_f32(1.0)), v(Tensor::scalar_f64(1.0))]);
        assert_eq!(call("tree_sum", &[mixed]), v(Tensor::scalar_f64(2.0)));
        let with_zero = Value::tuple(vec![Value::Zero, params(1.0, 2.0)]);
        assert_eq!(call("tree_sum", &[with_zero]), v(Tensor::scalar_f32(6.0)));
        assert_eq!(call("tree_sum", &[Value::Zero]), v(Tensor::weak_f64(0.0)));
        let bad = Value::tuple(vec![Value::str("x")]);
        assert!(call_err("tree_sum", &[bad]).contains("expected tensors"));
    }
}
