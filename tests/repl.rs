//! `adjoint repl`, driven as a separate process: through a pipe (standard
//! input not a terminal: no prompts, no editing) and through a
//! pseudo-terminal (rustyline's editing and history).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The outcome of one session.
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

/// Runs `adjoint repl ARGS` with `input` piped to its standard input.
fn repl(args: &[&str], input: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_adjoint"))
        .arg("repl")
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("ADJOINT_HISTORY", "")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start adjoint repl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write the session");
    let out = child.wait_with_output().expect("wait for adjoint repl");
    let r = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    for bad in ["panicked", "RUST_BACKTRACE", "internal error"] {
        assert!(!r.stderr.contains(bad), "stderr mentions `{bad}`:\n{r:?}");
    }
    // A piped session fails as a whole when one of its inputs failed.
    let failed = r.stderr.contains("Error:") || r.stderr.contains("error:");
    assert_eq!(r.code, Some(if failed { 1 } else { 0 }), "{r:?}");
    r
}

/// sin(x) + x cos(x): the derivative of sin(x) x (1.3668683913... at 1.2).
fn dfdx(x: f64) -> f64 {
    x.sin() + x * x.cos()
}

#[test]
fn the_issue_session_prints_the_gradient_and_the_ir() {
    let r = repl(&[], "fn f(x) = sin(x) * x\ngrad(f)(1.2)\n:ir grad(f)\n");
    let mut lines = r.stdout.lines();
    let g: f64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("a number first:\n{r:?}"));
    assert_eq!(g, dfdx(1.2), "{r:?}");
    assert!((g - 1.36687).abs() < 1e-5);
    // The IR of `grad(f)`: the hidden input function, the gradient graph,
    // the J transform of `f` and its backpropagator, and the rules of the
    // primitives (the derivative of `sin` is a `cos`).
    let ir: Vec<&str> = lines.collect();
    // A graph's header, after its role if it has one (`reverse graph @J.f(`).
    let header = |l: &str, g: &str| {
        l.starts_with(g)
            || l.split_once(' ')
                .is_some_and(|(_, rest)| rest.starts_with(g))
    };
    assert!(ir.iter().any(|l| header(l, "graph @__repl_input")), "{r:?}");
    for g in [
        "graph @grad.f(",
        "graph @J.f(",
        "graph @B.f(",
        "graph @bprop.sin(",
    ] {
        assert!(ir.iter().any(|l| header(l, g)), "no {g}:\n{r:?}");
    }
    assert!(
        ir.iter().filter(|l| header(l, "graph @")).count() >= 4,
        "the gradient's graphs:\n{r:?}"
    );
    assert!(ir.iter().any(|l| l.contains("sin(")), "{r:?}");
    assert!(ir.iter().any(|l| l.contains("cos(")), "{r:?}");
    assert_eq!(r.stderr, "");
}

#[test]
fn an_error_prints_a_diagnostic_and_the_session_goes_on() {
    let r = repl(
        &[],
        "fn f(x) = sin(x) * x\n\
         f(undefined_thing)\n\
         [1.0, 2.0] @ [[1.0, 2.0, 3.0]]\n\
         :nonsense\n\
         fn broken(x) = x +\n\
         )\n\
         f(1.2)\n",
    );
    assert!(r.stderr.contains("undefined_thing"), "{r:?}");
    // Places are counted in the entry that was typed, not in the program
    // the REPL generates.
    assert!(
        r.stderr.contains("<input 2>:1:3"),
        "a file:line:col:\n{r:?}"
    );
    assert!(!r.stderr.contains("<repl>"), "{r:?}");
    assert!(
        r.stderr.contains("matmul") || r.stderr.contains("@"),
        "{r:?}"
    );
    assert!(r.stderr.contains("unknown command `:nonsense`"), "{r:?}");
    assert_eq!(
        r.stdout.trim().parse::<f64>().ok(),
        Some(1.2f64.sin() * 1.2),
        "{r:?}"
    );
}

#[test]
fn assignments_change_a_let_mut_of_the_session() {
    // (An outside probe found `z = 2.0;` dropped without a word.)
    let r = repl(
        &[],
        "let mut z = 1.0\nz = 2.0;\nz\nz += 3.0\nz\nlet mut v = [1.0, 2.0]\nv[1] = 5.0\nv\nz == 5.0\n",
    );
    assert_eq!(r.stdout, "2.0\n5.0\n[1.0, 5.0]\ntrue\n", "{r:?}");
}

#[test]
fn loops_and_ifs_at_the_prompt_keep_their_assignments() {
    // (An outside probe found the loop's effect lost at the next input.)
    let r = repl(
        &[],
        "let mut s = 0.0\nfor i in 0..4 { s += 1.5; }\ns\nif s > 5.0 { s = -s; }\ns\n\
         let mut k = 0\nwhile k < 3 {\n    k += 1;\n}\nk\n",
    );
    assert_eq!(r.stdout, "6.0\n-6.0\n3\n", "{r:?}");
}

#[test]
fn what_an_input_computed_and_printed_is_not_run_again() {
    // The session keeps values, not statements: a loop that prints runs
    // once, however many inputs follow (an outside probe found every later
    // input printing "step" again, and recomputing the loop).
    let r = repl(
        &[],
        "let mut s = 0.0
for i in 0..3 { s += 1.0; print(\"step\", i); }
s
s * 2.0
         let data = [1.0, 2.0, 3.0]; print(\"made\");
sum(data) + s
",
    );
    assert_eq!(
        r.stdout, "step 0\nstep 1\nstep 2\n3.0\n6.0\nmade\n9.0\n",
        "{r:?}"
    );
    // Tuple assignments, blocks, indexed updates and `if`s keep what they
    // assign; a closure (which cannot be kept as a value) is replayed.
    let r = repl(
        &[],
        "let (mut p, mut q) = (1.0, 2.0);
(p, q) = (q, p);
p - q
{ p = 7.0; }
p
         let mut w = [1.0, 2.0, 3.0]
w[1] = 9.0;
w
let f = |x| x * p;
f(2.0)
         if p > 1.0 { w = w * 2.0; q = 0.5; }
(w, q)
let v = [1.0]
v[0] = 2.0;
v
",
    );
    assert_eq!(
        r.stdout, "1.0\n7.0\n[1.0, 9.0, 3.0]\n14.0\n([2.0, 18.0, 6.0], 0.5)\n[1.0]\n",
        "{r:?}"
    );
    assert!(r.stderr.contains("immutable variable `v`"), "{r:?}");
    // A closure keeps the values it captured when it was made.
    let r = repl(
        &[],
        "let mut s = 3.0\nlet f = |x| x * s\ns = 100.0;\nf(2.0)\nlet g = |x| f(x) + s\ng(1.0)\n",
    );
    assert_eq!(r.stdout, "6.0\n103.0\n", "{r:?}");
    // Shadowing a captured variable leaves the closure its value; an
    // assignment typed without `;` to a name the session lacks is an
    // error about that name (an outside probe found a parse error in
    // generated code, and a session every later input of which failed).
    let r = repl(
        &[],
        "k = k + 1\nlet x = 3.0\nlet c = |z| z * x\nlet x = 10.0\nc(2.0)\nx\n1.0 + 1.0\n",
    );
    assert_eq!(r.stdout, "6.0\n10.0\n2.0\n", "{r:?}");
    assert!(r.stderr.contains("unknown name `k`"), "{r:?}");
}

#[test]
fn an_unterminated_string_is_an_error_at_once() {
    // (An outside probe found it swallowed the inputs after it.)
    let r = repl(&[], "print(\"abc)\n1.0 + 1.0\n");
    assert_eq!(r.stdout, "2.0\n", "{r:?}");
    assert!(r.stderr.contains("unterminated string"), "{r:?}");
}

#[test]
fn unclosed_brackets_continue_the_input() {
    let r = repl(
        &[],
        "fn power(x, n: i64) {\n\
         \x20   let mut acc = 1.0;\n\
         \x20   for i in 0..n {\n\
         \x20       acc = acc * x;\n\
         \x20   }\n\
         \x20   acc\n\
         }\n\
         power(2.0,\n\
         \x20     10)\n\
         sum([[1.0, 2.0],\n\
         \x20    [3.0, 4.0]])\n",
    );
    assert_eq!(r.stdout, "1024.0\n10.0\n", "{r:?}");
}

#[test]
fn mode_switches_and_both_modes_agree() {
    let session = "fn f(x) = sum(tanh(x) * x)\n\
                   grad(f)([0.5, -1.0, 2.0])\n\
                   :mode\n\
                   :mode eager\n\
                   :mode\n\
                   grad(f)([0.5, -1.0, 2.0])\n";
    let r = repl(&[], session);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{r:?}");
    assert_eq!(lines[1], "graph");
    assert_eq!(lines[2], "mode: eager");
    assert_eq!(lines[3], "eager");
    assert_eq!(lines[0], lines[4], "graph and eager mode differ:\n{r:?}");
    let want: Vec<f64> = [0.5f64, -1.0, 2.0]
        .iter()
        .map(|x| x.tanh() + x * (1.0 - x.tanh() * x.tanh()))
        .collect();
    let got: Vec<f64> = lines[4]
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|s| s.parse().unwrap())
        .collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
    }
    // `--mode eager` starts there.
    let r = repl(&["--mode", "eager"], ":mode\n");
    assert_eq!(r.stdout, "eager\n");
}

#[test]
fn load_adds_a_files_definitions() {
    let dir = std::env::temp_dir().join(format!("adjoint-repl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("defs.adj");
    // An import in a loaded file is relative to that file.
    std::fs::write(dir.join("helpers.adj"), "fn square(x) = x * x\n").unwrap();
    std::fs::write(
        &file,
        "import \"helpers.adj\" as h\n\nfn cube(x) {\n    x * h.square(x)\n}\n",
    )
    .unwrap();
    let r = repl(
        &[],
        &format!(
            ":load {}\ncube(3.0)\n:grad cube 2.0\n:load {}\ncube(1.0)\n",
            file.display(),
            dir.join("missing.adj").display()
        ),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            &format!("loaded 2 definitions from {}", file.display()) as &str,
            "27.0",
            "grad(cube) : (x: f64[]) -> f64[]",
            "12.0",
            "1.0"
        ],
        "{r:?}"
    );
    assert!(r.stderr.contains("missing.adj"), "{r:?}");
    assert!(r.stderr.contains("no such file"), "{r:?}");
}

#[test]
fn type_opt_time_and_lets() {
    let r = repl(
        &[],
        "let w = [[1.0, 2.0], [3.0, 4.0]]\n\
         fn loss(v) = sum(v * v)\n\
         :type w @ w\n\
         :type grad(loss)\n\
         :opt grad(loss)(w)\n\
         :time loss(w)\n\
         loss(w)\n",
    );
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "f64[2, 2]", "{r:?}");
    assert!(
        lines[1].contains("function") || lines[1].contains("fn"),
        "{r:?}"
    );
    assert!(lines[2].starts_with("// optimised:"), "{r:?}");
    assert!(r.stdout.contains("graph @__repl_input"), "{r:?}");
    let time = lines
        .iter()
        .position(|l| l.starts_with("time: load "))
        .unwrap_or_else(|| panic!("a time line:\n{r:?}"));
    assert_eq!(lines[time - 1], "30.0");
    assert_eq!(lines[time + 1], "30.0");
    assert_eq!(r.stderr, "");
}

#[test]
fn quit_ends_the_session_and_help_lists_commands() {
    let r = repl(&[], ":help\n:quit\n1.0 + 1.0\n");
    for cmd in [
        ":grad", ":ir", ":opt", ":type", ":mode", ":load", ":time", ":quit",
    ] {
        assert!(r.stdout.contains(cmd), "help lacks {cmd}:\n{r:?}");
    }
    assert!(!r.stdout.contains("2.0"), "ran past :quit:\n{r:?}");
}

#[test]
fn hostile_input_never_ends_the_session() {
    let mut s = String::new();
    let deep = format!("{}1.0{}", "(".repeat(300), ")".repeat(300));
    for bad in [
        deep.as_str(),
        "fn",
        "let",
        "let = 3",
        "fn f(x) = f(x) + 1.0",
        "f(1.0)",
        ":grad nothere",
        ":grad f [1.0, 2.0]",
        ":ir",
        ":load",
        "\"unterminated string\"",
        "}}}}",
        ")))",
        ":type grad",
        "print",
        "1 / 0",
        "[1.0, 2.0][7]",
        "zeros([100000000000, 100000000000])",
    ] {
        s.push_str(bad);
        s.push('\n');
    }
    s.push_str("40 + 2\n");
    // An input still open at the end of the input is compiled as it is.
    s.push_str("grad(grad(grad(\n");
    let r = repl(&[], &s);
    assert!(r.stdout.trim_end().ends_with("42"), "{r:?}");
    let last = r.stderr.rsplit("Error:").next().unwrap_or_default();
    assert!(last.contains("expected an expression"), "{r:?}");
    let errors = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("Error:") || l.starts_with("error:"))
        .count();
    assert!(errors >= 16, "{errors} errors:\n{r:?}");
}

/// `adjoint repl` in a pseudo-terminal with its history in `history`,
/// at its first prompt; `None` (with a message) where no pseudo-terminal
/// can be made.
#[cfg(unix)]
fn spawn_terminal(history: &std::path::Path) -> Option<expectrl::session::OsSession> {
    use expectrl::Expect;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_adjoint"));
    cmd.arg("repl")
        .env("ADJOINT_HISTORY", history)
        .env("TERM", "xterm");
    let mut p = match expectrl::Session::spawn(cmd) {
        Ok(p) => p,
        Err(e) => {
            println!("skipped: no pseudo-terminal in this environment ({e})");
            return None;
        }
    };
    p.set_expect_timeout(Some(std::time::Duration::from_secs(60)));
    p.expect("adjoint> ").expect("a prompt");
    Some(p)
}

/// A pseudo-terminal session: prompts, line editing and history.
#[cfg(unix)]
#[test]
fn a_terminal_session_with_history() {
    use expectrl::{Expect, Regex};
    let dir = std::env::temp_dir().join(format!("adjoint-repl-pty-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let history: PathBuf = dir.join("history");
    let Some(mut p) = spawn_terminal(&history) else {
        return;
    };
    p.send_line("fn f(x) = sin(x) * x").unwrap();
    p.expect("adjoint> ").expect("a prompt after a definition");
    p.send_line("grad(f)(").unwrap();
    p.expect("... ").expect("a continuation prompt");
    // Line editing: type 1.3, rub out the 3 (DEL), then finish the line.
    p.send("1.3").unwrap();
    p.send("\x7f").unwrap();
    p.send_line("2)").unwrap();
    let found = p.expect(Regex(r"1\.3668[0-9]+")).expect("the gradient");
    let text = String::from_utf8_lossy(found.get(0).unwrap()).into_owned();
    assert_eq!(text.parse::<f64>().unwrap(), dfdx(1.2));
    p.send_line(":quit").unwrap();
    p.expect(expectrl::Eof).expect("the REPL ends");
    let saved = std::fs::read_to_string(&history).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(saved.contains("fn f(x) = sin(x) * x"), "history: {saved:?}");
    assert!(saved.contains("1.2)"), "history: {saved:?}");
}

/// Ctrl-C stops an input that does not end, and the session goes on with
/// its definitions.
#[cfg(unix)]
#[test]
fn ctrl_c_interrupts_a_running_input() {
    use expectrl::{Expect, Regex};
    let history = std::env::temp_dir().join("adjoint-repl-ctrlc-history");
    let Some(mut p) = spawn_terminal(&history) else {
        return;
    };
    p.send_line("fn spin(n) = if n < 0 { n } else { spin(n + 1) }")
        .unwrap();
    p.expect("adjoint> ").expect("a prompt after a definition");
    p.send_line("spin(0)").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send("\x03").unwrap();
    p.expect("interrupted").expect("the input is interrupted");
    p.expect("adjoint> ").expect("a prompt after the interrupt");
    p.send_line("spin(-3) * 2").unwrap();
    p.expect(Regex(r"-6")).expect("the session goes on");
    p.send_line(":quit").unwrap();
    p.expect(expectrl::Eof).expect("the REPL ends");
}

/// A line ending in an operator continues on the next; a piped script
/// exits with status 1 when an input fails, after running the others.
#[test]
fn trailing_operators_continue_and_failures_set_the_exit_status() {
    let r = repl(&[], "let a = 1.0 +\n  2.0\nprint(a * 2.0)\n");
    assert_eq!(r.stdout, "6.0\n", "{r:?}");
    assert_eq!(r.code, Some(0), "{r:?}");
    let r = repl(&[], "print(nope)\nprint(1.5)\n");
    assert_eq!(r.stdout, "1.5\n", "{r:?}");
    assert_eq!(r.code, Some(1), "{r:?}");
}
