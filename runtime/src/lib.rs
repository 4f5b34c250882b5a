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
//! - [`math`]: the table of element-wise math functions (values,
//!   derivatives, CUDA names), from which the compiler derives their
//!   primitives;
//! - [`kernels`]: one reference kernel per primitive, by name
//!   ([`kernels::lookup`]);
//! - [`value`]: run-time values; [`error`]: [`RtError`];
//! - [`vm`]: the virtual machine; [`memory`]: allocator settings;
//!   [`dynamic`]: the hook through which the compiler differentiates
//!   function values at run time;
//! - [`host`]: hooks the host program provides for progress bars and plots;
//! - [`comm`]: the processes of the world (one, or an MPI job with the
//!   `mpi` feature) and the collectives' data exchange;
//! - [`cuda`]: the GPU (driver, device memory, NVRTC, cuBLAS) through
//!   `cudarc` with dynamic loading: builds with no CUDA installed.
//!
//! Calling a kernel directly:
//!
//! ```
//! use adjoint_runtime::{lookup, Ctx, RtError, Tensor, Value};
//!
//! struct Out(Vec<u8>);
//! impl Ctx for Out {
//!     fn call(&mut self, _: &Value, _: &[Value]) -> Result<Value, RtError> {
//!         Err(RtError::new("no functions here"))
//!     }
//!     fn stdout(&mut self) -> &mut dyn std::io::Write {
//!         &mut self.0
//!     }
//! }
//!
//! let x = Value::from(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?);
//! let two = Value::from(Tensor::weak_i64(2)); // a weakly typed literal adopts f32
//! let mul = lookup("mul").expect("a kernel");
//! let y = mul(&mut Out(Vec::new()), &[x, two])?;
//! assert_eq!(y.to_string(), "[[2.0, 4.0], [6.0, 8.0]]");
//!
//! let bad = mul(&mut Out(Vec::new()), &[y, Value::from(Tensor::vector(vec![1.0f64; 3]))]);
//! assert_eq!(
//!     bad.unwrap_err().message,
//!     "mul: shapes f32[2, 2] and f64[3] cannot be broadcast"
//! );
//! # Ok::<(), RtError>(())
//! ```

pub mod batch;
pub mod comm;
pub mod cuda;
pub mod dtype;
pub mod dynamic;
pub mod error;
pub mod format;
pub mod host;
pub mod kernels;
pub mod math;
pub mod memory;
pub mod shape;
pub mod tape;
pub mod tensor;
pub mod threads;
pub mod value;
pub mod vm;

pub use dtype::DType;
pub use error::RtError;
pub use kernels::{lookup, Ctx, Kernel, KERNELS};
pub use shape::TensorTy;
pub use tensor::{Buffer, Element, Tensor};
pub use value::{Record, Value};
