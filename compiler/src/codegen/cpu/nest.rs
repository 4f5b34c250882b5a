//! The loop nest of a kernel: dimensions of size 1 dropped, reduced
//! dimensions moved inside, adjacent dimensions that every operand walks
//! contiguously merged, and the innermost dimension vectorised when every
//! input reads it with stride 0 or 1.
//!
//! A dense map over any shape becomes a single flat loop (the fast path);
//! broadcasting and reductions keep a short nest.

use crate::codegen::kernel::{KExpr, KernelSpec, ReduceOp};

/// How the loop nest combines the body's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Each output element is written once.
    Map,
    /// The reduced dimensions are the innermost loops; each output element
    /// is accumulated in registers and stored once.
    InnerReduce(ReduceOp),
    /// The last loop is over the last kept dimension, inside the reduced
    /// loops; the output row is filled with the identity and accumulated in
    /// memory, one vector of outputs at a time.
    OuterReduce(ReduceOp),
}

/// The loop nest of a kernel, outermost loop first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoopNest {
    pub mode: Mode,
    /// The extent of each loop.
    pub dims: Vec<usize>,
    /// Whether each loop is over reduced dimensions.
    pub reduced: Vec<bool>,
    /// Per input, per loop: the stride in elements.
    pub in_strides: Vec<Vec<isize>>,
    /// Per loop: the output stride in elements (0 on reduced loops).
    pub out_strides: Vec<isize>,
    /// Per loop: the stride of a reduction's side outputs, which are dense
    /// over the whole iteration space (`out_strides` for a map).
    pub side_strides: Vec<isize>,
    /// The loop whose range is `[begin, end)` of the compiled function.
    pub par_dim: usize,
    /// Whether the innermost loop is vectorised.
    pub vector: bool,
}

impl LoopNest {
    /// The nest of a valid canonical spec with a nonempty iteration space.
    pub fn new(spec: &KernelSpec) -> LoopNest {
        let nd = spec.shape.len();
        let axes: &[usize] = spec.reduce.as_ref().map_or(&[], |r| &r.axes);
        let red: Vec<bool> = (0..nd).map(|d| axes.contains(&d)).collect();
        let mut out_st = vec![0isize; nd];
        let mut s = 1isize;
        for d in (0..nd).rev() {
            if !red[d] {
                out_st[d] = s;
                s *= spec.shape[d] as isize;
            }
        }
        // Side outputs constrain the loops only when there are some.
        let side_st = if spec.has_side_outputs() {
            crate::codegen::kernel::InputSpec::contiguous(&spec.shape).strides
        } else {
            vec![0isize; nd]
        };
        // Drop size-1 dimensions and merge contiguous ones in the natural
        // order first, then order the loops.
        let live: Vec<usize> = (0..nd).filter(|&d| spec.shape[d] != 1).collect();
        // Inputs the body does not read must not constrain the loops.
        let used = |i: usize| {
            spec.body
                .iter()
                .any(|e| matches!(e, KExpr::Input(j) if *j == i))
        };
        let mut nat = LoopNest {
            mode: Mode::Map,
            dims: live.iter().map(|&d| spec.shape[d]).collect(),
            reduced: live.iter().map(|&d| red[d]).collect(),
            in_strides: spec
                .inputs
                .iter()
                .enumerate()
                .map(|(k, i)| {
                    live.iter()
                        .map(|&d| if used(k) { i.strides[d] } else { 0 })
                        .collect()
                })
                .collect(),
            out_strides: live.iter().map(|&d| out_st[d]).collect(),
            side_strides: live.iter().map(|&d| side_st[d]).collect(),
            par_dim: 0,
            vector: false,
        };
        nat.merge();
        let nd = nat.dims.len();
        let kept: Vec<usize> = (0..nd).filter(|&d| !nat.reduced[d]).collect();
        let reduced: Vec<usize> = (0..nd).filter(|&d| nat.reduced[d]).collect();
        let (mode, order): (Mode, Vec<usize>) = match (&spec.reduce, reduced.is_empty()) {
            (None, _) | (Some(_), true) => (Mode::Map, (0..nd).collect()),
            (Some(r), false) => {
                if nat.reduced[nd - 1] {
                    let order = kept.iter().chain(&reduced).copied().collect();
                    (Mode::InnerReduce(r.op), order)
                } else {
                    let (last, outer) = kept.split_last().unwrap();
                    let order = outer
                        .iter()
                        .chain(&reduced)
                        .chain(std::iter::once(last))
                        .copied()
                        .collect();
                    (Mode::OuterReduce(r.op), order)
                }
            }
        };
        let mut nest = LoopNest {
            mode,
            dims: order.iter().map(|&d| nat.dims[d]).collect(),
            reduced: order.iter().map(|&d| nat.reduced[d]).collect(),
            in_strides: nat
                .in_strides
                .iter()
                .map(|s| order.iter().map(|&d| s[d]).collect())
                .collect(),
            out_strides: order.iter().map(|&d| nat.out_strides[d]).collect(),
            side_strides: order.iter().map(|&d| nat.side_strides[d]).collect(),
            par_dim: 0,
            vector: false,
        };
        nest.merge();
        // The outermost loop is split across threads: it must be a kept
        // loop. A map of a single element gets one loop. A full reduction
        // gets a kept loop of extent 1 and splits its first reduced loop
        // instead: each range stores its partial result (see `is_split`).
        if nest.dims.is_empty() || nest.reduced[0] {
            match nest.mode {
                Mode::OuterReduce(_) => nest.par_dim = nest.dims.len() - 1,
                Mode::InnerReduce(_) => {
                    nest.insert_outer();
                    nest.par_dim = 1;
                }
                Mode::Map => nest.insert_outer(),
            }
        }
        let last = nest.dims.len() - 1;
        // (Side strides are all 0 when there are no side outputs.)
        nest.vector = nest.in_strides.iter().all(|s| matches!(s[last], 0 | 1))
            && matches!(nest.side_strides[last], 0 | 1);
        nest
    }

    fn insert_outer(&mut self) {
        self.dims.insert(0, 1);
        self.reduced.insert(0, false);
        for s in &mut self.in_strides {
            s.insert(0, 0);
        }
        self.out_strides.insert(0, 0);
        self.side_strides.insert(0, 0);
    }

    /// Merges loop `k` into loop `k + 1` when both are kept or both are
    /// reduced and every operand steps over loop `k` as one step of the
    /// merged loop.
    fn merge(&mut self) {
        let mut k = 0;
        while k + 1 < self.dims.len() {
            let n = self.dims[k + 1] as isize;
            let fits = |s: &[isize]| s[k] == s[k + 1] * n;
            if self.reduced[k] == self.reduced[k + 1]
                && fits(&self.out_strides)
                && fits(&self.side_strides)
                && self.in_strides.iter().all(|s| fits(s))
            {
                self.dims[k + 1] *= self.dims[k];
                self.dims.remove(k);
                self.reduced.remove(k);
                self.out_strides.remove(k);
                self.side_strides.remove(k);
                for s in &mut self.in_strides {
                    s.remove(k);
                }
            } else {
                k += 1;
            }
        }
    }

    /// Whether this is a reduction to one element whose parallel loop is a
    /// reduced loop: each call reduces its range and stores that partial
    /// result; the caller combines the partials.
    pub fn is_split(&self) -> bool {
        matches!(self.mode, Mode::InnerReduce(_)) && self.par_dim == 1
    }

    /// The number of elements one step of the parallel loop covers.
    pub fn inner_elements(&self) -> usize {
        self.dims[self.par_dim + 1..].iter().product()
    }

    /// The extent of the loop split across threads.
    pub fn par_extent(&self) -> usize {
        self.dims[self.par_dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::kernel::{InputSpec, KDType, KId, ReduceSpec};

    fn spec(
        shape: &[usize],
        inputs: Vec<InputSpec>,
        reduce: Option<(ReduceOp, Vec<usize>)>,
    ) -> KernelSpec {
        KernelSpec {
            dtype: KDType::F32,
            shape: shape.to_vec(),
            inputs,
            body: vec![KExpr::Input(0)],
            outputs: vec![KId(0)],
            reduce: reduce.map(|(op, axes)| ReduceSpec {
                op,
                axes,
                keepdims: false,
            }),
        }
    }

    #[test]
    fn dense_map_is_flat() {
        let p = LoopNest::new(&spec(
            &[2, 3, 4],
            vec![InputSpec::contiguous(&[2, 3, 4]), InputSpec::scalar(3)],
            None,
        ));
        assert_eq!(p.dims, vec![24]);
        assert_eq!(p.in_strides, vec![vec![1], vec![0]]);
        assert!(p.vector);
        assert_eq!(p.mode, Mode::Map);
    }

    #[test]
    fn broadcast_keeps_two_loops() {
        let p = LoopNest::new(&spec(
            &[5, 1, 6],
            vec![InputSpec::broadcast(&[6], &[5, 1, 6]).unwrap()],
            None,
        ));
        assert_eq!(p.dims, vec![5, 6]);
        assert_eq!(p.in_strides, vec![vec![0, 1]]);
        let p = LoopNest::new(&spec(
            &[5, 6],
            vec![InputSpec {
                strides: vec![1, 5],
            }],
            None,
        ));
        assert!(!p.vector);
    }

    #[test]
    fn reductions() {
        let x = || vec![InputSpec::contiguous(&[4, 5, 6])];
        let p = LoopNest::new(&spec(&[4, 5, 6], x(), Some((ReduceOp::Sum, vec![1, 2]))));
        assert_eq!(p.mode, Mode::InnerReduce(ReduceOp::Sum));
        assert_eq!(p.dims, vec![4, 30]);
        let p = LoopNest::new(&spec(&[4, 5, 6], x(), Some((ReduceOp::Sum, vec![0, 1, 2]))));
        assert_eq!(p.dims, vec![1, 120]);
        assert!(p.is_split());
        let p = LoopNest::new(&spec(&[4, 5, 6], x(), Some((ReduceOp::Max, vec![0]))));
        assert_eq!(p.mode, Mode::OuterReduce(ReduceOp::Max));
        assert_eq!(p.dims, vec![4, 30]);
        assert_eq!(p.par_dim, 1);
        let p = LoopNest::new(&spec(&[4, 5, 6], x(), Some((ReduceOp::Max, vec![1]))));
        assert_eq!(p.mode, Mode::OuterReduce(ReduceOp::Max));
        assert_eq!(p.dims, vec![4, 5, 6]);
        assert_eq!(p.reduced, vec![false, true, false]);
        assert_eq!(p.par_dim, 0);
    }
}
