//! Linear algebra: `matmul` (NumPy semantics, batched, through the `gemm`
//! crate for floats), `dot` and `outer`.

use gemm::Parallelism;

use super::args::{arity, rule, tensor, typed};
use super::map::binary;
use super::num::Num;
use super::strided::{broadcast_strides, offsets};
use super::Ctx;
use crate::error::RtError;
use crate::shape::{self, MatmulPlan};
use crate::tensor::{DType, Element, Tensor};
use crate::value::Value;
use crate::{dispatch_numeric, dtype};

/// Products with at least this many multiply-adds use all rayon threads.
const PARALLEL_FLOPS: usize = 1 << 18;

/// Dense matrix product in f32 or f64: `dst (m×n) = a (m×k) · b (k×n)`,
/// all row-major and contiguous.
fn gemm_float<T: Num>(m: usize, k: usize, n: usize, a: &[T], b: &[T], dst: &mut [T]) {
    if m == 0 || n == 0 || k == 0 {
        dst.iter_mut().for_each(|d| *d = T::zero());
        return;
    }
    assert!(a.len() >= m * k && b.len() >= k * n && dst.len() >= m * n);
    assert!(T::DTYPE.is_float());
    let par = if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_FLOPS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // SAFETY: the asserts above keep every access of the three row-major
    // matrices in bounds; `T` is f32 or f64, types gemm supports; `dst` does
    // not alias the operands (it is a fresh buffer).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
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
fn gemm_int<T: Num>(m: usize, k: usize, n: usize, a: &[T], b: &[T], dst: &mut [T]) {
    for i in 0..m {
        let row = &mut dst[i * n..(i + 1) * n];
        row.iter_mut().for_each(|d| *d = T::zero());
        for p in 0..k {
            let x = a[i * k + p];
            for (d, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *d = d.add(x.mul(y));
            }
        }
    }
}

fn batched<T: Num>(plan: &MatmulPlan, a: &[T], b: &[T]) -> Vec<T> {
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
    let mut out = vec![T::zero(); count * m * n];
    let kernel = if T::DTYPE.is_float() {
        gemm_float::<T>
    } else {
        gemm_int::<T>
    };
    for ((ia, ib), dst) in offsets(&plan.batch, &sa)
        .zip(offsets(&plan.batch, &sb))
        .zip(out.chunks_mut((m * n).max(1)))
    {
        kernel(m, k, n, &a[ia..ia + m * k], &b[ib..ib + k * n], dst);
    }
    out
}

/// `a @ b` after the shape rule `plan`; `op` names the operation in dtype errors.
fn matmul_with(op: &str, plan: &MatmulPlan, a: &Tensor, b: &Tensor) -> Result<Tensor, RtError> {
    let (dt, weak) = rule(dtype::promote(op, (a.dtype(), a.weak), (b.dtype(), b.weak)))?;
    if dt == DType::Bool {
        return Err(RtError::new(format!(
            "{op} of {} and {}: expected numeric operands",
            a.type_string(),
            b.type_string()
        )));
    }
    let (a, b) = (a.cast(dt), b.cast(dt));
    let buf = dispatch_numeric!(dt, T => T::wrap(batched(plan, typed::<T>(&a)?, typed::<T>(&b)?)),
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
        assert!(call_err("matmul", &[a, d]).contains("dtype mismatch f32 and f64"));
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
        assert!(call_err("outer", &[x, v(Tensor::vector(vec![1.0f64]))]).contains("dtype mismatch"));
    }
}
