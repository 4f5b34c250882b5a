//! Row-major (batched) matrix products as column-major cuBLAS calls.
//!
//! cuBLAS reads matrices column-major. A row-major `r × c` matrix is the
//! column-major `c × r` matrix of its transpose, so the row-major product
//! `C = op(A) op(B)` is computed as the column-major `Cᵀ = op(B)ᵀ op(A)ᵀ`:
//! cuBLAS's first operand is our `B`, its second our `A`. [`plan_gemm`] is
//! that mapping, a pure function tested against a CPU model of cuBLAS's
//! `gemmStridedBatched` (below).

/// Whether cuBLAS reads an operand as stored or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// As stored (`CUBLAS_OP_N`).
    N,
    /// Transposed (`CUBLAS_OP_T`).
    T,
}

/// The arguments of one `cublas{S,D}gemmStridedBatched` call, in cuBLAS's
/// terms (column-major; operand `a` is cuBLAS's first operand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    pub transa: Op,
    pub transb: Op,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    /// Elements between consecutive matrices of cuBLAS's first operand (our
    /// `B`); 0 when one matrix serves every batch.
    pub stride_a: usize,
    /// The same for cuBLAS's second operand (our `A`).
    pub stride_b: usize,
    pub stride_c: usize,
    pub batch: usize,
}

/// A row-major batched product `op(A) @ op(B)` as a cuBLAS call, and the
/// result's shape.
///
/// `a` and `b` are the stored shapes; `ta` says `A` is the stored tensor's
/// last two axes swapped (`mT`), likewise `tb`. Handled: both of rank ≥ 2
/// with equal batch dimensions, or one of rank 2 (broadcast over the
/// other's batch). Anything else — lower ranks, size-1 batch broadcasting,
/// mismatched inner sizes — is `None`, and the caller uses the reference
/// kernel, which also produces the errors.
pub fn plan_gemm(a: &[usize], ta: bool, b: &[usize], tb: bool) -> Option<(GemmPlan, Vec<usize>)> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (ab, am) = a.split_at(a.len() - 2);
    let (bb, bm) = b.split_at(b.len() - 2);
    let (m, ka) = if ta { (am[1], am[0]) } else { (am[0], am[1]) };
    let (kb, n) = if tb { (bm[1], bm[0]) } else { (bm[0], bm[1]) };
    if ka != kb {
        return None;
    }
    let k = ka;
    let batch_dims: Vec<usize> = if ab == bb || bb.is_empty() {
        ab.to_vec()
    } else if ab.is_empty() {
        bb.to_vec()
    } else {
        return None;
    };
    let batch: usize = batch_dims.iter().product();
    let stride = |batched: bool, size: usize| if batched { size } else { 0 };
    let plan = GemmPlan {
        transa: if tb { Op::T } else { Op::N },
        transb: if ta { Op::T } else { Op::N },
        m: n,
        n: m,
        k,
        lda: if tb { k } else { n },
        ldb: if ta { m } else { k },
        ldc: n,
        stride_a: stride(!bb.is_empty(), k * n),
        stride_b: stride(!ab.is_empty(), m * k),
        stride_c: m * n,
        batch,
    };
    let mut out = batch_dims;
    out.extend([m, n]);
    Some((plan, out))
}

impl GemmPlan {
    /// Whether every size fits cuBLAS's 32-bit integers.
    pub fn fits_i32(&self) -> bool {
        let lim = i32::MAX as usize;
        [
            self.m, self.n, self.k, self.lda, self.ldb, self.ldc, self.batch,
        ]
        .iter()
        .all(|&v| v <= lim && v > 0)
            || (self.m == 0 || self.n == 0 || self.batch == 0)
    }

    /// Whether the product has no elements to compute (cuBLAS is not
    /// called; with `k == 0` the result is zeros).
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }
}

/// What `gemmStridedBatched` computes with `alpha = 1`, `beta = 0`, on the
/// CPU: the model the mapping is tested against.
pub fn gemm_model(p: &GemmPlan, a: &[f64], b: &[f64], c: &mut [f64]) {
    for bt in 0..p.batch {
        let (oa, ob, oc) = (bt * p.stride_a, bt * p.stride_b, bt * p.stride_c);
        for j in 0..p.n {
            for i in 0..p.m {
                let mut s = 0.0;
                for l in 0..p.k {
                    let x = match p.transa {
                        Op::N => a[oa + i + l * p.lda],
                        Op::T => a[oa + l + i * p.lda],
                    };
                    let y = match p.transb {
                        Op::N => b[ob + l + j * p.ldb],
                        Op::T => b[ob + j + l * p.ldb],
                    };
                    s += x * y;
                }
                c[oc + i + j * p.ldc] = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major `op(A) @ op(B)` by the definition, with rank-2 broadcast.
    fn naive(a: &[usize], ad: &[f64], ta: bool, b: &[usize], bd: &[f64], tb: bool) -> Vec<f64> {
        let get = |shape: &[usize], d: &[f64], t: bool, batch: usize, i: usize, j: usize| {
            let (r, c) = (shape[shape.len() - 2], shape[shape.len() - 1]);
            let base = if shape.len() > 2 { batch * r * c } else { 0 };
            if t {
                d[base + j * c + i]
            } else {
                d[base + i * c + j]
            }
        };
        let (ar, ac) = (a[a.len() - 2], a[a.len() - 1]);
        let (br, bc) = (b[b.len() - 2], b[b.len() - 1]);
        let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
        let n = if tb { br } else { bc };
        let batch: usize = if a.len() > 2 {
            a[..a.len() - 2].iter().product()
        } else {
            b[..b.len() - 2].iter().product()
        };
        let mut out = vec![0.0; batch * m * n];
        for bt in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for l in 0..k {
                        s += get(a, ad, ta, bt, i, l) * get(b, bd, tb, bt, l, j);
                    }
                    out[bt * m * n + i * n + j] = s;
                }
            }
        }
        out
    }

    fn data(n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f64 / 100.0 - 5.0)
            .collect()
    }

    #[test]
    fn mapping_matches_the_definition() {
        let cases: &[(&[usize], bool, &[usize], bool)] = &[
            (&[3, 4], false, &[4, 5], false),
            (&[4, 3], true, &[4, 5], false),
            (&[3, 4], false, &[5, 4], true),
            (&[4, 3], true, &[5, 4], true),
            (&[2, 3, 4], false, &[2, 4, 5], false),
            (&[2, 4, 3], true, &[2, 5, 4], true),
            (&[2, 3, 4], false, &[4, 5], false),
            (&[3, 4], false, &[2, 5, 4], true),
            (&[2, 2, 3, 4], false, &[2, 2, 4, 1], false),
            (&[1, 4], false, &[4, 1], false),
        ];
        for &(a, ta, b, tb) in cases {
            let ad = data(a.iter().product(), 1);
            let bd = data(b.iter().product(), 2);
            let (p, out_shape) = plan_gemm(a, ta, b, tb).expect("handled");
            assert!(p.fits_i32());
            let mut c = vec![f64::NAN; out_shape.iter().product()];
            // cuBLAS's first operand is B, its second A.
            gemm_model(&p, &bd, &ad, &mut c);
            assert_eq!(c, naive(a, &ad, ta, b, &bd, tb), "{a:?} {ta} {b:?} {tb}");
        }
    }

    #[test]
    fn output_shapes_and_refusals() {
        assert_eq!(
            plan_gemm(&[2, 3, 4], false, &[4, 5], false).unwrap().1,
            vec![2, 3, 5]
        );
        assert_eq!(
            plan_gemm(&[4, 3], true, &[6, 4], true).unwrap().1,
            vec![3, 6]
        );
        // Inner sizes differ: the reference kernel reports it.
        assert!(plan_gemm(&[3, 4], false, &[5, 6], false).is_none());
        // Vectors and size-1 batch broadcasting are left to the CPU.
        assert!(plan_gemm(&[4], false, &[4, 5], false).is_none());
        assert!(plan_gemm(&[1, 3, 4], false, &[2, 4, 5], false).is_none());
        assert!(plan_gemm(&[0, 4], false, &[4, 5], false)
            .unwrap()
            .0
            .is_empty());
    }
}
