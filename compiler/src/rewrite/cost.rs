//! The cost model of extraction: bytes of memory traffic, with
//! arithmetic counted at a small fraction of a byte.
//!
//! - Leaves, literals and lists cost nothing: they exist anyway.
//! - A map is computed inside the kernel of its consumer (fusion groups
//!   chains of maps), so it moves no bytes of its own; it costs a quarter
//!   of a byte per element for the arithmetic. `zeros_like` / `ones_like`
//!   are constants in a kernel: free.
//! - `broadcast` and `reshape` are views a kernel reads through strides:
//!   free.
//! - A `transpose` is a copy: its bytes read and written.
//! - A reduction writes its result and does an add per element read.
//! - A matrix product reads its operands, writes its result and does
//!   `2mnk` flops, counted at 1/8 byte each (GEMM runs near its
//!   arithmetic peak, well above the memory bandwidth).
//!
//! Costs add up over the tree of an expression (egg's extraction), so a
//! value used twice counts twice; extraction only chooses between equal
//! values, which all pay for the same shared operands.

use egg::{CostFunction, Id, Language};

use super::lang::{bytes, elements, Meta, MetaGraph};

pub struct Traffic<'a> {
    pub egraph: &'a MetaGraph,
}

impl Traffic<'_> {
    fn ty_of(&self, id: Id) -> Option<&crate::infer::AbsTensor> {
        self.egraph[id].data.ty.as_ref()
    }
}

/// Arithmetic per element, in bytes.
const OP: f64 = 0.25;
/// One flop of a matrix product, in bytes.
const FLOP: f64 = 0.125;

impl CostFunction<Meta> for Traffic<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &Meta, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let children: f64 = enode.children().iter().map(|c| costs(*c)).sum();
        let out = self
            .egraph
            .lookup(enode.clone())
            .and_then(|id| self.ty_of(id));
        let (out_elems, out_bytes) = out.map_or((1.0, 8.0), |t| (elements(t), bytes(t)));
        let own = match enode {
            Meta::Leaf(_) | Meta::Lit(_) | Meta::Dims(_) => 0.0,
            Meta::ZerosLike(_) | Meta::OnesLike(_) => 0.0,
            Meta::Broadcast(_) | Meta::Reshape(_) => 0.0,
            Meta::Map(..) => OP * out_elems,
            Meta::Transpose(_) => 2.0 * out_bytes,
            Meta::Sum([x, _]) | Meta::SumKeep([x, _]) | Meta::SumTo([x, _]) => {
                out_bytes + OP * self.ty_of(*x).map_or(1.0, elements)
            }
            Meta::Matmul([a, b]) => {
                let (ta, tb) = (self.ty_of(*a), self.ty_of(*b));
                let k = ta.and_then(|t| t.shape.last().copied()).unwrap_or(1) as f64;
                let operands = ta.map_or(8.0, bytes) + tb.map_or(8.0, bytes);
                2.0 * out_elems * k * FLOP + operands + out_bytes
            }
        };
        // A small charge per node prefers the smaller of equal-cost forms.
        own + children + 1e-3
    }
}
