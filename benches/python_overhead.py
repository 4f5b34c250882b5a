#!/usr/bin/env python3
"""What calling Adjoint from Python costs, and a training step from Python
against the same step in JAX.

    pip install ./python numpy            # the package, from the repository root
    pip install jax                       # optional: the JAX row
    python benches/python_overhead.py [--quick]

Part 1, per-call overhead on small inputs: the median time of one call
from Python (argument conversion, GIL release, the SIGINT hook, result
conversion, plus the compiled function itself) against the same calls
timed inside Rust with the arguments converted once
(`adjoint._native_call_time`). The difference is what the binding adds
(goal: under 5 us).

Part 2, one training step of an MLP (64-512-10, ReLU, softmax
cross-entropy, batch 32, SGD, f32 — the digits model of
examples/digits_mlp.adj without dropout), called from Python in a loop:
  - Adjoint, the whole step (value_and_grad and the SGD update) as one
    compiled function;
  - Adjoint's value_and_grad from Python, with the update in NumPy;
  - JAX, the same step under jax.jit (block_until_ready after each call);
    skipped with a message when JAX is not installed.
The losses of the three are checked against each other first.
"""

import argparse
import statistics
import sys
import time

import numpy as np

import adjoint

SMALL = """
fn add1(x) = x + 1.0
fn axpy(a, x, y) = a * x + y
fn dense(p, x) = sum(tanh(x @ p.w + p.b))
fn pair(x, y) = (x * y, x + y)
"""

STEP = """
import nn
import optim

fn loss(p, x, y) = cross_entropy(nn.mlp(p, x), y)

fn step(p, x, y) {
    let (l, g) = value_and_grad(loss)(p, x, y);
    (l, optim.sgd(p, g, lr = 0.1))
}
"""


def median_time(f, budget, min_reps=5):
    """Median seconds of one call of `f`, timed in batches so that each
    timing covers at least ~1 ms."""
    f()
    t = time.perf_counter()
    f()
    one = max(time.perf_counter() - t, 1e-7)
    inner = max(1, int(1e-3 / one))
    samples = []
    deadline = time.perf_counter() + budget
    while len(samples) < min_reps or time.perf_counter() < deadline:
        t = time.perf_counter()
        for _ in range(inner):
            f()
        samples.append((time.perf_counter() - t) / inner)
    return statistics.median(samples)


def us(s):
    return f"{s * 1e6:9.2f} us"


def part1(budget):
    m = adjoint.loads(SMALL, name="small.adj")
    rng = np.random.default_rng(0)
    x16 = rng.standard_normal(16)
    y16 = rng.standard_normal(16)
    p = {"w": rng.standard_normal((8, 4)), "b": rng.standard_normal(4)}
    x8 = rng.standard_normal((2, 8))
    cases = [
        ("add1(float)", m.add1, (1.5,)),
        ("add1(f64[16])", m.add1, (x16,)),
        ("axpy(float, f64[16], f64[16])", m.axpy, (2.0, x16, y16)),
        ("pair(f64[16], f64[16]) -> tuple", m.pair, (x16, y16)),
        ("dense({w: f64[8,4], b: f64[4]}, f64[2,8])", m.dense, (p, x8)),
        ("grad(dense) -> dict", adjoint.grad(m.dense), (p, x8)),
    ]
    print("Per-call overhead from Python (graph mode, median):")
    print()
    print(f"| {'call':44} | {'from Python':>12} | {'inside Rust':>12} | {'overhead':>12} |")
    print(f"|{'-' * 46}|{'-' * 14}|{'-' * 14}|{'-' * 14}|")
    overheads = []
    for name, f, args in cases:
        py = median_time(lambda: f(*args), budget)
        n = max(10, int(0.2 / max(py, 1e-7)))
        native = min(adjoint._native_call_time(f, args, n) for _ in range(5))
        overheads.append(py - native)
        print(f"| {name:44} | {us(py):>12} | {us(native):>12} | {us(py - native):>12} |")
    print()
    print(f"Overhead beyond the compiled function's own time: {min(overheads) * 1e6:.2f} to "
          f"{max(overheads) * 1e6:.2f} us (goal: under 5 us).")
    print()


def init(rng):
    def dense(n_in, n_out, std):
        return {"w": (rng.standard_normal((n_in, n_out)) * std).astype(np.float32),
                "b": np.zeros(n_out, dtype=np.float32)}

    return {"hidden": dense(64, 512, np.sqrt(2 / 64)), "out": dense(512, 10, np.sqrt(2 / 522))}


def part2(budget):
    rng = np.random.default_rng(0)
    params = init(rng)
    x = rng.random((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int64)
    m = adjoint.loads(STEP, name="step.adj")
    vg = adjoint.value_and_grad(m.loss)

    def adjoint_step():
        return m.step(params, x, y)

    def numpy_update():
        loss, g = vg(params, x, y)
        new = {k: {n: params[k][n] - np.float32(0.1) * g[k][n] for n in params[k]}
               for k in params}
        return loss, new

    t = time.perf_counter()
    l_step, _ = adjoint_step()
    compile_step = time.perf_counter() - t
    l_vg, _ = numpy_update()
    rows = [
        ("Adjoint: step(p, x, y), one call", median_time(adjoint_step, budget)),
        ("Adjoint: value_and_grad + NumPy SGD", median_time(numpy_update, budget)),
    ]
    jax_note = None
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        jax_note = f"JAX is not installed ({e}); its row is skipped (pip install jax)."
    if jax_note is None:
        def jloss(p, x, y):
            h = jnp.maximum(x @ p["hidden"]["w"] + p["hidden"]["b"], 0)
            logits = h @ p["out"]["w"] + p["out"]["b"]
            lp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(lp, y[:, None], axis=1))

        @jax.jit
        def jstep(p, x, y):
            l, g = jax.value_and_grad(jloss)(p, x, y)
            return l, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, p, g)

        jp = jax.tree_util.tree_map(jnp.asarray, params)
        jx, jy = jnp.asarray(x), jnp.asarray(y)
        t = time.perf_counter()
        l_jax, _ = jax.block_until_ready(jstep(jp, jx, jy))
        compile_jax = time.perf_counter() - t

        def jax_step():
            return jax.block_until_ready(jstep(jp, jx, jy))

        rows.append((f"JAX {jax.__version__}: jax.jit(step), one call", median_time(jax_step, budget)))
        for name, v in [("Adjoint value_and_grad", l_vg), ("JAX", float(l_jax))]:
            if abs(float(v) - float(l_step)) > 1e-4 * abs(float(l_step)):
                sys.exit(f"the losses differ: Adjoint step {l_step}, {name} {v}")
    print("Training step from Python: MLP 64-512-10, batch 32, f32, SGD (median):")
    print()
    print(f"| {'step':44} | {'time':>12} |")
    print(f"|{'-' * 46}|{'-' * 14}|")
    for name, t in rows:
        print(f"| {name:44} | {us(t):>12} |")
    print()
    print(f"First call (compiling): Adjoint step {compile_step * 1e3:.0f} ms"
          + ("" if jax_note else f", JAX {compile_jax * 1e3:.0f} ms") + f"; loss {float(l_step):.6f}.")
    if jax_note:
        print(jax_note)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter timing budgets")
    args = ap.parse_args()
    budget = 0.2 if args.quick else 1.0
    part1(budget)
    part2(budget)


if __name__ == "__main__":
    main()
