//! End-to-end program tests: every `tests/programs/*.adj` file (not
//! `tests/programs/modules/`) is run with `adjoint run FILE` from the
//! repository root, and its stdout, stderr and exit status are compared with
//! the expectations written in its trailing comments:
//!
//! - `// out: TEXT`: one line of expected stdout, in order (`// out:` alone
//!   is an empty line); stdout must match exactly.
//! - `// error: TEXT`: the program must fail (exit status 1) and stderr must
//!   contain TEXT.
//! - `// error-at: L:C`: stderr must contain `:L:C` (1-based line and column
//!   of the primary location of the error).
//!
//! Environment:
//!
//! Every program runs in both modes, graph (the optimiser) and eager, and
//! must meet its expectations in each: the output is compared exactly, so
//! the two modes agree.
//!
//! - `ADJOINT_MODE=eager|graph` runs only that mode.
//! - `ADJOINT_FILTER=SUBSTR` runs only the files whose name contains SUBSTR.
//! - `ADJOINT_TIMEOUT=SECONDS` changes the per-program time limit (default 60).
//! - `ADJOINT_JOBS=N` runs N programs at a time (default: available cores).
//!
//! All failures are collected and reported together. The format is described
//! in `tests/programs/README.md`.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What a program file says it should do.
#[derive(Debug, Default)]
struct Expectation {
    /// Expected stdout lines, in order.
    out: Vec<String>,
    /// Substrings stderr must contain; non-empty means the program must fail.
    errors: Vec<String>,
    /// `LINE:COL` locations stderr must contain (as `:LINE:COL`).
    error_at: Vec<String>,
}

impl Expectation {
    fn expects_failure(&self) -> bool {
        !self.errors.is_empty()
    }

    fn expected_stdout(&self) -> String {
        let mut s = String::new();
        for line in &self.out {
            s.push_str(line);
            s.push('\n');
        }
        s
    }
}

/// Reads the `// out:`, `// error:` and `// error-at:` lines of a program.
fn parse_expectation(src: &str) -> Result<Expectation, String> {
    let mut e = Expectation::default();
    for (i, raw) in src.lines().enumerate() {
        let line = raw.trim_end_matches('\r').trim_start();
        // Check `error-at` before `error` (it shares the prefix `// error`).
        if let Some(rest) = line.strip_prefix("// error-at:") {
            let loc = rest.trim();
            let ok = match loc.split_once(':') {
                Some((l, c)) => l.parse::<u32>().is_ok() && c.parse::<u32>().is_ok(),
                None => false,
            };
            if !ok {
                return Err(format!(
                    "line {}: `// error-at:` wants LINE:COL, got `{loc}`",
                    i + 1
                ));
            }
            e.error_at.push(loc.to_string());
        } else if let Some(rest) = line.strip_prefix("// error:") {
            let text = rest.trim();
            if text.is_empty() {
                return Err(format!("line {}: empty `// error:`", i + 1));
            }
            e.errors.push(text.to_string());
        } else if let Some(rest) = line.strip_prefix("// out:") {
            // Exactly one separating space is dropped; the rest is kept.
            let text = rest.strip_prefix(' ').unwrap_or(rest);
            e.out.push(text.to_string());
        }
    }
    if e.out.is_empty() && e.errors.is_empty() {
        return Err("no `// out:` or `// error:` lines".to_string());
    }
    if !e.error_at.is_empty() && e.errors.is_empty() {
        return Err("`// error-at:` without `// error:`".to_string());
    }
    Ok(e)
}

/// One program's outcome: its index in the sorted list, its path, and the
/// problems found (empty when it passed).
type Outcome = (usize, PathBuf, Vec<String>);

/// The result of running one program.
struct RunOutput {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    timed_out: bool,
    elapsed: Duration,
}

/// Runs the binary on `file` with a time limit; kills it when the limit passes.
fn run_program(
    bin: &Path,
    root: &Path,
    file: &Path,
    mode: Option<&str>,
    timeout: Duration,
) -> Result<RunOutput, String> {
    let mut cmd = Command::new(bin);
    cmd.arg("run").arg(file);
    if let Some(m) = mode {
        cmd.arg("--mode").arg(m);
    }
    cmd.current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;

    // Drain both pipes on their own threads so a chatty child cannot block.
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let out_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });

    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {
                if start.elapsed() >= timeout {
                    timed_out = true;
                    let _ = child.kill();
                    break child.wait().ok();
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("waiting for the child failed: {e}"));
            }
        }
    };
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    Ok(RunOutput {
        status,
        stdout,
        stderr,
        timed_out,
        elapsed,
    })
}

/// Checks one program in each mode; returns a description of every
/// mismatch.
fn check_program(
    bin: &Path,
    root: &Path,
    file: &Path,
    modes: &[String],
    timeout: Duration,
) -> Vec<String> {
    let mut problems = Vec::new();
    for mode in modes {
        for p in check_program_in(bin, root, file, Some(mode), timeout) {
            problems.push(format!("[mode {mode}] {p}"));
        }
    }
    problems
}

/// Checks one program in one mode.
fn check_program_in(
    bin: &Path,
    root: &Path,
    file: &Path,
    mode: Option<&str>,
    timeout: Duration,
) -> Vec<String> {
    let src = match fs::read_to_string(root.join(file)) {
        Ok(s) => s,
        Err(e) => return vec![format!("cannot read the program: {e}")],
    };
    let exp = match parse_expectation(&src) {
        Ok(e) => e,
        Err(msg) => return vec![format!("malformed test file: {msg}")],
    };
    let run = match run_program(bin, root, file, mode, timeout) {
        Ok(r) => r,
        Err(msg) => return vec![msg],
    };

    let mut problems = Vec::new();
    if run.timed_out {
        problems.push(format!(
            "timed out after {:.1} s (killed)",
            run.elapsed.as_secs_f64()
        ));
    }
    let code = run.status.and_then(|s| s.code());
    let want_code = if exp.expects_failure() { 1 } else { 0 };
    if !run.timed_out && code != Some(want_code) {
        let got = match (code, run.status) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("terminated abnormally ({s})"),
            (None, None) => "no exit status".to_string(),
        };
        problems.push(format!("expected exit status {want_code}, got {got}"));
    }
    let want_stdout = exp.expected_stdout();
    if run.stdout != want_stdout {
        problems.push(format!(
            "stdout differs\n{}",
            diff_lines(&want_stdout, &run.stdout)
        ));
    }
    for needle in &exp.errors {
        if !run.stderr.contains(needle.as_str()) {
            problems.push(format!("stderr does not contain `{needle}`"));
        }
    }
    for loc in &exp.error_at {
        let needle = format!(":{loc}");
        if !run.stderr.contains(&needle) {
            problems.push(format!("stderr does not contain the location `{needle}`"));
        }
    }
    if !problems.is_empty() {
        problems.push(format!("stderr:\n{}", indent(&run.stderr)));
    }
    problems
}

/// A line-by-line comparison of expected and actual output.
fn diff_lines(want: &str, got: &str) -> String {
    let w: Vec<&str> = want.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut s = String::new();
    for i in 0..w.len().max(g.len()) {
        let a = w.get(i).copied();
        let b = g.get(i).copied();
        let mark = if a == b { ' ' } else { '!' };
        s.push_str(&format!(
            "  {mark} {:>3} | expected: {:<40} | actual: {}\n",
            i + 1,
            a.map(|x| format!("{x:?}"))
                .unwrap_or_else(|| "<none>".into()),
            b.map(|x| format!("{x:?}"))
                .unwrap_or_else(|| "<none>".into()),
        ));
    }
    if !got.is_empty() && !got.ends_with('\n') {
        s.push_str("  (actual stdout does not end with a newline)\n");
    }
    s
}

fn indent(text: &str) -> String {
    if text.is_empty() {
        return "    <empty>".to_string();
    }
    // Keep reports readable when a program floods stderr.
    const LIMIT: usize = 4000;
    let t = if text.len() > LIMIT {
        let mut cut = LIMIT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}\n... ({} more bytes)", &text[..cut], text.len() - cut)
    } else {
        text.to_string()
    };
    t.lines().map(|l| format!("    {l}\n")).collect()
}

/// The `.adj` files directly inside `tests/programs/`, sorted by name.
fn program_files(root: &Path, filter: Option<&str>) -> Vec<PathBuf> {
    let dir = root.join("tests").join("programs");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "adj"))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            filter.is_none_or(|f| name.contains(f))
        })
        .map(|p| {
            // Run by the path relative to the root, so diagnostics stay short.
            Path::new("tests")
                .join("programs")
                .join(p.file_name().unwrap())
        })
        .collect();
    files.sort();
    files
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[test]
fn programs() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_adjoint"));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mode = env_nonempty("ADJOINT_MODE");
    let modes: Vec<String> = match &mode {
        Some(m) => vec![m.clone()],
        None => vec!["graph".to_string(), "eager".to_string()],
    };
    let filter = env_nonempty("ADJOINT_FILTER");
    let timeout = Duration::from_secs_f64(
        env_nonempty("ADJOINT_TIMEOUT")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(60.0),
    );
    let jobs = env_nonempty("ADJOINT_JOBS")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or_else(|| thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);

    // Some programs write files under target/.
    let _ = fs::create_dir_all(root.join("target"));

    let files = program_files(&root, filter.as_deref());
    if files.is_empty() {
        if filter.is_some() {
            eprintln!("no program matches ADJOINT_FILTER={filter:?}");
            return;
        }
        panic!("no programs found in tests/programs");
    }

    // A small pool of workers over a shared queue of files.
    let queue = Arc::new(Mutex::new(files.clone().into_iter().enumerate()));
    let results: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..jobs.min(files.len()))
        .map(|_| {
            let queue = Arc::clone(&queue);
            let results = Arc::clone(&results);
            let bin = bin.clone();
            let root = root.clone();
            let modes = modes.clone();
            thread::spawn(move || loop {
                let next = queue.lock().unwrap().next();
                let Some((i, file)) = next else { break };
                let problems = check_program(&bin, &root, &file, &modes, timeout);
                results.lock().unwrap().push((i, file, problems));
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker thread panicked");
    }

    let mut results = std::mem::take(&mut *results.lock().unwrap());
    results.sort_by_key(|(i, _, _)| *i);
    let total = results.len();
    let failures: Vec<_> = results
        .into_iter()
        .filter(|(_, _, p)| !p.is_empty())
        .collect();

    if failures.is_empty() {
        eprintln!(
            "{total} programs passed{}",
            mode.as_deref()
                .map(|m| format!(" (mode {m})"))
                .unwrap_or_default()
        );
        return;
    }
    let mut report = String::new();
    for (_, file, problems) in &failures {
        report.push_str(&format!("==== FAIL {}\n", file.display()));
        for p in problems {
            report.push_str(&format!("  - {}\n", p.trim_end()));
        }
        report.push('\n');
    }
    let names: Vec<String> = failures
        .iter()
        .map(|(_, f, _)| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    eprintln!("{report}");
    panic!(
        "{} of {} programs failed{}: {}",
        failures.len(),
        total,
        mode.as_deref()
            .map(|m| format!(" (mode {m})"))
            .unwrap_or_default(),
        names.join(", ")
    );
}
