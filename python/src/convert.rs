//! Values across the boundary (docs/python.md, "Conversions").
//!
//! In: a NumPy array of a supported dtype becomes a tensor of that dtype
//! and shape; its elements are copied once into a buffer the runtime owns
//! (one `memcpy` for a C-contiguous array, a gather otherwise), because a
//! tensor's buffer is a Rust `Vec` the kernels may reuse for their results.
//! Python `float` and `int` are weakly typed scalars (`f64`, `i64`), like
//! literals in the source: they take the dtype of what they meet; `bool`
//! is a bool scalar; NumPy scalars (`np.float32(1)`) are strongly typed
//! scalars of their dtype; tuples and lists become tuples, dicts with
//! `str` keys records (in the dict's order), `str` strings. Anything else
//! with `__array__` goes through `numpy.asarray`.
//!
//! Out: a tensor of one or more dimensions becomes a NumPy array; from
//! 16 KiB up it takes over the result's buffer without a copy when nothing
//! else holds it (a result that is also an input, or part of one, is
//! copied), smaller ones are copied into an array NumPy allocates; `f64`,
//! `i64` and bool scalars become Python `float`, `int` and `bool`; `f32`,
//! `i32` and `u8` scalars NumPy scalars of their dtype; tuples tuples,
//! records dicts, strings `str`.

use std::sync::Arc;

use adjoint::{DType, Tensor, Value};
use adjoint_runtime::tensor::Element;
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Why a Python value could not be converted, and where in it.
pub(crate) struct ConvError {
    /// The path inside the argument: `[2]['w']`.
    path: String,
    message: String,
}

impl ConvError {
    fn new(message: String) -> ConvError {
        ConvError {
            path: String::new(),
            message,
        }
    }

    fn inside(mut self, step: String) -> ConvError {
        self.path.insert_str(0, &step);
        self
    }

    /// The message, for `what` (which argument).
    pub(crate) fn describe(&self, what: &str) -> String {
        if self.path.is_empty() {
            format!("{what}: {}", self.message)
        } else {
            format!("{what}, at {}: {}", self.path, self.message)
        }
    }
}

const EXPECTED: &str = "expected a NumPy array (float32, float64, int32, int64, bool or uint8), \
                        a float, int or bool, a tuple or list of these, a dict with str keys, or a str";

/// The Adjoint value of a Python value.
pub(crate) fn to_value(x: &Bound<'_, PyAny>) -> Result<Value, ConvError> {
    if let Ok(a) = x.cast::<PyUntypedArray>() {
        return array_to_value(a);
    }
    if x.is_exact_instance_of::<PyFloat>() {
        let v: f64 = x
            .extract()
            .map_err(|e: PyErr| ConvError::new(e.to_string()))?;
        return Ok(Value::Tensor(Tensor::weak_f64(v)));
    }
    if x.is_instance_of::<PyBool>() {
        let v: bool = x
            .extract()
            .map_err(|e: PyErr| ConvError::new(e.to_string()))?;
        return Ok(Value::Tensor(Tensor::scalar_bool(v)));
    }
    if x.is_exact_instance_of::<PyInt>() {
        let v: i64 = x.extract().map_err(|_| {
            ConvError::new(format!(
                "the int {} does not fit in an i64",
                x.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?;
        return Ok(Value::Tensor(Tensor::weak_i64(v)));
    }
    if let Ok(t) = x.cast::<PyTuple>() {
        return items_to_value(t.iter());
    }
    if let Ok(l) = x.cast::<PyList>() {
        return items_to_value(l.iter());
    }
    if let Ok(d) = x.cast::<PyDict>() {
        let mut fields: Vec<(Arc<str>, Value)> = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Ok(k) = k.cast::<PyString>() else {
                return Err(ConvError::new(format!(
                    "a dict becomes a record, so its keys must be str, not {}",
                    crate::type_name(&k)
                )));
            };
            let name = k.to_string();
            let v = to_value(&v).map_err(|e| {
                let key = k.repr().map(|r| r.to_string()).unwrap_or_default();
                e.inside(format!("[{key}]"))
            })?;
            fields.push((Arc::from(name.as_str()), v));
        }
        return Ok(Value::record(fields));
    }
    if let Ok(s) = x.cast::<PyString>() {
        return Ok(Value::str(s.to_string()));
    }
    // NumPy scalars (np.float32(1.0), np.float64 — a float subclass —,
    // np.int64, np.bool_), int and float subclasses, and anything else
    // that NumPy can read (`__array__`): through numpy.asarray.
    let py = x.py();
    let numeric = x.is_instance_of::<PyFloat>() || x.is_instance_of::<PyInt>();
    if numeric || x.hasattr("__array__").unwrap_or(false) {
        let a = py
            .import("numpy")
            .and_then(|np| np.getattr("asarray"))
            .and_then(|f| f.call1((x,)))
            .map_err(|e| ConvError::new(format!("numpy.asarray failed: {e}")))?;
        if let Ok(a) = a.cast::<PyUntypedArray>() {
            return array_to_value(a);
        }
    }
    Err(ConvError::new(format!(
        "{EXPECTED}; got {}",
        crate::type_name(x)
    )))
}

fn items_to_value<'py>(items: impl Iterator<Item = Bound<'py, PyAny>>) -> Result<Value, ConvError> {
    let vs = items
        .enumerate()
        .map(|(i, v)| to_value(&v).map_err(|e| e.inside(format!("[{i}]"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::tuple(vs))
}

fn array_to_value(a: &Bound<'_, PyUntypedArray>) -> Result<Value, ConvError> {
    if !a.is_aligned() {
        // Elements at addresses their type may not be read from (an array
        // over a byte buffer at an odd offset): an aligned copy first.
        return normalised(a, false);
    }
    fn typed<T: Element + numpy::Element + Copy>(
        a: &Bound<'_, PyUntypedArray>,
    ) -> Option<Result<Value, ConvError>> {
        let a = a.cast::<PyArrayDyn<T>>().ok()?;
        Some(copy_in(a))
    }
    if let Some(v) = typed::<f64>(a)
        .or_else(|| typed::<f32>(a))
        .or_else(|| typed::<i64>(a))
        .or_else(|| typed::<i32>(a))
        .or_else(|| typed::<bool>(a))
        .or_else(|| typed::<u8>(a))
    {
        return v;
    }
    let dtype = a.dtype();
    if !is_native(&dtype) {
        // A supported dtype in the other byte order: converted to this
        // machine's.
        return normalised(a, true);
    }
    let name = dtype
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "unknown".into());
    Err(ConvError::new(format!(
        "a NumPy array of dtype {name} is not supported; expected float32, float64, int32, \
         int64, bool or uint8; convert it with .astype(...)"
    )))
}

/// Whether a dtype is in this machine's byte order (NumPy's
/// `dtype.isnative`).
fn is_native(dtype: &Bound<'_, numpy::PyArrayDescr>) -> bool {
    dtype
        .getattr("isnative")
        .and_then(|v| v.extract::<bool>())
        .unwrap_or(true)
}

/// An aligned C-contiguous copy of `a` (in native byte order when
/// `native`), converted.
fn normalised(a: &Bound<'_, PyUntypedArray>, native: bool) -> Result<Value, ConvError> {
    let copy = (|| -> PyResult<Bound<'_, PyAny>> {
        let dtype = a.dtype();
        let dtype = if native {
            dtype.call_method1("newbyteorder", ("=",))?
        } else {
            dtype.into_any()
        };
        // `astype` always copies, into memory NumPy allocates (aligned).
        let kwargs = pyo3::types::PyDict::new(a.py());
        kwargs.set_item("order", "C")?;
        a.call_method("astype", (dtype,), Some(&kwargs))
    })()
    .map_err(|e| ConvError::new(format!("the array could not be copied: {e}")))?;
    match copy.cast::<PyUntypedArray>() {
        Ok(c) if c.is_aligned() && (!native || is_native(&c.dtype())) => array_to_value(c),
        _ => Err(ConvError::new(
            "the array could not be converted to an aligned one in native byte order".into(),
        )),
    }
}

/// The array's elements copied into a tensor (row-major).
fn copy_in<T: Element + numpy::Element + Copy>(
    a: &Bound<'_, PyArrayDyn<T>>,
) -> Result<Value, ConvError> {
    // SAFETY: the elements are read while this thread holds the GIL, so no
    // Python code writes to them meanwhile; the views do not outlive the
    // copy. (NumPy's borrow tracking, `try_readonly`, would guard against
    // Rust code elsewhere holding a mutable view across a GIL release, at
    // a cost of about a microsecond per array.)
    let data: Vec<T> = unsafe {
        // `as_slice` also accepts Fortran order, whose memory order is not
        // the row-major order a tensor needs.
        match a.is_c_contiguous().then(|| a.as_slice().ok()).flatten() {
            Some(s) => s.to_vec(),
            // Not C-contiguous (a transposed, Fortran-ordered or strided
            // view): gathered in row-major order.
            None => a.as_array().iter().copied().collect(),
        }
    };
    Tensor::from_vec(data, a.shape())
        .map(Value::Tensor)
        .map_err(|e| ConvError::new(e.message))
}

/// The structure, dtypes and shapes of a value, kept to check that a
/// cotangent or a tangent has the type of what it goes with.
pub(crate) enum Layout {
    Tensor { dtype: DType, shape: Vec<usize> },
    Tuple(Vec<Layout>),
    Record(Vec<(Arc<str>, Layout)>),
    Other,
}

impl Layout {
    pub(crate) fn of(v: &Value) -> Layout {
        match v {
            Value::Tensor(t) => Layout::Tensor {
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
            },
            Value::Tuple(items) => Layout::Tuple(items.iter().map(Layout::of).collect()),
            Value::Record(r) => Layout::Record(
                r.fields
                    .iter()
                    .map(|(n, v)| (n.clone(), Layout::of(v)))
                    .collect(),
            ),
            _ => Layout::Other,
        }
    }

    fn describe(&self) -> String {
        match self {
            Layout::Tensor { dtype, shape } => {
                let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                format!("{dtype}[{}]", dims.join(", "))
            }
            Layout::Tuple(items) => {
                let items: Vec<String> = items.iter().map(Layout::describe).collect();
                format!(
                    "({}{})",
                    items.join(", "),
                    if items.len() == 1 { "," } else { "" }
                )
            }
            Layout::Record(fields) => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|(n, l)| format!("{n}: {}", l.describe()))
                    .collect();
                format!("{{{}}}", fields.join(", "))
            }
            Layout::Other => "a value".into(),
        }
    }

    /// Whether `v` fits where a value of this layout goes (a tangent of
    /// this primal, a cotangent of this result): the same structure,
    /// shapes and float dtype; a Python float (weak) takes the dtype it
    /// meets. `Err` says where it does not.
    pub(crate) fn admits(&self, v: &Value) -> Result<(), ConvError> {
        let mismatch = || {
            ConvError::new(format!(
                "expected {}, got {}",
                self.describe(),
                adjoint::value_type(v)
            ))
        };
        match (self, v) {
            // Ints and bools have no derivative: what goes with them is
            // the program's to judge.
            (Layout::Tensor { dtype, .. }, _) if !dtype.is_float() => Ok(()),
            (Layout::Tensor { dtype, shape }, Value::Tensor(t)) => {
                let dtype_ok = t.dtype() == *dtype || (t.weak && dtype.is_float());
                if t.shape() == shape.as_slice() && dtype_ok {
                    Ok(())
                } else {
                    Err(mismatch())
                }
            }
            (Layout::Tuple(items), Value::Tuple(vs)) if items.len() == vs.len() => {
                for (i, (l, v)) in items.iter().zip(vs.iter()).enumerate() {
                    l.admits(v).map_err(|e| e.inside(format!("[{i}]")))?;
                }
                Ok(())
            }
            (Layout::Record(fields), Value::Record(r))
                if fields.len() == r.fields.len()
                    && fields.iter().zip(&r.fields).all(|((a, _), (b, _))| a == b) =>
            {
                for ((n, l), (_, v)) in fields.iter().zip(&r.fields) {
                    l.admits(v).map_err(|e| e.inside(format!("['{n}']")))?;
                }
                Ok(())
            }
            (Layout::Other, _) => Ok(()),
            _ => Err(mismatch()),
        }
    }
}

/// The Python value of an Adjoint value.
pub(crate) fn to_python(py: Python<'_>, v: Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Tensor(t) => tensor_to_python(py, t)?,
        Value::Tuple(items) => {
            let items = items
                .iter()
                .map(|v| to_python(py, v.clone()))
                .collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, items)?.into_any().unbind()
        }
        Value::Record(r) => {
            let d = PyDict::new(py);
            for (k, v) in &r.fields {
                d.set_item(&**k, to_python(py, v.clone())?)?;
            }
            d.into_any().unbind()
        }
        Value::Str(s) => PyString::new(py, &s).into_any().unbind(),
        Value::DType(d) => PyString::new(py, d.name()).into_any().unbind(),
        // A symbolic zero that reached the result: no contribution.
        Value::Zero => PyFloat::new(py, 0.0).into_any().unbind(),
        other => {
            return Err(crate::usage_error(
                py,
                format!(
                    "the result is a {}, which cannot be returned to Python (return tensors, \
                 numbers, tuples, records or strings)",
                    other.kind()
                ),
            ))
        }
    })
}

/// Results from this size up become NumPy arrays over their own buffer;
/// smaller ones are copied into arrays NumPy allocates.
const TAKE_OVER_BYTES: usize = 16 << 10;

fn tensor_to_python(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
    if t.shape().is_empty() {
        let np = || py.import("numpy");
        return Ok(match t.dtype() {
            DType::F64 => PyFloat::new(py, t.to_f64_scalar().unwrap_or(f64::NAN))
                .into_any()
                .unbind(),
            DType::I64 => t
                .to_i64_scalar()
                .unwrap_or(0)
                .into_pyobject(py)?
                .into_any()
                .unbind(),
            DType::Bool => PyBool::new(py, t.to_bool_scalar().unwrap_or(false))
                .to_owned()
                .into_any()
                .unbind(),
            DType::F32 => np()?
                .getattr("float32")?
                .call1((t.to_f64_scalar().unwrap_or(f64::NAN),))?
                .unbind(),
            DType::I32 => np()?
                .getattr("int32")?
                .call1((t.to_i64_scalar().unwrap_or(0),))?
                .unbind(),
            DType::U8 => np()?
                .getattr("uint8")?
                .call1((t.to_i64_scalar().unwrap_or(0),))?
                .unbind(),
        });
    }
    fn array<T: Element + numpy::Element + Copy>(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
        let shape = t.shape().to_vec();
        if t.len() * std::mem::size_of::<T>() < TAKE_OVER_BYTES {
            // Small: a NumPy-allocated array and a copy cost less than an
            // array over Rust memory (which needs an owner object).
            let src = t.slice::<T>().unwrap_or_default();
            // SAFETY: every element of the new array is written before it
            // is returned; it is C-contiguous, so `as_slice_mut` succeeds.
            unsafe {
                let a = PyArrayDyn::<T>::new(py, IxDyn(&shape), false);
                if let Ok(dst) = a.as_slice_mut() {
                    dst.copy_from_slice(src);
                }
                return Ok(a.into_any().unbind());
            }
        }
        // The buffer itself when the result holds the only reference.
        let data = match t.into_vec::<T>() {
            Ok(v) => v,
            Err(t) => t.slice::<T>().map(<[T]>::to_vec).unwrap_or_default(),
        };
        let a = ArrayD::from_shape_vec(IxDyn(&shape), data)
            .map_err(|e| crate::usage_error(py, format!("internal error: {e}")))?;
        Ok(a.into_pyarray(py).into_any().unbind())
    }
    match t.dtype() {
        DType::F32 => array::<f32>(py, t),
        DType::F64 => array::<f64>(py, t),
        DType::I32 => array::<i32>(py, t),
        DType::I64 => array::<i64>(py, t),
        DType::Bool => array::<bool>(py, t),
        DType::U8 => array::<u8>(py, t),
    }
}

/// What a program prints, written to Python's `sys.stdout` a line at a
/// time (so that notebooks and pytest's capture see it), taking the GIL
/// only to write.
#[derive(Default)]
pub(crate) struct PyStdout {
    pending: Vec<u8>,
}

impl PyStdout {
    fn emit(&mut self, upto: usize) -> std::io::Result<()> {
        if upto == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.pending[..upto]).into_owned();
        self.pending.drain(..upto);
        Python::attach(|py| {
            py.import("sys")
                .and_then(|sys| sys.getattr("stdout"))
                .and_then(|out| out.call_method1("write", (text,)))
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string()))
        })
    }
}

impl std::io::Write for PyStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if let Some(last) = self.pending.iter().rposition(|b| *b == b'\n') {
            self.emit(last + 1)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let n = self.pending.len();
        self.emit(n)
    }
}

impl Drop for PyStdout {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}
