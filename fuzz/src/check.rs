//! Running a program through `adjoint` in several configurations and
//! checking the oracles.

use crate::gen::Meta;
use crate::value::{parse_line, PVal};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One way of running a program.
pub struct Config {
    pub name: &'static str,
    pub mode: &'static str,
    /// Extra arguments of `adjoint run`.
    pub args: &'static [&'static str],
    /// Relative tolerance when this configuration's output is compared
    /// with another's: 1e-12 on the CPU (the same operations, maybe in
    /// another order); looser on the GPU, whose `exp`, `log`, `tanh`, ..
    /// may differ from the CPU's libm in the last bits, which cancellation
    /// can magnify. A wrong value is off by far more.
    pub rel: f64,
    pub env: &'static [(&'static str, &'static str)],
}

pub const CONFIGS: [Config; 6] = [
    Config {
        name: "eager",
        mode: "eager",
        args: &[],
        rel: 1e-12,
        env: &[],
    },
    Config {
        name: "graph",
        mode: "graph",
        args: &[],
        rel: 1e-12,
        env: &[],
    },
    Config {
        name: "graph+NO_SCALAR_JIT",
        mode: "graph",
        args: &[],
        rel: 1e-12,
        env: &[("ADJOINT_NO_SCALAR_JIT", "1")],
    },
    Config {
        name: "graph+NO_TAPE",
        mode: "graph",
        args: &[],
        rel: 1e-12,
        env: &[("ADJOINT_NO_TAPE", "1")],
    },
    Config {
        name: "graph+NO_SIDE_OUTPUTS",
        mode: "graph",
        args: &[],
        rel: 1e-12,
        env: &[("ADJOINT_NO_SIDE_OUTPUTS", "1")],
    },
    Config {
        name: "graph+cuda",
        mode: "graph",
        args: &["--device", "cuda"],
        rel: 1e-7,
        env: &[],
    },
];
pub const EAGER: usize = 0;
pub const GRAPH: usize = 1;
/// Graph mode with the fused kernels on the GPU (`--cuda`).
pub const CUDA: usize = 5;

#[derive(Clone, Debug)]
pub struct CheckOpts {
    pub adjoint: PathBuf,
    pub timeout: Duration,
    /// Flag a compile (`adjoint emit --stage kernels`) taking longer than this (seconds); `None`: do
    /// not time the compile.
    pub max_compile_secs: Option<f64>,
}

pub struct RunOut {
    /// Exit code; `None` when killed by the timeout or a signal.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub secs: f64,
    /// Processor time of the run (user and system, all its threads), as
    /// last seen while it ran (Linux's `/proc`; `None` elsewhere): unlike
    /// the wall time, it does not grow when other work holds the cores.
    pub cpu_secs: Option<f64>,
}

/// The processor time process `pid` has used so far, from
/// `/proc/PID/stat` (its `utime` and `stime`, in clock ticks of 1/100 s,
/// Linux's value on every platform it runs on).
fn cpu_time(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses: state is
    // the first, utime the twelfth, stime the thirteenth.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Runs `adjoint ARGS` with a timeout, output going through files in `dir`.
pub fn run_adjoint(opts: &CheckOpts, args: &[&str], env: &[(&str, &str)], dir: &Path) -> RunOut {
    let out_p = dir.join("stdout.txt");
    let err_p = dir.join("stderr.txt");
    let start = Instant::now();
    let spawn = (|| -> std::io::Result<std::process::Child> {
        let out = File::create(&out_p)?;
        let err = File::create(&err_p)?;
        let mut cmd = Command::new(&opts.adjoint);
        cmd.args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // the fuzzer's own environment must not switch optimisations off
        for k in [
            "ADJOINT_NO_SCALAR_JIT",
            "ADJOINT_NO_TAPE",
            "ADJOINT_NO_SIDE_OUTPUTS",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn()
    })();
    let mut child = match spawn {
        Ok(c) => c,
        Err(e) => {
            return RunOut {
                code: None,
                timed_out: false,
                stdout: String::new(),
                stderr: format!("fuzzer: cannot run {}: {e}", opts.adjoint.display()),
                secs: 0.0,
                cpu_secs: None,
            }
        }
    };
    let mut timed_out = false;
    let mut cpu_secs = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {
                cpu_secs = cpu_time(child.id()).or(cpu_secs);
                if start.elapsed() > opts.timeout {
                    let _ = child.kill();
                    let _ = child.wait();
                    timed_out = true;
                    break None;
                }
                let e = start.elapsed().as_millis();
                std::thread::sleep(Duration::from_millis(if e < 50 {
                    2
                } else if e < 1000 {
                    5
                } else {
                    20
                }));
            }
            Err(_) => break None,
        }
    };
    let secs = start.elapsed().as_secs_f64();
    RunOut {
        code: status.and_then(|s| s.code()),
        timed_out,
        stdout: std::fs::read_to_string(&out_p).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_p).unwrap_or_default(),
        secs,
        cpu_secs,
    }
}

/// One failed check. `class` groups failures of the same kind (and is what
/// the shrinker preserves); `configs` are the configurations that show it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub class: String,
    pub detail: String,
    pub configs: Vec<usize>,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub failures: Vec<Failure>,
    /// Every configuration rejected the program the same way.
    pub gen_invalid: Option<String>,
    pub fd_skipped: bool,
    pub hvp_skipped: bool,
    pub compile_secs: Option<f64>,
    pub run_secs: f64,
    /// Wall time of each configuration's run.
    pub config_secs: Vec<(usize, f64)>,
}

fn is_panic(stderr: &str) -> bool {
    stderr.contains("internal compiler error")
        || stderr.contains("panicked")
        || stderr.contains("ICE")
        || stderr.contains("RUST_BACKTRACE")
}

/// The place of a panic (`at compiler/src/x.rs:12`), for grouping.
fn panic_site(stderr: &str) -> String {
    for line in stderr.lines() {
        if let Some(k) = line.find("internal compiler error") {
            let rest = &line[k..];
            if let Some(a) = rest.rfind(" at ") {
                let site = &rest[a + 4..];
                if site.contains(".rs:") {
                    return site.trim().to_string();
                }
            }
            return rest.chars().take(80).collect();
        }
        if let Some(k) = line.find("panicked at ") {
            return line[k + 12..].trim().chars().take(80).collect();
        }
    }
    "unknown site".into()
}

/// Whether a diagnostic names `FILE:LINE:COL`.
fn has_location(stderr: &str, file: &str) -> bool {
    let mut rest = stderr;
    while let Some(k) = rest.find(file) {
        let after = &rest[k + file.len()..];
        let b = after.as_bytes();
        let mut i = 0;
        let mut parts = 0;
        while i < b.len() && b[i] == b':' {
            let st = i + 1;
            let mut j = st;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j == st {
                break;
            }
            parts += 1;
            i = j;
        }
        if parts >= 2 {
            return true;
        }
        rest = after;
    }
    false
}

fn first_error_line(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.contains("error"))
        .or_else(|| stderr.lines().next())
        .unwrap_or("")
        .trim()
        .chars()
        .take(200)
        .collect()
}

/// The kind of an error message, for grouping: `Error: broadcast_to: cannot
/// broadcast f64[1] to []` -> `broadcast_to: cannot broadcast`.
fn error_kind(msg: &str) -> String {
    let m = msg
        .trim_start_matches("Error:")
        .trim_start_matches("error:")
        .trim();
    let words: Vec<&str> = m
        .split_whitespace()
        .take_while(|w| {
            !w.contains([
                '[', '`', '(', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9',
            ])
        })
        .take(6)
        .collect();
    words.join(" ")
}

/// The group a label belongs to (for failure classes).
fn label_group(label: &str) -> &str {
    if label.starts_with("gfd") {
        "grad@x+hv"
    } else if label.starts_with("fd") {
        "f@x+hv"
    } else {
        label
    }
}

pub fn close(a: f64, b: f64, rel: f64, abs: f64) -> bool {
    if a.is_nan() && b.is_nan() {
        return true;
    }
    if a == b {
        return true;
    }
    (a - b).abs() <= rel * a.abs().max(b.abs()) + abs
}

type Lines = Vec<(String, PVal)>;

fn parse_output(stdout: &str) -> Lines {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_line)
        .collect()
}

/// Compares the outputs of two configurations.
fn compare(a: &Lines, b: &Lines, an: &str, bn: &str, ai: usize, bi: usize) -> Option<Failure> {
    for (k, ((la, va), (lb, vb))) in a.iter().zip(b).enumerate() {
        if la != lb || va.shape_sig() != vb.shape_sig() {
            return Some(Failure {
                class: format!(
                    "output differs {an} vs {bn}: structure of [{}]",
                    label_group(la)
                ),
                detail: format!("line {k}:\n  {an}: {la} {va:?}\n  {bn}: {lb} {vb:?}"),
                configs: vec![ai, bi],
            });
        }
        let (fa, fb) = (va.flat(), vb.flat());
        for (i, (x, y)) in fa.iter().zip(&fb).enumerate() {
            let rel = CONFIGS[ai].rel.max(CONFIGS[bi].rel);
            if !close(*x, *y, rel, rel) {
                return Some(Failure {
                    class: format!("value mismatch {an} vs {bn} [{}]", label_group(la)),
                    detail: format!(
                        "line `{la}`, element {i}: {an} = {x:e}, {bn} = {y:e}\n  {an}: {fa:?}\n  {bn}: {fb:?}"
                    ),
                    configs: vec![ai, bi],
                });
            }
        }
    }
    (a.len() != b.len()).then(|| Failure {
        class: format!("output differs {an} vs {bn}: line count"),
        detail: format!("{an} printed {} lines, {bn} {}", a.len(), b.len()),
        configs: vec![ai, bi],
    })
}

fn get<'a>(lines: &'a Lines, label: &str) -> Option<&'a PVal> {
    lines.iter().find(|(l, _)| l == label).map(|(_, v)| v)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn inf_norm(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// The mathematical oracles on one configuration's output. Returns the
/// failures and (fd_skipped, hvp_skipped).
fn oracles(lines: &Lines, meta: &Meta, cfg: usize) -> (Vec<Failure>, bool, bool) {
    let mut fails = Vec::new();
    let mut fail = |class: &str, detail: String| {
        fails.push(Failure {
            class: class.to_string(),
            detail,
            configs: vec![cfg],
        });
    };
    let n = meta.v.len();
    let scalar = |l: &str| -> Option<f64> {
        let f = get(lines, l)?.flat();
        if f.len() == 1 {
            Some(f[0])
        } else {
            None
        }
    };
    let fx = scalar("f");
    let g = get(lines, "grad").map(|v| v.flat());
    let t = scalar("jvp");
    if let Some(g) = &g {
        if g.len() != n {
            fail(
                "grad has the wrong size",
                format!("grad has {} numbers, the arguments {n}", g.len()),
            );
        }
    }
    let g = g.filter(|g| g.len() == n);
    // 1. <grad, v> = jvp tangent
    if let (Some(g), Some(t)) = (&g, t) {
        let gv = dot(g, &meta.v);
        let scale = 1f64
            .max(t.abs())
            .max(g.iter().zip(&meta.v).map(|(a, b)| (a * b).abs()).sum());
        if !(gv.is_finite() && t.is_finite()) || (gv - t).abs() > 1e-8 * scale {
            if gv.is_finite() || t.is_finite() {
                fail(
                    "grad . v != jvp tangent",
                    format!("<grad, v> = {gv:e}, jvp tangent = {t:e}\n  grad = {g:?}"),
                );
            }
        }
    }
    // vmap over three points equals the function and its gradient at each
    for (k, (fl, gl)) in [("f", "grad"), ("fd1p", "gfd1p"), ("fd1m", "gfd1m")]
        .iter()
        .enumerate()
    {
        for (mapped, single) in [(format!("vmap{k}"), fl), (format!("vgrad{k}"), gl)] {
            let (Some(a), Some(b)) = (get(lines, &mapped), get(lines, single)) else {
                continue;
            };
            let (a, b) = (a.flat(), b.flat());
            let sc = 1f64.max(inf_norm(&b));
            let same = a.len() == b.len()
                && a.iter().zip(&b).all(|(x, y)| {
                    (x.is_nan() && y.is_nan()) || x == y || close(*x, *y, 1e-9, 1e-9 * sc)
                });
            if !same {
                fail(
                    "vmap differs from the function at each point",
                    format!("{mapped} = {a:?}\n  {single} = {b:?}"),
                );
            }
        }
    }
    // vjp's primal equals f
    if let (Some(fx), Some(y)) = (fx, scalar("vjp_y")) {
        if !close(fx, y, 1e-12, 1e-12) {
            fail(
                "vjp primal != f",
                format!("f = {fx:e}, vjp's value = {y:e}"),
            );
        }
    }
    // 4. pullback of u = u * grad; int / bool cotangents are 0
    if let Some(pb) = get(lines, "vjp") {
        match pb {
            PVal::Tup(parts) if parts.len() == meta.n_float + meta.n_nondiff => {
                let mut pf = Vec::new();
                parts[..meta.n_float]
                    .iter()
                    .for_each(|p| p.flatten(&mut pf));
                if let Some(g) = &g {
                    if pf.len() != n {
                        fail(
                            "vjp cotangent has the wrong size",
                            format!("{} numbers, expected {n}", pf.len()),
                        );
                    } else {
                        let ug: Vec<f64> = g.iter().map(|x| x * meta.u).collect();
                        let sc = 1f64.max(inf_norm(&ug));
                        if pf
                            .iter()
                            .zip(&ug)
                            .any(|(a, b)| !close(*a, *b, 1e-9, 1e-9 * sc))
                        {
                            // transposition: <pb(u), v> vs u * jvp
                            let tr = t.map(|t| {
                                format!(
                                    "\n  <pb(u), v> = {:e}, u * jvp = {:e}",
                                    dot(&pf, &meta.v),
                                    meta.u * t
                                )
                            });
                            fail(
                                "vjp pullback != u * grad",
                                format!(
                                    "u = {}\n  pb(u)    = {pf:?}\n  u * grad = {ug:?}{}",
                                    meta.u,
                                    tr.unwrap_or_default()
                                ),
                            );
                        }
                    }
                }
                for (k, p) in parts[meta.n_float..].iter().enumerate() {
                    let z = p.flat();
                    if z.iter().any(|x| *x != 0.0) {
                        fail(
                            "vjp cotangent of an int/bool argument is not zero",
                            format!("argument {} (int/bool): cotangent {p:?}", meta.n_float + k),
                        );
                    }
                }
            }
            other => fail(
                "vjp pullback has the wrong structure",
                format!(
                    "expected a tuple of {} cotangents, got {other:?}",
                    meta.n_float + meta.n_nondiff
                ),
            ),
        }
    }
    // 5. finite differences
    let h = &meta.hs;
    let fd = |k: usize| -> Option<f64> {
        let p = scalar(&format!("fd{k}p"))?;
        let m = scalar(&format!("fd{k}m"))?;
        Some((p - m) / (2.0 * h[k]))
    };
    let mut fd_skipped = true;
    let mut hvp_skipped = true;
    let fd_applies = !meta.stop_gradient;
    if let (Some(fx), Some(t), Some(d4), Some(d3)) = (fx, t, fd(0), fd(1)) {
        // one-sided differences: at a kink exactly at x (a tie of max or min)
        // the central differences agree, but forward - backward is the jump
        // whatever h is, where for a smooth f it shrinks with h (h f'')
        let one_sided = |k: usize| -> Option<f64> {
            let p = scalar(&format!("fd{k}p"))?;
            let m = scalar(&format!("fd{k}m"))?;
            Some(((p - fx) - (fx - m)) / h[k])
        };
        let (fb4, fb3) = (one_sided(0).unwrap_or(0.0), one_sided(1).unwrap_or(0.0));
        let kink_at_x = fb4.abs() > 0.3 * fb3.abs() + 1e-9 * (1.0 + fx.abs());
        let smooth = fx.is_finite()
            && d4.is_finite()
            && d3.is_finite()
            && (d4 - d3).abs() <= 1e-3 * (1.0 + d4.abs())
            && !kink_at_x;
        if smooth {
            fd_skipped = !fd_applies;
            let tol = 1e-5 * (1.0 + t.abs()) + 0.05 * (d4 - d3).abs();
            if fd_applies && (!t.is_finite() || (t - d4).abs() > tol) {
                fail(
                    "jvp/grad disagree with finite differences",
                    format!(
                        "jvp tangent = {t:e}, central differences: h=1e-4 {d4:e}, h=1e-3 {d3:e}"
                    ),
                );
            }
            // 6. Hessian symmetry and the Hessian-vector product against
            // finite differences of the gradient
            let hv = get(lines, "hvp_v").map(|v| v.flat());
            let hw = get(lines, "hvp_w").map(|v| v.flat());
            if let (Some(hv), Some(hw)) = (&hv, &hw) {
                if hv.len() == n && hw.len() == n {
                    let a = dot(&meta.w, hv);
                    let b = dot(&meta.v, hw);
                    if !(a.is_finite() && b.is_finite())
                        || (a - b).abs() > 1e-7 * 1f64.max(a.abs()).max(b.abs())
                    {
                        fail(
                            "Hessian not symmetric (<w, Hv> != <v, Hw>)",
                            format!("<w, Hv> = {a:e}, <v, Hw> = {b:e}"),
                        );
                    }
                } else {
                    fail(
                        "hvp has the wrong size",
                        format!("{} and {} numbers, expected {n}", hv.len(), hw.len()),
                    );
                }
            }
            let gfd = |k: usize| -> Option<Vec<f64>> {
                let p = get(lines, &format!("gfd{k}p"))?.flat();
                let m = get(lines, &format!("gfd{k}m"))?.flat();
                if p.len() != n || m.len() != n {
                    return None;
                }
                Some(
                    p.iter()
                        .zip(&m)
                        .map(|(a, b)| (a - b) / (2.0 * h[k]))
                        .collect(),
                )
            };
            if let (true, Some(hv), Some(g4), Some(g3)) = (fd_applies, &hv, gfd(0), gfd(1)) {
                if hv.len() == n {
                    let diff: Vec<f64> = g4.iter().zip(&g3).map(|(a, b)| a - b).collect();
                    let dn = inf_norm(&diff);
                    // one-sided differences of grad, as for f
                    let gside = |k: usize| -> Option<f64> {
                        let p = get(lines, &format!("gfd{k}p"))?.flat();
                        let m = get(lines, &format!("gfd{k}m"))?.flat();
                        let g0 = g.as_ref()?;
                        if p.len() != n || m.len() != n {
                            return None;
                        }
                        Some(
                            (0..n)
                                .map(|i| (((p[i] - g0[i]) - (g0[i] - m[i])) / h[k]).abs())
                                .fold(0.0, f64::max),
                        )
                    };
                    let (s4, s3) = (gside(0).unwrap_or(0.0), gside(1).unwrap_or(0.0));
                    let gkink = s4
                        > 0.3 * s3 + 1e-9 * (1.0 + g.as_ref().map(|g| inf_norm(g)).unwrap_or(0.0));
                    if g4.iter().chain(&g3).all(|x| x.is_finite())
                        && dn <= 1e-3 * (1.0 + inf_norm(&g4))
                        && !gkink
                    {
                        hvp_skipped = false;
                        let tol = 1e-5 * (1.0 + inf_norm(hv)) + 0.05 * dn;
                        if hv
                            .iter()
                            .zip(&g4)
                            .any(|(a, b)| !a.is_finite() || (a - b).abs() > tol)
                        {
                            fail(
                                "Hessian-vector product disagrees with finite differences of grad",
                                format!("jvp of grad = {hv:?}\n  FD of grad (h=1e-4) = {g4:?}\n  FD of grad (h=1e-3) = {g3:?}"),
                            );
                        }
                    }
                }
            }
        }
    }
    (fails, fd_skipped, hvp_skipped)
}

/// Runs `source` (written to `dir/prog.adj`) in the configurations
/// `configs` and checks everything.
pub fn check_program(
    source: &str,
    meta: &Meta,
    opts: &CheckOpts,
    configs: &[usize],
    dir: &Path,
) -> Outcome {
    let file = "prog.adj";
    let mut out = Outcome {
        fd_skipped: true,
        hvp_skipped: true,
        ..Default::default()
    };
    if let Err(e) = std::fs::write(dir.join(file), source) {
        out.failures.push(Failure {
            class: "fuzzer io error".into(),
            detail: e.to_string(),
            configs: vec![],
        });
        return out;
    }
    let start = Instant::now();
    if let Some(max) = opts.max_compile_secs {
        // The whole compile: parsing, checks, the optimiser, fusion and
        // Cranelift (graph mode's kernels of `main`).
        let r = run_adjoint(opts, &["emit", "--stage", "kernels", file], &[], dir);
        // Processor time where it can be read: a compile slowed only by
        // other work on the machine is not slow.
        let secs = r.cpu_secs.unwrap_or(r.secs);
        out.compile_secs = Some(secs);
        if r.timed_out {
            out.failures.push(Failure {
                class: "timeout in `adjoint emit --stage kernels`".into(),
                detail: format!("killed after {:?}", opts.timeout),
                configs: vec![],
            });
            // the runs would compile as long: do not wait for each
            out.run_secs = start.elapsed().as_secs_f64();
            return out;
        } else if is_panic(&r.stderr) {
            out.failures.push(Failure {
                class: format!("panic: {}", panic_site(&r.stderr)),
                detail: format!("adjoint emit --stage kernels:\n{}", r.stderr.trim()),
                configs: vec![],
            });
        } else if r.code == Some(0) && secs > max {
            out.failures.push(Failure {
                class: "slow compile".into(),
                detail: format!(
                    "`adjoint emit --stage kernels` took {secs:.2} s of processor time \
                     ({:.2} s of wall time; limit {max} s)",
                    r.secs
                ),
                configs: vec![],
            });
        }
    }
    let mut runs: Vec<(usize, RunOut)> = Vec::new();
    for &c in configs {
        let cfg = &CONFIGS[c];
        let mut args = vec!["run", file, "--mode", cfg.mode];
        args.extend_from_slice(cfg.args);
        let r = run_adjoint(opts, &args, cfg.env, dir);
        runs.push((c, r));
    }
    out.run_secs = start.elapsed().as_secs_f64();
    out.config_secs = runs.iter().map(|(c, r)| (*c, r.secs)).collect();
    // per-run failures
    let mut ok: Vec<(usize, Lines)> = Vec::new();
    let mut errs: Vec<(usize, String)> = Vec::new();
    for (c, r) in &runs {
        let name = CONFIGS[*c].name;
        if r.timed_out {
            out.failures.push(Failure {
                class: format!("timeout ({name})"),
                detail: format!("killed after {:?}", opts.timeout),
                configs: vec![*c],
            });
            continue;
        }
        if is_panic(&r.stderr) {
            out.failures.push(Failure {
                class: format!("panic: {}", panic_site(&r.stderr)),
                detail: format!("{name}:\n{}", r.stderr.trim()),
                configs: vec![*c],
            });
            continue;
        }
        match r.code {
            Some(0) => ok.push((*c, parse_output(&r.stdout))),
            Some(1) => {
                if !has_location(&r.stderr, file) {
                    out.failures.push(Failure {
                        class: "error without FILE:LINE:COL".into(),
                        detail: format!("{name}:\n{}", r.stderr.trim()),
                        configs: vec![*c],
                    });
                }
                errs.push((*c, first_error_line(&r.stderr)));
            }
            code => {
                out.failures.push(Failure {
                    class: format!("crash (exit {code:?})"),
                    detail: format!("{name}:\n{}", r.stderr.trim()),
                    configs: vec![*c],
                });
            }
        }
    }
    // exit status differs between configurations
    if !errs.is_empty() && !ok.is_empty() {
        let (ec, emsg) = &errs[0];
        let (oc, _) = &ok[0];
        out.failures.push(Failure {
            class: format!(
                "error in {} only (ok in {}): {}",
                CONFIGS[*ec].name,
                CONFIGS[*oc].name,
                error_kind(emsg)
            ),
            detail: format!(
                "fails in: {}\n  runs in: {}\n  {emsg}",
                errs.iter()
                    .map(|(c, _)| CONFIGS[*c].name)
                    .collect::<Vec<_>>()
                    .join(", "),
                ok.iter()
                    .map(|(c, _)| CONFIGS[*c].name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            configs: vec![*ec, *oc],
        });
    }
    if ok.is_empty() && !errs.is_empty() && out.failures.is_empty() {
        // rejected everywhere: the generator's fault unless the messages differ
        let first = &errs[0].1;
        // Every line before the vmap lines printed: the function runs, and
        // only its mapped form fails.
        let mapped_only = runs
            .iter()
            .any(|(_, r)| r.stdout.lines().any(|l| l.starts_with("gfd1m ")));
        // A failure that every configuration shares, with each one's message.
        let everywhere = |class: String| Failure {
            class,
            detail: errs
                .iter()
                .map(|(c, m)| format!("{}: {m}", CONFIGS[*c].name))
                .collect::<Vec<_>>()
                .join("\n  "),
            configs: errs.iter().map(|(c, _)| *c).take(2).collect(),
        };
        if mapped_only {
            out.failures.push(everywhere(format!(
                "vmap fails where the function runs: {first}"
            )));
        } else if first.contains("internal error") {
            // The compiler's fault, however consistently it fails.
            out.failures.push(everywhere(format!(
                "internal error in every configuration: {first}"
            )));
        } else if errs.iter().all(|(_, m)| m == first) {
            out.gen_invalid = Some(first.clone());
        } else {
            out.failures.push(everywhere(
                "different errors in different configurations".into(),
            ));
        }
        return out;
    }
    // outputs agree between configurations
    if let Some((rc, rl)) = ok.first() {
        for (c, l) in &ok[1..] {
            if let Some(f) = compare(rl, l, CONFIGS[*rc].name, CONFIGS[*c].name, *rc, *c) {
                out.failures.push(f);
            }
        }
    }
    // mathematical oracles, on eager and graph output
    let mut seen: Vec<Failure> = Vec::new();
    for (c, l) in &ok {
        if *c != EAGER && *c != GRAPH && ok.iter().any(|(c2, _)| *c2 == EAGER || *c2 == GRAPH) {
            continue;
        }
        let (fs, fd_skip, hvp_skip) = oracles(l, meta, *c);
        out.fd_skipped &= fd_skip;
        out.hvp_skipped &= hvp_skip;
        for f in fs {
            if let Some(s) = seen.iter_mut().find(|s| s.class == f.class) {
                s.configs.push(*c);
            } else {
                seen.push(f);
            }
        }
    }
    for mut f in seen {
        let names: Vec<&str> = f.configs.iter().map(|c| CONFIGS[*c].name).collect();
        f.detail = format!("[{}] {}", names.join(", "), f.detail);
        out.failures.push(f);
    }
    out
}
