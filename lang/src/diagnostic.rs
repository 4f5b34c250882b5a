//! Diagnostics: the error/warning type shared by every stage of the
//! compiler, and its rendering.
//!
//! A [`Diagnostic`] has a one-line message, a primary [`Label`] (the span the
//! error is about, with an optional short remark), secondary labels pointing
//! at related code, and free-form notes. Build one with the helpers:
//!
//! ```
//! use adjoint_lang::{Diagnostic, FileId, Span, SourceMap, render};
//! let mut sm = SourceMap::new();
//! let f = sm.add_file("a.adj", "let x = y;\n");
//! let d = Diagnostic::error("unknown name `y`", Span::new(f, 8, 9))
//!     .with_label("not found in this scope")
//!     .with_note("names must be bound before use");
//! let text = render(&[d], &sm, false);
//! assert!(text.contains("a.adj:1:9"));
//! ```

use std::fmt::Write as _;

use crate::span::{floor_char_boundary, FileId, SourceMap, Span};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Compilation cannot succeed.
    #[default]
    Error,
    /// Something suspicious; compilation continues.
    Warning,
    /// Extra information.
    Note,
}

impl Severity {
    /// `"error"`, `"warning"` or `"note"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

/// A span with a (possibly empty) remark attached to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// Where.
    pub span: Span,
    /// What to say there; empty for a bare underline.
    pub message: String,
}

impl Label {
    /// A label at `span` saying `message`.
    pub fn new(span: Span, message: impl Into<String>) -> Label {
        Label {
            span,
            message: message.into(),
        }
    }
}

/// An error or warning about the user's program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error, warning or note.
    pub severity: Severity,
    /// The headline, lowercase, without trailing period.
    pub message: String,
    /// The main location.
    pub primary: Label,
    /// Related locations.
    pub secondary: Vec<Label>,
    /// Extra sentences shown after the source excerpt.
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// An error with headline `message` at `span` (no label text yet).
    pub fn error(message: impl Into<String>, span: Span) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            message: message.into(),
            primary: Label::new(span, ""),
            secondary: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A warning with headline `message` at `span`.
    pub fn warning(message: impl Into<String>, span: Span) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(message, span)
        }
    }

    /// Sets the remark on the primary label.
    pub fn with_label(mut self, message: impl Into<String>) -> Diagnostic {
        self.primary.message = message.into();
        self
    }

    /// Adds a secondary label.
    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label::new(span, message));
        self
    }

    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// Changes the severity.
    pub fn with_severity(mut self, severity: Severity) -> Diagnostic {
        self.severity = severity;
        self
    }

    /// The primary span.
    pub fn span(&self) -> Span {
        self.primary.span
    }

    /// Whether this is an error (as opposed to a warning or note).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl std::fmt::Display for Diagnostic {
    /// `error: message` (no location; use [`render_short`] for that).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.severity.as_str(), self.message)
    }
}

impl std::error::Error for Diagnostic {}

/// `file:line:col: error: message` — one line per diagnostic, no source
/// excerpt. Notes are not shown.
pub fn render_short(d: &Diagnostic, sources: &SourceMap) -> String {
    let (line, col) = sources.line_col(d.primary.span);
    format!(
        "{}:{}:{}: {}: {}",
        sources.name(d.primary.span.file),
        line,
        col,
        d.severity.as_str(),
        d.message
    )
}

/// Renders diagnostics in full: headline, `file:line:col`, the source lines
/// with the labelled spans underlined, and the notes. With `color == false`
/// the output contains no escape codes (for tests, pipes and files).
pub fn render(diags: &[Diagnostic], sources: &SourceMap, color: bool) -> String {
    let mut out = String::new();
    // One cache for all diagnostics: indexing a file's lines is linear in
    // its size, and must not be repeated per diagnostic.
    let mut cache = Cache {
        sources,
        cached: Vec::new(),
    };
    for d in diags {
        let one = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            render_one(d, sources, &mut cache, color)
        }));
        match one {
            Ok(Some(s)) => out.push_str(&s),
            // Unknown file or a renderer failure: fall back to the short form.
            _ => {
                let _ = writeln!(out, "{}", render_short(d, sources));
                for n in &d.notes {
                    let _ = writeln!(out, "  = note: {n}");
                }
            }
        }
    }
    out
}

/// Clamps a span to char boundaries inside its file's text, and to the
/// line it starts on: a label over several lines (a whole loop, say) would
/// show as an empty excerpt, its first line is the one that says where.
fn sanitize(span: Span, sources: &SourceMap) -> Option<(FileId, std::ops::Range<usize>)> {
    let file = sources.get(span.file)?;
    let lo = floor_char_boundary(&file.text, span.lo as usize);
    let mut hi = floor_char_boundary(&file.text, span.hi as usize).max(lo);
    if let Some(eol) = file.text[lo..hi].find('\n') {
        hi = lo + eol;
    }
    // ariadne is given offsets in characters: with byte offsets its
    // excerpts are right but the `file:line:col` it writes above a
    // secondary file's excerpt counted a multi-byte character as several
    // (two lines early deep in the standard library, which has `ᵀ`s).
    let chars = |b: usize| file.text[..b].chars().count();
    Some((span.file, chars(lo)..chars(hi)))
}

struct Cache<'a> {
    sources: &'a SourceMap,
    cached: Vec<Option<ariadne::Source<&'a str>>>,
}

impl<'a> ariadne::Cache<FileId> for Cache<'a> {
    type Storage = &'a str;

    fn fetch(&mut self, id: &FileId) -> Result<&ariadne::Source<&'a str>, impl std::fmt::Debug> {
        let i = id.0 as usize;
        let Some(file) = self.sources.get(*id) else {
            return Err("unknown file");
        };
        if self.cached.len() <= i {
            self.cached.resize_with(i + 1, || None);
        }
        Ok(self.cached[i].get_or_insert_with(|| ariadne::Source::from(file.text.as_str())))
    }

    fn display<'b>(&self, id: &'b FileId) -> Option<impl std::fmt::Display + 'b> {
        Some(self.sources.name(*id).to_string())
    }
}

fn render_one(
    d: &Diagnostic,
    sources: &SourceMap,
    cache: &mut Cache<'_>,
    color: bool,
) -> Option<String> {
    use ariadne::{Config, IndexType, Label as ALabel, Report, ReportKind};
    let primary = sanitize(d.primary.span, sources)?;
    let kind = match d.severity {
        Severity::Error => ReportKind::Error,
        Severity::Warning => ReportKind::Warning,
        Severity::Note => ReportKind::Advice,
    };
    let config = Config::default()
        .with_color(color)
        .with_index_type(IndexType::Char);
    // ariadne keeps the labels of one file in one excerpt only when they
    // come in line order.
    // ariadne underlines only labels with text: a primary label without
    // one (type and run-time errors) gets the reason, the message after
    // its last `: `, so every error underlines its expression.
    let reason;
    let primary_message = if d.primary.message.is_empty() {
        reason = reason_of(&d.message).unwrap_or("here").to_string();
        &reason
    } else {
        &d.primary.message
    };
    let mut labels = vec![(primary.clone(), primary_message, true)];
    for l in &d.secondary {
        if let Some(span) = sanitize(l.span, sources) {
            labels.push((span, &l.message, false));
        }
    }
    labels.sort_by_key(|(s, _, _)| (s.0, s.1.start, s.1.end));
    let mut report = Report::build(kind, primary)
        .with_config(config)
        .with_message(&d.message);
    for (span, message, is_primary) in labels {
        let mut label = ALabel::new(span);
        if !message.is_empty() {
            label = label.with_message(message);
        }
        if color {
            label = label.with_color(if is_primary {
                ariadne::Color::Red
            } else {
                ariadne::Color::Blue
            });
        }
        report = report.with_label(label);
    }
    for n in &d.notes {
        report = report.with_note(n);
    }
    let mut buf = Vec::new();
    report.finish().write(cache, &mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reasons_keep_record_types_and_code_whole() {
        assert_eq!(
            reason_of("add: expected a tensor, got {a: f64[]}"),
            Some("expected a tensor, got {a: f64[]}")
        );
        assert_eq!(
            reason_of("tuple_get: index 5 is out of range: (f64[], f64[])"),
            Some("(f64[], f64[])")
        );
        assert_eq!(
            reason_of("slices in loops have the form `e : e + c`: here `i : j`"),
            Some("here `i : j`")
        );
        assert_eq!(reason_of("record {a: f64[]} has no field `b`"), None);
    }

    use super::*;

    #[test]
    fn a_secondary_file_after_multibyte_characters_is_located_right() {
        let mut sm = SourceMap::new();
        let user = sm.add_file("m.adj", "grad(f)(x)\n");
        let text = "// aᵀ b⁻¹\n// ᵀᵀᵀ\nbprop f(x) = x\n";
        let lib = sm.add_file("<stdlib>/lib.adj", text);
        let at = text.find("bprop").unwrap() as u32;
        let d = Diagnostic::error("boom", Span::new(user, 0, 4))
            .with_secondary(Span::new(lib, at, at + 5), "while running this");
        let out = render(&[d], &sm, false);
        assert!(out.contains("<stdlib>/lib.adj:3:1"), "{out}");
        assert!(out.contains("3 │ bprop f(x) = x"), "{out}");
    }

    #[test]
    fn short_and_long_forms() {
        let mut sm = SourceMap::new();
        let f = sm.add_file("m.adj", "fn f() {\n  x + \n}\n");
        let d = Diagnostic::error("expected an expression, found `}`", Span::new(f, 16, 17))
            .with_label("expected an expression here")
            .with_secondary(Span::new(f, 13, 14), "after this operator")
            .with_note("a note");
        assert_eq!(
            render_short(&d, &sm),
            "m.adj:3:1: error: expected an expression, found `}`"
        );
        let long = render(&[d], &sm, false);
        assert!(long.contains("m.adj:3:1"), "{long}");
        assert!(long.contains("expected an expression here"), "{long}");
        assert!(long.contains("x +"), "{long}");
        assert!(long.contains("a note"), "{long}");
        assert!(!long.contains('\x1b'), "{long}");
    }

    /// A span over several lines (a loop) shows its first line.
    #[test]
    fn a_span_over_lines_shows_its_first() {
        let mut sm = SourceMap::new();
        let text = "fn f(n) {\n    for i in 0..n {\n        g(i);\n    }\n}\n";
        let f = sm.add_file("m.adj", text);
        let lo = text.find("for").unwrap() as u32;
        let hi = text.rfind("    }").unwrap() as u32 + 5;
        let long = render(
            &[Diagnostic::error("too long", Span::new(f, lo, hi))],
            &sm,
            false,
        );
        assert!(long.contains("m.adj:2:5"), "{long}");
        assert!(long.contains("2 │     for i in 0..n {"), "{long}");
    }

    #[test]
    fn color_output_has_escapes() {
        let mut sm = SourceMap::new();
        let f = sm.add_file("m.adj", "abc");
        let d = Diagnostic::error("bad", Span::new(f, 0, 1));
        assert!(render(&[d], &sm, true).contains('\x1b'));
    }

    #[test]
    fn odd_spans_do_not_panic() {
        let mut sm = SourceMap::new();
        let f = sm.add_file("m.adj", "λλ\r\nx");
        for lo in 0..10 {
            for hi in 0..10 {
                let d = Diagnostic::error("m", Span::new(f, lo, hi));
                let _ = render(std::slice::from_ref(&d), &sm, false);
                let _ = render_short(&d, &sm);
            }
        }
        let d = Diagnostic::error("foreign", Span::new(FileId(7), 0, 1));
        assert!(render(&[d], &sm, false).contains("foreign"));
    }

    /// Rendering indexes each file once, not once per diagnostic: many
    /// diagnostics in a big file (one per line, as for a function defined
    /// 10^4 times) render in time linear in their number.
    #[test]
    fn many_diagnostics_in_a_big_file() {
        let n = 20_000u32;
        let line = "fn main() { 1 +; }\n";
        let mut sm = SourceMap::new();
        let f = sm.add_file("big.adj", line.repeat(n as usize));
        let len = line.len() as u32;
        let diags: Vec<_> = (0..n)
            .map(|i| Diagnostic::error("defined twice", Span::new(f, i * len + 3, i * len + 7)))
            .collect();
        let start = std::time::Instant::now();
        let text = render(&diags, &sm, false);
        let took = start.elapsed();
        assert!(
            text.contains(&format!("big.adj:{n}:4")),
            "last diagnostic missing"
        );
        assert_eq!(text.matches("defined twice").count(), n as usize);
        // quadratic rendering took minutes here; linear takes well under 1 s
        assert!(took.as_secs() < 20, "rendering took {took:?}");
    }
}

/// The reason in a message `what: reason`: the text after its last `: `
/// that is not inside brackets or backticks (a record type `{a: f64[]}`
/// or code `` `e : e + c` `` in the reason stays whole).
fn reason_of(message: &str) -> Option<&str> {
    let mut depth = 0i32;
    let mut code = false;
    let mut cut = None;
    let bytes = message.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'`' => code = !code,
            b'(' | b'[' | b'{' if !code => depth += 1,
            b')' | b']' | b'}' if !code => depth -= 1,
            b':' if !code && depth == 0 && bytes.get(i + 1) == Some(&b' ') => cut = Some(i),
            _ => {}
        }
    }
    cut.map(|i| &message[i + 2..])
}
