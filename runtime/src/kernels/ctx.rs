//! What a kernel may ask of the machine that runs it ([`Ctx`]), the
//! signature of every kernel ([`Kernel`]), and the transforms of function
//! values a kernel may ask for ([`DynOp`]; see [`crate::dynamic`]). The
//! kernels, the tape and the VM build on it.

use std::io::Write;

use crate::error::RtError;
use crate::value::Value;

/// What a kernel may ask of the machine that runs it.
pub trait Ctx {
    /// Calls a function value (for `tree_map`).
    fn call(&mut self, f: &Value, args: &[Value]) -> Result<Value, RtError>;
    /// Where `print` writes.
    fn stdout(&mut self) -> &mut dyn Write;
    /// The processes the collectives run between (one, unless the host
    /// gave the VM another world).
    fn comm(&self) -> &dyn crate::comm::Communicator {
        &crate::comm::Single
    }
    /// Differentiates a function value (`ad_lift`, `ad_dyn`): only a
    /// program the compiler gave a [`crate::dynamic::Dynamic`] hook can.
    fn transform(&mut self, _f: &Value, _op: &DynOp) -> Result<Value, RtError> {
        Err(RtError::new(
            "differentiation of function values needs the compiler at run time",
        ))
    }
}

/// The signature of every kernel.
pub type Kernel = fn(&mut dyn Ctx, &[Value]) -> Result<Value, RtError>;

/// A kernel that may take its arguments' values out of `args` (the VM's
/// own copies, read from slots): when an argument was the last use of its
/// slot, the kernel then holds the only reference and may reuse its buffer.
pub type InplaceKernel = fn(&mut dyn Ctx, &mut [Value]) -> Result<Value, RtError>;

/// A transform of a function value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DynOp {
    /// The representation of a value inside differentiated code: closures
    /// (also inside tuples and records) become their `J` transform
    /// (reverse mode, `mode` 1) or their `F` transform (forward mode,
    /// `mode` 2); other values are unchanged. With `wrap` (as for
    /// `Request`), the value given and the result are inside those
    /// transforms.
    Lift { mode: u8, wrap: i64 },
    /// `grad`, `value_and_grad`, `vjp` or `jvp` of the closure (`kind`),
    /// with the `argnums` of `grad` ("" for the first argument alone, else
    /// comma-separated indices). `wrap` lists the transforms the closure
    /// and the result sit inside, one base-3 digit each, innermost first
    /// (1 = J, 2 = F): `ad_dyn` inside code that is itself differentiated.
    Request {
        kind: String,
        argnums: String,
        wrap: i64,
    },
}
