"""grad, value_and_grad, vjp and jvp from Python against the CLI running
the same transforms in a program (`adjoint run`) and against central
finite differences."""

import numpy as np
import pytest

import adjoint
from conftest import central_difference, flatten

FUNCS = """
fn f(x) = sin(x) * x
fn residual(a, x, b) {
    let r = a @ x - b;
    sum(r * r)
}
fn g(x, y) = sum(tanh(x) * y) + sum(x * x) * y[0]
fn h(x, y) = (sin(x) * y, x * x + y)
fn rec_loss(p, x) = sum((x @ p.w + p.b) ** 2)
fn power(x, n: i64) {
    let mut acc = 1.0;
    for i in 0..n { acc = acc * x; }
    acc
}
"""

A = [[1.0, 2.0], [3.0, -4.0], [0.5, 6.0]]
X = [0.5, -1.0]
B = [1.0, 0.0, -1.0]
GX = [0.3, -0.7, 1.1]
GY = [2.0, -0.5, 0.25]


def arr(v):
    return np.array(v, dtype=np.float64)


@pytest.fixture(scope="module", params=["graph", "eager"])
def m(request):
    return adjoint.loads(FUNCS, mode=request.param, name="t.adj")


def close(a, b, rtol=1e-10, atol=1e-12):
    a, b = flatten(a), flatten(b)
    assert len(a) == len(b), (a, b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_transforms_agree_with_the_cli(run_cli, mode):
    m = adjoint.loads(FUNCS, mode=mode, name="t.adj")
    main = FUNCS + f"""
fn main() {{
    let a = {A};
    let x = {X};
    let b = {B};
    let gx = {GX};
    let gy = {GY};
    print(grad(f)(1.2));
    print(value_and_grad(f)(1.2));
    print(grad(residual, argnums = (0, 1))(a, x, b));
    print(grad(residual, argnums = (1,))(a, x, b));
    print(value_and_grad(g, argnums = (0, 1))(gx, gy));
    print(jvp(g, (gx, gy), ([1.0, 0.0, 2.0], [0.5, 0.5, -1.0])));
    let (y, pb) = vjp(h, gx, gy);
    print(y);
    print(pb(([1.0, 2.0, 3.0], [-1.0, 0.0, 1.0])));
    print(grad(grad(f))(0.7));
    print(grad(power)(1.5, 4));
}}
"""
    lines = run_cli(main, mode=mode)
    a, x, b, gx, gy = arr(A), arr(X), arr(B), arr(GX), arr(GY)
    ours = [
        adjoint.grad(m.f)(1.2),
        adjoint.value_and_grad(m.f)(1.2),
        adjoint.grad(m.residual, argnums=(0, 1))(a, x, b),
        adjoint.grad(m.residual, argnums=(1,))(a, x, b),
        adjoint.value_and_grad(m.g, argnums=(0, 1))(gx, gy),
        adjoint.jvp(m.g, (gx, gy), (arr([1.0, 0.0, 2.0]), arr([0.5, 0.5, -1.0]))),
    ]
    y, pb = adjoint.vjp(m.h, gx, gy)
    ours += [y, pb((arr([1.0, 2.0, 3.0]), arr([-1.0, 0.0, 1.0])))]
    ours += [adjoint.grad(adjoint.grad(m.f))(0.7), adjoint.grad(m.power)(1.5, 4)]
    assert len(lines) == len(ours)
    for line, value in zip(lines, ours):
        close(value, line, rtol=1e-12)


def test_grad_against_finite_differences(m):
    a, x, b = arr(A), arr(X), arr(B)
    for argnum in range(3):
        g = adjoint.grad(m.residual, argnums=argnum)(a, x, b)
        fd = central_difference(m.residual, [a, x, b], argnum)
        assert g.shape == fd.shape
        close(g, fd, rtol=1e-6, atol=1e-6)
    # A tuple of argnums gives a tuple; an int the gradient itself.
    gs = adjoint.grad(m.residual, argnums=(2, 0))(a, x, b)
    assert isinstance(gs, tuple) and len(gs) == 2
    close(gs[0], central_difference(m.residual, [a, x, b], 2), rtol=1e-6, atol=1e-6)
    close(gs[1], central_difference(m.residual, [a, x, b], 0), rtol=1e-6, atol=1e-6)
    # Negative argnums count from the end, as in JAX.
    close(adjoint.grad(m.residual, argnums=-1)(a, x, b), gs[0])
    # Scalars: d/dx sin(x) x.
    x0 = 0.9
    assert abs(adjoint.grad(m.f)(x0) - (np.sin(x0) + x0 * np.cos(x0))) < 1e-12


def test_grad_of_a_record_is_a_dict(m):
    p = {"w": arr([[1.0, -2.0], [0.5, 0.25]]), "b": arr([0.1, -0.3])}
    x = arr([[1.0, 2.0], [-1.0, 0.5], [3.0, 1.0]])
    g = adjoint.grad(m.rec_loss)(p, x)
    assert list(g) == ["w", "b"]
    loss_w = lambda w, x: m.rec_loss({"w": w, "b": p["b"]}, x)
    loss_b = lambda b, x: m.rec_loss({"w": p["w"], "b": b}, x)
    close(g["w"], central_difference(loss_w, [p["w"], x], 0), rtol=1e-6, atol=1e-6)
    close(g["b"], central_difference(loss_b, [p["b"], x], 0), rtol=1e-6, atol=1e-6)
    v, g2 = adjoint.value_and_grad(m.rec_loss)(p, x)
    assert v == m.rec_loss(p, x)
    close(g2, g)


def test_value_and_grad_with_one_argnum(m):
    gx, gy = arr(GX), arr(GY)
    v, g = adjoint.value_and_grad(m.g, argnums=1)(gx, gy)
    assert v == pytest.approx(m.g(gx, gy), rel=1e-14)
    assert isinstance(g, np.ndarray)
    close(g, central_difference(m.g, [gx, gy], 1), rtol=1e-6, atol=1e-6)


def test_jvp_against_finite_differences(m):
    gx, gy = arr(GX), arr(GY)
    tx, ty = arr([1.0, -2.0, 0.5]), arr([0.3, 0.0, -1.0])
    y, t = adjoint.jvp(m.g, (gx, gy), (tx, ty))
    assert y == pytest.approx(m.g(gx, gy), rel=1e-14)
    eps = 1e-6
    fd = (m.g(gx + eps * tx, gy + eps * ty) - m.g(gx - eps * tx, gy - eps * ty)) / (2 * eps)
    assert t == pytest.approx(fd, rel=1e-6)
    # A tuple-valued function: the tangent has the result's structure.
    y, t = adjoint.jvp(m.h, [gx, gy], [tx, ty])
    assert isinstance(y, tuple) and isinstance(t, tuple)
    close(t[0], np.cos(gx) * tx * gy + np.sin(gx) * ty)
    close(t[1], 2 * gx * tx + ty)


def test_vjp_against_finite_differences(m):
    gx, gy = arr(GX), arr(GY)
    y, pullback = adjoint.vjp(m.h, gx, gy)
    close(y, m.h(gx, gy))
    c0, c1 = arr([1.0, 2.0, 3.0]), arr([-1.0, 0.0, 1.0])
    cts = pullback((c0, c1))
    assert isinstance(cts, tuple) and len(cts) == 2
    # <ct, h(x)> differentiated by finite differences.
    dot = lambda x, y: float(np.dot(c0, m.h(x, y)[0]) + np.dot(c1, m.h(x, y)[1]))
    close(cts[0], central_difference(dot, [gx, gy], 0), rtol=1e-6, atol=1e-6)
    close(cts[1], central_difference(dot, [gx, gy], 1), rtol=1e-6, atol=1e-6)
    # The pullback can be called again, with another cotangent.
    cts2 = pullback((2 * c0, 2 * c1))
    close(cts2, [2 * c for c in flatten(cts)])
    # vjp and jvp agree: <ct, J t> = <J^T ct, t>.
    t = (arr([0.2, 0.1, -0.4]), arr([1.0, 1.0, 0.5]))
    _, jt = adjoint.jvp(m.h, (gx, gy), t)
    lhs = np.dot(c0, jt[0]) + np.dot(c1, jt[1])
    rhs = np.dot(cts[0], t[0]) + np.dot(cts[1], t[1])
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_transforms_compose_and_are_made_once(m):
    # grad of grad: d2/dx2 sin(x) x = 2 cos x - x sin x.
    d2 = adjoint.grad(adjoint.grad(m.f))
    x = 0.4
    assert d2(x) == pytest.approx(2 * np.cos(x) - x * np.sin(x), rel=1e-12)
    # jvp of grad: a Hessian-vector product.
    _, hv = adjoint.jvp(adjoint.grad(m.f), (x,), (1.0,))
    assert hv == pytest.approx(d2(x), rel=1e-12)
    # A second grad(m.f) reuses what the first made (and compiled).
    assert adjoint.grad(m.f).__name__ == "grad(f)"
    assert adjoint.grad(m.g, argnums=1).__name__ == "grad(g, argnums=1)"
    assert adjoint.grad(m.g, argnums=(0, 1)).params == ["x", "y"]


def test_int_arguments_and_transforms(m):
    # d/dx x^4 at 1.5 = 4 * 1.5^3; the int argument is not differentiated.
    assert adjoint.grad(m.power)(1.5, 4) == pytest.approx(4 * 1.5**3, rel=1e-12)
    with pytest.raises(adjoint.AdjointError, match="int"):
        adjoint.grad(m.power, argnums=1)(1.5, 4)


def test_float32_gradients_stay_float32(m):
    a = arr(A).astype(np.float32)
    x = arr(X).astype(np.float32)
    b = arr(B).astype(np.float32)
    g = adjoint.grad(m.residual, argnums=1)(a, x, b)
    assert g.dtype == np.float32
    close(g, adjoint.grad(m.residual, argnums=1)(arr(A), arr(X), arr(B)), rtol=1e-5)


def test_transform_arguments_are_checked(m):
    with pytest.raises(adjoint.ArgumentError, match="function of an Adjoint module"):
        adjoint.grad(lambda x: x)
    with pytest.raises(adjoint.ArgumentError, match="out of range"):
        adjoint.grad(m.f, argnums=1)
    with pytest.raises(adjoint.ArgumentError, match="int or a tuple of ints"):
        adjoint.grad(m.f, argnums="0")
    with pytest.raises(adjoint.ArgumentError, match="empty"):
        adjoint.grad(m.f, argnums=())
    with pytest.raises(adjoint.ArgumentError, match="takes 2 arguments"):
        adjoint.jvp(m.g, (1.0,), (1.0,))
    with pytest.raises(adjoint.ArgumentError, match="as a tuple"):
        adjoint.jvp(m.f, 1.0, 1.0)
    with pytest.raises(adjoint.ArgumentError, match="takes 3 arguments"):
        adjoint.vjp(m.residual, 1.0)
    k = adjoint.loads("fn k() = 1.0\n")
    with pytest.raises(adjoint.AdjointError, match="nothing to differentiate"):
        adjoint.grad(k.k)


def test_parameters_with_defaults_may_be_left_out():
    m = adjoint.loads("fn g(x, s = 2.0, t = 1.0) = x * s * t\n", name="d.adj")
    assert m.g(1.5) == 3.0
    assert m.g(1.5, 3.0) == 4.5
    assert m.g(1.5, t=4.0) == 12.0
    # Transforms too: argnums count all the parameters.
    assert adjoint.grad(m.g)(1.5) == 2.0
    assert adjoint.grad(m.g, argnums=2)(1.5, t=3.0) == 3.0
    assert adjoint.value_and_grad(m.g, argnums=(0, 2))(1.5, t=3.0) == (9.0, (6.0, 3.0))
    with pytest.raises(adjoint.ArgumentError, match=r"missing: x, t"):
        m.g(s=1.0)
    with pytest.raises(adjoint.ArgumentError, match="argument 2, which was not given"):
        adjoint.grad(m.g, argnums=2)(1.5)


def test_tangents_and_cotangents_must_have_the_type_they_go_with():
    m = adjoint.loads("fn g(x) = x * 2.0\nfn h(p) = (p.w * 2.0, p.b)\n")
    x32 = np.ones(2, dtype=np.float32)
    with pytest.raises(adjoint.ArgumentError,
                       match=r"tangent of argument `x` \(index 0\).*expected f32\[2\], got f64\[2\]"):
        adjoint.jvp(m.g, (x32,), (np.ones(2),))
    _, pullback = adjoint.vjp(m.g, x32)
    with pytest.raises(adjoint.ArgumentError, match=r"result's type: expected f32\[2\], got f64\[\]"):
        pullback(1.0)
    (ct,) = pullback(np.full(2, 3.0, dtype=np.float32))
    assert ct.dtype == np.float32
    np.testing.assert_array_equal(ct, [6.0, 6.0])
    _, pullback = adjoint.vjp(m.h, {"w": np.ones(2), "b": 1.0})
    with pytest.raises(adjoint.ArgumentError, match=r"at \[0\]: expected f64\[2\], got f64\[3\]"):
        pullback((np.ones(3), 1.0))
    # A Python float is weakly typed: it fits a scalar of any float dtype.
    (ct,) = pullback((np.ones(2), 2.0))
    assert ct["b"] == 2.0
    y, t = adjoint.jvp(m.g, (np.float32(1.0),), (1.0,))
    assert type(t) is np.float32 and t == 2.0
