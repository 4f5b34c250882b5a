//! The `adjoint` command.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use adjoint::{Device, Mode, Options, Session, SessionError, Value};

mod driver;
mod host;
mod repl;

#[derive(Parser)]
#[command(
    name = "adjoint",
    version,
    about = "Adjoint: a differentiable programming language and compiler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print the time each compiler stage took (parsing and lowering,
    /// differentiation, type checking, the optimiser's rounds, equality
    /// saturation, fusion, code generation) to stderr at the end.
    #[arg(long, global = true)]
    time_passes: bool,
}

#[derive(Copy, Clone, ValueEnum)]
enum ModeArg {
    Eager,
    Graph,
}

#[derive(Copy, Clone, ValueEnum, PartialEq)]
enum Stage {
    Ast,
    Ir,
    /// The IR of `grad(F)` for the function given with `--fn`.
    Grad,
    /// The IR after the optimiser (graph mode's input to code generation).
    Opt,
    /// The optimised IR of `grad(F)` for the function given with `--fn`.
    GradOpt,
    /// The kernels fusion compiles for `--fn F` (default `main`).
    Kernels,
    /// The CUDA C source of those kernels (what `--device cuda` compiles
    /// with NVRTC; no GPU needed to print it).
    Cuda,
}

#[derive(Copy, Clone, ValueEnum, PartialEq)]
enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Subcommand)]
enum Command {
    /// Run the program's `main` function.
    Run {
        file: PathBuf,
        /// `graph` optimises the program first; `eager` runs the IR as
        /// differentiated, one primitive at a time (for debugging).
        #[arg(long, value_enum, default_value = "graph")]
        mode: ModeArg,
        /// Where graph mode's kernels run: `cuda` runs fused kernels and
        /// matrix products on the first NVIDIA GPU.
        #[arg(long, value_enum, default_value = "cpu")]
        device: DeviceArg,
        /// Print compile and run times, peak heap memory, kernel and closure
        /// counts to stderr after the run.
        #[arg(long)]
        stats: bool,
        /// Where `plot(..)` draws: a PNG file. Without it, `plot` draws
        /// nothing.
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
        /// Arguments for `fn main(args)`, after `--`: a tuple of strings.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Parse, lower and type-check a program without running it.
    Check {
        file: PathBuf,
        /// Arguments for `fn main(args)`, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// List the devices programs can run on (the CPU, and CUDA GPUs when a
    /// driver is present).
    Devices,
    /// Print the value and gradient of function FN at a point.
    Grad {
        file: PathBuf,
        #[arg(value_name = "FN")]
        function: String,
        /// Arguments: numbers, tensor literals such as [1.0, 2.0], or .npy paths.
        #[arg(long, num_args = 1.., required = true, allow_hyphen_values = true)]
        at: Vec<String>,
    },
    /// Compare reverse mode with forward mode and finite differences.
    CheckGrad {
        file: PathBuf,
        #[arg(value_name = "FN")]
        function: String,
        #[arg(long, num_args = 1.., required = true, allow_hyphen_values = true)]
        at: Vec<String>,
        /// Largest relative error accepted [default: 1e-4, or 3e-2 when a
        /// differentiated parameter is annotated f32, whose finite
        /// differences are taken in f32].
        #[arg(long)]
        tolerance: Option<f64>,
    },
    /// An interactive session: definitions, expressions, `:grad`, `:ir`, ...
    /// (`:help` lists the commands).
    Repl {
        /// The mode expressions run in (`:mode` changes it).
        #[arg(long, value_enum, default_value = "graph")]
        mode: ModeArg,
    },
    /// Print one stage of the compiler's work on a program.
    Emit {
        file: PathBuf,
        #[arg(long, value_enum)]
        stage: Stage,
        /// Function to show (default: every function of the file).
        #[arg(long = "fn")]
        function: Option<String>,
        /// Write the IR of the stage (ir, grad, opt, grad-opt) as a
        /// Graphviz drawing to this file instead of printing it.
        #[arg(long, value_name = "FILE")]
        dot: Option<PathBuf>,
    },
    /// Build a native library (or object file) exporting a function, and
    /// optionally its gradient, with a C ABI, and its C header.
    Build {
        /// The program.
        file: PathBuf,
        /// The function to export.
        #[arg(long, value_name = "F")]
        entry: String,
        /// Also export `F_grad`, the gradient of F with respect to every
        /// parameter (or those --wrt names), and `F_value_and_grad`.
        #[arg(long)]
        with_grad: bool,
        /// The parameters of F to differentiate with respect to, by name
        /// (default: all of them).
        #[arg(long, value_name = "NAMES", value_delimiter = ',', num_args = 1..)]
        wrt: Option<Vec<String>>,
        /// The library to write: `libF.so` (a shared library) or `F.o` (an
        /// object file to link with libadjoint_capi.a yourself).
        #[arg(short = 'o', long = "output", value_name = "OUT")]
        output: PathBuf,
        /// The C header to write (default: F.h beside OUT).
        #[arg(long, value_name = "FILE")]
        header: Option<PathBuf>,
        /// The runtime's static library (default: libadjoint_capi.a beside
        /// the adjoint executable).
        #[arg(long, value_name = "LIB")]
        runtime: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // A panic is a compiler bug: report it in one line, without a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal compiler error: {msg}{at}\nplease report this as a bug");
        if std::env::var_os("ADJOINT_ICE_BACKTRACE").is_some() {
            eprintln!("{}", std::backtrace::Backtrace::force_capture());
        }
    }));
    // This thread runs the VM: make it one of the kernel pool's workers,
    // so parallel kernels start here instead of waking other threads and
    // waiting for them (`adjoint_runtime::threads`).
    adjoint_runtime::threads::join_kernel_pool(adjoint::env_options::kernel_threads());
    let cli = Cli::parse();
    let times = cli.time_passes.then(adjoint::pass_times::PassTimes::new);
    adjoint::env_options::install_tracing(times.as_ref());
    // Under `mpirun`, join the MPI job before anything runs; the universe
    // lives until `main` returns (dropping it finalises MPI).
    #[cfg(feature = "mpi")]
    let (_universe, comm) = match join_mpi_job() {
        Ok(Some((u, c))) => (Some(u), c),
        Ok(None) => (None, single()),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    #[cfg(not(feature = "mpi"))]
    let comm = single();
    if let Command::Repl { mode } = cli.command {
        return repl::run(match mode {
            ModeArg::Eager => Mode::Eager,
            ModeArg::Graph => Mode::Graph,
        });
    }
    let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli, comm))) {
        Ok(code) => code,
        Err(_) => ExitCode::from(101),
    };
    if let Some(times) = times {
        let total = times
            .stages()
            .iter()
            .filter(|s| s.path.len() == 1)
            .map(|s| s.total)
            .sum();
        eprint!("{}", times.describe(total));
    }
    code
}

/// Initialises MPI when this process was started by `mpirun` (its
/// launcher sets the variables below) and installs MPI's world as the
/// process's communicator; alone, the process stays a world of one
/// without touching MPI.
#[cfg(feature = "mpi")]
fn join_mpi_job() -> Result<Option<(mpi::environment::Universe, Comm)>, String> {
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if !launched {
        return Ok(None);
    }
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized)
        .ok_or("MPI was already initialised")?;
    let world = adjoint::comm::mpi::MpiWorld::new(universe.world());
    Ok(Some((universe, Arc::new(world))))
}

/// The processes a run is made of.
type Comm = Arc<dyn adjoint::comm::Communicator>;

/// One process alone.
fn single() -> Comm {
    Arc::new(adjoint::comm::Single)
}

/// A session with the compiler options of the environment.
fn session(mode: Mode) -> Session {
    Session::new(mode).with_compiler_options(adjoint::env_options::compiler_options())
}

fn run(cli: Cli, comm: Comm) -> ExitCode {
    let color = std::io::stderr().is_terminal();
    let result = match cli.command {
        Command::Run {
            file,
            mode,
            device,
            stats,
            plot,
            args,
        } => {
            let mode = match mode {
                ModeArg::Eager => Mode::Eager,
                ModeArg::Graph => Mode::Graph,
            };
            let device = match device {
                DeviceArg::Cpu => Device::Cpu,
                DeviceArg::Cuda => {
                    adjoint_runtime::cuda::nvrtc::set_cache_dir(ptx_cache_dir());
                    Device::Cuda
                }
            };
            // Progress bars (on a terminal) and plots.
            adjoint_runtime::host::set_host(Some(Box::new(host::CliHost::new(plot))));
            let r = run_file(&file, mode, device, stats, args, comm.clone());
            // Dropping the host closes bars left open by an early return.
            adjoint_runtime::host::set_host(None);
            r
        }
        Command::Repl { .. } => Ok(()),
        Command::Devices => write_stdout(&devices_text()),
        Command::Check { file, args } => session(Mode::Eager)
            .with_main_args(args)
            .load_file(&file)
            .and_then(|s| s.check()),
        Command::Emit {
            file,
            stage,
            function,
            dot,
        } => emit(&file, stage, function.as_deref(), dot.as_deref()),
        Command::Build {
            file,
            entry,
            with_grad,
            wrt,
            output,
            header,
            runtime,
        } => {
            let opts = adjoint::aot::BuildOptions {
                file,
                entry,
                with_grad,
                wrt,
                output,
                header,
                runtime,
                cc: std::env::var("CC").unwrap_or_else(|_| "cc".into()),
            };
            adjoint::aot::build(&opts).and_then(|b| {
                write_stdout(&format!(
                    "wrote {} and {}\n",
                    b.library.display(),
                    b.header.display()
                ))
            })
        }
        Command::Grad { file, function, at } => {
            run_driver(&file, driver::grad_driver(&file, &function, &at)).map(|_| ())
        }
        Command::CheckGrad {
            file,
            function,
            at,
            tolerance,
        } => match driver::check_grad_driver(&file, &function, &at)
            .map_err(SessionError::message)
            .and_then(|d| {
                let tolerance = tolerance.unwrap_or(if d.in_f32 { 3e-2 } else { 1e-4 });
                run_driver(&file, Ok(d.source)).map(|v| (v, tolerance))
            }) {
            Ok((v, tolerance)) => {
                let worst = v
                    .as_tensor()
                    .and_then(|t| t.to_f64_scalar())
                    .unwrap_or(f64::NAN);
                if worst <= tolerance {
                    write_stdout(&format!("ok (tolerance {tolerance:e})\n"))
                } else {
                    let _ = write_stdout(&format!(
                        "MISMATCH: worst relative error {worst:e} exceeds {tolerance:e}\n"
                    ));
                    return ExitCode::from(1);
                }
            }
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            let world = &*comm;
            if world.size() > 1 {
                // The other ranks may be waiting in a collective for this
                // one: say which rank failed, then end them all.
                let text = format!(
                    "rank {} of {}: {}",
                    world.rank(),
                    world.size(),
                    e.render(color)
                );
                let _ = std::io::stderr().write_all(text.as_bytes());
                let _ = std::io::stderr().flush();
                world.abort(1);
            }
            let _ = write!(std::io::stderr(), "{}", e.render(color));
            ExitCode::from(1)
        }
    }
}

/// What `adjoint devices` prints: the CPU, then each GPU or why there is
/// none.
fn devices_text() -> String {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = format!("cpu: {threads} threads (Cranelift kernels)\n");
    match adjoint_runtime::cuda::devices() {
        Ok(gpus) if gpus.is_empty() => out.push_str("cuda: none (the driver reports no GPU)\n"),
        Ok(gpus) => {
            let driver = adjoint_runtime::cuda::driver_version().unwrap_or_else(|| "?".into());
            let nvrtc = match adjoint_runtime::cuda::nvrtc::version() {
                Some((a, b)) => format!("NVRTC {a}.{b}"),
                None => "NVRTC not found: --device cuda cannot compile kernels".into(),
            };
            for g in gpus {
                out.push_str(&format!(
                    "cuda:{}: {}, {:.1} GiB, compute capability {}.{}, {} SMs (driver {driver}, {nvrtc})\n",
                    g.ordinal,
                    g.name,
                    g.total_memory as f64 / (1u64 << 30) as f64,
                    g.compute_capability.0,
                    g.compute_capability.1,
                    g.multiprocessors
                ));
            }
        }
        Err(e) => out.push_str(&format!("cuda: none ({})\n", e.message)),
    }
    out
}

/// Where compiled PTX is kept between runs: `$XDG_CACHE_HOME/adjoint/ptx`,
/// else `~/.cache/adjoint/ptx`.
fn ptx_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("adjoint").join("ptx"))
}

fn run_file(
    file: &std::path::Path,
    mode: Mode,
    device: Device,
    stats: bool,
    args: Vec<String>,
    comm: Comm,
) -> Result<(), SessionError> {
    let session = Session::with_options(Options {
        mode,
        device,
        compiler: adjoint::env_options::compiler_options(),
    })?
    .with_main_args(args)
    .with_communicator(comm.clone())
    .load_file(file)?;
    // Every rank runs the program; only rank 0 writes what it prints.
    if comm.rank() != 0 {
        return session.run_main(&mut std::io::sink());
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if !stats {
        return session.run_main(&mut out);
    }
    let s = session.run_main_with_stats(&mut out)?;
    drop(out);
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "stats: compile {:.1} ms, peak heap {:.2} MiB",
        s.compile.as_secs_f64() * 1e3,
        mib(s.compile_peak_bytes)
    );
    eprintln!(
        "stats: run {:.1} ms, peak heap {:.2} MiB above what was in use before it",
        s.run.as_secs_f64() * 1e3,
        mib(s.run_peak_bytes)
    );
    eprintln!(
        "stats: {} fused kernel calls, {} of them wrote over an input that died there",
        s.kernel_calls, s.kernels_in_place
    );
    eprintln!("stats: {} closures made", s.closures_made);
    eprintln!(
        "stats: {} indexed updates, {} of them wrote into their array's buffer, which died there",
        s.updates, s.updates_in_place
    );
    Ok(())
}

/// Counts heap bytes for `--stats` (and nothing else).
#[global_allocator]
static ALLOC: adjoint_runtime::memory::CountingAlloc = adjoint_runtime::memory::CountingAlloc;

/// Loads `file` with a generated driver function appended and runs it.
fn run_driver(file: &std::path::Path, src: Result<String, String>) -> Result<Value, SessionError> {
    let src = src.map_err(SessionError::message)?;
    let run = || {
        let session = session(Mode::Graph).load_file_with(file, &src)?;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        session.run_function(driver::DRIVER, &mut out)
    };
    run().map_err(|e| in_driver(e, file, &src))
}

/// `e` with the places that fall in the driver appended to `file` shown
/// in the driver's own text, named as generated (the user's file has no
/// such lines).
fn in_driver(e: SessionError, file: &std::path::Path, src: &str) -> SessionError {
    let Ok(text) = std::fs::read_to_string(file) else {
        return e;
    };
    let piece = adjoint::SourcePiece {
        at: text.len() + 1,
        len: src.len(),
        name: "<generated driver>".into(),
        text: src.to_string(),
        offset: 0,
    };
    e.relocate(&file.display().to_string(), &[piece])
}

fn emit(
    file: &std::path::Path,
    stage: Stage,
    function: Option<&str>,
    dot: Option<&std::path::Path>,
) -> Result<(), SessionError> {
    let draw = dot.is_some();
    let text = match stage {
        Stage::Grad | Stage::GradOpt => {
            let Some(f) = function else {
                return Err(SessionError::message(format!(
                    "`--stage {}` needs `--fn NAME`",
                    if stage == Stage::Grad {
                        "grad"
                    } else {
                        "grad-opt"
                    }
                )));
            };
            let src = driver::emit_grad_driver(f);
            let emit = || {
                let s = session(Mode::Graph).load_file_with(file, &src)?;
                match (stage == Stage::Grad, draw) {
                    (true, false) => s.emit_ir(Some(driver::DRIVER)),
                    (true, true) => s.emit_ir_dot(Some(driver::DRIVER)),
                    (false, false) => s.emit_opt(Some(driver::DRIVER)),
                    (false, true) => s.emit_opt_dot(Some(driver::DRIVER)),
                }
            };
            emit().map_err(|e| in_driver(e, file, &src))?
        }
        Stage::Kernels | Stage::Cuda | Stage::Ast if draw => {
            return Err(SessionError::message(
                "`--dot` draws the IR stages: ir, grad, opt and grad-opt".into(),
            ))
        }
        Stage::Kernels => session(Mode::Graph)
            .load_file(file)?
            .emit_kernels(function.unwrap_or("main"))?,
        Stage::Cuda => session(Mode::Graph)
            .load_file(file)?
            .emit_cuda(function.unwrap_or("main"))?,
        Stage::Opt if draw => session(Mode::Graph)
            .load_file(file)?
            .emit_opt_dot(function)?,
        Stage::Opt => session(Mode::Graph).load_file(file)?.emit_opt(function)?,
        Stage::Ast => Session::emit_ast(file)?,
        Stage::Ir if draw => session(Mode::Eager)
            .load_file(file)?
            .emit_ir_dot(function)?,
        Stage::Ir => session(Mode::Eager).load_file(file)?.emit_ir(function)?,
    };
    match dot {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| SessionError::message(format!("cannot write {}: {e}", path.display()))),
        None => write_stdout(&text),
    }
}

/// Writes to standard output; a reader that has gone away (`| head`) is
/// not an error, any other failure is reported.
fn write_stdout(text: &str) -> Result<(), SessionError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(SessionError::message(format!(
            "cannot write the output: {e}"
        ))),
    }
}
