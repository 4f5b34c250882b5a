//! Specialising a graph on a function-valued argument.
//!
//! A call `h(.., f, ..)` of a graph that is not inlined (it is recursive,
//! or too large) where `f` is a known function — a graph without free
//! variables, or a primitive — and `h` calls that parameter, becomes a
//! call of a copy `h_f` of `h` without the parameter, in which `f` is a
//! constant. The copy's own recursive calls pass `f` again, so the next
//! round redirects them to `h_f` as well (the copies are memoised), and
//! inside `h_f` the calls of `f` are direct calls, which inlining then
//! removes. This is what lets a higher-order loop (`fold(f, acc, n)`) run
//! without a closure call per iteration, in either pass of its gradient.

use rustc_hash::FxHashMap as HashMap;

use super::Rewriter;
use crate::ir::{Const, GraphId, NodeId, NodeKind};
use crate::prim::Prim;

/// How many specialisations one optimisation makes at most.
const MAX_SPECIALISATIONS: usize = 64;

/// The function a parameter is fixed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Known {
    Graph(GraphId),
    Prim(Prim),
}

/// Specialised copies: (graph, parameter index, function) → copy.
#[derive(Default)]
pub struct Memo {
    copies: HashMap<(GraphId, usize, Known), GraphId>,
    made: usize,
}

impl Rewriter<'_> {
    /// The known function `n` stands for, if any.
    fn known_function(&self, n: NodeId) -> Option<Known> {
        match self.m.as_const(n)? {
            // A graph made this round (a clone) is not in the snapshot of
            // free variables: known from the next round on.
            Const::Graph(k) if self.fv.try_get(*k).is_some_and(<[NodeId]>::is_empty) => {
                Some(Known::Graph(*k))
            }
            Const::Prim(p) => Some(Known::Prim(*p)),
            _ => None,
        }
    }

    /// Whether parameter `p` of `h` is called somewhere in `h` or the
    /// graphs nested in it.
    fn calls_param(&self, h: GraphId, p: NodeId) -> bool {
        self.nest(h).iter().any(|k| {
            self.bodies
                .get(k)
                .into_iter()
                .flatten()
                .any(|&n| self.m.inputs(n).first().map(|c| self.resolve(*c)) == Some(p))
        })
    }

    /// Redirects call `call` of `h` (arguments `args`, in graph `g`) to a
    /// copy of `h` specialised on its first function-valued argument that
    /// `h` calls; returns the new call.
    pub(super) fn specialize(
        &mut self,
        g: GraphId,
        call: NodeId,
        h: GraphId,
        args: &[NodeId],
    ) -> Option<NodeId> {
        if !self.can_inline_body(h, args.len()) {
            return None;
        }
        let params = self.m.graph(h).params.clone();
        let (j, f) = args.iter().enumerate().find_map(|(j, a)| {
            let f = self.known_function(*a)?;
            self.calls_param(h, params[j]).then_some((j, f))
        })?;
        let key = (h, j, f);
        // A copy no longer reachable was detached: make a new one.
        let live = |c: &GraphId| c.index() >= self.graphs_at_start || self.bodies.contains_key(c);
        let copy = match self.memo.copies.get(&key).filter(|c| live(c)) {
            Some(c) => *c,
            None => {
                if self.memo.made >= MAX_SPECIALISATIONS {
                    return None;
                }
                self.memo.made += 1;
                let hg = self.m.graph(h).clone();
                let fname = match f {
                    Known::Graph(k) => self.m.graph(k).name.clone(),
                    Known::Prim(p) => p.name().to_string(),
                };
                let c = self
                    .m
                    .add_graph_as(format!("{}[{}]", hg.name, fname), hg.loc, hg.role);
                let mut inner = Vec::with_capacity(params.len());
                for (i, (p, name)) in params.iter().zip(&hg.param_names).enumerate() {
                    inner.push(if i == j {
                        args[j]
                    } else {
                        let loc = self.m.node(*p).loc;
                        self.m.add_param(c, name.clone(), loc)
                    });
                }
                let first = self.m.nodes.len();
                let out = self.inline_at(c, hg.loc, h, &inner);
                self.m.set_output(c, out);
                // The copy's own calls of `h` with the same function call
                // the copy: it is recursive from the start (else the next
                // round would inline it as if it were not).
                for i in first..self.m.nodes.len() {
                    let n = NodeId(i as u32);
                    let NodeKind::Apply(ins) = &self.m.node(n).kind else {
                        continue;
                    };
                    let same_call = ins.len() == args.len() + 1
                        && self.m.as_const(ins[0]) == Some(&Const::Graph(h))
                        && self.known_function(ins[j + 1]) == Some(f);
                    if same_call {
                        let mut new_ins = ins.clone();
                        new_ins.remove(j + 1);
                        new_ins[0] = self.m.add_const(Const::Graph(c), hg.loc);
                        self.m.node_mut(n).kind = NodeKind::Apply(new_ins);
                    }
                }
                self.memo.copies.insert(key, c);
                self.m.dropped_params.insert(c, (h, j));
                c
            }
        };
        let loc = self.m.node(call).loc;
        let callee = self.m.add_const(Const::Graph(copy), loc);
        let mut inputs = vec![callee];
        inputs.extend(
            args.iter()
                .enumerate()
                .filter(|(i, _)| *i != j)
                .map(|(_, a)| *a),
        );
        Some(self.m.add_apply(g, inputs, loc))
    }
}
