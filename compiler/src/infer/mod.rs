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
//! - [`error`]: [`InferError`], what inference reports.
//! - [`provenance`]: which IR expressions are fixed by the program text
//!   (their errors are compile-time errors) rather than by specialisation.
//!
//! ```text
//! infer_module(&module, main, &[AbsVal::tensor(F32, &[3, 4])])?.type_of(node)
//! ```

pub mod domain;
pub mod error;
pub mod eval;
pub mod provenance;
pub mod rules;

pub use domain::{join, parse_types, AbsTensor, AbsVal, Closure};
pub use error::InferError;
pub use eval::{
    infer_module, infer_module_partial, infer_module_with, InferOptions, LoadTypeFn, Spec, SpecId,
    Types,
};
