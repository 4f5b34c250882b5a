//! The fused map kernel `y = tanh(2x + 1) * sigmoid(x) - x / 3` on 16M
//! f32 elements: the Cranelift kernel on 1 and 2 threads against plain Rust
//! loops. Prints the median of several runs as a table.
//!
//! Run with `cargo bench -p adjoint-compiler --bench map_kernel`
//! (`-- N` sets the element count, default 16M).

use std::time::{Duration, Instant};

use adjoint_compiler::codegen::cpu::{compile, compile_with, CompileOptions, CompiledKernel};
use adjoint_compiler::codegen::kernel::{
    BinaryOp, BodyBuilder, InputSpec, KDType, KernelSpec, UnaryOp,
};
use rayon::prelude::*;

fn spec(n: usize) -> KernelSpec {
    let mut b = BodyBuilder::new();
    let x = b.input(0);
    let two = b.constant(2.0);
    let one = b.constant(1.0);
    let three = b.constant(3.0);
    let t = b.binary(BinaryOp::Mul, two, x);
    let t = b.binary(BinaryOp::Add, t, one);
    let t = b.unary(UnaryOp::Tanh, t);
    let s = b.unary(UnaryOp::Sigmoid, x);
    let p = b.binary(BinaryOp::Mul, t, s);
    let q = b.binary(BinaryOp::Div, x, three);
    let y = b.binary(BinaryOp::Sub, p, q);
    KernelSpec {
        dtype: KDType::F32,
        shape: vec![n],
        inputs: vec![InputSpec::contiguous(&[n])],
        body: b.body,
        outputs: vec![y],
        reduce: None,
    }
}

fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn plain(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = (2.0 * x + 1.0).tanh() * sigmoid(x) - x / 3.0;
    }
}

/// The median and the minimum of `reps` timed runs after a warm-up.
fn time(mut f: impl FnMut(), reps: usize) -> (Duration, Duration) {
    f();
    let mut t: Vec<Duration> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .collect();
    t.sort();
    (t[reps / 2], t[0])
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(16 << 20);
    let reps = 11;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i as u64 * 2_654_435_761) % 20_000) as f32 / 1000.0 - 10.0)
        .collect();
    let mut y = vec![0.0f32; n];
    let mut want = vec![0.0f32; n];

    let spec = spec(n);
    let kernel: CompiledKernel = compile(&spec).unwrap();
    println!(
        "kernel: y = tanh(2x+1) * sigmoid(x) - x/3, f32, n = {n}; compiled in {:.3} ms, {} bytes of code, unroll {}, fma {}",
        kernel.compile_time().as_secs_f64() * 1e3,
        kernel.code_size(),
        kernel.unroll(),
        kernel.uses_fma()
    );

    let mut rows: Vec<(String, (Duration, Duration))> = Vec::new();
    rows.push((
        "plain Rust loop, 1 thread".into(),
        time(|| plain(&x, &mut want), reps),
    ));
    let p2 = pool(2);
    rows.push((
        "plain Rust loop, rayon 2 threads".into(),
        time(
            || {
                p2.install(|| {
                    want.par_chunks_mut(1 << 16)
                        .zip(x.par_chunks(1 << 16))
                        .for_each(|(y, x)| plain(x, y))
                })
            },
            reps,
        ),
    ));
    let p1 = pool(1);
    rows.push((
        "Cranelift kernel, 1 thread".into(),
        time(
            || p1.install(|| kernel.run(&[&x[..]], &mut [&mut y[..]]).unwrap()),
            reps,
        ),
    ));
    for unroll in [2, 4] {
        let k = compile_with(
            &spec,
            &CompileOptions {
                unroll: Some(unroll),
                ..Default::default()
            },
        )
        .unwrap();
        rows.push((
            format!("Cranelift kernel, unroll {unroll}, 1 thread"),
            time(
                || p1.install(|| k.run(&[&x[..]], &mut [&mut y[..]]).unwrap()),
                reps,
            ),
        ));
    }
    let max_err = y
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    rows.push((
        "Cranelift kernel, 2 threads".into(),
        time(
            || p2.install(|| kernel.run(&[&x[..]], &mut [&mut y[..]]).unwrap()),
            reps,
        ),
    ));

    let bytes = (2 * n * 4) as f64;
    println!();
    println!("| variant | median ms | min ms | GB/s (median) | Gelem/s (median) |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, (med, min)) in &rows {
        let s = med.as_secs_f64();
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.3} |",
            s * 1e3,
            min.as_secs_f64() * 1e3,
            bytes / s / 1e9,
            n as f64 / s / 1e9
        );
    }
    println!();
    println!("max |kernel - plain loop| = {max_err:e}");
}
