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
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
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
        }
    }
}
