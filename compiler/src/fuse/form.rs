//! What a fusion group computes, independent of the back end that runs
//! it: the CPU plan compiles these with Cranelift (and the reference
//! `gemm`), and `codegen::cuda::retarget` compiles the same forms for a
//! GPU.

use super::matmul::View;
use crate::codegen::kernel::KernelSpec;
use crate::scalar::ScalarProgram;

/// A group's kernel before code generation.
#[derive(Clone, Debug)]
pub enum KernelForm {
    /// An element-wise chain, possibly closed by a reduction.
    Fused(KernelSpec),
    /// `matmul(view_a(..), view_b(..))`.
    Matmul(View, View),
    /// A matrix product with its bias row and activation
    /// ([`super::epilogue`]); only the CPU back end has this kernel.
    Epilogue,
    /// A loop over scalars ([`super::regions`]): latency-bound host code,
    /// compiled for the CPU only.
    Scalar(ScalarProgram),
}
