//! Tests of the CUDA code generator. Structure is checked everywhere; the
//! source is compiled to PTX by NVRTC for sm_80 and sm_90 wherever
//! `libnvrtc` loads (set `ADJOINT_REQUIRE_NVRTC=1` to make its absence a
//! failure, as CI does). No GPU is needed.

use super::layout::ReduceStrategy;
use super::source::{constant, generate, Launch};
use crate::codegen::kernel::*;
use adjoint_runtime::cuda::nvrtc;

/// Compiles `src` for both architectures when NVRTC is present; returns
/// whether it ran.
fn nvrtc_accepts(name: &str, src: &str) -> bool {
    if !nvrtc::available() {
        // Read when the tests are built (`.ci/run` sets it before `cargo
        // test`), so that no library code reads the environment.
        assert!(
            option_env!("ADJOINT_REQUIRE_NVRTC").is_none(),
            "ADJOINT_REQUIRE_NVRTC is set but libnvrtc.so.12 cannot be loaded"
        );
        println!("skipped NVRTC compile of {name}: libnvrtc.so.12 not found (LD_LIBRARY_PATH)");
        return false;
    }
    for arch in ["compute_80", "compute_90"] {
        let ptx = nvrtc::compile_ptx(src, arch)
            .unwrap_or_else(|e| panic!("{name} for {arch}: {e}\n--- source ---\n{src}"));
        assert!(
            ptx.contains(&format!(".entry {name}")),
            "{name}: no entry in the PTX"
        );
        let target = arch.replace("compute_", "sm_");
        assert!(
            ptx.contains(&format!(".target {target}")),
            "{arch}: {ptx:.300}"
        );
    }
    true
}

fn unary_spec(op: UnaryOp, dtype: KDType) -> KernelSpec {
    let mut b = BodyBuilder::new();
    let x = b.input(0);
    let y = b.unary(op, x);
    KernelSpec {
        dtype,
        shape: vec![100, 7],
        inputs: vec![InputSpec::contiguous(&[100, 7])],
        body: b.body,
        outputs: vec![y],
        reduce: None,
    }
}

fn binary_spec(op: BinaryOp, dtype: KDType) -> KernelSpec {
    let mut b = BodyBuilder::new();
    let x = b.input(0);
    let y = b.input(1);
    let z = b.binary(op, x, y);
    KernelSpec {
        dtype,
        shape: vec![100, 7],
        inputs: vec![
            InputSpec::contiguous(&[100, 7]),
            InputSpec::broadcast(&[7], &[100, 7]).unwrap(),
        ],
        body: b.body,
        outputs: vec![z],
        reduce: None,
    }
}

/// The CUDA spelling each operation must use (the function the reference
/// semantics need, not an approximate intrinsic).
fn expected_unary(op: UnaryOp, d: KDType) -> String {
    let f = |n: &str| match d {
        KDType::F32 => format!("{n}f(v0)"),
        KDType::F64 => format!("{n}(v0)"),
    };
    match op {
        UnaryOp::Neg => "= -v0;".into(),
        UnaryOp::Exp => f("exp"),
        UnaryOp::Log => f("log"),
        UnaryOp::Log1p => f("log1p"),
        UnaryOp::Tanh => f("tanh"),
        UnaryOp::Sigmoid => "adj_sigmoid(v0)".into(),
        UnaryOp::Relu => "v0 != v0) ? v0 :".into(),
        UnaryOp::Sqrt => f("sqrt"),
        UnaryOp::Rsqrt => format!("1 / {}", f("sqrt")),
        UnaryOp::Abs => f("fabs"),
        UnaryOp::Sign => "? (T)-1 : v0)".into(),
        UnaryOp::Floor => f("floor"),
        UnaryOp::Ceil => f("ceil"),
        UnaryOp::Erf => f("erf"),
        UnaryOp::Math(m) => f(m.row().cuda),
    }
}

#[test]
fn every_unary_operation() {
    let mut compiled = 0;
    for &d in &[KDType::F32, KDType::F64] {
        for &op in UnaryOp::all() {
            let k = generate(&unary_spec(op, d));
            let want = expected_unary(op, d);
            assert!(
                k.source.contains(&want),
                "{op} {d:?}: no `{want}` in\n{}",
                k.source
            );
            assert!(!k.source.contains("__expf") && !k.source.contains("rsqrtf("));
            assert_eq!(k.launch, Launch::Map { n: 700 });
            compiled += nvrtc_accepts(&k.name, &k.source) as usize;
        }
    }
    println!("compiled {compiled} unary kernels");
}

#[test]
fn every_binary_operation() {
    for &d in &[KDType::F32, KDType::F64] {
        for &op in BinaryOp::ALL {
            let k = generate(&binary_spec(op, d));
            let want = match op {
                BinaryOp::Add => "v0 + v1".to_string(),
                BinaryOp::Sub => "v0 - v1".into(),
                BinaryOp::Mul => "v0 * v1".into(),
                BinaryOp::Div => "v0 / v1".into(),
                BinaryOp::Pow if d == KDType::F32 => "powf(v0, v1)".into(),
                BinaryOp::Pow => "pow(v0, v1)".into(),
                BinaryOp::Rem if d == KDType::F32 => "fmodf(v0, v1)".into(),
                BinaryOp::Rem => "fmod(v0, v1)".into(),
                BinaryOp::Maximum => "adj_maximum(v0, v1)".into(),
                BinaryOp::Minimum => "adj_minimum(v0, v1)".into(),
                BinaryOp::Eq => "((v0 == v1) ? (T)1 : (T)0)".into(),
                BinaryOp::Ne => "((v0 != v1) ? (T)1 : (T)0)".into(),
                BinaryOp::Lt => "((v0 < v1) ? (T)1 : (T)0)".into(),
                BinaryOp::Le => "((v0 <= v1) ? (T)1 : (T)0)".into(),
                BinaryOp::Gt => "((v0 > v1) ? (T)1 : (T)0)".into(),
                BinaryOp::Ge => "((v0 >= v1) ? (T)1 : (T)0)".into(),
            };
            assert!(
                k.source.contains(&want),
                "{op}: no `{want}` in\n{}",
                k.source
            );
            // The broadcast input reads with stride 1 along the last
            // dimension only; the dense one with the collapsed flat index.
            assert!(k.source.contains("o0 += r * 7LL;"), "{}", k.source);
            assert!(k.source.contains("o1 += c1 * 1LL;"), "{}", k.source);
            assert!(!k.source.contains("o1 += r"), "{}", k.source);
            nvrtc_accepts(&k.name, &k.source);
        }
    }
}

#[test]
fn nan_rules_of_maximum_and_sign() {
    let k = generate(&binary_spec(BinaryOp::Maximum, KDType::F32));
    assert!(k.source.contains("return (a != a || a >= b) ? a : b;"));
    let k = generate(&unary_spec(UnaryOp::Sign, KDType::F64));
    // sign keeps NaN and -0.0: the last branch returns x itself.
    assert!(k
        .source
        .contains("(v0 > (T)0 ? (T)1 : (v0 < (T)0 ? (T)-1 : v0))"));
}

#[test]
fn constants_are_exact() {
    assert_eq!(
        constant(KDType::F32, 0.1),
        "__int_as_float(0x3dcccccd) /* 1e-1 */"
    );
    assert!(constant(KDType::F64, f64::NEG_INFINITY)
        .starts_with("__longlong_as_double(0xfff0000000000000LL)"));
    assert!(constant(KDType::F64, -0.0).starts_with("__longlong_as_double(0x8000000000000000LL)"));
    let mut b = BodyBuilder::new();
    let x = b.input(0);
    let c = b.constant(f64::NAN);
    let h = b.constant(0.5);
    let s = b.select(x, c, h);
    let spec = KernelSpec {
        dtype: KDType::F32,
        shape: vec![5000],
        inputs: vec![InputSpec::contiguous(&[5000])],
        body: b.body,
        outputs: vec![s, x],
        reduce: None,
    };
    let k = generate(&spec);
    assert!(
        k.source.contains("__int_as_float(0x7fc00000)"),
        "{}",
        k.source
    );
    assert!(k.source.contains("(v0 != (T)0) ? v1 : v2"), "{}", k.source);
    assert!(k.source.contains("out1[i] = v0;"));
    nvrtc_accepts(&k.name, &k.source);
}

fn reduce_spec(shape: &[usize], axes: &[usize], op: ReduceOp, d: KDType) -> KernelSpec {
    let mut b = BodyBuilder::new();
    let x = b.input(0);
    let e = b.unary(UnaryOp::Exp, x);
    KernelSpec {
        dtype: d,
        shape: shape.to_vec(),
        inputs: vec![InputSpec::contiguous(shape)],
        body: b.body,
        outputs: vec![e],
        reduce: Some(ReduceSpec {
            op,
            axes: axes.to_vec(),
            keepdims: false,
        }),
    }
}

#[test]
fn reductions_both_strategies() {
    for &d in &[KDType::F32, KDType::F64] {
        for &op in ReduceOp::ALL {
            // Rows of 4096: a block per row with a shuffle tree.
            let k = generate(&reduce_spec(&[64, 4096], &[1], op, d));
            assert_eq!(
                k.launch,
                Launch::Reduce {
                    n_out: 64,
                    n_red: 4096,
                    strategy: ReduceStrategy::BlockPerOutput
                }
            );
            assert!(k.source.contains("__shfl_down_sync(0xffffffffu, acc, s)"));
            assert!(k.source.contains("__shared__ T partial[8];"));
            let ident = constant(d, op.identity());
            assert!(k.source.contains(&format!("T acc = {ident};")));
            nvrtc_accepts(&k.name, &k.source);
            // Columns of a wide matrix: a thread per column.
            let k = generate(&reduce_spec(&[512, 4096], &[0], op, d));
            assert_eq!(
                k.launch,
                Launch::Reduce {
                    n_out: 4096,
                    n_red: 512,
                    strategy: ReduceStrategy::ThreadPerOutput
                }
            );
            assert!(!k.source.contains("__shfl"));
            // Column j of row r is element r * 4096 + j.
            assert!(k.source.contains("b0 += r * 1LL;"), "{}", k.source);
            assert!(k.source.contains("o0 += r * 4096LL;"), "{}", k.source);
            nvrtc_accepts(&k.name, &k.source);
        }
    }
}

#[test]
fn max_reduction_step_propagates_nan() {
    let k = generate(&reduce_spec(&[8192], &[0], ReduceOp::Max, KDType::F32));
    assert!(k
        .source
        .contains("return (a != a) ? a : ((b != b || b > a) ? b : a);"));
    assert!(
        k.source.contains("acc = adj_rmax(acc, v1);"),
        "{}",
        k.source
    );
}

#[test]
fn names_depend_on_the_canonical_spec() {
    let a = generate(&unary_spec(UnaryOp::Exp, KDType::F32));
    let b = generate(&unary_spec(UnaryOp::Exp, KDType::F32));
    let c = generate(&unary_spec(UnaryOp::Exp, KDType::F64));
    assert_eq!(a, b);
    assert_ne!(a.name, c.name);
    assert!(a
        .source
        .contains(&format!("void __launch_bounds__(256) {}(", a.name)));
}

#[test]
fn scalars_and_empty_shapes() {
    let mut b = BodyBuilder::new();
    let x = b.input(0);
    let y = b.input(1);
    let z = b.binary(BinaryOp::Mul, x, y);
    let spec = KernelSpec {
        dtype: KDType::F64,
        shape: vec![3, 0],
        inputs: vec![InputSpec::scalar(2), InputSpec::contiguous(&[3, 0])],
        body: b.body,
        outputs: vec![z],
        reduce: None,
    };
    let k = generate(&spec);
    assert!(k.launch.is_empty());
    // The scalar is read at offset 0.
    assert!(k.source.contains("long long o0 = 0;"));
    nvrtc_accepts(&k.name, &k.source);
}
