//! Differentiation of function values at run time.
//!
//! The compiler differentiates every function it can name at compile time.
//! A function that is only a *value* (a parameter, an element of a tuple,
//! the result of a call) reaches `grad`, `vjp` or `jvp` as a closure: the
//! two primitives `ad_lift` and `ad_dyn` hand it to a [`Dynamic`] hook that
//! the compiler installs in the [`Program`](crate::vm::Program). The hook
//! transforms the closure's graph, compiles the new graphs into code objects
//! numbered after the program's own, and returns the transformed closure.
//! This crate only defines the interface; `adjoint-compiler` implements it.

use std::fmt;
use std::sync::Arc;

use crate::value::{CodeId, Value};
use crate::vm::Code;

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

/// The compiler's side of run-time differentiation.
pub trait Dynamic: Send + Sync {
    /// A code object made by [`Dynamic::transform`] (ids past the
    /// program's own).
    fn code(&self, id: CodeId) -> Option<Arc<Code>>;
    /// Transforms function value `f`.
    fn transform(&self, f: &Value, op: &DynOp) -> Result<Value, String>;
}

/// The hook as a program holds it.
#[derive(Clone)]
pub struct DynamicHook(pub Arc<dyn Dynamic>);

impl fmt::Debug for DynamicHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DynamicHook")
    }
}
