//! Matrix products whose operand is a transpose (`mT`, `transpose`,
//! `transpose_grad`) in the same graph: one native kernel reads the
//! untransposed tensor in place (`gemm` with swapped strides) instead of
//! materialising the copy. Reverse mode makes these everywhere: the
//! derivative of `a @ b` is `d @ mT(b)` and `mT(a) @ d`.
//!
//! This needs no types: the kernel decides at run time from the actual
//! shapes, and falls back to the reference kernels (the transpose, then
//! `matmul`) for anything but a swap of the last two axes, so results and
//! errors are those of eager mode.

use std::io::Write;

use adjoint_runtime::error::RtError;
use adjoint_runtime::kernels::{self, args::opt_ints, linalg, Ctx};
use adjoint_runtime::shape;
use adjoint_runtime::tensor::Tensor;
use adjoint_runtime::value::Value;
use adjoint_runtime::vm::NativeKernel;

use crate::ir::{GraphId, Module, NodeId};
use crate::prim::Prim;

/// How the kernel gets one operand of the product from its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The input itself.
    Plain,
    /// `mT(input)`.
    MatrixT,
    /// `transpose(input, perm)`; the permutation is the next input.
    Transpose,
    /// `transpose_grad(input, perm)`; the permutation is the next input.
    TransposeGrad,
}

impl View {
    /// The view a transposing node `t` gives of its first operand, if it
    /// is one.
    pub fn of(m: &Module, t: NodeId) -> Option<View> {
        let ins = m.inputs(t);
        match m.applied_prim(t)? {
            Prim::MatrixT if ins.len() == 2 => Some(View::MatrixT),
            Prim::Transpose if ins.len() == 3 => Some(View::Transpose),
            Prim::TransposeGrad if ins.len() == 3 => Some(View::TransposeGrad),
            _ => None,
        }
    }

    /// How many kernel inputs the operand takes.
    pub fn arity(self) -> usize {
        match self {
            View::Plain | View::MatrixT => 1,
            View::Transpose | View::TransposeGrad => 2,
        }
    }

    fn kernel_name(self) -> &'static str {
        match self {
            View::Plain => "",
            View::MatrixT => "mT",
            View::Transpose => "transpose",
            View::TransposeGrad => "transpose_grad",
        }
    }

    fn describe(self, x: &str) -> String {
        match self {
            View::Plain => x.to_string(),
            v => format!("{}({x})", v.kernel_name()),
        }
    }
}

/// How a product in graph `g` of operands `ins` reads them: each one's
/// view (a transpose made in `g` is read in place), the kernel inputs
/// (the transposes' operands instead of the transposes) and the
/// transposes it recomputes.
pub fn operands(m: &Module, g: GraphId, ins: &[NodeId]) -> (View, View, Vec<NodeId>, Vec<NodeId>) {
    let view = |x: NodeId| -> View {
        if m.node(x).graph != Some(g) {
            return View::Plain;
        }
        View::of(m, x).unwrap_or(View::Plain)
    };
    let (va, vb) = (view(ins[0]), view(ins[1]));
    let mut inputs = Vec::new();
    let mut recomputed = Vec::new();
    for (x, v) in [(ins[0], va), (ins[1], vb)] {
        if v == View::Plain {
            inputs.push(x);
        } else {
            inputs.extend_from_slice(&m.inputs(x)[1..]);
            recomputed.push(x);
        }
    }
    (va, vb, inputs, recomputed)
}

/// `matmul(view_a(..), view_b(..))` as one native call.
pub struct MatmulKernel {
    a: View,
    b: View,
    name: String,
}

impl MatmulKernel {
    pub fn new(a: View, b: View) -> MatmulKernel {
        MatmulKernel {
            a,
            b,
            name: format!("matmul[{}, {}]", a.describe("a"), b.describe("b")),
        }
    }

    /// The inputs the kernel takes.
    pub fn arity(&self) -> usize {
        self.a.arity() + self.b.arity()
    }

    /// The operand as a tensor and whether the product reads it with its
    /// last two axes swapped; `None` when only the reference kernels can
    /// tell (not a tensor, a bad permutation, another permutation).
    pub(crate) fn operand(view: View, args: &[Value]) -> Option<(Tensor, bool)> {
        let Value::Tensor(x) = &args[0] else {
            return None;
        };
        let perm = match view {
            View::Plain => return Some((x.clone(), false)),
            View::MatrixT => shape::matrix_t_perm(x.ty()).ok()?,
            View::Transpose | View::TransposeGrad => {
                let p = opt_ints("transpose", &args[1], "perm").ok()?;
                if view == View::Transpose {
                    shape::transpose_perm(x.ty(), p.as_deref()).ok()?
                } else {
                    shape::transpose_grad_perm(x.ty(), p.as_deref()).ok()?
                }
            }
        };
        let n = perm.len();
        let identity_but_last_two = perm[..n.saturating_sub(2)]
            .iter()
            .enumerate()
            .all(|(i, &p)| i == p);
        match perm[n.saturating_sub(2)..] {
            [a, b] if identity_but_last_two && a == n - 1 && b == n - 2 => Some((x.clone(), true)),
            _ if perm.iter().enumerate().all(|(i, &p)| i == p) => Some((x.clone(), false)),
            _ => None,
        }
    }

    /// What eager mode does: the transposes' kernels, then `matmul`'s.
    fn reference(&self, args: &[Value]) -> Result<Value, RtError> {
        let mut ctx = NoCtx(std::io::sink());
        let mut run = |view: View, args: &[Value]| -> Result<Value, RtError> {
            if view == View::Plain {
                return Ok(args[0].clone());
            }
            let k = kernels::lookup(view.kernel_name())
                .ok_or_else(|| RtError::internal("no transpose kernel"))?;
            k(&mut ctx, args)
        };
        let na = self.a.arity();
        let a = run(self.a, &args[..na])?;
        let b = run(self.b, &args[na..])?;
        let mm = kernels::lookup("matmul").ok_or_else(|| RtError::internal("no matmul kernel"))?;
        mm(&mut ctx, &[a, b])
    }
}

impl NativeKernel for MatmulKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, args: Vec<Value>) -> Result<Value, RtError> {
        let args = &args[..];
        super::check_arity(&self.name, self.arity(), args.len())?;
        let na = self.a.arity();
        match (
            Self::operand(self.a, &args[..na]),
            Self::operand(self.b, &args[na..]),
        ) {
            // Shape and dtype errors are those of `matmul` of the
            // transposed operands.
            (Some((a, ta)), Some((b, tb))) => {
                linalg::matmul_transposed(&a, ta, &b, tb).map(Value::Tensor)
            }
            _ => self.reference(args),
        }
    }
}

/// The context of the reference kernels the fallback runs: none of them
/// calls functions or prints.
struct NoCtx(std::io::Sink);

impl Ctx for NoCtx {
    fn call(&mut self, _: &Value, _: &[Value]) -> Result<Value, RtError> {
        Err(RtError::internal("a matrix product called a function"))
    }
    fn stdout(&mut self) -> &mut dyn Write {
        &mut self.0
    }
}
