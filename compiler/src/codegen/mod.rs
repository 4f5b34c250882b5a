//! Code generation for fused element-wise kernels.
//!
//! [`kernel`] describes a kernel (a map chain with at most one reduction),
//! which the fusion pass builds from the IR; [`cpu`] compiles such a
//! description to native code with Cranelift, [`cuda`] to CUDA C for
//! NVRTC (with cuBLAS for matrix products). [`scalar`] describes loops and
//! recursion over scalars, which [`cpu::scalar`] compiles to native
//! functions with tail calls.

pub mod cpu;
pub mod cuda;
pub mod kernel;
pub mod scalar;
pub mod scalar_ad;

#[cfg(test)]
mod tests;
