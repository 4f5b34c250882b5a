//! `adjoint-lang`: the front end of the Adjoint compiler — lexer, grammar,
//! AST, source spans and diagnostics.
//!
//! ```
//! use adjoint_lang::{parse, render, SourceMap};
//! let mut sources = SourceMap::new();
//! let src = "fn square(x) = x * x\nfn main() { print(grad(square)(3.0)); }\n";
//! let file = sources.add_file("square.adj", src);
//! let (module, diags) = parse(file, src);
//! assert!(diags.is_empty(), "{}", render(&diags, &sources, false));
//! assert_eq!(module.items.len(), 2);
//! ```
//!
//! **Architecture invariant:** this crate knows nothing of the rest of the
//! compiler; later stages reuse its [`Span`], [`SourceMap`] and
//! [`Diagnostic`] types.
//!
//! # Pipeline
//!
//! [`lexer::lex`] (logos, plus a pass for tuple indices and record braces)
//! → nesting check ([`MAX_NESTING`]) → LALRPOP parser (`grammar.lalrpop`,
//! error recovery at item and statement level) → [`Module`]. [`parse`] runs
//! all of it and never fails: it returns what could be parsed and every
//! diagnostic, sorted by position.
//!
//! # Syntax decisions beyond `docs/language.md`
//!
//! - A block's last `if` or `{ .. }` without `;` is the block's tail (its
//!   value), as in Rust; with `;` it is a statement. An `if`/block at the
//!   start of a statement is never continued by an operator: `if c {a} else
//!   {b} - 1` in statement position is an `if` statement followed by `-1`.
//! - At top level the `;` after `fn f(..) = expr` (and `bprop`, `import`)
//!   is optional; inside a block a local `fn f(..) = expr;` needs it.
//! - `{` followed by `ident :` starts a record; any other `{` a block (so
//!   `{}` is an empty block, and a record needs at least one field).
//! - Comparisons do not chain: `a < b < c` is reported as "comparison
//!   operators cannot be chained".
//! - `..` is accepted only in a `for` header and as a call argument; as an
//!   argument of anything but `progress` it is reported.
//! - Assignment targets are names, `_` and tuples of them; `x[i] = e` and
//!   `p.w = e` are errors. Compound assignment (`+=` …) needs a name.
//! - `_` is lexically an identifier; as a pattern it is the wildcard.
//! - Whitespace may come before the `.` of a tuple index: `t .0` is `t.0`.
//!   After a number or an operator, `.5` is a float.
//! - Strings end at the end of their line (no raw newlines; use `\n`);
//!   escapes are `\n \t \r \0 \" \\`.
//! - Type annotations: `f32`, `f32[]` (scalar), `f32[3, 4]`, tuples
//!   `(f32, i64)`, records `{ w: f32[3] }`. The dtype name is not checked
//!   here.
//! - Lambda parameters are names with optional types, no patterns or
//!   defaults.
//!
//! # Limits
//!
//! Brackets nest at most [`MAX_NESTING`] (200) deep, checked before
//! parsing; an expression tree is at most [`MAX_EXPR_DEPTH`] (256) nodes
//! deep — deeper subtrees (e.g. `a + a + … + a` with 10^5 terms, which is
//! left-deep) are reported and replaced by [`ExprKind::Error`]. Together
//! they bound the recursion depth of every pass over the AST, including its
//! `Drop`. At most 50 lexical and 50 syntax errors are reported per file.

#![warn(missing_docs)]

pub mod ast;
pub mod diagnostic;
pub mod dump;
pub mod lexer;
pub mod parser;
pub mod span;

pub use ast::*;
pub use diagnostic::{render, render_short, Diagnostic, Label, Severity};
pub use dump::{dump, dump_expr};
pub use parser::{parse, parse_expr, MAX_NESTING};
pub use span::{FileId, SourceFile, SourceMap, Span};
