"""Errors: AdjointError with the diagnostic's file:line:col, argument
errors that say which argument and what was expected."""

import re

import numpy as np
import pytest

import adjoint


def test_a_syntax_error_in_a_file_has_its_location(tmp_path):
    path = tmp_path / "broken.adj"
    path.write_text("fn ok(x) = x\nfn bad(x) = x +* 2\n")
    with pytest.raises(adjoint.AdjointError) as e:
        adjoint.load(path)
    err = e.value
    assert f"{path}:2:" in str(err)
    assert err.location[0] == str(path) and err.location[1] == 2
    assert err.kind == "program"
    assert err.summary and "\n" not in err.summary
    # The source line is shown.
    assert "fn bad(x) = x +* 2" in str(err)


def test_an_unknown_name_points_at_it():
    with pytest.raises(adjoint.AdjointError) as e:
        adjoint.loads("fn g(x) = x * y\n", name="bad.adj")
    assert "bad.adj:1:15" in str(e.value)
    assert e.value.location == ("bad.adj", 1, 15)
    assert "unknown name `y`" in e.value.summary


def test_a_shape_error_at_call_time_points_into_the_program():
    m = adjoint.loads("fn f(a, x) {\n    let r = a @ x;\n    sum(r)\n}\n", name="shapes.adj")
    with pytest.raises(adjoint.AdjointError) as e:
        m.f(np.ones((3, 2)), np.ones(3))
    assert "shapes.adj:2:13" in str(e.value)
    assert re.search(r"inner dimensions 2 and 3", str(e.value))
    # The same function still works with arguments that fit.
    assert m.f(np.ones((3, 2)), np.ones(2)) == 6.0


def test_a_run_time_failure_is_an_adjoint_error():
    m = adjoint.loads("fn f(i: i64) = [1.0, 2.0, 3.0][i]\n",
                      name="rt.adj")
    assert m.f(1) == 2.0
    with pytest.raises(adjoint.AdjointError) as e:
        m.f(7)
    assert "rt.adj:1:" in str(e.value)


def test_a_missing_file():
    with pytest.raises(adjoint.AdjointError) as e:
        adjoint.load("/nonexistent/model.adj")
    assert "cannot read" in str(e.value) and "no such file" in str(e.value)
    assert e.value.kind == "io" and e.value.location is None


def test_wrong_numbers_of_arguments():
    m = adjoint.loads("fn loss(params, x, y) = sum(params * x) + y\n")
    with pytest.raises(adjoint.ArgumentError) as e:
        m.loss(1.0, 2.0)
    assert str(e.value) == ("`loss` takes 3 arguments (params, x, y), but 2 were given "
                            "(missing: y): missing argument `y` in call to `loss`")
    with pytest.raises(adjoint.ArgumentError, match="takes 3 arguments .* but 4 were given"):
        m.loss(1.0, 2.0, 3.0, 4.0)
    assert isinstance(e.value, adjoint.AdjointError) and isinstance(e.value, TypeError)


def test_an_argument_of_the_wrong_type_for_the_program():
    m = adjoint.loads("fn power(x, n: i64) = x * f64(n)\n", name="p.adj")
    with pytest.raises(adjoint.AdjointError) as e:
        m.power(2.0, 1.5)
    assert "p.adj:1:" in str(e.value)


def test_unknown_functions_list_those_there_are():
    m = adjoint.loads("fn a(x) = x\nfn b(x) = x\n", name="two.adj")
    with pytest.raises(AttributeError, match="`two.adj` has no function `c`; its functions: a, b"):
        m.c
    with pytest.raises(KeyError):
        m["c"]
    assert "a" in m and "c" not in m
    assert list(m) == ["a", "b"] and len(m) == 2
    assert m["b"](3.0) == 3.0
    assert set(dir(m)) == {"a", "b"}


def test_bad_mode():
    with pytest.raises(adjoint.ArgumentError, match='mode must be "graph" or "eager"'):
        adjoint.loads("fn a(x) = x\n", mode="fast")
    with pytest.raises(ValueError):
        adjoint.loads("fn a(x) = x\n", mode="fast")


def test_modes_and_repr():
    m = adjoint.loads("fn a(x, y) = x\n", mode="eager", name="r.adj")
    assert m.a.mode == "eager"
    assert m.a.with_mode("graph").mode == "graph"
    assert repr(m) == '<adjoint.Module "r.adj" (eager mode): a>'
    assert repr(m.a) == "<adjoint.Function a(x, y)>"
    assert m.a.result_type(np.ones(3, dtype=np.float32), 1.0) == "f32[3]"


def test_every_adjoint_error_has_the_attributes():
    m = adjoint.loads("fn closure(a) = |x| x * a\n")
    with pytest.raises(adjoint.AdjointError) as e:
        m.closure(1.0)
    assert e.value.kind == "usage" and e.value.location is None
    assert "function" in e.value.summary
    with pytest.raises(adjoint.ArgumentError) as e:
        m.closure({1})
    assert e.value.kind == "argument" and e.value.location is None


def test_program_errors_note_the_call_as_python_made_it():
    m = adjoint.loads("fn add(x, y) = x + y\nfn r(p) = p.w + p.b\n", name="n.adj")
    with pytest.raises(adjoint.AdjointError) as e:
        m.add(np.ones(3, dtype=np.float32), np.ones(4))
    assert "n.adj:1:16" in str(e.value)
    assert "called from Python as add(x: f32[3], y: f64[4])" in str(e.value)
    with pytest.raises(adjoint.AdjointError) as e:
        m.r({"w": np.ones(2), "b": (np.ones(3), 1)})
    assert "r(p: {w: f64[2], b: (f64[3], i64[])})" in str(e.value)
