//! IR filetests: data files holding an input (a program, or IR text), a
//! header naming the compiler stage to run on it, and the expected output
//! of that stage after a `// expected:` line, as comment lines.
//! `BLESS=1 cargo test --test ir_filetests` rewrites every expectation
//! from the compiler's output.
//!
//! A file starts with `// test KIND`; directive lines anywhere before
//! `// expected:` give the stage its inputs; other comment lines say what
//! the test checks. One directory per stage family, each its own test:
//!
//! | directory | kind | input | output |
//! | --- | --- | --- | --- |
//! | `tests/ir/lower/` | `lower` | `.adj` | the lowered IR of `// fn: F` (as `adjoint emit --stage ir --fn F`) |
//! | `tests/ir/grad/` | `grad` | `.adj` | the IR of `grad(F)` after AD (`emit --stage grad --fn F`); `// driver: EXPR` differentiates another expression (`jvp`, `vjp`, a lambda) |
//! | `tests/ir/opt/` | `opt` | `.adj` | the optimised IR of `// fn: F` (`emit --stage opt --fn F`; every function without `// fn:`); with `// args: TYPES`, what graph mode compiles for a call of `F` with arguments of these types (typed optimiser and rewrites) |
//! | `tests/ir/opt/` | `grad-opt` | `.adj` | the optimised IR of `grad(F)` (`emit --stage grad-opt --fn F`; `// driver:` as for `grad`) |
//! | `tests/ir/opt/` | `opt-ir` | `.ir` | the optimiser alone (`opt::optimize`, default options, then the verifier) on the first graph of the IR text; with `// args: TYPES` that graph is the typed entry, called with arguments of these types |
//! | `tests/ir/rewrite/` | `rewrite-ir` | `.ir` | the egg rewrites alone (`rewrite::rewrite`) on the first graph of the IR text, typed by inference from `// args: TYPES`: the rules that fired, then the IR |
//! | `tests/ir/infer/` | `infer` | `.adj` | the IR of `// fn: F` (default `main`) with inferred types on every node, for arguments `// args: TYPES` (default none) |
//! | `tests/ir/kernels/` | `kernels` | `.adj` | the kernels fusion selects for `// fn: F` (default `main`, no arguments; `emit --stage kernels`) |
//!
//! `TYPES` are written as the types print: `f32[3, 4], (f64[], i64[]),
//! {w: f32[2]}`; an int literal is an int argument of that value. The
//! optimiser's statistics line (`// optimised: ..`) is left out of the
//! output of `opt` and `grad-opt`.
//!
//! A failure prints the file and a line diff of expected against actual
//! output; every file runs before the test fails. Errors (a program that
//! does not load, a panic in the compiler) are failures too, blessed or
//! not.
//!
//! The last test lowers every program of the corpus and checks that its
//! printed IR parses back and prints identically.

use std::path::{Path, PathBuf};
use std::time::Duration;

use adjoint::{Mode, Session};
use adjoint_compiler::infer::{infer_module_with, parse_types, InferOptions};
use adjoint_compiler::ir::parse::parse_module;
use adjoint_compiler::ir::print::print_module;
use adjoint_compiler::ir::verify::verify_reachable;

/// The files with extension `ext` under `dir` (relative to the crate),
/// in subdirectories too, sorted.
fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("test directory") {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

const MARK: &str = "// expected:";

/// The name of the function `emit --stage grad` adds (as `src/driver.rs`).
const DRIVER: &str = "__adjoint_driver";

/// One stage a filetest can run, by its header word.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lower,
    Grad,
    GradOpt,
    Opt,
    OptIr,
    RewriteIr,
    Infer,
    Kernels,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Lower,
        Kind::Grad,
        Kind::GradOpt,
        Kind::Opt,
        Kind::OptIr,
        Kind::RewriteIr,
        Kind::Infer,
        Kind::Kernels,
    ];

    fn word(self) -> &'static str {
        match self {
            Kind::Lower => "lower",
            Kind::Grad => "grad",
            Kind::GradOpt => "grad-opt",
            Kind::Opt => "opt",
            Kind::OptIr => "opt-ir",
            Kind::RewriteIr => "rewrite-ir",
            Kind::Infer => "infer",
            Kind::Kernels => "kernels",
        }
    }

    /// The directory its files live in.
    fn dir(self) -> &'static str {
        match self {
            Kind::Lower => "lower",
            Kind::Grad => "grad",
            Kind::GradOpt | Kind::Opt | Kind::OptIr => "opt",
            Kind::RewriteIr => "rewrite",
            Kind::Infer => "infer",
            Kind::Kernels => "kernels",
        }
    }

    /// Whether its input is IR text (`.ir`) rather than a program (`.adj`).
    fn takes_ir(self) -> bool {
        matches!(self, Kind::OptIr | Kind::RewriteIr)
    }
}

/// A filetest's input: the text before `// expected:`, its kind and its
/// directives.
struct Input {
    source: String,
    kind: Kind,
    function: Option<String>,
    args: Option<String>,
    driver: Option<String>,
}

fn read_input(path: &Path, text: &str) -> Result<Input, String> {
    let source = text.split(MARK).next().unwrap().trim_end().to_string() + "\n";
    let word = source
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// test "))
        .ok_or("the first line must be `// test KIND`")?
        .trim();
    let kind = Kind::ALL
        .into_iter()
        .find(|k| k.word() == word)
        .ok_or_else(|| format!("unknown kind `{word}`"))?;
    let ext = if kind.takes_ir() { "ir" } else { "adj" };
    if path.extension().is_none_or(|e| e != ext) {
        return Err(format!("a `{word}` filetest is a .{ext} file"));
    }
    let directive = |name: &str| {
        let prefix = format!("// {name}:");
        source
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().to_string())
    };
    let input = Input {
        kind,
        function: directive("fn"),
        args: directive("args"),
        driver: directive("driver"),
        source: source.clone(),
    };
    let needs_fn = kind == Kind::Lower
        || (matches!(kind, Kind::Grad | Kind::GradOpt) && input.driver.is_none());
    if needs_fn && input.function.is_none() {
        return Err(format!("a `{word}` filetest needs `// fn: NAME`"));
    }
    let takes_args = matches!(
        kind,
        Kind::Opt | Kind::OptIr | Kind::RewriteIr | Kind::Infer
    );
    if input.args.is_some() && !takes_args {
        return Err(format!("a `{word}` filetest takes no `// args:`"));
    }
    if kind == Kind::Opt && input.args.is_some() && input.function.is_none() {
        return Err("`// args:` of an `opt` filetest are those of `// fn: NAME`".into());
    }
    if input.driver.is_some() && !matches!(kind, Kind::Grad | Kind::GradOpt) {
        return Err(format!("a `{word}` filetest takes no `// driver:`"));
    }
    if kind == Kind::RewriteIr && input.args.is_none() {
        return Err("a `rewrite-ir` filetest needs `// args: TYPES`".into());
    }
    Ok(input)
}

/// The output of the stage the file asks for.
fn run_stage(path: &Path, input: &Input) -> Result<String, String> {
    let name = path.display().to_string();
    let load = |mode: Mode, extra: &str| {
        Session::new(mode)
            .load_source(&name, &format!("{}{extra}", input.source))
            .map_err(|e| e.render(false))
    };
    let render = |e: adjoint::SessionError| e.render(false);
    // `opt` output without the statistics line.
    let strip_stats = |text: String| match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("// optimised:") => rest.to_string(),
        _ => text,
    };
    let f = input.function.as_deref();
    let driver = || {
        let expr = match (&input.driver, f) {
            (Some(e), _) => e.clone(),
            (None, Some(f)) => format!("grad({f})"),
            (None, None) => unreachable!("checked when read"),
        };
        format!("\nfn {DRIVER}() = {expr}\n")
    };
    match input.kind {
        Kind::Lower => load(Mode::Eager, "")?.emit_ir(f).map_err(render),
        Kind::Grad => load(Mode::Graph, &driver())?
            .emit_ir(Some(DRIVER))
            .map_err(render),
        Kind::GradOpt => load(Mode::Graph, &driver())?
            .emit_opt(Some(DRIVER))
            .map(strip_stats)
            .map_err(render),
        Kind::Opt => {
            let s = load(Mode::Graph, "")?;
            match (&input.args, f) {
                (Some(args), Some(f)) => s.emit_opt_for(f, args),
                _ => s.emit_opt(f),
            }
            .map(strip_stats)
            .map_err(render)
        }
        Kind::Infer => load(Mode::Graph, "")?
            .emit_types(f.unwrap_or("main"), input.args.as_deref().unwrap_or(""))
            .map_err(render),
        Kind::Kernels => load(Mode::Graph, "")?
            .emit_kernels(f.unwrap_or("main"))
            .map_err(render),
        Kind::OptIr => {
            let (mut m, roots) = parse_module(&input.source).map_err(|e| e.to_string())?;
            let root = *roots.first().ok_or("no graph")?;
            let entry = match &input.args {
                Some(a) => Some((root, parse_types(a)?)),
                None => None,
            };
            let opts = adjoint_compiler::opt::Options {
                entry,
                ..Default::default()
            };
            adjoint_compiler::opt::optimize(&mut m, &[root], &opts);
            verify_reachable(&m, &[root])
                .map_err(|e| format!("invalid IR after optimisation: {}", e.join("; ")))?;
            Ok(print_module(&m, &[root], None))
        }
        Kind::RewriteIr => {
            let (mut m, roots) = parse_module(&input.source).map_err(|e| e.to_string())?;
            let root = *roots.first().ok_or("no graph")?;
            let args = parse_types(input.args.as_deref().unwrap_or(""))?;
            let iopts = InferOptions {
                only_taken_branches: true,
                ..Default::default()
            };
            let types = infer_module_with(&m, root, &args, &iopts).map_err(|e| e.to_string())?;
            // A generous time limit: saturation must not stop early on a
            // loaded machine (the table of rules is what is tested).
            let opts = adjoint_compiler::rewrite::Options {
                time_limit: Duration::from_secs(10),
                ..Default::default()
            };
            let stats = adjoint_compiler::rewrite::rewrite(&mut m, &[root], &[], &types, &opts);
            verify_reachable(&m, &[root])
                .map_err(|e| format!("invalid IR after rewriting: {}", e.join("; ")))?;
            let mut out = String::new();
            for g in &stats.graphs {
                let fired: Vec<String> = g.fired.iter().map(|(r, n)| format!("{r}×{n}")).collect();
                out.push_str(&format!(
                    "fired in @{}: {}; {} replaced\n",
                    g.graph,
                    if fired.is_empty() {
                        "nothing".to_string()
                    } else {
                        fired.join(", ")
                    },
                    g.replaced
                ));
            }
            Ok(out + &print_module(&m, &[root], None))
        }
    }
}

/// The expected output written in a file (its comment lines after
/// `// expected:`, uncommented).
fn expected_of(text: &str) -> String {
    text.split_once(MARK)
        .map(|(_, rest)| {
            rest.lines()
                .skip(1)
                .map(|l| {
                    l.strip_prefix("// ")
                        .unwrap_or(l.strip_prefix("//").unwrap_or(l))
                })
                .map(|l| format!("{l}\n"))
                .collect()
        })
        .unwrap_or_default()
}

/// The file with `output` as its expectation.
fn blessed(source: &str, output: &str) -> String {
    let mut out = source.to_string();
    out.push('\n');
    out.push_str(MARK);
    out.push('\n');
    for l in output.lines() {
        if l.is_empty() {
            out.push_str("//\n");
        } else {
            out.push_str(&format!("// {l}\n"));
        }
    }
    out
}

/// A line diff of `a` (expected) against `b` (actual): hunks of changed
/// lines (`-` expected, `+` actual) with up to three lines of context.
fn diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Longest common subsequence, from the ends.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // The edit script: (tag, line).
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = String::new();
    let mut shown_to = 0;
    for (n, &k) in changed.iter().enumerate() {
        let from = k.saturating_sub(CONTEXT).max(shown_to);
        if from > shown_to || (n == 0 && from > 0) {
            out.push_str("@@\n");
        }
        let to = (k + 1 + CONTEXT).min(ops.len());
        let next_from = changed.get(n + 1).map(|&k2| k2.saturating_sub(CONTEXT));
        let to = match next_from {
            Some(nf) if nf <= to => nf.max(k + 1),
            _ => to,
        };
        for (tag, line) in &ops[from..to] {
            out.push_str(&format!("{tag} {line}\n"));
        }
        shown_to = to;
    }
    out
}

/// Runs (or blesses) every filetest in `tests/ir/DIR`, whose kinds must
/// be among those of that directory.
fn run_dir(dir: &str) {
    let bless = std::env::var_os("BLESS").is_some();
    let root = format!("tests/ir/{dir}");
    let paths: Vec<PathBuf> = files(&root, "adj")
        .into_iter()
        .chain(files(&root, "ir"))
        .collect();
    assert!(!paths.is_empty(), "no filetests in {root}");
    let mut failures = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        let outcome = read_input(path, &text).and_then(|input| {
            if input.kind.dir() != dir {
                return Err(format!(
                    "a `{}` filetest belongs in tests/ir/{}",
                    input.kind.word(),
                    input.kind.dir()
                ));
            }
            let out = std::panic::catch_unwind(|| run_stage(path, &input)).unwrap_or_else(|p| {
                Err(format!(
                    "panicked: {}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                ))
            })?;
            Ok((input, out))
        });
        let (input, actual) = match outcome {
            Ok(x) => x,
            Err(e) => {
                failures.push(format!("==== {}\nerror: {e}\n", path.display()));
                continue;
            }
        };
        if bless {
            std::fs::write(path, blessed(&input.source, &actual)).unwrap();
            continue;
        }
        let expected = expected_of(&text);
        if actual.trim_end() != expected.trim_end() {
            failures.push(format!(
                "==== {} (- expected, + actual)\n{}",
                path.display(),
                diff(expected.trim_end(), actual.trim_end())
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetests in {root} failed (BLESS=1 to accept new output):\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}

#[test]
fn lower_filetests() {
    run_dir("lower");
}

#[test]
fn grad_filetests() {
    run_dir("grad");
}

#[test]
fn opt_filetests() {
    run_dir("opt");
}

#[test]
fn rewrite_filetests() {
    run_dir("rewrite");
}

#[test]
fn infer_filetests() {
    run_dir("infer");
}

#[test]
fn kernels_filetests() {
    run_dir("kernels");
}

#[test]
fn every_filetest_is_in_a_stage_directory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ir");
    let dirs: Vec<&str> = Kind::ALL.iter().map(|k| k.dir()).collect();
    for e in std::fs::read_dir(&root).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            p.is_dir() && dirs.contains(&name.as_str()),
            "{}: tests/ir holds only the stage directories {dirs:?}",
            p.display()
        );
    }
}

#[test]
fn the_diff_shows_changed_lines_with_context() {
    let a = "a\nb\nc\nd\ne\nf\ng\nh\ni\n";
    let b = "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\n";
    assert_eq!(
        diff(a, b),
        "@@\n  b\n  c\n  d\n- e\n+ E\n  f\n  g\n  h\n  i\n+ j\n"
    );
    assert_eq!(diff("x\n", "x\n"), "");
    assert_eq!(diff("", "y\n"), "+ y\n");
}

#[test]
fn printed_ir_parses_back_identically() {
    let mut checked = 0;
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
    for path in files("tests/programs", "adj")
        .into_iter()
        .filter(|p| p.parent() == Some(programs.as_path()))
        .chain(files("tests/ir", "adj"))
    {
        let Ok(session) = Session::new(Mode::Eager).load_file(&path) else {
            continue; // error programs that fail before lowering
        };
        let text = session.emit_ir(None).unwrap();
        let (module, roots) = parse_module(&text).unwrap_or_else(|e| {
            panic!(
                "{}: printed IR does not parse: {e:?}\n{text}",
                path.display()
            )
        });
        let again = print_module(&module, &roots, None);
        assert_eq!(
            text,
            again,
            "{}: print → parse → print differs",
            path.display()
        );
        adjoint_compiler::ir::verify::verify(&module)
            .unwrap_or_else(|e| panic!("{}: parsed IR does not verify: {e:?}", path.display()));
        checked += 1;
    }
    assert!(checked > 100, "only {checked} programs lowered");
}
