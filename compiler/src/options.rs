//! How the compiler works, as a value passed down from whoever drives it.
//!
//! The switches turn optimisations off (to measure what they save, and as
//! the random-program tester's oracles: a program must compute the same
//! values with each off) and set limits. The command line builds a
//! [`CompilerOptions`] from its flags and the environment variables it
//! documents; an embedder builds one in code ([`CompilerOptions::default`]
//! is what a program normally gets). Nothing in the compiler or runtime
//! crates reads the environment.
//!
//! Debug output goes through [`tracing`] events, one target per stage, so
//! a subscriber chooses what to show:
//!
//! | target | what |
//! | --- | --- |
//! | `adjoint::opt` | each optimiser round and typed pass (sizes, time) |
//! | `adjoint::ir` | the module after each optimiser round (large) |
//! | `adjoint::egg` | equality saturation's report per graph |
//! | `adjoint::fuse` | the kernels fusion made, and what it could not fuse |
//! | `adjoint::scalar` | the graphs and loops compiled to native scalar code |
//! | `adjoint::vm` | the VM code of each compiled graph |

/// The compiler's switches and limits (see the module documentation).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CompilerOptions {
    /// Loops and recursion over scalars run as native code (graph mode);
    /// off, the VM interprets them.
    pub scalar_jit: bool,
    /// Reverse mode's stacks of backpropagators are tapes (graph mode);
    /// off, they are lists of closures.
    pub tapes: bool,
    /// Reductions write the unreduced values other code needs in the same
    /// pass (side outputs).
    pub side_outputs: bool,
    /// The VM releases each value after its last use; off, when its
    /// function returns.
    pub release_early: bool,
    /// Kernels may use their 256-bit routines (where the CPU has them).
    pub avx2: bool,
    /// The most values (8 bytes each) one tape of native reverse mode may
    /// hold; past it the run stops with an error instead of exhausting
    /// memory.
    pub max_tape_slots: u64,
}

impl Default for CompilerOptions {
    fn default() -> CompilerOptions {
        CompilerOptions {
            scalar_jit: true,
            tapes: true,
            side_outputs: true,
            release_early: true,
            avx2: true,
            max_tape_slots: 1 << 30,
        }
    }
}
