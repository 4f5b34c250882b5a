//! Programs run on several processes: every `tests/parallel/*.adj` file is
//! run with `mpirun -np N adjoint run FILE`, in graph and in eager mode,
//! and its rank 0 output is compared with the expectations in its
//! comments:
//!
//! - `// np: N`: the number of processes (required);
//! - `// out: TEXT`: one line of expected stdout, in order;
//! - `// error: TEXT`: the job must fail and stderr must contain TEXT.
//!
//! Needs the `mpi` feature (`cargo test --release --features mpi --test
//! parallel`) and OpenMPI's `mpirun` on the PATH (docs/parallel.md). The
//! one-process meaning of the same collectives is tested in
//! tests/programs/g105_collectives_one_process.adj.

#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::Command;

struct Expect {
    np: usize,
    out: Vec<String>,
    errors: Vec<String>,
}

fn expectations(src: &str, file: &Path) -> Expect {
    let mut e = Expect {
        np: 0,
        out: Vec::new(),
        errors: Vec::new(),
    };
    for line in src.lines() {
        let line = line.trim();
        if let Some(n) = line.strip_prefix("// np:") {
            e.np = n.trim().parse().expect("`// np: N` with a number");
        } else if let Some(o) = line.strip_prefix("// out:") {
            e.out.push(o.strip_prefix(' ').unwrap_or(o).to_string());
        } else if let Some(o) = line.strip_prefix("// error:") {
            e.errors.push(o.trim().to_string());
        }
    }
    assert!(e.np > 0, "{}: no `// np: N` line", file.display());
    e
}

/// Runs `file` on `np` processes; (success, stdout, stderr).
fn mpirun(file: &Path, np: usize, mode: &str) -> (bool, String, String) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_adjoint"));
    let out = Command::new("mpirun")
        // OpenMPI refuses root without these, and the CI machine has
        // fewer cores than some tests have ranks.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", &np.to_string()])
        .arg(&bin)
        .args(["run", "--mode", mode])
        .arg(file)
        .output()
        .expect("mpirun (OpenMPI) on the PATH: see docs/parallel.md");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn parallel_programs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parallel");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/parallel")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "adj"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut failures = Vec::new();
    for file in &files {
        let e = expectations(&std::fs::read_to_string(file).unwrap(), file);
        for mode in ["graph", "eager"] {
            let (ok, stdout, stderr) = mpirun(file, e.np, mode);
            let name = format!("{} ({mode}, {} ranks)", file.display(), e.np);
            if e.errors.is_empty() {
                let got: Vec<&str> = stdout.lines().collect();
                if !ok || got != e.out {
                    failures.push(format!(
                        "{name}: expected\n{}\ngot\n{stdout}\nstderr:\n{stderr}",
                        e.out.join("\n")
                    ));
                }
            } else if ok {
                failures.push(format!("{name}: should have failed; stdout:\n{stdout}"));
            } else if let Some(miss) = e.errors.iter().find(|m| !stderr.contains(m.as_str())) {
                failures.push(format!("{name}: stderr lacks {miss:?}:\n{stderr}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// examples/mpi_embed.rs: Rust trains a model written in Adjoint on 1, 2
/// and 4 processes (a session on MPI's world), and rank 0 checks the
/// weights against a second session that runs alone.
#[test]
fn embedding_on_a_communicator() {
    // target/<profile>/deps/parallel-HASH -> target/<profile>/examples
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("examples/mpi_embed"))
        .unwrap();
    assert!(
        example.exists(),
        "{} is missing: `cargo build --release --features mpi --example mpi_embed` first",
        example.display()
    );
    for np in [1, 2, 4] {
        let out = Command::new("mpirun")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .args(["--oversubscribe", "-np", &np.to_string()])
            .arg(&example)
            .output()
            .expect("mpirun");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && stdout.contains(&format!("ranks: {np}\n"))
                && stdout.contains("same as one process: true"),
            "{np} ranks:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
