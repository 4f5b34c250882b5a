"""Adjoint from Python: load programs written in Adjoint's language, call
their functions on NumPy arrays and Python numbers, and differentiate them
with JAX-style transforms compiled by Adjoint.

    m = adjoint.load("examples/digits_mlp.adj")
    loss, grads = adjoint.value_and_grad(m.loss)(params, x, y)

See docs/python.md in the repository.
"""

import os
from typing import Any, Iterator, Literal, Sequence, Tuple, Union, final

__version__: str
__all__ = [
    "AdjointError",
    "ArgumentError",
    "Module",
    "Function",
    "Pullback",
    "load",
    "loads",
    "grad",
    "value_and_grad",
    "vjp",
    "jvp",
    "_native_call_time",
    "__version__",
]

#: What crosses the boundary: NumPy arrays (float32, float64, int32, int64,
#: bool, uint8), Python float/int/bool, NumPy scalars, tuples and lists of
#: values, dicts with str keys (records), str.
_Value = Any

_Mode = Literal["graph", "eager"]

class AdjointError(Exception):
    """An error reported by Adjoint: a syntax, name, type or shape error in
    the program, a failure while it ran, or a bad argument.

    ``str(e)`` is the diagnostic with ``file:line:col`` and the source line.
    """

    #: ``(file, line, column)`` of the primary diagnostic, or None.
    location: Union[Tuple[str, int, int], None]
    #: The one-line message, without location or source excerpt.
    summary: str
    #: "program", "io", "usage", "device" or "argument".
    kind: str

class ArgumentError(AdjointError, TypeError, ValueError):
    """A value passed from Python that Adjoint cannot take: an unsupported
    type or dtype, a wrong number of arguments, a bad mode or argnums. The
    message says which argument and what was expected."""

@final
class Function:
    """A function of a loaded program, or one made from it by a transform.

    Calling it converts the arguments (see docs/python.md), compiles it for
    their dtypes and shapes on the first call with them (the code is kept),
    and runs it with the GIL released. Keyword arguments use the names of
    the parameters in the source; parameters with defaults in the source
    may be left out.
    """

    __name__: str
    #: The parameter names in the source.
    params: list[str]
    #: The number of arguments.
    arity: int
    #: "graph" or "eager".
    mode: str
    def __call__(self, *args: _Value, **kwargs: _Value) -> Any: ...
    def with_mode(self, mode: _Mode) -> "Function":
        """The same function running in another mode."""
    def result_type(self, *args: _Value, **kwargs: _Value) -> str:
        """The type of the result for arguments like these (type inference
        only, nothing runs), as the language writes it: ``f32[10]``."""
    def prepare(self, *args: _Value, **kwargs: _Value) -> None:
        """Compiles the function for arguments like these without running it."""

@final
class Module:
    """A loaded program. Each top-level function of the file is an
    attribute (``m.loss``) and an item (``m["loss"]``); iterating gives the
    names in source order."""

    def __getattr__(self, name: str) -> Function: ...
    def __getitem__(self, name: str, /) -> Function: ...
    def __contains__(self, name: str, /) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...

@final
class Pullback:
    """What :func:`vjp` returns with the value: call it with the cotangent
    of the result (of the result's structure) to get a tuple with the
    cotangent of each argument. Each call runs the forward pass again."""

    def __call__(self, ct: _Value, /) -> Tuple[Any, ...]: ...

def load(path: Union[str, os.PathLike[str]], mode: _Mode = "graph") -> Module:
    """Loads and checks a program file and its imports. ``mode`` is
    "graph" (optimised, the default) or "eager" (one primitive at a time,
    for debugging). Raises AdjointError with the diagnostic."""

def loads(source: str, mode: _Mode = "graph", name: str = "<string>") -> Module:
    """Loads a program from source text; ``name`` is the file name that
    diagnostics show."""

def grad(f: Function, argnums: Union[int, Sequence[int], None] = None) -> Function:
    """The gradient of scalar-valued ``f``: with respect to argument
    ``argnums`` (an int, default 0), a value of that argument's structure;
    with a tuple of ints, a tuple of them. Compiled by Adjoint."""

def value_and_grad(
    f: Function, argnums: Union[int, Sequence[int], None] = None
) -> Function:
    """A function returning ``(f(*args), grad(f, argnums)(*args))`` from
    one forward pass."""

def vjp(f: Function, *args: _Value) -> Tuple[Any, Pullback]:
    """``(f(*args), pullback)``; ``pullback(ct)`` is a tuple with the
    cotangent of each argument for the cotangent ``ct`` of the result."""

def jvp(f: Function, primals: Sequence[_Value], tangents: Sequence[_Value]) -> Tuple[Any, Any]:
    """Forward mode: ``(f(*primals), df(primals)·tangents)``. ``primals``
    and ``tangents`` have one element per argument."""

def _native_call_time(f: Function, args: Tuple[_Value, ...], n: int) -> float:
    """For benches/python_overhead.py: the mean seconds of ``n`` calls of
    ``f`` timed inside Rust, with the arguments converted once."""
