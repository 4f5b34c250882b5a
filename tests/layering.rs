//! The layering check (`docs/architecture.md`, section `## Layers`): within
//! `compiler/src` and `runtime/src`, a module may use only modules of a
//! lower layer. The layers are the fenced block of that section, which this
//! test parses, so the document and the check cannot drift apart.
//!
//! A module's references are the paths in its source that name another
//! module of the same crate: `use crate::m::..`, `crate::m::x` in code,
//! `use crate::{a, b::{c, d}}` groups, `super::` paths that climb out to
//! another module, `self::` paths, and paths that start with the name of a
//! child module (`map::add` in `kernels/mod.rs`). `$crate::` in a macro
//! counts for the module that defines the macro. A path to a name the crate
//! root re-exports (`crate::Value`, a `#[macro_export]` macro) counts for
//! the module that defines it. Comments (doc links too) and string
//! literals are not read. Items under `#[cfg(test)]` (test modules, whether
//! inline or in their own file) do not count: tests may use any module, as
//! they are not part of the crate a program links.
//!
//! `cargo test --test layering` runs it alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// Lexing: identifiers, `::` and single punctuation characters, with their
// line numbers; comments and literals are skipped.

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

fn lex(src: &str) -> Vec<Token> {
    let s: Vec<char> = src.chars().collect();
    let n = s.len();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Skips a (possibly raw) string literal whose opening quote is at `q`
    // with `hashes` `#` before it (raw) or `None` (escapes apply); returns
    // the index after it.
    let skip_string = |q: usize, raw: Option<usize>, line: &mut usize| -> usize {
        let mut j = q + 1;
        while j < n {
            let c = s[j];
            if c == '\n' {
                *line += 1;
            }
            match raw {
                None if c == '\\' => {
                    if j + 1 < n && s[j + 1] == '\n' {
                        *line += 1;
                    }
                    j += 2;
                    continue;
                }
                None if c == '"' => return j + 1,
                Some(h) if c == '"' && (1..=h).all(|k| j + k < n && s[j + k] == '#') => {
                    return j + 1 + h;
                }
                _ => {}
            }
            j += 1;
        }
        n
    };
    while i < n {
        let c = s[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && i + 1 < n && s[i + 1] == '/' {
            while i < n && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && i + 1 < n && s[i + 1] == '*' {
            let mut depth = 0;
            while i < n {
                if s[i] == '/' && i + 1 < n && s[i + 1] == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && i + 1 < n && s[i + 1] == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if s[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(i, None, &mut line);
        } else if c == '\'' {
            // A character literal, or a lifetime or label (skipped quote).
            if i + 1 < n && s[i + 1] == '\\' {
                let mut j = i + 3;
                while j < n && s[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if i + 2 < n && s[i + 2] == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            while i < n
                && (is_ident_char(s[i]) || (s[i] == '.' && i + 1 < n && s[i + 1].is_ascii_digit()))
            {
                i += 1;
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < n && is_ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr");
            if prefix && i < n && s[i] == '"' {
                let raw = word.contains('r').then_some(0);
                i = skip_string(i, raw, &mut line);
            } else if prefix && word.contains('r') && i < n && s[i] == '#' {
                let mut j = i;
                while j < n && s[j] == '#' {
                    j += 1;
                }
                if j < n && s[j] == '"' {
                    i = skip_string(j, Some(j - i), &mut line);
                } else {
                    // A raw identifier `r#name`.
                    i += 1;
                }
            } else if word == "b" && i < n && s[i] == '\'' {
                // A byte literal: the quote is read as a character literal.
            } else {
                out.push(Token {
                    tok: Tok::Ident(word),
                    line,
                });
            }
        } else if c == ':' && i + 1 < n && s[i + 1] == ':' {
            out.push(Token {
                tok: Tok::Sep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Scanning one file: the modules it declares and the paths it uses.

/// How a path starts.
#[derive(Clone, Debug, PartialEq)]
enum Start {
    /// `crate::` (or `$crate::`)
    Crate,
    /// `super::` this many times
    Super(usize),
    /// `self::`
    SelfMod,
    /// A plain name: a path relative to the module if the name is one of
    /// its child modules.
    Name,
}

/// A path as written, in the (inline) module it appears in.
#[derive(Clone, Debug, PartialEq)]
struct RawPath {
    line: usize,
    /// The inline modules (`mod m { .. }`) around it, outermost first.
    inline: Vec<String>,
    start: Start,
    segs: Vec<String>,
}

#[derive(Debug, Default)]
struct FileScan {
    /// `mod name;` declarations: (inline modules around it, name).
    child_files: Vec<(Vec<String>, String)>,
    /// `mod name { .. }` modules, as paths of inline names.
    inline_mods: Vec<Vec<String>>,
    /// `#[macro_export]` macros: (inline modules around it, name).
    exported_macros: Vec<(Vec<String>, String)>,
    paths: Vec<RawPath>,
    /// The whole file is `#![cfg(test)]`.
    test_only: bool,
}

fn ident(t: Option<&Token>) -> Option<&str> {
    match t {
        Some(Token {
            tok: Tok::Ident(s), ..
        }) => Some(s),
        _ => None,
    }
}

fn is_punct(t: Option<&Token>, c: char) -> bool {
    matches!(t, Some(Token { tok: Tok::Punct(p), .. }) if *p == c)
}

fn is_sep(t: Option<&Token>) -> bool {
    matches!(t, Some(Token { tok: Tok::Sep, .. }))
}

/// The index after the bracketed group that opens at `i` (`(`, `[` or `{`).
fn skip_group(toks: &[Token], i: usize) -> usize {
    let mut depth = 0i64;
    let mut j = i;
    while j < toks.len() {
        match toks[j].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    toks.len()
}

/// The index after the item that starts at `i`: up to a `;` or the end of
/// a `{ .. }` block at the item's own level.
fn skip_item(toks: &[Token], i: usize) -> usize {
    let mut j = i;
    while j < toks.len() {
        match toks[j].tok {
            Tok::Punct(';') => return j + 1,
            Tok::Punct('{') => return skip_group(toks, j),
            Tok::Punct('(' | '[') => j = skip_group(toks, j),
            _ => j += 1,
        }
    }
    toks.len()
}

/// Parses the rest of a path after its first segment: `(:: seg)*`, ending
/// in a `{ .. }` group or `*`; pushes every full path it stands for.
/// Returns the index after it.
fn parse_tail(
    toks: &[Token],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut segs = prefix;
    while is_sep(toks.get(i)) {
        if let Some(name) = ident(toks.get(i + 1)) {
            segs.push(name.to_string());
            i += 2;
        } else if is_punct(toks.get(i + 1), '{') {
            return parse_group(toks, i + 1, &segs, out);
        } else {
            // `*` or a turbofish: the path ends here.
            i += 1;
            break;
        }
    }
    out.push(segs);
    i
}

/// Parses a use group `{ a, b::{c, d}, self }` at `i` under `prefix`.
fn parse_group(toks: &[Token], i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let end = skip_group(toks, i);
    let mut j = i + 1;
    while j < end - 1 {
        if let Some(name) = ident(toks.get(j)) {
            let mut p = prefix.to_vec();
            if name != "self" {
                p.push(name.to_string());
            }
            j = parse_tail(toks, j + 1, p, out);
            // Skip `as alias` and anything else up to the next item.
            while j < end - 1 && !is_punct(toks.get(j), ',') {
                j = if is_punct(toks.get(j), '{') {
                    skip_group(toks, j)
                } else {
                    j + 1
                };
            }
        } else if is_punct(toks.get(j), '{') {
            j = parse_group(toks, j, prefix, out);
        } else {
            j += 1;
        }
    }
    end
}

fn scan(src: &str) -> FileScan {
    let toks = lex(src);
    let mut fs = FileScan::default();
    // Inline modules open: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut macro_export = false;
    let names =
        |inline: &[(String, usize)]| inline.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        match &t.tok {
            Tok::Punct('#') => {
                let inner = is_punct(toks.get(i + 1), '!');
                let open = if inner { i + 2 } else { i + 1 };
                if !is_punct(toks.get(open), '[') {
                    i += 1;
                    continue;
                }
                let end = skip_group(&toks, open);
                let body: Vec<&Tok> = toks[open + 1..end - 1].iter().map(|t| &t.tok).collect();
                let cfg_test = body
                    == [
                        &Tok::Ident("cfg".into()),
                        &Tok::Punct('('),
                        &Tok::Ident("test".into()),
                        &Tok::Punct(')'),
                    ];
                if body == [&Tok::Ident("macro_export".into())] {
                    macro_export = true;
                }
                if cfg_test && inner {
                    if depth == 0 {
                        fs.test_only = true;
                        return fs;
                    }
                    // `#![cfg(test)]` inside an inline module: skip the rest.
                    let (_, d) = inline.pop().expect("an inner attribute inside a module");
                    let mut j = end;
                    let mut k = depth;
                    while j < toks.len() && k >= d {
                        match toks[j].tok {
                            Tok::Punct('{') => k += 1,
                            Tok::Punct('}') => k -= 1,
                            _ => {}
                        }
                        j += 1;
                    }
                    depth = k;
                    i = j;
                } else if cfg_test {
                    // Skip the item, with the attributes that follow.
                    let mut j = end;
                    while is_punct(toks.get(j), '#') && is_punct(toks.get(j + 1), '[') {
                        j = skip_group(&toks, j + 1);
                    }
                    i = skip_item(&toks, j);
                } else {
                    i = end;
                }
                continue;
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "macro_rules" && is_punct(toks.get(i + 1), '!') => {
                if let (true, Some(name)) = (macro_export, ident(toks.get(i + 2))) {
                    fs.exported_macros.push((names(&inline), name.to_string()));
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let Some(name) = ident(toks.get(i + 1)) {
                    if is_punct(toks.get(i + 2), ';') {
                        fs.child_files.push((names(&inline), name.to_string()));
                        i += 3;
                        continue;
                    }
                    if is_punct(toks.get(i + 2), '{') {
                        inline.push((name.to_string(), depth + 1));
                        fs.inline_mods.push(names(&inline));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
            }
            Tok::Ident(w)
                if !is_sep(i.checked_sub(1).and_then(|k| toks.get(k)))
                    && is_sep(toks.get(i + 1)) =>
            {
                // `pub(in crate::m)` is a visibility, not a use of `m`.
                let visibility = ident(i.checked_sub(1).and_then(|k| toks.get(k))) == Some("in")
                    && is_punct(i.checked_sub(2).and_then(|k| toks.get(k)), '(');
                let (start, first) = match w.as_str() {
                    "crate" => (Start::Crate, i + 1),
                    "self" => (Start::SelfMod, i + 1),
                    "super" => {
                        let mut k = 1;
                        let mut j = i + 1;
                        while is_sep(toks.get(j)) && ident(toks.get(j + 1)) == Some("super") {
                            k += 1;
                            j += 2;
                        }
                        (Start::Super(k), j)
                    }
                    _ => (Start::Name, i + 1),
                };
                let prefix = if start == Start::Name {
                    vec![w.clone()]
                } else {
                    Vec::new()
                };
                let mut leaves = Vec::new();
                let next = parse_tail(&toks, first, prefix, &mut leaves);
                if !visibility {
                    for segs in leaves {
                        fs.paths.push(RawPath {
                            line: t.line,
                            inline: names(&inline),
                            start: start.clone(),
                            segs,
                        });
                    }
                }
                i = next;
                continue;
            }
            _ => {}
        }
        // Only attributes stand between `#[macro_export]` and its macro.
        macro_export = false;
        i += 1;
    }
    fs
}

/// The absolute path (from the crate root) of `p`, used in module `module`
/// (`$crate` is written `crate` by the lexer's rules: `$` is punctuation).
fn absolute(module: &[String], p: &RawPath) -> Option<Vec<String>> {
    let mut here: Vec<String> = module.to_vec();
    here.extend(p.inline.iter().cloned());
    match p.start {
        Start::Crate => Some(p.segs.clone()),
        Start::SelfMod | Start::Name => {
            here.extend(p.segs.iter().cloned());
            Some(here)
        }
        Start::Super(k) => {
            if k > here.len() {
                return None;
            }
            here.truncate(here.len() - k);
            here.extend(p.segs.iter().cloned());
            Some(here)
        }
    }
}

// ---------------------------------------------------------------------------
// A crate: its modules, from `lib.rs` through `mod` declarations.

struct Crate {
    /// The crate's directory, as the messages name it (`compiler/src`).
    src: String,
    /// Every (non-test) module, by path, with the file that defines it.
    modules: BTreeMap<Vec<String>, PathBuf>,
    /// Each file's module and scan.
    files: Vec<(PathBuf, Vec<String>, FileScan)>,
    /// Names the crate root re-exports or that `#[macro_export]` puts
    /// there: name → the full path it stands for.
    root_names: HashMap<String, Vec<String>>,
}

fn load_crate(root: &Path, src: &str) -> Crate {
    let dir = root.join(src);
    let mut c = Crate {
        src: src.to_string(),
        modules: BTreeMap::new(),
        files: Vec::new(),
        root_names: HashMap::new(),
    };
    let mut todo: Vec<(PathBuf, Vec<String>)> = vec![(dir.join("lib.rs"), Vec::new())];
    while let Some((file, module)) = todo.pop() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let fs = scan(&text);
        if fs.test_only {
            continue;
        }
        c.modules.insert(module.clone(), file.clone());
        for m in &fs.inline_mods {
            let mut p = module.clone();
            p.extend(m.iter().cloned());
            c.modules.insert(p, file.clone());
        }
        // The directory of the children of this file's module.
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let base = if name == "lib.rs" || name == "mod.rs" {
            file.parent().expect("a parent").to_path_buf()
        } else {
            file.with_extension("")
        };
        for (inline, child) in &fs.child_files {
            let mut d = base.clone();
            for m in inline {
                d = d.join(m);
            }
            let flat = d.join(format!("{child}.rs"));
            let nested = d.join(child).join("mod.rs");
            let f = if flat.exists() { flat } else { nested };
            let mut p = module.clone();
            p.extend(inline.iter().cloned());
            p.push(child.clone());
            todo.push((f, p));
        }
        for (inline, mac) in &fs.exported_macros {
            let mut p = module.clone();
            p.extend(inline.iter().cloned());
            p.push(mac.clone());
            c.root_names.insert(mac.clone(), p);
        }
        c.files.push((file, module, fs));
    }
    // The root's re-exports: `pub use m::{A, B}` in lib.rs.
    let root_paths: Vec<Vec<String>> = c
        .files
        .iter()
        .filter(|(_, m, _)| m.is_empty())
        .flat_map(|(_, _, fs)| fs.paths.iter().filter(|p| p.inline.is_empty()))
        .filter_map(|p| absolute(&[], p))
        .collect();
    for p in root_paths {
        if p.len() > 1 && c.modules.contains_key(&p[..1]) {
            c.root_names.insert(p.last().cloned().expect("a name"), p);
        }
    }
    c.files.sort_by(|a, b| a.0.cmp(&b.0));
    c
}

impl Crate {
    /// The module an absolute path names (or names an item of), resolving
    /// the root's re-exports. `None` for a path that names no module
    /// (a plain name that is not a child module).
    fn module_of(&self, path: &[String]) -> Result<Vec<String>, String> {
        let first = path.first().ok_or("the crate root itself")?;
        if !self.modules.contains_key(std::slice::from_ref(first)) {
            return match self.root_names.get(first) {
                Some(full) => {
                    let mut p = full.clone();
                    p.extend(path[1..].iter().cloned());
                    if self.modules.contains_key(&p[..1]) {
                        self.module_of(&p)
                    } else {
                        Err(format!("`{}` re-exports no module's item", first))
                    }
                }
                None => Err(format!(
                    "`crate::{}` is no module of the crate",
                    path.join("::")
                )),
            };
        }
        let mut k = path.len();
        while !self.modules.contains_key(&path[..k]) {
            k -= 1;
        }
        Ok(path[..k].to_vec())
    }
}

// ---------------------------------------------------------------------------
// The layers, as `docs/architecture.md` writes them.

#[derive(Debug, Default)]
struct Layers {
    /// Crate directory (`compiler`) → its layers, bottom first.
    crates: BTreeMap<String, Vec<Vec<String>>>,
    /// Crate → allowed exceptions (from, to).
    allow: BTreeMap<String, BTreeSet<(String, String)>>,
}

/// The first fenced block after `## Layers`: a line with a crate's name
/// (its directory) at the start, then one indented line per layer, bottom
/// first: its number (from 0) and its modules (`ir`, or `kernels::map` for
/// a submodule that is a node of its own; a module's node is its longest
/// prefix listed). An indented line `allow A -> B` lets module `A` use `B`
/// all the same (a documented exception).
fn parse_layers(doc: &str) -> Result<Layers, String> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != "## Layers");
    if lines.next().is_none() {
        return Err("no section `## Layers`".into());
    }
    let mut lines = lines
        .take_while(|l| !l.starts_with("## "))
        .skip_while(|l| !l.starts_with("```"));
    if lines.next().is_none() {
        return Err("no fenced block in `## Layers`".into());
    }
    let mut layers = Layers::default();
    let mut current: Option<String> = None;
    for l in lines.take_while(|l| !l.starts_with("```")) {
        if l.trim().is_empty() {
            continue;
        }
        if !l.starts_with(char::is_whitespace) {
            let name = l.trim().trim_end_matches(':').to_string();
            if layers.crates.insert(name.clone(), Vec::new()).is_some() {
                return Err(format!("crate `{name}` listed twice"));
            }
            current = Some(name);
            continue;
        }
        let krate = current
            .clone()
            .ok_or_else(|| format!("`{}` before any crate", l.trim()))?;
        let words: Vec<&str> = l.split_whitespace().collect();
        if words[0] == "allow" {
            match words.as_slice() {
                ["allow", from, "->", to, ..] => {
                    layers
                        .allow
                        .entry(krate)
                        .or_default()
                        .insert((from.to_string(), to.to_string()));
                }
                _ => return Err(format!("`{}`: expected `allow A -> B`", l.trim())),
            }
            continue;
        }
        let list = layers.crates.get_mut(&krate).expect("inserted");
        let number: usize = words[0]
            .parse()
            .map_err(|_| format!("`{}`: a layer line starts with its number", l.trim()))?;
        if number != list.len() {
            return Err(format!(
                "{krate}: layer {number} where {} was expected",
                list.len()
            ));
        }
        if words.len() < 2 {
            return Err(format!("{krate}: layer {number} has no module"));
        }
        list.push(words[1..].iter().map(|w| w.to_string()).collect());
    }
    Ok(layers)
}

/// One use of a module by another: where, from which node, to which.
#[derive(Clone, Debug, PartialEq)]
struct Edge {
    at: String,
    from: String,
    to: String,
}

/// The violations among `edges` of the layer list `layers` (with the
/// exceptions `allow`), and the exceptions no edge needs.
fn violations(
    layers: &[Vec<String>],
    allow: &BTreeSet<(String, String)>,
    edges: &[Edge],
) -> Vec<String> {
    let layer_of: HashMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(k, l)| l.iter().map(move |m| (m.as_str(), k)))
        .collect();
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for e in edges {
        if e.from == e.to {
            continue;
        }
        let (Some(&lf), Some(&lt)) = (layer_of.get(e.from.as_str()), layer_of.get(e.to.as_str()))
        else {
            out.push(format!("{}: {} or {} is in no layer", e.at, e.from, e.to));
            continue;
        };
        if lt < lf {
            continue;
        }
        let key = (e.from.clone(), e.to.clone());
        if allow.contains(&key) {
            used.insert(key);
            continue;
        }
        out.push(format!(
            "{} imports {} (layer {lt}) from {} (layer {lf}){}",
            e.at,
            e.to,
            e.from,
            if lt == lf { ", the same layer" } else { "" }
        ));
    }
    for (a, b) in allow.difference(&used) {
        out.push(format!(
            "the exception `allow {a} -> {b}` is no longer needed: remove it"
        ));
    }
    out
}

/// The node of module `m`: its longest prefix that the layers list.
fn node_of(listed: &BTreeSet<String>, m: &[String]) -> Option<String> {
    (1..=m.len())
        .rev()
        .map(|k| m[..k].join("::"))
        .find(|n| listed.contains(n))
}

/// The edges between the nodes of crate `c`, and the errors met.
fn crate_edges(c: &Crate, listed: &BTreeSet<String>) -> (Vec<Edge>, Vec<String>) {
    let mut edges = Vec::new();
    let mut errors = Vec::new();
    for m in c.modules.keys() {
        if !m.is_empty() && node_of(listed, m).is_none() {
            errors.push(format!(
                "{}: module `{}` is in no layer",
                c.src,
                m.join("::")
            ));
        }
    }
    for n in listed {
        let path: Vec<String> = n.split("::").map(str::to_string).collect();
        if !c.modules.contains_key(&path) {
            errors.push(format!(
                "{}: the layers list `{n}`, which is no module",
                c.src
            ));
        }
    }
    for (file, module, fs) in &c.files {
        if module.is_empty() {
            // The crate root: module declarations and re-exports.
            continue;
        }
        let rel = file
            .strip_prefix(c.modules[&Vec::new()].parent().expect("src"))
            .unwrap_or(file);
        for p in &fs.paths {
            let mut here = module.clone();
            here.extend(p.inline.iter().cloned());
            let Some(abs) = absolute(module, p) else {
                errors.push(format!(
                    "{}/{}:{}: `super` climbs above the crate",
                    c.src,
                    rel.display(),
                    p.line
                ));
                continue;
            };
            if p.start == Start::Name && !c.modules.contains_key(&abs[..here.len() + 1]) {
                // A plain path that does not start with a child module.
                continue;
            }
            let target = match c.module_of(&abs) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(format!("{}/{}:{}: {e}", c.src, rel.display(), p.line));
                    continue;
                }
            };
            let (Some(from), Some(to)) = (node_of(listed, &here), node_of(listed, &target)) else {
                continue;
            };
            if from == to {
                continue;
            }
            let e = Edge {
                at: format!("{}/{}:{}", c.src, rel.display(), p.line),
                from,
                to,
            };
            // One report per line and target (`use crate::m::{a, b}`).
            if !edges.contains(&e) {
                edges.push(e);
            }
        }
    }
    (edges, errors)
}

#[test]
fn modules_use_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc =
        std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let layers =
        parse_layers(&doc).unwrap_or_else(|e| panic!("docs/architecture.md, ## Layers: {e}"));
    let mut problems = Vec::new();
    for name in ["compiler", "runtime"] {
        let Some(list) = layers.crates.get(name) else {
            problems.push(format!(
                "docs/architecture.md, ## Layers: no layers for `{name}`"
            ));
            continue;
        };
        let listed: BTreeSet<String> = list.iter().flatten().cloned().collect();
        if listed.len() != list.iter().map(Vec::len).sum::<usize>() {
            problems.push(format!("{name}: a module is listed twice"));
        }
        let c = load_crate(root, &format!("{name}/src"));
        let (edges, errors) = crate_edges(&c, &listed);
        problems.extend(errors);
        problems.extend(violations(
            list,
            &layers.allow.get(name).cloned().unwrap_or_default(),
            &edges,
        ));
    }
    assert!(
        problems.is_empty(),
        "the module layering of docs/architecture.md (## Layers) is broken:\n{}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------
// The parser on small inputs.

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The absolute paths `src` uses from module `module` (plain names
/// included, as if each were a child module).
fn paths_in(module: &[&str], src: &str) -> Vec<(usize, Vec<String>)> {
    scan(src)
        .paths
        .iter()
        .filter(|p| p.start != Start::Name || p.segs[0] == "child")
        .map(|p| (p.line, absolute(&s(module), p).expect("inside the crate")))
        .collect()
}

#[test]
fn use_groups_are_expanded() {
    let got = paths_in(
        &["m"],
        "use crate::{a, b::{c, d as e}, f::*, self};\nuse crate::g::{self, h};",
    );
    assert_eq!(
        got,
        vec![
            (1, s(&["a"])),
            (1, s(&["b", "c"])),
            (1, s(&["b", "d"])),
            (1, s(&["f"])),
            (1, s(&[])),
            (2, s(&["g"])),
            (2, s(&["g", "h"])),
        ]
    );
}

#[test]
fn comments_and_strings_are_not_read() {
    let src = r####"
// use crate::a;
/* crate::b /* nested crate::c */ crate::d */
/// [`crate::e`]
let x = "crate::f \" crate::g";
let y = r#"crate::h " crate::i"#;
let z = br"crate::j";
let q = '"'; let p = b'\''; fn f<'a>(x: &'a str) -> &'a str { x }
crate::k::l();
"####;
    assert_eq!(paths_in(&["m"], src), vec![(9, s(&["k", "l"]))]);
}

#[test]
fn test_items_do_not_count() {
    let src = "
#[cfg(test)]
mod tests {
    use crate::a;
    mod deeper { use crate::b; }
}
#[cfg(test)]
#[allow(unused)]
use crate::c;
#[cfg(test)]
mod more;
#[cfg(not(test))]
use crate::d;
fn f() { crate::e::g() }
";
    assert_eq!(
        paths_in(&["m"], src),
        vec![(13, s(&["d"])), (14, s(&["e", "g"]))]
    );
    let fs = scan(src);
    assert!(fs.child_files.is_empty(), "{:?}", fs.child_files);
    assert!(scan("#![cfg(test)]\nuse crate::a;").test_only);
}

#[test]
fn super_climbs_from_files_and_inline_modules() {
    let src = "
use super::sibling::X;
use super::super::top::{Y, Z};
mod inner {
    use super::super::other;
    fn f() { self::g(); super::h(); }
}
use self::child::W;
fn k() { child::v(); $crate::mac::u(); }
pub(in crate::hidden) fn vis() {}
";
    assert_eq!(
        paths_in(&["a", "b"], src),
        vec![
            (2, s(&["a", "sibling", "X"])),
            (3, s(&["top", "Y"])),
            (3, s(&["top", "Z"])),
            (5, s(&["a", "other"])),
            (6, s(&["a", "b", "inner", "g"])),
            (6, s(&["a", "b", "h"])),
            (8, s(&["a", "b", "child", "W"])),
            (9, s(&["a", "b", "child", "v"])),
            (9, s(&["mac", "u"])),
        ]
    );
    let fs = scan(src);
    assert_eq!(fs.inline_mods, vec![s(&["inner"])]);
}

#[test]
fn modules_and_exported_macros_are_found() {
    let fs = scan(
        "pub mod a;\nmod b { pub mod c; }\n#[macro_export]\n#[doc(hidden)]\nmacro_rules! m { () => {} }\nmacro_rules! local { () => {} }",
    );
    assert_eq!(
        fs.child_files,
        vec![(vec![], "a".to_string()), (s(&["b"]), "c".to_string())]
    );
    assert_eq!(fs.exported_macros, vec![(vec![], "m".to_string())]);
}

#[test]
fn the_layer_block_is_parsed() {
    let doc = "# T\n## Layers\ntext\n```text\ncompiler\n  0  ir prim\n  1  lower\n  allow ir -> lower\nruntime\n  0  error\n```\n## Next\n";
    let l = parse_layers(doc).expect("parses");
    assert_eq!(
        l.crates["compiler"],
        vec![s(&["ir", "prim"]), s(&["lower"])]
    );
    assert_eq!(l.crates["runtime"], vec![s(&["error"])]);
    assert!(l.allow["compiler"].contains(&("ir".to_string(), "lower".to_string())));
    assert!(parse_layers("## Layers\n```\nc\n  1  a\n```\n").is_err());
    assert!(parse_layers("## Other\n").is_err());
}

#[test]
fn violations_are_upward_and_same_layer_uses() {
    let layers = vec![s(&["ir", "prim"]), s(&["fuse"]), s(&["codegen"])];
    let e = |from: &str, to: &str| Edge {
        at: "f.rs:1".to_string(),
        from: from.to_string(),
        to: to.to_string(),
    };
    let none = BTreeSet::new();
    assert!(violations(
        &layers,
        &none,
        &[e("fuse", "ir"), e("fuse", "fuse"), e("codegen", "prim")]
    )
    .is_empty());
    assert_eq!(
        violations(&layers, &none, &[e("fuse", "codegen"), e("ir", "prim")]),
        vec![
            "f.rs:1 imports codegen (layer 2) from fuse (layer 1)".to_string(),
            "f.rs:1 imports prim (layer 0) from ir (layer 0), the same layer".to_string(),
        ]
    );
    let allow: BTreeSet<_> = [
        ("fuse".to_string(), "codegen".to_string()),
        ("ir".to_string(), "fuse".to_string()),
    ]
    .into();
    assert_eq!(
        violations(&layers, &allow, &[e("fuse", "codegen")]),
        vec!["the exception `allow ir -> fuse` is no longer needed: remove it".to_string()]
    );
    let listed: BTreeSet<String> = s(&["kernels", "kernels::map"]).into_iter().collect();
    assert_eq!(
        node_of(&listed, &s(&["kernels", "map", "inner"])),
        Some("kernels::map".to_string())
    );
    assert_eq!(
        node_of(&listed, &s(&["kernels", "args"])),
        Some("kernels".to_string())
    );
    assert_eq!(node_of(&listed, &s(&["vm"])), None);
}

#[test]
fn a_small_crate_end_to_end() {
    let root = std::env::temp_dir().join(format!("adjoint-layering-{}", std::process::id()));
    let files = [
        ("lib.rs", "pub mod low;\npub mod high;\npub use low::Thing;\n"),
        (
            "low.rs",
            "pub struct Thing;\n#[macro_export]\nmacro_rules! mac { () => { $crate::low::Thing } }\n#[cfg(test)]\nmod tests;\n",
        ),
        ("low/tests.rs", "use crate::high::Up;\n"),
        (
            "high/mod.rs",
            "mod part;\npub struct Up;\nfn f() { part::g(); let _ = crate::Thing; }\n",
        ),
        ("high/part.rs", "use crate::mac;\npub fn g() {}\n"),
    ];
    for (path, text) in files {
        let p = root.join("src").join(path);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("a directory");
        std::fs::write(p, text).expect("written");
    }
    let c = load_crate(&root, "src");
    let modules: Vec<String> = c.modules.keys().map(|m| m.join("::")).collect();
    assert_eq!(modules, vec!["", "high", "high::part", "low"]);
    let listed: BTreeSet<String> = s(&["low", "high", "high::part"]).into_iter().collect();
    let (edges, errors) = crate_edges(&c, &listed);
    assert!(errors.is_empty(), "{errors:?}");
    let got: Vec<(String, String, String)> = edges
        .iter()
        .map(|e| (e.at.clone(), e.from.clone(), e.to.clone()))
        .collect();
    let e = |at: &str, from: &str, to: &str| (at.to_string(), from.to_string(), to.to_string());
    assert_eq!(
        got,
        vec![
            e("src/high/mod.rs:3", "high", "high::part"),
            e("src/high/mod.rs:3", "high", "low"),
            e("src/high/part.rs:1", "high::part", "low"),
        ]
    );
    let layers = vec![s(&["low"]), s(&["high::part"]), s(&["high"])];
    assert!(violations(&layers, &BTreeSet::new(), &edges).is_empty());
    let wrong = vec![s(&["high::part"]), s(&["low"]), s(&["high"])];
    assert_eq!(
        violations(&wrong, &BTreeSet::new(), &edges),
        vec!["src/high/part.rs:1 imports low (layer 1) from high::part (layer 0)".to_string()]
    );
    let _ = std::fs::remove_dir_all(&root);
}
