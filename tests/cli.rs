//! The `adjoint` command, run as a separate process: exit statuses, what
//! goes to standard output and what to standard error (README "The
//! `adjoint` command", docs/language.md §6).
//!
//! Every run goes through [`adjoint`], which also checks that standard
//! error never shows a panic or a backtrace (`RUST_BACKTRACE=1` is set to
//! make one visible if the command ever panics).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A scratch directory for one test, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("adjoint-cli-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a scratch directory");
        Dir(p)
    }
    fn write(&self, name: &str, text: impl AsRef<[u8]>) -> &Dir {
        std::fs::write(self.0.join(name), text).expect("write a scratch file");
        self
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The outcome of one run.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn no_crash(r: &Run) {
    for bad in [
        "panicked",
        "RUST_BACKTRACE",
        "stack backtrace",
        "internal compiler error",
    ] {
        assert!(!r.stderr.contains(bad), "stderr mentions `{bad}`:\n{r:?}");
    }
    assert_ne!(r.code, Some(101), "exit status 101 is a panic:\n{r:?}");
    assert!(r.code.is_some(), "killed by a signal:\n{r:?}");
}

fn finish(out: Output) -> Run {
    let r = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    no_crash(&r);
    r
}

fn command(dir: &Dir, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_adjoint"));
    c.args(args)
        .current_dir(&dir.0)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null());
    c
}

/// Runs `adjoint ARGS` in `dir`.
fn adjoint(dir: &Dir, args: &[&str]) -> Run {
    finish(command(dir, args).output().expect("run the adjoint binary"))
}

/// A failed run: exit status 1, nothing on stdout unless `stdout` says so,
/// and stderr containing each of `needles`.
fn assert_fails(r: &Run, stdout: &str, needles: &[&str]) {
    assert_eq!(r.code, Some(1), "{r:?}");
    assert_eq!(r.stdout, stdout, "{r:?}");
    for n in needles {
        assert!(r.stderr.contains(n), "stderr lacks {n:?}:\n{r:?}");
    }
}

fn assert_succeeds(r: &Run, stdout: &str) {
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(r.stdout, stdout, "{r:?}");
    assert_eq!(r.stderr, "", "{r:?}");
}

const GOOD: &str = "\
fn square(x) = x * x;

fn power(x, n: i64) {
    let mut acc = 1.0;
    for i in 0..n {
        acc = acc * x;
    }
    acc
}

fn main() {
    print(square(3.0), power(2.0, 10));
    print([[1.0, 2.5], [3.0, 4.0]], (1, \"two\"), {w: 1, b: true});
    print(shape(zeros([4, 3]) @ ones([3, 2])), dtype(f32(1.0)));
}
";

const GOOD_OUT: &str = "\
9.0 1024.0
[[1.0, 2.5], [3.0, 4.0]] (1, two) {w: 1, b: true}
(4, 2) f32
";

/// A shape error: `f32[3] @ f32[5, 2]`, on line 5 (the `@`'s left operand
/// starts at column 11).
const TYPE_ERROR: &str = "\
fn main() {
    print(\"never printed\");
    let a = zeros([3]);
    let b = zeros([5, 2]);
    print(a @ b);
}
";

/// Fails when it runs: the file does not exist (line 3, column 13).
const RUN_ERROR: &str = "\
fn main() {
    print(\"before\");
    let x = load_npy(\"no_such_dir/missing.npy\");
    print(x);
}
";

#[test]
fn run_prints_to_stdout_and_exits_0() {
    let d = Dir::new("run-good");
    d.write("good.adj", GOOD);
    assert_succeeds(&adjoint(&d, &["run", "good.adj"]), GOOD_OUT);
    assert_succeeds(
        &adjoint(&d, &["run", "good.adj", "--mode", "eager"]),
        GOOD_OUT,
    );
}

#[test]
fn a_type_error_is_located_with_its_source_line() {
    let d = Dir::new("type-error");
    d.write("bad.adj", TYPE_ERROR);
    for cmd in ["run", "check"] {
        let r = adjoint(&d, &[cmd, "bad.adj"]);
        assert_fails(
            &r,
            "",
            &[
                "bad.adj:5:11",
                "print(a @ b);",
                "`@` of f32[3] and f32[5, 2]: inner dimensions 3 and 5 differ",
            ],
        );
    }
}

/// A reversed loop whose tape would pass the limit stops with an error at
/// the loop (the limit lowered through the environment for the test).
#[test]
fn a_reversed_loop_beyond_the_tape_limit_is_an_error() {
    let d = Dir::new("tape-limit");
    d.write(
        "long.adj",
        "\
fn iterate(x, n) {
    let mut y = x;
    for i in 0..n {
        y = sin(y) * y + 0.5;
    }
    y
}
fn main() {
    print(grad(iterate)(0.3, 100));
    print(grad(iterate)(0.3, 100000));
}
",
    );
    let r = finish(
        command(&d, &["run", "long.adj"])
            .env("ADJOINT_MAX_TAPE_SLOTS", "10000")
            .output()
            .expect("run the adjoint binary"),
    );
    assert_fails(
        &r,
        "5.260621290029205e-20\n",
        // The excerpt shows the loop's first line.
        &[
            "tape of this loop exceeds 10000 values",
            "long.adj:3:5",
            "3 │     for i in 0..n {",
        ],
    );
}

#[test]
fn a_run_time_error_names_the_path_and_the_source_line() {
    let d = Dir::new("run-error");
    d.write("load.adj", RUN_ERROR);
    let r = adjoint(&d, &["run", "load.adj"]);
    assert_fails(
        &r,
        "before\n",
        &[
            "no_such_dir/missing.npy",
            "load.adj:3:13",
            "let x = load_npy(\"no_such_dir/missing.npy\");",
        ],
    );
    // checking does not run the program
    assert_succeeds(&adjoint(&d, &["check", "load.adj"]), "");
}

#[test]
fn check_is_silent_on_a_good_program() {
    let d = Dir::new("check");
    d.write("good.adj", GOOD);
    assert_succeeds(&adjoint(&d, &["check", "good.adj"]), "");
    // a file without `main` checks (there is nothing to run)...
    d.write("lib.adj", "fn f(x) = x + 1;\n");
    assert_succeeds(&adjoint(&d, &["check", "lib.adj"]), "");
    // ...but does not run
    assert_fails(
        &adjoint(&d, &["run", "lib.adj"]),
        "",
        &["lib.adj:1:1", "no `main` function"],
    );
}

#[test]
fn syntax_errors_are_all_reported() {
    let d = Dir::new("syntax");
    d.write(
        "syntax.adj",
        "fn main() {\n    let x = 1 +;\n    let y = (2;\n    print(x $ y);\n}\n",
    );
    for cmd in [
        &["check", "syntax.adj"][..],
        &["run", "syntax.adj"],
        &["emit", "syntax.adj", "--stage", "ast"],
    ] {
        let r = adjoint(&d, cmd);
        assert_fails(
            &r,
            "",
            &["syntax.adj:2:16", "let x = 1 +;", "syntax.adj:4:13"],
        );
    }
}

#[test]
fn emit_ast_and_ir() {
    let d = Dir::new("emit");
    d.write("good.adj", GOOD);
    let ast = adjoint(&d, &["emit", "good.adj", "--stage", "ast"]);
    assert_eq!(ast.code, Some(0), "{ast:?}");
    assert!(
        ast.stdout.contains("(fn square") && ast.stdout.contains("(fn main"),
        "{ast:?}"
    );
    let ir = adjoint(&d, &["emit", "good.adj", "--stage", "ir", "--fn", "power"]);
    assert_eq!(ir.code, Some(0), "{ir:?}");
    assert!(ir.stdout.contains("graph @power"), "{ir:?}");
    assert!(
        !ir.stdout.contains("graph @square"),
        "only what `power` uses:\n{ir:?}"
    );
    let all = adjoint(&d, &["emit", "good.adj", "--stage", "ir"]);
    assert_eq!(all.code, Some(0), "{all:?}");
    for g in ["graph @square", "graph @power", "graph @main"] {
        assert!(all.stdout.contains(g), "{all:?}");
    }
}

#[test]
fn emit_of_an_unknown_function_fails_clearly() {
    let d = Dir::new("emit-unknown");
    d.write("good.adj", GOOD);
    let r = adjoint(&d, &["emit", "good.adj", "--stage", "ir", "--fn", "nope"]);
    assert_fails(&r, "", &["no function `nope`"]);
}

#[test]
fn a_missing_input_file_is_one_clear_line() {
    let d = Dir::new("missing");
    for args in [
        &["run", "nothere.adj"][..],
        &["check", "nothere.adj"],
        &["emit", "nothere.adj", "--stage", "ast"],
        &["emit", "nothere.adj", "--stage", "ir"],
    ] {
        let r = adjoint(&d, args);
        assert_fails(
            &r,
            "",
            &["cannot read \"nothere.adj\"", "no such file or directory"],
        );
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    }
    // a directory is not a program either
    std::fs::create_dir(d.0.join("sub")).unwrap();
    let r = adjoint(&d, &["run", "sub"]);
    assert_fails(&r, "", &["cannot read \"sub\""]);
    assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
}

#[test]
fn a_file_that_is_not_utf8_is_refused() {
    let d = Dir::new("utf8");
    d.write("latin1.adj", b"fn main() { print(\"caf\xe9\"); }\n");
    for cmd in ["run", "check"] {
        let r = adjoint(&d, &[cmd, "latin1.adj"]);
        assert_fails(&r, "", &["latin1.adj", "not valid UTF-8"]);
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    }
    // an import that is not UTF-8 is located at the import
    d.write(
        "main.adj",
        "import \"latin1.adj\" as l\nfn main() { print(1); }\n",
    );
    let r = adjoint(&d, &["run", "main.adj"]);
    assert_fails(&r, "", &["main.adj:1:8", "latin1.adj"]);
}

#[test]
fn graph_mode_runs_and_emits_optimised_ir() {
    let d = Dir::new("graph");
    d.write("good.adj", GOOD);
    assert_succeeds(
        &adjoint(&d, &["run", "good.adj", "--mode", "graph"]),
        GOOD_OUT,
    );
    d.write("f.adj", "fn f(x) = sin(x) * x\n");
    let r = adjoint(&d, &["emit", "f.adj", "--stage", "grad-opt", "--fn", "f"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    // One first-order graph: no backpropagator closures, environments,
    // zero checks or switches are left.
    assert!(r.stdout.starts_with("// optimised:"), "{r:?}");
    for gone in ["J.", "B.", "env_", "is_zero", "switch", "zero()"] {
        assert!(!r.stdout.contains(gone), "`{gone}` left in {}", r.stdout);
    }
    assert!(r.stdout.contains("cos("), "{}", r.stdout);
    let r = adjoint(&d, &["emit", "f.adj", "--stage", "grad-opt"]);
    assert_fails(&r, "", &["`--stage grad-opt` needs `--fn NAME`"]);
    // A chain of element-wise operations and its sum: one kernel each
    // (the sum is of a value also printed, so it cannot close the chain).
    d.write(
        "k.adj",
        "fn main() {\n    let x = rand((100, 100), seed = 1);\n    let y = tanh(2.0 * x + 1.0) * sigmoid(x) - x / 3.0;\n    print(y[0, 0] < 1.0, sum(y) > 0.0);\n}\n",
    );
    let r = adjoint(&d, &["emit", "k.adj", "--stage", "kernels"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.starts_with("// 2 fused kernels"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("fused[mul,add,tanh,sigmoid,mul,div,sub] over [100, 100] f32"),
        "{}",
        r.stdout
    );
    assert_succeeds(&adjoint(&d, &["run", "k.adj"]), "true true\n");
}

#[test]
fn usage_errors_and_help() {
    let d = Dir::new("usage");
    let r = adjoint(&d, &[]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("Usage"), "{r:?}");
    let r = adjoint(&d, &["run"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    let r = adjoint(&d, &["emit", "x.adj", "--stage", "bytecode"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    let r = adjoint(&d, &["run", "x.adj", "--mode", "fast"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    let r = adjoint(&d, &["--help"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    for c in ["run", "check", "emit"] {
        assert!(r.stdout.contains(c), "{r:?}");
    }
    let r = adjoint(&d, &["--version"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.starts_with("adjoint "), "{r:?}");
}

/// Output into a pipe whose reader has gone (`adjoint emit ... | head -1`)
/// must not make the command panic.
#[test]
fn a_closed_stdout_is_not_a_crash() {
    let d = Dir::new("pipe");
    let big: String = (0..5000)
        .map(|i| format!("fn g{i}(x) = x + {i};\n"))
        .collect();
    d.write(
        "big.adj",
        format!("{big}fn main() {{ for i in 0..100000 {{ print(i); }} }}\n"),
    );
    for args in [
        &["emit", "big.adj", "--stage", "ir"][..],
        &["emit", "big.adj", "--stage", "ast"],
        &["run", "big.adj"],
    ] {
        let mut child = command(&d, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the adjoint binary");
        let mut first = [0u8; 16];
        let mut stdout = child.stdout.take().unwrap();
        stdout.read_exact(&mut first).expect("some output");
        drop(stdout);
        let out = child.wait_with_output().expect("wait for adjoint");
        let r = finish(out);
        assert!(matches!(r.code, Some(0 | 1)), "{args:?}: {r:?}");
    }
}

#[test]
fn grad_and_check_grad() {
    let d = Dir::new("grad");
    d.write(
        "g.adj",
        "fn square(x) = x * x;\nfn main() { print(square(3.0)); }\n",
    );
    let r = adjoint(&d, &["grad", "g.adj", "square", "--at", "3.0"]);
    assert_succeeds(&r, "value: 9.0\ngradient 0: 6.0\n");
    let r = adjoint(&d, &["check-grad", "g.adj", "square", "--at", "3.0"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.ends_with("ok (tolerance 1e-4)\n"), "{r:?}");
    let r = adjoint(&d, &["emit", "g.adj", "--stage", "grad", "--fn", "square"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("graph @"), "{r:?}");
    // Defaults fill the parameters `--at` leaves out (outside probe: "takes
    // 3 arguments, but --at gives 1").
    d.write("p.adj", "fn scaled(x, k = 3.0, p = 2) = k * x ** p\n");
    let r = adjoint(&d, &["grad", "p.adj", "scaled", "--at", "2.0"]);
    assert_succeeds(&r, "value: 12.0\ngradient 0: 12.0\n");
    let r = adjoint(&d, &["grad", "p.adj", "scaled", "--at", "2.0", "0.5"]);
    assert_succeeds(&r, "value: 2.0\ngradient 0: 2.0\ngradient 1: 4.0\n");
    let r = adjoint(&d, &["check-grad", "p.adj", "scaled", "--at", "2.0"]);
    assert!(r.stdout.ends_with("ok (tolerance 1e-4)\n"), "{r:?}");
    let r = adjoint(
        &d,
        &["grad", "p.adj", "scaled", "--at", "1.0", "1.0", "1", "1"],
    );
    assert_fails(
        &r,
        "",
        &["`scaled` takes 1 to 3 arguments, but --at gives 4"],
    );
    // errors: one line each, no panic
    for (args, msg) in [
        (
            &["grad", "g.adj", "nope", "--at", "1.0"][..],
            "no function `nope`",
        ),
        (
            &["grad", "g.adj", "square", "--at", "1.0", "2.0"],
            "takes 1 argument",
        ),
        (
            &["grad", "g.adj", "square", "--at", "1.0 +"],
            "cannot read argument `1.0 +`",
        ),
        (
            &["grad", "g.adj", "square", "--at", "3"],
            "no float argument",
        ),
        (
            &["grad", "nothere.adj", "square", "--at", "1.0"],
            "nothere.adj",
        ),
        (&["emit", "g.adj", "--stage", "grad"], "--fn"),
    ] {
        let r = adjoint(&d, args);
        assert_fails(&r, "", &[msg]);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {r:?}");
    }
    // a string is not differentiated
    let r = adjoint(&d, &["grad", "g.adj", "square", "--at", "\"s\""]);
    assert_fails(&r, "", &["no float argument"]);
    // an argument of the wrong type is located in the program
    let r = adjoint(&d, &["grad", "g.adj", "square", "--at", "(1.0, 2.0)"]);
    assert_fails(&r, "", &["g.adj:1:16"]);
}

/// The generated driver's local names cannot shadow the user's functions
/// (a function named `e`, `g` or `h` broke `check-grad`), and an error in
/// the driver is shown in the driver's text, not at a line the user's file
/// does not have.
#[test]
fn grad_drivers_keep_to_their_own_names_and_text() {
    let d = Dir::new("grad_names");
    d.write(
        "f.adj",
        "fn g(x) = x * x;\nfn e(x) = sin(x) * g(x);\nfn h(x, k) = e(x) * k;\nfn v(x) = [x, x];\n\
         fn w(x: f32[2]) = sum(exp(x));\n",
    );
    // An f32-annotated parameter is given an f32; check-grad's finite
    // differences are then taken in f32, with a wider default tolerance.
    let r = adjoint(&d, &["check-grad", "f.adj", "w", "--at", "[1.0, 2.0]"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout.contains("in f32") && r.stdout.ends_with("ok (tolerance 3e-2)\n"),
        "{r:?}"
    );
    let r = adjoint(&d, &["grad", "f.adj", "w", "--at", "[1.0, 2.0]"]);
    assert_succeeds(&r, "value: 10.107338\ngradient 0: [2.7182817, 7.389056]\n");
    for f in ["e", "g"] {
        let r = adjoint(&d, &["check-grad", "f.adj", f, "--at", "0.5"]);
        assert_eq!(r.code, Some(0), "{f}: {r:?}");
        assert!(r.stdout.ends_with("ok (tolerance 1e-4)\n"), "{f}: {r:?}");
    }
    let r = adjoint(&d, &["check-grad", "f.adj", "h", "--at", "0.5", "2.0"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let r = adjoint(&d, &["grad", "f.adj", "e", "--at", "0.5"]);
    let want = 0.5f64.sin() * 0.25;
    assert!(r.stdout.starts_with(&format!("value: {want}\n")), "{r:?}");
    for cmd in ["grad", "check-grad"] {
        let r = adjoint(&d, &[cmd, "f.adj", "v", "--at", "0.5"]);
        assert_fails(
            &r,
            "",
            &["needs `v` to return a float scalar", "<generated driver>:"],
        );
        assert!(!r.stderr.contains("f.adj:"), "{cmd}: {r:?}");
    }
}

/// Every program of the corpus, run through the command: the harness
/// `tests/programs.rs` checks their output; here only that nothing
/// crashes, on `check` and `emit` too.
#[test]
fn no_corpus_program_crashes_any_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let d = Dir::new("corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("tests/programs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "adj"))
        .collect();
    files.sort();
    for f in files {
        let f = f.to_str().unwrap();
        for args in [
            &["check", f][..],
            &["emit", f, "--stage", "ast"],
            &["emit", f, "--stage", "ir"],
        ] {
            let r = adjoint(&d, args);
            assert!(matches!(r.code, Some(0 | 1)), "{args:?}: {r:?}");
            if r.code == Some(1) {
                assert!(r.stdout.is_empty(), "{args:?}: {r:?}");
                assert!(!r.stderr.is_empty(), "{args:?}: {r:?}");
            }
        }
    }
}

/// The run line of `--stats`: the peak heap in MiB.
fn run_peak_mib(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("stats: run"))
        .unwrap_or_else(|| panic!("no run line in {stderr}"));
    let at = line.find("peak heap ").expect("peak heap") + "peak heap ".len();
    line[at..]
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line}"))
}

#[test]
fn stats_report_memory_that_planning_saves() {
    // Five layers: each intermediate is dead after the next layer reads it.
    let d = Dir::new("stats");
    d.write(
        "layers.adj",
        "fn main() {
    let w = f64(ones([512, 512])) * 0.001;
    let x = f64(ones([256, 512]));
    let h1 = relu(x @ w - 0.01);
    let h2 = relu(h1 @ w - 0.01);
    let h3 = relu(h2 @ w - 0.01);
    let h4 = relu(h3 @ w - 0.01);
    let h5 = relu(h4 @ w - 0.01);
    print(sum(h5));
}
",
    );
    let eager = adjoint(&d, &["run", "layers.adj", "--mode", "eager"]);
    assert_eq!(eager.code, Some(0), "{eager:?}");
    let planned = adjoint(&d, &["run", "layers.adj", "--stats"]);
    assert_eq!(planned.code, Some(0), "{planned:?}");
    let value = |r: &Run| -> f64 { r.stdout.trim().parse().expect("a number") };
    // Kernels sum in another order than eager mode's reference kernels.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-10 * b.abs();
    assert!(
        close(value(&planned), value(&eager)),
        "{planned:?}\n{eager:?}"
    );
    let kept = finish(
        command(&d, &["run", "layers.adj", "--stats"])
            .env("ADJOINT_KEEP_VALUES", "1")
            .output()
            .expect("run"),
    );
    assert_eq!(kept.stdout, planned.stdout);
    // 4 MiB of inputs and 1 MiB per intermediate: releasing each at its
    // last use keeps about three alive instead of all ten.
    let (p, k) = (run_peak_mib(&planned.stderr), run_peak_mib(&kept.stderr));
    assert!(p > 3.0 && p < 0.7 * k, "peak {p} MiB planned, {k} MiB kept");
    // The element-wise kernels wrote over the products that died there.
    let kernels = planned
        .stderr
        .lines()
        .find(|l| l.contains("fused kernel calls"))
        .expect("kernel line");
    assert!(
        !kernels.contains(", 0 of them"),
        "no kernel ran in place: {kernels}"
    );
}

#[test]
fn emit_dot_draws_the_gradient_graphs() {
    let d = Dir::new("emit-dot");
    d.write("good.adj", GOOD);
    let r = adjoint(
        &d,
        &[
            "emit", "good.adj", "--stage", "grad", "--fn", "square", "--dot", "g.dot",
        ],
    );
    assert_succeeds(&r, "");
    let dot = std::fs::read_to_string(d.0.join("g.dot")).expect("g.dot written");
    assert!(dot.starts_with("digraph adjoint {"), "{dot}");
    assert!(dot.trim_end().ends_with('}'), "{dot}");
    // One cluster per graph: the driver, grad(square), J(square), its
    // backpropagator, and the rule of `mul`.
    assert!(dot.matches("subgraph cluster_").count() >= 4, "{dot}");
    for needle in ["@J.square", "@B.square", " = mul(", " -> "] {
        assert!(dot.contains(needle), "no {needle:?} in\n{dot}");
    }
    // Balanced braces: every cluster is closed.
    assert_eq!(dot.matches('{').count(), dot.matches('}').count(), "{dot}");
    let opt = adjoint(
        &d,
        &["emit", "good.adj", "--stage", "opt", "--dot", "o.dot"],
    );
    assert_succeeds(&opt, "");
    assert!(std::fs::read_to_string(d.0.join("o.dot"))
        .expect("o.dot")
        .contains("label=\"@main\""));
    let bad = adjoint(
        &d,
        &["emit", "good.adj", "--stage", "ast", "--dot", "a.dot"],
    );
    assert_fails(&bad, "", &["`--dot` draws the IR stages"]);
}

/// `adjoint devices` always lists the CPU, then the GPUs or, in one line,
/// why there are none.
#[test]
fn devices_lists_the_cpu_and_cuda() {
    let dir = Dir::new("devices");
    let r = adjoint(&dir, &["devices"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("cpu: "), "{r:?}");
    assert!(lines[0].ends_with(" threads (Cranelift kernels)"), "{r:?}");
    match adjoint_runtime::cuda::devices() {
        Ok(gpus) if !gpus.is_empty() => {
            assert_eq!(lines.len(), 1 + gpus.len(), "{r:?}");
            assert!(
                lines[1].starts_with(&format!("cuda:0: {}", gpus[0].name)),
                "{r:?}"
            );
        }
        _ => {
            assert_eq!(lines.len(), 2, "{r:?}");
            assert!(lines[1].starts_with("cuda: none ("), "{r:?}");
        }
    }
}

/// `--device cuda` without a usable GPU: one line on stderr, status 1, no
/// panic; with one, the program runs and prints what the CPU prints.
#[test]
fn run_on_cuda_without_a_gpu_is_one_clear_line() {
    let dir = Dir::new("device-cuda");
    dir.write("good.adj", GOOD);
    let r = adjoint(&dir, &["run", "good.adj", "--device", "cuda"]);
    let usable = adjoint_runtime::cuda::CudaDevice::open(0).is_ok();
    if usable {
        assert_succeeds(&r, GOOD_OUT);
    } else {
        assert_fails(&r, "", &["error: cannot use CUDA: "]);
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    }
    // The CPU is the default, and can be named.
    assert_succeeds(
        &adjoint(&dir, &["run", "good.adj", "--device", "cpu"]),
        GOOD_OUT,
    );
    // An unknown device is a usage error from the argument parser.
    let r = adjoint(&dir, &["run", "good.adj", "--device", "tpu"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("invalid value 'tpu'"), "{r:?}");
}

/// `emit --stage cuda` prints the CUDA C of the fused kernels; no GPU is
/// needed.
#[test]
fn emit_cuda_source() {
    let dir = Dir::new("emit-cuda");
    dir.write(
        "k.adj",
        "fn main() { let x = f32(randn([128, 64], seed = 1)); print(sum(exp(x) * 2.0)); }",
    );
    let r = adjoint(&dir, &["emit", "k.adj", "--stage", "cuda"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.starts_with("// 1 CUDA kernels\n"), "{r:?}");
    assert!(r.stdout.contains("extern \"C\" __global__"), "{r:?}");
    assert!(r.stdout.contains("expf(v0)"), "{r:?}");
    assert!(r.stdout.contains("__shfl_down_sync"), "{r:?}");
}

/// `adjoint run FILE -- ARGS` passes the arguments to `fn main(args)` as a
/// tuple of strings; `int(s)` of one decides a shape; `load_csv` reads a
/// table with a header; `format` writes the numbers.
#[test]
fn main_takes_command_line_arguments() {
    let d = Dir::new("main-args");
    d.write("data.csv", "x,y\n1.5,2\n-3,4e-1\n\n0.25, 8\n");
    d.write(
        "prog.adj",
        "\
fn main(args) {
    let n = int(args.0);
    let lr = float(args.1);
    let t = load_csv(\"data.csv\");
    print(format(\"{} {:.3} {}\", n, lr, shape(t)), zeros([n]));
    print(format(\"{:.2} | {:>7.1e} | {:<4}|\", sum(t, axis = 0), lr, n) + \" done\");
}
",
    );
    let want = "3 0.010 (3, 2) [0.0, 0.0, 0.0]\n[-1.25, 10.40] |  1.0e-2 | 3   | done\n";
    for mode in ["graph", "eager"] {
        assert_succeeds(
            &adjoint(&d, &["run", "prog.adj", "--mode", mode, "--", "3", "0.01"]),
            want,
        );
    }
    assert_succeeds(&adjoint(&d, &["check", "prog.adj", "--", "3", "0.01"]), "");
    // A bad number is an error at the conversion; missing arguments at the
    // use; arguments for a `main` without a parameter are refused.
    let r = adjoint(&d, &["run", "prog.adj", "--", "three", "0.01"]);
    assert_fails(&r, "", &["int: \"three\" is not an integer", "prog.adj:2:"]);
    let r = adjoint(&d, &["run", "prog.adj"]);
    assert_fails(&r, "", &["out of range", "prog.adj:2:"]);
    d.write("plain.adj", "fn main() { print(1); }\n");
    let r = adjoint(&d, &["run", "plain.adj", "--", "x"]);
    assert_fails(&r, "", &["declare `fn main(args)`"]);
    // A CSV row of another width is an error naming the line.
    d.write("bad.csv", "1,2\n3\n");
    d.write("bad.adj", "fn main() { print(load_csv(\"bad.csv\")); }\n");
    let r = adjoint(&d, &["run", "bad.adj", "--mode", "eager"]);
    assert_fails(
        &r,
        "",
        &["\"bad.csv\" line 2: 1 value, but the rows before have 2"],
    );
}

#[test]
fn time_passes_prints_each_stage() {
    let d = Dir::new("time_passes");
    d.write(
        "loop.adj",
        "fn f(x) {
    let mut y = x;
    for i in 0..3 { y = sin(y) * x; }
    y
}
fn main() { print(grad(f)(0.5)); }
",
    );
    let r = adjoint(&d, &["run", "loop.adj", "--time-passes"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    // the program's output is unchanged; the table goes to stderr
    assert_eq!(r.stdout, adjoint(&d, &["run", "loop.adj"]).stdout);
    let rows: Vec<(&str, f64)> = r
        .stderr
        .lines()
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let ms = cols[cols.len() - 3].parse().expect("ms");
            (l.split("  ").find(|s| !s.is_empty()).unwrap().trim(), ms)
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
    for stage in [
        "parse and lower",
        "differentiate",
        "type check",
        "optimise",
        "round",
        "typed pass",
        "fusion",
        "VM code",
    ] {
        assert!(names.contains(&stage), "{stage} missing in {}", r.stderr);
    }
    // an inner stage never takes longer than the stage containing it
    let total = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().1;
    assert!(total("round") <= total("optimise"), "{}", r.stderr);
    // `check` times its stages too, and nothing is printed without the flag
    let c = adjoint(&d, &["check", "loop.adj", "--time-passes"]);
    assert!(c.stderr.contains("type check"), "{c:?}");
    assert!(adjoint(&d, &["check", "loop.adj"]).stderr.is_empty());
}
