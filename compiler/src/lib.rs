pub mod ad;
pub mod checks;
pub mod exec;
pub mod infer;
pub mod ir;
pub mod lower;
pub mod pipeline;
pub mod prim;
