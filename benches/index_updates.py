#!/usr/bin/env python3
"""Time per single-element indexed update, against the array's size.

For each n in 10^4, 10^5, 10^6 it times a loop of n updates
`v[i] = f64(i) * 0.5` of an f64 array of n elements:

- Adjoint: `adjoint run --stats` of a generated program (graph mode); the
  run time it reports, which includes making the array (one O(n) fill),
  and how many updates wrote into the array's own buffer;
- JAX (if installed in the interpreter running this script): the same
  loop as `lax.fori_loop` over `v.at[i].set(..)` under `jit`, compiled
  before timing;
- NumPy: a Python loop of `v[i] = i * 0.5`.

If each update copied the array the time per update would grow with n
(10^2 times from the first row to the last); written in place, it stays
flat.

    target/pyenv/bin/python benches/index_updates.py [--adjoint PATH] [--sizes 10000,100000,1000000]

PATH defaults to target/release/adjoint (build it with
`cargo build --release --bin adjoint`), else target/debug/adjoint.
"""

import argparse
import os
import re
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
fn fill(n: i64) {
    let mut v = zeros([n], dtype = f64);
    for i in 0..n {
        v[i] = f64(i) * 0.5;
    }
    v
}

fn main() {
    let v = fill(N);
    print(v[N - 1], sum(v));
}
"""


def adjoint_time(exe, n):
    with tempfile.NamedTemporaryFile("w", suffix=".adj", delete=False) as f:
        f.write(PROGRAM.replace("N", str(n)))
        path = f.name
    try:
        r = subprocess.run([exe, "run", path, "--stats"], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    want = (n - 1) * 0.5
    got = float(r.stdout.split()[0])
    assert got == want, (got, want)
    run_ms = float(re.search(r"stats: run ([0-9.]+) ms", r.stderr).group(1))
    m = re.search(r"stats: (\d+) indexed updates, (\d+) of them", r.stderr)
    return run_ms / 1e3, int(m.group(1)), int(m.group(2))


def numpy_time(n):
    import numpy as np

    v = np.zeros(n)
    t0 = time.perf_counter()
    for i in range(n):
        v[i] = i * 0.5
    return time.perf_counter() - t0


def jax_time(n):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)

    @jax.jit
    def fill(v):
        return jax.lax.fori_loop(0, v.shape[0], lambda i, v: v.at[i].set(i * 0.5), v)

    v = jnp.zeros(n)
    fill(v).block_until_ready()
    t0 = time.perf_counter()
    fill(v).block_until_ready()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adjoint", default=None)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    args = ap.parse_args()
    exe = args.adjoint
    if exe is None:
        rel = os.path.join(ROOT, "target", "release", "adjoint")
        exe = rel if os.path.exists(rel) else os.path.join(ROOT, "target", "debug", "adjoint")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"adjoint: {exe}")
    print(f"{'n (updates = size)':>20} {'adjoint ns/update':>18} {'in place':>14} {'jax ns/update':>14} {'numpy ns/update':>16}")
    for n in sizes:
        t, ups, inplace = adjoint_time(exe, n)
        j = jax_time(n)
        np_t = numpy_time(n)
        jcol = f"{j / n * 1e9:14.1f}" if j is not None else f"{'(no jax)':>14}"
        print(f"{n:>20} {t / n * 1e9:18.1f} {f'{inplace}/{ups}':>14} {jcol} {np_t / n * 1e9:16.1f}")


if __name__ == "__main__":
    main()
