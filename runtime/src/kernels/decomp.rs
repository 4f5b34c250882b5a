//! Matrix decompositions and the solves built on them, on the `faer`
//! crate: `solve(a, b)`, `triangular_solve(a, b, lower)`, `det(a)`,
//! `slogdet(a)`, `cholesky(a)`, `eigh(a)` and `qr(a)`.
//!
//! Every operation takes a stack of matrices (`[.., m, n]`) and runs once
//! per matrix; the batch dimensions of the two operands of a solve
//! broadcast. Floats only; f32 operands are factorised in f64 and the
//! results rounded to f32. `cholesky` and `eigh` read the symmetric part
//! `(a + aᵀ) / 2` (as JAX does), so their derivatives are those of a
//! function of symmetric matrices.
//!
//! Singular input: `solve` and `triangular_solve` fail with an error
//! naming the matrix (NumPy's `LinAlgError`); `det` is 0 and `slogdet`
//! `(0, -inf)`; `cholesky` of a matrix that is not positive definite
//! fails. The results are made unique where the factorisation is not:
//! `qr`'s `r` has a non-negative diagonal, and each eigenvector of `eigh`
//! has its largest element (the first of equal ones) positive.

use faer::linalg::solvers::{Llt, PartialPivLu, Qr, SelfAdjointEigen, SolveCore};
use faer::{Conj, Mat, MatRef, Par, Side};

use super::args::{arity, bool_or, rule, tensor};
use super::ctx::Ctx;
use crate::dtype::DType;
use crate::error::RtError;
use crate::shape::{self, SolvePlan};
use crate::tensor::Tensor;
use crate::value::Value;

/// A float operand, as f64 elements in row-major order.
fn floats(op: &str, v: &Value, what: &str) -> Result<(DType, Vec<f64>, Vec<usize>), RtError> {
    let t = tensor(op, v, what)?;
    if !t.dtype().is_float() {
        return Err(RtError::new(format!(
            "{op}: {what} must be a float tensor, got {}",
            t.type_string()
        )));
    }
    Ok((t.dtype(), t.as_f64_vec(), t.shape().to_vec()))
}

/// A result tensor of `dtype` from f64 elements.
fn result(dtype: DType, data: Vec<f64>, shape: &[usize]) -> Result<Value, RtError> {
    let t = if dtype == DType::F32 {
        Tensor::from_vec(
            data.into_iter().map(|v| v as f32).collect::<Vec<_>>(),
            shape,
        )?
    } else {
        Tensor::from_vec(data, shape)?
    };
    Ok(Value::Tensor(t))
}

/// Matrix `i` (`rows × cols`) of a stack held row-major in `data`.
fn matrix(data: &[f64], i: usize, rows: usize, cols: usize) -> Mat<f64> {
    let off = i * rows * cols;
    Mat::from_fn(rows, cols, |r, c| data[off + r * cols + c])
}

/// The symmetric part `(a + aᵀ) / 2` of square matrix `i` of a stack.
fn symmetric(data: &[f64], i: usize, n: usize) -> Mat<f64> {
    let off = i * n * n;
    Mat::from_fn(n, n, |r, c| {
        0.5 * (data[off + r * n + c] + data[off + c * n + r])
    })
}

/// Appends `m` to `out` row-major.
fn push(out: &mut Vec<f64>, m: MatRef<'_, f64>) {
    for r in 0..m.nrows() {
        for c in 0..m.ncols() {
            out.push(m[(r, c)]);
        }
    }
}

/// The flat index into a stack of batch shape `sub` of the element of
/// the broadcast batch `batch` at flat index `i` (`sub` is aligned to the
/// right; its dimensions of size 1 repeat).
fn batch_index(i: usize, batch: &[usize], sub: &[usize]) -> usize {
    let (mut rem, mut idx, mut stride) = (i, 0, 1);
    for (from_right, &size) in batch.iter().rev().enumerate() {
        let coord = rem % size.max(1);
        rem /= size.max(1);
        if from_right < sub.len() {
            let s = sub[sub.len() - 1 - from_right];
            idx += if s == 1 { 0 } else { coord } * stride;
            stride *= s;
        }
    }
    idx
}

/// " (matrix 3 of the stack)" when the operand is a stack.
fn which(i: usize, batch: &[usize]) -> String {
    if batch.is_empty() {
        String::new()
    } else {
        format!(" (matrix {i} of the stack of {})", shape::fmt_shape(batch))
    }
}

/// Runs `each(a, b)` (an `n × n` and an `n × k` matrix, solved in place
/// into the second) over the broadcast batch of a solve.
fn solve_each(
    op: &str,
    args: &[Value],
    mut each: impl FnMut(&Mat<f64>, &mut Mat<f64>) -> Result<(), String>,
) -> Result<Value, RtError> {
    let (adt, ad, ashape) = floats(op, &args[0], "a")?;
    let (bdt, bd, bshape) = floats(op, &args[1], "b")?;
    let plan: SolvePlan = rule(shape::solve_plan(
        op,
        shape::TensorTy::new(adt, &ashape),
        shape::TensorTy::new(bdt, &bshape),
    ))?;
    // Promoted as `@` promotes: a literal adopts the other's dtype.
    let weak = |v: &Value, what| tensor(op, v, what).map(|t| t.weak);
    let (dt, weak) = rule(crate::dtype::promote(
        op,
        (adt, weak(&args[0], "a")?),
        (bdt, weak(&args[1], "b")?),
    ))?;
    let (n, k) = (plan.n, plan.k);
    let count: usize = plan.batch.iter().product();
    let mut out = Vec::with_capacity(count * n * k);
    for i in 0..count {
        let a = matrix(&ad, batch_index(i, &plan.batch, &plan.a_batch), n, n);
        let mut x = matrix(&bd, batch_index(i, &plan.batch, &plan.b_batch), n, k);
        each(&a, &mut x)
            .map_err(|e| RtError::new(format!("{op}: {e}{}", which(i, &plan.batch))))?;
        push(&mut out, x.as_ref());
    }
    let t = result(dt, out, &plan.shape)?;
    Ok(match t {
        Value::Tensor(t) => Value::Tensor(t.with_weak(weak)),
        v => v,
    })
}

/// `solve(a, b)`: `x` with `a @ x = b`, by LU with partial pivoting.
pub fn solve(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("solve", args, 2)?;
    solve_each("solve", args, |a, x| {
        let lu = PartialPivLu::new(a.as_ref());
        let u = lu.U();
        if (0..u.nrows()).any(|j| u[(j, j)] == 0.0) {
            return Err("the matrix is singular".into());
        }
        lu.solve_in_place_with_conj(Conj::No, x.as_mut());
        Ok(())
    })
}

/// `triangular_solve(a, b, lower)`: `x` with `a @ x = b`, reading only
/// the lower (or upper) triangle of `a`.
pub fn triangular_solve(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "triangular_solve";
    arity(op, args, 3)?;
    let lower = bool_or(op, &args[2], "lower", true)?;
    solve_each(op, args, |a, x| {
        let n = a.nrows();
        if (0..n).any(|j| a[(j, j)] == 0.0) {
            return Err("the matrix is singular (a zero on its diagonal)".into());
        }
        let t = Mat::from_fn(n, n, |r, c| {
            if (lower && c <= r) || (!lower && c >= r) {
                a[(r, c)]
            } else {
                0.0
            }
        });
        if lower {
            faer::linalg::triangular_solve::solve_lower_triangular_in_place(
                t.as_ref(),
                x.as_mut(),
                Par::Seq,
            );
        } else {
            faer::linalg::triangular_solve::solve_upper_triangular_in_place(
                t.as_ref(),
                x.as_mut(),
                Par::Seq,
            );
        }
        Ok(())
    })
}

/// The sign and log of the absolute value of the determinant of `a`.
fn sign_logdet(a: &Mat<f64>) -> (f64, f64) {
    let n = a.nrows();
    if n == 0 {
        return (1.0, 0.0);
    }
    let lu = PartialPivLu::new(a.as_ref());
    let u = lu.U();
    // The permutation's parity: n minus its number of cycles.
    let perm = lu.P().arrays().0.to_vec();
    let mut seen = vec![false; n];
    let mut cycles = 0;
    for s in 0..n {
        if !seen[s] {
            cycles += 1;
            let mut j = s;
            while !seen[j] {
                seen[j] = true;
                j = perm[j];
            }
        }
    }
    let mut sign = if (n - cycles) % 2 == 0 { 1.0 } else { -1.0 };
    let mut log = 0.0;
    for j in 0..n {
        let d = u[(j, j)];
        if d == 0.0 {
            return (0.0, f64::NEG_INFINITY);
        }
        if d < 0.0 {
            sign = -sign;
        }
        log += d.abs().ln();
    }
    (sign, log)
}

/// Runs `each` over the matrices of a stack of square matrices.
fn per_square(
    op: &str,
    args: &[Value],
    mut each: impl FnMut(usize, &[f64], usize) -> Result<(), String>,
) -> Result<(DType, Vec<usize>, usize), RtError> {
    arity(op, args, 1)?;
    let (dt, data, shp) = floats(op, &args[0], "a")?;
    let (batch, n) = rule(shape::square(op, shape::TensorTy::new(dt, &shp)))?;
    let count: usize = batch.iter().product();
    for i in 0..count {
        each(i, &data, n).map_err(|e| RtError::new(format!("{op}: {e}{}", which(i, &batch))))?;
    }
    Ok((dt, batch, n))
}

/// `det(a)`: the determinant of each matrix, from its LU factors (0 for a
/// singular one).
pub fn det(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let mut out = Vec::new();
    let (dt, batch, _) = per_square("det", args, |i, data, n| {
        let a = matrix(data, i, n, n);
        let (sign, log) = sign_logdet(&a);
        out.push(if sign == 0.0 { 0.0 } else { sign * log.exp() });
        Ok(())
    })?;
    result(dt, out, &batch)
}

/// `slogdet(a)`: `(sign, log|det|)` of each matrix (`(0, -inf)` for a
/// singular one).
pub fn slogdet(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let (mut signs, mut logs) = (Vec::new(), Vec::new());
    let (dt, batch, _) = per_square("slogdet", args, |i, data, n| {
        let (s, l) = sign_logdet(&matrix(data, i, n, n));
        signs.push(s);
        logs.push(l);
        Ok(())
    })?;
    Ok(Value::tuple(vec![
        result(dt, signs, &batch)?,
        result(dt, logs, &batch)?,
    ]))
}

/// `cholesky(a)`: the lower-triangular `l` with `l @ lᵀ` the symmetric
/// part of `a`.
pub fn cholesky(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let mut out = Vec::new();
    let mut shp = Vec::new();
    let (dt, batch, n) = per_square("cholesky", args, |i, data, n| {
        let a = symmetric(data, i, n);
        let llt = Llt::new(a.as_ref(), Side::Lower)
            .map_err(|_| "the matrix is not positive definite".to_string())?;
        let l = llt.L();
        let lower = Mat::from_fn(n, n, |r, c| if c <= r { l[(r, c)] } else { 0.0 });
        push(&mut out, lower.as_ref());
        Ok(())
    })?;
    shp.extend_from_slice(&batch);
    shp.extend([n, n]);
    result(dt, out, &shp)
}

/// `eigh(a)`: `(w, v)`, the eigenvalues of the symmetric part of `a` in
/// ascending order and the eigenvectors as the columns of `v`.
pub fn eigh(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let (mut ws, mut vs) = (Vec::new(), Vec::new());
    let (dt, batch, n) = per_square("eigh", args, |i, data, n| {
        let a = symmetric(data, i, n);
        let e = SelfAdjointEigen::new(a.as_ref(), Side::Lower)
            .map_err(|_| "the eigenvalue iteration did not converge".to_string())?;
        let w = e.S().column_vector();
        let u = e.U();
        let mut v = Mat::from_fn(n, n, |r, c| u[(r, c)]);
        for c in 0..n {
            ws.push(w[c]);
            let mut big = 0;
            for r in 1..n {
                if v[(r, c)].abs() > v[(big, c)].abs() {
                    big = r;
                }
            }
            if v[(big, c)] < 0.0 {
                for r in 0..n {
                    v[(r, c)] = -v[(r, c)];
                }
            }
        }
        push(&mut vs, v.as_ref());
        Ok(())
    })?;
    let mut wshape = batch.clone();
    wshape.push(n);
    let mut vshape = batch;
    vshape.extend([n, n]);
    Ok(Value::tuple(vec![
        result(dt, ws, &wshape)?,
        result(dt, vs, &vshape)?,
    ]))
}

/// `qr(a)`: the reduced `(q, r)` of each matrix, `r` with a non-negative
/// diagonal.
pub fn qr(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "qr";
    arity(op, args, 1)?;
    let (dt, data, shp) = floats(op, &args[0], "a")?;
    let ty = shape::TensorTy::new(dt, &shp);
    let (qshape, rshape) = rule(shape::qr(ty))?;
    let (m, n) = (shp[shp.len() - 2], shp[shp.len() - 1]);
    let k = m.min(n);
    let count: usize = shp[..shp.len() - 2].iter().product();
    let (mut qs, mut rs) = (Vec::new(), Vec::new());
    for i in 0..count {
        let a = matrix(&data, i, m, n);
        let f = Qr::new(a.as_ref());
        let mut q = f.compute_thin_Q();
        let rr = f.thin_R();
        let mut r = Mat::from_fn(k, n, |i, j| if j >= i { rr[(i, j)] } else { 0.0 });
        for j in 0..k {
            if r[(j, j)] < 0.0 {
                for c in j..n {
                    r[(j, c)] = -r[(j, c)];
                }
                for row in 0..m {
                    q[(row, j)] = -q[(row, j)];
                }
            }
        }
        push(&mut qs, q.as_ref());
        push(&mut rs, r.as_ref());
    }
    Ok(Value::tuple(vec![
        result(dt, qs, &qshape)?,
        result(dt, rs, &rshape)?,
    ]))
}
