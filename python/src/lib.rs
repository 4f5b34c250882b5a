//! The Python package `adjoint`: load Adjoint programs, call their
//! functions on NumPy arrays and Python numbers, and differentiate them
//! with JAX-style transforms that Adjoint compiles.
//!
//! A thin layer over the root crate's [`adjoint::Session`] and
//! [`adjoint::Function`]: this file converts values at the boundary
//! (`convert`), turns [`adjoint::SessionError`]s into `AdjointError`s,
//! releases the GIL while compiled code runs and chains a SIGINT handler
//! in front of Python's for the duration of a call on the main thread, so
//! that Ctrl-C stops the program (`interrupt`). See `docs/python.md`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use adjoint::{Mode, Session, SessionError, Value};
use pyo3::exceptions::{PyAttributeError, PyException, PyKeyError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyType};

mod convert;
mod interrupt;

/// Rust allocations of the extension (tensors, the VM's frames) go through
/// Adjoint's allocator, mimalloc, as in the `adjoint` command: with the C
/// library's, calls on small inputs spent about 15% of their time in
/// malloc and free.
/// Arrays handed to NumPy without a copy are freed through it too (by
/// their owner object, in Rust).
#[global_allocator]
static ALLOC: adjoint::CountingAlloc = adjoint::CountingAlloc;

pyo3::create_exception!(
    adjoint,
    AdjointError,
    PyException,
    "An error reported by Adjoint: a syntax, name, type or shape error in \
     the program, a failure while it ran, or a bad argument. `str(e)` is \
     the diagnostic with `file:line:col` and the source line; `e.location` \
     is `(file, line, column)` or None, `e.summary` the one-line message, \
     `e.kind` one of \"program\", \"io\", \"usage\", \"device\", \"argument\"."
);

/// `ArgumentError(AdjointError, TypeError, ValueError)`, made when the
/// module is initialised: a value from Python that cannot be passed (an
/// unsupported type or dtype, a wrong number of arguments, a bad mode or
/// `argnums`). It is an `AdjointError`, and also what Python code expects
/// from a bad argument.
static ARGUMENT_ERROR: OnceLock<Py<PyType>> = OnceLock::new();

fn error_instance(
    class: &Bound<'_, PyType>,
    message: &str,
    summary: &str,
    kind: &str,
    location: Option<(String, u32, u32)>,
) -> PyErr {
    let make = || -> PyResult<PyErr> {
        let e = class.call1((message,))?;
        e.setattr("summary", summary)?;
        e.setattr("kind", kind)?;
        e.setattr("location", location)?;
        Ok(PyErr::from_value(e))
    };
    make().unwrap_or_else(|e| e)
}

/// An `AdjointError` carrying a compiler or run-time error.
fn session_error(py: Python<'_>, e: &SessionError) -> PyErr {
    let kind = match e.kind() {
        adjoint::ErrorKind::Program => "program",
        adjoint::ErrorKind::Io => "io",
        adjoint::ErrorKind::Usage => "usage",
        adjoint::ErrorKind::DeviceUnavailable => "device",
    };
    let text = e.render(false);
    let mut text = text.trim_end();
    if e.location().is_none() {
        // One line with no place in a source file: the message alone.
        text = text.strip_prefix("error: ").unwrap_or(text);
    }
    let class = py.get_type::<AdjointError>();
    error_instance(&class, text, e.summary(), kind, e.location())
}

/// An `AdjointError` with `message` and no place in a source file.
pub(crate) fn usage_error(py: Python<'_>, message: String) -> PyErr {
    let class = py.get_type::<AdjointError>();
    error_instance(&class, &message, &message, "usage", None)
}

/// An `ArgumentError` with `message`.
pub(crate) fn argument_error(py: Python<'_>, message: String) -> PyErr {
    match ARGUMENT_ERROR.get() {
        Some(class) => error_instance(class.bind(py), &message, &message, "argument", None),
        None => usage_error(py, message),
    }
}

fn parse_mode(py: Python<'_>, mode: &str) -> PyResult<Mode> {
    match mode {
        "graph" => Ok(Mode::Graph),
        "eager" => Ok(Mode::Eager),
        other => Err(argument_error(
            py,
            format!("mode must be \"graph\" or \"eager\", not {other:?}"),
        )),
    }
}

/// A loaded program: its top-level functions are attributes.
#[pyclass(frozen, name = "Module", module = "adjoint")]
struct PyProgram {
    /// The file name (or the name given to `loads`).
    name: String,
    mode: Mode,
    /// Function names in source order.
    names: Vec<String>,
    functions: HashMap<String, Py<PyFunction>>,
}

impl PyProgram {
    fn new(py: Python<'_>, name: String, session: Session) -> PyResult<PyProgram> {
        let names = session
            .function_names()
            .map_err(|e| session_error(py, &e))?;
        let mut functions = HashMap::new();
        for n in &names {
            let f = session.function(n).map_err(|e| session_error(py, &e))?;
            let params = f.param_names();
            let pf = PyFunction::new(f, n.clone(), params);
            functions.insert(n.clone(), Py::new(py, pf)?);
        }
        Ok(PyProgram {
            name,
            mode: session.mode(),
            names,
            functions,
        })
    }

    fn no_such(&self, name: &str) -> String {
        format!(
            "`{}` has no function `{name}`; its functions: {}",
            self.name,
            if self.names.is_empty() {
                "none".to_string()
            } else {
                self.names.join(", ")
            }
        )
    }
}

#[pymethods]
impl PyProgram {
    fn __getattr__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyFunction>> {
        match self.functions.get(name) {
            Some(f) => Ok(f.clone_ref(py)),
            None => Err(PyAttributeError::new_err(self.no_such(name))),
        }
    }

    /// `m["loss"]`: the function of that name (for names that are not
    /// Python identifiers or that a method of the module would hide).
    fn __getitem__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyFunction>> {
        match self.functions.get(name) {
            Some(f) => Ok(f.clone_ref(py)),
            None => Err(PyKeyError::new_err(self.no_such(name))),
        }
    }

    fn __contains__(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    /// The names of the program's functions, in source order.
    fn __iter__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let names = PyTuple::new(slf.py(), &slf.get().names)?;
        Ok(names.try_iter()?.into_any().unbind())
    }

    fn __len__(&self) -> usize {
        self.names.len()
    }

    fn __dir__(&self) -> Vec<String> {
        self.names.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "<adjoint.Module {:?} ({} mode): {}>",
            self.name,
            mode_name(self.mode),
            self.names.join(", ")
        )
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Graph => "graph",
        Mode::Eager => "eager",
    }
}

/// What a transform cache entry is for.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Derived {
    Grad(Vec<usize>, bool),
    ValueAndGrad(Vec<usize>, bool),
    Jvp,
    Vjp,
    /// Called with the parameters marked present, the others defaulted.
    Partial(Vec<bool>),
}

/// The function transform `which` makes from `f`.
fn apply(f: &adjoint::Function, which: &Derived) -> Result<adjoint::Function, SessionError> {
    match which {
        Derived::Grad(nums, single) => match (nums.as_slice(), single) {
            ([0], true) => f.grad(),
            ([k], true) => f.grad_argnum(*k),
            _ => f.grad_argnums(nums),
        },
        Derived::ValueAndGrad(nums, single) => match (nums.as_slice(), single) {
            ([0], true) => f.value_and_grad(),
            ([k], true) => f.value_and_grad_argnum(*k),
            _ => f.value_and_grad_argnums(nums),
        },
        Derived::Jvp => f.jvp(),
        Derived::Vjp => f.vjp(),
        Derived::Partial(present) => f.with_args(present),
    }
}

impl Derived {
    /// The same transform of the function called with only the parameters
    /// marked in `present`: argnums renumbered among those.
    fn among(&self, present: &[bool], label: &str) -> Result<Derived, SessionError> {
        let renumber = |nums: &[usize]| -> Result<Vec<usize>, SessionError> {
            nums.iter()
                .map(|&k| {
                    if present.get(k) == Some(&true) {
                        Ok(present[..k].iter().filter(|p| **p).count())
                    } else {
                        Err(SessionError::message(format!(
                            "`{label}` differentiates with respect to argument {k}, which was not given"
                        )))
                    }
                })
                .collect()
        };
        Ok(match self {
            Derived::Grad(nums, single) => Derived::Grad(renumber(nums)?, *single),
            Derived::ValueAndGrad(nums, single) => Derived::ValueAndGrad(renumber(nums)?, *single),
            other => other.clone(),
        })
    }
}

/// A function of a loaded program, or one a transform made from it.
#[pyclass(frozen, name = "Function", module = "adjoint")]
pub(crate) struct PyFunction {
    f: adjoint::Function,
    /// How it reads: `loss`, `grad(loss, argnums=1)`.
    label: String,
    /// The parameter names users see (the original function's for
    /// transforms, which take the same arguments).
    params: Vec<String>,
    /// The functions transforms made from this one, made once.
    derived: Mutex<HashMap<Derived, adjoint::Function>>,
    /// For a transform of a function of the module: that function and the
    /// transform, so that a call leaving out parameters with defaults can
    /// transform the function called with those left out.
    source: Option<(adjoint::Function, Derived)>,
}

impl PyFunction {
    fn new(f: adjoint::Function, label: String, params: Vec<String>) -> PyFunction {
        PyFunction {
            f,
            label,
            params,
            derived: Mutex::new(HashMap::new()),
            source: None,
        }
    }

    /// The function transform `which` makes from this one (compiled by
    /// reloading the program with a wrapper: made once, then kept).
    fn derive(&self, py: Python<'_>, which: Derived) -> PyResult<adjoint::Function> {
        self.derive_raw(py, which)
            .map_err(|e| session_error(py, &e))
    }

    fn derive_raw(
        &self,
        py: Python<'_>,
        which: Derived,
    ) -> Result<adjoint::Function, SessionError> {
        let lock = |d: &Mutex<HashMap<Derived, adjoint::Function>>| {
            d.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&which)
                .cloned()
        };
        if let Some(f) = lock(&self.derived) {
            return Ok(f);
        }
        let made = py.detach(|| match (&which, &self.source) {
            // A transform called with parameters left out: the same
            // transform of the function called with them left out, its
            // argnums counted among the parameters given.
            (Derived::Partial(present), Some((base, transform))) => {
                let partial = base.with_args(present)?;
                apply(&partial, &transform.among(present, &self.label)?)
            }
            _ => apply(&self.f, &which),
        })?;
        self.derived
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(which, made.clone());
        Ok(made)
    }

    /// The arguments converted, checked against the arity (`what` names
    /// the call in messages).
    fn convert_args(
        &self,
        py: Python<'_>,
        what: &str,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<Value>> {
        let (values, present) = self.convert_some_args(py, what, args, kwargs, false)?;
        debug_assert!(present.is_none());
        Ok(values)
    }

    /// The arguments given converted, and when `defaults` allows some to be
    /// left out (to take the defaults of the source) and some were, which
    /// parameters were given.
    fn convert_some_args(
        &self,
        py: Python<'_>,
        what: &str,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        defaults: bool,
    ) -> PyResult<(Vec<Value>, Option<Vec<bool>>)> {
        let n = self.params.len();
        let mut slots: Vec<Option<Bound<'_, PyAny>>> = vec![None; n.max(args.len())];
        for (i, a) in args.iter().enumerate() {
            slots[i] = Some(a);
        }
        if let Some(kw) = kwargs {
            for (k, v) in kw.iter() {
                let k: String = k.extract()?;
                let Some(i) = self.params.iter().position(|p| *p == k) else {
                    return Err(argument_error(
                        py,
                        format!(
                            "`{what}` has no parameter `{k}`; its parameters: {}",
                            self.params.join(", ")
                        ),
                    ));
                };
                if slots[i].is_some() {
                    return Err(argument_error(
                        py,
                        format!("`{what}` got two values for parameter `{k}`"),
                    ));
                }
                slots[i] = Some(v);
            }
        }
        let given = slots.iter().filter(|s| s.is_some()).count();
        let mut present = None;
        if defaults && slots.len() == n && given < n {
            present = Some(slots.iter().map(Option::is_some).collect::<Vec<bool>>());
        } else if slots.len() != n || given != n {
            let missing: Vec<&str> = (0..n)
                .filter(|i| slots[*i].is_none())
                .map(|i| self.params[i].as_str())
                .collect();
            let extra = if missing.is_empty() {
                String::new()
            } else {
                format!(" (missing: {})", missing.join(", "))
            };
            return Err(argument_error(
                py,
                format!(
                    "`{what}` takes {n} argument{} ({}), but {given} {} given{extra}",
                    if n == 1 { "" } else { "s" },
                    self.params.join(", "),
                    if given == 1 { "was" } else { "were" },
                ),
            ));
        }
        let values = slots
            .into_iter()
            .enumerate()
            .filter_map(|(i, a)| a.map(|a| (i, a)))
            .map(|(i, a)| {
                convert::to_value(&a).map_err(|e| {
                    argument_error(
                        py,
                        e.describe(&format!(
                            "argument `{}` (index {i}) of `{what}`",
                            self.params[i]
                        )),
                    )
                })
            })
            .collect::<PyResult<Vec<Value>>>()?;
        Ok((values, present))
    }

    /// The error for a call that leaves out parameters without defaults.
    fn missing_error(&self, py: Python<'_>, present: &[bool], e: &SessionError) -> PyErr {
        let missing: Vec<&str> = (0..present.len())
            .filter(|i| !present[*i])
            .map(|i| self.params[i].as_str())
            .collect();
        let given = present.iter().filter(|p| **p).count();
        argument_error(
            py,
            format!(
                "`{}` takes {} argument{} ({}), but {given} {} given (missing: {}): {}",
                self.label,
                present.len(),
                if present.len() == 1 { "" } else { "s" },
                self.params.join(", "),
                if given == 1 { "was" } else { "were" },
                missing.join(", "),
                if e.summary().contains("__adjoint_") {
                    "they have no default"
                } else {
                    e.summary()
                }
            ),
        )
    }
}

/// Runs compiled code without the GIL; on the main thread with SIGINT
/// routed to Adjoint's interrupt flag as well as to Python.
///
/// A program error (a type or shape error found when the function is
/// compiled for these arguments, a failure while it runs) gets a note with
/// the call as Python made it: `label` and the arguments' names and types.
fn run(
    py: Python<'_>,
    f: &adjoint::Function,
    args: &[Value],
    label: &str,
    names: &[&str],
) -> PyResult<Value> {
    let main = interrupt::on_main_thread();
    let result = py.detach(|| {
        let _sigint = if main {
            interrupt::SigintGuard::install()
        } else {
            None
        };
        let mut out = convert::PyStdout::default();
        f.call_with_output(args, &mut out)
    });
    if main && interrupt::take_seen() {
        // Python's own handler ran too: this raises KeyboardInterrupt (or
        // whatever the program's handler raises).
        py.check_signals()?;
    }
    result.map_err(|e| {
        let e = if e.kind() == adjoint::ErrorKind::Program {
            let described: Vec<String> = args
                .iter()
                .enumerate()
                .map(|(i, v)| match names.get(i) {
                    Some(n) => format!("{n}: {}", adjoint::value_type(v)),
                    None => adjoint::value_type(v),
                })
                .collect();
            e.with_note(format!(
                "called from Python as {label}({})",
                described.join(", ")
            ))
        } else {
            e
        };
        session_error(py, &e)
    })
}

#[pymethods]
impl PyFunction {
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let (values, present) = self.convert_some_args(py, &self.label, args, kwargs, true)?;
        let result = match present {
            None => {
                let names: Vec<&str> = self.params.iter().map(String::as_str).collect();
                run(py, &self.f, &values, &self.label, &names)?
            }
            // Parameters left out take the defaults written in the source.
            Some(present) => {
                let f = self
                    .derive_raw(py, Derived::Partial(present.clone()))
                    .map_err(|e| self.missing_error(py, &present, &e))?;
                let names: Vec<&str> = self
                    .params
                    .iter()
                    .zip(&present)
                    .filter(|(_, p)| **p)
                    .map(|(n, _)| n.as_str())
                    .collect();
                run(py, &f, &values, &self.label, &names)?
            }
        };
        convert::to_python(py, result)
    }

    /// The name: the program's name for it, or the transform that made it
    /// (`grad(loss, argnums=1)`).
    #[getter]
    fn __name__(&self) -> String {
        self.label.clone()
    }

    /// The parameter names.
    #[getter]
    fn params(&self) -> Vec<String> {
        self.params.clone()
    }

    /// The number of arguments it takes.
    #[getter]
    fn arity(&self) -> usize {
        self.params.len()
    }

    /// "graph" or "eager".
    #[getter]
    fn mode(&self) -> &'static str {
        mode_name(self.f.mode())
    }

    /// The same function in another mode (sharing what was compiled).
    fn with_mode(&self, py: Python<'_>, mode: &str) -> PyResult<PyFunction> {
        let mode = parse_mode(py, mode)?;
        Ok(PyFunction::new(
            self.f.with_mode(mode),
            self.label.clone(),
            self.params.clone(),
        ))
    }

    /// The type of the result for arguments like these (inference only;
    /// nothing runs), as the language writes it: `f32[10]`, `(f64[], i64[])`.
    #[pyo3(signature = (*args, **kwargs))]
    fn result_type(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let values = self.convert_args(py, &self.label, args, kwargs)?;
        let f = &self.f;
        py.detach(|| f.result_type(&values))
            .map_err(|e| session_error(py, &e))
    }

    /// Compiles the function for arguments like these without running it.
    #[pyo3(signature = (*args, **kwargs))]
    fn prepare(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let values = self.convert_args(py, &self.label, args, kwargs)?;
        let f = &self.f;
        py.detach(|| f.prepare(&values))
            .map_err(|e| session_error(py, &e))
    }

    fn __repr__(&self) -> String {
        format!(
            "<adjoint.Function {}({})>",
            self.label,
            self.params.join(", ")
        )
    }
}

/// The pullback `vjp` returns: call it with the cotangent of the result.
#[pyclass(frozen, name = "Pullback", module = "adjoint")]
struct Pullback {
    f: adjoint::Function,
    label: String,
    args: Vec<Value>,
    /// The result's type, which the cotangent must have.
    result: convert::Layout,
}

#[pymethods]
impl Pullback {
    /// The cotangents of the arguments, a tuple with one per argument,
    /// for the cotangent `ct` of the result (of the result's structure).
    fn __call__(&self, py: Python<'_>, ct: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let ct = convert::to_value(ct).map_err(|e| {
            argument_error(
                py,
                e.describe(&format!(
                    "the cotangent given to the pullback of `{}`",
                    self.label
                )),
            )
        })?;
        self.result.admits(&ct).map_err(|e| {
            argument_error(
                py,
                e.describe(&format!(
                    "the cotangent given to the pullback of `{}` must have the result's type",
                    self.label
                )),
            )
        })?;
        let mut args = self.args.clone();
        args.push(ct);
        let result = run(
            py,
            &self.f,
            &args,
            &format!("the pullback of {}", self.label),
            &[],
        )?;
        convert::to_python(py, result)
    }

    fn __repr__(&self) -> String {
        format!("<adjoint.Pullback of {}>", self.label)
    }
}

fn function_arg<'py>(
    py: Python<'py>,
    what: &str,
    f: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyFunction>> {
    f.cast::<PyFunction>().cloned().map_err(|_| {
        argument_error(
            py,
            format!(
                "adjoint.{what} needs a function of an Adjoint module (such as `m.loss`, \
                 from adjoint.load), not a {}",
                type_name(f)
            ),
        )
    })
}

pub(crate) fn type_name(x: &Bound<'_, PyAny>) -> String {
    x.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "value".into())
}

/// `argnums` as a list, and whether it was one int.
fn argnums_arg(
    py: Python<'_>,
    f: &PyFunction,
    argnums: &Bound<'_, PyAny>,
) -> PyResult<(Vec<usize>, bool)> {
    let bad = || {
        argument_error(
            py,
            format!(
                "argnums must be an int or a tuple of ints, not {}",
                argnums.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    };
    let (raw, single): (Vec<i64>, bool) = if argnums.is_instance_of::<pyo3::types::PyBool>() {
        return Err(bad());
    } else if let Ok(k) = argnums.extract::<i64>() {
        (vec![k], true)
    } else if argnums.is_instance_of::<PyTuple>() || argnums.is_instance_of::<pyo3::types::PyList>()
    {
        (argnums.extract().map_err(|_| bad())?, false)
    } else {
        return Err(bad());
    };
    let n = f.params.len();
    if raw.is_empty() {
        return Err(argument_error(py, "argnums is empty".into()));
    }
    let mut nums = Vec::new();
    for k in raw {
        // Negative numbers count from the end, as in JAX.
        let i = if k < 0 { k + n as i64 } else { k };
        if i < 0 || i >= n as i64 {
            return Err(argument_error(
                py,
                format!(
                    "argnums {k} is out of range: `{}` takes {n} argument{}",
                    f.label,
                    if n == 1 { "" } else { "s" }
                ),
            ));
        }
        if nums.contains(&(i as usize)) {
            return Err(argument_error(py, format!("argnums repeats {i}")));
        }
        nums.push(i as usize);
    }
    Ok((nums, single))
}

fn argnums_label(nums: &[usize], single: bool) -> String {
    if single {
        if nums[0] == 0 {
            String::new()
        } else {
            format!(", argnums={}", nums[0])
        }
    } else {
        let list: Vec<String> = nums.iter().map(|i| i.to_string()).collect();
        format!(
            ", argnums=({}{})",
            list.join(", "),
            if nums.len() == 1 { "," } else { "" }
        )
    }
}

/// Loads and compiles a program file (and its imports).
#[pyfunction]
#[pyo3(signature = (path, mode = "graph"))]
fn load(py: Python<'_>, path: std::path::PathBuf, mode: &str) -> PyResult<PyProgram> {
    let mode = parse_mode(py, mode)?;
    let session = py
        .detach(|| Session::new(mode).load_file(&path))
        .map_err(|e| session_error(py, &e))?;
    PyProgram::new(py, path.display().to_string(), session)
}

/// Loads and compiles a program from source text; `name` is the file name
/// diagnostics show.
#[pyfunction]
#[pyo3(signature = (source, mode = "graph", name = "<string>"))]
fn loads(py: Python<'_>, source: &str, mode: &str, name: &str) -> PyResult<PyProgram> {
    let mode = parse_mode(py, mode)?;
    let session = py
        .detach(|| Session::new(mode).load_source(name, source))
        .map_err(|e| session_error(py, &e))?;
    PyProgram::new(py, name.to_string(), session)
}

/// The gradient of scalar-valued `f` with respect to argument `argnums`
/// (an int: the gradient itself; a tuple: a tuple of gradients).
#[pyfunction]
#[pyo3(signature = (f, argnums = None))]
fn grad(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    argnums: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyFunction> {
    transform(py, f, argnums, false)
}

/// A function returning `(f(x..), grad(f, argnums)(x..))` from one
/// forward pass.
#[pyfunction]
#[pyo3(signature = (f, argnums = None))]
fn value_and_grad(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    argnums: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyFunction> {
    transform(py, f, argnums, true)
}

fn transform(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    argnums: Option<&Bound<'_, PyAny>>,
    with_value: bool,
) -> PyResult<PyFunction> {
    let what = if with_value { "value_and_grad" } else { "grad" };
    let f = function_arg(py, what, f)?;
    let f = f.get();
    let (nums, single) = match argnums {
        Some(a) if !a.is_none() => argnums_arg(py, f, a)?,
        _ => {
            if f.params.is_empty() {
                return Err(argument_error(
                    py,
                    format!(
                        "`{}` takes no arguments: there is nothing to differentiate",
                        f.label
                    ),
                ));
            }
            (vec![0], true)
        }
    };
    let label = format!("{what}({}{})", f.label, argnums_label(&nums, single));
    let which = if with_value {
        Derived::ValueAndGrad(nums, single)
    } else {
        Derived::Grad(nums, single)
    };
    let d = f.derive(py, which.clone())?;
    let mut made = PyFunction::new(d, label, f.params.clone());
    if f.source.is_none() {
        made.source = Some((f.f.clone(), which));
    }
    Ok(made)
}

/// `(f(*args), pullback)`: `pullback(ct)` is the tuple of the arguments'
/// cotangents for the cotangent `ct` of the result.
#[pyfunction]
#[pyo3(signature = (f, *args))]
fn vjp(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
) -> PyResult<(Py<PyAny>, Pullback)> {
    let f = function_arg(py, "vjp", f)?;
    let f = f.get();
    let what = format!("vjp({})", f.label);
    let values = f.convert_args(py, &what, args, None)?;
    let pull = f.derive(py, Derived::Vjp)?;
    let names: Vec<&str> = f.params.iter().map(String::as_str).collect();
    let y = run(py, &f.f, &values, &f.label, &names)?;
    let result = convert::Layout::of(&y);
    let y = convert::to_python(py, y)?;
    Ok((
        y,
        Pullback {
            f: pull,
            label: f.label.clone(),
            args: values,
            result,
        },
    ))
}

/// Forward mode: `(f(*primals), the derivative of f at primals along
/// tangents)`; `primals` and `tangents` are tuples (or lists) with one
/// element per argument.
#[pyfunction]
fn jvp(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    primals: &Bound<'_, PyAny>,
    tangents: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let f = function_arg(py, "jvp", f)?;
    let f = f.get();
    let as_tuple = |x: &Bound<'_, PyAny>, which: &str| -> PyResult<Py<PyTuple>> {
        if let Ok(t) = x.cast::<PyTuple>() {
            return Ok(t.clone().unbind());
        }
        if let Ok(l) = x.cast::<pyo3::types::PyList>() {
            return Ok(l.to_tuple().unbind());
        }
        Err(argument_error(
            py,
            format!(
                "adjoint.jvp takes the {which} as a tuple with one element per argument of `{}`, not a {}",
                f.label,
                type_name(x)
            ),
        ))
    };
    let primals = as_tuple(primals, "primals")?;
    let tangents = as_tuple(tangents, "tangents")?;
    let what = format!("jvp({})", f.label);
    let mut values = f.convert_args(py, &format!("{what} primals"), primals.bind(py), None)?;
    let ts = f.convert_args(py, &format!("{what} tangents"), tangents.bind(py), None)?;
    // A tangent has its primal's type (a Python float takes its dtype).
    for (i, (x, t)) in values.iter().zip(&ts).enumerate() {
        convert::Layout::of(x).admits(t).map_err(|e| {
            argument_error(
                py,
                e.describe(&format!(
                    "the tangent of argument `{}` (index {i}) of `{what}` must have its type",
                    f.params[i]
                )),
            )
        })?;
    }
    values.extend(ts);
    let d = f.derive(py, Derived::Jvp)?;
    let r = run(py, &d, &values, &format!("jvp({})", f.label), &[])?;
    convert::to_python(py, r)
}

/// For benches/python_overhead.py: the seconds one call of `f` takes
/// measured inside Rust (`Function::call_with_output` with the arguments
/// converted once), the mean of `n` calls: the compiled function's own
/// time, which the overhead of a call from Python is measured against.
#[pyfunction]
#[pyo3(name = "_native_call_time")]
fn native_call_time(
    py: Python<'_>,
    f: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
    n: usize,
) -> PyResult<f64> {
    let f = function_arg(py, "_native_call_time", f)?;
    let f = f.get();
    let values = f.convert_args(py, &f.label, args, None)?;
    let func = &f.f;
    py.detach(|| {
        let mut sink = Vec::new();
        func.call_with_output(&values, &mut sink)?;
        let t = std::time::Instant::now();
        for _ in 0..n.max(1) {
            sink.clear();
            func.call_with_output(&values, &mut sink)?;
        }
        Ok(t.elapsed().as_secs_f64() / n.max(1) as f64)
    })
    .map_err(|e: SessionError| session_error(py, &e))
}

/// Adjoint from Python: load programs written in Adjoint's language
/// (`load`, `loads`), call their functions on NumPy arrays and Python
/// numbers (`m.loss(params, x, y)`), and differentiate them with
/// transforms Adjoint compiles (`grad`, `value_and_grad`, `vjp`, `jvp`).
/// See docs/python.md in the repository.
#[pymodule]
#[pyo3(name = "adjoint")]
fn adjoint_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("AdjointError", py.get_type::<AdjointError>())?;
    let builtins = py.import("builtins")?;
    let bases = PyTuple::new(
        py,
        [
            py.get_type::<AdjointError>().into_any(),
            builtins.getattr("TypeError")?,
            builtins.getattr("ValueError")?,
        ],
    )?;
    let ns = PyDict::new(py);
    ns.set_item("__module__", "adjoint")?;
    ns.set_item(
        "__doc__",
        "A value passed from Python that Adjoint cannot take: an unsupported type or \
         dtype, a wrong number of arguments, a bad mode or argnums. It is an \
         AdjointError, a TypeError and a ValueError.",
    )?;
    let class = builtins
        .getattr("type")?
        .call1(("ArgumentError", bases, ns))?
        .cast_into::<PyType>()?;
    m.add("ArgumentError", &class)?;
    let _ = ARGUMENT_ERROR.set(class.unbind());
    interrupt::init(py)?;
    // NumPy's C API is imported now, not lazily at the first conversion: a
    // lazy import runs Python code in the middle of a call, where a
    // pending signal's handler could raise into it.
    let _ = numpy::dtype::<f64>(py);
    m.add_class::<PyProgram>()?;
    m.add_class::<PyFunction>()?;
    m.add_class::<Pullback>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(loads, m)?)?;
    m.add_function(wrap_pyfunction!(grad, m)?)?;
    m.add_function(wrap_pyfunction!(value_and_grad, m)?)?;
    m.add_function(wrap_pyfunction!(vjp, m)?)?;
    m.add_function(wrap_pyfunction!(jvp, m)?)?;
    m.add_function(wrap_pyfunction!(native_call_time, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
