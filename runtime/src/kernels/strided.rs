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

/// `x` broadcast to `shape` (which it must broadcast to). Shares the buffer
/// when the shape is unchanged.
pub fn broadcast_tensor(x: &Tensor, shape: &[usize]) -> Result<Tensor, RtError> {
    if x.shape() == shape {
        return Ok(x.clone());
    }
    let st = broadcast_strides(x.shape(), shape);
    remap(x, shape, offsets(shape, &st))
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
    offsets(out, &sa)
        .zip(offsets(out, &sb))
        .map(|(i, j)| f(a[i], b[j]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
