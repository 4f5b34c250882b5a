//! The CUDA back end without a GPU: every fused kernel of the program
//! corpus (and of the examples and benchmark programs) is generated and
//! compiled to PTX by NVRTC for sm_80 and sm_90.
//!
//! NVRTC comes from `libnvrtc.so.12` on the loader's path (CI installs the
//! `nvidia-cuda-nvrtc-cu12` wheel and sets `LD_LIBRARY_PATH`, see
//! `.ci/run`). Where it is missing the compile step is skipped with a
//! message, unless `ADJOINT_REQUIRE_NVRTC` is set (CI sets it), which
//! makes that a failure. Running kernels needs a GPU: `scripts/gpu-check.sh`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use adjoint::{Mode, Session};
use adjoint_runtime::cuda::nvrtc;

fn adj_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "adj"))
        .collect();
    v.sort();
    v
}

/// Every distinct kernel (by entry name) of the programs' `main`s, with
/// the first program it came from.
fn corpus_kernels() -> BTreeMap<String, (PathBuf, String)> {
    let mut kernels = BTreeMap::new();
    let mut files: Vec<(PathBuf, &str)> = adj_files("tests/programs")
        .into_iter()
        .chain(adj_files("examples"))
        .map(|p| (p, ""))
        .collect();
    // The benchmarks' entry is `run(reps)`: the 16M-element chain and the
    // MLP training step.
    for b in ["benches/programs/map.adj", "benches/programs/mlp.adj"] {
        files.push((PathBuf::from(b), "fn main() = run(1)"));
    }
    for (path, extra) in files {
        // Programs that are meant not to compile, and files without a
        // `main`, have no kernels.
        let Ok(session) = Session::new(Mode::Graph).load_file_with(Path::new(&path), extra) else {
            continue;
        };
        let Ok(ks) = session.cuda_kernels("main") else {
            continue;
        };
        for k in ks {
            kernels
                .entry(k.entry.clone())
                .or_insert_with(|| (path.clone(), k.source));
        }
    }
    kernels
}

#[test]
fn corpus_kernels_compile_with_nvrtc() {
    let kernels = corpus_kernels();
    // The corpus has dozens of fused kernels (maps, reductions, f32, f64).
    assert!(kernels.len() >= 20, "only {} kernels", kernels.len());
    let reductions = kernels
        .values()
        .filter(|(_, s)| s.contains("T acc ="))
        .count();
    assert!(reductions >= 5, "only {reductions} reducing kernels");
    let f32s = kernels
        .values()
        .filter(|(_, s)| s.contains("typedef float T;"))
        .count();
    assert!(f32s >= 1, "no f32 kernel in the corpus");
    if !nvrtc::available() {
        assert!(
            std::env::var_os("ADJOINT_REQUIRE_NVRTC").is_none(),
            "ADJOINT_REQUIRE_NVRTC is set but libnvrtc.so.12 cannot be loaded"
        );
        eprintln!(
            "skipped: libnvrtc.so.12 not found (LD_LIBRARY_PATH); {} kernels generated, none compiled",
            kernels.len()
        );
        return;
    }
    let mut failures = Vec::new();
    for (entry, (path, source)) in &kernels {
        for arch in ["compute_80", "compute_90"] {
            match nvrtc::compile_ptx(source, arch) {
                Ok(ptx) if ptx.contains(&format!(".entry {entry}")) => {}
                Ok(_) => failures.push(format!("{}: {entry}: no entry in the PTX", path.display())),
                Err(e) => failures.push(format!("{}: {entry} for {arch}: {e}", path.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "compiled {} corpus kernels for sm_80 and sm_90 (NVRTC {:?})",
        kernels.len(),
        nvrtc::version()
    );
}

#[test]
fn emit_cuda_prints_every_kernel() {
    let s = Session::new(Mode::Graph)
        .load_source(
            "chain.adj",
            "fn main() { let x = randn([64, 128]); print(sum(tanh(2.0 * x + 1.0) * x, axis = 1)); }",
        )
        .expect("loads");
    let text = s.emit_cuda("main").expect("kernels");
    let ks = s.cuda_kernels("main").unwrap();
    assert!(!ks.is_empty());
    assert!(text.starts_with(&format!("// {} CUDA kernels\n", ks.len())));
    for k in &ks {
        assert!(text.contains(&k.source));
        assert!(k
            .source
            .contains(&format!("void __launch_bounds__(256) {}(", k.entry)));
    }
}
