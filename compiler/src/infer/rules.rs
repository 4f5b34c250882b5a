//! The type-and-shape rule of every primitive, on abstract values.
//!
//! [`apply`] selects the rule with one exhaustive `match` over [`Prim`]: a
//! new primitive does not compile until it has a rule here. Dtypes come
//! from `adjoint_runtime::dtype` and shapes from `adjoint_runtime::shape`,
//! the functions the kernels use, so compile-time and run-time errors read
//! the same. Scalar int and bool arithmetic is folded when every operand is
//! known, so shapes, axes, slice bounds and tuple indices computed from
//! constants stay constants.

use std::sync::Arc;

use adjoint_runtime::dtype;
use adjoint_runtime::shape::{self, IndexComp, IndexStep, TensorTy};
use adjoint_runtime::tensor::DType;

use super::domain::{join, wrap, AbsTensor, AbsVal, MAX_CONST_ELEMS};
use super::error::InferError;
use super::provenance;
use crate::ir::analysis::window_len;
use crate::ir::{Const, Loc, Module, NodeId};
use crate::prim::{Category, Prim};

/// Gives the type of the data that `load_npy` or `load_safetensors` will
/// read from a path known at compile time (for instance by reading the
/// file's header): a precise value, [`AbsVal::Unknown`] when it cannot be
/// known before the program runs, or an error message.
pub type LoadTypeFn = dyn Fn(Prim, &str) -> Result<AbsVal, String> + Sync;

/// Why a rule failed: a message for the application's location, or an
/// error raised inside a function the rule called (`tree_map`).
#[derive(Clone, Debug, PartialEq)]
pub enum RuleError {
    Msg(String),
    Nested(InferError),
}

impl From<String> for RuleError {
    fn from(m: String) -> RuleError {
        RuleError::Msg(m)
    }
}

impl From<InferError> for RuleError {
    fn from(e: InferError) -> RuleError {
        RuleError::Nested(e)
    }
}

type Rule = Result<AbsVal, RuleError>;

fn fail<T>(msg: impl Into<String>) -> Result<T, RuleError> {
    Err(RuleError::Msg(msg.into()))
}

/// Calls function values for higher-order primitives (`tree_map`).
pub trait Calls {
    /// The result of calling `f` with `args`.
    fn call(&mut self, f: &AbsVal, args: Vec<AbsVal>) -> Result<AbsVal, InferError>;
}

/// What a rule may look at besides the argument values: the IR (to
/// recognise the slice form `e : e + c`), the values of other nodes of the
/// current specialisation, and the loader of file types.
pub struct RuleCtx<'a> {
    pub module: &'a Module,
    /// The location of the application.
    pub loc: Loc,
    /// The argument nodes, parallel to the argument values; empty when the
    /// primitive is called indirectly (by `tree_map`).
    pub arg_nodes: &'a [NodeId],
    /// The value of a node in the current specialisation, if computed.
    pub value_of: &'a dyn Fn(NodeId) -> Option<AbsVal>,
    /// Gives the type of the data a `load_npy` / `load_safetensors` of a
    /// constant path will produce.
    pub load_type: Option<&'a LoadTypeFn>,
}

/// Applies the rule of `p` to `args`. `Bottom` arguments (values of
/// recursive calls not known yet) give `Bottom`, except for `switch`,
/// which only needs its condition. `Unknown` arguments (known only at run
/// time) give `Unknown`, except for primitives that build structures or
/// thread the IO token.
pub fn apply(p: Prim, ctx: &RuleCtx, args: &[AbsVal], calls: &mut dyn Calls) -> Rule {
    check_arity(p, args.len())?;
    if p != Prim::Switch && args.iter().any(AbsVal::is_bottom) {
        return Ok(AbsVal::Bottom);
    }
    // The symbolic zero is taken apart by the primitives of
    // differentiation alone; the others see it as `Unknown`.
    let stripped: Vec<AbsVal>;
    let args = if takes_zero(p) {
        // A part of the symbolic zero, and the cotangent of a part of it,
        // are the symbolic zero (as in the kernels).
        if matches!(
            p,
            Prim::TupleGet | Prim::RecordGet | Prim::TupleGrad | Prim::RecordGrad
        ) && args[0] == AbsVal::Zero
        {
            return Ok(AbsVal::Zero);
        }
        args
    } else if args.iter().any(AbsVal::contains_zero) {
        stripped = args
            .iter()
            .map(|a| a.zero_as_unknown().into_owned())
            .collect();
        &stripped
    } else {
        args
    };
    if !keeps_unknown(p) && args.iter().any(|a| matches!(a, AbsVal::Unknown)) {
        return Ok(AbsVal::Unknown);
    }
    let op = p.name();
    match p {
        // Element-wise, with the folding of known int and bool elements.
        Prim::Neg => unary(p, &args[0], Some(i64::wrapping_neg)),
        Prim::Abs => unary(p, &args[0], Some(i64::wrapping_abs)),
        Prim::Sign => unary(p, &args[0], Some(i64::signum)),
        Prim::Relu => unary(p, &args[0], Some(|v| v.max(0))),
        Prim::Floor | Prim::Ceil => unary(p, &args[0], Some(|v| v)),
        Prim::Not => unary(p, &args[0], Some(|v| (v == 0) as i64)),
        Prim::Exp
        | Prim::Log
        | Prim::Log1p
        | Prim::Tanh
        | Prim::Sigmoid
        | Prim::Sqrt
        | Prim::Rsqrt
        | Prim::Lgamma
        | Prim::Digamma
        | Prim::Trigamma
        | Prim::Erf
        | Prim::Math(_) => unary(p, &args[0], None),
        Prim::Polygamma => {
            let n = int_scalar(op, "order n", &args[0])?;
            let max = adjoint_runtime::kernels::num::POLYGAMMA_MAX_ORDER;
            if let Some(n) = n.scalar_value().filter(|n| !(0..=max as i64).contains(n)) {
                return fail(format!(
                    "{op}: the order n must be between 0 and {max}, got {n}"
                ));
            }
            let x = tensor(op, &args[1])?;
            let (d, w) = dtype::float_operand(op, x.weak_dtype())?;
            Ok(AbsVal::Tensor(AbsTensor::new(d, x.shape.clone(), w)))
        }
        // `+` of two strings joins them.
        Prim::Add if matches!((&args[0], &args[1]), (AbsVal::Str(_), AbsVal::Str(_))) => {
            Ok(match (&args[0], &args[1]) {
                (AbsVal::Str(Some(a)), AbsVal::Str(Some(b))) => {
                    AbsVal::Str(Some(format!("{a}{b}").into()))
                }
                _ => AbsVal::Str(None),
            })
        }
        Prim::Add => binary(p, args, |a, b| Some(a.wrapping_add(b))),
        // `==` and `!=` of two strings compare them (known when both are).
        Prim::Eq | Prim::Ne if matches!((&args[0], &args[1]), (AbsVal::Str(_), AbsVal::Str(_))) => {
            Ok(match (&args[0], &args[1]) {
                (AbsVal::Str(Some(a)), AbsVal::Str(Some(b))) => {
                    AbsVal::bool((a == b) == (p == Prim::Eq))
                }
                _ => AbsVal::Tensor(AbsTensor::new(DType::Bool, vec![], false)),
            })
        }
        Prim::Format => {
            match &args[0] {
                AbsVal::Str(Some(t)) => {
                    let pieces = adjoint_runtime::kernels::text::parse_template(t)
                        .map_err(|e| RuleError::Msg(format!("{op}: {e}")))?;
                    let want = adjoint_runtime::kernels::text::placeholders(&pieces);
                    if want != args.len() - 1 {
                        return fail(format!(
                            "{op}: the template has {want} placeholder{} but {} value{} given",
                            if want == 1 { "" } else { "s" },
                            args.len() - 1,
                            if args.len() == 2 { " was" } else { "s were" }
                        ));
                    }
                }
                AbsVal::Str(None) => {}
                v => return fail(format!("{op}: the template must be a string, got {v}")),
            }
            Ok(AbsVal::Str(None))
        }
        Prim::ParseInt | Prim::ParseFloat => match &args[0] {
            AbsVal::Str(text) => {
                let int = p == Prim::ParseInt;
                // A string known now (a command-line argument) gives a
                // known int, which may decide shapes.
                if let (Some(t), true) = (text, int) {
                    let v: i64 = t
                        .trim()
                        .parse()
                        .map_err(|_| RuleError::Msg(format!("int: {t:?} is not an integer")))?;
                    return Ok(AbsVal::int(v, false));
                }
                if let (Some(t), false) = (text, int) {
                    t.trim()
                        .parse::<f64>()
                        .map_err(|_| RuleError::Msg(format!("float: {t:?} is not a number")))?;
                }
                let d = if int { DType::I64 } else { DType::F64 };
                Ok(AbsVal::Tensor(AbsTensor::new(d, vec![], false)))
            }
            v => fail(format!(
                "{op}: expected a string, got {v} (a tensor converts with {}(x))",
                if p == Prim::ParseInt { "i64" } else { "f64" }
            )),
        },
        Prim::Sub => binary(p, args, |a, b| Some(a.wrapping_sub(b))),
        Prim::Mul => binary(p, args, |a, b| Some(a.wrapping_mul(b))),
        // Not folded where the kernel fails: division by zero, negative powers.
        Prim::Div => binary(p, args, |a, b| (b != 0).then(|| a.wrapping_div(b))),
        Prim::Rem => binary(p, args, |a, b| (b != 0).then(|| a.wrapping_rem(b))),
        Prim::Pow => binary(p, args, |a, b| {
            u32::try_from(b).ok().map(|b| a.wrapping_pow(b))
        }),
        Prim::Maximum => binary(p, args, |a, b| Some(a.max(b))),
        Prim::Minimum => binary(p, args, |a, b| Some(a.min(b))),
        Prim::Eq => binary(p, args, |a, b| Some((a == b) as i64)),
        Prim::Ne => binary(p, args, |a, b| Some((a != b) as i64)),
        Prim::Lt => binary(p, args, |a, b| Some((a < b) as i64)),
        Prim::Le => binary(p, args, |a, b| Some((a <= b) as i64)),
        Prim::Gt => binary(p, args, |a, b| Some((a > b) as i64)),
        Prim::Ge => binary(p, args, |a, b| Some((a >= b) as i64)),
        Prim::And => logic(p, args, false),
        Prim::Or => logic(p, args, true),
        Prim::Where => where_(&args[0], &args[1], &args[2]),
        Prim::Cast => cast(&args[0], &args[1]),
        Prim::Sum | Prim::Mean | Prim::Max | Prim::Min | Prim::Prod | Prim::Argmax => {
            reduce(p, &args[0], &args[1], &args[2])
        }
        Prim::Cumsum | Prim::Cumprod | Prim::Argsort => {
            let x = tensor(op, &args[0])?;
            let axis = if args[1].is_unit() {
                None
            } else {
                Some(known_int(op, "axis", &args[1])?)
            };
            let (shape, _) = shape::scan(op, x.ty(), axis)?;
            let (d, w) = match p {
                Prim::Cumsum => dtype::reduce_result("sum", x.weak_dtype())?,
                Prim::Cumprod => dtype::reduce_result("prod", x.weak_dtype())?,
                _ => (DType::I64, false),
            };
            Ok(AbsVal::Tensor(AbsTensor::new(d, shape, w)))
        }
        Prim::IsUnit => Ok(AbsVal::bool(args[0].is_unit())),
        Prim::IsTuple => Ok(AbsVal::bool(matches!(args[0], AbsVal::Tuple(_)))),
        // The error is the run time's: a branch that fails may be one
        // inference cannot rule out (its condition compares floats, whose
        // values it does not track), so reaching it here proves nothing.
        Prim::Fail => match &args[0] {
            AbsVal::Str(_) => Ok(AbsVal::Bottom),
            other => fail(format!("fail: expected a message, got {other}")),
        },
        Prim::Reshape => {
            let x = tensor(op, &args[0])?;
            let target = known_ints(op, "shape", &args[1])?;
            let shape = shape::reshape(x.ty(), &target)?;
            Ok(like(x, shape, x.value.clone()))
        }
        Prim::Transpose => {
            let x = tensor(op, &args[0])?;
            let perm = opt_known_ints(op, "permutation", &args[1])?;
            let shape = shape::transpose(x.ty(), perm.as_deref())?;
            let value = if x.shape.len() <= 1 {
                x.value.clone()
            } else {
                None
            };
            Ok(like(x, shape, value))
        }
        Prim::BroadcastTo => {
            let x = tensor(op, &args[0])?;
            let target = known_shape(op, &args[1])?;
            let shape = shape::broadcast_to(op, x.ty(), &target)?;
            let value = x
                .value
                .as_ref()
                .and_then(|v| small(&shape).then(|| broadcast_values(&shape, &x.shape, v)));
            Ok(like(x, shape, value.map(Arc::from)))
        }
        Prim::Concat => join_along(op, args, shape::concat),
        Prim::Stack => join_along(op, args, shape::stack),
        Prim::ExpandDims => {
            let x = tensor(op, &args[0])?;
            let axis = known_int(op, "axis", &args[1])?;
            let shape = shape::expand_dims(x.ty(), axis)?;
            Ok(like(x, shape, x.value.clone()))
        }
        Prim::Squeeze => {
            let x = tensor(op, &args[0])?;
            let axes = opt_known_ints(op, "axis", &args[1])?;
            let shape = shape::squeeze(x.ty(), axes.as_deref())?;
            Ok(like(x, shape, x.value.clone()))
        }
        Prim::Take => {
            let x = tensor(op, &args[0])?;
            let idx = tensor(op, &args[1])?;
            let axis = if args[2].is_unit() {
                None
            } else {
                Some(known_int(op, "axis", &args[2])?)
            };
            let shape = shape::take(x.ty(), idx.ty(), axis)?;
            Ok(like(x, shape, None))
        }
        // `shape(x)[0]` as NumPy's `x.shape[0]`: say how a tuple's items
        // are read.
        Prim::Index if matches!(&args[0], AbsVal::Tuple(_)) => {
            let item = match args.get(1) {
                Some(AbsVal::Tensor(t)) if t.shape.is_empty() => t
                    .value
                    .as_ref()
                    .and_then(|v| v.first().copied())
                    .map_or("0".to_string(), |k| k.to_string()),
                _ => "0".to_string(),
            };
            fail(format!(
                "`[..]` indexes tensors, but this is the tuple {}: read an item with `.{item}` (`shape(x).{item}` for NumPy's `x.shape[{item}]`)",
                args[0]
            ))
        }
        Prim::Index => index(ctx, &args[0], &args[1..], arg_nodes_from(ctx, 1)),
        Prim::IndexAt => {
            let (comps, nodes) = index_tuple(ctx, &args[1], 1)?;
            index(ctx, &args[0], comps, nodes)
        }
        Prim::IndexSet | Prim::IndexAdd | Prim::IndexMul | Prim::IndexMin | Prim::IndexMax => {
            let x = tensor(op, &args[0])?;
            let v = tensor(op, &args[2])?;
            let (comps, nodes) = index_tuple(ctx, &args[1], 1)?;
            let AbsVal::Tensor(region) = index(ctx, &args[0], comps, nodes)? else {
                return fail(format!("{op}: expected a tensor, got {}", args[0]));
            };
            shape::broadcast_to(op, v.ty(), &region.shape)?;
            if p != Prim::IndexSet && x.dtype == DType::Bool {
                return fail(format!("{op}: expected a numeric array, got {}", x.ty()));
            }
            Ok(like(x, x.shape.clone(), None))
        }
        Prim::Matmul => contract("`@`", args, shape::matmul),
        Prim::Dot => contract(op, args, shape::dot),
        Prim::Outer => contract(op, args, shape::outer),
        Prim::Solve | Prim::TriangularSolve => {
            let a = float_operand(op, "a", &args[0])?;
            let b = float_operand(op, "b", &args[1])?;
            let plan = shape::solve_plan(op, a.ty(), b.ty())?;
            let (d, w) = dtype::promote(op, a.weak_dtype(), b.weak_dtype())?;
            Ok(AbsVal::Tensor(AbsTensor::new(d, plan.shape, w)))
        }
        Prim::Det | Prim::Slogdet | Prim::Cholesky | Prim::Eigh => {
            let a = float_operand(op, "a", &args[0])?;
            let (batch, n) = shape::square(op, a.ty())?;
            let t = |extra: &[usize]| {
                let mut s = batch.clone();
                s.extend_from_slice(extra);
                AbsVal::Tensor(AbsTensor::new(a.dtype, s, false))
            };
            Ok(match p {
                Prim::Det => t(&[]),
                Prim::Slogdet => AbsVal::Tuple(vec![t(&[]), t(&[])]),
                Prim::Cholesky => t(&[n, n]),
                _ => AbsVal::Tuple(vec![t(&[n]), t(&[n, n])]),
            })
        }
        Prim::Qr => {
            let a = float_operand(op, "a", &args[0])?;
            let (q, r) = shape::qr(a.ty())?;
            Ok(AbsVal::Tuple(vec![
                AbsVal::Tensor(AbsTensor::new(a.dtype, q, false)),
                AbsVal::Tensor(AbsTensor::new(a.dtype, r, false)),
            ]))
        }
        Prim::Shape => {
            let x = tensor(op, &args[0])?;
            Ok(AbsVal::Tuple(
                x.shape
                    .iter()
                    .map(|&d| AbsVal::int(d as i64, true))
                    .collect(),
            ))
        }
        Prim::Size => {
            let x = tensor(op, &args[0])?;
            Ok(AbsVal::int(shape::size(&x.shape) as i64, true))
        }
        Prim::DTypeOf => Ok(AbsVal::DType(tensor(op, &args[0])?.dtype)),
        Prim::Zeros => {
            let shape = known_shape(op, &args[0])?;
            let d = opt_dtype(op, &args[1])?.unwrap_or(DType::F32);
            Ok(filled(d, shape, Some(0)))
        }
        Prim::Ones => {
            let shape = known_shape(op, &args[0])?;
            let d = opt_dtype(op, &args[1])?.unwrap_or(DType::F32);
            Ok(filled(d, shape, Some(1)))
        }
        Prim::Full => {
            let shape = known_shape(op, &args[0])?;
            let v = tensor(op, &args[1])?;
            shape::broadcast_to(op, v.ty(), &shape)?;
            let d = match opt_dtype(op, &args[2])? {
                Some(d) => d,
                None if !v.weak => v.dtype,
                None => DType::F32,
            };
            let fill = v
                .scalar_value()
                .filter(|_| !v.dtype.is_float() && v.shape.is_empty());
            Ok(filled(d, shape, fill))
        }
        Prim::ZerosLike => fill_like(op, &args[0], 0),
        Prim::OnesLike => fill_like(op, &args[0], 1),
        Prim::GradSeed => match &args[0] {
            AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype.is_float() => {
                fill_like(op, &args[0], 1)
            }
            // Not a float scalar: `grad`'s check (crate::checks), which
            // runs after inference and names the function, reports it;
            // the kernel stops a request built at run time.
            _ => Ok(AbsVal::Unknown),
        },
        Prim::Arange => {
            // A negative length gives an empty range, as in the kernel; a
            // float length `n` gives `ceil(n)` floats.
            let (n, default) = match (
                &args[0],
                ctx.arg_nodes.first().and_then(|&a| ctx.module.as_const(a)),
            ) {
                (AbsVal::Tensor(t), Some(Const::Float(x)))
                    if t.shape.is_empty() && t.dtype.is_float() =>
                {
                    if !x.is_finite() || *x > (1u64 << 40) as f64 {
                        return fail(format!("arange: invalid length {x}"));
                    }
                    (x.ceil().max(0.0) as usize, DType::F32)
                }
                (n, _) => (known_int(op, "length", n)?.max(0) as usize, DType::I64),
            };
            let d = opt_dtype(op, &args[1])?.unwrap_or(default);
            let t = AbsTensor::new(d, vec![n], false);
            Ok(AbsVal::Tensor(if n <= MAX_CONST_ELEMS {
                t.with_value((0..n as i64).collect())
            } else {
                t
            }))
        }
        Prim::Eye => {
            let n = known_count(op, "size", &args[0])?;
            let d = opt_dtype(op, &args[1])?.unwrap_or(DType::F32);
            Ok(AbsVal::tensor(d, &[n, n]))
        }
        Prim::OneHot => {
            let labels = tensor(op, &args[0])?;
            let n = known_int(op, "number of classes", &args[1])?;
            let shape = shape::one_hot(labels.ty(), n)?;
            let d = opt_dtype(op, &args[2])?.unwrap_or(DType::F32);
            Ok(AbsVal::tensor(d, &shape))
        }
        Prim::Randn | Prim::Rand => {
            let shape = known_shape(op, &args[0])?;
            seed(op, &args[1])?;
            let d = opt_dtype(op, &args[2])?.unwrap_or(DType::F32);
            if !d.is_float() {
                return fail(format!("{op}: expected a float dtype, got {d}"));
            }
            Ok(AbsVal::tensor(d, &shape))
        }
        Prim::Permutation => {
            let n = known_count(op, "size", &args[0])?;
            seed(op, &args[1])?;
            Ok(AbsVal::tensor(DType::I64, &[n]))
        }
        Prim::MakeTuple => Ok(AbsVal::Tuple(args.to_vec())),
        Prim::TupleGet => tuple_get(&args[0], &args[1]),
        Prim::TupleLen => match &args[0] {
            AbsVal::Tuple(items) => Ok(AbsVal::int(items.len() as i64, true)),
            v => fail(format!("tuple_len: expected a tuple, got {v}")),
        },
        Prim::MakeRecord => make_record(args),
        Prim::RecordGet => record_get(&args[0], &args[1]),
        Prim::TensorLiteral => tensor_literal(args),
        Prim::Switch => switch(ctx, &args[0], &args[1], &args[2]),
        Prim::TreeMap => {
            if args[0] == AbsVal::Unknown {
                // (The caller records the closures in the trees as lost.)
                return Ok(AbsVal::Unknown);
            }
            if !matches!(args[0], AbsVal::Func(_)) {
                return fail(format!("tree_map: expected a function, got {}", args[0]));
            }
            let rest: Vec<&AbsVal> = args[2..].iter().collect();
            let out = tree_map(&args[0], &args[1], &rest, calls)?;
            Ok(if out.any_part(&AbsVal::is_bottom) {
                AbsVal::Bottom
            } else {
                out
            })
        }
        Prim::TreeSum => {
            let mut leaves = Vec::new();
            collect_leaves(&args[0], &mut leaves);
            let mut dtypes = Vec::with_capacity(leaves.len());
            if leaves.contains(&&AbsVal::Unknown) {
                return Ok(AbsVal::Unknown);
            }
            for leaf in leaves {
                let t = tensor(op, leaf)?;
                dtypes.push(dtype::reduce_result("sum", t.weak_dtype())?);
            }
            let (d, w) = dtype::promote_all(op, &dtypes)?;
            Ok(AbsVal::Tensor(AbsTensor::new(d, Vec::new(), w)))
        }
        Prim::StopGradient => Ok(args[0].clone()),
        // vmap: the mapped function sees one lane.
        Prim::VmapLevel => Ok(AbsVal::scalar(DType::I64)),
        Prim::VmapSize => Ok(vmap_size(op, &args[0], &args[1])?),
        Prim::VmapIn => {
            if args[1].is_unit() {
                return Ok(args[0].clone());
            }
            let a = known_int(op, "in_axes", &args[1])?;
            map_tensors(&args[0], &mut |x| {
                let r = x.shape.len() as i64;
                let p = if a < 0 { a + r } else { a };
                if p < 0 || p >= r {
                    return fail(format!("vmap: in_axes {a} for an argument of rank {r}"));
                }
                let mut shape = x.shape.clone();
                shape.remove(p as usize);
                Ok(like(x, shape, None))
            })
        }
        Prim::VmapOut => {
            if args[1].is_unit() {
                return Ok(args[0].clone());
            }
            let a = known_int(op, "out_axes", &args[1])?;
            let Some(n) = args[3].as_tensor().and_then(|t| t.scalar_value()) else {
                return Ok(AbsVal::Unknown);
            };
            map_tensors(&args[0], &mut |y| {
                let r = y.shape.len() as i64;
                let q = if a < 0 { a + r + 1 } else { a };
                if q < 0 || q > r {
                    return fail(format!("vmap: out_axes {a} for a result of rank {r}"));
                }
                let mut shape = y.shape.clone();
                shape.insert(q as usize, n as usize);
                Ok(like(y, shape, None))
            })
        }
        Prim::VmapSum | Prim::VmapFn => Ok(args[0].clone()),
        Prim::Rank => Ok(AbsVal::int(ctx.module.world.rank as i64, false)),
        Prim::WorldSize => Ok(AbsVal::int(ctx.module.world.size as i64, false)),
        Prim::AllReduce => {
            let x = tensor(op, &args[0])?;
            match &args[1] {
                AbsVal::Str(Some(s)) if &**s == "mean" && !x.dtype.is_float() => {
                    return fail(format!(
                        "{op}: the mean of {} needs a float tensor",
                        args[0]
                    ))
                }
                AbsVal::Str(Some(s)) if !["sum", "mean", "max", "min"].contains(&&**s) => {
                    return fail(format!(
                        "{op}: op must be \"sum\", \"mean\", \"max\" or \"min\", not {s:?}"
                    ))
                }
                v => optional_str(op, "op", v)?,
            }
            Ok(collective_result(ctx, x, x.shape.clone()))
        }
        Prim::AllGather | Prim::ReduceScatter => {
            let x = tensor(op, &args[0])?;
            let axis = known_int(op, "axis", &args[1])?;
            let ranks = ctx.module.world.size;
            let (_, shape) = if p == Prim::AllGather {
                shape::all_gather(x.ty(), axis, ranks)?
            } else {
                shape::reduce_scatter(x.ty(), axis, ranks)?
            };
            Ok(collective_result(ctx, x, shape))
        }
        Prim::Broadcast => {
            let x = tensor(op, &args[0])?;
            let root = int_scalar(op, "root", &args[1])?;
            if let Some(r) = root.value.as_deref().and_then(|v| v.first()) {
                if *r < 0 || *r as usize >= ctx.module.world.size {
                    return fail(format!(
                        "{op}: root {r} is not a rank of this world of {}",
                        ctx.module.world.size
                    ));
                }
            }
            Ok(collective_result(ctx, x, x.shape.clone()))
        }
        Prim::JacBasis if has_unknown(&args[0]) => Ok(AbsVal::Unknown),
        Prim::JacReshape if has_unknown(&args[1]) || has_unknown(&args[2]) => Ok(AbsVal::Unknown),
        Prim::JacBasis => {
            let leaves = jac_leaves(op, &args[0], "value")?;
            let m: usize = leaves
                .iter()
                .map(|t| t.shape.iter().product::<usize>())
                .sum();
            let mut rows = leaves.iter().map(|y| {
                let mut shape = vec![m];
                shape.extend_from_slice(&y.shape);
                let d = if y.dtype.is_float() {
                    y.dtype
                } else {
                    DType::F32
                };
                AbsVal::Tensor(AbsTensor::new(d, shape, false))
            });
            Ok(jac_rebuild(&args[0], &mut rows))
        }
        Prim::JacReshape => {
            let ys = jac_leaves(op, &args[1], "value")?;
            let xs = jac_leaves(op, &args[2], "argument")?;
            let size = |t: &AbsTensor| t.shape.iter().product::<usize>();
            let (m, n) = (
                ys.iter().map(size).sum::<usize>(),
                xs.iter().map(size).sum::<usize>(),
            );
            // The blocks' dtype: the rows', else the value's.
            let mut js = Vec::new();
            let mut dtype = None;
            collect_tensors(&args[0], &mut js);
            for j in &js {
                dtype = dtype.or(Some(j.dtype));
            }
            let total: usize = js.iter().map(size).sum();
            if !js.is_empty() && total != m * n {
                return fail(format!(
                    "jacobian: {total} elements of rows do not fit {m} x {n}"
                ));
            }
            let dtype = dtype.unwrap_or_else(|| ys.first().map_or(DType::F64, |t| t.dtype));
            let mut outer = ys.iter().map(|y| {
                let mut inner = xs.iter().map(|x| {
                    let mut shape = y.shape.clone();
                    shape.extend_from_slice(&x.shape);
                    AbsVal::Tensor(AbsTensor::new(dtype, shape, false))
                });
                jac_rebuild(&args[2], &mut inner)
            });
            Ok(jac_rebuild(&args[1], &mut outer))
        }
        Prim::MatrixT => {
            let x = tensor(op, &args[0])?;
            let shape = shape::matrix_t(x.ty())?;
            Ok(like(x, shape, None))
        }
        // Values made by differentiation. A symbolic zero has no static
        // structure (it stands for a zero of any shape), nor do
        // environments: both are `Unknown`, and the rules below let
        // `Unknown` through where the result's type is known anyway.
        Prim::Zero => Ok(AbsVal::Zero),
        // A known tensor is never the symbolic zero.
        Prim::IsZero => Ok(match &args[0] {
            AbsVal::Zero => AbsVal::bool(true),
            AbsVal::Tensor(_) => AbsVal::bool(false),
            _ => AbsVal::scalar(DType::Bool),
        }),
        Prim::GAdd => Ok(gadd(&args[0], &args[1])),
        Prim::EnvSetitem | Prim::EnvGetitem => {
            if args[1] != AbsVal::Unknown {
                int_scalar(op, "key", &args[1])?;
            }
            Ok(AbsVal::Unknown)
        }
        Prim::GradFinalize => {
            if let Some((d, x)) = shape_mismatch(&args[0], &args[1]) {
                return fail(adjoint_runtime::kernels::ad::derivative_shape_message(
                    &d, &x,
                ));
            }
            Ok(finalized(&args[1]))
        }
        Prim::SumTo => {
            let x = tensor(op, &args[0])?;
            let target = tensor(op, &args[1])?;
            let shape = shape::sum_to(x.ty(), target.ty())?;
            Ok(like(x, shape, None))
        }
        Prim::ExtremumMask => {
            let x = tensor(op, &args[0])?;
            let axes = opt_known_ints(op, "axis", &args[1])?;
            shape::reduce_axes(op, x.ty(), axes.as_deref())?;
            match &args[2] {
                v if v.is_unit() => {}
                AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype == DType::Bool => {}
                v => return fail(format!("{op}: is_min must be a bool, got {v}")),
            }
            Ok(like(x, x.shape.clone(), None))
        }
        Prim::TransposeGrad => {
            let d = tensor(op, &args[0])?;
            let perm = opt_known_ints(op, "permutation", &args[1])?;
            let shape = shape::transpose_grad(d.ty(), perm.as_deref())?;
            Ok(like(d, shape, None))
        }
        Prim::SplitLike => {
            let d = tensor(op, &args[0])?;
            let Some(xs) = tensor_tuple(op, &args[1])? else {
                return Ok(AbsVal::Unknown);
            };
            let axis = known_int(op, "axis", &args[2])?;
            let tys: Vec<TensorTy> = xs.iter().map(|t| t.ty()).collect();
            let (_, shapes) = shape::split_like(d.ty(), &tys, axis)?;
            Ok(AbsVal::Tuple(
                shapes.into_iter().map(|s| like(d, s, None)).collect(),
            ))
        }
        Prim::Unstack => {
            let d = tensor(op, &args[0])?;
            let axis = known_int(op, "axis", &args[1])?;
            let (_, n, piece) = shape::unstack(d.ty(), axis)?;
            Ok(AbsVal::Tuple(vec![like(d, piece, None); n]))
        }
        Prim::TakeGrad => {
            let x = tensor(op, &args[0])?;
            let idx = tensor(op, &args[1])?;
            let axis = if args[2].is_unit() {
                None
            } else {
                Some(known_int(op, "axis", &args[2])?)
            };
            let d = tensor(op, &args[3])?;
            let want = shape::take(x.ty(), idx.ty(), axis)?;
            if d.shape != want {
                return fail(format!(
                    "{op}: the gradient {} does not match the shape {} of take",
                    d.ty(),
                    shape::fmt_shape(&want)
                ));
            }
            Ok(like(x, x.shape.clone(), None))
        }
        Prim::IndexGrad => {
            let x = tensor(op, &args[0])?;
            let d = tensor(op, &args[1])?;
            let AbsVal::Tensor(read) = index(ctx, &args[0], &args[2..], arg_nodes_from(ctx, 2))?
            else {
                return fail(format!("{op}: expected a tensor, got {}", args[0]));
            };
            if d.shape != read.shape {
                return fail(format!(
                    "{op}: the gradient {} does not match the shape {} of the index",
                    d.ty(),
                    shape::fmt_shape(&read.shape)
                ));
            }
            Ok(like(x, x.shape.clone(), None))
        }
        Prim::TupleGrad => tuple_grad(&args[0], &args[1], &args[2]),
        Prim::RecordGrad => record_grad(&args[0], &args[1], &args[2]),
        Prim::TreeGAdd => {
            let mut leaves = Vec::new();
            collect_leaves(&args[0], &mut leaves);
            Ok(leaves
                .into_iter()
                .fold(AbsVal::Unknown, |acc, leaf| gadd(&acc, leaf)))
        }
        // A value with no function in it is lifted to itself; a lifted
        // function is a transform built at run time, of unknown type.
        Prim::AdLift => Ok(if args[0].has_function_or_unknown() {
            AbsVal::Unknown
        } else {
            args[0].clone()
        }),
        Prim::AdDyn | Prim::AdHide => Ok(AbsVal::Unknown),
        Prim::AdKey => Ok(args[0].clone()),
        Prim::TreeFill => {
            let d = tensor(op, &args[1])?;
            if shape::size(&d.shape) != 1 {
                return fail(format!("{op}: expected a scalar, got {}", d.ty()));
            }
            filled_tree(&args[0])
        }
        Prim::Print => {
            io_token(op, &args[0])?;
            Ok(AbsVal::Io)
        }
        Prim::LoadNpy | Prim::LoadCsv | Prim::LoadSafetensors => {
            // Without a loader, or for a path known only at run time, the
            // data's type is known only at run time.
            io_token(op, &args[0])?;
            let data = match (&args[1], ctx.load_type) {
                (AbsVal::Str(Some(path)), Some(load)) => load(p, path).map_err(RuleError::Msg)?,
                (AbsVal::Str(_) | AbsVal::Unknown, _) => AbsVal::Unknown,
                (v, _) => return fail(format!("{op}: expected a string, got {v}")),
            };
            Ok(AbsVal::Tuple(vec![AbsVal::Io, data]))
        }
        Prim::SaveNpy => {
            io_token(op, &args[0])?;
            path_arg(op, &args[1])?;
            if args[2] != AbsVal::Unknown {
                tensor(op, &args[2])?;
            }
            Ok(AbsVal::Io)
        }
        Prim::SaveSafetensors => {
            io_token(op, &args[0])?;
            path_arg(op, &args[1])?;
            match &args[2] {
                AbsVal::Record(_) | AbsVal::Unknown => {
                    saved_tree(op, &args[2])?;
                    Ok(AbsVal::Io)
                }
                v => fail(format!("{op}: expected a record of tensors, got {v}")),
            }
        }
        Prim::ProgressStart => {
            io_token(op, &args[0])?;
            for (v, what) in [(&args[1], "start"), (&args[2], "end")] {
                if *v != AbsVal::Unknown {
                    int_scalar(op, what, v)?;
                }
            }
            Ok(AbsVal::Io)
        }
        Prim::ProgressStep => {
            io_token(op, &args[0])?;
            if args[1] != AbsVal::Unknown {
                int_scalar(op, "counter", &args[1])?;
            }
            Ok(AbsVal::Io)
        }
        Prim::ProgressEnd | Prim::ProgressNote => {
            io_token(op, &args[0])?;
            Ok(AbsVal::Io)
        }
        Prim::SaveCsv => {
            io_token(op, &args[0])?;
            path_arg(op, &args[1])?;
            if args[2] != AbsVal::Unknown {
                let t = tensor(op, &args[2])?;
                if t.shape.len() > 2 {
                    return fail(format!(
                        "{op}: expected a tensor of one or two dimensions, got {}",
                        t.ty()
                    ));
                }
            }
            optional_str(op, "the header", &args[3])?;
            Ok(AbsVal::Io)
        }
        Prim::Plot => {
            io_token(op, &args[0])?;
            if args[1] != AbsVal::Unknown {
                let t = tensor(op, &args[1])?;
                if t.shape.len() > 2 || t.dtype == DType::Bool {
                    return fail(format!(
                        "{op}: expected numbers in one or two dimensions, got {}",
                        t.ty()
                    ));
                }
            }
            optional_str(op, "the title", &args[2])?;
            Ok(AbsVal::Io)
        }
    }
}

/// Primitives whose rule accepts `Unknown` arguments: those that build
/// structures, select a branch, call a function (`tree_map` must call it
/// even on trees of unknown type, or the calls it makes at run time go
/// unseen), or thread the IO token, and the
/// differentiation helpers whose result type does not depend on the
/// cotangent they take (`grad_finalize`, `tuple_grad`, ...) or that treat
/// `Unknown` as the symbolic zero (`gadd`).
fn keeps_unknown(p: Prim) -> bool {
    match p.category() {
        Category::Io => true,
        Category::Control => matches!(p, Prim::Switch | Prim::TreeMap),
        Category::Struct => matches!(
            p,
            Prim::MakeTuple
                | Prim::MakeRecord
                | Prim::Zero
                | Prim::IsZero
                | Prim::GAdd
                | Prim::EnvSetitem
                | Prim::EnvGetitem
                | Prim::GradFinalize
                | Prim::TupleGrad
                | Prim::RecordGrad
        ),
        Category::Map
        | Category::Reindex
        | Category::Reduce
        | Category::Contract
        | Category::Create => false,
    }
}

/// Primitives whose rule takes the symbolic zero ([`AbsVal::Zero`]) as
/// itself: those that build and take apart structures, choose, and the
/// tests and sums of differentiation. (A projection of the zero itself is
/// unknown.)
fn takes_zero(p: Prim) -> bool {
    matches!(
        p,
        Prim::MakeTuple
            | Prim::MakeRecord
            | Prim::TupleGet
            | Prim::RecordGet
            | Prim::Switch
            | Prim::Zero
            | Prim::IsZero
            | Prim::GAdd
            | Prim::GradFinalize
            | Prim::TupleGrad
            | Prim::RecordGrad
    )
}

fn check_arity(p: Prim, n: usize) -> Result<(), RuleError> {
    let info = p.info();
    let want = info.params.len();
    if n == want || (info.variadic && n > want) {
        Ok(())
    } else if info.variadic {
        fail(format!("{p}: expected at least {want} arguments, got {n}"))
    } else {
        fail(format!("{p}: expected {want} arguments, got {n}"))
    }
}

// ---------------------------------------------------------------------------
// Argument helpers

/// The tensors of a tuple of tensors; `None` when one is only known at run
/// time.
fn tensor_tuple<'v>(op: &str, v: &'v AbsVal) -> Result<Option<Vec<&'v AbsTensor>>, RuleError> {
    let AbsVal::Tuple(items) = v else {
        return fail(format!("{op}: expected a tuple of tensors, got {v}"));
    };
    if items.contains(&AbsVal::Unknown) {
        return Ok(None);
    }
    items
        .iter()
        .map(|x| tensor(op, x))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A float tensor operand of a matrix decomposition.
fn float_operand<'v>(op: &str, what: &str, v: &'v AbsVal) -> Result<&'v AbsTensor, RuleError> {
    let t = tensor(op, v)?;
    if !t.dtype.is_float() {
        return fail(format!(
            "{op}: {what} must be a float tensor, got {}",
            t.ty()
        ));
    }
    Ok(t)
}

fn tensor<'v>(op: &str, v: &'v AbsVal) -> Result<&'v AbsTensor, RuleError> {
    match v {
        AbsVal::Tensor(t) => Ok(t),
        _ => fail(format!("{op}: expected a tensor, got {v}")),
    }
}

/// A tensor like `x` (dtype, weak flag) with another shape and value.
/// `f` applied to every tensor leaf of tuples and records.
fn map_tensors(v: &AbsVal, f: &mut dyn FnMut(&AbsTensor) -> Rule) -> Rule {
    match v {
        AbsVal::Tensor(t) => f(t),
        AbsVal::Tuple(items) => Ok(AbsVal::Tuple(
            items
                .iter()
                .map(|x| map_tensors(x, f))
                .collect::<Result<_, _>>()?,
        )),
        AbsVal::Record(fields) => Ok(AbsVal::Record(
            fields
                .iter()
                .map(|(n, x)| Ok((n.clone(), map_tensors(x, f)?)))
                .collect::<Result<_, RuleError>>()?,
        )),
        AbsVal::Zero | AbsVal::Unknown | AbsVal::Bottom => Ok(v.clone()),
        other => fail(format!("vmap: cannot map over {other}")),
    }
}

fn abs_leaves<'a>(v: &'a AbsVal, out: &mut Vec<&'a AbsVal>) {
    match v {
        AbsVal::Tuple(items) => items.iter().for_each(|x| abs_leaves(x, out)),
        AbsVal::Record(fields) => fields.iter().for_each(|(_, x)| abs_leaves(x, out)),
        other => out.push(other),
    }
}

/// The length of the mapped axes of `vmap`'s arguments, known when their
/// shapes are.
fn vmap_size(op: &str, xs: &AbsVal, axes: &AbsVal) -> Rule {
    let (AbsVal::Tuple(xs), AbsVal::Tuple(axes)) = (xs, axes) else {
        return Ok(AbsVal::scalar(DType::I64));
    };
    let mut mapped = Vec::new();
    for (i, (x, ax)) in xs.iter().zip(axes).enumerate() {
        if ax.is_unit() {
            continue;
        }
        let a = known_int(op, "in_axes", ax)?;
        let mut leaves = Vec::new();
        abs_leaves(x, &mut leaves);
        for leaf in leaves {
            let AbsVal::Tensor(t) = leaf else {
                return Ok(AbsVal::scalar(DType::I64));
            };
            mapped.push((i, t.shape.as_slice(), a));
        }
    }
    match shape::mapped_len(&mapped)? {
        Some(d) => Ok(AbsVal::Tensor(
            AbsTensor::new(DType::I64, Vec::new(), false).with_value(vec![d as i64]),
        )),
        None => fail("vmap: no argument is mapped (every in_axes is None)"),
    }
}

/// The result of a collective: of `x`'s dtype, its value known only in a
/// world of one process (where every collective is the identity).
fn collective_result(ctx: &RuleCtx, x: &AbsTensor, shape: Vec<usize>) -> AbsVal {
    let value = if ctx.module.world.size == 1 {
        x.value.clone()
    } else {
        None
    };
    let mut t = AbsTensor::new(x.dtype, shape, false);
    t.value = value;
    AbsVal::Tensor(t)
}

fn like(x: &AbsTensor, shape: Vec<usize>, value: Option<Arc<[i64]>>) -> AbsVal {
    let mut t = AbsTensor::new(x.dtype, shape, x.weak);
    t.value = value;
    AbsVal::Tensor(t)
}

/// Whether a tensor of this shape is small enough to keep its value.
fn small(shape: &[usize]) -> bool {
    shape::checked_size(shape).is_some_and(|n| n <= MAX_CONST_ELEMS)
}

/// A tensor of `shape` whose elements are all `fill` (when known and the
/// dtype keeps values).
fn filled(d: DType, shape: Vec<usize>, fill: Option<i64>) -> AbsVal {
    let n = shape::size(&shape);
    let t = AbsTensor::new(d, shape, false);
    AbsVal::Tensor(match fill {
        Some(v) if n <= MAX_CONST_ELEMS => t.with_value(vec![v; n]),
        _ => t,
    })
}

/// `x`'s type (weak flag included) filled with `v`.
fn fill_like(op: &str, x: &AbsVal, v: i64) -> Rule {
    let x = tensor(op, x)?;
    let mut t = AbsTensor::new(x.dtype, x.shape.clone(), x.weak);
    if small(&x.shape) {
        t = t.with_value(vec![v; shape::size(&x.shape)]);
    }
    Ok(AbsVal::Tensor(t))
}

fn int_scalar<'v>(op: &str, what: &str, v: &'v AbsVal) -> Result<&'v AbsTensor, RuleError> {
    match v {
        AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype.is_int() => Ok(t),
        _ => fail(format!("{op}: the {what} must be an int, got {v}")),
    }
}

/// A seed: an int, or `()` for the default.
fn seed(op: &str, v: &AbsVal) -> Result<(), RuleError> {
    if !v.is_unit() {
        int_scalar(op, "seed", v)?;
    }
    Ok(())
}

/// An int argument that must be known at compile time (an axis, a count).
fn known_int(op: &str, what: &str, v: &AbsVal) -> Result<i64, RuleError> {
    int_scalar(op, what, v)?
        .scalar_value()
        .ok_or_else(|| RuleError::Msg(format!("the {what} of {op} must be known at compile time")))
}

/// A non-negative int known at compile time (a length).
fn known_count(op: &str, what: &str, v: &AbsVal) -> Result<usize, RuleError> {
    let n = known_int(op, what, v)?;
    usize::try_from(n).or_else(|_| fail(format!("{op}: the {what} must be >= 0, got {n}")))
}

/// A bool known at compile time; `()` gives `default`.
fn bool_const(op: &str, what: &str, v: &AbsVal, default: bool) -> Result<bool, RuleError> {
    match v {
        _ if v.is_unit() => Ok(default),
        AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype == DType::Bool => t
            .scalar_value()
            .map(|b| b != 0)
            .ok_or_else(|| RuleError::Msg(format!("{what} of {op} must be known at compile time"))),
        _ => fail(format!("{op}: {what} must be a bool, got {v}")),
    }
}

/// The ints of a shape, axes or permutation argument: an int tensor of rank
/// at most 1, or a tuple of int scalars (as `shape(x)` gives). `Ok(None)`
/// when they are not known.
fn ints(op: &str, what: &str, v: &AbsVal) -> Result<Option<Vec<i64>>, RuleError> {
    match v {
        AbsVal::Tensor(t) if t.shape.len() <= 1 && t.dtype.is_int() => {
            Ok(t.value.as_ref().map(|v| v.to_vec()))
        }
        // `[]`: an empty literal (weakly typed f64)
        AbsVal::Tensor(t) if t.shape == [0] => Ok(Some(Vec::new())),
        AbsVal::Tuple(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype.is_int() => {
                        match t.scalar_value() {
                            Some(i) => out.push(i),
                            None => return Ok(None),
                        }
                    }
                    _ => return fail(format!("{op}: the {what} must be ints, got {v}")),
                }
            }
            Ok(Some(out))
        }
        _ => fail(format!("{op}: the {what} must be ints, got {v}")),
    }
}

fn known_ints(op: &str, what: &str, v: &AbsVal) -> Result<Vec<i64>, RuleError> {
    ints(op, what, v)?
        .ok_or_else(|| RuleError::Msg(format!("the {what} of {op} must be known at compile time")))
}

/// Optional ints: `()` is "omitted", a single int is a list of one.
fn opt_known_ints(op: &str, what: &str, v: &AbsVal) -> Result<Option<Vec<i64>>, RuleError> {
    if v.is_unit() {
        return Ok(None);
    }
    if let AbsVal::Tensor(t) = v {
        if t.shape.is_empty() && t.dtype.is_int() {
            return known_int(op, what, v).map(|i| Some(vec![i]));
        }
    }
    known_ints(op, what, v).map(Some)
}

/// A shape known at compile time, every dimension non-negative.
fn known_shape(op: &str, v: &AbsVal) -> Result<Vec<usize>, RuleError> {
    let dims = known_ints(op, "shape", v)?;
    let shape = dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .or_else(|_| fail(format!("{op}: dimensions must be >= 0, got {dims:?}")))?;
    if shape::checked_size(&shape).is_none() {
        return fail(format!(
            "{op}: shape {} is too large",
            shape::fmt_shape(&shape)
        ));
    }
    Ok(shape)
}

fn opt_dtype(op: &str, v: &AbsVal) -> Result<Option<DType>, RuleError> {
    match v {
        AbsVal::DType(d) => Ok(Some(*d)),
        _ if v.is_unit() => Ok(None),
        _ => fail(format!("{op}: expected a dtype, got {v}")),
    }
}

/// A path: a string, or a value known only at run time.
fn path_arg(op: &str, v: &AbsVal) -> Result<(), RuleError> {
    match v {
        AbsVal::Str(_) | AbsVal::Unknown => Ok(()),
        _ => fail(format!("{op}: expected a string, got {v}")),
    }
}

/// A tree of records and tuples with tensors at its leaves (what
/// `save_safetensors` writes).
fn saved_tree(op: &str, v: &AbsVal) -> Result<(), RuleError> {
    match v {
        AbsVal::Record(fields) => fields.iter().try_for_each(|(_, x)| saved_tree(op, x)),
        AbsVal::Tuple(items) if !items.is_empty() => {
            items.iter().try_for_each(|x| saved_tree(op, x))
        }
        AbsVal::Unknown => Ok(()),
        v => tensor(op, v).map(|_| ()),
    }
}

/// An omitted optional string (`()`) or a string.
fn optional_str(op: &str, what: &str, v: &AbsVal) -> Result<(), RuleError> {
    match v {
        AbsVal::Str(_) | AbsVal::Unknown => Ok(()),
        AbsVal::Tuple(items) if items.is_empty() => Ok(()),
        _ => fail(format!("{op}: expected a string for {what}, got {v}")),
    }
}

fn io_token(op: &str, v: &AbsVal) -> Result<(), RuleError> {
    match v {
        AbsVal::Io => Ok(()),
        _ => fail(format!(
            "{op}: expected the io token as first argument, got {v}"
        )),
    }
}

// ---------------------------------------------------------------------------
// Element-wise primitives

/// An element-wise unary primitive; `fold` computes known int and bool
/// elements when the dtype does not change.
fn unary(p: Prim, x: &AbsVal, fold: Option<fn(i64) -> i64>) -> Rule {
    let op = p.name();
    let x = tensor(op, x)?;
    let (d, w) = dtype::unary_result(op, x.weak_dtype())?;
    let mut out = AbsTensor::new(d, x.shape.clone(), w);
    if let (Some(v), Some(f), true) = (&x.value, fold, d == x.dtype) {
        out = out.with_value(v.iter().map(|&e| f(e)).collect());
    }
    Ok(AbsVal::Tensor(out))
}

/// The index into a tensor of shape `in_shape` of the element that
/// broadcasts to linear position `lin` of a tensor of shape `out`.
fn broadcast_source(out: &[usize], in_shape: &[usize], mut lin: usize) -> usize {
    let mut src = 0;
    let mut stride = 1;
    for k in 1..=out.len() {
        let d = out[out.len() - k];
        let i = lin % d.max(1);
        lin /= d.max(1);
        if k <= in_shape.len() {
            let e = in_shape[in_shape.len() - k];
            if e != 1 {
                src += i * stride;
            }
            stride *= e;
        }
    }
    src
}

fn broadcast_values(out: &[usize], in_shape: &[usize], v: &[i64]) -> Vec<i64> {
    (0..shape::size(out))
        .map(|i| v[broadcast_source(out, in_shape, i)])
        .collect()
}

/// Folds `f` element-wise over broadcast operands, or `None` if an element
/// does not fold.
fn fold_elements(
    out: &[usize],
    operands: &[(&[usize], &[i64])],
    f: impl Fn(&[i64]) -> Option<i64>,
) -> Option<Vec<i64>> {
    if !small(out) {
        return None;
    }
    let mut args = vec![0; operands.len()];
    (0..shape::size(out))
        .map(|i| {
            for (a, (s, v)) in args.iter_mut().zip(operands) {
                *a = v[broadcast_source(out, s, i)];
            }
            f(&args)
        })
        .collect()
}

/// An element-wise binary primitive (broadcasting, weak literal typing);
/// `fold` computes known int and bool elements (`None`: not folded).
fn binary(p: Prim, args: &[AbsVal], fold: fn(i64, i64) -> Option<i64>) -> Rule {
    let op = p.name();
    let (x, y) = (tensor(op, &args[0])?, tensor(op, &args[1])?);
    let (operand, _) = dtype::binary_operands(op, x.weak_dtype(), y.weak_dtype())?;
    let (d, w) = dtype::binary_result(op, x.weak_dtype(), y.weak_dtype())?;
    let shape = shape::broadcast(op, x.ty(), y.ty())?;
    let mut out = AbsTensor::new(d, shape, w);
    if let (Some(xv), Some(yv), false) = (&x.value, &y.value, operand.is_float()) {
        let folded = fold_elements(&out.shape, &[(&x.shape, xv), (&y.shape, yv)], |e| {
            fold(wrap(operand, e[0]), wrap(operand, e[1])).map(|r| wrap(operand, r))
        });
        if let Some(v) = folded {
            out = out.with_value(v);
        }
    }
    Ok(AbsVal::Tensor(out))
}

/// `and` (`or`): folded when both operands are known, and also when one
/// is known to be all false (all true), whatever the other is: a loop
/// `while s < tol && i < n` then stops at `i == n` for inference too.
fn logic(p: Prim, args: &[AbsVal], absorbing: bool) -> Rule {
    let fold: fn(i64, i64) -> Option<i64> = if absorbing {
        |a, b| Some((a != 0 || b != 0) as i64)
    } else {
        |a, b| Some((a != 0 && b != 0) as i64)
    };
    let r = binary(p, args, fold)?;
    let AbsVal::Tensor(out) = r else { return Ok(r) };
    if out.value.is_some() || out.dtype != DType::Bool {
        return Ok(AbsVal::Tensor(out));
    }
    let decides = |v: &AbsVal| {
        v.as_tensor()
            .and_then(|t| t.value.as_ref())
            .is_some_and(|vs| !vs.is_empty() && vs.iter().all(|&e| (e != 0) == absorbing))
    };
    if args.iter().any(decides) {
        let n: usize = out.shape.iter().product();
        return Ok(AbsVal::Tensor(out.with_value(vec![absorbing as i64; n])));
    }
    Ok(AbsVal::Tensor(out))
}

fn where_(c: &AbsVal, a: &AbsVal, b: &AbsVal) -> Rule {
    let op = "where";
    let (c, x, y) = (tensor(op, c)?, tensor(op, a)?, tensor(op, b)?);
    let (d, w) = dtype::where_result(c.weak_dtype(), x.weak_dtype(), y.weak_dtype())?;
    let shape = shape::broadcast_all(op, &[c.ty(), x.ty(), y.ty()])?;
    let mut out = AbsTensor::new(d, shape, w);
    if let (Some(cv), Some(xv), Some(yv), false) = (&c.value, &x.value, &y.value, d.is_float()) {
        let ops = [(&c.shape[..], &cv[..]), (&x.shape, xv), (&y.shape, yv)];
        if let Some(v) = fold_elements(&out.shape, &ops, |e| {
            Some(if e[0] != 0 { e[1] } else { e[2] })
        }) {
            out = out.with_value(v);
        }
    }
    Ok(AbsVal::Tensor(out))
}

fn cast(x: &AbsVal, d: &AbsVal) -> Rule {
    let x = tensor("cast", x)?;
    let AbsVal::DType(d) = d else {
        return fail(format!("cast: expected a dtype, got {d}"));
    };
    let out = AbsTensor::new(*d, x.shape.clone(), false);
    Ok(AbsVal::Tensor(match (&x.value, x.dtype.is_float()) {
        (Some(v), false) => out.with_value(v.to_vec()),
        _ => out,
    }))
}

// ---------------------------------------------------------------------------
// Reductions, reindexing, contractions

fn reduce(p: Prim, x: &AbsVal, axis: &AbsVal, keepdims: &AbsVal) -> Rule {
    let op = p.name();
    let x = tensor(op, x)?;
    let axes = opt_known_ints(op, "axis", axis)?;
    let keep = bool_const(op, "keepdims", keepdims, false)?;
    if let (Prim::Argmax, Some(a)) = (p, &axes) {
        if a.len() != 1 {
            return fail(format!("argmax: expected one axis, got {}", a.len()));
        }
    }
    let (d, w) = dtype::reduce_result(op, x.weak_dtype())?;
    let shape = shape::reduce(op, x.ty(), axes.as_deref(), keep)?;
    Ok(AbsVal::Tensor(AbsTensor::new(d, shape, w)))
}

/// `concat` or `stack` (shape rule `rule`) of the tuple `args[0]` along
/// the axis `args[1]`.
fn join_along(
    op: &str,
    args: &[AbsVal],
    rule: fn(&[TensorTy], i64) -> Result<Vec<usize>, String>,
) -> Rule {
    let (xs, axis) = (&args[0], &args[1]);
    let Some(ts) = tensor_tuple(op, xs)? else {
        return Ok(AbsVal::Unknown);
    };
    let axis = known_int(op, "axis", axis)?;
    let tys: Vec<TensorTy> = ts.iter().map(|t| t.ty()).collect();
    let dts: Vec<(DType, bool)> = ts.iter().map(|t| t.weak_dtype()).collect();
    let (d, w) = dtype::promote_all(op, &dts)?;
    let shape = rule(&tys, axis)?;
    let ndim = shape.len();
    let mut out = AbsTensor::new(d, shape, w);
    // Along the first axis the elements are the operands' one after another.
    if shape::normalize_axis(axis, ndim) == Some(0) && !d.is_float() {
        let values: Option<Vec<i64>> = ts
            .iter()
            .map(|t| t.value.as_ref().map(|v| v.to_vec()))
            .collect::<Option<Vec<_>>>()
            .map(|vs| vs.concat());
        if let Some(v) = values {
            out = out.with_value(v);
        }
    }
    Ok(AbsVal::Tensor(out))
}

/// A matrix product whose shape rule is `rule`; `op` is its name in messages.
fn contract(
    op: &str,
    args: &[AbsVal],
    rule: fn(TensorTy, TensorTy) -> Result<Vec<usize>, String>,
) -> Rule {
    let (x, y) = (tensor(op, &args[0])?, tensor(op, &args[1])?);
    if x.dtype == DType::Bool || y.dtype == DType::Bool {
        return fail(format!(
            "{op}: expected numeric operands, got {} and {}",
            x.ty(),
            y.ty()
        ));
    }
    let (d, w) = dtype::promote(op, x.weak_dtype(), y.weak_dtype())?;
    let shape = rule(x.ty(), y.ty())?;
    Ok(AbsVal::Tensor(AbsTensor::new(d, shape, w)))
}

/// A slice bound: omitted (`()`), a known int, or an int known only at run
/// time.
enum Bound {
    Known(Option<i64>),
    Dynamic,
}

fn bound(v: &AbsVal) -> Result<Bound, RuleError> {
    if v.is_unit() {
        return Ok(Bound::Known(None));
    }
    let t = int_scalar("index", "slice bound", v)?;
    Ok(t.scalar_value()
        .map_or(Bound::Dynamic, |i| Bound::Known(Some(i))))
}

/// The slice `e : e + c` of index component `items` (computed by `node`):
/// the node of `e`, when known, and `c`. Lowering gives such a slice its
/// length as a third element, known wherever `c` is, even after `e` passed
/// through parameters; in IR without it, `node` is looked at for
/// `make_tuple(lo, add(lo', c))`.
fn window(ctx: &RuleCtx, node: Option<NodeId>, items: &[AbsVal]) -> Option<(Option<NodeId>, i64)> {
    let m = ctx.module;
    let parts = node
        .filter(|n| m.applied_prim(*n) == Some(Prim::MakeTuple))
        .map(|n| &m.inputs(n)[1..]);
    let lo = parts.and_then(|p| p.first().copied());
    if let Some(c) = items.get(2).and_then(AbsVal::const_int) {
        return Some((lo, c));
    }
    let &[lo, hi] = parts? else {
        return None;
    };
    let c = window_len(m, lo, hi)?;
    let c = match m.as_const(c) {
        Some(Const::Int(c)) => Some(*c),
        _ => (ctx.value_of)(c).and_then(|v| v.const_int()),
    }?;
    Some((Some(lo), c))
}

/// One index component, twice: as the shape rule must see it (an index or
/// slice start computed from values the function was specialised on is
/// dynamic: checked at run time), and with every known value (to fold the
/// elements of constant tensors).
fn index_comp(
    ctx: &RuleCtx,
    v: &AbsVal,
    node: Option<NodeId>,
) -> Result<(IndexComp, Option<IndexComp>), RuleError> {
    let is_static = |n: Option<NodeId>| n.is_none_or(|n| provenance::is_static(ctx.module, n));
    match v {
        AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype.is_int() => {
            let k = t.scalar_value();
            let known = k.map(|k| IndexComp::At(Some(k)));
            Ok((IndexComp::At(k.filter(|_| is_static(node))), known))
        }
        AbsVal::Tuple(items) if items.len() == 2 || items.len() == 3 => {
            let (lo, hi) = (bound(&items[0])?, bound(&items[1])?);
            let win = window(ctx, node, items);
            let known = match (&lo, &hi) {
                (Bound::Known(l), Bound::Known(h)) => Some(IndexComp::Slice(*l, *h)),
                _ => None,
            };
            match (win, known) {
                (Some((_, c)), _) if c < 0 => fail(format!("index: slice length {c} is negative")),
                (Some((lo_node, c)), known) if known.is_none() || !is_static(lo_node) => {
                    Ok((IndexComp::Window(c as usize), known))
                }
                (_, Some(k)) => Ok((k, Some(k))),
                _ => fail(
                    "index: slice bounds must be known at compile time, or have the form `e : e + c` \
                     with a constant `c`",
                ),
            }
        }
        _ => {
            // `take` gathers by a tensor of ints; a float index needs a cast.
            let hint = match v {
                AbsVal::Tensor(t) if t.dtype.is_int() => {
                    "; to gather by a tensor of indices, use take(x, idx, axis = ..)"
                }
                AbsVal::Tensor(t) if t.dtype.is_float() => {
                    "; convert a computed index with i64(..)"
                }
                _ => "",
            };
            fail(format!(
                "index: each index must be an int or a slice, got {v}{hint}"
            ))
        }
    }
}

/// The elements of `x[steps]` from the row-major elements of `x`.
fn gather(shape: &[usize], values: &[i64], steps: &[IndexStep]) -> Vec<i64> {
    let strides = shape::strides(shape);
    let mut offsets = vec![0usize];
    for (step, &stride) in steps.iter().zip(&strides) {
        offsets = match *step {
            IndexStep::At(i) => offsets.iter().map(|o| o + i * stride).collect(),
            IndexStep::Range { start, len } => offsets
                .iter()
                .flat_map(|o| (start..start + len).map(move |j| o + j * stride))
                .collect(),
        };
    }
    offsets.iter().map(|&o| values[o]).collect()
}

/// The argument nodes of the application from position `first` (the
/// components of `index` from 1, of `index_grad` from 2).
fn arg_nodes_from<'a>(ctx: &RuleCtx<'a>, first: usize) -> &'a [NodeId] {
    ctx.arg_nodes.get(first..).unwrap_or(&[])
}

/// The components of the index tuple `idx`, argument `at` of the
/// application (`index_at` and the updates), with their nodes when the
/// tuple is made there (else none: a component's node tells whether it is
/// static and a slice `e : e + c` its length, which a 3-tuple also carries).
fn index_tuple<'a>(
    ctx: &RuleCtx<'a>,
    idx: &'a AbsVal,
    at: usize,
) -> Result<(&'a [AbsVal], &'a [NodeId]), RuleError> {
    let AbsVal::Tuple(items) = idx else {
        return fail(format!(
            "index: expected a tuple of index components, got {idx}"
        ));
    };
    let m = ctx.module;
    let nodes = ctx
        .arg_nodes
        .get(at)
        .copied()
        .filter(|n| m.applied_prim(*n) == Some(Prim::MakeTuple))
        .map_or(&[][..], |n| &m.inputs(n)[1..]);
    Ok((items, nodes))
}

/// `x[comps..]`; `nodes` are the components' nodes, where known.
fn index(ctx: &RuleCtx, x: &AbsVal, comps: &[AbsVal], nodes: &[NodeId]) -> Rule {
    let x = tensor("index", x)?;
    let (comps, known): (Vec<IndexComp>, Vec<Option<IndexComp>>) = comps
        .iter()
        .enumerate()
        .map(|(i, v)| index_comp(ctx, v, nodes.get(i).copied()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    let shape = shape::index(x.ty(), &comps)?;
    let known: Option<Vec<IndexComp>> = known.into_iter().collect();
    let value = match (&x.value, known) {
        (Some(v), Some(known)) => shape::resolve_index(x.ty(), &known)
            .ok()
            .map(|steps| Arc::from(gather(&x.shape, v, &steps))),
        _ => None,
    };
    Ok(like(x, shape, value))
}

// ---------------------------------------------------------------------------
// Tuples, records, literals

fn tuple_get(t: &AbsVal, i: &AbsVal) -> Rule {
    let AbsVal::Tuple(items) = t else {
        return fail(format!("tuple_get: expected a tuple, got {t}"));
    };
    let i = int_scalar("tuple_get", "index", i)?;
    match i.scalar_value() {
        Some(k) => {
            // A negative index counts from the end, as in the kernel.
            let n = items.len() as i64;
            let j = if k < 0 { k + n } else { k };
            if (0..n).contains(&j) {
                Ok(items[j as usize].clone())
            } else {
                fail(format!(
                    "index {k} is out of range for a tuple of {n} elements: {t}"
                ))
            }
        }
        None => {
            let mut acc = AbsVal::Bottom;
            for item in items {
                acc = join(&acc, item).ok_or_else(|| {
                    RuleError::Msg(format!(
                        "tuple_get: the index must be known at compile time for {t}, whose elements have different types"
                    ))
                })?;
            }
            if items.is_empty() {
                return fail("index out of range for the empty tuple ()");
            }
            Ok(acc)
        }
    }
}

fn make_record(args: &[AbsVal]) -> Rule {
    if !args.len().is_multiple_of(2) {
        return fail("make_record: expected name and value pairs");
    }
    let mut fields: Vec<(Arc<str>, AbsVal)> = Vec::with_capacity(args.len() / 2);
    for pair in args.chunks(2) {
        let AbsVal::Str(Some(name)) = &pair[0] else {
            return fail(format!(
                "make_record: field names must be known strings, got {}",
                pair[0]
            ));
        };
        if fields.iter().any(|(n, _)| n == name) {
            return fail(format!("make_record: field `{name}` is repeated"));
        }
        fields.push((name.clone(), pair[1].clone()));
    }
    Ok(AbsVal::Record(fields))
}

fn record_get(r: &AbsVal, name: &AbsVal) -> Rule {
    let AbsVal::Str(Some(name)) = name else {
        return fail(format!(
            "record_get: the field name must be a known string, got {name}"
        ));
    };
    match r {
        AbsVal::Record(fields) => fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| RuleError::Msg(format!("record {r} has no field `{name}`"))),
        _ => fail(format!("cannot get field `{name}` of a value of type {r}")),
    }
}

fn tensor_literal(args: &[AbsVal]) -> Rule {
    let op = "tensor literal";
    let ts = args
        .iter()
        .map(|v| match v {
            AbsVal::Tensor(t) => Ok(t),
            _ => fail(format!(
                "{op}: elements must be numbers or tensors, got {v}"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dts: Vec<(DType, bool)> = ts.iter().map(|t| t.weak_dtype()).collect();
    let (d, w) = dtype::promote_all(op, &dts)?;
    if ts.is_empty() {
        return Ok(AbsVal::Tensor(AbsTensor::new(d, vec![0], w)));
    }
    if let Some(t) = ts.iter().find(|t| t.shape != ts[0].shape) {
        return fail(format!(
            "{op}: elements have different shapes {} and {}",
            ts[0].ty(),
            t.ty()
        ));
    }
    let mut shape = vec![ts.len()];
    shape.extend_from_slice(&ts[0].shape);
    let out = AbsTensor::new(d, shape, w);
    let values: Option<Vec<i64>> = ts
        .iter()
        .map(|t| t.value.as_ref().map(|v| v.to_vec()))
        .collect::<Option<Vec<_>>>()
        .map(|vs| vs.concat());
    Ok(AbsVal::Tensor(match values {
        Some(v) if !d.is_float() && ts.iter().all(|t| !t.dtype.is_float()) => out.with_value(v),
        _ => out,
    }))
}

// ---------------------------------------------------------------------------
// Differentiation

/// `gadd(a, b)`: an `Unknown` operand (the symbolic zero, or a cotangent
/// known only at run time) gives the other one; tensors follow `add`
/// (`or` for bools); tuples and records add element-wise; anything else is
/// the join of both, or `Unknown` when they do not join (the kernel
/// checks).
fn gadd(a: &AbsVal, b: &AbsVal) -> AbsVal {
    match (a, b) {
        (AbsVal::Zero, x) | (x, AbsVal::Zero) => x.clone(),
        // An unknown cotangent has the other's type (or is zero), but may
        // add to any part the other has as zero.
        (AbsVal::Unknown, x) | (x, AbsVal::Unknown) => x.zero_as_unknown().into_owned(),
        (AbsVal::Tensor(x), AbsVal::Tensor(y)) => {
            let args = [a.clone(), b.clone()];
            let r = if x.dtype == DType::Bool && y.dtype == DType::Bool {
                binary(Prim::Or, &args, |p, q| Some((p != 0 || q != 0) as i64))
            } else {
                binary(Prim::Add, &args, |p, q| Some(p.wrapping_add(q)))
            };
            r.unwrap_or(AbsVal::Unknown)
        }
        (AbsVal::Tuple(x), AbsVal::Tuple(y)) if x.len() == y.len() => {
            AbsVal::Tuple(x.iter().zip(y).map(|(p, q)| gadd(p, q)).collect())
        }
        (AbsVal::Record(x), AbsVal::Record(y))
            if x.len() == y.len() && x.iter().all(|(n, _)| y.iter().any(|(m, _)| m == n)) =>
        {
            AbsVal::Record(
                x.iter()
                    .map(|(n, p)| {
                        let q = y.iter().find(|(m, _)| m == n).map(|(_, q)| q);
                        (n.clone(), q.map_or(AbsVal::Unknown, |q| gadd(p, q)))
                    })
                    .collect(),
            )
        }
        _ => join(a, b).unwrap_or(AbsVal::Unknown),
    }
}

/// The first float tensor of `x` whose derivative in `d` has another
/// shape: both types, as text (what `grad_finalize` refuses when it runs).
fn shape_mismatch(d: &AbsVal, x: &AbsVal) -> Option<(String, String)> {
    match (d, x) {
        (AbsVal::Tensor(dt), AbsVal::Tensor(xt)) => {
            (xt.dtype.is_float() && dt.shape != xt.shape).then(|| (d.to_string(), x.to_string()))
        }
        (AbsVal::Tuple(ds), AbsVal::Tuple(xs)) if ds.len() == xs.len() => {
            ds.iter().zip(xs).find_map(|(a, b)| shape_mismatch(a, b))
        }
        (AbsVal::Record(ds), AbsVal::Record(xs)) => ds.iter().find_map(|(n, a)| {
            let b = xs.iter().find(|(m, _)| m == n)?;
            shape_mismatch(a, &b.1)
        }),
        _ => None,
    }
}

/// The type of `grad_finalize(d, x)`: `x`'s structure, its tensors with
/// their dtypes, shapes and weak flags (values unknown), its other leaves
/// `()`.
fn finalized(x: &AbsVal) -> AbsVal {
    match x {
        AbsVal::Tensor(t) => AbsVal::Tensor(AbsTensor::new(t.dtype, t.shape.clone(), t.weak)),
        AbsVal::Tuple(items) => AbsVal::Tuple(items.iter().map(finalized).collect()),
        AbsVal::Record(fields) => AbsVal::Record(
            fields
                .iter()
                .map(|(n, v)| (n.clone(), finalized(v)))
                .collect(),
        ),
        AbsVal::Unknown | AbsVal::Bottom => x.clone(),
        AbsVal::Zero => AbsVal::Unknown,
        AbsVal::Str(_) | AbsVal::Func(_) | AbsVal::DType(_) | AbsVal::Io => AbsVal::unit(),
    }
}

/// `tuple_grad(t, i, d)`: a tuple as long as `t`, `d` at position `i` and
/// symbolic zeros elsewhere.
fn tuple_grad(t: &AbsVal, i: &AbsVal, d: &AbsVal) -> Rule {
    let op = "tuple_grad";
    let items = match t {
        AbsVal::Unknown => return Ok(AbsVal::Unknown),
        AbsVal::Tuple(items) => items,
        _ => return fail(format!("{op}: expected a tuple, got {t}")),
    };
    let n = items.len() as i64;
    if *i == AbsVal::Unknown {
        return Ok(AbsVal::Tuple(vec![AbsVal::Unknown; items.len()]));
    }
    let mut out = vec![AbsVal::Zero; items.len()];
    if let Some(k) = int_scalar(op, "index", i)?.scalar_value() {
        let j = if k < 0 { k + n } else { k };
        if !(0..n).contains(&j) {
            return fail(format!(
                "{op}: index {k} is out of range for a tuple of {n}"
            ));
        }
        out[j as usize] = d.clone();
    }
    Ok(AbsVal::Tuple(out))
}

/// `record_grad(r, name, d)`: a record with `r`'s fields, `d` in field
/// `name` and symbolic zeros elsewhere.
fn record_grad(r: &AbsVal, name: &AbsVal, d: &AbsVal) -> Rule {
    let op = "record_grad";
    let fields = match r {
        AbsVal::Unknown => return Ok(AbsVal::Unknown),
        AbsVal::Record(fields) => fields,
        _ => return fail(format!("{op}: expected a record, got {r}")),
    };
    let name = match name {
        AbsVal::Str(Some(n)) => Some(n),
        AbsVal::Str(None) | AbsVal::Unknown => None,
        _ => return fail(format!("{op}: expected a field name, got {name}")),
    };
    if let Some(n) = name {
        if !fields.iter().any(|(m, _)| m == n) {
            return fail(format!("{op}: record {r} has no field `{n}`"));
        }
    }
    Ok(AbsVal::Record(
        fields
            .iter()
            .map(|(m, _)| {
                let v = if Some(m) == name {
                    d.clone()
                } else if name.is_some() {
                    AbsVal::Zero
                } else {
                    AbsVal::Unknown
                };
                (m.clone(), v)
            })
            .collect(),
    ))
}

/// The type of `tree_fill(t, d)`: `t`'s, every tensor leaf with its
/// dtype, shape and weak flag (values unknown).
fn filled_tree(t: &AbsVal) -> Rule {
    Ok(match t {
        AbsVal::Tensor(leaf) => like(leaf, leaf.shape.clone(), None),
        AbsVal::Tuple(items) => AbsVal::Tuple(
            items
                .iter()
                .map(filled_tree)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        AbsVal::Record(fields) => AbsVal::Record(
            fields
                .iter()
                .map(|(n, v)| Ok((n.clone(), filled_tree(v)?)))
                .collect::<Result<Vec<_>, RuleError>>()?,
        ),
        AbsVal::Unknown | AbsVal::Bottom => t.clone(),
        _ => return fail(format!("tree_fill: expected tensors in the tree, got {t}")),
    })
}

// ---------------------------------------------------------------------------
// Control

/// `switch(c, a, b)`: the chosen value when `c` is known, else the join of
/// both (for closures, the set of both).
fn switch(ctx: &RuleCtx, c: &AbsVal, a: &AbsVal, b: &AbsVal) -> Rule {
    match c {
        AbsVal::Bottom => return Ok(AbsVal::Bottom),
        AbsVal::Unknown => {}
        AbsVal::Tensor(t) if t.shape.is_empty() && t.dtype == DType::Bool => {
            if let Some(v) = t.scalar_value() {
                return Ok(if v != 0 { a.clone() } else { b.clone() });
            }
        }
        _ => return fail(format!("a condition must be a bool scalar, got {c}")),
    }
    join(a, b).ok_or_else(|| {
        let mut e = InferError::new(
            ctx.loc,
            format!(
                "if branches have different types: {} and {}",
                a.user_view(),
                b.user_view()
            ),
        );
        for (node, v) in ctx.arg_nodes.iter().skip(1).zip([a, b]) {
            e.secondary.push((
                ctx.module.node(*node).loc,
                format!("this branch has type {}", v.user_view()),
            ));
        }
        RuleError::Nested(e)
    })
}

/// `tree_map(f, t, rest..)`: the first tree's structure decides; where it
/// has a leaf, `f` gets the other trees' values there whole (they may be
/// deeper); where it has a tuple or record, an `Unknown` (a symbolic zero)
/// in another tree stands for that structure. A first tree of unknown
/// structure gives an unknown result, and `f` is called on unknown
/// leaves, so that what it calls is seen for every call it may get.
fn tree_map(f: &AbsVal, t: &AbsVal, rest: &[&AbsVal], calls: &mut dyn Calls) -> Rule {
    let mismatch = |other: &AbsVal| {
        fail(format!(
            "tree_map: trees have different structures: {t} and {other}"
        ))
    };
    match t {
        AbsVal::Tuple(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let mut sub = Vec::with_capacity(rest.len());
                for r in rest {
                    match r {
                        AbsVal::Tuple(o) if o.len() == items.len() => sub.push(&o[i]),
                        // A symbolic zero (or a value known at run time only).
                        AbsVal::Unknown => sub.push(r),
                        _ => return mismatch(r),
                    }
                }
                out.push(tree_map(f, item, &sub, calls)?);
            }
            Ok(AbsVal::Tuple(out))
        }
        AbsVal::Record(fields) => {
            let mut out = Vec::with_capacity(fields.len());
            for (i, (name, item)) in fields.iter().enumerate() {
                let mut sub = Vec::with_capacity(rest.len());
                for r in rest {
                    match r {
                        AbsVal::Record(o) if o.len() == fields.len() && o[i].0 == *name => {
                            sub.push(&o[i].1)
                        }
                        AbsVal::Unknown => sub.push(r),
                        _ => return mismatch(r),
                    }
                }
                out.push((name.clone(), tree_map(f, item, &sub, calls)?));
            }
            Ok(AbsVal::Record(out))
        }
        AbsVal::Unknown => {
            let unknown = vec![AbsVal::Unknown; 1 + rest.len()];
            Ok(match calls.call(f, unknown)? {
                AbsVal::Bottom => AbsVal::Bottom,
                _ => AbsVal::Unknown,
            })
        }
        _ => {
            let mut args = vec![t.clone()];
            args.extend(rest.iter().map(|r| (*r).clone()));
            Ok(calls.call(f, args)?)
        }
    }
}

fn collect_leaves<'v>(v: &'v AbsVal, out: &mut Vec<&'v AbsVal>) {
    match v {
        AbsVal::Tuple(items) => items.iter().for_each(|i| collect_leaves(i, out)),
        AbsVal::Record(fields) => fields.iter().for_each(|(_, v)| collect_leaves(v, out)),
        _ => out.push(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::domain::Closure;
    use DType::*;

    struct NoCalls;
    impl Calls for NoCalls {
        fn call(&mut self, _: &AbsVal, _: Vec<AbsVal>) -> Result<AbsVal, InferError> {
            unreachable!("no calls in these tests")
        }
    }

    fn run(p: Prim, args: &[AbsVal]) -> Result<AbsVal, String> {
        run_with(p, args, &mut NoCalls)
    }

    /// [`run`] with the calls the rule makes going to `calls`.
    fn run_with(p: Prim, args: &[AbsVal], calls: &mut dyn Calls) -> Result<AbsVal, String> {
        run_in(&Module::new(), p, args, calls)
    }

    /// [`run_with`] in module `m`.
    fn run_in(
        m: &Module,
        p: Prim,
        args: &[AbsVal],
        calls: &mut dyn Calls,
    ) -> Result<AbsVal, String> {
        let ctx = RuleCtx {
            module: m,
            loc: Loc::NONE,
            arg_nodes: &[],
            value_of: &|_| None,
            load_type: None,
        };
        apply(p, &ctx, args, calls).map_err(|e| match e {
            RuleError::Msg(m) => m,
            RuleError::Nested(e) => e.message,
        })
    }

    fn ty(p: Prim, args: &[AbsVal]) -> String {
        match run(p, args) {
            Ok(v) => v.to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    fn f32s(shape: &[usize]) -> AbsVal {
        AbsVal::tensor(F32, shape)
    }

    fn ints_lit(v: &[i64]) -> AbsVal {
        AbsVal::Tensor(AbsTensor::new(I64, vec![v.len()], true).with_value(v.to_vec()))
    }

    fn unit() -> AbsVal {
        AbsVal::unit()
    }

    #[test]
    fn polygamma_takes_an_int_order() {
        let two = AbsVal::int(2, true);
        assert_eq!(ty(Prim::Polygamma, &[two.clone(), f32s(&[3])]), "f32[3]");
        assert_eq!(
            ty(
                Prim::Polygamma,
                &[AbsVal::tensor(I32, &[]), AbsVal::scalar(F64)]
            ),
            "f64[]"
        );
        assert_eq!(
            ty(Prim::Polygamma, &[AbsVal::scalar(F32), f32s(&[3])]),
            "error: polygamma: the order n must be an int, got f32[]"
        );
        assert_eq!(
            ty(Prim::Polygamma, &[AbsVal::int(-1, true), f32s(&[3])]),
            "error: polygamma: the order n must be between 0 and 100, got -1"
        );
        assert!(ty(Prim::Polygamma, &[two, AbsVal::tensor(I64, &[2])]).contains("use a cast"));
    }

    #[test]
    fn collectives_follow_the_world_of_the_module() {
        let world = |rank, size| {
            let mut m = Module::new();
            m.world = crate::ir::World { rank, size };
            m
        };
        let in_world = |p: Prim, args: &[AbsVal], rank: usize, size: usize| match run_in(
            &world(rank, size),
            p,
            args,
            &mut NoCalls,
        ) {
            Ok(v) => v.to_string(),
            Err(e) => format!("error: {e}"),
        };
        let known = |v: AbsVal| match v {
            AbsVal::Tensor(t) => t.value.as_deref().map(|v| v.to_vec()),
            _ => None,
        };
        let m = world(3, 4);
        let rank = run_in(&m, Prim::Rank, &[], &mut NoCalls).ok();
        let size = run_in(&m, Prim::WorldSize, &[], &mut NoCalls).ok();
        assert_eq!(rank.and_then(known), Some(vec![3]));
        assert_eq!(size.and_then(known), Some(vec![4]));
        let zero = AbsVal::int(0, true);
        assert_eq!(
            in_world(Prim::AllGather, &[f32s(&[2, 3]), zero.clone()], 0, 4),
            "f32[8, 3]"
        );
        assert_eq!(
            in_world(
                Prim::ReduceScatter,
                &[f32s(&[2, 8]), AbsVal::int(1, true)],
                0,
                4
            ),
            "f32[2, 2]"
        );
        assert!(in_world(Prim::ReduceScatter, &[f32s(&[6]), zero], 0, 4).starts_with("error"));
        assert_eq!(
            in_world(Prim::Broadcast, &[f32s(&[2]), AbsVal::int(4, true)], 0, 4),
            "error: broadcast: root 4 is not a rank of this world of 4"
        );
        let mean = AbsVal::Str(Some("mean".into()));
        assert!(
            in_world(Prim::AllReduce, &[AbsVal::tensor(I64, &[2]), mean], 0, 2)
                .contains("needs a float tensor")
        );
        // One process: the collectives are the identity, values included.
        let one = run(Prim::AllReduce, &[AbsVal::int(5, false), unit()]);
        assert_eq!(one.ok().and_then(known), Some(vec![5]));
        assert_eq!(
            in_world(Prim::AllReduce, &[AbsVal::int(5, false), unit()], 0, 2),
            "i64[]"
        );
    }

    #[test]
    fn tree_gadd_adds_the_leaves() {
        let t = AbsVal::Tuple(vec![
            f32s(&[2]),
            AbsVal::Unknown,
            AbsVal::Record(vec![("a".into(), f32s(&[2]))]),
        ]);
        assert_eq!(ty(Prim::TreeGAdd, &[t]), "f32[2]");
        assert_eq!(run(Prim::TreeGAdd, &[unit()]), Ok(AbsVal::Unknown));
    }

    #[test]
    fn every_primitive_has_a_rule_that_does_not_panic_on_junk() {
        // Junk arguments of the right count give errors, never panics.
        for p in Prim::all() {
            let n = p.info().params.len();
            let _ = run(*p, &vec![AbsVal::Io; n]);
            let _ = run(*p, &vec![AbsVal::int(1, true); n]);
            let _ = run(*p, &vec![unit(); n]);
            let _ = run(*p, &vec![AbsVal::Unknown; n]);
            let _ = run(*p, &vec![f32s(&[0, 2]); n + 1]);
        }
    }

    #[test]
    fn elementwise() {
        assert_eq!(
            ty(Prim::Mul, &[f32s(&[3, 1]), AbsVal::weak_scalar(F64)]),
            "f32[3, 1]"
        );
        assert_eq!(ty(Prim::Add, &[f32s(&[3, 1]), f32s(&[4])]), "f32[3, 4]");
        assert_eq!(
            ty(Prim::Add, &[f32s(&[3]), f32s(&[4])]),
            "error: add: shapes f32[3] and f32[4] cannot be broadcast"
        );
        assert_eq!(
            ty(Prim::Lt, &[f32s(&[2]), AbsVal::weak_scalar(F64)]),
            "bool[2]"
        );
        assert_eq!(ty(Prim::Exp, &[AbsVal::int(2, true)]), "f64[]");
        // Strong dtypes promote, as in JAX.
        assert_eq!(ty(Prim::Add, &[f32s(&[]), AbsVal::scalar(F64)]), "f64[]");
    }

    #[test]
    fn folds_int_constants() {
        let r = run(Prim::Add, &[AbsVal::int(2, true), AbsVal::int(3, true)]).unwrap();
        assert_eq!(r, AbsVal::int(5, true));
        let r = run(Prim::Lt, &[AbsVal::int(2, true), AbsVal::int(3, true)]).unwrap();
        assert_eq!(r, AbsVal::bool(true));
        let r = run(Prim::Div, &[AbsVal::int(-7, true), AbsVal::int(2, true)]).unwrap();
        assert_eq!(r.const_int(), Some(-3));
        let r = run(Prim::Div, &[AbsVal::int(1, true), AbsVal::int(0, true)]).unwrap();
        assert_eq!(r.const_int(), None);
        let r = run(Prim::Mul, &[ints_lit(&[3, 4]), AbsVal::int(2, true)]).unwrap();
        assert_eq!(r.as_tensor().unwrap().value.as_deref(), Some(&[6, 8][..]));
        // floats never fold
        let r = run(Prim::Add, &[AbsVal::int(2, true), AbsVal::weak_scalar(F64)]).unwrap();
        assert_eq!(r, AbsVal::weak_scalar(F64));
    }

    /// Records the arguments of every call and answers with a scalar.
    struct Record(Vec<Vec<AbsVal>>);
    impl Calls for Record {
        fn call(&mut self, _: &AbsVal, args: Vec<AbsVal>) -> Result<AbsVal, InferError> {
            self.0.push(args);
            Ok(AbsVal::tensor(F64, &[]))
        }
    }

    #[test]
    fn tree_map_calls_its_function_on_trees_of_unknown_type() {
        let f = AbsVal::Func(vec![Closure::Prim(Prim::Add)]);
        let x = AbsVal::tensor(F64, &[]);
        // A tangent tree that may be the symbolic zero: the function is
        // still called, on that leaf's known value and an unknown one.
        let mut calls = Record(Vec::new());
        let tree = AbsVal::Tuple(vec![x.clone()]);
        let args = [f.clone(), tree, AbsVal::Unknown];
        let out = run_with(Prim::TreeMap, &args, &mut calls);
        assert_eq!(out, Ok(AbsVal::Tuple(vec![x.clone()])));
        assert_eq!(calls.0, vec![vec![x.clone(), AbsVal::Unknown]]);
        // A first tree of unknown structure: one call on unknown leaves,
        // and an unknown result.
        let mut calls = Record(Vec::new());
        let args = [f, AbsVal::Unknown, AbsVal::Tuple(vec![x])];
        let out = run_with(Prim::TreeMap, &args, &mut calls);
        assert_eq!(out, Ok(AbsVal::Unknown));
        assert_eq!(calls.0, vec![vec![AbsVal::Unknown, AbsVal::Unknown]]);
    }

    #[test]
    fn and_or_fold_on_an_absorbing_operand() {
        let unknown = AbsVal::scalar(Bool);
        let (f, t) = (AbsVal::bool(false), AbsVal::bool(true));
        // `s < tol && i < n` is false once `i < n` is, whatever `s` is.
        assert_eq!(run(Prim::And, &[unknown.clone(), f.clone()]), Ok(f.clone()));
        assert_eq!(run(Prim::And, &[f.clone(), unknown.clone()]), Ok(f.clone()));
        assert_eq!(run(Prim::Or, &[unknown.clone(), t.clone()]), Ok(t.clone()));
        // The other operand decides: unknown.
        assert_eq!(
            run(Prim::And, &[unknown.clone(), t.clone()]),
            Ok(unknown.clone())
        );
        assert_eq!(run(Prim::Or, &[f, unknown.clone()]), Ok(unknown));
        assert_eq!(run(Prim::And, &[t.clone(), t.clone()]), Ok(t));
    }

    #[test]
    fn reductions() {
        let x = f32s(&[2, 3, 4]);
        let f = AbsVal::bool(false);
        let t = AbsVal::bool(true);
        assert_eq!(ty(Prim::Sum, &[x.clone(), unit(), f.clone()]), "f32[]");
        assert_eq!(
            ty(Prim::Sum, &[x.clone(), AbsVal::int(1, true), f.clone()]),
            "f32[2, 4]"
        );
        assert_eq!(
            ty(
                Prim::Mean,
                &[
                    x.clone(),
                    AbsVal::Tuple(vec![AbsVal::int(0, true), AbsVal::int(2, true)]),
                    t.clone()
                ]
            ),
            "f32[1, 3, 1]"
        );
        assert_eq!(
            ty(Prim::Argmax, &[x.clone(), AbsVal::int(-1, true), f.clone()]),
            "i64[2, 3]"
        );
        assert_eq!(
            ty(Prim::Sum, &[x, AbsVal::weak_scalar(I64), f]),
            "error: the axis of sum must be known at compile time"
        );
    }

    #[test]
    fn shapes_and_creation() {
        assert_eq!(ty(Prim::Zeros, &[ints_lit(&[3, 4]), unit()]), "f32[3, 4]");
        assert_eq!(
            ty(Prim::Zeros, &[ints_lit(&[3, 4]), AbsVal::DType(F64)]),
            "f64[3, 4]"
        );
        assert_eq!(
            ty(
                Prim::Zeros,
                &[AbsVal::Tuple(vec![AbsVal::weak_scalar(I64)]), unit()]
            ),
            "error: the shape of zeros must be known at compile time"
        );
        let s = run(Prim::Shape, &[f32s(&[5, 6])]).unwrap();
        assert_eq!(
            s,
            AbsVal::Tuple(vec![AbsVal::int(5, true), AbsVal::int(6, true)])
        );
        assert_eq!(ty(Prim::Reshape, &[f32s(&[5, 6]), s.clone()]), "f32[5, 6]");
        assert_eq!(
            ty(Prim::Reshape, &[f32s(&[5, 6]), ints_lit(&[-1, 2])]),
            "f32[15, 2]"
        );
        assert_eq!(ty(Prim::Transpose, &[f32s(&[5, 6]), unit()]), "f32[6, 5]");
        assert_eq!(ty(Prim::Arange, &[AbsVal::int(4, true), unit()]), "i64[4]");
        assert_eq!(
            ty(Prim::Matmul, &[f32s(&[3, 4]), f32s(&[5, 2])]),
            "error: `@` of f32[3, 4] and f32[5, 2]: inner dimensions 4 and 5 differ"
        );
        assert_eq!(
            ty(
                Prim::Concat,
                &[
                    AbsVal::Tuple(vec![f32s(&[2, 3]), f32s(&[4, 3])]),
                    AbsVal::int(0, true)
                ]
            ),
            "f32[6, 3]"
        );
        assert_eq!(
            ty(
                Prim::TensorLiteral,
                &[AbsVal::int(1, true), AbsVal::weak_scalar(F64)]
            ),
            "f64[2]"
        );
        let lit = run(
            Prim::TensorLiteral,
            &[AbsVal::int(3, true), AbsVal::int(4, true)],
        )
        .unwrap();
        assert_eq!(lit, ints_lit(&[3, 4]));
    }

    #[test]
    fn static_indexing() {
        let x = f32s(&[4, 5]);
        let sl = |a: i64, b: i64| AbsVal::Tuple(vec![AbsVal::int(a, true), AbsVal::int(b, true)]);
        assert_eq!(
            ty(Prim::Index, &[x.clone(), AbsVal::int(1, true)]),
            "f32[5]"
        );
        let all = AbsVal::Tuple(vec![unit(), unit()]);
        assert_eq!(ty(Prim::Index, &[x.clone(), all, sl(1, 3)]), "f32[4, 2]");
        assert_eq!(
            ty(Prim::Index, &[x.clone(), AbsVal::weak_scalar(I64)]),
            "f32[5]"
        );
        assert_eq!(
            ty(Prim::Index, &[x.clone(), AbsVal::int(4, true)]),
            "error: index 4 is out of range for axis 0 of size 4"
        );
        let dynamic = AbsVal::Tuple(vec![AbsVal::weak_scalar(I64), AbsVal::weak_scalar(I64)]);
        assert!(ty(Prim::Index, &[x, dynamic]).contains("`e : e + c`"));
        let folded = run(Prim::Index, &[ints_lit(&[7, 8, 9]), AbsVal::int(-1, true)]).unwrap();
        assert_eq!(folded, AbsVal::int(9, true));
    }

    #[test]
    fn tuples_and_records() {
        let t = AbsVal::Tuple(vec![f32s(&[2]), AbsVal::int(1, true)]);
        assert_eq!(
            ty(Prim::TupleGet, &[t.clone(), AbsVal::int(0, true)]),
            "f32[2]"
        );
        assert_eq!(
            ty(Prim::TupleGet, &[t.clone(), AbsVal::int(2, true)]),
            "error: index 2 is out of range for a tuple of 2 elements: (f32[2], i64[])"
        );
        assert!(ty(Prim::TupleGet, &[t, AbsVal::weak_scalar(I64)]).contains("different types"));
        let r = run(
            Prim::MakeRecord,
            &[
                AbsVal::Str(Some("w".into())),
                f32s(&[4, 3]),
                AbsVal::Str(Some("b".into())),
                f32s(&[3]),
            ],
        )
        .unwrap();
        assert_eq!(r.to_string(), "{w: f32[4, 3], b: f32[3]}");
        assert_eq!(
            ty(Prim::RecordGet, &[r.clone(), AbsVal::Str(Some("b".into()))]),
            "f32[3]"
        );
        assert_eq!(
            ty(Prim::RecordGet, &[r, AbsVal::Str(Some("x".into()))]),
            "error: record {w: f32[4, 3], b: f32[3]} has no field `x`"
        );
        assert_eq!(
            ty(
                Prim::TreeSum,
                &[AbsVal::Tuple(vec![f32s(&[2]), f32s(&[3, 3])])]
            ),
            "f32[]"
        );
    }

    #[test]
    fn switch_rule() {
        let a = f32s(&[3]);
        let b = f32s(&[4]);
        assert_eq!(
            run(Prim::Switch, &[AbsVal::bool(true), a.clone(), b.clone()]),
            Ok(a.clone())
        );
        assert_eq!(
            run(Prim::Switch, &[AbsVal::bool(false), a.clone(), b.clone()]),
            Ok(b.clone())
        );
        assert_eq!(
            ty(Prim::Switch, &[AbsVal::scalar(Bool), a.clone(), b.clone()]),
            "error: if branches have different types: f32[3] and f32[4]"
        );
        assert_eq!(
            ty(Prim::Switch, &[f32s(&[]), a.clone(), a]),
            "error: a condition must be a bool scalar, got f32[]"
        );
    }

    #[test]
    fn io() {
        assert_eq!(ty(Prim::Print, &[AbsVal::Io, f32s(&[2])]), "io");
        assert!(ty(Prim::Print, &[f32s(&[2])]).contains("io token"));
        // without a loader, the data is known only at run time
        assert_eq!(
            ty(
                Prim::LoadNpy,
                &[AbsVal::Io, AbsVal::Str(Some("x.npy".into()))]
            ),
            "(io, ?)"
        );
        assert_eq!(ty(Prim::Add, &[AbsVal::Unknown, f32s(&[2])]), "?");
        assert_eq!(ty(Prim::Print, &[AbsVal::Io, AbsVal::Unknown]), "io");
        assert_eq!(
            ty(Prim::MakeTuple, &[AbsVal::Unknown, f32s(&[2])]),
            "(?, f32[2])"
        );
    }
}

/// The tensors of a Jacobian's value or argument (a tensor, or tuples and
/// records of them), depth first.
fn jac_leaves(op: &str, v: &AbsVal, what: &str) -> Result<Vec<AbsTensor>, RuleError> {
    let mut out = Vec::new();
    fn go(v: &AbsVal, out: &mut Vec<AbsTensor>) -> bool {
        match v {
            AbsVal::Tensor(t) => {
                out.push(t.clone());
                true
            }
            AbsVal::Tuple(items) => items.iter().all(|i| go(i, out)),
            AbsVal::Record(fields) => fields.iter().all(|(_, f)| go(f, out)),
            _ => false,
        }
    }
    if go(v, &mut out) {
        Ok(out)
    } else {
        fail(format!(
            "{op}: the {what} must be made of tensors, tuples and records, got {v}"
        ))
    }
}

/// The known tensors inside `v` (symbolic zeros and unknowns left out).
fn collect_tensors(v: &AbsVal, out: &mut Vec<AbsTensor>) {
    match v {
        AbsVal::Tensor(t) => out.push(t.clone()),
        AbsVal::Tuple(items) => items.iter().for_each(|i| collect_tensors(i, out)),
        AbsVal::Record(fields) => fields.iter().for_each(|(_, f)| collect_tensors(f, out)),
        _ => {}
    }
}

/// `like`'s structure of tuples and records with its leaves replaced, in
/// order, by `leaves`.
fn jac_rebuild(like: &AbsVal, leaves: &mut impl Iterator<Item = AbsVal>) -> AbsVal {
    match like {
        AbsVal::Tuple(items) => {
            AbsVal::Tuple(items.iter().map(|i| jac_rebuild(i, leaves)).collect())
        }
        AbsVal::Record(fields) => AbsVal::Record(
            fields
                .iter()
                .map(|(k, f)| (k.clone(), jac_rebuild(f, leaves)))
                .collect(),
        ),
        _ => leaves.next().unwrap_or(AbsVal::Unknown),
    }
}

/// Whether a value's type is known only at run time somewhere inside.
fn has_unknown(v: &AbsVal) -> bool {
    match v {
        AbsVal::Unknown | AbsVal::Bottom => true,
        AbsVal::Tuple(items) => items.iter().any(has_unknown),
        AbsVal::Record(fields) => fields.iter().any(|(_, f)| has_unknown(f)),
        _ => false,
    }
}
