//! Index arithmetic of the CUDA kernels, as pure functions: collapsing
//! dimensions, splitting an iteration space into kept and reduced parts,
//! choosing a reduction strategy and launch sizes. The generated code
//! follows these plans; the tests check them against plain index loops.

use crate::codegen::kernel::KernelSpec;

/// An iteration space (row-major) and, per input, the element stride of
/// each of its dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    /// `strides[input][dim]`.
    pub strides: Vec<Vec<isize>>,
}

impl Layout {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The offset input `i` reads at row-major position `flat` — what the
    /// generated code computes.
    pub fn offset(&self, i: usize, mut flat: usize) -> isize {
        let mut off = 0isize;
        for d in (0..self.shape.len()).rev() {
            let c = if d == 0 { flat } else { flat % self.shape[d] };
            flat /= self.shape[d].max(1);
            off += c as isize * self.strides[i][d];
        }
        off
    }
}

/// `shape` with the dimensions `dims` (in that order) and every input's
/// strides on them, simplified: size-1 dimensions dropped, and a dimension
/// merged into the one before it when every input steps over both as over
/// one (`stride[prev] == stride[d] * shape[d]`). The simplified layout
/// visits the same offsets in the same order with fewer divisions.
pub fn collapse(shape: &[usize], strides: &[&[isize]], dims: &[usize]) -> Layout {
    let n_in = strides.len();
    let mut out = Layout {
        shape: Vec::new(),
        strides: vec![Vec::new(); n_in],
    };
    for &d in dims {
        let n = shape[d];
        if n == 1 {
            continue;
        }
        let mergeable = !out.shape.is_empty()
            && n != 0
            && (0..n_in).all(|i| {
                let last = *out.strides[i].last().expect("same rank");
                last == strides[i][d] * n as isize
            });
        if mergeable {
            *out.shape.last_mut().expect("not empty") *= n;
            for (i, s) in out.strides.iter_mut().enumerate() {
                *s.last_mut().expect("not empty") = strides[i][d];
            }
        } else {
            out.shape.push(n);
            for (i, s) in out.strides.iter_mut().enumerate() {
                s.push(strides[i][d]);
            }
        }
    }
    out
}

/// How a reducing kernel spreads its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceStrategy {
    /// One thread per output element, reducing in index order. Used when
    /// the innermost dimension is kept (neighbouring threads read
    /// neighbouring elements) with enough outputs to fill the GPU, or when
    /// each output reduces few elements.
    ThreadPerOutput,
    /// One block per output element: each thread reduces a strided share,
    /// then a tree over warp shuffles and shared memory combines the
    /// threads in a fixed order.
    BlockPerOutput,
}

/// The kept and reduced layouts of a reducing spec (inputs' strides split
/// accordingly), and the strategy.
pub fn reduce_layouts(spec: &KernelSpec) -> (Layout, Layout, ReduceStrategy) {
    let r = spec.reduce.as_ref().expect("a reducing spec");
    let nd = spec.shape.len();
    let strides: Vec<&[isize]> = spec.inputs.iter().map(|i| i.strides.as_slice()).collect();
    let kept_dims: Vec<usize> = (0..nd).filter(|d| !r.axes.contains(d)).collect();
    let mut red_dims = r.axes.clone();
    red_dims.sort_unstable();
    let kept = collapse(&spec.shape, &strides, &kept_dims);
    let red = collapse(&spec.shape, &strides, &red_dims);
    let inner_kept = (0..nd)
        .rev()
        .find(|&d| spec.shape[d] != 1)
        .is_some_and(|d| !r.axes.contains(&d));
    let (n_out, n_red) = (kept.len(), red.len());
    let strategy = if n_red <= 32 || (inner_kept && n_out >= 2048) {
        ReduceStrategy::ThreadPerOutput
    } else {
        ReduceStrategy::BlockPerOutput
    };
    (kept, red, strategy)
}

/// Threads per block of every generated kernel (a multiple of the warp
/// size; the reduction tree assumes it).
pub const BLOCK: u32 = 256;

/// The number of blocks for `work` items at [`BLOCK`] items per block,
/// capped at `max_blocks` (the kernels loop over the rest): at least 1.
pub fn grid_for(work: usize, per_block: usize, max_blocks: usize) -> u32 {
    work.div_ceil(per_block.max(1))
        .clamp(1, max_blocks.max(1))
        .min(i32::MAX as usize) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::kernel::{InputSpec, KDType, KExpr, KId, ReduceOp, ReduceSpec};

    /// Offsets by the definition: Σ idx[d] * stride[d] in row-major order
    /// over `dims`.
    fn offsets(shape: &[usize], strides: &[isize], dims: &[usize]) -> Vec<isize> {
        let n: usize = dims.iter().map(|&d| shape[d]).product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; dims.len()];
        for flat in 0..n {
            if flat > 0 {
                for k in (0..dims.len()).rev() {
                    idx[k] += 1;
                    if idx[k] < shape[dims[k]] {
                        break;
                    }
                    idx[k] = 0;
                }
            }
            out.push(
                dims.iter()
                    .zip(&idx)
                    .map(|(&d, &i)| i as isize * strides[d])
                    .sum(),
            );
        }
        out
    }

    /// A small deterministic generator.
    fn lcg(seed: &mut u64) -> usize {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as usize
    }

    #[test]
    fn collapse_visits_the_same_offsets() {
        let mut seed = 7;
        for _ in 0..500 {
            let nd = lcg(&mut seed) % 5;
            let shape: Vec<usize> = (0..nd)
                .map(|_| [1, 1, 2, 3, 4][lcg(&mut seed) % 5])
                .collect();
            // Inputs: dense, broadcast from a random subset of dimensions,
            // and a transposed-looking one.
            let dense = InputSpec::contiguous(&shape).strides;
            let mut bcast = dense.clone();
            for s in bcast.iter_mut() {
                if lcg(&mut seed).is_multiple_of(2) {
                    *s = 0;
                }
            }
            let mut rev = vec![0isize; nd];
            let mut s = 1isize;
            for d in 0..nd {
                rev[d] = s;
                s *= shape[d] as isize;
            }
            let all = [dense, bcast, rev];
            let refs: Vec<&[isize]> = all.iter().map(|v| v.as_slice()).collect();
            // Every subset of dimensions in order (kept / reduced parts).
            for mask in 0..(1u32 << nd) {
                let dims: Vec<usize> = (0..nd).filter(|d| mask & (1 << d) != 0).collect();
                let l = collapse(&shape, &refs, &dims);
                for (i, st) in all.iter().enumerate() {
                    let want = offsets(&shape, st, &dims);
                    let got: Vec<isize> = (0..want.len()).map(|f| l.offset(i, f)).collect();
                    assert_eq!(got, want, "shape {shape:?} dims {dims:?} input {i}");
                }
                assert_eq!(l.len(), dims.iter().map(|&d| shape[d]).product::<usize>());
            }
        }
    }

    #[test]
    fn collapse_merges_dense_dimensions() {
        let st = InputSpec::contiguous(&[4, 5, 6]).strides;
        let b = InputSpec::broadcast(&[6], &[4, 5, 6]).unwrap().strides;
        let l = collapse(&[4, 5, 6], &[&st], &[0, 1, 2]);
        assert_eq!((l.shape, l.strides), (vec![120], vec![vec![1]]));
        let l = collapse(&[4, 5, 6], &[&st, &b], &[0, 1, 2]);
        // The broadcast input steps 0 over [4, 5] (merged) and 1 over 6.
        assert_eq!(l.shape, vec![20, 6]);
        assert_eq!(l.strides, vec![vec![6, 1], vec![0, 1]]);
        // Empty tensors keep their zero-size dimension.
        let l = collapse(&[0, 3], &[&[3, 1]], &[0, 1]);
        assert_eq!(l.len(), 0);
    }

    fn reducing(shape: &[usize], axes: &[usize]) -> KernelSpec {
        KernelSpec {
            dtype: KDType::F32,
            shape: shape.to_vec(),
            inputs: vec![InputSpec::contiguous(shape)],
            body: vec![KExpr::Input(0)],
            outputs: vec![KId(0)],
            reduce: Some(ReduceSpec {
                op: ReduceOp::Sum,
                axes: axes.to_vec(),
                keepdims: false,
            }),
        }
    }

    #[test]
    fn reduction_strategies() {
        // A bias gradient: [1024, 2048] over axis 0; threads read along rows.
        let (k, r, s) = reduce_layouts(&reducing(&[1024, 2048], &[0]));
        assert_eq!((k.shape, r.shape), (vec![2048], vec![1024]));
        assert_eq!(s, ReduceStrategy::ThreadPerOutput);
        // Row sums of wide rows: a block per row.
        let (_, _, s) = reduce_layouts(&reducing(&[1024, 2048], &[1]));
        assert_eq!(s, ReduceStrategy::BlockPerOutput);
        // A full reduction.
        let (k, r, s) = reduce_layouts(&reducing(&[64, 64], &[0, 1]));
        assert_eq!((k.len(), r.shape.clone()), (1, vec![4096]));
        assert_eq!(s, ReduceStrategy::BlockPerOutput);
        // Short rows: a thread each.
        let (_, _, s) = reduce_layouts(&reducing(&[100000, 10], &[1]));
        assert_eq!(s, ReduceStrategy::ThreadPerOutput);
    }

    #[test]
    fn grids() {
        assert_eq!(grid_for(0, 256, 1000), 1);
        assert_eq!(grid_for(256, 256, 1000), 1);
        assert_eq!(grid_for(257, 256, 1000), 2);
        assert_eq!(grid_for(1 << 30, 256, 4224), 4224);
    }
}
