//! Linear algebra: `matmul` (NumPy semantics, batched, through the `gemm`
//! crate for floats), `dot` and `outer`.

use gemm::Parallelism;

use super::args::{arity, rule, tensor, typed};
use super::ctx::Ctx;
use super::map::binary;
use super::num::Num;
use super::strided::{broadcast_strides, offsets};
use crate::error::RtError;
use crate::shape::{self, MatmulPlan};
use crate::tensor::{DType, Element, Tensor};
use crate::value::Value;
use crate::{dispatch_numeric, dtype};

/// Products with at least this many multiply-adds use all rayon threads.
const PARALLEL_FLOPS: usize = 1 << 18;

/// How a matrix operand is stored: row-major as the product reads it, or
/// row-major transposed (the product reads its last two axes swapped).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    Plain,
    Transposed,
}

impl Layout {
    /// (column stride, row stride) of an `rows × cols` matrix read in
    /// this layout.
    fn strides(self, rows: usize, cols: usize) -> (isize, isize) {
        match self {
            Layout::Plain => (1, cols as isize),
            Layout::Transposed => (rows as isize, 1),
        }
    }
}

/// Whether the `gemm` crate computes an `m×k · k×n` product the same way
/// whatever the operands' layouts: it takes layout-specific paths (with
/// another order of summation) for tiny outputs, thin operands and short
/// inner dimensions, and otherwise packs the operands and runs the same
/// micro-kernels. Transposed operands are read in place only then, so
/// results never depend on whether a transpose was materialised.
pub fn layout_independent(m: usize, k: usize, n: usize) -> bool {
    m > 1 && n > 1 && k > 2 && m.saturating_mul(n) > 16 * 16
}

/// Dense matrix product in f32 or f64: `dst (m×n) = a (m×k) · b (k×n)`,
/// `dst` row-major, the operands row-major in the given layouts. Every
/// element of `dst` is written.
#[allow(clippy::too_many_arguments)]
fn gemm_float<T: Num>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    la: Layout,
    b: &[T],
    lb: Layout,
    dst: &mut [std::mem::MaybeUninit<T>],
    par: Parallelism,
) {
    assert!(a.len() >= m * k && b.len() >= k * n && dst.len() >= m * n);
    assert!(T::DTYPE.is_float());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst[..m * n].iter_mut().for_each(|d| {
            d.write(T::zero());
        });
        return;
    }
    let (a_cs, a_rs) = la.strides(m, k);
    let (b_cs, b_rs) = lb.strides(k, n);
    // SAFETY: the asserts above keep every access of the three matrices in
    // bounds (a transposed operand is the same buffer read with swapped
    // strides); `T` is f32 or f64, types gemm supports; `dst` does not
    // alias the operands (it is a fresh buffer); with `read_dst` false
    // gemm only writes `dst`, so it may be uninitialised.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr() as *mut T,
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

/// Integer matrix product, wrapping on overflow.
#[allow(clippy::too_many_arguments)]
fn gemm_int<T: Num>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    la: Layout,
    b: &[T],
    lb: Layout,
    dst: &mut [std::mem::MaybeUninit<T>],
    _: Parallelism,
) {
    let (a_cs, a_rs) = la.strides(m, k);
    let (b_cs, b_rs) = lb.strides(k, n);
    let mut row = vec![T::zero(); n];
    for i in 0..m {
        row.iter_mut().for_each(|d| *d = T::zero());
        for p in 0..k {
            let x = a[i * a_rs as usize + p * a_cs as usize];
            for (j, d) in row.iter_mut().enumerate() {
                *d = d.add(x.mul(b[p * b_rs as usize + j * b_cs as usize]));
            }
        }
        for (d, &v) in dst[i * n..(i + 1) * n].iter_mut().zip(&row) {
            d.write(v);
        }
    }
}

fn batched<T: Num>(plan: &MatmulPlan, a: &[T], la: Layout, b: &[T], lb: Layout) -> Vec<T> {
    use rayon::prelude::*;
    let (m, k, n) = (plan.m, plan.k, plan.n);
    let sa: Vec<usize> = broadcast_strides(&plan.a_batch, &plan.batch)
        .into_iter()
        .map(|s| s * m * k)
        .collect();
    let sb: Vec<usize> = broadcast_strides(&plan.b_batch, &plan.batch)
        .into_iter()
        .map(|s| s * k * n)
        .collect();
    let count = shape::size(&plan.batch);
    let total = count * m * n;
    let mut out: Vec<T> = Vec::with_capacity(total);
    let kernel = if T::DTYPE.is_float() {
        gemm_float::<T>
    } else {
        gemm_int::<T>
    };
    let flops = m.saturating_mul(n).saturating_mul(k);
    let dst = &mut out.spare_capacity_mut()[..total];
    if m * n > 0 {
        let pairs: Vec<(usize, usize)> = offsets(&plan.batch, &sa)
            .zip(offsets(&plan.batch, &sb))
            .collect();
        let one = |(ia, ib): (usize, usize), d: &mut [std::mem::MaybeUninit<T>], par| {
            kernel(
                m,
                k,
                n,
                &a[ia..ia + m * k],
                la,
                &b[ib..ib + k * n],
                lb,
                d,
                par,
            )
        };
        let threads = rayon::current_num_threads();
        let many = count >= 2 * threads || (count > 1 && flops < PARALLEL_FLOPS);
        if count == 1 || (flops >= PARALLEL_FLOPS && !many) {
            // Few large products: gemm splits each one over the threads.
            let par = if flops >= PARALLEL_FLOPS {
                Parallelism::Rayon(0)
            } else {
                Parallelism::None
            };
            for (p, d) in pairs.into_iter().zip(dst.chunks_mut(m * n)) {
                one(p, d, par);
            }
        } else if flops.saturating_mul(count) >= PARALLEL_FLOPS {
            // Many products: split the batch over the threads.
            pairs
                .into_par_iter()
                .zip(dst.par_chunks_mut(m * n))
                .for_each(|(p, d)| one(p, d, Parallelism::None));
        } else {
            for (p, d) in pairs.into_iter().zip(dst.chunks_mut(m * n)) {
                one(p, d, Parallelism::None);
            }
        }
    }
    // SAFETY: every one of the `total` elements was written above (each
    // kernel writes all of its m×n block; with m×n = 0 there are none).
    unsafe { out.set_len(total) };
    out
}

/// `a @ b` after the shape rule `plan`; `op` names the operation in dtype errors.
fn matmul_with(op: &str, plan: &MatmulPlan, a: &Tensor, b: &Tensor) -> Result<Tensor, RtError> {
    matmul_layout(op, plan, a, Layout::Plain, b, Layout::Plain)
}

/// `a @ b` after the shape rule `plan`, each operand stored in its layout.
fn matmul_layout(
    op: &str,
    plan: &MatmulPlan,
    a: &Tensor,
    la: Layout,
    b: &Tensor,
    lb: Layout,
) -> Result<Tensor, RtError> {
    let (dt, weak) = rule(dtype::promote(op, (a.dtype(), a.weak), (b.dtype(), b.weak)))?;
    if dt == DType::Bool {
        return Err(RtError::new(format!(
            "{op} of {} and {}: expected numeric operands",
            a.type_string(),
            b.type_string()
        )));
    }
    let (a, b) = (a.cast(dt), b.cast(dt));
    let buf = dispatch_numeric!(dt, T => T::wrap(batched(plan, typed::<T>(&a)?, la, typed::<T>(&b)?, lb)),
        else return Err(RtError::internal("bool matmul")));
    Ok(Tensor::new(buf, &plan.shape)?.with_weak(weak))
}

/// `matmul(a, b)` / `a @ b`: NumPy matmul, batched over leading dimensions.
pub fn matmul(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "`@`";
    arity("matmul", args, 2)?;
    let a = tensor("matmul", &args[0], "a")?;
    let b = tensor("matmul", &args[1], "b")?;
    let plan = rule(shape::matmul_plan(a.ty(), b.ty()))?;
    Ok(Value::Tensor(matmul_with(op, &plan, a, b)?))
}

/// `matmul(a', b')` where `a'` is `mT(a)` when `ta` (else `a`) and `b'`
/// likewise: the same result and errors as materialising the transposes
/// first, without the copies when the product is large enough for the
/// result not to depend on the operands' layout (see
/// [`layout_independent`]).
pub fn matmul_transposed(a: &Tensor, ta: bool, b: &Tensor, tb: bool) -> Result<Tensor, RtError> {
    let view = |x: &Tensor, t: bool| -> Result<Vec<usize>, RtError> {
        if t {
            rule(shape::matrix_t(x.ty()))
        } else {
            Ok(x.shape().to_vec())
        }
    };
    let (sa, sb) = (view(a, ta)?, view(b, tb)?);
    let plan = rule(shape::matmul_plan(
        shape::TensorTy::new(a.dtype(), &sa),
        shape::TensorTy::new(b.dtype(), &sb),
    ))?;
    // A 1-d operand is never transposed (mT refused it above).
    if layout_independent(plan.m, plan.k, plan.n) {
        let l = |t: bool| if t { Layout::Transposed } else { Layout::Plain };
        return matmul_layout("`@`", &plan, a, l(ta), b, l(tb));
    }
    let mat = |x: &Tensor, t: bool, s: &[usize]| -> Result<Tensor, RtError> {
        if !t {
            return Ok(x.clone());
        }
        let st = shape::strides(x.shape());
        let n = st.len();
        let mut pst = st.clone();
        pst.swap(n - 2, n - 1);
        super::strided::remap_strided(x, s, &pst)
    };
    matmul_layout(
        "`@`",
        &plan,
        &mat(a, ta, &sa)?,
        Layout::Plain,
        &mat(b, tb, &sb)?,
        Layout::Plain,
    )
}

/// `dot(a, b)`: NumPy dot for 0-d (a product), 1-d and 2-d operands.
pub fn dot(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "dot";
    arity(op, args, 2)?;
    let a = tensor(op, &args[0], "a")?;
    let b = tensor(op, &args[1], "b")?;
    rule(shape::dot(a.ty(), b.ty()))?;
    if a.ndim() == 0 || b.ndim() == 0 {
        return super::map::mul(ctx, args);
    }
    let plan = rule(shape::matmul_plan(a.ty(), b.ty()))?;
    Ok(Value::Tensor(matmul_with(op, &plan, a, b)?))
}

/// `outer(a, b)`: `[size(a), size(b)]` products of the flattened operands.
pub fn outer(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "outer";
    arity(op, args, 2)?;
    let a = tensor(op, &args[0], "a")?;
    let b = tensor(op, &args[1], "b")?;
    let out = rule(shape::outer(a.ty(), b.ty()))?;
    let (dt, _) = rule(dtype::promote(op, (a.dtype(), a.weak), (b.dtype(), b.weak)))?;
    if dt == DType::Bool {
        return Err(RtError::new(
            "outer: expected numeric operands, got bool and bool",
        ));
    }
    let col = Value::Tensor(a.reshape(&[out[0], 1])?);
    let row = Value::Tensor(b.reshape(&[1, out[1]])?);
    binary("mul", &[col, row])
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, f64s, i64s, shape_of, v};
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn matmul_2d() {
        let a = v(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap());
        let b = v(Tensor::from_vec(vec![7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]).unwrap());
        let r = call("matmul", &[a.clone(), b.clone()]);
        assert_eq!(shape_of(&r), vec![2, 2]);
        assert_eq!(f32s(&r), vec![58.0, 64.0, 139.0, 154.0]);
        assert_eq!(
            call_err("matmul", &[a.clone(), a.clone()]),
            "`@` of f32[2, 3] and f32[2, 3]: inner dimensions 3 and 2 differ"
        );
        let d = v(Tensor::from_vec(vec![1.0f64; 6], &[3, 2]).unwrap());
        assert_eq!(f64s(&call("matmul", &[a, d])), vec![6.0, 6.0, 15.0, 15.0]);
    }

    #[test]
    fn matmul_large_matches_naive() {
        let (m, k, n) = (70, 65, 90);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 11) as f64 * 0.5).collect();
        let expect = naive(&a, &b, m, k, n);
        let r = call(
            "matmul",
            &[
                v(Tensor::from_vec(a, &[m, k]).unwrap()),
                v(Tensor::from_vec(b, &[k, n]).unwrap()),
            ],
        );
        assert_eq!(f64s(&r), expect);
    }

    #[test]
    fn matmul_vectors_and_batches() {
        let m = v(Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap());
        let x = v(Tensor::vector(vec![1.0f64, 1.0]));
        assert_eq!(
            f64s(&call("matmul", &[m.clone(), x.clone()])),
            vec![3.0, 7.0]
        );
        assert_eq!(
            f64s(&call("matmul", &[x.clone(), m.clone()])),
            vec![4.0, 6.0]
        );
        assert_eq!(
            call("matmul", &[x.clone(), x.clone()]),
            v(Tensor::scalar_f64(2.0))
        );
        // A batch of two matrices times one broadcast matrix.
        let batch = v(Tensor::from_vec(
            vec![1.0f64, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0],
            &[2, 2, 2],
        )
        .unwrap());
        let r = call("matmul", &[batch, m.clone()]);
        assert_eq!(shape_of(&r), vec![2, 2, 2]);
        assert_eq!(f64s(&r), vec![1.0, 2.0, 3.0, 4.0, 2.0, 4.0, 6.0, 8.0]);
        // Weak literals adopt the other side's dtype.
        let lit = v(Tensor::from_vec(vec![1.0f64, 2.0], &[1, 2])
            .unwrap()
            .with_weak(true));
        let f = v(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap());
        assert_eq!(f32s(&call("matmul", &[lit, f])), vec![7.0, 10.0]);
        // Empty inner dimension gives zeros.
        let e1 = v(Tensor::zeros(DType::F32, &[2, 0]).unwrap());
        let e2 = v(Tensor::zeros(DType::F32, &[0, 3]).unwrap());
        assert_eq!(f32s(&call("matmul", &[e1, e2])), vec![0.0; 6]);
    }

    /// Products with transposed operands read in place agree bit for bit
    /// with products of materialised transposes, in every size class.
    #[test]
    fn transposed_operands_match_materialised() {
        let mt = |x: &Tensor| match call("mT", &[v(x.clone())]) {
            Value::Tensor(t) => t,
            _ => unreachable!(),
        };
        let sizes = [
            (1, 5, 7),
            (3, 2, 4),
            (8, 9, 10),
            (17, 3, 19),
            (33, 40, 2),
            (2, 40, 33),
            (64, 65, 66),
            (128, 100, 10),
            (10, 128, 100),
            (130, 70, 150),
        ];
        for &(m, k, n) in &sizes {
            for batch in [vec![], vec![3]] {
                let mk: Vec<usize> = batch.iter().copied().chain([m, k]).collect();
                let kn: Vec<usize> = batch.iter().copied().chain([k, n]).collect();
                let count = shape::size(&mk);
                let a: Vec<f32> = (0..count)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                    .collect();
                let count = shape::size(&kn);
                let b: Vec<f32> = (0..count)
                    .map(|i| ((i * 53 % 97) as f32 - 40.0) / 3.0)
                    .collect();
                let a = Tensor::from_vec(a, &mk).unwrap();
                let b = Tensor::from_vec(b, &kn).unwrap();
                let (at, bt) = (mt(&a), mt(&b));
                let expect = matmul_transposed(&a, false, &b, false).unwrap();
                let e64 = matmul_transposed(&a.cast(DType::F64), false, &b.cast(DType::F64), false)
                    .unwrap();
                for (x, tx, y, ty) in [
                    (&at, true, &b, false),
                    (&a, false, &bt, true),
                    (&at, true, &bt, true),
                ] {
                    let r = matmul_transposed(x, tx, y, ty).unwrap();
                    assert_eq!(r, expect, "{m} {k} {n} {batch:?} {tx} {ty}");
                    let r64 = matmul_transposed(&x.cast(DType::F64), tx, &y.cast(DType::F64), ty)
                        .unwrap();
                    assert_eq!(r64, e64);
                }
            }
        }
        let a = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[3, 2]).unwrap();
        let r = matmul_transposed(&a, true, &a, false).unwrap();
        assert_eq!(r.as_i64(), Some(&[35, 44, 44, 56][..]));
        let x = Tensor::vector(vec![1.0f32, 2.0]);
        assert!(matmul_transposed(&x, true, &x, false)
            .unwrap_err()
            .to_string()
            .contains("mT: expected at least 2 dimensions"));
    }

    #[test]
    fn matmul_ints() {
        let a = v(Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap());
        assert_eq!(
            i64s(&call("matmul", &[a.clone(), a.clone()])),
            vec![7, 10, 15, 22]
        );
        let b = v(Tensor::vector(vec![true, false]));
        assert!(call_err("matmul", &[b.clone(), b]).contains("expected numeric operands"));
    }

    #[test]
    fn dots_and_outers() {
        let x = v(Tensor::vector(vec![1.0f32, 2.0, 3.0]));
        assert_eq!(
            call("dot", &[x.clone(), x.clone()]),
            v(Tensor::scalar_f32(14.0))
        );
        assert_eq!(
            f32s(&call("dot", &[x.clone(), v(Tensor::weak_i64(2))])),
            vec![2.0, 4.0, 6.0]
        );
        assert_eq!(
            call_err("dot", &[x.clone(), v(Tensor::vector(vec![1.0f32]))]),
            "dot of f32[3] and f32[1]: inner dimensions 3 and 1 differ"
        );
        let r = call("outer", &[x.clone(), v(Tensor::vector(vec![1.0f32, 10.0]))]);
        assert_eq!(shape_of(&r), vec![3, 2]);
        assert_eq!(f32s(&r), vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        assert_eq!(
            f64s(&call("outer", &[x, v(Tensor::vector(vec![1.0f64]))])),
            vec![1.0, 2.0, 3.0]
        );
    }
}
