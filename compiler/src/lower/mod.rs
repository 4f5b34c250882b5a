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

mod einsum;
mod expr;
mod modules;
mod scan;
mod stmt;
mod vmap;

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
/// How a transformed function will be called (see
/// [`Lowerer::resolve_fn_called`]).
#[derive(Clone, Copy, Debug)]
enum Called {
    /// With every parameter of the function's definition.
    AsDefined,
    /// With this many positional arguments, when known.
    With(Option<usize>),
}

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
    /// Graphs that take the parameters of a definition with defaults: its
    /// own (a global function) and `grad`s of it. A call of one that is
    /// known when lowering (`let g = grad(f); g(x)`, `grad(grad(f))(x)`)
    /// fills defaults and keywords as a direct call of the function would.
    /// The key of a global function (whose IO decides how it is called).
    with_defaults: HashMap<GraphId, (Rc<FnDef>, Option<FnKey>)>,
    pending: Vec<(FnKey, GraphId)>,
    prim_values: HashMap<Prim, GraphId>,
    scopes: Vec<Vec<(String, Binding)>>,
    vars: Vec<VarInfo>,
    next_fn_id: u32,
    diags: Vec<Diagnostic>,
    effectful_graphs: HashSet<GraphId>,
    depth: usize,
    checks: Vec<Check>,
    /// The values each function being lowered returns (innermost last),
    /// with where, and whether a `return` statement gives it.
    returns: Vec<Vec<(NodeId, Span, bool)>>,
    /// Set by a `return` statement for the `finish` it calls.
    explicit_return: bool,
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
        | Prim::IsUnit
        | Prim::IsTuple
        | Prim::Fail
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
            with_defaults: HashMap::new(),
            pending: Vec::new(),
            prim_values: HashMap::new(),
            scopes: Vec::new(),
            vars: Vec::new(),
            next_fn_id: 0,
            diags: Vec::new(),
            effectful_graphs: HashSet::new(),
            depth: 0,
            checks: Vec::new(),
            returns: Vec::new(),
            explicit_return: false,
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
        for (i, p) in def.params.iter().enumerate() {
            let first = def.params[..i]
                .iter()
                .find(|q| q.name.name == p.name.name && p.name.name != "_");
            if let Some(q) = first {
                return Err(Diagnostic::error(
                    format!("parameter `{}` is named twice", p.name.name),
                    p.name.span,
                )
                .with_secondary(q.name.span, "first named here")
                .with_note("each parameter needs its own name (`_` may repeat)"));
            }
        }
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
        self.returns.push(Vec::new());
        let r = self.lower_tail(module, &mut cx, Some(&def.body), def.span, &Cont::Return);
        let values = self.returns.pop().unwrap_or_default();
        if values.iter().any(|v| v.2) && values.len() > 1 {
            self.checks.push(Check::Returns { values });
        }
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
        let explicit = std::mem::take(&mut self.explicit_return);
        if let (Cont::Return, Some(values)) = (k, self.returns.last_mut()) {
            values.push((value, span, explicit));
        }
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

/// `argnums = 1` (that argument's gradient alone, as in JAX) or
/// `argnums = (0, 2)` (a tuple of gradients): ints written in the source.
fn static_argnums(e: &Expr) -> R<crate::ad::Argnums> {
    let one = |x: &Expr| match &*x.kind {
        ExprKind::Int(i) if *i >= 0 => Ok(*i as usize),
        _ => Err(Diagnostic::error(
            "argnums must be written as an int or a tuple of ints",
            x.span,
        )),
    };
    match &*e.kind {
        ExprKind::Tuple(items) => items
            .iter()
            .map(one)
            .collect::<R<_>>()
            .map(crate::ad::Argnums::Many),
        _ => one(e).map(crate::ad::Argnums::One),
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
