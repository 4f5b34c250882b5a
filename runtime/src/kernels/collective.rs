//! Collectives over the processes of the world ([`crate::comm`]):
//! `rank()`, `world_size()`, `all_reduce(x, op)`, `all_gather(x, axis)`,
//! `reduce_scatter(x, axis)` and `broadcast(x, root)`. With one process
//! each is the identity (`all_reduce` with `"mean"` too).
//!
//! Floats travel as f64, ints and bools as i64, and results come back in
//! the operand's dtype: exact for every dtype (an f32 sum is rounded once,
//! at the end).

use super::args::{arity, int, string, tensor};
use super::ctx::Ctx;
use crate::comm::{self, Communicator, ReduceOp};
use crate::error::RtError;
use crate::shape;
use crate::tensor::{DType, Tensor};
use crate::value::Value;

pub fn rank(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("rank", args, 0)?;
    Ok(Value::from(Tensor::scalar_i64(ctx.comm().rank() as i64)))
}

pub fn world_size(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("world_size", args, 0)?;
    Ok(Value::from(Tensor::scalar_i64(ctx.comm().size() as i64)))
}

/// The data of `x` as f64 or i64 (`Err`).
enum Data {
    F(Vec<f64>),
    I(Vec<i64>),
}

fn data(x: &Tensor) -> Data {
    if x.dtype().is_float() {
        Data::F(x.as_f64_vec())
    } else {
        Data::I(x.as_i64_vec())
    }
}

fn back(d: Data, dtype: DType, shape: &[usize]) -> Result<Value, RtError> {
    let t = match d {
        Data::F(v) => Tensor::from_vec(v, shape)?,
        Data::I(v) => Tensor::from_vec(v, shape)?,
    };
    Ok(Value::from(if t.dtype() == dtype {
        t
    } else {
        t.cast(dtype)
    }))
}

fn dtype_code(d: DType) -> i64 {
    DType::ALL.iter().position(|&e| e == d).unwrap_or(99) as i64
}

/// What every rank must agree on: the collective, its parameter, and the
/// operand's dtype and shape.
fn agree(c: &dyn Communicator, op: &str, code: i64, param: i64, x: &Tensor) -> Result<(), RtError> {
    let mut h = vec![code, param, dtype_code(x.dtype()), x.ndim() as i64];
    h.extend(x.shape().iter().take(8).map(|&d| d as i64));
    h.resize(12, -1);
    comm::agree(c, op, &h).map_err(RtError::new)
}

pub fn all_reduce(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("all_reduce", args, 2)?;
    let x = tensor("all_reduce", &args[0], "x")?;
    let how = if args[1].is_unit() {
        "sum"
    } else {
        string("all_reduce", &args[1], "op")?
    };
    let (op, code) = match how {
        "sum" => (ReduceOp::Sum, 0),
        "mean" => (ReduceOp::Sum, 1),
        "max" => (ReduceOp::Max, 2),
        "min" => (ReduceOp::Min, 3),
        other => {
            return Err(RtError::new(format!(
                "all_reduce: op must be \"sum\", \"mean\", \"max\" or \"min\", not {other:?}"
            )))
        }
    };
    if how == "mean" && !x.dtype().is_float() {
        return Err(RtError::new(format!(
            "all_reduce: the mean of {} needs a float tensor",
            x.type_string()
        )));
    }
    let c = ctx.comm();
    agree(c, "all_reduce", 1, code, x)?;
    let d = match data(x) {
        Data::F(mut v) => {
            c.all_reduce_f64(&mut v, op);
            if how == "mean" {
                let n = c.size() as f64;
                v.iter_mut().for_each(|e| *e /= n);
            }
            Data::F(v)
        }
        Data::I(mut v) => {
            c.all_reduce_i64(&mut v, op);
            Data::I(v)
        }
    };
    back(d, x.dtype(), x.shape())
}

/// The blocks of `p` ranks' data (rank-major, each `outer` blocks of
/// `inner` elements) laid side by side along an axis: block `o` of rank
/// 0, block `o` of rank 1, ...
fn interleave<T: Copy>(all: &[T], p: usize, outer: usize, inner: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(all.len());
    for o in 0..outer {
        for r in 0..p {
            let base = r * outer * inner + o * inner;
            out.extend_from_slice(&all[base..base + inner]);
        }
    }
    out
}

/// Chunk `r` of `p` along an axis: of each of `outer` blocks of `inner`
/// elements, the `r`-th of `p` equal parts.
fn chunk<T: Copy>(v: &[T], p: usize, r: usize, outer: usize, inner: usize) -> Vec<T> {
    let part = inner / p;
    let mut out = Vec::with_capacity(outer * part);
    for o in 0..outer {
        let base = o * inner + r * part;
        out.extend_from_slice(&v[base..base + part]);
    }
    out
}

/// The number of blocks before axis `a` and the elements of one block
/// (axis `a` and after).
fn blocks(shape: &[usize], a: usize) -> (usize, usize) {
    (shape[..a].iter().product(), shape[a..].iter().product())
}

pub fn all_gather(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("all_gather", args, 2)?;
    let x = tensor("all_gather", &args[0], "x")?;
    let axis = int("all_gather", &args[1], "axis")?;
    let c = ctx.comm();
    let (a, out_shape) = shape::all_gather(x.ty(), axis, c.size()).map_err(RtError::new)?;
    agree(c, "all_gather", 2, a as i64, x)?;
    let (outer, inner) = blocks(x.shape(), a);
    let p = c.size();
    let d = match data(x) {
        Data::F(v) => Data::F(interleave(&c.all_gather_f64(&v), p, outer, inner)),
        Data::I(v) => Data::I(interleave(&c.all_gather_i64(&v), p, outer, inner)),
    };
    back(d, x.dtype(), &out_shape)
}

pub fn reduce_scatter(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("reduce_scatter", args, 2)?;
    let x = tensor("reduce_scatter", &args[0], "x")?;
    let axis = int("reduce_scatter", &args[1], "axis")?;
    let c = ctx.comm();
    let (a, out_shape) = shape::reduce_scatter(x.ty(), axis, c.size()).map_err(RtError::new)?;
    agree(c, "reduce_scatter", 3, a as i64, x)?;
    let (outer, inner) = blocks(x.shape(), a);
    let (p, r) = (c.size(), c.rank());
    let d = match data(x) {
        Data::F(mut v) => {
            c.all_reduce_f64(&mut v, ReduceOp::Sum);
            Data::F(chunk(&v, p, r, outer, inner))
        }
        Data::I(mut v) => {
            c.all_reduce_i64(&mut v, ReduceOp::Sum);
            Data::I(chunk(&v, p, r, outer, inner))
        }
    };
    back(d, x.dtype(), &out_shape)
}

pub fn broadcast(ctx: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    arity("broadcast", args, 2)?;
    let x = tensor("broadcast", &args[0], "x")?;
    let root = int("broadcast", &args[1], "root")?;
    let c = ctx.comm();
    if root < 0 || root as usize >= c.size() {
        return Err(RtError::new(format!(
            "broadcast: root {root} is not a rank of this world of {}",
            c.size()
        )));
    }
    agree(c, "broadcast", 4, root, x)?;
    let d = match data(x) {
        Data::F(mut v) => {
            c.broadcast_f64(&mut v, root as usize);
            Data::F(v)
        }
        Data::I(mut v) => {
            c.broadcast_i64(&mut v, root as usize);
            Data::I(v)
        }
    };
    back(d, x.dtype(), x.shape())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathering_lays_ranks_side_by_side_along_the_axis() {
        // Two ranks, each a [2, 2] block: along axis 1 the rows join.
        let all = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(interleave(&all, 2, 2, 2), vec![1, 2, 5, 6, 3, 4, 7, 8]);
        // Along axis 0 the blocks follow each other.
        assert_eq!(interleave(&all, 2, 1, 4), all.to_vec());
        // The chunks undo it.
        let g = interleave(&all, 2, 2, 2);
        assert_eq!(chunk(&g, 2, 1, 2, 4), vec![5, 6, 7, 8]);
    }
}
