//! Gathering kernels: `take(x, idx, axis)` and `index(x, c0, c1, ..)`;
//! and indexed reads and updates whose index is one tuple of components
//! (`x.at[idx]` of the language): `index_at(x, idx)`, `index_set(x, idx,
//! v)`, `index_add`, `index_mul`, `index_min`, `index_max`.
//!
//! An update returns a new array; when the VM hands it the only reference
//! to `x` (its last use: [`INPLACE_KERNELS`]) it writes into `x`'s buffer
//! instead of copying it, so a loop of single-element updates costs O(1)
//! per update.

use super::args::{arity, min_arity, opt_int, rule, tensor, typed};
use super::ctx::Ctx;
use super::num::Num;
use super::strided::{broadcast_strides, offsets, offsets_from, remap};
use crate::error::RtError;
use crate::shape::{self, IndexComp, IndexStep};
use crate::tensor::{Element, Tensor};
use crate::value::Value;
use crate::{dispatch_all, dispatch_numeric};

/// `take(x, idx, axis)`: gathers along `axis` by an int tensor of indices
/// (negative ones count from the end); with no axis, from the flattened `x`.
pub fn take(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "take";
    arity(op, args, 3)?;
    let x = tensor(op, &args[0], "x")?;
    let idx = tensor(op, &args[1], "the indices")?;
    let axis = opt_int(op, &args[2], "axis")?;
    let plan = take_plan(op, x, idx, axis)?;
    let TakePlan {
        outer, dim, inner, ..
    } = plan;
    let picks = &plan.picks;
    let buf = dispatch_all!(x.dtype(), T => {
        let src = typed::<T>(x)?;
        let mut dst: Vec<T> = Vec::with_capacity(outer * picks.len() * inner);
        for o in 0..outer {
            for &j in picks {
                let start = (o * dim + j) * inner;
                dst.extend_from_slice(&src[start..start + inner]);
            }
        }
        T::wrap(dst)
    });
    Ok(Value::Tensor(
        Tensor::new(buf, &plan.out)?.with_weak(x.weak),
    ))
}

/// What `take(x, idx, axis)` reads: `x` viewed as `[outer, dim, inner]`
/// (`dim` the gathered axis; with no axis, `x` flattened), the positions
/// along `dim` it picks, in order, and the result shape.
pub(crate) struct TakePlan {
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
    pub picks: Vec<usize>,
    pub out: Vec<usize>,
}

/// Plans `take(x, idx, axis)`; errors name `op`'s rule as `take`'s.
pub(crate) fn take_plan(
    op: &str,
    x: &Tensor,
    idx: &Tensor,
    axis: Option<i64>,
) -> Result<TakePlan, RtError> {
    let out = rule(shape::take(x.ty(), idx.ty(), axis))?;
    let (outer, dim, inner, ax) = match axis {
        None => (1, x.len(), 1, 0),
        Some(a) => {
            let ax = rule(shape::axis(op, a, x.ndim(), &x.ty()))?;
            let s = x.shape();
            (shape::size(&s[..ax]), s[ax], shape::size(&s[ax + 1..]), ax)
        }
    };
    let picks: Vec<usize> = idx
        .as_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim as i64 } else { i };
            if (0..dim as i64).contains(&j) {
                Ok(j as usize)
            } else {
                Err(RtError::new(format!(
                    "{op}: index {i} is out of range for axis {ax} of size {dim}"
                )))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(TakePlan {
        outer,
        dim,
        inner,
        picks,
        out,
    })
}

fn bound(op: &str, v: &Value, k: usize) -> Result<Option<i64>, RtError> {
    if v.is_unit() {
        return Ok(None);
    }
    v.as_tensor()
        .and_then(Tensor::to_i64_scalar)
        .map(Some)
        .ok_or_else(|| {
            RtError::new(format!(
                "{op}: expected an int slice bound in component {k}, got {}",
                v.kind()
            ))
        })
}

/// Decodes one index component: an int scalar, or a slice `(start, stop)`
/// whose bounds are int scalars or `()`.
pub(crate) fn component(op: &str, v: &Value, k: usize) -> Result<IndexComp, RtError> {
    match v {
        Value::Tensor(t) => t.to_i64_scalar().map(|i| IndexComp::At(Some(i))).ok_or_else(|| {
            RtError::new(format!(
                "{op}: expected an int index in component {k}, got {}; use take to gather by a tensor of indices",
                v.kind()
            ))
        }),
        // `(start, stop)`, or `(start, stop, len)` for a slice written
        // `e : e + len` (the length is for the compiler; stop says it).
        Value::Tuple(b) if b.len() == 2 || b.len() == 3 => {
            Ok(IndexComp::Slice(bound(op, &b[0], k)?, bound(op, &b[1], k)?))
        }
        _ => Err(RtError::new(format!(
            "{op}: expected an int or a slice in component {k}, got {}",
            v.kind()
        ))),
    }
}

/// `index(x, c0, c1, ..)`: `x[c0, c1, ..]`. An int selects (and removes the
/// axis); a slice `(start, stop)` keeps a range; axes past the last
/// component stay whole.
pub fn index(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "index";
    min_arity(op, args, 1)?;
    let x = tensor(op, &args[0], "x")?;
    let comps: Vec<IndexComp> = args[1..]
        .iter()
        .enumerate()
        .map(|(k, c)| component(op, c, k))
        .collect::<Result<_, _>>()?;
    let (base, out, out_strides) = index_view(x, &comps)?;
    if shape::size(&out) == 0 {
        return Ok(Value::Tensor(
            Tensor::zeros(x.dtype(), &out)?.with_weak(x.weak),
        ));
    }
    Ok(Value::Tensor(remap(
        x,
        &out,
        offsets_from(base, &out, &out_strides),
    )?))
}

/// The components of the index tuple `idx` of `index_at` and the updates.
fn components(op: &str, idx: &Value) -> Result<Vec<IndexComp>, RtError> {
    match idx {
        Value::Tuple(items) => items
            .iter()
            .enumerate()
            .map(|(k, c)| component(op, c, k))
            .collect(),
        _ => Err(RtError::new(format!(
            "{op}: expected a tuple of index components, got {}",
            idx.kind()
        ))),
    }
}

/// `index_at(x, idx)`: `x[c0, c1, ..]` for the tuple `idx = (c0, c1, ..)`.
pub fn index_at(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("index_at", args, 2)?;
    let Value::Tuple(comps) = &args[1] else {
        return Err(RtError::new(format!(
            "index_at: expected a tuple of index components, got {}",
            args[1].kind()
        )));
    };
    let mut all = Vec::with_capacity(comps.len() + 1);
    all.push(args[0].clone());
    all.extend(comps.iter().cloned());
    index(ctx, &all)
}

/// What an update does to each element it selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    Set,
    Add,
    Mul,
    Min,
    Max,
}

impl Update {
    const fn name(self) -> &'static str {
        match self {
            Update::Set => "index_set",
            Update::Add => "index_add",
            Update::Mul => "index_mul",
            Update::Min => "index_min",
            Update::Max => "index_max",
        }
    }

    fn apply<T: Num>(self, old: T, v: T) -> T {
        match self {
            Update::Set => v,
            Update::Add => old.add(v),
            Update::Mul => old.mul(v),
            Update::Min => old.minimum(v),
            Update::Max => old.maximum(v),
        }
    }
}

static UPDATES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static UPDATES_IN_PLACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Indexed updates run in this process so far, and how many of them wrote
/// into the buffer of their array (which died there) instead of a copy.
pub fn update_counts() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (UPDATES.load(Relaxed), UPDATES_IN_PLACE.load(Relaxed))
}

/// `x` with the region `x[idx]` combined with `v` (broadcast to the
/// region's shape, cast to `x`'s dtype) by `how`. Takes `x` by value: it
/// is written in place when no other value shares its buffer.
pub fn update(how: Update, x: Tensor, idx: &Value, v: &Value) -> Result<Value, RtError> {
    use std::sync::atomic::Ordering::Relaxed;
    let op = how.name();
    let comps = components(op, idx)?;
    let v = tensor(op, v, "the new value")?;
    let (base, region, strides) = index_view(&x, &comps)?;
    rule(shape::broadcast_to(op, v.ty(), &region))?;
    if how != Update::Set && x.dtype() == crate::dtype::DType::Bool {
        return Err(RtError::new(format!(
            "{op}: expected a numeric array, got {}",
            x.type_string()
        )));
    }
    let v = v.cast(x.dtype());
    let dtype = x.dtype();
    let (out, in_place) = dispatch_numeric!(dtype, T => {
        let src = typed::<T>(&v)?;
        let (t, ip) = x
            .modify::<T>(|dst| {
                if src.len() == 1 {
                    let s = src[0];
                    for o in offsets_from(base, &region, &strides) {
                        dst[o] = how.apply(dst[o], s);
                    }
                } else {
                    let vs = broadcast_strides(v.shape(), &region);
                    for (o, p) in offsets_from(base, &region, &strides).zip(offsets(&region, &vs)) {
                        dst[o] = how.apply(dst[o], src[p]);
                    }
                }
            })
            .ok_or_else(|| RtError::internal("index update: dtype changed"))?;
        (t, ip)
    }, else {
        let src = typed::<bool>(&v)?;
        let vs = broadcast_strides(v.shape(), &region);
        let (t, ip) = x
            .modify::<bool>(|dst| {
                for (o, p) in offsets_from(base, &region, &strides).zip(offsets(&region, &vs)) {
                    dst[o] = src[p];
                }
            })
            .ok_or_else(|| RtError::internal("index update: dtype changed"))?;
        (t, ip)
    });
    UPDATES.fetch_add(1, Relaxed);
    if in_place {
        UPDATES_IN_PLACE.fetch_add(1, Relaxed);
    }
    Ok(Value::Tensor(out))
}

fn update_kernel(how: Update, args: &[Value]) -> Result<Value, RtError> {
    arity(how.name(), args, 3)?;
    let x = tensor(how.name(), &args[0], "x")?.clone();
    update(how, x, &args[1], &args[2])
}

/// The same update, given the arguments to keep: the VM's in-place path.
fn update_owned(how: Update, args: &mut [Value]) -> Result<Value, RtError> {
    arity(how.name(), args, 3)?;
    let x = match std::mem::replace(&mut args[0], Value::unit()) {
        Value::Tensor(t) => t,
        other => {
            return Err(RtError::new(format!(
                "{}: expected a tensor for x, got {}",
                how.name(),
                other.kind()
            )))
        }
    };
    update(how, x, &args[1], &args[2])
}

macro_rules! update_kernels {
    ($($name:ident, $owned:ident => $how:ident;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "(x, idx, v)`: see [`update`].")]
            pub fn $name(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
                update_kernel(Update::$how, args)
            }
            #[doc = concat!("`", stringify!($name), "` on arguments it may consume.")]
            pub fn $owned(_: &mut dyn Ctx, args: &mut [Value]) -> Result<Value, RtError> {
                update_owned(Update::$how, args)
            }
        )*
        /// The kernels that may consume their arguments: the VM calls them
        /// with the values it read, so a moved (dead) `x` is written in place.
        pub const INPLACE_KERNELS: &[(&str, super::ctx::InplaceKernel)] = &[
            $((Update::$how.name(), $owned),)*
        ];
    };
}

update_kernels! {
    index_set, index_set_owned => Set;
    index_add, index_add_owned => Add;
    index_mul, index_mul_owned => Mul;
    index_min, index_min_owned => Min;
    index_max, index_max_owned => Max;
}

/// The elements `x[comps..]` reads: the offset of the first, and the
/// result's shape with the strides that walk `x`'s buffer along it.
pub(crate) fn index_view(
    x: &Tensor,
    comps: &[IndexComp],
) -> Result<(usize, Vec<usize>, Vec<usize>), RtError> {
    let steps = rule(shape::resolve_index(x.ty(), comps))?;
    let st = shape::strides(x.shape());
    let mut base = 0;
    let mut out = Vec::new();
    let mut out_strides = Vec::new();
    for (step, &s) in steps.iter().zip(&st) {
        match *step {
            IndexStep::At(i) => base += i * s,
            IndexStep::Range { start, len } => {
                base += start * s;
                out.push(len);
                out_strides.push(s);
            }
        }
    }
    Ok((base, out, out_strides))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, i64s, shape_of, v};
    use super::*;

    fn m() -> Value {
        v(Tensor::from_vec((0..12).map(|i| i as f32).collect(), &[3, 4]).unwrap())
    }

    fn int(i: i64) -> Value {
        v(Tensor::weak_i64(i))
    }

    fn sl(a: Option<i64>, b: Option<i64>) -> Value {
        let f = |x: Option<i64>| x.map(int).unwrap_or_else(Value::unit);
        Value::tuple(vec![f(a), f(b)])
    }

    #[test]
    fn takes() {
        let idx = v(Tensor::vector(vec![2i64, 0, -1]));
        let r = call("take", &[m(), idx.clone(), int(0)]);
        assert_eq!(shape_of(&r), vec![3, 4]);
        assert_eq!(&f32s(&r)[..5], &[8.0, 9.0, 10.0, 11.0, 0.0]);
        let r = call("take", &[m(), idx.clone(), int(1)]);
        assert_eq!(shape_of(&r), vec![3, 3]);
        assert_eq!(&f32s(&r)[..3], &[2.0, 0.0, 3.0]);
        let r = call("take", &[m(), idx.clone(), Value::unit()]);
        assert_eq!(f32s(&r), vec![2.0, 0.0, 11.0]);
        let idx2 = v(Tensor::from_vec(vec![0i32, 1, 1, 0], &[2, 2]).unwrap());
        let r = call("take", &[m(), idx2, int(0)]);
        assert_eq!(shape_of(&r), vec![2, 2, 4]);
        assert_eq!(
            call_err("take", &[m(), v(Tensor::vector(vec![7i64])), int(0)]),
            "take: index 7 is out of range for axis 0 of size 3"
        );
        assert!(
            call_err("take", &[m(), v(Tensor::vector(vec![1.0f32])), int(0)])
                .contains("must be ints")
        );
    }

    #[test]
    fn updates_write_in_place_only_when_unshared() {
        let Value::Tensor(t) = m() else {
            unreachable!()
        };
        let shared = t.clone();
        let row1 = Value::tuple(vec![int(1)]);
        let r = update(Update::Set, t, &row1, &v(Tensor::scalar_f32(-1.0))).unwrap();
        assert_eq!(&f32s(&r)[4..8], &[-1.0; 4]);
        assert_eq!(shared.as_f32().unwrap()[4], 4.0);
        let Value::Tensor(t) = m() else {
            unreachable!()
        };
        let at = t.as_f32().unwrap().as_ptr();
        let col0 = Value::tuple(vec![sl(Some(0), Some(2)), int(0)]);
        let r = update(Update::Max, t, &col0, &v(Tensor::scalar_f32(5.0))).unwrap();
        assert_eq!(r.as_tensor().unwrap().as_f32().unwrap().as_ptr(), at);
        assert_eq!([f32s(&r)[0], f32s(&r)[4], f32s(&r)[8]], [5.0, 5.0, 8.0]);
        let r = call(
            "index_add",
            &[
                m(),
                row1.clone(),
                v(Tensor::vector(vec![1.0f64, 2.0, 3.0, 4.0])),
            ],
        );
        assert_eq!(&f32s(&r)[4..8], &[5.0, 7.0, 9.0, 11.0]);
        let r = call("index_at", &[m(), Value::tuple(vec![int(2), int(1)])]);
        assert_eq!(f32s(&r), vec![9.0]);
        let one = v(Tensor::scalar_f32(1.0));
        assert!(
            call_err("index_set", &[m(), Value::tuple(vec![int(3)]), one.clone()])
                .contains("out of range")
        );
        let two = v(Tensor::vector(vec![1.0f32, 2.0]));
        assert!(call_err("index_mul", &[m(), row1, two]).contains("cannot broadcast"));
    }

    #[test]
    fn indexes() {
        let r = call("index", &[m(), int(1)]);
        assert_eq!(f32s(&r), vec![4.0, 5.0, 6.0, 7.0]);
        let r = call("index", &[m(), int(-1), int(2)]);
        assert_eq!(r, v(Tensor::scalar_f32(10.0)));
        let r = call("index", &[m(), sl(None, None), int(0)]);
        assert_eq!(f32s(&r), vec![0.0, 4.0, 8.0]);
        let r = call("index", &[m(), sl(Some(1), Some(3)), sl(None, Some(2))]);
        assert_eq!(shape_of(&r), vec![2, 2]);
        assert_eq!(f32s(&r), vec![4.0, 5.0, 8.0, 9.0]);
        let r = call("index", &[m(), sl(Some(2), None)]);
        assert_eq!(shape_of(&r), vec![1, 4]);
        let r = call("index", &[m(), sl(Some(1), Some(1))]);
        assert_eq!(shape_of(&r), vec![0, 4]);
        assert_eq!(call("index", &[m()]), m());
        assert_eq!(
            call_err("index", &[m(), int(5)]),
            "index 5 is out of range for axis 0 of size 3"
        );
        assert_eq!(
            call_err("index", &[m(), int(0), sl(Some(3), Some(9))]),
            "slice 3:9 is out of range for axis 1 of size 4"
        );
        assert!(call_err("index", &[m(), int(0), int(0), int(0)]).contains("too many indices"));
        assert!(call_err("index", &[m(), v(Tensor::vector(vec![0i64]))]).contains("use take"));
        let ints = v(Tensor::vector(vec![5i64, 6, 7]));
        assert_eq!(
            i64s(&call("index", &[ints, sl(Some(-2), None)])),
            vec![6, 7]
        );
    }
}
