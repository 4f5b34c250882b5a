//! Abstract values: what inference knows about a run-time value.
//!
//! A tensor is known by its dtype, its static shape and its weak flag
//! (language.md §2); small int and bool tensors (scalars such as loop
//! counters, literals such as the shape `[3, 4]`) may also carry their
//! elements, so shapes, axes, slice bounds and tuple indices computed from
//! them are known at compile time. A function is known by the closures it
//! may be: graphs with the abstract values they captured, or primitives.
//!
//! [`join`] merges the values of two control-flow paths; [`generalize`]
//! forgets constants that vary, so that recursion on constant ints
//! terminates.

use rustc_hash::FxHashSet as HashSet;
use std::fmt;
use std::sync::Arc;

use adjoint_runtime::shape::TensorTy;
use adjoint_runtime::tensor::{DType, Tensor};
use adjoint_runtime::value::Value;

use crate::ir::GraphId;
use crate::prim::Prim;

/// Int and bool tensors with at most this many elements keep their values.
pub const MAX_CONST_ELEMS: usize = 256;

/// Abstract values with more parts than this (see [`AbsVal::exceeds_parts`])
/// are rejected: abstract values share nothing, so a type that doubles at
/// each step (`let t2 = (t1, t1);`, or a recursion that passes `(t, t)`)
/// would otherwise exhaust memory in a few dozen steps.
pub const MAX_VALUE_PARTS: usize = 100_000;

/// What inference knows about a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AbsTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// A weakly typed literal (or computed only from literals).
    pub weak: bool,
    /// The elements, row-major, when known: only for int and bool dtypes
    /// (bools as 0 and 1), with at most [`MAX_CONST_ELEMS`] elements.
    pub value: Option<Arc<[i64]>>,
}

impl AbsTensor {
    /// A tensor of unknown value. Bool is never weak.
    pub fn new(dtype: DType, shape: Vec<usize>, weak: bool) -> AbsTensor {
        AbsTensor {
            dtype,
            shape,
            weak: weak && dtype != DType::Bool,
            value: None,
        }
    }

    /// The same tensor with known elements (dropped if the dtype is a float
    /// or there are too many of them).
    pub fn with_value(mut self, value: Vec<i64>) -> AbsTensor {
        let keep = !self.dtype.is_float()
            && value.len() <= MAX_CONST_ELEMS
            && Some(value.len()) == adjoint_runtime::shape::checked_size(&self.shape);
        self.value = if keep {
            Some(value.into_iter().map(|v| wrap(self.dtype, v)).collect())
        } else {
            None
        };
        self
    }

    /// The static type, for shape rules and messages.
    pub fn ty(&self) -> TensorTy<'_> {
        TensorTy::new(self.dtype, &self.shape)
    }

    /// The `(dtype, weak)` pair the runtime's dtype rules take.
    pub fn weak_dtype(&self) -> (DType, bool) {
        (self.dtype, self.weak)
    }

    /// The value of a 0-d int or bool tensor, when known.
    pub fn scalar_value(&self) -> Option<i64> {
        match &self.value {
            Some(v) if self.shape.is_empty() => v.first().copied(),
            _ => None,
        }
    }
}

/// Normalises an int to what a tensor of `dtype` can hold (two's complement
/// wrap-around, as the kernels do); bools become 0 or 1.
pub fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::Bool => (v != 0) as i64,
        DType::I64 | DType::F32 | DType::F64 => v,
    }
}

/// A function a value may be.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Closure {
    /// A graph with the abstract values of its free variables, in the order
    /// of [`crate::ir::analysis::FreeVars`].
    Graph {
        graph: GraphId,
        /// Shared: closures are copied wherever their values flow, and
        /// the values they capture (backpropagators capture forward
        /// values and other closures) can be large.
        captures: Arc<[AbsVal]>,
    },
    Prim(Prim),
}

/// An abstract value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AbsVal {
    Tensor(AbsTensor),
    Tuple(Vec<AbsVal>),
    /// Named fields in written order.
    Record(Vec<(Arc<str>, AbsVal)>),
    /// A string, with its text when known.
    Str(Option<Arc<str>>),
    /// One of these closures (more than one after joining control-flow
    /// paths); never empty.
    Func(Vec<Closure>),
    DType(DType),
    /// The IO state token.
    Io,
    /// A value whose type is known only at run time: data read from a file
    /// whose type the compiler was not given. Operations on it are checked
    /// when they run; it joins with anything to itself.
    Unknown,
    /// Not known yet: the provisional result of a recursive call. Joins as
    /// the identity.
    Bottom,
    /// The symbolic zero of differentiation (`zero()`: no contribution).
    /// Only the primitives of differentiation take it apart (`is_zero` is
    /// true of it and false of every other known value, `gadd` drops it);
    /// every other rule sees it as `Unknown`, as does a join with anything
    /// else.
    Zero,
}

impl AbsVal {
    /// How a user sees the value of a branch or body in a function that
    /// does IO: without the IO token the compiler threads through it
    /// (`(f64[2], io)` is `f64[2]`).
    pub fn user_view(&self) -> AbsVal {
        match self {
            AbsVal::Tuple(items)
                if items.len() >= 2 && matches!(items.last(), Some(AbsVal::Io)) =>
            {
                let rest = &items[..items.len() - 1];
                if rest.len() == 1 {
                    rest[0].clone()
                } else {
                    AbsVal::Tuple(rest.to_vec())
                }
            }
            v => v.clone(),
        }
    }

    /// Adds to `out` the graph of every closure in the value, captured
    /// closures included.
    pub fn collect_graphs(&self, out: &mut HashSet<GraphId>) {
        match self {
            AbsVal::Func(cs) => {
                for c in cs {
                    if let Closure::Graph { graph, captures } = c {
                        out.insert(*graph);
                        for v in captures.iter() {
                            v.collect_graphs(out);
                        }
                    }
                }
            }
            AbsVal::Tuple(items) => items.iter().for_each(|v| v.collect_graphs(out)),
            AbsVal::Record(fields) => fields.iter().for_each(|(_, v)| v.collect_graphs(out)),
            _ => {}
        }
    }

    /// Whether the value has more than `limit` parts, counting every tensor,
    /// string, tuple, record, field, closure and captured value once. Stops
    /// counting past the limit.
    pub fn exceeds_parts(&self, limit: usize) -> bool {
        let mut count = 0usize;
        let mut stack = vec![self];
        // Captures are shared: a backpropagator of order n captures those
        // of order n - 1 several times over, so counting each shared list
        // once keeps the count to what is stored, not its unfolding.
        let mut seen: HashSet<*const AbsVal> = HashSet::default();
        while let Some(v) = stack.pop() {
            count += 1;
            if count > limit {
                return true;
            }
            match v {
                AbsVal::Tuple(items) => stack.extend(items),
                AbsVal::Record(fields) => stack.extend(fields.iter().map(|(_, v)| v)),
                AbsVal::Func(closures) => {
                    for c in closures {
                        if let Closure::Graph { captures, .. } = c {
                            if seen.insert(captures.as_ptr()) {
                                stack.extend(captures.iter());
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        false
    }

    /// Whether `pred` holds of the value or of a part of its tuples and
    /// records (not of closures' captures).
    pub fn any_part(&self, pred: &impl Fn(&AbsVal) -> bool) -> bool {
        pred(self)
            || match self {
                AbsVal::Tuple(items) => items.iter().any(|v| v.any_part(pred)),
                AbsVal::Record(fields) => fields.iter().any(|(_, v)| v.any_part(pred)),
                _ => false,
            }
    }

    /// Whether the symbolic zero is the value or a part of it.
    pub fn contains_zero(&self) -> bool {
        self.any_part(&|v| *v == AbsVal::Zero)
    }

    /// The value with every symbolic zero in it seen as `Unknown` (what
    /// the rules that do not take zeros apart receive).
    pub fn zero_as_unknown(&self) -> std::borrow::Cow<'_, AbsVal> {
        use std::borrow::Cow;
        fn strip(v: &AbsVal) -> AbsVal {
            match v {
                AbsVal::Zero => AbsVal::Unknown,
                AbsVal::Tuple(items) => AbsVal::Tuple(items.iter().map(strip).collect()),
                AbsVal::Record(fields) => {
                    AbsVal::Record(fields.iter().map(|(k, v)| (k.clone(), strip(v))).collect())
                }
                v => v.clone(),
            }
        }
        if self.contains_zero() {
            Cow::Owned(strip(self))
        } else {
            Cow::Borrowed(self)
        }
    }

    /// A tensor of unknown value.
    pub fn tensor(dtype: DType, shape: &[usize]) -> AbsVal {
        AbsVal::Tensor(AbsTensor::new(dtype, shape.to_vec(), false))
    }

    /// A scalar of unknown value.
    pub fn scalar(dtype: DType) -> AbsVal {
        AbsVal::tensor(dtype, &[])
    }

    /// A weakly typed scalar of unknown value (`i64` or `f64`).
    pub fn weak_scalar(dtype: DType) -> AbsVal {
        AbsVal::Tensor(AbsTensor::new(dtype, Vec::new(), true))
    }

    /// A known int scalar (`Const::Int` when `weak`).
    pub fn int(v: i64, weak: bool) -> AbsVal {
        AbsVal::Tensor(AbsTensor::new(DType::I64, Vec::new(), weak).with_value(vec![v]))
    }

    /// A known bool scalar.
    pub fn bool(v: bool) -> AbsVal {
        AbsVal::Tensor(AbsTensor::new(DType::Bool, Vec::new(), false).with_value(vec![v as i64]))
    }

    /// The empty tuple `()`.
    pub fn unit() -> AbsVal {
        AbsVal::Tuple(Vec::new())
    }

    /// Whether a function, or a part of unknown type, occurs in the value.
    pub fn has_function_or_unknown(&self) -> bool {
        match self {
            AbsVal::Func(_) | AbsVal::Unknown | AbsVal::Zero => true,
            AbsVal::Tuple(items) => items.iter().any(AbsVal::has_function_or_unknown),
            AbsVal::Record(fields) => fields.iter().any(|(_, v)| v.has_function_or_unknown()),
            _ => false,
        }
    }

    /// Whether `Unknown` occurs in the value (captures of closures
    /// included).
    pub fn contains_unknown(&self) -> bool {
        match self {
            AbsVal::Unknown => true,
            AbsVal::Tuple(items) => items.iter().any(AbsVal::contains_unknown),
            AbsVal::Record(fields) => fields.iter().any(|(_, v)| v.contains_unknown()),
            AbsVal::Func(cs) => cs.iter().any(|c| match c {
                Closure::Graph { captures, .. } => captures.iter().any(AbsVal::contains_unknown),
                Closure::Prim(_) => false,
            }),
            _ => false,
        }
    }

    pub fn is_unit(&self) -> bool {
        matches!(self, AbsVal::Tuple(t) if t.is_empty())
    }

    pub fn is_bottom(&self) -> bool {
        matches!(self, AbsVal::Bottom)
    }

    pub fn as_tensor(&self) -> Option<&AbsTensor> {
        match self {
            AbsVal::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The value of a known int or bool scalar.
    pub fn const_int(&self) -> Option<i64> {
        self.as_tensor().and_then(AbsTensor::scalar_value)
    }

    /// What inference knows about a concrete tensor (its elements when it
    /// is a small int or bool tensor).
    pub fn from_tensor(t: &Tensor) -> AbsVal {
        let a = AbsTensor::new(t.dtype(), t.shape().to_vec(), t.weak);
        let a = if !t.dtype().is_float() && t.len() <= MAX_CONST_ELEMS {
            a.with_value(t.as_i64_vec())
        } else {
            a
        };
        AbsVal::Tensor(a)
    }

    /// What inference knows about a run-time value (for entry arguments);
    /// `None` for functions, whose code the runtime value does not name.
    pub fn from_value(v: &Value) -> Option<AbsVal> {
        Some(match v {
            Value::Tensor(t) => AbsVal::from_tensor(t),
            Value::Tuple(items) => AbsVal::Tuple(
                items
                    .iter()
                    .map(AbsVal::from_value)
                    .collect::<Option<Vec<_>>>()?,
            ),
            Value::Record(r) => AbsVal::Record(
                r.fields
                    .iter()
                    .map(|(n, v)| Some((n.clone(), AbsVal::from_value(v)?)))
                    .collect::<Option<Vec<_>>>()?,
            ),
            Value::Str(s) => AbsVal::Str(Some(s.clone())),
            Value::DType(d) => AbsVal::DType(*d),
            Value::Io => AbsVal::Io,
            Value::Func(_) | Value::Tape(_) => return None,
            // Values made by differentiation have no static type of their own.
            Value::Zero | Value::Env(_) | Value::Batched(_) | Value::Lanes(_) => AbsVal::Unknown,
        })
    }

    /// The same value with closures nested deeper than `depth` (closures
    /// captured by closures) replaced by `Unknown`.
    /// Adds to `out` the graphs of the closures [`AbsVal::truncate_funcs`]
    /// replaces (with those they capture): inference loses track of those
    /// closures, even where other closures of the same graphs remain.
    pub fn truncated_graphs(&self, depth: usize, out: &mut HashSet<GraphId>) {
        match self {
            AbsVal::Func(_) if depth == 0 => self.collect_graphs(out),
            AbsVal::Func(cs) => {
                for c in cs {
                    if let Closure::Graph { captures, .. } = c {
                        for v in captures.iter() {
                            v.truncated_graphs(depth - 1, out);
                        }
                    }
                }
            }
            AbsVal::Tuple(items) => items.iter().for_each(|v| v.truncated_graphs(depth, out)),
            AbsVal::Record(fields) => fields
                .iter()
                .for_each(|(_, v)| v.truncated_graphs(depth, out)),
            _ => {}
        }
    }

    pub fn truncate_funcs(&self, depth: usize) -> AbsVal {
        match self {
            AbsVal::Func(_) if depth == 0 => AbsVal::Unknown,
            AbsVal::Func(cs) => AbsVal::Func(
                cs.iter()
                    .map(|c| match c {
                        Closure::Graph { graph, captures } => Closure::Graph {
                            graph: *graph,
                            captures: captures
                                .iter()
                                .map(|v| v.truncate_funcs(depth - 1))
                                .collect(),
                        },
                        Closure::Prim(p) => Closure::Prim(*p),
                    })
                    .collect(),
            ),
            AbsVal::Tuple(items) => {
                AbsVal::Tuple(items.iter().map(|v| v.truncate_funcs(depth)).collect())
            }
            AbsVal::Record(fields) => AbsVal::Record(
                fields
                    .iter()
                    .map(|(n, v)| (n.clone(), v.truncate_funcs(depth)))
                    .collect(),
            ),
            _ => self.clone(),
        }
    }

    /// The same value with every known constant forgotten (strings keep
    /// their text).
    pub fn widen(&self) -> AbsVal {
        match self {
            AbsVal::Tensor(t) => AbsVal::Tensor(AbsTensor {
                value: None,
                ..t.clone()
            }),
            AbsVal::Tuple(items) => AbsVal::Tuple(items.iter().map(AbsVal::widen).collect()),
            AbsVal::Record(fields) => {
                AbsVal::Record(fields.iter().map(|(n, v)| (n.clone(), v.widen())).collect())
            }
            AbsVal::Func(cs) => AbsVal::Func(
                cs.iter()
                    .map(|c| match c {
                        Closure::Graph { graph, captures } => Closure::Graph {
                            graph: *graph,
                            captures: captures.iter().map(AbsVal::widen).collect(),
                        },
                        Closure::Prim(p) => Closure::Prim(*p),
                    })
                    .collect(),
            ),
            AbsVal::Str(_)
            | AbsVal::DType(_)
            | AbsVal::Io
            | AbsVal::Unknown
            | AbsVal::Zero
            | AbsVal::Bottom => self.clone(),
        }
    }
}

/// Joins the values two control-flow paths may produce: equal values join
/// to themselves; tensors of equal shapes join when their dtypes promote
/// (a weak literal adopts the other side's dtype); constants that differ
/// become unknown; closures collect into a set. `None` when the types
/// differ (the caller names both in its message).
pub fn join(a: &AbsVal, b: &AbsVal) -> Option<AbsVal> {
    if a == b {
        return Some(a.clone());
    }
    Some(match (a, b) {
        (AbsVal::Bottom, x) | (x, AbsVal::Bottom) => x.clone(),
        (AbsVal::Unknown | AbsVal::Zero, _) | (_, AbsVal::Unknown | AbsVal::Zero) => {
            AbsVal::Unknown
        }
        (AbsVal::Tensor(x), AbsVal::Tensor(y)) => {
            if x.shape != y.shape {
                return None;
            }
            let (dtype, weak) = if x.weak_dtype() == y.weak_dtype() {
                x.weak_dtype()
            } else {
                // Two paths' values of different strong dtypes do not
                // join (a join is not an operation: nothing converts
                // them); a weak literal joins a dtype it can adopt.
                if !x.weak && !y.weak {
                    return None;
                }
                let (w, s) = if x.weak { (x, y) } else { (y, x) };
                if !s.weak && !adjoint_runtime::dtype::weak_adopts(w.dtype, s.dtype) {
                    return None;
                }
                adjoint_runtime::dtype::promote("join", x.weak_dtype(), y.weak_dtype()).ok()?
            };
            let value = if x.value == y.value && x.dtype == dtype && y.dtype == dtype {
                x.value.clone()
            } else {
                None
            };
            AbsVal::Tensor(AbsTensor {
                value,
                ..AbsTensor::new(dtype, x.shape.clone(), weak)
            })
        }
        (AbsVal::Tuple(x), AbsVal::Tuple(y)) => {
            if x.len() != y.len() {
                return None;
            }
            AbsVal::Tuple(
                x.iter()
                    .zip(y)
                    .map(|(a, b)| join(a, b))
                    .collect::<Option<Vec<_>>>()?,
            )
        }
        (AbsVal::Record(x), AbsVal::Record(y)) => {
            if x.len() != y.len() || x.iter().zip(y).any(|((n, _), (m, _))| n != m) {
                return None;
            }
            AbsVal::Record(
                x.iter()
                    .zip(y)
                    .map(|((n, a), (_, b))| Some((n.clone(), join(a, b)?)))
                    .collect::<Option<Vec<_>>>()?,
            )
        }
        (AbsVal::Str(_), AbsVal::Str(_)) => AbsVal::Str(None),
        (AbsVal::Func(x), AbsVal::Func(y)) => {
            let mut out = x.clone();
            for c in y {
                add_closure(&mut out, c);
            }
            AbsVal::Func(out)
        }
        _ => return None,
    })
}

/// Adds `c` to a closure set: merged with a closure of the same graph when
/// their captures join, else appended.
fn add_closure(set: &mut Vec<Closure>, c: &Closure) {
    if set.contains(c) {
        return;
    }
    if let Closure::Graph { graph, captures } = c {
        for existing in set.iter_mut() {
            if let Closure::Graph {
                graph: g,
                captures: caps,
            } = existing
            {
                if g == graph && caps.len() == captures.len() {
                    let joined: Option<Vec<AbsVal>> = caps
                        .iter()
                        .zip(captures.iter())
                        .map(|(a, b)| join(a, b))
                        .collect();
                    if let Some(j) = joined {
                        *caps = j.into();
                        return;
                    }
                }
            }
        }
    }
    set.push(c.clone());
}

/// `new` with the constants forgotten that differ from those of `old` at
/// the same place (where both have the same structure). Used to widen the
/// arguments of a recursive call against those of the calls in progress.
pub fn generalize(new: &AbsVal, old: &AbsVal) -> AbsVal {
    match (new, old) {
        (AbsVal::Tensor(x), AbsVal::Tensor(y)) => {
            if x.value.is_some() && x.value != y.value {
                AbsVal::Tensor(AbsTensor {
                    value: None,
                    ..x.clone()
                })
            } else {
                new.clone()
            }
        }
        (AbsVal::Tuple(x), AbsVal::Tuple(y)) if x.len() == y.len() => {
            AbsVal::Tuple(x.iter().zip(y).map(|(a, b)| generalize(a, b)).collect())
        }
        (AbsVal::Record(x), AbsVal::Record(y)) if x.len() == y.len() => AbsVal::Record(
            x.iter()
                .zip(y)
                .map(|((n, a), (m, b))| {
                    (n.clone(), if n == m { generalize(a, b) } else { a.clone() })
                })
                .collect(),
        ),
        (AbsVal::Str(Some(x)), AbsVal::Str(y)) if y.as_ref() != Some(x) => AbsVal::Str(None),
        (AbsVal::Func(x), AbsVal::Func(y)) => AbsVal::Func(
            x.iter()
                .map(|c| match c {
                    Closure::Graph { graph, captures } => {
                        let other = y.iter().find_map(|d| match d {
                            Closure::Graph {
                                graph: g,
                                captures: caps,
                            } if g == graph && caps.len() == captures.len() => Some(caps),
                            _ => None,
                        });
                        match other {
                            Some(caps) => Closure::Graph {
                                graph: *graph,
                                captures: generalize_all(captures, caps).into(),
                            },
                            None => c.clone(),
                        }
                    }
                    Closure::Prim(_) => c.clone(),
                })
                .collect(),
        ),
        _ => new.clone(),
    }
}

/// [`generalize`] pointwise over two lists of the same length.
pub fn generalize_all(new: &[AbsVal], old: &[AbsVal]) -> Vec<AbsVal> {
    if new.len() != old.len() {
        return new.to_vec();
    }
    new.iter().zip(old).map(|(a, b)| generalize(a, b)).collect()
}

/// Types as messages and the IR printer show them: `f32[3, 4]`, `f32[]`,
/// `(f32[], i64[])`, `{w: f32[4, 3], b: f32[3]}`, `fn`, `str`, `dtype`,
/// `io`, `?` for a value known only at run time, and `never` for a value
/// that is never produced.
impl fmt::Display for AbsVal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbsVal::Tensor(t) => write!(f, "{}", t.ty()),
            AbsVal::Tuple(items) => {
                write!(f, "(")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if items.len() == 1 {
                    write!(f, ",")?;
                }
                write!(f, ")")
            }
            AbsVal::Record(fields) => {
                write!(f, "{{")?;
                for (i, (n, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{n}: {v}")?;
                }
                write!(f, "}}")
            }
            AbsVal::Str(_) => write!(f, "str"),
            AbsVal::Func(_) => write!(f, "fn"),
            AbsVal::DType(_) => write!(f, "dtype"),
            AbsVal::Io => write!(f, "io"),
            AbsVal::Unknown => write!(f, "?"),
            AbsVal::Bottom => write!(f, "never"),
            AbsVal::Zero => write!(f, "zero"),
        }
    }
}

/// Reads a list of types written as [`AbsVal`]'s `Display` writes them,
/// separated by commas: `f32[3, 4], (f64[], i64[]), {w: f32[2]}`. A
/// tensor type is a dtype and a shape (not weakly typed, value unknown);
/// an integer literal (`3`) is an `i64` scalar of that value, as an entry
/// function's int arguments are (the language specialises on them). For
/// entry arguments in tests and tools; an empty text is an empty list.
pub fn parse_types(text: &str) -> Result<Vec<AbsVal>, String> {
    let mut p = TypeParser {
        s: text.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    p.ws();
    if p.i == p.s.len() {
        return Ok(out);
    }
    loop {
        out.push(p.ty()?);
        p.ws();
        if p.i == p.s.len() {
            return Ok(out);
        }
        p.expect(b',')?;
    }
}

struct TypeParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl TypeParser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.error(&format!("`{}`", c as char)))
        }
    }

    fn error(&self, what: &str) -> String {
        let rest = String::from_utf8_lossy(&self.s[self.i.min(self.s.len())..]);
        if rest.is_empty() {
            format!("expected {what} at the end of the type")
        } else {
            format!("expected {what} at `{rest}`")
        }
    }

    fn word(&mut self) -> &str {
        self.ws();
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
        {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i]).expect("ASCII")
    }

    /// A list of items up to `close`, after the opening bracket; whether
    /// the last item was followed by a comma.
    fn items<T>(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<(Vec<T>, bool), String> {
        let mut out = Vec::new();
        let mut trailing = false;
        while self.peek() != Some(close) {
            out.push(item(self)?);
            trailing = false;
            if self.peek() == Some(b',') {
                self.i += 1;
                trailing = true;
            } else if self.peek() != Some(close) {
                return Err(self.error(&format!("`,` or `{}`", close as char)));
            }
        }
        self.i += 1;
        Ok((out, trailing))
    }

    fn ty(&mut self) -> Result<AbsVal, String> {
        match self.peek() {
            Some(b'(') => {
                self.i += 1;
                let (items, trailing) = self.items(b')', |p| p.ty())?;
                if items.len() == 1 && !trailing {
                    return Err("a tuple of one type is written `(t,)`".into());
                }
                Ok(AbsVal::Tuple(items))
            }
            Some(b'{') => {
                self.i += 1;
                let (fields, _) = self.items(b'}', |p| {
                    let name = p.word().to_string();
                    if name.is_empty() {
                        return Err(p.error("a field name"));
                    }
                    p.expect(b':')?;
                    Ok((Arc::from(name), p.ty()?))
                })?;
                Ok(AbsVal::Record(fields))
            }
            Some(c) if c.is_ascii_digit() || c == b'-' => {
                let w = self.word().to_string();
                w.parse::<i64>()
                    .map(|v| AbsVal::int(v, false))
                    .map_err(|_| format!("`{w}` is not an integer"))
            }
            _ => {
                let w = self.word().to_string();
                let dtype = DType::from_name(&w).ok_or_else(|| {
                    if w.is_empty() {
                        self.error("a type")
                    } else {
                        format!("unknown dtype `{w}`")
                    }
                })?;
                self.expect(b'[')?;
                let (dims, _) = self.items(b']', |p| {
                    let d = p.word().to_string();
                    d.parse::<usize>()
                        .map_err(|_| format!("`{d}` is not a dimension"))
                })?;
                Ok(AbsVal::tensor(dtype, &dims))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    fn t(d: DType, shape: &[usize], weak: bool) -> AbsVal {
        AbsVal::Tensor(AbsTensor::new(d, shape.to_vec(), weak))
    }

    #[test]
    fn parses_types_as_displayed() {
        for text in [
            "f32[3, 4]",
            "f64[]",
            "(f32[], i64[])",
            "(f32[],)",
            "()",
            "{w: f32[4, 3], b: f32[3]}",
            "(bool[2], {x: (u8[1], i32[]), y: f64[0]})",
        ] {
            let v = parse_types(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(v.len(), 1, "{text}");
            assert_eq!(v[0].to_string(), text);
        }
        assert_eq!(
            parse_types(" f32[2] , 3 ").unwrap(),
            vec![AbsVal::tensor(F32, &[2]), AbsVal::int(3, false)]
        );
        assert_eq!(parse_types("  ").unwrap(), vec![]);
        for bad in [
            "f16[2]",
            "f32",
            "f32[2",
            "(f32[])",
            "f32[2] f32[3]",
            "{: f32[]}",
            "f32[x]",
        ] {
            assert!(parse_types(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn display() {
        assert_eq!(AbsVal::tensor(F32, &[3, 4]).to_string(), "f32[3, 4]");
        assert_eq!(AbsVal::scalar(F32).to_string(), "f32[]");
        assert_eq!(
            AbsVal::Tuple(vec![AbsVal::scalar(F32), AbsVal::int(3, true)]).to_string(),
            "(f32[], i64[])"
        );
        assert_eq!(
            AbsVal::Tuple(vec![AbsVal::scalar(F32)]).to_string(),
            "(f32[],)"
        );
        assert_eq!(
            AbsVal::Record(vec![
                ("w".into(), AbsVal::tensor(F32, &[4, 3])),
                ("b".into(), AbsVal::tensor(F32, &[3])),
            ])
            .to_string(),
            "{w: f32[4, 3], b: f32[3]}"
        );
        assert_eq!(
            AbsVal::Func(vec![Closure::Prim(Prim::Add)]).to_string(),
            "fn"
        );
        assert_eq!(AbsVal::Io.to_string(), "io");
    }

    #[test]
    fn joins() {
        let a = t(F32, &[3], false);
        assert_eq!(join(&a, &a), Some(a.clone()));
        assert_eq!(join(&a, &t(F32, &[4], false)), None);
        assert_eq!(join(&a, &t(F64, &[3], false)), None);
        // a weak literal adopts the strong dtype
        assert_eq!(join(&t(F64, &[3], true), &a), Some(a.clone()));
        assert_eq!(
            join(&t(I64, &[], true), &t(F64, &[], true)),
            Some(t(F64, &[], true))
        );
        assert_eq!(join(&t(I64, &[], false), &t(F64, &[], true)), None);
        // differing constants become unknown
        assert_eq!(
            join(&AbsVal::int(1, true), &AbsVal::int(2, true)),
            Some(t(I64, &[], true))
        );
        assert_eq!(join(&AbsVal::Bottom, &a), Some(a.clone()));
        assert_eq!(join(&AbsVal::Unknown, &a), Some(AbsVal::Unknown));
        let f = AbsVal::Func(vec![Closure::Prim(Prim::Add)]);
        let g = AbsVal::Func(vec![Closure::Prim(Prim::Mul)]);
        assert_eq!(
            join(&f, &g),
            Some(AbsVal::Func(vec![
                Closure::Prim(Prim::Add),
                Closure::Prim(Prim::Mul)
            ]))
        );
    }

    #[test]
    fn generalizes_only_what_varies() {
        let new = AbsVal::Tuple(vec![AbsVal::int(3, true), AbsVal::int(10, true)]);
        let old = AbsVal::Tuple(vec![AbsVal::int(2, true), AbsVal::int(10, true)]);
        assert_eq!(
            generalize(&new, &old),
            AbsVal::Tuple(vec![t(I64, &[], true), AbsVal::int(10, true)])
        );
    }

    #[test]
    fn parts_are_counted_up_to_the_limit() {
        let x = AbsVal::scalar(F32);
        assert!(!x.exceeds_parts(1));
        assert!(x.exceeds_parts(0));
        let pair = AbsVal::Tuple(vec![x.clone(), x.clone()]);
        assert!(!pair.exceeds_parts(3) && pair.exceeds_parts(2));
        let rec = AbsVal::Record(vec![("a".into(), pair.clone()), ("b".into(), x.clone())]);
        assert!(!rec.exceeds_parts(5) && rec.exceeds_parts(4));
        let f = AbsVal::Func(vec![Closure::Graph {
            graph: GraphId(0),
            captures: vec![rec.clone()].into(),
        }]);
        assert!(!f.exceeds_parts(6) && f.exceeds_parts(5));
        // counting stops at the limit
        let mut t = x;
        for _ in 0..17 {
            t = AbsVal::Tuple(vec![t.clone(), t]);
        }
        assert!(t.exceeds_parts(MAX_VALUE_PARTS));
    }

    #[test]
    fn constants_wrap_to_their_dtype() {
        let x = AbsTensor::new(U8, vec![], false).with_value(vec![300]);
        assert_eq!(x.scalar_value(), Some(44));
        let y = AbsTensor::new(F32, vec![], false).with_value(vec![1]);
        assert_eq!(y.value, None);
    }
}
