//! IR locations and source spans: the one place that maps between the
//! syntax crate's `Span` and the IR's opaque [`Loc`] (the IR itself does
//! not know the syntax crate). Lowering makes locations; checks, the
//! pipeline and the command line map them back for diagnostics.

use adjoint_lang::{FileId, Span};

use crate::ir::Loc;

/// Converts a source span to an IR location.
pub fn loc(span: Span) -> Loc {
    Loc {
        file: span.file.0,
        lo: span.lo,
        hi: span.hi,
    }
}

/// Converts an IR location back to a source span.
pub fn span_of(l: Loc) -> Option<Span> {
    if l.is_none() {
        None
    } else {
        Some(Span::new(FileId(l.file), l.lo, l.hi))
    }
}
