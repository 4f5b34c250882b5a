//! The IR text format, printing side (the grammar is in `docs/ir.md`;
//! [`super::parse`] reads it back).
//!
//! ```text
//! graph @loss(%0 x: f32[4], %1 y: f32[4]) -> f32[] {
//!   %2 = mul(%0, %1) : f32[4]
//!   %3 = sum(%2, (), false) : f32[]
//!   return %3
//! }
//! ```
//!
//! Node numbers are dense across the printed module and independent of the
//! arena ids, so printing the same structure always gives the same text
//! (goldens stay stable when a pass allocates nodes in another order).
//! Constants are printed inline. Graph names are made unique.
//!
//! Which graphs and nodes are printed, and in what order, is decided by
//! [`layout`]: a depth-first walk from the roots through node inputs, where
//! a graph constant `@h` leads into `h` (so a closure's free variables are
//! scheduled in the enclosing graph before the node that makes the
//! closure). Everything is iterative: long programs cannot overflow the
//! Rust stack.

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};

use adjoint_runtime::tensor::{DType, Tensor};

use super::{Const, GraphId, GraphRole, Module, NodeId, NodeKind};

/// A callback giving the type of a node, as text, when one is known.
pub type TypeFn<'a> = &'a dyn Fn(NodeId) -> Option<String>;

/// Which graphs a printout holds, in order, under which (unique) names, the
/// application nodes of each graph in printing order, and the number of
/// every printed node.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Printed graphs: roots first, then graphs in the order the walk met
    /// them, then the owners of free variables that were not met otherwise.
    pub graphs: Vec<GraphId>,
    /// Printed names (unique), parallel to `graphs`.
    pub names: Vec<String>,
    /// The application nodes owned by each graph, parallel to `graphs`, in
    /// dependency order: every node after its inputs, and after the nodes
    /// of its own graph that the closures it uses capture.
    pub bodies: Vec<Vec<NodeId>>,
    numbers: HashMap<NodeId, u32>,
    positions: HashMap<GraphId, usize>,
}

impl Layout {
    /// The printed number of a parameter or application node.
    pub fn number(&self, n: NodeId) -> Option<u32> {
        self.numbers.get(&n).copied()
    }
    /// The printed (unique) name of a graph.
    pub fn name(&self, g: GraphId) -> Option<&str> {
        self.positions.get(&g).map(|&i| self.names[i].as_str())
    }
    /// The position of `g` in [`Layout::graphs`].
    pub fn position(&self, g: GraphId) -> Option<usize> {
        self.positions.get(&g).copied()
    }
}

enum Frame {
    /// A node and the index of its next input to visit.
    Node(NodeId, usize),
    /// A graph to walk (from its output) unless already walked.
    Graph(GraphId),
}

/// Computes what [`print_module`] prints for `roots`. Tolerates broken
/// modules (ids out of range, cycles, missing outputs): it never panics,
/// and nodes it cannot place are simply left unnumbered.
pub fn layout(m: &Module, roots: &[GraphId]) -> Layout {
    let nn = m.nodes.len();
    let ng = m.graphs.len();
    let mut walked = vec![false; ng];
    let mut order: Vec<GraphId> = Vec::new();
    // 0: unvisited, 1: on the stack, 2: done.
    let mut state = vec![0u8; nn];
    let mut post: Vec<NodeId> = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();

    let push_node = |n: NodeId, state: &mut Vec<u8>, stack: &mut Vec<Frame>| {
        if n.index() >= nn {
            return;
        }
        match &m.node(n).kind {
            NodeKind::Const(Const::Graph(h)) => stack.push(Frame::Graph(*h)),
            NodeKind::Const(_) => {}
            _ => {
                if state[n.index()] == 0 {
                    state[n.index()] = 1;
                    stack.push(Frame::Node(n, 0));
                }
            }
        }
    };

    let mut pending_roots: Vec<GraphId> = roots.iter().rev().copied().collect();
    let mut cursor = 0;
    loop {
        if stack.is_empty() {
            if let Some(r) = pending_roots.pop() {
                stack.push(Frame::Graph(r));
            } else {
                // Owners of printed nodes (free variables) must be printed.
                while cursor < post.len() && stack.is_empty() {
                    let n = post[cursor];
                    cursor += 1;
                    if let Some(g) = m.node(n).graph {
                        if g.index() < ng && !walked[g.index()] {
                            stack.push(Frame::Graph(g));
                        }
                    }
                }
                if stack.is_empty() {
                    break;
                }
            }
        }
        let Some(top) = stack.last_mut() else {
            continue;
        };
        match top {
            Frame::Graph(g) => {
                let g = *g;
                stack.pop();
                if g.index() < ng && !walked[g.index()] {
                    walked[g.index()] = true;
                    order.push(g);
                    if let Some(out) = m.graph(g).output {
                        push_node(out, &mut state, &mut stack);
                    }
                }
            }
            Frame::Node(n, i) => {
                let n = *n;
                let inputs = m.inputs(n);
                if *i < inputs.len() {
                    let child = inputs[*i];
                    *i += 1;
                    push_node(child, &mut state, &mut stack);
                } else {
                    state[n.index()] = 2;
                    post.push(n);
                    stack.pop();
                }
            }
        }
    }

    let mut positions = HashMap::new();
    for (i, &g) in order.iter().enumerate() {
        positions.insert(g, i);
    }
    let mut bodies: Vec<Vec<NodeId>> = vec![Vec::new(); order.len()];
    for &n in &post {
        let node = m.node(n);
        if let (NodeKind::Apply(_), Some(g)) = (&node.kind, node.graph) {
            if let Some(&i) = positions.get(&g) {
                bodies[i].push(n);
            }
        }
    }
    let mut numbers = HashMap::new();
    let mut number = |n: NodeId| {
        let next = numbers.len() as u32;
        numbers.entry(n).or_insert(next);
    };
    for (i, &g) in order.iter().enumerate() {
        for &p in &m.graph(g).params {
            if p.index() < nn {
                number(p);
            }
        }
        for &n in &bodies[i] {
            number(n);
        }
    }
    let names = unique_names(m, &order);
    Layout {
        graphs: order,
        names,
        bodies,
        numbers,
        positions,
    }
}

/// The graphs' names, with `.1`, `.2`, .. appended to repeated ones.
fn unique_names(m: &Module, order: &[GraphId]) -> Vec<String> {
    let mut used: HashSet<String> = HashSet::new();
    let mut names = Vec::with_capacity(order.len());
    for &g in order {
        let base = &m.graph(g).name;
        let mut name = base.clone();
        let mut k = 1;
        while used.contains(&name) {
            name = format!("{base}.{k}");
            k += 1;
        }
        used.insert(name.clone());
        names.push(name);
    }
    names
}

/// Prints every graph reachable from `roots` (and the graphs owning the
/// free variables they use). `types` gives the type of a parameter or
/// application node as text, printed after it when known.
pub fn print_module(m: &Module, roots: &[GraphId], types: Option<TypeFn<'_>>) -> String {
    let l = layout(m, roots);
    let mut out = String::new();
    for i in 0..l.graphs.len() {
        if i > 0 {
            out.push('\n');
        }
        write_graph(&mut out, m, &l, i, types);
    }
    out
}

/// Prints graph `g` alone, numbered as in `print_module(m, &[g], types)`:
/// its own nodes are numbered from `%0`; free variables keep the numbers
/// they have in that printout.
pub fn print_graph(m: &Module, g: GraphId, types: Option<TypeFn<'_>>) -> String {
    let l = layout(m, &[g]);
    let mut out = String::new();
    if let Some(i) = l.position(g) {
        write_graph(&mut out, m, &l, i, types);
    }
    out
}

/// `print_module` as a value that implements `Display`.
pub struct DisplayModule<'a> {
    pub module: &'a Module,
    pub roots: &'a [GraphId],
}

impl fmt::Display for DisplayModule<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print_module(self.module, self.roots, None))
    }
}

impl Module {
    /// Displays the graphs reachable from `roots` in the IR text format.
    pub fn display<'a>(&'a self, roots: &'a [GraphId]) -> DisplayModule<'a> {
        DisplayModule {
            module: self,
            roots,
        }
    }
}

/// Displays a constant as the text format writes it inline; graph
/// references use the graph's own name.
pub struct DisplayConst<'a> {
    pub module: &'a Module,
    pub value: &'a Const,
}

impl fmt::Display for DisplayConst<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        write_const(&mut s, self.module, None, self.value);
        f.write_str(&s)
    }
}

fn write_graph(out: &mut String, m: &Module, l: &Layout, i: usize, types: Option<TypeFn<'_>>) {
    let g = l.graphs[i];
    let graph = m.graph(g);
    let ty = |n: NodeId| types.and_then(|f| f(n));
    if graph.role != GraphRole::Primal {
        out.push_str(graph.role.keyword());
        out.push(' ');
    }
    out.push_str("graph @");
    write_name(out, &l.names[i]);
    out.push('(');
    for (k, &p) in graph.params.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        write_ref(out, m, l, p);
        if let Some(name) = graph.param_names.get(k) {
            if !name.is_empty() {
                out.push(' ');
                write_name(out, name);
            }
        }
        if let Some(t) = ty(p) {
            let _ = write!(out, ": {t}");
        }
    }
    out.push(')');
    if let Some(t) = graph.output.and_then(ty) {
        let _ = write!(out, " -> {t}");
    }
    out.push_str(" {\n");
    for &n in &l.bodies[i] {
        out.push_str("  ");
        write_ref(out, m, l, n);
        out.push_str(" = ");
        let inputs = m.inputs(n);
        match inputs.first() {
            Some(&callee) => match m.nodes.get(callee.index()).map(|c| &c.kind) {
                Some(NodeKind::Const(Const::Prim(p))) => out.push_str(p.name()),
                _ => write_ref(out, m, l, callee),
            },
            None => out.push_str("!nocallee"),
        }
        out.push('(');
        for (k, &a) in inputs.iter().skip(1).enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            write_ref(out, m, l, a);
        }
        out.push(')');
        if let Some(t) = ty(n) {
            let _ = write!(out, " : {t}");
        }
        out.push('\n');
    }
    if let Some(o) = graph.output {
        out.push_str("  return ");
        write_ref(out, m, l, o);
        out.push('\n');
    }
    out.push_str("}\n");
}

/// Writes a use of node `n`: its number, or the constant inline. Nodes the
/// layout could not place (only in broken modules) print as `%!<arena id>`,
/// which the parser rejects.
fn write_ref(out: &mut String, m: &Module, l: &Layout, n: NodeId) {
    match m.nodes.get(n.index()) {
        Some(node) => match &node.kind {
            NodeKind::Const(c) => write_const(out, m, Some(l), c),
            _ => match l.number(n) {
                Some(k) => {
                    let _ = write!(out, "%{k}");
                }
                None => {
                    let _ = write!(out, "%!{}", n.0);
                }
            },
        },
        None => {
            let _ = write!(out, "%!{}", n.0);
        }
    }
}

fn write_const(out: &mut String, m: &Module, l: Option<&Layout>, c: &Const) {
    match c {
        Const::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Const::Float(x) => write_f64(out, *x),
        Const::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Const::Str(s) => write_str_lit(out, s),
        Const::Unit => out.push_str("()"),
        Const::DType(d) => out.push_str(d.name()),
        Const::Tensor(t) => write_tensor(out, t),
        Const::Prim(p) => {
            let _ = write!(out, "prim.{}", p.name());
        }
        Const::Graph(g) => {
            out.push('@');
            match l.and_then(|l| l.name(*g)) {
                Some(name) => write_name(out, name),
                None => match m.graphs.get(g.index()) {
                    Some(graph) => write_name(out, &graph.name),
                    None => {
                        let _ = write!(out, "!{}", g.0);
                    }
                },
            }
        }
    }
}

/// Whether `s` prints bare as a graph or parameter name.
pub fn is_plain_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(is_name_char)
}

pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'
}

fn write_name(out: &mut String, s: &str) {
    if is_plain_name(s) {
        out.push_str(s);
    } else {
        write_str_lit(out, s);
    }
}

/// A string literal with `\\ \" \n \r \t` and `\u{..}` for other control
/// characters.
fn write_str_lit(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float that always reads back as a float and as the same value:
/// `1.0`, `0.1`, `1e-7`, `inf`, `-inf`, `nan`.
pub fn format_f64(x: f64) -> String {
    let mut s = String::new();
    write_f64(&mut s, x);
    s
}

fn write_f64(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("nan");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        // `Debug` is the shortest text that reads back exactly, and always
        // has a `.` or an exponent.
        let _ = write!(out, "{x:?}");
    }
}

fn write_f32(out: &mut String, x: f32) {
    if x.is_nan() {
        out.push_str("nan");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(out, "{x:?}");
    }
}

/// `tensor<f32[2]>[1.0, 2.0]`, or `tensor<weak f64[]>[2.5]` for a weakly
/// typed literal. Elements are listed flat, in row-major order.
fn write_tensor(out: &mut String, t: &Tensor) {
    out.push_str("tensor<");
    if t.weak {
        out.push_str("weak ");
    }
    out.push_str(t.dtype().name());
    out.push('[');
    for (i, d) in t.shape().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{d}");
    }
    out.push_str("]>[");
    fn list<T>(out: &mut String, xs: &[T], mut f: impl FnMut(&mut String, &T)) {
        for (i, x) in xs.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            f(out, x);
        }
    }
    match t.dtype() {
        DType::F32 => list(out, t.as_f32().unwrap_or(&[]), |o, x| write_f32(o, *x)),
        DType::F64 => list(out, t.as_f64().unwrap_or(&[]), |o, x| write_f64(o, *x)),
        DType::I32 => list(out, t.as_i32().unwrap_or(&[]), |o, x| {
            let _ = write!(o, "{x}");
        }),
        DType::I64 => list(out, t.as_i64().unwrap_or(&[]), |o, x| {
            let _ = write!(o, "{x}");
        }),
        DType::U8 => list(out, t.as_u8().unwrap_or(&[]), |o, x| {
            let _ = write!(o, "{x}");
        }),
        DType::Bool => list(out, t.as_bool().unwrap_or(&[]), |o, x| {
            o.push_str(if *x { "true" } else { "false" })
        }),
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prim::Prim;

    #[test]
    fn floats_always_read_back_as_floats() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e-7, "1e-7"),
            (1e16, "1e16"),
            (123456.5, "123456.5"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
        ];
        for (x, s) in cases {
            assert_eq!(format_f64(x), s);
        }
        for x in [0.1, 1.0 / 3.0, 1e-300, f64::MAX, f64::MIN_POSITIVE, 5e-324] {
            assert_eq!(format_f64(x).parse::<f64>().unwrap().to_bits(), x.to_bits());
        }
    }

    #[test]
    fn names_and_strings() {
        assert!(is_plain_name("main.while_header.3"));
        assert!(is_plain_name("_x$1"));
        assert!(!is_plain_name("1x"));
        assert!(!is_plain_name("a b"));
        assert!(!is_plain_name(""));
        let mut s = String::new();
        write_str_lit(&mut s, "a\"b\\c\n\u{7f}");
        assert_eq!(s, r#""a\"b\\c\n\u{7f}""#);
    }

    #[test]
    fn display_helpers() {
        let mut m = Module::new();
        let g = m.add_graph("f", super::super::Loc::NONE);
        let x = m.add_param(g, "x", super::super::Loc::NONE);
        let n = m.add_prim(g, Prim::Exp, &[x], super::super::Loc::NONE);
        m.set_output(g, n);
        assert_eq!(
            m.display(&[g]).to_string(),
            "graph @f(%0 x) {\n  %1 = exp(%0)\n  return %1\n}\n"
        );
        let c = Const::Graph(g);
        assert_eq!(
            DisplayConst {
                module: &m,
                value: &c
            }
            .to_string(),
            "@f"
        );
        let c = Const::Prim(Prim::Add);
        assert_eq!(
            DisplayConst {
                module: &m,
                value: &c
            }
            .to_string(),
            "prim.add"
        );
        let l = layout(&m, &[g]);
        assert_eq!(l.number(n), Some(1));
        assert_eq!(l.name(g), Some("f"));
        assert_eq!(l.bodies, vec![vec![n]]);
    }
}
