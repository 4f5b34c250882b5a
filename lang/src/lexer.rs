//! The lexer: source text → tokens with byte spans.
//!
//! The heavy lifting is a [logos] automaton over a raw token enum; a thin wrapper
//! ([`lex`]) then applies the rules that need context:
//!
//! - **tuple indices**: after an identifier, `)`, `]` or a tuple index, a `.`
//!   followed by digits is lexed as [`Tok::Dot`] + [`Tok::Int`] (`t.0.1`,
//!   `shape(x).1`), never as a float `.0`;
//! - **record braces**: a `{` followed by `ident :` becomes
//!   [`Tok::RecLBrace`], so the grammar can tell the record `{ w: w0 }` from a
//!   block without extra lookahead;
//! - literal decoding (ints with `_`, string escapes) and error reporting.
//!
//! Errors (a bad character, an unterminated string or comment, a bad escape,
//! an int that does not fit in `i64`) become diagnostics and lexing carries
//! on: the bad bytes are skipped and never reach the parser.

use logos::{Lexer, Logos};

use crate::diagnostic::Diagnostic;
use crate::span::{FileId, Span};

/// The raw logos token kinds. Context-free; see [`lex`] for the wrapper.
#[derive(Logos, Clone, Copy, Debug, PartialEq, Eq)]
#[logos(skip r"[ \t\r\n\f\x0B]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
enum RawTok {
    // keywords
    #[token("fn")]
    Fn,
    #[token("bprop")]
    Bprop,
    #[token("let")]
    Let,
    #[token("mut")]
    Mut,
    #[token("if")]
    If,
    #[token("else")]
    Else,
    #[token("for")]
    For,
    #[token("in")]
    In,
    #[token("while")]
    While,
    #[token("break")]
    Break,
    #[token("continue")]
    Continue,
    #[token("return")]
    Return,
    #[token("import")]
    Import,
    #[token("as")]
    As,
    #[token("true")]
    True,
    #[token("false")]
    False,

    // literals
    #[regex("[A-Za-z_][A-Za-z0-9_]*")]
    Ident,
    #[regex("[0-9][0-9_]*")]
    Int,
    #[regex(r"[0-9][0-9_]*\.[0-9][0-9_]*([eE][+-]?[0-9][0-9_]*)?")]
    #[regex(r"\.[0-9][0-9_]*([eE][+-]?[0-9][0-9_]*)?")]
    #[regex(r"[0-9][0-9_]*[eE][+-]?[0-9][0-9_]*")]
    Float,
    /// `"...`: `true` when the closing quote was found on the same line.
    #[token("\"", lex_string)]
    Str(bool),
    /// `/* ... */`, nesting: `true` when closed. Skipped by [`lex`].
    #[token("/*", lex_block_comment)]
    BlockComment(bool),

    // operators
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
    #[token("**")]
    StarStar,
    #[token("@")]
    At,
    #[token("==")]
    EqEq,
    #[token("!=")]
    NotEq,
    #[token("<")]
    Lt,
    #[token("<=")]
    Le,
    #[token(">")]
    Gt,
    #[token(">=")]
    Ge,
    #[token("&&")]
    AndAnd,
    #[token("||")]
    OrOr,
    #[token("!")]
    Bang,
    #[token("=")]
    Eq,
    #[token("+=")]
    PlusEq,
    #[token("-=")]
    MinusEq,
    #[token("*=")]
    StarEq,
    #[token("/=")]
    SlashEq,
    #[token("..")]
    DotDot,
    #[token(":")]
    Colon,
    #[token(",")]
    Comma,
    #[token(";")]
    Semi,
    #[token(".")]
    Dot,
    #[token("|")]
    Pipe,
    #[token("->")]
    Arrow,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
}

/// Scans the rest of a string literal after its opening quote. Stops after
/// the closing quote (returns `true`) or before a newline / at the end of
/// the input (returns `false`: unterminated).
fn lex_string(lex: &mut Lexer<'_, RawTok>) -> bool {
    let rem = lex.remainder().as_bytes();
    let mut i = 0;
    while i < rem.len() {
        match rem[i] {
            b'"' => {
                lex.bump(i + 1);
                return true;
            }
            b'\\' if i + 1 < rem.len() && matches!(rem[i + 1], b'"' | b'\\') => i += 2,
            b'\n' => {
                lex.bump(i);
                return false;
            }
            _ => i += 1,
        }
    }
    lex.bump(rem.len());
    false
}

/// Skips a (nesting) block comment after its opening `/*`.
fn lex_block_comment(lex: &mut Lexer<'_, RawTok>) -> bool {
    let rem = lex.remainder().as_bytes();
    let mut depth = 1usize;
    let mut i = 0;
    while i < rem.len() {
        if rem[i] == b'/' && rem.get(i + 1) == Some(&b'*') {
            depth += 1;
            i += 2;
        } else if rem[i] == b'*' && rem.get(i + 1) == Some(&b'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                lex.bump(i);
                return true;
            }
        } else {
            i += 1;
        }
    }
    lex.bump(rem.len());
    false
}

/// A token as the parser sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Tok<'a> {
    /// An identifier (including `_`).
    Ident(&'a str),
    /// An integer literal, `_` removed (0 after an overflow, which is
    /// reported).
    Int(i64),
    /// A float literal, as written.
    Float(&'a str),
    /// A string literal, escapes decoded.
    Str(String),
    /// `fn`
    KwFn,
    /// `bprop`
    KwBprop,
    /// `let`
    KwLet,
    /// `mut`
    KwMut,
    /// `if`
    KwIf,
    /// `else`
    KwElse,
    /// `for`
    KwFor,
    /// `in`
    KwIn,
    /// `while`
    KwWhile,
    /// `break`
    KwBreak,
    /// `continue`
    KwContinue,
    /// `return`
    KwReturn,
    /// `import`
    KwImport,
    /// `as`
    KwAs,
    /// `true`
    KwTrue,
    /// `false`
    KwFalse,
    /// `+`
    Plus,
    /// `-`
    Minus,
    /// `*`
    Star,
    /// `/`
    Slash,
    /// `%`
    Percent,
    /// `**`
    StarStar,
    /// `@`
    At,
    /// `==`
    EqEq,
    /// `!=`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `&&`
    AndAnd,
    /// `||`
    OrOr,
    /// `!`
    Bang,
    /// `=`
    Eq,
    /// `+=`
    PlusEq,
    /// `-=`
    MinusEq,
    /// `*=`
    StarEq,
    /// `/=`
    SlashEq,
    /// `..`
    DotDot,
    /// `:`
    Colon,
    /// `,`
    Comma,
    /// `;`
    Semi,
    /// `.`
    Dot,
    /// `|`
    Pipe,
    /// `->`
    Arrow,
    /// `(`
    LParen,
    /// `)`
    RParen,
    /// `[`
    LBracket,
    /// `]`
    RBracket,
    /// `{` opening a block (or a record pattern / empty braces).
    LBrace,
    /// `{` followed by `ident :` — opens a record expression or type.
    RecLBrace,
    /// `}`
    RBrace,
}

impl Tok<'_> {
    /// How the token is named in messages: `` `;` ``, ``identifier `x` ``.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier `{s}`"),
            Tok::Int(v) => format!("integer `{v}`"),
            Tok::Float(s) => format!("number `{s}`"),
            Tok::Str(_) => "a string".to_string(),
            other => format!("`{}`", other.text()),
        }
    }

    /// The fixed spelling of punctuation and keywords (`""` for literals).
    pub fn text(&self) -> &'static str {
        match self {
            Tok::Ident(_) | Tok::Int(_) | Tok::Float(_) | Tok::Str(_) => "",
            Tok::KwFn => "fn",
            Tok::KwBprop => "bprop",
            Tok::KwLet => "let",
            Tok::KwMut => "mut",
            Tok::KwIf => "if",
            Tok::KwElse => "else",
            Tok::KwFor => "for",
            Tok::KwIn => "in",
            Tok::KwWhile => "while",
            Tok::KwBreak => "break",
            Tok::KwContinue => "continue",
            Tok::KwReturn => "return",
            Tok::KwImport => "import",
            Tok::KwAs => "as",
            Tok::KwTrue => "true",
            Tok::KwFalse => "false",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Percent => "%",
            Tok::StarStar => "**",
            Tok::At => "@",
            Tok::EqEq => "==",
            Tok::NotEq => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::AndAnd => "&&",
            Tok::OrOr => "||",
            Tok::Bang => "!",
            Tok::Eq => "=",
            Tok::PlusEq => "+=",
            Tok::MinusEq => "-=",
            Tok::StarEq => "*=",
            Tok::SlashEq => "/=",
            Tok::DotDot => "..",
            Tok::Colon => ":",
            Tok::Comma => ",",
            Tok::Semi => ";",
            Tok::Dot => ".",
            Tok::Pipe => "|",
            Tok::Arrow => "->",
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace | Tok::RecLBrace => "{",
            Tok::RBrace => "}",
        }
    }

    /// Whether this token opens a bracket (`(`, `[`, `{`).
    pub fn is_open(&self) -> bool {
        matches!(
            self,
            Tok::LParen | Tok::LBracket | Tok::LBrace | Tok::RecLBrace
        )
    }

    /// Whether this token closes a bracket.
    pub fn is_close(&self) -> bool {
        matches!(self, Tok::RParen | Tok::RBracket | Tok::RBrace)
    }
}

/// A token with its byte range `(lo, tok, hi)` — the triple the parser eats.
pub type Spanned<'a> = (usize, Tok<'a>, usize);

/// The result of [`lex`].
#[derive(Debug, Default)]
pub struct Lexed<'a> {
    /// The tokens, in order.
    pub tokens: Vec<Spanned<'a>>,
    /// Lexical errors, in order.
    pub diags: Vec<Diagnostic>,
}

/// At most this many lexical errors are reported per file.
pub const MAX_LEX_ERRORS: usize = 50;

struct State<'a> {
    file: FileId,
    src: &'a str,
    tokens: Vec<Spanned<'a>>,
    diags: Vec<Diagnostic>,
    /// Unreported run of bad characters `(lo, hi)`.
    bad: Option<(usize, usize)>,
    suppressed: usize,
}

impl<'a> State<'a> {
    fn span(&self, lo: usize, hi: usize) -> Span {
        Span::new(self.file, lo as u32, hi as u32)
    }

    fn error(&mut self, d: Diagnostic) {
        if self.diags.len() < MAX_LEX_ERRORS {
            self.diags.push(d);
        } else {
            self.suppressed += 1;
        }
    }

    fn flush_bad(&mut self) {
        if let Some((lo, hi)) = self.bad.take() {
            let text = &self.src[lo..hi];
            let msg = if text.chars().count() == 1 {
                format!("unexpected character {}", show_chars(text))
            } else {
                format!("unexpected characters {}", show_chars(text))
            };
            let d = Diagnostic::error(msg, self.span(lo, hi)).with_label("not valid here");
            self.error(d);
        }
    }

    fn push(&mut self, lo: usize, tok: Tok<'a>, hi: usize) {
        self.flush_bad();
        self.tokens.push((lo, tok, hi));
    }

    fn int(&mut self, lo: usize, hi: usize) -> i64 {
        let text = &self.src[lo..hi];
        let digits: String = text.chars().filter(|&c| c != '_').collect();
        match digits.parse::<i64>() {
            Ok(v) => v,
            Err(_) => {
                let d = Diagnostic::error(
                    format!("integer literal `{text}` is too large"),
                    self.span(lo, hi),
                )
                .with_label("does not fit in a 64-bit signed integer");
                self.error(d);
                0
            }
        }
    }

    fn string(&mut self, lo: usize, hi: usize, closed: bool) -> String {
        let body_hi = if closed { hi - 1 } else { hi };
        let body = &self.src[lo + 1..body_hi];
        if !closed {
            let d = Diagnostic::error("unterminated string", self.span(lo, hi))
                .with_label("this string has no closing `\"` on its line");
            self.error(d);
        }
        let mut out = String::with_capacity(body.len());
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, 'r')) => out.push('\r'),
                Some((_, '0')) => out.push('\0'),
                Some((_, '"')) => out.push('"'),
                Some((_, '\\')) => out.push('\\'),
                Some((j, other)) => {
                    let elo = lo + 1 + i;
                    let ehi = lo + 1 + j + other.len_utf8();
                    let d = Diagnostic::error(
                        format!("unknown escape `\\{}` in string", other.escape_default()),
                        self.span(elo, ehi),
                    )
                    .with_label("unknown escape")
                    .with_note(r#"the escapes are \n \t \r \0 \" \\"#);
                    self.error(d);
                    out.push(other);
                }
                None => {
                    // a lone backslash at the end of an unterminated string
                    out.push('\\');
                }
            }
        }
        out
    }
}

/// Shows a run of bad characters in backquotes, escaping invisible ones.
fn show_chars(text: &str) -> String {
    let mut s = String::from("`");
    for c in text.chars().take(16) {
        if c.is_control() || c == '`' {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    if text.chars().count() > 16 {
        s.push('…');
    }
    s.push('`');
    s
}

/// Whether a tuple index may follow this token (`t.0`, `f(x).1`, `a[0].1`,
/// `t.0.1`).
fn ends_postfix(tok: &Tok<'_>) -> bool {
    matches!(tok, Tok::Ident(_) | Tok::RParen | Tok::RBracket)
}

/// Lexes `src` (of file `file`) into tokens. Never fails: errors are
/// returned as diagnostics next to the tokens that could be read.
pub fn lex(file: FileId, src: &str) -> Lexed<'_> {
    let mut st = State {
        file,
        src,
        tokens: Vec::new(),
        diags: Vec::new(),
        bad: None,
        suppressed: 0,
    };
    let mut lx = RawTok::lexer(src);
    // Whether the previous token allows a tuple index to follow.
    let mut postfix = false;
    loop {
        if postfix {
            let rem = lx.remainder();
            let trimmed = rem.trim_start_matches([' ', '\t', '\r', '\n']);
            let ws = rem.len() - trimmed.len();
            let b = trimmed.as_bytes();
            if b.len() >= 2 && b[0] == b'.' && b[1].is_ascii_digit() {
                let start = src.len() - rem.len() + ws;
                let ndigits = b[1..].iter().take_while(|c| c.is_ascii_digit()).count();
                st.push(start, Tok::Dot, start + 1);
                let v = st.int(start + 1, start + 1 + ndigits);
                st.push(start + 1, Tok::Int(v), start + 1 + ndigits);
                lx.bump(ws + 1 + ndigits);
                continue;
            }
        }
        let Some(res) = lx.next() else { break };
        let std::ops::Range { start: lo, end: hi } = lx.span();
        let raw = match res {
            Ok(raw) => raw,
            Err(()) => {
                st.bad = match st.bad {
                    Some((blo, bhi)) if bhi == lo => Some((blo, hi)),
                    Some(_) => {
                        st.flush_bad();
                        Some((lo, hi))
                    }
                    None => Some((lo, hi)),
                };
                continue;
            }
        };
        let tok = match raw {
            RawTok::BlockComment(closed) => {
                if !closed {
                    st.flush_bad();
                    let d = Diagnostic::error("unterminated block comment", st.span(lo, lo + 2))
                        .with_label("this comment is never closed")
                        .with_note("block comments nest: each `/*` needs its own `*/`");
                    st.error(d);
                }
                continue;
            }
            RawTok::Fn => Tok::KwFn,
            RawTok::Bprop => Tok::KwBprop,
            RawTok::Let => Tok::KwLet,
            RawTok::Mut => Tok::KwMut,
            RawTok::If => Tok::KwIf,
            RawTok::Else => Tok::KwElse,
            RawTok::For => Tok::KwFor,
            RawTok::In => Tok::KwIn,
            RawTok::While => Tok::KwWhile,
            RawTok::Break => Tok::KwBreak,
            RawTok::Continue => Tok::KwContinue,
            RawTok::Return => Tok::KwReturn,
            RawTok::Import => Tok::KwImport,
            RawTok::As => Tok::KwAs,
            RawTok::True => Tok::KwTrue,
            RawTok::False => Tok::KwFalse,
            RawTok::Ident => Tok::Ident(&src[lo..hi]),
            RawTok::Int => {
                st.flush_bad();
                Tok::Int(st.int(lo, hi))
            }
            RawTok::Float => Tok::Float(&src[lo..hi]),
            RawTok::Str(closed) => {
                st.flush_bad();
                Tok::Str(st.string(lo, hi, closed))
            }
            RawTok::Plus => Tok::Plus,
            RawTok::Minus => Tok::Minus,
            RawTok::Star => Tok::Star,
            RawTok::Slash => Tok::Slash,
            RawTok::Percent => Tok::Percent,
            RawTok::StarStar => Tok::StarStar,
            RawTok::At => Tok::At,
            RawTok::EqEq => Tok::EqEq,
            RawTok::NotEq => Tok::NotEq,
            RawTok::Lt => Tok::Lt,
            RawTok::Le => Tok::Le,
            RawTok::Gt => Tok::Gt,
            RawTok::Ge => Tok::Ge,
            RawTok::AndAnd => Tok::AndAnd,
            RawTok::OrOr => Tok::OrOr,
            RawTok::Bang => Tok::Bang,
            RawTok::Eq => Tok::Eq,
            RawTok::PlusEq => Tok::PlusEq,
            RawTok::MinusEq => Tok::MinusEq,
            RawTok::StarEq => Tok::StarEq,
            RawTok::SlashEq => Tok::SlashEq,
            RawTok::DotDot => Tok::DotDot,
            RawTok::Colon => Tok::Colon,
            RawTok::Comma => Tok::Comma,
            RawTok::Semi => Tok::Semi,
            RawTok::Dot => Tok::Dot,
            RawTok::Pipe => Tok::Pipe,
            RawTok::Arrow => Tok::Arrow,
            RawTok::LParen => Tok::LParen,
            RawTok::RParen => Tok::RParen,
            RawTok::LBracket => Tok::LBracket,
            RawTok::RBracket => Tok::RBracket,
            RawTok::LBrace => Tok::LBrace,
            RawTok::RBrace => Tok::RBrace,
        };
        postfix = ends_postfix(&tok);
        st.push(lo, tok, hi);
    }
    st.flush_bad();
    if st.suppressed > 0 {
        let end = src.len();
        let d = Diagnostic::error(
            format!("{} more lexical errors not shown", st.suppressed),
            st.span(end, end),
        );
        st.diags.push(d);
    }
    // A `{` directly followed by `ident :` opens a record.
    let toks = &mut st.tokens;
    for i in 0..toks.len() {
        if toks[i].1 == Tok::LBrace
            && matches!(toks.get(i + 1), Some((_, Tok::Ident(_), _)))
            && matches!(toks.get(i + 2), Some((_, Tok::Colon, _)))
        {
            toks[i].1 = Tok::RecLBrace;
        }
    }
    Lexed {
        tokens: st.tokens,
        diags: st.diags,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok<'_>> {
        let l = lex(FileId(0), src);
        assert!(l.diags.is_empty(), "{src:?}: {:?}", l.diags);
        l.tokens.into_iter().map(|t| t.1).collect()
    }

    #[test]
    fn keywords_and_idents() {
        use Tok::*;
        assert_eq!(
            toks("fn bprop let mut if else for in while break continue return import as true false fnx _ _a1"),
            vec![
                KwFn, KwBprop, KwLet, KwMut, KwIf, KwElse, KwFor, KwIn, KwWhile, KwBreak,
                KwContinue, KwReturn, KwImport, KwAs, KwTrue, KwFalse, Ident("fnx"), Ident("_"),
                Ident("_a1")
            ]
        );
    }

    #[test]
    fn numbers() {
        use Tok::*;
        assert_eq!(toks("0 42 1_000"), vec![Int(0), Int(42), Int(1000)]);
        assert_eq!(
            toks("1.0 .5 1e-3 2.5e+4 1E5"),
            vec![
                Float("1.0"),
                Float(".5"),
                Float("1e-3"),
                Float("2.5e+4"),
                Float("1E5")
            ]
        );
        // a float needs a digit after its dot
        assert_eq!(toks("1."), vec![Int(1), Dot]);
        assert_eq!(toks("0..10"), vec![Int(0), DotDot, Int(10)]);
        assert_eq!(toks("1..2"), vec![Int(1), DotDot, Int(2)]);
        assert_eq!(toks("a..b"), vec![Ident("a"), DotDot, Ident("b")]);
    }

    #[test]
    fn tuple_index() {
        use Tok::*;
        assert_eq!(toks("t.0"), vec![Ident("t"), Dot, Int(0)]);
        assert_eq!(toks("t.0.1"), vec![Ident("t"), Dot, Int(0), Dot, Int(1)]);
        assert_eq!(
            toks("shape(x).1"),
            vec![Ident("shape"), LParen, Ident("x"), RParen, Dot, Int(1)]
        );
        assert_eq!(
            toks("a[0].12"),
            vec![Ident("a"), LBracket, Int(0), RBracket, Dot, Int(12)]
        );
        assert_eq!(toks("t .1"), vec![Ident("t"), Dot, Int(1)]);
        // not after a number or an operator
        assert_eq!(toks("x + .5"), vec![Ident("x"), Plus, Float(".5")]);
        assert_eq!(toks("(.5)"), vec![LParen, Float(".5"), RParen]);
        assert_eq!(
            toks("t.w.0"),
            vec![Ident("t"), Dot, Ident("w"), Dot, Int(0)]
        );
    }

    #[test]
    fn operators() {
        use Tok::*;
        assert_eq!(
            toks("** * @ .. . -> - += -= *= /= && || ! != == = | <= < >= > % / : , ;"),
            vec![
                StarStar, Star, At, DotDot, Dot, Arrow, Minus, PlusEq, MinusEq, StarEq, SlashEq,
                AndAnd, OrOr, Bang, NotEq, EqEq, Eq, Pipe, Le, Lt, Ge, Gt, Percent, Slash, Colon,
                Comma, Semi
            ]
        );
    }

    #[test]
    fn strings_and_comments() {
        use Tok::*;
        assert_eq!(
            toks(r#""a\n\t\"\\b" // c"#),
            vec![Str("a\n\t\"\\b".to_string())]
        );
        assert_eq!(
            toks("a /* x /* nested */ still */ b"),
            vec![Ident("a"), Ident("b")]
        );
        assert_eq!(toks("a // x\nb"), vec![Ident("a"), Ident("b")]);
    }

    #[test]
    fn record_brace() {
        use Tok::*;
        assert_eq!(
            toks("{ w: 1 } { w } {}"),
            vec![
                RecLBrace,
                Ident("w"),
                Colon,
                Int(1),
                RBrace,
                LBrace,
                Ident("w"),
                RBrace,
                LBrace,
                RBrace
            ]
        );
    }

    #[test]
    fn errors_continue() {
        let l = lex(FileId(0), "a $$ b \"open\nc /* never");
        let kinds: Vec<_> = l.tokens.iter().map(|t| t.1.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Tok::Ident("a"),
                Tok::Ident("b"),
                Tok::Str("open".into()),
                Tok::Ident("c")
            ]
        );
        let msgs: Vec<_> = l.diags.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(
            msgs,
            vec![
                "unexpected characters `$$`",
                "unterminated string",
                "unterminated block comment"
            ]
        );
        let l = lex(FileId(0), r#""\q" 99999999999999999999"#);
        assert_eq!(l.diags.len(), 2, "{:?}", l.diags);
    }

    #[test]
    fn non_ascii() {
        let l = lex(FileId(0), "λ x é\u{0}");
        assert_eq!(l.tokens.len(), 1);
        assert_eq!(l.diags.len(), 2);
        let l = lex(FileId(0), "\"é\\é\"");
        assert_eq!(l.tokens.len(), 1);
    }
}
