//! Differentiation of function values at run time.
//!
//! `grad(f)` where `f` is only known when the program runs (a parameter,
//! an element of a tuple, the result of a call) lowers to
//! `ad_dyn(f, kind, argnums, wrap)`; and the transforms lift values they
//! reach from outside the differentiated code with `ad_lift(v, mode)`.
//! When such a program runs, [`DynAd`] (the runtime's
//! [`Dynamic`] hook) receives the closure, transforms its graph with the
//! same code as compile-time requests, compiles the new graphs into code
//! objects numbered after the program's own and returns the new closure.
//! Each (graph, transform) is built once.
//!
//! Representation: inside reverse-mode code a closure `(g, c)` (graph,
//! captured values) is `(J(g), lift(c))`, the same free variables with
//! each captured value lifted in turn; forward mode likewise with `F`.
//! The transforms built here use their free variables as they are
//! (`lift_outside` off), because the captures arrive lifted. Compile-time
//! requests instead capture values as they are and lift them inside.
//!
//! `ad_dyn` inside differentiated code (`grad` of a function that calls
//! `grad(f)` on a function value) receives `f` lifted: `wrap` records the
//! transforms around it (base 3, the outermost in the lowest digit). The
//! closure's graph is peeled back to the original through
//! [`Provenance`], the request is built on the original, and the
//! transforms are applied to the request's graph, outermost last. The
//! cotangent of a closure is an environment keyed by the values its free
//! variables stand for ([`super::env_key`]): the graphs built here capture
//! the original's free variables where the compile-time transforms of the
//! same closure capture their own nodes (`J(f)`'s `x` for `f`'s `x`), and
//! the keys agree, so the rules of `ad_lift` and `ad_dyn` pass cotangents
//! through at every order.
//!
//! Forward graphs built here take, besides each captured value, its
//! tangents (placeholder free variables, [`Provenance::placeholder`]),
//! one per path of tangent steps through the world's forward levels, so in
//! `F(F(g))` the inner tangent, the outer one and the tangent of the
//! tangent are distinct: zero for a level the closure was lifted into
//! from outside the differentiated code, the tangent the forward code
//! computed for a closure it made. Peeling maps a compile-time
//! transform's captures to the same (free variable, path) pairs, and
//! lifting into a new level shifts the paths to the levels they keep.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use adjoint_runtime::dynamic::{DynOp, Dynamic};
use adjoint_runtime::value::{Closure, CodeId, Record, Value};
use adjoint_runtime::vm::{Code, LocIndex};

use super::{Ad, AdKind, AdRequest, Provenance, Rules};
use crate::ir::analysis::{free_variables, FreeVars};
use crate::ir::{GraphId, Loc, Module, NodeId};
use crate::vmgen;

/// The compiler's run-time differentiation of closures.
pub struct DynAd {
    state: Mutex<State>,
    /// Code objects made at run time, by id minus `base`.
    codes: RwLock<Vec<Arc<Code>>>,
    base: u32,
    /// The location index of the first location of code made here.
    loc_base: u32,
    locs: RwLock<Vec<Loc>>,
    /// Whether the code made here releases values after their last use
    /// ([`crate::options::CompilerOptions::release_early`]).
    release_early: bool,
}

struct State {
    m: Module,
    rules: Rules,
    effectful: HashSet<GraphId>,
    prov: Provenance,
    code_of: HashMap<GraphId, CodeId>,
    graph_of: HashMap<CodeId, GraphId>,
    /// Graphs built here (their free variables are their source's).
    built: HashSet<GraphId>,
    /// The module's graph count when the program started: graphs from
    /// here on were made at run time (they use captured values as they
    /// are: lifted).
    first_run_time: u32,
    lifts: HashMap<(GraphId, u8), GraphId>,
    requests: HashMap<(GraphId, String, String, i64), GraphId>,
    /// The free variables of the module, computed when first needed after
    /// the module last changed (every call of a transformed closure reads
    /// them; only building a transform changes them).
    fv: Option<FreeVars>,
}

impl State {
    /// The transforms, working on this state's module (which they change).
    fn ad(&mut self) -> Ad<'_> {
        self.fv = None;
        Ad::new(&mut self.m, &self.rules, &self.effectful, &mut self.prov)
    }

    /// Makes sure `fv` is up to date.
    fn refresh_fv(&mut self) {
        if self.fv.is_none() {
            self.fv = Some(free_variables(&self.m));
        }
    }
}

impl DynAd {
    /// The hook for a program compiled from module `m` (`code_of` as the
    /// compiler numbered its graphs, `n_codes` code objects, `n_locs`
    /// locations).
    pub fn new(
        m: Module,
        rules: Rules,
        effectful: HashSet<GraphId>,
        prov: Provenance,
        code_of: HashMap<GraphId, CodeId>,
        n_codes: u32,
        n_locs: u32,
        release_early: bool,
    ) -> DynAd {
        let graph_of = code_of.iter().map(|(g, c)| (*c, *g)).collect();
        let first_run_time = m.graph_ids().count() as u32;
        DynAd {
            state: Mutex::new(State {
                m,
                rules,
                effectful,
                prov,
                code_of,
                graph_of,
                built: HashSet::new(),
                first_run_time,
                lifts: HashMap::new(),
                requests: HashMap::new(),
                fv: None,
            }),
            codes: RwLock::new(Vec::new()),
            base: n_codes,
            loc_base: n_locs,
            locs: RwLock::new(Vec::new()),
            release_early,
        }
    }

    /// The source location of location index `i` of code made here.
    pub fn loc(&self, i: LocIndex) -> Loc {
        let Some(k) = i.checked_sub(self.loc_base) else {
            return Loc::NONE;
        };
        let locs = self.locs.read().unwrap_or_else(|e| e.into_inner());
        locs.get(k as usize).copied().unwrap_or(Loc::NONE)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compiles what graph `g` reaches that has no code yet.
    fn compile(&self, st: &mut State, g: GraphId) -> Result<CodeId, String> {
        if let Some(c) = st.code_of.get(&g) {
            return Ok(*c);
        }
        st.refresh_fv();
        let fv = st.fv.as_ref().expect("refreshed");
        let mut codes = self.codes.write().unwrap_or_else(|e| e.into_inner());
        let mut locs = self.locs.write().unwrap_or_else(|e| e.into_inner());
        let next = self.base + codes.len() as u32;
        let before: HashSet<GraphId> = st.code_of.keys().copied().collect();
        let new = vmgen::compile_more(
            &st.m,
            &[g],
            fv,
            &mut st.code_of,
            next,
            &mut locs,
            self.loc_base,
            self.release_early,
        )
        .map_err(|e| format!("internal error: {}", e.message))?;
        for (h, c) in st.code_of.iter() {
            if !before.contains(h) {
                st.graph_of.insert(*c, *h);
            }
        }
        codes.extend(new.into_iter().map(Arc::new));
        Ok(st.code_of[&g])
    }

    /// The graph of a closure.
    fn graph_of(st: &State, c: &Closure) -> Result<GraphId, String> {
        st.graph_of
            .get(&c.code)
            .copied()
            .ok_or_else(|| "internal error: a closure whose graph is unknown".to_string())
    }

    /// `J(g)` (mode 1) or `F(g)` (mode 2) with its free variables used as
    /// they are; `g` has `f_level` forward transforms already (the
    /// tangents of captured values `F` adds are that level's).
    fn transformed(
        &self,
        st: &mut State,
        g: GraphId,
        mode: u8,
        f_level: usize,
    ) -> Result<GraphId, String> {
        if let Some(t) = st.lifts.get(&(g, mode)) {
            return Ok(*t);
        }
        let mut ad = st.ad();
        ad.lift_outside = false;
        ad.f_level = f_level;
        ad.fv = free_variables(ad.m);
        let loc = ad.m.graph(g).loc;
        let t = if mode == 1 {
            ad.j_graph(g, loc)
        } else {
            ad.fwd_graph(g, loc)
        }
        .map_err(|e| e.message)?;
        st.built.insert(t);
        st.lifts.insert((g, mode), t);
        Ok(t)
    }

    /// `g` with the transforms of `world` applied, innermost first.
    fn in_world(&self, st: &mut State, mut g: GraphId, world: &[u8]) -> Result<GraphId, String> {
        for (level, &mode) in world.iter().enumerate() {
            g = self.transformed(st, g, mode, f_level(world, level))?;
        }
        Ok(g)
    }

    /// Takes the transforms of `world` (innermost first) off closure `f`:
    /// the original graph, and for each of its free variables the value
    /// captured for it, as an [`Entry`]: the original's free variable it
    /// stands for, the tangent steps between (a transform built at compile
    /// time captures its own primal and tangent nodes; one built here the
    /// original's free variables and placeholders for their tangents), and
    /// the levels of `world` the value is in (a transform built at compile
    /// time may capture a value as it is and lift it inside: that value
    /// lacks that level).
    fn peel(
        &self,
        st: &mut State,
        f: &Closure,
        world: &[u8],
    ) -> Result<(GraphId, Vec<Entry>), String> {
        st.refresh_fv();
        let fv = st.fv.as_ref().expect("refreshed");
        let mut g = Self::graph_of(st, f)?;
        let all: Vec<usize> = (0..world.len()).collect();
        let mut entries: Vec<Entry> = fv
            .get(g)
            .iter()
            .zip(&f.captures)
            .map(|(u, v)| match st.prov.placeholder_of.get(u) {
                Some((x, path)) => Entry {
                    node: *x,
                    value: v.clone(),
                    levels: all.clone(),
                    path: path.clone(),
                    known: true,
                },
                None => Entry {
                    node: *u,
                    value: v.clone(),
                    levels: all.clone(),
                    path: Vec::new(),
                    known: false,
                },
            })
            .collect();
        for (depth, &mode) in world.iter().enumerate().rev() {
            let Some(&(gm, src)) = st.prov.graphs.get(&g) else {
                return Err(
                    "internal error: a transformed function value of unknown origin".into(),
                );
            };
            if gm != mode {
                return Err("internal error: the nesting of transforms does not match".into());
            }
            if !st.built.contains(&g) {
                let run_time = g.0 >= st.first_run_time;
                for e in entries.iter_mut().filter(|e| !e.known) {
                    if let Some(x) = st.prov.origin.get(&e.node) {
                        e.node = *x;
                    } else if let Some(x) = st.prov.tangent_origin.get(&e.node) {
                        e.node = *x;
                        tangent_step(&mut e.path, f_level(world, depth));
                    } else if run_time {
                        // Used as it is: the capture arrived lifted.
                    } else {
                        // Captured as it was and lifted inside.
                        e.levels.retain(|l| *l != depth);
                    }
                }
            }
            g = src;
        }
        Ok((g, entries))
    }

    /// Value `v`, given in world `from`, in world `to`, which has the
    /// transforms of `from` and more: level `i` of `from` is level
    /// `embed[i]` of `to`.
    fn relift(
        &self,
        st: &mut State,
        v: &Value,
        from: &[u8],
        to: &[u8],
        embed: &[usize],
    ) -> Result<Value, String> {
        if from.len() == to.len() {
            return Ok(v.clone());
        }
        Ok(match v {
            Value::Func(c) => {
                let (g, entries) = self.peel(st, c, from)?;
                let t = self.in_world(st, g, to)?;
                let captures = self.captures(st, t, &entries, from, to, embed)?;
                let code = self.compile(st, t)?;
                Value::Func(Arc::new(Closure { code, captures }))
            }
            Value::Tuple(items) => {
                let mut out = Vec::with_capacity(items.len());
                for x in items.iter() {
                    out.push(self.relift(st, x, from, to, embed)?);
                }
                Value::Tuple(Arc::from(out))
            }
            Value::Record(r) => {
                let mut fields = Vec::with_capacity(r.fields.len());
                for (k, x) in &r.fields {
                    fields.push((k.clone(), self.relift(st, x, from, to, embed)?));
                }
                Value::Record(Arc::new(Record::new(fields)))
            }
            other => other.clone(),
        })
    }

    /// The captures of a closure of graph `t` (whose free variables are
    /// those of an original peeled in world `peeled`, and placeholders for
    /// their tangents), in world `to`; level `i` of `peeled` is level
    /// `embed[i]` of `to`.
    fn captures(
        &self,
        st: &mut State,
        t: GraphId,
        entries: &[Entry],
        peeled: &[u8],
        to: &[u8],
        embed: &[usize],
    ) -> Result<Vec<Value>, String> {
        st.refresh_fv();
        let needed = st.fv.as_ref().expect("refreshed").get(t).to_vec();
        // Forward level `i` of `peeled` is forward level `f_embed[i]` of `to`.
        let f_embed: Vec<usize> = (0..peeled.len())
            .filter(|l| peeled[*l] == 2)
            .map(|l| f_level(to, embed[l]))
            .collect();
        let mut captures = Vec::new();
        for u in needed {
            if let Some((x, path)) = st.prov.placeholder_of.get(&u).cloned() {
                // A tangent of a captured value: zero unless the closure
                // came with it (a level it lacks has none).
                let d = entries
                    .iter()
                    .find(|e| e.node == x && !e.path.is_empty() && e.embedded(&f_embed) == path);
                captures.push(d.map_or(Value::Zero, |e| e.value.clone()));
                continue;
            }
            let Some(e) = entries.iter().find(|e| e.node == u && e.path.is_empty()) else {
                return Err("internal error: a captured value went missing".into());
            };
            let from: Vec<u8> = e.levels.iter().map(|l| peeled[*l]).collect();
            let inner: Vec<usize> = e.levels.iter().map(|l| embed[*l]).collect();
            captures.push(self.relift(st, &e.value, &from, to, &inner)?);
        }
        Ok(captures)
    }

    /// `ad_dyn(f, kind, argnums, wrap)`: the request built on `f`'s
    /// original graph, in `f`'s world.
    fn request(
        &self,
        st: &mut State,
        f: &Closure,
        kind: &str,
        argnums: &str,
        wrap: i64,
    ) -> Result<Value, String> {
        let world = world_of(wrap);
        let (g, entries) = self.peel(st, f, &world)?;
        let key = (g, kind.to_string(), argnums.to_string(), wrap);
        let r = match st.requests.get(&key) {
            Some(r) => *r,
            None => {
                let r = self.build_request(st, g, kind, argnums)?;
                let r = self.in_world(st, r, &world)?;
                st.requests.insert(key, r);
                r
            }
        };
        let same: Vec<usize> = (0..world.len()).collect();
        let captures = self.captures(st, r, &entries, &world, &world, &same)?;
        let code = self.compile(st, r)?;
        Ok(Value::Func(Arc::new(Closure { code, captures })))
    }

    /// The graph of `grad(g)` (or `value_and_grad`, `vjp`, `jvp`), which
    /// differentiates `g`'s closure through `ad_lift`.
    fn build_request(
        &self,
        st: &mut State,
        g: GraphId,
        kind: &str,
        argnums: &str,
    ) -> Result<GraphId, String> {
        let kind = match kind {
            "grad" | "value_and_grad" => {
                let argnums = super::Argnums::decode(argnums)?;
                AdKind::Grad {
                    argnums,
                    with_value: kind == "value_and_grad",
                }
            }
            "vjp" => AdKind::Vjp,
            "jvp" => AdKind::Jvp,
            other => return Err(format!("unknown transform `{other}`")),
        };
        let loc = st.m.graph(g).loc;
        let name = st.m.graph(g).name.clone();
        let target = st.m.add_graph(format!("dyn.{name}"), loc);
        let mut ad = st.ad();
        ad.lift_source = true;
        ad.build(&AdRequest {
            target,
            source: g,
            kind,
            loc,
            name: display(&name),
        })
        .map_err(|e| e.message)?;
        st.built.insert(target);
        Ok(target)
    }
}

/// A captured value of a peeled closure: the free variable of the
/// original it stands for, and the levels of the peeled world the value
/// is in.
struct Entry {
    node: NodeId,
    value: Value,
    levels: Vec<usize>,
    /// The tangent steps from `node`'s value to this one, by forward level
    /// of the peeled world (innermost first, as in
    /// [`Provenance::placeholder`]), ending with a tangent step; empty for
    /// `node`'s value itself.
    path: Vec<bool>,
    /// `node` and `path` are final (the capture is a placeholder).
    known: bool,
}

impl Entry {
    /// `path` in a world where forward level `i` of the peeled one is
    /// `embed[i]`.
    fn embedded(&self, embed: &[usize]) -> Vec<bool> {
        let mut out = Vec::new();
        for (i, t) in self.path.iter().enumerate() {
            if *t {
                tangent_step(&mut out, embed[i]);
            }
        }
        out
    }
}

/// Marks a tangent step at forward level `l` in `path`.
fn tangent_step(path: &mut Vec<bool>, l: usize) {
    if path.len() <= l {
        path.resize(l + 1, false);
    }
    path[l] = true;
}

/// The transforms of nesting code `wrap` (base 3, outermost in the lowest
/// digit), innermost first.
fn world_of(wrap: i64) -> Vec<u8> {
    let mut v = Vec::new();
    let mut w = wrap;
    while w > 0 {
        v.push((w % 3) as u8);
        w /= 3;
    }
    v.reverse();
    v
}

/// The number of forward transforms below level `level` of `world`
/// (innermost first): the forward level of a tangent taken there.
fn f_level(world: &[u8], level: usize) -> usize {
    world[..level].iter().filter(|m| **m == 2).count()
}

/// A graph's name as messages show it.
fn display(name: &str) -> String {
    name.to_string()
}

impl vmgen::RuntimeLocs for DynAd {
    fn loc(&self, i: LocIndex) -> Loc {
        DynAd::loc(self, i)
    }
}

impl Dynamic for DynAd {
    fn code(&self, id: CodeId) -> Option<Arc<Code>> {
        let k = id.0.checked_sub(self.base)?;
        let codes = self.codes.read().unwrap_or_else(|e| e.into_inner());
        codes.get(k as usize).cloned()
    }

    fn transform(&self, f: &Value, op: &DynOp) -> Result<Value, String> {
        let mut st = self.lock();
        match op {
            DynOp::Lift { mode, wrap } => {
                let from = world_of(*wrap);
                let mut to = vec![*mode];
                to.extend_from_slice(&from);
                // The new transform is the innermost.
                let embed: Vec<usize> = (1..to.len()).collect();
                self.relift(&mut st, f, &from, &to, &embed)
            }
            DynOp::Request {
                kind,
                argnums,
                wrap,
            } => {
                let Value::Func(c) = f else {
                    return Err(format!("{kind} needs a function, got {}", f.kind()));
                };
                self.request(&mut st, c, kind, argnums, *wrap)
            }
        }
    }
}
