#!/usr/bin/env python3
"""Per-example gradients, Adjoint's `vmap(grad(loss))` beside JAX's, in one run.

An MLP 784 -> 128 (tanh) -> 10, softmax cross-entropy, f32, batch 128
(the data and parameters are made here with NumPy and given to both
systems as .npy files). For each system it times

- per-example: `vmap(grad(loss), in_axes = (None, 0, 0))(p, x, y)`, the
  128 gradients at once (the first layer's is 128 x 784 x 128);
- batched: `grad` of the summed loss over the batch, one gradient,

and prints the median time of each, the ratio per-example / batched
(JAX's `vmap` promise: close to the cost of one batched gradient, plus
writing the larger result), and the ratio Adjoint / JAX. Before the
table it checks that both systems' per-example gradients agree.

Adjoint's time is taken from `adjoint run --stats` (graph mode, the run
without the compile), as the difference between a run of R + 1 calls and
a run of one call, over R. JAX's is the median of R calls of the jitted
function after a warm-up call, each ended by `block_until_ready`.

    pip install numpy "jax[cpu]"
    cargo build --release --bin adjoint
    python3 benches/per_example_grads.py [--adjoint PATH] [--reps 20]
"""

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, N_IN, N_HID, N_OUT = 128, 784, 128, 10

PROGRAM = """
fn forward(p, x) = tanh(x @ p.w1 + p.b1) @ p.w2 + p.b2
// The loss of one example (x [784], y one-hot [10]) or, summed, of a batch.
fn loss(p, x, y) = -sum(log_softmax(forward(p, x)) * y)

fn main() {
    let p = {w1: load_npy("w1.npy"), b1: load_npy("b1.npy"), w2: load_npy("w2.npy"), b2: load_npy("b2.npy")};
    let x = load_npy("x.npy");
    let y = load_npy("y.npy");
    let per = vmap(grad(loss), in_axes = (None, 0, 0));
    let mut acc = 0.0;
    for r in 0..REPS {
        // x changed below its last bit, so no call is hoisted out of the loop
        let x = x + f32(r) * 1e-30;
        let g = CALL;
        acc = acc + sum(g.b2);
        if r == 0 {
            print(CHECK);
        }
    }
    print(acc);
}
"""

PER_CALL = "per(p, x, y)"
PER_CHECK = "sum(abs(g.w1)), sum(abs(g.b2)), g.w1[3, 100, 7], g.b1[5, 9], g.w2[127, 1, 2]"
BATCH_CALL = "grad(loss)(p, x, y)"
BATCH_CHECK = "sum(abs(g.w1)), sum(abs(g.b2)), g.w1[100, 7]"


def make_data(d):
    rng = np.random.default_rng(0)
    p = {
        "w1": (rng.standard_normal((N_IN, N_HID)) * 0.05).astype(np.float32),
        "b1": np.zeros(N_HID, np.float32),
        "w2": (rng.standard_normal((N_HID, N_OUT)) * 0.1).astype(np.float32),
        "b2": np.zeros(N_OUT, np.float32),
    }
    x = rng.standard_normal((B, N_IN)).astype(np.float32)
    y = np.eye(N_OUT, dtype=np.float32)[rng.integers(0, N_OUT, B)]
    for k, v in p.items():
        np.save(os.path.join(d, f"{k}.npy"), v)
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), y)
    return p, x, y


def adjoint_run(exe, d, call, check, reps):
    src = PROGRAM.replace("REPS", str(reps)).replace("CALL", call).replace("CHECK", check)
    path = os.path.join(d, "bench.adj")
    with open(path, "w") as f:
        f.write(src)
    r = subprocess.run([exe, "run", path, "--stats"], capture_output=True, text=True, cwd=d)
    if r.returncode != 0:
        raise SystemExit(f"adjoint failed:\n{r.stderr}")
    ms = float(re.search(r"stats: run ([0-9.]+) ms", r.stderr).group(1))
    first = r.stdout.splitlines()[0].split()
    return ms / 1e3, [float(v) for v in first]


def adjoint_time(exe, d, call, check, reps):
    t1, vals = adjoint_run(exe, d, call, check, 1)
    tn, _ = adjoint_run(exe, d, call, check, reps + 1)
    return (tn - t1) / reps, vals


def jax_times(p, x, y, reps):
    import jax
    import jax.numpy as jnp

    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return -jnp.sum(jax.nn.log_softmax(h @ p["w2"] + p["b2"]) * y)

    per = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))
    batched = jax.jit(jax.grad(loss))
    pj = {k: jnp.asarray(v) for k, v in p.items()}
    xj, yj = jnp.asarray(x), jnp.asarray(y)

    def timed(f):
        jax.block_until_ready(f(pj, xj, yj))
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(f(pj, xj, yj))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    g = per(pj, xj, yj)
    vals = [
        float(jnp.sum(jnp.abs(g["w1"]))),
        float(jnp.sum(jnp.abs(g["b2"]))),
        float(g["w1"][3, 100, 7]),
        float(g["b1"][5, 9]),
        float(g["w2"][127, 1, 2]),
    ]
    return timed(per), timed(batched), vals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adjoint", default=None)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    exe = args.adjoint or os.path.join(ROOT, "target", "release", "adjoint")
    with tempfile.TemporaryDirectory() as d:
        p, x, y = make_data(d)
        a_per, a_vals = adjoint_time(exe, d, PER_CALL, PER_CHECK, args.reps)
        a_batch, _ = adjoint_time(exe, d, BATCH_CALL, BATCH_CHECK, args.reps)
    try:
        j_per, j_batch, j_vals = jax_times(p, x, y, args.reps)
    except ImportError:
        j_per = j_batch = j_vals = None
    if j_vals is not None:
        for name, a, j in zip(["sum|dw1|", "sum|db2|", "dw1[3,100,7]", "db1[5,9]", "dw2[127,1,2]"], a_vals, j_vals):
            ok = abs(a - j) <= 1e-4 * max(1.0, abs(j))
            print(f"check {name:>14}: adjoint {a: .7g}  jax {j: .7g}  {'ok' if ok else 'DIFFERENT'}")
            if not ok:
                raise SystemExit("the per-example gradients differ")
    print(f"\nper-example gradients, MLP {N_IN}-{N_HID}-{N_OUT}, batch {B}, f32 (median of {args.reps})")
    print(f"{'system':>8} {'per-example ms':>15} {'batched grad ms':>16} {'per-ex / batched':>17}")
    print(f"{'adjoint':>8} {a_per * 1e3:15.2f} {a_batch * 1e3:16.2f} {a_per / a_batch:17.1f}")
    if j_per is not None:
        print(f"{'jax':>8} {j_per * 1e3:15.2f} {j_batch * 1e3:16.2f} {j_per / j_batch:17.1f}")
        print(f"\nadjoint / jax: per-example {a_per / j_per:.2f}x, batched {a_batch / j_batch:.2f}x")
    else:
        print("(jax is not installed: no comparison)")


if __name__ == "__main__":
    main()
