//! The order of the passes. Only this module knows it.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use adjoint_lang::{Diagnostic, FileId, SourceMap, Span};
use adjoint_runtime::tensor::DType;
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::{Vm, VmError};

use crate::ir::{GraphId, Loc};
use crate::lower::{span_of, Lowered, Lowerer, SourceLoader};
use crate::prim::Prim;
use crate::vmgen::{self, Executable};

/// How a program runs: its IR as lowered and differentiated, one
/// primitive at a time (`Eager`, for debugging), or through the optimiser
/// first (`Graph`, the default).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    Eager,
    #[default]
    Graph,
}

/// What `load_npy` of a path will give (dtype and shape), as the embedder
/// can tell before the program runs (by reading the file's header); `None`
/// when it cannot.
pub type NpyTypeFn = dyn Fn(&str) -> Option<(DType, Vec<usize>)> + Send + Sync;

/// A dtype and shape.
type TypeOf = (DType, Vec<usize>);

/// The answers of an [`NpyTypeFn`], asked once per path.
struct LoadTypes {
    oracle: Box<NpyTypeFn>,
    /// The paths the program may write (never specialised).
    written: HashSet<String>,
    answered: Mutex<HashMap<String, Option<TypeOf>>>,
}

impl LoadTypes {
    fn get(&self, path: &str) -> Option<TypeOf> {
        if self.written.contains(path) {
            return None;
        }
        let mut a = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        a.entry(path.to_string())
            .or_insert_with(|| (self.oracle)(path))
            .clone()
    }
}

/// The paths a program may write files to. Strings are only ever
/// literals, so a save whose path is a literal writes that path; a save
/// whose path is computed (a parameter of a helper) or a save primitive
/// used as a value may write any literal that is used other than as the
/// path of a load. Loads of the other paths read files the program cannot
/// have changed, whatever IO comes before or after them (issue 23 #10:
/// saving a checkpoint after a training loop used to stop graph mode from
/// specialising every load, and the loop ran without fused kernels).
fn written_paths(m: &crate::ir::Module) -> HashSet<String> {
    use crate::ir::{Const, NodeId, NodeKind};
    let is_save = |c: &Const| matches!(c, Const::Prim(Prim::SaveNpy | Prim::SaveSafetensors));
    let str_of = |n: NodeId| match m.as_const(n) {
        Some(Const::Str(s)) => Some(s.to_string()),
        _ => None,
    };
    let mut written = HashSet::new();
    let mut any_path = false;
    // Literals read as a load's path, and literals used anywhere else.
    let mut load_paths = HashSet::new();
    let mut other_uses = HashSet::new();
    for node in &m.nodes {
        let NodeKind::Apply(ins) = &node.kind else {
            continue;
        };
        let callee = m.as_const(ins[0]);
        let load = matches!(
            callee,
            Some(Const::Prim(
                Prim::LoadNpy | Prim::LoadCsv | Prim::LoadSafetensors
            ))
        );
        for (k, &x) in ins.iter().enumerate() {
            if k == 0 {
                continue;
            }
            if m.as_const(x).is_some_and(is_save) {
                any_path = true;
            }
            if let Some(s) = str_of(x) {
                if load && k == 2 {
                    load_paths.insert(s);
                } else {
                    other_uses.insert(s);
                }
            }
        }
        if callee.is_some_and(is_save) {
            match ins.get(2).and_then(|&p| str_of(p)) {
                Some(s) => {
                    written.insert(s);
                }
                None => any_path = true,
            }
        }
    }
    if any_path {
        written.extend(other_uses);
    }
    written
}

/// A parsed and lowered program.
pub struct Program {
    pub lowered: Lowered,
    pub root: FileId,
    /// The types of the data the program loads, when the embedder gave a
    /// way to know them (graph mode specialises to them).
    load_types: Option<Arc<LoadTypes>>,
    /// The GPU graph mode's kernels run on, if not the CPU.
    cuda: Option<Arc<adjoint_runtime::cuda::CudaDevice>>,
    /// How the compiler works (switches and limits).
    options: crate::options::CompilerOptions,
    /// The processes the program runs on (its module's `world`).
    comm: Arc<dyn adjoint_runtime::comm::Communicator>,
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
        let mut lowered = {
            let _s = stage!("parse and lower");
            Lowerer::lower_program(sources, root, root_path, loader)?
        };
        if !lowered.ad_requests.is_empty() {
            let _s = stage!("differentiate");
            let requests = std::mem::take(&mut lowered.ad_requests);
            // Derivatives differentiated again are simplified first, by
            // the optimiser's untyped rounds.
            let internal_files: Vec<u32> = lowered.stdlib_files.iter().map(|f| f.0).collect();
            let simplify = |sub: &mut crate::ir::Module, root: GraphId| {
                let opts = crate::opt::Options {
                    internal_files: internal_files.clone(),
                    to_differentiate: true,
                    ..crate::opt::Options::default()
                };
                crate::opt::optimize(sub, &[root], &opts);
            };
            let checks = crate::ad::run(
                &mut lowered.module,
                &requests,
                &lowered.ad_rules,
                &lowered.effectful,
                &mut lowered.ad_provenance,
                Some(&simplify),
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
            let _s = stage!("verify IR");
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
        Ok(Program {
            lowered,
            root,
            load_types: None,
            cuda: None,
            options: Default::default(),
            comm: Arc::new(adjoint_runtime::comm::Single),
        })
    }

    /// Runs graph mode's kernels on a GPU: fused kernels through NVRTC,
    /// matrix products through cuBLAS (`codegen::cuda::retarget`). Eager
    /// mode and primitives outside kernels stay on the CPU.
    pub fn set_cuda_device(&mut self, device: Arc<adjoint_runtime::cuda::CudaDevice>) {
        self.cuda = Some(device);
    }

    /// Runs the program on the processes of `comm`: `rank()` and
    /// `world_size()` become its rank and size when the program is
    /// compiled, and the collectives exchange data through it.
    pub fn set_communicator(&mut self, comm: Arc<dyn adjoint_runtime::comm::Communicator>) {
        self.lowered.module.world = crate::ir::World::of(&*comm);
        self.comm = comm;
    }

    /// Sets how the compiler works (see [`crate::options`]).
    pub fn set_options(&mut self, options: crate::options::CompilerOptions) {
        self.options = options;
    }

    /// Lets graph mode specialise the program to the data it loads:
    /// `npy_type` tells the dtype and shape `load_npy` of a path will give
    /// (for instance from the file's header). Type checking does not use
    /// it (errors in loaded data are reported when the program runs, as in
    /// eager mode); the optimiser and fusion do, and the compiled program
    /// checks that each such load still gives that type.
    ///
    /// A load is not specialised when the program may write its path
    /// (see [`written_paths`]): it could load what it wrote.
    pub fn set_npy_types(&mut self, npy_type: Box<NpyTypeFn>) {
        self.load_types = Some(Arc::new(LoadTypes {
            oracle: npy_type,
            written: written_paths(&self.lowered.module),
            answered: Mutex::new(HashMap::new()),
        }));
    }

    /// The types of loads for inference in graph mode.
    fn load_type_fn(&self) -> Option<Arc<crate::infer::LoadTypeFn>> {
        let lt = self.load_types.clone()?;
        Some(Arc::new(
            move |p: crate::prim::Prim, path: &str| -> Result<crate::infer::AbsVal, String> {
                use crate::infer::{AbsTensor, AbsVal};
                Ok(match (p, lt.get(path)) {
                    (crate::prim::Prim::LoadNpy | crate::prim::Prim::LoadCsv, Some((d, shape))) => {
                        AbsVal::Tensor(AbsTensor::new(d, shape, false))
                    }
                    _ => AbsVal::Unknown,
                })
            },
        ))
    }

    /// The check of every load whose type graph mode assumed.
    fn load_check(&self) -> Option<Arc<dyn adjoint_runtime::vm::NativeKernel>> {
        let lt = self.load_types.as_ref()?;
        let answered = lt.answered.lock().unwrap_or_else(|e| e.into_inner());
        let expected: HashMap<String, TypeOf> = answered
            .iter()
            .filter_map(|(p, t)| Some((p.clone(), t.clone()?)))
            .collect();
        if expected.is_empty() {
            return None;
        }
        Some(Arc::new(LoadCheck { expected }))
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
        self.infer_entry_with(entry, &[]).map(|_| ())
    }

    /// The number of arguments entry function `g` takes from its caller
    /// (its parameters, less the IO token of one that does IO).
    pub fn arity(&self, g: GraphId) -> usize {
        let n = self.lowered.module.graph(g).params.len();
        if self.lowered.effectful.contains(&g) {
            n.saturating_sub(1)
        } else {
            n
        }
    }

    /// Type-checks entry graph `entry` called with arguments of the given
    /// abstract types (with the IO token added for one that does IO);
    /// returns what inference found.
    fn infer_entry_with(
        &self,
        entry: GraphId,
        args: &[crate::infer::AbsVal],
    ) -> Result<crate::infer::Types, Vec<Diagnostic>> {
        use crate::infer::{infer_module_partial, InferOptions};
        let _s = stage!("type check");
        let m = &self.lowered.module;
        if self.arity(entry) != args.len() {
            return Err(vec![self.arity_error(entry, args.len())]);
        }
        let args = self.entry_args_with(entry, args);
        let internal: Vec<u32> = self.lowered.stdlib_files.iter().map(|f| f.0).collect();
        let opts = InferOptions {
            internal_files: &internal,
            ..InferOptions::default()
        };
        let types = match infer_module_partial(m, entry, &args, &opts) {
            Ok(t) => t,
            Err((e, partial)) => {
                // A check that explains the mistake (a `jvp` given too few
                // tangents, a `bprop` rule returning a bare value) beats
                // the message of the operation it broke.
                let explained = partial.map_or_else(Vec::new, |t| {
                    crate::checks::run(
                        &self.lowered.checks,
                        m,
                        &t,
                        &self.lowered.ad_provenance.origin,
                        true,
                    )
                });
                return Err(if explained.is_empty() {
                    vec![infer_diagnostic(&e, self.root)]
                } else {
                    explained
                });
            }
        };
        let failed = crate::checks::run(
            &self.lowered.checks,
            m,
            &types,
            &self.lowered.ad_provenance.origin,
            false,
        );
        if failed.is_empty() {
            Ok(types)
        } else {
            Err(failed)
        }
    }

    /// The type of what entry function `name` returns when called with
    /// arguments of the given abstract types (type-checked as by
    /// [`Program::prepare_with`], not run).
    pub fn result_type(
        &self,
        name: &str,
        args: &[crate::infer::AbsVal],
    ) -> Result<crate::infer::AbsVal, Vec<Diagnostic>> {
        let g = self.entry(name)?;
        let types = self.infer_entry_with(g, args)?;
        let r = types.result().clone();
        Ok(match r {
            crate::infer::AbsVal::Tuple(mut items)
                if self.lowered.effectful.contains(&g) && items.len() == 2 =>
            {
                items.pop().expect("two items")
            }
            r => r,
        })
    }

    /// What inference finds for entry function `name` called with
    /// arguments of the given abstract types (type-checked as by
    /// [`Program::result_type`]): the types of the nodes of the lowered
    /// module, for `adjoint emit`-style printing and filetests.
    pub fn infer(
        &self,
        name: &str,
        args: &[crate::infer::AbsVal],
    ) -> Result<crate::infer::Types, Vec<Diagnostic>> {
        let g = self.entry(name)?;
        self.infer_entry_with(g, args)
    }

    fn arity_error(&self, entry: GraphId, given: usize) -> Diagnostic {
        let name = self
            .lowered
            .functions
            .iter()
            .find(|(_, g)| *g == entry)
            .map(|(n, _)| n.as_str())
            .unwrap_or("the entry function");
        if name == "main" && given == 0 {
            return self.main_params_error(entry);
        }
        let loc = self.lowered.module.graph(entry).loc;
        let n = self.arity(entry);
        Diagnostic::error(
            format!(
                "`{name}` takes {n} argument{}, but {given} {} given",
                if n == 1 { "" } else { "s" },
                if given == 1 { "was" } else { "were" }
            ),
            span_of(loc).unwrap_or(Span::point(self.root, 0)),
        )
    }

    fn entry(&self, name: &str) -> Result<GraphId, Vec<Diagnostic>> {
        self.function(name).ok_or_else(|| {
            vec![Diagnostic::error(
                format!("this program has no `{name}` function"),
                Span::point(self.root, 0),
            )]
        })
    }

    /// The error for a `main` with more than one parameter, at `main`.
    pub fn main_params_error(&self, entry: GraphId) -> Diagnostic {
        let loc = self.lowered.module.graph(entry).loc;
        Diagnostic::error(
            "`main` takes no parameters, or one: the command-line arguments (a tuple of strings)",
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
        // An entry point that takes no arguments (`main`, or a driver) can
        // be typed, and its shapes folded.
        let entry = match roots {
            [g] if self.arity(*g) == 0 => Some(Vec::new()),
            _ => None,
        };
        self.optimized_for(roots, entry.as_deref())
    }

    /// [`Program::optimized`] for a single entry whose arguments have the
    /// given abstract types (`None`: not known), which the typed pass uses.
    pub fn optimized_for(
        &self,
        roots: &[GraphId],
        entry_args: Option<&[crate::infer::AbsVal]>,
    ) -> (crate::ir::Module, crate::opt::Stats) {
        self.optimized_from(&self.lowered.module, roots, entry_args)
    }

    /// [`Program::optimized_for`] of `source`, the program's module or a
    /// copy of it changed for one entry ([`crate::adopt`]).
    fn optimized_from(
        &self,
        source: &crate::ir::Module,
        roots: &[GraphId],
        entry_args: Option<&[crate::infer::AbsVal]>,
    ) -> (crate::ir::Module, crate::opt::Stats) {
        let mut m = source.clone();
        let entry = match (roots, entry_args) {
            ([g], Some(args)) if self.arity(*g) == args.len() => {
                Some((*g, self.entry_args_with(*g, args)))
            }
            _ => None,
        };
        let opts = crate::opt::Options {
            internal_files: self.lowered.stdlib_files.iter().map(|f| f.0).collect(),
            entry,
            load_type: self.load_type_fn().map(crate::opt::LoadType),
            ..crate::opt::Options::default()
        };
        // Differentiation at run time builds on the derivative rules:
        // keep them (optimised too).
        let mut roots = roots.to_vec();
        if crate::vmgen::uses_dynamic_ad(&m, &roots) {
            roots.extend(self.rule_graphs());
        }
        let _s = stage!("optimise");
        let mut stats = crate::opt::optimize(&mut m, &roots, &opts);
        if let Some((g, args)) = &opts.entry {
            let _s = stage!("equality saturation");
            stats.rewrite = self.rewrite(&mut m, *g, &roots, args);
        }
        (m, stats)
    }

    /// Equality-saturation rewriting ([`crate::rewrite`]) of the optimised
    /// module `m`, typed from `entry` called with `args` (the IO token
    /// included); nothing when inference fails on it.
    fn rewrite(
        &self,
        m: &mut crate::ir::Module,
        entry: GraphId,
        keep: &[GraphId],
        args: &[crate::infer::AbsVal],
    ) -> Option<crate::rewrite::Stats> {
        let load_type = self.load_type_fn();
        let iopts = crate::infer::InferOptions {
            only_taken_branches: true,
            load_type: load_type.as_deref(),
            ..Default::default()
        };
        let types = match {
            let _s = stage!("inference");
            crate::infer::infer_module_with(m, entry, args, &iopts)
        } {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(
                    target: "adjoint::egg",
                    "egg: inference of the optimised module failed: {e}"
                );
                return None;
            }
        };
        // The graphs the optimiser kept besides the entry (the derivative
        // rules, for run-time differentiation) stay whole.
        let stats = crate::rewrite::rewrite(m, &[entry], keep, &types, &Default::default());
        if tracing::enabled!(target: "adjoint::egg", tracing::Level::DEBUG) {
            for line in stats.describe() {
                tracing::debug!(target: "adjoint::egg", "egg: {line}");
            }
        }
        Some(stats)
    }

    /// The graphs of the derivative rules.
    fn rule_graphs(&self) -> Vec<GraphId> {
        let r = &self.lowered.ad_rules;
        let mut v: Vec<GraphId> = r
            .prims
            .values()
            .chain(r.user.values())
            .chain(r.tangents.values())
            .copied()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// `ex` compiled from module `m`, with the hook that differentiates
    /// function values at run time when the program needs one.
    fn with_dynamic(
        &self,
        mut ex: Executable,
        m: &crate::ir::Module,
        roots: &[GraphId],
    ) -> Executable {
        if !crate::vmgen::uses_dynamic_ad(m, roots) {
            return ex;
        }
        let d = Arc::new(crate::ad::dynamic::DynAd::new(
            m.clone(),
            self.lowered.ad_rules.clone(),
            self.lowered.effectful.clone(),
            self.lowered.ad_provenance.clone(),
            ex.code_of.clone(),
            ex.program.codes.len() as u32,
            ex.locs.len() as u32,
            self.options.release_early,
        ));
        ex.program.dynamic = Some(adjoint_runtime::dynamic::DynamicHook(d.clone()));
        ex.dynamic = Some(d);
        ex
    }

    /// Fusion of the optimised module `m` reached from `entry`. Element-wise
    /// kernels need its types; when inference cannot give them, only the
    /// matrix products of transposes (which need none) are planned.
    pub fn fusion_plan(&self, m: &crate::ir::Module, entry: GraphId) -> Option<crate::fuse::Plan> {
        self.fusion_plan_for(m, entry, &[])
    }

    /// [`Program::fusion_plan`] for an entry called with arguments of the
    /// given abstract types.
    fn fusion_plan_for(
        &self,
        m: &crate::ir::Module,
        entry: GraphId,
        args: &[crate::infer::AbsVal],
    ) -> Option<crate::fuse::Plan> {
        let _s = stage!("fusion");
        let load_type = self.load_type_fn();
        let opts = crate::infer::InferOptions {
            only_taken_branches: true,
            load_type: load_type.as_deref(),
            ..Default::default()
        };
        let inference = stage!("inference");
        let types =
            crate::infer::infer_module_with(m, entry, &self.entry_args_with(entry, args), &opts)
                .map_err(|e| {
                    tracing::debug!(
                        target: "adjoint::fuse",
                        "fuse: inference of the optimised module failed: {e}"
                    );
                })
                .ok();
        drop(inference);
        let _s = stage!("plan");
        Some(crate::fuse::plan(
            m,
            &[entry],
            types.as_ref(),
            &self.options,
        ))
    }

    /// The abstract arguments of an entry function: `args`, then the IO
    /// token for one that does IO.
    fn entry_args_with(
        &self,
        g: GraphId,
        args: &[crate::infer::AbsVal],
    ) -> Vec<crate::infer::AbsVal> {
        let mut all = args.to_vec();
        if self.lowered.effectful.contains(&g) {
            all.push(crate::infer::AbsVal::Io);
        }
        all
    }

    /// Type-checks entry function `name` (which takes no arguments) and
    /// compiles it for the VM, through the optimiser in graph mode.
    pub fn prepare(&self, name: &str, mode: Mode) -> Result<Executable, Vec<Diagnostic>> {
        self.prepare_with(name, mode, &[])
    }

    /// Type-checks entry function `name` for arguments of the given
    /// abstract types and compiles it for the VM, through the optimiser in
    /// graph mode (which specialises the program to those types: an
    /// executable serves every call with arguments of these types).
    pub fn prepare_with(
        &self,
        name: &str,
        mode: Mode,
        args: &[crate::infer::AbsVal],
    ) -> Result<Executable, Vec<Diagnostic>> {
        let main = self.entry(name)?;
        let types = self.infer_entry_with(main, args)?;
        // Weak literals take the type of the joins inference gave them.
        let adopted = crate::adopt::weak_joins(&self.lowered.module, &types);
        let source = adopted.as_ref().unwrap_or(&self.lowered.module);
        // Differentiating code that differentiates a function value at run
        // time follows the transforms' graphs back to their sources, which
        // the optimiser's inlining would have copied: such a program runs
        // its IR as differentiated, as eager mode does.
        let mode = if nested_dynamic_ad(&self.lowered.module, &[main]) {
            Mode::Eager
        } else {
            mode
        };
        let compiled = match mode {
            Mode::Eager => {
                let _s = stage!("VM code");
                vmgen::compile(source, &[main], &self.options)
                    .map(|ex| self.with_dynamic(ex, source, &[main]))
            }
            Mode::Graph => {
                let (m, _) = self.optimized_from(source, &[main], Some(args));
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
                let mut plan = self.fusion_plan_for(&m, main, args);
                if let Some(p) = plan.as_mut() {
                    p.load_check = self.load_check();
                    if let Some(dev) = &self.cuda {
                        crate::codegen::cuda::retarget(&m, &[main], p, dev);
                    }
                }
                if tracing::enabled!(target: "adjoint::fuse", tracing::Level::DEBUG) {
                    for line in plan.iter().flat_map(|p| p.describe()) {
                        tracing::debug!(target: "adjoint::fuse", "fused: {line}");
                    }
                }
                let _s = stage!("VM code");
                vmgen::compile_with(&m, &[main], plan.as_ref(), &self.options)
                    .map(|ex| self.with_dynamic(ex, &m, &[main]))
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
        self.execute_with(name, ex, Vec::new(), out)
    }

    /// Runs entry function `name` from an executable prepared (by
    /// [`Program::prepare_with`]) for arguments of the types of `args`.
    pub fn execute_with(
        &self,
        name: &str,
        ex: &Executable,
        mut args: Vec<Value>,
        out: &mut dyn std::io::Write,
    ) -> Result<Value, Vec<Diagnostic>> {
        let main = self.entry(name)?;
        let Some(f) = ex.function(main) else {
            return Err(vec![located(
                format!("internal error: `{name}` is not compiled in this executable"),
                Loc::NONE,
                self.root,
            )]);
        };
        if args.len() != self.arity(main) {
            return Err(vec![self.arity_error(main, args.len())]);
        }
        let effectful = self.lowered.effectful.contains(&main);
        if effectful {
            args.push(Value::Io);
        }
        let mut vm = Vm::new(&ex.program, out).with_comm(&*self.comm);
        let r = vm.call(&f, args);
        drop(vm);
        let _ = out.flush();
        match r {
            Ok(v) => Ok(match v {
                Value::Tuple(t) if effectful && t.len() == 2 => t[1].clone(),
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

/// Checks that `load_npy` of a path gives the type graph mode compiled the
/// program for (the file may have changed since): a native instruction
/// after each load, taking the load's result and path.
struct LoadCheck {
    expected: HashMap<String, TypeOf>,
}

impl adjoint_runtime::vm::NativeKernel for LoadCheck {
    fn name(&self) -> &str {
        "load_check"
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, adjoint_runtime::RtError> {
        let args = &args[..];
        if let (Some(Value::Tuple(items)), Some(Value::Str(path))) = (args.first(), args.get(1)) {
            if let (Some(Value::Tensor(t)), Some((d, shape))) =
                (items.get(1), self.expected.get(&**path))
            {
                if t.dtype() != *d || t.shape() != shape.as_slice() {
                    let want = adjoint_runtime::TensorTy::new(*d, shape);
                    return Err(adjoint_runtime::RtError::new(format!(
                        "load_npy: {path:?} holds {} now, but {want} when the program was compiled",
                        t.type_string()
                    )));
                }
            }
        }
        args.first()
            .cloned()
            .ok_or_else(|| adjoint_runtime::RtError::internal("load_check without a value"))
    }
}

fn located(message: String, loc: Loc, root: FileId) -> Diagnostic {
    let (message, note) = in_user_words(message);
    let d = Diagnostic::error(message, span_of(loc).unwrap_or(Span::point(root, 0)));
    match note {
        Some(n) => d.with_note(n),
        None => d,
    }
}

/// A message from inference or a kernel in the words of the program: an
/// operator's primitive (`add: ..`) named as the operator the user wrote,
/// and a note where a `()` stands for a value (most often a block ending
/// in `;`).
fn in_user_words(message: String) -> (String, Option<&'static str>) {
    let message = match message.split_once(": ") {
        Some((head, rest)) => match Prim::from_name(head).and_then(Prim::user_label) {
            Some(label) => format!("{label}: {rest}"),
            None => message,
        },
        None => message,
    };
    let note = message.ends_with("got ()").then_some(
        "`()` is the value of a block whose last statement ends in `;`: drop that `;` to give the block the statement's value",
    );
    (message, note)
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

/// Whether code reachable from `roots` transforms, at run time, a function
/// value inside code that is itself differentiated.
fn nested_dynamic_ad(m: &crate::ir::Module, roots: &[GraphId]) -> bool {
    let graphs = crate::ir::analysis::reachable_graphs(m, roots);
    crate::vmgen::dynamic_ad_ops(m, &graphs)
        .into_iter()
        .any(|nested| nested)
}
