//! The README's first command: `examples/digits_mlp.adj` trains an MLP on
//! the handwritten digits, reaches at least 92% test accuracy, saves its
//! parameters, which `examples/digits_eval.adj` loads to get the same
//! accuracy; the loss curve goes to a CSV file and, with `--plot`, a PNG.
//! Also: the progress bar is drawn on a terminal (a pseudo-terminal made by
//! `script`, where it is installed) and shows the loss.
//!
//! Each test runs the `adjoint` binary in a scratch directory holding a
//! copy of `examples/` (the programs read `examples/data/..` and write
//! their files to the working directory).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A scratch directory with a copy of the examples, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("adjoint-digits-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let data = p.join("examples/data");
        std::fs::create_dir_all(&data).expect("create a scratch directory");
        for f in ["digits_images.npy", "digits_labels.npy"] {
            std::fs::copy(root.join("examples/data").join(f), data.join(f)).expect("copy the data");
        }
        for f in ["digits_mlp.adj", "digits_eval.adj", "per_example_grads.adj"] {
            std::fs::copy(root.join("examples").join(f), p.join("examples").join(f))
                .expect("copy the example");
        }
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `adjoint ARGS` in `dir`; returns stdout, after checking that it
/// succeeded.
fn adjoint(dir: &Dir, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_adjoint"))
        .args(args)
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .output()
        .expect("run the adjoint binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "adjoint {args:?} failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    // Not a terminal: no progress bar on stderr.
    assert_eq!(stderr, "", "stderr of adjoint {args:?}");
    stdout
}

/// The number after `prefix` on the line that starts with it.
fn value_after(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line `{prefix} ..` in\n{stdout}"));
    line[prefix.len()..]
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("`{line}`: {e}"))
}

#[test]
fn digits_mlp_trains_saves_and_evaluates() {
    let d = Dir::new("train");
    let out = adjoint(
        &d,
        &["run", "examples/digits_mlp.adj", "--plot", "loss.png"],
    );
    let acc = value_after(&out, "test accuracy:");
    assert!(acc >= 0.92, "test accuracy {acc} < 0.92\n{out}");
    let train_acc = value_after(&out, "train accuracy:");
    assert!(train_acc > 0.99, "train accuracy {train_acc}\n{out}");
    // Every tenth epoch reports its loss.
    assert_eq!(
        out.lines().filter(|l| l.starts_with("epoch ")).count(),
        3,
        "{out}"
    );

    // The loss curve: a header and one loss per epoch, falling.
    let csv = std::fs::read_to_string(d.0.join("digits_loss.csv")).expect("digits_loss.csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("loss"));
    let losses: Vec<f64> = lines.map(|l| l.parse().expect("a number")).collect();
    assert_eq!(losses.len(), 30, "{csv}");
    assert!(losses.iter().all(|l| l.is_finite() && *l >= 0.0), "{csv}");
    assert!(
        losses[29] < losses[0] / 10.0,
        "the loss did not fall: {csv}"
    );
    // The last epoch's loss is the one printed.
    let printed = value_after(&out, "epoch 30 loss");
    assert!(
        (printed - losses[29]).abs() <= 1e-6 * printed.abs(),
        "{printed} vs {csv}"
    );

    // The PNG of `--plot`.
    let png = std::fs::read(d.0.join("loss.png")).expect("loss.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 1000, "a PNG of {} bytes", png.len());

    // The saved parameters give the same test accuracy in a new program,
    // in both modes.
    assert!(d.0.join("digits_mlp.safetensors").exists());
    for mode in ["graph", "eager"] {
        let eval = adjoint(&d, &["run", "examples/digits_eval.adj", "--mode", mode]);
        assert_eq!(
            value_after(&eval, "test accuracy:"),
            acc,
            "digits_eval in {mode} mode\n{eval}"
        );
        // The per-digit counts add up to the accuracy.
        let hits: i64 = eval
            .lines()
            .filter(|l| l.starts_with("digit "))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f[3].parse::<i64>().expect("a count")
            })
            .sum();
        assert_eq!(hits as f64 / 360.0, (acc * 360.0).round() / 360.0, "{eval}");
    }
}

/// Without `--plot`, `plot` draws nothing.
#[test]
fn plot_without_the_option_writes_nothing() {
    let d = Dir::new("noplot");
    std::fs::write(
        d.0.join("p.adj"),
        "fn main() {\n    plot([3.0, 2.0, 1.5], title = \"t\");\n    save_csv(\"c.csv\", [[1.0, 2.5], [3.0, 4.0]], header = \"a,b\");\n    print(\"ok\");\n}\n",
    )
    .expect("write");
    assert_eq!(adjoint(&d, &["run", "p.adj"]), "ok\n");
    assert_eq!(
        std::fs::read_to_string(d.0.join("c.csv")).expect("c.csv"),
        "a,b\n1.0,2.5\n3.0,4.0\n"
    );
    let entries: Vec<_> = std::fs::read_dir(&d.0)
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "png"))
        .collect();
    assert!(entries.is_empty(), "a PNG was written");
    assert_eq!(adjoint(&d, &["run", "p.adj", "--plot", "out.png"]), "ok\n");
    let png = std::fs::read(d.0.join("out.png")).expect("out.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

/// On a terminal the progress bar is drawn on stderr with the loss that
/// `progress_note` reports, and printed lines still reach stdout.
#[test]
fn progress_bar_draws_on_a_terminal() {
    let Ok(script) = which("script") else {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    };
    let d = Dir::new("tty");
    std::fs::write(
        d.0.join("bar.adj"),
        "fn main() {\n    let mut s = 0.0;\n    for i in progress(0..40) {\n        s += f64(i);\n        progress_note(\"loss\", s);\n        if i == 20 { print(\"halfway\"); }\n    }\n    print(s);\n}\n",
    )
    .expect("write");
    let cmd = format!("{} run bar.adj", env!("CARGO_BIN_EXE_adjoint"));
    let out = Command::new(script)
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(&d.0)
        .stdin(Stdio::null())
        .output()
        .expect("run script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("halfway"), "{text}");
    assert!(text.contains("780.0"), "{text}");
    assert!(text.contains("40/40"), "no finished bar in {text:?}");
    assert!(text.contains("loss 780.0"), "no loss message in {text:?}");
}

fn which(name: &str) -> Result<PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// `examples/per_example_grads.adj`: per-example gradients by
/// `vmap(grad(..))` average to the batch gradient, and clipped
/// per-example training (DP-SGD's recipe) learns the digits, in both
/// modes.
#[test]
fn per_example_gradients_train_the_digits() {
    let dir = Dir::new("per-example");
    for mode in ["graph", "eager"] {
        let out = adjoint(
            &dir,
            &["run", "examples/per_example_grads.adj", "--mode", mode],
        );
        assert!(
            out.starts_with(
                "per-example gradients: (64, 64, 128) their mean is the batch gradient: true\n"
            ),
            "{mode}: {out}"
        );
        let acc = |what: &str| -> f64 {
            let line = out.lines().find(|l| l.starts_with(what)).expect(what);
            line[what.len()..].trim().parse().expect("a number")
        };
        assert!(acc("test accuracy:") > 0.8, "{mode}: {out}");
        assert!(acc("train accuracy:") > 0.9, "{mode}: {out}");
    }
}
