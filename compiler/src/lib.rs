pub mod infer;
pub mod ir;
pub mod exec;
pub mod lower;
pub mod pipeline;
pub mod prim;
