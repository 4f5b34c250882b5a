//! adjoint-fuzz: a random-program differential tester for the Adjoint
//! compiler. It generates well-typed programs (`gen`), runs each through
//! the `adjoint` executable in several configurations and checks oracles
//! (`check`), and minimises failing programs (`shrink`).
//!
//! The library is what `src/main.rs` (the `adjoint-fuzz` command) and
//! `tests/ci.rs` call: [`run`] with [`Options`], then [`Summary::print`].

pub mod check;
pub mod gen;
pub mod rng;
pub mod shrink;
pub mod value;

use check::{check_program, CheckOpts, Failure, Outcome, CONFIGS, CUDA, EAGER, GRAPH};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which of the `ADJOINT_NO_*` configurations run besides eager and graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Switches {
    /// All three on every program.
    All,
    /// One of the three per program, in turn.
    Rotate,
    /// None.
    None,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub count: u64,
    /// The index of the first program: a long campaign (one seed,
    /// programs `0..N`) can run in chunks, `--start K --count C` each.
    pub start: u64,
    pub jobs: usize,
    pub adjoint: PathBuf,
    pub out: PathBuf,
    pub shrink: bool,
    /// Time budget of one shrink.
    pub shrink_secs: f64,
    /// Flag a compile (`adjoint emit --stage kernels`) slower than this; `None`: do not
    /// time compiles.
    pub max_compile_secs: Option<f64>,
    /// Run only this program.
    pub only: Option<u64>,
    pub switches: Switches,
    pub timeout_secs: f64,
    /// Print a line per program.
    pub verbose: bool,
    /// Generate smaller programs (faster compiles).
    pub small: bool,
    /// Time compiles (`adjoint emit --stage kernels`) on every k-th program only.
    pub compile_every: u64,
    /// With `Switches::Rotate`: a switch configuration on every k-th
    /// program only.
    pub switch_every: u64,
    /// Also run every program in graph mode on the GPU (`--device cuda`)
    /// and compare.
    pub cuda: bool,
    /// Start no program after this many seconds (the programs started
    /// finish; the ones run are still `start..start + n`).
    pub max_secs: Option<f64>,
}

impl Options {
    pub fn new(adjoint: PathBuf) -> Options {
        Options {
            seed: 1,
            count: 100,
            start: 0,
            jobs: 2,
            adjoint,
            out: PathBuf::from("target/fuzz"),
            shrink: false,
            shrink_secs: 120.0,
            max_compile_secs: Some(2.0),
            only: None,
            switches: Switches::All,
            timeout_secs: 10.0,
            verbose: false,
            small: false,
            compile_every: 1,
            switch_every: 1,
            cuda: false,
            max_secs: None,
        }
    }

    fn configs_for(&self, index: u64) -> Vec<usize> {
        let mut c = vec![EAGER, GRAPH];
        match self.switches {
            Switches::All => c.extend([2, 3, 4]),
            Switches::Rotate => {
                let k = self.switch_every.max(1);
                if index % k == 0 {
                    c.push(2 + ((index / k) % 3) as usize);
                }
            }
            Switches::None => {}
        }
        if self.cuda {
            c.push(CUDA);
        }
        c
    }

    fn check_opts_for(&self, index: u64) -> CheckOpts {
        let mut co = self.check_opts();
        if index % self.compile_every.max(1) != 0 {
            co.max_compile_secs = None;
        }
        co
    }

    fn check_opts(&self) -> CheckOpts {
        CheckOpts {
            adjoint: self.adjoint.clone(),
            timeout: Duration::from_secs_f64(self.timeout_secs),
            max_compile_secs: self.max_compile_secs,
        }
    }
}

/// A failing program.
#[derive(Clone, Debug)]
pub struct FailureReport {
    pub index: u64,
    pub failures: Vec<Failure>,
    pub path: PathBuf,
    pub minimised: Option<PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub seed: u64,
    /// The indices of the programs run: `first..first + programs` (or
    /// the one `--only` program).
    pub first: u64,
    pub programs: usize,
    pub failing: Vec<FailureReport>,
    pub gen_invalid: Vec<(u64, String)>,
    pub fd_skipped: usize,
    pub hvp_skipped: usize,
    pub features: BTreeMap<&'static str, usize>,
    pub compile_secs: Vec<f64>,
    /// Per configuration: (runs, total seconds).
    pub config_secs: BTreeMap<usize, (usize, f64)>,
    pub secs: f64,
    pub shrink_secs: f64,
}

impl Summary {
    /// Failing programs grouped by failure class: class -> indices.
    pub fn classes(&self) -> BTreeMap<String, Vec<u64>> {
        let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for r in &self.failing {
            for f in &r.failures {
                let e = m.entry(f.class.clone()).or_default();
                if !e.contains(&r.index) {
                    e.push(r.index);
                }
            }
        }
        m
    }

    pub fn report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "== adjoint-fuzz summary (seed {}) ==", self.seed);
        let _ = writeln!(
            s,
            "programs run:          {} (#{}..#{})",
            self.programs,
            self.first,
            self.first + self.programs as u64
        );
        let _ = writeln!(s, "failing programs:      {}", self.failing.len());
        let classes = self.classes();
        let _ = writeln!(s, "distinct failure classes: {}", classes.len());
        for (c, idx) in &classes {
            let shown: Vec<String> = idx.iter().take(12).map(|i| i.to_string()).collect();
            let more = if idx.len() > 12 {
                format!(" (+{})", idx.len() - 12)
            } else {
                String::new()
            };
            let min = self
                .failing
                .iter()
                .find(|r| r.index == idx[0])
                .and_then(|r| r.minimised.as_ref())
                .map(|p| format!("\n      minimised: {}", p.display()))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {:4} x {c}\n      programs: {}{more}{min}",
                idx.len(),
                shown.join(" ")
            );
        }
        let pct = 100.0 * self.gen_invalid.len() as f64 / self.programs.max(1) as f64;
        let _ = writeln!(
            s,
            "generator invalid:     {} ({pct:.1}%)",
            self.gen_invalid.len()
        );
        let mut msgs: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, m) in &self.gen_invalid {
            *msgs.entry(m.as_str()).or_default() += 1;
        }
        for (m, n) in msgs.iter().take(8) {
            let ex: Vec<String> = self
                .gen_invalid
                .iter()
                .filter(|(_, x)| x == m)
                .take(6)
                .map(|(i, _)| i.to_string())
                .collect();
            let _ = writeln!(
                s,
                "  {n} x {m}\n      programs: {} (saved as *.invalid.adj)",
                ex.join(" ")
            );
        }
        let _ = writeln!(
            s,
            "FD skipped (kink / discontinuity / non-finite): {}",
            self.fd_skipped
        );
        let _ = writeln!(s, "HVP-vs-FD skipped:     {}", self.hvp_skipped);
        if !self.compile_secs.is_empty() {
            let mut c = self.compile_secs.clone();
            c.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let mean = c.iter().sum::<f64>() / c.len() as f64;
            let _ = writeln!(
                s,
                "compile (`adjoint emit --stage kernels`): mean {:.3} s, median {:.3} s, max {:.3} s",
                mean,
                c[c.len() / 2],
                c[c.len() - 1]
            );
        }
        if !self.config_secs.is_empty() {
            let parts: Vec<String> = self
                .config_secs
                .iter()
                .map(|(c, (n, t))| format!("{} {:.2} s", CONFIGS[*c].name, t / *n as f64))
                .collect();
            let _ = writeln!(s, "mean run time per configuration: {}", parts.join(", "));
        }
        let _ = writeln!(s, "programs by feature:");
        let mut line = String::new();
        for (f, n) in &self.features {
            let item = format!("{f}: {n}");
            if line.len() + item.len() > 96 {
                let _ = writeln!(s, "  {}", line.trim_end_matches([',', ' ']));
                line.clear();
            }
            line.push_str(&item);
            line.push_str(", ");
        }
        if !line.is_empty() {
            let _ = writeln!(s, "  {}", line.trim_end_matches([',', ' ']));
        }
        if self.shrink_secs > 0.0 {
            let _ = writeln!(s, "shrinking time:        {:.1} s", self.shrink_secs);
        }
        let _ = writeln!(s, "total time:            {:.1} s", self.secs);
        s
    }

    pub fn print(&self) {
        print!("{}", self.report());
    }
}

/// Where the program `index` of a run is saved.
fn program_path(out: &Path, seed: u64, index: u64) -> PathBuf {
    out.join(format!("seed{seed}-{index:05}.adj"))
}

/// Configurations the shrinker runs to reproduce a failure.
fn shrink_configs(f: &Failure) -> Vec<usize> {
    let c = &f.class;
    if c.starts_with("value mismatch")
        || c.starts_with("output differs")
        || c.starts_with("error in")
        || c.starts_with("different errors")
    {
        f.configs.clone()
    } else {
        f.configs.iter().take(1).cloned().collect()
    }
}

/// Whether `source` still fails with `class`.
fn reproduces(source: &str, meta: &gen::Meta, opts: &Options, f: &Failure, dir: &Path) -> bool {
    let mut co = opts.check_opts();
    let configs = shrink_configs(f);
    if !configs.is_empty() && f.class != "slow compile" && !f.class.starts_with("timeout in") {
        co.max_compile_secs = None;
    } else if co.max_compile_secs.is_none() {
        co.max_compile_secs = Some(1e9);
    }
    let o = check_program(source, meta, &co, &configs, dir);
    o.failures.iter().any(|g| g.class == f.class)
}

/// Runs the fuzzer.
pub fn run(opts: &Options) -> Summary {
    let start = Instant::now();
    // runs happen in work directories: the executable's path must be absolute
    let mut opts = opts.clone();
    if let Ok(p) = std::fs::canonicalize(&opts.adjoint) {
        opts.adjoint = p;
    }
    let opts = &opts;
    let _ = std::fs::create_dir_all(&opts.out);
    let indices: Vec<u64> = match opts.only {
        Some(i) => vec![i],
        None => (opts.start..opts.start + opts.count).collect(),
    };
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(u64, gen::Program, Outcome)>> = Mutex::new(Vec::new());
    let jobs = opts.jobs.max(1).min(indices.len().max(1));
    std::thread::scope(|s| {
        for w in 0..jobs {
            let (next, results, indices) = (&next, &results, &indices);
            s.spawn(move || {
                // Per process: two testers writing to one `--out` must not
                // run each other's programs.
                let dir = opts.out.join(format!("work-{}-{w}", std::process::id()));
                let _ = std::fs::create_dir_all(&dir);
                loop {
                    if opts
                        .max_secs
                        .is_some_and(|m| start.elapsed().as_secs_f64() >= m)
                    {
                        break;
                    }
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&index) = indices.get(k) else { break };
                    let prog = gen::generate_sized(opts.seed, index, opts.small);
                    let co = opts.check_opts_for(index);
                    let out = check_program(
                        &prog.source,
                        &prog.meta,
                        &co,
                        &opts.configs_for(index),
                        &dir,
                    );
                    if !out.failures.is_empty() {
                        let path = program_path(&opts.out, opts.seed, index);
                        let _ = std::fs::write(&path, &prog.source);
                        let mut txt = String::new();
                        for f in &out.failures {
                            let _ = writeln!(txt, "== {}\n{}\n", f.class, f.detail);
                        }
                        let _ = std::fs::write(path.with_extension("txt"), txt);
                        for f in &out.failures {
                            println!("FAIL #{index}: {}  ({})", f.class, path.display());
                        }
                    } else if opts.verbose {
                        let st = if out.gen_invalid.is_some() {
                            "generator-invalid"
                        } else {
                            "ok"
                        };
                        println!("#{index}: {st} ({:.2} s)", out.run_secs);
                    }
                    if out.gen_invalid.is_some() {
                        let path =
                            program_path(&opts.out, opts.seed, index).with_extension("invalid.adj");
                        let _ = std::fs::write(&path, &prog.source);
                    }
                    if let (Some(m), true) = (&out.gen_invalid, opts.verbose || opts.only.is_some())
                    {
                        println!("#{index}: rejected in every configuration: {m}");
                    }
                    results.lock().unwrap().push((index, prog, out));
                }
                let _ = std::fs::remove_dir_all(&dir);
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _, _)| *i);
    let mut summary = Summary {
        seed: opts.seed,
        first: indices.first().copied().unwrap_or(0),
        programs: results.len(),
        ..Default::default()
    };
    for (index, prog, out) in &results {
        for f in &prog.features {
            *summary.features.entry(f).or_default() += 1;
        }
        for (c, t) in &out.config_secs {
            let e = summary.config_secs.entry(*c).or_default();
            e.0 += 1;
            e.1 += t;
        }
        if let Some(m) = &out.gen_invalid {
            summary.gen_invalid.push((*index, m.clone()));
            continue;
        }
        if out.fd_skipped && out.failures.is_empty() {
            summary.fd_skipped += 1;
        }
        if out.hvp_skipped && out.failures.is_empty() {
            summary.hvp_skipped += 1;
        }
        if let Some(c) = out.compile_secs {
            summary.compile_secs.push(c);
        }
        if !out.failures.is_empty() {
            summary.failing.push(FailureReport {
                index: *index,
                failures: out.failures.clone(),
                path: program_path(&opts.out, opts.seed, *index),
                minimised: None,
            });
        }
    }
    if opts.shrink && !summary.failing.is_empty() {
        let sh_start = Instant::now();
        // shrink the first program of each class (a program once)
        let mut todo: Vec<(usize, Failure)> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (k, r) in summary.failing.iter().enumerate() {
            let fresh: Vec<&Failure> = r
                .failures
                .iter()
                .filter(|f| !seen.contains(&f.class))
                .collect();
            if let Some(f) = fresh.first() {
                todo.push((k, (*f).clone()));
            }
            for f in &r.failures {
                seen.insert(f.class.clone());
            }
        }
        let next = AtomicUsize::new(0);
        let done: Mutex<Vec<(usize, PathBuf)>> = Mutex::new(Vec::new());
        let by_index: BTreeMap<u64, &gen::Program> =
            results.iter().map(|(i, p, _)| (*i, p)).collect();
        std::thread::scope(|s| {
            for w in 0..opts.jobs.max(1).min(todo.len()) {
                let (next, done, todo, by_index, summary) =
                    (&next, &done, &todo, &by_index, &summary);
                s.spawn(move || {
                    let dir = opts.out.join(format!("shrink-{}-{w}", std::process::id()));
                    let _ = std::fs::create_dir_all(&dir);
                    loop {
                        let k = next.fetch_add(1, Ordering::SeqCst);
                        let Some((ri, f)) = todo.get(k) else { break };
                        let r = &summary.failing[*ri];
                        let prog = by_index[&r.index];
                        let t0 = Instant::now();
                        let (min, tries) = shrink::shrink(
                            &prog.source,
                            Duration::from_secs_f64(opts.shrink_secs),
                            |c| reproduces(c, &prog.meta, opts, f, &dir),
                        );
                        // the result must still fail (it does unless nothing reproduced)
                        let path = r.path.with_extension("min.adj");
                        let header = format!(
                            "// minimised ({tries} tries, {:.0} s): {}\n",
                            t0.elapsed().as_secs_f64(),
                            f.class
                        );
                        let _ = std::fs::write(&path, format!("{header}{min}"));
                        println!(
                            "shrunk #{} [{}]: {} -> {} lines: {}",
                            r.index,
                            f.class,
                            prog.source.lines().count(),
                            min.lines().count(),
                            path.display()
                        );
                        done.lock().unwrap().push((*ri, path));
                    }
                });
            }
        });
        for (ri, p) in done.into_inner().unwrap() {
            summary.failing[ri].minimised = Some(p);
        }
        summary.shrink_secs = sh_start.elapsed().as_secs_f64();
    }
    summary.secs = start.elapsed().as_secs_f64();
    summary
}

/// The configuration names, for help texts.
pub fn config_names() -> Vec<&'static str> {
    CONFIGS.iter().map(|c| c.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_runs_every_program_on_the_gpu_too() {
        let mut o = Options::new(PathBuf::from("adjoint"));
        o.switches = Switches::None;
        assert_eq!(o.configs_for(3), vec![EAGER, GRAPH]);
        o.cuda = true;
        assert_eq!(o.configs_for(3), vec![EAGER, GRAPH, CUDA]);
        assert_eq!(CONFIGS[CUDA].args, ["--device", "cuda"]);
        // the GPU's own transcendental functions: a looser comparison
        assert!(CONFIGS[CUDA].rel > CONFIGS[GRAPH].rel);
    }

    #[test]
    fn a_spent_time_budget_starts_no_program() {
        let dir = std::env::temp_dir().join(format!("adjoint-fuzz-budget-{}", std::process::id()));
        let mut o = Options::new(PathBuf::from("/nonexistent/adjoint"));
        o.out = dir.clone();
        o.count = 50;
        o.max_secs = Some(0.0);
        let s = run(&o);
        assert_eq!(s.programs, 0);
        assert!(s.failing.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }
}
