//! The order of the passes. Only this module knows it.

use std::path::Path;

use adjoint_lang::{Diagnostic, FileId, SourceMap, Span};
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::{Vm, VmError};

use crate::exec::{self, Executable};
use crate::ir::{GraphId, Loc};
use crate::lower::{span_of, Lowered, Lowerer, SourceLoader};

/// How a program runs: its IR as lowered and differentiated, one
/// primitive at a time (`Eager`, for debugging), or through the optimiser
/// first (`Graph`, the default).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    Eager,
    #[default]
    Graph,
}

/// A parsed and lowered program.
pub struct Program {
    pub lowered: Lowered,
    pub root: FileId,
}

impl Program {
    /// Parses and lowers `root` (already added to `sources`) and what it
    /// imports. In debug builds the IR verifier runs on the result.
    pub fn load(
        sources: &mut SourceMap,
        root: FileId,
        root_path: Option<&Path>,
        loader: &dyn SourceLoader,
    ) -> Result<Program, Vec<Diagnostic>> {
        let mut lowered = Lowerer::lower_program(sources, root, root_path, loader)?;
        if !lowered.ad_requests.is_empty() {
            let requests = std::mem::take(&mut lowered.ad_requests);
            let checks = crate::ad::run(
                &mut lowered.module,
                &requests,
                &lowered.ad_rules,
                &lowered.effectful,
            )
            .map_err(|e| {
                let mut d = located(e.message, e.loc, root);
                if let Some(n) = e.note {
                    d = d.with_note(n);
                }
                vec![d]
            })?;
            lowered.checks.extend(checks);
        }
        // The verifier runs after lowering and differentiation in debug
        // builds (and so in every test).
        if cfg!(debug_assertions) {
            let roots: Vec<GraphId> = lowered.functions.iter().map(|(_, g)| *g).collect();
            if let Err(errors) = crate::ir::verify::verify_reachable(&lowered.module, &roots) {
                let span = Span::point(root, 0);
                return Err(vec![Diagnostic::error(
                    format!(
                        "internal error: lowering produced invalid IR: {}",
                        errors.join("; ")
                    ),
                    span,
                )]);
            }
        }
        Ok(Program { lowered, root })
    }

    pub fn function(&self, name: &str) -> Option<GraphId> {
        self.lowered
            .functions
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, g)| *g)
    }

    /// Checks `main` with type inference, when the program has one.
    pub fn check(&self) -> Result<(), Vec<Diagnostic>> {
        let Some(main) = self.function("main") else {
            return Ok(());
        };
        self.infer_entry(main)
    }

    fn infer_entry(&self, entry: GraphId) -> Result<(), Vec<Diagnostic>> {
        use crate::infer::{infer_module_with, AbsVal, InferOptions};
        let m = &self.lowered.module;
        let nparams = m.graph(entry).params.len();
        let mut args = Vec::new();
        if self.lowered.effectful.contains(&entry) {
            if nparams != 1 {
                return Err(vec![self.main_params_error(entry)]);
            }
            args.push(AbsVal::Io);
        }
        let internal: Vec<u32> = self.lowered.stdlib_files.iter().map(|f| f.0).collect();
        let opts = InferOptions {
            internal_files: &internal,
            ..InferOptions::default()
        };
        let types = infer_module_with(m, entry, &args, &opts)
            .map_err(|e| vec![infer_diagnostic(&e, self.root)])?;
        let failed = crate::checks::run(&self.lowered.checks, m, &types);
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    fn main_params_error(&self, entry: GraphId) -> Diagnostic {
        let loc = self.lowered.module.graph(entry).loc;
        Diagnostic::error(
            "`main` must take no parameters",
            span_of(loc).unwrap_or(Span::point(self.root, 0)),
        )
    }

    /// Type-checks `main` and compiles it for the VM.
    pub fn prepare_main(&self, mode: Mode) -> Result<Executable, Vec<Diagnostic>> {
        self.prepare("main", mode)
    }

    /// The module with the graphs reachable from `roots` optimised (a copy:
    /// the program itself keeps its unoptimised IR), and what the optimiser
    /// did.
    pub fn optimized(&self, roots: &[GraphId]) -> (crate::ir::Module, crate::opt::Stats) {
        let mut m = self.lowered.module.clone();
        // An entry point that takes no arguments (`main`, or a driver) can
        // be typed, and its shapes folded.
        let entry = match roots {
            [g] if m.graph(*g).params.is_empty() => Some((*g, Vec::new())),
            [g] if self.lowered.effectful.contains(g) && m.graph(*g).params.len() == 1 => {
                Some((*g, vec![crate::infer::AbsVal::Io]))
            }
            _ => None,
        };
        let opts = crate::opt::Options {
            internal_files: self.lowered.stdlib_files.iter().map(|f| f.0).collect(),
            entry,
            ..crate::opt::Options::default()
        };
        let stats = crate::opt::optimize(&mut m, roots, &opts);
        (m, stats)
    }

    /// Fusion of the optimised module `m` reached from `entry`: needs its
    /// types; when inference cannot give them, there is no plan and
    /// everything runs on the reference kernels.
    pub fn fusion_plan(&self, m: &crate::ir::Module, entry: GraphId) -> Option<crate::fuse::Plan> {
        let opts = crate::infer::InferOptions {
            only_taken_branches: true,
            ..Default::default()
        };
        let types =
            crate::infer::infer_module_with(m, entry, &self.entry_args(entry), &opts).ok()?;
        Some(crate::fuse::plan(m, &[entry], &types))
    }

    /// The abstract arguments of an entry function: the IO token for one
    /// that does IO, else none.
    fn entry_args(&self, g: GraphId) -> Vec<crate::infer::AbsVal> {
        if self.lowered.effectful.contains(&g) {
            vec![crate::infer::AbsVal::Io]
        } else {
            Vec::new()
        }
    }

    /// Type-checks entry function `name` (which takes no arguments) and
    /// compiles it for the VM, through the optimiser in graph mode.
    pub fn prepare(&self, name: &str, mode: Mode) -> Result<Executable, Vec<Diagnostic>> {
        let Some(main) = self.function(name) else {
            return Err(vec![Diagnostic::error(
                format!("this program has no `{name}` function"),
                Span::point(self.root, 0),
            )]);
        };
        self.infer_entry(main)?;
        let compiled = match mode {
            Mode::Eager => exec::compile(&self.lowered.module, &[main]),
            Mode::Graph => {
                let (m, _) = self.optimized(&[main]);
                if cfg!(debug_assertions) {
                    if let Err(errors) = crate::ir::verify::verify_reachable(&m, &[main]) {
                        return Err(vec![located(
                            format!(
                                "internal error: the optimiser produced invalid IR: {}",
                                errors.join("; ")
                            ),
                            Loc::NONE,
                            self.root,
                        )]);
                    }
                }
                let plan = self.fusion_plan(&m, main);
                if std::env::var_os("ADJOINT_FUSE_TRACE").is_some() {
                    for line in plan.iter().flat_map(|p| p.describe()) {
                        eprintln!("fused: {line}");
                    }
                }
                exec::compile_with(&m, &[main], plan.as_ref())
            }
        };
        compiled.map_err(|e| vec![located(e.message, e.loc, self.root)])
    }

    /// Runs `main` (type-checked first), writing what it prints to `out`.
    pub fn run_main(
        &self,
        mode: Mode,
        out: &mut dyn std::io::Write,
    ) -> Result<Value, Vec<Diagnostic>> {
        let ex = self.prepare_main(mode)?;
        self.execute_main(&ex, out)
    }

    /// Runs `main` from a prepared executable. The VM keeps its frames on
    /// the heap, so this needs no special stack.
    pub fn execute_main(
        &self,
        ex: &Executable,
        out: &mut dyn std::io::Write,
    ) -> Result<Value, Vec<Diagnostic>> {
        self.execute("main", ex, out)
    }

    /// Runs entry function `name` from a prepared executable.
    pub fn execute(
        &self,
        name: &str,
        ex: &Executable,
        out: &mut dyn std::io::Write,
    ) -> Result<Value, Vec<Diagnostic>> {
        let main = self.function(name).expect("prepared");
        let f = ex.function(main).expect("main is compiled");
        let mut vm = Vm::new(&ex.program, out);
        let r = vm.call(&f, vec![Value::Io]);
        drop(vm);
        let _ = out.flush();
        match r {
            Ok(v) => Ok(match v {
                Value::Tuple(t) if t.len() == 2 => t[1].clone(),
                v => v,
            }),
            Err(e) => Err(vec![vm_diagnostic(
                &e,
                ex,
                self.root,
                &self.lowered.stdlib_files,
            )]),
        }
    }
}

fn located(message: String, loc: Loc, root: FileId) -> Diagnostic {
    Diagnostic::error(message, span_of(loc).unwrap_or(Span::point(root, 0)))
}

fn infer_diagnostic(e: &crate::infer::InferError, root: FileId) -> Diagnostic {
    let mut d = located(e.message.clone(), e.loc, root);
    for (l, msg) in &e.secondary {
        if let Some(s) = span_of(*l) {
            d = d.with_secondary(s, msg.clone());
        }
    }
    d
}

fn vm_diagnostic(e: &VmError, ex: &Executable, root: FileId, stdlib: &[FileId]) -> Diagnostic {
    let loc = e.loc.map(|l| ex.loc(l)).unwrap_or(Loc::NONE);
    // Nodes made by differentiation for a primitive have no location of
    // their own; standard-library code is not the user's.
    let in_stdlib = |l: Loc| l.is_none() || stdlib.iter().any(|f| f.0 == l.file);
    if !in_stdlib(loc) {
        return located(e.message.clone(), loc, root);
    }
    // The failure is inside the standard library (a derivative rule, say):
    // report it at the innermost call from the user's code.
    let user = e
        .trace
        .iter()
        .map(|l| ex.loc(*l))
        .find(|l| !l.is_none() && !in_stdlib(*l));
    match (user, span_of(loc)) {
        (Some(u), Some(inner)) => located(e.message.clone(), u, root)
            .with_secondary(inner, "while running this part of the standard library"),
        (Some(u), None) => located(e.message.clone(), u, root),
        _ => located(e.message.clone(), loc, root),
    }
}
