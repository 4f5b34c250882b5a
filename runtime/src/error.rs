//! The run-time error type shared by tensors, shape rules and kernels.

/// A run-time failure: a lowercase message that names the operation and the
/// operand types (`add: shapes f32[3] and f32[4] cannot be broadcast`).
///
/// The VM adds the source location of the operation that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RtError {
    /// The message, lowercase, without a location.
    pub message: String,
    /// Where inside compiled code the failure happened, when the code
    /// knows better than its call site (a division in a native loop): a
    /// site the instruction that ran the code maps to a source location
    /// ([`crate::vm::Instr::Native`]). `None` for the call site itself.
    pub site: Option<u32>,
}

impl RtError {
    /// An error with the given message.
    pub fn new(message: impl Into<String>) -> RtError {
        RtError {
            message: message.into(),
            site: None,
        }
    }

    /// This error, raised at `site` of the code that ran.
    pub fn at_site(mut self, site: Option<u32>) -> RtError {
        self.site = site;
        self
    }

    /// An error that signals a broken invariant inside the runtime rather
    /// than a mistake in the user's program.
    pub fn internal(what: impl std::fmt::Display) -> RtError {
        RtError::new(format!("internal error: {what}"))
    }
}

impl From<String> for RtError {
    fn from(message: String) -> RtError {
        RtError::new(message)
    }
}

impl From<&str> for RtError {
    fn from(message: &str) -> RtError {
        RtError::new(message)
    }
}

/// Shorthand for results of run-time operations.
pub type RtResult<T> = Result<T, RtError>;
