#!/usr/bin/env bash
# Adjoint side by side with JAX and PyTorch: makes a virtualenv in
# benches/.venv (once), builds the Adjoint timing harness, and runs
# benches/compare.py with the arguments given (see --help).
#
#   benches/compare.sh             # the full run (a few minutes)
#   benches/compare.sh --quick     # a smoke test
#   benches/compare.sh --runs 3    # three runs in turn: median and spread
#
# PYTHON picks the interpreter for the virtualenv (default python3);
# CARGO_TARGET_DIR is honoured as usual.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import numpy, jax, torch" 2>/dev/null; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet numpy "jax[cpu]"
    # The CPU-only wheel is much smaller; PyPI's (with CUDA libraries) when
    # the PyTorch index cannot be reached.
    if ! "$venv/bin/python" -m pip install --quiet torch \
            --retries 0 --timeout 15 --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
        echo "compare.sh: the PyTorch CPU index is unreachable; installing torch from PyPI" >&2
        "$venv/bin/python" -m pip install --quiet torch
    fi
fi

cd "$root"
echo "compare.sh: building the Adjoint harness (cargo bench --no-run)" >&2
cargo bench --quiet --bench adjoint_bench --no-run
exec "$venv/bin/python" "$here/compare.py" "$@"
