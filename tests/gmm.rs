//! ADBench's GMM objective in Adjoint (`examples/gmm.adj`) against the
//! reference values of ADBench (benches/data/README.md), and its gradient
//! against central finite differences.
//!
//! The inputs are the `.npy` files under `benches/data/gmm/`, made from
//! ADBench's text files by `benches/data/convert.py` and committed.

use std::path::PathBuf;

use adjoint::{Mode, Session};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example() -> PathBuf {
    root().join("examples/gmm.adj")
}

/// `let` statements that load data set `set` (`test`, `d2_K5`, ...) into
/// `alphas means icf x gamma m`, by absolute path.
fn load(set: &str) -> String {
    let dir = root().join("benches/data/gmm").join(set);
    let path = |f: &str| format!("{:?}", dir.join(f).display().to_string());
    format!(
        "    let alphas = load_npy({});\n    let means = load_npy({});\n    let icf = load_npy({});\n    let x = load_npy({});\n    let w = load_npy({});\n    let gamma = w[0];\n    let m = w[1];\n",
        path("alpha.npy"),
        path("means.npy"),
        path("icf.npy"),
        path("x.npy"),
        path("wishart.npy"),
    )
}

/// Runs function `entry` of examples/gmm.adj with `extra` appended; returns
/// what it printed.
fn run_with(extra: &str, entry: &str) -> String {
    let session = Session::new(Mode::Eager)
        .load_file_with(&example(), extra)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    let mut out = Vec::new();
    session
        .run_function(entry, &mut out)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    String::from_utf8(out).expect("utf-8 output")
}

/// The numbers of a line `label: a b c`.
fn numbers(out: &str, label: &str) -> Vec<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no line `{label}` in:\n{out}"));
    line[label.len()..]
        .split_whitespace()
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("not a number: {w} in {line}"))
        })
        .collect()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-300)
}

/// The objective and the sum of all gradient entries on one data set.
fn objective_and_gradient_sum(set: &str) -> (f64, f64) {
    let driver = format!(
        "fn __test_entry() {{\n{}    let (v, g) = value_and_grad(gmm_objective, argnums = (0, 1, 2))(alphas, means, icf, x, gamma, m);\n    print(\"objective:\", v);\n    print(\"gradient sum:\", sum(g.0) + sum(g.1) + sum(g.2));\n    print(\"objective alone:\", gmm_objective(alphas, means, icf, x, gamma, m));\n}}\n",
        load(set)
    );
    let out = run_with(&driver, "__test_entry");
    let v = numbers(&out, "objective:")[0];
    let alone = numbers(&out, "objective alone:")[0];
    assert_eq!(
        v, alone,
        "value_and_grad's value differs from the objective"
    );
    (v, numbers(&out, "gradient sum:")[0])
}

#[test]
fn objective_on_test_txt() {
    let (v, _) = objective_and_gradient_sum("test");
    // ADBench gives 8.07380408004975791, more digits than an f64 holds.
    let want = 8.073_804_080_049_758;
    assert!(rel(v, want) < 1e-9, "objective {v}, reference {want}");
}

#[test]
fn objective_and_gradient_sum_on_d2_k5() {
    let (v, gs) = objective_and_gradient_sum("d2_K5");
    let want = -5240.590562549577;
    let want_gs = -1001.2283331778158;
    assert!(rel(v, want) < 1e-9, "objective {v}, reference {want}");
    assert!(
        rel(gs, want_gs) < 1e-9,
        "gradient sum {gs}, reference {want_gs}"
    );
}

/// The larger benchmark inputs (D > 2, so that L has more than one column):
/// objectives from an independent NumPy implementation (a loop over
/// components that fills Q entry by entry), gradient sums from JAX's
/// `grad` of a transcription of the same formula.
#[test]
fn objective_and_gradient_sum_on_d10_k25() {
    let (v, gs) = objective_and_gradient_sum("d10_K25");
    let want = -25649.6526211973;
    let want_gs = -17695.995235195707;
    assert!(rel(v, want) < 1e-9, "objective {v}, reference {want}");
    assert!(
        rel(gs, want_gs) < 1e-9,
        "gradient sum {gs}, reference {want_gs}"
    );
}

/// The main of examples/gmm.adj prints the d2_K5 values.
#[test]
fn example_main() {
    let session = Session::new(Mode::Eager)
        .load_file(&example())
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    let mut out = Vec::new();
    // `main` reads `benches/data/...` relative to the working directory,
    // which for `cargo test` is the repository root.
    assert_eq!(std::env::current_dir().unwrap(), root());
    session
        .run_main(&mut out)
        .unwrap_or_else(|e| panic!("{}", e.render(false)));
    let out = String::from_utf8(out).unwrap();
    assert!(
        rel(numbers(&out, "objective:")[0], -5240.590562549577) < 1e-9,
        "{out}"
    );
    assert!(
        rel(numbers(&out, "gradient sum:")[0], -1001.2283331778158) < 1e-9,
        "{out}"
    );
}

/// Reverse-mode gradient entries against central differences of the
/// objective, on a data set with D = 10 (so the strictly lower part of L
/// spans several columns) and on d2_K5. `entries` are (argument, flat
/// index) pairs.
fn finite_differences(set: &str, entries: &[(usize, usize)]) {
    let names = ["alphas", "means", "icf"];
    let mut driver = format!(
        "fn __test_entry() {{\n{}    let g = grad(gmm_objective, argnums = (0, 1, 2))(alphas, means, icf, x, gamma, m);\n    let h = 1e-5;\n",
        load(set)
    );
    for &(arg, k) in entries {
        let a = names[arg];
        let call = |sign: &str| {
            let args: Vec<String> = names
                .iter()
                .enumerate()
                .map(|(j, n)| {
                    if j == arg {
                        format!("{n} {sign} h * e")
                    } else {
                        n.to_string()
                    }
                })
                .collect();
            format!("gmm_objective({}, x, gamma, m)", args.join(", "))
        };
        driver.push_str(&format!(
            "    {{\n        let e = reshape(one_hot({k}, size({a}), dtype = f64), shape({a}));\n        print(\"entry:\", sum(g.{arg} * e), ({} - {}) / (2.0 * h));\n    }}\n",
            call("+"),
            call("-"),
        ));
    }
    driver.push_str("}\n");
    let out = run_with(&driver, "__test_entry");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("entry:")).collect();
    assert_eq!(rows.len(), entries.len(), "{out}");
    for (row, &(arg, k)) in rows.iter().zip(entries) {
        let v = numbers(row, "entry:");
        let (rev, fd) = (v[0], v[1]);
        let err = (rev - fd).abs() / rev.abs().max(1.0);
        assert!(
            err < 1e-6,
            "{set}: d/d{}[{k}]: reverse mode {rev}, finite differences {fd} (relative error {err:e})",
            names[arg]
        );
    }
}

#[test]
fn gradient_matches_finite_differences_d2_k5() {
    // alphas[0], alphas[4], means[1, 0], means[3, 1], icf[0, 0] (a log
    // diagonal), icf[2, 2] (the L entry), icf[4, 1].
    finite_differences(
        "d2_K5",
        &[(0, 0), (0, 4), (1, 2), (1, 7), (2, 0), (2, 8), (2, 13)],
    );
}

#[test]
fn gradient_matches_finite_differences_d10_k25() {
    // icf rows have 55 entries: 10 log-diagonal ones, then L column by
    // column (9, 8, ... 1 entries). Entries in the first column (10), a
    // middle column (30 = column 2, row 5 + ...), the last (54), and
    // diagonals.
    finite_differences(
        "d10_K25",
        &[
            (0, 3),
            (0, 24),
            (1, 17),
            (1, 249),
            (2, 5),
            (2, 10),
            (2, 30),
            (2, 54),
            (2, 7 * 55 + 41),
            (2, 24 * 55 + 9),
        ],
    );
}
