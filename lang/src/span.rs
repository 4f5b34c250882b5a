//! Source files and byte spans.
//!
//! Every AST node and every [`Diagnostic`](crate::Diagnostic) carries a
//! [`Span`]: a file id plus a half-open byte range `lo..hi` into that file's
//! text. The [`SourceMap`] owns the texts and turns spans into 1-based
//! `line:col` positions for messages.

use std::fmt;

/// Identifies one file in a [`SourceMap`]. Ids are dense indices handed out
/// by [`SourceMap::add_file`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// A half-open byte range `lo..hi` in one source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// The file the range points into.
    pub file: FileId,
    /// Byte offset of the first byte.
    pub lo: u32,
    /// Byte offset one past the last byte.
    pub hi: u32,
}

impl Span {
    /// A span from `lo` to `hi` in `file`.
    pub fn new(file: FileId, lo: u32, hi: u32) -> Span {
        Span { file, lo, hi }
    }

    /// An empty span at `pos`.
    pub fn point(file: FileId, pos: u32) -> Span {
        Span {
            file,
            lo: pos,
            hi: pos,
        }
    }

    /// The smallest span covering both `self` and `other` (same file assumed;
    /// the file of `self` is kept).
    pub fn to(self, other: Span) -> Span {
        Span {
            file: self.file,
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }

    /// The length in bytes.
    pub fn len(self) -> u32 {
        self.hi.saturating_sub(self.lo)
    }

    /// Whether the span covers no bytes.
    pub fn is_empty(self) -> bool {
        self.hi <= self.lo
    }

    /// The empty span at the end of `self`.
    pub fn end(self) -> Span {
        Span::point(self.file, self.hi)
    }

    /// The byte range as a `usize` range.
    pub fn range(self) -> std::ops::Range<usize> {
        self.lo as usize..self.hi as usize
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}..{}", self.file.0, self.lo, self.hi)
    }
}

/// One source file: its display name (usually a path) and its text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// The name shown in diagnostics.
    pub name: String,
    /// The full text.
    pub text: String,
    /// Byte offsets at which lines start (always begins with 0).
    line_starts: Vec<u32>,
}

impl SourceFile {
    fn new(name: String, text: String) -> SourceFile {
        let line_starts = compute_line_starts(&text);
        SourceFile {
            name,
            text,
            line_starts,
        }
    }

    /// The 1-based line and column (in characters) of byte offset `pos`,
    /// clamped to the text.
    pub fn line_col(&self, pos: u32) -> (u32, u32) {
        let pos = floor_char_boundary(&self.text, pos as usize) as u32;
        let line = match self.line_starts.binary_search(&pos) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[line] as usize;
        let col = self.text[start..pos as usize].chars().count();
        (line as u32 + 1, col as u32 + 1)
    }

    /// The text of 1-based line `line`, without its terminator.
    pub fn line_text(&self, line: u32) -> Option<&str> {
        let i = (line as usize).checked_sub(1)?;
        let start = *self.line_starts.get(i)? as usize;
        let end = self
            .line_starts
            .get(i + 1)
            .map_or(self.text.len(), |&e| e as usize);
        Some(self.text[start..end].trim_end_matches(['\n', '\r']))
    }

    /// Number of lines (an empty file has one).
    pub fn line_count(&self) -> usize {
        self.line_starts.len()
    }
}

/// Line terminators, matching the ones the diagnostic renderer (ariadne)
/// uses, so that `line:col` agrees between the short and the long form.
fn is_line_separator(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\x0B' | '\x0C' | '\u{0085}' | '\u{2028}' | '\u{2029}'
    )
}

fn compute_line_starts(text: &str) -> Vec<u32> {
    let mut starts = vec![0u32];
    let mut it = text.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if is_line_separator(c) {
            let mut end = i + c.len_utf8();
            if c == '\r' {
                if let Some(&(j, '\n')) = it.peek() {
                    it.next();
                    end = j + 1;
                }
            }
            starts.push(end as u32);
        }
    }
    starts
}

/// The largest char boundary `<= pos` (and `<= text.len()`).
pub(crate) fn floor_char_boundary(text: &str, pos: usize) -> usize {
    let mut p = pos.min(text.len());
    while !text.is_char_boundary(p) {
        p -= 1;
    }
    p
}

/// All source files of a compilation, indexed by [`FileId`].
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    /// An empty map.
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    /// Adds a file and returns its id.
    pub fn add_file(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        let id = FileId(self.files.len() as u32);
        self.files.push(SourceFile::new(name.into(), text.into()));
        id
    }

    /// The file with id `id`, if any.
    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    /// The file with id `id`.
    ///
    /// # Panics
    /// If `id` was not handed out by this map.
    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    /// The display name of file `id` (`"<unknown>"` for a foreign id).
    pub fn name(&self, id: FileId) -> &str {
        self.get(id).map_or("<unknown>", |f| f.name.as_str())
    }

    /// The text of file `id` (empty for a foreign id).
    pub fn text(&self, id: FileId) -> &str {
        self.get(id).map_or("", |f| f.text.as_str())
    }

    /// The 1-based `(line, column)` of the start of `span`; columns count
    /// characters. A span from an unknown file gives `(0, 0)`.
    pub fn line_col(&self, span: Span) -> (u32, u32) {
        self.get(span.file).map_or((0, 0), |f| f.line_col(span.lo))
    }

    /// The source text covered by `span` (clamped to char boundaries).
    pub fn snippet(&self, span: Span) -> &str {
        let text = self.text(span.file);
        let lo = floor_char_boundary(text, span.lo as usize);
        let hi = floor_char_boundary(text, span.hi as usize).max(lo);
        &text[lo..hi]
    }

    /// Iterates over `(id, file)` pairs.
    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| (FileId(i as u32), f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_is_one_based() {
        let mut sm = SourceMap::new();
        let f = sm.add_file("a.adj", "ab\ncd\r\nλx\n");
        assert_eq!(sm.line_col(Span::point(f, 0)), (1, 1));
        assert_eq!(sm.line_col(Span::point(f, 1)), (1, 2));
        assert_eq!(sm.line_col(Span::point(f, 3)), (2, 1));
        assert_eq!(sm.line_col(Span::point(f, 7)), (3, 1));
        // after the two-byte λ: column 2 in characters
        assert_eq!(sm.line_col(Span::point(f, 9)), (3, 2));
        // inside λ: clamped back to its start
        assert_eq!(sm.line_col(Span::point(f, 8)), (3, 1));
        // past the end: clamped
        assert_eq!(sm.line_col(Span::point(f, 999)), (4, 1));
        assert_eq!(sm.file(f).line_text(2), Some("cd"));
        assert_eq!(sm.line_col(Span::point(FileId(9), 0)), (0, 0));
    }
}
