//! Reference kernels: one function per primitive, all with the signature
//! [`Kernel`], found by name through [`lookup`] or the [`KERNELS`] table.
//!
//! Arguments arrive positionally, keyword arguments already normalised by
//! the compiler; an omitted optional argument arrives as `()`
//! ([`Value::unit`]). Kernels never panic on user input: every failure is
//! an [`RtError`] whose message names the operation and the operand types.
//! The VM adds the source location.
//!
//! The table below is the contract with the compiler: the names and the
//! positional parameters of every primitive.
//!
//! | category | kernels (parameters) |
//! | --- | --- |
//! | unary map | `neg exp log log1p sin cos tanh sigmoid relu sqrt rsqrt abs sign floor ceil lgamma digamma trigamma erf not` (x); `polygamma(n, x)` (an int order n) |
//! | binary map | `add sub mul div pow rem maximum minimum eq ne lt le gt ge and or` (x, y) |
//! | select, convert | `where(c, a, b)`, `cast(x, dtype)` |
//! | reduce | `sum mean max min prod argmax` (x, axis, keepdims) |
//! | scan | `cumsum cumprod` (x, axis, reverse), `argsort(x, axis)`; `is_unit(v)`, `is_tuple(v)`, `fail(message)` |
//! | shape | `reshape(x, shape)`, `transpose(x, perm)`, `broadcast_to(x, shape)`, `concat(xs, axis)`, `stack(xs, axis)`, `expand_dims(x, axis)`, `squeeze(x, axis)`, `shape(x)`, `size(x)`, `dtype(x)` |
//! | gather | `take(x, idx, axis)`, `index(x, c0, c1, ..)`, `index_at(x, idx)` (`idx` a tuple of components) |
//! | update | `index_set index_add index_mul index_min index_max` (x, idx, v) |
//! | linear algebra | `matmul(a, b)`, `dot(a, b)`, `outer(a, b)` |
//! | strings | `format(template, values..)`, `int(s)`, `float(s)`; `s + t` is `add` |
//! | decompositions | `solve(a, b)`, `triangular_solve(a, b, lower)`, `det(a)`, `slogdet(a)`, `cholesky(a)`, `eigh(a)`, `qr(a)` (on `faer`) |
//! | creation | `zeros(shape, dtype)`, `ones(shape, dtype)`, `full(shape, v, dtype)`, `zeros_like(x)`, `ones_like(x)`, `arange(n, dtype)`, `eye(n, dtype)`, `one_hot(labels, n, dtype)` |
//! | random | `randn(shape, seed, dtype)`, `rand(shape, seed, dtype)`, `permutation(n, seed)` |
//! | trees | `tree_map(f, t, ..)`, `tree_sum(t)`, `tree_gadd(t)` |
//! | structure | `make_tuple(..)`, `tuple_get(t, i)`, `make_record(name0, v0, ..)`, `record_get(r, name)`, `tensor_literal(e0, ..)` |
//! | differentiation | `stop_gradient(x)`, `mT(x)`, `zero()`, `is_zero(x)`, `gadd(x, y)`, `env_setitem(env, key, v)`, `env_getitem(env, key)`, `grad_finalize(d, x)`, `sum_to(x, like)`, `extremum_mask(x, axis, is_min)`, `transpose_grad(d, perm)`, `split_like(d, xs, axis)`, `unstack(d, axis)`, `take_grad(x, idx, axis, d)`, `index_grad(x, d, c0, ..)`, `tuple_grad(t, i, d)`, `record_grad(r, name, d)`, `tree_fill(t, d)` |
//! | IO | `print(io, ..)`, `load_npy(io, path)`, `save_npy(io, path, x)`, `save_safetensors(io, path, record)`, `load_safetensors(io, path)`, `save_csv(io, path, x, header)`, `plot(io, y, title)`, `progress_start(io, lo, hi)`, `progress_step(io, i)`, `progress_end(io)`, `progress_note(io, ..)` |

pub mod ad;
pub mod args;
pub mod collective;
pub mod create;
pub mod ctx;
pub mod decomp;
pub mod index;
pub mod io;
pub mod linalg;
pub mod map;
pub mod num;
pub mod random;
pub mod reduce;
pub mod scan;
pub mod shape;
pub mod strided;
pub mod structural;
pub mod text;
pub mod tree;

pub use ctx::{Ctx, InplaceKernel, Kernel};

/// Every kernel by primitive name.
pub const KERNELS: &[(&str, Kernel)] = &[
    // unary maps
    ("neg", map::neg),
    ("exp", map::exp),
    ("log", map::log),
    ("log1p", map::log1p),
    ("tanh", map::tanh),
    ("sigmoid", map::sigmoid),
    ("relu", map::relu),
    ("sqrt", map::sqrt),
    ("rsqrt", map::rsqrt),
    ("abs", map::abs),
    ("sign", map::sign),
    ("floor", map::floor),
    ("ceil", map::ceil),
    ("lgamma", map::lgamma),
    ("digamma", map::digamma),
    ("trigamma", map::trigamma),
    ("polygamma", map::polygamma),
    ("erf", map::erf),
    ("not", map::not),
    // binary maps
    ("add", map::add),
    ("sub", map::sub),
    ("mul", map::mul),
    ("div", map::div),
    ("pow", map::pow),
    ("rem", map::rem),
    ("maximum", map::maximum),
    ("minimum", map::minimum),
    ("eq", map::eq),
    ("ne", map::ne),
    ("lt", map::lt),
    ("le", map::le),
    ("gt", map::gt),
    ("ge", map::ge),
    ("and", map::and),
    ("or", map::or),
    ("where", map::where_),
    ("cast", map::cast),
    // reductions
    ("sum", reduce::sum),
    ("mean", reduce::mean),
    ("max", reduce::max),
    ("min", reduce::min),
    ("prod", reduce::prod),
    ("argmax", reduce::argmax),
    // scans and orderings along an axis
    ("cumsum", scan::cumsum),
    ("cumprod", scan::cumprod),
    ("argsort", scan::argsort),
    // strings
    ("format", text::format),
    ("int", text::parse_int),
    ("float", text::parse_float),
    // matrix decompositions
    ("solve", decomp::solve),
    ("triangular_solve", decomp::triangular_solve),
    ("det", decomp::det),
    ("slogdet", decomp::slogdet),
    ("cholesky", decomp::cholesky),
    ("eigh", decomp::eigh),
    ("qr", decomp::qr),
    ("is_unit", scan::is_unit),
    ("is_tuple", scan::is_tuple),
    ("fail", scan::fail),
    // shape
    ("reshape", shape::reshape),
    ("transpose", shape::transpose),
    ("broadcast_to", shape::broadcast_to),
    ("concat", shape::concat),
    ("stack", shape::stack),
    ("expand_dims", shape::expand_dims),
    ("squeeze", shape::squeeze),
    ("shape", shape::shape),
    ("size", shape::size),
    ("dtype", shape::dtype),
    // gather
    ("take", index::take),
    ("index", index::index),
    ("index_at", index::index_at),
    // updates
    ("index_set", index::index_set),
    ("index_add", index::index_add),
    ("index_mul", index::index_mul),
    ("index_min", index::index_min),
    ("index_max", index::index_max),
    // linear algebra
    ("matmul", linalg::matmul),
    ("dot", linalg::dot),
    ("outer", linalg::outer),
    // creation
    ("zeros", create::zeros),
    ("ones", create::ones),
    ("full", create::full),
    ("zeros_like", create::zeros_like),
    ("ones_like", create::ones_like),
    ("arange", create::arange),
    ("eye", create::eye),
    ("one_hot", create::one_hot),
    // random
    ("randn", random::randn),
    ("rand", random::rand),
    ("permutation", random::permutation),
    // trees
    ("tree_map", tree::tree_map),
    ("tree_sum", tree::tree_sum),
    ("tree_gadd", tree::tree_gadd),
    ("ad_lift", ad::ad_lift),
    ("ad_dyn", ad::ad_dyn),
    ("ad_hide", ad::ad_hide),
    ("ad_key", ad::ad_key),
    ("grad_seed", create::grad_seed),
    // vmap (crate::batch)
    ("vmap_level", crate::batch::vmap_level),
    ("vmap_size", crate::batch::vmap_size),
    ("vmap_in", crate::batch::vmap_in),
    ("vmap_out", crate::batch::vmap_out),
    ("vmap_sum", crate::batch::vmap_sum),
    ("vmap_fn", crate::batch::vmap_fn),
    ("jac_basis", crate::batch::jac_basis),
    ("jac_reshape", crate::batch::jac_reshape),
    // processes (crate::comm)
    ("rank", collective::rank),
    ("world_size", collective::world_size),
    ("all_reduce", collective::all_reduce),
    ("all_gather", collective::all_gather),
    ("reduce_scatter", collective::reduce_scatter),
    ("broadcast", collective::broadcast),
    // structure
    ("make_tuple", structural::make_tuple),
    ("tuple_get", structural::tuple_get),
    ("tuple_len", structural::tuple_len),
    ("make_record", structural::make_record),
    ("record_get", structural::record_get),
    ("tensor_literal", structural::tensor_literal),
    // differentiation
    ("stop_gradient", ad::stop_gradient),
    ("mT", ad::matrix_t),
    ("zero", ad::zero),
    ("is_zero", ad::is_zero),
    ("gadd", ad::gadd),
    ("env_setitem", ad::env_setitem),
    ("env_getitem", ad::env_getitem),
    ("grad_finalize", ad::grad_finalize),
    ("sum_to", ad::sum_to),
    ("extremum_mask", ad::extremum_mask),
    ("transpose_grad", ad::transpose_grad),
    ("split_like", ad::split_like),
    ("unstack", ad::unstack),
    ("take_grad", ad::take_grad),
    ("index_grad", ad::index_grad),
    ("tuple_grad", ad::tuple_grad),
    ("record_grad", ad::record_grad),
    ("tree_fill", ad::tree_fill),
    // IO
    ("print", io::print),
    ("load_npy", io::load_npy),
    ("load_csv", io::load_csv),
    ("save_npy", io::save_npy),
    ("save_safetensors", io::save_safetensors),
    ("load_safetensors", io::load_safetensors),
    ("progress_start", io::progress_start),
    ("progress_step", io::progress_step),
    ("progress_end", io::progress_end),
    ("progress_note", io::progress_note),
    ("save_csv", io::save_csv),
    ("plot", io::plot),
];

/// The kernel of the primitive `name`.
pub fn lookup(name: &str) -> Option<Kernel> {
    KERNELS
        .iter()
        .chain(map::MATH_KERNELS)
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k)
}

/// The variant of the primitive `name`'s kernel that may consume its
/// arguments (see [`InplaceKernel`]), if it has one.
pub fn lookup_inplace(name: &str) -> Option<InplaceKernel> {
    index::INPLACE_KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k)
}

/// Helpers for the kernels' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::error::RtError;
    use crate::tensor::Tensor;
    use crate::value::Value;
    use std::io::Write;

    /// A context whose function values are kernels: code 0 is `add`, code 1
    /// is `neg`, code 2 is `mul`; `print` writes into `out`.
    #[derive(Default)]
    pub struct TestCtx {
        pub out: Vec<u8>,
    }

    impl Ctx for TestCtx {
        fn call(&mut self, f: &Value, args: &[Value]) -> Result<Value, RtError> {
            let Value::Func(c) = f else {
                return Err(RtError::new(format!("cannot call {}", f.kind())));
            };
            let name = match c.code.0 {
                0 => "add",
                1 => "neg",
                2 => "mul",
                3 => "make_tuple",
                _ => return Err(RtError::new("unknown test function")),
            };
            let k = lookup(name).ok_or_else(|| RtError::new("no kernel"))?;
            k(self, args)
        }
        fn stdout(&mut self) -> &mut dyn Write {
            &mut self.out
        }
    }

    /// Runs a kernel and returns its result or its error.
    pub fn try_call(name: &str, args: &[Value]) -> Result<Value, RtError> {
        let k = lookup(name).unwrap_or_else(|| panic!("no kernel {name}"));
        k(&mut TestCtx::default(), args)
    }

    /// Runs a kernel that must succeed.
    pub fn call(name: &str, args: &[Value]) -> Value {
        try_call(name, args).unwrap_or_else(|e| panic!("{name} failed: {e}"))
    }

    /// Runs a kernel that must fail; returns the message.
    pub fn call_err(name: &str, args: &[Value]) -> String {
        match try_call(name, args) {
            Ok(v) => panic!("{name} succeeded with {v}"),
            Err(e) => e.message,
        }
    }

    /// A tensor value.
    pub fn v(t: Tensor) -> Value {
        Value::Tensor(t)
    }

    fn t(x: &Value) -> &Tensor {
        x.as_tensor().expect("a tensor")
    }

    /// The f32 elements of a tensor value.
    pub fn f32s(x: &Value) -> Vec<f32> {
        t(x).as_f32().expect("f32").to_vec()
    }

    /// The f64 elements of a tensor value.
    pub fn f64s(x: &Value) -> Vec<f64> {
        t(x).as_f64().expect("f64").to_vec()
    }

    /// The i64 elements of a tensor value.
    pub fn i64s(x: &Value) -> Vec<i64> {
        t(x).as_i64().expect("i64").to_vec()
    }

    /// The shape of a tensor value.
    pub fn shape_of(x: &Value) -> Vec<usize> {
        t(x).shape().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_unique_names_and_lookup_works() {
        let mut names: Vec<&str> = KERNELS
            .iter()
            .chain(map::MATH_KERNELS)
            .map(|(n, _)| *n)
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate kernel names");
        assert!(lookup("add").is_some());
        assert!(lookup("where").is_some());
        assert!(lookup("atanh").is_some());
        assert!(lookup("frobnicate").is_none());
    }
}
