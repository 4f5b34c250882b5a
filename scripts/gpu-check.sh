#!/usr/bin/env bash
# GPU parity and speed check for the CUDA back end (`--device cuda`).
#
#   scripts/gpu-check.sh            # on a machine with an NVIDIA GPU
#
# 1. builds the release binary;
# 2. runs every program of tests/programs/ and examples/ that succeeds on the CPU again
#    with --device cuda and compares the output: numbers within 1e-4
#    relative (plus 1e-6 absolute, for values near zero), all other text
#    exactly;
# 3. prints a benchmark table: the MLP train step (batch 1024,
#    784-2048-2048-10, f32), the ADBench GMM gradient (d=20 K=50, f64) and
#    the 16M-element f32 chain of benches/programs/map.adj, each beside
#    PyTorch on the same GPU when PyTorch is installed or installable, and
#    as a fraction of the GPU's memory bandwidth and peak FLOP/s.
#
# ADJOINT_BIN=path uses a binary built elsewhere instead of building one
# (a GPU machine without Rust). When the loader cannot find NVRTC or
# cuBLAS by the names the back end asks for (`libnvrtc.so`,
# `libnvrtc.so.12`, ..), the script looks in the CUDA toolkit and in the
# `nvidia-*` Python wheels and links what it finds into
# target/gpu-check-libs.
#
# It stops with a message and status 2 when no GPU can be used, status 1
# when a program's output differs. Meant to take under 5 minutes on one
# GPU. Set SKIP_BENCH=1 for the parity check alone, SKIP_TORCH=1 to
# leave PyTorch out, TORCH_DIR to where PyTorch
# may be installed (default target/gpu-check-torch), GPU_PEAK_GBS and
# GPU_PEAK_TFLOPS to the GPU's peak memory bandwidth (GB/s) and FP32
# FLOP/s (TFLOP/s) when it is not in the script's table.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "gpu-check: $*" >&2
    exit 2
}

command -v python3 >/dev/null || die "python3 is needed to compare outputs and time runs"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    die "no NVIDIA GPU here (nvidia-smi is missing or lists no GPU)"
fi

if [ -n "${ADJOINT_BIN:-}" ]; then
    BIN="$ADJOINT_BIN"
else
    echo "== build (release)"
    cargo build --release --quiet
    BIN="${CARGO_TARGET_DIR:-target}/release/adjoint"
fi
[ -x "$BIN" ] || die "no binary at $BIN"
mkdir -p target

# NVRTC and cuBLAS under the names the back end asks for.
find_lib() { # the newest lib$1.so* in the toolkit or the pip wheels
    local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
    local site
    for site in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null); do
        [ -d "$site/nvidia" ] && dirs+=("$site"/nvidia/*/lib "$site"/nvidia/*/*/lib)
    done
    for d in "${dirs[@]}"; do
        ls "$d"/lib"$1".so* 2>/dev/null
    done | sort -V | tail -1
}
SHIM="$PWD/target/gpu-check-libs"
mkdir -p "$SHIM"
for lib in nvrtc cublas; do
    if ! ldconfig -p 2>/dev/null | grep -qE "lib$lib\.so(\.12)? "; then
        f="$(find_lib "$lib")"
        if [ -n "$f" ]; then
            ln -sf "$f" "$SHIM/lib$lib.so"
            export LD_LIBRARY_PATH="$SHIM:$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "gpu-check: lib$lib from $f"
        fi
    fi
done
# for other tools run after this script (adjoint-fuzz --cuda)
echo "export LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}'" >target/gpu-check-env.sh

echo "== devices"
"$BIN" devices | tee target/gpu-check-devices.txt
grep -q '^cuda:0: ' target/gpu-check-devices.txt ||
    die "adjoint sees no usable GPU (see the cuda line above; NVRTC must be on LD_LIBRARY_PATH)"

if [ "${SKIP_TORCH:-0}" != 1 ] && ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    TORCH_DIR="${TORCH_DIR:-$PWD/target/gpu-check-torch}"
    if ! PYTHONPATH="$TORCH_DIR" python3 -c 'import torch' 2>/dev/null; then
        echo "== installing PyTorch into $TORCH_DIR (at most 150 s; SKIP_TORCH=1 skips)"
        PIP_BREAK_SYSTEM_PACKAGES=1 timeout 150 python3 -m pip install --quiet \
            --disable-pip-version-check --target "$TORCH_DIR" torch numpy ||
            echo "gpu-check: PyTorch could not be installed; its column stays empty" >&2
    fi
    export PYTHONPATH="$TORCH_DIR${PYTHONPATH:+:$PYTHONPATH}"
fi

exec python3 scripts/gpu_check.py --bin "$BIN"
