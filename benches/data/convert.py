#!/usr/bin/env python3
"""Converts the ADBench GMM and LSTM text inputs in this folder to .npy
files that Adjoint programs read with `load_npy`.

    python3 benches/data/convert.py

For each input `gmm/test.txt` and `gmm/1k/gmm_dD_KK.txt` it writes a folder
`gmm/<name>/` (`gmm/test/`, `gmm/d2_K5/`, ...) with, all float64:

    alpha.npy     [K]
    means.npy     [K, D]
    icf.npy       [K, D*(D+1)/2]   D log-diagonal entries, then the strictly
                                   lower part of L column by column
    x.npy         [n, D]
    wishart.npy   [2]              gamma, m

For the LSTM input `lstm/lstm_l2_c1024.txt` (l layers, c characters, b
bits) it writes `lstm/l2_c1024/` with, all float64:

    main.npy      [2l, 4b]   per layer a row of weights, then a row of biases
    extra.npy     [3, b]     input scale, output scale, output bias
    state.npy     [2l, b]    per layer the hidden state, then the cell
    sequence.npy  [c, b]

The generated files are committed, so that tests need no Python; rerun this
script only when the inputs change. The text layout is described in
README.md.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

INPUTS = {
    "test": "gmm/test.txt",
    "d2_K5": "gmm/1k/gmm_d2_K5.txt",
    "d10_K25": "gmm/1k/gmm_d10_K25.txt",
    "d20_K50": "gmm/1k/gmm_d20_K50.txt",
}


def read_gmm(path):
    with open(path) as f:
        rows = [line.split() for line in f if line.strip()]
    d, k, n = (int(v) for v in rows[0])
    pos = 1

    def take(count, width):
        nonlocal pos
        block = np.array([[float(v) for v in r] for r in rows[pos:pos + count]],
                         dtype=np.float64)
        if block.shape != (count, width):
            raise ValueError(f"{path}: expected {count} rows of {width} numbers "
                             f"at row {pos + 1}, got shape {block.shape}")
        pos += count
        return block

    alpha = take(k, 1).reshape(k)
    means = take(k, d)
    icf = take(k, d * (d + 1) // 2)
    x = take(n, d)
    wishart = take(1, 2).reshape(2)
    if pos != len(rows):
        raise ValueError(f"{path}: {len(rows) - pos} unexpected trailing rows")
    return {"alpha": alpha, "means": means, "icf": icf, "x": x, "wishart": wishart}


def read_lstm(path):
    with open(path) as f:
        text = f.read()
    head, *sections = [s for s in text.split("\n\n") if s.strip()]
    l, c, b = (int(v) for v in head.split())
    shapes = {"main": (2 * l, 4 * b), "extra": (3, b), "state": (2 * l, b), "sequence": (c, b)}
    if len(sections) != len(shapes):
        raise ValueError(f"{path}: expected {len(shapes)} sections, got {len(sections)}")
    out = {}
    for (key, shape), sec in zip(shapes.items(), sections):
        block = np.array([[float(v) for v in r.split()] for r in sec.strip().splitlines()],
                         dtype=np.float64)
        if block.shape != shape:
            raise ValueError(f"{path}: section {key} has shape {block.shape}, expected {shape}")
        out[key] = block
    return out


def main():
    arrays = read_lstm(os.path.join(HERE, "lstm", "lstm_l2_c1024.txt"))
    out = os.path.join(HERE, "lstm", "l2_c1024")
    os.makedirs(out, exist_ok=True)
    for key, arr in arrays.items():
        np.save(os.path.join(out, key + ".npy"), np.ascontiguousarray(arr))
    print("lstm/l2_c1024: " + ", ".join(f"{k}{list(v.shape)}" for k, v in arrays.items()))
    for name, rel in INPUTS.items():
        arrays = read_gmm(os.path.join(HERE, rel))
        out = os.path.join(HERE, "gmm", name)
        os.makedirs(out, exist_ok=True)
        for key, arr in arrays.items():
            np.save(os.path.join(out, key + ".npy"), np.ascontiguousarray(arr))
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in arrays.items())
        print(f"gmm/{name}: {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
