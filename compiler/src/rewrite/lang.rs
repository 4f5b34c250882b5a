//! The meta-operator language the rewrites work on, and the analysis that
//! gives every e-class its tensor type.
//!
//! Four kinds of operator, after Jittor: *map* (any element-wise
//! primitive, by name, plus `zeros_like` / `ones_like`), *reindex*
//! (`broadcast`, `reshape`, `transpose`), *reduce* (`sum`, `sumk` — the
//! same with the reduced axes kept —, `sum_to`) and *contract*
//! (`matmul`). Everything else the region reads is a leaf: a parameter, a
//! node of another kind, a node of another graph. Shapes, permutations and
//! axes are `Dims` leaves (`[128,512]`, no spaces); weak literals are `Lit`
//! leaves (`2` is an int, `2.0` a float).
//!
//! The analysis computes each class's type with the inference rules of the
//! primitives ([`crate::infer::rules::apply`]), so a rewrite can compare
//! the types of its two sides (see [`super::rules`]).

use std::fmt;
use std::str::FromStr;

use adjoint_runtime::tensor::DType;
use egg::{define_language, Analysis, DidMerge, EGraph, Id, Symbol};

use crate::infer::{AbsTensor, AbsVal};
use crate::prim::{Category, Prim};

define_language! {
    /// A tensor expression over meta-operators.
    pub enum Meta {
        "broadcast" = Broadcast([Id; 2]),
        "reshape" = Reshape([Id; 2]),
        "transpose" = Transpose([Id; 2]),
        "sum" = Sum([Id; 2]),
        "sumk" = SumKeep([Id; 2]),
        "sum_to" = SumTo([Id; 2]),
        "matmul" = Matmul([Id; 2]),
        "zeros_like" = ZerosLike(Id),
        "ones_like" = OnesLike(Id),
        Dims(Dims),
        Lit(Lit),
        Map(MapOp, Vec<Id>),
        Leaf(Symbol),
    }
}

/// An element-wise primitive (any of category `Map` but `cast`, whose
/// dtype argument is not a tensor).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MapOp(pub Prim);

impl MapOp {
    pub fn of(p: Prim) -> Option<MapOp> {
        (p.category() == Category::Map && p != Prim::Cast).then_some(MapOp(p))
    }
}

impl FromStr for MapOp {
    type Err = String;
    fn from_str(s: &str) -> Result<MapOp, String> {
        Prim::from_name(s)
            .and_then(MapOp::of)
            .ok_or_else(|| format!("{s} is not an element-wise primitive"))
    }
}

impl fmt::Display for MapOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

/// A shape, a permutation or a list of axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dims(pub Vec<usize>);

impl FromStr for Dims {
    type Err = String;
    fn from_str(s: &str) -> Result<Dims, String> {
        let inner = s
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .ok_or_else(|| format!("{s} is not a list of dims"))?;
        if inner.is_empty() {
            return Ok(Dims(Vec::new()));
        }
        inner
            .split(',')
            .map(|d| d.parse::<usize>().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()
            .map(Dims)
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        write!(f, "[{}]", parts.join(","))
    }
}

/// A weakly typed literal: an int (`2`) or a float (`2.0`). The two are
/// different values (their types differ), so different nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lit {
    Int(i64),
    /// The bits of an `f64`.
    Float(u64),
}

impl Lit {
    pub fn float(x: f64) -> Lit {
        Lit::Float(x.to_bits())
    }
    pub fn value(self) -> f64 {
        match self {
            Lit::Int(i) => i as f64,
            Lit::Float(b) => f64::from_bits(b),
        }
    }
}

impl FromStr for Lit {
    type Err = String;
    fn from_str(s: &str) -> Result<Lit, String> {
        if let Ok(i) = s.parse::<i64>() {
            return Ok(Lit::Int(i));
        }
        // Only decimal numbers: a leaf could be named `inf`.
        let numeric = s
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
            && s.chars().any(|c| c.is_ascii_digit());
        match s.parse::<f64>() {
            Ok(x) if numeric => Ok(Lit::float(x)),
            _ => Err(format!("{s} is not a literal")),
        }
    }
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lit::Int(i) => write!(f, "{i}"),
            Lit::Float(b) => write!(f, "{:?}", f64::from_bits(*b)),
        }
    }
}

/// What the analysis knows of an e-class.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Info {
    /// Its tensor type (dtype, shape, weak flag), when known.
    pub ty: Option<AbsTensor>,
    /// The value of every element, when they are all one known constant
    /// (literals, `zeros_like`, `ones_like`).
    pub constant: Option<f64>,
    /// The list, for a `Dims` class.
    pub dims: Option<Vec<usize>>,
}

/// The analysis: the types of the leaves (set when the region is lowered)
/// and the inference rules for everything else.
#[derive(Default)]
pub struct Types {
    pub leaves: std::collections::HashMap<Symbol, AbsTensor>,
}

pub type MetaGraph = EGraph<Meta, Types>;

/// `dims` as the abstract value of a tuple of ints.
fn tuple(dims: &[usize]) -> AbsVal {
    AbsVal::Tuple(dims.iter().map(|d| AbsVal::int(*d as i64, true)).collect())
}

/// The type of `p` applied to `args`, by its inference rule.
fn rule(p: Prim, args: &[AbsVal]) -> Option<AbsTensor> {
    struct NoCalls;
    impl crate::infer::rules::Calls for NoCalls {
        fn call(&mut self, _: &AbsVal, _: Vec<AbsVal>) -> Result<AbsVal, crate::infer::InferError> {
            Err(crate::infer::InferError::new(
                crate::ir::Loc::NONE,
                "no calls in rewrites",
            ))
        }
    }
    let module = crate::ir::Module::new();
    let ctx = crate::infer::rules::RuleCtx {
        module: &module,
        loc: crate::ir::Loc::NONE,
        arg_nodes: &[],
        value_of: &|_| None,
        load_type: None,
    };
    match crate::infer::rules::apply(p, &ctx, args, &mut NoCalls) {
        // Known int values are of no use here and would make equal types
        // differ.
        Ok(AbsVal::Tensor(mut t)) => {
            t.value = None;
            Some(t)
        }
        _ => None,
    }
}

impl Analysis<Meta> for Types {
    type Data = Info;

    fn make(egraph: &mut MetaGraph, enode: &Meta, _id: Id) -> Info {
        let ty = |i: &Id| egraph[*i].data.ty.clone().map(AbsVal::Tensor);
        let dims = |i: &Id| egraph[*i].data.dims.clone();
        let with = |p: Prim, args: Vec<Option<AbsVal>>| -> Option<AbsTensor> {
            let args: Option<Vec<AbsVal>> = args.into_iter().collect();
            rule(p, &args?)
        };
        let mut info = Info::default();
        match enode {
            Meta::Leaf(s) => info.ty = egraph.analysis.leaves.get(s).cloned(),
            Meta::Lit(l) => {
                let d = match l {
                    Lit::Int(_) => DType::I64,
                    Lit::Float(_) => DType::F64,
                };
                info.ty = Some(AbsTensor::new(d, Vec::new(), true));
                info.constant = Some(l.value());
            }
            Meta::Dims(d) => info.dims = Some(d.0.clone()),
            Meta::Map(op, args) => info.ty = with(op.0, args.iter().map(ty).collect()),
            Meta::ZerosLike(x) | Meta::OnesLike(x) => {
                let p = if matches!(enode, Meta::ZerosLike(_)) {
                    Prim::ZerosLike
                } else {
                    Prim::OnesLike
                };
                info.ty = with(p, vec![ty(x)]);
                info.constant = Some(if p == Prim::ZerosLike { 0.0 } else { 1.0 });
            }
            Meta::Broadcast([x, s]) => {
                info.ty = with(Prim::BroadcastTo, vec![ty(x), dims(s).map(|d| tuple(&d))])
            }
            Meta::Reshape([x, s]) => {
                info.ty = with(Prim::Reshape, vec![ty(x), dims(s).map(|d| tuple(&d))])
            }
            Meta::Transpose([x, p]) => {
                info.ty = with(Prim::Transpose, vec![ty(x), dims(p).map(|d| tuple(&d))])
            }
            Meta::Sum([x, a]) | Meta::SumKeep([x, a]) => {
                let keep = AbsVal::bool(matches!(enode, Meta::SumKeep(_)));
                info.ty = with(
                    Prim::Sum,
                    vec![ty(x), dims(a).map(|d| tuple(&d)), Some(keep)],
                );
            }
            Meta::SumTo([x, s]) => {
                let like = match (&egraph[*x].data.ty, dims(s)) {
                    (Some(t), Some(d)) => Some(AbsVal::Tensor(AbsTensor::new(t.dtype, d, t.weak))),
                    _ => None,
                };
                info.ty = with(Prim::SumTo, vec![ty(x), like]);
            }
            Meta::Matmul([a, b]) => info.ty = with(Prim::Matmul, vec![ty(a), ty(b)]),
        }
        info
    }

    fn merge(&mut self, to: &mut Info, from: Info) -> DidMerge {
        // Rewrites only join classes of equal types (see `rules`); what one
        // side knows and the other does not is kept.
        let mut changed = false;
        if to.ty.is_none() && from.ty.is_some() {
            to.ty = from.ty.clone();
            changed = true;
        }
        if to.constant.is_none() && from.constant.is_some() {
            to.constant = from.constant;
            changed = true;
        }
        if to.dims.is_none() && from.dims.is_some() {
            to.dims = from.dims.clone();
            changed = true;
        }
        let from_gains = (from.ty.is_none() && to.ty.is_some())
            || (from.constant.is_none() && to.constant.is_some())
            || (from.dims.is_none() && to.dims.is_some());
        DidMerge(changed, from_gains)
    }
}

/// The number of elements of a type.
pub fn elements(t: &AbsTensor) -> f64 {
    t.shape.iter().map(|d| *d as f64).product()
}

/// The bytes of a tensor of type `t`.
pub fn bytes(t: &AbsTensor) -> f64 {
    elements(t) * t.dtype.size_bytes() as f64
}
