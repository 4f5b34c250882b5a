//! adjoint-runtime: tensors, reference kernels, IO and the virtual machine.
//!
//! **Architecture Invariant:** this crate depends on no other crate of the
//! workspace. The compiler produces a [`vm::Program`]; this crate runs it.
//!
//! Code map:
//!
//! - [`tensor`]: [`DType`], [`Tensor`] (shared row-major buffer, static
//!   shape, weak flag); [`format`]: the print format;
//! - [`dtype`]: promotion with weakly typed literals and the result dtype
//!   of every element-wise primitive; [`shape`]: the shape rule of every
//!   primitive. Both are pure and shared with the compiler's type inference;
//! - [`kernels`]: one reference kernel per primitive, by name
//!   ([`kernels::lookup`]);
//! - [`value`]: run-time values; [`error`]: [`RtError`];
//! - [`vm`]: the virtual machine.

pub mod dtype;
pub mod error;
pub mod format;
pub mod kernels;
pub mod shape;
pub mod tensor;
pub mod value;
pub mod vm;

pub use error::RtError;
pub use kernels::{lookup, Ctx, Kernel, KERNELS};
pub use shape::TensorTy;
pub use tensor::{Buffer, DType, Element, Tensor};
pub use value::{Record, Value};
