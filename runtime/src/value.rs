//! Run-time values: what the VM and the kernels pass around.

use std::fmt;
use std::sync::Arc;

use crate::tensor::{DType, Tensor};

/// Index of a compiled code object (one graph) inside a [`crate::vm::Program`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CodeId(pub u32);

/// A function value: a code object plus the values it captured.
#[derive(Clone, Debug)]
pub struct Closure {
    /// The code object.
    pub code: CodeId,
    /// The captured values, in the code object's order.
    pub captures: Vec<Value>,
}

/// Closures can form long chains (the backpropagator of each loop
/// iteration captures the next one's): drop them with a work list rather
/// than recursively, so a chain of a million closures cannot overflow the
/// stack.
impl Drop for Closure {
    fn drop(&mut self) {
        let mut stack: Vec<Value> = std::mem::take(&mut self.captures);
        while let Some(v) = stack.pop() {
            match v {
                Value::Func(f) => {
                    if let Some(mut c) = Arc::into_inner(f) {
                        stack.append(&mut c.captures);
                    }
                }
                Value::Tuple(t) if Arc::strong_count(&t) == 1 => {
                    // Move the elements to the work list; dropping the tuple
                    // then only releases references.
                    stack.extend(t.iter().cloned());
                }
                Value::Env(e) if Arc::strong_count(&e) == 1 => {
                    stack.extend(e.iter().map(|(_, v)| v.clone()));
                }
                Value::Record(r) if Arc::strong_count(&r) == 1 => {
                    stack.extend(r.fields.iter().map(|(_, v)| v.clone()));
                }
                other => drop(other),
            }
        }
    }
}

/// A record: named fields in written order.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Field names and values, in written order.
    pub fields: Vec<(Arc<str>, Value)>,
}

impl Record {
    /// A record with the given fields, in order.
    pub fn new(fields: Vec<(Arc<str>, Value)>) -> Record {
        Record { fields }
    }

    /// The value of the field `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v)
    }
}

/// A run-time value.
///
/// Scalars are 0-d tensors; `()` is the empty tuple. `Io` is the state token
/// that orders side effects.
#[derive(Clone, Debug)]
pub enum Value {
    /// A tensor (scalars are 0-d tensors).
    Tensor(Tensor),
    /// A tuple; `()` is the empty one.
    Tuple(Arc<[Value]>),
    /// A record.
    Record(Arc<Record>),
    /// A string (for IO and printing).
    Str(Arc<str>),
    /// A function value.
    Func(Arc<Closure>),
    /// A dtype value (`f32`, the result of `dtype(x)`).
    DType(DType),
    /// The IO state token.
    Io,
    /// A symbolic zero cotangent made by differentiation: "no
    /// contribution". Adding it to anything gives the other operand.
    Zero,
    /// An environment of cotangents for the free variables of a closure,
    /// keyed by the forward node's id, sorted by key, keys unique.
    Env(Arc<Vec<(u64, Value)>>),
    /// Reverse mode's stack of backpropagators stored flat
    /// ([`crate::tape`]); it reads as the list `(top, rest)` it stands for.
    Tape(crate::tape::Tape),
}

impl Value {
    /// The unit value `()` (the empty tuple); also what an omitted optional
    /// kernel argument arrives as.
    pub fn unit() -> Value {
        Value::Tuple(Arc::from(Vec::new()))
    }
    /// A tuple of the given items.
    pub fn tuple(items: Vec<Value>) -> Value {
        Value::Tuple(Arc::from(items))
    }
    /// Whether this is `()`.
    pub fn is_unit(&self) -> bool {
        matches!(self, Value::Tuple(t) if t.is_empty())
    }
    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// A record with the given fields, in order.
    pub fn record<S: Into<Arc<str>>>(fields: Vec<(S, Value)>) -> Value {
        Value::Record(Arc::new(Record::new(
            fields.into_iter().map(|(n, v)| (n.into(), v)).collect(),
        )))
    }

    /// A string value.
    pub fn str(s: impl Into<Arc<str>>) -> Value {
        Value::Str(s.into())
    }

    /// The items, if this is a tuple.
    pub fn as_tuple(&self) -> Option<&[Value]> {
        match self {
            Value::Tuple(t) => Some(t),
            _ => None,
        }
    }

    /// The record, if this is one.
    pub fn as_record(&self) -> Option<&Record> {
        match self {
            Value::Record(r) => Some(r),
            _ => None,
        }
    }

    /// The text, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    /// A short description of the value's kind, for error messages
    /// (`f32[3, 4]`, `tuple`, `record`, `function`, ...).
    pub fn kind(&self) -> String {
        match self {
            Value::Tensor(t) => t.type_string(),
            Value::Tuple(_) => "tuple".into(),
            Value::Record(_) => "record".into(),
            Value::Str(_) => "string".into(),
            Value::Func(_) => "function".into(),
            Value::DType(_) => "dtype".into(),
            Value::Io => "io".into(),
            Value::Zero => "zero".into(),
            Value::Env(_) => "env".into(),
            Value::Tape(_) => "function stack".into(),
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}

/// Conversions between values and Rust numbers, vectors and slices (for
/// programs that embed the compiler). Values made here are strongly typed:
/// an `f64` is an `f64` scalar, not a weakly typed literal.
impl Value {
    /// An `f64` tensor of the given shape from its elements, row-major:
    /// `Value::tensor_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2])`. An error when
    /// the number of elements is not the shape's size.
    pub fn tensor_f64(data: &[f64], shape: &[usize]) -> Result<Value, crate::RtError> {
        Ok(Value::Tensor(Tensor::from_vec(data.to_vec(), shape)?))
    }

    /// An `f32` tensor of the given shape from its elements, row-major.
    pub fn tensor_f32(data: &[f32], shape: &[usize]) -> Result<Value, crate::RtError> {
        Ok(Value::Tensor(Tensor::from_vec(data.to_vec(), shape)?))
    }

    /// An `i64` tensor of the given shape from its elements, row-major.
    pub fn tensor_i64(data: &[i64], shape: &[usize]) -> Result<Value, crate::RtError> {
        Ok(Value::Tensor(Tensor::from_vec(data.to_vec(), shape)?))
    }

    /// The value of a 0-d numeric tensor (or one with a single element) as
    /// an `f64`; `None` for anything else.
    pub fn to_f64(&self) -> Option<f64> {
        let t = self.as_tensor()?;
        if t.len() != 1 || !t.dtype().is_numeric() {
            return None;
        }
        t.as_f64_vec().first().copied()
    }

    /// The value of a 0-d int tensor; `None` for anything else.
    pub fn to_i64(&self) -> Option<i64> {
        self.as_tensor()?.to_i64_scalar()
    }

    /// The value of a 0-d bool tensor; `None` for anything else.
    pub fn to_bool(&self) -> Option<bool> {
        self.as_tensor()?.to_bool_scalar()
    }

    /// The elements of a numeric tensor converted to `f64`, row-major;
    /// `None` when this is not a numeric tensor.
    pub fn to_vec_f64(&self) -> Option<Vec<f64>> {
        let t = self.as_tensor()?;
        t.dtype().is_numeric().then(|| t.as_f64_vec())
    }

    /// The elements of a numeric tensor converted to `f32`, row-major.
    pub fn to_vec_f32(&self) -> Option<Vec<f32>> {
        Some(self.to_vec_f64()?.into_iter().map(|x| x as f32).collect())
    }

    /// The shape of a tensor (`[]` for a scalar); `None` for other values.
    pub fn shape(&self) -> Option<&[usize]> {
        self.as_tensor().map(Tensor::shape)
    }

    /// The dtype of a tensor; `None` for other values.
    pub fn dtype(&self) -> Option<DType> {
        self.as_tensor().map(Tensor::dtype)
    }
}

impl From<f64> for Value {
    /// An `f64` scalar.
    fn from(v: f64) -> Value {
        Value::Tensor(Tensor::scalar(v))
    }
}

impl From<f32> for Value {
    /// An `f32` scalar.
    fn from(v: f32) -> Value {
        Value::Tensor(Tensor::scalar(v))
    }
}

impl From<i64> for Value {
    /// An `i64` scalar.
    fn from(v: i64) -> Value {
        Value::Tensor(Tensor::scalar(v))
    }
}

impl From<i32> for Value {
    /// An `i32` scalar.
    fn from(v: i32) -> Value {
        Value::Tensor(Tensor::scalar(v))
    }
}

impl From<bool> for Value {
    /// A bool scalar.
    fn from(v: bool) -> Value {
        Value::Tensor(Tensor::scalar(v))
    }
}

impl From<Vec<f64>> for Value {
    /// A 1-d `f64` tensor.
    fn from(v: Vec<f64>) -> Value {
        Value::Tensor(Tensor::vector(v))
    }
}

impl From<&[f64]> for Value {
    /// A 1-d `f64` tensor.
    fn from(v: &[f64]) -> Value {
        Value::Tensor(Tensor::vector(v.to_vec()))
    }
}

impl From<Vec<f32>> for Value {
    /// A 1-d `f32` tensor.
    fn from(v: Vec<f32>) -> Value {
        Value::Tensor(Tensor::vector(v))
    }
}

impl From<&[f32]> for Value {
    /// A 1-d `f32` tensor.
    fn from(v: &[f32]) -> Value {
        Value::Tensor(Tensor::vector(v.to_vec()))
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Tensor(a), Value::Tensor(b)) => a == b,
            (Value::Tuple(a), Value::Tuple(b)) => a == b,
            (Value::Record(a), Value::Record(b)) => a == b,
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Func(a), Value::Func(b)) => Arc::ptr_eq(a, b),
            (Value::DType(a), Value::DType(b)) => a == b,
            (Value::Io, Value::Io) => true,
            (Value::Zero, Value::Zero) => true,
            (Value::Env(a), Value::Env(b)) => a == b,
            (Value::Tape(a), Value::Tape(b)) => a.same(b),
            _ => false,
        }
    }
}

/// Formats a value the way `print` shows it (language.md §5).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Tensor(t) => write!(f, "{t}"),
            Value::Tuple(items) => {
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
            Value::Record(r) => {
                write!(f, "{{")?;
                for (i, (n, v)) in r.fields.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{n}: {v}")?;
                }
                write!(f, "}}")
            }
            Value::Str(s) => write!(f, "{s}"),
            Value::Func(_) => write!(f, "<function>"),
            Value::DType(d) => write!(f, "{d}"),
            Value::Io => write!(f, "<io>"),
            Value::Zero => write!(f, "zero"),
            Value::Env(_) => write!(f, "<env>"),
            Value::Tape(t) => write!(f, "<stack of {} functions>", t.len()),
        }
    }
}
