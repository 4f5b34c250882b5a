//! Code generation for fused element-wise kernels.
//!
//! [`kernel`] describes a kernel (a map chain with at most one reduction),
//! which the fusion pass builds from the IR; [`cpu`] compiles such a
//! description to native code with Cranelift, [`cuda`] to CUDA C for
//! NVRTC (with cuBLAS for matrix products). Loops over scalars have their
//! own compiler, [`crate::scalar`].

pub mod cpu;
pub mod cuda;
pub mod kernel;

#[cfg(test)]
mod tests;
