//! The environment variables the command line (and the benchmark harness)
//! read, turned into typed options. The compiler and runtime crates never
//! read the environment: they take a [`CompilerOptions`] and emit
//! `tracing` events (see `adjoint_compiler::options`).
//!
//! | variable | effect |
//! | --- | --- |
//! | `ADJOINT_NO_SCALAR_JIT` | loops over scalars run on the VM, not as native code |
//! | `ADJOINT_NO_TAPE` | reverse mode's stacks stay lists of closures |
//! | `ADJOINT_NO_SIDE_OUTPUTS=1` | reductions write no side outputs |
//! | `ADJOINT_KEEP_VALUES` | values live until their function returns |
//! | `ADJOINT_NO_AVX2=1` | kernels do not use their 256-bit routines |
//! | `ADJOINT_MAX_TAPE_SLOTS=N` | a native reverse-mode tape holds at most N values |
//! | `ADJOINT_OPT_TRACE`, `ADJOINT_OPT_DUMP`, `ADJOINT_FUSE_TRACE`, `ADJOINT_SCALAR_TRACE`, `ADJOINT_EGG_TRACE`, `ADJOINT_VM_DUMP` | debug output on stderr (the `tracing` targets `adjoint::opt`, `adjoint::ir`, `adjoint::fuse`, `adjoint::scalar`, `adjoint::egg`, `adjoint::vm`) |
//! | `RAYON_NUM_THREADS=N` | the kernel pool's size |

use std::sync::OnceLock;

use adjoint_compiler::CompilerOptions;

fn set(name: &str) -> bool {
    std::env::var_os(name).is_some()
}

fn one(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// The compiler options the environment asks for (read once).
pub fn compiler_options() -> CompilerOptions {
    static OPTIONS: OnceLock<CompilerOptions> = OnceLock::new();
    *OPTIONS.get_or_init(|| {
        let default = CompilerOptions::default();
        CompilerOptions {
            scalar_jit: !set("ADJOINT_NO_SCALAR_JIT"),
            tapes: !set("ADJOINT_NO_TAPE"),
            side_outputs: !one("ADJOINT_NO_SIDE_OUTPUTS"),
            release_early: !set("ADJOINT_KEEP_VALUES"),
            avx2: !one("ADJOINT_NO_AVX2"),
            max_tape_slots: std::env::var("ADJOINT_MAX_TAPE_SLOTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default.max_tape_slots),
        }
    })
}

/// The kernel pool's size the environment asks for (`RAYON_NUM_THREADS`).
pub fn kernel_threads() -> Option<usize> {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Shows the debug output the environment asks for on stderr, one
/// message a line, as it comes; with `times`, also measures the
/// compiler's stages into it (`--time-passes`).
pub fn install_tracing(times: Option<&crate::pass_times::PassTimes>) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let mut targets = Targets::new();
    let mut any = false;
    for (var, target) in [
        ("ADJOINT_OPT_TRACE", "adjoint::opt"),
        ("ADJOINT_OPT_DUMP", "adjoint::ir"),
        ("ADJOINT_FUSE_TRACE", "adjoint::fuse"),
        ("ADJOINT_SCALAR_TRACE", "adjoint::scalar"),
        ("ADJOINT_EGG_TRACE", "adjoint::egg"),
        ("ADJOINT_VM_DUMP", "adjoint::vm"),
    ] {
        if set(var) {
            targets = targets.with_target(target, LevelFilter::DEBUG);
            any = true;
        }
    }
    if !any && times.is_none() {
        return;
    }
    let messages = || {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .with_level(false)
            .with_target(false)
            .with_filter(targets.clone())
    };
    // (Optional layers would do, but per-layer filters under a `None`
    // layer lose some of the spans: each case builds its own stack.)
    let registry = tracing_subscriber::registry();
    let _ = match (any, times) {
        (true, Some(t)) => registry.with(messages()).with(t.layer()).try_init(),
        (true, None) => registry.with(messages()).try_init(),
        (false, Some(t)) => registry.with(t.layer()).try_init(),
        (false, None) => Ok(()),
    };
}
