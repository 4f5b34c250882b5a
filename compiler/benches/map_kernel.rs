//! The fused map kernel `y = tanh(2x + 1) * sigmoid(x) - x / 3` on 16M
//! f32 elements: the Cranelift kernel on 1 and 2 threads, with and without
//! the 256-bit routines, against plain Rust loops, and the kernel's parts
//! alone. Prints the median of several runs as a table.
//!
//! Run with `cargo bench -p adjoint-compiler --bench map_kernel`
//! (`-- N` sets the element count, default 16M).

use std::time::{Duration, Instant};

use adjoint_compiler::codegen::cpu::{
    compile, compile_with, CompileOptions, CompiledKernel, Parallelism,
};
use adjoint_compiler::codegen::kernel::{BinaryOp, BodyBuilder, KDType, KId, KernelSpec, UnaryOp};
use rayon::prelude::*;

fn spec(n: usize) -> KernelSpec {
    KernelSpec::tanh_sigmoid_map(KDType::F32, n)
}

/// Parts of the kernel, each alone.
fn parts(n: usize) -> Vec<(&'static str, KernelSpec)> {
    let one = |f: &dyn Fn(&mut BodyBuilder, KId) -> KId| {
        let mut b = BodyBuilder::new();
        let x = b.input(0);
        let y = f(&mut b, x);
        KernelSpec::map_1d(KDType::F32, n, b.body, vec![y])
    };
    vec![
        ("tanh(x)", one(&|b, x| b.unary(UnaryOp::Tanh, x))),
        ("sigmoid(x)", one(&|b, x| b.unary(UnaryOp::Sigmoid, x))),
        (
            "x / 3",
            one(&|b, x| {
                let c = b.constant(3.0);
                b.binary(BinaryOp::Div, x, c)
            }),
        ),
        (
            "2x + 1",
            one(&|b, x| {
                let two = b.constant(2.0);
                let one = b.constant(1.0);
                let t = b.binary(BinaryOp::Mul, two, x);
                b.binary(BinaryOp::Add, t, one)
            }),
        ),
    ]
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
    let reps = 15;
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
    let narrow = compile_with(
        &spec,
        &CompileOptions {
            avx2: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    let mut y2 = vec![0.0f32; n];
    for (label, k, pool) in [
        ("", &kernel, &p1),
        (", 128-bit only", &narrow, &p1),
        ("", &kernel, &p2),
        (", 128-bit only", &narrow, &p2),
    ] {
        let threads = pool.current_num_threads();
        let name = if k.uses_avx2() {
            format!("Cranelift kernel with 256-bit routines{label}, {threads} thread(s)")
        } else {
            format!("Cranelift kernel{label}, {threads} thread(s)")
        };
        let out = if k.uses_avx2() { &mut y } else { &mut y2 };
        rows.push((
            name,
            time(
                || pool.install(|| k.run(&[&x[..]], &mut [&mut out[..]]).unwrap()),
                reps,
            ),
        ));
    }
    // How finely the work is split over 2 threads: the counts alternate
    // within each round, so that a slow spell of the machine falls on all.
    let splits = [2usize, 8, 32, 128];
    let mut split_times: Vec<Vec<Duration>> = vec![Vec::new(); splits.len()];
    for _ in 0..reps {
        for (i, &c) in splits.iter().enumerate() {
            let t0 = Instant::now();
            p2.install(|| {
                kernel
                    .run_with(&[&x[..]], &mut [&mut y[..]], Parallelism::Chunks(c))
                    .unwrap()
            });
            split_times[i].push(t0.elapsed());
        }
    }
    for (c, mut t) in splits.iter().zip(split_times) {
        t.sort();
        rows.push((
            format!("256-bit routines, 2 threads, {c} pieces"),
            (t[t.len() / 2], t[0]),
        ));
    }
    let max_err = y
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let same_bits = y.iter().zip(&y2).all(|(a, b)| a.to_bits() == b.to_bits());
    // The kernel's parts alone, on one thread.
    for (what, part) in parts(n) {
        let k = compile(&part).unwrap();
        rows.push((
            format!("part: {what}, 1 thread"),
            time(
                || p1.install(|| k.run(&[&x[..]], &mut [&mut y2[..]]).unwrap()),
                reps,
            ),
        ));
    }

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
    println!("256-bit routines and 128-bit code give the same bits: {same_bits}");
}
