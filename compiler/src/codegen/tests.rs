//! Tests of the CPU back end against [`KernelSpec::eval_reference`] and
//! against Rust's libm-backed functions.

use std::sync::Arc;

use super::cpu::{
    cache_len, compile, compile_cached, compile_with, CodegenError, CompileOptions, CompiledKernel,
    KernelElem, Parallelism,
};
use super::kernel::*;

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// `±10^u` with `u` uniform in `[lo, hi]`.
    fn log_uniform(&mut self, lo: f64, hi: f64, signed: bool) -> f64 {
        let m = 10f64.powf(self.uniform(lo, hi));
        if signed && self.next() & 1 == 1 {
            -m
        } else {
            m
        }
    }
}

/// Edge values of a dtype.
fn edges(dt: KDType) -> Vec<f64> {
    let mut v = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -3.0,
        1e-30,
        -1e-30,
        88.0,
        -88.0,
        100.0,
        -100.0,
        700.0,
        -740.0,
        1e30,
        -1e30,
    ];
    match dt {
        KDType::F32 => v.extend([
            f32::MAX as f64,
            f32::MIN as f64,
            f32::MIN_POSITIVE as f64,
            1e-40, // subnormal
            -1e-40,
            f32::from_bits(1) as f64,
        ]),
        KDType::F64 => v.extend([
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            1e-310,
            -1e-310,
            f64::from_bits(1),
        ]),
    }
    v
}

/// `n` values: edges, uniform in [-10, 10], log-uniform over the range, and
/// random bit patterns; rounded to the dtype.
fn values(rng: &mut Rng, dt: KDType, n: usize) -> Vec<f64> {
    let e = edges(dt);
    (0..n)
        .map(|k| {
            let x = match k % 4 {
                _ if k < e.len() => e[k],
                0 => rng.uniform(-10.0, 10.0),
                1 => rng.log_uniform(-40.0, 40.0, true),
                2 => match dt {
                    KDType::F32 => f32::from_bits(rng.next() as u32) as f64,
                    KDType::F64 => f64::from_bits(rng.next()),
                },
                _ => rng.uniform(-2.0, 2.0),
            };
            round(dt, x)
        })
        .collect()
}

fn round(dt: KDType, x: f64) -> f64 {
    match dt {
        KDType::F32 => x as f32 as f64,
        KDType::F64 => x,
    }
}

/// Distance in units in the last place (both NaN: 0; -0 and 0: 0).
fn ulps(dt: KDType, a: f64, b: f64) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    let ord = |x: f64| -> i128 {
        match dt {
            KDType::F32 => {
                let b = (x as f32).to_bits() as i32;
                (if b < 0 { i32::MIN - b } else { b }) as i128
            }
            KDType::F64 => {
                let b = x.to_bits() as i64;
                (if b < 0 { i64::MIN - b } else { b }) as i128
            }
        }
    };
    (ord(a) - ord(b)).unsigned_abs().min(u64::MAX as u128) as u64
}

/// Bitwise equality, any NaN equal to any NaN.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Runs a compiled kernel on f64 data converted to its dtype.
fn run(k: &CompiledKernel, inputs: &[Vec<f64>], par: Parallelism) -> Vec<Vec<f64>> {
    fn go<T: KernelElem + Into<f64>>(
        k: &CompiledKernel,
        inputs: &[Vec<f64>],
        par: Parallelism,
    ) -> Vec<Vec<f64>> {
        let ins: Vec<Vec<T>> = inputs
            .iter()
            .map(|x| x.iter().map(|&v| T::from_f64(v)).collect())
            .collect();
        let in_refs: Vec<&[T]> = ins.iter().map(|x| &x[..]).collect();
        let mut outs: Vec<Vec<T>> = (0..k.spec().outputs.len())
            .map(|j| vec![T::from_f64(-7.0); k.spec().output_len_of(j)])
            .collect();
        let mut out_refs: Vec<&mut [T]> = outs.iter_mut().map(|y| &mut y[..]).collect();
        k.run_with(&in_refs, &mut out_refs, par).unwrap();
        outs.into_iter()
            .map(|y| y.into_iter().map(Into::into).collect())
            .collect()
    }
    match k.spec().dtype {
        KDType::F32 => go::<f32>(k, inputs, par),
        KDType::F64 => go::<f64>(k, inputs, par),
    }
}

fn unary_spec(op: UnaryOp, dt: KDType, n: usize) -> KernelSpec {
    KernelSpec {
        dtype: dt,
        shape: vec![n],
        inputs: vec![InputSpec::contiguous(&[n])],
        body: vec![KExpr::Input(0), KExpr::Unary(op, KId(0))],
        outputs: vec![KId(1)],
        reduce: None,
    }
}

/// The maximum ulp error of a polynomial operation, and whether other
/// operations must be bit-exact.
fn ulp_bound(op: UnaryOp) -> u64 {
    match op {
        UnaryOp::Exp | UnaryOp::Log => 2,
        UnaryOp::Log1p | UnaryOp::Tanh | UnaryOp::Sigmoid => 4,
        _ => 0,
    }
}

const DTYPES: [KDType; 2] = [KDType::F32, KDType::F64];

#[test]
fn codegen_unary_ops_match_reference() {
    let mut rng = Rng(1);
    for dt in DTYPES {
        for &op in UnaryOp::all() {
            // 1037: unrolled vector loop, single vectors and a scalar tail.
            let n = 1037;
            let spec = unary_spec(op, dt, n);
            let k = compile(&spec).unwrap();
            assert!(k.is_flat() && k.is_vectorized());
            let x = values(&mut rng, dt, n);
            let want = spec.eval_reference(&[&x]);
            let got = run(&k, std::slice::from_ref(&x), Parallelism::Serial);
            let bound = ulp_bound(op);
            for i in 0..n {
                let (g, w) = (got[0][i], want[0][i]);
                let ok = if bound == 0 {
                    same(g, w)
                } else {
                    ulps(dt, g, w) <= bound
                };
                assert!(ok, "{op} {dt:?} at x = {:e}: got {g:e}, want {w:e}", x[i]);
            }
        }
    }
}

fn binary_spec(
    op: BinaryOp,
    dt: KDType,
    shape: &[usize],
    a: InputSpec,
    b: InputSpec,
) -> KernelSpec {
    KernelSpec {
        dtype: dt,
        shape: shape.to_vec(),
        inputs: vec![a, b],
        body: vec![
            KExpr::Input(0),
            KExpr::Input(1),
            KExpr::Binary(op, KId(0), KId(1)),
        ],
        outputs: vec![KId(2)],
        reduce: None,
    }
}

fn check_exact(spec: &KernelSpec, inputs: &[Vec<f64>], what: &str) {
    let k = compile(spec).unwrap();
    let refs: Vec<&[f64]> = inputs.iter().map(|x| &x[..]).collect();
    let want = spec.eval_reference(&refs);
    let got = run(&k, inputs, Parallelism::Serial);
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        for i in 0..g.len() {
            assert!(
                same(g[i], w[i]),
                "{what}: output {o} element {i}: got {:e}, want {:e}",
                g[i],
                w[i]
            );
        }
    }
}

#[test]
fn codegen_binary_ops_match_reference() {
    let mut rng = Rng(2);
    for dt in DTYPES {
        for &op in BinaryOp::ALL {
            let n = 523;
            let mut a = values(&mut rng, dt, n);
            let mut b = values(&mut rng, dt, n);
            // Equal operands, and every edge against every edge.
            for i in 0..50 {
                b[i * 3] = a[i * 3];
            }
            let e = edges(dt);
            for (i, &x) in e.iter().enumerate() {
                for (j, &y) in e.iter().enumerate() {
                    let k = 100 + (i * e.len() + j) % 400;
                    a[k] = x;
                    b[k] = y;
                }
            }
            let c = || InputSpec::contiguous(&[n]);
            let spec = binary_spec(op, dt, &[n], c(), c());
            check_exact(&spec, &[a.clone(), b.clone()], &format!("{op} {dt:?}"));
            // Scalar on either side.
            for &s in &[f64::NAN, 0.0, -0.0, 2.5, f64::INFINITY] {
                let spec = binary_spec(op, dt, &[n], c(), InputSpec::scalar(1));
                check_exact(&spec, &[a.clone(), vec![s]], &format!("{op} {dt:?} x,{s}"));
                let spec = binary_spec(op, dt, &[n], InputSpec::scalar(1), c());
                check_exact(&spec, &[vec![s], b.clone()], &format!("{op} {dt:?} {s},x"));
            }
        }
    }
}

#[test]
fn codegen_select_and_masks() {
    // select(x < y, exp(x), select(x, y, -x)) and relu/sign edge cases.
    let mut rng = Rng(3);
    for dt in DTYPES {
        let n = 301;
        let mut bb = BodyBuilder::new();
        let x = bb.input(0);
        let y = bb.input(1);
        let lt = bb.binary(BinaryOp::Lt, x, y);
        let ex = bb.unary(UnaryOp::Abs, x);
        let nx = bb.unary(UnaryOp::Neg, x);
        let inner = bb.select(x, y, nx);
        let out = bb.select(lt, ex, inner);
        let ge = bb.binary(BinaryOp::Ge, x, y);
        let spec = KernelSpec {
            dtype: dt,
            shape: vec![n],
            inputs: vec![InputSpec::contiguous(&[n]); 2],
            body: bb.body,
            outputs: vec![out, ge, lt],
            reduce: None,
        };
        let a = values(&mut rng, dt, n);
        let b = values(&mut rng, dt, n);
        check_exact(&spec, &[a, b], &format!("select {dt:?}"));
    }
}

#[test]
fn codegen_broadcast_patterns() {
    let mut rng = Rng(4);
    let shape = [5usize, 7, 9];
    // (buffer shape, strides)
    let patterns: Vec<(usize, Vec<isize>)> = vec![
        (315, vec![63, 9, 1]),   // contiguous
        (9, vec![0, 0, 1]),      // row vector
        (5, vec![1, 0, 0]),      // [5, 1, 1]
        (7, vec![0, 1, 0]),      // [1, 7, 1]
        (315, vec![1, 5, 35]),   // transposed [9, 7, 5]
        (1, vec![0, 0, 0]),      // scalar
        (63, vec![0, 9, 1]),     // [1, 7, 9]
        (45, vec![9, 0, 1]),     // [5, 1, 9]
        (630, vec![126, 18, 2]), // every other element
    ];
    for dt in DTYPES {
        for (pa, (na, sa)) in patterns.iter().enumerate() {
            for (pb, (nb, sb)) in patterns.iter().enumerate() {
                let mut bb = BodyBuilder::new();
                let x = bb.input(0);
                let y = bb.input(1);
                let s = bb.binary(BinaryOp::Mul, x, y);
                let c = bb.constant(0.25);
                let t = bb.binary(BinaryOp::Sub, s, c);
                let m = bb.binary(BinaryOp::Maximum, t, x);
                let spec = KernelSpec {
                    dtype: dt,
                    shape: shape.to_vec(),
                    inputs: vec![
                        InputSpec {
                            strides: sa.clone(),
                        },
                        InputSpec {
                            strides: sb.clone(),
                        },
                    ],
                    body: bb.body,
                    outputs: vec![m, t],
                    reduce: None,
                };
                let a: Vec<f64> = (0..*na)
                    .map(|_| round(dt, rng.uniform(-3.0, 3.0)))
                    .collect();
                let b: Vec<f64> = (0..*nb)
                    .map(|_| round(dt, rng.uniform(-3.0, 3.0)))
                    .collect();
                check_exact(&spec, &[a, b], &format!("{dt:?} patterns {pa} {pb}"));
            }
        }
    }
}

#[test]
fn codegen_scalar_and_empty_kernels() {
    // A rank-0 kernel.
    let spec = KernelSpec {
        dtype: KDType::F64,
        shape: vec![],
        inputs: vec![InputSpec::scalar(0)],
        body: vec![KExpr::Input(0), KExpr::Unary(UnaryOp::Exp, KId(0))],
        outputs: vec![KId(1)],
        reduce: None,
    };
    check_exact(&spec, &[vec![1.5]], "rank 0");
    // Empty map and empty reductions.
    for op in ReduceOp::ALL {
        let spec = KernelSpec {
            dtype: KDType::F32,
            shape: vec![3, 0],
            inputs: vec![InputSpec::contiguous(&[3, 0])],
            body: vec![KExpr::Input(0)],
            outputs: vec![KId(0)],
            reduce: Some(ReduceSpec {
                op: *op,
                axes: vec![1],
                keepdims: false,
            }),
        };
        let k = compile(&spec).unwrap();
        let got = run(&k, &[vec![]], Parallelism::Auto);
        assert_eq!(got, vec![vec![op.identity(); 3]]);
    }
    let spec = unary_spec(UnaryOp::Exp, KDType::F32, 0);
    let k = compile(&spec).unwrap();
    assert_eq!(
        run(&k, &[vec![]], Parallelism::Auto),
        vec![Vec::<f64>::new()]
    );
}

fn reduce_spec(
    dt: KDType,
    shape: &[usize],
    op: ReduceOp,
    axes: &[usize],
    keepdims: bool,
) -> KernelSpec {
    // prod: 1 + x / 64 keeps products finite; others: |x| * 0.25 - 1. (Exact
    // operations, so max and min must match the reference exactly.)
    let mut bb = BodyBuilder::new();
    let x = bb.input(0);
    let out = if op == ReduceOp::Prod {
        let c = bb.constant(1.0 / 64.0);
        let s = bb.binary(BinaryOp::Mul, x, c);
        let one = bb.constant(1.0);
        bb.binary(BinaryOp::Add, s, one)
    } else {
        let a = bb.unary(UnaryOp::Abs, x);
        let c = bb.constant(0.25);
        let s = bb.binary(BinaryOp::Mul, a, c);
        let one = bb.constant(1.0);
        bb.binary(BinaryOp::Sub, s, one)
    };
    KernelSpec {
        dtype: dt,
        shape: shape.to_vec(),
        inputs: vec![InputSpec::contiguous(shape)],
        body: bb.body,
        outputs: vec![out],
        reduce: Some(ReduceSpec {
            op,
            axes: axes.to_vec(),
            keepdims,
        }),
    }
}

fn axes_sets(nd: usize) -> Vec<Vec<usize>> {
    (1..1u32 << nd)
        .map(|m| (0..nd).filter(|d| m & (1 << d) != 0).collect())
        .collect()
}

/// Compares a reduction with the reference: max/min exactly (up to the
/// sign of zero), sums and products relative to the sum of magnitudes.
fn check_reduce(spec: &KernelSpec, x: &[f64], got: &[f64], what: &str) {
    let want = &spec.eval_reference(&[x])[0];
    assert_eq!(got.len(), want.len(), "{what}");
    let r = spec.reduce.as_ref().unwrap();
    let n: usize = r.axes.iter().map(|&a| spec.shape[a]).product();
    let eps = match spec.dtype {
        KDType::F32 => f32::EPSILON as f64,
        KDType::F64 => f64::EPSILON,
    };
    for i in 0..got.len() {
        let (g, w) = (got[i], want[i]);
        let ok = match r.op {
            ReduceOp::Max | ReduceOp::Min => g == w || (g.is_nan() && w.is_nan()),
            // Elements are at most 1.5 in magnitude.
            ReduceOp::Sum => (g - w).abs() <= 4.0 * eps * n as f64 * 1.5,
            ReduceOp::Prod => g == w || ((g - w) / w).abs() <= 4.0 * eps * n as f64,
        };
        assert!(ok, "{what}: output {i}: got {g:e}, want {w:e}");
    }
}

#[test]
fn codegen_reductions_match_reference() {
    let mut rng = Rng(5);
    for dt in DTYPES {
        for shape in [vec![6usize, 37, 11], vec![3, 1, 64], vec![130]] {
            let nd = shape.len();
            let n: usize = shape.iter().product();
            for op in ReduceOp::ALL {
                for axes in axes_sets(nd) {
                    for keepdims in [false, true] {
                        let spec = reduce_spec(dt, &shape, *op, &axes, keepdims);
                        let mut x: Vec<f64> = (0..n)
                            .map(|_| round(dt, rng.uniform(-10.0, 10.0)))
                            .collect();
                        if n > 100 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
                            x[n / 2] = f64::NAN;
                        }
                        let k = compile(&spec).unwrap();
                        let got = run(&k, std::slice::from_ref(&x), Parallelism::Serial);
                        let what =
                            format!("{op} {dt:?} {shape:?} axes {axes:?} keepdims {keepdims}");
                        check_reduce(&spec, &x, &got[0], &what);
                    }
                }
            }
        }
    }
}

#[test]
fn codegen_reductions_with_side_outputs() {
    // The reduction also writes, unreduced, the value it reduces and the
    // input it read: exactly the reference's values, whatever the loop
    // order, vectorisation and split across threads.
    let mut rng = Rng(11);
    for dt in DTYPES {
        for shape in [vec![6usize, 37, 11], vec![3, 1, 64], vec![50, 40, 20]] {
            let n: usize = shape.iter().product();
            for op in ReduceOp::ALL {
                for axes in axes_sets(shape.len()) {
                    let mut spec = reduce_spec(dt, &shape, *op, &axes, false);
                    if spec.output_len() == 1 {
                        spec.outputs.push(KId(0));
                        assert!(spec.validate().is_err(), "one element, side outputs");
                        continue;
                    }
                    let reduced = spec.outputs[0];
                    spec.outputs.extend([reduced, KId(0)]);
                    let x: Vec<f64> = (0..n)
                        .map(|_| round(dt, rng.uniform(-10.0, 10.0)))
                        .collect();
                    let want = spec.eval_reference(&[&x]);
                    assert_eq!(want.len(), 3);
                    let k = compile(&spec).unwrap();
                    let what = format!("{op} {dt:?} {shape:?} axes {axes:?}");
                    for par in [
                        Parallelism::Serial,
                        Parallelism::Chunks(3),
                        Parallelism::Auto,
                    ] {
                        let got = run(&k, std::slice::from_ref(&x), par);
                        check_reduce(&spec, &x, &got[0], &what);
                        for j in [1, 2] {
                            assert_eq!(got[j].len(), n, "{what}");
                            assert!(
                                got[j].iter().zip(&want[j]).all(|(a, b)| same(*a, *b)),
                                "{what}: side output {j} ({par:?})"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn codegen_reductions_with_broadcast_inputs() {
    // sum over axis 1 of x[4, 50] * w[50] + b[4, 1].
    let mut rng = Rng(6);
    for dt in DTYPES {
        for axes in axes_sets(2) {
            let mut bb = BodyBuilder::new();
            let x = bb.input(0);
            let w = bb.input(1);
            let b = bb.input(2);
            let p = bb.binary(BinaryOp::Mul, x, w);
            let s = bb.binary(BinaryOp::Add, p, b);
            let spec = KernelSpec {
                dtype: dt,
                shape: vec![4, 50],
                inputs: vec![
                    InputSpec::contiguous(&[4, 50]),
                    InputSpec::broadcast(&[50], &[4, 50]).unwrap(),
                    InputSpec::broadcast(&[4, 1], &[4, 50]).unwrap(),
                ],
                body: bb.body,
                outputs: vec![s],
                reduce: Some(ReduceSpec {
                    op: ReduceOp::Sum,
                    axes: axes.clone(),
                    keepdims: false,
                }),
            };
            let gen = |rng: &mut Rng, n: usize| -> Vec<f64> {
                (0..n).map(|_| round(dt, rng.uniform(-1.0, 1.0))).collect()
            };
            let xs = [gen(&mut rng, 200), gen(&mut rng, 50), gen(&mut rng, 4)];
            let refs: Vec<&[f64]> = xs.iter().map(|v| &v[..]).collect();
            let want = &spec.eval_reference(&refs)[0];
            let k = compile(&spec).unwrap();
            let got = &run(&k, &xs, Parallelism::Serial)[0];
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-4, "{dt:?} {axes:?}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn codegen_threads_do_not_change_results() {
    let mut rng = Rng(7);
    for dt in DTYPES {
        let shape = vec![64usize, 1031];
        let n: usize = shape.iter().product();
        let x: Vec<f64> = (0..n)
            .map(|_| round(dt, rng.uniform(-10.0, 10.0)))
            .collect();
        let mut specs = vec![];
        // The benchmark's map.
        specs.push(bench_spec(dt, n));
        for axes in axes_sets(2) {
            for op in ReduceOp::ALL {
                specs.push(reduce_spec(dt, &shape, *op, &axes, false));
            }
        }
        for spec in &specs {
            let k = compile(spec).unwrap();
            let inputs = std::slice::from_ref(&x);
            let serial = run(&k, inputs, Parallelism::Serial);
            if spec.reduce.is_some() {
                check_reduce(spec, &x, &serial[0], &format!("{dt:?} {:?}", spec.reduce));
            }
            for chunks in [2, 3, 7, 64] {
                let par = run(&k, inputs, Parallelism::Chunks(chunks));
                assert!(
                    serial[0].iter().zip(&par[0]).all(|(a, b)| same(*a, *b)),
                    "{dt:?} {:?}: {chunks} chunks differ",
                    spec.reduce
                );
            }
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            let auto = pool.install(|| run(&k, inputs, Parallelism::Auto));
            assert!(serial[0].iter().zip(&auto[0]).all(|(a, b)| same(*a, *b)));
        }
    }
}

/// The benchmark's kernel.
pub(crate) fn bench_spec(dt: KDType, n: usize) -> KernelSpec {
    KernelSpec::tanh_sigmoid_map(dt, n)
}

#[test]
fn codegen_unroll_options_agree() {
    let mut rng = Rng(8);
    for dt in DTYPES {
        let n = 1000;
        let spec = bench_spec(dt, n);
        let x: Vec<f64> = (0..n)
            .map(|_| round(dt, rng.uniform(-10.0, 10.0)))
            .collect();
        let base = run(
            &compile(&spec).unwrap(),
            std::slice::from_ref(&x),
            Parallelism::Serial,
        );
        for unroll in 1..=4 {
            let k = compile_with(
                &spec,
                &CompileOptions {
                    unroll: Some(unroll),
                    ..Default::default()
                },
            )
            .unwrap();
            assert_eq!(k.unroll(), unroll);
            let got = run(&k, std::slice::from_ref(&x), Parallelism::Serial);
            assert!(base[0].iter().zip(&got[0]).all(|(a, b)| same(*a, *b)));
        }
    }
}

#[test]
fn codegen_cache_and_compile_time() {
    let spec = bench_spec(KDType::F32, 4096);
    let a = compile_cached(&spec).unwrap();
    let before = cache_len();
    // An equivalent spec with dead code and a duplicate constant.
    let mut other = spec.clone();
    other.body.push(KExpr::Const(2.0));
    let b = compile_cached(&other).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(cache_len(), before);
    let k = compile(&spec).unwrap();
    println!(
        "compiling y = tanh(2x+1)*sigmoid(x) - x/3 (f32): {:.3} ms, {} bytes of code",
        k.compile_time().as_secs_f64() * 1e3,
        k.code_size()
    );
    assert!(k.compile_time().as_secs_f64() < 1.0);
}

#[test]
fn codegen_disassembly_on_request() {
    let spec = bench_spec(KDType::F32, 64);
    let k = compile_with(
        &spec,
        &CompileOptions {
            disasm: true,
            ..Default::default()
        },
    )
    .unwrap();
    let text = k.disassembly().unwrap();
    assert!(text.contains("mulps"), "{text}");
    assert!(compile(&spec).unwrap().disassembly().is_none());
}

#[test]
fn codegen_run_checks_buffers() {
    let spec = unary_spec(UnaryOp::Exp, KDType::F32, 8);
    let k = compile(&spec).unwrap();
    let x = [0.0f32; 8];
    let mut y = vec![0.0f32; 8];
    let xd = [0.0f64; 8];
    let mut yd = [0.0f64; 8];
    assert!(matches!(
        k.run(&[&xd[..]], &mut [&mut yd[..]]),
        Err(CodegenError::DType { .. })
    ));
    assert!(matches!(
        k.run(&[&x[..4]], &mut [&mut y[..]]),
        Err(CodegenError::Buffers(_))
    ));
    assert!(matches!(
        k.run(&[&x[..]], &mut [&mut y[..7]]),
        Err(CodegenError::Buffers(_))
    ));
    assert!(matches!(
        k.run::<f32>(&[], &mut [&mut y[..]]),
        Err(CodegenError::Buffers(_))
    ));
    k.run(&[&x[..]], &mut [&mut y[..]]).unwrap();
    assert_eq!(y, vec![1.0; 8]);
    let mut bad = spec.clone();
    bad.outputs = vec![KId(9)];
    assert!(matches!(compile(&bad), Err(CodegenError::Spec(_))));
}

/// Samples for the accuracy table of `op`: its interesting domain.
fn domain(op: UnaryOp, dt: KDType, rng: &mut Rng) -> f64 {
    let f32 = dt == KDType::F32;
    let k = rng.next() % 4;
    let x = match op {
        UnaryOp::Exp => match k {
            0 | 1 => {
                if f32 {
                    rng.uniform(-104.0, 89.0)
                } else {
                    rng.uniform(-746.0, 710.0)
                }
            }
            2 => rng.uniform(-2.0, 2.0),
            _ => rng.log_uniform(-30.0, 0.0, true),
        },
        UnaryOp::Log => match k {
            0 => rng.uniform(0.5, 2.0),
            1 => rng.uniform(0.0, 100.0),
            _ => {
                if f32 {
                    rng.log_uniform(-45.0, 38.5, false)
                } else {
                    rng.log_uniform(-320.0, 308.0, false)
                }
            }
        },
        UnaryOp::Log1p => match k {
            0 => rng.uniform(-1.0, 1.0),
            1 => rng.log_uniform(-30.0, 0.0, true),
            2 => -rng.log_uniform(-30.0, 0.0, false) + 0.0,
            _ => rng.log_uniform(0.0, 30.0, false),
        },
        UnaryOp::Tanh => match k {
            0 => rng.uniform(-1.0, 1.0),
            1 => rng.uniform(-20.0, 20.0),
            _ => rng.log_uniform(-30.0, 1.5, true),
        },
        UnaryOp::Sigmoid => match k {
            0 => rng.uniform(-5.0, 5.0),
            1 => {
                if f32 {
                    rng.uniform(-104.0, 20.0)
                } else {
                    rng.uniform(-745.0, 40.0)
                }
            }
            _ => rng.log_uniform(-30.0, 2.0, true),
        },
        _ => unreachable!(),
    };
    let x = round(dt, x);
    if op == UnaryOp::Log1p && x < -1.0 {
        -1.0 + (x + 1.0).abs().min(0.5)
    } else {
        x
    }
}

/// The exact-ish value: f32 operations computed in f64 with Rust's libm
/// functions and rounded; f64 operations with Rust's f64 functions.
fn truth(op: UnaryOp, dt: KDType, x: f64) -> f64 {
    let sigmoid = |x: f64| {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            let e = x.exp();
            e / (1.0 + e)
        }
    };
    let y = match op {
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        _ => unreachable!(),
    };
    round(dt, y)
}

#[test]
fn codegen_math_accuracy_table() {
    // Maximum ulp error over 200k samples per function and dtype, against
    // Rust's libm (f32 results computed in f64 and rounded, so the f32
    // columns are errors against the correctly rounded value in practice).
    const BOUNDS: [(UnaryOp, u64, u64); 5] = [
        (UnaryOp::Exp, 1, 1),
        (UnaryOp::Log, 1, 1),
        (UnaryOp::Log1p, 2, 2),
        (UnaryOp::Tanh, 2, 2),
        (UnaryOp::Sigmoid, 2, 2),
    ];
    let mut rng = Rng(9);
    let n = 200_000;
    let mut table = String::from("op       fma   f32 max ulp  f64 max ulp\n");
    let mut failures = Vec::new();
    for (op, b32, b64) in BOUNDS {
        for fma in [false, true] {
            let mut row = format!("{:<8} {:<5}", op.name(), fma);
            for (dt, bound) in [(KDType::F32, b32), (KDType::F64, b64)] {
                let x: Vec<f64> = (0..n).map(|_| domain(op, dt, &mut rng)).collect();
                let options = CompileOptions {
                    fma: Some(fma),
                    ..Default::default()
                };
                let k = compile_with(&unary_spec(op, dt, n), &options).unwrap();
                let got = &run(&k, std::slice::from_ref(&x), Parallelism::Auto)[0];
                let mut worst = (0u64, 0.0f64);
                for (i, &g) in got.iter().enumerate() {
                    let u = ulps(dt, g, truth(op, dt, x[i]));
                    if u > worst.0 {
                        worst = (u, x[i]);
                    }
                }
                row += &format!(" {:>12}", worst.0);
                if worst.0 > bound {
                    failures.push(format!(
                        "{op} {dt:?} fma {fma}: {} ulp > {bound} at x = {:e} (got {:e}, want {:e})",
                        worst.0,
                        worst.1,
                        got[x
                            .iter()
                            .position(|&v| v.to_bits() == worst.1.to_bits())
                            .unwrap()],
                        truth(op, dt, worst.1)
                    ));
                }
            }
            table += &row;
            table.push('\n');
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn codegen_math_special_values() {
    let cases: &[(UnaryOp, f64, f64)] = &[
        (UnaryOp::Exp, f64::INFINITY, f64::INFINITY),
        (UnaryOp::Exp, f64::NEG_INFINITY, 0.0),
        (UnaryOp::Exp, 0.0, 1.0),
        (UnaryOp::Exp, 1000.0, f64::INFINITY),
        (UnaryOp::Exp, -1000.0, 0.0),
        (UnaryOp::Log, 0.0, f64::NEG_INFINITY),
        (UnaryOp::Log, -0.0, f64::NEG_INFINITY),
        (UnaryOp::Log, f64::INFINITY, f64::INFINITY),
        (UnaryOp::Log, 1.0, 0.0),
        (UnaryOp::Log1p, -1.0, f64::NEG_INFINITY),
        (UnaryOp::Log1p, f64::INFINITY, f64::INFINITY),
        (UnaryOp::Log1p, -0.0, -0.0),
        (UnaryOp::Tanh, f64::INFINITY, 1.0),
        (UnaryOp::Tanh, f64::NEG_INFINITY, -1.0),
        (UnaryOp::Tanh, -0.0, -0.0),
        (UnaryOp::Sigmoid, f64::INFINITY, 1.0),
        (UnaryOp::Sigmoid, f64::NEG_INFINITY, 0.0),
        (UnaryOp::Sigmoid, 0.0, 0.5),
    ];
    for dt in DTYPES {
        for &(op, x, want) in cases {
            let k = compile(&unary_spec(op, dt, 1)).unwrap();
            let got = run(&k, &[vec![x]], Parallelism::Serial)[0][0];
            assert!(same(got, want), "{op} {dt:?} {x}: got {got}, want {want}");
        }
        for op in [
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Log1p,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
        ] {
            let k = compile(&unary_spec(op, dt, 1)).unwrap();
            assert!(run(&k, &[vec![f64::NAN]], Parallelism::Serial)[0][0].is_nan());
        }
        for (op, x) in [
            (UnaryOp::Log, -1.0),
            (UnaryOp::Log1p, -2.0),
            (UnaryOp::Log, f64::NEG_INFINITY),
        ] {
            let k = compile(&unary_spec(op, dt, 1)).unwrap();
            assert!(run(&k, &[vec![x]], Parallelism::Serial)[0][0].is_nan());
        }
    }
}

/// An f32 sum of many elements stays near the accuracy of a pairwise sum:
/// blocks are short and their results are added in f64 (relative error
/// against the exact sum of the f32 inputs, for positive data where the
/// bound means something).
#[test]
fn codegen_f32_sums_are_accurate() {
    let mut rng = Rng(11);
    for n in [131_072usize, 1_000_003] {
        let x: Vec<f64> = (0..n)
            .map(|_| round(KDType::F32, rng.uniform(0.0, 1.0)))
            .collect();
        let mut bb = BodyBuilder::new();
        let i = bb.input(0);
        let spec = KernelSpec {
            dtype: KDType::F32,
            shape: vec![n],
            inputs: vec![InputSpec::contiguous(&[n])],
            body: bb.body,
            outputs: vec![i],
            reduce: Some(ReduceSpec {
                op: ReduceOp::Sum,
                axes: vec![0],
                keepdims: false,
            }),
        };
        let k = compile(&spec).unwrap();
        let exact: f64 = x.iter().sum();
        for par in [Parallelism::Serial, Parallelism::Auto] {
            let got = run(&k, std::slice::from_ref(&x), par)[0][0];
            let rel = ((got - exact) / exact).abs();
            // A sequential f32 sum of this data is off by about 1e-4.
            assert!(rel < 1e-7, "n = {n}: relative error {rel:e}");
        }
    }
}

/// `exp` scales in one product when every lane's exponent is normal (also
/// inside `tanh` and `sigmoid`): each value gives the same bits in a vector
/// that takes the shortcut, in one that does not (beside a lane whose
/// result is subnormal, or that needs `tanh`'s exponential), and in the
/// scalar tail, for every unroll.
#[test]
fn vector_shortcuts_give_the_same_bits() {
    let small = [0.3, -0.1, 1e-3, -0.0, 0.0, 0.6, -0.62, 2e-30];
    for op in [UnaryOp::Tanh, UnaryOp::Exp, UnaryOp::Sigmoid] {
        for dt in DTYPES {
            let lanes = if dt == KDType::F32 { 4 } else { 2 };
            // Each small value in an all-small group, then beside a large
            // one (a lane that needs the general path: |x| >= 0.625 for
            // tanh, an exponent below the normal range for exp), then in
            // the tail.
            let big = if op == UnaryOp::Exp { -740.0 } else { 5.0 };
            let mut x = Vec::new();
            for v in small {
                x.extend(std::iter::repeat_n(v, lanes));
                x.push(v);
                x.extend(std::iter::repeat_n(big, lanes - 1));
            }
            x.extend(small);
            // One more, so that the last element is in the scalar tail.
            x.push(small[0]);
            let n = x.len();
            for unroll in [1, 2, 4] {
                let options = CompileOptions {
                    unroll: Some(unroll),
                    ..Default::default()
                };
                let k = compile_with(&unary_spec(op, dt, n), &options).unwrap();
                let y = &run(&k, std::slice::from_ref(&x), Parallelism::Serial)[0];
                let tail = n - 1 - small.len();
                assert_eq!(
                    y[n - 1].to_bits(),
                    y[0].to_bits(),
                    "{op:?} {dt:?} scalar tail"
                );
                for (i, v) in small.iter().enumerate() {
                    let at = i * 2 * lanes;
                    let want = y[at].to_bits();
                    for j in [at + 1, at + lanes, tail + i] {
                        assert_eq!(
                            y[j].to_bits(),
                            want,
                            "{op:?} {dt:?} unroll {unroll} x = {v}"
                        );
                    }
                }
            }
        }
    }
}

/// Kernels whose innermost loop runs in chunks around the 256-bit
/// routines give the same bits as the 128-bit code, for the routines'
/// functions alone (over edge values, wide ranges and random bit patterns)
/// and inside bodies that cut into several stages: a routine of a
/// routine's result, a routine of a broadcast or strided input, several
/// outputs, a select on a mask, outputs computed before the last stage.
#[test]
fn avx2_chunks_give_the_same_bits() {
    let on = CompileOptions {
        avx2: Some(true),
        ..Default::default()
    };
    let off = CompileOptions {
        avx2: Some(false),
        ..Default::default()
    };
    if !compile_with(&bench_spec(KDType::F32, 64), &on)
        .unwrap()
        .uses_avx2()
    {
        println!("skipped: this host has no AVX2 and FMA");
        return;
    }
    let mut rng = Rng(12);
    let compare = |spec: &KernelSpec, inputs: &[Vec<f64>], what: &str| {
        let a = compile_with(spec, &on).unwrap();
        let b = compile_with(spec, &off).unwrap();
        assert!(a.uses_avx2(), "{what}: not chunked");
        assert!(!b.uses_avx2());
        for par in [Parallelism::Serial, Parallelism::Chunks(3)] {
            let ya = run(&a, inputs, par);
            let yb = run(&b, inputs, par);
            for (o, (ya, yb)) in ya.iter().zip(&yb).enumerate() {
                for (i, (p, q)) in ya.iter().zip(yb).enumerate() {
                    assert!(
                        same(*p, *q),
                        "{what} output {o} [{i}]: {p:e} (chunked) vs {q:e}"
                    );
                }
            }
        }
    };
    for dt in DTYPES {
        for op in [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid] {
            if dt == KDType::F64 && op == UnaryOp::Tanh {
                continue; // no f64 routine
            }
            let n = 300_007;
            let mut x = values(&mut rng, dt, n);
            for k in 0..n / 3 {
                x[3 * k + 1] = domain(op, dt, &mut rng);
            }
            compare(&unary_spec(op, dt, n), &[x], &format!("{op} {dt:?}"));
        }
        for n in [16, 17, 31, 513, 1037, 5000] {
            let x: Vec<f64> = (0..n)
                .map(|_| round(dt, rng.uniform(-12.0, 12.0)))
                .collect();
            compare(&bench_spec(dt, n), &[x], &format!("bench {dt:?} n={n}"));
        }
        // Two-dimensional, with a row-broadcast input (read in place by a
        // routine) and a column-broadcast one (constant along the row,
        // copied to a buffer for its routine).
        let (r, c) = (7, 300);
        let mut b = BodyBuilder::new();
        let x = b.input(0);
        let row = b.input(1);
        let col = b.input(2);
        let e = b.unary(UnaryOp::Exp, x);
        let t = b.unary(UnaryOp::Sigmoid, e); // a routine of a routine
        let s = b.unary(UnaryOp::Sigmoid, col); // of a broadcast input
        let u = b.unary(UnaryOp::Exp, row);
        let m = b.binary(BinaryOp::Gt, x, col);
        let sel = b.select(m, t, s); // a mask from stage 0, read in stage 2
        let early = b.binary(BinaryOp::Mul, x, col); // an output of stage 0
        let y = b.binary(BinaryOp::Add, sel, u);
        let spec = KernelSpec {
            dtype: dt,
            shape: vec![r, c],
            inputs: vec![
                InputSpec::contiguous(&[r, c]),
                InputSpec {
                    strides: vec![0, 1],
                },
                InputSpec {
                    strides: vec![1, 0],
                },
            ],
            body: b.body,
            outputs: vec![y, early, e],
            reduce: None,
        };
        let gen = |rng: &mut Rng, n: usize| -> Vec<f64> {
            (0..n).map(|_| round(dt, rng.uniform(-6.0, 6.0))).collect()
        };
        let inputs = vec![gen(&mut rng, r * c), gen(&mut rng, c), gen(&mut rng, r)];
        compare(&spec, &inputs, &format!("staged {dt:?}"));
    }
}
