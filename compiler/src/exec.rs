//! Turns graph IR into the runtime's executable form ([`Program`]).
//!
//! Each reachable graph becomes one code object. Its slots are its
//! parameters, then its free variables (the closure's captures), then one
//! slot per application in dependency order. A graph constant whose graph
//! has free variables becomes a `MakeClosure` instruction; an application in
//! output position that calls a function becomes a tail call, so loops run
//! in constant stack.

use std::collections::HashMap;
use std::sync::Arc;

use adjoint_runtime::kernels;
use adjoint_runtime::tensor::Tensor;
use adjoint_runtime::value::{Closure, CodeId, Value};
use adjoint_runtime::vm::{Code, Instr, LocIndex, Operand, Program};

use crate::ir::analysis::{free_variables, graph_body_with, reachable_graphs, FreeVars};
use crate::ir::{Const, GraphId, Loc, Module, NodeId, NodeKind};
use crate::prim::Prim;

/// A program and the tables that relate it back to the IR.
pub struct Executable {
    pub program: Program,
    pub code_of: HashMap<GraphId, CodeId>,
    /// Source location of every `LocIndex` used by instructions.
    pub locs: Vec<Loc>,
}

impl Executable {
    pub fn loc(&self, i: LocIndex) -> Loc {
        self.locs.get(i as usize).copied().unwrap_or(Loc::NONE)
    }
    /// The function value of a graph without free variables.
    pub fn function(&self, g: GraphId) -> Option<Value> {
        self.code_of.get(&g).map(|c| {
            Value::Func(Arc::new(Closure {
                code: *c,
                captures: Vec::new(),
            }))
        })
    }
}

/// An internal inconsistency found while compiling (never user input: the
/// verifier and inference run before).
#[derive(Debug, Clone)]
pub struct ExecError {
    pub message: String,
    pub loc: Loc,
}

/// The run-time value of a non-graph, non-primitive constant.
pub fn const_value(c: &Const) -> Option<Value> {
    Some(match c {
        Const::Int(i) => Value::Tensor(Tensor::weak_i64(*i)),
        Const::Float(f) => Value::Tensor(Tensor::weak_f64(*f)),
        Const::Bool(b) => Value::Tensor(Tensor::scalar_bool(*b)),
        Const::Str(s) => Value::Str(s.clone()),
        Const::Unit => Value::unit(),
        Const::DType(d) => Value::DType(*d),
        Const::Tensor(t) => Value::Tensor(t.clone()),
        Const::Prim(_) | Const::Graph(_) => return None,
    })
}

pub fn compile(m: &Module, roots: &[GraphId]) -> Result<Executable, ExecError> {
    let graphs = reachable_graphs(m, roots);
    let fv = free_variables(m);
    let code_of: HashMap<GraphId, CodeId> = graphs
        .iter()
        .enumerate()
        .map(|(i, g)| (*g, CodeId(i as u32)))
        .collect();
    let mut ex = Executable {
        program: Program::default(),
        code_of,
        locs: Vec::new(),
    };
    for &g in &graphs {
        let code = compile_graph(m, g, &fv, &mut ex)?;
        ex.program.codes.push(code);
    }
    Ok(ex)
}

struct CodeBuilder<'a> {
    m: &'a Module,
    g: GraphId,
    fv: &'a FreeVars,
    slot_of: HashMap<NodeId, u32>,
    n_slots: u32,
    consts: Vec<Value>,
    instrs: Vec<Instr>,
}

impl CodeBuilder<'_> {
    fn constant(&mut self, v: Value) -> Operand {
        self.consts.push(v);
        Operand::Const(self.consts.len() as u32 - 1)
    }

    fn operand(&mut self, n: NodeId, ex: &Executable) -> Result<Operand, ExecError> {
        if let Some(s) = self.slot_of.get(&n) {
            return Ok(Operand::Slot(*s));
        }
        let node = self.m.node(n);
        match &node.kind {
            NodeKind::Const(Const::Graph(h)) => {
                let code = *ex.code_of.get(h).ok_or_else(|| ExecError {
                    message: format!("graph {h} is not compiled"),
                    loc: node.loc,
                })?;
                let fvs = self.fv.get(*h);
                if fvs.is_empty() {
                    return Ok(self.constant(Value::Func(Arc::new(Closure {
                        code,
                        captures: Vec::new(),
                    }))));
                }
                let mut captures = Vec::with_capacity(fvs.len());
                for &v in fvs {
                    captures.push(self.operand(v, ex)?);
                }
                let dst = self.n_slots;
                self.n_slots += 1;
                self.instrs.push(Instr::MakeClosure {
                    dst,
                    code,
                    captures,
                });
                Ok(Operand::Slot(dst))
            }
            NodeKind::Const(Const::Prim(p)) => Err(ExecError {
                message: format!("primitive `{p}` used as a value"),
                loc: node.loc,
            }),
            NodeKind::Const(c) => {
                let v = const_value(c).expect("plain constant");
                Ok(self.constant(v))
            }
            _ => Err(ExecError {
                message: format!("node {n} is used by graph {} before it is computed", self.g),
                loc: node.loc,
            }),
        }
    }
}

fn compile_graph(
    m: &Module,
    g: GraphId,
    fv: &FreeVars,
    ex: &mut Executable,
) -> Result<Code, ExecError> {
    let graph = m.graph(g);
    let mut b = CodeBuilder {
        m,
        g,
        fv,
        slot_of: HashMap::new(),
        n_slots: 0,
        consts: Vec::new(),
        instrs: Vec::new(),
    };
    for &p in &graph.params {
        b.slot_of.insert(p, b.n_slots);
        b.n_slots += 1;
    }
    let captures = fv.get(g);
    for &c in captures {
        b.slot_of.insert(c, b.n_slots);
        b.n_slots += 1;
    }
    let output = graph.output.ok_or_else(|| ExecError {
        message: format!("graph @{} has no output", graph.name),
        loc: graph.loc,
    })?;
    let body = graph_body_with(m, g, fv);
    let mut tail = false;
    for &n in &body {
        let node = m.node(n);
        let inputs = m.inputs(n);
        let loc = ex.locs.len() as LocIndex;
        ex.locs.push(node.loc);
        let dst = b.n_slots;
        b.n_slots += 1;
        let instr = match m.as_const(inputs[0]) {
            Some(Const::Prim(Prim::Switch)) => {
                if inputs.len() != 4 {
                    return Err(ExecError {
                        message: "switch takes three arguments".into(),
                        loc: node.loc,
                    });
                }
                let cond = b.operand(inputs[1], ex)?;
                let a = b.operand(inputs[2], ex)?;
                let bb = b.operand(inputs[3], ex)?;
                Instr::Switch {
                    dst,
                    cond,
                    a,
                    b: bb,
                    loc,
                }
            }
            Some(Const::Prim(p)) => {
                let kernel = kernels::lookup(p.name()).ok_or_else(|| ExecError {
                    message: format!("primitive `{p}` has no reference kernel"),
                    loc: node.loc,
                })?;
                let mut args = Vec::with_capacity(inputs.len() - 1);
                for &i in &inputs[1..] {
                    args.push(b.operand(i, ex)?);
                }
                Instr::Prim {
                    dst,
                    name: p.name(),
                    kernel,
                    args,
                    loc,
                }
            }
            _ => {
                let callee = b.operand(inputs[0], ex)?;
                let mut args = Vec::with_capacity(inputs.len() - 1);
                for &i in &inputs[1..] {
                    args.push(b.operand(i, ex)?);
                }
                if n == output {
                    tail = true;
                    Instr::TailCall { callee, args, loc }
                } else {
                    Instr::Call {
                        dst,
                        callee,
                        args,
                        loc,
                    }
                }
            }
        };
        b.instrs.push(instr);
        b.slot_of.insert(n, dst);
    }
    let ret = if tail {
        Operand::Slot(0)
    } else {
        b.operand(output, ex)?
    };
    Ok(Code {
        name: graph.name.clone(),
        n_params: graph.params.len() as u32,
        n_captures: captures.len() as u32,
        n_slots: b.n_slots,
        consts: b.consts,
        instrs: b.instrs,
        ret,
    })
}
