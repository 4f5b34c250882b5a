//! Differentiation of function values at run time.
//!
//! The compiler differentiates every function it can name at compile time.
//! A function that is only a *value* (a parameter, an element of a tuple,
//! the result of a call) reaches `grad`, `vjp` or `jvp` as a closure: the
//! two primitives `ad_lift` and `ad_dyn` hand it to a [`Dynamic`] hook that
//! the compiler installs in the [`Program`](crate::vm::Program). The hook
//! transforms the closure's graph, compiles the new graphs into code objects
//! numbered after the program's own, and returns the transformed closure.
//! This crate only defines the interface; `adjoint-compiler` implements it.
//!
//! The pieces live where the code that uses them can see them: [`DynOp`]
//! with the kernels' [`Ctx`](crate::kernels::Ctx), which `ad_lift` and
//! `ad_dyn` call; [`Dynamic`] and [`DynamicHook`] with the VM's program,
//! which holds the hook and runs the code it makes. This module gathers
//! them.

pub use crate::kernels::ctx::DynOp;
pub use crate::vm::{Dynamic, DynamicHook};
