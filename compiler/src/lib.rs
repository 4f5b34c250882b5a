/// Opens a span around one stage of compilation (target `adjoint::pass`);
/// the stage lasts until the returned guard drops. Nothing is measured
/// unless a subscriber listens (`adjoint run --time-passes`).
macro_rules! stage {
    ($name:literal) => {
        tracing::info_span!(target: "adjoint::pass", $name).entered()
    };
}

pub mod ad;
pub mod adopt;
pub mod aot;
pub mod checks;
pub mod codegen;
pub mod fuse;
pub mod infer;
pub mod ir;
pub mod lower;
pub mod opt;
pub mod options;
pub mod pipeline;
pub mod prim;
pub mod rewrite;
pub mod rule;
pub mod scalar;
pub mod span;
pub mod stack;
pub mod vmgen;
pub use options::CompilerOptions;
