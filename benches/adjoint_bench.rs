//! Timing harness for the Adjoint side of `benches/compare.py`.
//!
//! ```text
//! cargo bench --bench adjoint_bench                    # every case, a table
//! cargo bench --bench adjoint_bench -- --json mlp gmm  # some cases, JSON lines
//! ```
//!
//! Options: `--json` (one JSON object per case on stdout, for compare.py),
//! `--budget SECONDS` (the time spent on the timed repetitions of one case,
//! default 6), `--max-reps N` (default 50), `--mode eager|graph` (default
//! graph, the mode `adjoint run` uses, or `ADJOINT_BENCH_MODE`), then case
//! names or prefixes to run
//! (default: all). The cases are listed by `--list`.
//!
//! How it measures. The public API (`Session::load_file_with`, then
//! `Session::run_function`) runs an entry function that takes no arguments,
//! and type-checks and compiles it on every call. So every case is an
//! Adjoint program in `benches/programs/` whose function `run(.., reps)`
//! sets up its inputs, prints `ready`, then evaluates the benchmarked
//! computation `reps` times in a loop, printing one `tick` line after each
//! evaluation (the printed value depends on the result). The harness
//! appends an entry function `__bench_entry` that calls it, and hands
//! `run_function` a writer that timestamps every line as it is printed:
//! the time of one evaluation is the gap between two lines, so neither
//! compilation nor set-up nor loading is counted in it. A first run with one
//! repetition estimates the cost of an evaluation, and sets the number of
//! repetitions of the timed run (at least 3, at most `--max-reps`, about
//! `--budget` seconds). Reported: the median, minimum and count of the
//! per-evaluation times.
//!
//! Paired cases (`gmm_d10_pair`, `gmm_d20_pair`) evaluate two computations
//! in turn, the GMM objective and then objective and gradient, a `tick`
//! after each: reported besides are both medians and the median of the
//! second's time over the first's, pair by pair, which a slow spell of a
//! shared machine (slowing both sides of a pair) disturbs much less than
//! the ratio of two cases timed one after the other.
//!
//! Compile time (the MLP case): "source to ready-to-run" is the time to
//! load the file (parse, lower, differentiate: `load_file_with`) plus the
//! time from calling `run_function` to the program's first line (`start`,
//! printed before any work: type inference and compilation for the VM),
//! plus the extra time of the first training step over the steady state
//! (anything done lazily on first use), median of several runs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use adjoint::{Mode, Session};

// The allocator of the `adjoint` binary, so the figures are what its users
// get (large freed blocks are kept for reuse).
#[global_allocator]
static ALLOC: adjoint_runtime::memory::CountingAlloc = adjoint_runtime::memory::CountingAlloc;

/// A writer that records when each line is printed.
struct Clock {
    partial: Vec<u8>,
    lines: Vec<(Instant, String)>,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            partial: Vec::new(),
            lines: Vec::new(),
        }
    }
}

impl Write for Clock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let now = Instant::now();
        for &b in buf {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.partial).into_owned();
                self.lines.push((now, line));
                self.partial.clear();
            } else {
                self.partial.push(b);
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What one benchmark case runs.
struct Case {
    name: &'static str,
    what: String,
    /// The program, relative to the repository root.
    file: &'static str,
    /// The body of the entry function, with `REPS` for the repetitions.
    entry: String,
    /// Whether to measure compile time (several extra runs).
    compile: bool,
    /// Whether a repetition evaluates two computations in turn (two
    /// `tick` lines): the second's time over the first's is reported
    /// pair by pair.
    paired: bool,
}

/// The Adjoint expression that loads `benches/data/DIR/FILE`.
fn load_npy(root: &Path, dir: &str, file: &str) -> String {
    let p = root.join("benches/data").join(dir).join(file);
    format!("load_npy({:?})", p.display().to_string())
}

fn gmm_entry(root: &Path, set: &str, function: &str) -> String {
    let file = |f: &str| load_npy(root, &format!("gmm/{set}"), f);
    format!(
        "    print(\"start\");\n    let w = {};\n    {function}({}, {}, {}, {}, w[0], w[1], REPS);\n",
        file("wishart.npy"),
        file("alpha.npy"),
        file("means.npy"),
        file("icf.npy"),
        file("x.npy"),
    )
}

fn cases(root: &Path) -> Vec<Case> {
    let simple = "    run(REPS);\n".to_string();
    let mut v = vec![Case {
        name: "mlp",
        what: "MLP train step, batch 128, 784-512-512-10, ReLU, softmax CE, SGD, f32".to_string(),
        file: "benches/programs/mlp.adj",
        entry: simple.clone(),
        compile: true,
        paired: false,
    }];
    let gmm = [
        (
            "d10_K25",
            ["gmm_d10_grad", "gmm_d10_obj", "gmm_d10_pair"],
            "d=10 K=25 n=1000",
        ),
        (
            "d20_K50",
            ["gmm_d20_grad", "gmm_d20_obj", "gmm_d20_pair"],
            "d=20 K=50 n=1000",
        ),
    ];
    for (set, [grad_name, obj_name, pair_name], size) in gmm {
        v.push(Case {
            name: grad_name,
            what: format!("GMM objective + gradient, f64, {size}"),
            file: "benches/programs/gmm.adj",
            entry: gmm_entry(root, set, "gradient_loop"),
            compile: false,
            paired: false,
        });
        v.push(Case {
            name: obj_name,
            what: format!("GMM objective only, f64, {size}"),
            file: "benches/programs/gmm.adj",
            entry: gmm_entry(root, set, "objective_loop"),
            compile: false,
            paired: false,
        });
        v.push(Case {
            name: pair_name,
            what: format!("GMM objective, then objective + gradient, in turn, f64, {size}"),
            file: "benches/programs/gmm.adj",
            entry: gmm_entry(root, set, "pair_loop"),
            compile: false,
            paired: true,
        });
    }
    let lstm = |f: &str| load_npy(root, "lstm/l2_c1024", f);
    v.push(Case {
        name: "lstm",
        what: "ADBench LSTM objective + gradient, f64, 2 layers, 1024 characters".to_string(),
        file: "benches/programs/lstm.adj",
        entry: format!(
            "    print(\"start\");\n    run({}, {}, {}, {}, REPS);\n",
            lstm("main.npy"),
            lstm("extra.npy"),
            lstm("state.npy"),
            lstm("sequence.npy")
        ),
        compile: true,
        paired: false,
    });
    let ba = |f: &str| load_npy(root, "ba/n49", f);
    v.push(Case {
        name: "ba",
        what: "ADBench bundle adjustment objective + gradient, f64, n49".to_string(),
        file: "benches/programs/ba.adj",
        entry: format!(
            "    print(\"start\");\n    run({}, {}, {}, {}, {}, REPS);\n",
            ba("cams.npy"),
            ba("points.npy"),
            ba("weights.npy"),
            ba("features.npy"),
            ba("obs.npy")
        ),
        compile: true,
        paired: false,
    });
    v.push(Case {
        name: "loop_grad",
        what: "gradient of x <- sin(x)*x + 0.5, 1000 steps, f64 scalar".to_string(),
        file: "benches/programs/loop_grad.adj",
        entry: simple.clone(),
        compile: false,
        paired: false,
    });
    v.push(Case {
        name: "loop_grad2",
        what: "second derivative (grad of grad) of the same loop, 1000 steps, f64 scalar"
            .to_string(),
        file: "benches/programs/loop_grad2.adj",
        entry: simple.clone(),
        compile: false,
        paired: false,
    });
    v.push(Case {
        name: "loop_fwd",
        what: "x <- sin(x)*x + 0.5, 1000 steps, f64 scalar (forward only)".to_string(),
        file: "benches/programs/loop_fwd.adj",
        entry: simple.clone(),
        compile: false,
        paired: false,
    });
    for (name, what, entry) in [
        (
            "loop_tensor_grad",
            "gradient of y <- y + 0.01*tanh(y)*exp(-y*y), 1000 steps, 1000 f32",
            "run_grad",
        ),
        (
            "loop_tensor_fwd",
            "y <- y + 0.01*tanh(y)*exp(-y*y), 1000 steps, 1000 f32 (forward only)",
            "run_fwd",
        ),
    ] {
        v.push(Case {
            name,
            what: what.to_string(),
            file: "benches/programs/loop_tensor.adj",
            entry: format!("    {entry}(REPS);\n"),
            compile: false,
            paired: false,
        });
    }
    v.push(Case {
        name: "map16m",
        what: "y = tanh(2x+1)*sigmoid(x) - x/3 on 2^24 f32".to_string(),
        file: "benches/programs/map.adj",
        entry: simple,
        compile: false,
        paired: false,
    });
    v
}

/// One run of a case: the timings read off its lines.
struct RunTimes {
    /// `load_file_with`: parse, lower, differentiate.
    load: Duration,
    /// From calling `run_function` to the `start` line (or to `ready` when
    /// the program prints no `start`).
    to_start: Duration,
    /// The time of each evaluation, in order.
    iters: Vec<Duration>,
    /// The lines after the loop (`value ...`), for the record.
    results: Vec<String>,
}

fn run_case(root: &Path, case: &Case, mode: Mode, reps: usize) -> Result<RunTimes, String> {
    let ticks = if case.paired { 2 * reps } else { reps };
    let entry = format!(
        "\nfn __bench_entry() {{\n{}}}\n",
        case.entry.replace("REPS", &reps.to_string())
    );
    let path = root.join(case.file);
    let t0 = Instant::now();
    let session = Session::new(mode)
        .with_compiler_options(adjoint::env_options::compiler_options())
        .load_file_with(&path, &entry)
        .map_err(|e| e.render(false))?;
    let load = t0.elapsed();
    let mut clock = Clock::new();
    let t1 = Instant::now();
    session
        .run_function("__bench_entry", &mut clock)
        .map_err(|e| e.render(false))?;
    let lines = clock.lines;
    // A tag may be followed by values (`ready true`).
    let at = |tag: &str| {
        lines
            .iter()
            .position(|(_, l)| l == tag || l.starts_with(&format!("{tag} ")))
    };
    let ready = at("ready").ok_or("the program printed no `ready` line")?;
    let start = at("start").unwrap_or(ready);
    let to_start = lines[start].0 - t1;
    let mut iters = Vec::new();
    let mut prev = lines[ready].0;
    let mut results = Vec::new();
    for (t, l) in &lines[ready + 1..] {
        if l.starts_with("tick") {
            iters.push(*t - prev);
            prev = *t;
        } else {
            results.push(l.clone());
        }
    }
    if iters.len() != ticks {
        return Err(format!("expected {ticks} tick lines, got {}", iters.len()));
    }
    Ok(RunTimes {
        load,
        to_start,
        iters,
        results,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

fn secs(d: &[Duration]) -> Vec<f64> {
    d.iter().map(|d| d.as_secs_f64()).collect()
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:e}")
    } else {
        "null".into()
    }
}

struct Options {
    json: bool,
    budget: f64,
    max_reps: usize,
    mode: Mode,
    selected: Vec<String>,
    list: bool,
}

fn parse_args() -> Result<Options, String> {
    let mode_env = std::env::var("ADJOINT_BENCH_MODE").unwrap_or_default();
    let mut o = Options {
        json: false,
        budget: 6.0,
        max_reps: 50,
        mode: if mode_env == "eager" {
            Mode::Eager
        } else {
            Mode::Graph
        },
        selected: Vec::new(),
        list: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => o.json = true,
            "--list" => o.list = true,
            "--bench" => {} // added by `cargo bench`
            "--budget" => {
                o.budget = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--budget wants seconds")?
            }
            "--max-reps" => {
                o.max_reps = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--max-reps wants a count")?
            }
            "--mode" => {
                o.mode = match args.next().as_deref() {
                    Some("eager") => Mode::Eager,
                    Some("graph") => Mode::Graph,
                    _ => return Err("--mode wants eager or graph".into()),
                }
            }
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            s => o.selected.push(s.to_string()),
        }
    }
    Ok(o)
}

fn main() {
    // As the `adjoint` binary does: the thread that runs programs is one of
    // the kernel pool's workers.
    adjoint_runtime::threads::join_kernel_pool(adjoint::env_options::kernel_threads());
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("adjoint_bench: {e}");
            std::process::exit(2);
        }
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // Programs read nothing by relative path, but run where `cargo bench`
    // would, whoever starts the binary.
    let _ = std::env::set_current_dir(&root);
    let all = cases(&root);
    if opts.list {
        for c in &all {
            println!("{:14} {}", c.name, c.what);
        }
        return;
    }
    let chosen: Vec<&Case> = all
        .iter()
        .filter(|c| {
            opts.selected.is_empty() || opts.selected.iter().any(|s| c.name.starts_with(s.as_str()))
        })
        .collect();
    if chosen.is_empty() {
        eprintln!(
            "adjoint_bench: no case matches {:?} (see --list)",
            opts.selected
        );
        std::process::exit(2);
    }
    let mode_name = match opts.mode {
        Mode::Eager => "eager",
        Mode::Graph => "graph",
    };
    if !opts.json {
        println!(
            "{:14} {:>12} {:>12} {:>6}  (mode {mode_name}; seconds per evaluation)",
            "case", "median", "min", "reps"
        );
    }
    let mut failed = false;
    for case in chosen {
        match measure(&root, case, &opts) {
            Ok(m) => {
                if opts.json {
                    let mut fields = vec![
                        format!("\"case\": {}", json_str(case.name)),
                        format!("\"what\": {}", json_str(&case.what)),
                        format!("\"mode\": {}", json_str(mode_name)),
                        format!("\"median_s\": {}", json_num(m.median)),
                        format!("\"min_s\": {}", json_num(m.min)),
                        format!("\"reps\": {}", m.reps),
                        format!(
                            "\"times_s\": [{}]",
                            m.times
                                .iter()
                                .map(|t| json_num(*t))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        format!(
                            "\"results\": [{}]",
                            m.results
                                .iter()
                                .map(|r| json_str(r))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ];
                    if let Some(p) = &m.pairs {
                        fields.push(format!("\"first_median_s\": {}", json_num(p.first)));
                        fields.push(format!("\"second_median_s\": {}", json_num(p.second)));
                        fields.push(format!("\"pair_ratio\": {}", json_num(p.ratio)));
                    }
                    if let Some(c) = &m.compile {
                        fields.push(format!("\"compile_s\": {}", json_num(c.total)));
                        fields.push(format!("\"compile_load_s\": {}", json_num(c.load)));
                        fields.push(format!("\"compile_prepare_s\": {}", json_num(c.prepare)));
                        fields.push(format!(
                            "\"compile_first_step_extra_s\": {}",
                            json_num(c.first_extra)
                        ));
                    }
                    println!("{{{}}}", fields.join(", "));
                } else {
                    println!(
                        "{:14} {:>12.6} {:>12.6} {:>6}",
                        case.name, m.median, m.min, m.reps
                    );
                    if let Some(p) = &m.pairs {
                        println!(
                            "{:14} {:>12.3}   (second/first pair by pair; medians {:.6} and {:.6})",
                            "  ratio", p.ratio, p.second, p.first
                        );
                    }
                    if let Some(c) = &m.compile {
                        println!(
                            "{:14} {:>12.6}   (load {:.6} + prepare {:.6} + first-step extra {:.6})",
                            "  compile", c.total, c.load, c.prepare, c.first_extra
                        );
                    }
                    for r in &m.results {
                        println!("{:14} {r}", "");
                    }
                }
            }
            Err(e) => {
                failed = true;
                if opts.json {
                    println!(
                        "{{\"case\": {}, \"mode\": {}, \"error\": {}}}",
                        json_str(case.name),
                        json_str(mode_name),
                        json_str(&e)
                    );
                } else {
                    println!("{:14} failed: {e}", case.name);
                }
            }
        }
        let _ = std::io::stdout().flush();
    }
    if failed {
        std::process::exit(1);
    }
}

struct Compile {
    total: f64,
    load: f64,
    prepare: f64,
    first_extra: f64,
}

struct Measured {
    median: f64,
    min: f64,
    reps: usize,
    times: Vec<f64>,
    results: Vec<String>,
    compile: Option<Compile>,
    /// For a paired case: the medians of the first and second
    /// computations' times and the median of their ratios pair by pair.
    pairs: Option<Pairs>,
}

struct Pairs {
    first: f64,
    second: f64,
    ratio: f64,
}

/// A paired case's figures from its alternating times (the first pair
/// left out when there are more than three pairs, as one-off work may
/// fall in it). `median` and `min` are the second computation's.
fn measure_pairs(times: &[f64], results: Vec<String>) -> Measured {
    let skip = if times.len() > 6 { 2 } else { 0 };
    let steady = &times[skip..];
    let first: Vec<f64> = steady.iter().step_by(2).copied().collect();
    let second: Vec<f64> = steady.iter().skip(1).step_by(2).copied().collect();
    let ratios: Vec<f64> = first.iter().zip(&second).map(|(a, b)| b / a).collect();
    Measured {
        median: median(&second),
        min: second.iter().cloned().fold(f64::INFINITY, f64::min),
        reps: second.len(),
        times: steady.to_vec(),
        results,
        compile: None,
        pairs: Some(Pairs {
            first: median(&first),
            second: median(&second),
            ratio: median(&ratios),
        }),
    }
}

fn measure(root: &Path, case: &Case, opts: &Options) -> Result<Measured, String> {
    // A pilot run with one evaluation estimates its cost.
    if case.compile {
        adjoint::clear_code_caches();
    }
    let pilot = run_case(root, case, opts.mode, 1)?;
    let one = secs(&pilot.iters).iter().sum::<f64>().max(1e-9);
    let reps = ((opts.budget / one).ceil() as usize).clamp(3, opts.max_reps.max(3));
    let run = run_case(root, case, opts.mode, reps)?;
    let times = secs(&run.iters);
    if case.paired {
        return Ok(measure_pairs(&times, run.results));
    }
    // The first evaluation of a run may do one-off work: leave it out of
    // the steady state when there are enough of the others.
    let steady = if times.len() > 3 {
        &times[1..]
    } else {
        &times[..]
    };
    let med = median(steady);
    let min = steady.iter().cloned().fold(f64::INFINITY, f64::min);
    let compile = if case.compile {
        // Several short runs: load + time to `start`, and the first step's
        // excess over the steady state.
        // (Only runs that compiled everything: the timed run found the
        // pilot's code in the caches.)
        let mut loads = vec![pilot.load.as_secs_f64()];
        let mut preps = vec![pilot.to_start.as_secs_f64()];
        let mut firsts = vec![pilot.iters[0].as_secs_f64()];
        for _ in 0..3 {
            // Code compiled by earlier runs is cached in the process: a
            // fresh process would compile it again.
            adjoint::clear_code_caches();
            let r = run_case(root, case, opts.mode, 1)?;
            loads.push(r.load.as_secs_f64());
            preps.push(r.to_start.as_secs_f64());
            firsts.push(r.iters[0].as_secs_f64());
        }
        let load = median(&loads);
        let prepare = median(&preps);
        let first_extra = (median(&firsts) - med).max(0.0);
        Some(Compile {
            total: load + prepare + first_extra,
            load,
            prepare,
            first_extra,
        })
    } else {
        None
    };
    Ok(Measured {
        median: med,
        min,
        reps: steady.len(),
        times: steady.to_vec(),
        results: run.results,
        compile,
        pairs: None,
    })
}
