//! Batching for `vmap`, done while the program runs.
//!
//! `vmap(f)(xs)` runs `f` once on values that carry a batch: a
//! [`Batched`] value is a tensor whose leading axes are lanes, one axis per
//! active `vmap` (a *level*: a number handed out by [`new_level`], so an
//! inner `vmap` has a larger level than the one around it), followed by
//! the logical shape that `f` sees. The compiler types `f` by the logical
//! shapes (one lane), so checks and derivatives are those of the unbatched
//! program; the kernels run on whole batches.
//!
//! When a primitive meets a batched operand, the VM calls [`apply`] with
//! the primitive's [`BatchRule`], which the compiler takes from its
//! primitive table: element-wise primitives broadcast the lanes against
//! the logical shapes, reductions and reindexing shift their axes past the
//! lane axes, products and decompositions run over the lanes as stack
//! axes, and any other primitive runs once per lane and stacks the
//! results ([`per_lane`]), which is always right and slower.
//!
//! A `switch` on a batched condition ([`switch_value`]) takes one branch
//! when every lane agrees; otherwise it gives a function that runs each
//! branch on its own lanes only (the values the branch closure captures
//! are cut down to those lanes) and merges the results lane by lane. A loop
//! is a recursive function whose exit is such a `switch`, so lanes that
//! leave a loop early wait while the others go on, and no lane ever runs
//! an iteration it would not run alone.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::RtError;
use crate::kernels::ctx::{Ctx, Kernel};
use crate::kernels::strided::broadcast_tensor;
use crate::kernels::{ad, args as kargs, index, map, reduce, shape as kshape};
use crate::shape::TensorTy;
use crate::tensor::{DType, Tensor};
use crate::value::CodeId;
use crate::value::{Closure, Record, Value};

pub use crate::value::{Batched, Lanes};

/// How a primitive treats operands with lanes (chosen by the compiler from
/// its primitive table).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BatchRule {
    /// Values pass through untouched (tuples, records, environments,
    /// function values); per-lane values ([`Lanes`]) are taken apart.
    Opaque,
    /// The kernel takes values with lanes as they are (the `vmap`
    /// primitives, IO).
    Itself,
    /// Element-wise with NumPy broadcasting.
    Elementwise,
    /// `(x, axis, ..)`: a reduction, scan or ordering along logical axes.
    Reduce,
    /// `matmul`.
    Matmul,
    Reshape,
    Transpose,
    BroadcastTo,
    ExpandDims,
    Squeeze,
    /// `concat` and `stack` of a tuple of tensors.
    Join,
    /// `take(x, idx, axis)` with lanes on `x` only.
    Take,
    /// A result shaped like the operand (`zeros_like`, `stop_gradient`).
    Like,
    /// `shape` and `size`: the logical shape.
    Query,
    /// Decompositions, already over stacks of matrices.
    Stacked,
    /// `sum_to(x, like)`.
    SumTo,
    /// `gadd`: structures added leaf by leaf.
    GAdd,
    /// `grad_finalize(d, x)`.
    GradFinalize,
    /// Once per lane, results stacked.
    PerLane,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static NEXT_LEVEL: AtomicU32 = AtomicU32::new(1);

/// Whether any value with lanes was ever made in this process: until then
/// the VM skips the check of operands.
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// A fresh level, larger than every level handed out before.
pub fn new_level() -> u32 {
    ACTIVE.store(true, Ordering::Relaxed);
    NEXT_LEVEL.fetch_add(1, Ordering::Relaxed)
}

fn err<T>(m: impl Into<String>) -> Result<T, RtError> {
    Err(RtError::new(m))
}

/// `t` with lanes at `levels`, or `t` itself when there are none.
pub fn wrap(levels: Vec<u32>, t: Tensor) -> Value {
    if levels.is_empty() {
        Value::Tensor(t)
    } else {
        Value::Batched(Arc::new(Batched { levels, t }))
    }
}

/// The levels and the physical tensor of a tensor value.
fn parts(v: &Value) -> Option<(&[u32], &Tensor)> {
    match v {
        Value::Tensor(t) => Some((&[], t)),
        Value::Batched(b) => Some((&b.levels, &b.t)),
        _ => None,
    }
}

/// Whether `v` has lanes anywhere inside its tuples, records and
/// environments.
pub fn has_batched(v: &Value) -> bool {
    match v {
        Value::Batched(_) | Value::Lanes(_) => true,
        Value::Tuple(t) => t.iter().any(has_batched),
        Value::Record(r) => r.fields.iter().any(|(_, v)| has_batched(v)),
        Value::Env(e) => e.iter().any(|(_, v)| has_batched(v)),
        _ => false,
    }
}

/// Whether `v` holds per-lane values anywhere inside its structures.
fn has_lanes(v: &Value) -> bool {
    match v {
        Value::Lanes(_) => true,
        Value::Tuple(t) => t.iter().any(has_lanes),
        Value::Record(r) => r.fields.iter().any(|(_, v)| has_lanes(v)),
        Value::Env(e) => e.iter().any(|(_, v)| has_lanes(v)),
        _ => false,
    }
}

/// Whether an operand of a structural primitive is itself per-lane values:
/// then the primitive runs per lane.
pub fn is_lanes(v: &Value) -> bool {
    matches!(v, Value::Lanes(_))
}

fn int(i: i64) -> Value {
    Value::Tensor(Tensor::weak_i64(i))
}

fn ints(v: impl IntoIterator<Item = i64>) -> Value {
    Value::tuple(v.into_iter().map(int).collect())
}

/// The levels met in some operands and their lane counts, ascending.
#[derive(Default, Clone, Debug)]
struct Levels(Vec<(u32, usize)>);

impl Levels {
    fn add(&mut self, levels: &[u32], lanes: &[usize]) -> Result<(), RtError> {
        for (&l, &n) in levels.iter().zip(lanes) {
            match self.0.binary_search_by_key(&l, |p| p.0) {
                Ok(i) if self.0[i].1 != n => {
                    return err(format!(
                        "vmap: mapped axes of sizes {} and {} meet in one operation",
                        self.0[i].1, n
                    ))
                }
                Ok(_) => {}
                Err(i) => self.0.insert(i, (l, n)),
            }
        }
        Ok(())
    }
    fn levels(&self) -> Vec<u32> {
        self.0.iter().map(|p| p.0).collect()
    }
    fn lanes(&self) -> Vec<usize> {
        self.0.iter().map(|p| p.1).collect()
    }
}

/// `t` (lanes at `levels`) laid out for the levels `u`: an axis per level
/// of `u` (size 1 where `t` has none, or the full count with `full`), then
/// size-1 axes up to logical rank `rank`, then `t`'s logical axes.
fn physical(
    u: &Levels,
    levels: &[u32],
    t: &Tensor,
    rank: usize,
    full: bool,
) -> Result<Tensor, RtError> {
    let k = levels.len();
    let logical = &t.shape()[k..];
    let mut shape = Vec::with_capacity(u.0.len() + rank.max(logical.len()));
    let mut j = 0;
    for &(l, _) in &u.0 {
        if j < k && levels[j] == l {
            shape.push(t.shape()[j]);
            j += 1;
        } else {
            shape.push(1);
        }
    }
    shape.extend(std::iter::repeat_n(1, rank.saturating_sub(logical.len())));
    shape.extend_from_slice(logical);
    let mut out = if shape == t.shape() {
        t.clone()
    } else {
        t.reshape(&shape)?
    };
    if full {
        let mut target = shape.clone();
        target[..u.0.len()].copy_from_slice(&u.lanes());
        if target != shape {
            out = broadcast_tensor(&out, &target)?;
        }
    }
    Ok(out)
}

/// A kernel's result on physical operands, given the lanes of `u`.
fn rewrap(levels: &[u32], out: Value) -> Value {
    match out {
        Value::Tensor(t) => wrap(levels.to_vec(), t),
        Value::Tuple(items) => {
            Value::tuple(items.iter().map(|v| rewrap(levels, v.clone())).collect())
        }
        other => other,
    }
}

/// Runs primitive `name` (kernel `kernel`, rule `rule`) on operands of
/// which at least one has lanes.
pub fn apply(
    ctx: &mut dyn Ctx,
    rule: BatchRule,
    name: &str,
    kernel: Kernel,
    args: &[Value],
) -> Result<Value, RtError> {
    let first = args.first();
    let first_batched = matches!(first, Some(Value::Batched(_)));
    let rest_plain = || args.iter().skip(1).all(|a| !has_batched(a));
    if rule == BatchRule::Itself {
        return kernel(ctx, args);
    }
    if args.iter().any(has_lanes) {
        return per_lane(
            ctx,
            &mut |ctx, a| dispatch(ctx, rule, name, kernel, &a),
            args,
        );
    }
    match rule {
        BatchRule::Opaque | BatchRule::Itself => kernel(ctx, args),
        BatchRule::Elementwise
            if args
                .iter()
                .all(|a| !matches!(a, Value::Tuple(_) | Value::Record(_))) =>
        {
            elementwise(ctx, kernel, args)
        }
        BatchRule::Reduce if first_batched && rest_plain() => reduce(ctx, name, kernel, args),
        BatchRule::Matmul => matmul(ctx, kernel, args),
        BatchRule::Reshape
        | BatchRule::Transpose
        | BatchRule::BroadcastTo
        | BatchRule::ExpandDims
        | BatchRule::Squeeze
        | BatchRule::Take
        | BatchRule::Like
        | BatchRule::Query
        | BatchRule::Stacked
            if first_batched && rest_plain() =>
        {
            let Some(Value::Batched(b)) = first else {
                unreachable!()
            };
            reindex(ctx, rule, name, kernel, b, args)
        }
        BatchRule::Join if rest_plain() => join(ctx, name, kernel, args),
        BatchRule::SumTo if rest_plain() => match first {
            Some(Value::Batched(b)) => sum_to(ctx, b, &args[1]),
            _ => kernel(ctx, args),
        },
        BatchRule::GAdd if args.len() == 2 => gadd(ctx, &args[0], &args[1]),
        BatchRule::GradFinalize if args.len() == 2 => finalize(ctx, &args[0], &args[1]),
        _ => per_lane(
            ctx,
            &mut |ctx, a| dispatch(ctx, rule, name, kernel, &a),
            args,
        ),
    }
}

/// Runs the primitive, batching when an operand has lanes.
fn dispatch(
    ctx: &mut dyn Ctx,
    rule: BatchRule,
    name: &str,
    kernel: Kernel,
    args: &[Value],
) -> Result<Value, RtError> {
    if args.iter().any(has_batched) {
        apply(ctx, rule, name, kernel, args)
    } else {
        kernel(ctx, args)
    }
}

fn elementwise(ctx: &mut dyn Ctx, kernel: Kernel, args: &[Value]) -> Result<Value, RtError> {
    let mut u = Levels::default();
    let mut rank = 0;
    for a in args {
        if let Some((ls, t)) = parts(a) {
            u.add(ls, &t.shape()[..ls.len()])?;
            rank = rank.max(t.ndim() - ls.len());
        }
    }
    let phys = args
        .iter()
        .map(|a| match a {
            Value::Batched(b) => physical(&u, &b.levels, &b.t, rank, false).map(Value::Tensor),
            other => Ok(other.clone()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rewrap(&u.levels(), kernel(ctx, &phys)?))
}

/// The axis argument `v` (an int or a tuple of ints) moved past `k` lane
/// axes, for logical rank `r` (`extra` more for `stack`/`expand_dims`).
fn shift_axes(op: &str, v: &Value, k: usize, r: usize) -> Result<Value, RtError> {
    let norm = |a: i64| if a < 0 { a + r as i64 } else { a } + k as i64;
    match v {
        Value::Tuple(items) => {
            let mut out = Vec::with_capacity(items.len());
            for a in items.iter() {
                out.push(norm(kargs::int(op, a, "axis")?));
            }
            Ok(ints(out))
        }
        _ => Ok(int(norm(kargs::int(op, v, "axis")?))),
    }
}

fn reduce(ctx: &mut dyn Ctx, name: &str, kernel: Kernel, args: &[Value]) -> Result<Value, RtError> {
    let Value::Batched(b) = &args[0] else {
        unreachable!()
    };
    let k = b.levels.len();
    let r = b.t.ndim() - k;
    let mut a = args.to_vec();
    if args.len() < 2 {
        return per_lane(
            ctx,
            &mut |ctx, a| dispatch(ctx, BatchRule::Reduce, name, kernel, &a),
            args,
        );
    }
    if args[1].is_unit() {
        let keepdims = args
            .get(2)
            .is_some_and(|v| v.as_tensor().and_then(|t| t.to_bool_scalar()) == Some(true));
        if matches!(name, "argmax" | "cumsum" | "cumprod") {
            // Over the flattened lane.
            if name == "argmax" && keepdims {
                return per_lane(
                    ctx,
                    &mut |ctx, a| dispatch(ctx, BatchRule::Reduce, name, kernel, &a),
                    args,
                );
            }
            let mut shape = b.lanes().to_vec();
            shape.push(b.logical().iter().product());
            a[0] = Value::Tensor(b.t.reshape(&shape)?);
            a[1] = int(k as i64);
        } else if r == 0 {
            return per_lane(
                ctx,
                &mut |ctx, a| dispatch(ctx, BatchRule::Reduce, name, kernel, &a),
                args,
            );
        } else {
            a[1] = ints((k..k + r).map(|i| i as i64));
        }
    } else {
        a[1] = shift_axes(name, &args[1], k, r)?;
    }
    a[0] = Value::Tensor(match &a[0] {
        Value::Tensor(t) => t.clone(),
        _ => b.t.clone(),
    });
    Ok(rewrap(&b.levels, kernel(ctx, &a)?))
}

fn matmul(ctx: &mut dyn Ctx, kernel: Kernel, args: &[Value]) -> Result<Value, RtError> {
    let (Some((la, ta)), Some((lb, tb))) = (parts(&args[0]), parts(&args[1])) else {
        return kernel(ctx, args);
    };
    let (ra, rb) = (ta.ndim() - la.len(), tb.ndim() - lb.len());
    if ra == 0 || rb == 0 {
        return per_lane(
            ctx,
            &mut |ctx, a| dispatch(ctx, BatchRule::Matmul, "matmul", kernel, &a),
            args,
        );
    }
    let mut u = Levels::default();
    u.add(la, &ta.shape()[..la.len()])?;
    u.add(lb, &tb.shape()[..lb.len()])?;
    // A batched vector becomes a matrix (a row on the left, a column on
    // the right), squeezed from the result again.
    let a_vec = !la.is_empty() && ra == 1;
    let b_vec = !lb.is_empty() && rb == 1;
    let promote = |levels: &[u32], t: &Tensor, at: usize| -> Result<Tensor, RtError> {
        let mut s = t.shape().to_vec();
        s.insert(levels.len() + at, 1);
        t.reshape(&s)
    };
    let ta2 = if a_vec {
        promote(la, ta, 0)?
    } else {
        ta.clone()
    };
    let tb2 = if b_vec {
        promote(lb, tb, 1)?
    } else {
        tb.clone()
    };
    let rank = (ta2.ndim() - la.len()).max(tb2.ndim() - lb.len());
    let side = |levels: &[u32], t: &Tensor| -> Result<Value, RtError> {
        if levels.is_empty() {
            Ok(Value::Tensor(t.clone()))
        } else {
            physical(&u, levels, t, rank, true).map(Value::Tensor)
        }
    };
    let out = kernel(ctx, &[side(la, &ta2)?, side(lb, &tb2)?])?;
    let Value::Tensor(mut t) = out else {
        return err("matmul: expected a tensor result");
    };
    let mut s = t.shape().to_vec();
    if b_vec {
        s.remove(s.len() - 1);
    }
    if a_vec {
        // The row axis is last when the right operand is a vector (a
        // column removed above, or an unmapped vector the product drops).
        let b_vector = b_vec || (lb.is_empty() && rb == 1);
        s.remove(s.len() - if b_vector { 1 } else { 2 });
    }
    if s != t.shape() {
        t = t.reshape(&s)?;
    }
    Ok(wrap(u.levels(), t))
}

fn reindex(
    ctx: &mut dyn Ctx,
    rule: BatchRule,
    name: &str,
    kernel: Kernel,
    b: &Batched,
    args: &[Value],
) -> Result<Value, RtError> {
    let k = b.levels.len();
    let r = b.t.ndim() - k;
    let lanes: Vec<i64> = b.lanes().iter().map(|&d| d as i64).collect();
    let x = Value::Tensor(b.t.clone());
    let call = |ctx: &mut dyn Ctx, a: Vec<Value>| -> Result<Value, RtError> {
        Ok(rewrap(&b.levels, kernel(ctx, &a)?))
    };
    match rule {
        BatchRule::Reshape => {
            let target = kargs::ints(name, &args[1], "shape")?;
            call(ctx, vec![x, ints(lanes.into_iter().chain(target))])
        }
        BatchRule::Transpose => {
            let perm: Vec<i64> = match kargs::opt_ints(name, &args[1], "perm")? {
                Some(p) => p
                    .iter()
                    .map(|&a| if a < 0 { a + r as i64 } else { a })
                    .collect(),
                None => (0..r as i64).rev().collect(),
            };
            if perm.len() != r {
                return per_lane(
                    ctx,
                    &mut |ctx, a| dispatch(ctx, rule, name, kernel, &a),
                    args,
                );
            }
            let full = (0..k as i64).chain(perm.iter().map(|a| a + k as i64));
            call(ctx, vec![x, ints(full)])
        }
        BatchRule::BroadcastTo => {
            let target = kargs::ints(name, &args[1], "shape")?;
            let mut u = Levels::default();
            u.add(&b.levels, b.lanes())?;
            let padded = physical(&u, &b.levels, &b.t, target.len(), false)?;
            call(
                ctx,
                vec![Value::Tensor(padded), ints(lanes.into_iter().chain(target))],
            )
        }
        BatchRule::ExpandDims => {
            let a = kargs::int(name, &args[1], "axis")?;
            let a = if a < 0 { a + r as i64 + 1 } else { a };
            call(ctx, vec![x, int(a + k as i64)])
        }
        BatchRule::Squeeze => {
            let logical = b.logical();
            let drop: Vec<usize> = match kargs::opt_ints(name, &args[1], "axis")? {
                None => (0..r).filter(|&i| logical[i] == 1).collect(),
                Some(axes) => axes
                    .iter()
                    .map(|&a| if a < 0 { a + r as i64 } else { a } as usize)
                    .collect(),
            };
            if drop.iter().any(|&i| i >= r || logical[i] != 1) {
                return per_lane(
                    ctx,
                    &mut |ctx, a| dispatch(ctx, rule, name, kernel, &a),
                    args,
                );
            }
            let mut s = b.lanes().to_vec();
            s.extend((0..r).filter(|i| !drop.contains(i)).map(|i| logical[i]));
            Ok(wrap(b.levels.clone(), b.t.reshape(&s)?))
        }
        BatchRule::Take => {
            if args[2].is_unit() {
                let mut s = b.lanes().to_vec();
                s.push(b.logical().iter().product());
                call(
                    ctx,
                    vec![
                        Value::Tensor(b.t.reshape(&s)?),
                        args[1].clone(),
                        int(k as i64),
                    ],
                )
            } else {
                let a = shift_axes(name, &args[2], k, r)?;
                call(ctx, vec![x, args[1].clone(), a])
            }
        }
        BatchRule::Query => match name {
            "shape" => Ok(ints(b.logical().iter().map(|&d| d as i64))),
            "size" => Ok(int(b.logical().iter().product::<usize>() as i64)),
            _ => kernel(ctx, &[x]),
        },
        // `grad`'s seed checks what one lane sees, then is `ones_like`.
        BatchRule::Like if name == "grad_seed" => {
            if !b.logical().is_empty() || !b.t.dtype().is_float() {
                let one = Tensor::zeros(b.t.dtype(), b.logical())?;
                return crate::kernels::create::grad_seed(ctx, &[Value::Tensor(one)]);
            }
            let ones = crate::kernels::create::ones_like(ctx, &[x])?;
            Ok(rewrap(&b.levels, ones))
        }
        BatchRule::Like | BatchRule::Stacked => {
            let mut a = args.to_vec();
            a[0] = x;
            call(ctx, a)
        }
        _ => unreachable!("not a reindexing rule"),
    }
}

fn join(ctx: &mut dyn Ctx, name: &str, kernel: Kernel, args: &[Value]) -> Result<Value, RtError> {
    let Value::Tuple(xs) = &args[0] else {
        return per_lane(
            ctx,
            &mut |ctx, a| dispatch(ctx, BatchRule::Join, name, kernel, &a),
            args,
        );
    };
    let mut u = Levels::default();
    let mut r = 0;
    for x in xs.iter() {
        let Some((ls, t)) = parts(x) else {
            return per_lane(
                ctx,
                &mut |ctx, a| dispatch(ctx, BatchRule::Join, name, kernel, &a),
                args,
            );
        };
        u.add(ls, &t.shape()[..ls.len()])?;
        r = t.ndim() - ls.len();
    }
    let k = u.0.len();
    let items = xs
        .iter()
        .map(|x| {
            let (ls, t) = parts(x).expect("checked");
            let own = t.ndim() - ls.len();
            physical(&u, ls, t, own, true).map(Value::Tensor)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let r = if name == "stack" { r + 1 } else { r };
    let axis = shift_axes(name, &args[1], k, r)?;
    Ok(rewrap(
        &u.levels(),
        kernel(ctx, &[Value::tuple(items), axis])?,
    ))
}

fn sum_to(ctx: &mut dyn Ctx, b: &Batched, like: &Value) -> Result<Value, RtError> {
    let Some(lt) = like.as_tensor() else {
        return ad::sum_to(ctx, &[Value::Batched(Arc::new(b.clone())), like.clone()]);
    };
    let k = b.levels.len();
    let r = b.t.ndim() - k;
    let target = lt.shape();
    let mut t = b.t.clone();
    if r > target.len() {
        let axes = ints((k..k + r - target.len()).map(|i| i as i64));
        let v = reduce::sum(
            ctx,
            &[
                Value::Tensor(t),
                axes,
                Value::Tensor(Tensor::scalar_bool(false)),
            ],
        )?;
        t = v
            .as_tensor()
            .cloned()
            .ok_or_else(|| RtError::new("sum_to: expected a tensor"))?;
    }
    let mut out = b.lanes().to_vec();
    out.extend_from_slice(target);
    if t.shape() != out.as_slice() {
        t = ad::sum_to_shape(&t, &out)?;
    }
    Ok(wrap(b.levels.clone(), t.cast(lt.dtype())))
}

fn gadd(ctx: &mut dyn Ctx, a: &Value, b: &Value) -> Result<Value, RtError> {
    ad::add_values_with(a, b, &mut |p, q| match (p, q) {
        (Value::Batched(_), _) | (_, Value::Batched(_)) => {
            elementwise(ctx, ad::gadd, &[p.clone(), q.clone()])
        }
        _ => ad::add_values(p, q),
    })
}

fn finalize(ctx: &mut dyn Ctx, d: &Value, x: &Value) -> Result<Value, RtError> {
    match (d, x) {
        (Value::Zero, Value::Batched(b)) => Ok(wrap(
            b.levels.clone(),
            Tensor::zeros(b.t.dtype(), b.t.shape())?,
        )),
        (_, Value::Batched(b)) if !b.t.dtype().is_float() => Ok(wrap(
            b.levels.clone(),
            Tensor::zeros(b.t.dtype(), b.t.shape())?,
        )),
        (Value::Tuple(ds), Value::Tuple(xs)) if ds.len() == xs.len() => {
            let items = ds
                .iter()
                .zip(xs.iter())
                .map(|(p, q)| finalize(ctx, p, q))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::tuple(items))
        }
        (Value::Record(dr), Value::Record(xr)) if dr.fields.len() == xr.fields.len() => {
            let mut fields = Vec::with_capacity(xr.fields.len());
            for ((n, p), (_, q)) in dr.fields.iter().zip(xr.fields.iter()) {
                fields.push((n.clone(), finalize(ctx, p, q)?));
            }
            Ok(Value::Record(Arc::new(Record::new(fields))))
        }
        _ => match (parts(d), parts(x)) {
            (Some((ld, td)), Some((lx, tx))) if !ld.is_empty() || !lx.is_empty() => {
                let (dl, xl) = (&td.shape()[ld.len()..], &tx.shape()[lx.len()..]);
                if dl != xl {
                    return err(ad::derivative_shape_message(
                        &TensorTy::new(td.dtype(), dl).to_string(),
                        &TensorTy::new(tx.dtype(), xl).to_string(),
                    ));
                }
                Ok(wrap(ld.to_vec(), td.cast(tx.dtype()).with_weak(tx.weak)))
            }
            _ => ad::grad_finalize(ctx, &[d.clone(), x.clone()]),
        },
    }
}

/// `v`'s tuple items, record fields or environment entries mapped by `f`
/// (one level deep); `None` when `v` is none of those.
fn map_children(
    v: &Value,
    f: &mut dyn FnMut(&Value) -> Result<Value, RtError>,
) -> Result<Option<Value>, RtError> {
    Ok(Some(match v {
        Value::Tuple(t) => Value::tuple(t.iter().map(|x| f(x)).collect::<Result<_, _>>()?),
        Value::Record(r) => {
            let mut fields = Vec::with_capacity(r.fields.len());
            for (n, x) in &r.fields {
                fields.push((n.clone(), f(x)?));
            }
            Value::Record(Arc::new(Record::new(fields)))
        }
        Value::Env(e) => {
            let mut out = Vec::with_capacity(e.len());
            for (k, x) in e.iter() {
                out.push((*k, f(x)?));
            }
            Value::Env(Arc::new(out))
        }
        // A stack of backpropagators holds the values its records saved.
        Value::Tape(t) => t.with_values(t.values().iter().map(f).collect::<Result<_, _>>()?),
        _ => return Ok(None),
    }))
}

/// Lane `i` of level `level` of every value with lanes inside `v`.
fn lane(ctx: &mut dyn Ctx, v: &Value, level: u32, i: usize) -> Result<Value, RtError> {
    gather(ctx, v, level, &[i], true)
}

/// The lanes `idx` of level `level` inside `v` (function values included:
/// their captures): one lane, its axis dropped, when `drop`.
fn gather(
    ctx: &mut dyn Ctx,
    v: &Value,
    level: u32,
    idx: &[usize],
    drop: bool,
) -> Result<Value, RtError> {
    Ok(match v {
        Value::Lanes(l) if l.level == level => {
            if drop {
                l.items[idx[0]].clone()
            } else {
                Value::Lanes(Arc::new(Lanes {
                    level,
                    items: idx.iter().map(|&i| l.items[i].clone()).collect(),
                }))
            }
        }
        Value::Lanes(l) if deep_has_level(v, level) => {
            let items = l
                .items
                .iter()
                .map(|x| gather(ctx, x, level, idx, drop))
                .collect::<Result<_, _>>()?;
            Value::Lanes(Arc::new(Lanes {
                level: l.level,
                items,
            }))
        }
        Value::Batched(b) => match b.levels.iter().position(|&l| l == level) {
            Some(p) => {
                let iv = if drop {
                    int(idx[0] as i64)
                } else {
                    Value::Tensor(Tensor::vector(
                        idx.iter().map(|&i| i as i64).collect::<Vec<_>>(),
                    ))
                };
                let t = index::take(ctx, &[Value::Tensor(b.t.clone()), iv, int(p as i64)])?;
                let t = t
                    .as_tensor()
                    .cloned()
                    .ok_or_else(|| RtError::new("vmap: take gave no tensor"))?;
                let mut levels = b.levels.clone();
                if drop {
                    levels.remove(p);
                }
                wrap(levels, t)
            }
            None => v.clone(),
        },
        Value::Func(c) if c.captures.iter().any(|x| deep_has_level(x, level)) => {
            let captures = c
                .captures
                .iter()
                .map(|x| gather(ctx, x, level, idx, drop))
                .collect::<Result<_, _>>()?;
            Value::Func(Arc::new(Closure {
                code: c.code,
                captures,
            }))
        }
        other => match map_children(other, &mut |x| gather(ctx, x, level, idx, drop))? {
            Some(v) => v,
            None => other.clone(),
        },
    })
}

/// Whether `v` (function values' captures included) has lanes of `level`.
fn deep_has_level(v: &Value, level: u32) -> bool {
    match v {
        Value::Batched(b) => b.levels.contains(&level),
        Value::Lanes(l) => l.level == level || l.items.iter().any(|x| deep_has_level(x, level)),
        Value::Tuple(t) => t.iter().any(|x| deep_has_level(x, level)),
        Value::Record(r) => r.fields.iter().any(|(_, x)| deep_has_level(x, level)),
        Value::Env(e) => e.iter().any(|(_, x)| deep_has_level(x, level)),
        Value::Func(c) => c.captures.iter().any(|x| deep_has_level(x, level)),
        Value::Tape(t) => t.any_value(|x| deep_has_level(x, level)),
        _ => false,
    }
}

/// The top level inside `v` (function values' captures included) with its
/// lane count.
fn top_level(v: &Value, best: &mut Option<(u32, usize)>) {
    match v {
        Value::Batched(b) => {
            if let (Some(&l), Some(&n)) = (b.levels.last(), b.lanes().last()) {
                if best.is_none_or(|(m, _)| l > m) {
                    *best = Some((l, n));
                }
            }
        }
        Value::Lanes(l) => {
            if best.is_none_or(|(m, _)| l.level > m) {
                *best = Some((l.level, l.items.len()));
            }
            l.items.iter().for_each(|x| top_level(x, best));
        }
        Value::Tuple(t) => t.iter().for_each(|x| top_level(x, best)),
        Value::Record(r) => r.fields.iter().for_each(|(_, x)| top_level(x, best)),
        Value::Env(e) => e.iter().for_each(|(_, x)| top_level(x, best)),
        Value::Func(c) => c.captures.iter().for_each(|x| top_level(x, best)),
        Value::Tape(t) => {
            t.any_value(|x| {
                top_level(x, best);
                false
            });
        }
        _ => {}
    }
}

/// Runs `f` once per lane of the top level of `args` and stacks the
/// results: the rule for any primitive without a better one.
pub fn per_lane(
    ctx: &mut dyn Ctx,
    f: &mut dyn FnMut(&mut dyn Ctx, Vec<Value>) -> Result<Value, RtError>,
    args: &[Value],
) -> Result<Value, RtError> {
    let mut top = None;
    args.iter().for_each(|a| top_level(a, &mut top));
    let Some((level, n)) = top else {
        return f(ctx, args.to_vec());
    };
    let mut outs = Vec::with_capacity(n);
    for i in 0..n {
        let a = args
            .iter()
            .map(|v| lane(ctx, v, level, i))
            .collect::<Result<Vec<_>, _>>()?;
        outs.push(f(ctx, a)?);
    }
    stack_lanes(ctx, &outs, level, false)
}

/// Runs `f` once per lane of every level (code compiled for one lane).
pub fn per_lane_deep(
    ctx: &mut dyn Ctx,
    f: &mut dyn FnMut(Vec<Value>) -> Result<Value, RtError>,
    args: &[Value],
) -> Result<Value, RtError> {
    per_lane(
        ctx,
        &mut |ctx, a| {
            if a.iter().any(has_batched) {
                per_lane_deep(ctx, f, &a)
            } else {
                f(a)
            }
        },
        args,
    )
}

/// Values of one lane each, stacked as lanes of `level` (larger than every
/// level inside them); kept one by one ([`Lanes`]) where their structures
/// differ.
///
/// `zero_fill`: whether a symbolic zero in some lanes may stand for zeros
/// shaped like the other lanes' tensors. That holds only where every lane
/// gives a value of one type (the branches of one `if`, the result of a
/// `vmap`); lanes that ran different code (per-lane functions, per-lane
/// structures) may hold a zero for a record where another lane holds a
/// tensor, and are kept one by one.
fn stack_lanes(
    ctx: &mut dyn Ctx,
    outs: &[Value],
    level: u32,
    zero_fill: bool,
) -> Result<Value, RtError> {
    match try_stack(ctx, outs, level, zero_fill)? {
        Some(v) => Ok(v),
        None => Ok(Value::Lanes(Arc::new(Lanes {
            level,
            items: outs.to_vec(),
        }))),
    }
}

fn try_stack(
    ctx: &mut dyn Ctx,
    outs: &[Value],
    level: u32,
    zero_fill: bool,
) -> Result<Option<Value>, RtError> {
    let Some(first) = outs.first() else {
        return err("vmap: no lanes");
    };
    if outs
        .iter()
        .any(|o| matches!(o, Value::Lanes(l) if l.level == level))
    {
        return Ok(None);
    }
    // Every lane the same (an output of compiled code run per lane that
    // does not depend on the lanes): no lanes.
    if let Some((ls, t)) = parts(first) {
        if outs[1..]
            .iter()
            .all(|o| parts(o).is_some_and(|(l2, t2)| l2 == ls && same_tensor(t, t2)))
        {
            return Ok(Some(first.clone()));
        }
    }
    Ok(Some(match first {
        Value::Tensor(_) | Value::Batched(_) | Value::Zero
            if outs.iter().any(|o| parts(o).is_some()) =>
        {
            let like = outs
                .iter()
                .find_map(|o| parts(o).map(|(l, t)| (l.to_vec(), t.clone())))
                .expect("found");
            let logical = &like.1.shape()[like.0.len()..];
            let mut u = Levels::default();
            for o in outs {
                match parts(o) {
                    Some((ls, t)) => {
                        if &t.shape()[ls.len()..] != logical || t.dtype() != like.1.dtype() {
                            return Ok(None);
                        }
                        u.add(ls, &t.shape()[..ls.len()])?
                    }
                    None if zero_fill && matches!(o, Value::Zero) => {}
                    None => return Ok(None),
                }
            }
            let items = outs
                .iter()
                .map(|o| {
                    let (ls, t) = match parts(o) {
                        Some((ls, t)) => (ls.to_vec(), t.clone()),
                        None => (
                            like.0.clone(),
                            Tensor::zeros(like.1.dtype(), like.1.shape())?,
                        ),
                    };
                    let r = t.ndim() - ls.len();
                    physical(&u, &ls, &t, r, true).map(Value::Tensor)
                })
                .collect::<Result<Vec<_>, _>>()?;
            // The new lanes' axis goes among the others in level order
            // (the lanes of each lane's outputs may be of outer levels:
            // `vmap` of code run lane by lane inside another `vmap`).
            let mut levels = u.levels();
            let p = levels.iter().filter(|&&l| l < level).count();
            let s = kshape::stack(ctx, &[Value::tuple(items), int(p as i64)])?;
            let t = s
                .as_tensor()
                .cloned()
                .ok_or_else(|| RtError::new("vmap: stack gave no tensor"))?;
            levels.insert(p, level);
            wrap(levels, t)
        }
        Value::Tuple(t) => {
            if outs
                .iter()
                .any(|o| !matches!(o, Value::Tuple(x) if x.len() == t.len()))
            {
                return Ok(None);
            }
            Value::tuple(stack_columns(
                ctx,
                outs,
                t.len(),
                level,
                zero_fill,
                |o, j| match o {
                    Value::Tuple(x) => x[j].clone(),
                    _ => unreachable!("checked"),
                },
            )?)
        }
        Value::Record(r) => {
            let same = |o: &Value| match o {
                Value::Record(x) => {
                    x.fields.len() == r.fields.len()
                        && x.fields.iter().zip(&r.fields).all(|(a, b)| a.0 == b.0)
                }
                _ => false,
            };
            if !outs.iter().all(same) {
                return Ok(None);
            }
            let cols = stack_columns(
                ctx,
                outs,
                r.fields.len(),
                level,
                zero_fill,
                |o, j| match o {
                    Value::Record(x) => x.fields[j].1.clone(),
                    _ => unreachable!("checked"),
                },
            )?;
            let fields = r
                .fields
                .iter()
                .zip(cols)
                .map(|((n, _), v)| (n.clone(), v))
                .collect();
            Value::Record(Arc::new(Record::new(fields)))
        }
        Value::Func(c) => {
            if outs
                .iter()
                .any(|o| !matches!(o, Value::Func(x) if x.code == c.code))
            {
                return Ok(None);
            }
            let captures =
                stack_columns(
                    ctx,
                    outs,
                    c.captures.len(),
                    level,
                    zero_fill,
                    |o, j| match o {
                        Value::Func(x) => x.captures[j].clone(),
                        _ => unreachable!("checked"),
                    },
                )?;
            Value::Func(Arc::new(Closure {
                code: c.code,
                captures,
            }))
        }
        Value::Env(e) => {
            let same = |o: &Value| match o {
                Value::Env(x) => {
                    x.len() == e.len() && x.iter().zip(e.iter()).all(|(a, b)| a.0 == b.0)
                }
                _ => false,
            };
            if !outs.iter().all(same) {
                return Ok(None);
            }
            let cols = stack_columns(ctx, outs, e.len(), level, zero_fill, |o, j| match o {
                Value::Env(x) => x[j].1.clone(),
                _ => unreachable!("checked"),
            })?;
            Value::Env(Arc::new(
                e.iter().zip(cols).map(|((k, _), v)| (*k, v)).collect(),
            ))
        }
        Value::Tape(t) => {
            let same = |o: &Value| matches!(o, Value::Tape(x) if x.same_records(t));
            if !outs.iter().all(same) {
                return Ok(None);
            }
            // Each lane's saved values, read once, as a row to stack.
            let rows: Vec<Value> = outs
                .iter()
                .map(|o| match o {
                    Value::Tape(x) => Value::tuple(x.values()),
                    _ => unreachable!("checked"),
                })
                .collect();
            let n = t.values_len();
            let cols = stack_columns(ctx, &rows, n, level, zero_fill, |o, j| match o {
                Value::Tuple(x) => x[j].clone(),
                _ => unreachable!("rows are tuples"),
            })?;
            t.with_values(cols)
        }
        Value::Str(_) | Value::DType(_) | Value::Io => {
            let text = format!("{first}");
            if outs.iter().any(|o| {
                format!("{o}") != text || std::mem::discriminant(o) != std::mem::discriminant(first)
            }) {
                return Ok(None);
            }
            first.clone()
        }
        Value::Zero if outs.iter().all(|o| matches!(o, Value::Zero)) => Value::Zero,
        _ => return Ok(None),
    }))
}

/// Column `j` of every lane's structure (`get`), stacked, for `j < n`.
fn stack_columns(
    ctx: &mut dyn Ctx,
    outs: &[Value],
    n: usize,
    level: u32,
    zero_fill: bool,
    get: impl Fn(&Value, usize) -> Value,
) -> Result<Vec<Value>, RtError> {
    (0..n)
        .map(|j| {
            let col: Vec<Value> = outs.iter().map(|o| get(o, j)).collect();
            stack_lanes(ctx, &col, level, zero_fill)
        })
        .collect()
}

/// Whether two tensors hold the same elements (bit for bit, so NaNs
/// compare equal to themselves).
fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return false;
    }
    if std::ptr::eq(a.buffer(), b.buffer()) {
        return true;
    }
    match a.dtype() {
        DType::F64 => a
            .as_f64()
            .zip(b.as_f64())
            .is_some_and(|(x, y)| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())),
        DType::F32 => a
            .as_f32()
            .zip(b.as_f32())
            .is_some_and(|(x, y)| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())),
        _ => a.as_i64_vec() == b.as_i64_vec(),
    }
}

/// The code id of the function [`lanes_value_call`] runs: a call of per-lane
/// function values.
pub const LANES_CALL_CODE: CodeId = CodeId(u32::MAX - 2);

/// Calls each lane's function with that lane's arguments.
pub fn lanes_value_call(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [Value::Lanes(f), Value::Tuple(call_args)] = args else {
        return err("internal error: a per-lane call takes the functions and a tuple");
    };
    let mut outs = Vec::with_capacity(f.items.len());
    for (i, g) in f.items.iter().enumerate() {
        let a = call_args
            .iter()
            .map(|v| lane(ctx, v, f.level, i))
            .collect::<Result<Vec<_>, _>>()?;
        outs.push(ctx.call(g, &a)?);
    }
    stack_lanes(ctx, &outs, f.level, false)
}

/// The code id of the function [`switch_value`] makes (its code object,
/// which calls [`select_call`], is the VM's).
pub const SELECT_CODE: CodeId = CodeId(u32::MAX - 1);

/// The lanes of a 0-d bool condition with one level, as bools.
fn mask_of(c: &Batched) -> Option<Vec<bool>> {
    if c.levels.len() != 1 || c.t.ndim() != 1 || c.t.dtype() != DType::Bool {
        return None;
    }
    c.t.as_bool().map(|s| s.to_vec())
}

/// `switch(c, a, b)` for a condition with lanes: `a` or `b` when every lane
/// agrees, else a function that runs both on their own lanes (function
/// values), or the lane-wise selection (other values).
pub fn switch_value(ctx: &mut dyn Ctx, c: &Batched, a: Value, b: Value) -> Result<Value, RtError> {
    if c.t.dtype() != DType::Bool || !c.logical().is_empty() {
        return err(format!(
            "a condition must be a bool scalar, got {}",
            c.type_string()
        ));
    }
    if let Some(bools) = c.t.as_bool() {
        if bools.iter().all(|&x| x) {
            return Ok(a);
        }
        if bools.iter().all(|&x| !x) {
            return Ok(b);
        }
    }
    let cv = Value::Batched(Arc::new(c.clone()));
    if matches!((&a, &b), (Value::Func(_), Value::Func(_))) {
        return Ok(Value::Func(Arc::new(Closure {
            code: SELECT_CODE,
            captures: vec![cv, a, b],
        })));
    }
    select_values(ctx, &cv, &a, &b)
}

/// `where(c, a, b)` leaf by leaf.
fn select_values(ctx: &mut dyn Ctx, c: &Value, a: &Value, b: &Value) -> Result<Value, RtError> {
    match (a, b) {
        (Value::Tuple(x), Value::Tuple(y)) if x.len() == y.len() => {
            let items = x
                .iter()
                .zip(y.iter())
                .map(|(p, q)| select_values(ctx, c, p, q))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::tuple(items))
        }
        _ if parts(a).is_some() && parts(b).is_some() => {
            elementwise(ctx, map::where_, &[c.clone(), a.clone(), b.clone()])
        }
        _ => per_lane(
            ctx,
            &mut |_, v| {
                let take = v[0]
                    .as_tensor()
                    .and_then(|t| t.to_bool_scalar())
                    .unwrap_or(false);
                Ok(if take { v[1].clone() } else { v[2].clone() })
            },
            &[c.clone(), a.clone(), b.clone()],
        ),
    }
}

/// The kernel of [`SELECT`]: runs branch `a` on the lanes where `c` holds
/// and `b` on the others, each cut down to its lanes, and merges.
pub fn select_call(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [c, a, b, call_args] = args else {
        return err("internal error: a batched if takes four values");
    };
    let items = |v: &Value| -> Vec<Value> {
        match v {
            Value::Tuple(t) => t.to_vec(),
            _ => Vec::new(),
        }
    };
    let Value::Batched(cb) = c else {
        return err("internal error: a batched if without lanes");
    };
    let Some(mask) = mask_of(cb) else {
        // Lanes of several levels: one lane of the top level at a time.
        return per_lane(
            ctx,
            &mut |ctx, v| match &v[0] {
                Value::Batched(c) => {
                    let f = switch_value(ctx, c, v[1].clone(), v[2].clone())?;
                    ctx.call(&f, &items(&v[3]))
                }
                c => {
                    let take = c
                        .as_tensor()
                        .and_then(|t| t.to_bool_scalar())
                        .unwrap_or(false);
                    ctx.call(if take { &v[1] } else { &v[2] }, &items(&v[3]))
                }
            },
            args,
        );
    };
    let level = cb.levels[0];
    let n = mask.len();
    let on: Vec<i64> = (0..n).filter(|&i| mask[i]).map(|i| i as i64).collect();
    let off: Vec<i64> = (0..n).filter(|&i| !mask[i]).map(|i| i as i64).collect();
    let idx = |v: &[i64]| Value::Tensor(Tensor::vector(v.to_vec()));
    let (on_u, off_u): (Vec<usize>, Vec<usize>) = (
        on.iter().map(|&i| i as usize).collect(),
        off.iter().map(|&i| i as usize).collect(),
    );
    let fa = gather(ctx, a, level, &on_u, false)?;
    let fb = gather(ctx, b, level, &off_u, false)?;
    let xa = gather(ctx, call_args, level, &on_u, false)?;
    let xb = gather(ctx, call_args, level, &off_u, false)?;
    let ra = ctx.call(&fa, &items(&xa))?;
    let rb = ctx.call(&fb, &items(&xb))?;
    // Lane i of the result is lane pos[i] of concat(ra, rb).
    let mut pos = vec![0i64; n];
    for (j, &i) in on.iter().chain(off.iter()).enumerate() {
        pos[i as usize] = j as i64;
    }
    merge(ctx, &ra, &rb, level, (on.len(), off.len()), &idx(&pos))
}

/// `ra` (lanes `on` of `level`) and `rb` (the others) as one value.
fn merge(
    ctx: &mut dyn Ctx,
    ra: &Value,
    rb: &Value,
    level: u32,
    sizes: (usize, usize),
    pos: &Value,
) -> Result<Value, RtError> {
    match (ra, rb) {
        (Value::Zero, Value::Zero) => Ok(Value::Zero),
        (Value::Tuple(x), Value::Tuple(y)) if x.len() == y.len() => {
            let items = x
                .iter()
                .zip(y.iter())
                .map(|(p, q)| merge(ctx, p, q, level, sizes, pos))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::tuple(items))
        }
        (Value::Record(x), Value::Record(y)) if x.fields.len() == y.fields.len() => {
            let mut fields = Vec::with_capacity(x.fields.len());
            for ((n, p), (_, q)) in x.fields.iter().zip(y.fields.iter()) {
                fields.push((n.clone(), merge(ctx, p, q, level, sizes, pos)?));
            }
            Ok(Value::Record(Arc::new(Record::new(fields))))
        }
        (Value::Func(x), Value::Func(y)) if x.code == y.code => {
            let captures = x
                .captures
                .iter()
                .zip(y.captures.iter())
                .map(|(p, q)| merge(ctx, p, q, level, sizes, pos))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Func(Arc::new(Closure {
                code: x.code,
                captures,
            })))
        }
        // Two stacks of backpropagators with the same records: their
        // values merged one by one (else lane by lane, below: a stack is
        // never taken whole for lanes that did not make it).
        (Value::Tape(x), Value::Tape(y)) if x.same_records(y) => {
            let items = x
                .values()
                .iter()
                .zip(y.values().iter())
                .map(|(p, q)| merge(ctx, p, q, level, sizes, pos))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(x.with_values(items))
        }
        (Value::Tuple(_), Value::Tuple(_))
        | (Value::Record(_), Value::Record(_))
        | (Value::Func(_), Value::Func(_))
        | (
            Value::Tuple(_)
            | Value::Record(_)
            | Value::Func(_)
            | Value::Env(_)
            | Value::Lanes(_)
            | Value::Tape(_),
            _,
        )
        | (
            _,
            Value::Tuple(_)
            | Value::Record(_)
            | Value::Func(_)
            | Value::Env(_)
            | Value::Lanes(_)
            | Value::Tape(_),
        ) => per_lane_merge(ctx, ra, rb, level, sizes, pos),
        _ => {
            let zero_like = |o: &Value| -> Result<Value, RtError> {
                match parts(o) {
                    Some((ls, t)) => Ok(wrap(ls.to_vec(), Tensor::zeros(t.dtype(), t.shape())?)),
                    None => Ok(o.clone()),
                }
            };
            let (ra, rb) = match (ra, rb) {
                (Value::Zero, o) => (zero_like(o)?, o.clone()),
                (o, Value::Zero) => (o.clone(), zero_like(o)?),
                _ => (ra.clone(), rb.clone()),
            };
            let (Some((la, ta)), Some((lb, tb))) = (parts(&ra), parts(&rb)) else {
                if !has_batched(&ra) && !has_batched(&rb) && format!("{ra}") == format!("{rb}") {
                    return Ok(ra);
                }
                return per_lane_merge(ctx, &ra, &rb, level, sizes, pos);
            };
            if ta.shape()[la.len()..] != tb.shape()[lb.len()..] {
                return per_lane_merge(ctx, &ra, &rb, level, sizes, pos);
            }
            // Both sides with lanes of `level` (sizes.0 and sizes.1) and of
            // the same other levels, then joined and put in lane order.
            let with_level =
                |ls: &[u32], t: &Tensor, count: usize| -> Result<(Vec<u32>, Tensor), RtError> {
                    if ls.contains(&level) {
                        return Ok((ls.to_vec(), t.clone()));
                    }
                    let p = ls.iter().filter(|&&l| l < level).count();
                    let mut s = t.shape().to_vec();
                    s.insert(p, 1);
                    let mut target = s.clone();
                    target[p] = count;
                    let t = broadcast_tensor(&t.reshape(&s)?, &target)?;
                    let mut levels = ls.to_vec();
                    levels.insert(p, level);
                    Ok((levels, t))
                };
            let (la, ta) = with_level(la, ta, sizes.0)?;
            let (lb, tb) = with_level(lb, tb, sizes.1)?;
            let mut u2 = Levels::default();
            let skip = |ls: &[u32], t: &Tensor| -> (Vec<u32>, Vec<usize>) {
                ls.iter()
                    .zip(t.shape())
                    .filter(|(l, _)| **l != level)
                    .map(|(l, d)| (*l, *d))
                    .unzip()
            };
            let (l1, n1) = skip(&la, &ta);
            let (l2, n2) = skip(&lb, &tb);
            u2.add(&l1, &n1)?;
            u2.add(&l2, &n2)?;
            u2.0.push((level, 0));
            u2.0.sort_by_key(|p| p.0);
            let full = |ls: &[u32], t: &Tensor, count: usize| -> Result<Tensor, RtError> {
                let mut v = u2.clone();
                for p in v.0.iter_mut() {
                    if p.0 == level {
                        p.1 = count;
                    }
                }
                let r = t.ndim() - ls.len();
                physical(&v, ls, t, r, true)
            };
            let ta = full(&la, &ta, sizes.0)?;
            let tb = full(&lb, &tb, sizes.1)?;
            let dtype = crate::dtype::promote("if", (ta.dtype(), ta.weak), (tb.dtype(), tb.weak))
                .map_or(ta.dtype(), |d| d.0);
            let axis = u2.0.iter().position(|p| p.0 == level).expect("added");
            let joined = kshape::concat(
                ctx,
                &[
                    Value::tuple(vec![
                        Value::Tensor(ta.cast(dtype)),
                        Value::Tensor(tb.cast(dtype)),
                    ]),
                    int(axis as i64),
                ],
            )?;
            let out = index::take(ctx, &[joined, pos.clone(), int(axis as i64)])?;
            let t = out
                .as_tensor()
                .cloned()
                .ok_or_else(|| RtError::new("vmap: take gave no tensor"))?;
            Ok(wrap(u2.levels(), t))
        }
    }
}

/// `ra` and `rb` kept lane by lane, where their structures differ.
fn per_lane_merge(
    ctx: &mut dyn Ctx,
    ra: &Value,
    rb: &Value,
    level: u32,
    sizes: (usize, usize),
    pos: &Value,
) -> Result<Value, RtError> {
    let pos = pos.as_tensor().map(|t| t.as_i64_vec()).unwrap_or_default();
    let mut items = Vec::with_capacity(pos.len());
    for &j in &pos {
        let j = j as usize;
        items.push(if j < sizes.0 {
            lane(ctx, ra, level, j)?
        } else {
            lane(ctx, rb, level, j - sizes.0)?
        });
    }
    stack_lanes(ctx, &items, level, true)
}

/// `vmap_level(args)`: a fresh level for one call of a mapped function
/// (the argument only keeps calls apart).
pub fn vmap_level(_: &mut dyn Ctx, _args: &[Value]) -> Result<Value, RtError> {
    Ok(Value::Tensor(Tensor::scalar_i64(new_level() as i64)))
}

/// The logical shape of a tensor value.
fn logical_shape(v: &Value) -> Option<&[usize]> {
    match v {
        Value::Tensor(t) => Some(t.shape()),
        Value::Batched(b) => Some(b.logical()),
        _ => None,
    }
}

/// `vmap_size(args, axes)`: the length of the mapped axes (the same for
/// every mapped leaf).
pub fn vmap_size(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [Value::Tuple(xs), Value::Tuple(axes)] = args else {
        return err("vmap_size takes the arguments and their axes");
    };
    let mut mapped = Vec::new();
    for (i, (x, ax)) in xs.iter().zip(axes.iter()).enumerate() {
        if ax.is_unit() {
            continue;
        }
        let a = kargs::int("vmap", ax, "in_axes")?;
        let mut leaves = Vec::new();
        leaves_of(x, &mut leaves);
        for leaf in leaves {
            let Some(s) = logical_shape(leaf) else {
                return err(format!(
                    "vmap: argument {} holds a {}, which has no axis to map",
                    i + 1,
                    leaf.kind()
                ));
            };
            mapped.push((i, s, a));
        }
    }
    match crate::shape::mapped_len(&mapped).map_err(RtError::new)? {
        Some(d) => Ok(Value::Tensor(Tensor::scalar_i64(d as i64))),
        None => err("vmap: no argument is mapped (every in_axes is None)"),
    }
}

fn leaves_of<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Tuple(t) => t.iter().for_each(|x| leaves_of(x, out)),
        Value::Record(r) => r.fields.iter().for_each(|(_, x)| leaves_of(x, out)),
        other => out.push(other),
    }
}

/// Applies `f` to every leaf (not inside function values).
fn map_leaves(
    v: &Value,
    f: &mut dyn FnMut(&Value) -> Result<Value, RtError>,
) -> Result<Value, RtError> {
    match map_children(v, &mut |x| map_leaves(x, f))? {
        Some(v) => Ok(v),
        None => f(v),
    }
}

/// `vmap_fn(f, level, n)`: `f` itself.
pub fn vmap_fn(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    Ok(args[0].clone())
}

fn level_arg(v: &Value) -> Result<u32, RtError> {
    Ok(kargs::int("vmap", v, "level")? as u32)
}

/// `vmap_in(x, axis, level, n)`: every leaf of `x` with its axis `axis`
/// made the lanes of `level` (`axis` `()`: unmapped, unchanged).
pub fn vmap_in(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [x, axis, level, _n] = args else {
        return err("vmap_in takes four arguments");
    };
    if axis.is_unit() {
        return Ok(x.clone());
    }
    let a = kargs::int("vmap", axis, "in_axes")?;
    let level = level_arg(level)?;
    map_leaves(x, &mut |leaf| {
        let (ls, t) = match leaf {
            Value::Zero => return Ok(Value::Zero),
            _ => parts(leaf)
                .ok_or_else(|| RtError::new(format!("vmap: cannot map over a {}", leaf.kind())))?,
        };
        let k = ls.len();
        let r = t.ndim() - k;
        let p = if a < 0 { a + r as i64 } else { a };
        if p < 0 || p as usize >= r {
            return err(format!("vmap: in_axes {a} for a value of rank {r}"));
        }
        let p = k + p as usize;
        // Levels stay in order: a level older than some of the leaf's (a
        // pullback that runs the reverse of a finished `vmap` inside a
        // newer one, as `jacobian` of a function calling `vmap` does)
        // goes before them.
        let j = ls.iter().filter(|&&l| l < level).count();
        let t = if p == j {
            t.clone()
        } else {
            let mut perm: Vec<i64> = (0..t.ndim() as i64).filter(|&i| i != p as i64).collect();
            perm.insert(j, p as i64);
            kshape::transpose_tensor(t, Some(&perm))?
        };
        let mut levels = ls.to_vec();
        levels.insert(j, level);
        Ok(wrap(levels, t))
    })
}

/// `vmap_out(y, axis, level, n)`: every leaf of `y` with the lanes of
/// `level` moved to logical axis `axis` (a leaf without them repeated `n`
/// times); `axis` `()` requires leaves without them.
pub fn vmap_out(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [y, axis, level, n] = args else {
        return err("vmap_out takes four arguments");
    };
    let level = level_arg(level)?;
    let y = &densify(ctx, y, level)?;
    let n = kargs::int("vmap", n, "size")? as usize;
    if axis.is_unit() {
        if deep_has_level(y, level) {
            return err("vmap: out_axes is None but the result depends on the mapped arguments");
        }
        return Ok(y.clone());
    }
    let a = kargs::int("vmap", axis, "out_axes")?;
    map_leaves(y, &mut |leaf| {
        let (ls, t) = match leaf {
            Value::Zero => return Ok(Value::Zero),
            _ => parts(leaf).ok_or_else(|| {
                RtError::new(format!(
                    "vmap: a function cannot return a {} as a mapped result",
                    leaf.kind()
                ))
            })?,
        };
        let (levels, t, p) = match ls.iter().position(|&l| l == level) {
            Some(p) => {
                let mut levels = ls.to_vec();
                levels.remove(p);
                (levels, t.clone(), p)
            }
            None => {
                // Unmapped: repeat it as lanes of this level.
                let p = ls.iter().filter(|&&l| l < level).count();
                let mut s = t.shape().to_vec();
                s.insert(p, 1);
                let mut target = s.clone();
                target[p] = n;
                let t = broadcast_tensor(&t.reshape(&s)?, &target)?;
                (ls.to_vec(), t, p)
            }
        };
        let k = levels.len();
        let r = t.ndim() - k - 1;
        let q = if a < 0 { a + r as i64 + 1 } else { a };
        if q < 0 || q as usize > r {
            return err(format!("vmap: out_axes {a} for a result of rank {r}"));
        }
        let q = k + q as usize;
        let t = if q == p {
            t
        } else {
            let mut perm: Vec<i64> = (0..t.ndim() as i64).filter(|&i| i != p as i64).collect();
            perm.insert(q, p as i64);
            kshape::transpose_tensor(&t, Some(&perm))?
        };
        Ok(wrap(levels, t))
    })
}

/// `v` with its per-lane values of `level` stacked where they can be.
fn densify(ctx: &mut dyn Ctx, v: &Value, level: u32) -> Result<Value, RtError> {
    Ok(match v {
        Value::Lanes(l) if l.level == level => {
            let items = l
                .items
                .iter()
                .map(|x| densify(ctx, x, level))
                .collect::<Result<Vec<_>, _>>()?;
            match try_stack(ctx, &items, level, true)? {
                Some(v) => v,
                None => {
                    return err("vmap: the lanes give results of different shapes or structures")
                }
            }
        }
        other => match map_children(other, &mut |x| densify(ctx, x, level))? {
            Some(v) => v,
            None => other.clone(),
        },
    })
}

/// `vmap_sum(d, level, n)`: the cotangent of an unmapped argument, summed
/// over the lanes of `level` (a value without them stands for `n` equal
/// lanes).
pub fn vmap_sum(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [d, level, n] = args else {
        return err("vmap_sum takes three arguments");
    };
    let level = level_arg(level)?;
    let n = kargs::int("vmap", n, "size")?;
    let d = &densify(ctx, d, level)?;
    map_leaves(d, &mut |leaf| {
        let Some((ls, t)) = parts(leaf) else {
            return Ok(leaf.clone());
        };
        match ls.iter().position(|&l| l == level) {
            Some(p) => {
                let s = reduce::sum(
                    ctx,
                    &[
                        Value::Tensor(t.clone()),
                        int(p as i64),
                        Value::Tensor(Tensor::scalar_bool(false)),
                    ],
                )?;
                let t = s
                    .as_tensor()
                    .cloned()
                    .ok_or_else(|| RtError::new("vmap: sum gave no tensor"))?;
                let mut levels = ls.to_vec();
                levels.remove(p);
                Ok(wrap(levels, t.cast(leaf_dtype(leaf))))
            }
            None => {
                let scaled = map::mul(
                    ctx,
                    &[Value::Tensor(t.clone()), Value::Tensor(Tensor::weak_i64(n))],
                )?;
                Ok(rewrap(ls, scaled))
            }
        }
    })
}

fn leaf_dtype(v: &Value) -> DType {
    parts(v).map_or(DType::F32, |(_, t)| t.dtype())
}

/// The tensor leaves of a value made of tuples and records, depth first
/// (symbolic zeros count as leaves: `None`).
fn jac_leaves<'a>(v: &'a Value, out: &mut Vec<Option<&'a Tensor>>) -> Result<(), RtError> {
    match v {
        Value::Tensor(t) => out.push(Some(t)),
        Value::Zero => out.push(None),
        Value::Tuple(items) => {
            for i in items.iter() {
                jac_leaves(i, out)?;
            }
        }
        Value::Record(r) => {
            for (_, f) in &r.fields {
                jac_leaves(f, out)?;
            }
        }
        other => {
            return err(format!(
                "jacobian: expected tensors, tuples and records, got {}",
                other.kind()
            ))
        }
    }
    Ok(())
}

/// `like`'s structure with its leaves, in order, replaced by `leaves`.
fn jac_rebuild(like: &Value, leaves: &mut impl Iterator<Item = Value>) -> Value {
    match like {
        Value::Tuple(items) => Value::tuple(items.iter().map(|i| jac_rebuild(i, leaves)).collect()),
        Value::Record(r) => Value::Record(Arc::new(Record::new(
            r.fields
                .iter()
                .map(|(k, f)| (k.clone(), jac_rebuild(f, leaves)))
                .collect(),
        ))),
        _ => leaves.next().unwrap_or(Value::Zero),
    }
}

/// The tensor leaves of `v` (a tensor, or tuples and records of them).
fn jac_tensors<'a>(what: &str, v: &'a Value) -> Result<Vec<&'a Tensor>, RtError> {
    let mut leaves = Vec::new();
    jac_leaves(v, &mut leaves)?;
    leaves
        .into_iter()
        .map(|l| l.ok_or_else(|| RtError::new(format!("jacobian: the {what} has no value"))))
        .collect()
}

/// `jac_basis(y)`: the rows of the identity for a value shaped like `y`,
/// one row per element of `y`: for a tensor `[size(y), *shape(y)]` in its
/// float dtype; for tuples and records the same structure, each leaf
/// `[size(y), *shape(leaf)]` (row `k` is 1 at element `k` of the
/// flattened value, counting leaves in order).
pub fn jac_basis(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let y = &args[0];
    let leaves = jac_tensors("value", y)?;
    let m: usize = leaves.iter().map(|t| t.len()).sum();
    let mut offset = 0;
    let mut out = Vec::with_capacity(leaves.len());
    for t in leaves {
        let k = t.len();
        let mut data = vec![0.0f64; m * k];
        for i in 0..k {
            data[(offset + i) * k + i] = 1.0;
        }
        offset += k;
        let mut shape = vec![m];
        shape.extend_from_slice(t.shape());
        let dtype = if t.dtype().is_float() {
            t.dtype()
        } else {
            DType::F32
        };
        out.push(Value::Tensor(Tensor::from_vec(data, &shape)?.cast(dtype)));
    }
    Ok(jac_rebuild(y, &mut out.into_iter()))
}

/// `jac_reshape(j, y, x, fwd)`: a Jacobian laid out as JAX lays it out:
/// `shape(y) + shape(x)` for tensors; for tuples and records, `y`'s
/// structure with `x`'s inside, a block per pair of leaves. Reverse mode
/// (`fwd` false) stacked one row per element of `y` on `x`'s leaves
/// (`[size(y), *shape(x leaf)]`); forward mode one column per element of
/// `x` as the last axis of `y`'s leaves (`[*shape(y leaf), size(x)]`). A
/// symbolic zero is a block of zeros.
pub fn jac_reshape(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let [j, y, x, fwd] = args else {
        return err("jac_reshape takes four arguments");
    };
    let fwd = kargs::bool_or("jacobian", fwd, "fwd", false)?;
    let ys = jac_tensors("value", y)?;
    let xs = jac_tensors("argument", x)?;
    let mut js = Vec::new();
    jac_leaves(j, &mut js)?;
    // `j`'s leaves: one per leaf of `x` (reverse) or of `y` (forward);
    // a single symbolic zero stands for all of them.
    let per = if fwd { ys.len() } else { xs.len() };
    if js.len() == 1 && js[0].is_none() {
        js = vec![None; per];
    }
    if js.len() != per {
        return err(format!(
            "jacobian: {} blocks of rows for {per} leaves",
            js.len()
        ));
    }
    let m: usize = ys.iter().map(|t| t.len()).sum();
    let n: usize = xs.iter().map(|t| t.len()).sum();
    // Every block as a tensor of shape `shape(y_i) + shape(x_k)`.
    let dtype = js
        .iter()
        .flatten()
        .map(|t| t.dtype())
        .next()
        .unwrap_or_else(|| ys.first().map_or(DType::F64, |t| t.dtype()));
    let mut outer = Vec::with_capacity(ys.len());
    let mut yo = 0;
    for yi in &ys {
        let mut inner = Vec::with_capacity(xs.len());
        let mut xo = 0;
        for (k, xk) in xs.iter().enumerate() {
            let mut shape = yi.shape().to_vec();
            shape.extend_from_slice(xk.shape());
            let (a, b) = (yi.len(), xk.len());
            let block = match js[if fwd { outer.len() } else { k }] {
                None => Tensor::from_vec(vec![0.0f64; a * b], &shape)?.cast(dtype),
                Some(jt) if ys.len() == 1 && xs.len() == 1 => jt.reshape(&shape)?,
                Some(jt) => {
                    // reverse: rows yo..yo+a of [m, b]; forward: columns
                    // xo..xo+b of [a, n]
                    let (rows, cols, r0, c0) = if fwd { (a, n, 0, xo) } else { (m, b, yo, 0) };
                    if jt.len() != rows * cols {
                        return err(format!(
                            "jacobian: a block of {} elements for {rows} x {cols}",
                            jt.len()
                        ));
                    }
                    let flat = jt.reshape(&[rows, cols])?.cast(DType::F64);
                    let data = flat
                        .as_f64()
                        .ok_or_else(|| RtError::new("jacobian: rows"))?;
                    let mut out = Vec::with_capacity(a * b);
                    for r in 0..a {
                        for c in 0..b {
                            out.push(data[(r0 + r) * cols + c0 + c]);
                        }
                    }
                    Tensor::from_vec(out, &shape)?.cast(jt.dtype())
                }
            };
            inner.push(Value::Tensor(block));
            xo += b;
        }
        outer.push(jac_rebuild(x, &mut inner.into_iter()));
        yo += yi.len();
    }
    Ok(jac_rebuild(y, &mut outer.into_iter()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::TestCtx;
    use crate::value::TapeHint;

    fn lanes(xs: &[f64]) -> Value {
        wrap(vec![1], Tensor::vector(xs.to_vec()))
    }

    fn tape(values: &[Value]) -> Value {
        let hint = Arc::new(TapeHint::default());
        let mut t = Value::tuple(Vec::new());
        for v in values {
            t = crate::value::Tape::push(&t, CodeId(7), std::iter::once(v.clone()), &hint)
                .expect("a tape");
        }
        t
    }

    fn tape_values(v: &Value) -> Vec<String> {
        let Value::Tape(t) = v else {
            panic!("a tape, got {}", v.kind())
        };
        t.values().iter().map(|x| format!("{x}")).collect()
    }

    #[test]
    fn merging_stacks_of_equal_length_keeps_each_lanes_values() {
        // Lanes 0 and 2 ran one branch, lane 1 the other: the merged stack
        // holds each lane's own saved values (it used to take the first
        // branch's stack whole when both had as many records).
        let mut ctx = TestCtx::default();
        let a = tape(&[lanes(&[1.0, 3.0])]);
        let b = tape(&[lanes(&[20.0])]);
        let pos = Value::Tensor(Tensor::vector(vec![0i64, 2, 1]));
        let m = merge(&mut ctx, &a, &b, 1, (2, 1), &pos).unwrap();
        assert_eq!(tape_values(&m), vec!["<mapped f64[]: [1.0, 20.0, 3.0]>"]);
    }

    #[test]
    fn one_lane_of_a_stack_has_its_values_cut_to_that_lane() {
        let mut ctx = TestCtx::default();
        let t = tape(&[lanes(&[1.0, 2.0, 3.0]), lanes(&[4.0, 5.0, 6.0])]);
        let one = lane(&mut ctx, &t, 1, 1).unwrap();
        assert_eq!(tape_values(&one), vec!["2.0", "5.0"]);
        let two = gather(&mut ctx, &t, 1, &[2, 0], false).unwrap();
        let Value::Tape(two) = two else { panic!() };
        assert_eq!(two.len(), 2);
        assert!(two.any_value(|v| format!("{v}").contains("[3.0, 1.0]")));
    }
}
