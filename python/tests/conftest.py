"""Shared helpers of the Python package's tests (run by .ci/run:
`pytest python/tests` after `pip install ./python`)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli():
    """The `adjoint` command of a release build of this repository, or one
    on PATH."""
    dirs = []
    if os.environ.get("CARGO_TARGET_DIR"):
        dirs.append(Path(os.environ["CARGO_TARGET_DIR"]))
    dirs.append(REPO / "target")
    for d in dirs:
        for profile in ("release", "debug"):
            exe = d / profile / "adjoint"
            if exe.is_file():
                return str(exe)
    return shutil.which("adjoint")


@pytest.fixture(scope="session")
def cli():
    exe = _cli()
    if exe is None:
        message = "no `adjoint` command built (cargo build --release)"
        if os.environ.get("ADJOINT_REQUIRE_CLI"):
            pytest.fail(message)
        pytest.skip(message)
    return exe


NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)")


def numbers(text):
    """Every number printed in `text`, in order (the print format writes
    floats as the shortest decimal that reads back exactly)."""
    return [float(t) for t in NUMBER.findall(text)]


def flatten(x):
    """The numbers of a result (arrays, scalars, tuples, dicts) in the
    order the CLI prints them."""
    if isinstance(x, dict):
        return [v for item in x.values() for v in flatten(item)]
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in flatten(item)]
    return [float(v) for v in np.asarray(x).ravel()]


@pytest.fixture
def run_cli(cli, tmp_path):
    """Runs `adjoint run` on a program and gives what it printed, one list
    of numbers per line."""

    def run(source, mode="graph"):
        path = tmp_path / "cli.adj"
        path.write_text(source)
        out = subprocess.run(
            [cli, "run", str(path), "--mode", mode],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert out.returncode == 0, out.stderr
        return [numbers(line) for line in out.stdout.splitlines() if line.strip()]

    return run


def central_difference(f, args, argnum, eps=1e-6):
    """The gradient of scalar `f` with respect to array argument `argnum`
    by central differences (float64)."""
    x = np.array(args[argnum], dtype=np.float64)
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gf = g.reshape(-1)
    for i in range(flat.size):
        saved = flat[i]
        flat[i] = saved + eps
        hi = f(*[x.copy() if j == argnum else a for j, a in enumerate(args)])
        flat[i] = saved - eps
        lo = f(*[x.copy() if j == argnum else a for j, a in enumerate(args)])
        flat[i] = saved
        gf[i] = (hi - lo) / (2 * eps)
    return g if g.shape else float(g)
