//! Reverse mode on scalar programs: a loop's gradient as two native
//! loops and a typed tape.
//!
//! [`reverse`] turns a [`ScalarProgram`] `P` into two programs:
//!
//! - **forward** computes what `P` computes and records, at the end of
//!   every function activation, the values its reverse needs (its
//!   parameters, the results of its calls and of its transcendental
//!   operations), then the activation's tag (the function's index). Before
//!   each non-tail call it pushes a mark, so the callee's chain of tail
//!   calls can find where it began.
//! - **backward** takes the cotangents of `P`'s float results and returns
//!   those of its float parameters, popping the tape: for each activation,
//!   newest first, it recomputes the cheap values of the function from the
//!   record, runs the function's instructions in reverse with the rules of
//!   the primitive table (`crate::rule`, from which `stdlib/bprop.adj`'s
//!   element-wise rules are generated too), then dispatches on the next tag
//!   to the function that tail-called this one, or returns at a mark.
//!
//! The reverse of a function depends on how the activation ended (which
//! callee it tail-called, or that it returned), because that fixes the
//! types of the cotangents it receives; each pair gets its own function.
//! All reverse functions of one chain of tail calls return the cotangents
//! of the chain's entry, so the dispatches are native tail calls too: a
//! loop of 10^6 iterations is reversed in constant stack, with 8 bytes of
//! tape per recorded value and no other allocation.
//!
//! Integer and bool values have no cotangents. Programs whose chains
//! would need two different cotangent types, or that use an operation
//! without a scalar rule (`trigamma`), are refused.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::prim::Prim;
use crate::rule::{self, Rule, RuleExpr};

/// The tag pushed before a non-tail call (function tags are indices).
const MARK: i64 = -1;

/// The two programs [`reverse`] makes.
#[derive(Clone, Debug)]
pub struct Reversed {
    /// `P` with its tape records: same parameters and results.
    pub forward: ScalarProgram,
    /// From the cotangents of `P`'s float results, in order, to those of
    /// its float parameters, in order.
    pub backward: ScalarProgram,
}

/// The float types of `tys`, in order: what cotangents exist for.
fn floats(tys: &[SType]) -> Vec<SType> {
    tys.iter().copied().filter(|t| t.is_float()).collect()
}

fn zero_of(t: SType) -> Scalar {
    match t {
        SType::F32 => Scalar::F32(0.0),
        _ => Scalar::F64(0.0),
    }
}

fn float_const(t: SType, x: f64) -> Scalar {
    match t {
        SType::F32 => Scalar::F32(x as f32),
        _ => Scalar::F64(x),
    }
}

/// Whether the reverse reads the result of `op` from the record instead
/// of recomputing it: calls (their chains are not run again) and the
/// operations that call the runtime.
fn saved(op: &SOp) -> bool {
    match op {
        // The backward program reads no buffers.
        SOp::Call(_) | SOp::CallIf(..) | SOp::Load { .. } => true,
        SOp::Unary(u, _) => !matches!(
            u,
            SUnary::Neg
                | SUnary::Abs
                | SUnary::Sign
                | SUnary::Relu
                | SUnary::Floor
                | SUnary::Ceil
                | SUnary::Sqrt
                | SUnary::Not
        ),
        SOp::Binary(b, ..) => matches!(b, SBinary::Pow | SBinary::Rem),
        _ => false,
    }
}

/// The cotangents of the operands `args` of the element-wise primitive
/// `p` (with result `out`) for the result's cotangent `d`, of float type
/// `t`, from the rules of `p`'s row of the primitive table
/// ([`crate::rule`]); `None` for an operand whose cotangent is zero.
fn table_rule(
    fb: &mut Fb,
    p: Prim,
    args: &[SVal],
    out: SVal,
    d: SVal,
    t: SType,
) -> Result<Vec<Option<SVal>>, String> {
    let Some(rules) = rule::rules_of(p) else {
        return Err(format!("{p} has no derivative rule"));
    };
    let env = RuleEnv { args, out, d };
    rules
        .iter()
        .map(|r| match r {
            Rule::Zero | Rule::None => Ok(None),
            Rule::Expr(e) => emit_rule(fb, e, &env, t).map(Some),
        })
        .collect()
}

/// The values a rule's names stand for.
struct RuleEnv<'a> {
    args: &'a [SVal],
    out: SVal,
    d: SVal,
}

/// Scalar operations computing rule expression `e` in `env`.
fn emit_rule(fb: &mut Fb, e: &RuleExpr, env: &RuleEnv, t: SType) -> Result<SVal, String> {
    Ok(match e {
        RuleExpr::Num(v) => fb.konst(float_const(t, *v)),
        RuleExpr::Int(v) => fb.konst(float_const(t, *v as f64)),
        RuleExpr::Param(i) => env.args[*i],
        RuleExpr::Out => env.out,
        RuleExpr::D => env.d,
        RuleExpr::Tangent(_) => return Err("a tangent in a table rule".into()),
        RuleExpr::Neg(a) => {
            let a = emit_rule(fb, a, env, t)?;
            fb.one(SOp::Unary(SUnary::Neg, a), t)
        }
        RuleExpr::Arith(op, a, b) => {
            let a = emit_rule(fb, a, env, t)?;
            let b = emit_rule(fb, b, env, t)?;
            let op = match op {
                '+' => SBinary::Add,
                '-' => SBinary::Sub,
                '*' => SBinary::Mul,
                _ => SBinary::Div,
            };
            fb.one(SOp::Binary(op, a, b), t)
        }
        RuleExpr::Pow(a, b) => {
            let a = emit_rule(fb, a, env, t)?;
            let b = emit_rule(fb, b, env, t)?;
            fb.one(SOp::Binary(SBinary::Pow, a, b), t)
        }
        RuleExpr::Cmp(op, a, b) => {
            let a = emit_rule(fb, a, env, t)?;
            let b = emit_rule(fb, b, env, t)?;
            let op = match *op {
                ">" => SBinary::Gt,
                "<" => SBinary::Lt,
                ">=" => SBinary::Ge,
                "<=" => SBinary::Le,
                "==" => SBinary::Eq,
                _ => SBinary::Ne,
            };
            fb.one(SOp::Binary(op, a, b), SType::Bool)
        }
        RuleExpr::Call(name, args) => match (name.as_str(), &args[..]) {
            ("where", [c, a, b]) => {
                let c = emit_rule(fb, c, env, t)?;
                let a = emit_rule(fb, a, env, t)?;
                let b = emit_rule(fb, b, env, t)?;
                fb.one(SOp::Select(c, a, b), t)
            }
            ("zeros_like", [_]) => fb.konst(zero_of(t)),
            ("ones_like", [_]) => fb.konst(float_const(t, 1.0)),
            (f, [a]) => {
                let op = Prim::from_name(f)
                    .and_then(SUnary::of_prim)
                    .ok_or_else(|| format!("{f} has no scalar operation"))?;
                let a = emit_rule(fb, a, env, t)?;
                fb.one(SOp::Unary(op, a), t)
            }
            _ => return Err(format!("{name} has no scalar operation")),
        },
    })
}

/// The functions a function tail-calls.
fn tail_callees(t: &STerm) -> Vec<u32> {
    match t {
        STerm::Return(_) => Vec::new(),
        STerm::TailCall(c) => vec![c.func.0],
        STerm::TailCallIf(_, a, b) => vec![a.func.0, b.func.0],
    }
}

/// A function under construction.
struct Fb {
    params: Vec<SType>,
    body: Vec<SInst>,
    next: u32,
    /// The type of every value so far.
    tys: Vec<SType>,
}

impl Fb {
    fn new(params: Vec<SType>) -> Fb {
        let next = params.len() as u32;
        Fb {
            tys: params.clone(),
            params,
            body: Vec::new(),
            next,
        }
    }

    fn push(&mut self, op: SOp, results: Vec<SType>) -> Vec<SVal> {
        self.push_at(op, results, None)
    }

    /// [`Fb::push`] of an instruction copied from one at `site`.
    fn push_at(&mut self, op: SOp, results: Vec<SType>, site: Option<u32>) -> Vec<SVal> {
        let vs = (0..results.len() as u32)
            .map(|k| SVal(self.next + k))
            .collect();
        self.next += results.len() as u32;
        self.tys.extend_from_slice(&results);
        self.body.push(SInst { op, results, site });
        vs
    }

    fn one(&mut self, op: SOp, t: SType) -> SVal {
        self.push(op, vec![t])[0]
    }

    fn konst(&mut self, c: Scalar) -> SVal {
        self.one(SOp::Const(c), c.ty())
    }

    fn finish(self, name: String, results: Vec<SType>, term: STerm) -> SFunc {
        SFunc {
            name,
            params: self.params,
            results,
            body: self.body,
            term,
        }
    }
}

/// How an activation ended, which fixes the cotangents its reverse gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Exit {
    Return,
    TailCall(u32),
}

/// A function of the backward program.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// The reverse of function `k` for activations that ended so.
    Rev(u32, Exit),
    /// The dispatch that ends each reverse of `k` (a list only, never a
    /// function of its own): the next tag sends the cotangents to the
    /// function that tail-called `k`, or a mark returns them.
    Pred(u32),
    /// At a call of `g`: pops the tag of the activation of `g`'s chain
    /// that returned and goes to its reverse.
    Ret(u32),
    /// Candidate `i` onwards of a dispatch (`Pred` or `Ret` list), with
    /// the tag as last parameter.
    Sel(Box<Key>, usize),
    /// Returns its parameters.
    Id(Vec<SType>),
}

/// Where a dispatch goes for one tag.
#[derive(Clone, Debug)]
enum Target {
    Mark,
    Func(Key),
}

struct Rev<'a> {
    p: &'a ScalarProgram,
    /// The cotangent types of each function's chain entry (None: never
    /// runs).
    ce: Vec<Option<Vec<SType>>>,
    preds: Vec<Vec<u32>>,
    entry: Vec<bool>,
    /// Per function, the record: parameters, then saved results.
    record: Vec<Vec<SVal>>,
    keys: HashMap<Key, u32>,
    work: Vec<Key>,
    funcs: Vec<Option<SFunc>>,
}

/// Reverse mode for `p`; an error names what is not supported.
pub fn reverse(p: &ScalarProgram) -> Result<Reversed, String> {
    p.validate()?;
    if p.uses_tape() {
        return Err("the program already uses the tape".into());
    }
    let n = p.funcs.len();
    // Chain entries: the program's entry and every callee of a non-tail
    // call. Their cotangent types spread along tail calls.
    let mut entry = vec![false; n];
    entry[0] = true;
    for f in &p.funcs {
        for inst in &f.body {
            match &inst.op {
                SOp::Call(c) => entry[c.func.0 as usize] = true,
                SOp::CallIf(_, a, b) => {
                    entry[a.func.0 as usize] = true;
                    entry[b.func.0 as usize] = true;
                }
                _ => {}
            }
        }
    }
    let mut ce: Vec<Option<Vec<SType>>> = vec![None; n];
    for e in (0..n).filter(|e| entry[*e]) {
        let want = floats(&p.funcs[e].params);
        let mut stack = vec![e];
        while let Some(k) = stack.pop() {
            match &ce[k] {
                Some(have) if *have == want => continue,
                Some(_) => {
                    return Err(format!(
                        "{}: reached from chains with different cotangent types",
                        p.funcs[k].name
                    ))
                }
                None => {}
            }
            ce[k] = Some(want.clone());
            stack.extend(
                tail_callees(&p.funcs[k].term)
                    .into_iter()
                    .map(|c| c as usize),
            );
        }
    }
    let mut preds = vec![Vec::new(); n];
    for (j, f) in p.funcs.iter().enumerate() {
        for c in tail_callees(&f.term) {
            if !preds[c as usize].contains(&(j as u32)) {
                preds[c as usize].push(j as u32);
            }
        }
    }
    let record = p
        .funcs
        .iter()
        .map(|f| {
            let mut rec: Vec<SVal> = (0..f.params.len() as u32).map(SVal).collect();
            let mut next = f.params.len() as u32;
            for inst in &f.body {
                if saved(&inst.op) {
                    rec.extend((0..inst.results.len() as u32).map(|k| SVal(next + k)));
                }
                next += inst.results.len() as u32;
            }
            rec
        })
        .collect();
    let mut r = Rev {
        p,
        ce,
        preds,
        entry,
        record,
        keys: HashMap::new(),
        work: Vec::new(),
        funcs: Vec::new(),
    };
    let mut forward = r.forward();
    r.backward()?;
    let mut revs: HashMap<u32, Vec<usize>> = HashMap::new();
    for (key, i) in &r.keys {
        if let Key::Rev(k, _) = key {
            revs.entry(*k).or_default().push(*i as usize);
        }
    }
    let mut backward = ScalarProgram {
        funcs: r
            .funcs
            .into_iter()
            .map(|f| f.expect("every function of the backward program is built"))
            .collect(),
        // Loaded values are read back from the record.
        buffers: Vec::new(),
    };
    for f in &mut backward.funcs {
        dce(f);
    }
    for (k, fs) in revs {
        prune_record(&mut forward.funcs[k as usize + 1], &mut backward, &fs);
    }
    forward.validate()?;
    backward.validate()?;
    Ok(Reversed { forward, backward })
}

/// `op` with its values renamed by `map` and its callees shifted by
/// `shift`.
fn remap(op: &SOp, map: &[SVal], shift: u32) -> SOp {
    let mut op = op.clone();
    op.rename(&|v| map[v.0 as usize]);
    match &mut op {
        SOp::Call(c) => c.func.0 += shift,
        SOp::CallIf(_, a, b) => {
            a.func.0 += shift;
            b.func.0 += shift;
        }
        _ => {}
    }
    op
}

impl Rev<'_> {
    /// The forward program: a function that pushes the first mark and
    /// calls `P`'s entry, then `P`'s functions with their records.
    fn forward(&self) -> ScalarProgram {
        let p = self.p;
        let e = p.entry();
        let mut fb = Fb::new(e.params.clone());
        let m = fb.konst(Scalar::I64(MARK));
        fb.push(SOp::Push(vec![m]), Vec::new());
        let args = (0..e.params.len() as u32).map(SVal).collect();
        let rs = fb.push(
            SOp::Call(SCall {
                func: FuncIdx(1),
                args,
            }),
            e.results.clone(),
        );
        let mut funcs = vec![fb.finish(
            format!("{} (recording)", e.name),
            e.results.clone(),
            STerm::Return(rs),
        )];
        for (k, f) in p.funcs.iter().enumerate() {
            let mut fb = Fb::new(f.params.clone());
            let mut map: Vec<SVal> = (0..f.params.len() as u32).map(SVal).collect();
            for inst in &f.body {
                if matches!(inst.op, SOp::Call(_) | SOp::CallIf(..)) {
                    let m = fb.konst(Scalar::I64(MARK));
                    fb.push(SOp::Push(vec![m]), Vec::new());
                }
                let rs = fb.push_at(remap(&inst.op, &map, 1), inst.results.clone(), inst.site);
                map.extend(rs);
            }
            let mut rec: Vec<SVal> = self.record[k].iter().map(|v| map[v.0 as usize]).collect();
            rec.push(fb.konst(Scalar::I64(k as i64)));
            fb.push(SOp::Push(rec), Vec::new());
            let mut term = f.term.clone();
            term.rename(&|v| map[v.0 as usize]);
            match &mut term {
                STerm::Return(_) => {}
                STerm::TailCall(c) => c.func.0 += 1,
                STerm::TailCallIf(_, a, b) => {
                    a.func.0 += 1;
                    b.func.0 += 1;
                }
            }
            funcs.push(fb.finish(f.name.clone(), f.results.clone(), term));
        }
        ScalarProgram {
            funcs,
            buffers: p.buffers.clone(),
        }
    }

    /// The index of backward function `key`, queued for building.
    fn idx(&mut self, key: Key) -> FuncIdx {
        if let Some(&i) = self.keys.get(&key) {
            return FuncIdx(i);
        }
        let i = self.funcs.len() as u32;
        self.funcs.push(None);
        self.keys.insert(key.clone(), i);
        self.work.push(key);
        FuncIdx(i)
    }

    fn ce(&self, k: u32) -> Result<Vec<SType>, String> {
        self.ce[k as usize]
            .clone()
            .ok_or_else(|| format!("{} never runs", self.p.funcs[k as usize].name))
    }

    /// The cotangent types an activation of `k` that ended with `exit`
    /// receives.
    fn exit_types(&self, k: u32, exit: Exit) -> Vec<SType> {
        match exit {
            Exit::Return => floats(&self.p.funcs[k as usize].results),
            Exit::TailCall(c) => floats(&self.p.funcs[c as usize].params),
        }
    }

    /// The candidates of a dispatch list (`Pred` or `Ret`).
    fn candidates(&self, list: &Key) -> Vec<(i64, Target)> {
        match list {
            Key::Pred(k) => {
                let mut out = Vec::new();
                if self.entry[*k as usize] {
                    out.push((MARK, Target::Mark));
                }
                for &j in &self.preds[*k as usize] {
                    out.push((j as i64, Target::Func(Key::Rev(j, Exit::TailCall(*k)))));
                }
                out
            }
            Key::Ret(g) => {
                // The functions of g's chain that return.
                let mut seen = HashSet::from([*g]);
                let mut stack = vec![*g];
                let mut out = Vec::new();
                while let Some(j) = stack.pop() {
                    let f = &self.p.funcs[j as usize];
                    if matches!(f.term, STerm::Return(_)) {
                        out.push((j as i64, Target::Func(Key::Rev(j, Exit::Return))));
                    }
                    for c in tail_callees(&f.term) {
                        if seen.insert(c) {
                            stack.push(c);
                        }
                    }
                }
                out.sort_by_key(|(t, _)| *t);
                out
            }
            _ => unreachable!("only Pred and Ret are dispatch lists"),
        }
    }

    /// Parameters and results of a dispatch list's functions.
    fn list_types(&self, list: &Key) -> Result<(Vec<SType>, Vec<SType>), String> {
        Ok(match list {
            Key::Pred(k) => (floats(&self.p.funcs[*k as usize].params), self.ce(*k)?),
            Key::Ret(g) => (floats(&self.p.funcs[*g as usize].results), self.ce(*g)?),
            _ => unreachable!("only Pred and Ret are dispatch lists"),
        })
    }

    fn backward(&mut self) -> Result<(), String> {
        // Index 0 is the entry.
        self.funcs.push(None);
        let e = self.p.entry();
        let seeds = floats(&e.results);
        let mut fb = Fb::new(seeds.clone());
        let args = (0..seeds.len() as u32).map(SVal).collect();
        let ret = self.idx(Key::Ret(0));
        let rs = fb.push(SOp::Call(SCall { func: ret, args }), self.ce(0)?);
        self.funcs[0] = Some(fb.finish(
            format!("{} (reverse)", e.name),
            self.ce(0)?,
            STerm::Return(rs),
        ));
        while let Some(key) = self.work.pop() {
            let f = self.build(&key)?;
            let i = self.keys[&key] as usize;
            self.funcs[i] = Some(f);
        }
        Ok(())
    }

    fn build(&mut self, key: &Key) -> Result<SFunc, String> {
        match key {
            Key::Id(tys) => {
                let fb = Fb::new(tys.clone());
                let vs = (0..tys.len() as u32).map(SVal).collect();
                Ok(fb.finish("return".into(), tys.clone(), STerm::Return(vs)))
            }
            Key::Ret(_) => {
                let (params, results) = self.list_types(key)?;
                let mut fb = Fb::new(params.clone());
                let cot: Vec<SVal> = (0..params.len() as u32).map(SVal).collect();
                let term = self.dispatch(&mut fb, key, cot, &results)?;
                Ok(fb.finish(self.dispatch_name(key), results, term))
            }
            Key::Pred(_) => unreachable!("each reverse dispatches to its predecessors itself"),
            Key::Sel(list, i) => {
                let (mut params, results) = self.list_types(list)?;
                let ncot = params.len() as u32;
                params.push(SType::I64);
                let mut fb = Fb::new(params);
                let cot: Vec<SVal> = (0..ncot).map(SVal).collect();
                let term = self.test_tags(&mut fb, list, *i, cot, SVal(ncot), &results);
                Ok(fb.finish(format!("{} #{i}", self.dispatch_name(list)), results, term))
            }
            Key::Rev(k, exit) => self.rev(*k, *exit),
        }
    }

    /// Pops a tag and ends by going where dispatch list `list` sends it
    /// with the cotangents `cot`.
    fn dispatch(
        &mut self,
        fb: &mut Fb,
        list: &Key,
        cot: Vec<SVal>,
        results: &[SType],
    ) -> Result<STerm, String> {
        let t = fb.push(SOp::Pop, vec![SType::I64])[0];
        if self.candidates(list).is_empty() {
            return Err(format!(
                "{}: no activation can end here",
                self.dispatch_name(list)
            ));
        }
        Ok(self.test_tags(fb, list, 0, cot, t, results))
    }

    /// The end that sends tag `t` to candidate `from` or a later one of
    /// dispatch list `list`: the last is not tested, two are tested here,
    /// more go on through `Sel` functions (one test each).
    fn test_tags(
        &mut self,
        fb: &mut Fb,
        list: &Key,
        from: usize,
        cot: Vec<SVal>,
        t: SVal,
        results: &[SType],
    ) -> STerm {
        let cands = self.candidates(list);
        let rest = &cands[from..];
        if let [(_, Target::Mark)] = rest {
            return STerm::Return(cot);
        }
        let target = |this: &mut Self, tg: &Target| SCall {
            func: match tg {
                Target::Mark => this.idx(Key::Id(results.to_vec())),
                Target::Func(k) => this.idx(k.clone()),
            },
            args: cot.clone(),
        };
        if let [(_, only)] = rest {
            return STerm::TailCall(target(self, only));
        }
        let tag = fb.konst(Scalar::I64(rest[0].0));
        let hit = fb.one(SOp::Binary(SBinary::Eq, t, tag), SType::Bool);
        let yes = target(self, &rest[0].1);
        let no = if rest.len() == 2 {
            target(self, &rest[1].1)
        } else {
            let mut args = cot.clone();
            args.push(t);
            SCall {
                func: self.idx(Key::Sel(Box::new(list.clone()), from + 1)),
                args,
            }
        };
        STerm::TailCallIf(hit, yes, no)
    }

    fn dispatch_name(&self, list: &Key) -> String {
        match list {
            Key::Pred(k) => format!("before {}", self.p.funcs[*k as usize].name),
            Key::Ret(g) => format!("returns of {}", self.p.funcs[*g as usize].name),
            _ => "dispatch".into(),
        }
    }

    /// The reverse of function `k` for activations that ended with `exit`:
    /// the activation's values again ([`Rev::replay`]), the cotangents
    /// received seeded onto what it passed on ([`Rev::seed_exit`]), its
    /// instructions in reverse ([`Rev::rev_call`], [`rev_op`]), then the
    /// dispatch to the activation before it.
    fn rev(&mut self, k: u32, exit: Exit) -> Result<SFunc, String> {
        let p = self.p;
        let f = &p.funcs[k as usize];
        let dtys = self.exit_types(k, exit);
        let mut fb = Fb::new(dtys.clone());
        let tys = f.value_types();
        let map = self.replay(&mut fb, k, &tys);
        let mut adj: HashMap<u32, SVal> = HashMap::new();
        let d: Vec<SVal> = (0..dtys.len() as u32).map(SVal).collect();
        self.seed_exit(&mut fb, &mut adj, f, exit, &map, &tys, &d)?;
        let mut starts = Vec::with_capacity(f.body.len());
        let mut next = f.params.len() as u32;
        for inst in &f.body {
            starts.push(next);
            next += inst.results.len() as u32;
        }
        for (inst, &r0) in f.body.iter().zip(&starts).rev() {
            if let SOp::Call(_) | SOp::CallIf(..) = &inst.op {
                self.rev_call(&mut fb, &mut adj, f, inst, r0, &map, &tys)?;
                continue;
            }
            let r = SVal(r0);
            let Some(&dr) = adj.get(&r.0) else {
                continue;
            };
            if tys[r.0 as usize].is_float() {
                rev_op(&mut fb, &mut adj, &inst.op, r, dr, &map, &tys)
                    .map_err(|e| format!("{}: {e}", f.name))?;
            }
        }
        let mut cot = Vec::new();
        for (i, t) in f.params.iter().enumerate() {
            if t.is_float() {
                cot.push(match adj.get(&(i as u32)) {
                    Some(x) => *x,
                    None => fb.konst(zero_of(*t)),
                });
            }
        }
        let name = match exit {
            Exit::Return => format!("{} (reverse)", f.name),
            Exit::TailCall(c) => format!("{} (reverse, from {})", f.name, p.funcs[c as usize].name),
        };
        let results = self.ce(k)?;
        let term = self.dispatch(&mut fb, &Key::Pred(k), cot, &results)?;
        Ok(fb.finish(name, results, term))
    }

    /// The values of an activation of function `k` in the reverse
    /// function being built: the record popped from the tape (the
    /// parameters and the saved results), the cheap values recomputed.
    /// Returns the map from `k`'s values to `fb`'s.
    fn replay(&self, fb: &mut Fb, k: u32, tys: &[SType]) -> Vec<SVal> {
        let f = &self.p.funcs[k as usize];
        let rec_tys: Vec<SType> = self.record[k as usize]
            .iter()
            .map(|v| tys[v.0 as usize])
            .collect();
        let rec = if rec_tys.is_empty() {
            Vec::new()
        } else {
            fb.push(SOp::Pop, rec_tys)
        };
        let mut map: Vec<SVal> = rec[..f.params.len()].to_vec();
        let mut from_rec = f.params.len();
        for inst in &f.body {
            if saved(&inst.op) {
                let w = inst.results.len();
                map.extend_from_slice(&rec[from_rec..from_rec + w]);
                from_rec += w;
            } else {
                let rs = fb.push_at(remap(&inst.op, &map, 0), inst.results.clone(), inst.site);
                map.extend(rs);
            }
        }
        map
    }

    /// Adds the cotangents `d` the reverse function receives to the
    /// values the activation passed on where it ended (`exit`): its
    /// results, or the arguments of its tail call.
    #[allow(clippy::too_many_arguments)]
    fn seed_exit(
        &self,
        fb: &mut Fb,
        adj: &mut HashMap<u32, SVal>,
        f: &SFunc,
        exit: Exit,
        map: &[SVal],
        tys: &[SType],
        d: &[SVal],
    ) -> Result<(), String> {
        let floats = |args: &[SVal]| -> Vec<SVal> { float_args(args, tys) };
        match (&f.term, exit) {
            (STerm::Return(vs), Exit::Return) => {
                for (v, dv) in floats(vs).into_iter().zip(d) {
                    acc(fb, adj, v, *dv);
                }
            }
            (STerm::TailCall(c), Exit::TailCall(_)) => {
                for (v, dv) in floats(&c.args).into_iter().zip(d) {
                    acc(fb, adj, v, *dv);
                }
            }
            (STerm::TailCallIf(cond, a, b), Exit::TailCall(callee)) => {
                let both = a.func.0 == callee && b.func.0 == callee;
                let c = map[cond.0 as usize];
                for (branch, first) in [(a, true), (b, false)] {
                    if branch.func.0 != callee {
                        continue;
                    }
                    for (v, dv) in floats(&branch.args).into_iter().zip(d) {
                        let dv = if both {
                            guard(fb, c, *dv, first, tys[v.0 as usize])
                        } else {
                            *dv
                        };
                        acc(fb, adj, v, dv);
                    }
                }
            }
            _ => return Err(format!("{}: no such exit {exit:?}", f.name)),
        }
        Ok(())
    }

    /// The reverse of a call instruction `inst` (results from `r0`): the
    /// callee's chain is reversed whatever the cotangents, since its
    /// records must come off the tape.
    #[allow(clippy::too_many_arguments)]
    fn rev_call(
        &mut self,
        fb: &mut Fb,
        adj: &mut HashMap<u32, SVal>,
        f: &SFunc,
        inst: &SInst,
        r0: u32,
        map: &[SVal],
        tys: &[SType],
    ) -> Result<(), String> {
        let dres: Vec<SVal> = (0..inst.results.len() as u32)
            .filter(|i| inst.results[*i as usize].is_float())
            .map(|i| {
                let v = SVal(r0 + i);
                match adj.get(&v.0) {
                    Some(x) => *x,
                    None => fb.konst(zero_of(tys[v.0 as usize])),
                }
            })
            .collect();
        match &inst.op {
            SOp::Call(c) => {
                let ce = self.ce(c.func.0)?;
                let func = self.idx(Key::Ret(c.func.0));
                let cot = fb.push(SOp::Call(SCall { func, args: dres }), ce);
                for (v, dv) in float_args(&c.args, tys).into_iter().zip(cot) {
                    acc(fb, adj, v, dv);
                }
            }
            SOp::CallIf(cond, a, b) => {
                let ce = self.ce(a.func.0)?;
                if self.ce(b.func.0)? != ce {
                    return Err(format!(
                        "{}: the two callees of a call have different cotangents",
                        f.name
                    ));
                }
                let fa = self.idx(Key::Ret(a.func.0));
                let fbi = self.idx(Key::Ret(b.func.0));
                let c = map[cond.0 as usize];
                let calls = (
                    SCall {
                        func: fa,
                        args: dres.clone(),
                    },
                    SCall {
                        func: fbi,
                        args: dres,
                    },
                );
                let cot = fb.push(SOp::CallIf(c, calls.0, calls.1), ce);
                for (branch, first) in [(a, true), (b, false)] {
                    for (v, dv) in float_args(&branch.args, tys).into_iter().zip(&cot) {
                        let g = guard(fb, c, *dv, first, tys[v.0 as usize]);
                        acc(fb, adj, v, g);
                    }
                }
            }
            _ => unreachable!("rev_call of a non-call"),
        }
        Ok(())
    }
}

/// The float values among `args` (those with cotangents).
fn float_args(args: &[SVal], tys: &[SType]) -> Vec<SVal> {
    args.iter()
        .copied()
        .filter(|a| tys[a.0 as usize].is_float())
        .collect()
}

/// The reverse of an operation without calls, `op`, whose (float) result
/// `r` has cotangent `dr`: its operands' cotangents, from the rules of
/// the primitive table.
fn rev_op(
    fb: &mut Fb,
    adj: &mut HashMap<u32, SVal>,
    op: &SOp,
    r: SVal,
    dr: SVal,
    map: &[SVal],
    tys: &[SType],
) -> Result<(), String> {
    let t = tys[r.0 as usize];
    let m = |x: &SVal| map[x.0 as usize];
    let y = m(&r);
    let (prim, operands): (Prim, Vec<SVal>) = match op {
        SOp::Unary(u, x) => (u.prim(), vec![*x]),
        SOp::Binary(b, x, z) => (b.prim(), vec![*x, *z]),
        SOp::Select(c, x, z) => (Prim::Where, vec![*c, *x, *z]),
        SOp::Cast(x) => {
            let from = tys[x.0 as usize];
            if from.is_float() {
                let dx = if from == t {
                    dr
                } else {
                    fb.one(SOp::Cast(dr), from)
                };
                acc(fb, adj, *x, dx);
            }
            return Ok(());
        }
        // A buffer is a constant of the loop: regions only make one of a
        // value whose cotangent is not asked for.
        SOp::Const(_)
        | SOp::Bound { .. }
        | SOp::Load { .. }
        | SOp::Call(_)
        | SOp::CallIf(..)
        | SOp::Push(_)
        | SOp::Pop => return Ok(()),
    };
    let args: Vec<SVal> = operands.iter().map(m).collect();
    let ds = table_rule(fb, prim, &args, y, dr, t)?;
    for (v, dv) in operands.into_iter().zip(ds) {
        if let Some(dv) = dv {
            acc(fb, adj, v, dv);
        }
    }
    Ok(())
}

/// Removes the instructions without effects whose results nothing reads.
fn dce(f: &mut SFunc) {
    let np = f.params.len() as u32;
    let mut starts = Vec::with_capacity(f.body.len());
    let mut next = np;
    for inst in &f.body {
        starts.push(next);
        next += inst.results.len() as u32;
    }
    let mut live = vec![false; next as usize];
    f.term.each_val(&mut |v| live[v.0 as usize] = true);
    let mut keep = vec![false; f.body.len()];
    for (i, inst) in f.body.iter().enumerate().rev() {
        let effect = matches!(
            inst.op,
            SOp::Call(_) | SOp::CallIf(..) | SOp::Push(_) | SOp::Pop
        );
        let r0 = starts[i] as usize;
        if effect || (r0..r0 + inst.results.len()).any(|v| live[v]) {
            keep[i] = true;
            inst.op.each_val(&mut |v| live[v.0 as usize] = true);
        }
    }
    if keep.iter().all(|k| *k) {
        return;
    }
    // New numbers: parameters, then the kept instructions' results.
    let mut new = vec![u32::MAX; next as usize];
    for v in 0..np {
        new[v as usize] = v;
    }
    let mut n = np;
    for (i, inst) in f.body.iter().enumerate() {
        if keep[i] {
            for k in 0..inst.results.len() {
                new[starts[i] as usize + k] = n;
                n += 1;
            }
        }
    }
    let rename = |v: SVal| SVal(new[v.0 as usize]);
    let body = std::mem::take(&mut f.body);
    for (mut inst, k) in body.into_iter().zip(keep) {
        if k {
            inst.op.rename(&rename);
            f.body.push(inst);
        }
    }
    f.term.rename(&rename);
}

/// Drops from a function's record the values none of its reverses
/// (backward functions `revs`, whose first instruction pops the record)
/// reads; `fwd` is the recording function, whose last instruction pushes
/// the record and the tag.
fn prune_record(fwd: &mut SFunc, bwd: &mut ScalarProgram, revs: &[usize]) {
    let Some(SInst {
        op: SOp::Push(rec), ..
    }) = fwd.body.last()
    else {
        return;
    };
    let width = rec.len() - 1;
    if width == 0 {
        return;
    }
    let mut used = vec![false; width];
    for &i in revs {
        let f = &bwd.funcs[i];
        let nd = f.params.len() as u32;
        let mut mark = |v: SVal| {
            if v.0 >= nd && v.0 < nd + width as u32 {
                used[(v.0 - nd) as usize] = true;
            }
        };
        for inst in &f.body[1..] {
            inst.op.each_val(&mut mark);
        }
        f.term.each_val(&mut mark);
    }
    if used.iter().all(|u| *u) {
        return;
    }
    let kept = used.iter().filter(|u| **u).count() as u32;
    let rank: Vec<u32> = used
        .iter()
        .scan(0u32, |r, u| {
            let here = *r;
            *r += *u as u32;
            Some(here)
        })
        .collect();
    for &i in revs {
        let f = &mut bwd.funcs[i];
        let nd = f.params.len() as u32;
        let w = width as u32;
        let rename = |v: SVal| {
            if v.0 < nd {
                v
            } else if v.0 < nd + w {
                SVal(nd + rank[(v.0 - nd) as usize])
            } else {
                SVal(v.0 - (w - kept))
            }
        };
        let tys: Vec<SType> = f.body[0]
            .results
            .iter()
            .zip(&used)
            .filter(|(_, u)| **u)
            .map(|(t, _)| *t)
            .collect();
        if tys.is_empty() {
            f.body.remove(0);
        } else {
            f.body[0].results = tys;
        }
        for inst in &mut f.body {
            inst.op.rename(&rename);
        }
        f.term.rename(&rename);
    }
    if let Some(SInst {
        op: SOp::Push(rec), ..
    }) = fwd.body.last_mut()
    {
        let tag = rec[width];
        let mut kept_vals: Vec<SVal> = rec[..width]
            .iter()
            .zip(&used)
            .filter(|(_, u)| **u)
            .map(|(v, _)| *v)
            .collect();
        kept_vals.push(tag);
        *rec = kept_vals;
    }
}

/// `d` where `c` is `first` (else zero).
fn guard(fb: &mut Fb, c: SVal, d: SVal, first: bool, t: SType) -> SVal {
    let z = fb.konst(zero_of(t));
    let (a, b) = if first { (d, z) } else { (z, d) };
    fb.one(SOp::Select(c, a, b), t)
}

/// Adds `d` to the cotangent of primal value `v`.
fn acc(fb: &mut Fb, adj: &mut HashMap<u32, SVal>, v: SVal, d: SVal) {
    let t = fb.tys[d.0 as usize];
    let sum = match adj.get(&v.0) {
        Some(prev) => fb.one(SOp::Binary(SBinary::Add, *prev, d), t),
        None => d,
    };
    adj.insert(v.0, sum);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalar::native::compile_scalar;
    use crate::scalar::tests::{iterate, random_program, same};
    use proptest::prelude::*;

    /// Forward then backward, natively and in the interpreter: the
    /// results, the cotangents, and whether both agree bit for bit (tapes
    /// included) and the tape ends empty.
    fn run_both(p: &ScalarProgram, args: &[Scalar], seed: &[Scalar]) -> (Vec<Scalar>, Vec<Scalar>) {
        let r = reverse(p).unwrap();
        let (fw, bw) = (
            compile_scalar(&r.forward).unwrap(),
            compile_scalar(&r.backward).unwrap(),
        );
        let mut tape = Vec::new();
        let y = fw.call_with_tape(args, &mut tape, u64::MAX).unwrap();
        let mut itape = Vec::new();
        let iy = r.forward.eval_with_tape(args, &mut itape, 1 << 24).unwrap();
        assert!(same(&y, &iy), "forward: native {y:?}, interpreted {iy:?}");
        assert_eq!(tape, itape, "tapes");
        let d = bw.call_with_tape(seed, &mut tape, u64::MAX).unwrap();
        let id = r
            .backward
            .eval_with_tape(seed, &mut itape, 1 << 24)
            .unwrap();
        assert!(same(&d, &id), "backward: native {d:?}, interpreted {id:?}");
        assert!(
            tape.is_empty() && itape.is_empty(),
            "the backward pass pops the whole tape"
        );
        (y, d)
    }

    fn f64s(v: &[Scalar]) -> Vec<f64> {
        v.iter()
            .map(|s| match s {
                Scalar::F64(x) => *x,
                Scalar::F32(x) => *x as f64,
                _ => panic!("not a float"),
            })
            .collect()
    }

    #[test]
    fn the_gradient_of_a_loop_is_the_chain_rule_over_its_iterations() {
        let p = iterate();
        for n in [0i64, 1, 5, 1000] {
            let args = [Scalar::I64(0), Scalar::F64(0.3), Scalar::I64(n)];
            let (y, d) = run_both(&p, &args, &[Scalar::F64(1.0)]);
            // By hand: x <- sin(x) x + 0.5, dx'/dx = cos(x) x + sin(x).
            let (mut x, mut g) = (0.3f64, 1.0f64);
            for _ in 0..n {
                g *= x.cos() * x + x.sin();
                x = x.sin() * x + 0.5;
            }
            assert_eq!(y[0], Scalar::F64(x));
            let got = f64s(&d)[0];
            assert!(
                (got - g).abs() <= 1e-12 * g.abs().max(1.0),
                "n = {n}: {got} vs {g}"
            );
        }
    }

    #[test]
    fn a_million_iterations_reverse_in_constant_stack() {
        let r = reverse(&iterate()).unwrap();
        let (fw, bw) = (
            compile_scalar(&r.forward).unwrap(),
            compile_scalar(&r.backward).unwrap(),
        );
        let mut tape = Vec::new();
        fw.call_with_tape(
            &[Scalar::I64(0), Scalar::F64(0.3), Scalar::I64(1_000_000)],
            &mut tape,
            u64::MAX,
        )
        .unwrap();
        // Per iteration at most the header's record (3 values and a tag)
        // and the body's (3 values, sin and a tag), before the slots no
        // reverse reads are dropped.
        assert!(tape.len() <= 9 * 1_000_000 + 16, "{} slots", tape.len());
        let d = bw
            .call_with_tape(&[Scalar::F64(1.0)], &mut tape, u64::MAX)
            .unwrap();
        assert!(tape.is_empty());
        assert!(f64s(&d)[0].is_finite());
    }

    /// Nested loops and an `if` as calls: `outer(x, w)` runs `inner` 3
    /// times, `inner` scales by `w` 4 times, then `pick` takes `sqrt` or
    /// `exp` of the result depending on its sign.
    fn nested() -> ScalarProgram {
        use SType::*;
        let inst = |op, t| SInst::new(op, vec![t]);
        let call = |f, args: &[u32]| SCall {
            func: FuncIdx(f),
            args: args.iter().map(|a| SVal(*a)).collect(),
        };
        // f0 outer(i, x, w): if i < 3 { x' = inner(0, x, w); x'' = pick(x'); outer(i+1, x'', w) } else x
        let outer = SFunc {
            name: "outer".into(),
            params: vec![I64, F64, F64],
            results: vec![F64],
            body: vec![
                inst(SOp::Const(Scalar::I64(3)), I64),                  // 3
                inst(SOp::Binary(SBinary::Lt, SVal(0), SVal(3)), Bool), // 4
            ],
            term: STerm::TailCallIf(SVal(4), call(1, &[0, 1, 2]), call(4, &[0, 1, 2])),
        };
        let outer_body = SFunc {
            name: "outer.body".into(),
            params: vec![I64, F64, F64],
            results: vec![F64],
            body: vec![
                inst(SOp::Const(Scalar::I64(0)), I64),                  // 3
                SInst::new(SOp::Call(call(2, &[3, 1, 2])), vec![F64]),  // 4
                inst(SOp::Const(Scalar::F64(0.0)), F64),                // 5
                inst(SOp::Binary(SBinary::Gt, SVal(4), SVal(5)), Bool), // 6
                SInst::new(
                    SOp::CallIf(SVal(6), call(5, &[4, 2]), call(6, &[4, 2])),
                    vec![F64],
                ), // 7
                inst(SOp::Const(Scalar::I64(1)), I64),                  // 8
                inst(SOp::Binary(SBinary::Add, SVal(0), SVal(8)), I64), // 9
            ],
            term: STerm::TailCall(call(0, &[9, 7, 2])),
        };
        // f2 inner(j, x, w): if j < 4 { inner(j+1, x * w + 0.1, w) } else x
        let inner = SFunc {
            name: "inner".into(),
            params: vec![I64, F64, F64],
            results: vec![F64],
            body: vec![
                inst(SOp::Const(Scalar::I64(4)), I64),                  // 3
                inst(SOp::Binary(SBinary::Lt, SVal(0), SVal(3)), Bool), // 4
                inst(SOp::Binary(SBinary::Mul, SVal(1), SVal(2)), F64), // 5
                inst(SOp::Const(Scalar::F64(0.1)), F64),                // 6
                inst(SOp::Binary(SBinary::Add, SVal(5), SVal(6)), F64), // 7
                inst(SOp::Const(Scalar::I64(1)), I64),                  // 8
                inst(SOp::Binary(SBinary::Add, SVal(0), SVal(8)), I64), // 9
            ],
            term: STerm::TailCallIf(SVal(4), call(2, &[9, 7, 2]), call(3, &[1])),
        };
        let inner_done = SFunc {
            name: "inner.done".into(),
            params: vec![F64],
            results: vec![F64],
            body: vec![],
            term: STerm::Return(vec![SVal(0)]),
        };
        let outer_done = SFunc {
            name: "outer.done".into(),
            params: vec![I64, F64, F64],
            results: vec![F64],
            body: vec![],
            term: STerm::Return(vec![SVal(1)]),
        };
        // pick_pos(x, w) = sqrt(x) * w; pick_neg(x, w) = exp(x) - w
        let pos = SFunc {
            name: "pick.pos".into(),
            params: vec![F64, F64],
            results: vec![F64],
            body: vec![
                inst(SOp::Unary(SUnary::Sqrt, SVal(0)), F64),
                inst(SOp::Binary(SBinary::Mul, SVal(2), SVal(1)), F64),
            ],
            term: STerm::Return(vec![SVal(3)]),
        };
        let neg = SFunc {
            name: "pick.neg".into(),
            params: vec![F64, F64],
            results: vec![F64],
            body: vec![
                inst(SOp::Unary(SUnary::Exp, SVal(0)), F64),
                inst(SOp::Binary(SBinary::Sub, SVal(2), SVal(1)), F64),
            ],
            term: STerm::Return(vec![SVal(3)]),
        };
        ScalarProgram {
            funcs: vec![outer, outer_body, inner, inner_done, outer_done, pos, neg],
            buffers: Vec::new(),
        }
    }

    #[test]
    fn nested_loops_and_ifs_match_finite_differences() {
        let p = nested();
        p.validate().unwrap();
        let f = |x: f64, w: f64| {
            f64s(
                &p.eval(&[Scalar::I64(0), Scalar::F64(x), Scalar::F64(w)], 1 << 20)
                    .unwrap(),
            )[0]
        };
        for (x, w) in [(0.7, 0.9), (-0.4, 1.1), (2.0, -0.3)] {
            let (y, d) = run_both(
                &p,
                &[Scalar::I64(0), Scalar::F64(x), Scalar::F64(w)],
                &[Scalar::F64(1.0)],
            );
            assert_eq!(f64s(&y)[0], f(x, w));
            let d = f64s(&d);
            let h = 1e-6;
            let fdx = (f(x + h, w) - f(x - h, w)) / (2.0 * h);
            let fdw = (f(x, w + h) - f(x, w - h)) / (2.0 * h);
            for (got, want) in [(d[0], fdx), (d[1], fdw)] {
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "at ({x}, {w}): {got} vs {want}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Random loops over all four types: the recording run and the
        /// reverse run agree natively and in the interpreter, and the
        /// tape ends empty.
        #[test]
        fn random_loops_reverse_alike_natively_and_interpreted(
            ops in prop::collection::vec((0u8..5, 0u8..4, 0u8..255), 1..24),
            trips in 1i64..6,
            x in -3.0f64..3.0,
        ) {
            let p = random_program(&ops, trips);
            prop_assume!(reverse(&p).is_ok());
            let args = [
                Scalar::F64(x), Scalar::F32(x as f32 * 0.5), Scalar::I64(3),
                Scalar::Bool(x > 0.0), Scalar::I64(0),
            ];
            // Runs that divide an integer by zero or raise one to a
            // negative power stop (the scalar tests check that natively
            // too); the others must reverse alike.
            prop_assume!(p.eval(&args, 1 << 24).is_some());
            run_both(&p, &args, &[Scalar::F64(1.0), Scalar::F32(0.5)]);
        }
    }
}
