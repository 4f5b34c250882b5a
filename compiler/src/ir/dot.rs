//! The IR as a Graphviz graph (`adjoint emit --dot FILE`).
//!
//! One cluster per graph, laid out as [`super::print::layout`] orders and
//! names them; parameters are ellipses, applications boxes labelled with
//! the primitive or the called value, the output is drawn bold. Constant
//! inputs are written into the label of the node that uses them (they are
//! not nodes of the drawing); an input from another graph (a free
//! variable) is a dashed edge, and a closure made here is a dotted edge to
//! the cluster of its graph.

use std::fmt::Write;

use super::print::{layout, DisplayConst};
use super::{Const, GraphId, Module, NodeId, NodeKind};

/// The graphs reachable from `roots` in Graphviz `dot` syntax.
pub fn to_dot(m: &Module, roots: &[GraphId]) -> String {
    let l = layout(m, roots);
    let id = |n: NodeId| format!("n{}", n.index());
    let mut out = String::from(
        "digraph adjoint {\n  compound=true;\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n",
    );
    for (i, &g) in l.graphs.iter().enumerate() {
        let graph = m.graph(g);
        let _ = writeln!(out, "  subgraph cluster_{i} {{");
        let _ = writeln!(out, "    label={};", quote(&format!("@{}", l.names[i])));
        // An invisible anchor, so that edges can point at the cluster.
        let _ = writeln!(out, "    g{i} [shape=point, style=invis];");
        for (k, &p) in graph.params.iter().enumerate() {
            let name = graph.param_names.get(k).map(String::as_str).unwrap_or("");
            let label = format!("%{} {}", l.number(p).unwrap_or(0), name);
            let _ = writeln!(
                out,
                "    {} [shape=ellipse, label={}];",
                id(p),
                quote(label.trim())
            );
        }
        for &n in &l.bodies[i] {
            let inputs = m.inputs(n);
            let mut label = format!("%{} = ", l.number(n).unwrap_or(0));
            match inputs.first().map(|c| &m.node(*c).kind) {
                Some(NodeKind::Const(Const::Prim(p))) => label.push_str(p.name()),
                Some(NodeKind::Const(c)) => {
                    let _ = write!(
                        label,
                        "{}",
                        DisplayConst {
                            module: m,
                            value: c
                        }
                    );
                }
                Some(_) => label.push_str("call"),
                None => label.push('?'),
            }
            let args: Vec<String> = inputs
                .iter()
                .skip(1)
                .map(|a| match &m.node(*a).kind {
                    NodeKind::Const(c) => format!(
                        "{}",
                        DisplayConst {
                            module: m,
                            value: c
                        }
                    ),
                    _ => format!("%{}", l.number(*a).unwrap_or(0)),
                })
                .collect();
            let _ = write!(label, "({})", args.join(", "));
            let bold = if graph.output == Some(n) {
                ", style=bold"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "    {} [shape=box, label={}{bold}];",
                id(n),
                quote(&label)
            );
        }
        let _ = writeln!(out, "  }}");
    }
    // Edges: data inputs (dashed from another graph), closures (dotted to
    // the cluster of the graph they make).
    for (i, &g) in l.graphs.iter().enumerate() {
        for &n in &l.bodies[i] {
            for &a in m.inputs(n) {
                match &m.node(a).kind {
                    NodeKind::Const(Const::Graph(h)) => {
                        if let Some(j) = l.position(*h) {
                            let _ = writeln!(
                                out,
                                "  {} -> g{j} [dir=back, style=dotted, lhead=cluster_{j}];",
                                id(n)
                            );
                        }
                    }
                    NodeKind::Const(_) => {}
                    _ => {
                        let style = if m.node(a).graph == Some(g) {
                            ""
                        } else {
                            " [style=dashed]"
                        };
                        let _ = writeln!(out, "  {} -> {}{style};", id(a), id(n));
                    }
                }
            }
        }
    }
    out.push_str("}\n");
    out
}

/// A Graphviz string literal.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            '\n' => q.push_str("\\n"),
            _ => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_module_draws_its_graphs_nodes_and_edges() {
        let (m, roots) = crate::ir::parse::parse_module(
            "graph @f(%0 x) {\n  %1 = mul(%0, 2.0)\n  %2 = @g(%1)\n  return %2\n}\n\ngraph @g(%3 y) {\n  %4 = sin(%3)\n  return %4\n}\n",
        )
        .expect("parses");
        let dot = to_dot(&m, &roots[..1]);
        assert!(dot.starts_with("digraph adjoint {"), "{dot}");
        assert!(dot.contains("label=\"@f\""), "{dot}");
        assert!(dot.contains("label=\"@g\""), "{dot}");
        assert!(dot.contains("label=\"%1 = mul(%0, 2.0)\""), "{dot}");
        assert!(dot.contains("label=\"%4 = sin(%3)\", style=bold"), "{dot}");
        // Data edges within each graph, and a dotted one from the call to
        // the cluster of the graph it calls.
        assert_eq!(dot.matches(" -> ").count(), 4, "{dot}");
        for edge in [
            "n0 -> n1;",
            "n1 -> n2;",
            "n3 -> n4;",
            "n2 -> g1 [dir=back, style=dotted",
        ] {
            assert!(dot.contains(edge), "no {edge:?} in {dot}");
        }
        assert!(dot.ends_with("}\n"));
    }
}
