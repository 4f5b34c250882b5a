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
//!
//! The typed pass also copies a loop or recursive graph per signature
//! its callers give it ([`Rewriter::split_by_signature`]).

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::Rewriter;
use crate::infer::{AbsVal, Types};
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

/// The most graphs [`Rewriter::split_by_signature`] copies in one typed
/// pass.
const MAX_SIGNATURE_COPIES: usize = 32;

/// The dtypes and shapes of `vals`, as text (known values and weak types
/// left out: code generation specialises on neither).
fn signature<'a>(vals: impl Iterator<Item = &'a AbsVal>) -> String {
    fn put(v: &AbsVal, out: &mut String) {
        match v {
            AbsVal::Tensor(t) => out.push_str(&format!("{:?}{:?}", t.dtype, t.shape)),
            AbsVal::Tuple(items) => {
                out.push('(');
                items.iter().for_each(|i| put(i, out));
                out.push(')');
            }
            AbsVal::Record(fields) => {
                out.push('{');
                for (name, i) in fields {
                    out.push_str(name);
                    put(i, out);
                }
                out.push('}');
            }
            other => out.push_str(&format!("{other:?}")),
        }
        out.push(' ');
    }
    let mut out = String::new();
    vals.for_each(|v| put(v, &mut out));
    out
}

impl Rewriter<'_> {
    /// Gives a graph that is not inlined (a loop's header or exit, a
    /// recursive function) and that its callers call with different types
    /// one copy per further signature, so that each has one type per
    /// value.
    ///
    /// Inference specialises a graph per signature, but the module keeps
    /// one graph, whose values join the signatures' types: a loop called
    /// both on a scalar and, under `vmap`, on a vector, or on f32 and f64
    /// data, has values of no one shape, and code generation, which needs
    /// static types, leaves it (and everything it calls) to the VM. Calls
    /// of graphs on a cycle of calls or chosen by a `switch` (which
    /// inlining leaves), from outside them, are grouped by the callee's
    /// dtypes and shapes (one in every signature of the caller, else the
    /// call is left alone) and by which arguments have `vmap` lanes (which
    /// fusion leaves to the VM too); the first group keeps the graph, every other
    /// calls a copy of it with the graphs nested in it, whose own calls of
    /// the graph (a loop's back edge) call the copy. Graphs the copies
    /// call with one signature each are split by the next typed pass,
    /// their callers having one signature then.
    pub(super) fn split_by_signature(&mut self, graphs: &[GraphId], types: &Types) {
        // External calls of each graph: (the callee's signature, caller,
        // call).
        type Site = (String, GraphId, NodeId);
        let mut sites: HashMap<GraphId, Vec<Site>> = HashMap::default();
        let mut chosen: HashSet<GraphId> = HashSet::default();
        for &g in graphs {
            for &n in &self.bodies[&g] {
                let (hs, by_switch) = self.called_graphs(n);
                for h in hs {
                    // The callee's types in every signature of the caller
                    // (a loop's first trip and the next ones differ only
                    // in known values and weak types): one, or no site.
                    let mut sig: Option<String> = None;
                    let mut one = true;
                    for &id in types.specs_of(g) {
                        for &c in types.spec(id).calls.get(&n).into_iter().flatten() {
                            let cs = types.spec(c);
                            if cs.graph != h {
                                continue;
                            }
                            let here = signature(cs.args.iter().chain(cs.captures.iter()));
                            match &sig {
                                None => sig = Some(here),
                                Some(s) => one &= *s == here,
                            }
                        }
                    }
                    let (Some(sig), true) = (sig, one) else {
                        continue;
                    };
                    sites.entry(h).or_default().push((sig, g, n));
                    if by_switch {
                        chosen.insert(h);
                    }
                }
            }
        }
        // Only graphs that more than one call from outside them may need
        // copies.
        sites.retain(|h, v| {
            let nest = self.nest(*h);
            v.retain(|(_, g, _)| !nest.contains(g));
            v.len() > 1 && (chosen.contains(h) || self.on_cycle(*h, &nest))
        });
        if sites.is_empty() {
            return;
        }
        // Values with `vmap` lanes: fusion leaves the graphs that see them
        // to the VM, so a loop called with and without lanes is split too.
        let (lanes, _) = crate::fuse::lanes::lane_nodes(self.m, graphs, self.bodies);
        for (sig, _, n) in sites.values_mut().flatten() {
            for &a in &self.m.inputs(*n)[1..] {
                sig.push(if lanes.contains(&self.resolve(a)) {
                    'L'
                } else {
                    '.'
                });
            }
        }
        let mut callees: Vec<GraphId> = sites.keys().copied().collect();
        callees.sort_by_key(|h| h.index());
        let mut made = 0;
        for h in callees {
            if types.is_escaped(h) {
                continue;
            }
            let outside: Vec<Site> = sites[&h].clone();
            let mut sigs: Vec<&str> = Vec::new();
            for (s, _, _) in &outside {
                if !sigs.contains(&s.as_str()) {
                    sigs.push(s);
                }
            }
            let nparams = self.m.graph(h).params.len();
            for sig in sigs.iter().skip(1) {
                if made >= MAX_SIGNATURE_COPIES || !self.can_inline_body(h, nparams) {
                    break;
                }
                made += 1;
                let copy = self.copy_of(h);
                for (_, g, n) in outside.iter().filter(|(s, _, _)| s == sig) {
                    self.redirect(*g, *n, h, copy);
                }
                self.stats.specialized += 1;
            }
        }
    }

    /// Whether a graph of `nest` (the graphs nested in `h`) calls `h`.
    fn on_cycle(&self, h: GraphId, nest: &[GraphId]) -> bool {
        nest.iter().any(|k| {
            self.bodies
                .get(k)
                .is_some_and(|b| b.iter().any(|&n| self.called_graphs(n).0.contains(&h)))
        })
    }

    /// The graphs call `n` may call: `@h(..)`, or one of the graphs of
    /// `switch(c, @a, @b)(..)` (then also `true`).
    fn called_graphs(&self, n: NodeId) -> (Vec<GraphId>, bool) {
        let Some(&c) = self.m.inputs(n).first() else {
            return (Vec::new(), false);
        };
        if self.m.applied_prim(n).is_some() {
            return (Vec::new(), false);
        }
        let c = self.resolve(c);
        if let Some(Const::Graph(h)) = self.m.as_const(c) {
            return (vec![*h], false);
        }
        match self.m.graph_switch(c) {
            Some((_, a, b)) => (vec![a, b], true),
            None => (Vec::new(), false),
        }
    }

    /// Makes call `n` (in `g`) call `copy` where it called `h`: directly,
    /// or as the graph its `switch` chooses.
    fn redirect(&mut self, g: GraphId, n: NodeId, h: GraphId, copy: GraphId) {
        let n = self.resolve(n);
        let loc = self.m.node(n).loc;
        let mut inputs = self.m.inputs(n).to_vec();
        let head = self.resolve(inputs[0]);
        let to_copy = |rw: &mut Self, x: NodeId| -> NodeId {
            if rw.m.as_const(x) == Some(&Const::Graph(h)) {
                rw.m.add_const(Const::Graph(copy), loc)
            } else {
                x
            }
        };
        if self.m.as_const(head) == Some(&Const::Graph(h)) {
            inputs[0] = to_copy(self, head);
        } else {
            let sw: Vec<NodeId> = self.m.inputs(head).to_vec();
            let sw: Vec<NodeId> = sw
                .into_iter()
                .map(|x| to_copy(self, self.resolve(x)))
                .collect();
            let hloc = self.m.node(head).loc;
            inputs[0] = self.m.add_apply(g, sw, hloc);
        }
        let call = self.m.add_apply(g, inputs, loc);
        self.replace(g, n, call);
    }
    /// A copy of `h` and the graphs nested in it, whose uses of `h` are
    /// uses of the copy.
    fn copy_of(&mut self, h: GraphId) -> GraphId {
        let hg = self.m.graph(h).clone();
        let c = self.m.add_graph_as(hg.name.clone(), hg.loc, hg.role);
        let mut params = Vec::with_capacity(hg.params.len());
        for (p, name) in hg.params.iter().zip(&hg.param_names) {
            let loc = self.m.node(*p).loc;
            params.push(self.m.add_param(c, name.clone(), loc));
        }
        let first = self.m.nodes.len();
        let out = self.inline_at(c, hg.loc, h, &params);
        self.m.set_output(c, out);
        let mut own: Option<NodeId> = None;
        for i in first..self.m.nodes.len() {
            let n = NodeId(i as u32);
            let NodeKind::Apply(ins) = &self.m.node(n).kind else {
                continue;
            };
            if !ins
                .iter()
                .any(|i| self.m.as_const(*i) == Some(&Const::Graph(h)))
            {
                continue;
            }
            let mut ins = ins.clone();
            for i in ins.iter_mut() {
                if self.m.as_const(*i) == Some(&Const::Graph(h)) {
                    let loc = self.m.node(*i).loc;
                    *i = *own.get_or_insert_with(|| self.m.add_const(Const::Graph(c), loc));
                }
            }
            self.m.node_mut(n).kind = NodeKind::Apply(ins);
        }
        if let Some(d) = self.m.dropped_params.get(&h).copied() {
            self.m.dropped_params.insert(c, d);
        }
        self.changed += self.m.nodes.len() - first;
        c
    }
}
