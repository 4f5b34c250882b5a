//! Code generation for fused element-wise kernels.
//!
//! [`kernel`] describes a kernel (a map chain with at most one reduction);
//! [`cpu`] compiles such a description to native code with Cranelift. A
//! fusion pass over the IR will build the descriptions; for now tests and
//! benchmarks build them by hand.

pub mod cpu;
pub mod kernel;

#[cfg(test)]
mod tests;
