//! The IR text format, reading side: parses what [`super::print`] writes
//! (grammar in `docs/ir.md`).
//!
//! Node numbers and graph names may be used before they are defined (a
//! nested graph may be printed before or after the graph whose nodes it
//! uses), so parsing is two passes: the text is read into a small syntax
//! tree, then the module is built and every reference resolved. Types are
//! not interpreted: they are kept as text in [`Parsed::types`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use adjoint_runtime::tensor::{DType, Tensor};

use super::print::is_name_char;
use super::{Const, GraphId, GraphRole, Loc, Module, NodeId};
use crate::prim::Prim;

/// A syntax error, or a reference to an undefined node or graph, at a
/// 1-based line and column (columns count characters).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
}

/// A parsed module with the types written in the text.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    pub module: Module,
    /// Every graph, in the order of the text.
    pub graphs: Vec<GraphId>,
    /// The type text written after parameters (`%0: f32[4]`), applications
    /// (`%2 = .. : f32[4]`) and graph results (`-> f32[]`, recorded for the
    /// output node unless it has a type of its own already).
    pub types: HashMap<NodeId, String>,
}

/// Parses a module; returns it with its graphs in text order. Printing
/// those graphs as roots gives the text back (for text the printer wrote).
pub fn parse_module(text: &str) -> Result<(Module, Vec<GraphId>), ParseError> {
    let p = parse_module_with_types(text)?;
    Ok((p.module, p.graphs))
}

/// Like [`parse_module`], also returning the types written in the text.
pub fn parse_module_with_types(text: &str) -> Result<Parsed, ParseError> {
    let graphs = Reader::new(text).module()?;
    build(text, graphs)
}

// ---------------------------------------------------------------------------
// Syntax tree

#[derive(Debug)]
enum Value {
    Node(u32),
    Graph(String),
    Const(Const),
}

#[derive(Debug)]
struct Spanned<T> {
    at: usize,
    item: T,
}

#[derive(Debug)]
enum Callee {
    Prim(Prim),
    Value(Spanned<Value>),
}

#[derive(Debug)]
struct Stmt {
    at: usize,
    num: u32,
    callee: Callee,
    args: Vec<Spanned<Value>>,
    ty: Option<String>,
}

#[derive(Debug)]
struct ParamAst {
    at: usize,
    num: u32,
    name: String,
    ty: Option<String>,
}

#[derive(Debug)]
struct GraphAst {
    at: usize,
    name: String,
    role: GraphRole,
    params: Vec<ParamAst>,
    ret_ty: Option<String>,
    stmts: Vec<Stmt>,
    ret: Option<Spanned<Value>>,
}

// ---------------------------------------------------------------------------
// Reading

struct Reader<'a> {
    src: &'a str,
    pos: usize,
    prims: HashMap<&'static str, Prim>,
}

fn line_col(src: &str, pos: usize) -> (u32, u32) {
    let pos = pos.min(src.len());
    let before = &src[..pos];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = src[start..pos].chars().count() + 1;
    (line as u32, col as u32)
}

fn error_at(src: &str, pos: usize, message: impl Into<String>) -> ParseError {
    let (line, col) = line_col(src, pos);
    ParseError {
        line,
        col,
        message: message.into(),
    }
}

type R<T> = Result<T, ParseError>;

impl<'a> Reader<'a> {
    fn new(src: &'a str) -> Reader<'a> {
        Reader {
            src,
            pos: 0,
            prims: Prim::all().iter().map(|&p| (p.name(), p)).collect(),
        }
    }

    fn err<T>(&self, at: usize, message: impl Into<String>) -> R<T> {
        Err(error_at(self.src, at, message))
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Skips spaces, tabs and a `//` comment, but not a newline.
    fn ws(&mut self) {
        loop {
            match self.peek() {
                Some(' ') | Some('\t') => {
                    self.pos += 1;
                }
                Some('/') if self.rest().starts_with("//") => {
                    let n = self.rest().find('\n').unwrap_or(self.rest().len());
                    self.pos += n;
                }
                _ => return,
            }
        }
    }

    /// Skips whitespace, comments and newlines.
    fn blank(&mut self) {
        loop {
            self.ws();
            match self.peek() {
                Some('\n') => self.pos += 1,
                Some('\r') if self.rest().starts_with("\r\n") => self.pos += 2,
                _ => return,
            }
        }
    }

    fn describe_here(&self) -> String {
        match self.peek() {
            None => "end of input".into(),
            Some('\n') | Some('\r') => "end of line".into(),
            Some(c) => format!("`{c}`"),
        }
    }

    fn expect(&mut self, c: char, what: &str) -> R<()> {
        self.ws();
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            Ok(())
        } else {
            self.err(
                self.pos,
                format!("expected {what}, found {}", self.describe_here()),
            )
        }
    }

    fn end_of_line(&mut self) -> R<()> {
        self.ws();
        match self.peek() {
            None => Ok(()),
            Some('\n') => {
                self.pos += 1;
                Ok(())
            }
            Some('\r') if self.rest().starts_with("\r\n") => {
                self.pos += 2;
                Ok(())
            }
            _ => self.err(
                self.pos,
                format!("expected end of line, found {}", self.describe_here()),
            ),
        }
    }

    /// A bare word: letters, digits, `_`, `.`, `$`, not starting with a digit.
    fn word(&mut self) -> Option<&'a str> {
        let rest = self.rest();
        let mut chars = rest.char_indices();
        match chars.next() {
            Some((_, c)) if c.is_ascii_alphabetic() || c == '_' => {}
            _ => return None,
        }
        let end = chars
            .find(|&(_, c)| !is_name_char(c))
            .map_or(rest.len(), |(i, _)| i);
        self.pos += end;
        Some(&rest[..end])
    }

    fn keyword(&mut self, kw: &str) -> bool {
        let save = self.pos;
        if self.word() == Some(kw) {
            true
        } else {
            self.pos = save;
            false
        }
    }

    fn string_lit(&mut self) -> R<String> {
        let start = self.pos;
        if self.bump() != Some('"') {
            return self.err(start, "expected a string");
        }
        let mut s = String::new();
        loop {
            let at = self.pos;
            match self.bump() {
                None | Some('\n') => return self.err(start, "unterminated string"),
                Some('"') => return Ok(s),
                Some('\\') => match self.bump() {
                    Some('\\') => s.push('\\'),
                    Some('"') => s.push('"'),
                    Some('n') => s.push('\n'),
                    Some('r') => s.push('\r'),
                    Some('t') => s.push('\t'),
                    Some('0') => s.push('\0'),
                    Some('u') => {
                        if self.bump() != Some('{') {
                            return self.err(at, "expected `{` after `\\u`");
                        }
                        let hex_start = self.pos;
                        let Some(close) = self.rest().find('}') else {
                            return self.err(at, "unterminated `\\u{..}` escape");
                        };
                        let hex = &self.src[hex_start..hex_start + close];
                        self.pos = hex_start + close + 1;
                        match u32::from_str_radix(hex, 16).ok().and_then(char::from_u32) {
                            Some(c) => s.push(c),
                            None => return self.err(at, format!("bad escape `\\u{{{hex}}}`")),
                        }
                    }
                    _ => return self.err(at, "unknown escape in string"),
                },
                Some(c) => s.push(c),
            }
        }
    }

    /// A graph or parameter name: a bare word or a string.
    fn name(&mut self, what: &str) -> R<String> {
        if self.peek() == Some('"') {
            return self.string_lit();
        }
        match self.word() {
            Some(w) => Ok(w.to_string()),
            None => self.err(
                self.pos,
                format!("expected {what}, found {}", self.describe_here()),
            ),
        }
    }

    fn node_num(&mut self) -> R<u32> {
        let start = self.pos;
        if self.bump() != Some('%') {
            return self.err(start, "expected a node `%N`");
        }
        let digits = self
            .rest()
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(self.rest().len());
        if digits == 0 {
            return self.err(self.pos, "expected a node number after `%`");
        }
        let text = &self.rest()[..digits];
        self.pos += digits;
        text.parse::<u32>()
            .or_else(|_| self.err(start, format!("node number `%{text}` is too large")))
    }

    /// The text of a type after `:` up to a `,` or `)` outside brackets.
    fn param_type(&mut self) -> R<String> {
        self.ws();
        let start = self.pos;
        let mut depth = 0i32;
        loop {
            match self.peek() {
                None | Some('\n') | Some('\r') => {
                    return self.err(self.pos, "unterminated parameter type")
                }
                Some('"') => {
                    self.string_lit()?;
                }
                Some(c @ ('(' | '[' | '{')) => {
                    depth += 1;
                    self.pos += c.len_utf8();
                }
                Some(c @ (')' | ']' | '}')) => {
                    if depth == 0 {
                        if c == ')' {
                            break;
                        }
                        return self.err(self.pos, format!("unbalanced `{c}` in type"));
                    }
                    depth -= 1;
                    self.pos += 1;
                }
                Some(',') if depth == 0 => break,
                Some(c) => self.pos += c.len_utf8(),
            }
        }
        let ty = self.src[start..self.pos].trim_end();
        if ty.is_empty() {
            return self.err(start, "expected a type after `:`");
        }
        Ok(ty.to_string())
    }

    /// The rest of the line as a type (a `//` comment ends it).
    fn line_type(&mut self) -> R<String> {
        self.ws();
        let start = self.pos;
        let line = &self.rest()[..self.rest().find('\n').unwrap_or(self.rest().len())];
        let end = line.find("//").unwrap_or(line.len());
        let ty = line[..end].trim_end();
        if ty.is_empty() {
            return self.err(start, "expected a type after `:`");
        }
        self.pos += ty.len();
        Ok(ty.to_string())
    }

    fn module(mut self) -> R<Vec<GraphAst>> {
        let mut graphs = Vec::new();
        loop {
            self.blank();
            if self.peek().is_none() {
                return Ok(graphs);
            }
            let at = self.pos;
            let role = match self.word().and_then(GraphRole::from_keyword) {
                Some(role) => {
                    self.ws();
                    role
                }
                None => {
                    self.pos = at;
                    GraphRole::Primal
                }
            };
            let kw = self.pos;
            if !self.keyword("graph") {
                let expected = if role == GraphRole::Primal {
                    "`graph` or a graph role"
                } else {
                    "`graph`"
                };
                return self.err(
                    kw,
                    format!("expected {expected}, found {}", self.describe_here()),
                );
            }
            let mut graph = self.graph(at)?;
            graph.role = role;
            graphs.push(graph);
        }
    }

    fn graph(&mut self, at: usize) -> R<GraphAst> {
        self.expect('@', "`@` and a graph name")?;
        let name = self.name("a graph name")?;
        self.expect('(', "`(`")?;
        let mut params = Vec::new();
        self.ws();
        if self.peek() != Some(')') {
            loop {
                self.ws();
                let pat = self.pos;
                let num = self.node_num()?;
                self.ws();
                let pname = match self.peek() {
                    Some('"') => self.string_lit()?,
                    Some(c) if c.is_ascii_alphabetic() || c == '_' => self.name("a name")?,
                    _ => String::new(),
                };
                self.ws();
                let ty = if self.eat(":") {
                    Some(self.param_type()?)
                } else {
                    None
                };
                params.push(ParamAst {
                    at: pat,
                    num,
                    name: pname,
                    ty,
                });
                self.ws();
                if self.eat(",") {
                    continue;
                }
                break;
            }
        }
        self.expect(')', "`,` or `)`")?;
        self.ws();
        let ret_ty = if self.eat("->") {
            self.ws();
            let start = self.pos;
            let line = &self.rest()[..self.rest().find('\n').unwrap_or(self.rest().len())];
            let line = line.trim_end();
            let Some(brace) = line.rfind('{') else {
                return self.err(start + line.len(), "expected `{` at the end of the line");
            };
            let ty = line[..brace].trim_end();
            if ty.is_empty() {
                return self.err(start, "expected a type after `->`");
            }
            self.pos = start + brace;
            Some(ty.to_string())
        } else {
            None
        };
        self.expect('{', "`{`")?;
        self.end_of_line()?;
        let mut stmts = Vec::new();
        let mut ret: Option<Spanned<Value>> = None;
        loop {
            self.blank();
            let sat = self.pos;
            match self.peek() {
                None => return self.err(at, "graph is not closed by `}`"),
                Some('}') => {
                    self.pos += 1;
                    self.end_of_line()?;
                    break;
                }
                _ => {}
            }
            if ret.is_some() {
                return self.err(sat, "expected `}` after `return`");
            }
            if self.keyword("return") {
                self.ws();
                ret = Some(self.value()?);
                self.end_of_line()?;
                continue;
            }
            if self.peek() != Some('%') {
                return self.err(
                    sat,
                    format!(
                        "expected `%N = ..`, `return` or `}}`, found {}",
                        self.describe_here()
                    ),
                );
            }
            let num = self.node_num()?;
            self.expect('=', "`=`")?;
            self.ws();
            let callee = self.callee()?;
            self.expect('(', "`(`")?;
            let mut args = Vec::new();
            self.ws();
            if self.peek() != Some(')') {
                loop {
                    self.ws();
                    args.push(self.value()?);
                    self.ws();
                    if self.eat(",") {
                        continue;
                    }
                    break;
                }
            }
            self.expect(')', "`,` or `)`")?;
            self.ws();
            let ty = if self.eat(":") {
                Some(self.line_type()?)
            } else {
                None
            };
            self.end_of_line()?;
            stmts.push(Stmt {
                at: sat,
                num,
                callee,
                args,
                ty,
            });
        }
        Ok(GraphAst {
            at,
            name,
            role: GraphRole::Primal,
            params,
            ret_ty,
            stmts,
            ret,
        })
    }

    fn callee(&mut self) -> R<Callee> {
        let save = self.pos;
        if let Some(w) = self.word() {
            if let Some(p) = self.prims.get(w).copied() {
                return Ok(Callee::Prim(p));
            }
            self.pos = save;
        }
        Ok(Callee::Value(self.value()?))
    }

    fn value(&mut self) -> R<Spanned<Value>> {
        let at = self.pos;
        let item = match self.peek() {
            Some('%') => Value::Node(self.node_num()?),
            Some('@') => {
                self.pos += 1;
                Value::Graph(self.name("a graph name")?)
            }
            Some('"') => Value::Const(Const::Str(Arc::from(self.string_lit()?))),
            Some('(') => {
                self.pos += 1;
                self.expect(')', "`)` (only `()` is a constant)")?;
                Value::Const(Const::Unit)
            }
            Some(c) if c == '-' || c.is_ascii_digit() => Value::Const(self.number()?),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let w = self.word().unwrap_or_default();
                match w {
                    "true" => Value::Const(Const::Bool(true)),
                    "false" => Value::Const(Const::Bool(false)),
                    "inf" => Value::Const(Const::Float(f64::INFINITY)),
                    "nan" => Value::Const(Const::Float(f64::NAN)),
                    "tensor" => Value::Const(Const::Tensor(self.tensor(at)?)),
                    _ => {
                        if let Some(d) = DType::from_name(w) {
                            Value::Const(Const::DType(d))
                        } else if let Some(p) = w.strip_prefix("prim.") {
                            match self.prims.get(p).copied() {
                                Some(p) => Value::Const(Const::Prim(p)),
                                None => return self.err(at, format!("unknown primitive `{p}`")),
                            }
                        } else if self.prims.get(w).copied().is_some() {
                            return self.err(
                                at,
                                format!("a primitive used as a value is written `prim.{w}`"),
                            );
                        } else {
                            return self.err(at, format!("unknown name `{w}`"));
                        }
                    }
                }
            }
            _ => {
                return self.err(
                    at,
                    format!("expected a value, found {}", self.describe_here()),
                );
            }
        };
        Ok(Spanned { at, item })
    }

    /// The text of a number: `-`? digits (`.` digits?)? (e (+|-)? digits)?,
    /// or `-inf`. Returns the text and whether it is a float.
    fn number_text(&mut self) -> R<(&'a str, bool)> {
        let start = self.pos;
        let rest = self.rest();
        let b = rest.as_bytes();
        let mut i = 0;
        if b.first() == Some(&b'-') {
            i += 1;
            if rest[i..].starts_with("inf") && !rest[i + 3..].starts_with(is_name_char) {
                self.pos += i + 3;
                return Ok((&rest[..i + 3], true));
            }
        }
        let digits = |i: &mut usize| {
            let s = *i;
            while *i < b.len() && b[*i].is_ascii_digit() {
                *i += 1;
            }
            *i > s
        };
        if !digits(&mut i) {
            return self.err(start, "expected a number");
        }
        let mut float = false;
        if i < b.len() && b[i] == b'.' {
            float = true;
            i += 1;
            digits(&mut i);
        }
        if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
            float = true;
            i += 1;
            if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
                i += 1;
            }
            if !digits(&mut i) {
                return self.err(start, "expected digits in the exponent");
            }
        }
        if i < b.len() && (b[i] as char).is_ascii_alphabetic() {
            return self.err(start + i, "unexpected letter after a number");
        }
        self.pos += i;
        Ok((&rest[..i], float))
    }

    fn number(&mut self) -> R<Const> {
        let start = self.pos;
        let (text, float) = self.number_text()?;
        if float {
            parse_f64(text)
                .map(Const::Float)
                .ok_or_else(|| error_at(self.src, start, format!("bad float `{text}`")))
        } else {
            text.parse::<i64>()
                .map(Const::Int)
                .or_else(|_| self.err(start, format!("integer `{text}` is out of range")))
        }
    }

    /// After `tensor`: `<` `weak`? dtype `[` dims `]` `>` `[` elements `]`.
    fn tensor(&mut self, at: usize) -> R<Tensor> {
        self.expect('<', "`<` after `tensor`")?;
        self.ws();
        let weak = self.keyword("weak");
        self.ws();
        let dat = self.pos;
        let dtype = match self.word().and_then(DType::from_name) {
            Some(d) => d,
            None => return self.err(dat, "expected a dtype"),
        };
        self.expect('[', "`[`")?;
        let mut shape = Vec::new();
        self.ws();
        if self.peek() != Some(']') {
            loop {
                self.ws();
                let nat = self.pos;
                let (text, float) = self.number_text()?;
                match text.parse::<usize>() {
                    Ok(d) if !float => shape.push(d),
                    _ => return self.err(nat, format!("bad dimension `{text}`")),
                }
                self.ws();
                if self.eat(",") {
                    continue;
                }
                break;
            }
        }
        self.expect(']', "`,` or `]`")?;
        self.expect('>', "`>`")?;
        self.expect('[', "`[` and the elements")?;
        let mut elems: Vec<(usize, &'a str)> = Vec::new();
        self.ws();
        if self.peek() != Some(']') {
            loop {
                self.ws();
                let eat = self.pos;
                let text = match self.peek() {
                    Some(c) if c == '-' || c.is_ascii_digit() => self.number_text()?.0,
                    _ => match self.word() {
                        Some(w @ ("true" | "false" | "inf" | "nan")) => w,
                        _ => return self.err(eat, "expected a tensor element"),
                    },
                };
                elems.push((eat, text));
                self.ws();
                if self.eat(",") {
                    continue;
                }
                break;
            }
        }
        self.expect(']', "`,` or `]`")?;
        let size = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if size != Some(elems.len()) {
            return self.err(
                at,
                format!(
                    "tensor of shape {shape:?} needs {} elements, found {}",
                    size.map_or("too many".to_string(), |s| s.to_string()),
                    elems.len()
                ),
            );
        }
        fn conv<T>(
            r: &Reader<'_>,
            elems: &[(usize, &str)],
            dtype: DType,
            f: impl Fn(&str) -> Option<T>,
        ) -> R<Vec<T>> {
            elems
                .iter()
                .map(|&(at, s)| {
                    f(s).ok_or_else(|| error_at(r.src, at, format!("bad {dtype} element `{s}`")))
                })
                .collect()
        }
        let made = match dtype {
            DType::F32 => Tensor::from_vec(conv(self, &elems, dtype, parse_f32)?, &shape),
            DType::F64 => Tensor::from_vec(conv(self, &elems, dtype, parse_f64)?, &shape),
            DType::I32 => Tensor::from_vec(
                conv(self, &elems, dtype, |s| s.parse::<i32>().ok())?,
                &shape,
            ),
            DType::I64 => Tensor::from_vec(
                conv(self, &elems, dtype, |s| s.parse::<i64>().ok())?,
                &shape,
            ),
            DType::U8 => {
                Tensor::from_vec(conv(self, &elems, dtype, |s| s.parse::<u8>().ok())?, &shape)
            }
            DType::Bool => Tensor::from_vec(
                conv(self, &elems, dtype, |s| match s {
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => None,
                })?,
                &shape,
            ),
        };
        match made {
            Ok(t) => Ok(t.with_weak(weak)),
            Err(e) => self.err(at, e.message),
        }
    }
}

fn parse_f64(s: &str) -> Option<f64> {
    match s {
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

fn parse_f32(s: &str) -> Option<f32> {
    match s {
        "inf" => Some(f32::INFINITY),
        "-inf" => Some(f32::NEG_INFINITY),
        "nan" => Some(f32::NAN),
        _ => s.parse().ok(),
    }
}

// ---------------------------------------------------------------------------
// Building the module

fn build(src: &str, asts: Vec<GraphAst>) -> R<Parsed> {
    let mut m = Module::new();
    let mut by_name: HashMap<String, GraphId> = HashMap::new();
    let mut graphs = Vec::with_capacity(asts.len());
    for ast in &asts {
        let g = m.add_graph_as(ast.name.clone(), Loc::NONE, ast.role);
        if by_name.insert(ast.name.clone(), g).is_some() {
            return Err(error_at(
                src,
                ast.at,
                format!("graph `@{}` is defined twice", ast.name),
            ));
        }
        graphs.push(g);
    }
    let mut nodes: HashMap<u32, NodeId> = HashMap::new();
    let mut types: HashMap<NodeId, String> = HashMap::new();
    let define = |nodes: &mut HashMap<u32, NodeId>, num: u32, id: NodeId, at: usize| {
        if nodes.insert(num, id).is_some() {
            Err(error_at(src, at, format!("node `%{num}` is defined twice")))
        } else {
            Ok(())
        }
    };
    // Parameters and applications first (inputs filled in below), so that
    // references may point forwards.
    let mut stmt_ids: Vec<Vec<NodeId>> = Vec::with_capacity(asts.len());
    for (ast, &g) in asts.iter().zip(&graphs) {
        for p in &ast.params {
            let id = m.add_param(g, p.name.clone(), Loc::NONE);
            define(&mut nodes, p.num, id, p.at)?;
            if let Some(t) = &p.ty {
                types.insert(id, t.clone());
            }
        }
        let mut ids = Vec::with_capacity(ast.stmts.len());
        for s in &ast.stmts {
            let id = m.add_apply(g, Vec::new(), Loc::NONE);
            define(&mut nodes, s.num, id, s.at)?;
            if let Some(t) = &s.ty {
                types.insert(id, t.clone());
            }
            ids.push(id);
        }
        stmt_ids.push(ids);
    }
    let resolve = |m: &mut Module, v: &Spanned<Value>| -> R<NodeId> {
        match &v.item {
            Value::Node(num) => nodes
                .get(num)
                .copied()
                .ok_or_else(|| error_at(src, v.at, format!("node `%{num}` is not defined"))),
            Value::Graph(name) => match by_name.get(name) {
                Some(&h) => Ok(m.add_const(Const::Graph(h), Loc::NONE)),
                None => Err(error_at(
                    src,
                    v.at,
                    format!("graph `@{name}` is not defined"),
                )),
            },
            Value::Const(c) => Ok(m.add_const(c.clone(), Loc::NONE)),
        }
    };
    for ((ast, &g), ids) in asts.iter().zip(&graphs).zip(&stmt_ids) {
        for (s, &id) in ast.stmts.iter().zip(ids) {
            let mut inputs = Vec::with_capacity(s.args.len() + 1);
            inputs.push(match &s.callee {
                Callee::Prim(p) => m.add_const(Const::Prim(*p), Loc::NONE),
                Callee::Value(v) => resolve(&mut m, v)?,
            });
            for a in &s.args {
                inputs.push(resolve(&mut m, a)?);
            }
            m.node_mut(id).kind = super::NodeKind::Apply(inputs);
        }
        if let Some(r) = &ast.ret {
            let out = resolve(&mut m, r)?;
            m.set_output(g, out);
            if let Some(t) = &ast.ret_ty {
                types.entry(out).or_insert_with(|| t.clone());
            }
        }
    }
    Ok(Parsed {
        module: m,
        graphs,
        types,
    })
}

impl fmt::Display for Parsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let types = |n: NodeId| self.types.get(&n).cloned();
        f.write_str(&super::print::print_module(
            &self.module,
            &self.graphs,
            Some(&types),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let src = "ab\nçé x";
        assert_eq!(line_col(src, 0), (1, 1));
        assert_eq!(line_col(src, 3), (2, 1));
        assert_eq!(line_col(src, src.find('x').unwrap()), (2, 4));
    }

    #[test]
    fn accepts_crlf_and_no_final_newline() {
        let (m, gs) =
            parse_module("graph @f(%0 x) {\r\n  %1 = neg(%0)\r\n  return %1\r\n}").unwrap();
        assert_eq!(gs.len(), 1);
        assert_eq!(m.graph(gs[0]).param_names, vec!["x"]);
        assert_eq!(
            m.applied_prim(m.graph(gs[0]).output.unwrap()),
            Some(Prim::Neg)
        );
    }

    #[test]
    fn empty_text_is_an_empty_module() {
        let (m, gs) = parse_module("\n// nothing\n\n").unwrap();
        assert!(gs.is_empty() && m.nodes.is_empty());
    }

    #[test]
    fn prim_values_and_callees() {
        let text = "graph @f() {\n  %0 = prim.neg(prim.exp)\n  return %0\n}\n";
        let (m, gs) = parse_module(text).unwrap();
        let out = m.graph(gs[0]).output.unwrap();
        assert_eq!(m.applied_prim(out), Some(Prim::Neg));
        assert_eq!(m.as_const(m.inputs(out)[1]), Some(&Const::Prim(Prim::Exp)));
    }

    #[test]
    fn graph_roles_round_trip() {
        use crate::ir::print::print_module;
        use crate::ir::GraphRole;
        let mut text = String::new();
        for (i, role) in GraphRole::ALL.into_iter().enumerate() {
            if role != GraphRole::Primal {
                text.push_str(role.keyword());
                text.push(' ');
            }
            text.push_str(&format!("graph @g{i}(%{i} x) {{\n  return %{i}\n}}\n\n"));
        }
        let (m, gs) = parse_module(&text).unwrap();
        let roles: Vec<GraphRole> = gs.iter().map(|g| m.graph(*g).role).collect();
        assert_eq!(roles, GraphRole::ALL);
        assert_eq!(print_module(&m, &gs, None).trim_end(), text.trim_end());
        let err = parse_module("backward graph @f() {\n  return 1\n}\n").unwrap_err();
        assert!(
            err.to_string().contains("expected `graph` or a graph role"),
            "{err}"
        );
        let err = parse_module("backprop @f() {\n  return 1\n}\n").unwrap_err();
        assert!(err.to_string().contains("expected `graph`, found"), "{err}");
        assert_eq!(GraphRole::from_keyword("graph"), None);
    }
}
