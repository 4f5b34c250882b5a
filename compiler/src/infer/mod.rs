//! Type and shape inference by abstract interpretation.
//!
//! Inference runs the program on abstract values ([`AbsVal`]: dtypes,
//! static shapes, weak flags, and the values of small int constants)
//! starting from an entry graph and the abstract values of its arguments.
//! Every graph is *specialised* per abstract signature (its arguments and
//! the values it captured): the result is a side table, [`Types`], with the
//! value of every node in every specialisation and the specialisations each
//! call reaches.
//!
//! - [`domain`]: the abstract values, their join and their display.
//! - [`rules`]: the type-and-shape rule of every primitive, one exhaustive
//!   `match` over [`crate::prim::Prim`], built on the runtime's dtype and
//!   shape rules (one definition shared with the kernels).
//! - [`eval`]: the interpreter: specialisation, `switch`, recursion to a
//!   fixpoint, widening of constants that vary.
//! - [`provenance`]: which IR expressions are fixed by the program text
//!   (their errors are compile-time errors) rather than by specialisation.
//!
//! ```text
//! infer_module(&module, main, &[AbsVal::tensor(F32, &[3, 4])])?.type_of(node)
//! ```

pub mod domain;
pub mod eval;
pub mod provenance;
pub mod rules;

use crate::ir::Loc;

pub use domain::{join, parse_types, AbsTensor, AbsVal, Closure};
pub use eval::{infer_module, infer_module_with, InferOptions, LoadTypeFn, Spec, SpecId, Types};

/// A type error: where, what, and related places (for instance the two
/// branches of an `if` whose types differ).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InferError {
    /// The location of the IR node whose operation failed.
    pub loc: Loc,
    /// A lowercase message naming the operation and the types.
    pub message: String,
    /// Related locations, each with a note.
    pub secondary: Vec<(Loc, String)>,
}

impl InferError {
    /// An error at `loc` with no related locations.
    pub fn new(loc: Loc, message: impl Into<String>) -> InferError {
        InferError {
            loc,
            message: message.into(),
            secondary: Vec::new(),
        }
    }
}
