//! Adjoint: a source-to-source automatic differentiation compiler.
//!
//! This crate is the front door: the [`Session`] API that the `adjoint`
//! command (and programs embedding the compiler) use to load, check, print
//! and run Adjoint programs.

use std::path::{Path, PathBuf};

use adjoint_compiler::ir::print::print_module;
use adjoint_compiler::lower::SourceLoader;
use adjoint_compiler::pipeline::Program;
use adjoint_lang::{render, Diagnostic, SourceMap};

pub use adjoint_runtime::value::Value;

pub mod aot;

/// How programs run: one primitive at a time on the IR as differentiated
/// (eager, for debugging), or through the optimiser (graph, the default).
pub use adjoint_compiler::pipeline::Mode;

/// Errors carry their diagnostics and the sources they point into.
#[derive(Debug)]
pub struct SessionError {
    pub diagnostics: Vec<Diagnostic>,
    sources: SourceMap,
    /// An error with no place in a source file (an input file that cannot
    /// be read, a bad command-line argument): rendered as one line.
    plain: bool,
}

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
    /// input, say).
    pub fn message(message: String) -> SessionError {
        let mut sources = SourceMap::new();
        let file = sources.add_file("<command line>", "");
        SessionError {
            diagnostics: vec![Diagnostic::error(
                message,
                adjoint_lang::Span::point(file, 0),
            )],
            sources,
            plain: true,
        }
    }

    fn io(path: &Path, e: std::io::Error) -> SessionError {
        let mut sources = SourceMap::new();
        let file = sources.add_file(path.display().to_string(), "");
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            std::io::ErrorKind::InvalidData => "the file is not valid UTF-8".to_string(),
            _ => e.to_string().to_lowercase(),
        };
        SessionError {
            diagnostics: vec![Diagnostic::error(
                format!("cannot read \"{}\": {reason}", path.display()),
                adjoint_lang::Span::point(file, 0),
            )],
            sources,
            plain: true,
        }
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(false))
    }
}

impl std::error::Error for SessionError {}

/// Stack size for compiler passes, which recurse over the program's
/// nesting (the parser bounds it; the passes still need more than a default
/// thread's stack for deeply nested programs).
const COMPILER_STACK: usize = 512 << 20;

/// Runs `f` on a thread with a large stack, so that deep programs give
/// diagnostics, not stack overflows, whatever thread the caller is on.
fn with_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("adjoint-compiler".into())
            .stack_size(COMPILER_STACK)
            .spawn_scoped(s, f)
            .expect("spawn a compiler thread");
        match handle.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

struct FsLoader;

/// The dtype and shape `load_npy(path)` will give, from the file's header
/// (its first 64 KiB), when it can be read now.
fn npy_header_type(path: &str) -> Option<(adjoint_runtime::DType, Vec<usize>)> {
    use std::io::Read;
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

/// A compiler session holding one loaded program.
pub struct Session {
    mode: Mode,
    sources: SourceMap,
    program: Option<Program>,
    path: Option<PathBuf>,
}

impl Session {
    pub fn new(mode: Mode) -> Session {
        // Tensor temporaries of megabytes come and go at every step of a
        // loop: keep freed memory instead of faulting fresh pages in.
        adjoint_runtime::memory::keep_freed_memory();
        Session {
            mode,
            sources: SourceMap::new(),
            program: None,
            path: None,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Loads, parses and lowers a program from a file.
    pub fn load_file(mut self, path: &Path) -> Result<Session, SessionError> {
        let text = std::fs::read_to_string(path).map_err(|e| SessionError::io(path, e))?;
        self.path = Some(path.to_path_buf());
        self.load_named(path.display().to_string(), text, Some(path))
    }

    /// Loads a program from a file with `extra` source text appended (the
    /// command line uses this for the driver functions of `adjoint grad`).
    pub fn load_file_with(mut self, path: &Path, extra: &str) -> Result<Session, SessionError> {
        let mut text = std::fs::read_to_string(path).map_err(|e| SessionError::io(path, e))?;
        text.push('\n');
        text.push_str(extra);
        self.path = Some(path.to_path_buf());
        self.load_named(path.display().to_string(), text, Some(path))
    }

    /// Runs function `name` of the loaded program (it must take no
    /// arguments), writing what it prints to `out`; returns its result.
    pub fn run_function(
        &self,
        name: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<Value, SessionError> {
        let program = self.program();
        let mode = self.mode;
        let ex = with_stack(|| program.prepare(name, mode)).map_err(|d| self.error(d))?;
        program.execute(name, &ex, out).map_err(|d| self.error(d))
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
        let root = self.sources.add_file(name, text);
        let sources = &mut self.sources;
        match with_stack(|| Program::load(sources, root, path, &FsLoader)) {
            Ok(mut p) => {
                // Graph mode specialises the program to the shapes of the
                // .npy files it loads (read from their headers).
                p.set_npy_types(Box::new(npy_header_type));
                self.program = Some(p);
                Ok(self)
            }
            Err(diagnostics) => Err(self.error(diagnostics)),
        }
    }

    fn error(&self, diagnostics: Vec<Diagnostic>) -> SessionError {
        SessionError {
            diagnostics,
            sources: self.sources.clone(),
            plain: false,
        }
    }

    fn program(&self) -> &Program {
        self.program.as_ref().expect("a program is loaded")
    }

    /// Type-checks the program (its `main`, if any).
    pub fn check(&self) -> Result<(), SessionError> {
        let program = self.program();
        with_stack(|| program.check()).map_err(|d| self.error(d))
    }

    /// Runs `main`, writing what it prints to `out`.
    pub fn run_main(&self, out: &mut dyn std::io::Write) -> Result<(), SessionError> {
        let program = self.program();
        let mode = self.mode;
        let ex = with_stack(|| program.prepare_main(mode)).map_err(|d| self.error(d))?;
        program
            .execute_main(&ex, out)
            .map(|_| ())
            .map_err(|d| self.error(d))
    }

    /// The graph IR of one function (with everything it refers to), or of
    /// every function of the file.
    pub fn emit_ir(&self, function: Option<&str>) -> Result<String, SessionError> {
        let p = self.program();
        let roots = self.roots(function)?;
        Ok(print_module(&p.lowered.module, &roots, None))
    }

    /// The IR after the optimiser, with a header comment saying what it
    /// did (node and graph counts before and after).
    pub fn emit_opt(&self, function: Option<&str>) -> Result<String, SessionError> {
        let p = self.program();
        let roots = self.roots(function)?;
        let (m, s) = with_stack(|| p.optimized(&roots));
        Ok(format!(
            "// optimised: {} -> {} nodes, {} -> {} graphs ({} inlined, {} simplified, {} merged, {} rounds)\n{}",
            s.nodes_before,
            s.nodes_after,
            s.graphs_before,
            s.graphs_after,
            s.inlined,
            s.simplified,
            s.cse,
            s.rounds,
            print_module(&m, &roots, None)
        ))
    }

    /// The kernels graph mode compiles for entry function `name` (which
    /// takes no arguments), one line each.
    pub fn emit_kernels(&self, name: &str) -> Result<String, SessionError> {
        let p = self.program();
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

    fn roots(
        &self,
        function: Option<&str>,
    ) -> Result<Vec<adjoint_compiler::ir::GraphId>, SessionError> {
        let p = self.program();
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
            });
        }
        Ok(adjoint_lang::dump(&module, &sources))
    }
}
