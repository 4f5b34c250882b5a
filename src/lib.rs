//! Adjoint: a source-to-source automatic differentiation compiler.
//!
//! This crate is the front door: the [`Session`] API that the `adjoint`
//! command, its REPL and programs embedding the compiler use to load,
//! check, print, differentiate and run Adjoint programs.
//!
//! A [`Session`] loads a program ([`Session::load_source`],
//! [`Session::load_file`]); [`Session::function`] names one of its
//! functions; a [`Function`] is called with [`Value`]s
//! ([`Function::call`]) and transformed into other functions
//! ([`Function::grad`], [`Function::value_and_grad`], [`Function::jvp`],
//! [`Function::vjp`]).
//! A function is compiled once per signature of its arguments (their
//! dtypes and shapes) and the compiled code is kept, so calling it again
//! costs only the run. Errors are [`SessionError`]s, which carry the
//! diagnostics and render them with `file:line:col` and the source line.
//!
//! The example below is `tests/embed.rs`, which `cargo test` runs:
//!
//! ```rust
#![doc = include_str!("../tests/embed.rs")]
//! ```

#![warn(missing_docs)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use adjoint_compiler::infer::AbsVal;
use adjoint_compiler::ir::print::print_module;
use adjoint_compiler::lower::SourceLoader;
use adjoint_compiler::pipeline::Program;
use adjoint_compiler::vmgen::Executable;
use adjoint_lang::{render, Diagnostic, SourceMap};

/// Processes and collectives (`Session::with_communicator`).
pub use adjoint_runtime::comm;
use adjoint_runtime::comm::Communicator;
pub use adjoint_runtime::tensor::{DType, Tensor};
pub use adjoint_runtime::value::Value;

/// The allocator of the `adjoint` command, for programs that embed
/// Adjoint: mimalloc, with a cache of large freed blocks and a byte
/// count for peak-memory figures. A loop the VM interprets allocates a
/// few small blocks per step; with glibc's allocator they cost 7-11% of
/// a reversed loop over tensors (`docs/benchmarks.md`). Install it with
/// `#[global_allocator] static ALLOC: adjoint::CountingAlloc =
/// adjoint::CountingAlloc;`.
pub use adjoint_runtime::memory::CountingAlloc;
/// Makes the calling thread one of the workers that run parallel kernels,
/// so that the large kernels of the programs it runs start on it instead
/// of waking other threads and waiting for them: 5-15% of an MLP or GMM
/// gradient on two cores. Call it once, early, on a thread that lives as
/// long as the process (`main`); the `adjoint` command does. Returns
/// whether it did (not on one core, nor once parallel kernels have run).
pub use adjoint_runtime::threads::join_kernel_pool;

/// Interrupting running programs from another thread or a signal handler
/// (Ctrl-C): [`request_interrupt`] makes every program running in the
/// process stop at its next call or loop iteration (native loops poll the
/// same flag) with an `interrupted` error; [`clear_interrupt`] withdraws
/// the request before more runs. [`interrupt_requested`] reads it.
pub use adjoint_runtime::vm::{clear_interrupt, interrupt_requested, request_interrupt};

/// Forgets the machine code compiled so far in the process (fused
/// kernels and native loops are cached by their form, so a program
/// loaded again compiles nothing): the next program compiles from
/// scratch, as in a fresh process. Programs already loaded keep their
/// code. For embedders that want memory back, and for measuring compile
/// times (`benches/adjoint_bench.rs`).
pub fn clear_code_caches() {
    adjoint_compiler::codegen::cpu::clear_cache();
    adjoint_compiler::scalar::native::clear_cache();
}

pub mod env_options;

pub mod pass_times;

pub mod aot;

/// How programs run: one primitive at a time on the IR as differentiated
/// (eager, for debugging), or through the optimiser (graph, the default).
pub use adjoint_compiler::pipeline::Mode;
pub use adjoint_compiler::CompilerOptions;

/// What [`Session::run_main_with_stats`] measured.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// Parsing is done by `load_*`; this is checking, optimising and
    /// compiling `main`.
    pub compile: std::time::Duration,
    /// Running `main`.
    pub run: std::time::Duration,
    /// The most heap memory the compile step added to what was in use
    /// before it.
    pub compile_peak_bytes: usize,
    /// The most heap memory the run added to what was in use before it.
    pub run_peak_bytes: usize,
    /// Calls of fused (Cranelift) kernels.
    pub kernel_calls: usize,
    /// How many of those calls wrote their result over an input that died
    /// there.
    pub kernels_in_place: usize,
    /// Closures with captures the VM made (graph mode lambda-lifts the
    /// functions that are only called, such as loop bodies).
    pub closures_made: u64,
    /// Indexed updates (`v[i] = e`, `x.at[i].set(e)`, ..) run.
    pub updates: usize,
    /// How many of those wrote into the buffer of their array, which died
    /// there, instead of copying it.
    pub updates_in_place: usize,
}

/// One generated CUDA kernel ([`Session::cuda_kernels`]).
#[derive(Clone, Debug)]
pub struct CudaKernelSource {
    /// What fusion grouped into it (as `--stage kernels` prints).
    pub description: String,
    /// The `extern "C"` entry point.
    pub entry: String,
    /// The CUDA C source, for NVRTC.
    pub source: String,
}

/// Where programs run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU: reference kernels and Cranelift-compiled fused kernels.
    #[default]
    Cpu,
    /// The first NVIDIA GPU: graph mode's fused kernels run as CUDA
    /// kernels compiled by NVRTC, matrix products through cuBLAS; other
    /// primitives, and eager mode, stay on the CPU. Without a usable GPU
    /// (no driver, no device, no NVRTC) [`Session::with_options`] fails
    /// with [`ErrorKind::DeviceUnavailable`] and a one-line reason.
    Cuda,
}

/// The options of a [`Session`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Options {
    /// Graph mode (optimised, the default) or eager mode.
    pub mode: Mode,
    /// The device programs run on.
    pub device: Device,
    /// How the compiler works: switches and limits.
    pub compiler: CompilerOptions,
}

/// What kind of failure a [`SessionError`] is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The program is wrong: a syntax, name, type or shape error, or a
    /// failure while it ran (its diagnostics point into the source).
    Program,
    /// A file could not be read.
    Io,
    /// The embedder asked for something that cannot be: a function that
    /// does not exist, the wrong number of arguments, a bad value.
    Usage,
    /// The device asked for is not available on this machine.
    DeviceUnavailable,
}

/// An error: its kind and its diagnostics, with the sources they point
/// into, so that it renders with `file:line:col` and the source line.
#[derive(Debug, Clone)]
pub struct SessionError {
    /// The diagnostics, first the primary one.
    pub diagnostics: Vec<Diagnostic>,
    sources: SourceMap,
    /// An error with no place in a source file (an input file that cannot
    /// be read, a bad command-line argument): rendered as one line.
    plain: bool,
    kind: ErrorKind,
}

/// A stretch of a generated source (`at..at + len`) copied from the text
/// `text` named `name`, where it starts at byte `offset`
/// ([`SessionError::relocate`]).
#[derive(Clone, Debug)]
pub struct SourcePiece {
    /// Where the piece starts in the generated source (bytes).
    pub at: usize,
    /// Its length in the generated source.
    pub len: usize,
    /// The name diagnostics give the original text (`<input 3>`).
    pub name: String,
    /// The whole original text.
    pub text: String,
    /// Where the piece starts in `text`.
    pub offset: usize,
}

/// The error type of the embedding API (the same as [`SessionError`]).
pub type Error = SessionError;

impl SessionError {
    /// The diagnostics rendered with source excerpts (`file:line:col`); an
    /// error that has no place in a source file as one line, `error: ...`.
    pub fn render(&self, color: bool) -> String {
        if self.plain {
            return self
                .diagnostics
                .iter()
                .map(|d| format!("error: {}\n", d.message))
                .collect();
        }
        render(&self.diagnostics, &self.sources, color)
    }

    /// An error with a message and no source location (bad command-line
    /// input, say), of kind [`ErrorKind::Usage`].
    pub fn message(message: String) -> SessionError {
        SessionError::plain(message, "<command line>", ErrorKind::Usage)
    }

    /// The same error with a note added to its primary diagnostic.
    pub fn with_note(mut self, note: impl Into<String>) -> SessionError {
        let note = note.into();
        if self.plain {
            if let Some(d) = self.diagnostics.first_mut() {
                d.message = format!("{}\nnote: {note}", d.message);
            }
        } else if let Some(d) = self.diagnostics.first_mut() {
            d.notes.push(note);
        }
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The primary message, without location or source excerpt.
    pub fn summary(&self) -> &str {
        self.diagnostics
            .first()
            .map(|d| d.message.as_str())
            .unwrap_or("")
    }

    /// The `file:line:col` of the primary diagnostic, when it has a place
    /// in a source file.
    pub fn location(&self) -> Option<(String, u32, u32)> {
        if self.plain {
            return None;
        }
        let d = self.diagnostics.first()?;
        let span = d.primary.span;
        self.sources.get(span.file)?;
        let (line, col) = self.sources.line_col(span);
        Some((self.sources.name(span.file).to_string(), line, col))
    }

    /// The same error with the places that fall inside `pieces` of the
    /// source named `generated` shown at their place in the text each
    /// piece was copied from (an entry typed at the REPL, a loaded file),
    /// so that line numbers refer to what the user wrote.
    pub fn relocate(mut self, generated: &str, pieces: &[SourcePiece]) -> SessionError {
        if self.plain {
            return self;
        }
        let SessionError {
            diagnostics,
            sources,
            ..
        } = &mut self;
        let mut files: HashMap<String, adjoint_lang::FileId> = HashMap::new();
        for d in diagnostics.iter_mut() {
            for label in std::iter::once(&mut d.primary).chain(d.secondary.iter_mut()) {
                let span = label.span;
                if sources.get(span.file).is_none() || sources.name(span.file) != generated {
                    continue;
                }
                let (mut lo, mut hi) = (span.lo as usize, span.hi as usize);
                let p = match pieces.iter().find(|p| p.at <= lo && hi <= p.at + p.len) {
                    Some(p) => p,
                    None => {
                        // A generated expression around one piece (`grad(f)`
                        // for `:grad f`): the piece.
                        let mut inside = pieces.iter().filter(|p| lo <= p.at && p.at + p.len <= hi);
                        match (inside.next(), inside.next()) {
                            (Some(p), None) => {
                                (lo, hi) = (p.at, p.at + p.len);
                                p
                            }
                            _ => continue,
                        }
                    }
                };
                let file = *files
                    .entry(p.name.clone())
                    .or_insert_with(|| sources.add_file(p.name.clone(), p.text.clone()));
                let end = p.text.len();
                let shift = |x: usize| (x - p.at + p.offset).min(end) as u32;
                label.span = adjoint_lang::Span::new(file, shift(lo), shift(hi));
            }
        }
        self
    }

    fn plain(message: String, file: &str, kind: ErrorKind) -> SessionError {
        let mut sources = SourceMap::new();
        let file = sources.add_file(file, "");
        SessionError {
            diagnostics: vec![Diagnostic::error(
                message,
                adjoint_lang::Span::point(file, 0),
            )],
            sources,
            plain: true,
            kind,
        }
    }

    fn io(path: &Path, e: std::io::Error) -> SessionError {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            std::io::ErrorKind::InvalidData => "the file is not valid UTF-8".to_string(),
            _ => e.to_string().to_lowercase(),
        };
        SessionError::plain(
            format!("cannot read \"{}\": {reason}", path.display()),
            &path.display().to_string(),
            ErrorKind::Io,
        )
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(false))
    }
}

impl std::error::Error for SessionError {}

/// A run-time error of the tensor library (a shape that does not match
/// the data given to [`Value::tensor_f64`], say) as a usage error.
impl From<adjoint_runtime::RtError> for SessionError {
    fn from(e: adjoint_runtime::RtError) -> SessionError {
        SessionError::plain(e.message, "<value>", ErrorKind::Usage)
    }
}

/// Stack size for compiler passes, which recurse over the program's
/// nesting (the parser bounds it; the passes still need more than a default
/// thread's stack for deeply nested programs).
const COMPILER_STACK: usize = 512 << 20;

/// Runs `f` on a thread with a large stack, so that deep programs give
/// diagnostics, not stack overflows, whatever thread the caller is on.
fn with_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    // On this thread, inference recurses in place instead of starting a
    // thread of its own (`adjoint_compiler::stack`).
    match adjoint_compiler::stack::with_stack("adjoint-compiler", COMPILER_STACK, f)
        .expect("spawn a compiler thread")
    {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

struct FsLoader;

/// The dtype and shape a load of `path` will give, when it can be read
/// now: `load_csv` of a `.csv` file (read whole), else `load_npy` (from
/// the file's header, its first 64 KiB).
fn npy_header_type(path: &str) -> Option<(adjoint_runtime::DType, Vec<usize>)> {
    use std::io::Read;
    if path.ends_with(".csv") {
        let text = std::fs::read_to_string(path).ok()?;
        let (_, rows, cols) = adjoint_runtime::kernels::io::csv_table(path, &text).ok()?;
        return Some((adjoint_runtime::DType::F64, vec![rows, cols]));
    }
    let mut prefix = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 << 10)
        .read_to_end(&mut prefix)
        .ok()?;
    adjoint_runtime::kernels::io::npy_type(&prefix)
}

impl SourceLoader for FsLoader {
    fn load(&self, path: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(path)
    }
}

/// What a compiled executable is kept for: a function, a mode and the
/// abstract types of the arguments (dtypes and shapes; the values of small
/// int arguments, on which the program may be specialised).
type CacheKey = (String, Mode, Vec<AbsVal>);

/// A loaded program, shared by a session and the functions taken from it.
struct Loaded {
    program: Program,
    sources: SourceMap,
    /// The root file's name and text, and its path when it came from a
    /// file: transforms ([`Function::grad`], ...) reload it with a
    /// generated wrapper function appended.
    name: String,
    text: String,
    path: Option<PathBuf>,
    /// The executables compiled so far.
    cache: Mutex<HashMap<CacheKey, Arc<Executable>>>,
    /// The GPU graph mode runs kernels on ([`Device::Cuda`]).
    cuda: Option<Arc<adjoint_runtime::cuda::CudaDevice>>,
    compiler: CompilerOptions,
    /// The processes the program runs on.
    comm: Arc<dyn Communicator>,
}

impl Loaded {
    fn load(
        name: String,
        text: String,
        path: Option<&Path>,
        cuda: Option<Arc<adjoint_runtime::cuda::CudaDevice>>,
        compiler: CompilerOptions,
        comm: Arc<dyn Communicator>,
    ) -> Result<Loaded, SessionError> {
        let mut sources = SourceMap::new();
        let root = sources.add_file(name.clone(), text.clone());
        let loaded = with_stack(|| Program::load(&mut sources, root, path, &FsLoader));
        match loaded {
            Ok(mut program) => {
                // Graph mode specialises the program to the shapes of the
                // .npy files it loads (read from their headers).
                program.set_npy_types(Box::new(npy_header_type));
                program.set_options(compiler);
                program.set_communicator(comm.clone());
                if let Some(dev) = &cuda {
                    program.set_cuda_device(dev.clone());
                }
                Ok(Loaded {
                    cuda,
                    compiler,
                    comm,
                    program,
                    sources,
                    name,
                    text,
                    path: path.map(Path::to_path_buf),
                    cache: Mutex::new(HashMap::new()),
                })
            }
            Err(diagnostics) => Err(SessionError {
                diagnostics,
                sources,
                plain: false,
                kind: ErrorKind::Program,
            }),
        }
    }

    fn error(&self, diagnostics: Vec<Diagnostic>) -> SessionError {
        SessionError {
            diagnostics,
            sources: self.sources.clone(),
            plain: false,
            kind: ErrorKind::Program,
        }
    }

    /// The executable of `name` for arguments of types `key`, compiled on
    /// first use.
    fn executable(
        &self,
        name: &str,
        mode: Mode,
        args: Vec<AbsVal>,
    ) -> Result<Arc<Executable>, SessionError> {
        let key = (name.to_string(), mode, args);
        if let Some(ex) = self.lock_cache().get(&key) {
            return Ok(ex.clone());
        }
        let program = &self.program;
        let ex =
            with_stack(|| program.prepare_with(name, mode, &key.2)).map_err(|d| self.error(d))?;
        let ex = Arc::new(ex);
        self.lock_cache().insert(key, ex.clone());
        Ok(ex)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Executable>>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A compiler session holding one loaded program.
///
/// Loading consumes the session and gives it back with the program
/// loaded: `Session::new(Mode::Graph).load_source("f.adj", text)?`.
pub struct Session {
    mode: Mode,
    device: Device,
    loaded: Option<Arc<Loaded>>,
    cuda: Option<Arc<adjoint_runtime::cuda::CudaDevice>>,
    compiler: CompilerOptions,
    /// What `main(args)` receives (`adjoint run FILE -- a b`).
    main_args: Vec<String>,
    /// The processes programs run on (docs/parallel.md).
    comm: Arc<dyn Communicator>,
}

impl Session {
    /// A session that runs programs in `mode`, on the CPU.
    pub fn new(mode: Mode) -> Session {
        // Tensor temporaries of megabytes come and go at every step of a
        // loop: keep freed memory instead of faulting fresh pages in.
        adjoint_runtime::memory::keep_freed_memory();
        Session {
            mode,
            device: Device::Cpu,
            loaded: None,
            cuda: None,
            compiler: CompilerOptions::default(),
            main_args: Vec::new(),
            comm: Arc::new(comm::Single),
        }
    }

    /// The same session passing `args` to a `main` that takes one
    /// parameter, as a tuple of strings (the command line after `--`).
    pub fn with_main_args(mut self, args: Vec<String>) -> Session {
        self.main_args = args;
        self
    }

    /// What `main` is called with: `(args,)` when it takes the
    /// command-line arguments, nothing when it takes no parameter (then
    /// there must be no arguments), with their abstract types.
    fn main_call(&self) -> Result<(Vec<Value>, Vec<AbsVal>), SessionError> {
        let program = self.program()?;
        if let Some(g) = program.function("main").filter(|&g| program.arity(g) > 1) {
            return Err(self.error(vec![program.main_params_error(g)]));
        }
        let takes_args = program
            .function("main")
            .is_some_and(|g| program.arity(g) == 1);
        if takes_args {
            let v = Value::tuple(
                self.main_args
                    .iter()
                    .map(|s| Value::str(s.as_str()))
                    .collect(),
            );
            let a = AbsVal::from_value(&v).expect("strings have abstract values");
            Ok((vec![v], vec![a]))
        } else if !self.main_args.is_empty() {
            Err(SessionError::message(
                "`main` takes no parameters, so the arguments after `--` have nowhere to go: declare `fn main(args)` to receive them as a tuple of strings".into(),
            ))
        } else {
            Ok((Vec::new(), Vec::new()))
        }
    }

    /// The same session running the programs it loads from now on as one
    /// of the processes of `comm` (an MPI world: `comm::mpi::MpiWorld`
    /// with the `mpi` feature): `rank()` and `world_size()` are its rank
    /// and size, and the collectives exchange data through it. Every
    /// process of the world must load the same program and make the same
    /// calls. Without it, a program runs as one process alone.
    pub fn with_communicator(mut self, comm: Arc<dyn Communicator>) -> Session {
        self.comm = comm;
        self
    }

    /// The same session with the compiler working as `options` say, for
    /// programs loaded from now on.
    pub fn with_compiler_options(mut self, options: CompilerOptions) -> Session {
        self.compiler = options;
        self
    }

    /// A session with the given options; an error of kind
    /// [`ErrorKind::DeviceUnavailable`] for a device this machine cannot
    /// use (its message says why, in one line).
    pub fn with_options(options: Options) -> Result<Session, SessionError> {
        let mut s = Session::new(options.mode);
        if options.device == Device::Cuda {
            let dev = adjoint_runtime::cuda::CudaDevice::open(0).map_err(|e| {
                SessionError::plain(
                    format!("cannot use CUDA: {}", e.message),
                    "<options>",
                    ErrorKind::DeviceUnavailable,
                )
            })?;
            s.cuda = Some(dev);
        }
        s.device = options.device;
        s.compiler = options.compiler;
        Ok(s)
    }

    /// The mode programs run in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The device programs run on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Changes the mode later calls run in (functions already taken with
    /// [`Session::function`] keep theirs).
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// Loads, parses, lowers and differentiates a program from a file
    /// (`import`s are read relative to it).
    pub fn load_file(self, path: &Path) -> Result<Session, SessionError> {
        let text = std::fs::read_to_string(path).map_err(|e| SessionError::io(path, e))?;
        self.load_named(path.display().to_string(), text, Some(path))
    }

    /// Loads a program from a file with `extra` source text appended (the
    /// command line uses this for the driver functions of `adjoint grad`).
    pub fn load_file_with(self, path: &Path, extra: &str) -> Result<Session, SessionError> {
        let mut text = std::fs::read_to_string(path).map_err(|e| SessionError::io(path, e))?;
        text.push('\n');
        text.push_str(extra);
        self.load_named(path.display().to_string(), text, Some(path))
    }

    /// Loads a program from source text; `name` is shown in diagnostics.
    pub fn load_source(self, name: &str, text: &str) -> Result<Session, SessionError> {
        self.load_named(name.to_string(), text.to_string(), None)
    }

    fn load_named(
        mut self,
        name: String,
        text: String,
        path: Option<&Path>,
    ) -> Result<Session, SessionError> {
        self.loaded = Some(Arc::new(Loaded::load(
            name,
            text,
            path,
            self.cuda.clone(),
            self.compiler,
            self.comm.clone(),
        )?));
        Ok(self)
    }

    fn loaded(&self) -> Result<&Arc<Loaded>, SessionError> {
        self.loaded.as_ref().ok_or_else(|| {
            SessionError::plain(
                "no program is loaded: call `load_source` or `load_file` first".into(),
                "<session>",
                ErrorKind::Usage,
            )
        })
    }

    pub(crate) fn program(&self) -> Result<&Program, SessionError> {
        Ok(&self.loaded()?.program)
    }

    fn error(&self, diagnostics: Vec<Diagnostic>) -> SessionError {
        match &self.loaded {
            Some(l) => l.error(diagnostics),
            None => SessionError {
                diagnostics,
                sources: SourceMap::new(),
                plain: true,
                kind: ErrorKind::Program,
            },
        }
    }

    /// The names of the loaded program's functions (those of the root
    /// file, not of its imports), in source order.
    pub fn function_names(&self) -> Result<Vec<String>, SessionError> {
        Ok(self
            .program()?
            .lowered
            .functions
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| !n.starts_with("__adjoint_"))
            .collect())
    }

    /// The function `name` of the loaded program (a function of the root
    /// file), to call or to transform. It runs in the session's mode.
    pub fn function(&self, name: &str) -> Result<Function, SessionError> {
        Function::new(self.loaded()?.clone(), name, self.mode)
    }

    /// Runs function `name` of the loaded program (it must take no
    /// arguments), writing what it prints to `out`; returns its result.
    /// The compiled code is kept: running it again does not recompile.
    pub fn run_function(
        &self,
        name: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<Value, SessionError> {
        self.function(name)?.call_with_output(&[], out)
    }

    /// Type-checks the program (its `main`, if any, with the session's
    /// command-line arguments when it takes them).
    pub fn check(&self) -> Result<(), SessionError> {
        let program = self.program()?;
        let (_, abs) = self.main_call()?;
        if abs.is_empty() {
            with_stack(|| program.check()).map_err(|d| self.error(d))
        } else {
            with_stack(|| program.infer("main", &abs))
                .map(|_| ())
                .map_err(|d| self.error(d))
        }
    }

    /// Runs `main`, writing what it prints to `out`.
    pub fn run_main(&self, out: &mut dyn std::io::Write) -> Result<(), SessionError> {
        let (args, _) = self.main_call()?;
        self.function("main")?
            .call_with_output(&args, out)
            .map(|_| ())
    }

    /// The type of what function `name` returns when called with no
    /// arguments (found by type inference; nothing runs), as the language
    /// writes types: `f64[]`, `(f32[3], i64[])`, ...
    pub fn result_type(&self, name: &str) -> Result<String, SessionError> {
        let program = self.program()?;
        with_stack(|| program.result_type(name, &[]))
            .map(|t| t.to_string())
            .map_err(|d| self.error(d))
    }

    /// Runs `main` like [`Session::run_main`] and measures it: compile and
    /// run times, and the peak heap memory of each phase (measured only
    /// when the program's allocator is
    /// [`adjoint_runtime::memory::CountingAlloc`], as in the `adjoint`
    /// command; zeros otherwise).
    pub fn run_main_with_stats(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<RunStats, SessionError> {
        use adjoint_runtime::memory::{count_heap, heap_in_use, heap_peak, reset_heap_peak};
        let program = self.program()?;
        let mode = self.mode;
        count_heap();
        let start = heap_in_use();
        reset_heap_peak();
        let t0 = std::time::Instant::now();
        let (args, abs) = self.main_call()?;
        let ex =
            with_stack(|| program.prepare_with("main", mode, &abs)).map_err(|d| self.error(d))?;
        let compile = t0.elapsed();
        let compile_peak = heap_peak().wrapping_sub(start);
        let before_run = heap_in_use();
        reset_heap_peak();
        let calls0 = adjoint_compiler::fuse::kernel_calls();
        let closures0 = adjoint_runtime::vm::closures_made();
        let updates0 = adjoint_runtime::kernels::index::update_counts();
        let t1 = std::time::Instant::now();
        program
            .execute_with("main", &ex, args, out)
            .map_err(|d| self.error(d))?;
        let run = t1.elapsed();
        let calls1 = adjoint_compiler::fuse::kernel_calls();
        let closures_made = adjoint_runtime::vm::closures_made() - closures0;
        let updates1 = adjoint_runtime::kernels::index::update_counts();
        Ok(RunStats {
            compile,
            run,
            compile_peak_bytes: compile_peak,
            run_peak_bytes: heap_peak().wrapping_sub(before_run),
            kernel_calls: calls1.0 - calls0.0,
            kernels_in_place: calls1.1 - calls0.1,
            closures_made,
            updates: updates1.0 - updates0.0,
            updates_in_place: updates1.1 - updates0.1,
        })
    }

    /// The graph IR of one function (with everything it refers to), or of
    /// every function of the file.
    pub fn emit_ir(&self, function: Option<&str>) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(function)?;
        Ok(print_module(&p.lowered.module, &roots, None))
    }

    /// [`Session::emit_ir`] as a Graphviz drawing (`dot` syntax).
    pub fn emit_ir_dot(&self, function: Option<&str>) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(function)?;
        Ok(adjoint_compiler::ir::dot::to_dot(&p.lowered.module, &roots))
    }

    /// [`Session::emit_opt`] as a Graphviz drawing (`dot` syntax).
    pub fn emit_opt_dot(&self, function: Option<&str>) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(function)?;
        let (m, _) = with_stack(|| p.optimized(&roots));
        Ok(adjoint_compiler::ir::dot::to_dot(&m, &roots))
    }

    /// The IR after the optimiser, with a header comment saying what it
    /// did (node and graph counts before and after).
    pub fn emit_opt(&self, function: Option<&str>) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(function)?;
        let (m, s) = with_stack(|| p.optimized(&roots));
        Ok(Self::describe_opt(&m, &roots, &s))
    }

    /// The IR graph mode compiles for calls of entry function `name` with
    /// arguments of the given types (written as for
    /// [`Session::emit_types`]): the optimiser typed from that entry, then
    /// the rewrites, with the header comment of [`Session::emit_opt`].
    pub fn emit_opt_for(&self, name: &str, arg_types: &str) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(Some(name))?;
        let args = parse_arg_types(arg_types)?;
        with_stack(|| p.infer(name, &args)).map_err(|d| self.error(d))?;
        let (m, s) = with_stack(|| p.optimized_for(&roots, Some(&args)));
        Ok(Self::describe_opt(&m, &roots, &s))
    }

    fn describe_opt(
        m: &adjoint_compiler::ir::Module,
        roots: &[adjoint_compiler::ir::GraphId],
        s: &adjoint_compiler::opt::Stats,
    ) -> String {
        let egg = s
            .rewrite
            .as_ref()
            .map(|r| format!("; egg rewrites replaced {} nodes", r.replaced()))
            .unwrap_or_default();
        format!(
            "// optimised: {} -> {} nodes, {} -> {} graphs ({} inlined, {} simplified, {} merged, {} rounds){egg}\n{}",
            s.nodes_before,
            s.nodes_after,
            s.graphs_before,
            s.graphs_after,
            s.inlined,
            s.simplified,
            s.cse,
            s.rounds,
            print_module(m, roots, None)
        )
    }

    /// The IR of entry function `name` (as [`Session::emit_ir`] prints it)
    /// with the types inference finds on every parameter and application
    /// when it is called with arguments of the given types, written as
    /// types print (`f32[3, 4], (f64[], i64[])`; an int literal is an int
    /// argument of that value; see [`adjoint_compiler::infer::parse_types`]).
    /// Nodes inference never reaches (untaken branches, dead code) have no
    /// type.
    pub fn emit_types(&self, name: &str, arg_types: &str) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(Some(name))?;
        let args = parse_arg_types(arg_types)?;
        let types = with_stack(|| p.infer(name, &args)).map_err(|d| self.error(d))?;
        let ty = |n| types.type_of(n);
        Ok(print_module(&p.lowered.module, &roots, Some(&ty)))
    }

    /// The kernels graph mode compiles for entry function `name` (which
    /// takes no arguments), one line each.
    pub fn emit_kernels(&self, name: &str) -> Result<String, SessionError> {
        let p = self.program()?;
        let roots = self.roots(Some(name))?;
        if let Err(d) = with_stack(|| p.check()) {
            return Err(self.error(d));
        }
        let lines = with_stack(|| {
            let (m, _) = p.optimized(&roots);
            p.fusion_plan(&m, roots[0])
                .map(|plan| plan.describe())
                .unwrap_or_default()
        });
        let mut out = format!("// {} fused kernels\n", lines.len());
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        Ok(out)
    }

    /// The CUDA kernels graph mode generates for entry function `name`
    /// (which takes no arguments): one per fused kernel, in plan order
    /// (matrix products go to cuBLAS and have no source). Needs no GPU.
    pub fn cuda_kernels(&self, name: &str) -> Result<Vec<CudaKernelSource>, SessionError> {
        let p = self.program()?;
        let roots = self.roots(Some(name))?;
        if let Err(d) = with_stack(|| p.check()) {
            return Err(self.error(d));
        }
        Ok(with_stack(|| {
            let (m, _) = p.optimized(&roots);
            p.fusion_plan(&m, roots[0])
                .map(|plan| {
                    adjoint_compiler::codegen::cuda::plan_sources(&plan)
                        .into_iter()
                        .map(|(description, k)| CudaKernelSource {
                            description,
                            entry: k.name,
                            source: k.source,
                        })
                        .collect()
                })
                .unwrap_or_default()
        }))
    }

    /// [`Session::cuda_kernels`] as text (`adjoint emit --stage cuda`).
    pub fn emit_cuda(&self, name: &str) -> Result<String, SessionError> {
        let ks = self.cuda_kernels(name)?;
        let mut out = format!("// {} CUDA kernels\n", ks.len());
        for (i, k) in ks.iter().enumerate() {
            out.push_str(&format!("\n// kernel {i}: {}\n{}", k.description, k.source));
        }
        Ok(out)
    }

    fn roots(
        &self,
        function: Option<&str>,
    ) -> Result<Vec<adjoint_compiler::ir::GraphId>, SessionError> {
        let p = self.program()?;
        let roots: Vec<_> = match function {
            Some(f) => match p.function(f) {
                Some(g) => vec![g],
                None => {
                    let span = adjoint_lang::Span::point(p.root, 0);
                    return Err(self.error(vec![Diagnostic::error(
                        format!("this program has no function `{f}`"),
                        span,
                    )]));
                }
            },
            None => p.lowered.functions.iter().map(|(_, g)| *g).collect(),
        };
        Ok(roots)
    }

    /// The syntax tree of a file, as an S-expression dump.
    pub fn emit_ast(path: &Path) -> Result<String, SessionError> {
        let text = std::fs::read_to_string(path).map_err(|e| SessionError::io(path, e))?;
        let mut sources = SourceMap::new();
        let file = sources.add_file(path.display().to_string(), text.clone());
        let (module, diags) = adjoint_lang::parse(file, &text);
        if diags.iter().any(|d| d.is_error()) {
            return Err(SessionError {
                diagnostics: diags,
                sources,
                plain: false,
                kind: ErrorKind::Program,
            });
        }
        Ok(adjoint_lang::dump(&module, &sources))
    }
}

/// Argument types written as types print (see
/// [`adjoint_compiler::infer::parse_types`]).
fn parse_arg_types(text: &str) -> Result<Vec<adjoint_compiler::infer::AbsVal>, SessionError> {
    adjoint_compiler::infer::parse_types(text)
        .map_err(|e| SessionError::message(format!("cannot read the argument types: {e}")))
}

/// The type of a value as the language writes it: `f64[]`, `(f32[3], i64[])`,
/// `{w: f32[4, 3], b: f32[3]}` (other values by their kind: `function`).
pub fn value_type(v: &Value) -> String {
    match v {
        Value::Tuple(items) => {
            let parts: Vec<String> = items.iter().map(value_type).collect();
            if parts.len() == 1 {
                format!("({},)", parts[0])
            } else {
                format!("({})", parts.join(", "))
            }
        }
        Value::Record(r) => {
            let parts: Vec<String> = r
                .fields
                .iter()
                .map(|(n, v)| format!("{n}: {}", value_type(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        other => other.kind(),
    }
}

/// An argument's abstract type without the elements of its int and bool
/// tensors of one or more dimensions (labels, index batches), keeping those
/// of scalars: a program may build shapes and loop bounds from int
/// scalars, so they are part of the signature code is compiled for, but a
/// function called with a new batch of labels at every step must not be
/// compiled again at every step.
fn forget_array_values(v: AbsVal) -> AbsVal {
    match v {
        AbsVal::Tensor(mut t) if !t.shape.is_empty() => {
            t.value = None;
            AbsVal::Tensor(t)
        }
        AbsVal::Tuple(items) => AbsVal::Tuple(items.into_iter().map(forget_array_values).collect()),
        AbsVal::Record(fields) => AbsVal::Record(
            fields
                .into_iter()
                .map(|(n, v)| (n, forget_array_values(v)))
                .collect(),
        ),
        other => other,
    }
}

// Functions may be shared between threads.
const _: () = {
    fn send_sync<T: Send + Sync>() {}
    let _ = send_sync::<Function>;
};

/// A function of a loaded program, or one made from it by a transform
/// (its gradient, its forward-mode derivative). Cheap to clone; the clones
/// share compiled code.
///
/// It is compiled the first time it is called with arguments of a given
/// signature (dtypes and shapes, and the values of int scalars, which the
/// language lets a program specialise on); later calls with that
/// signature reuse the compiled code.
#[derive(Clone)]
pub struct Function {
    loaded: Arc<Loaded>,
    name: String,
    mode: Mode,
    arity: usize,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({}/{})", self.name, self.arity)
    }
}

impl Function {
    fn new(loaded: Arc<Loaded>, name: &str, mode: Mode) -> Result<Function, SessionError> {
        let Some(g) = loaded.program.function(name) else {
            let mut known: Vec<&str> = loaded
                .program
                .lowered
                .functions
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !n.starts_with("__adjoint_"))
                .collect();
            known.sort();
            let d = Diagnostic::error(
                format!("this program has no `{name}` function"),
                adjoint_lang::Span::point(loaded.program.root, 0),
            );
            let d = if known.is_empty() {
                d
            } else {
                d.with_note(format!("its functions: {}", known.join(", ")))
            };
            let mut e = loaded.error(vec![d]);
            e.kind = ErrorKind::Usage;
            return Err(e);
        };
        let arity = loaded.program.arity(g);
        Ok(Function {
            name: name.to_string(),
            arity,
            loaded,
            mode,
        })
    }

    /// The function's name in the program (generated names for transforms:
    /// `__adjoint_grad_f`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many arguments it takes.
    pub fn arity(&self) -> usize {
        self.arity
    }

    /// The names of its parameters as written in the source (generated
    /// names, `x0`, `x1`, ..., for transforms), without the IO token of a
    /// function that prints.
    pub fn param_names(&self) -> Vec<String> {
        let Some(g) = self.loaded.program.function(&self.name) else {
            return Vec::new();
        };
        let mut names = self
            .loaded
            .program
            .lowered
            .module
            .graph(g)
            .param_names
            .clone();
        names.truncate(self.arity);
        names
    }

    /// The mode it runs in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The same function running in another mode (sharing compiled code).
    pub fn with_mode(&self, mode: Mode) -> Function {
        Function {
            mode,
            ..self.clone()
        }
    }

    /// Calls the function; what it prints goes to standard output.
    pub fn call(&self, args: &[Value]) -> Result<Value, SessionError> {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        self.call_with_output(args, &mut out)
    }

    /// Calls the function, writing what it prints to `out`.
    pub fn call_with_output(
        &self,
        args: &[Value],
        out: &mut dyn std::io::Write,
    ) -> Result<Value, SessionError> {
        let types = self.signature(args)?;
        let ex = self.loaded.executable(&self.name, self.mode, types)?;
        self.loaded
            .program
            .execute_with(&self.name, &ex, args.to_vec(), out)
            .map_err(|d| self.loaded.error(d))
    }

    /// Compiles the function for arguments of the types of `args` (their
    /// values are not used, except those of int scalars), without running
    /// it; a later call with such arguments runs at once.
    pub fn prepare(&self, args: &[Value]) -> Result<(), SessionError> {
        let types = self.signature(args)?;
        self.loaded
            .executable(&self.name, self.mode, types)
            .map(|_| ())
    }

    /// The type of the result for arguments like `args` (by type
    /// inference; nothing runs), as the language writes types.
    pub fn result_type(&self, args: &[Value]) -> Result<String, SessionError> {
        let types = self.signature(args)?;
        let program = &self.loaded.program;
        with_stack(|| program.result_type(&self.name, &types))
            .map(|t| t.to_string())
            .map_err(|d| self.loaded.error(d))
    }

    /// How many executables have been compiled for this program so far
    /// (one per function, mode and argument signature called).
    pub fn compiled_count(&self) -> usize {
        self.loaded.lock_cache().len()
    }

    /// The abstract types of the arguments, checked against the arity.
    fn signature(&self, args: &[Value]) -> Result<Vec<AbsVal>, SessionError> {
        if args.len() != self.arity {
            return Err(SessionError::plain(
                format!(
                    "`{}` takes {} argument{}, but {} {} given",
                    self.name,
                    self.arity,
                    if self.arity == 1 { "" } else { "s" },
                    args.len(),
                    if args.len() == 1 { "was" } else { "were" }
                ),
                &self.loaded.name,
                ErrorKind::Usage,
            ));
        }
        args.iter()
            .enumerate()
            .map(|(i, v)| {
                AbsVal::from_value(v)
                    .map(forget_array_values)
                    .ok_or_else(|| {
                        SessionError::plain(
                            format!(
                                "argument {i} of `{}` is a {}, which cannot be passed from Rust",
                                self.name,
                                v.kind()
                            ),
                            &self.loaded.name,
                            ErrorKind::Usage,
                        )
                    })
            })
            .collect()
    }

    /// The gradient of this scalar-valued function with respect to its
    /// first argument: `grad(f)` of the language. It takes the same
    /// arguments and returns a value of the first argument's structure.
    pub fn grad(&self) -> Result<Function, SessionError> {
        self.transform("grad", |f| format!("grad({f})"))
    }

    /// The gradients with respect to the arguments `argnums` (a tuple of
    /// them): `grad(f, argnums = (..))`.
    pub fn grad_argnums(&self, argnums: &[usize]) -> Result<Function, SessionError> {
        let (tag, list) = self.argnums(argnums)?;
        self.transform(&format!("grad{tag}"), |f| {
            format!("grad({f}, argnums = ({list}))")
        })
    }

    /// The gradient with respect to argument `argnum` alone, not wrapped
    /// in a tuple: `grad(f, argnums = (k,))(x..).0` (JAX's
    /// `grad(f, argnums = k)`).
    pub fn grad_argnum(&self, argnum: usize) -> Result<Function, SessionError> {
        if argnum == 0 {
            return self.grad();
        }
        self.argnums(&[argnum])?;
        self.wrap(&format!("grad{argnum}"), |f, xs| {
            format!(" = grad({f}, argnums = ({argnum},))({xs}).0;")
        })
    }

    /// `value_and_grad(f, argnums = k)` with the gradient not wrapped in a
    /// tuple: `(f(x..), grad(f, argnums = k)(x..))`.
    pub fn value_and_grad_argnum(&self, argnum: usize) -> Result<Function, SessionError> {
        if argnum == 0 {
            return self.value_and_grad();
        }
        self.argnums(&[argnum])?;
        self.wrap(&format!("vg{argnum}"), |f, xs| {
            format!(
                " {{\n    let (v, g) = value_and_grad({f}, argnums = ({argnum},))({xs});\n    (v, g.0)\n}}"
            )
        })
    }

    /// `value_and_grad(f)`: a function returning `(f(x..), grad(f)(x..))`
    /// from one forward pass.
    pub fn value_and_grad(&self) -> Result<Function, SessionError> {
        self.transform("vg", |f| format!("value_and_grad({f})"))
    }

    /// `value_and_grad(f, argnums = (..))`: the second element is a tuple
    /// of the gradients with respect to `argnums`.
    pub fn value_and_grad_argnums(&self, argnums: &[usize]) -> Result<Function, SessionError> {
        let (tag, list) = self.argnums(argnums)?;
        self.transform(&format!("vg{tag}"), |f| {
            format!("value_and_grad({f}, argnums = ({list}))")
        })
    }

    /// Forward mode: a function of twice as many arguments, the point
    /// `x..` then the tangents `dx..`, returning `(f(x..), df(x..)·dx..)`
    /// (`jvp(f, (x..), (dx..))` of the language).
    pub fn jvp(&self) -> Result<Function, SessionError> {
        let n = self.arity;
        if n == 0 {
            return Err(self.usage(format!(
                "`{}` takes no arguments: there is nothing to differentiate",
                self.name
            )));
        }
        let xs: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
        let ts: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        let wrapper = format!("__adjoint_jvp_{}", self.name);
        let src = format!(
            "fn {wrapper}({}, {}) = jvp({}, ({},), ({},));\n",
            xs.join(", "),
            ts.join(", "),
            self.name,
            xs.join(", "),
            ts.join(", ")
        );
        self.derive(&wrapper, &src)
    }

    /// The function called with only the parameters marked in `present`
    /// (one flag per parameter), the others taking their default values
    /// (`fn mlp(p, x, drop = 0.0)`): a function of the present ones, in
    /// order. An error (when it is made, or called) if a parameter left
    /// out has no default.
    pub fn with_args(&self, present: &[bool]) -> Result<Function, SessionError> {
        if present.len() != self.arity {
            return Err(self.usage(format!(
                "`{}` takes {} arguments, not {}",
                self.name,
                self.arity,
                present.len()
            )));
        }
        if present.iter().all(|p| *p) {
            return Ok(self.clone());
        }
        let names = self.param_names();
        let mask: String = present.iter().map(|p| if *p { '1' } else { '0' }).collect();
        let wrapper = format!("__adjoint_call{mask}_{}", self.name);
        let mut params = Vec::new();
        let mut args = Vec::new();
        // Positional up to the first parameter left out, by name after it.
        let mut by_name = false;
        for (i, (p, name)) in present.iter().zip(&names).enumerate() {
            if !*p {
                by_name = true;
                continue;
            }
            params.push(format!("x{i}"));
            args.push(if by_name {
                format!("{name} = x{i}")
            } else {
                format!("x{i}")
            });
        }
        let src = format!(
            "fn {wrapper}({}) = {}({});\n",
            params.join(", "),
            self.name,
            args.join(", ")
        );
        self.derive(&wrapper, &src)
    }

    /// Reverse mode with the cotangent given: a function of one more
    /// argument than this one, the point `x..` then the cotangent `dy` of
    /// the result (of the result's structure), returning the tuple of the
    /// arguments' cotangents, `pullback(dy)` where `(y, pullback) = vjp(f,
    /// x..)` in the language. Each call runs the forward pass again.
    pub fn vjp(&self) -> Result<Function, SessionError> {
        let n = self.arity;
        if n == 0 {
            return Err(self.usage(format!(
                "`{}` takes no arguments: there is nothing to differentiate",
                self.name
            )));
        }
        let xs: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
        let wrapper = format!("__adjoint_vjp_{}", self.name);
        let src = format!(
            "fn {wrapper}({}, dy) {{\n    let (y, pullback) = vjp({}, {});\n    pullback(dy)\n}}\n",
            xs.join(", "),
            self.name,
            xs.join(", ")
        );
        self.derive(&wrapper, &src)
    }

    fn argnums(&self, argnums: &[usize]) -> Result<(String, String), SessionError> {
        if argnums.is_empty() {
            return Err(self.usage("`argnums` is empty".into()));
        }
        if let Some(i) = argnums.iter().find(|i| **i >= self.arity) {
            return Err(self.usage(format!(
                "argument {i} is out of range: `{}` takes {} argument{}",
                self.name,
                self.arity,
                if self.arity == 1 { "" } else { "s" }
            )));
        }
        let tag: String = argnums.iter().map(|i| format!("_{i}")).collect();
        let list: Vec<String> = argnums.iter().map(|i| i.to_string()).collect();
        Ok((tag, format!("{},", list.join(", "))))
    }

    fn usage(&self, message: String) -> SessionError {
        SessionError::plain(message, &self.loaded.name, ErrorKind::Usage)
    }

    /// A function `__adjoint_{tag}_{f}(x..) = {make(f)}(x..)`.
    fn transform(
        &self,
        tag: &str,
        make: impl FnOnce(&str) -> String,
    ) -> Result<Function, SessionError> {
        if self.arity == 0 {
            return Err(self.usage(format!(
                "`{}` takes no arguments: there is nothing to differentiate",
                self.name
            )));
        }
        self.wrap(tag, |f, xs| format!(" = {}({xs});", make(f)))
    }

    /// A function `__adjoint_{tag}_{f}(x0, x1, ..)` whose definition after
    /// the parameter list is `body(f, "x0, x1, ..")`.
    fn wrap(
        &self,
        tag: &str,
        body: impl FnOnce(&str, &str) -> String,
    ) -> Result<Function, SessionError> {
        let xs: Vec<String> = (0..self.arity).map(|i| format!("x{i}")).collect();
        let xs = xs.join(", ");
        let wrapper = format!("__adjoint_{tag}_{}", self.name);
        let src = format!("fn {wrapper}({xs}){}\n", body(&self.name, &xs));
        self.derive(&wrapper, &src)
    }

    /// Reloads the program with `src` (defining `wrapper`) appended, and
    /// gives that function.
    fn derive(&self, wrapper: &str, src: &str) -> Result<Function, SessionError> {
        if self.loaded.program.function(wrapper).is_some() {
            return Function::new(self.loaded.clone(), wrapper, self.mode);
        }
        let l = &self.loaded;
        let mut text = l.text.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(src);
        let loaded = Loaded::load(
            l.name.clone(),
            text,
            l.path.as_deref(),
            l.cuda.clone(),
            l.compiler,
            l.comm.clone(),
        )?;
        Function::new(Arc::new(loaded), wrapper, self.mode)
    }
}
