//! Deterministic, counter-based random numbers: `randn rand permutation`.
//!
//! Element `i` of a draw with seed `s` is a pure function of `(s, stream,
//! i)`: SplitMix64 positioned at counter `i` ([`random_bits`]), so the same
//! seed and shape give the same numbers on every machine, in any order and
//! on any number of threads. Transcendentals come from the `libm` crate
//! (pure Rust), not the platform's math library, for the same reason.
//!
//! - `rand`: uniform in `[0, 1)`; f32 from 24 bits, f64 from 53 bits.
//! - `randn`: standard normal by Box–Muller; elements `2p` and `2p + 1` are
//!   the cosine and sine halves of pair `p`, computed in f64.
//! - `permutation`: Fisher–Yates from the last position down, position `i`
//!   swapping with `bits(i) * (i + 1) >> 64`.

use super::args::{arity, dtype_or, int, opt_int, shape as shape_arg};
use super::ctx::Ctx;
use crate::error::RtError;
use crate::tensor::{DType, Tensor};
use crate::value::Value;

/// Stream of `rand`.
pub const STREAM_UNIFORM: u64 = 0;
/// Stream of `randn`.
pub const STREAM_NORMAL: u64 = 1;
/// Stream of `permutation`.
pub const STREAM_PERMUTATION: u64 = 2;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for element `counter` of `stream` under `seed`: the
/// SplitMix64 generator keyed by `(seed, stream)`, jumped to `counter`.
pub fn random_bits(seed: u64, stream: u64, counter: u64) -> u64 {
    let key = mix64(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
    mix64(key.wrapping_add(counter.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform f64 in `[0, 1)` from the top 53 bits.
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform f32 in `[0, 1)` from the top 24 bits.
pub fn unit_f32(bits: u64) -> f32 {
    (bits >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Element `i` of a standard normal draw.
pub fn normal(seed: u64, i: u64) -> f64 {
    let p = i / 2;
    let u1 = 1.0 - unit_f64(random_bits(seed, STREAM_NORMAL, 2 * p));
    let u2 = unit_f64(random_bits(seed, STREAM_NORMAL, 2 * p + 1));
    let r = libm::sqrt(-2.0 * libm::log(u1));
    let theta = 2.0 * std::f64::consts::PI * u2;
    if i.is_multiple_of(2) {
        r * libm::cos(theta)
    } else {
        r * libm::sin(theta)
    }
}

fn seed_arg(op: &str, v: &Value) -> Result<u64, RtError> {
    Ok(opt_int(op, v, "seed")?.unwrap_or(0) as u64)
}

fn float_dtype(op: &str, v: &Value) -> Result<DType, RtError> {
    let dt = dtype_or(op, v, DType::F32)?;
    if dt.is_float() {
        Ok(dt)
    } else {
        Err(RtError::new(format!(
            "{op}: expected a float dtype, got {dt}"
        )))
    }
}

/// `randn(shape, seed, dtype)`: standard normal samples (default f32).
pub fn randn(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "randn";
    arity(op, args, 3)?;
    let shape = shape_arg(op, &args[0])?;
    let seed = seed_arg(op, &args[1])?;
    let dt = float_dtype(op, &args[2])?;
    let n = crate::shape::size(&shape) as u64;
    let v: Vec<f64> = (0..n).map(|i| normal(seed, i)).collect();
    Ok(Value::Tensor(Tensor::from_vec(v, &shape)?.cast(dt)))
}

/// `rand(shape, seed, dtype)`: uniform samples in `[0, 1)` (default f32).
pub fn rand(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "rand";
    arity(op, args, 3)?;
    let shape = shape_arg(op, &args[0])?;
    let seed = seed_arg(op, &args[1])?;
    let dt = float_dtype(op, &args[2])?;
    let n = crate::shape::size(&shape) as u64;
    let bits = (0..n).map(|i| random_bits(seed, STREAM_UNIFORM, i));
    let t = match dt {
        DType::F32 => Tensor::from_vec(bits.map(unit_f32).collect(), &shape)?,
        _ => Tensor::from_vec(bits.map(unit_f64).collect(), &shape)?,
    };
    Ok(Value::Tensor(t))
}

/// `permutation(n, seed)`: a random permutation of `0..n` as i64.
pub fn permutation(_: &mut dyn Ctx, args: &[Value]) -> Result<Value, RtError> {
    let op = "permutation";
    arity(op, args, 2)?;
    let n = int(op, &args[0], "n")?;
    let n = usize::try_from(n).map_err(|_| RtError::new(format!("{op}: invalid length {n}")))?;
    crate::shape::check_alloc(op, n).map_err(RtError::new)?;
    let seed = seed_arg(op, &args[1])?;
    let mut p: Vec<i64> = (0..n as i64).collect();
    for i in (1..n).rev() {
        let bits = random_bits(seed, STREAM_PERMUTATION, i as u64);
        let j = ((bits as u128 * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    Ok(Value::Tensor(Tensor::vector(p)))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, call_err, f32s, f64s, i64s, shape_of, v};
    use super::*;

    fn lit(xs: &[i64]) -> Value {
        v(Tensor::vector(xs.to_vec()).with_weak(true))
    }

    fn seed(s: i64) -> Value {
        v(Tensor::weak_i64(s))
    }

    #[test]
    fn known_values() {
        // Pinned so that a change of the generator is noticed: these numbers
        // must be the same on every machine.
        assert_eq!(mix64(0), 0);
        assert_eq!(random_bits(0, 0, 0), 0xE220_A839_7B1D_CDAF);
        let u = f64s(&call(
            "rand",
            &[lit(&[3]), seed(42), Value::DType(DType::F64)],
        ));
        let again = f64s(&call(
            "rand",
            &[lit(&[3]), seed(42), Value::DType(DType::F64)],
        ));
        assert_eq!(u, again);
        assert!(u.iter().all(|x| (0.0..1.0).contains(x)));
        let other = f64s(&call(
            "rand",
            &[lit(&[3]), seed(43), Value::DType(DType::F64)],
        ));
        assert_ne!(u, other);
    }

    #[test]
    fn normal_statistics() {
        let r = call("randn", &[lit(&[100, 100]), seed(7), Value::unit()]);
        assert_eq!(shape_of(&r), vec![100, 100]);
        let x = f32s(&r);
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
        // The same element does not depend on the shape it is drawn in.
        let small = f32s(&call("randn", &[lit(&[5]), seed(7), Value::unit()]));
        assert_eq!(&small[..], &x[..5]);
    }

    #[test]
    fn uniform_statistics() {
        let x = f32s(&call("rand", &[lit(&[10000]), seed(1), Value::unit()]));
        assert!(x.iter().all(|v| (0.0..1.0).contains(v)));
        let mean = x.iter().sum::<f32>() / x.len() as f32;
        assert!((mean - 0.5).abs() < 0.02);
        assert!(
            call_err("rand", &[lit(&[2]), seed(1), Value::DType(DType::I64)])
                .contains("float dtype")
        );
    }

    #[test]
    fn permutations() {
        let p = i64s(&call("permutation", &[v(Tensor::weak_i64(10)), seed(3)]));
        let mut s = p.clone();
        s.sort_unstable();
        assert_eq!(s, (0..10).collect::<Vec<i64>>());
        assert_ne!(p, (0..10).collect::<Vec<i64>>());
        assert_eq!(
            p,
            i64s(&call("permutation", &[v(Tensor::weak_i64(10)), seed(3)]))
        );
        assert_eq!(
            i64s(&call(
                "permutation",
                &[v(Tensor::weak_i64(0)), Value::unit()]
            )),
            Vec::<i64>::new()
        );
    }
}
