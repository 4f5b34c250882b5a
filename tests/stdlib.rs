//! Gradients through the standard library (`nn`, the prelude), checked by
//! `adjoint check-grad`: reverse mode against forward mode and central
//! finite differences, for conv2d with stride and padding, layer_norm,
//! max/avg pooling and cross-entropy over a dense layer. (The program
//! corpus checks values against NumPy, and g082 checks gradients by finite
//! differences written in Adjoint, in both modes.)

use std::process::{Command, Stdio};

fn check_grad(function: &str, at: &[&str]) {
    check_grad_with(function, at, &[]);
}

/// [`check_grad`] with environment variables `env` set; its stderr.
fn check_grad_with(function: &str, at: &[&str], env: &[(&str, &str)]) -> String {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stdlib/check_grad.adj");
    let mut args = vec!["check-grad", file, function, "--tolerance", "1e-6", "--at"];
    args.extend_from_slice(at);
    let out = Command::new(env!("CARGO_BIN_EXE_adjoint"))
        .args(&args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the adjoint binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && stdout.contains("ok (tolerance 1e-6)"),
        "check-grad {function}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    assert!(stdout.contains("reverse vs forward mode"), "{stdout}");
    stderr
}

/// Where `layer_norm` is checked: `x` and `gamma`.
const LN_AT: [&str; 2] = ["[[1.0, 2.0, -0.5], [0.3, -1.2, 0.8]]", "[1.0, -0.5, 2.0]"];

#[test]
fn conv2d_with_stride_and_padding() {
    check_grad(
        "conv",
        &[
            "[[[[0.1, -0.2], [0.3, 0.4]]], [[[0.5, 0.1], [-0.3, 0.2]]]]",
            "[[[[1.0, 2.0, -1.0], [0.5, -0.5, 1.5], [0.2, 0.1, -0.7]]]]",
        ],
    );
}

#[test]
fn layer_norm() {
    check_grad("ln", &LN_AT);
}

#[test]
fn pooling() {
    check_grad(
        "pool",
        &["[[[[1.0, 2.0, -1.0, 0.3], [0.5, -0.5, 1.5, 0.9], [0.2, 0.1, -0.7, 0.25], [1.1, -1.3, 0.45, 0.6]]]]"],
    );
}

#[test]
fn cross_entropy_of_a_dense_layer() {
    check_grad(
        "ce",
        &[
            "[[0.1, -0.2, 0.3], [0.5, 0.1, -0.4]]",
            "[[1.0, 2.0], [-1.0, 0.5]]",
        ],
    );
}

/// The check-grad driver of `layer_norm` (forward mode, reverse mode and
/// finite differences in one graph, over tiny shapes) is where fusion once
/// formed groups that needed each other's results through values outside
/// them: exec found the cycle and ran the graph without kernels. Fusion
/// now dissolves the few groups on such cycles itself.
#[test]
fn fusion_leaves_no_cycle_for_exec() {
    let stderr = check_grad_with("ln", &LN_AT, &[("ADJOINT_FUSE_TRACE", "1")]);
    assert!(stderr.contains("on a cycle of steps"), "{stderr}");
    assert!(!stderr.contains("need each other"), "{stderr}");
}
