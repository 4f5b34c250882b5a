//! Lowering: AST → graph IR.
//!
//! Names are resolved here (with errors for unknown names); `let mut`
//! variables become SSA values, and graph parameters where control flow
//! joins; closures become nested graphs whose free variables are the
//! captured values; `if` becomes `switch(c, @then, @else)()`; loops become
//! recursive header/body/after graphs in continuation-passing style, so
//! `break`, `continue` and `return` are tail calls between graphs.
//!
//! IO is ordered by an explicit state token: a function that (transitively)
//! performs IO takes the token as its last parameter and returns
//! `make_tuple(io, value)`; every IO primitive takes the token first and
//! yields the next one. No later pass can reorder or drop IO without
//! breaking that data dependence.

mod scan;
mod stmt;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use adjoint_lang::ast::{self, Expr, ExprKind, FnDef, Item};
use adjoint_lang::{Diagnostic, FileId, SourceMap, Span};
use adjoint_runtime::tensor::DType;

use crate::ad::{AdKind, AdRequest, Rules};
use crate::checks::Check;
use crate::ir::{Const, GraphId, Loc, Module, NodeId};
use crate::prim::{self, Prim};
pub use crate::span::{loc, span_of};
use scan::CallTarget;

/// The standard library modules, compiled into the binary.
pub const STDLIB: &[(&str, &str)] = &[
    ("prelude", include_str!("../../../stdlib/prelude.adj")),
    ("nn", include_str!("../../../stdlib/nn.adj")),
    ("bprop", include_str!("../../../stdlib/bprop.adj")),
    ("jvp", include_str!("../../../stdlib/jvp.adj")),
    ("optim", include_str!("../../../stdlib/optim.adj")),
];

/// The text of a standard library module as the compiler loads it: the
/// rule files get the rules generated from the primitive table
/// ([`crate::rule::stdlib_rules`]) appended.
pub fn stdlib_text(name: &str) -> Option<String> {
    let (_, text) = STDLIB.iter().find(|(n, _)| *n == name)?;
    let (bprop, jvp) = crate::rule::stdlib_rules();
    Some(match name {
        "bprop" => format!("{text}{bprop}"),
        "jvp" => format!("{text}{jvp}"),
        _ => text.to_string(),
    })
}

/// Reads imported files (the root package provides one backed by the file
/// system; nothing below it touches the file system itself).
pub trait SourceLoader {
    fn load(&self, path: &Path) -> std::io::Result<String>;
}

/// The result of lowering a program.
pub struct Lowered {
    pub module: Module,
    /// The root file's functions, by name, in source order.
    pub functions: Vec<(String, GraphId)>,
    /// Graphs that take the IO token as their last parameter and return
    /// `(io, value)`.
    pub effectful: HashSet<GraphId>,
    /// What to check once types are known (annotations, assignments).
    pub checks: Vec<Check>,
    /// Graphs to build by differentiation, and the rules to build them.
    pub ad_requests: Vec<AdRequest>,
    pub ad_rules: Rules,
    /// Where the graphs made by differentiation came from (for
    /// differentiating function values at run time).
    pub ad_provenance: crate::ad::Provenance,
    /// Files of the standard library (errors inside them are reported at
    /// the user code that called into them).
    pub stdlib_files: Vec<FileId>,
}

type R<T> = Result<T, Diagnostic>;

/// What `grad(f)` and friends differentiate.
enum DiffTarget {
    /// A function known at compile time, with its name for messages.
    Static(GraphId, String),
    /// A function value, differentiated when the program runs.
    Value(NodeId),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct FnKey {
    module: usize,
    item: usize,
}

struct ModInfo {
    file: FileId,
    ast: Rc<ast::Module>,
    fns: HashMap<String, usize>,
    bprops: HashMap<String, usize>,
    imports: HashMap<String, usize>,
    /// Standard-library modules may call the primitives that
    /// differentiation uses internally.
    internal: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct VarId(u32);

struct VarInfo {
    fn_id: u32,
}

#[derive(Clone)]
enum Binding {
    Val(NodeId),
    Var(VarId),
    LocalFn(LocalFn),
}

#[derive(Clone)]
struct LocalFn {
    graph: GraphId,
    def: Rc<FnDef>,
    effectful: bool,
}

/// A loop that `break` and `continue` may jump to.
#[derive(Clone)]
struct LoopCx {
    header: GraphId,
    after: GraphId,
    carried: Vec<VarId>,
    /// For counted loops: the next value of the counter.
    next: Option<NodeId>,
}

/// What to do with a block's value once computed.
#[derive(Clone)]
enum Cont {
    /// Give it back to the caller of `lower_stmts` (inline blocks).
    Value,
    /// It is the function's result: the graph outputs it (paired with the
    /// IO token in effectful functions).
    Return,
    /// The graph outputs `make_tuple(value, vars..)`, or the value alone
    /// when there are no variables.
    Pack(Vec<VarId>),
    /// Tail-call `graph(prefix.., vars..)`, dropping the value.
    Jump {
        graph: GraphId,
        prefix: Vec<NodeId>,
        vars: Vec<VarId>,
    },
}

/// The state of the graph being built.
#[derive(Clone)]
struct Cx {
    graph: GraphId,
    vals: HashMap<VarId, NodeId>,
    /// The IO token variable of an effectful function.
    io: Option<VarId>,
    fn_id: u32,
    loops: Vec<LoopCx>,
    /// Why jumps out of this graph are not allowed, when they are not.
    barrier: Option<&'static str>,
    /// The function's return annotation.
    ret: Option<Rc<ast::TypeExpr>>,
}

impl Cx {
    fn child(&self, graph: GraphId) -> Cx {
        Cx {
            graph,
            ..self.clone()
        }
    }
}

pub struct Lowerer<'a> {
    m: Module,
    sources: &'a mut SourceMap,
    loader: &'a dyn SourceLoader,
    mods: Vec<ModInfo>,
    mod_by_path: HashMap<String, usize>,
    prelude: Option<usize>,
    effectful: HashSet<FnKey>,
    fn_graphs: HashMap<FnKey, GraphId>,
    pending: Vec<(FnKey, GraphId)>,
    prim_values: HashMap<Prim, GraphId>,
    scopes: Vec<Vec<(String, Binding)>>,
    vars: Vec<VarInfo>,
    next_fn_id: u32,
    diags: Vec<Diagnostic>,
    effectful_graphs: HashSet<GraphId>,
    depth: usize,
    checks: Vec<Check>,
    ad_requests: Vec<AdRequest>,
    /// Whether some `grad(..)` differentiates a function value (the rules
    /// are then needed when the program runs).
    dynamic_ad: bool,
    bprop_mod: Option<usize>,
    /// The tangent rules (`stdlib/jvp.adj`).
    jvp_mod: Option<usize>,
}

/// Names of user-facing primitives that are spelled differently or not
/// callable directly.
fn user_prim(name: &str) -> Option<Prim> {
    let p = Prim::from_name(name)?;
    match p {
        Prim::Not
        | Prim::Add
        | Prim::Sub
        | Prim::Mul
        | Prim::Div
        | Prim::Pow
        | Prim::Rem
        | Prim::Eq
        | Prim::Ne
        | Prim::Lt
        | Prim::Le
        | Prim::Gt
        | Prim::Ge
        | Prim::And
        | Prim::Or
        | Prim::Cast
        | Prim::Index
        | Prim::MakeTuple
        | Prim::TupleGet
        | Prim::TupleLen
        | Prim::MakeRecord
        | Prim::RecordGet
        | Prim::TensorLiteral
        | Prim::Switch
        | Prim::AdLift
        | Prim::AdDyn
        | Prim::AdHide
        | Prim::AdKey
        | Prim::GradSeed
        | Prim::ProgressStart
        | Prim::ProgressStep
        | Prim::ProgressEnd => None,
        _ => Some(p),
    }
}

const DIFF_NAMES: &[&str] = &["grad", "value_and_grad", "vjp", "jvp"];

const MAX_DEPTH: usize = 20_000;

impl<'a> Lowerer<'a> {
    /// Parses `root` (already in `sources`) and every module it imports,
    /// then lowers every function of the root file.
    pub fn lower_program(
        sources: &'a mut SourceMap,
        root: FileId,
        root_path: Option<&Path>,
        loader: &'a dyn SourceLoader,
    ) -> Result<Lowered, Vec<Diagnostic>> {
        let mut lw = Lowerer {
            m: Module::new(),
            sources,
            loader,
            mods: Vec::new(),
            mod_by_path: HashMap::new(),
            prelude: None,
            effectful: HashSet::new(),
            fn_graphs: HashMap::new(),
            pending: Vec::new(),
            prim_values: HashMap::new(),
            scopes: Vec::new(),
            vars: Vec::new(),
            next_fn_id: 0,
            diags: Vec::new(),
            effectful_graphs: HashSet::new(),
            depth: 0,
            checks: Vec::new(),
            ad_requests: Vec::new(),
            dynamic_ad: false,
            bprop_mod: None,
            jvp_mod: None,
        };
        let prelude_src = STDLIB[0].1;
        let pf = lw.sources.add_file("<stdlib>/prelude.adj", prelude_src);
        let prelude = lw.load_module(pf, None);
        lw.mods[prelude].internal = true;
        lw.prelude = Some(prelude);
        let bf = lw.sources.add_file(
            "<stdlib>/bprop.adj",
            stdlib_text("bprop").expect("bprop.adj"),
        );
        let bprop_mod = lw.load_module(bf, None);
        lw.mods[bprop_mod].internal = true;
        lw.bprop_mod = Some(bprop_mod);
        let jf = lw
            .sources
            .add_file("<stdlib>/jvp.adj", stdlib_text("jvp").expect("jvp.adj"));
        let jvp_mod = lw.load_module(jf, None);
        lw.mods[jvp_mod].internal = true;
        lw.jvp_mod = Some(jvp_mod);
        let root_dir = root_path.and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let root_mod = lw.load_module(root, root_dir);
        if lw.diags.iter().any(|d| d.is_error()) {
            return Err(lw.diags);
        }
        lw.compute_effects();
        let mut functions = Vec::new();
        let ast = lw.mods[root_mod].ast.clone();
        for (i, item) in ast.items.iter().enumerate() {
            if let Item::Fn(def) = item {
                let g = lw.fn_graph(FnKey {
                    module: root_mod,
                    item: i,
                });
                functions.push((def.name.name.clone(), g));
            }
        }
        lw.drain_pending();
        let ad_rules = if lw.ad_requests.is_empty() && !lw.dynamic_ad {
            Rules::default()
        } else {
            lw.lower_rules()
        };
        if lw.diags.iter().any(|d| d.is_error()) {
            return Err(lw.diags);
        }
        Ok(Lowered {
            module: lw.m,
            functions,
            effectful: lw.effectful_graphs,
            checks: lw.checks,
            ad_requests: lw.ad_requests,
            ad_rules,
            ad_provenance: Default::default(),
            stdlib_files: lw
                .mods
                .iter()
                .filter(|m| m.internal)
                .map(|m| m.file)
                .collect(),
        })
    }

    fn error(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    // ----- modules -------------------------------------------------------

    fn load_module(&mut self, file: FileId, dir: Option<PathBuf>) -> usize {
        let text = self.sources.text(file).to_string();
        let (ast, diags) = adjoint_lang::parse(file, &text);
        self.diags.extend(diags);
        let ast = Rc::new(ast);
        let idx = self.mods.len();
        let mut fns = HashMap::new();
        let mut bprops = HashMap::new();
        for (i, item) in ast.items.iter().enumerate() {
            if let Item::Bprop(def) = item {
                if bprops.insert(def.name.name.clone(), i).is_some() {
                    self.error(Diagnostic::error(
                        format!("`{}` has two bprop rules", def.name.name),
                        def.name.span,
                    ));
                }
            }
            if let Item::Fn(def) = item {
                if let Some(prev) = fns.insert(def.name.name.clone(), i) {
                    let prev_span = match &ast.items[prev] {
                        Item::Fn(p) => p.name.span,
                        _ => def.name.span,
                    };
                    self.error(
                        Diagnostic::error(
                            format!("function `{}` is defined twice", def.name.name),
                            def.name.span,
                        )
                        .with_secondary(prev_span, "first defined here"),
                    );
                }
            }
        }
        self.mods.push(ModInfo {
            file,

            ast: ast.clone(),
            fns,
            bprops,
            imports: HashMap::new(),
            internal: false,
        });
        for item in ast.items.iter() {
            if let Item::Import(imp) = item {
                self.load_import(idx, imp, dir.as_deref());
            }
        }
        idx
    }

    fn load_import(&mut self, from: usize, imp: &ast::Import, dir: Option<&Path>) {
        let (key, alias, text, name, idir) = match &imp.module {
            ast::ImportPath::Name(id) => {
                let Some((_, src)) = STDLIB.iter().find(|(n, _)| *n == id.name) else {
                    self.error(
                        Diagnostic::error(
                            format!("no standard library module named `{}`", id.name),
                            id.span,
                        )
                        .with_note(format!(
                            "the standard library has: {}",
                            STDLIB
                                .iter()
                                .map(|(n, _)| *n)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    );
                    return;
                };
                let alias = imp
                    .alias
                    .as_ref()
                    .map_or(id.name.clone(), |a| a.name.clone());
                (
                    format!("<stdlib>/{}", id.name),
                    alias,
                    src.to_string(),
                    format!("<stdlib>/{}.adj", id.name),
                    None,
                )
            }
            ast::ImportPath::File { path, span } => {
                let full = match dir {
                    Some(d) => d.join(path),
                    None => PathBuf::from(path),
                };
                let alias = match &imp.alias {
                    Some(a) => a.name.clone(),
                    None => Path::new(path)
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_else(|| path.clone()),
                };
                let text = match self.loader.load(&full) {
                    Ok(t) => t,
                    Err(e) => {
                        self.error(Diagnostic::error(
                            format!("cannot import \"{}\": {}", full.display(), io_reason(&e)),
                            *span,
                        ));
                        return;
                    }
                };
                let key = full
                    .canonicalize()
                    .unwrap_or(full.clone())
                    .display()
                    .to_string();
                let idir = full.parent().map(|p| p.to_path_buf());
                (key, alias, text, full.display().to_string(), idir)
            }
        };
        let target = match self.mod_by_path.get(&key) {
            Some(m) => *m,
            None => {
                if self.mods.len() > 1000 {
                    self.error(Diagnostic::error("too many imported modules", imp.span));
                    return;
                }
                let file = self.sources.add_file(name, text);
                // Register before loading, so import cycles terminate.
                self.mod_by_path.insert(key.clone(), self.mods.len());
                let m = self.load_module(file, idir);
                if key.starts_with("<stdlib>/") {
                    self.mods[m].internal = true;
                }
                m
            }
        };
        self.mods[from].imports.insert(alias, target);
    }

    /// Which functions perform IO, directly or through the functions they
    /// call by name (a fixpoint over the call graph).
    fn compute_effects(&mut self) {
        let mut calls: HashMap<FnKey, Vec<CallTarget>> = HashMap::new();
        for (mi, m) in self.mods.iter().enumerate() {
            for (i, item) in m.ast.items.iter().enumerate() {
                if let Item::Fn(def) = item {
                    calls.insert(
                        FnKey {
                            module: mi,
                            item: i,
                        },
                        scan::calls_in(&def.body),
                    );
                }
            }
        }
        loop {
            let mut changed = false;
            for (key, targets) in &calls {
                if self.effectful.contains(key) {
                    continue;
                }
                let is_main = matches!(
                    &self.mods[key.module].ast.items[key.item],
                    Item::Fn(def) if def.name.name == "main"
                );
                if is_main || targets.iter().any(|t| self.target_effectful(key.module, t)) {
                    self.effectful.insert(*key);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    fn target_effectful(&self, module: usize, t: &CallTarget) -> bool {
        match t {
            CallTarget::Name(n) => {
                if is_io_name(n) {
                    return true;
                }
                self.global_fn(module, n)
                    .is_some_and(|k| self.effectful.contains(&k))
            }
            CallTarget::Member(m, n) => self.mods[module]
                .imports
                .get(m)
                .and_then(|mi| self.mods[*mi].fns.get(n).map(|i| (*mi, *i)))
                .is_some_and(|(mi, i)| {
                    self.effectful.contains(&FnKey {
                        module: mi,
                        item: i,
                    })
                }),
        }
    }

    /// A global function visible by plain name from `module`: its own, or
    /// the prelude's. The tangent rules (`stdlib/jvp.adj`) also see the
    /// helpers of the reverse rules (`stdlib/bprop.adj`), so a rule shared
    /// by both modes is written once.
    fn global_fn(&self, module: usize, name: &str) -> Option<FnKey> {
        if let Some(i) = self.mods[module].fns.get(name) {
            return Some(FnKey { module, item: *i });
        }
        if let (Some(j), Some(b)) = (self.jvp_mod, self.bprop_mod) {
            if module == j {
                if let Some(i) = self.mods[b].fns.get(name) {
                    return Some(FnKey {
                        module: b,
                        item: *i,
                    });
                }
            }
        }
        let p = self.prelude?;
        self.mods[p].fns.get(name).map(|i| FnKey {
            module: p,
            item: *i,
        })
    }

    fn fn_def(&self, key: FnKey) -> Rc<FnDef> {
        match &self.mods[key.module].ast.items[key.item] {
            Item::Fn(def) | Item::Bprop(def) => Rc::new(def.clone()),
            _ => unreachable!("function keys point at functions"),
        }
    }

    /// The graph of a global function, creating it (and queueing its body)
    /// on first use.
    fn fn_graph(&mut self, key: FnKey) -> GraphId {
        if let Some(g) = self.fn_graphs.get(&key) {
            return *g;
        }
        let def = self.fn_def(key);
        let name = match &self.mods[key.module].ast.items[key.item] {
            Item::Bprop(_) => format!("bprop.{}", def.name.name),
            _ => def.name.name.clone(),
        };
        let g = self.m.add_graph(name, loc(def.name.span));
        self.fn_graphs.insert(key, g);
        self.pending.push((key, g));
        g
    }

    /// Lowers the reverse rules: the standard library's, for primitives,
    /// and the program's own, for its functions.
    fn lower_rules(&mut self) -> Rules {
        let mut rules = Rules::default();
        for module in 0..self.mods.len() {
            let bprops: Vec<(String, usize)> = self.mods[module]
                .bprops
                .iter()
                .map(|(n, i)| (n.clone(), *i))
                .collect();
            for (name, item) in bprops {
                let span = match &self.mods[module].ast.items[item] {
                    Item::Bprop(d) => d.name.span,
                    _ => continue,
                };
                let rule = self.fn_graph(FnKey { module, item });
                if Some(module) == self.bprop_mod {
                    match Prim::from_name(&name) {
                        Some(p) => {
                            rules.prims.insert(p, rule);
                        }
                        None => self.error(Diagnostic::error(
                            format!("bprop for unknown primitive `{name}`"),
                            span,
                        )),
                    }
                } else {
                    match self.mods[module].fns.get(&name).copied() {
                        Some(f) => {
                            let g = self.fn_graph(FnKey { module, item: f });
                            rules.user.insert(g, rule);
                        }
                        None => self.error(Diagnostic::error(
                            format!("bprop for unknown function `{name}`"),
                            span,
                        )
                        .with_note("a bprop item gives the derivative of a function defined in the same file")),
                    }
                }
            }
        }
        self.lower_tangent_rules(&mut rules);
        self.drain_pending();
        let missing = crate::ad::missing_rules(&rules);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|p| p.name()).collect();
            let span = Span::point(self.mods[self.bprop_mod.unwrap_or(0)].file, 0);
            self.error(
                Diagnostic::error(
                    format!("no derivative rule for: {}", names.join(", ")),
                    span,
                )
                .with_note("every differentiable primitive needs a `bprop` in stdlib/bprop.adj"),
            );
        }
        let missing = crate::ad::missing_tangent_rules(&rules);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|p| p.name()).collect();
            let span = Span::point(self.mods[self.jvp_mod.unwrap_or(0)].file, 0);
            self.error(
                Diagnostic::error(format!("no tangent rule for: {}", names.join(", ")), span)
                    .with_note(
                        "every differentiable primitive needs a `jvp_` function in stdlib/jvp.adj",
                    ),
            );
        }
        rules
    }

    /// Lowers the tangent rules of forward mode: the functions `jvp_P` of
    /// `stdlib/jvp.adj`, one per primitive `P` (other functions there are
    /// helpers).
    fn lower_tangent_rules(&mut self, rules: &mut Rules) {
        let Some(module) = self.jvp_mod else {
            return;
        };
        let mut fns: Vec<(String, usize)> = self.mods[module]
            .fns
            .iter()
            .map(|(n, i)| (n.clone(), *i))
            .collect();
        fns.sort_by_key(|(_, i)| *i);
        for (name, item) in fns {
            let Some(pname) = name.strip_prefix("jvp_") else {
                continue;
            };
            let span = match &self.mods[module].ast.items[item] {
                Item::Fn(d) => d.name.span,
                _ => continue,
            };
            let problem = match Prim::from_name(pname) {
                None => Some(format!("tangent rule for unknown primitive `{pname}`")),
                Some(p) if !p.info().differentiable => Some(format!(
                    "tangent rule for `{p}`, which is not differentiable"
                )),
                Some(p) if crate::ad::tangent_is_generated(p) => Some(format!(
                    "tangent rule for `{p}`, whose rule the forward transform generates"
                )),
                Some(p) => {
                    let g = self.fn_graph(FnKey { module, item });
                    rules.tangents.insert(p, g);
                    None
                }
            };
            if let Some(message) = problem {
                self.error(Diagnostic::error(message, span));
            }
        }
    }

    /// A primitive callable by this name from `module`.
    fn prim_named(&self, module: usize, name: &str) -> Option<Prim> {
        if self.mods[module].internal {
            Prim::from_name(name)
        } else {
            user_prim(name)
        }
    }

    fn drain_pending(&mut self) {
        while let Some((key, g)) = self.pending.pop() {
            let def = self.fn_def(key);
            let effectful = self.effectful.contains(&key);
            let saved = std::mem::take(&mut self.scopes);
            let module = key.module;
            if let Err(d) = self.lower_function(module, g, &def, effectful) {
                self.error(d);
                // Leave a well-formed graph behind.
                if self.m.graph(g).output.is_none() {
                    let u = self.m.add_const(Const::Unit, Loc::NONE);
                    self.m.set_output(g, u);
                }
            }
            self.scopes = saved;
        }
    }

    // ----- functions -----------------------------------------------------

    fn new_fn_id(&mut self) -> u32 {
        self.next_fn_id += 1;
        self.next_fn_id
    }

    fn new_var(&mut self, fn_id: u32) -> VarId {
        self.vars.push(VarInfo { fn_id });
        VarId(self.vars.len() as u32 - 1)
    }

    /// Lowers a function body into graph `g` (parameters first, then the IO
    /// token when `effectful`). `vals` are the variable values visible at
    /// the definition (captured by value).
    fn lower_fn_body(
        &mut self,
        module: usize,
        g: GraphId,
        def: &FnDef,
        effectful: bool,
        vals: HashMap<VarId, NodeId>,
    ) -> R<()> {
        let fn_id = self.new_fn_id();
        let mut cx = Cx {
            graph: g,
            vals,
            io: None,
            fn_id,
            loops: Vec::new(),
            barrier: None,
            ret: def.ret.clone().map(Rc::new),
        };
        self.scopes.push(Vec::new());
        for p in &def.params {
            let node = self.m.add_param(g, p.name.name.clone(), loc(p.span));
            if let Some(ty) = &p.ty {
                self.checks.push(Check::Annotation {
                    node,
                    ty: ty.clone(),
                    what: format!("parameter `{}`", p.name.name),
                });
            }
            if p.name.name != "_" {
                self.bind(&p.name.name, Binding::Val(node));
            }
        }
        if effectful {
            let io = self.m.add_param(g, "io", loc(def.name.span));
            let v = self.new_var(fn_id);
            cx.vals.insert(v, io);
            cx.io = Some(v);
            self.effectful_graphs.insert(g);
        }
        let r = self.lower_tail(module, &mut cx, Some(&def.body), def.span, &Cont::Return);
        self.scopes.pop();
        r.map(|_| ())
    }

    fn lower_function(&mut self, module: usize, g: GraphId, def: &FnDef, effectful: bool) -> R<()> {
        self.lower_fn_body(module, g, def, effectful, HashMap::new())
    }

    // ----- scopes --------------------------------------------------------

    fn bind(&mut self, name: &str, b: Binding) {
        self.scopes
            .last_mut()
            .expect("a scope is open")
            .push((name.to_string(), b));
    }

    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|s| s.iter().rev())
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
    }

    // ----- node helpers --------------------------------------------------

    fn konst(&mut self, c: Const, span: Span) -> NodeId {
        self.m.add_const(c, loc(span))
    }

    fn prim(&mut self, cx: &Cx, p: Prim, args: &[NodeId], span: Span) -> NodeId {
        self.m.add_prim(cx.graph, p, args, loc(span))
    }

    fn tuple_get(&mut self, cx: &Cx, t: NodeId, i: usize, span: Span) -> NodeId {
        let k = self.konst(Const::Int(i as i64), span);
        self.prim(cx, Prim::TupleGet, &[t, k], span)
    }

    fn unit(&mut self, span: Span) -> NodeId {
        self.konst(Const::Unit, span)
    }

    fn graph_ref(&mut self, g: GraphId, span: Span) -> NodeId {
        self.konst(Const::Graph(g), span)
    }

    /// `callee(args..)`, threading the IO token when the callee is effectful.
    fn call(
        &mut self,
        cx: &mut Cx,
        callee: NodeId,
        mut args: Vec<NodeId>,
        effectful: bool,
        span: Span,
    ) -> R<NodeId> {
        if !effectful {
            let mut inputs = vec![callee];
            inputs.extend(args);
            return Ok(self.m.add_apply(cx.graph, inputs, loc(span)));
        }
        let io_var = self.io_var(cx, span)?;
        args.push(cx.vals[&io_var]);
        let mut inputs = vec![callee];
        inputs.extend(args);
        let r = self.m.add_apply(cx.graph, inputs, loc(span));
        let io = self.tuple_get(cx, r, 0, span);
        cx.vals.insert(io_var, io);
        Ok(self.tuple_get(cx, r, 1, span))
    }

    fn io_var(&mut self, cx: &Cx, span: Span) -> R<VarId> {
        cx.io.ok_or_else(|| {
            Diagnostic::error("IO is not allowed here", span).with_note(
                "printing and file IO may happen only in named functions called directly, \
                 not inside lambdas or functions passed as values",
            )
        })
    }

    /// Finishes the current graph (or returns the value, for `Cont::Value`).
    fn finish(&mut self, cx: &mut Cx, value: NodeId, k: &Cont, span: Span) -> Option<NodeId> {
        if let (Cont::Return, Some(ty)) = (k, &cx.ret) {
            self.checks.push(Check::Annotation {
                node: value,
                ty: (**ty).clone(),
                what: "the result".into(),
            });
        }
        let out = match k {
            Cont::Value => return Some(value),
            Cont::Return => match cx.io {
                Some(io) => {
                    let tok = cx.vals[&io];
                    self.prim(cx, Prim::MakeTuple, &[tok, value], span)
                }
                None => value,
            },
            Cont::Pack(vars) => {
                if vars.is_empty() {
                    value
                } else {
                    let mut items = vec![value];
                    items.extend(vars.iter().map(|v| cx.vals[v]));
                    self.prim(cx, Prim::MakeTuple, &items, span)
                }
            }
            Cont::Jump {
                graph,
                prefix,
                vars,
            } => {
                let callee = self.graph_ref(*graph, span);
                let mut inputs = vec![callee];
                inputs.extend(prefix.iter().copied());
                inputs.extend(vars.iter().map(|v| cx.vals[v]));
                self.m.add_apply(cx.graph, inputs, loc(span))
            }
        };
        self.m.set_output(cx.graph, out);
        None
    }

    /// Unpacks the result of a `Pack` continuation into the value and the
    /// variables' new values.
    fn unpack(&mut self, cx: &mut Cx, r: NodeId, vars: &[VarId], span: Span) -> NodeId {
        if vars.is_empty() {
            return r;
        }
        for (i, v) in vars.iter().enumerate() {
            let n = self.tuple_get(cx, r, i + 1, span);
            cx.vals.insert(*v, n);
        }
        self.tuple_get(cx, r, 0, span)
    }

    /// The variables among `names` that the current function may reassign,
    /// plus the IO token: what flows through a join point.
    fn carried(&self, cx: &Cx, names: &[String]) -> Vec<VarId> {
        let mut vars: Vec<VarId> = names
            .iter()
            .filter_map(|n| match self.lookup(n) {
                Some(Binding::Var(v)) if self.vars[v.0 as usize].fn_id == cx.fn_id => Some(*v),
                _ => None,
            })
            .collect();
        if let Some(io) = cx.io {
            vars.push(io);
        }
        vars.sort();
        vars.dedup();
        vars
    }

    /// A new graph whose parameters stand for `vars` (and `extra` leading
    /// parameters); returns the graph and a context for it.
    fn join_graph(
        &mut self,
        cx: &Cx,
        name: &str,
        extra: &[&str],
        vars: &[VarId],
        span: Span,
    ) -> (GraphId, Cx, Vec<NodeId>) {
        let parent = self.m.graph(cx.graph).name.clone();
        let base = parent.split('.').next().unwrap_or(&parent).to_string();
        let g = self.m.add_graph(format!("{base}.{name}"), loc(span));
        let mut extras = Vec::new();
        for e in extra {
            extras.push(self.m.add_param(g, *e, loc(span)));
        }
        let mut ncx = cx.child(g);
        for v in vars {
            let p = self.m.add_param(g, self.var_name(cx, *v), loc(span));
            ncx.vals.insert(*v, p);
        }
        (g, ncx, extras)
    }

    fn var_name(&self, cx: &Cx, v: VarId) -> String {
        if cx.io == Some(v) {
            return "io".into();
        }
        for s in self.scopes.iter().rev() {
            for (n, b) in s.iter().rev() {
                if let Binding::Var(w) = b {
                    if *w == v {
                        return n.clone();
                    }
                }
            }
        }
        format!("v{}", v.0)
    }

    fn enter(&mut self, span: Span) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(
                Diagnostic::error("program too deeply nested for the compiler", span)
                    .with_note("split the function into smaller functions"),
            );
        }
        Ok(())
    }
    fn leave(&mut self) {
        self.depth -= 1;
    }

    // ----- expressions ---------------------------------------------------

    fn lower_expr(&mut self, module: usize, cx: &mut Cx, e: &Expr) -> R<NodeId> {
        self.enter(e.span)?;
        let r = self.lower_expr_inner(module, cx, e);
        self.leave();
        r
    }

    fn lower_expr_inner(&mut self, module: usize, cx: &mut Cx, e: &Expr) -> R<NodeId> {
        let span = e.span;
        match &*e.kind {
            ExprKind::Int(i) => Ok(self.konst(Const::Int(*i), span)),
            ExprKind::Float { value, .. } => Ok(self.konst(Const::Float(*value), span)),
            ExprKind::Bool(b) => Ok(self.konst(Const::Bool(*b), span)),
            ExprKind::Str(s) => Ok(self.konst(Const::Str(Arc::from(s.as_str())), span)),
            ExprKind::Name(n) => self.lower_name(module, cx, n, span),
            ExprKind::Tuple(es) => {
                if es.is_empty() {
                    return Ok(self.unit(span));
                }
                let items = self.lower_all(module, cx, es)?;
                Ok(self.prim(cx, Prim::MakeTuple, &items, span))
            }
            ExprKind::Record(fields) => {
                let mut args = Vec::new();
                let mut seen = HashSet::new();
                for f in fields {
                    if !seen.insert(f.name.name.clone()) {
                        return Err(Diagnostic::error(
                            format!("field `{}` is given twice", f.name.name),
                            f.name.span,
                        ));
                    }
                    let v = self.lower_expr(module, cx, &f.value)?;
                    args.push(self.konst(Const::Str(Arc::from(f.name.name.as_str())), f.name.span));
                    args.push(v);
                }
                Ok(self.prim(cx, Prim::MakeRecord, &args, span))
            }
            ExprKind::Tensor(es) => {
                let items = self.lower_all(module, cx, es)?;
                Ok(self.prim(cx, Prim::TensorLiteral, &items, span))
            }
            ExprKind::Unary { op, operand } => {
                match (op, &*operand.kind) {
                    (ast::UnOp::Neg, ExprKind::Int(i)) => {
                        return Ok(self.konst(Const::Int(i.wrapping_neg()), span))
                    }
                    (ast::UnOp::Neg, ExprKind::Float { value, .. }) => {
                        return Ok(self.konst(Const::Float(-value), span))
                    }
                    _ => {}
                }
                let x = self.lower_expr(module, cx, operand)?;
                let p = match op {
                    ast::UnOp::Neg => Prim::Neg,
                    ast::UnOp::Not => Prim::Not,
                };
                Ok(self.prim(cx, p, &[x], span))
            }
            ExprKind::Binary { op, lhs, rhs, .. } => {
                let a = self.lower_expr(module, cx, lhs)?;
                let b = self.lower_expr(module, cx, rhs)?;
                Ok(self.prim(cx, binop_prim(*op), &[a, b], span))
            }
            ExprKind::Call { callee, args } => self.lower_call(module, cx, callee, args, span),
            ExprKind::Index { base, indices } => {
                let x = self.lower_expr(module, cx, base)?;
                let mut args = vec![x];
                for c in indices {
                    match c {
                        ast::IndexComp::Expr(i) => args.push(self.lower_expr(module, cx, i)?),
                        ast::IndexComp::Slice { lo, hi, span } => {
                            let lo = match lo {
                                Some(l) => self.lower_expr(module, cx, l)?,
                                None => self.unit(*span),
                            };
                            let hi = match hi {
                                Some(h) => self.lower_expr(module, cx, h)?,
                                None => self.unit(*span),
                            };
                            // `e : e + c` also carries its length `c`,
                            // which stays a constant where `e` is not, even
                            // through the parameters of differentiated code
                            // (see `docs/ir.md`).
                            let len = crate::ir::analysis::window_len(&self.m, lo, hi);
                            let parts: &[NodeId] = match &len {
                                Some(c) => &[lo, hi, *c],
                                None => &[lo, hi],
                            };
                            args.push(self.prim(cx, Prim::MakeTuple, parts, *span));
                        }
                    }
                }
                Ok(self.prim(cx, Prim::Index, &args, span))
            }
            ExprKind::Field { base, name } => {
                if let ExprKind::Name(m) = &*base.kind {
                    if self.lookup(m).is_none() {
                        if let Some(target) = self.mods[module].imports.get(m).copied() {
                            return self.module_member_value(target, m, name, span);
                        }
                    }
                }
                let r = self.lower_expr(module, cx, base)?;
                let n = self.konst(Const::Str(Arc::from(name.name.as_str())), name.span);
                Ok(self.prim(cx, Prim::RecordGet, &[r, n], span))
            }
            ExprKind::TupleIndex { base, index, .. } => {
                let t = self.lower_expr(module, cx, base)?;
                Ok(self.tuple_get(cx, t, *index as usize, span))
            }
            ExprKind::Lambda { params, body } => self.lower_lambda(module, cx, params, body, span),
            ExprKind::Block(b) => self.lower_block_value(module, cx, b),
            ExprKind::If(i) => self.lower_if_value(module, cx, i, span),
            ExprKind::Range { .. } => Err(Diagnostic::error(
                "a range `a..b` may appear only in a `for` header or as the argument of `progress`",
                span,
            )),
            ExprKind::Error => Err(Diagnostic::error("invalid expression", span)),
        }
    }

    fn lower_all(&mut self, module: usize, cx: &mut Cx, es: &[Expr]) -> R<Vec<NodeId>> {
        es.iter().map(|e| self.lower_expr(module, cx, e)).collect()
    }

    fn module_member_value(
        &mut self,
        target: usize,
        alias: &str,
        name: &ast::Ident,
        span: Span,
    ) -> R<NodeId> {
        let Some(i) = self.mods[target].fns.get(&name.name).copied() else {
            return Err(Diagnostic::error(
                format!("module `{alias}` has no function `{}`", name.name),
                name.span,
            ));
        };
        let key = FnKey {
            module: target,
            item: i,
        };
        if self.effectful.contains(&key) {
            return Err(effectful_value_error(&name.name, span));
        }
        let g = self.fn_graph(key);
        Ok(self.graph_ref(g, span))
    }

    fn lower_name(&mut self, module: usize, cx: &mut Cx, n: &str, span: Span) -> R<NodeId> {
        match self.lookup(n).cloned() {
            Some(Binding::Val(v)) => return Ok(v),
            Some(Binding::Var(v)) => {
                return cx.vals.get(&v).copied().ok_or_else(|| {
                    Diagnostic::error(format!("variable `{n}` is not available here"), span)
                })
            }
            Some(Binding::LocalFn(f)) => {
                if f.effectful {
                    return Err(effectful_value_error(n, span));
                }
                return Ok(self.graph_ref(f.graph, span));
            }
            None => {}
        }
        if let Some(key) = self.global_fn(module, n) {
            if self.effectful.contains(&key) {
                return Err(effectful_value_error(n, span));
            }
            let g = self.fn_graph(key);
            return Ok(self.graph_ref(g, span));
        }
        if let Some(d) = DType::from_name(n) {
            return Ok(self.konst(Const::DType(d), span));
        }
        if let Some(p) = self.prim_named(module, n) {
            if p.category() == prim::Category::Io {
                return Err(effectful_value_error(n, span));
            }
            let g = self.prim_value(p, span);
            return Ok(self.graph_ref(g, span));
        }
        if self.mods[module].imports.contains_key(n) {
            return Err(Diagnostic::error(
                format!("module `{n}` is not a value; use one of its members, as in `{n}.name`"),
                span,
            ));
        }
        if DIFF_NAMES.contains(&n) {
            return Err(Diagnostic::error(
                format!("`{n}` must be called with the function to differentiate, as in `{n}(f)`"),
                span,
            ));
        }
        Err(self.unknown_name(module, n, span))
    }

    fn unknown_name(&self, module: usize, n: &str, span: Span) -> Diagnostic {
        let mut d = Diagnostic::error(format!("unknown name `{n}`"), span)
            .with_label("not found in this scope");
        let mut candidates: Vec<String> = self
            .scopes
            .iter()
            .flat_map(|s| s.iter().map(|(k, _)| k.clone()))
            .collect();
        candidates.extend(self.mods[module].fns.keys().cloned());
        if let Some(p) = self.prelude {
            candidates.extend(self.mods[p].fns.keys().cloned());
        }
        // Only the primitives this module may call: suggesting an internal
        // one (`cast`, `gadd`) would name something the user cannot use.
        candidates.extend(
            Prim::all()
                .iter()
                .filter(|p| self.prim_named(module, p.name()).is_some())
                .map(|p| p.name().to_string()),
        );
        if let Some(best) = candidates
            .iter()
            .filter(|c| edit_distance(c, n) <= 2.min(n.len().saturating_sub(1)).max(1))
            .min_by_key(|c| edit_distance(c, n))
        {
            d = d.with_note(format!("a similar name exists: `{best}`"));
        }
        d
    }

    /// A graph that calls primitive `p` with its required parameters, used
    /// when a primitive is passed as a value (`tree_map(exp, t)`).
    fn prim_value(&mut self, p: Prim, span: Span) -> GraphId {
        if let Some(g) = self.prim_values.get(&p) {
            return *g;
        }
        let info = p.info();
        let g = self.m.add_graph(format!("prim.{}", info.name), Loc::NONE);
        let mut args = Vec::new();
        for param in info.params {
            match param.default {
                None => args.push(self.m.add_param(g, param.name, Loc::NONE)),
                Some(d) => args.push(self.m.add_const(default_const(d), Loc::NONE)),
            }
        }
        let out = self.m.add_prim(g, p, &args, loc(span));
        self.m.set_output(g, out);
        self.prim_values.insert(p, g);
        g
    }

    fn lower_lambda(
        &mut self,
        module: usize,
        cx: &mut Cx,
        params: &[ast::Param],
        body: &Expr,
        span: Span,
    ) -> R<NodeId> {
        let parent = self.m.graph(cx.graph).name.clone();
        let base = parent.split('.').next().unwrap_or(&parent).to_string();
        let g = self.m.add_graph(format!("{base}.lambda"), loc(span));
        let def = FnDef {
            name: ast::Ident {
                name: "lambda".into(),
                span,
            },
            params: params.to_vec(),
            ret: None,
            body: body.clone(),
            span,
        };
        self.lower_fn_body(module, g, &def, false, cx.vals.clone())?;
        Ok(self.graph_ref(g, span))
    }

    // ----- calls ---------------------------------------------------------

    fn lower_call(
        &mut self,
        module: usize,
        cx: &mut Cx,
        callee: &Expr,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        match &*callee.kind {
            ExprKind::Name(n) => match self.lookup(n).cloned() {
                Some(Binding::LocalFn(f)) => {
                    let g = f.graph;
                    let effectful = f.effectful;
                    return self.call_def(module, cx, g, &f.def, effectful, args, span);
                }
                Some(_) => {}
                None => {
                    if let Some(key) = self.global_fn(module, n) {
                        let g = self.fn_graph(key);
                        let def = self.fn_def(key);
                        let eff = self.effectful.contains(&key);
                        return self.call_def(module, cx, g, &def, eff, args, span);
                    }
                    if let Some(d) = DType::from_name(n) {
                        let x = self.positional_only(module, cx, args, 1, n, span)?;
                        let dt = self.konst(Const::DType(d), callee.span);
                        return Ok(self.prim(cx, Prim::Cast, &[x[0], dt], span));
                    }
                    if DIFF_NAMES.contains(&n.as_str()) {
                        return self.lower_diff(module, cx, n, args, span);
                    }
                    if let Some(p) = self.prim_named(module, n) {
                        return self.call_prim(module, cx, p, args, span);
                    }
                    if n == "progress" {
                        return Err(Diagnostic::error(
                            "`progress(a..b)` may appear only as the range of a `for` loop",
                            span,
                        ));
                    }
                }
            },
            ExprKind::Field { base, name } => {
                if let ExprKind::Name(m) = &*base.kind {
                    if self.lookup(m).is_none() {
                        if let Some(target) = self.mods[module].imports.get(m).copied() {
                            let Some(i) = self.mods[target].fns.get(&name.name).copied() else {
                                return Err(Diagnostic::error(
                                    format!("module `{m}` has no function `{}`", name.name),
                                    name.span,
                                ));
                            };
                            let key = FnKey {
                                module: target,
                                item: i,
                            };
                            let g = self.fn_graph(key);
                            let def = self.fn_def(key);
                            let eff = self.effectful.contains(&key);
                            return self.call_def(module, cx, g, &def, eff, args, span);
                        }
                    }
                }
            }
            _ => {}
        }
        // `grad(f)(x, k = ..)`: the gradient takes f's parameters, so its
        // call resolves keywords and defaults against f's definition.
        if let ExprKind::Call {
            callee: inner,
            args: inner_args,
        } = &*callee.kind
        {
            if let ExprKind::Name(d) = &*inner.kind {
                let is_grad = (d == "grad" || d == "value_and_grad") && self.lookup(d).is_none();
                if let (true, Some(first)) = (is_grad, inner_args.first()) {
                    if let Some(def) = self.static_fn_def(module, &first.value) {
                        let g = self.lower_expr(module, cx, callee)?;
                        let Some(Const::Graph(target)) = self.m.as_const(g).cloned() else {
                            unreachable!("grad(..) lowers to a graph constant")
                        };
                        return self.call_def(module, cx, target, &def, false, args, span);
                    }
                }
            }
        }
        let f = self.lower_expr(module, cx, callee)?;
        let mut vals = Vec::new();
        for a in args {
            if let Some(k) = &a.name {
                return Err(Diagnostic::error(
                    format!(
                        "keyword argument `{}` needs a function known by name; \
                         this call goes through a value",
                        k.name
                    ),
                    k.span,
                ));
            }
            vals.push(self.lower_expr(module, cx, &a.value)?);
        }
        self.call(cx, f, vals, false, span)
    }

    /// `grad(f, argnums = ..)`, `value_and_grad(f, ..)` (function values),
    /// `vjp(f, x..)` and `jvp(f, (x..), (dx..))` (calls).
    fn lower_diff(
        &mut self,
        module: usize,
        cx: &mut Cx,
        which: &str,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        let Some(first) = args.first().filter(|a| a.name.is_none()) else {
            return Err(Diagnostic::error(
                format!("`{which}` needs the function to differentiate as its first argument"),
                span,
            ));
        };
        let target_fn = self.resolve_fn(module, cx, &first.value)?;
        let mut argnums = None;
        let mut rest = Vec::new();
        for a in &args[1..] {
            match &a.name {
                Some(k) if k.name == "argnums" && which != "vjp" && which != "jvp" => {
                    argnums = Some(static_ints(&a.value)?);
                }
                Some(k) => {
                    return Err(Diagnostic::error(
                        format!("`{which}` has no parameter named `{}`", k.name),
                        k.span,
                    ))
                }
                None => rest.push(a),
            }
        }
        let kind = match which {
            "grad" | "value_and_grad" => {
                if !rest.is_empty() {
                    return Err(Diagnostic::error(
                        format!("`{which}(f)` takes only the function; call the result: `{which}(f)(x)`"),
                        span,
                    ));
                }
                AdKind::Grad {
                    argnums: argnums.clone(),
                    with_value: which == "value_and_grad",
                }
            }
            "vjp" => AdKind::Vjp,
            _ => {
                if rest.len() != 2 {
                    return Err(Diagnostic::error(
                        "`jvp` takes the function, a tuple of primals and a tuple of tangents",
                        span,
                    ));
                }
                AdKind::Jvp
            }
        };
        let (source, name) = match target_fn {
            DiffTarget::Static(g, name) => (g, name),
            DiffTarget::Value(f) => {
                // A function value: differentiated when the program runs.
                self.dynamic_ad = true;
                let nums = argnums
                    .iter()
                    .flatten()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                let args = [
                    f,
                    self.konst(Const::Str(which.into()), span),
                    self.konst(Const::Str(nums.into()), span),
                    self.konst(Const::Int(0), span),
                ];
                let d = self.m.add_prim(cx.graph, Prim::AdDyn, &args, loc(span));
                if which == "grad" || which == "value_and_grad" {
                    return Ok(d);
                }
                let mut vals = Vec::new();
                for a in rest {
                    vals.push(self.lower_expr(module, cx, &a.value)?);
                }
                return self.call(cx, d, vals, false, span);
            }
        };
        let target = self.m.add_graph(format!("{which}.{name}"), loc(span));
        self.ad_requests.push(AdRequest {
            target,
            source,
            kind,
            loc: loc(span),
            name,
        });
        let callee = self.graph_ref(target, span);
        if which == "grad" || which == "value_and_grad" {
            return Ok(callee);
        }
        let mut vals = Vec::new();
        for a in rest {
            vals.push(self.lower_expr(module, cx, &a.value)?);
        }
        self.call(cx, callee, vals, false, span)
    }

    /// The definition of a function named by `e`, when it is one (for
    /// keyword arguments and defaults).
    fn static_fn_def(&self, module: usize, e: &Expr) -> Option<Rc<FnDef>> {
        let ExprKind::Name(n) = &*e.kind else {
            return None;
        };
        match self.lookup(n) {
            Some(Binding::LocalFn(f)) => Some(f.def.clone()),
            Some(_) => None,
            None => self.global_fn(module, n).map(|k| self.fn_def(k)),
        }
    }

    /// What `grad(e)` differentiates: the graph of a function known at
    /// compile time (a function name, a lambda, a module member, another
    /// `grad(..)`), or else the function value `e` evaluates to.
    fn resolve_fn(&mut self, module: usize, cx: &mut Cx, e: &Expr) -> R<DiffTarget> {
        let io = |n: &str| {
            let mut d = Diagnostic::error(
                format!("IO inside differentiated code: `{n}` prints or reads/writes files"),
                e.span,
            )
            .with_note("move the IO out of the function that is differentiated");
            // Show the IO itself when the function is a global one.
            if let Some(def) = self.global_fn(module, n).map(|k| self.fn_def(k)) {
                if let Some(at) = first_io_call(&def.body) {
                    d = d.with_secondary(at, "the IO happens here");
                }
            }
            d
        };
        match &*e.kind {
            ExprKind::Name(n) => {
                match self.lookup(n).cloned() {
                    Some(Binding::LocalFn(f)) => {
                        if f.effectful {
                            return Err(io(n));
                        }
                        return Ok(DiffTarget::Static(f.graph, n.clone()));
                    }
                    Some(Binding::Val(v)) => {
                        return Ok(match self.m.as_const(v) {
                            Some(Const::Graph(g)) => DiffTarget::Static(*g, n.clone()),
                            _ => DiffTarget::Value(v),
                        })
                    }
                    Some(Binding::Var(v)) => {
                        return match cx.vals.get(&v).copied() {
                            Some(x) => Ok(match self.m.as_const(x) {
                                Some(Const::Graph(g)) => DiffTarget::Static(*g, n.clone()),
                                _ => DiffTarget::Value(x),
                            }),
                            None => Ok(DiffTarget::Value(self.lower_expr(module, cx, e)?)),
                        }
                    }
                    None => {}
                }
                if let Some(key) = self.global_fn(module, n) {
                    if self.effectful.contains(&key) {
                        return Err(io(n));
                    }
                    return Ok(DiffTarget::Static(self.fn_graph(key), n.clone()));
                }
                if let Some(p) = self.prim_named(module, n) {
                    if p.category() != prim::Category::Io {
                        return Ok(DiffTarget::Static(self.prim_value(p, e.span), n.clone()));
                    }
                    return Err(io(n));
                }
                Err(self.unknown_name(module, n, e.span))
            }
            ExprKind::Field { .. } | ExprKind::Lambda { .. } | ExprKind::Call { .. } => {
                let node = self.lower_expr(module, cx, e)?;
                let name = match &*e.kind {
                    ExprKind::Field { name, .. } => name.name.clone(),
                    ExprKind::Lambda { .. } => "lambda".to_string(),
                    _ => "fn".to_string(),
                };
                Ok(match self.m.as_const(node) {
                    Some(Const::Graph(g)) => DiffTarget::Static(*g, name),
                    _ => DiffTarget::Value(node),
                })
            }
            _ => Ok(DiffTarget::Value(self.lower_expr(module, cx, e)?)),
        }
    }

    fn positional_only(
        &mut self,
        module: usize,
        cx: &mut Cx,
        args: &[ast::Arg],
        n: usize,
        what: &str,
        span: Span,
    ) -> R<Vec<NodeId>> {
        if args.len() != n || args.iter().any(|a| a.name.is_some()) {
            return Err(Diagnostic::error(
                format!(
                    "`{what}` takes {n} positional argument{}, got {}",
                    if n == 1 { "" } else { "s" },
                    args.len()
                ),
                span,
            ));
        }
        args.iter()
            .map(|a| self.lower_expr(module, cx, &a.value))
            .collect()
    }

    /// A direct call of a function known by name: keyword arguments and
    /// defaults are resolved against its definition.
    #[allow(clippy::too_many_arguments)]
    fn call_def(
        &mut self,
        module: usize,
        cx: &mut Cx,
        g: GraphId,
        def: &FnDef,
        effectful: bool,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        let name = &def.name.name;
        let mut slots: Vec<Option<NodeId>> = vec![None; def.params.len()];
        let mut positional = 0;
        if let Some(bad) = positional_after_keyword(args) {
            return Err(bad);
        }
        for a in args {
            let idx = match &a.name {
                None => {
                    if positional >= def.params.len() {
                        return Err(Diagnostic::error(
                            format!(
                                "`{name}` takes {} argument{}, got {}",
                                def.params.len(),
                                if def.params.len() == 1 { "" } else { "s" },
                                args.len()
                            ),
                            span,
                        )
                        .with_secondary(def.name.span, "defined here"));
                    }
                    positional += 1;
                    positional - 1
                }
                Some(k) => match def.params.iter().position(|p| p.name.name == k.name) {
                    Some(i) => i,
                    None => {
                        return Err(Diagnostic::error(
                            format!("`{name}` has no parameter named `{}`", k.name),
                            k.span,
                        )
                        .with_secondary(def.name.span, "defined here"))
                    }
                },
            };
            if slots[idx].is_some() {
                return Err(Diagnostic::error(
                    format!("argument `{}` is given twice", def.params[idx].name.name),
                    a.span,
                ));
            }
            slots[idx] = Some(self.lower_expr(module, cx, &a.value)?);
        }
        let mut vals = Vec::new();
        for (i, s) in slots.into_iter().enumerate() {
            match s {
                Some(v) => vals.push(v),
                None => match &def.params[i].default {
                    Some(d) => vals.push(self.lower_expr(module, cx, d)?),
                    None => {
                        return Err(Diagnostic::error(
                            format!(
                                "missing argument `{}` in call to `{name}`",
                                def.params[i].name.name
                            ),
                            span,
                        )
                        .with_secondary(def.name.span, "defined here"))
                    }
                },
            }
        }
        let callee = self.graph_ref(g, span);
        self.call(cx, callee, vals, effectful, span)
    }

    fn call_prim(
        &mut self,
        module: usize,
        cx: &mut Cx,
        p: Prim,
        args: &[ast::Arg],
        span: Span,
    ) -> R<NodeId> {
        let info = p.info();
        let is_io = info.category == prim::Category::Io;
        // The IO token is supplied here, not by the caller.
        let params: Vec<_> = info.params.iter().skip(usize::from(is_io)).collect();
        let mut slots: Vec<Option<NodeId>> = vec![None; params.len()];
        let mut extra = Vec::new();
        let mut positional = 0;
        if let Some(bad) = positional_after_keyword(args) {
            return Err(bad);
        }
        for a in args {
            match &a.name {
                None => {
                    if positional < params.len() {
                        slots[positional] = Some(self.lower_expr(module, cx, &a.value)?);
                    } else if info.variadic {
                        extra.push(self.lower_expr(module, cx, &a.value)?);
                    } else {
                        return Err(Diagnostic::error(
                            format!(
                                "`{}` takes at most {} argument{}, got {}",
                                info.name,
                                params.len(),
                                if params.len() == 1 { "" } else { "s" },
                                args.len()
                            ),
                            span,
                        ));
                    }
                    positional += 1;
                }
                Some(k) => {
                    let Some(i) = params.iter().position(|q| q.name == k.name) else {
                        let names: Vec<_> = params.iter().map(|q| q.name).collect();
                        return Err(Diagnostic::error(
                            format!("`{}` has no parameter named `{}`", info.name, k.name),
                            k.span,
                        )
                        .with_note(format!("its parameters are: {}", names.join(", "))));
                    };
                    if slots[i].is_some() {
                        return Err(Diagnostic::error(
                            format!("argument `{}` is given twice", k.name),
                            a.span,
                        ));
                    }
                    slots[i] = Some(self.lower_expr(module, cx, &a.value)?);
                }
            }
        }
        let mut vals = Vec::new();
        for (i, s) in slots.into_iter().enumerate() {
            match s {
                Some(v) => vals.push(v),
                None => match params[i].default {
                    Some(d) => vals.push(self.konst(default_const(d), span)),
                    None => {
                        return Err(Diagnostic::error(
                            format!(
                                "missing argument `{}` in call to `{}`",
                                params[i].name, info.name
                            ),
                            span,
                        ))
                    }
                },
            }
        }
        vals.extend(extra);
        if !is_io {
            return Ok(self.prim(cx, p, &vals, span));
        }
        let io_var = self.io_var(cx, span)?;
        let mut all = vec![cx.vals[&io_var]];
        all.extend(vals);
        let r = self.prim(cx, p, &all, span);
        if p.returns_io_pair() {
            let io = self.tuple_get(cx, r, 0, span);
            cx.vals.insert(io_var, io);
            Ok(self.tuple_get(cx, r, 1, span))
        } else {
            cx.vals.insert(io_var, r);
            Ok(self.unit(span))
        }
    }
}

fn binop_prim(op: ast::BinOp) -> Prim {
    use ast::BinOp::*;
    match op {
        Add => Prim::Add,
        Sub => Prim::Sub,
        Mul => Prim::Mul,
        Div => Prim::Div,
        Rem => Prim::Rem,
        Pow => Prim::Pow,
        MatMul => Prim::Matmul,
        Eq => Prim::Eq,
        Ne => Prim::Ne,
        Lt => Prim::Lt,
        Le => Prim::Le,
        Gt => Prim::Gt,
        Ge => Prim::Ge,
        And => Prim::And,
        Or => Prim::Or,
    }
}

fn default_const(d: prim::Default) -> Const {
    match d {
        prim::Default::Unit => Const::Unit,
        prim::Default::Bool(b) => Const::Bool(b),
        prim::Default::Int(i) => Const::Int(i),
    }
}

/// The span of the first call of an IO primitive in `body` (not inside
/// lambdas).
fn first_io_call(body: &Expr) -> Option<Span> {
    let mut found = None;
    scan::walk_expr(body, true, &mut |v| {
        if let scan::Visit::Expr(x) = v {
            if let ExprKind::Call { callee, .. } = &*x.kind {
                if let ExprKind::Name(n) = &*callee.kind {
                    if found.is_none() && is_io_name(n) {
                        found = Some(x.span);
                    }
                }
            }
        }
    });
    found
}

/// A positional argument after a keyword argument, as in `f(b = 2, 1)`.
fn positional_after_keyword(args: &[ast::Arg]) -> Option<Diagnostic> {
    let first_kw = args.iter().position(|a| a.name.is_some())?;
    let bad = args[first_kw..].iter().find(|a| a.name.is_none())?;
    Some(
        Diagnostic::error("positional argument after a keyword argument", bad.span)
            .with_secondary(args[first_kw].span, "keyword arguments start here")
            .with_note("write positional arguments first"),
    )
}

/// `argnums = 1` or `argnums = (0, 2)`: ints written in the source.
fn static_ints(e: &Expr) -> R<Vec<usize>> {
    let one = |x: &Expr| match &*x.kind {
        ExprKind::Int(i) if *i >= 0 => Ok(*i as usize),
        _ => Err(Diagnostic::error(
            "argnums must be written as an int or a tuple of ints",
            x.span,
        )),
    };
    match &*e.kind {
        ExprKind::Tuple(items) => items.iter().map(one).collect(),
        _ => Ok(vec![one(e)?]),
    }
}

fn is_io_name(n: &str) -> bool {
    Prim::from_name(n).is_some_and(|p| p.category() == prim::Category::Io)
}

fn effectful_value_error(n: &str, span: Span) -> Diagnostic {
    Diagnostic::error(
        format!("`{n}` performs IO and cannot be used as a value"),
        span,
    )
    .with_note("functions that print or read/write files can only be called directly by name")
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string().to_lowercase(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}
