//! The abstract syntax tree. Every node carries a [`Span`].
//!
//! **Depth invariant.** The parser guarantees that an expression tree is at
//! most [`MAX_EXPR_DEPTH`] levels deep (counting every node, blocks and
//! statements included) and that brackets nest at most
//! [`MAX_NESTING`](crate::parser::MAX_NESTING) levels, so recursive passes
//! over a parsed AST (and its recursive `Drop`) cannot overflow the stack.
//! A deeper expression — e.g. `a + a + … + a` with 10^5 terms, a
//! left-deep tree — is reported as `expression is nested too deeply` and
//! the offending subtree is replaced by [`ExprKind::Error`].

use crate::span::Span;

/// The maximum depth of an expression tree built by the parser.
pub const MAX_EXPR_DEPTH: u32 = 256;

/// A name with its location.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    /// The name.
    pub name: String,
    /// Where it is written.
    pub span: Span,
}

/// One source file: a list of items.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    /// The items in source order. Items that failed to parse are left out.
    pub items: Vec<Item>,
}

/// A top-level item.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// `fn name(params) -> ret { .. }` or `fn name(params) = expr;`
    Fn(FnDef),
    /// `bprop name(x, y, out, dout) { .. }` or `= expr;`: the reverse rule of
    /// function `name`. Same shape as a function (its `ret` is normally
    /// `None`).
    Bprop(FnDef),
    /// `import nn`, `import "layers.adj" as ly`
    Import(Import),
}

impl Item {
    /// The span of the whole item.
    pub fn span(&self) -> Span {
        match self {
            Item::Fn(f) | Item::Bprop(f) => f.span,
            Item::Import(i) => i.span,
        }
    }
}

/// `import nn` / `import "layers.adj" as ly`.
#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    /// What is imported.
    pub module: ImportPath,
    /// The `as` name, if given.
    pub alias: Option<Ident>,
    /// The whole item.
    pub span: Span,
}

/// The target of an `import`.
#[derive(Clone, Debug, PartialEq)]
pub enum ImportPath {
    /// A standard-library module by name: `import nn`.
    Name(Ident),
    /// A file, relative to the importing file: `import "layers.adj"`.
    File {
        /// The path as written (escapes decoded).
        path: String,
        /// The string literal.
        span: Span,
    },
}

/// A function (also a `bprop` rule or a local `fn` statement).
#[derive(Clone, Debug, PartialEq)]
pub struct FnDef {
    /// The function's name.
    pub name: Ident,
    /// Parameters in order.
    pub params: Vec<Param>,
    /// The return type annotation after `->`.
    pub ret: Option<TypeExpr>,
    /// The body: an [`ExprKind::Block`] for `{ .. }` bodies, any expression
    /// for `= expr` bodies.
    pub body: Expr,
    /// From `fn`/`bprop` to the end of the body (or its `;`).
    pub span: Span,
}

/// A function or lambda parameter: `x`, `n: i64`, `lr = 0.01`,
/// `lr: f32 = 0.01`.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// The parameter's name (may be `_`).
    pub name: Ident,
    /// Its annotation.
    pub ty: Option<TypeExpr>,
    /// Its default value (never set for lambda parameters).
    pub default: Option<Expr>,
    /// The whole parameter.
    pub span: Span,
}

/// A type annotation.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr {
    /// What kind of type.
    pub kind: TypeKind,
    /// Where it is written.
    pub span: Span,
}

/// The kinds of type annotation.
#[derive(Clone, Debug, PartialEq)]
pub enum TypeKind {
    /// `f32` (dims `None`: any shape), `f32[]` (a scalar, dims `Some([])`),
    /// `f32[3, 4]`. The dtype name is not checked by the parser.
    Tensor {
        /// `f32`, `f64`, `i32`, `i64`, `bool`, `u8` (unchecked here).
        dtype: Ident,
        /// The static shape, if written.
        dims: Option<Vec<i64>>,
    },
    /// `(f64, f64)`, `(f32,)`, `()`.
    Tuple(Vec<TypeExpr>),
    /// `{ w: f32[4, 3], b: f32[3] }`.
    Record(Vec<(Ident, TypeExpr)>),
}

/// A binding pattern (`let`, `for`) or an assignment target.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    /// What kind of pattern.
    pub kind: PatternKind,
    /// Where it is written.
    pub span: Span,
}

/// The kinds of pattern.
#[derive(Clone, Debug, PartialEq)]
pub enum PatternKind {
    /// Binds (or, as an assignment target, reassigns) a name.
    Name(String),
    /// `mut name` in a tuple pattern: binds a variable later statements
    /// may reassign (`let (mut a, b) = ..`). Never an assignment target.
    MutName(String),
    /// `_`: matches and discards.
    Wildcard,
    /// `(a, b)`, `(a,)`, `()`.
    Tuple(Vec<Pattern>),
    /// `{ w, b: bias }` — a field without a pattern binds its own name.
    /// Never an assignment target.
    Record(Vec<FieldPattern>),
}

/// One field of a record pattern.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldPattern {
    /// The field name.
    pub name: Ident,
    /// The sub-pattern after `:`; `None` for punning (`{ w }` binds `w`).
    pub pattern: Option<Pattern>,
    /// The whole field.
    pub span: Span,
}

/// An expression. The kind is boxed so `Expr` stays small.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// What kind of expression.
    pub kind: Box<ExprKind>,
    /// Where it is written (parentheses around it are not included).
    pub span: Span,
    depth: u32,
}

/// Unary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// `-x`
    Neg,
    /// `!x`
    Not,
}

impl UnOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            UnOp::Neg => "-",
            UnOp::Not => "!",
        }
    }
}

/// Binary operators (and the `op` of compound assignments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
    /// `**`
    Pow,
    /// `@`
    MatMul,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `&&`
    And,
    /// `||`
    Or,
}

impl BinOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Pow => "**",
            BinOp::MatMul => "@",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }

    /// Whether this is one of `== != < <= > >=`.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }
}

/// A call argument: positional (`x`) or keyword (`lr = 0.1`).
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// The keyword, if any.
    pub name: Option<Ident>,
    /// The value.
    pub value: Expr,
    /// The whole argument.
    pub span: Span,
}

/// One component of an index: `x[i]`, `x[1:3]`, `x[:, 0]`.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexComp {
    /// A single index (drops the dimension).
    Expr(Expr),
    /// `lo:hi`, either bound may be omitted.
    Slice {
        /// The start, if written.
        lo: Option<Expr>,
        /// The end (exclusive), if written.
        hi: Option<Expr>,
        /// The whole component.
        span: Span,
    },
}

/// One field of a record expression: `w: w0`.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordField {
    /// The field name.
    pub name: Ident,
    /// Its value.
    pub value: Expr,
    /// The whole field.
    pub span: Span,
}

/// `if cond { .. } else ..`.
#[derive(Clone, Debug, PartialEq)]
pub struct IfExpr {
    /// The condition.
    pub cond: Expr,
    /// The block run when it holds.
    pub then: Block,
    /// The `else` branch.
    pub else_: Option<Else>,
}

/// The `else` branch of an `if`.
#[derive(Clone, Debug, PartialEq)]
pub enum Else {
    /// `else { .. }`
    Block(Block),
    /// `else if ..`: the expression's kind is always [`ExprKind::If`].
    If(Expr),
}

/// A block `{ stmt; ...; tail }`.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// The statements.
    pub stmts: Vec<Stmt>,
    /// The final expression, whose value is the block's; `None` means `()`.
    /// A trailing `if` or block without `;` is the tail (`{ if c {a} else
    /// {b} }` has the `if` as its tail), as in Rust.
    pub tail: Option<Expr>,
    /// From `{` to `}`.
    pub span: Span,
}

/// The kinds of expression.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// An integer literal (weakly typed).
    Int(i64),
    /// A float literal (weakly typed).
    Float {
        /// The parsed value.
        value: f64,
        /// The literal as written (`1e-3`, `.5`).
        text: String,
    },
    /// `true` / `false`.
    Bool(bool),
    /// A string literal, escapes decoded.
    Str(String),
    /// A variable, function or module name.
    Name(String),
    /// `()`, `(a,)`, `(a, b)`.
    Tuple(Vec<Expr>),
    /// `{ w: w0, b: b0 }` (at least one field; `{}` is an empty block).
    Record(Vec<RecordField>),
    /// A tensor literal `[1.0, 2.0]`, `[[1, 2], [3, 4]]`, `[]`.
    Tensor(Vec<Expr>),
    /// `-x`, `!x`.
    Unary {
        /// The operator.
        op: UnOp,
        /// The operand.
        operand: Expr,
    },
    /// `a + b` etc. (not `..`, see [`ExprKind::Range`]).
    Binary {
        /// The operator.
        op: BinOp,
        /// Where the operator is written.
        op_span: Span,
        /// Left operand.
        lhs: Expr,
        /// Right operand.
        rhs: Expr,
    },
    /// `f(x, lr = 0.1)`. Module members are calls of a field:
    /// `nn.dense(p, x)` has callee `Field { base: Name("nn"), name: dense }`.
    Call {
        /// What is called.
        callee: Expr,
        /// The arguments in order.
        args: Vec<Arg>,
    },
    /// `x[i]`, `x[i, j]`, `x[1:3]`, `x[:, :3]` (at least one component).
    Index {
        /// What is indexed.
        base: Expr,
        /// One component per indexed dimension.
        indices: Vec<IndexComp>,
    },
    /// `p.w` (also `nn.dense`).
    Field {
        /// The record (or module).
        base: Expr,
        /// The field.
        name: Ident,
    },
    /// `t.0`.
    TupleIndex {
        /// The tuple.
        base: Expr,
        /// The element number.
        index: u32,
        /// Where the number is written.
        index_span: Span,
    },
    /// `|x, y| body`, `|| body`. Parameters have no defaults.
    Lambda {
        /// The parameters.
        params: Vec<Param>,
        /// The body.
        body: Expr,
    },
    /// `{ .. }` used as an expression.
    Block(Block),
    /// `if c { .. } else { .. }`.
    If(IfExpr),
    /// `lo..hi`. The parser produces it only as a call argument (for
    /// `progress(a..b)`); in a `for` header it becomes [`ForIter::Range`]
    /// or [`ForIter::Progress`].
    Range {
        /// Start (inclusive).
        lo: Expr,
        /// End (exclusive).
        hi: Expr,
    },
    /// A placeholder left where an error was reported (the parse produced
    /// at least one error diagnostic).
    Error,
}

impl Expr {
    /// A new expression node. Its depth is computed from its children.
    pub fn new(kind: ExprKind, span: Span) -> Expr {
        let depth = 1 + kind_depth(&kind);
        Expr {
            kind: Box::new(kind),
            span,
            depth,
        }
    }

    /// An [`ExprKind::Error`] placeholder.
    pub fn error(span: Span) -> Expr {
        Expr::new(ExprKind::Error, span)
    }

    /// The height of the tree below and including this node (a leaf is 1).
    /// Computed at construction; not updated if `kind` is mutated later.
    pub fn depth(&self) -> u32 {
        self.depth
    }
}

fn max_depth<'a>(exprs: impl IntoIterator<Item = &'a Expr>) -> u32 {
    exprs.into_iter().map(|e| e.depth).max().unwrap_or(0)
}

/// The depth of a block: 1 + the deepest expression in it.
pub(crate) fn block_depth(b: &Block) -> u32 {
    let mut d = b.tail.as_ref().map_or(0, |e| e.depth);
    for s in &b.stmts {
        d = d.max(stmt_depth(s));
    }
    d + 1
}

fn fn_depth(f: &FnDef) -> u32 {
    let params = f.params.iter().filter_map(|p| p.default.as_ref());
    1 + f.body.depth.max(max_depth(params))
}

pub(crate) fn stmt_depth(s: &Stmt) -> u32 {
    1 + match &s.kind {
        StmtKind::Let { value, .. } => value.depth,
        StmtKind::Assign { value, .. } => value.depth,
        StmtKind::Expr { expr, .. } => expr.depth,
        StmtKind::Fn(f) => fn_depth(f),
        StmtKind::For { iter, body, .. } => {
            let it = match iter {
                ForIter::Range { lo, hi } | ForIter::Progress { lo, hi, .. } => {
                    lo.depth.max(hi.depth)
                }
                ForIter::Expr(e) => e.depth,
            };
            it.max(block_depth(body))
        }
        StmtKind::While { cond, body } => cond.depth.max(block_depth(body)),
        StmtKind::Break | StmtKind::Continue => 0,
        StmtKind::Return(e) => e.as_ref().map_or(0, |e| e.depth),
    }
}

fn if_depth(i: &IfExpr) -> u32 {
    let e = match &i.else_ {
        None => 0,
        Some(Else::Block(b)) => block_depth(b),
        Some(Else::If(e)) => e.depth,
    };
    i.cond.depth.max(block_depth(&i.then)).max(e)
}

fn kind_depth(kind: &ExprKind) -> u32 {
    match kind {
        ExprKind::Int(_)
        | ExprKind::Float { .. }
        | ExprKind::Bool(_)
        | ExprKind::Str(_)
        | ExprKind::Name(_)
        | ExprKind::Error => 0,
        ExprKind::Tuple(es) | ExprKind::Tensor(es) => max_depth(es),
        ExprKind::Record(fs) => max_depth(fs.iter().map(|f| &f.value)),
        ExprKind::Unary { operand, .. } => operand.depth,
        ExprKind::Binary { lhs, rhs, .. } => lhs.depth.max(rhs.depth),
        ExprKind::Call { callee, args } => {
            callee.depth.max(max_depth(args.iter().map(|a| &a.value)))
        }
        ExprKind::Index { base, indices } => {
            let mut d = base.depth;
            for c in indices {
                match c {
                    IndexComp::Expr(e) => d = d.max(e.depth),
                    IndexComp::Slice { lo, hi, .. } => {
                        d = d.max(max_depth(lo.iter().chain(hi.iter())));
                    }
                }
            }
            d
        }
        ExprKind::Field { base, .. } | ExprKind::TupleIndex { base, .. } => base.depth,
        ExprKind::Lambda { body, .. } => body.depth,
        ExprKind::Block(b) => block_depth(b),
        ExprKind::If(i) => if_depth(i),
        ExprKind::Range { lo, hi } => lo.depth.max(hi.depth),
    }
}

/// A statement inside a block.
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    /// What kind of statement.
    pub kind: StmtKind,
    /// Where it is written (including its `;`).
    pub span: Span,
}

/// The kinds of statement.
#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    /// `let pattern: ty = value;` / `let mut ...`.
    Let {
        /// What is bound.
        pattern: Pattern,
        /// `let mut`.
        mutable: bool,
        /// The annotation.
        ty: Option<TypeExpr>,
        /// The value.
        value: Expr,
    },
    /// `x = e;`, `(a, b) = e;`, `x += e;` (`op` is `Some(Add)`), `-= *= /=`.
    /// The target is a [`Pattern`] made only of `Name`, `Wildcard` and
    /// `Tuple`.
    Assign {
        /// What is reassigned.
        target: Pattern,
        /// For compound assignment: the operator (`Add Sub Mul Div`).
        op: Option<BinOp>,
        /// The value.
        value: Expr,
    },
    /// An expression statement. `semi` is whether it ended with `;`; an
    /// `if` or block statement may omit it (then `semi == false`). A
    /// block's final `if`/block without `;` is its tail, not a statement.
    Expr {
        /// The expression.
        expr: Expr,
        /// Whether a `;` followed it.
        semi: bool,
    },
    /// A local function `fn f(..) { .. }`: a named, possibly recursive
    /// closure over the enclosing variables.
    Fn(FnDef),
    /// `for pattern in iter { body }`.
    For {
        /// The loop variable(s).
        pattern: Pattern,
        /// What is iterated.
        iter: ForIter,
        /// The body.
        body: Block,
    },
    /// `while cond { body }`.
    While {
        /// The condition.
        cond: Expr,
        /// The body.
        body: Block,
    },
    /// `break;`
    Break,
    /// `continue;`
    Continue,
    /// `return e;` / `return;`.
    Return(Option<Expr>),
}

/// What a `for` loop iterates over.
#[derive(Clone, Debug, PartialEq)]
pub enum ForIter {
    /// `for i in lo..hi`: ints `lo` to `hi - 1`.
    Range {
        /// Start (inclusive).
        lo: Expr,
        /// End (exclusive).
        hi: Expr,
    },
    /// `for i in progress(lo..hi)`: like `Range`, drawing a progress bar.
    Progress {
        /// Start (inclusive).
        lo: Expr,
        /// End (exclusive).
        hi: Expr,
        /// The whole `progress(..)` call.
        span: Span,
    },
    /// `for x in t`: the elements of a tuple.
    Expr(Expr),
}
