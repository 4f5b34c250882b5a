//! The error of inference (its own module so that the rules and the
//! interpreter, below [`crate::infer`], can make it).

use crate::ir::Loc;

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
