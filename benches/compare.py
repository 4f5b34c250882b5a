#!/usr/bin/env python3
"""Adjoint side by side with JAX (jit) and PyTorch (eager), in one run.

    benches/compare.sh            # makes benches/.venv, builds, runs this
    benches/compare.sh --quick    # shorter budgets (a smoke test)
    benches/compare.sh --runs 3   # three runs in turn: median and spread

Cases (docs/benchmarks.md):
  1. MLP train step, batch 128, 784-512-512-10, ReLU, softmax cross-entropy,
     SGD, f32;
  2. ADBench GMM objective + gradient, f64, d=10 K=25 n=1000 and d=20 K=50;
  3. gradient of x <- sin(x)*x + 0.5 iterated 1000 steps, f64 scalar;
  4. y = tanh(2x+1)*sigmoid(x) - x/3 on 16M (2^24) f32;
  5. gradient / objective time ratio on GMM: from the two cases' medians,
     and timed in turn (the objective, then objective and gradient, the
     ratio taken pair by pair, which a slow spell of the machine disturbs
     less);
  6. compile time of the MLP train step (Adjoint: source to ready-to-run;
     JAX: first jit call minus the steady state; PyTorch: none, eager);
  7. ADBench LSTM objective + gradient (2 layers, 1024 characters, f64),
     written as ADBench's Python reference is: a loop over characters
     (`lax.scan` in JAX, a Python loop in PyTorch and Adjoint's `for`), a
     loop over layers, and its compile time as in 6.

Every time is the median of repeated runs of one evaluation (after warm-up
calls), each ended by waiting for the result (`block_until_ready` for JAX).
The Adjoint numbers come from `cargo bench --bench adjoint_bench -- --json`
(benches/adjoint_bench.rs), which times evaluations inside one run of a
compiled program. The GMM objective and gradient of the three systems are
checked against each other before the table is printed.
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

THREADS = [None]  # --threads
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "gmm")

# Goals from the project issue (seconds): what JAX and PyTorch took there.
GOALS = {
    "mlp": (3.3e-3, 3.7e-3),
    "gmm_d10_grad": (1.55e-3, 2.97e-3),
    "gmm_d20_grad": (9.4e-3, 13.1e-3),
    "loop_grad": (32e-6, 22e-3),
    "map16m": (35e-3, 217e-3),
    "mlp_compile": (0.29, None),
    "lstm": (8e-3, None),
    "lstm_compile": (0.8, None),
}

ROWS = [
    ("lstm", "7. ADBench LSTM obj+grad (f64)"),
    ("lstm_compile", "7. LSTM compile time"),
    ("ba", "8. ADBench BA obj+grad n49 (f64)"),
    ("ba_compile", "8. BA compile time"),
    ("mlp", "1. MLP train step (f32, batch 128)"),
    ("gmm_d10_grad", "2. GMM obj+grad d=10 K=25 (f64)"),
    ("gmm_d20_grad", "2. GMM obj+grad d=20 K=50 (f64)"),
    ("loop_grad", "3. grad of 1000-step sin loop (f64)"),
    ("loop_fwd", "3b. 1000-step sin loop, forward (f64)"),
    ("loop_tensor_grad", "3c. grad of 1000-step loop, 1000 f32"),
    ("loop_tensor_fwd", "3d. 1000-step loop, 1000 f32, forward"),
    ("map16m", "4. tanh*sigmoid map, 16M f32"),
    ("gmm_d10_obj", "   GMM objective only d=10 K=25"),
    ("gmm_d20_obj", "   GMM objective only d=20 K=50"),
    ("gmm_d10_ratio", "5. GMM grad/objective ratio d=10"),
    ("gmm_d20_ratio", "5. GMM grad/objective ratio d=20"),
    ("gmm_d10_pair_ratio", "5. the same d=10, timed in turn"),
    ("gmm_d20_pair_ratio", "5. the same d=20, timed in turn"),
    ("mlp_compile", "6. MLP train step compile time"),
]


def load_lstm():
    d = os.path.join(HERE, "data", "lstm", "l2_c1024")
    return [np.load(os.path.join(d, f + ".npy")) for f in ("main", "extra", "state", "sequence")]


def load_ba():
    d = os.path.join(HERE, "data", "ba", "n49")
    return [np.load(os.path.join(d, f + ".npy"))
            for f in ("cams", "points", "weights", "features", "obs")]


def load_gmm(name):
    def f(k):
        return np.load(os.path.join(DATA, name, k + ".npy"))
    w = f("wishart")
    return f("alpha"), f("means"), f("icf"), f("x"), float(w[0]), float(w[1])


def lower_index(d):
    """Where entry (r, c), r > c, of the strictly lower part of L sits in a
    row of icf (0 elsewhere); the same gather as examples/gmm.adj."""
    r = np.arange(d)[:, None]
    c = np.arange(d)[None, :]
    at = d + c * (d - 1) - c * (c - 1) // 2 + r - c - 1
    return np.where(r > c, at, 0), (r > c)


def time_fn(fn, budget, max_reps, min_reps=3, warmup=2):
    """Median seconds of `fn()` (which must wait for its result)."""
    for _ in range(warmup):
        fn()
    times = []
    t_end = time.perf_counter() + budget
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def time_pair(first, second, budget, max_reps, min_reps=3, warmup=2):
    """`first()` and `second()` timed in turn: the median of `second`'s
    time over `first`'s, pair by pair (a slow spell of the machine slows
    both sides of a pair)."""
    for _ in range(warmup):
        first()
        second()
    ratios = []
    t_end = time.perf_counter() + budget
    while len(ratios) < max_reps and (len(ratios) < min_reps or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    return statistics.median(ratios)


# --------------------------------------------------------------------- JAX

def bench_jax(cases, budget, max_reps, log):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    out = {}
    checks = {}

    # 1 and 6: MLP
    if "mlp" in cases:
        def init(key, n_in, n_out):
            w = jax.random.normal(key, (n_in, n_out), dtype=jnp.float32) * jnp.float32(math.sqrt(2.0 / n_in))
            return {"w": w, "b": jnp.zeros((n_out,), jnp.float32)}
        keys = jax.random.split(jax.random.PRNGKey(0), 5)
        params = [init(keys[0], 784, 512), init(keys[1], 512, 512), init(keys[2], 512, 10)]
        x = jax.random.normal(keys[3], (128, 784), dtype=jnp.float32)
        labels = jax.random.randint(keys[4], (128,), 0, 10)

        def loss(p, x, labels):
            h = jax.nn.relu(x @ p[0]["w"] + p[0]["b"])
            h = jax.nn.relu(h @ p[1]["w"] + p[1]["b"])
            logits = h @ p[2]["w"] + p[2]["b"]
            lp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], axis=1))

        def train_step(p, x, labels):
            l, g = jax.value_and_grad(loss)(p, x, labels)
            return jax.tree_util.tree_map(lambda w, dw: w - 0.01 * dw, p, g), l

        step = jax.jit(train_step)
        t0 = time.perf_counter()
        first = step(params, x, labels)
        jax.block_until_ready(first)
        t_first = time.perf_counter() - t0
        state = {"p": params}

        def run():
            p, l = step(state["p"], x, labels)
            jax.block_until_ready(l)
            state["p"] = p
        out["mlp"], _ = time_fn(run, budget, max_reps)
        out["mlp_compile"] = max(t_first - out["mlp"], 0.0)
        log("jax mlp done")

    # 7: ADBench LSTM
    if "lstm" in cases:
        main_rows, extra, state, seq = (jnp.asarray(v) for v in load_lstm())
        w = main_rows.reshape(main_rows.shape[0], 4, -1)

        def lstm(weight, bias, hidden, cell, inp):
            forget = jax.nn.sigmoid(inp * weight[0] + bias[0])
            ingate = jax.nn.sigmoid(hidden * weight[1] + bias[1])
            outgate = jax.nn.sigmoid(inp * weight[2] + bias[2])
            change = jnp.tanh(hidden * weight[3] + bias[3])
            cell = cell * forget + ingate * change
            return outgate * jnp.tanh(cell), cell

        def predict(w, w2, s, inp):
            x = inp * w2[0]
            s2 = s
            for i in range(s.shape[0] // 2):
                h, c = lstm(w[2 * i], w[2 * i + 1], s[2 * i], s[2 * i + 1], x)
                s2 = s2.at[2 * i].set(h).at[2 * i + 1].set(c)
                x = h
            return x * w2[1] + w2[2], s2

        def loss(w, w2, s, sequence):
            def step(carry, ygold):
                s, inp, total = carry
                ypred, s = predict(w, w2, s, inp)
                ynorm = ypred - jnp.log(jnp.sum(jnp.exp(ypred)) + 2.0)
                return (s, ygold, total + jnp.sum(ygold * ynorm)), None
            (_, _, total), _ = jax.lax.scan(step, (s, sequence[0], 0.0), sequence[1:])
            return -total / ((sequence.shape[0] - 1) * sequence.shape[1])

        vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        t0 = time.perf_counter()
        v, g = vg(w, extra, state, seq)
        jax.block_until_ready(v)
        t_first = time.perf_counter() - t0
        checks["lstm"] = (float(v), float(jnp.sum(g[0]) + jnp.sum(g[1])))
        out["lstm"], _ = time_fn(lambda: jax.block_until_ready(vg(w, extra, state, seq)), budget, max_reps)
        out["lstm_compile"] = max(t_first - out["lstm"], 0.0)
        log("jax lstm done")

    # 8: ADBench bundle adjustment, vectorised over the observations
    if "ba" in cases:
        cams, points, weights, features, obs = (jnp.asarray(v) for v in load_ba())

        def rodrigues(rot, x):
            sqtheta = jnp.sum(rot * rot, axis=1, keepdims=True)
            theta = jnp.sqrt(sqtheta)
            w = rot / theta
            c, s = jnp.cos(theta), jnp.sin(theta)
            rotated = x * c + jnp.cross(w, x) * s + w * (jnp.sum(w * x, axis=1, keepdims=True) * (1.0 - c))
            return jnp.where(sqtheta != 0.0, rotated, x + jnp.cross(rot, x))

        def project(cam, x):
            xcam = rodrigues(cam[:, 0:3], x - cam[:, 3:6])
            p = xcam[:, 0:2] / xcam[:, 2:3]
            rsq = jnp.sum(p * p, axis=1, keepdims=True)
            distortion = 1.0 + cam[:, 9:10] * rsq + cam[:, 10:11] * rsq * rsq
            return p * distortion * cam[:, 6:7] + cam[:, 7:9]

        def ba_objective(cams, points, weights, obs, features):
            cam = jnp.take(cams, obs[:, 0], axis=0)
            x = jnp.take(points, obs[:, 1], axis=0)
            err = weights[:, None] * (project(cam, x) - features)
            werr = 1.0 - weights * weights
            return jnp.sum(err * err) + jnp.sum(werr * werr)

        vg = jax.jit(jax.value_and_grad(ba_objective, argnums=(0, 1, 2)))
        t0 = time.perf_counter()
        v, g = vg(cams, points, weights, obs, features)
        jax.block_until_ready(v)
        t_first = time.perf_counter() - t0
        checks["ba"] = (float(v), float(sum(jnp.sum(t) for t in g)))
        out["ba"], _ = time_fn(lambda: jax.block_until_ready(vg(cams, points, weights, obs, features)),
                               budget, max_reps)
        out["ba_compile"] = max(t_first - out["ba"], 0.0)
        log("jax ba done")

    # 2 and 5: GMM
    def gmm_objective(alphas, means, icf, x, gamma, m, idx, mask):
        k, d = means.shape
        n = x.shape[0]
        lower = jnp.where(mask, jnp.take(icf, idx, axis=1), 0.0)
        q = lower + jnp.exp(icf[:, :d])[:, :, None] * jnp.eye(d)
        sum_q = jnp.sum(icf[:, :d], axis=1)
        xc = x[None, :, :] - means[:, None, :]
        qx = xc @ jnp.transpose(q, (0, 2, 1))
        main = (alphas + sum_q)[:, None] - 0.5 * jnp.sum(qx * qx, axis=2)
        lse = jnp.sum(jax.scipy.special.logsumexp(main, axis=0))
        consts = -n * d * 0.5 * math.log(2 * math.pi)
        n2 = d + m + 1.0
        j = jnp.arange(d)
        lmg = 0.25 * d * (d - 1) * math.log(math.pi) + jnp.sum(jax.scipy.special.gammaln(0.5 * n2 - 0.5 * j))
        c = n2 * d * (jnp.log(gamma) - 0.5 * math.log(2.0)) - lmg
        frob = jnp.sum(jnp.exp(icf[:, :d]) ** 2) + jnp.sum(icf[:, d:] ** 2)
        prior = 0.5 * gamma * gamma * frob - m * jnp.sum(sum_q) - k * c
        return consts + lse - n * jax.scipy.special.logsumexp(alphas) + prior

    for set_name, short in (("d10_K25", "d10"), ("d20_K50", "d20")):
        if not any(c.startswith("gmm_" + short) for c in cases):
            continue
        a, mu, icf, xx, g, m = load_gmm(set_name)
        idx, mask = lower_index(mu.shape[1])
        args = [jnp.asarray(v) for v in (a, mu, icf, xx)] + [jnp.float64(g), jnp.float64(m)]
        idx, mask = jnp.asarray(idx), jnp.asarray(mask)
        obj = jax.jit(lambda a, mu, icf, x, g, m: gmm_objective(a, mu, icf, x, g, m, idx, mask))
        vg = jax.jit(jax.value_and_grad(
            lambda a, mu, icf, x, g, m: gmm_objective(a, mu, icf, x, g, m, idx, mask),
            argnums=(0, 1, 2)))
        v, grads = vg(*args)
        checks["gmm_" + short] = (float(v), float(sum(jnp.sum(t) for t in grads)))
        out["gmm_%s_grad" % short], _ = time_fn(lambda: jax.block_until_ready(vg(*args)), budget, max_reps)
        out["gmm_%s_obj" % short], _ = time_fn(lambda: jax.block_until_ready(obj(*args)), budget, max_reps)
        out["gmm_%s_pair_ratio" % short] = time_pair(lambda: jax.block_until_ready(obj(*args)),
                                                     lambda: jax.block_until_ready(vg(*args)),
                                                     budget, max_reps)
        log("jax gmm %s done" % short)

    # 3: gradient through a 1000-step loop
    if "loop_grad" in cases:
        def iterate(x):
            return jax.lax.fori_loop(0, 1000, lambda i, x: jnp.sin(x) * x + 0.5, x)
        gl = jax.jit(jax.grad(iterate))
        x0 = jnp.float64(0.3)
        checks["loop_grad"] = float(gl(x0))
        out["loop_grad"], _ = time_fn(lambda: jax.block_until_ready(gl(x0)), budget, max_reps)
        log("jax loop_grad done")

    # 3b: the same loop, forward only
    if "loop_fwd" in cases:
        fl = jax.jit(lambda x: jax.lax.fori_loop(0, 1000, lambda i, x: jnp.sin(x) * x + 0.5, x))
        x0 = jnp.float64(0.3)
        checks["loop_fwd"] = float(fl(x0))
        out["loop_fwd"], _ = time_fn(lambda: jax.block_until_ready(fl(x0)), budget, max_reps)
        log("jax loop_fwd done")

    # 3c, 3d: a loop over a small tensor (fori_loop: a static trip count,
    # which JAX needs for reverse mode), gradient and forward
    xt = jnp.sin(jnp.arange(1000, dtype=jnp.float32)) * jnp.float32(0.5)

    def tensor_loop(x):
        step = lambda i, y: y + 0.01 * jnp.tanh(y) * jnp.exp(-y * y)
        return jnp.sum(jax.lax.fori_loop(0, 1000, step, x))
    if "loop_tensor_grad" in cases:
        tg = jax.jit(jax.grad(tensor_loop))
        out["loop_tensor_grad"], _ = time_fn(lambda: jax.block_until_ready(tg(xt)), budget, max_reps)
        log("jax loop_tensor_grad done")
    if "loop_tensor_fwd" in cases:
        tf = jax.jit(tensor_loop)
        out["loop_tensor_fwd"], _ = time_fn(lambda: jax.block_until_ready(tf(xt)), budget, max_reps)
        log("jax loop_tensor_fwd done")

    # 4: element-wise map on 16M f32
    if "map16m" in cases:
        f = jax.jit(lambda x: jnp.tanh(2.0 * x + 1.0) * jax.nn.sigmoid(x) - x / 3.0)
        x = jax.random.normal(jax.random.PRNGKey(7), (1 << 24,), dtype=jnp.float32)
        out["map16m"], _ = time_fn(lambda: jax.block_until_ready(f(x)), budget, max_reps)
        log("jax map16m done")
    return out, checks, "jax " + jax.__version__


# ----------------------------------------------------------------- PyTorch

def bench_torch(cases, budget, max_reps, log):
    import torch
    import torch.nn.functional as F
    if THREADS[0]:
        torch.set_num_threads(THREADS[0])
    out = {}
    checks = {}

    if "mlp" in cases:
        gen = torch.Generator().manual_seed(0)

        def init(n_in, n_out):
            w = torch.randn(n_in, n_out, generator=gen, dtype=torch.float32) * math.sqrt(2.0 / n_in)
            return [w.requires_grad_(), torch.zeros(n_out, dtype=torch.float32, requires_grad=True)]
        params = init(784, 512) + init(512, 512) + init(512, 10)
        x = torch.randn(128, 784, generator=gen, dtype=torch.float32)
        labels = torch.randint(0, 10, (128,), generator=gen)

        def run():
            w1, b1, w2, b2, w3, b3 = params
            h = torch.relu(x @ w1 + b1)
            h = torch.relu(h @ w2 + b2)
            loss = F.cross_entropy(h @ w3 + b3, labels)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(0.01 * g)
            return loss.item()
        out["mlp"], _ = time_fn(run, budget, max_reps)
        log("torch mlp done")

    if "lstm" in cases:
        main_rows, extra, state, seq = (torch.from_numpy(v) for v in load_lstm())
        w0 = main_rows.reshape(main_rows.shape[0], 4, -1)

        def lstm(weight, bias, hidden, cell, inp):
            forget = torch.sigmoid(inp * weight[0] + bias[0])
            ingate = torch.sigmoid(hidden * weight[1] + bias[1])
            outgate = torch.sigmoid(inp * weight[2] + bias[2])
            change = torch.tanh(hidden * weight[3] + bias[3])
            cell = cell * forget + ingate * change
            return outgate * torch.tanh(cell), cell

        def loss(w, w2, s, sequence):
            total = 0.0
            inp = sequence[0]
            for t in range(sequence.shape[0] - 1):
                x = inp * w2[0]
                s2 = []
                for i in range(s.shape[0] // 2):
                    h, c = lstm(w[2 * i], w[2 * i + 1], s[2 * i], s[2 * i + 1], x)
                    s2 += [h, c]
                    x = h
                s = torch.stack(s2)
                ypred = x * w2[1] + w2[2]
                ynorm = ypred - torch.log(torch.sum(torch.exp(ypred)) + 2.0)
                ygold = sequence[t + 1]
                total = total + torch.sum(ygold * ynorm)
                inp = ygold
            return -total / ((sequence.shape[0] - 1) * sequence.shape[1])

        def vg():
            w = w0.clone().requires_grad_()
            w2 = extra.clone().requires_grad_()
            v = loss(w, w2, state, seq)
            g = torch.autograd.grad(v, (w, w2))
            return float(v), float(g[0].sum() + g[1].sum())
        checks["lstm"] = vg()
        out["lstm"], _ = time_fn(vg, budget, max_reps)
        log("torch lstm done")

    def gmm_objective(alphas, means, icf, x, gamma, m, idx, mask):
        k, d = means.shape
        n = x.shape[0]
        lower = torch.where(mask, icf[:, idx], torch.zeros((), dtype=icf.dtype))
        q = lower + torch.exp(icf[:, :d])[:, :, None] * torch.eye(d, dtype=icf.dtype)
        sum_q = icf[:, :d].sum(1)
        xc = x[None, :, :] - means[:, None, :]
        qx = xc @ q.transpose(1, 2)
        main = (alphas + sum_q)[:, None] - 0.5 * (qx * qx).sum(2)
        lse = torch.logsumexp(main, 0).sum()
        consts = -n * d * 0.5 * math.log(2 * math.pi)
        n2 = d + m + 1.0
        lmg = 0.25 * d * (d - 1) * math.log(math.pi) + sum(math.lgamma(0.5 * n2 - 0.5 * j) for j in range(d))
        c = n2 * d * (math.log(gamma) - 0.5 * math.log(2.0)) - lmg
        frob = (torch.exp(icf[:, :d]) ** 2).sum() + (icf[:, d:] ** 2).sum()
        prior = 0.5 * gamma * gamma * frob - m * sum_q.sum() - k * c
        return consts + lse - n * torch.logsumexp(alphas, 0) + prior

    for set_name, short in (("d10_K25", "d10"), ("d20_K50", "d20")):
        if not any(c.startswith("gmm_" + short) for c in cases):
            continue
        a, mu, icf, xx, g, m = load_gmm(set_name)
        idx, mask = lower_index(mu.shape[1])
        idx, mask = torch.from_numpy(idx), torch.from_numpy(mask)
        ta, tmu, ticf = (torch.tensor(v, requires_grad=True) for v in (a, mu, icf))
        tx = torch.tensor(xx)

        def vg():
            v = gmm_objective(ta, tmu, ticf, tx, g, m, idx, mask)
            grads = torch.autograd.grad(v, (ta, tmu, ticf))
            return v.item(), grads

        def obj():
            with torch.no_grad():
                return gmm_objective(ta, tmu, ticf, tx, g, m, idx, mask).item()
        v, grads = vg()
        checks["gmm_" + short] = (v, float(sum(t.sum() for t in grads)))
        out["gmm_%s_grad" % short], _ = time_fn(vg, budget, max_reps)
        out["gmm_%s_obj" % short], _ = time_fn(obj, budget, max_reps)
        out["gmm_%s_pair_ratio" % short] = time_pair(obj, vg, budget, max_reps)
        log("torch gmm %s done" % short)

    if "loop_grad" in cases:
        def gl():
            x0 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
            x = x0
            for _ in range(1000):
                x = torch.sin(x) * x + 0.5
            return torch.autograd.grad(x, x0)[0].item()
        checks["loop_grad"] = gl()
        out["loop_grad"], _ = time_fn(gl, budget, max_reps)
        log("torch loop_grad done")

    if "loop_fwd" in cases:
        def fl():
            x = torch.tensor(0.3, dtype=torch.float64)
            for _ in range(1000):
                x = torch.sin(x) * x + 0.5
            return x.item()
        checks["loop_fwd"] = fl()
        out["loop_fwd"], _ = time_fn(fl, budget, max_reps)
        log("torch loop_fwd done")

    xt = torch.sin(torch.arange(1000, dtype=torch.float32)) * 0.5

    def tensor_loop(x):
        y = x
        for _ in range(1000):
            y = y + 0.01 * torch.tanh(y) * torch.exp(-y * y)
        return y.sum()
    if "loop_tensor_grad" in cases:
        def tg():
            x0 = xt.clone().requires_grad_(True)
            return torch.autograd.grad(tensor_loop(x0), x0)[0]
        out["loop_tensor_grad"], _ = time_fn(tg, budget, max_reps)
        log("torch loop_tensor_grad done")
    if "loop_tensor_fwd" in cases:
        def tf():
            with torch.no_grad():
                return tensor_loop(xt).item()
        out["loop_tensor_fwd"], _ = time_fn(tf, budget, max_reps)
        log("torch loop_tensor_fwd done")

    if "map16m" in cases:
        x = torch.randn(1 << 24, generator=torch.Generator().manual_seed(7), dtype=torch.float32)

        def f():
            with torch.no_grad():
                return torch.tanh(2.0 * x + 1.0) * torch.sigmoid(x) - x / 3.0
        out["map16m"], _ = time_fn(f, budget, max_reps)
        log("torch map16m done")
    return out, checks, "torch %s (%d threads)" % (torch.__version__, torch.get_num_threads())


# ------------------------------------------------------------------ Adjoint

def bench_adjoint(cases, budget, max_reps, log):
    cmd = ["cargo", "bench", "--quiet", "--bench", "adjoint_bench", "--", "--json",
           "--budget", str(budget), "--max-reps", str(max_reps)] + sorted(cases)
    log("running " + " ".join(cmd))
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    out, checks, errors, raw = {}, {}, {}, []
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        raw.append(r)
        if "error" in r:
            errors[r["case"]] = r["error"]
            continue
        out[r["case"]] = r["median_s"]
        if "pair_ratio" in r:
            # gmm_d10_pair: objective, then objective and gradient, in turn.
            out[r["case"] + "_ratio"] = r["pair_ratio"]
        if "compile_s" in r:
            out[r["case"] + "_compile"] = r["compile_s"]
        vals = {}
        for res in r.get("results", []):
            parts = res.split()
            if len(parts) == 2:
                vals[parts[0]] = float(parts[1])
        if r["case"].endswith("_grad") and r["case"].startswith("gmm"):
            checks[r["case"][:-5]] = (vals.get("value"), vals.get("gradient_sum"))
        if r["case"] in ("loop_grad", "loop_fwd"):
            checks[r["case"]] = vals.get("value")
        if r["case"] in ("lstm", "ba"):
            checks[r["case"]] = (vals.get("value"), vals.get("gradient_sum"))
    if p.returncode != 0 and not raw:
        raise SystemExit("adjoint_bench failed (exit status %d)" % p.returncode)
    mode = raw[0].get("mode", "?") if raw else "?"
    return out, checks, errors, raw, "adjoint (%s mode)" % mode


# -------------------------------------------------------------------- table

def fmt_time(t):
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return "-"
    if t >= 1.0:
        return "%.2f s" % t
    if t >= 1e-3:
        return "%.2f ms" % (t * 1e3)
    return "%.1f us" % (t * 1e6)


def fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return "%.3g" % r


def add_ratios(res):
    for short in ("d10", "d20"):
        g, o = res.get("gmm_%s_grad" % short), res.get("gmm_%s_obj" % short)
        if g is not None and o:
            res["gmm_%s_ratio" % short] = g / o


def combine_runs(runs):
    """Per system and case, the median of the runs' values."""
    out = {}
    for res in runs:
        for s, r in res.items():
            for k, v in r.items():
                if v is not None:
                    out.setdefault(s, {}).setdefault(k, []).append(v)
    return {s: {k: statistics.median(v) for k, v in r.items()} for s, r in out.items()}


def print_spread(runs, sysnames):
    """Each case's lowest and highest run, per system, and the ratios of
    Adjoint to the others run by run."""
    others = [s for s in sysnames if s != "adjoint"]
    head = "%-38s" % ("spread over %d runs" % len(runs)) + "".join("%22s" % s for s in sysnames)
    if "adjoint" in sysnames:
        head += "".join("%16s" % ("adj/" + s) for s in others)
    print(head)
    print("-" * len(head))
    for key, label in ROWS:
        cols = []
        for s in sysnames:
            vals = [r[s][key] for r in runs if s in r and r[s].get(key) is not None]
            if not vals:
                cols.append("%22s" % "-")
            elif key.endswith("_ratio"):
                cols.append("%22s" % ("%.2f-%.2f" % (min(vals), max(vals))))
            else:
                cols.append("%22s" % ("%s-%s" % (fmt_time(min(vals)), fmt_time(max(vals)))))
        if all(c.strip() == "-" for c in cols):
            continue
        row = "%-38s" % label + "".join(cols)
        if "adjoint" in sysnames:
            for s in others:
                ratios = [r["adjoint"][key] / r[s][key] for r in runs
                          if r.get("adjoint", {}).get(key) is not None and r.get(s, {}).get(key)]
                row += "%16s" % ("%.3g-%.3g" % (min(ratios), max(ratios)) if ratios else "-")
        print(row)
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=4.0,
                    help="seconds of timed repetitions per case and system (default 4)")
    ap.add_argument("--max-reps", type=int, default=100, help="at most this many timed runs (default 100)")
    ap.add_argument("--quick", action="store_true", help="budget 0.5 s, at most 10 runs")
    ap.add_argument("--runs", type=int, default=1,
                    help="measure every system this many times, one after the other, and report "
                         "the median of the runs' medians with their spread (default 1): the "
                         "machine can be slow for a whole run")
    ap.add_argument("--only", nargs="*", default=None,
                    help="cases: lstm ba mlp gmm_d10 gmm_d20 loop_grad loop_fwd map16m (default all)")
    ap.add_argument("--skip", nargs="*", default=[], help="systems to leave out: adjoint jax torch")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results to FILE")
    ap.add_argument("--threads", type=int, default=None,
                    help="limit every system to N threads (Adjoint's rayon pool, XLA's and "
                         "PyTorch's intra-op pools); default: each library's own choice")
    args = ap.parse_args()
    if args.threads:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        if args.threads == 1:
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        THREADS[0] = args.threads
    if args.quick:
        args.budget, args.max_reps = 0.5, 10
    all_cases = ["lstm", "ba", "mlp", "gmm_d10_grad", "gmm_d10_obj", "gmm_d10_pair", "gmm_d20_grad", "gmm_d20_obj",
                 "gmm_d20_pair", "loop_grad", "loop_fwd", "loop_tensor_grad", "loop_tensor_fwd", "map16m"]
    cases = [c for c in all_cases if args.only is None or any(c.startswith(o) for o in args.only)]

    t_start = time.perf_counter()

    def log(msg):
        print("[%6.1f s] %s" % (time.perf_counter() - t_start, msg), file=sys.stderr, flush=True)

    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    checks, versions = {}, {}
    adj_errors, adj_raw = {}, []
    runs = []  # per run: system -> case -> median
    skipped = set(args.skip)
    for run in range(max(1, args.runs)):
        if args.runs > 1:
            log("run %d of %d" % (run + 1, args.runs))
        res = {}
        if "adjoint" not in skipped:
            out, chk, errs, raw, ver = bench_adjoint(cases, args.budget, args.max_reps, log)
            res["adjoint"], checks["adjoint"], versions["adjoint"] = out, chk, ver
            adj_raw += raw
            for c, e in errs.items():
                adj_errors[c] = e
                log("adjoint %s failed: %s" % (c, e.strip().splitlines()[0] if e.strip() else e))
        for name, fn in (("jax", bench_jax), ("torch", bench_torch)):
            if name in skipped:
                continue
            try:
                out, chk, ver = fn(cases, args.budget, args.max_reps, log)
            except ImportError as e:
                log("%s is not installed (%s): skipped" % (name, e))
                skipped.add(name)
                continue
            res[name], checks[name], versions[name] = out, chk, ver
        for r in res.values():
            add_ratios(r)
        runs.append(res)
    results = combine_runs(runs)

    # Do the systems compute the same thing?
    print("Cross-check (GMM, LSTM and BA objective and gradient sum; loop gradient and value):")
    ok = True
    systems = list(checks)
    for key in ("gmm_d10", "gmm_d20", "loop_grad", "loop_fwd", "lstm", "ba"):
        vals = {s: checks[s].get(key) for s in systems if checks[s].get(key) is not None}
        if len(vals) < 2:
            continue
        ref_sys, ref = next(iter(vals.items()))
        line = []
        for s, v in vals.items():
            pairs = v if isinstance(v, tuple) else (v,)
            refs = ref if isinstance(ref, tuple) else (ref,)
            worst = max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(pairs, refs) if a is not None)
            good = worst < 1e-8
            ok &= good
            line.append("%s %s%s" % (s, " ".join("%.15g" % p for p in pairs if p is not None),
                                     "" if good else " (MISMATCH vs %s: %.2g)" % (ref_sys, worst)))
        print("  %-9s %s" % (key + ":", "; ".join(line)))
    print()

    sysnames = [s for s in ("adjoint", "jax", "torch") if s in results]
    head = "%-38s" % "case" + "".join("%12s" % s for s in sysnames)
    if "adjoint" in results:
        head += "".join("%12s" % ("adj/" + s) for s in sysnames if s != "adjoint")
    head += "%12s%12s" % ("goal jax", "goal torch")
    print(head)
    print("-" * len(head))
    for key, label in ROWS:
        if not any(key in results[s] for s in sysnames):
            continue
        is_ratio = key.endswith("_ratio")
        cell = (lambda v: "-" if v is None else "%.2f" % v) if is_ratio else fmt_time
        row = "%-38s" % label + "".join("%12s" % cell(results[s].get(key)) for s in sysnames)
        if "adjoint" in results:
            row += "".join("%12s" % fmt_ratio(results["adjoint"].get(key), results[s].get(key))
                           for s in sysnames if s != "adjoint")
        goal = GOALS.get(key, (None, None))
        row += "%12s%12s" % (fmt_time(goal[0]) if goal[0] else "-", fmt_time(goal[1]) if goal[1] else "-")
        print(row)
    print()
    if len(runs) > 1:
        print_spread(runs, sysnames)
    print("Medians of repeated runs%s; adj/X is Adjoint's time over X's (higher: Adjoint slower)." % (
        ", then the median over %d runs" % len(runs) if len(runs) > 1 else ""))
    print("Versions: " + "; ".join("%s" % v for v in versions.values()))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("Machine: %s, %d CPUs, Python %s; threads: %s; load average %.1f at the start, %.1f at the end; total %.0f s" % (
        platform.platform(), os.cpu_count() or 0, platform.python_version(),
        args.threads or "library defaults", load0, load, time.perf_counter() - t_start))
    if adj_errors:
        print("Adjoint cases that failed: " + ", ".join(sorted(adj_errors)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "checks": {s: {k: v for k, v in c.items()} for s, c in checks.items()},
                       "versions": versions, "adjoint_raw": adj_raw, "date": time.strftime("%Y-%m-%d")}, f, indent=1)
    if not ok:
        print("The systems disagree on a checked value (see above).")
        return 1
    return 1 if adj_errors else 0


if __name__ == "__main__":
    sys.exit(main())
