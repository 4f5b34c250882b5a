//! Strided iteration: the one index loop behind broadcasting, transposes,
//! reductions and slicing.

use crate::error::RtError;
use crate::shape::strides;
use crate::tensor::{Element, Tensor};
use crate::with_buffer;

/// Iterates the positions of `shape` in row-major order and yields, for
/// each, the offset `sum(index[d] * strides[d])`. Amortised O(1) per step.
pub struct Offsets {
    shape: Vec<usize>,
    strides: Vec<usize>,
    index: Vec<usize>,
    offset: usize,
    remaining: usize,
}

impl Iterator for Offsets {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let current = self.offset;
        self.remaining -= 1;
        if self.remaining > 0 {
            let mut d = self.shape.len();
            while d > 0 {
                d -= 1;
                self.index[d] += 1;
                self.offset += self.strides[d];
                if self.index[d] < self.shape[d] {
                    break;
                }
                self.offset -= self.strides[d] * self.shape[d];
                self.index[d] = 0;
            }
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets {}

/// Offsets of the positions of `shape` under `strides` (one per dimension),
/// starting at `base`.
pub fn offsets_from(base: usize, shape: &[usize], strides: &[usize]) -> Offsets {
    Offsets {
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        index: vec![0; shape.len()],
        offset: base,
        remaining: crate::shape::size(shape),
    }
}

/// Offsets of the positions of `shape` under `strides`, starting at 0.
pub fn offsets(shape: &[usize], strides: &[usize]) -> Offsets {
    offsets_from(0, shape, strides)
}

/// Strides that read a row-major tensor of `in_shape` as if broadcast to
/// `out_shape` (0 along stretched or missing dimensions). `in_shape` must
/// broadcast to `out_shape`.
pub fn broadcast_strides(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let s = strides(in_shape);
    let lead = out_shape.len() - in_shape.len();
    (0..out_shape.len())
        .map(|d| {
            if d < lead || in_shape[d - lead] == 1 {
                0
            } else {
                s[d - lead]
            }
        })
        .collect()
}

/// The elements of `src` at `offs`, in order.
pub fn gather<T: Copy>(src: &[T], offs: impl Iterator<Item = usize>) -> Vec<T> {
    offs.map(|o| src[o]).collect()
}

/// A tensor of `shape` whose elements are `x`'s at `offs` (same dtype and
/// weakness).
pub fn remap(
    x: &Tensor,
    shape: &[usize],
    offs: impl Iterator<Item = usize>,
) -> Result<Tensor, RtError> {
    let buf = with_buffer!(x.buffer(), v => Element::wrap(gather(v, offs)));
    Ok(Tensor::new(buf, shape)?.with_weak(x.weak))
}

/// Row-major iteration over `shape` in runs along the innermost axes, for
/// `N` offset tables at once (`strides[k]` gives table `k`'s stride along
/// each axis). Axes of length 1 are dropped and adjacent axes that every
/// table walks uniformly are merged, so a run is as long as possible:
/// callers loop over a run with a constant step per table (often 0 or 1,
/// which they special-case) instead of paying the odometer per element.
pub struct Rows<const N: usize> {
    /// Lengths of the axes outside a run (outermost first).
    outer: Vec<usize>,
    /// Per table, its strides along `outer`.
    outer_strides: [Vec<usize>; N],
    /// Elements in a run (0 when the shape is empty).
    pub len: usize,
    /// Per table, its step within a run.
    pub step: [usize; N],
}

impl<const N: usize> Rows<N> {
    pub fn new(shape: &[usize], strides: [&[usize]; N]) -> Rows<N> {
        // Merged axes, innermost first: (length, stride per table).
        let mut merged: Vec<(usize, [usize; N])> = Vec::new();
        let mut empty = false;
        for d in (0..shape.len()).rev() {
            let len = shape[d];
            if len == 0 {
                empty = true;
            }
            if len == 1 {
                continue;
            }
            let st: [usize; N] = std::array::from_fn(|k| strides[k][d]);
            if let Some((l, s)) = merged.last_mut() {
                if (0..N).all(|k| st[k] == s[k] * *l) {
                    *l *= len;
                    continue;
                }
            }
            merged.push((len, st));
        }
        if empty {
            return Rows {
                outer: Vec::new(),
                outer_strides: std::array::from_fn(|_| Vec::new()),
                len: 0,
                step: [0; N],
            };
        }
        let (len, step) = if merged.is_empty() {
            (1, [0; N])
        } else {
            merged.remove(0)
        };
        merged.reverse();
        Rows {
            outer: merged.iter().map(|(l, _)| *l).collect(),
            outer_strides: std::array::from_fn(|k| merged.iter().map(|(_, s)| s[k]).collect()),
            len,
            step,
        }
    }

    /// Calls `f` with the offsets (one per table) of the first element of
    /// every run, in row-major order.
    pub fn for_each(&self, mut f: impl FnMut([usize; N])) {
        if self.len == 0 {
            return;
        }
        let total: usize = self.outer.iter().product();
        let nd = self.outer.len();
        let mut idx = vec![0usize; nd];
        let mut base = [0usize; N];
        for _ in 0..total {
            f(base);
            let mut d = nd;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for (b, s) in base.iter_mut().zip(&self.outer_strides) {
                    *b += s[d];
                }
                if idx[d] < self.outer[d] {
                    break;
                }
                for (b, s) in base.iter_mut().zip(&self.outer_strides) {
                    *b -= s[d] * self.outer[d];
                }
                idx[d] = 0;
            }
        }
    }
}

/// The elements of `src` read at the positions of `shape` under `strides`,
/// in row-major order (what `gather(src, offsets(shape, strides))` gives).
pub fn gather_strided<T: Copy + Send + Sync>(
    src: &[T],
    shape: &[usize],
    strides: &[usize],
) -> Vec<T> {
    if let Some(out) = transpose_tiles(src, shape, strides) {
        return out;
    }
    let rows = Rows::new(shape, [strides]);
    let mut out = Vec::with_capacity(crate::shape::size(shape));
    let (len, [step]) = (rows.len, rows.step);
    rows.for_each(|[o]| match step {
        1 => out.extend_from_slice(&src[o..o + len]),
        0 => out.extend(std::iter::repeat_n(src[o], len)),
        _ => out.extend((0..len).map(|j| src[o + j * step])),
    });
    out
}

/// Side of the square tiles [`transpose_tiles`] copies.
const TILE: usize = 16;

/// Elements from which [`transpose_tiles`] splits its bands of rows over
/// rayon's threads (a transposed operand of a batch of products: 2 MiB
/// of f64 took 155 µs on one thread).
const PARALLEL_COPY: usize = 1 << 16;

/// [`gather_strided`] for a transpose of the last two axes (`mT`, the
/// transposes of matrix products' operands): the elements of each matrix
/// read from a `cols × rows` source, in square tiles, so that the strided
/// reads of a tile share cache lines. `None` for any other layout.
fn transpose_tiles<T: Copy + Send + Sync>(
    src: &[T],
    shape: &[usize],
    strides: &[usize],
) -> Option<Vec<T>> {
    let r = shape.len();
    if r < 2 {
        return None;
    }
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    if strides[r - 2] != 1 || strides[r - 1] != rows || rows < 4 || cols < 4 {
        return None;
    }
    let n = crate::shape::size(shape);
    let mut out: Vec<T> = Vec::with_capacity(n);
    let dst = &mut out.spare_capacity_mut()[..n];
    // The matrices, in row-major order of the leading axes.
    let bases = offsets(&shape[..r - 2], &strides[..r - 2]);
    // Rows `i0..` (at most TILE) of the matrix at `base`, into `d`.
    let band = |d: &mut [std::mem::MaybeUninit<T>], base: usize, i0: usize| {
        for j0 in (0..cols).step_by(TILE) {
            for i in i0..(i0 + TILE).min(rows) {
                for j in j0..(j0 + TILE).min(cols) {
                    d[(i - i0) * cols + j].write(src[base + j * rows + i]);
                }
            }
        }
    };
    if n >= PARALLEL_COPY && rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        let bases: Vec<usize> = bases.collect();
        dst.par_chunks_mut(rows * cols)
            .zip(bases.par_iter())
            .for_each(|(d, &base)| {
                d.par_chunks_mut(TILE * cols)
                    .enumerate()
                    .for_each(|(t, d)| band(d, base, t * TILE))
            });
    } else {
        for (d, base) in dst.chunks_mut(rows * cols).zip(bases) {
            for (t, d) in d.chunks_mut(TILE * cols).enumerate() {
                band(d, base, t * TILE);
            }
        }
    }
    // SAFETY: the loops above wrote all `n` elements (every matrix, every
    // row and column of it).
    unsafe { out.set_len(n) };
    Some(out)
}

/// A tensor of `shape` whose elements are `x`'s read under `strides` (same
/// dtype and weakness).
pub fn remap_strided(x: &Tensor, shape: &[usize], strides: &[usize]) -> Result<Tensor, RtError> {
    let buf = with_buffer!(x.buffer(), v => Element::wrap(gather_strided(v, shape, strides)));
    Ok(Tensor::new(buf, shape)?.with_weak(x.weak))
}

/// Folds a row-major `x` of `shape` into `n_out` accumulators: the element
/// at each position goes into the accumulator at its offset under
/// `out_strides`. Every accumulator sees its elements in row-major order,
/// whatever the layout, so float results do not depend on it.
pub fn fold_into<T: Copy, A: Copy>(
    x: &[T],
    shape: &[usize],
    out_strides: &[usize],
    n_out: usize,
    init: A,
    f: impl Fn(A, T) -> A,
) -> Vec<A> {
    let mut acc = vec![init; n_out];
    let contiguous = crate::shape::strides(shape);
    let rows = Rows::new(shape, [&contiguous, out_strides]);
    let (len, [_, step]) = (rows.len, rows.step);
    rows.for_each(|[i, o]| {
        let xs = &x[i..i + len];
        match step {
            0 => {
                let mut a = acc[o];
                for &v in xs {
                    a = f(a, v);
                }
                acc[o] = a;
            }
            1 => {
                for (a, &v) in acc[o..o + len].iter_mut().zip(xs) {
                    *a = f(*a, v);
                }
            }
            _ => {
                for (j, &v) in xs.iter().enumerate() {
                    let a = &mut acc[o + j * step];
                    *a = f(*a, v);
                }
            }
        }
    });
    acc
}

/// `x` broadcast to `shape` (which it must broadcast to). Shares the buffer
/// when the shape is unchanged.
pub fn broadcast_tensor(x: &Tensor, shape: &[usize]) -> Result<Tensor, RtError> {
    if x.shape() == shape {
        return Ok(x.clone());
    }
    let st = broadcast_strides(x.shape(), shape);
    remap_strided(x, shape, &st)
}

/// Applies `f` element-wise to `a` and `b` broadcast to `out`.
pub fn zip_broadcast<A: Copy, B: Copy, R>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out: &[usize],
    f: impl Fn(A, B) -> R,
) -> Vec<R> {
    let n = crate::shape::size(out);
    if a.len() == n && b.len() == n {
        return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    }
    if b.len() == 1 && a.len() == n {
        let y = b[0];
        return a.iter().map(|&x| f(x, y)).collect();
    }
    if a.len() == 1 && b.len() == n {
        let x = a[0];
        return b.iter().map(|&y| f(x, y)).collect();
    }
    let sa = broadcast_strides(a_shape, out);
    let sb = broadcast_strides(b_shape, out);
    let rows = Rows::new(out, [&sa, &sb]);
    let (len, [da, db]) = (rows.len, rows.step);
    let mut v = Vec::with_capacity(n);
    rows.for_each(|[i, j]| match (da, db) {
        (1, 1) => v.extend(
            a[i..i + len]
                .iter()
                .zip(&b[j..j + len])
                .map(|(&x, &y)| f(x, y)),
        ),
        (1, 0) => {
            let y = b[j];
            v.extend(a[i..i + len].iter().map(|&x| f(x, y)));
        }
        (0, 1) => {
            let x = a[i];
            v.extend(b[j..j + len].iter().map(|&y| f(x, y)));
        }
        _ => v.extend((0..len).map(|k| f(a[i + k * da], b[j + k * db]))),
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transposes of the last two axes, copied by tiles, equal the
    /// element-by-element gather, for sizes around the tile's, on one
    /// thread and split over several.
    #[test]
    fn tiled_transposes_equal_the_plain_gather() {
        for (b, rows, cols) in [
            (1, 16, 16),
            (3, 17, 40),
            (2, 100, 31),
            (25, 10, 1000),
            (1, 33, 16),
            (2, 4, 5),
            (1, 3, 50),
            // Split over threads (from 2^16 elements): bands of one
            // matrix, the last one short, and several matrices.
            (1, 300, 250),
            (2, 257, 130),
        ] {
            let src: Vec<u32> = (0..(b * rows * cols) as u32).collect();
            // `src` is b × cols × rows; its transpose is b × rows × cols.
            let shape = [b, rows, cols];
            let strides = [rows * cols, 1, rows];
            let want: Vec<u32> = (0..b)
                .flat_map(|m| {
                    (0..rows).flat_map(move |i| {
                        (0..cols).map(move |j| (m * rows * cols + j * rows + i) as u32)
                    })
                })
                .collect();
            assert_eq!(gather_strided(&src, &shape, &strides), want, "{shape:?}");
        }
    }

    #[test]
    fn odometer() {
        let o: Vec<usize> = offsets(&[2, 3], &[1, 2]).collect();
        assert_eq!(o, vec![0, 2, 4, 1, 3, 5]);
        let o: Vec<usize> = offsets(&[], &[]).collect();
        assert_eq!(o, vec![0]);
        assert_eq!(offsets(&[2, 0], &[1, 1]).count(), 0);
        let o: Vec<usize> = offsets_from(10, &[2], &[3]).collect();
        assert_eq!(o, vec![10, 13]);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
        let r = zip_broadcast(&[1, 2, 3], &[3, 1], &[10, 20], &[2], &[3, 2], |a, b| a + b);
        assert_eq!(r, vec![11, 21, 12, 22, 13, 23]);
        let x = Tensor::vector(vec![1i64, 2]);
        let y = broadcast_tensor(&x, &[2, 2]).unwrap();
        assert_eq!(y.as_i64(), Some(&[1, 2, 1, 2][..]));
    }

    /// The run-based loops agree with the odometer on assorted layouts.
    #[test]
    fn rows_agree_with_offsets() {
        let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
            (vec![], vec![]),
            (vec![1], vec![0]),
            (vec![4], vec![1]),
            (vec![3, 4], vec![4, 1]),
            (vec![3, 4], vec![1, 3]),
            (vec![3, 4], vec![0, 1]),
            (vec![3, 4], vec![1, 0]),
            (vec![2, 1, 3], vec![3, 0, 1]),
            (vec![2, 3, 4], vec![12, 4, 1]),
            (vec![2, 3, 4], vec![0, 4, 1]),
            (vec![2, 3, 4], vec![4, 0, 1]),
            (vec![2, 3, 4], vec![1, 0, 2]),
            (vec![2, 0, 4], vec![0, 4, 1]),
            (vec![5, 2, 3], vec![1, 15, 5]),
        ];
        for (shape, st) in cases {
            let src: Vec<i64> = (0..64).collect();
            let expect = gather(&src, offsets(&shape, &st));
            assert_eq!(
                gather_strided(&src, &shape, &st),
                expect,
                "{shape:?} {st:?}"
            );
            let n: usize = shape.iter().product();
            let x: Vec<i64> = (0..n as i64).map(|v| v * 7 + 1).collect();
            let mut acc = vec![Vec::new(); 64];
            for (&v, o) in x.iter().zip(offsets(&shape, &st)) {
                acc[o].push(v);
            }
            let sums = fold_into(&x, &shape, &st, 64, 0i64, |a, v| a * 3 + v);
            let expect: Vec<i64> = acc
                .iter()
                .map(|vs| vs.iter().fold(0i64, |a, &v| a * 3 + v))
                .collect();
            assert_eq!(sums, expect, "{shape:?} {st:?}");
        }
        let r = zip_broadcast(
            &[1, 2, 3, 4, 5, 6],
            &[2, 3],
            &[10, 20, 30],
            &[3],
            &[2, 2, 3],
            |a, b| a * 100 + b,
        );
        assert_eq!(
            r,
            vec![110, 220, 330, 410, 520, 630, 110, 220, 330, 410, 520, 630]
        );
    }
}
