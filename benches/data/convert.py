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

For the bundle-adjustment input `ba/ba1_n49_m7776_p31843.txt` (n cameras,
m points, p observations; the file holds one of each, which ADBench's
reader copies to all) it writes `ba/n49/` with:

    cams.npy      [n, 11]  f64: rotation (Rodrigues), centre, focal length,
                           principal point, two radial distortion terms
    points.npy    [m, 3]   f64
    weights.npy   [p]      f64
    features.npy  [p, 2]   f64
    obs.npy       [p, 2]   i64: observation i sees camera i % n, point i % m

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


def read_ba(path):
    with open(path) as f:
        rows = [line.split() for line in f if line.strip()]
    n, m, p = (int(v) for v in rows[0])
    cam, point, weight, feature = ([float(v) for v in r] for r in rows[1:5])
    if (len(cam), len(point), len(weight), len(feature)) != (11, 3, 1, 2):
        raise ValueError(f"{path}: expected rows of 11, 3, 1 and 2 numbers")
    i = np.arange(p, dtype=np.int64)
    return {
        "cams": np.tile(np.array(cam), (n, 1)),
        "points": np.tile(np.array(point), (m, 1)),
        "weights": np.full(p, weight[0]),
        "features": np.tile(np.array(feature), (p, 1)),
        "obs": np.stack([i % n, i % m], axis=1),
    }


def save(folder, arrays):
    """Writes each array to `folder/<key>.npy` (under this folder) and
    prints their shapes."""
    out = os.path.join(HERE, folder)
    os.makedirs(out, exist_ok=True)
    for key, arr in arrays.items():
        np.save(os.path.join(out, key + ".npy"), np.ascontiguousarray(arr))
    print(f"{folder}: " + ", ".join(f"{k}{list(v.shape)}" for k, v in arrays.items()))


def main():
    save("ba/n49", read_ba(os.path.join(HERE, "ba", "ba1_n49_m7776_p31843.txt")))
    save("lstm/l2_c1024", read_lstm(os.path.join(HERE, "lstm", "lstm_l2_c1024.txt")))
    for name, rel in INPUTS.items():
        save(f"gmm/{name}", read_gmm(os.path.join(HERE, rel)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
