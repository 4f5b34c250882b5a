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
