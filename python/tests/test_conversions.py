"""Every conversion across the boundary, both ways (docs/python.md)."""

import numpy as np
import pytest

import adjoint

SRC = """
fn ident(x) = x
fn add(x, y) = x + y
fn double(x) = x * 2.0
fn shape_of(x) = shape(x)
fn dt(x) = dtype(x)
fn total(x) = sum(x)
fn swap(t) = (t.1, t.0)
fn nested(t) = (t.0, (t.1.0 * 2.0, t.1.1))
fn rec(p) = { w: p.w * 2.0, b: p.b + 1.0, name: p.name }
fn make_rec(x) = { z: x, a: x + 1.0, m: x * 3.0 }
fn first(x) = x[0]
fn row(x) = x[1]
fn negate(b) = !b
fn unit() = ()
fn text() = "hello"
fn closure(a) = |x| x * a
fn count(n: i64) = n + 1
"""


@pytest.fixture(scope="module", params=["graph", "eager"])
def m(request):
    return adjoint.loads(SRC, mode=request.param, name="conv.adj")


DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 1, 4), (0,), (3, 0)])
def test_arrays_of_every_dtype_and_shape_round_trip(m, dtype, shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 50).astype(dtype)
    r = m.ident(a)
    assert isinstance(r, np.ndarray)
    assert r.dtype == np.dtype(dtype)
    assert r.shape == shape
    np.testing.assert_array_equal(r, a)
    # The result is an array of its own, writeable, that does not alias
    # the input.
    assert r.flags.writeable and r.flags.c_contiguous
    assert not np.shares_memory(r, a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_program_sees_the_dtype_and_shape(m, dtype):
    a = np.zeros((3, 4), dtype=dtype)
    names = {np.float32: "f32", np.float64: "f64", np.int32: "i32",
             np.int64: "i64", np.bool_: "bool", np.uint8: "u8"}
    assert m.dt(a) == names[dtype]
    assert m.shape_of(a) == (3, 4)
    assert m.shape_of(np.zeros((2, 0, 5), dtype=dtype)) == (2, 0, 5)


def test_results_of_computation_are_right(m):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = m.double(a)
    assert r.dtype == np.float32
    np.testing.assert_array_equal(r, a * 2)
    np.testing.assert_array_equal(m.row(a), a[1])
    assert m.total(np.arange(10, dtype=np.int64)) == 45


def test_non_contiguous_arrays_are_read_in_logical_order(m):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    for view in [base.T, base[:, ::2], base[::-1], np.asfortranarray(base), base[1:3, 2:5]]:
        assert not (view.flags.c_contiguous and view is base)
        np.testing.assert_array_equal(m.ident(view), view)
        np.testing.assert_array_equal(m.double(view), view * 2)


def test_a_zero_dimensional_array_is_a_scalar(m):
    assert m.ident(np.array(2.5)) == 2.5
    assert isinstance(m.ident(np.array(2.5)), float)
    assert m.shape_of(np.array(2.5, dtype=np.float32)) == ()


def test_python_scalars(m):
    # float, int and bool out as Python float, int and bool.
    for v, t in [(1.5, float), (7, int), (True, bool), (False, bool), (-3, int)]:
        r = m.ident(v)
        assert type(r) is t and r == v
    assert m.double(1.25) == 2.5
    assert m.count(41) == 42 and type(m.count(41)) is int
    assert m.negate(True) is False
    # Python floats and ints are weakly typed, like literals: they take the
    # dtype of the array they meet.
    r = m.add(np.ones(3, dtype=np.float32), 0.5)
    assert r.dtype == np.float32
    np.testing.assert_array_equal(r, np.full(3, 1.5, dtype=np.float32))
    assert m.add(np.ones(2, dtype=np.int32), 3).dtype == np.int32
    assert m.dt(1.0) == "f64" and m.dt(1) == "i64" and m.dt(True) == "bool"


def test_numpy_scalars_keep_their_dtype(m):
    cases = [(np.float32(1.5), np.float32), (np.int32(-4), np.int32),
             (np.uint8(200), np.uint8)]
    for v, t in cases:
        r = m.ident(v)
        assert type(r) is t and r == v
    assert m.dt(np.float32(1)) == "f32"
    assert m.dt(np.float64(1)) == "f64"
    assert m.dt(np.int64(1)) == "i64"
    assert m.dt(np.bool_(True)) == "bool"
    # np.float64 is strongly typed: f32 + f64 promotes to f64 (as in JAX),
    # where the weak 0.5 keeps f32.
    r = m.add(np.ones(3, dtype=np.float32), np.float64(0.5))
    assert r.dtype == np.float64 and list(r) == [1.5, 1.5, 1.5]
    assert m.add(np.ones(3, dtype=np.float32), 0.5).dtype == np.float32
    assert type(m.ident(np.float64(2.0))) is float
    assert type(m.ident(np.int64(2))) is int


def test_tuples_and_lists(m):
    a = np.arange(3.0)
    r = m.swap((a, 2))
    assert isinstance(r, tuple) and len(r) == 2
    assert r[0] == 2
    np.testing.assert_array_equal(r[1], a)
    # Lists are tuples.
    r = m.swap([1.5, True])
    assert r == (True, 1.5)
    r = m.nested((np.float32(1), (np.ones(2), (3, 4))))
    assert r[0] == 1 and type(r[0]) is np.float32
    np.testing.assert_array_equal(r[1][0], [2.0, 2.0])
    assert r[1][1] == (3, 4)
    assert m.ident(()) == ()
    assert m.unit() == ()


def test_records_are_dicts_with_field_order_kept(m):
    p = {"w": np.arange(4, dtype=np.float32), "b": 1.0, "name": "layer"}
    r = m.rec(p)
    assert isinstance(r, dict)
    assert list(r) == ["w", "b", "name"]
    np.testing.assert_array_equal(r["w"], np.arange(4) * 2)
    assert r["w"].dtype == np.float32
    assert r["b"] == 2.0
    assert r["name"] == "layer"
    r = m.make_rec(1.0)
    assert list(r) == ["z", "a", "m"]
    assert r == {"z": 1.0, "a": 2.0, "m": 3.0}
    # Nested records and the dict's own order.
    q = {"b": {"y": 1.0, "x": 2.0}, "a": (1, 2)}
    r = m.ident(q)
    assert list(r) == ["b", "a"] and list(r["b"]) == ["y", "x"]
    assert r == {"b": {"y": 1.0, "x": 2.0}, "a": (1, 2)}


def test_strings(m):
    assert m.ident("text") == "text"
    assert m.text() == "hello"


def test_objects_with_array_interface_go_through_numpy():
    m = adjoint.loads("fn ident(x) = x\n")

    class Wrapped:
        def __array__(self, dtype=None, copy=None):
            return np.arange(3, dtype=np.int32)

    r = m.ident(Wrapped())
    assert r.dtype == np.int32
    np.testing.assert_array_equal(r, [0, 1, 2])


def test_keyword_arguments_use_the_parameter_names(m):
    assert m.add(x=1.0, y=2.5) == 3.5
    assert m.add(1.0, y=2.5) == 3.5
    assert m.add.params == ["x", "y"]
    assert m.add.arity == 2
    with pytest.raises(adjoint.ArgumentError, match="no parameter `z`"):
        m.add(1.0, z=2.0)
    with pytest.raises(adjoint.ArgumentError, match="two values for parameter `x`"):
        m.add(1.0, x=2.0)


def test_unsupported_values_say_which_argument_and_what_is_expected(m):
    with pytest.raises(adjoint.ArgumentError) as e:
        m.add(1.0, np.zeros(3, dtype=np.float16))
    text = str(e.value)
    assert "argument `y` (index 1) of `add`" in text
    assert "dtype float16" in text or "<f2" in text
    assert "float32, float64, int32, int64, bool or uint8" in text
    with pytest.raises(adjoint.ArgumentError, match="argument `x` \\(index 0\\) of `ident`.*complex"):
        m.ident(np.zeros(2, dtype=np.complex128))
    with pytest.raises(adjoint.ArgumentError, match="expected a NumPy array.*got set"):
        m.ident({1, 2})
    with pytest.raises(adjoint.ArgumentError, match=r"at \[1\]\['w'\].*got NoneType"):
        m.ident((1.0, {"w": None}))
    with pytest.raises(adjoint.ArgumentError, match="keys must be str"):
        m.ident({1: 2.0})
    with pytest.raises(adjoint.ArgumentError, match="does not fit in an i64"):
        m.ident(2**70)
    with pytest.raises(adjoint.ArgumentError, match="object"):
        m.ident(np.array([object()]))
    # They are also what Python code expects from a bad argument.
    with pytest.raises(TypeError):
        m.ident({1, 2})


def test_functions_cannot_be_returned(m):
    with pytest.raises(adjoint.AdjointError, match="function"):
        m.closure(2.0)


@pytest.mark.parametrize("n", [10, 1000, 100_000])
def test_outputs_are_arrays_of_their_own(n):
    """Small results are copied into NumPy arrays, large ones become arrays
    over their buffer: either way writing to one changes nothing else, and
    a result that is an input comes back as a copy."""
    m = adjoint.loads("fn f(x) = x * 3.0\nfn same(x) = x\nfn two(x) = (x * 2.0, x * 2.0)\n")
    a = np.ones(n)
    r = m.f(a)
    np.testing.assert_array_equal(r, np.full(n, 3.0))
    r[0] = 99.0
    assert a[0] == 1.0
    s = m.same(a)
    s[1] = 5.0
    assert a[1] == 1.0 and s[1] == 5.0
    p, q = m.two(a)
    p[2] = -1.0
    assert q[2] == 2.0
    del r, s
    # The arrays outlive the call's values.
    np.testing.assert_array_equal(q, np.full(n, 2.0))


def test_unaligned_and_byte_swapped_arrays_are_read_right(m):
    # float64 elements at an odd offset in a byte buffer: not aligned.
    raw = np.arange(8 * 5 + 1, dtype=np.uint8)
    unaligned = np.frombuffer(raw.data, dtype=np.float64, count=5, offset=1)
    assert not unaligned.flags.aligned
    expected = np.frombuffer(raw.tobytes()[1:], dtype=np.float64)
    np.testing.assert_array_equal(m.ident(unaligned), expected)
    # The other byte order: converted to this machine's.
    for dtype in [np.float32, np.float64, np.int32, np.int64]:
        a = np.arange(6, dtype=dtype).reshape(2, 3)
        swapped = a.astype(a.dtype.newbyteorder("S"))
        assert not swapped.dtype.isnative
        r = m.ident(swapped)
        assert r.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(r, a)
