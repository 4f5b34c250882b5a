//! Shape rules of every primitive, as pure functions.
//!
//! The kernels and the compiler's static type inference call the same
//! functions, so a program is rejected with the same message whether the
//! error is found at compile time or at run time. Tensor operands are
//! passed as [`TensorTy`] (a dtype and a shape) only so that messages can
//! name them (`f32[3, 4]`); the rules themselves look at shapes. Errors are
//! lowercase and name the operation.

use std::fmt;

use crate::dtype::DType;

/// The static type of a tensor operand: what messages call `f32[3, 4]`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TensorTy<'a> {
    /// The element type.
    pub dtype: DType,
    /// The dimensions.
    pub shape: &'a [usize],
}

impl<'a> TensorTy<'a> {
    /// The type of a tensor of this dtype and shape.
    pub fn new(dtype: DType, shape: &'a [usize]) -> TensorTy<'a> {
        TensorTy { dtype, shape }
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
}

/// `f32[3, 4]`; `f32[]` for a scalar.
impl fmt::Display for TensorTy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, fmt_shape(self.shape))
    }
}

/// `[3, 4]`; `[]` for a scalar.
pub fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

/// Number of elements, or `None` on overflow.
pub fn checked_size(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The largest tensor the runtime will allocate, in elements (a resource
/// limit: larger requests are errors, not aborts).
pub const MAX_ELEMENTS: usize = 1 << 32;

/// Checks that a tensor of `n` elements may be allocated.
pub fn check_alloc(op: &str, n: usize) -> Result<(), String> {
    if n > MAX_ELEMENTS {
        Err(format!(
            "{op}: a tensor of {n} elements is larger than the limit of {MAX_ELEMENTS}"
        ))
    } else {
        Ok(())
    }
}

/// Number of elements (saturating).
pub fn size(shape: &[usize]) -> usize {
    checked_size(shape).unwrap_or(usize::MAX)
}

/// Row-major strides, in elements.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// An axis in `-ndim..ndim`, normalised to `0..ndim`.
pub fn normalize_axis(axis: i64, ndim: usize) -> Option<usize> {
    let n = ndim as i64;
    let a = if axis < 0 { axis + n } else { axis };
    (0..n).contains(&a).then_some(a as usize)
}

/// [`normalize_axis`] with the error `{op}: axis {axis} is out of range for {what}`.
pub fn axis(op: &str, axis: i64, ndim: usize, what: &dyn fmt::Display) -> Result<usize, String> {
    normalize_axis(axis, ndim)
        .ok_or_else(|| format!("{op}: axis {axis} is out of range for {what}"))
}

/// Several axes of `x`, normalised, sorted, without repeats.
pub fn axes(op: &str, axes: &[i64], x: TensorTy) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = axis(op, a, x.ndim(), &x)?;
        if out.contains(&n) {
            return Err(format!("{op}: axis {a} is repeated"));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

fn too_big(op: &str) -> String {
    format!("{op}: the result would be too large")
}

/// NumPy broadcasting of two shapes: align from the right, a 1 stretches.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

fn join_types(xs: &[TensorTy]) -> String {
    let names: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, init)) => format!("{} and {last}", init.join(", ")),
    }
}

/// The broadcast shape of two operands of `op`.
pub fn broadcast(op: &str, a: TensorTy, b: TensorTy) -> Result<Vec<usize>, String> {
    broadcast_all(op, &[a, b])
}

/// The broadcast shape of several operands of `op` (`where` has three).
pub fn broadcast_all(op: &str, xs: &[TensorTy]) -> Result<Vec<usize>, String> {
    let mut out: Vec<usize> = Vec::new();
    for x in xs {
        out = broadcast_shapes(&out, x.shape)
            .ok_or_else(|| format!("{op}: shapes {} cannot be broadcast", join_types(xs)))?;
    }
    Ok(out)
}

/// `broadcast_to(x, shape)`: `x` must broadcast to exactly `target`.
pub fn broadcast_to(op: &str, x: TensorTy, target: &[usize]) -> Result<Vec<usize>, String> {
    match broadcast_shapes(x.shape, target) {
        Some(s) if s == target => Ok(s),
        _ => Err(format!(
            "{op}: cannot broadcast {x} to {}",
            fmt_shape(target)
        )),
    }
}

/// The reduced axes of a reduction: all of them when `axes` is `None`.
pub fn reduce_axes(op: &str, x: TensorTy, axes_: Option<&[i64]>) -> Result<Vec<usize>, String> {
    match axes_ {
        None => Ok((0..x.ndim()).collect()),
        Some(a) => axes(op, a, x),
    }
}

/// The result shape of a reduction over `axes` (all when `None`); reduced
/// axes stay as 1s with `keepdims`.
pub fn reduce(
    op: &str,
    x: TensorTy,
    axes_: Option<&[i64]>,
    keepdims: bool,
) -> Result<Vec<usize>, String> {
    let red = reduce_axes(op, x, axes_)?;
    Ok(x.shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (red.contains(&i), keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect())
}

/// How a (batched) matrix product is computed: the operands, viewed as
/// stacks of `m×k` and `k×n` matrices, and the result shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulPlan {
    /// The broadcast batch dimensions of the result.
    pub batch: Vec<usize>,
    /// The batch dimensions of the left operand (before broadcasting).
    pub a_batch: Vec<usize>,
    /// The batch dimensions of the right operand (before broadcasting).
    pub b_batch: Vec<usize>,
    /// Rows of each left matrix (1 for a 1-d left operand).
    pub m: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Columns of each right matrix (1 for a 1-d right operand).
    pub n: usize,
    /// The result shape (1-d operands' promoted dimensions removed).
    pub shape: Vec<usize>,
}

/// Plans NumPy `matmul`: a 1-d left operand gets a leading 1, a 1-d right
/// operand a trailing 1 (both removed from the result); leading dimensions
/// are batch dimensions and broadcast.
pub fn matmul_plan(a: TensorTy, b: TensorTy) -> Result<MatmulPlan, String> {
    let op = "`@`";
    let rank = || format!("{op} of {a} and {b}: operands must be at least 1-d");
    let (a_batch, m, ka) = match a.shape {
        [k] => (&[][..], 1, *k),
        [batch @ .., m, k] => (batch, *m, *k),
        [] => return Err(rank()),
    };
    let (b_batch, kb, n) = match b.shape {
        [k] => (&[][..], *k, 1),
        [batch @ .., k, n] => (batch, *k, *n),
        [] => return Err(rank()),
    };
    if ka != kb {
        return Err(format!(
            "{op} of {a} and {b}: inner dimensions {ka} and {kb} differ"
        ));
    }
    let batch = broadcast_shapes(a_batch, b_batch).ok_or_else(|| {
        format!(
            "{op} of {a} and {b}: batch dimensions {} and {} cannot be broadcast",
            fmt_shape(a_batch),
            fmt_shape(b_batch)
        )
    })?;
    let mut shape = batch.clone();
    if a.ndim() > 1 {
        shape.push(m);
    }
    if b.ndim() > 1 {
        shape.push(n);
    }
    checked_size(&shape).ok_or_else(|| too_big(op))?;
    Ok(MatmulPlan {
        batch,
        a_batch: a_batch.to_vec(),
        b_batch: b_batch.to_vec(),
        m,
        k: ka,
        n,
        shape,
    })
}

/// The result shape of `a @ b` (see [`matmul_plan`]).
pub fn matmul(a: TensorTy, b: TensorTy) -> Result<Vec<usize>, String> {
    matmul_plan(a, b).map(|p| p.shape)
}

/// The result shape of `dot(a, b)`, NumPy style for 0-d, 1-d and 2-d
/// operands: with a scalar it multiplies; otherwise it is [`matmul`].
pub fn dot(a: TensorTy, b: TensorTy) -> Result<Vec<usize>, String> {
    if a.ndim() == 0 || b.ndim() == 0 {
        return broadcast("dot", a, b);
    }
    if a.ndim() > 2 || b.ndim() > 2 {
        return Err(format!(
            "dot: expected 1-d or 2-d operands, got {a} and {b}; use matmul for batches"
        ));
    }
    matmul_plan(a, b)
        .map(|p| p.shape)
        .map_err(|e| e.replacen("`@`", "dot", 1))
}

/// The result shape of `outer(a, b)`: `[size(a), size(b)]` (operands are flattened).
pub fn outer(a: TensorTy, b: TensorTy) -> Result<Vec<usize>, String> {
    let shape = vec![size(a.shape), size(b.shape)];
    checked_size(&shape).ok_or_else(|| too_big("outer"))?;
    Ok(shape)
}

/// The result shape of `reshape(x, target)`; one entry of `target` may be
/// -1 and is then inferred.
pub fn reshape(x: TensorTy, target: &[i64]) -> Result<Vec<usize>, String> {
    let op = "reshape";
    let total = size(x.shape);
    let mut hole = None;
    let mut known = 1usize;
    for (i, &d) in target.iter().enumerate() {
        if d == -1 {
            if hole.is_some() {
                return Err(format!("{op}: only one dimension may be -1"));
            }
            hole = Some(i);
        } else if d < 0 {
            return Err(format!("{op}: invalid dimension {d}"));
        } else {
            known = known.checked_mul(d as usize).ok_or_else(|| too_big(op))?;
        }
    }
    let show = || {
        let dims: Vec<String> = target.iter().map(|d| d.to_string()).collect();
        format!("[{}]", dims.join(", "))
    };
    let mut out: Vec<usize> = target.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(h) = hole {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!(
                "{op}: cannot reshape {x} ({total} elements) into {}",
                show()
            ));
        }
        out[h] = total / known;
    } else if known != total {
        return Err(format!(
            "{op}: cannot reshape {x} ({total} elements) into {}",
            show()
        ));
    }
    Ok(out)
}

/// The permutation `transpose(x, perm)` applies, normalised; `None`
/// reverses all axes.
pub fn transpose_perm(x: TensorTy, perm: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let n = x.ndim();
    let Some(perm) = perm else {
        return Ok((0..n).rev().collect());
    };
    let bad = || {
        let p: Vec<String> = perm.iter().map(|d| d.to_string()).collect();
        format!(
            "transpose: [{}] is not a permutation of the {n} axes of {x}",
            p.join(", ")
        )
    };
    if perm.len() != n {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(n);
    for &p in perm {
        let a = normalize_axis(p, n).ok_or_else(bad)?;
        if out.contains(&a) {
            return Err(bad());
        }
        out.push(a);
    }
    Ok(out)
}

/// The result shape of `transpose(x, perm)`.
pub fn transpose(x: TensorTy, perm: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let p = transpose_perm(x, perm)?;
    Ok(p.iter().map(|&a| x.shape[a]).collect())
}

/// The result shape of `concat(xs, axis)`: equal ranks, equal dimensions
/// except along `axis`.
pub fn concat(xs: &[TensorTy], axis_: i64) -> Result<Vec<usize>, String> {
    let op = "concat";
    let Some(first) = xs.first() else {
        return Err(format!("{op}: expected at least one tensor"));
    };
    let ax = axis(op, axis_, first.ndim(), first)?;
    let mut out = first.shape.to_vec();
    for x in &xs[1..] {
        if x.ndim() != first.ndim() {
            return Err(format!("{op}: {first} and {x} have different ranks"));
        }
        for (i, (&d0, &d)) in first.shape.iter().zip(x.shape).enumerate() {
            if i != ax && d0 != d {
                return Err(format!(
                    "{op}: shapes {first} and {x} differ outside axis {ax}"
                ));
            }
        }
        out[ax] = out[ax]
            .checked_add(x.shape[ax])
            .ok_or_else(|| too_big(op))?;
    }
    Ok(out)
}

/// The result shape of `stack(xs, axis)`: equal shapes, a new axis of size
/// `xs.len()` at `axis` (in `-(ndim+1)..=ndim`).
pub fn stack(xs: &[TensorTy], axis_: i64) -> Result<Vec<usize>, String> {
    let op = "stack";
    let Some(first) = xs.first() else {
        return Err(format!("{op}: expected at least one tensor"));
    };
    for x in &xs[1..] {
        if x.shape != first.shape {
            return Err(format!("{op}: shapes {first} and {x} differ"));
        }
    }
    let ax = axis(op, axis_, first.ndim() + 1, first)?;
    let mut out = first.shape.to_vec();
    out.insert(ax, xs.len());
    Ok(out)
}

/// The result shape of `expand_dims(x, axis)`: a 1 inserted at `axis`
/// (in `-(ndim+1)..=ndim`).
pub fn expand_dims(x: TensorTy, axis_: i64) -> Result<Vec<usize>, String> {
    let ax = axis("expand_dims", axis_, x.ndim() + 1, &x)?;
    let mut out = x.shape.to_vec();
    out.insert(ax, 1);
    Ok(out)
}

/// The result shape of `squeeze(x, axes)`: the given size-1 axes removed,
/// or every size-1 axis when `None`.
pub fn squeeze(x: TensorTy, axes_: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let op = "squeeze";
    let Some(a) = axes_ else {
        return Ok(x.shape.iter().copied().filter(|&d| d != 1).collect());
    };
    let red = axes(op, a, x)?;
    for &i in &red {
        if x.shape[i] != 1 {
            return Err(format!(
                "{op}: axis {i} of {x} has size {}, not 1",
                x.shape[i]
            ));
        }
    }
    Ok(x.shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !red.contains(i))
        .map(|(_, &d)| d)
        .collect())
}

/// The result shape of `sum_to(x, like)`: `like`'s shape, which must
/// broadcast to `x`'s (summing undoes that broadcast).
pub fn sum_to(x: TensorTy, like: TensorTy) -> Result<Vec<usize>, String> {
    match broadcast_shapes(like.shape, x.shape) {
        Some(s) if s == x.shape => Ok(like.shape.to_vec()),
        _ => Err(format!("sum_to: cannot sum {x} to the shape of {like}")),
    }
}

/// The permutation of `mT(x)`: the last two axes swapped (rank >= 2).
pub fn matrix_t_perm(x: TensorTy) -> Result<Vec<usize>, String> {
    let n = x.ndim();
    if n < 2 {
        return Err(format!("mT: expected at least 2 dimensions, got {x}"));
    }
    let mut perm: Vec<usize> = (0..n).collect();
    perm.swap(n - 2, n - 1);
    Ok(perm)
}

/// The result shape of `mT(x)`.
pub fn matrix_t(x: TensorTy) -> Result<Vec<usize>, String> {
    let p = matrix_t_perm(x)?;
    Ok(p.iter().map(|&a| x.shape[a]).collect())
}

/// The permutation that `transpose_grad(d, perm)` applies to `d` (the
/// result of `transpose(_, perm)`): the inverse of `perm`, normalised.
pub fn transpose_grad_perm(d: TensorTy, perm: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let p = transpose_perm(d, perm).map_err(|e| e.replacen("transpose:", "transpose_grad:", 1))?;
    let mut inv = vec![0; p.len()];
    for (i, &a) in p.iter().enumerate() {
        inv[a] = i;
    }
    Ok(inv)
}

/// The result shape of `transpose_grad(d, perm)`.
pub fn transpose_grad(d: TensorTy, perm: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let p = transpose_grad_perm(d, perm)?;
    Ok(p.iter().map(|&a| d.shape[a]).collect())
}

/// `split_like(d, xs, axis)`: the normalised axis and the shape of each
/// piece (`d`'s shape with `xs[i]`'s length along the axis). `d` must be
/// what `concat(xs, axis)` gives: the same rank as every `xs[i]`, equal
/// dimensions outside the axis, and the lengths along it adding up.
pub fn split_like(
    d: TensorTy,
    xs: &[TensorTy],
    axis_: i64,
) -> Result<(usize, Vec<Vec<usize>>), String> {
    let op = "split_like";
    if xs.is_empty() {
        return Err(format!("{op}: expected at least one tensor"));
    }
    let ax = axis(op, axis_, d.ndim(), &d)?;
    let mut total = 0usize;
    let mut out = Vec::with_capacity(xs.len());
    for x in xs {
        let fits = x.ndim() == d.ndim()
            && x.shape
                .iter()
                .zip(d.shape)
                .enumerate()
                .all(|(i, (a, b))| i == ax || a == b);
        if !fits {
            return Err(format!("{op}: {x} is not a piece of {d} along axis {ax}"));
        }
        total = total.saturating_add(x.shape[ax]);
        let mut s = d.shape.to_vec();
        s[ax] = x.shape[ax];
        out.push(s);
    }
    if total != d.shape[ax] {
        return Err(format!(
            "{op}: the pieces have {total} elements along axis {ax}, but {d} has {}",
            d.shape[ax]
        ));
    }
    Ok((ax, out))
}

/// `unstack(d, axis)`: the normalised axis, the number of pieces and the
/// shape of each (`d`'s without the axis).
pub fn unstack(d: TensorTy, axis_: i64) -> Result<(usize, usize, Vec<usize>), String> {
    let ax = axis("unstack", axis_, d.ndim(), &d)?;
    let mut s = d.shape.to_vec();
    let n = s.remove(ax);
    Ok((ax, n, s))
}

fn require_int(op: &str, what: &str, t: TensorTy) -> Result<(), String> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(format!("{op}: {what} must be ints, got {t}"))
    }
}

/// The result shape of `take(x, idx, axis)`: `x.shape[..axis] ++ idx.shape
/// ++ x.shape[axis+1..]`; with no axis, `x` is flattened first and the
/// result has `idx`'s shape.
/// A scan or ordering along one axis (`cumsum`, `cumprod`, `argsort`):
/// the result's shape and the axis, normalised. Without an axis the
/// tensor is taken flattened, as NumPy does: the result is 1-d and the
/// axis is 0.
pub fn scan(op: &str, x: TensorTy, axis_: Option<i64>) -> Result<(Vec<usize>, usize), String> {
    match axis_ {
        Some(a) => {
            if x.ndim() == 0 {
                return Err(format!("{op}: axis {a} is out of range for {x}"));
            }
            Ok((x.shape.to_vec(), axis(op, a, x.ndim(), &x)?))
        }
        None => Ok((vec![size(x.shape)], 0)),
    }
}

pub fn take(x: TensorTy, idx: TensorTy, axis_: Option<i64>) -> Result<Vec<usize>, String> {
    let op = "take";
    require_int(op, "indices", idx)?;
    let Some(a) = axis_ else {
        return Ok(idx.shape.to_vec());
    };
    let ax = axis(op, a, x.ndim(), &x)?;
    let mut out = x.shape[..ax].to_vec();
    out.extend_from_slice(idx.shape);
    out.extend_from_slice(&x.shape[ax + 1..]);
    checked_size(&out).ok_or_else(|| too_big(op))?;
    Ok(out)
}

/// The result shape of `one_hot(labels, n)`: `labels.shape ++ [n]`.
pub fn one_hot(labels: TensorTy, n: i64) -> Result<Vec<usize>, String> {
    let op = "one_hot";
    require_int(op, "labels", labels)?;
    if n < 0 {
        return Err(format!("{op}: the number of classes must be >= 0, got {n}"));
    }
    let mut out = labels.shape.to_vec();
    out.push(n as usize);
    checked_size(&out).ok_or_else(|| too_big(op))?;
    Ok(out)
}

/// One component of an index expression `x[c0, c1, ..]`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IndexComp {
    /// `x[i]`: selects one position and removes the axis; a negative index
    /// counts from the end. `None`: a dynamic index (checked at run time).
    At(Option<i64>),
    /// `x[a:b]` with either bound omitted (`None`); negative bounds count
    /// from the end.
    Slice(Option<i64>, Option<i64>),
    /// `x[e : e + len]` with a dynamic start `e`: a static length.
    Window(usize),
}

/// A resolved, in-range index component along one axis.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IndexStep {
    /// Select this position (the axis disappears).
    At(usize),
    /// Keep `len` positions starting at `start`.
    Range {
        /// First position kept.
        start: usize,
        /// Number of positions kept.
        len: usize,
    },
}

fn bound(b: Option<i64>) -> String {
    b.map(|v| v.to_string()).unwrap_or_default()
}

fn check_components(x: TensorTy, comps: &[IndexComp]) -> Result<(), String> {
    if comps.len() > x.ndim() {
        return Err(format!(
            "index: too many indices for {x}: {} given",
            comps.len()
        ));
    }
    Ok(())
}

/// Position `i` along axis `ax` of size `n` (negative ones count from the
/// end), or the error indexing reports when it is out of range.
pub fn resolve_at(i: i64, ax: usize, n: usize) -> Result<usize, String> {
    let j = if i < 0 { i + n as i64 } else { i };
    if (0..n as i64).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!(
            "index {i} is out of range for axis {ax} of size {n}"
        ))
    }
}

fn resolve_slice(s: Option<i64>, e: Option<i64>, ax: usize, n: usize) -> Result<IndexStep, String> {
    let fix = |v: i64| if v < 0 { v + n as i64 } else { v };
    let start = s.map(fix).unwrap_or(0);
    let stop = e.map(fix).unwrap_or(n as i64);
    if 0 <= start && start <= stop && stop <= n as i64 {
        Ok(IndexStep::Range {
            start: start as usize,
            len: (stop - start) as usize,
        })
    } else {
        Err(format!(
            "slice {}:{} is out of range for axis {ax} of size {n}",
            bound(s),
            bound(e)
        ))
    }
}

/// The result shape of `x[comps..]`: selected axes disappear, sliced axes
/// keep their slice length, axes past the last component stay whole.
/// Static indices and bounds are range-checked.
pub fn index(x: TensorTy, comps: &[IndexComp]) -> Result<Vec<usize>, String> {
    check_components(x, comps)?;
    let mut out = Vec::with_capacity(x.ndim());
    for (ax, &n) in x.shape.iter().enumerate() {
        match comps.get(ax) {
            None => out.push(n),
            Some(IndexComp::At(Some(i))) => {
                resolve_at(*i, ax, n)?;
            }
            Some(IndexComp::At(None)) => {}
            Some(IndexComp::Slice(s, e)) => {
                if let IndexStep::Range { len, .. } = resolve_slice(*s, *e, ax, n)? {
                    out.push(len);
                }
            }
            Some(IndexComp::Window(len)) => {
                if *len > n {
                    return Err(format!(
                        "slice of length {len} is out of range for axis {ax} of size {n}"
                    ));
                }
                out.push(*len);
            }
        }
    }
    Ok(out)
}

/// Resolves concrete index components to in-range steps, one per axis of
/// `x` (axes past the last component are whole ranges). Dynamic components
/// (`At(None)`, `Window`) are rejected: at run time every value is known.
pub fn resolve_index(x: TensorTy, comps: &[IndexComp]) -> Result<Vec<IndexStep>, String> {
    check_components(x, comps)?;
    x.shape
        .iter()
        .enumerate()
        .map(|(ax, &n)| match comps.get(ax) {
            None => Ok(IndexStep::Range { start: 0, len: n }),
            Some(IndexComp::At(Some(i))) => resolve_at(*i, ax, n).map(IndexStep::At),
            Some(IndexComp::Slice(s, e)) => resolve_slice(*s, *e, ax, n),
            Some(IndexComp::At(None)) | Some(IndexComp::Window(_)) => {
                Err("index: dynamic component at run time".to_string())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    fn t(shape: &[usize]) -> TensorTy<'_> {
        TensorTy::new(F32, shape)
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]), Some(vec![3, 4]));
        assert_eq!(broadcast_shapes(&[], &[2, 3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[2, 1, 5], &[3, 1]), Some(vec![2, 3, 5]));
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast_shapes(&[3], &[4]), None);
        assert_eq!(
            broadcast("add", t(&[3]), t(&[4])).unwrap_err(),
            "add: shapes f32[3] and f32[4] cannot be broadcast"
        );
        assert_eq!(
            broadcast_all("where", &[TensorTy::new(Bool, &[2]), t(&[3]), t(&[])]).unwrap_err(),
            "where: shapes bool[2], f32[3] and f32[] cannot be broadcast"
        );
        assert_eq!(
            broadcast_to("broadcast_to", t(&[3, 1]), &[2, 3, 4]),
            Ok(vec![2, 3, 4])
        );
        assert!(broadcast_to("broadcast_to", t(&[3]), &[1]).is_err());
    }

    #[test]
    fn reductions() {
        assert_eq!(reduce("sum", t(&[2, 3, 4]), None, false), Ok(vec![]));
        assert_eq!(reduce("sum", t(&[2, 3, 4]), None, true), Ok(vec![1, 1, 1]));
        assert_eq!(
            reduce("sum", t(&[2, 3, 4]), Some(&[-1]), false),
            Ok(vec![2, 3])
        );
        assert_eq!(
            reduce("sum", t(&[2, 3, 4]), Some(&[0, 2]), true),
            Ok(vec![1, 3, 1])
        );
        assert_eq!(
            reduce("sum", t(&[2, 3]), Some(&[2]), false).unwrap_err(),
            "sum: axis 2 is out of range for f32[2, 3]"
        );
        assert!(reduce("sum", t(&[2, 3]), Some(&[0, -2]), false).is_err());
    }

    #[test]
    fn matmul_rules() {
        assert_eq!(matmul(t(&[3, 4]), t(&[4, 2])), Ok(vec![3, 2]));
        assert_eq!(matmul(t(&[4]), t(&[4, 2])), Ok(vec![2]));
        assert_eq!(matmul(t(&[3, 4]), t(&[4])), Ok(vec![3]));
        assert_eq!(matmul(t(&[4]), t(&[4])), Ok(vec![]));
        assert_eq!(
            matmul(t(&[5, 1, 3, 4]), t(&[2, 4, 6])),
            Ok(vec![5, 2, 3, 6])
        );
        assert_eq!(
            matmul(t(&[3, 4]), t(&[5, 2])).unwrap_err(),
            "`@` of f32[3, 4] and f32[5, 2]: inner dimensions 4 and 5 differ"
        );
        assert!(matmul(t(&[2, 3, 4]), t(&[3, 4, 2])).is_err());
        assert!(matmul(t(&[]), t(&[3])).is_err());
        assert_eq!(dot(t(&[3]), t(&[3])), Ok(vec![]));
        assert_eq!(dot(t(&[]), t(&[2, 2])), Ok(vec![2, 2]));
        assert_eq!(
            dot(t(&[3]), t(&[4])).unwrap_err(),
            "dot of f32[3] and f32[4]: inner dimensions 3 and 4 differ"
        );
        assert!(dot(t(&[2, 3, 4]), t(&[4])).is_err());
        assert_eq!(outer(t(&[3]), t(&[2, 2])), Ok(vec![3, 4]));
    }

    #[test]
    fn reshapes() {
        assert_eq!(reshape(t(&[3, 4]), &[2, 6]), Ok(vec![2, 6]));
        assert_eq!(reshape(t(&[3, 4]), &[-1, 2]), Ok(vec![6, 2]));
        assert_eq!(reshape(t(&[3, 4]), &[-1]), Ok(vec![12]));
        assert_eq!(reshape(t(&[1]), &[]), Ok(vec![]));
        assert_eq!(
            reshape(t(&[3, 4]), &[5, 2]).unwrap_err(),
            "reshape: cannot reshape f32[3, 4] (12 elements) into [5, 2]"
        );
        assert!(reshape(t(&[3, 4]), &[-1, -1]).is_err());
        assert!(reshape(t(&[3, 4]), &[-1, 5]).is_err());
        assert!(reshape(t(&[3, 4]), &[-3, -4]).is_err());
    }

    #[test]
    fn transposes() {
        assert_eq!(transpose(t(&[2, 3, 4]), None), Ok(vec![4, 3, 2]));
        assert_eq!(
            transpose(t(&[2, 3, 4]), Some(&[0, 2, 1])),
            Ok(vec![2, 4, 3])
        );
        assert_eq!(transpose(t(&[2, 3]), Some(&[-1, 0])), Ok(vec![3, 2]));
        assert_eq!(
            transpose(t(&[2, 3]), Some(&[0, 0])).unwrap_err(),
            "transpose: [0, 0] is not a permutation of the 2 axes of f32[2, 3]"
        );
    }

    #[test]
    fn joining() {
        assert_eq!(concat(&[t(&[2, 3]), t(&[4, 3])], 0), Ok(vec![6, 3]));
        assert_eq!(concat(&[t(&[2, 3]), t(&[2, 1])], -1), Ok(vec![2, 4]));
        assert!(concat(&[t(&[2, 3]), t(&[2, 1])], 0).is_err());
        assert!(concat(&[t(&[2]), t(&[2, 1])], 0).is_err());
        assert!(concat(&[], 0).is_err());
        assert!(concat(&[t(&[])], 0).is_err());
        assert_eq!(stack(&[t(&[3]), t(&[3])], 0), Ok(vec![2, 3]));
        assert_eq!(stack(&[t(&[3]), t(&[3])], 1), Ok(vec![3, 2]));
        assert_eq!(stack(&[t(&[3]), t(&[3])], -1), Ok(vec![3, 2]));
        assert!(stack(&[t(&[3]), t(&[4])], 0).is_err());
        assert_eq!(expand_dims(t(&[3]), 0), Ok(vec![1, 3]));
        assert_eq!(expand_dims(t(&[3]), -1), Ok(vec![3, 1]));
        assert!(expand_dims(t(&[3]), 2).is_err());
        assert_eq!(squeeze(t(&[1, 3, 1]), None), Ok(vec![3]));
        assert_eq!(squeeze(t(&[1, 3, 1]), Some(&[0])), Ok(vec![3, 1]));
        assert_eq!(
            squeeze(t(&[1, 3, 1]), Some(&[1])).unwrap_err(),
            "squeeze: axis 1 of f32[1, 3, 1] has size 3, not 1"
        );
    }

    #[test]
    fn gathering() {
        let idx = TensorTy::new(I64, &[5]);
        assert_eq!(take(t(&[3, 4]), idx, Some(0)), Ok(vec![5, 4]));
        assert_eq!(take(t(&[3, 4]), idx, Some(1)), Ok(vec![3, 5]));
        assert_eq!(take(t(&[3, 4]), idx, None), Ok(vec![5]));
        assert!(take(t(&[3, 4]), t(&[5]), None).is_err());
        assert_eq!(one_hot(TensorTy::new(I64, &[4]), 10), Ok(vec![4, 10]));
        assert!(one_hot(t(&[4]), 10).is_err());
    }

    #[test]
    fn indexing() {
        use IndexComp::*;
        let x = t(&[3, 4, 5]);
        assert_eq!(index(x, &[At(Some(1))]), Ok(vec![4, 5]));
        assert_eq!(index(x, &[At(Some(-1)), At(Some(0))]), Ok(vec![5]));
        assert_eq!(index(x, &[Slice(Some(1), Some(3))]), Ok(vec![2, 4, 5]));
        assert_eq!(index(x, &[Slice(None, None), At(Some(0))]), Ok(vec![3, 5]));
        assert_eq!(index(x, &[Slice(None, Some(-1))]), Ok(vec![2, 4, 5]));
        assert_eq!(index(x, &[At(None), Window(2)]), Ok(vec![2, 5]));
        assert_eq!(
            index(t(&[3]), &[At(Some(5))]).unwrap_err(),
            "index 5 is out of range for axis 0 of size 3"
        );
        assert_eq!(
            index(t(&[3]), &[Slice(Some(2), Some(5))]).unwrap_err(),
            "slice 2:5 is out of range for axis 0 of size 3"
        );
        assert!(index(t(&[3]), &[Window(4)]).is_err());
        assert!(index(t(&[3]), &[At(Some(0)), At(Some(0))]).is_err());
        assert_eq!(
            resolve_index(t(&[3, 4]), &[At(Some(-1))]),
            Ok(vec![
                IndexStep::At(2),
                IndexStep::Range { start: 0, len: 4 }
            ])
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(strides(&[]), Vec::<usize>::new());
        assert_eq!(fmt_shape(&[3, 4]), "[3, 4]");
        assert_eq!(TensorTy::new(I64, &[]).to_string(), "i64[]");
        assert_eq!(normalize_axis(-1, 3), Some(2));
        assert_eq!(normalize_axis(3, 3), None);
        assert_eq!(checked_size(&[usize::MAX, 2]), None);
    }

    #[test]
    fn adjoint_rules() {
        assert_eq!(sum_to(t(&[2, 3, 4]), t(&[3, 1])), Ok(vec![3, 1]));
        assert_eq!(sum_to(t(&[2, 3]), t(&[])), Ok(vec![]));
        assert_eq!(sum_to(t(&[2, 3]), t(&[2, 3])), Ok(vec![2, 3]));
        assert_eq!(
            sum_to(t(&[3]), t(&[2, 3])).unwrap_err(),
            "sum_to: cannot sum f32[3] to the shape of f32[2, 3]"
        );
        assert!(sum_to(t(&[2, 3]), t(&[2])).is_err());
        assert_eq!(matrix_t(t(&[2, 3, 4])), Ok(vec![2, 4, 3]));
        assert_eq!(
            matrix_t(t(&[3])).unwrap_err(),
            "mT: expected at least 2 dimensions, got f32[3]"
        );
        // transpose(x [2, 3, 4], [1, 2, 0]) is [3, 4, 2]; the gradient goes back.
        assert_eq!(
            transpose_grad(t(&[3, 4, 2]), Some(&[1, 2, 0])),
            Ok(vec![2, 3, 4])
        );
        assert_eq!(transpose_grad(t(&[3, 2]), None), Ok(vec![2, 3]));
        assert!(transpose_grad(t(&[3, 2]), Some(&[0]))
            .unwrap_err()
            .starts_with("transpose_grad: "));
        assert_eq!(
            split_like(t(&[2, 5]), &[t(&[2, 2]), t(&[2, 3])], -1),
            Ok((1, vec![vec![2, 2], vec![2, 3]]))
        );
        assert!(split_like(t(&[2, 5]), &[t(&[2, 2]), t(&[2, 2])], 1)
            .unwrap_err()
            .contains("4 elements along axis 1"));
        assert!(split_like(t(&[2, 5]), &[t(&[3, 5])], 1)
            .unwrap_err()
            .contains("is not a piece"));
        assert!(split_like(t(&[2, 5]), &[], 0).is_err());
        assert_eq!(unstack(t(&[2, 3, 4]), 1), Ok((1, 3, vec![2, 4])));
        assert!(unstack(t(&[]), 0).is_err());
    }
}

/// A stack of square matrices `[.., n, n]` (`det`, `slogdet`, `cholesky`,
/// `eigh`, and the `a` of the solves): its batch dimensions and `n`.
pub fn square(op: &str, a: TensorTy) -> Result<(Vec<usize>, usize), String> {
    match a.shape {
        [batch @ .., n, m] if n == m => Ok((batch.to_vec(), *n)),
        _ => Err(format!(
            "{op}: expected a square matrix or a stack of them (shape [.., n, n]), got {a}"
        )),
    }
}

/// How `solve(a, b)` and `triangular_solve(a, b)` run: `a` is `[.., n, n]`,
/// `b` is `[.., n, k]`, or `[n]` (one right-hand side, as NumPy takes a
/// 1-d `b`); the batch dimensions broadcast.
#[derive(Clone, Debug)]
pub struct SolvePlan {
    pub batch: Vec<usize>,
    pub a_batch: Vec<usize>,
    pub b_batch: Vec<usize>,
    pub n: usize,
    /// Right-hand sides per matrix.
    pub k: usize,
    /// The result's shape: the batch, then `[n, k]` (`[n]` for a 1-d `b`).
    pub shape: Vec<usize>,
}

pub fn solve_plan(op: &str, a: TensorTy, b: TensorTy) -> Result<SolvePlan, String> {
    let (a_batch, n) = square(op, a)?;
    let (b_batch, nb, k, vector) = match b.shape {
        [nb] => (&[][..], *nb, 1, true),
        [batch @ .., nb, k] => (batch, *nb, *k, false),
        [] => {
            return Err(format!(
                "{op}: b must be a vector or a matrix (or a stack of them), got {b}"
            ))
        }
    };
    if nb != n {
        return Err(format!(
            "{op}: a is {a}, so b needs {n} rows, but it is {b}"
        ));
    }
    let batch = broadcast_shapes(&a_batch, b_batch).ok_or_else(|| {
        format!(
            "{op}: the batch dimensions of a ({}) and b ({}) cannot be broadcast",
            fmt_shape(&a_batch),
            fmt_shape(b_batch)
        )
    })?;
    let mut shape = batch.clone();
    shape.push(n);
    if !vector {
        shape.push(k);
    }
    checked_size(&shape).ok_or_else(|| too_big(op))?;
    Ok(SolvePlan {
        batch,
        a_batch,
        b_batch: b_batch.to_vec(),
        n,
        k,
        shape,
    })
}

/// `qr(a)` of `a: [.., m, n]`, reduced as NumPy's default: the shapes of
/// `q` (`[.., m, k]`) and `r` (`[.., k, n]`), `k = min(m, n)`.
pub fn qr(a: TensorTy) -> Result<(Vec<usize>, Vec<usize>), String> {
    match a.shape {
        [batch @ .., m, n] => {
            let k = (*m).min(*n);
            let mut q = batch.to_vec();
            q.extend([*m, k]);
            let mut r = batch.to_vec();
            r.extend([k, *n]);
            Ok((q, r))
        }
        _ => Err(format!(
            "qr: expected a matrix or a stack of them (shape [.., m, n]), got {a}"
        )),
    }
}

/// The length of `vmap`'s mapped axes: `leaves` holds, for each mapped
/// leaf, the index of its argument, its shape (one lane's) and the axis
/// mapped. `None` when no leaf is mapped.
pub fn mapped_len(leaves: &[(usize, &[usize], i64)]) -> Result<Option<usize>, String> {
    let mut n: Option<(usize, usize)> = None;
    for &(i, s, a) in leaves {
        let r = s.len() as i64;
        let p = if a < 0 { a + r } else { a };
        if p < 0 || p >= r {
            return Err(format!(
                "vmap: in_axes {a} for argument {} of rank {r}",
                i + 1
            ));
        }
        let d = s[p as usize];
        match n {
            Some((m, j)) if m != d => {
                return Err(format!(
                    "vmap: mapped axes differ in length: {m} (argument {}) and {d} (argument {})",
                    j + 1,
                    i + 1
                ))
            }
            Some(_) => {}
            None => n = Some((d, i)),
        }
    }
    Ok(n.map(|(d, _)| d))
}

/// The shape of `all_gather(x, axis)` over `ranks` processes: axis `axis`
/// (normalised) `ranks` times as long.
pub fn all_gather(x: TensorTy, axis: i64, ranks: usize) -> Result<(usize, Vec<usize>), String> {
    if x.ndim() == 0 {
        return Err(format!("all_gather: needs a tensor with an axis, got {x}"));
    }
    let a = self::axis("all_gather", axis, x.ndim(), &x)?;
    let mut s = x.shape.to_vec();
    s[a] = s[a]
        .checked_mul(ranks)
        .ok_or_else(|| too_big("all_gather"))?;
    Ok((a, s))
}

/// The shape of `reduce_scatter(x, axis)` over `ranks` processes: axis
/// `axis` (normalised) cut into `ranks` equal chunks.
pub fn reduce_scatter(x: TensorTy, axis: i64, ranks: usize) -> Result<(usize, Vec<usize>), String> {
    if x.ndim() == 0 {
        return Err(format!(
            "reduce_scatter: needs a tensor with an axis, got {x}"
        ));
    }
    let a = self::axis("reduce_scatter", axis, x.ndim(), &x)?;
    if x.shape[a] % ranks != 0 {
        return Err(format!(
            "reduce_scatter: axis {axis} of {x} has length {}, which {ranks} ranks cannot share equally",
            x.shape[a]
        ));
    }
    let mut s = x.shape.to_vec();
    s[a] /= ranks;
    Ok((a, s))
}
