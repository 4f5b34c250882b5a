//! `adjoint-fuzz`: generate random Adjoint programs, run them through the
//! `adjoint` executable in several configurations, check oracles, shrink
//! failures.

use adjoint_fuzz::{config_names, run, Options, Switches};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: adjoint-fuzz [OPTIONS]

  --seed S               run seed (default 1)
  --count N              number of programs (default 100)
  --max-secs T           start no program after T seconds (those started
                         finish, then the summary prints)
  --start K              index of the first program (default 0): a campaign
                         of one seed can run in chunks
  --jobs J               programs run in parallel (default 2)
  --adjoint PATH         the adjoint executable (default: target/release/adjoint,
                         else target/debug/adjoint, else `adjoint` on PATH)
  --out DIR              where failing programs are saved (default target/fuzz)
  --shrink               minimise one failing program per failure class
  --shrink-secs T        time budget of one shrink (default 120)
  --max-compile-secs T   flag a compile (`adjoint emit --stage kernels`: everything
                         up to machine code) slower than T s (default 2;
                         0 turns the compile timing off)
  --only INDEX           run only program INDEX of the seed (prints its source)
  --switches all|rotate|none
                         which ADJOINT_NO_* configurations run besides eager and
                         graph: all three, one in turn, or none (default all)
  --timeout T            kill a run after T seconds (default 10)
  --cuda                 also run each program with --device cuda (graph
                         mode, fused kernels on the GPU) and compare
  --small                smaller programs (faster compiles; other programs)
  --compile-every K      time the compile on every K-th program only
  --switch-every K       with --switches rotate: on every K-th program only
  --print                with --only: print the program and exit
  -v, --verbose          a line per program

  --reduce FILE --grep TEXT [--mode eager|graph]
                         shrink FILE while `adjoint run FILE --mode M` prints
                         TEXT (stdout or stderr); writes FILE.reduced.adj
";

fn default_adjoint() -> PathBuf {
    for p in [
        "target/release/adjoint",
        "target/debug/adjoint",
        "../target/release/adjoint",
        "../target/debug/adjoint",
    ] {
        let p = PathBuf::from(p);
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("adjoint")
}

fn main() -> ExitCode {
    let mut opts = Options::new(default_adjoint());
    let mut print_only = false;
    let mut reduce: Option<PathBuf> = None;
    let mut grep = String::new();
    let mut mode = "eager".to_string();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let val = |i: &mut usize, name: &str| -> String {
        *i += 1;
        match args.get(*i) {
            Some(v) => v.clone(),
            None => {
                eprintln!("adjoint-fuzz: {name} needs a value\n{USAGE}");
                std::process::exit(2);
            }
        }
    };
    fn num<T: std::str::FromStr>(s: &str, name: &str) -> T {
        s.parse().unwrap_or_else(|_| {
            eprintln!("adjoint-fuzz: bad value for {name}: {s}");
            std::process::exit(2)
        })
    }
    while i < args.len() {
        let a = args[i].clone();
        match a.as_str() {
            "--seed" => opts.seed = num(&val(&mut i, &a), &a),
            "--count" => opts.count = num(&val(&mut i, &a), &a),
            "--start" => opts.start = num(&val(&mut i, &a), &a),
            "--jobs" | "-j" => opts.jobs = num(&val(&mut i, &a), &a),
            "--adjoint" => opts.adjoint = PathBuf::from(val(&mut i, &a)),
            "--out" => opts.out = PathBuf::from(val(&mut i, &a)),
            "--shrink" => opts.shrink = true,
            "--shrink-secs" => opts.shrink_secs = num(&val(&mut i, &a), &a),
            "--max-compile-secs" => {
                let t: f64 = num(&val(&mut i, &a), &a);
                opts.max_compile_secs = if t > 0.0 { Some(t) } else { None };
            }
            "--only" => opts.only = Some(num(&val(&mut i, &a), &a)),
            "--switches" => {
                opts.switches = match val(&mut i, &a).as_str() {
                    "all" => Switches::All,
                    "rotate" => Switches::Rotate,
                    "none" => Switches::None,
                    s => {
                        eprintln!("adjoint-fuzz: --switches all|rotate|none, not {s}");
                        return ExitCode::from(2);
                    }
                }
            }
            "--timeout" => opts.timeout_secs = num(&val(&mut i, &a), &a),
            "--print" => print_only = true,
            "--reduce" => reduce = Some(PathBuf::from(val(&mut i, &a))),
            "--grep" => grep = val(&mut i, &a),
            "--mode" => mode = val(&mut i, &a),
            "-v" | "--verbose" => opts.verbose = true,
            "--small" => opts.small = true,
            "--cuda" => opts.cuda = true,
            "--max-secs" => opts.max_secs = Some(num(&val(&mut i, &a), &a)),
            "--switch-every" => opts.switch_every = num(&val(&mut i, &a), &a),
            "--compile-every" => opts.compile_every = num(&val(&mut i, &a), &a),
            "-h" | "--help" => {
                print!("{USAGE}\nconfigurations: {}\n", config_names().join(", "));
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("adjoint-fuzz: unknown argument {a}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
        i += 1;
    }
    if let Some(file) = reduce {
        return reduce_file(&opts, &file, &grep, &mode);
    }
    if let Some(index) = opts.only {
        let p = adjoint_fuzz::gen::generate_sized(opts.seed, index, opts.small);
        if print_only {
            print!("{}", p.source);
            return ExitCode::SUCCESS;
        }
        println!(
            "program #{index} of seed {} ({} lines)",
            opts.seed,
            p.source.lines().count()
        );
    }
    if !opts.adjoint.exists() && opts.adjoint.components().count() > 1 {
        eprintln!(
            "adjoint-fuzz: no adjoint executable at {}",
            opts.adjoint.display()
        );
        return ExitCode::from(2);
    }
    if opts.cuda {
        // One check up front, rather than one failure per program.
        let devices = std::process::Command::new(&opts.adjoint)
            .arg("devices")
            .output();
        let text = match &devices {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => e.to_string(),
        };
        if !text.lines().any(|l| l.starts_with("cuda:0:")) {
            eprintln!("adjoint-fuzz: --cuda needs a GPU that adjoint can use; `adjoint devices` says:\n{text}");
            return ExitCode::from(2);
        }
    }
    let summary = run(&opts);
    summary.print();
    if summary.failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--reduce`: shrink a file while a run of it prints `grep`.
fn reduce_file(opts: &Options, file: &std::path::Path, grep: &str, mode: &str) -> ExitCode {
    use adjoint_fuzz::check::{run_adjoint, CheckOpts};
    let Ok(src) = std::fs::read_to_string(file) else {
        eprintln!("adjoint-fuzz: cannot read {}", file.display());
        return ExitCode::from(2);
    };
    let dir = std::env::temp_dir().join(format!("adjoint-fuzz-reduce-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let co = CheckOpts {
        adjoint: std::fs::canonicalize(&opts.adjoint).unwrap_or(opts.adjoint.clone()),
        timeout: std::time::Duration::from_secs_f64(opts.timeout_secs),
        max_compile_secs: None,
    };
    let fails = |s: &str| {
        let _ = std::fs::write(dir.join("prog.adj"), s);
        let r = run_adjoint(&co, &["run", "prog.adj", "--mode", mode], &[], &dir);
        r.stdout.contains(grep) || r.stderr.contains(grep)
    };
    if !fails(&src) {
        eprintln!("adjoint-fuzz: the file does not print {grep:?}");
        return ExitCode::from(1);
    }
    let (min, tries) = adjoint_fuzz::shrink::shrink(
        &src,
        std::time::Duration::from_secs_f64(opts.shrink_secs),
        fails,
    );
    let out = file.with_extension("reduced.adj");
    let _ = std::fs::write(&out, &min);
    print!("{min}");
    eprintln!("{tries} tries; written to {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
    ExitCode::SUCCESS
}
