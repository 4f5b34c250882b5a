//! The primitive table: every primitive is defined here, once.
//!
//! One row per primitive: its name (the name users call it by, the name the
//! IR prints, and the name of its reference kernel in `adjoint-runtime`), its
//! category, its parameters with defaults (keyword arguments are
//! normalised against this list by lowering), whether it is
//! differentiable, and, for element-wise primitives, its derivative rule
//! (`d "..."`: one per parameter, see [`crate::rule`]), from which reverse,
//! forward and scalar-loop derivatives all come. (`cast` is the one
//! differentiable element-wise primitive without one: its reverse casts
//! back to the operand's dtype, written in `stdlib/bprop.adj`.) The math functions of
//! `adjoint_runtime::math` are primitives too, [`Prim::Math`]: their rows
//! live in that table, with their kernels. The type-and-shape rule lives
//! in [`crate::infer::rules`], selected by an exhaustive `match` over
//! [`Prim`], so adding a primitive makes the compiler list every place that
//! must handle it.

use std::fmt;

use adjoint_runtime::batch::BatchRule;
use adjoint_runtime::math::MathFn;

/// What a primitive does, for passes that treat groups of primitives alike.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Category {
    /// Element-wise.
    Map,
    /// Moves or selects elements (reshape, transpose, broadcast, index).
    Reindex,
    Reduce,
    /// Matrix products.
    Contract,
    /// Creation, random numbers, queries of shape and dtype.
    Create,
    /// Tuples, records and tensor literals.
    Struct,
    /// Control flow and higher-order helpers.
    Control,
    /// Side effects, ordered by the IO state token.
    Io,
}

/// The default of an optional parameter.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Default {
    /// Omitted: the kernel receives `()`.
    Unit,
    Bool(bool),
    Int(i64),
}

#[derive(Copy, Clone, Debug)]
pub struct Param {
    pub name: &'static str,
    pub default: Option<Default>,
}

#[derive(Copy, Clone, Debug)]
pub struct PrimInfo {
    pub name: &'static str,
    pub category: Category,
    /// Fixed parameters. A variadic primitive takes any number of further
    /// positional arguments after them.
    pub params: &'static [Param],
    pub variadic: bool,
    /// Whether a value of this primitive carries a derivative (used by AD).
    pub differentiable: bool,
}

const fn req(name: &'static str) -> Param {
    Param {
        name,
        default: None,
    }
}
const fn opt(name: &'static str, d: Default) -> Param {
    Param {
        name,
        default: Some(d),
    }
}

const X: &[Param] = &[req("x")];
const XY: &[Param] = &[req("x"), req("y")];
const A: &[Param] = &[req("a")];
const AB: &[Param] = &[req("a"), req("b")];
const REDUCE: &[Param] = &[
    req("x"),
    opt("axis", Default::Unit),
    opt("keepdims", Default::Bool(false)),
];
const SCAN: &[Param] = &[
    req("x"),
    opt("axis", Default::Unit),
    opt("reverse", Default::Bool(false)),
];
const NONE: &[Param] = &[];
const UPDATE: &[Param] = &[req("x"), req("idx"), req("v")];
const IO: &[Param] = &[req("io")];

macro_rules! prims {
    ($( $(#[$meta:meta])* $variant:ident = $name:literal, $cat:ident, $params:expr, $variadic:literal, $diff:literal $(, d $rule:literal)?; )*) => {
        /// A primitive operation.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Prim {
            $($(#[$meta])* $variant,)*
            /// A function of the math table (`adjoint_runtime::math`):
            /// element-wise, one float argument, differentiable by the
            /// table's rule.
            Math(MathFn),
        }

        impl Prim {
            /// The primitives of this table's rows, in table order.
            const ROWS: &'static [Prim] = &[$(Prim::$variant),*];

            pub fn info(self) -> PrimInfo {
                match self {
                    $(Prim::$variant => PrimInfo {
                        name: $name,
                        category: Category::$cat,
                        params: { const P: &[Param] = $params; P },
                        variadic: $variadic,
                        differentiable: $diff,
                    },)*
                    Prim::Math(f) => PrimInfo {
                        name: f.name(),
                        category: Category::Map,
                        params: X,
                        variadic: false,
                        differentiable: true,
                    },
                }
            }

            /// The derivative rule of an element-wise primitive, as the
            /// table writes it ([`crate::rule`] parses it).
            pub fn derivative(self) -> Option<&'static str> {
                match self {
                    $($(Prim::$variant => Some($rule),)?)*
                    Prim::Math(f) => Some(f.row().derivative),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
    };
}

prims! {
    // element-wise, one operand
    Neg = "neg", Map, X, false, true, d "-d";
    Exp = "exp", Map, X, false, true, d "d * out";
    Log = "log", Map, X, false, true, d "d / x";
    Log1p = "log1p", Map, X, false, true, d "d / (1.0 + x)";
    Tanh = "tanh", Map, X, false, true, d "d * (1.0 - out * out)";
    Sigmoid = "sigmoid", Map, X, false, true, d "d * out * (1.0 - out)";
    Relu = "relu", Map, X, false, true, d "where(x > 0.0, d, zeros_like(d))";
    Sqrt = "sqrt", Map, X, false, true, d "d / (2.0 * out)";
    Rsqrt = "rsqrt", Map, X, false, true, d "-0.5 * d * out * out * out";
    Abs = "abs", Map, X, false, true, d "d * sign(x)";
    Sign = "sign", Map, X, false, true, d "zero";
    Floor = "floor", Map, X, false, true, d "zero";
    Ceil = "ceil", Map, X, false, true, d "zero";
    Lgamma = "lgamma", Map, X, false, true, d "d * digamma(x)";
    Erf = "erf", Map, X, false, true, d "d * 1.1283791670955126 * exp(-(x * x))";
    Not = "not", Map, X, false, false;
    // element-wise, two operands (NumPy broadcasting, weak literal typing)
    Add = "add", Map, XY, false, true, d "x: d; y: d";
    Sub = "sub", Map, XY, false, true, d "x: d; y: -d";
    Mul = "mul", Map, XY, false, true, d "x: d * y; y: d * x";
    Div = "div", Map, XY, false, true, d "x: d / y; y: -(d * out) / y";
    // y x^(y-1), but 0 for y == 0 (where x^-1 would make 0 * inf at x = 0);
    // d/dy x^y = x^y log x, taken as 0 where x <= 0.
    Pow = "pow", Map, XY, false, true,
        d "x: where(y == 0.0, zeros_like(out), d * y * where(y == 0.0, ones_like(out), x) ** (y - 1));
           y: where(x > 0.0, d * out * log(where(x > 0.0, x, ones_like(x))), zeros_like(out))";
    Rem = "rem", Map, XY, false, true, d "x: d; y: -(d * sign(x / y) * floor(abs(x / y)))";
    // Ties send the derivative to the first argument.
    Maximum = "maximum", Map, XY, false, true,
        d "x: where(x >= y, d, zeros_like(d)); y: where(x >= y, zeros_like(d), d)";
    Minimum = "minimum", Map, XY, false, true,
        d "x: where(x <= y, d, zeros_like(d)); y: where(x <= y, zeros_like(d), d)";
    Eq = "eq", Map, XY, false, false;
    Ne = "ne", Map, XY, false, false;
    Lt = "lt", Map, XY, false, false;
    Le = "le", Map, XY, false, false;
    Gt = "gt", Map, XY, false, false;
    Ge = "ge", Map, XY, false, false;
    And = "and", Map, XY, false, false;
    Or = "or", Map, XY, false, false;
    Where = "where", Map, &[req("c"), req("a"), req("b")], false, true,
        d "c: none; a: where(c, d, zeros_like(d)); b: where(c, zeros_like(d), d)";
    Cast = "cast", Map, &[req("x"), req("dtype")], false, true;
    // reductions
    Sum = "sum", Reduce, REDUCE, false, true;
    Mean = "mean", Reduce, REDUCE, false, true;
    Max = "max", Reduce, REDUCE, false, true;
    Min = "min", Reduce, REDUCE, false, true;
    Prod = "prod", Reduce, REDUCE, false, true;
    Argmax = "argmax", Reduce, REDUCE, false, false;
    // scans and orderings along one axis (the tensor flattened without one)
    /// Running sums along `axis`; from the end when `reverse`.
    Cumsum = "cumsum", Reduce, SCAN, false, true;
    /// Running products along `axis`; from the end when `reverse`.
    Cumprod = "cumprod", Reduce, SCAN, false, true;
    /// The indices that sort each lane along `axis` ascending (stable,
    /// NaN last).
    Argsort = "argsort", Reduce, &[req("x"), opt("axis", Default::Int(-1))], false, false;
    // reindexing
    Reshape = "reshape", Reindex, &[req("x"), req("shape")], false, true;
    Transpose = "transpose", Reindex, &[req("x"), opt("perm", Default::Unit)], false, true;
    BroadcastTo = "broadcast_to", Reindex, &[req("x"), req("shape")], false, true;
    Concat = "concat", Reindex, &[req("xs"), opt("axis", Default::Int(0))], false, true;
    Stack = "stack", Reindex, &[req("xs"), opt("axis", Default::Int(0))], false, true;
    ExpandDims = "expand_dims", Reindex, &[req("x"), req("axis")], false, true;
    Squeeze = "squeeze", Reindex, &[req("x"), opt("axis", Default::Unit)], false, true;
    Take = "take", Reindex, &[req("x"), req("idx"), opt("axis", Default::Unit)], false, true;
    /// `x[c0, c1, ..]`: each component an int (select) or a `(lo, hi)` slice.
    Index = "index", Reindex, X, true, true;
    /// `index_at(x, idx)`: `x[c0, c1, ..]` for one tuple `idx = (c0, c1, ..)`
    /// of components as `index` takes them (the read of `x.at[idx]`, and
    /// of the update rules).
    IndexAt = "index_at", Reindex, &[req("x"), req("idx")], false, true;
    /// `x.at[idx].set(v)`: `x` with `x[idx]` replaced by `v` (broadcast to
    /// the region's shape, cast to `x`'s dtype); `v[i] = e` lowers to it.
    IndexSet = "index_set", Reindex, UPDATE, false, true;
    /// `x.at[idx].add(v)`: `x` with `v` added to `x[idx]` (`v[i] += e`).
    IndexAdd = "index_add", Reindex, UPDATE, false, true;
    /// `x.at[idx].mul(v)`: `x[idx]` multiplied by `v` (`v[i] *= e`).
    IndexMul = "index_mul", Reindex, UPDATE, false, true;
    /// `x.at[idx].min(v)`: `x[idx]` replaced by `minimum(x[idx], v)`.
    IndexMin = "index_min", Reindex, UPDATE, false, true;
    /// `x.at[idx].max(v)`: `x[idx]` replaced by `maximum(x[idx], v)`.
    IndexMax = "index_max", Reindex, UPDATE, false, true;
    // contractions
    Matmul = "matmul", Contract, XY, false, true;
    Dot = "dot", Contract, XY, false, true;
    Outer = "outer", Contract, XY, false, true;
    // strings (runtime/src/kernels/text.rs)
    /// `format(template, values..)`: `{}` and `{:.3}`-style placeholders.
    Format = "format", Create, &[req("template")], true, false;
    /// `int(s)`: the int a string holds.
    ParseInt = "int", Create, &[req("s")], false, false;
    /// `float(s)`: the float a string holds.
    ParseFloat = "float", Create, &[req("s")], false, false;
    // matrix decompositions, on stacks of matrices (runtime/src/kernels/decomp.rs)
    /// `x` with `a @ x = b`.
    Solve = "solve", Contract, AB, false, true;
    /// `x` with `a @ x = b`, reading one triangle of `a`.
    TriangularSolve = "triangular_solve", Contract,
        &[req("a"), req("b"), opt("lower", Default::Bool(true))], false, true;
    Det = "det", Contract, A, false, true;
    /// `(sign, log|det|)`.
    Slogdet = "slogdet", Contract, A, false, true;
    /// The lower Cholesky factor of the symmetric part of `a`.
    Cholesky = "cholesky", Contract, A, false, true;
    /// `(w, v)`: eigenvalues (ascending) and eigenvectors of the symmetric part.
    Eigh = "eigh", Contract, A, false, true;
    /// The reduced `(q, r)`, `r` with a non-negative diagonal.
    Qr = "qr", Contract, A, false, true;
    // queries, creation and random numbers
    Shape = "shape", Create, X, false, false;
    Size = "size", Create, X, false, false;
    DTypeOf = "dtype", Create, X, false, false;
    Zeros = "zeros", Create, &[req("shape"), opt("dtype", Default::Unit)], false, false;
    Ones = "ones", Create, &[req("shape"), opt("dtype", Default::Unit)], false, false;
    Full = "full", Create, &[req("shape"), req("v"), opt("dtype", Default::Unit)], false, true;
    ZerosLike = "zeros_like", Create, X, false, false;
    OnesLike = "ones_like", Create, X, false, false;
    Arange = "arange", Create, &[req("n"), opt("dtype", Default::Unit)], false, false;
    Eye = "eye", Create, &[req("n"), opt("dtype", Default::Unit)], false, false;
    OneHot = "one_hot", Create, &[req("labels"), req("n"), opt("dtype", Default::Unit)], false, false;
    Randn = "randn", Create, &[req("shape"), opt("seed", Default::Int(0)), opt("dtype", Default::Unit)], false, false;
    Rand = "rand", Create, &[req("shape"), opt("seed", Default::Int(0)), opt("dtype", Default::Unit)], false, false;
    Permutation = "permutation", Create, &[req("n"), opt("seed", Default::Int(0))], false, false;
    // tuples, records, tensor literals
    MakeTuple = "make_tuple", Struct, NONE, true, true;
    TupleGet = "tuple_get", Struct, &[req("t"), req("i")], false, true;
    TupleLen = "tuple_len", Struct, &[req("t")], false, false;
    /// Whether a value is `()`: how the standard library tells an omitted
    /// `axis` from a given one.
    IsUnit = "is_unit", Struct, X, false, false;
    /// Whether a value is a tuple (an int `reps` from a tuple of them).
    IsTuple = "is_tuple", Struct, X, false, false;
    /// `fail(message)`: an error when it runs (its value is never made):
    /// the standard library's way to refuse an argument it does not
    /// support.
    Fail = "fail", Control, &[req("message")], false, false;
    /// `make_record("w", w, "b", b)`.
    MakeRecord = "make_record", Struct, NONE, true, true;
    RecordGet = "record_get", Struct, &[req("r"), req("name")], false, true;
    TensorLiteral = "tensor_literal", Struct, NONE, true, true;
    // control
    /// `switch(c, a, b)` is `a` when `c` holds, else `b`.
    Switch = "switch", Control, &[req("c"), req("a"), req("b")], false, true;
    TreeMap = "tree_map", Control, &[req("f"), req("t")], true, true;
    TreeSum = "tree_sum", Control, &[req("t")], false, true;
    /// `x`, with a zero derivative (user-facing).
    StopGradient = "stop_gradient", Control, X, false, true;
    /// Swaps the last two axes (used by the rule of `@`).
    MatrixT = "mT", Reindex, X, false, true;
    /// The derivative of `lgamma`.
    Digamma = "digamma", Map, X, false, true, d "d * trigamma(x)";
    /// The derivative of `digamma`.
    Trigamma = "trigamma", Map, X, false, true, d "d * polygamma(2, x)";
    /// `polygamma(n, x)`: the `n`-th derivative of `digamma` (an int order
    /// `n >= 0`); its derivative is `polygamma(n + 1, x)`.
    Polygamma = "polygamma", Map, &[req("n"), req("x")], false, true, d "n: none; x: d * polygamma(n + 1, x)";
    // Values made by differentiation. Cotangents that are known to be zero
    // are the symbolic zero `zero()`; cotangents of free variables travel in
    // environments keyed by the forward node's id.
    Zero = "zero", Struct, NONE, false, true;
    IsZero = "is_zero", Struct, X, false, false;
    /// Adds two cotangents of the same structure; `zero()` is the identity.
    GAdd = "gadd", Struct, XY, false, true;
    EnvSetitem = "env_setitem", Struct, &[req("env"), req("key"), req("v")], false, true;
    /// `zero()` when the key is absent.
    EnvGetitem = "env_getitem", Struct, &[req("env"), req("key")], false, true;
    /// Replaces symbolic zeros in cotangent `d` by zeros shaped like `x`.
    GradFinalize = "grad_finalize", Struct, &[req("d"), req("x")], false, true;
    /// Sums `x` down to the shape of `like` (undoes broadcasting).
    SumTo = "sum_to", Reduce, &[req("x"), req("like")], false, true;
    /// A mask of `x`'s type: 1 at the first extremal element of each group
    /// reduced over `axis` (the minimum when `is_min`), 0 elsewhere.
    ExtremumMask = "extremum_mask", Reduce, &[req("x"), req("axis"), req("is_min")], false, false;
    /// `transpose(d, inverse of perm)`.
    TransposeGrad = "transpose_grad", Reindex, &[req("d"), req("perm")], false, true;
    /// Cuts `d` into pieces shaped like the elements of tuple `xs` along `axis`.
    SplitLike = "split_like", Reindex, &[req("d"), req("xs"), req("axis")], false, true;
    /// The slices of `d` along `axis`, as a tuple.
    Unstack = "unstack", Reindex, &[req("d"), req("axis")], false, true;
    /// Zeros shaped like `x` with `d` added at `take(x, idx, axis)`'s positions.
    TakeGrad = "take_grad", Reindex, &[req("x"), req("idx"), req("axis"), req("d")], false, true;
    /// `index_grad(x, d, c0, ..)`: zeros like `x` with `d` at `x[c0, ..]`.
    IndexGrad = "index_grad", Reindex, &[req("x"), req("d")], true, true;
    /// A tuple of zeros shaped like tuple `t` with `d` at position `i`.
    TupleGrad = "tuple_grad", Struct, &[req("t"), req("i"), req("d")], false, true;
    /// A record of zeros shaped like `r` with `d` in field `name`.
    RecordGrad = "record_grad", Struct, &[req("r"), req("name"), req("d")], false, true;
    /// Every leaf of tree `t` filled with scalar `d` (the rule of `tree_sum`).
    TreeFill = "tree_fill", Struct, &[req("t"), req("d")], false, true;
    /// The `gadd` of every leaf of tree `t` (the rule of `tree_map` sums the
    /// environments of the mapped function with it).
    TreeGAdd = "tree_gadd", Struct, &[req("t")], false, true;
    /// `ad_lift(v, mode, wrap)`: `v` as reverse- (mode 1) or forward-mode
    /// (2) differentiated code represents it: its closures transformed at
    /// run time (`adjoint_runtime::dynamic`; `wrap` as for `ad_dyn`). The
    /// transforms insert it for free variables they reach from outside the
    /// differentiated code.
    AdLift = "ad_lift", Control, &[req("f"), req("mode"), req("wrap")], false, true;
    /// `ad_dyn(f, kind, argnums, wrap)`: `grad(f)` and friends of a function
    /// value `f` not known at compile time, built at run time.
    AdDyn = "ad_dyn", Control, &[req("f"), req("kind"), req("argnums"), req("wrap")], false, true;
    /// `x` itself, of a type inference does not follow (`Unknown`): the
    /// stack of backpropagators that reverse mode threads through a loop
    /// grows by one entry per iteration, which no static type describes.
    AdHide = "ad_hide", Struct, X, false, true;
    /// `ad_key(x, key)`: `x` itself. Reverse mode wraps each use of a
    /// free variable of a loop it threads a stack through with the
    /// variable's environment key, so that the loop, compiled whole
    /// (`fuse::reverse`), can still tell which of its values stand for it
    /// after the optimiser substituted or specialised them.
    AdKey = "ad_key", Struct, &[req("x"), req("key")], false, true;
    /// `ones_like(y)` for a float scalar `y`, else an error: the seed of a
    /// `grad` built at run time, where no type check ran.
    GradSeed = "grad_seed", Create, X, false, false;
    // vmap (adjoint_runtime::batch): a mapped function's lanes. `vmap_in`
    // makes axis `axis` of every leaf the lanes of `level` (`axis` `()`:
    // not mapped), `vmap_out` puts them back at `axis`, `vmap_sum` sums a
    // cotangent over them; `jac_basis` and `jac_reshape` lay out Jacobians.
    VmapLevel = "vmap_level", Control, &[req("args")], false, false;
    VmapSize = "vmap_size", Control, &[req("args"), req("axes")], false, false;
    VmapIn = "vmap_in", Control, &[req("x"), req("axis"), req("level"), req("n")], false, true;
    VmapOut = "vmap_out", Control, &[req("y"), req("axis"), req("level"), req("n")], false, true;
    VmapSum = "vmap_sum", Control, &[req("d"), req("level"), req("n")], false, true;
    // The mapped function itself (its value unchanged): the cotangents of
    // the values it captures are summed over the lanes.
    VmapFn = "vmap_fn", Control, &[req("f"), req("level"), req("n")], false, true;
    JacBasis = "jac_basis", Create, &[req("y")], false, false;
    // processes (adjoint_runtime::comm): `rank()` and `world_size()` are
    // the module's world, constants when the program is compiled; the
    // collectives run in program order on every rank (control, so that no
    // pass evaluates or moves them as pure functions of their operands).
    Rank = "rank", Create, NONE, false, false;
    WorldSize = "world_size", Create, NONE, false, false;
    /// `all_reduce(x, op = "sum" | "mean" | "max" | "min")` (`()`: sum).
    AllReduce = "all_reduce", Control, &[req("x"), opt("op", Default::Unit)], false, true;
    /// The ranks' `x` joined along `axis`, in rank order.
    AllGather = "all_gather", Control, &[req("x"), opt("axis", Default::Int(0))], false, true;
    /// The sum over ranks of `x`, of which rank `r` keeps chunk `r` along `axis`.
    ReduceScatter = "reduce_scatter", Control, &[req("x"), opt("axis", Default::Int(0))], false, true;
    /// Rank `root`'s `x`, on every rank.
    Broadcast = "broadcast", Control, &[req("x"), opt("root", Default::Int(0))], false, true;
    JacReshape = "jac_reshape", Reindex, &[req("j"), req("y"), req("x"), opt("fwd", Default::Bool(false))], false, true;
    // side effects: the first argument is the IO state token
    Print = "print", Io, IO, true, false;
    LoadNpy = "load_npy", Io, &[req("io"), req("path")], false, false;
    /// `load_csv(path)`: a CSV file of numbers as f64[rows, columns].
    LoadCsv = "load_csv", Io, &[req("io"), req("path")], false, false;
    SaveNpy = "save_npy", Io, &[req("io"), req("path"), req("x")], false, false;
    SaveSafetensors = "save_safetensors", Io, &[req("io"), req("path"), req("record")], false, false;
    LoadSafetensors = "load_safetensors", Io, &[req("io"), req("path")], false, false;
    // progress bars and plots, drawn by the host program (see
    // `adjoint_runtime::host`); without one they do nothing
    /// Starts a bar for the loop `for i in progress(lo..hi)` (lowering
    /// inserts it, with `progress_step` and `progress_end`).
    ProgressStart = "progress_start", Io, &[req("io"), req("lo"), req("hi")], false, false;
    /// Iteration `i` of the innermost bar's loop begins.
    ProgressStep = "progress_step", Io, &[req("io"), req("i")], false, false;
    ProgressEnd = "progress_end", Io, IO, false, false;
    /// `progress_note(a, b, ..)`: the message of the innermost bar.
    ProgressNote = "progress_note", Io, IO, true, false;
    SaveCsv = "save_csv", Io, &[req("io"), req("path"), req("x"), opt("header", Default::Unit)], false, false;
    Plot = "plot", Io, &[req("io"), req("y"), opt("title", Default::Unit)], false, false;
}

/// Declares an enum of operations, each a primitive of this table (the
/// variant of [`Prim`] of the same name), with `ALL`, `prim`, `of_prim`,
/// `name`, `from_name` and `Display`: the native code generators name
/// the primitives they implement this way (`codegen::kernel::BinaryOp`,
/// `SBinary` of the scalar programs).
macro_rules! op_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant),*
        }

        impl $name {
            /// Every operation, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The primitive the operation computes (the variant of
            /// `Prim` of the same name).
            pub fn prim(self) -> $crate::prim::Prim {
                match self {
                    $($name::$variant => $crate::prim::Prim::$variant),*
                }
            }

            /// The operation of a primitive, if it is one of these.
            pub fn of_prim(p: $crate::prim::Prim) -> Option<Self> {
                match p {
                    $($crate::prim::Prim::$variant => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The primitive's name (as in `prim.rs` and the runtime kernels).
            pub fn name(self) -> &'static str {
                self.prim().name()
            }

        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}
pub(crate) use op_enum;

impl Prim {
    pub fn name(self) -> &'static str {
        self.info().name
    }
    /// Every primitive: the rows of this table, then the math table's
    /// functions.
    pub fn all() -> &'static [Prim] {
        static ALL: std::sync::OnceLock<Vec<Prim>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            let math = MathFn::ALL.iter().map(|f| Prim::Math(*f));
            Prim::ROWS.iter().copied().chain(math).collect()
        })
    }
    pub fn category(self) -> Category {
        self.info().category
    }
    /// How messages name the primitive where users write it as an
    /// operator or as indexing (`+`, `x[i]`, `x[i] = e`): its own name
    /// (`add`, `index_set`) is not in their program.
    pub fn user_label(self) -> Option<&'static str> {
        use Prim::*;
        Some(match self {
            Add => "`+`",
            Sub => "`-`",
            Mul => "`*`",
            Div => "`/`",
            Rem => "`%`",
            Pow => "`**`",
            Matmul => "`@`",
            Neg => "unary `-`",
            Not => "`!`",
            Eq => "`==`",
            Ne => "`!=`",
            Lt => "`<`",
            Le => "`<=`",
            Gt => "`>`",
            Ge => "`>=`",
            And => "`&&`",
            Or => "`||`",
            Index => "indexing",
            IndexSet => "indexed assignment",
            IndexAdd => "indexed `+=`",
            _ => return None,
        })
    }
    /// Looks a primitive up by its name.
    pub fn from_name(name: &str) -> Option<Prim> {
        Prim::all().iter().copied().find(|p| p.name() == name)
    }
    /// How the primitive runs on operands with lanes (`vmap`), from its
    /// category: element-wise primitives broadcast lanes, reductions and
    /// reindexing shift their axes past them, products and decompositions
    /// take them as stack axes, structure passes them through untouched,
    /// and the rest runs once per lane.
    pub fn batch_rule(self) -> BatchRule {
        use Prim::*;
        match self {
            Math(_) => BatchRule::Elementwise,
            GAdd => BatchRule::GAdd,
            GradFinalize => BatchRule::GradFinalize,
            SumTo => BatchRule::SumTo,
            Sum | Mean | Max | Min | Prod | Argmax | Cumsum | Cumprod | Argsort => {
                BatchRule::Reduce
            }
            Matmul => BatchRule::Matmul,
            Reshape => BatchRule::Reshape,
            Transpose => BatchRule::Transpose,
            BroadcastTo => BatchRule::BroadcastTo,
            ExpandDims => BatchRule::ExpandDims,
            Squeeze => BatchRule::Squeeze,
            Concat | Stack => BatchRule::Join,
            Take => BatchRule::Take,
            ZerosLike | OnesLike | GradSeed | StopGradient => BatchRule::Like,
            Shape | Size | DTypeOf => BatchRule::Query,
            Det | Slogdet | Cholesky | Eigh | Qr => BatchRule::Stacked,
            MakeTuple | TupleGet | TupleLen | MakeRecord | RecordGet | IsUnit | IsTuple | Fail
            | Switch | TreeMap | Zero | IsZero | EnvSetitem | EnvGetitem | TupleGrad
            | RecordGrad | AdLift | AdDyn | AdHide | AdKey => BatchRule::Opaque,
            VmapLevel | VmapSize | VmapIn | VmapOut | VmapSum | VmapFn => BatchRule::Itself,
            p if p.category() == Category::Io => BatchRule::Itself,
            p if p.category() == Category::Map => BatchRule::Elementwise,
            _ => BatchRule::PerLane,
        }
    }
    /// Whether IO primitives produce a `(io, value)` pair rather than a new
    /// state token alone.
    pub fn returns_io_pair(self) -> bool {
        matches!(self, Prim::LoadNpy | Prim::LoadCsv | Prim::LoadSafetensors)
    }
}

impl fmt::Display for Prim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        for p in Prim::all() {
            assert_eq!(Prim::from_name(p.name()), Some(*p));
        }
    }
}

#[cfg(test)]
mod kernel_tests {
    use super::*;

    /// Every primitive the VM does not implement itself has a reference
    /// kernel under its name: a missing one is caught here, not at run time.
    #[test]
    fn every_primitive_has_a_kernel() {
        let missing: Vec<_> = Prim::all()
            .iter()
            .filter(|p| **p != Prim::Switch)
            .filter(|p| adjoint_runtime::kernels::lookup(p.name()).is_none())
            .collect();
        assert!(
            missing.is_empty(),
            "primitives without kernels: {missing:?}"
        );
    }
}

#[cfg(test)]
mod native_op_tests {
    use super::*;
    use crate::codegen::kernel::UnaryOp;
    use crate::scalar::SUnary;

    /// The native operations of element-wise primitives map to their
    /// primitive and back, and every math function has both.
    #[test]
    fn unary_ops_and_primitives_correspond() {
        for op in UnaryOp::all() {
            assert_eq!(UnaryOp::of_prim(op.prim()), Some(*op));
            assert_eq!(op.prim().name(), op.name());
        }
        for op in SUnary::all() {
            assert_eq!(SUnary::of_prim(op.prim()), Some(*op));
            assert_eq!(op.prim().name(), op.name());
        }
        for f in MathFn::ALL {
            assert_eq!(UnaryOp::of_prim(Prim::Math(*f)), Some(UnaryOp::Math(*f)));
            assert_eq!(SUnary::of_prim(Prim::Math(*f)), Some(SUnary::Math(*f)));
        }
        assert_eq!(UnaryOp::of_prim(Prim::Add), None);
    }
}
