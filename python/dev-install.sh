#!/usr/bin/env bash
# Builds the package into target/pyenv (what .ci/run does), for development:
#     python/dev-install.sh && target/pyenv/bin/python -m pytest python/tests
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x target/pyenv/bin/python ]; then
    python3 -m venv target/pyenv
    target/pyenv/bin/pip install --quiet --disable-pip-version-check maturin numpy pytest
fi
PATH="$PWD/target/pyenv/bin:$PATH" target/pyenv/bin/pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall ./python
