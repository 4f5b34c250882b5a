//! The fuzzer in CI: 300 programs of a fixed seed against the `adjoint`
//! executable this checkout built (`../target/release/adjoint`, else
//! `../target/debug/adjoint`; `ADJOINT_BIN` overrides). Build it first
//! (`cargo build --release --bin adjoint`): this test builds nothing and
//! fails, with a message, when there is no executable.
//!
//! To fit in about three minutes on two cores it runs eager and graph mode on
//! every program, one `ADJOINT_NO_*` configuration (in turn) on every third,
//! small programs, and times the compile of every fifth program.
//! `CI_FUZZ_COUNT` and `CI_FUZZ_SEED` change the count and the seed.

use adjoint_fuzz::{run, Options, Switches};
use std::path::PathBuf;

fn adjoint_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ADJOINT_BIN") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "ADJOINT_BIN={} does not exist", p.display());
        return p;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for p in ["target/release/adjoint", "target/debug/adjoint"] {
        let p = root.join(p);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "no adjoint executable: looked for {0}/target/release/adjoint and {0}/target/debug/adjoint. \
         Build it first (`cargo build --release --bin adjoint`) or set ADJOINT_BIN.",
        root.display()
    );
}

// Ignored by `cargo test --workspace`, which builds no release executable
// (against a debug one it takes far longer): `.ci/run` builds one and then
// runs it with `cargo test --release -p adjoint-fuzz -- --ignored`.
#[test]
#[ignore = "needs a release build of adjoint; .ci/run runs it"]
fn fuzz_300_programs() {
    let bin = adjoint_bin();
    let mut opts = Options::new(bin.clone());
    opts.seed = std::env::var("CI_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20240);
    opts.count = std::env::var("CI_FUZZ_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    opts.jobs = 2;
    opts.switches = Switches::Rotate;
    opts.switch_every = 3;
    opts.small = true;
    opts.compile_every = 5;
    // a debug build compiles much more slowly than a release one
    let debug = bin.to_string_lossy().contains("debug");
    opts.max_compile_secs = Some(if debug { 20.0 } else { 2.0 });
    // A time-out stands for a hang: the slowest program of the default
    // seed (a 4th-order derivative through a loop, #188) compiles in about
    // 8 s in graph mode, and two programs run at once.
    opts.timeout_secs = if debug { 90.0 } else { 30.0 };
    opts.out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-ci");
    println!(
        "adjoint-fuzz CI: {} programs, seed {}, against {}",
        opts.count,
        opts.seed,
        bin.display()
    );
    let summary = run(&opts);
    summary.print();
    let classes = summary.classes();
    assert!(
        summary.failing.is_empty(),
        "{} failing programs in {} classes (saved under {}):\n{}",
        summary.failing.len(),
        classes.len(),
        opts.out.display(),
        classes.keys().cloned().collect::<Vec<_>>().join("\n")
    );
    let invalid = summary.gen_invalid.len() as f64 / summary.programs.max(1) as f64;
    assert!(
        invalid < 0.05,
        "{:.1}% of the programs were rejected in every configuration",
        100.0 * invalid
    );
}
