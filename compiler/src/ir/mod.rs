//! The graph IR: MindSpore-style functional graphs.
//!
//! A [`Module`] owns an arena of [`Node`]s and an arena of [`Graph`]s, both
//! addressed by typed ids. A graph has parameters and one output node. A
//! node is a parameter of some graph, a constant (scalar, string, tensor,
//! primitive, reference to a graph, dtype), or an application whose first
//! input is the callee. A node used by a graph other than its owner is a
//! *free variable* of that graph: graph constants referring to graphs with
//! free variables evaluate to closures.
//!
//! Derived facts (users, free variables, order) are not stored here; they
//! are computed into side tables by [`analysis`].
//!
//! **Architecture Invariant:** the IR does not depend on the syntax crate.
//! Nodes carry an opaque [`Loc`] (file id and byte range) that the pipeline
//! maps back to a source span.

pub mod analysis;
pub mod copy;
pub mod dot;
pub mod parse;
pub mod print;
pub mod verify;

use std::fmt;
use std::sync::Arc;

use adjoint_runtime::tensor::{DType, Tensor};

use crate::prim::Prim;

macro_rules! entity {
    ($name:ident, $prefix:expr) => {
        #[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
        pub struct $name(pub u32);
        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0)
            }
        }
    };
}

entity!(NodeId, "%");
entity!(GraphId, "@g");

/// An opaque source location: file id and byte range. `Loc::NONE` means
/// "no source" (nodes made up by a pass with nothing better to point at).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Loc {
    pub file: u32,
    pub lo: u32,
    pub hi: u32,
}

impl Loc {
    pub const NONE: Loc = Loc {
        file: u32::MAX,
        lo: 0,
        hi: 0,
    };
    pub fn is_none(self) -> bool {
        self.file == u32::MAX
    }
}

/// A constant value held by a constant node.
#[derive(Clone, Debug, PartialEq)]
pub enum Const {
    /// An integer literal (weakly typed i64 unless `strong`).
    Int(i64),
    /// A float literal (weakly typed f64).
    Float(f64),
    Bool(bool),
    Str(Arc<str>),
    /// The empty tuple `()`, also the "omitted" value of optional arguments.
    Unit,
    DType(DType),
    /// A tensor constant (made by constant folding, or parsed from IR text).
    Tensor(Tensor),
    Prim(Prim),
    Graph(GraphId),
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// The `index`-th parameter of its owning graph.
    Param {
        index: u32,
    },
    Const(Const),
    /// `inputs[0]` applied to `inputs[1..]`.
    Apply(Vec<NodeId>),
}

#[derive(Clone, Debug)]
pub struct Node {
    pub kind: NodeKind,
    /// The graph that owns the node; `None` for constants, which belong to
    /// no graph and may be shared.
    pub graph: Option<GraphId>,
    pub loc: Loc,
}

/// What a graph is for, set by the pass that makes it. Passes that treat
/// the graphs of lowering or of AD specially ask for the role, never for
/// the name (names are for people, and users choose them). Copies of a
/// graph (inlining, specialisation) keep its role. The text format writes
/// every role but [`GraphRole::Primal`] before `graph`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum GraphRole {
    /// A function, closure, branch or block of the program, or a graph a
    /// pass made with no role of its own.
    #[default]
    Primal,
    /// A loop's test: `while` or `for` header, which calls the body or the
    /// exit.
    LoopHeader,
    /// A loop's body, which tail-calls the header.
    LoopBody,
    /// What runs after a loop (`after`).
    LoopExit,
    /// Reverse mode's `J(f)`: returns `(value, backpropagator)`.
    Reverse,
    /// Reverse mode's `J'(f)` of a graph on a cycle of tail calls: its last
    /// parameter is the stack of backpropagators it threads.
    ReverseStacked,
    /// A backpropagator `B(f)` or `B'(f)`, or a primitive rule's.
    Backprop,
    /// Reverse mode's `unwind(stack, d)`, which pops a stack of
    /// backpropagators.
    Unwind,
    /// The branch of `unwind` that runs the top backpropagator.
    UnwindStep,
    /// The branch of `unwind` on an empty stack.
    UnwindDone,
    /// Forward mode's `F(f)`: returns `(value, tangent)`.
    Tangent,
}

impl GraphRole {
    pub const ALL: [GraphRole; 11] = [
        GraphRole::Primal,
        GraphRole::LoopHeader,
        GraphRole::LoopBody,
        GraphRole::LoopExit,
        GraphRole::Reverse,
        GraphRole::ReverseStacked,
        GraphRole::Backprop,
        GraphRole::Unwind,
        GraphRole::UnwindStep,
        GraphRole::UnwindDone,
        GraphRole::Tangent,
    ];

    /// The word the text format writes before `graph` (empty for
    /// [`GraphRole::Primal`]).
    pub fn keyword(self) -> &'static str {
        match self {
            GraphRole::Primal => "",
            GraphRole::LoopHeader => "loop_header",
            GraphRole::LoopBody => "loop_body",
            GraphRole::LoopExit => "loop_exit",
            GraphRole::Reverse => "reverse",
            GraphRole::ReverseStacked => "reverse_stacked",
            GraphRole::Backprop => "backprop",
            GraphRole::Unwind => "unwind",
            GraphRole::UnwindStep => "unwind_step",
            GraphRole::UnwindDone => "unwind_done",
            GraphRole::Tangent => "tangent",
        }
    }

    /// `unwind` or one of its branches.
    pub fn is_unwind(self) -> bool {
        matches!(
            self,
            GraphRole::Unwind | GraphRole::UnwindStep | GraphRole::UnwindDone
        )
    }

    pub fn from_keyword(word: &str) -> Option<GraphRole> {
        GraphRole::ALL
            .into_iter()
            .find(|r| *r != GraphRole::Primal && r.keyword() == word)
    }
}

#[derive(Clone, Debug)]
pub struct Graph {
    /// A readable name, unique within the module after lowering (`main`,
    /// `loss`, `main.while_header.3`). Only for people: passes read
    /// [`Graph::role`].
    pub name: String,
    pub role: GraphRole,
    pub params: Vec<NodeId>,
    /// Parameter names (for printing and diagnostics), parallel to `params`.
    pub param_names: Vec<String>,
    pub output: Option<NodeId>,
    pub loc: Loc,
}

/// A set of graphs and the nodes they are made of.
#[derive(Clone, Debug, Default)]
pub struct Module {
    pub nodes: Vec<Node>,
    pub graphs: Vec<Graph>,
    /// Graphs the optimiser copied without one parameter (specialised on
    /// a function argument, `opt::specialize`): the copy → the graph it
    /// copies and the index of the parameter dropped. Reverse mode's
    /// results keep a cotangent per parameter of the original.
    pub dropped_params: std::collections::HashMap<GraphId, (GraphId, usize)>,
    /// The processes the module is compiled for: `rank()` and
    /// `world_size()` are these constants, and the shapes of `all_gather`
    /// and `reduce_scatter` follow the size.
    pub world: World,
}

/// This process's place among the processes of a run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct World {
    pub rank: usize,
    pub size: usize,
}

impl World {
    /// One process alone.
    pub const SINGLE: World = World { rank: 0, size: 1 };

    /// This process's place in the world of `comm`.
    pub fn of(comm: &dyn adjoint_runtime::comm::Communicator) -> World {
        World {
            rank: comm.rank(),
            size: comm.size(),
        }
    }
}

impl Default for World {
    fn default() -> World {
        World::SINGLE
    }
}

impl Module {
    pub fn new() -> Module {
        Module::default()
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }
    /// For each parameter of `g`, its index among the parameters of the
    /// graph it was first copied from ([`Module::dropped_params`]), and
    /// that graph's parameter count.
    pub fn original_params(&self, g: GraphId) -> (Vec<usize>, usize) {
        let mut idx: Vec<usize> = (0..self.graph(g).params.len()).collect();
        let mut count = idx.len();
        let mut at = g;
        let mut steps = 0;
        while let Some(&(orig, j)) = self.dropped_params.get(&at) {
            for i in idx.iter_mut() {
                if *i >= j {
                    *i += 1;
                }
            }
            count += 1;
            at = orig;
            steps += 1;
            if steps > self.graphs.len() {
                break;
            }
        }
        (idx, count)
    }

    pub fn graph(&self, id: GraphId) -> &Graph {
        &self.graphs[id.index()]
    }
    pub fn graph_mut(&mut self, id: GraphId) -> &mut Graph {
        &mut self.graphs[id.index()]
    }
    pub fn graph_ids(&self) -> impl Iterator<Item = GraphId> {
        (0..self.graphs.len() as u32).map(GraphId)
    }

    pub fn add_graph(&mut self, name: impl Into<String>, loc: Loc) -> GraphId {
        self.add_graph_as(name, loc, GraphRole::Primal)
    }

    /// A new empty graph with a role.
    pub fn add_graph_as(&mut self, name: impl Into<String>, loc: Loc, role: GraphRole) -> GraphId {
        let id = GraphId(self.graphs.len() as u32);
        self.graphs.push(Graph {
            name: name.into(),
            role,
            params: Vec::new(),
            param_names: Vec::new(),
            output: None,
            loc,
        });
        id
    }

    fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(node);
        id
    }

    /// Appends a parameter to graph `g`.
    pub fn add_param(&mut self, g: GraphId, name: impl Into<String>, loc: Loc) -> NodeId {
        let index = self.graphs[g.index()].params.len() as u32;
        let id = self.push(Node {
            kind: NodeKind::Param { index },
            graph: Some(g),
            loc,
        });
        let graph = &mut self.graphs[g.index()];
        graph.params.push(id);
        graph.param_names.push(name.into());
        id
    }

    pub fn add_const(&mut self, c: Const, loc: Loc) -> NodeId {
        self.push(Node {
            kind: NodeKind::Const(c),
            graph: None,
            loc,
        })
    }

    /// Adds `inputs[0](inputs[1..])` to graph `g`.
    pub fn add_apply(&mut self, g: GraphId, inputs: Vec<NodeId>, loc: Loc) -> NodeId {
        self.push(Node {
            kind: NodeKind::Apply(inputs),
            graph: Some(g),
            loc,
        })
    }

    /// Adds a call of primitive `p` to graph `g`.
    pub fn add_prim(&mut self, g: GraphId, p: Prim, args: &[NodeId], loc: Loc) -> NodeId {
        let callee = self.add_const(Const::Prim(p), loc);
        let mut inputs = Vec::with_capacity(args.len() + 1);
        inputs.push(callee);
        inputs.extend_from_slice(args);
        self.add_apply(g, inputs, loc)
    }

    pub fn set_output(&mut self, g: GraphId, out: NodeId) {
        self.graphs[g.index()].output = Some(out);
    }

    /// The constant held by `id`, if it is a constant node.
    pub fn as_const(&self, id: NodeId) -> Option<&Const> {
        match &self.node(id).kind {
            NodeKind::Const(c) => Some(c),
            _ => None,
        }
    }
    /// The graph of a graph constant `@g`.
    pub fn as_graph(&self, id: NodeId) -> Option<GraphId> {
        match self.as_const(id) {
            Some(Const::Graph(g)) => Some(*g),
            _ => None,
        }
    }
    /// `switch(c, @a, @b)` between two graph constants: `c`, `a` and `b`.
    pub fn graph_switch(&self, id: NodeId) -> Option<(NodeId, GraphId, GraphId)> {
        let ins = self.inputs(id);
        if self.applied_prim(id) != Some(Prim::Switch) || ins.len() != 4 {
            return None;
        }
        Some((ins[1], self.as_graph(ins[2])?, self.as_graph(ins[3])?))
    }
    /// The primitive applied by `id`, if it is an application of one.
    pub fn applied_prim(&self, id: NodeId) -> Option<Prim> {
        match &self.node(id).kind {
            NodeKind::Apply(inputs) => match self.as_const(inputs[0]) {
                Some(Const::Prim(p)) => Some(*p),
                _ => None,
            },
            _ => None,
        }
    }
    pub fn inputs(&self, id: NodeId) -> &[NodeId] {
        match &self.node(id).kind {
            NodeKind::Apply(inputs) => inputs,
            _ => &[],
        }
    }
    pub fn graph_by_name(&self, name: &str) -> Option<GraphId> {
        self.graph_ids().find(|g| self.graph(*g).name == name)
    }
}

/// How messages name a function by its graph's name, as the program
/// writes it: `grad.f` is `grad(f)`, `grad.grad.lambda` is
/// `grad(grad(|..| ..))`, a numbered copy (`f.3`) is `f`. `None` for a
/// function value with no name of its own (`fn`, made by a call).
pub fn source_name(graph: &str) -> Option<String> {
    let base = match graph.rsplit_once('.') {
        Some((b, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => b,
        _ => graph,
    };
    const TRANSFORMS: [&str; 9] = [
        "value_and_grad",
        "grad",
        "vmap",
        "jacobian",
        "jacfwd",
        "hessian",
        "hvp",
        "vjp",
        "jvp",
    ];
    for t in TRANSFORMS {
        if let Some(f) = base.strip_prefix(t).and_then(|r| r.strip_prefix('.')) {
            return Some(format!(
                "{t}({})",
                source_name(f).unwrap_or_else(|| "..".into())
            ));
        }
    }
    if base == "lambda" || base.ends_with(".lambda") {
        Some("|..| ..".into())
    } else if base == "fn" || base.is_empty() {
        None
    } else {
        Some(base.to_string())
    }
}

/// [`source_name`] as a message says it: `` `grad(f)` ``, "this lambda",
/// "this function".
pub fn source_phrase(graph: &str) -> String {
    match source_name(graph) {
        Some(n) if n == "|..| .." => "this lambda".to_string(),
        Some(n) => format!("`{n}`"),
        None => "this function".to_string(),
    }
}

#[cfg(test)]
mod source_name_tests {
    use super::source_name;

    #[test]
    fn transforms_and_lambdas_read_as_written() {
        assert_eq!(source_name("grad.f").as_deref(), Some("grad(f)"));
        assert_eq!(
            source_name("grad.grad.lambda").as_deref(),
            Some("grad(grad(|..| ..))")
        );
        assert_eq!(source_name("f.3").as_deref(), Some("f"));
        assert_eq!(source_name("main.lambda").as_deref(), Some("|..| .."));
        assert_eq!(source_name("fn"), None);
        assert_eq!(source_name("vmap.fn").as_deref(), Some("vmap(..)"));
    }
}
