//! Run-time values: what the VM and the kernels pass around.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

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
    Tape(Tape),
    /// A tensor with lanes, inside `vmap` ([`crate::batch`]).
    Batched(Arc<Batched>),
    /// Inside `vmap`, one value per lane where the lanes' values differ in
    /// structure ([`Lanes`]).
    Lanes(Arc<Lanes>),
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
            Value::Batched(b) => format!("{} (mapped)", b.type_string()),
            Value::Lanes(l) => format!(
                "{} (mapped, per lane)",
                l.items.first().map_or("value".into(), |v| v.kind())
            ),
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
            Value::Batched(b) => write!(f, "<mapped {}: {}>", b.type_string(), b.t),
            Value::Lanes(l) => {
                write!(f, "<mapped:")?;
                for v in &l.items {
                    write!(f, " {v}")?;
                }
                write!(f, ">")
            }
        }
    }
}

/// Where a push site remembers how long its last tape grew (records,
/// values), so that the next tape it starts is allocated at that size.
#[derive(Debug, Default)]
pub struct TapeHint {
    records: AtomicUsize,
    values: AtomicUsize,
}

impl TapeHint {
    /// The capacities to allocate (records, values).
    pub fn get(&self) -> (usize, usize) {
        (self.records.load(Relaxed), self.values.load(Relaxed))
    }
}

#[derive(Debug)]
struct Buf {
    /// Per record: its code, and where its values start in `values`.
    records: Vec<(CodeId, u32)>,
    values: Vec<Value>,
    hint: Option<Arc<TapeHint>>,
}

impl Buf {
    /// Where the values of the records after the first `len` start.
    fn values_end(&self, len: usize) -> usize {
        self.records
            .get(len)
            .map_or(self.values.len(), |r| r.1 as usize)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(h) = &self.hint {
            h.records.store(self.records.len(), Relaxed);
            h.values.store(self.values.len(), Relaxed);
        }
    }
}

/// A stack of backpropagators: the first `len` records of a shared buffer
/// ([`crate::tape`] says how it is used; it is defined here because a value
/// holds a tape and a tape holds values).
#[derive(Clone, Debug)]
pub struct Tape {
    buf: Arc<Mutex<Buf>>,
    len: usize,
}

/// The most values a tape holds (its positions are `u32`).
const MAX_VALUES: usize = u32::MAX as usize;

thread_local! {
    static GROWTHS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many pushes on this thread so far found their tape full (and so
/// moved it to a larger buffer).
pub fn tape_growths() -> u64 {
    GROWTHS.with(|g| g.get())
}

impl Tape {
    fn lock(&self) -> MutexGuard<'_, Buf> {
        // A panic while the lock was held leaves the buffer consistent
        // (every change is one push): go on with it.
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many backpropagators are on the tape.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The length of the tuple the tape reads as: `(top, rest)`, or `()`
    /// when empty.
    pub fn list_len(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            2
        }
    }

    /// `stack` with the function `code` of `captures` pushed on top, where
    /// `stack` is a tape or `()` (an empty stack: a new tape, sized by
    /// `hint`). `None` for any other `stack` (a list of tuples made by
    /// code that does not use tapes), and for a tape that would outgrow
    /// `u32` positions: then `captures` has not been read, and the caller
    /// pushes a tuple cell.
    pub fn push(
        stack: &Value,
        code: CodeId,
        captures: impl ExactSizeIterator<Item = Value>,
        hint: &Arc<TapeHint>,
    ) -> Option<Value> {
        let n = captures.len();
        match stack {
            Value::Tape(t) => {
                let mut buf = t.lock();
                if buf.records.len() == t.len && buf.values.len() + n <= MAX_VALUES {
                    if buf.records.len() == buf.records.capacity()
                        || buf.values.len() + n > buf.values.capacity()
                    {
                        GROWTHS.with(|g| g.set(g.get() + 1));
                    }
                    let start = buf.values.len() as u32;
                    buf.records.push((code, start));
                    buf.values.extend(captures);
                    drop(buf);
                    return Some(Value::Tape(Tape {
                        buf: t.buf.clone(),
                        len: t.len + 1,
                    }));
                }
                // Another push went on from this tape: copy what it has.
                let end = buf.values_end(t.len);
                if end + n > MAX_VALUES {
                    return None;
                }
                let mut records = Vec::with_capacity(t.len + 1);
                records.extend_from_slice(&buf.records[..t.len]);
                let mut values = Vec::with_capacity(end + n);
                values.extend_from_slice(&buf.values[..end]);
                drop(buf);
                records.push((code, end as u32));
                values.extend(captures);
                Some(Tape::from_parts(records, values, Some(hint.clone())))
            }
            Value::Tuple(t) if t.is_empty() => {
                let (r, v) = hint.get();
                let mut records = Vec::with_capacity(r.max(1));
                let mut values = Vec::with_capacity(v.max(n));
                records.push((code, 0));
                values.extend(captures);
                Some(Tape::from_parts(records, values, Some(hint.clone())))
            }
            _ => None,
        }
    }

    pub(crate) fn from_parts(
        records: Vec<(CodeId, u32)>,
        values: Vec<Value>,
        hint: Option<Arc<TapeHint>>,
    ) -> Value {
        let len = records.len();
        Value::Tape(Tape {
            buf: Arc::new(Mutex::new(Buf {
                records,
                values,
                hint,
            })),
            len,
        })
    }

    /// The tape without its top record (itself when empty).
    pub fn rest(&self) -> Tape {
        Tape {
            buf: self.buf.clone(),
            len: self.len.saturating_sub(1),
        }
    }

    /// Runs `f` on the top record's code and values; `None` when empty.
    pub fn with_top<R>(&self, f: impl FnOnce(CodeId, &[Value]) -> R) -> Option<R> {
        if self.len == 0 {
            return None;
        }
        let buf = self.lock();
        let (code, start) = buf.records[self.len - 1];
        let end = buf.values_end(self.len);
        Some(f(code, &buf.values[start as usize..end]))
    }

    /// The top record as a function value (a closure of its code).
    pub fn top(&self) -> Option<Value> {
        self.with_top(|code, captures| {
            Value::Func(Arc::new(Closure {
                code,
                captures: captures.to_vec(),
            }))
        })
    }

    /// Whether some value saved on the tape satisfies `f`.
    pub fn any_value(&self, mut f: impl FnMut(&Value) -> bool) -> bool {
        let buf = self.lock();
        let end = buf.values_end(self.len);
        buf.values[..end].iter().any(|v| f(v))
    }

    /// The values saved on the tape, one record after another.
    pub fn values(&self) -> Vec<Value> {
        let buf = self.lock();
        let end = buf.values_end(self.len);
        buf.values[..end].to_vec()
    }

    /// How many values the tape's records saved.
    pub fn values_len(&self) -> usize {
        self.lock().values_end(self.len)
    }

    /// Whether `self` and `other` hold records of the same code in the same
    /// order (so that their values correspond one to one).
    pub fn same_records(&self, other: &Tape) -> bool {
        if self.len != other.len {
            return false;
        }
        if Arc::ptr_eq(&self.buf, &other.buf) {
            return true;
        }
        let a = self.lock().records[..self.len].to_vec();
        let b = other.lock();
        a[..] == b.records[..other.len]
    }

    /// The same records over new values (`values`, as many as
    /// [`Tape::values`] gives, in its order).
    pub fn with_values(&self, values: Vec<Value>) -> Value {
        let records = self.lock().records[..self.len].to_vec();
        Tape::from_parts(records, values, None)
    }

    /// Whether `self` and `other` are the same stack (the same records of
    /// the same buffer).
    pub fn same(&self, other: &Tape) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf) && self.len == other.len
    }
}

/// A value with lanes (`vmap`, [`crate::batch`]): `t`'s first `levels.len()` axes are the lanes of
/// those levels (ascending), the rest its logical shape.
#[derive(Clone, Debug)]
pub struct Batched {
    pub levels: Vec<u32>,
    pub t: Tensor,
}

impl Batched {
    /// The lane counts, one per level.
    pub fn lanes(&self) -> &[usize] {
        &self.t.shape()[..self.levels.len()]
    }
    /// The shape one lane sees.
    pub fn logical(&self) -> &[usize] {
        &self.t.shape()[self.levels.len()..]
    }
    /// The type one lane sees, for messages.
    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self.logical().iter().map(|d| d.to_string()).collect();
        format!("{}[{}]", self.t.dtype(), dims.join(", "))
    }
}

/// The values of the lanes of `level` one by one, where they cannot be
/// stacked: their structures differ (a list of reverse mode's
/// backpropagators one element longer in one lane, say). Every operation
/// on it runs once per lane.
#[derive(Clone, Debug)]
pub struct Lanes {
    pub level: u32,
    pub items: Vec<Value>,
}
