//! Kernels of the values made by differentiation: the symbolic zero,
//! environments of free-variable cotangents, cotangent addition, the
//! finalisation of gradients, and the adjoints of reindexing primitives.
//!
//! A cotangent mirrors the structure of its forward value: a tensor for a
//! tensor, a tuple for a tuple, a record for a record, an environment
//! ([`Value::Env`]) for a closure. [`Value::Zero`] stands for a cotangent
//! known to be zero, whatever its structure; the adjoint kernels pass it
//! through (`take_grad(x, idx, axis, zero())` is `zero()`), and
//! `grad_finalize` replaces it by real zeros at the end.

use std::sync::Arc;

use super::args::{arity, bool_or, int, min_arity, opt_int, opt_ints, rule, string, tensor, typed};
use super::ctx::Ctx;
use super::index::{component, index_view, take_plan};
use super::map::binary;
use super::num::Num;
use super::reduce::{better, output_offsets};
use super::shape::transpose_tensor;
use super::strided::{broadcast_strides, broadcast_tensor, fold_into, offsets_from, remap};
use crate::error::RtError;
use crate::shape::{self, IndexComp, TensorTy};
use crate::tensor::{DType, Element, Tensor};
use crate::value::{Record, Value};
use crate::{dispatch_all, dispatch_numeric};

fn err<T>(msg: String) -> Result<T, RtError> {
    Err(RtError::new(msg))
}

/// `zero()`: the symbolic zero cotangent.
pub fn zero(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("zero", args, 0)?;
    Ok(Value::Zero)
}

/// `is_zero(x)`: whether `x` is the symbolic zero (a bool scalar; a tensor
/// of zeros is not).
pub fn is_zero(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("is_zero", args, 1)?;
    Ok(Value::Tensor(Tensor::scalar_bool(matches!(
        args[0],
        Value::Zero
    ))))
}

/// `stop_gradient(x)`: `x` (its derivative is zero; only AD cares).
pub fn stop_gradient(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("stop_gradient", args, 1)?;
    Ok(args[0].clone())
}

// ---------------------------------------------------------------------------
// Cotangent addition

/// `gadd(a, b)`: the sum of two cotangents of the same structure.
/// `zero()` is the identity; tensors add (with `add`'s broadcasting and
/// promotion; bools or); tuples add element-wise, records field-wise,
/// environments key-wise.
pub fn gadd(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("gadd", args, 2)?;
    add_values(&args[0], &args[1])
}

/// The sum of two cotangents (see [`gadd`]).
pub fn add_values(a: &Value, b: &Value) -> Result<Value, RtError> {
    add_values_with(a, b, &mut |a, b| match (a, b) {
        (Value::Tensor(x), Value::Tensor(y)) => add_tensors(x, y).map(Value::Tensor),
        _ => err(format!("gadd: cannot add {} and {}", a.kind(), b.kind())),
    })
}

/// The sum of two cotangents, structures matched here and the rest (two
/// tensors, say) added by `leaf`.
pub fn add_values_with(
    a: &Value,
    b: &Value,
    leaf: &mut dyn FnMut(&Value, &Value) -> Result<Value, RtError>,
) -> Result<Value, RtError> {
    let op = "gadd";
    let add_values =
        |p: &Value, q: &Value, leaf: &mut dyn FnMut(&Value, &Value) -> Result<Value, RtError>| {
            add_values_with(p, q, leaf)
        };
    match (a, b) {
        (Value::Zero, x) | (x, Value::Zero) => Ok(x.clone()),
        // `()` is how a user's rule says "no cotangent" for a tensor (an
        // int input, say): a zero there, as in inference's rule.
        (u, x @ Value::Tensor(_)) | (x @ Value::Tensor(_), u) if u.is_unit() => Ok(x.clone()),
        (Value::Tuple(x), Value::Tuple(y)) => {
            if x.len() != y.len() {
                return err(format!(
                    "{op}: cannot add tuples of {} and {} elements",
                    x.len(),
                    y.len()
                ));
            }
            let items = x
                .iter()
                .zip(y.iter())
                .map(|(p, q)| add_values(p, q, leaf))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::tuple(items))
        }
        (Value::Record(x), Value::Record(y)) => {
            let names = |r: &Record| {
                let n: Vec<&str> = r.fields.iter().map(|(n, _)| &**n).collect();
                n.join(", ")
            };
            if x.fields.len() != y.fields.len() {
                return err(format!(
                    "{op}: cannot add records {{{}}} and {{{}}}",
                    names(x),
                    names(y)
                ));
            }
            let mut fields = Vec::with_capacity(x.fields.len());
            for (n, p) in &x.fields {
                let Some(q) = y.get(n) else {
                    return err(format!(
                        "{op}: cannot add records {{{}}} and {{{}}}",
                        names(x),
                        names(y)
                    ));
                };
                fields.push((n.clone(), add_values(p, q, leaf)?));
            }
            Ok(Value::Record(Arc::new(Record::new(fields))))
        }
        (Value::Env(x), Value::Env(y)) => {
            let mut out = Vec::with_capacity(x.len() + y.len());
            let (mut i, mut j) = (0, 0);
            while i < x.len() && j < y.len() {
                let (kx, vx) = &x[i];
                let (ky, vy) = &y[j];
                if kx < ky {
                    out.push((*kx, vx.clone()));
                    i += 1;
                } else if ky < kx {
                    out.push((*ky, vy.clone()));
                    j += 1;
                } else {
                    out.push((*kx, add_values(vx, vy, leaf)?));
                    i += 1;
                    j += 1;
                }
            }
            out.extend(x[i..].iter().cloned());
            out.extend(y[j..].iter().cloned());
            Ok(Value::Env(Arc::new(out)))
        }
        _ => leaf(a, b),
    }
}

fn add_tensors(x: &Tensor, y: &Tensor) -> Result<Tensor, RtError> {
    if x.dtype() == DType::Bool && y.dtype() == DType::Bool {
        let r = binary("or", &[Value::Tensor(x.clone()), Value::Tensor(y.clone())]);
        return relabel(r);
    }
    relabel(binary(
        "add",
        &[Value::Tensor(x.clone()), Value::Tensor(y.clone())],
    ))
}

/// A binary kernel's result as a tensor, its error renamed to `gadd`.
fn relabel(r: Result<Value, RtError>) -> Result<Tensor, RtError> {
    match r {
        Ok(Value::Tensor(t)) => Ok(t),
        Ok(v) => Err(RtError::internal(format!("gadd gave {}", v.kind()))),
        Err(mut e) => {
            for prefix in ["add: ", "or: "] {
                if let Some(rest) = e.message.strip_prefix(prefix) {
                    e.message = format!("gadd: {rest}");
                }
            }
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------
// Environments

/// The entries of an environment argument: `zero()` is the empty one.
fn env_entries<'a>(op: &str, v: &'a Value) -> Result<&'a [(u64, Value)], RtError> {
    match v {
        Value::Zero => Ok(&[]),
        Value::Env(e) => Ok(e),
        _ => err(format!("{op}: expected an environment, got {}", v.kind())),
    }
}

fn env_key(op: &str, v: &Value) -> Result<u64, RtError> {
    let k = int(op, v, "the key")?;
    u64::try_from(k).or_else(|_| err(format!("{op}: the key must be >= 0, got {k}")))
}

/// `env_setitem(env, key, v)`: a new environment with `key` bound to `v`
/// (replacing any previous binding); `env` may be `zero()` (empty).
pub fn env_setitem(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "env_setitem";
    arity(op, args, 3)?;
    let entries = env_entries(op, &args[0])?;
    let key = env_key(op, &args[1])?;
    let mut out = entries.to_vec();
    match out.binary_search_by_key(&key, |(k, _)| *k) {
        Ok(i) => out[i].1 = args[2].clone(),
        Err(i) => out.insert(i, (key, args[2].clone())),
    }
    Ok(Value::Env(Arc::new(out)))
}

/// `env_getitem(env, key)`: the value bound to `key`, or `zero()` when
/// there is none (or `env` is `zero()`).
pub fn env_getitem(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "env_getitem";
    arity(op, args, 2)?;
    let entries = env_entries(op, &args[0])?;
    let key = env_key(op, &args[1])?;
    Ok(match entries.binary_search_by_key(&key, |(k, _)| *k) {
        Ok(i) => entries[i].1.clone(),
        Err(_) => Value::Zero,
    })
}

// ---------------------------------------------------------------------------
// Finalisation

/// `grad_finalize(d, x)`: the cotangent `d` of `x` as a value shaped like
/// `x`: every `zero()` becomes zeros of the matching part of `x` (its
/// dtype, shape and weak flag), tensors take `x`'s dtype and weak flag, and
/// parts of `x` that are not tensors (functions, strings, dtypes) give `()`.
pub fn grad_finalize(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("grad_finalize", args, 2)?;
    finalize(&args[0], &args[1])
}

/// The message for a derivative (a cotangent or a tangent) that does not
/// have its value's shape (`got`, `value`: their types as text), also
/// what type inference reports when it finds one before the program runs.
pub fn derivative_shape_message(got: &str, value: &str) -> String {
    format!(
        "a derivative has the shape of its value (the cotangent passed to a `vjp` pullback, \
         what a `bprop` rule returns, the tangents given to `jvp`): got {got} for a value of type {value}"
    )
}

fn finalize(d: &Value, x: &Value) -> Result<Value, RtError> {
    match (d, x) {
        (Value::Zero, _) => zeros_like_value(x),
        // Ints and bools have no derivative: whatever reached them (a cast
        // back from a float, say) is not one.
        (_, Value::Tensor(xt)) if !xt.dtype().is_float() => zeros_like_value(x),
        (Value::Tensor(dt), Value::Tensor(xt)) => {
            if dt.shape() != xt.shape() {
                return err(derivative_shape_message(
                    &dt.type_string(),
                    &xt.type_string(),
                ));
            }
            Ok(Value::Tensor(dt.cast(xt.dtype()).with_weak(xt.weak)))
        }
        (Value::Tuple(ds), Value::Tuple(xs)) if ds.len() == xs.len() => {
            let items = ds
                .iter()
                .zip(xs.iter())
                .map(|(p, q)| finalize(p, q))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::tuple(items))
        }
        (Value::Record(dr), Value::Record(xr))
            if dr.fields.iter().all(|(n, _)| xr.get(n).is_some()) =>
        {
            let fields = xr
                .fields
                .iter()
                .map(|(n, q)| {
                    let p = dr.get(n).unwrap_or(&Value::Zero);
                    Ok((n.clone(), finalize(p, q)?))
                })
                .collect::<Result<Vec<_>, RtError>>()?;
            Ok(Value::Record(Arc::new(Record::new(fields))))
        }
        (_, Value::Tensor(_) | Value::Tuple(_) | Value::Record(_)) => err(format!(
            "a derivative has the structure of its value (the cotangent passed to a `vjp` pullback, \
             what a `bprop` rule returns, the tangents given to `jvp`): got {} for {}",
            d.kind(),
            x.kind()
        )),
        // Functions, strings, dtypes, the IO token: no gradient.
        _ => Ok(Value::unit()),
    }
}

/// Zeros shaped like `x` (see [`grad_finalize`]).
fn zeros_like_value(x: &Value) -> Result<Value, RtError> {
    Ok(match x {
        Value::Tensor(t) => Value::Tensor(Tensor::zeros(t.dtype(), t.shape())?.with_weak(t.weak)),
        Value::Tuple(items) => Value::tuple(
            items
                .iter()
                .map(zeros_like_value)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Value::Record(r) => Value::Record(Arc::new(Record::new(
            r.fields
                .iter()
                .map(|(n, v)| Ok((n.clone(), zeros_like_value(v)?)))
                .collect::<Result<Vec<_>, RtError>>()?,
        ))),
        _ => Value::unit(),
    })
}

// ---------------------------------------------------------------------------
// Adjoints of broadcasting, reductions and reindexing

/// `sum_to(x, like)`: `x` summed over the axes that broadcasting `like`
/// to `x`'s shape added or stretched, so the result has `like`'s shape;
/// `x`'s dtype and weak flag (bools or). `zero()` stays `zero()`.
pub fn sum_to(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "sum_to";
    arity(op, args, 2)?;
    if matches!(args[0], Value::Zero) {
        return Ok(Value::Zero);
    }
    let x = tensor(op, &args[0], "x")?;
    let like = tensor(op, &args[1], "like")?;
    let out = rule(shape::sum_to(x.ty(), like.ty()))?;
    if out == x.shape() {
        return Ok(Value::Tensor(x.clone()));
    }
    Ok(Value::Tensor(sum_to_shape(x, &out)?))
}

/// `x` summed down to `out`, which broadcasts to `x`'s shape.
pub(crate) fn sum_to_shape(x: &Tensor, out: &[usize]) -> Result<Tensor, RtError> {
    let n = shape::size(out);
    let st = broadcast_strides(out, x.shape());
    let xs = x.shape();
    let buf = dispatch_numeric!(x.dtype(), T => {
        let src = typed::<T>(x)?;
        if T::DTYPE.is_float() {
            let acc = fold_into(src, xs, &st, n, 0.0f64, |a, v| a + v.to_f64());
            T::wrap(acc.into_iter().map(T::cast_from).collect())
        } else {
            let acc = fold_into(src, xs, &st, n, 0i64, |a, v| a.wrapping_add(v.to_i64()));
            T::wrap(acc.into_iter().map(T::cast_from).collect())
        }
    }, else {
        let src = typed::<bool>(x)?;
        bool::wrap(fold_into(src, xs, &st, n, false, |a, v| a | v))
    });
    Ok(Tensor::new(buf, out)?.with_weak(x.weak))
}

/// `mT(x)`: `x` with its last two axes swapped (at least 2-d).
pub fn matrix_t(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "mT";
    arity(op, args, 1)?;
    if matches!(args[0], Value::Zero) {
        return Ok(Value::Zero);
    }
    let x = tensor(op, &args[0], "x")?;
    let perm: Vec<i64> = rule(shape::matrix_t_perm(x.ty()))?
        .into_iter()
        .map(|a| a as i64)
        .collect();
    Ok(Value::Tensor(transpose_tensor(x, Some(&perm))?))
}

/// `extremum_mask(x, axis, is_min)`: a tensor of `x`'s shape, dtype and
/// weak flag, 1 at the element `max(x, axis)` (`min` when `is_min`) picks
/// in each group of reduced elements — the first maximal one in row-major
/// order, or the first NaN — and 0 elsewhere. `axis`: `()` for all axes,
/// an int, or a tuple of ints.
pub fn extremum_mask(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "extremum_mask";
    arity(op, args, 3)?;
    let x = tensor(op, &args[0], "x")?;
    let axes = opt_ints(op, &args[1], "axis")?;
    let is_min = bool_or(op, &args[2], "is_min", false)?;
    let reduced = rule(shape::reduce_axes(op, x.ty(), axes.as_deref()))?;
    let n_out = shape::size(&rule(shape::reduce(op, x.ty(), axes.as_deref(), false))?);
    let offs = output_offsets(x.shape(), &reduced);
    let buf = dispatch_all!(x.dtype(), T => {
        let src = typed::<T>(x)?;
        let mut best: Vec<Option<(T, usize)>> = vec![None; n_out];
        for (i, (&v, o)) in src.iter().zip(offs).enumerate() {
            match best[o] {
                Some((b, _)) if !better(v, b, is_min) => {}
                _ => best[o] = Some((v, i)),
            }
        }
        let mut mask = vec![T::cast_from(false); src.len()];
        for (_, i) in best.into_iter().flatten() {
            mask[i] = T::cast_from(true);
        }
        T::wrap(mask)
    });
    Ok(Value::Tensor(
        Tensor::new(buf, x.shape())?.with_weak(x.weak),
    ))
}

/// `transpose_grad(d, perm)`: `d` transposed by the inverse of `perm`
/// (`()`: reversed axes, its own inverse).
pub fn transpose_grad(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "transpose_grad";
    arity(op, args, 2)?;
    if matches!(args[0], Value::Zero) {
        return Ok(Value::Zero);
    }
    let d = tensor(op, &args[0], "d")?;
    let perm = opt_ints(op, &args[1], "perm")?;
    let inv: Vec<i64> = rule(shape::transpose_grad_perm(d.ty(), perm.as_deref()))?
        .into_iter()
        .map(|a| a as i64)
        .collect();
    Ok(Value::Tensor(transpose_tensor(d, Some(&inv))?))
}

/// `len` positions of `t` along axis `ax` from `start`; the axis is
/// removed when `keep` is false (then `len` is 1).
fn slice_axis(
    t: &Tensor,
    ax: usize,
    start: usize,
    len: usize,
    keep: bool,
) -> Result<Tensor, RtError> {
    let st = shape::strides(t.shape());
    let mut out = t.shape().to_vec();
    let mut ost = st.clone();
    if keep {
        out[ax] = len;
    } else {
        out.remove(ax);
        ost.remove(ax);
    }
    if shape::size(&out) == 0 {
        return Ok(Tensor::zeros(t.dtype(), &out)?.with_weak(t.weak));
    }
    remap(t, &out, offsets_from(start * st[ax], &out, &ost))
}

/// `split_like(d, xs, axis)`: the cotangent `d` of `concat(xs, axis)` cut
/// into one piece per element of `xs`, each of that element's shape (and
/// `d`'s dtype). `zero()` gives a tuple of `zero()`s.
pub fn split_like(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "split_like";
    arity(op, args, 3)?;
    let xs = super::args::tuple(op, &args[1], "xs")?;
    let xs: Vec<&Tensor> = xs
        .iter()
        .map(|v| tensor(op, v, "each element of xs"))
        .collect::<Result<_, _>>()?;
    let axis = int(op, &args[2], "axis")?;
    if matches!(args[0], Value::Zero) {
        return Ok(Value::tuple(vec![Value::Zero; xs.len()]));
    }
    let d = tensor(op, &args[0], "d")?;
    let tys: Vec<TensorTy> = xs.iter().map(|t| t.ty()).collect();
    let (ax, shapes) = rule(shape::split_like(d.ty(), &tys, axis))?;
    let mut start = 0;
    let mut out = Vec::with_capacity(shapes.len());
    for s in &shapes {
        out.push(Value::Tensor(slice_axis(d, ax, start, s[ax], true)?));
        start += s[ax];
    }
    Ok(Value::tuple(out))
}

/// `unstack(d, axis)`: the slices of `d` along `axis` (the axis removed),
/// as a tuple: the cotangents of the elements of `stack(xs, axis)`.
/// `zero()` stays `zero()` (every element of it is `zero()`).
pub fn unstack(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "unstack";
    arity(op, args, 2)?;
    let axis = int(op, &args[1], "axis")?;
    if matches!(args[0], Value::Zero) {
        return Ok(Value::Zero);
    }
    let d = tensor(op, &args[0], "d")?;
    let (ax, n, _) = rule(shape::unstack(d.ty(), axis))?;
    let items = (0..n)
        .map(|k| slice_axis(d, ax, k, 1, false).map(Value::Tensor))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::tuple(items))
}

/// `take_grad(x, idx, axis, d)`: zeros of `x`'s type with the cotangent
/// `d` of `take(x, idx, axis)` added at the positions `take` read
/// (repeated indices accumulate). `zero()` stays `zero()`.
pub fn take_grad(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "take_grad";
    arity(op, args, 4)?;
    if matches!(args[3], Value::Zero) {
        return Ok(Value::Zero);
    }
    let x = tensor(op, &args[0], "x")?;
    let idx = tensor(op, &args[1], "the indices")?;
    let axis = opt_int(op, &args[2], "axis")?;
    let d = tensor(op, &args[3], "d")?;
    let plan = take_plan(op, x, idx, axis)?;
    if d.shape() != plan.out.as_slice() {
        return err(format!(
            "{op}: the gradient {} does not match the shape {} of take",
            d.type_string(),
            shape::fmt_shape(&plan.out)
        ));
    }
    let d = d.cast(x.dtype());
    let (outer, dim, inner, np) = (plan.outer, plan.dim, plan.inner, plan.picks.len());
    let buf = dispatch_numeric!(x.dtype(), T => {
        let src = typed::<T>(&d)?;
        let mut out = vec![T::zero(); x.len()];
        for o in 0..outer {
            for (p, &j) in plan.picks.iter().enumerate() {
                let s = (o * np + p) * inner;
                let t = (o * dim + j) * inner;
                for k in 0..inner {
                    out[t + k] = Num::add(out[t + k], src[s + k]);
                }
            }
        }
        T::wrap(out)
    }, else {
        let src = typed::<bool>(&d)?;
        let mut out = vec![false; x.len()];
        for o in 0..outer {
            for (p, &j) in plan.picks.iter().enumerate() {
                let s = (o * np + p) * inner;
                let t = (o * dim + j) * inner;
                for k in 0..inner {
                    out[t + k] |= src[s + k];
                }
            }
        }
        bool::wrap(out)
    });
    Ok(Value::Tensor(
        Tensor::new(buf, x.shape())?.with_weak(x.weak),
    ))
}

/// `index_grad(x, d, c0, c1, ..)`: zeros of `x`'s type with the cotangent
/// `d` of `x[c0, c1, ..]` placed where that index read (components as
/// `index` takes them). `zero()` stays `zero()`.
pub fn index_grad(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "index_grad";
    min_arity(op, args, 2)?;
    if matches!(args[1], Value::Zero) {
        return Ok(Value::Zero);
    }
    let x = tensor(op, &args[0], "x")?;
    let d = tensor(op, &args[1], "d")?;
    let comps: Vec<IndexComp> = args[2..]
        .iter()
        .enumerate()
        .map(|(k, c)| component(op, c, k))
        .collect::<Result<_, _>>()?;
    let (base, out, out_strides) = index_view(x, &comps)?;
    if d.shape() != out.as_slice() {
        return err(format!(
            "{op}: the gradient {} does not match the shape {} of the index",
            d.type_string(),
            shape::fmt_shape(&out)
        ));
    }
    let d = d.cast(x.dtype());
    let buf = dispatch_all!(x.dtype(), T => {
        let src = typed::<T>(&d)?;
        let mut dst = vec![T::cast_from(0i64); x.len()];
        for (o, &v) in offsets_from(base, &out, &out_strides).zip(src) {
            dst[o] = v;
        }
        T::wrap(dst)
    });
    Ok(Value::Tensor(
        Tensor::new(buf, x.shape())?.with_weak(x.weak),
    ))
}

// ---------------------------------------------------------------------------
// Structures

/// `tuple_grad(t, i, d)`: a tuple as long as `t`, `zero()` everywhere but
/// at position `i` (negative counts from the end), which is `d`.
pub fn tuple_grad(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "tuple_grad";
    arity(op, args, 3)?;
    // The symbolic zero has no parts to take a cotangent.
    if matches!(args[0], Value::Zero) {
        int(op, &args[1], "the index")?;
        return Ok(Value::Zero);
    }
    // A tape stands for the list `(top, rest)` (or `()` when empty).
    let n = match &args[0] {
        Value::Tape(t) => t.list_len(),
        other => super::args::tuple(op, other, "t")?.len(),
    } as i64;
    let i = int(op, &args[1], "the index")?;
    let j = if i < 0 { i + n } else { i };
    if !(0..n).contains(&j) {
        return err(format!(
            "{op}: index {i} is out of range for a tuple of {n}"
        ));
    }
    let mut out = vec![Value::Zero; n as usize];
    out[j as usize] = args[2].clone();
    Ok(Value::tuple(out))
}

/// `record_grad(r, name, d)`: a record with `r`'s fields, `zero()` in all
/// but field `name`, which is `d`.
pub fn record_grad(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "record_grad";
    arity(op, args, 3)?;
    if matches!(args[0], Value::Zero) {
        string(op, &args[1], "the field name")?;
        return Ok(Value::Zero);
    }
    let Value::Record(r) = &args[0] else {
        return err(format!("{op}: expected a record, got {}", args[0].kind()));
    };
    let name = string(op, &args[1], "the field name")?;
    if r.get(name).is_none() {
        let names: Vec<&str> = r.fields.iter().map(|(n, _)| &**n).collect();
        return err(format!(
            "{op}: the record {{{}}} has no field `{name}`",
            names.join(", ")
        ));
    }
    let fields = r
        .fields
        .iter()
        .map(|(n, _)| {
            let v = if &**n == name {
                args[2].clone()
            } else {
                Value::Zero
            };
            (n.clone(), v)
        })
        .collect();
    Ok(Value::Record(Arc::new(Record::new(fields))))
}

/// `tree_fill(t, d)`: the tree `t` with every tensor leaf replaced by the
/// scalar `d` broadcast to the leaf's shape, in its dtype and weak flag
/// (the cotangent of `tree_sum(t)`). `zero()` stays `zero()`.
pub fn tree_fill(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "tree_fill";
    arity(op, args, 2)?;
    if matches!(args[1], Value::Zero) {
        return Ok(Value::Zero);
    }
    let d = tensor(op, &args[1], "d")?;
    if d.len() != 1 {
        return err(format!("{op}: expected a scalar, got {}", d.type_string()));
    }
    let d = d.reshape(&[])?;
    fill(&args[0], &d)
}

fn fill(t: &Value, d: &Tensor) -> Result<Value, RtError> {
    match t {
        Value::Tensor(leaf) => Ok(Value::Tensor(
            broadcast_tensor(&d.cast(leaf.dtype()), leaf.shape())?.with_weak(leaf.weak),
        )),
        Value::Tuple(items) => Ok(Value::tuple(
            items
                .iter()
                .map(|v| fill(v, d))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        Value::Record(r) => Ok(Value::Record(Arc::new(Record::new(
            r.fields
                .iter()
                .map(|(n, v)| Ok((n.clone(), fill(v, d)?)))
                .collect::<Result<Vec<_>, RtError>>()?,
        )))),
        other => err(format!(
            "tree_fill: expected tensors in the tree, got {}",
            other.kind()
        )),
    }
}

/// `ad_lift(v, mode)`: `v` as differentiated code (mode 1: reverse, 2:
/// forward) represents it; see [`crate::dynamic`].
pub fn ad_lift(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("ad_lift", args, 3)?;
    let mode = int("ad_lift", &args[1], "the mode")?;
    if !(1..=2).contains(&mode) {
        return Err(RtError::new(format!("ad_lift: unknown mode {mode}")));
    }
    let wrap = int("ad_lift", &args[2], "the nesting")?;
    if !contains_function(&args[0]) {
        return Ok(args[0].clone());
    }
    ctx.transform(
        &args[0],
        &crate::kernels::ctx::DynOp::Lift {
            mode: mode as u8,
            wrap,
        },
    )
}

/// `ad_dyn(f, kind, argnums, wrap)`: `grad(f)` (or `value_and_grad`,
/// `vjp`, `jvp`) of a function value; see [`crate::dynamic`].
pub fn ad_dyn(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("ad_dyn", args, 4)?;
    let kind = string("ad_dyn", &args[1], "the transform")?.to_string();
    let argnums = string("ad_dyn", &args[2], "argnums")?.to_string();
    let wrap = int("ad_dyn", &args[3], "the nesting")?;
    if !matches!(args[0], Value::Func(_)) {
        return Err(RtError::new(format!(
            "{kind} needs a function, got {}",
            args[0].kind()
        )));
    }
    ctx.transform(
        &args[0],
        &crate::kernels::ctx::DynOp::Request {
            kind,
            argnums,
            wrap,
        },
    )
}

/// `ad_hide(x)`: `x` (the compiler hides its type from inference).
pub fn ad_hide(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("ad_hide", args, 1)?;
    Ok(args[0].clone())
}

/// `ad_key(x, key)`: `x` (the compiler marks a free variable's uses).
pub fn ad_key(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("ad_key", args, 2)?;
    Ok(args[0].clone())
}

/// Whether a closure occurs in `v` (tuples and records are searched).
pub fn contains_function(v: &Value) -> bool {
    match v {
        Value::Func(_) | Value::Tape(_) => true,
        Value::Tuple(t) => t.iter().any(contains_function),
        Value::Record(r) => r.fields.iter().any(|(_, x)| contains_function(x)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, f64s, i64s, shape_of, v};
    use super::*;

    fn int(i: i64) -> Value {
        v(Tensor::weak_i64(i))
    }

    fn f32t(data: &[f32], shape: &[usize]) -> Value {
        v(Tensor::from_vec(data.to_vec(), shape).unwrap())
    }

    fn range(shape: &[usize]) -> Value {
        let n = shape::size(shape);
        f32t(&(0..n).map(|i| i as f32).collect::<Vec<_>>(), shape)
    }

    fn yes() -> Value {
        v(Tensor::scalar_bool(true))
    }

    fn no() -> Value {
        v(Tensor::scalar_bool(false))
    }

    fn sl(a: Option<i64>, b: Option<i64>) -> Value {
        let f = |x: Option<i64>| x.map(int).unwrap_or_else(Value::unit);
        Value::tuple(vec![f(a), f(b)])
    }

    fn env(entries: Vec<(u64, Value)>) -> Value {
        Value::Env(Arc::new(entries))
    }

    #[test]
    fn zeros_and_printing() {
        assert_eq!(call("zero", &[]), Value::Zero);
        assert_eq!(call("is_zero", &[Value::Zero]), yes());
        assert_eq!(call("is_zero", &[v(Tensor::scalar_f32(0.0))]), no());
        assert_eq!(call("is_zero", &[Value::unit()]), no());
        assert_eq!(Value::Zero.to_string(), "zero");
        assert_eq!(Value::Zero.kind(), "zero");
        assert_eq!(env(vec![]).to_string(), "<env>");
        assert_eq!(env(vec![]).kind(), "env");
        assert_ne!(Value::Zero, Value::unit());
        assert_eq!(env(vec![(1, int(2))]), env(vec![(1, int(2))]));
        assert_ne!(env(vec![(1, int(2))]), env(vec![(1, int(3))]));
        assert!(call_err("zero", &[int(1)]).starts_with("zero: expected 0 arguments"));
        let x = range(&[2]);
        assert_eq!(call("stop_gradient", std::slice::from_ref(&x)), x);
        // Structures of zeros.
        let t = Value::tuple(vec![int(1), int(2)]);
        assert_eq!(call("tuple_get", &[Value::Zero, int(1)]), Value::Zero);
        assert!(call_err("tuple_get", &[Value::Zero, Value::unit()]).contains("expected an int"));
        assert_eq!(call("tuple_get", &[t, int(1)]), int(2));
        assert_eq!(
            call("record_get", &[Value::Zero, Value::str("w")]),
            Value::Zero
        );
    }

    #[test]
    fn gadd_tensors() {
        let a = f32t(&[1.0, 2.0], &[2]);
        let b = f32t(&[10.0, 20.0], &[2]);
        assert_eq!(
            call("gadd", &[a.clone(), b.clone()]),
            f32t(&[11.0, 22.0], &[2])
        );
        assert_eq!(call("gadd", &[Value::Zero, a.clone()]), a);
        assert_eq!(call("gadd", &[a.clone(), Value::Zero]), a);
        assert_eq!(call("gadd", &[Value::Zero, Value::Zero]), Value::Zero);
        // Falls back to broadcasting, and weak literals adopt the dtype.
        let m = range(&[2, 2]);
        assert_eq!(
            f32s(&call("gadd", &[m.clone(), a.clone()])),
            vec![1.0, 3.0, 3.0, 5.0]
        );
        assert_eq!(
            call("gadd", &[a.clone(), v(Tensor::weak_f64(1.0))]),
            f32t(&[2.0, 3.0], &[2])
        );
        let bools = v(Tensor::vector(vec![true, false]));
        assert_eq!(
            call(
                "gadd",
                &[bools.clone(), v(Tensor::vector(vec![false, false]))]
            ),
            bools
        );
        // Cotangents of two dtypes promote (the final gradient is cast
        // back to its value's dtype by grad_finalize).
        match call("gadd", &[a.clone(), v(Tensor::vector(vec![1.0f64, 2.0]))]) {
            Value::Tensor(t) => assert_eq!(t.dtype(), crate::DType::F64),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            call_err("gadd", &[a, range(&[3])]),
            "gadd: shapes f32[2] and f32[3] cannot be broadcast"
        );
    }

    #[test]
    fn gadd_structures() {
        let s = |x: f32| v(Tensor::scalar_f32(x));
        let tree = |a: Value, b: Value, c: Value| {
            Value::tuple(vec![
                a,
                Value::record(vec![("w", b), ("b", Value::tuple(vec![c, Value::unit()]))]),
            ])
        };
        let x = tree(s(1.0), s(2.0), Value::Zero);
        let y = tree(Value::Zero, s(10.0), s(20.0));
        assert_eq!(
            call("gadd", &[x.clone(), y]),
            tree(s(1.0), s(12.0), s(20.0))
        );
        // Records match by name; the first operand's order wins.
        let r1 = Value::record(vec![("a", s(1.0)), ("b", s(2.0))]);
        let r2 = Value::record(vec![("b", s(3.0)), ("a", s(4.0))]);
        assert_eq!(
            call("gadd", &[r1.clone(), r2]),
            Value::record(vec![("a", s(5.0)), ("b", s(5.0))])
        );
        let r3 = Value::record(vec![("a", s(1.0)), ("c", s(2.0))]);
        assert_eq!(
            call_err("gadd", &[r1, r3]),
            "gadd: cannot add records {a, b} and {a, c}"
        );
        assert_eq!(
            call_err("gadd", &[Value::tuple(vec![s(1.0)]), Value::unit()]),
            "gadd: cannot add tuples of 1 and 0 elements"
        );
        // Environments merge by key.
        let e1 = env(vec![
            (1, s(1.0)),
            (5, Value::tuple(vec![s(2.0), Value::Zero])),
        ]);
        let e2 = env(vec![
            (3, s(3.0)),
            (5, Value::tuple(vec![Value::Zero, s(4.0)])),
        ]);
        assert_eq!(
            call("gadd", &[e1.clone(), e2]),
            env(vec![
                (1, s(1.0)),
                (3, s(3.0)),
                (5, Value::tuple(vec![s(2.0), s(4.0)]))
            ])
        );
        assert_eq!(call("gadd", &[e1.clone(), Value::Zero]), e1);
        assert_eq!(
            call_err("gadd", &[Value::str("a"), Value::DType(DType::F32)]),
            "gadd: cannot add string and dtype"
        );
        assert_eq!(
            call_err("gadd", &[e1, s(1.0)]),
            "gadd: cannot add env and f32[]"
        );
    }

    #[test]
    fn environments() {
        let s = |x: f32| v(Tensor::scalar_f32(x));
        let e = call("env_setitem", &[Value::Zero, int(7), s(1.0)]);
        assert_eq!(e, env(vec![(7, s(1.0))]));
        let e = call("env_setitem", &[e, int(2), s(2.0)]);
        assert_eq!(e, env(vec![(2, s(2.0)), (7, s(1.0))]));
        let e = call("env_setitem", &[e, int(7), s(3.0)]);
        assert_eq!(e, env(vec![(2, s(2.0)), (7, s(3.0))]));
        assert_eq!(call("env_getitem", &[e.clone(), int(7)]), s(3.0));
        assert_eq!(call("env_getitem", &[e.clone(), int(3)]), Value::Zero);
        assert_eq!(call("env_getitem", &[Value::Zero, int(3)]), Value::Zero);
        assert_eq!(
            call_err("env_getitem", &[e.clone(), int(-1)]),
            "env_getitem: the key must be >= 0, got -1"
        );
        assert_eq!(
            call_err("env_setitem", &[Value::unit(), int(1), s(1.0)]),
            "env_setitem: expected an environment, got tuple"
        );
        assert!(call_err("env_getitem", &[e, s(1.0)]).contains("expected an int for the key"));
    }

    #[test]
    fn finalizes() {
        let x = Value::tuple(vec![
            range(&[2]),
            Value::record(vec![
                ("n", v(Tensor::vector(vec![1i32, 2]))),
                ("w", v(Tensor::weak_f64(1.5))),
                ("f", Value::str("name")),
            ]),
            Value::DType(DType::F32),
        ]);
        let r = call("grad_finalize", &[Value::Zero, x.clone()]);
        assert_eq!(
            r,
            Value::tuple(vec![
                v(Tensor::zeros(DType::F32, &[2]).unwrap()),
                Value::record(vec![
                    ("n", v(Tensor::vector(vec![0i32, 0]))),
                    ("w", v(Tensor::weak_f64(0.0))),
                    ("f", Value::unit()),
                ]),
                Value::unit(),
            ])
        );
        // Partial cotangents: zeros fill in; a missing record field is zero;
        // tensors take x's dtype and weak flag.
        let d = Value::tuple(vec![
            f32t(&[1.0, 2.0], &[2]),
            Value::record(vec![("w", v(Tensor::scalar_f64(2.0)))]),
            Value::Zero,
        ]);
        let r = call("grad_finalize", &[d, x.clone()]);
        let items = r.as_tuple().unwrap();
        assert_eq!(items[0], f32t(&[1.0, 2.0], &[2]));
        let rec = items[1].as_record().unwrap();
        assert_eq!(rec.get("w"), Some(&v(Tensor::weak_f64(2.0))));
        assert_eq!(rec.get("n"), Some(&v(Tensor::vector(vec![0i32, 0]))));
        // An int value has no derivative: whatever reached it gives zeros
        // of its type (issue 23: `vjp` used to return the cast cotangent).
        let r = call(
            "grad_finalize",
            &[
                v(Tensor::vector(vec![2.7f64])),
                v(Tensor::vector(vec![1i64])),
            ],
        );
        assert_eq!(r, v(Tensor::vector(vec![0i64])));
        // A weak cotangent of a strong value becomes strong.
        let r = call(
            "grad_finalize",
            &[v(Tensor::weak_f64(1.0)), v(Tensor::scalar_f32(3.0))],
        );
        assert_eq!(r, v(Tensor::scalar_f32(1.0)));
        // A closure's cotangent (an environment) finalises to ().
        let r = call("grad_finalize", &[env(vec![]), Value::str("f")]);
        assert_eq!(r, Value::unit());
        assert!(call_err("grad_finalize", &[range(&[3]), range(&[2])])
            .ends_with("got f32[3] for a value of type f32[2]"));
        assert!(call_err("grad_finalize", &[Value::unit(), range(&[2])])
            .ends_with("got tuple for f32[2]"));
    }

    #[test]
    fn sums_to() {
        let x = range(&[2, 3, 4]);
        let to = |like: &[usize]| call("sum_to", &[x.clone(), range(like)]);
        // Leading axes.
        let r = to(&[3, 4]);
        assert_eq!(shape_of(&r), vec![3, 4]);
        assert_eq!(f32s(&r)[..3], [12.0, 14.0, 16.0]);
        // A stretched inner axis, kept as 1.
        let r = to(&[2, 1, 4]);
        assert_eq!(shape_of(&r), vec![2, 1, 4]);
        assert_eq!(
            f32s(&r),
            vec![12.0, 15.0, 18.0, 21.0, 48.0, 51.0, 54.0, 57.0]
        );
        // Leading and stretched together.
        let r = to(&[3, 1]);
        assert_eq!(shape_of(&r), vec![3, 1]);
        assert_eq!(f32s(&r), vec![60.0, 92.0, 124.0]);
        // To a scalar, and to itself.
        assert_eq!(to(&[]), v(Tensor::scalar_f32(276.0)));
        assert_eq!(to(&[1, 1, 1]), f32t(&[276.0], &[1, 1, 1]));
        assert_eq!(to(&[2, 3, 4]), x);
        // Ints keep their dtype; weak stays weak.
        let i = v(Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])
            .unwrap()
            .with_weak(true));
        let r = call("sum_to", &[i, range(&[2])]);
        assert_eq!(r, v(Tensor::vector(vec![4i64, 6]).with_weak(true)));
        let d = v(Tensor::vector(vec![0.5f64; 10]));
        assert_eq!(f64s(&call("sum_to", &[d, range(&[1])])), vec![5.0]);
        assert_eq!(call("sum_to", &[Value::Zero, range(&[2])]), Value::Zero);
        assert_eq!(
            call_err("sum_to", &[range(&[3]), range(&[2, 3])]),
            "sum_to: cannot sum f32[3] to the shape of f32[2, 3]"
        );
        assert!(call_err("sum_to", &[x, range(&[3])]).contains("cannot sum"));
    }

    #[test]
    fn matrix_transposes() {
        let x = range(&[2, 2, 3]);
        let r = call("mT", std::slice::from_ref(&x));
        assert_eq!(shape_of(&r), vec![2, 3, 2]);
        assert_eq!(f32s(&r)[..6], [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(call("mT", &[r]), x);
        assert_eq!(
            call_err("mT", &[range(&[3])]),
            "mT: expected at least 2 dimensions, got f32[3]"
        );
        // transpose_grad undoes transpose.
        let x = range(&[2, 3, 4]);
        let perm = v(Tensor::vector(vec![1i64, 2, 0]).with_weak(true));
        let y = call("transpose", &[x.clone(), perm.clone()]);
        assert_eq!(shape_of(&y), vec![3, 4, 2]);
        assert_eq!(call("transpose_grad", &[y, perm]), x);
        let y = call("transpose", &[x.clone(), Value::unit()]);
        assert_eq!(call("transpose_grad", &[y, Value::unit()]), x);
        let neg = Value::tuple(vec![int(-1), int(0), int(1)]);
        let y = call("transpose", &[x.clone(), neg.clone()]);
        assert_eq!(call("transpose_grad", &[y, neg]), x);
        assert_eq!(
            call("transpose_grad", &[Value::Zero, Value::unit()]),
            Value::Zero
        );
        assert!(call_err("transpose_grad", &[x, int(0)]).starts_with("transpose_grad: "));
    }

    #[test]
    fn digammas() {
        let r = f64s(&call("digamma", &[v(Tensor::vector(vec![1.0f64, 0.5]))]));
        assert!((r[0] + 0.577_215_664_901_532_9).abs() < 1e-14);
        assert!((r[1] + 1.963_510_026_021_423_5).abs() < 1e-14);
        assert!(
            call("digamma", &[v(Tensor::weak_i64(1))])
                .as_tensor()
                .unwrap()
                .weak
        );
        assert!(call_err("digamma", &[v(Tensor::scalar_i64(1))]).contains("use a cast"));
    }

    #[test]
    fn extremum_masks() {
        let x = f32t(&[1.0, 5.0, 5.0, 4.0, 2.0, 0.0], &[2, 3]);
        let mask =
            |axis: Value, is_min: Value| f32s(&call("extremum_mask", &[x.clone(), axis, is_min]));
        // Ties: the first maximal element in row-major order.
        assert_eq!(
            mask(Value::unit(), no()),
            vec![0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(mask(int(1), no()), vec![0.0, 1.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(mask(int(0), no()), vec![0.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(mask(int(-1), yes()), vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(
            mask(Value::unit(), yes()),
            vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        );
        let both = Value::tuple(vec![int(0), int(1)]);
        assert_eq!(mask(both, no()), vec![0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        let all_equal = v(Tensor::vector(vec![3i64, 3, 3]));
        let r = call("extremum_mask", &[all_equal, Value::unit(), yes()]);
        assert_eq!(r, v(Tensor::vector(vec![1i64, 0, 0])));
        // NaN wins, as in max.
        let nan = v(Tensor::vector(vec![1.0f64, f64::NAN, 3.0, f64::NAN]));
        let r = call("extremum_mask", &[nan, Value::unit(), no()]);
        assert_eq!(f64s(&r), vec![0.0, 1.0, 0.0, 0.0]);
        let r = call("extremum_mask", &[range(&[0, 2]), int(0), no()]);
        assert_eq!(shape_of(&r), vec![0, 2]);
        assert_eq!(
            call_err("extremum_mask", &[x, int(2), no()]),
            "extremum_mask: axis 2 is out of range for f32[2, 3]"
        );
    }

    #[test]
    fn splits_and_unstacks() {
        let a = range(&[2, 1]);
        let b = range(&[2, 3]);
        let d = call(
            "concat",
            &[Value::tuple(vec![a.clone(), b.clone()]), int(1)],
        );
        let r = call(
            "split_like",
            &[d.clone(), Value::tuple(vec![a.clone(), b.clone()]), int(-1)],
        );
        assert_eq!(r, Value::tuple(vec![a.clone(), b.clone()]));
        let c = range(&[1, 3]);
        let d = call(
            "concat",
            &[Value::tuple(vec![b.clone(), c.clone()]), int(0)],
        );
        let r = call(
            "split_like",
            &[d, Value::tuple(vec![b.clone(), c.clone()]), int(0)],
        );
        assert_eq!(r, Value::tuple(vec![b.clone(), c.clone()]));
        // An empty piece.
        let e = range(&[0, 3]);
        let r = call(
            "split_like",
            &[b.clone(), Value::tuple(vec![e.clone(), b.clone()]), int(0)],
        );
        assert_eq!(r, Value::tuple(vec![e, b.clone()]));
        assert_eq!(
            call(
                "split_like",
                &[
                    Value::Zero,
                    Value::tuple(vec![a.clone(), b.clone()]),
                    int(1)
                ]
            ),
            Value::tuple(vec![Value::Zero, Value::Zero])
        );
        assert!(
            call_err("split_like", &[b.clone(), Value::tuple(vec![a, c]), int(1)])
                .starts_with("split_like: ")
        );
        // unstack undoes stack.
        let x = range(&[3]);
        let y = f32t(&[7.0, 8.0, 9.0], &[3]);
        for axis in [0, 1, -1] {
            let s = call(
                "stack",
                &[Value::tuple(vec![x.clone(), y.clone()]), int(axis)],
            );
            let r = call("unstack", &[s, int(axis)]);
            assert_eq!(r, Value::tuple(vec![x.clone(), y.clone()]));
        }
        let r = call("unstack", &[range(&[2, 2, 2]), int(1)]);
        let items = r.as_tuple().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(f32s(&items[1]), vec![2.0, 3.0, 6.0, 7.0]);
        assert_eq!(call("unstack", &[Value::Zero, int(0)]), Value::Zero);
        assert_eq!(
            call_err("unstack", &[v(Tensor::scalar_f32(1.0)), int(0)]),
            "unstack: axis 0 is out of range for f32[]"
        );
    }

    #[test]
    fn take_grads() {
        let x = range(&[3, 2]);
        // Repeated indices accumulate.
        let idx = v(Tensor::vector(vec![2i64, 0, 2, -1]));
        let d = f32t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[4, 2]);
        let r = call("take_grad", &[x.clone(), idx.clone(), int(0), d]);
        assert_eq!(shape_of(&r), vec![3, 2]);
        assert_eq!(f32s(&r), vec![3.0, 4.0, 0.0, 0.0, 13.0, 16.0]);
        // Along the last axis, with a 2-d index.
        let idx2 = v(Tensor::from_vec(vec![1i32, 1, 0, 1], &[2, 2]).unwrap());
        let d = f32t(&[1.0; 12], &[3, 2, 2]);
        let r = call("take_grad", &[x.clone(), idx2, int(1), d]);
        assert_eq!(f32s(&r), vec![1.0, 3.0, 1.0, 3.0, 1.0, 3.0]);
        // Flattened.
        let d = f32t(&[1.0, 1.0, 1.0, 1.0], &[4]);
        let r = call("take_grad", &[x.clone(), idx.clone(), Value::unit(), d]);
        assert_eq!(f32s(&r), vec![1.0, 0.0, 2.0, 0.0, 0.0, 1.0]);
        // The gradient takes x's dtype.
        let xi = v(Tensor::vector(vec![1i64, 2, 3]));
        let r = call(
            "take_grad",
            &[
                xi.clone(),
                v(Tensor::vector(vec![1i64, 1])),
                int(0),
                v(Tensor::vector(vec![2.0f64, 3.0])),
            ],
        );
        assert_eq!(i64s(&r), vec![0, 5, 0]);
        assert_eq!(
            call("take_grad", &[x.clone(), idx.clone(), int(0), Value::Zero]),
            Value::Zero
        );
        assert_eq!(
            call_err("take_grad", &[x.clone(), idx.clone(), int(0), range(&[4])]),
            "take_grad: the gradient f32[4] does not match the shape [4, 2] of take"
        );
        assert_eq!(
            call_err(
                "take_grad",
                &[x, v(Tensor::vector(vec![3i64])), int(0), range(&[1, 2])]
            ),
            "take_grad: index 3 is out of range for axis 0 of size 3"
        );
    }

    #[test]
    fn index_grads() {
        let x = range(&[3, 4]);
        let r = call(
            "index_grad",
            &[x.clone(), f32t(&[1.0, 2.0, 3.0, 4.0], &[4]), int(1)],
        );
        assert_eq!(
            f32s(&r),
            vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]
        );
        let r = call(
            "index_grad",
            &[x.clone(), v(Tensor::scalar_f32(5.0)), int(-1), int(2)],
        );
        assert_eq!(f32s(&r)[10], 5.0);
        assert_eq!(f32s(&r).iter().sum::<f32>(), 5.0);
        // Slices and ints mixed: x[1:3, :2] and x[:, 3].
        let d = f32t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let r = call(
            "index_grad",
            &[x.clone(), d, sl(Some(1), Some(3)), sl(None, Some(2))],
        );
        assert_eq!(
            f32s(&r),
            vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0]
        );
        let d = f32t(&[1.0, 2.0, 3.0], &[3]);
        let r = call("index_grad", &[x.clone(), d, sl(None, None), int(3)]);
        assert_eq!(
            f32s(&r),
            vec![0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 3.0]
        );
        // No components: the whole of x; an empty slice: all zeros.
        assert_eq!(call("index_grad", &[x.clone(), x.clone()]), x);
        let r = call(
            "index_grad",
            &[x.clone(), range(&[0, 4]), sl(Some(1), Some(1))],
        );
        assert_eq!(f32s(&r), vec![0.0; 12]);
        assert_eq!(
            call("index_grad", &[x.clone(), Value::Zero, int(0)]),
            Value::Zero
        );
        assert_eq!(
            call_err("index_grad", &[x.clone(), range(&[3]), int(0)]),
            "index_grad: the gradient f32[3] does not match the shape [4] of the index"
        );
        assert_eq!(
            call_err("index_grad", &[x.clone(), range(&[4]), int(3)]),
            "index 3 is out of range for axis 0 of size 3"
        );
        assert!(call_err("index_grad", &[x, range(&[4]), range(&[1])])
            .contains("index_grad: expected an int index"));
    }

    #[test]
    fn structures() {
        let s = |x: f32| v(Tensor::scalar_f32(x));
        let t = Value::tuple(vec![s(1.0), s(2.0), s(3.0)]);
        assert_eq!(
            call("tuple_grad", &[t.clone(), int(1), s(9.0)]),
            Value::tuple(vec![Value::Zero, s(9.0), Value::Zero])
        );
        assert_eq!(
            call("tuple_grad", &[t.clone(), int(-1), s(9.0)]),
            Value::tuple(vec![Value::Zero, Value::Zero, s(9.0)])
        );
        assert_eq!(
            call_err("tuple_grad", &[t, int(3), s(9.0)]),
            "tuple_grad: index 3 is out of range for a tuple of 3"
        );
        let r = Value::record(vec![("w", s(1.0)), ("b", s(2.0))]);
        assert_eq!(
            call("record_grad", &[r.clone(), Value::str("b"), s(9.0)]),
            Value::record(vec![("w", Value::Zero), ("b", s(9.0))])
        );
        assert_eq!(
            call_err("record_grad", &[r, Value::str("c"), s(9.0)]),
            "record_grad: the record {w, b} has no field `c`"
        );
        assert!(
            call_err("record_grad", &[Value::unit(), Value::str("c"), s(9.0)])
                .contains("expected a record")
        );
    }

    #[test]
    fn tree_fills() {
        let t = Value::record(vec![
            ("w", range(&[2, 2])),
            (
                "b",
                Value::tuple(vec![
                    v(Tensor::vector(vec![1.0f64])),
                    v(Tensor::weak_f64(0.0)),
                ]),
            ),
        ]);
        let r = call("tree_fill", &[t.clone(), v(Tensor::scalar_f32(2.0))]);
        assert_eq!(
            r,
            Value::record(vec![
                ("w", f32t(&[2.0; 4], &[2, 2])),
                (
                    "b",
                    Value::tuple(vec![
                        v(Tensor::vector(vec![2.0f64])),
                        v(Tensor::weak_f64(2.0)),
                    ])
                ),
            ])
        );
        assert_eq!(call("tree_fill", &[t.clone(), Value::Zero]), Value::Zero);
        assert_eq!(
            call("tree_fill", &[Value::unit(), v(Tensor::scalar_f32(1.0))]),
            Value::unit()
        );
        assert_eq!(
            call_err("tree_fill", &[t.clone(), range(&[2])]),
            "tree_fill: expected a scalar, got f32[2]"
        );
        assert_eq!(
            call_err(
                "tree_fill",
                &[
                    Value::tuple(vec![Value::str("x")]),
                    v(Tensor::scalar_f32(1.0))
                ]
            ),
            "tree_fill: expected tensors in the tree, got string"
        );
    }
}
