//! `adjoint repl`: an interactive session.
//!
//! Definitions (`fn`, `bprop` and `import` items) are kept as source text;
//! each input is compiled with them through a fresh [`Session`]: it
//! becomes the body of a hidden function `__repl_input` whose parameters
//! are the session's variables, passed the values they were given (so
//! nothing an input computed or printed runs again; a `let` bound to a
//! function, which cannot be passed, is replayed instead). What an input's
//! `let`s bind and what it assigns to the session's `let mut`s (read from
//! its syntax, loops and branches included) comes back as values; its
//! final expression's value is printed. A definition is compiled before it is accepted, so a bad one is
//! rejected and leaves the session as it was. Redefining a function
//! replaces it. An input whose brackets are not closed continues on the
//! next line. Each kept text remembers the input it was typed in, so that
//! a diagnostic names that input (`<input 3>:1:9`, or the loaded file) and
//! counts lines in it, not in the generated program.
//!
//! On a terminal, lines are read with rustyline (history in
//! `$ADJOINT_HISTORY`, else `adjoint/history` in the user's data
//! directory); otherwise they are read from standard input as they come,
//! with no prompt and no history, so that a script can be piped in.
//! Nothing typed ends the session but `:quit` or the end of the input: an
//! error prints its diagnostic, and a panic in the compiler (a bug) prints
//! an internal-error message.

use std::io::{BufRead, IsTerminal, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use adjoint::{Mode, Session, SessionError, SourcePiece, Value};
use adjoint_lang::{ast, FileId};

/// The hidden function an expression becomes.
const INPUT: &str = "__repl_input";
/// The name diagnostics show for the REPL's source.
const SOURCE_NAME: &str = "<repl>";

const HELP: &str = "\
Enter definitions (`fn f(x) = ...`, `let x = ...`, `import nn`) and
expressions (printed). An unclosed bracket continues the input on the next
line. Commands:
  :grad F [ARGS..]  the signature of grad(F); with arguments, its value there
  :type EXPR        the type of EXPR (inferred, not run)
  :ir EXPR          the IR of EXPR as lowered and differentiated
  :opt EXPR         the IR of EXPR after graph mode's optimiser
  :time EXPR        EXPR's value and the time to load, compile and run it
  :mode [eager|graph]  show or set the execution mode
  :load FILE        add the definitions of a file
  :defs             list the definitions
  :reset            forget every definition
  :help             this text
  :quit             leave (also Ctrl-D)
";

/// One accepted definition (or `let` binding): the names it defines, its
/// text, and where the text was written.
#[derive(Clone, Debug)]
struct Def {
    key: String,
    text: String,
    origin: Option<Origin>,
}

/// A variable of the session.
#[derive(Clone, Debug)]
enum Binding {
    /// A value computed once, when its input ran, and passed to every
    /// later input as an argument of the hidden function (so that the
    /// inputs that follow neither run its computation nor its printing
    /// again).
    Value {
        name: String,
        mutable: bool,
        value: Value,
    },
    /// A `let` whose value holds a function (which cannot be passed in):
    /// run again at the start of every later input. `value` is where its
    /// right-hand side is in `def.text`; it is run with the session values
    /// it names as they were when it was typed (`captured`), as a closure
    /// captures by value.
    Replay {
        def: Def,
        value: std::ops::Range<usize>,
        captured: Vec<(String, Value)>,
    },
}

impl Binding {
    /// The `let` statement that binds the variable, with a value written
    /// by `rhs`.
    fn let_text(&self, rhs: impl FnOnce(&Value) -> String) -> String {
        match self {
            Binding::Value {
                name,
                mutable,
                value,
            } => {
                let m = if *mutable { "mut " } else { "" };
                format!("let {m}{name} = {};", rhs(value))
            }
            Binding::Replay { def, .. } => def.text.clone(),
        }
    }
}

/// One input typed at the prompt (`<input 3>`) or a loaded file: what
/// diagnostics name and count lines in.
#[derive(Debug)]
struct Entry {
    name: String,
    text: String,
}

/// Where a kept text starts: its entry and the byte offset in it.
#[derive(Clone, Debug)]
struct Origin {
    entry: Arc<Entry>,
    offset: usize,
}

/// A generated program text and the pieces of it that were written by
/// the user ([`SessionError::relocate`] shows errors in them at their
/// place in the entry).
#[derive(Default)]
struct Gen {
    text: String,
    pieces: Vec<SourcePiece>,
}

impl Gen {
    fn push(&mut self, s: &str, origin: Option<&Origin>) {
        if let Some(o) = origin {
            let len = s.len().min(o.entry.text.len().saturating_sub(o.offset));
            self.pieces.push(SourcePiece {
                at: self.text.len(),
                len,
                name: o.entry.name.clone(),
                text: o.entry.text.clone(),
                offset: o.offset,
            });
        }
        self.text.push_str(s);
    }

    fn append(&mut self, other: Gen) {
        let at = self.text.len();
        self.pieces.extend(other.pieces.into_iter().map(|mut p| {
            p.at += at;
            p
        }));
        self.text.push_str(&other.text);
    }

    /// `e` with its places in the user's pieces shown there.
    fn relocate(&self, e: SessionError) -> SessionError {
        e.relocate(SOURCE_NAME, &self.pieces)
    }
}

/// The state of a session.
pub struct Repl {
    mode: Mode,
    /// `import` items, in order (they go first in the generated source).
    imports: Vec<Def>,
    /// `fn` and `bprop` items.
    items: Vec<Def>,
    /// The session's variables, in the order they were bound.
    bindings: Vec<Binding>,
    color: bool,
    /// How many inputs have been handled, and the one being handled (the
    /// address of its text, to place slices of it).
    entries: usize,
    entry: Option<Arc<Entry>>,
    entry_base: usize,
    /// Whether an input has failed (`adjoint repl < script` then exits
    /// with status 1).
    failed: bool,
}

/// What the input loop should do next.
#[derive(PartialEq)]
enum Flow {
    Continue,
    Quit,
}

/// The message of the last panic (a compiler bug), recorded by the hook.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

impl Repl {
    /// A session with no definitions.
    pub fn new(mode: Mode) -> Repl {
        Repl {
            mode,
            imports: Vec::new(),
            items: Vec::new(),
            bindings: Vec::new(),
            color: std::io::stderr().is_terminal(),
            failed: false,
            entries: 0,
            entry: None,
            entry_base: 0,
        }
    }

    /// Handles one complete input (possibly several lines), writing results
    /// to `out` and diagnostics to `err`. Never panics: a panic inside the
    /// compiler is reported as an internal error.
    fn handle(&mut self, input: &str, out: &mut dyn Write, err: &mut dyn Write) -> Flow {
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = None;
        adjoint_runtime::vm::clear_interrupt();
        self.entries += 1;
        self.entry = Some(Arc::new(Entry {
            name: format!("<input {}>", self.entries),
            text: input.to_string(),
        }));
        self.entry_base = input.as_ptr() as usize;
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| self.dispatch(input, out)));
        self.entry = None;
        let _ = out.flush();
        match r {
            Ok(Ok(flow)) => flow,
            Ok(Err(e)) => {
                self.failed = true;
                let _ = write!(err, "{}", e.render(self.color));
                let _ = err.flush();
                Flow::Continue
            }
            Err(payload) => {
                self.failed = true;
                let recorded = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
                let msg = recorded.unwrap_or_else(|| panic_message(&*payload));
                let _ = writeln!(
                    err,
                    "error: internal error: {msg}\nthis is a bug in Adjoint; the session goes on"
                );
                let _ = err.flush();
                Flow::Continue
            }
        }
    }

    fn dispatch(&mut self, input: &str, out: &mut dyn Write) -> Result<Flow, SessionError> {
        let input = input.trim();
        if input.is_empty() {
            return Ok(Flow::Continue);
        }
        if let Some(cmd) = input.strip_prefix(':') {
            return self.command(cmd, out);
        }
        match first_word(input) {
            "fn" | "bprop" | "import" => self.define(input)?,
            _ => self.run_input(input, out)?,
        }
        Ok(Flow::Continue)
    }

    fn command(&mut self, cmd: &str, out: &mut dyn Write) -> Result<Flow, SessionError> {
        let cmd = cmd.trim();
        let (name, rest) = match cmd.find(char::is_whitespace) {
            Some(i) => (&cmd[..i], cmd[i..].trim()),
            None => (cmd, ""),
        };
        let need = |what: &str| -> Result<(), SessionError> {
            if rest.is_empty() {
                Err(SessionError::message(format!(
                    "`:{name}` needs {what} (see :help)"
                )))
            } else {
                Ok(())
            }
        };
        match name {
            "q" | "quit" | "exit" => return Ok(Flow::Quit),
            "h" | "help" | "?" => write_out(out, HELP),
            "grad" => {
                need("a function name")?;
                self.grad(rest, out)?;
            }
            "type" | "t" => {
                need("an expression")?;
                let (s, g, args) = self.session_for(rest)?;
                let t = s
                    .function(INPUT)
                    .and_then(|f| f.result_type(&args))
                    .map_err(|e| g.relocate(e))?;
                write_out(out, &format!("{t}\n"));
            }
            "ir" => {
                need("an expression")?;
                let (s, g, _) = self.session_for(rest)?;
                write_out(out, &s.emit_ir(Some(INPUT)).map_err(|e| g.relocate(e))?);
            }
            "opt" => {
                need("an expression")?;
                let (s, g, _) = self.session_for(rest)?;
                write_out(out, &s.emit_opt(Some(INPUT)).map_err(|e| g.relocate(e))?);
            }
            "time" => {
                need("an expression")?;
                self.time(rest, out)?;
            }
            "mode" => match rest {
                "" => write_out(out, &format!("{}\n", mode_name(self.mode))),
                "eager" => {
                    self.mode = Mode::Eager;
                    write_out(out, "mode: eager\n");
                }
                "graph" => {
                    self.mode = Mode::Graph;
                    write_out(out, "mode: graph\n");
                }
                other => {
                    return Err(SessionError::message(format!(
                        "unknown mode `{other}`: expected `eager` or `graph`"
                    )))
                }
            },
            "load" | "l" => {
                need("a file name")?;
                let path = rest.trim_matches('"');
                let text = std::fs::read_to_string(path).map_err(|e| {
                    SessionError::message(format!("cannot read \"{path}\": {}", io_reason(&e)))
                })?;
                let dir = Path::new(path).parent().map(|d| {
                    if d.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        d
                    }
                });
                let entry = Arc::new(Entry {
                    name: path.to_string(),
                    text: text.clone(),
                });
                let n = self.define_named(&text, Origin { entry, offset: 0 }, dir)?;
                write_out(
                    out,
                    &format!(
                        "loaded {n} definition{} from {path}\n",
                        if n == 1 { "" } else { "s" }
                    ),
                );
            }
            "defs" => {
                let mut s = String::new();
                for d in self.imports.iter().chain(&self.items) {
                    s.push_str(&d.text);
                    s.push('\n');
                }
                for b in &self.bindings {
                    s.push_str(&b.let_text(|value| {
                        let shown = value.to_string();
                        if shown.len() <= 60 {
                            shown
                        } else {
                            format!("<{}>", adjoint::value_type(value))
                        }
                    }));
                    s.push('\n');
                }
                write_out(out, &s);
            }
            "reset" => {
                self.imports.clear();
                self.items.clear();
                self.bindings.clear();
            }
            other => {
                return Err(SessionError::message(format!(
                    "unknown command `:{other}` (see :help)"
                )))
            }
        }
        Ok(Flow::Continue)
    }

    /// The program: imports, then `first` (the new input), then the other
    /// definitions.
    fn source(&self, first: Gen) -> Gen {
        let mut g = Gen::default();
        for d in &self.imports {
            g.push(&d.text, d.origin.as_ref());
            g.push("\n", None);
        }
        g.append(first);
        g.push("\n", None);
        for d in &self.items {
            g.push(&d.text, d.origin.as_ref());
            g.push("\n", None);
        }
        g
    }

    /// The hidden function: its parameters are the session's values, which
    /// it binds to their names (with the replayed `let`s, in the order they
    /// were bound), then `body`; and the arguments to call it with.
    fn input_fn(&self, body: Gen) -> (Gen, Vec<Value>) {
        let mut g = Gen::default();
        let mut args = Vec::new();
        let mut lets = Gen::default();
        for b in &self.bindings {
            match b {
                Binding::Value { value, .. } => {
                    let text = b.let_text(|_| format!("__repl_v{}", args.len()));
                    lets.push(&text, None);
                    lets.push("\n", None);
                    args.push(value.clone());
                }
                Binding::Replay {
                    def,
                    value,
                    captured,
                } => {
                    let at = |k: usize| {
                        def.origin.as_ref().map(|o| Origin {
                            entry: o.entry.clone(),
                            offset: o.offset + k,
                        })
                    };
                    let t = &def.text;
                    lets.push(&t[..value.start], at(0).as_ref());
                    lets.push("{ ", None);
                    for (name, v) in captured {
                        lets.push(&format!("let {name} = __repl_v{}; ", args.len()), None);
                        args.push(v.clone());
                    }
                    lets.push(&t[value.clone()], at(value.start).as_ref());
                    lets.push(" }", None);
                    lets.push(&t[value.end..], at(value.end).as_ref());
                    lets.push("\n", None);
                }
            }
        }
        let params: Vec<String> = (0..args.len()).map(|i| format!("__repl_v{i}")).collect();
        g.push(&format!("fn {INPUT}({}) {{\n", params.join(", ")), None);
        g.append(lets);
        g.append(body);
        g.push("\n}", None);
        (g, args)
    }

    /// Where `s`, a slice of the input being handled, was typed.
    fn origin(&self, s: &str) -> Option<Origin> {
        let entry = self.entry.as_ref()?;
        let offset = (s.as_ptr() as usize).checked_sub(self.entry_base)?;
        (offset + s.len() <= entry.text.len()).then(|| Origin {
            entry: entry.clone(),
            offset,
        })
    }

    /// `s` as a generated text: placed in the input when it is a slice
    /// of it.
    fn typed(&self, s: &str) -> Gen {
        let mut g = Gen::default();
        g.push(s, self.origin(s).as_ref());
        g
    }

    /// A session with the program and the hidden function for `expr`, and
    /// the arguments to call it with.
    fn session_for(&self, expr: &str) -> Result<(Session, Gen, Vec<Value>), SessionError> {
        self.session_for_gen(self.typed(expr))
    }

    fn session_for_gen(&self, body: Gen) -> Result<(Session, Gen, Vec<Value>), SessionError> {
        let (input, args) = self.input_fn(body);
        let g = self.source(input);
        let s = Session::new(self.mode)
            .with_compiler_options(adjoint::env_options::compiler_options())
            .load_source(SOURCE_NAME, &g.text)
            .map_err(|e| g.relocate(e))?;
        Ok((s, g, args))
    }

    fn eval_gen(&self, body: Gen, out: &mut dyn Write) -> Result<Value, SessionError> {
        let (s, g, args) = self.session_for_gen(body)?;
        s.function(INPUT)
            .and_then(|f| f.call_with_output(&args, out))
            .map_err(|e| g.relocate(e))
    }

    /// An input that is not a definition: statements, then maybe an
    /// expression, whose value is printed. What its top-level `let`s bind
    /// and what it assigns to the session's `let mut` variables (in loops
    /// and branches too) is kept for the inputs that follow, as values,
    /// so that nothing it computed or printed runs again.
    fn run_input(&mut self, input: &str, out: &mut dyn Write) -> Result<(), SessionError> {
        let Some((shape, amended)) = InputShape::of(input) else {
            // Not a complete block: let compiling it report why.
            let v = self.eval_gen(self.typed(input), out)?;
            print_value(&v, out);
            return Ok(());
        };
        let let_names: Vec<&str> = shape
            .lets
            .iter()
            .flat_map(|l| l.names.iter().map(|(n, _)| n.as_str()))
            .collect();
        let assigned: Vec<String> = self
            .bindings
            .iter()
            .filter_map(|b| match b {
                Binding::Value {
                    name,
                    mutable: true,
                    ..
                } if shape.assigned.contains(name) && !let_names.contains(&name.as_str()) => {
                    Some(name.clone())
                }
                _ => None,
            })
            .collect();
        if shape.lets.is_empty() && assigned.is_empty() {
            // (`k = k + 1` typed without its `;`, for a `k` that is not a
            // session variable: compiled as typed, with the `;`, so that
            // the error is about `k`.)
            let mut body = self.typed(input);
            if amended {
                body.push(";", None);
            }
            let v = self.eval_gen(body, out)?;
            print_value(&v, out);
            return Ok(());
        }
        let split = shape.tail.unwrap_or(input.len());
        let mut body = Gen::default();
        body.push(&input[..split], self.origin(&input[..split]).as_ref());
        if amended {
            body.push(";", None);
        }
        body.push("\nlet __repl_result = (", None);
        if shape.tail.is_some() {
            body.push(&input[split..], self.origin(&input[split..]).as_ref());
        }
        let tuple = |names: &[&str]| match names {
            [] => "()".to_string(),
            names => format!("({},)", names.join(", ")),
        };
        let assigned_refs: Vec<&str> = assigned.iter().map(String::as_str).collect();
        body.push(
            &format!(
                ");\n(__repl_result, {}, {})",
                tuple(&let_names),
                tuple(&assigned_refs)
            ),
            None,
        );
        let v = self.eval_gen(body, out)?;
        let parts = match v.as_tuple() {
            Some([r, l, a]) => Some((
                r.clone(),
                l.as_tuple().map(<[Value]>::to_vec).unwrap_or_default(),
                a.as_tuple().map(<[Value]>::to_vec).unwrap_or_default(),
            )),
            _ => None,
        };
        let Some((result, bound, new_values)) = parts else {
            return Err(SessionError::message(
                "internal error: the REPL's input did not return its bindings".into(),
            ));
        };
        for (name, v) in assigned.iter().zip(new_values) {
            for b in &mut self.bindings {
                if let Binding::Value { name: n, value, .. } = b {
                    if n == name {
                        *value = v.clone();
                    }
                }
            }
        }
        let mut bound = bound.into_iter();
        for LetStmt {
            stmt: range,
            value: value_range,
            names,
        } in &shape.lets
        {
            let values: Vec<Value> = bound.by_ref().take(names.len()).collect();
            self.bindings.retain(|b| match b {
                Binding::Value { name, .. } => !names.iter().any(|(n, _)| n == name),
                Binding::Replay { .. } => true,
            });
            if values.iter().any(holds_function) {
                let text = &input[range.clone()];
                let mut t = text.to_string();
                if !t.trim_end().ends_with(';') {
                    t.push(';');
                }
                let rhs = value_range.start - range.start..value_range.end - range.start;
                let captured = self
                    .bindings
                    .iter()
                    .filter_map(|b| match b {
                        Binding::Value { name, value, .. } if names_word(&t[rhs.clone()], name) => {
                            Some((name.clone(), value.clone()))
                        }
                        _ => None,
                    })
                    .collect();
                self.bindings.push(Binding::Replay {
                    def: Def {
                        key: "let".into(),
                        text: t,
                        origin: self.origin(text),
                    },
                    value: rhs,
                    captured,
                });
            } else {
                for ((name, mutable), value) in names.iter().zip(values) {
                    self.bindings.push(Binding::Value {
                        name: name.clone(),
                        mutable: *mutable,
                        value,
                    });
                }
            }
        }
        if shape.tail.is_some() {
            print_value(&result, out);
        }
        Ok(())
    }

    /// Items typed at the prompt.
    fn define(&mut self, input: &str) -> Result<(), SessionError> {
        let origin = self.origin(input).unwrap_or_else(|| Origin {
            entry: Arc::new(Entry {
                name: SOURCE_NAME.into(),
                text: input.to_string(),
            }),
            offset: 0,
        });
        self.define_named(input, origin, None).map(|_| ())
    }

    /// Adds the items of `text` (replacing definitions of the same names)
    /// once the program with them compiles; returns how many there were.
    fn define_named(
        &mut self,
        text: &str,
        origin: Origin,
        base: Option<&Path>,
    ) -> Result<usize, SessionError> {
        let name = origin.entry.name.clone();
        let (module, diags) = adjoint_lang::parse(FileId(0), text);
        if diags.iter().any(|d| d.is_error()) {
            // Let the session render the syntax errors.
            let mut g = Gen::default();
            g.push(text, Some(&origin));
            return Err(Session::new(self.mode)
                .with_compiler_options(adjoint::env_options::compiler_options())
                .load_source(SOURCE_NAME, &g.text)
                .err()
                .map(|e| g.relocate(e))
                .unwrap_or_else(|| SessionError::message("syntax error".into())));
        }
        let mut new_imports = Vec::new();
        let mut new_items = Vec::new();
        for item in &module.items {
            let span = item.span().range();
            let Some(src) = text.get(span.clone()) else {
                continue;
            };
            let key = match item {
                ast::Item::Fn(f) => format!("fn {}", f.name.name),
                ast::Item::Bprop(f) => format!("bprop {}", f.name.name),
                ast::Item::Import(i) => {
                    let mut t = src.to_string();
                    // A file imported by a loaded file is relative to it.
                    if let (ast::ImportPath::File { path, span }, Some(dir)) = (&i.module, base) {
                        let lo = span.range().start - item.span().range().start;
                        let hi = span.range().end - item.span().range().start;
                        if Path::new(path).is_relative() && t.get(lo..hi).is_some() {
                            let full = dir.join(path).display().to_string();
                            t.replace_range(lo..hi, &format!("{full:?}"));
                        }
                    }
                    if !t.trim_end().ends_with(';') {
                        t.push(';');
                    }
                    new_imports.push(Def {
                        key: format!("import {}", t.trim().trim_end_matches(';')),
                        text: t,
                        origin: None,
                    });
                    continue;
                }
            };
            let mut t = src.to_string();
            if matches!(item, ast::Item::Fn(f) | ast::Item::Bprop(f) if !matches!(*f.body.kind, ast::ExprKind::Block(..)))
                && !t.trim_end().ends_with(';')
            {
                t.push(';');
            }
            new_items.push(Def {
                key,
                text: t,
                origin: Some(Origin {
                    entry: origin.entry.clone(),
                    offset: origin.offset + span.start,
                }),
            });
        }
        let n = new_imports.len() + new_items.len();
        if n == 0 {
            return Err(SessionError::message(format!("{name} has no definitions")));
        }
        // The candidate program: every old definition not redefined, the
        // new ones, and a use of every `let` so that they are checked too.
        let replaced: Vec<String> = new_items.iter().map(|d| d.key.clone()).collect();
        let mut candidate = Repl {
            mode: self.mode,
            imports: self.imports.clone(),
            items: self
                .items
                .iter()
                .filter(|d| !replaced.contains(&d.key))
                .cloned()
                .collect(),
            bindings: self.bindings.clone(),
            color: self.color,
            failed: false,
            entries: self.entries,
            entry: self.entry.clone(),
            entry_base: self.entry_base,
        };
        for d in new_imports {
            if !candidate.imports.iter().any(|o| o.key == d.key) {
                candidate.imports.push(d);
            }
        }
        candidate.items.extend(new_items);
        let g = candidate.source(Gen::default());
        if let Err(e) = Session::new(self.mode)
            .with_compiler_options(adjoint::env_options::compiler_options())
            .load_source(SOURCE_NAME, &g.text)
            .map_err(|e| g.relocate(e))
        {
            // A `let` name used in a definition: say why it is not found.
            let used = self
                .let_names()
                .into_iter()
                .find(|n| e.summary().contains(&format!("`{n}`")));
            return Err(match used {
                Some(n) => e.with_note(format!(
                    "`{n}` is bound by a `let` at the prompt: such names are visible to \
                     later expressions, not inside `fn` definitions; pass it as an argument"
                )),
                None => e,
            });
        }
        *self = candidate;
        Ok(n)
    }

    /// The names of the session's variables.
    fn let_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for b in &self.bindings {
            match b {
                Binding::Value { name, .. } => names.push(name.clone()),
                Binding::Replay { def, .. } => {
                    if let Some((shape, _)) = InputShape::of(&def.text) {
                        for l in shape.lets {
                            names.extend(l.names.into_iter().map(|(n, _)| n));
                        }
                    }
                }
            }
        }
        names
    }

    /// `:grad F [ARGS..]`.
    fn grad(&self, rest: &str, out: &mut dyn Write) -> Result<(), SessionError> {
        let (f, args) = match rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')) {
            Some(i) => (&rest[..i], rest[i..].trim()),
            None => (rest, ""),
        };
        if f.is_empty() {
            return Err(SessionError::message(
                "`:grad` needs a function name: `:grad f` or `:grad f 1.2`".into(),
            ));
        }
        let params = self.params_of(f);
        let args_at = args;
        let args = split_args(args);
        if args.is_empty() {
            // Check that `grad(f)` compiles, then show its signature.
            let mut body = Gen::default();
            body.push("grad(", None);
            body.push(f, self.origin(f).as_ref());
            body.push(")", None);
            self.session_for_gen(body)?;
            let sig = match &params {
                Some(ps) if !ps.is_empty() => {
                    let first = &ps[0];
                    let result = match &first.1 {
                        Some(t) => t.clone(),
                        None => format!("the type of {}", first.0),
                    };
                    format!(
                        "grad({f}) : ({}) -> {result}\n",
                        ps.iter()
                            .map(|(n, t)| match t {
                                Some(t) => format!("{n}: {t}"),
                                None => n.clone(),
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
                Some(_) => {
                    return Err(SessionError::message(format!(
                        "`{f}` takes no arguments: there is nothing to differentiate"
                    )))
                }
                None => format!("grad({f}) : (x, ..) -> the type of x\n"),
            };
            write_out(out, &sig);
            return Ok(());
        }
        let mut body = Gen::default();
        let names: Vec<String> = (0..args.len()).map(|i| format!("__repl_a{i}")).collect();
        // Each argument placed where it was typed (found in order).
        let mut cursor = 0;
        for (n, a) in names.iter().zip(&args) {
            body.push(&format!("let {n} = "), None);
            let at = args_at[cursor..].find(a.as_str()).map(|i| cursor + i);
            match at {
                Some(i) => {
                    cursor = i + a.len();
                    body.push(a, self.origin(&args_at[i..cursor]).as_ref());
                }
                None => body.push(a, None),
            }
            body.push(";\n", None);
        }
        body.push("(grad(", None);
        body.push(f, self.origin(f).as_ref());
        body.push(
            &format!(")({}), ({},))", names.join(", "), names.join(", ")),
            None,
        );
        let v = self.eval_gen(body, out)?;
        let (g, xs) = match v.as_tuple() {
            Some([g, xs]) => (g.clone(), xs.as_tuple().map(<[Value]>::to_vec)),
            _ => (v.clone(), None),
        };
        let xs = xs.unwrap_or_default();
        let param_names: Vec<String> = match &params {
            Some(ps) => ps.iter().map(|p| p.0.clone()).collect(),
            None => Vec::new(),
        };
        let sig: Vec<String> = xs
            .iter()
            .enumerate()
            .map(|(i, x)| match param_names.get(i) {
                Some(n) => format!("{n}: {}", adjoint::value_type(x)),
                None => adjoint::value_type(x),
            })
            .collect();
        write_out(
            out,
            &format!(
                "grad({f}) : ({}) -> {}\n",
                sig.join(", "),
                adjoint::value_type(&g)
            ),
        );
        print_value(&g, out);
        Ok(())
    }

    /// The parameters (names and written annotations) of a function defined
    /// at the prompt.
    fn params_of(&self, f: &str) -> Option<Vec<(String, Option<String>)>> {
        let key = format!("fn {f}");
        let def = self.items.iter().find(|d| d.key == key)?;
        let (module, _) = adjoint_lang::parse(FileId(0), &def.text);
        module.items.iter().find_map(|i| match i {
            ast::Item::Fn(d) if d.name.name == f => Some(
                d.params
                    .iter()
                    .map(|p| {
                        let ty = p.ty.as_ref().and_then(|_| {
                            // The annotation as written: from after the
                            // name's `:` to the end of the parameter (or
                            // its default).
                            let text = def.text.get(p.span.range())?;
                            let after = text.split_once(':')?.1;
                            Some(after.split('=').next()?.trim().to_string())
                        });
                        (p.name.name.to_string(), ty)
                    })
                    .collect(),
            ),
            _ => None,
        })
    }

    /// `:time EXPR`.
    fn time(&self, expr: &str, out: &mut dyn Write) -> Result<(), SessionError> {
        let t0 = Instant::now();
        let (s, g, args) = self.session_for(expr)?;
        let t1 = Instant::now();
        let f = s.function(INPUT).map_err(|e| g.relocate(e))?;
        f.prepare(&args).map_err(|e| g.relocate(e))?;
        let t2 = Instant::now();
        let v = f.call_with_output(&args, out).map_err(|e| g.relocate(e))?;
        let t3 = Instant::now();
        print_value(&v, out);
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        write_out(
            out,
            &format!(
                "time: load {:.3} ms, compile {:.3} ms, run {:.3} ms ({} mode)\n",
                ms(t0, t1),
                ms(t1, t2),
                ms(t2, t3),
                mode_name(self.mode)
            ),
        );
        Ok(())
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Eager => "eager",
        Mode::Graph => "graph",
    }
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::InvalidData => "the file is not valid UTF-8".into(),
        _ => e.to_string().to_lowercase(),
    }
}

/// The first word of an input (a keyword or a name).
fn first_word(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

fn print_value(v: &Value, out: &mut dyn Write) {
    if !v.is_unit() {
        write_out(out, &format!("{v}\n"));
    }
}

fn write_out(out: &mut dyn Write, s: &str) {
    let _ = out.write_all(s.as_bytes());
}

/// Splits `a, [1.0, 2.0], f(x, y)` at the commas outside brackets; with no
/// such comma, at the spaces outside brackets (`:grad f 1.2 3`).
fn split_args(s: &str) -> Vec<String> {
    let s = s.trim();
    if s.is_empty() {
        return Vec::new();
    }
    let split_on = |sep: fn(char) -> bool| -> Vec<String> {
        let mut parts = Vec::new();
        let mut depth = 0i32;
        let mut cur = String::new();
        let mut in_str = false;
        let mut escaped = false;
        for c in s.chars() {
            if in_str {
                cur.push(c);
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_str = false;
                }
                continue;
            }
            match c {
                '"' => in_str = true,
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 && sep(c) {
                if !cur.trim().is_empty() {
                    parts.push(cur.trim().to_string());
                }
                cur.clear();
            } else {
                cur.push(c);
            }
        }
        if !cur.trim().is_empty() {
            parts.push(cur.trim().to_string());
        }
        parts
    };
    let by_comma = split_on(|c| c == ',');
    if by_comma.len() > 1 {
        by_comma
    } else {
        split_on(char::is_whitespace)
    }
}

/// Whether `text` needs more lines: a bracket, a string or a block comment
/// is still open, or the last line ends in a binary operator or a comma
/// (`let y = a +`).
pub fn is_incomplete(text: &str) -> bool {
    open_at_end(text) || ends_in_operator(text)
}

/// Whether the last line, without a `//` comment, ends in an operator
/// that needs a right operand (or a comma).
fn ends_in_operator(text: &str) -> bool {
    let last = text.lines().last().unwrap_or("");
    let code = match last.find("//") {
        // A `//` inside a string on the line is rare at a line's end;
        // then the line is taken whole.
        Some(i) if !last[..i].contains('"') => &last[..i],
        _ => last,
    };
    let mut code = code.trim_end();
    // A block comment at the end (`f(x) /* .. */`) is not an operator.
    while code.ends_with("*/") {
        match code.rfind("/*") {
            Some(i) => code = code[..i].trim_end(),
            None => break,
        }
    }
    // `:grad f` and the other commands take no operators.
    if code.trim_start().starts_with(':') {
        return false;
    }
    code.ends_with([
        '+', '-', '*', '/', '%', '@', '=', '<', '>', '&', '|', '^', ',',
    ])
}

fn open_at_end(text: &str) -> bool {
    let mut depth = 0i64;
    let mut chars = text.chars().peekable();
    let mut comment = 0usize;
    while let Some(c) = chars.next() {
        if comment > 0 {
            match (c, chars.peek()) {
                ('*', Some('/')) => {
                    chars.next();
                    comment -= 1;
                }
                ('/', Some('*')) => {
                    chars.next();
                    comment += 1;
                }
                _ => {}
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                comment = 1;
            }
            // A string ends on its line: one left open is an error for the
            // parser to report at once, not a reason to wait for more lines
            // (which would swallow the inputs that follow).
            '"' => loop {
                match chars.next() {
                    Some('\\') if chars.peek() != Some(&'\n') => {
                        chars.next();
                    }
                    Some('"') => break,
                    Some('\n') | None => return false,
                    _ => {}
                }
            },
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    comment > 0 || depth > 0
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Where history is kept: `$ADJOINT_HISTORY`, else `adjoint/history` in
/// the user's data directory (`$XDG_DATA_HOME`, else `~/.local/share`).
fn history_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ADJOINT_HISTORY") {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("share"))
        })?;
    Some(data.join("adjoint").join("history"))
}

/// A source of input lines.
trait Lines {
    /// The next line (without its newline); `None` at the end of the input.
    /// `Some(Err(()))` when the user interrupted the current input.
    fn line(&mut self, prompt: &str) -> Option<Result<String, ()>>;
    /// Records a complete input in the history.
    fn remember(&mut self, _input: &str) {}
}

/// Lines from a pipe or a file: no prompt, no editing, no history.
struct Piped<R: BufRead>(R);

impl<R: BufRead> Lines for Piped<R> {
    fn line(&mut self, _prompt: &str) -> Option<Result<String, ()>> {
        let mut s = String::new();
        match self.0.read_line(&mut s) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                if s.ends_with('\n') {
                    s.pop();
                    if s.ends_with('\r') {
                        s.pop();
                    }
                }
                Some(Ok(s))
            }
        }
    }
}

/// Lines from a terminal, with rustyline's editing and history.
struct Terminal {
    editor: rustyline::DefaultEditor,
    history: Option<PathBuf>,
}

impl Terminal {
    fn new() -> Option<Terminal> {
        let mut editor = rustyline::DefaultEditor::new().ok()?;
        let history = history_path();
        if let Some(p) = &history {
            let _ = editor.load_history(p);
        }
        Some(Terminal { editor, history })
    }
}

impl Lines for Terminal {
    fn line(&mut self, prompt: &str) -> Option<Result<String, ()>> {
        use rustyline::error::ReadlineError;
        match self.editor.readline(prompt) {
            Ok(s) => Some(Ok(s)),
            Err(ReadlineError::Interrupted) => Some(Err(())),
            Err(_) => None,
        }
    }

    fn remember(&mut self, input: &str) {
        let _ = self.editor.add_history_entry(input);
        if let Some(p) = &self.history {
            if let Some(dir) = p.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = self.editor.save_history(p);
        }
    }
}

/// Runs the REPL on standard input until `:quit` or the end of the input.
pub fn run(mode: Mode) -> std::process::ExitCode {
    // A panic is a compiler bug: record its message for the report; the
    // input loop reports it and goes on.
    std::panic::set_hook(Box::new(|info| {
        let msg = panic_message(info.payload());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg}{at}"));
    }));
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        // Ctrl-C while an input runs stops it at its next call (while a
        // line is edited, rustyline reads Ctrl-C as a key instead).
        let _ = ctrlc::set_handler(adjoint_runtime::vm::request_interrupt);
    }
    let mut lines: Box<dyn Lines> = match interactive.then(Terminal::new).flatten() {
        Some(t) => {
            println!(
                "Adjoint REPL ({} mode). :help for help, :quit to leave.",
                mode_name(mode)
            );
            Box::new(t)
        }
        None => Box::new(Piped(std::io::stdin().lock())),
    };
    let mut repl = Repl::new(mode);
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    'inputs: loop {
        let mut input = String::new();
        loop {
            let prompt = if input.is_empty() {
                "adjoint> "
            } else {
                "     ... "
            };
            match lines.line(prompt) {
                None => {
                    if !input.trim().is_empty() {
                        repl.handle(&input, &mut stdout.lock(), &mut stderr.lock());
                    }
                    break 'inputs;
                }
                Some(Err(())) => continue 'inputs,
                Some(Ok(l)) => {
                    if !input.is_empty() {
                        input.push('\n');
                    }
                    input.push_str(&l);
                }
            }
            if !is_incomplete(&input) {
                break;
            }
        }
        if input.trim().is_empty() {
            continue;
        }
        lines.remember(&input);
        if repl.handle(&input, &mut stdout.lock(), &mut stderr.lock()) == Flow::Quit {
            break;
        }
    }
    // A script piped in fails as a whole when one of its inputs failed.
    if !interactive && repl.failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// A top-level `let` of an input.
struct LetStmt {
    /// Where the statement is in the input.
    stmt: std::ops::Range<usize>,
    /// Where its right-hand side is in the input.
    value: std::ops::Range<usize>,
    /// The names it binds, with whether each is `mut`.
    names: Vec<(String, bool)>,
}

/// What an input binds and assigns, read from its syntax.
struct InputShape {
    /// Its top-level `let` statements.
    lets: Vec<LetStmt>,
    /// The names its assignments target, in loops and branches too.
    assigned: Vec<String>,
    /// Where its final expression (whose value is printed) starts.
    tail: Option<usize>,
}

impl InputShape {
    /// The shape of `input` read as the statements of a block, and
    /// whether it needed a `;` added (`let x = 1.0`); `None` if it does
    /// not parse as one.
    fn of(input: &str) -> Option<(InputShape, bool)> {
        Self::parse(input, "")
            .map(|s| (s, false))
            .or_else(|| Self::parse(input, ";").map(|s| (s, true)))
    }

    fn parse(input: &str, end: &str) -> Option<InputShape> {
        const OPEN: &str = "fn __repl_shape() {\n";
        let text = format!("{OPEN}{input}{end}\n}}");
        let (module, diags) = adjoint_lang::parse(FileId(0), &text);
        if diags.iter().any(|d| d.is_error()) {
            return None;
        }
        let [ast::Item::Fn(f)] = module.items.as_slice() else {
            return None;
        };
        let ast::ExprKind::Block(block) = &*f.body.kind else {
            return None;
        };
        let at = |x: usize| x.saturating_sub(OPEN.len()).min(input.len());
        let mut shape = InputShape {
            lets: Vec::new(),
            assigned: Vec::new(),
            tail: block.tail.as_ref().map(|t| at(t.span.range().start)),
        };
        for stmt in &block.stmts {
            if let ast::StmtKind::Let {
                pattern,
                mutable,
                value,
                ..
            } = &stmt.kind
            {
                let mut names = Vec::new();
                pattern_names(pattern, *mutable, &mut names);
                let (r, v) = (stmt.span.range(), value.span.range());
                shape.lets.push(LetStmt {
                    stmt: at(r.start)..at(r.end),
                    value: at(v.start)..at(v.end),
                    names,
                });
            }
        }
        assigned_in(block, &mut shape.assigned);
        Some(shape)
    }
}

/// The names `p` binds, each with whether it is `mut`.
fn pattern_names(p: &ast::Pattern, mutable: bool, out: &mut Vec<(String, bool)>) {
    match &p.kind {
        ast::PatternKind::Name(n) => out.push((n.clone(), mutable)),
        ast::PatternKind::MutName(n) => out.push((n.clone(), true)),
        ast::PatternKind::Wildcard => {}
        ast::PatternKind::Tuple(items) => {
            for i in items {
                pattern_names(i, mutable, out);
            }
        }
        ast::PatternKind::Record(fields) => {
            for f in fields {
                match &f.pattern {
                    Some(p) => pattern_names(p, mutable, out),
                    None => out.push((f.name.name.clone(), mutable)),
                }
            }
        }
    }
}

/// The names assigned in `block`, its loops and branches (not in the
/// functions it defines, which cannot assign outer variables).
fn assigned_in(block: &ast::Block, out: &mut Vec<String>) {
    for stmt in &block.stmts {
        match &stmt.kind {
            ast::StmtKind::Assign { target, .. } => {
                let mut names = Vec::new();
                pattern_names(target, false, &mut names);
                out.extend(names.into_iter().map(|(n, _)| n));
            }
            ast::StmtKind::Expr { expr, .. } => assigned_in_expr(expr, out),
            ast::StmtKind::For { body, .. } | ast::StmtKind::While { body, .. } => {
                assigned_in(body, out)
            }
            _ => {}
        }
    }
    if let Some(t) = &block.tail {
        assigned_in_expr(t, out);
    }
}

fn assigned_in_expr(e: &ast::Expr, out: &mut Vec<String>) {
    match &*e.kind {
        ast::ExprKind::Block(b) => assigned_in(b, out),
        ast::ExprKind::If(i) => {
            assigned_in(&i.then, out);
            match &i.else_ {
                Some(ast::Else::Block(b)) => assigned_in(b, out),
                Some(ast::Else::If(e)) => assigned_in_expr(e, out),
                None => {}
            }
        }
        _ => {}
    }
}

/// Whether `text` has `name` as a word (an identifier, not part of one).
fn names_word(text: &str, name: &str) -> bool {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| w == name)
}

/// Whether `v` is or holds a function.
fn holds_function(v: &Value) -> bool {
    match v {
        Value::Func(_) => true,
        Value::Tuple(items) => items.iter().any(holds_function),
        Value::Record(r) => r.fields.iter().any(|(_, v)| holds_function(v)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailing_operator_continues_the_input() {
        assert!(is_incomplete("let a = 1.0 +"));
        assert!(is_incomplete("let b = x @ // the product"));
        assert!(is_incomplete("f(1.0,"));
        assert!(!is_incomplete("let a = 1.0 + 2.0"));
        assert!(!is_incomplete("x // ends in a comment +"));
        assert!(!is_incomplete("f(x) /* a comment */"));
        assert!(is_incomplete("a * /* more */"));
        assert!(!is_incomplete("print(\"a+\")"));
    }

    #[test]
    fn inputs_are_read_for_what_they_bind_and_assign() {
        let assigned = |input: &str| InputShape::of(input).map(|(s, _)| s.assigned);
        for (input, names) in [
            ("z = 2.0", vec!["z"]),
            ("v[i] += 1.0;", vec!["v"]),
            ("(p, q) = (q, p);", vec!["p", "q"]),
            ("{ p = 7.0; }", vec!["p"]),
            ("for i in 0..3 { z += 1.0; }", vec!["z"]),
            ("while k < 3 {\n  k += 1;\n  v[k] = 2.0;\n}", vec!["k", "v"]),
            ("if a > 0.0 { z = a; } else { w = 0.0; }", vec!["z", "w"]),
            ("z == 2.0", vec![]),
            ("if z == 1.0 { 2.0 } else { 3.0 }", vec![]),
            ("let f = |x| x * 2.0;", vec![]),
        ] {
            let want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            assert_eq!(assigned(input), Some(want), "{input}");
        }
        let (s, amended) = InputShape::of("let (mut a, b) = (1.0, 2.0)").unwrap();
        assert!(amended);
        assert_eq!(
            s.lets[0].names,
            vec![("a".to_string(), true), ("b".to_string(), false)]
        );
        let (s, _) = InputShape::of("let mut r = { w: 1.0, b: 2 }; r.w").unwrap();
        assert_eq!(s.lets[0].names, vec![("r".to_string(), true)]);
        assert_eq!(s.tail, Some(30));
        assert!(InputShape::of("f(1.0,").is_none());
    }

    #[test]
    fn brackets_strings_and_comments_decide_continuation() {
        assert!(is_incomplete("fn f(x) {"));
        assert!(is_incomplete("[1.0,\n 2.0"));
        assert!(!is_incomplete("fn f(x) { x }"));
        assert!(!is_incomplete("print(\"(\")"));
        // A string left open on its line is an error now, not more input.
        assert!(!is_incomplete("print(\"a"));
        assert!(!is_incomplete("let s = \"abc\nprint(1.0)"));
        assert!(!is_incomplete("f(x) // (unclosed in a comment"));
        assert!(is_incomplete("f(x) /* still /* nested */ open"));
        assert!(!is_incomplete("f(x) /* a ( */"));
        assert!(!is_incomplete(")"));
    }

    #[test]
    fn arguments_split_at_top_level_commas_or_spaces() {
        assert_eq!(split_args("1.2"), vec!["1.2"]);
        assert_eq!(split_args("1.2 3"), vec!["1.2", "3"]);
        assert_eq!(split_args("[1.0, 2.0], 3"), vec!["[1.0, 2.0]", "3"]);
        assert_eq!(split_args("[1.0, 2.0] 3"), vec!["[1.0, 2.0]", "3"]);
        assert_eq!(split_args("f(1, 2)"), vec!["f(1, 2)"]);
        assert!(split_args("  ").is_empty());
    }

    fn session(inputs: &[&str]) -> (String, String) {
        let mut r = Repl::new(Mode::Graph);
        r.color = false;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for i in inputs {
            r.handle(i, &mut out, &mut err);
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn definitions_accumulate_and_redefinition_replaces() {
        let (out, err) = session(&[
            "fn f(x) = x * x",
            "fn g(x) = f(x) + 1.0",
            "g(3.0)",
            "fn f(x) = x * x * x",
            "g(2.0)",
        ]);
        assert_eq!(out, "10.0\n9.0\n", "stderr: {err}");
        assert_eq!(err, "");
    }

    #[test]
    fn a_bad_definition_is_rejected_and_the_old_one_kept() {
        let (out, err) = session(&["fn f(x) = x * 2.0", "fn f(x) = x * nope", "f(4.0)"]);
        assert_eq!(out, "8.0\n");
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn diagnostics_point_into_the_entry_that_was_typed() {
        let (_, err) = session(&[
            "fn r(v, i) = v[i] * 2.0",
            "let k = 9",
            "fn h(x) {\n    let y = x * 2.0;\n    y + nope\n}",
            "r([1.0], k)",
            ":grad h 1.0",
            ":type 1.0 + zz",
        ]);
        // A name error on the third line of entry 3.
        assert!(err.contains("<input 3>:3:9"), "{err}");
        // A run-time error inside the definition typed as entry 1.
        assert!(err.contains("<input 1>:1:14"), "{err}");
        // `:grad` of an unknown function points at its name.
        assert!(err.contains("<input 5>:1:7"), "{err}");
        assert!(err.contains("<input 6>:1:13"), "{err}");
        assert!(!err.contains("<repl>") && !err.contains("__repl"), "{err}");
    }

    #[test]
    fn let_bindings_are_visible_to_later_inputs() {
        let (out, err) = session(&["let a = 2.0", "let b = a * 3.0", "b + a", "let c = oops"]);
        assert_eq!(out, "8.0\n", "{err}");
        assert!(err.contains("oops"), "{err}");
        let (out, _) = session(&["let (p, q) = (1.0, 2.0);", "p - q"]);
        assert_eq!(out, "-1.0\n");
        let (_, err) = session(&["let (w, b) = (2.0, 1.0)", "fn f(x) = w * x"]);
        assert!(err.contains("unknown name `w`"), "{err}");
        assert!(err.contains("not inside `fn` definitions"), "{err}");
    }

    #[test]
    fn grad_command_prints_signature_and_value() {
        let (out, err) = session(&[
            "fn f(x) = sin(x) * x",
            ":grad f",
            ":grad f 1.2",
            "fn h(x: f64, n: i64) = x ** n",
            ":grad h",
            ":grad h 2.0 3",
        ]);
        let x = 1.2f64;
        let g = x.sin() + x * x.cos();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "grad(f) : (x) -> the type of x", "{out}{err}");
        assert_eq!(lines[1], "grad(f) : (x: f64[]) -> f64[]");
        assert_eq!(lines[2].parse::<f64>().unwrap(), g);
        assert_eq!(lines[3], "grad(h) : (x: f64, n: i64) -> f64");
        assert_eq!(lines[4], "grad(h) : (x: f64[], n: i64[]) -> f64[]");
        assert_eq!(lines[5], "12.0");
        assert_eq!(err, "");
    }

    #[test]
    fn commands_report_misuse() {
        let (out, err) = session(&[":nope", ":mode fast", ":grad", ":type", ":mode"]);
        assert_eq!(out, "graph\n");
        assert!(err.contains("unknown command `:nope`"), "{err}");
        assert!(err.contains("unknown mode `fast`"), "{err}");
        assert!(err.contains("`:grad` needs"), "{err}");
        assert!(err.contains("`:type` needs"), "{err}");
    }

    #[test]
    fn type_is_inferred_without_running() {
        let (out, err) = session(&["fn f(x) = (x, [x, x])", ":type f(1.5)", ":type print(1.0)"]);
        assert_eq!(out, "(f64[], f64[2])\n()\n", "{err}");
    }
}
