//! The parser driver: lexing, the nesting check, the LALRPOP parser, and
//! turning parse errors into readable diagnostics.

use std::cell::Cell;
use std::rc::Rc;

use lalrpop_util::{ErrorRecovery, ParseError};

use crate::ast::*;
use crate::diagnostic::Diagnostic;
use crate::lexer::{self, Spanned, Tok};
use crate::span::{FileId, Span};

lalrpop_util::lalrpop_mod!(
    #[allow(clippy::all, clippy::pedantic, unused_parens, missing_docs)]
    grammar
);

/// Brackets (`(`, `[`, `{`) may nest at most this deep. Deeper input is
/// rejected before parsing with a `nesting too deep` diagnostic.
pub const MAX_NESTING: usize = 200;

/// A syntax error fewer than this many tokens after the previous one is not
/// reported (it is almost always a consequence of the first).
const CASCADE_GAP: usize = 3;

/// At most this many syntax errors are reported per file.
pub const MAX_SYNTAX_ERRORS: usize = 50;

/// One parsed statement slot of a block (grammar-internal).
pub(crate) enum ParsedStmt {
    /// A statement.
    Stmt(Stmt),
    /// An empty statement `;` (it may end a preceding `if`/block statement).
    Semi(usize),
    /// A statement that failed to parse (already reported).
    Error,
}

type Recovery<'input> = ErrorRecovery<usize, Tok<'input>, ()>;

/// Parsing state shared with the grammar actions.
pub(crate) struct Cx<'input> {
    file: FileId,
    /// Errors recovered by the LR parser (`!` in the grammar).
    pub errors: Vec<Recovery<'input>>,
    /// Errors found by grammar actions (chained comparisons, bad
    /// assignment targets, too-deep expressions, …).
    pub diags: Vec<Diagnostic>,
    deep_reported: bool,
    /// Counts grammar actions; the token feed watches it (see [`Feed`]).
    progress: Rc<Cell<u64>>,
}

impl<'input> Cx<'input> {
    fn new(file: FileId) -> Self {
        Cx {
            file,
            errors: Vec::new(),
            diags: Vec::new(),
            deep_reported: false,
            progress: Rc::new(Cell::new(0)),
        }
    }

    /// The span `lo..hi` in the current file.
    pub fn sp(&self, lo: usize, hi: usize) -> Span {
        // nearly every grammar action builds a span: count them as progress
        self.progress.set(self.progress.get() + 1);
        Span::new(self.file, lo as u32, hi.max(lo) as u32)
    }

    /// Builds an expression node, enforcing [`MAX_EXPR_DEPTH`].
    pub fn expr(&mut self, kind: ExprKind, lo: usize, hi: usize) -> Expr {
        let span = self.sp(lo, hi);
        let e = Expr::new(kind, span);
        if e.depth() <= MAX_EXPR_DEPTH {
            return e;
        }
        if !self.deep_reported {
            self.deep_reported = true;
            // point at the start only: the whole expression may be huge
            let at = self.sp(lo, (lo + 1).min(hi));
            self.diags.push(
                Diagnostic::error("expression is nested too deeply", at)
                    .with_label(format!("more than {MAX_EXPR_DEPTH} levels deep"))
                    .with_note("split it into smaller parts with `let` bindings"),
            );
        }
        // Dropping `e` recurses at most MAX_EXPR_DEPTH + 1 levels.
        Expr::error(span)
    }

    /// A binary operation.
    #[allow(clippy::too_many_arguments)]
    pub fn bin(
        &mut self,
        op: BinOp,
        ol: usize,
        oh: usize,
        lhs: Expr,
        rhs: Expr,
        lo: usize,
        hi: usize,
    ) -> Expr {
        let op_span = self.sp(ol, oh);
        self.expr(
            ExprKind::Binary {
                op,
                op_span,
                lhs,
                rhs,
            },
            lo,
            hi,
        )
    }

    /// Reports `a < b < c`.
    pub fn chained_comparison(&mut self, lhs: &Expr, op: BinOp, ol: usize, oh: usize) {
        let mut d = Diagnostic::error("comparison operators cannot be chained", self.sp(ol, oh))
            .with_label(format!("`{}` after another comparison", op.symbol()))
            .with_note("use `&&`, as in `a < b && b < c`, or add parentheses");
        if let ExprKind::Binary { op_span, .. } = &*lhs.kind {
            d = d.with_secondary(*op_span, "the first comparison");
        }
        self.diags.push(d);
    }

    /// A float literal.
    pub fn float(&mut self, text: &str, lo: usize, hi: usize) -> Expr {
        let clean: String = text.chars().filter(|&c| c != '_').collect();
        let value = clean.parse::<f64>().unwrap_or(f64::NAN);
        self.expr(
            ExprKind::Float {
                value,
                text: text.to_string(),
            },
            lo,
            hi,
        )
    }

    /// `base.<i>`.
    pub fn tuple_index(&mut self, base: Expr, i: i64, il: usize, lo: usize, hi: usize) -> Expr {
        let index_span = self.sp(il, hi);
        let index = match u32::try_from(i) {
            Ok(i) => i,
            Err(_) => {
                self.diags.push(
                    Diagnostic::error("tuple index is too large", index_span)
                        .with_label("not a valid element number"),
                );
                0
            }
        };
        self.expr(
            ExprKind::TupleIndex {
                base,
                index,
                index_span,
            },
            lo,
            hi,
        )
    }

    /// A call; checks that ranges appear only as the argument of
    /// `progress`.
    pub fn call(&mut self, callee: Expr, args: Vec<Arg>, lo: usize, hi: usize) -> Expr {
        let is_progress = matches!(&*callee.kind, ExprKind::Name(n) if n == "progress");
        for a in &args {
            if matches!(&*a.value.kind, ExprKind::Range { .. }) && !is_progress {
                self.diags.push(
                    Diagnostic::error("a range is not allowed here", a.value.span)
                        .with_label("`..` outside a `for` header")
                        .with_note(
                            "a range `a..b` may appear only in a `for` header or as the argument of `progress`",
                        ),
                );
            }
        }
        self.expr(ExprKind::Call { callee, args }, lo, hi)
    }

    /// An index expression (at least one component).
    pub fn index(&mut self, base: Expr, indices: Vec<IndexComp>, lo: usize, hi: usize) -> Expr {
        if indices.is_empty() {
            self.diags.push(
                Diagnostic::error("expected an index, found `]`", self.sp(lo, hi))
                    .with_label("empty index")
                    .with_note("write `x[i]`, `x[i, j]` or a slice such as `x[1:3]`"),
            );
        }
        self.expr(ExprKind::Index { base, indices }, lo, hi)
    }

    /// A name or `_` pattern.
    pub fn name_pattern(&mut self, n: &str, lo: usize, hi: usize) -> Pattern {
        let kind = if n == "_" {
            PatternKind::Wildcard
        } else {
            PatternKind::Name(n.to_string())
        };
        Pattern {
            kind,
            span: self.sp(lo, hi),
        }
    }

    /// A function or `bprop` definition.
    pub fn fn_def(
        &mut self,
        head: (Ident, Vec<Param>, Option<TypeExpr>),
        body: Expr,
        lo: usize,
        hi: usize,
    ) -> FnDef {
        let (name, params, ret) = head;
        FnDef {
            name,
            params,
            ret,
            body,
            span: self.sp(lo, hi),
        }
    }

    /// A statement.
    pub fn stmt(&mut self, kind: StmtKind, lo: usize, hi: usize) -> ParsedStmt {
        ParsedStmt::Stmt(Stmt {
            kind,
            span: self.sp(lo, hi),
        })
    }

    /// A block; a final `if`/block statement without `;` becomes the tail.
    pub fn block(
        &mut self,
        parsed: Vec<ParsedStmt>,
        mut tail: Option<Expr>,
        lo: usize,
        hi: usize,
    ) -> Block {
        let mut stmts: Vec<Stmt> = Vec::with_capacity(parsed.len());
        // Whether the last thing seen is an `if`/block statement that may
        // still become the tail.
        let mut open_tail = false;
        for p in parsed {
            match p {
                ParsedStmt::Stmt(s) => {
                    open_tail = matches!(s.kind, StmtKind::Expr { semi: false, .. });
                    stmts.push(s);
                }
                ParsedStmt::Semi(end) => {
                    if open_tail {
                        // `if c { .. };` — the `;` belongs to the statement
                        if let Some(Stmt {
                            kind: StmtKind::Expr { semi, .. },
                            span,
                        }) = stmts.last_mut()
                        {
                            *semi = true;
                            span.hi = end as u32;
                        }
                    }
                    open_tail = false;
                }
                ParsedStmt::Error => open_tail = false,
            }
        }
        if tail.is_none() && open_tail {
            if let Some(Stmt {
                kind: StmtKind::Expr { expr, .. },
                ..
            }) = stmts.pop()
            {
                tail = Some(expr);
            }
        }
        Block {
            stmts,
            tail,
            span: self.sp(lo, hi),
        }
    }

    /// `target = value;` / `target op= value;`.
    pub fn assign(
        &mut self,
        target: Expr,
        op: Option<BinOp>,
        value: Expr,
        lo: usize,
        hi: usize,
    ) -> ParsedStmt {
        if let Some(stmt) = self.indexed_assign(&target, op, &value, lo, hi) {
            return stmt;
        }
        let target = match (op, to_lvalue(&target)) {
            (None, Some(p)) => p,
            (Some(_), Some(p)) if matches!(p.kind, PatternKind::Name(_)) => p,
            (Some(op), _) => {
                self.diags.push(
                    Diagnostic::error(
                        format!("cannot use `{}=` on this expression", op.symbol()),
                        target.span,
                    )
                    .with_label("not a variable")
                    .with_note("compound assignment needs a `mut` variable: `x += e;`"),
                );
                return ParsedStmt::Error;
            }
            (None, None) => {
                self.diags.push(
                    Diagnostic::error("cannot assign to this expression", target.span)
                        .with_label("not a variable or a tuple of variables")
                        .with_note(
                            "only names, tuples of names and indexed variables can be assigned: `x = e;`, `(a, b) = e;`, `v[i] = e;`",
                        ),
                );
                return ParsedStmt::Error;
            }
        };
        self.stmt(StmtKind::Assign { target, op, value }, lo, hi)
    }

    /// `v[idx] = e;` and `v[idx] op= e;` for a name `v`, as the assignment
    /// `v = v.at[idx].set(e);` (`+=` is `.add(e)`, `-=` `.add(-e)`, `*=`
    /// `.mul(e)`, `/=` `.set(v[idx] / e)`). The update expressions keep the
    /// spans of what was written, so errors point at `v` (an immutable
    /// name, an index out of range) as for a plain assignment or a read.
    fn indexed_assign(
        &mut self,
        target: &Expr,
        op: Option<BinOp>,
        value: &Expr,
        lo: usize,
        hi: usize,
    ) -> Option<ParsedStmt> {
        let ExprKind::Index { base, indices } = &*target.kind else {
            return None;
        };
        let ExprKind::Name(name) = &*base.kind else {
            self.diags.push(
                Diagnostic::error("cannot assign to this indexed expression", target.span)
                    .with_label("not an indexed variable")
                    .with_note("an indexed assignment updates a `mut` variable: `v[i] = e;`"),
            );
            return Some(ParsedStmt::Error);
        };
        let (sp, vs) = (target.span, value.span);
        let (method, arg) = match op {
            None => ("set", value.clone()),
            Some(BinOp::Add) => ("add", value.clone()),
            Some(BinOp::Sub) => (
                "add",
                Expr::new(
                    ExprKind::Unary {
                        op: UnOp::Neg,
                        operand: value.clone(),
                    },
                    vs,
                ),
            ),
            Some(BinOp::Mul) => ("mul", value.clone()),
            Some(other) => (
                "set",
                Expr::new(
                    ExprKind::Binary {
                        op: other,
                        op_span: vs,
                        lhs: target.clone(),
                        rhs: value.clone(),
                    },
                    vs,
                ),
            ),
        };
        let ident = |name: &str, span| Ident {
            name: name.to_string(),
            span,
        };
        let at = Expr::new(
            ExprKind::Field {
                base: base.clone(),
                name: ident("at", sp),
            },
            sp,
        );
        let region = Expr::new(
            ExprKind::Index {
                base: at,
                indices: indices.clone(),
            },
            sp,
        );
        let callee = Expr::new(
            ExprKind::Field {
                base: region,
                name: ident(method, sp),
            },
            sp,
        );
        let update = Expr::new(
            ExprKind::Call {
                callee,
                args: vec![Arg {
                    name: None,
                    value: arg,
                    span: vs,
                }],
            },
            Span::new(self.file, sp.lo, vs.hi),
        );
        let pattern = Pattern {
            kind: PatternKind::Name(name.clone()),
            span: base.span,
        };
        Some(self.stmt(
            StmtKind::Assign {
                target: pattern,
                op: None,
                value: update,
            },
            lo,
            hi,
        ))
    }

    /// Classifies the iterable of a `for` that is not `a..b`.
    pub fn for_iter(&mut self, e: Expr) -> ForIter {
        let is_progress_range = matches!(
            &*e.kind,
            ExprKind::Call { callee, args }
                if matches!(&*callee.kind, ExprKind::Name(n) if n == "progress")
                && args.len() == 1
                && args[0].name.is_none()
                && matches!(&*args[0].value.kind, ExprKind::Range { .. })
        );
        if !is_progress_range {
            return ForIter::Expr(e);
        }
        let span = e.span;
        let ExprKind::Call { mut args, .. } = *e.kind else {
            unreachable!("checked above")
        };
        let arg = args.pop().expect("checked above");
        let ExprKind::Range { lo, hi } = *arg.value.kind else {
            unreachable!("checked above")
        };
        ForIter::Progress { lo, hi, span }
    }
}

/// The assignment target an expression denotes, if any.
fn to_lvalue(e: &Expr) -> Option<Pattern> {
    let kind = match &*e.kind {
        ExprKind::Name(n) if n == "_" => PatternKind::Wildcard,
        ExprKind::Name(n) => PatternKind::Name(n.clone()),
        ExprKind::Tuple(es) => {
            PatternKind::Tuple(es.iter().map(to_lvalue).collect::<Option<Vec<_>>>()?)
        }
        _ => return None,
    };
    Some(Pattern { kind, span: e.span })
}

/// Parses one source file.
///
/// Always returns a module — the items that could be parsed — together with
/// every lexical and syntax error found (several per file: the parser
/// recovers at statement and item level). The module is complete and
/// faithful only when no error diagnostic is returned.
///
/// ```
/// use adjoint_lang::{parse, FileId};
/// let (m, diags) = parse(FileId(0), "fn square(x) = x * x");
/// assert!(diags.is_empty());
/// assert_eq!(m.items.len(), 1);
/// ```
pub fn parse(file: FileId, src: &str) -> (Module, Vec<Diagnostic>) {
    let (m, diags) = run(file, src, |cx, tokens| {
        grammar::ModuleParser::new().parse(cx, tokens)
    });
    (m.unwrap_or_default(), diags)
}

/// Parses a single expression (for tests, tools and the REPL). There is no
/// error recovery inside: on a syntax error the result is `None` and the
/// diagnostics say why.
///
/// ```
/// use adjoint_lang::{dump_expr, parser::parse_expr, FileId};
/// let (e, diags) = parse_expr(FileId(0), "-x ** 2");
/// assert!(diags.is_empty());
/// assert_eq!(dump_expr(&e.unwrap()), "(neg (** x 2))");
/// ```
pub fn parse_expr(file: FileId, src: &str) -> (Option<Expr>, Vec<Diagnostic>) {
    run(file, src, |cx, tokens| {
        grammar::ExprParser::new().parse(cx, tokens)
    })
}

type RunResult<'input, T> = Result<T, ParseError<usize, Tok<'input>, ()>>;

/// Lexes, checks nesting, runs `f` and collects every diagnostic, sorted
/// by position.
fn run<'input, T>(
    file: FileId,
    src: &'input str,
    f: impl FnOnce(&mut Cx<'input>, Feed<'_, 'input>) -> RunResult<'input, T>,
) -> (Option<T>, Vec<Diagnostic>) {
    if src.len() >= u32::MAX as usize {
        let d = Diagnostic::error("file too large", Span::point(file, 0))
            .with_note("source files must be smaller than 4 GiB");
        return (None, vec![d]);
    }
    let lexed = lexer::lex(file, src);
    let mut diags = lexed.diags;
    let tokens = lexed.tokens;
    if let Some(d) = check_nesting(file, &tokens) {
        diags.push(d);
        return (None, diags);
    }

    let mut cx = Cx::new(file);
    let stalled = Rc::new(Cell::new(None));
    let feed = Feed {
        tokens: tokens.iter(),
        progress: cx.progress.clone(),
        last_progress: 0,
        since: 0,
        stalled: stalled.clone(),
    };
    let result = match f(&mut cx, feed) {
        Ok(m) => Some(m),
        Err(error) => {
            cx.errors.push(ErrorRecovery {
                error,
                dropped_tokens: Vec::new(),
            });
            None
        }
    };

    let lex_errors: Vec<Span> = diags.iter().map(|d| d.primary.span).collect();
    let mut syntax = Vec::new();
    // Index of the last token involved in the previous reported error.
    let mut last_tok: Option<usize> = None;
    let mut suppressed = 0usize;
    for rec in &cx.errors {
        if stalled.get().is_some() && matches!(rec.error, ParseError::UnrecognizedEof { .. }) {
            continue;
        }
        let at = match &rec.error {
            ParseError::UnrecognizedToken { token, .. } | ParseError::ExtraToken { token } => {
                token_at(&tokens, token.0)
            }
            _ => tokens.len(),
        };
        let end = rec
            .dropped_tokens
            .last()
            .map_or(at, |t| token_at(&tokens, t.0).max(at));
        // Panic-mode recovery can stumble again right after an error; an
        // error less than CASCADE_GAP tokens after the previous one is taken
        // as a knock-on effect and not reported.
        // (Running into the end of the file is always worth saying: it
        // points at the bracket left open.)
        let at_eof = matches!(rec.error, ParseError::UnrecognizedEof { .. });
        let cascade = !at_eof && last_tok.is_some_and(|prev| at < prev + CASCADE_GAP);
        last_tok = Some(end);
        if cascade {
            continue;
        }
        let Some(d) = syntax_error(file, src, &tokens, &rec.error, &lex_errors) else {
            continue;
        };
        if syntax.len() < MAX_SYNTAX_ERRORS {
            syntax.push(d);
        } else {
            suppressed += 1;
        }
    }
    diags.extend(syntax);
    // Errors found by grammar actions are capped too: each is rendered with
    // its source line, so an unbounded number of them on one long line
    // would make the report quadratic in the size of the file.
    let mut actions = cx.diags;
    actions.sort_by_key(|d| (d.primary.span.lo, d.primary.span.hi));
    if actions.len() > MAX_SYNTAX_ERRORS {
        suppressed += actions.len() - MAX_SYNTAX_ERRORS;
        actions.truncate(MAX_SYNTAX_ERRORS);
    }
    diags.extend(actions);
    if let Some((lo, hi)) = stalled.get() {
        diags.push(
            Diagnostic::error("the parser gave up here", Span::new(file, lo as u32, hi as u32))
                .with_label("no progress for too long")
                .with_note(format!(
                    "the parser read {STALL_LIMIT} tokens without completing any part of the program; the rest of the file was not parsed",
                )),
        );
    }
    diags.sort_by_key(|d| (d.primary.span.lo, d.primary.span.hi));
    if suppressed > 0 {
        let end = src.len() as u32;
        diags.push(Diagnostic::error(
            format!("{suppressed} more syntax errors not shown"),
            Span::point(file, end),
        ));
    }
    (result, diags)
}

/// See [`Feed`].
const STALL_LIMIT: usize = 2000;

/// The token stream handed to the LR parser.
///
/// LALRPOP's error recovery drops tokens one at a time and rescans the
/// whole parse stack for each; with a deep stack (a long chain of prefix
/// operators) and a long run of unusable tokens that is quadratic. The feed
/// therefore ends the input early once [`STALL_LIMIT`] tokens have gone by
/// without any grammar action running. A valid program never gets near
/// that: bracket nesting and expression depth are limited far below it.
pub(crate) struct Feed<'a, 'input> {
    tokens: std::slice::Iter<'a, Spanned<'input>>,
    progress: Rc<Cell<u64>>,
    last_progress: u64,
    since: usize,
    stalled: Rc<Cell<Option<(usize, usize)>>>,
}

impl<'input> Iterator for Feed<'_, 'input> {
    type Item = Spanned<'input>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.stalled.get().is_some() {
            return None;
        }
        let p = self.progress.get();
        if p != self.last_progress {
            self.last_progress = p;
            self.since = 0;
        }
        let t = self.tokens.next()?;
        self.since += 1;
        if self.since > STALL_LIMIT {
            self.stalled.set(Some((t.0, t.2)));
            return None;
        }
        Some(t.clone())
    }
}

/// Rejects bracket nesting deeper than [`MAX_NESTING`].
fn check_nesting(file: FileId, tokens: &[Spanned<'_>]) -> Option<Diagnostic> {
    let mut depth = 0usize;
    for (lo, tok, hi) in tokens {
        if tok.is_open() {
            depth += 1;
            if depth > MAX_NESTING {
                return Some(
                    Diagnostic::error("nesting too deep", Span::new(file, *lo as u32, *hi as u32))
                        .with_label(format!("more than {MAX_NESTING} levels of brackets"))
                        .with_note("the file was not parsed"),
                );
            }
        } else if tok.is_close() {
            depth = depth.saturating_sub(1);
        }
    }
    None
}

// ------------------------------------------------------------ messages

const EXPR_START: &[&str] = &[
    "IDENT",
    "INT",
    "FLOAT",
    "STR",
    "\"true\"",
    "\"false\"",
    "\"(\"",
    "\"[\"",
    "\"{\"",
    "REC_LBRACE",
    "\"-\"",
    "\"!\"",
    "\"|\"",
    "\"||\"",
    "\"if\"",
];

const STMT_START: &[&str] = &[
    "\"let\"",
    "\"fn\"",
    "\"for\"",
    "\"while\"",
    "\"break\"",
    "\"continue\"",
    "\"return\"",
    "\";\"",
];

/// Tokens that may follow a complete operand (infix and postfix operators,
/// assignment operators).
const AFTER_OPERAND: &[&str] = &[
    "\"+\"", "\"-\"", "\"*\"", "\"/\"", "\"%\"", "\"@\"", "\"**\"", "\"==\"", "\"!=\"", "\"<\"",
    "\"<=\"", "\">\"", "\">=\"", "\"&&\"", "\"||\"", "\".\"", "\"(\"", "\"[\"", "\"..\"", "\"=\"",
    "\"+=\"", "\"-=\"", "\"*=\"", "\"/=\"",
];

/// Describes one terminal name from the grammar.
fn terminal(t: &str) -> String {
    match t {
        "IDENT" => "an identifier".to_string(),
        "INT" => "an integer".to_string(),
        "FLOAT" => "a number".to_string(),
        "STR" => "a string".to_string(),
        "REC_LBRACE" => "`{`".to_string(),
        _ => {
            let inner = t.strip_prefix('"').and_then(|s| s.strip_suffix('"'));
            format!("`{}`", inner.unwrap_or(t))
        }
    }
}

/// Joins `["a", "b", "c"]` as `a, b or c`.
fn join_or(parts: &[String]) -> String {
    match parts {
        [] => "something else".to_string(),
        [a] => a.clone(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}

/// Summarises the parser's list of acceptable terminals in words.
pub(crate) fn describe_expected(expected: &[String]) -> Vec<String> {
    let has = |t: &str| expected.iter().any(|e| e == t);
    let mut skip: Vec<&str> = Vec::new();
    let mut parts: Vec<String> = Vec::new();
    if has("\"bprop\"") {
        parts.push("an item (`fn`, `bprop` or `import`)".to_string());
        skip.extend(["\"fn\"", "\"bprop\"", "\"import\""]);
    }
    // Operators that cannot start an expression: if one is acceptable, the
    // parser is right after a complete operand.
    let after_operand = [
        "\"+\"", "\"*\"", "\"/\"", "\"%\"", "\"@\"", "\"**\"", "\"==\"", "\"!=\"", "\"<\"",
        "\"<=\"", "\">\"", "\">=\"", "\"&&\"", "\".\"", "\"..\"", "\"+=\"",
    ]
    .iter()
    .any(|t| has(t));
    if after_operand {
        skip.extend(AFTER_OPERAND);
    }
    if has("\"let\"") {
        parts.push("a statement".to_string());
        skip.extend(STMT_START);
        skip.extend(EXPR_START);
    } else if has("INT") && has("\"(\"") && has("\"-\"") && !after_operand {
        parts.push("an expression".to_string());
        skip.extend(EXPR_START);
    } else if has("IDENT") && has("\"(\"") && has("REC_LBRACE") && !has("INT") {
        // the starts of a pattern (`x`, `(a, b)`, `{ w, b }`) or a type
        // (`f32`, `(f32, f32)`, `{ w: f32 }`)
        if has("\"{\"") {
            parts.push("a pattern".to_string());
        } else {
            parts.push("a type".to_string());
        }
        skip.extend(["IDENT", "\"(\"", "REC_LBRACE", "\"{\""]);
    }
    for e in expected {
        if !skip.contains(&e.as_str()) {
            let d = terminal(e);
            if !parts.contains(&d) {
                parts.push(d);
            }
        }
    }
    if parts.is_empty() && after_operand {
        parts.push("an operator".to_string());
    }
    if parts.len() > 6 {
        parts.truncate(5);
        parts.push("something else".to_string());
    }
    parts
}

/// The index of the first token starting at or after `pos`.
fn token_at(tokens: &[Spanned<'_>], pos: usize) -> usize {
    tokens.partition_point(|t| t.0 < pos)
}

/// Turns one parse error into a diagnostic (`None` when it is a knock-on
/// effect of a lexical error just before it).
fn syntax_error(
    file: FileId,
    src: &str,
    tokens: &[Spanned<'_>],
    err: &ParseError<usize, Tok<'_>, ()>,
    lex_errors: &[Span],
) -> Option<Diagnostic> {
    let sp = |lo: usize, hi: usize| Span::new(file, lo as u32, hi as u32);
    match err {
        ParseError::UnrecognizedToken {
            token: (lo, tok, hi),
            expected,
        } => {
            let i = token_at(tokens, *lo);
            let prev = i.checked_sub(1).map(|j| &tokens[j]);
            let gap_lo = prev.map_or(0, |p| p.2);
            if lex_errors
                .iter()
                .any(|s| s.lo as usize >= gap_lo && (s.hi as usize) <= *lo)
            {
                return None;
            }
            let parts = describe_expected(expected);
            let found = tok.describe();
            if parts == ["`;`"] {
                if let Some(p) = prev {
                    return Some(
                        Diagnostic::error("expected `;` after this statement", sp(p.0, p.2))
                            .with_label("expected `;` after this")
                            .with_secondary(sp(*lo, *hi), format!("found {found}")),
                    );
                }
            }
            let what = join_or(&parts);
            Some(
                Diagnostic::error(format!("expected {what}, found {found}"), sp(*lo, *hi))
                    .with_label(format!("expected {what}")),
            )
        }
        ParseError::UnrecognizedEof { location, expected } => {
            let what = join_or(&describe_expected(expected));
            let at = (*location).min(src.len());
            let mut d =
                Diagnostic::error(format!("expected {what}, found end of file"), sp(at, at))
                    .with_label(format!("expected {what}"));
            if let Some((olo, otok, ohi)) = innermost_unclosed(tokens) {
                d = d.with_secondary(
                    sp(olo, ohi),
                    format!("this `{}` is not closed", otok.text()),
                );
            }
            Some(d)
        }
        ParseError::ExtraToken {
            token: (lo, tok, hi),
        } => Some(
            Diagnostic::error(format!("unexpected {}", tok.describe()), sp(*lo, *hi))
                .with_label("expected end of file"),
        ),
        ParseError::InvalidToken { location } => {
            Some(Diagnostic::error("invalid token", sp(*location, *location)))
        }
        ParseError::User { .. } => None,
    }
}

/// The last bracket left open at the end of the token stream.
fn innermost_unclosed<'a>(tokens: &'a [Spanned<'a>]) -> Option<(usize, &'a Tok<'a>, usize)> {
    let mut stack = Vec::new();
    for (lo, tok, hi) in tokens {
        if tok.is_open() {
            stack.push((*lo, tok, *hi));
        } else if tok.is_close() {
            stack.pop();
        }
    }
    stack.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grammar actions may find an error per operator (`a < b < c < …`);
    /// they are capped like the parser's own errors, so that rendering them,
    /// each with its source line, stays linear in the size of the file.
    #[test]
    fn errors_from_grammar_actions_are_capped() {
        // 200 operators: 199 chained comparisons (and not yet too deep)
        let src = format!("fn main() {{ print(1{}); }}", " < 1".repeat(200));
        let (_, diags) = parse(FileId(0), &src);
        let chained = diags
            .iter()
            .filter(|d| d.message == "comparison operators cannot be chained")
            .count();
        assert_eq!(chained, MAX_SYNTAX_ERRORS);
        let last = diags.last().expect("diagnostics");
        assert_eq!(
            last.message,
            format!("{} more syntax errors not shown", 199 - MAX_SYNTAX_ERRORS)
        );
        assert_eq!(diags.len(), MAX_SYNTAX_ERRORS + 1);
        // the first ones are kept, in order
        assert!(diags[0].primary.span.lo < diags[1].primary.span.lo);
        // and a much longer chain is no slower to parse and report
        let src = format!("fn main() {{ print(1{}); }}", " < 1".repeat(100_000));
        let (_, diags) = parse(FileId(0), &src);
        assert!(diags.len() <= MAX_SYNTAX_ERRORS + 2, "{}", diags.len());
    }
}
