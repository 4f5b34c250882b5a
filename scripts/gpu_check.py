#!/usr/bin/env python3
"""The work of scripts/gpu-check.sh once the binary is built: CPU/GPU parity
over the program corpus, then the benchmark table. Run it through the shell
script, which checks for a GPU first."""

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "target", "gpu-check")
NUM = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|-?inf|NaN|nan")

# name fragment -> (memory GB/s, FP32 TFLOP/s, FP64 TFLOP/s), from the
# vendors' data sheets (SXM parts unless the name says PCIe).
PEAKS = [
    ("H200", 4800, 67.0, 34.0),
    ("H100 NVL", 3900, 60.0, 30.0),
    ("H100 PCIe", 2000, 51.0, 26.0),
    ("H100", 3350, 67.0, 34.0),
    ("A100-SXM4-80GB", 2039, 19.5, 9.7),
    ("A100 80GB PCIe", 1935, 19.5, 9.7),
    ("A100", 1555, 19.5, 9.7),
    ("L40S", 864, 91.6, 1.4),
    ("L4", 300, 30.3, 0.49),
    ("A10", 600, 31.2, 0.98),
    ("T4", 320, 8.1, 0.25),
    ("V100", 900, 15.7, 7.8),
    ("RTX 4090", 1008, 82.6, 1.3),
    ("RTX 3090", 936, 35.6, 0.56),
]


def tokens(text):
    """Splits output into numbers (floats) and the text between them."""
    out, pos = [], 0
    for m in NUM.finditer(text):
        out.append(("t", text[pos:m.start()]))
        out.append(("n", float(m.group().replace("NaN", "nan"))))
        pos = m.end()
    out.append(("t", text[pos:]))
    return out


def same(a, b, rel=1e-4, abs_=1e-6):
    """Whether two outputs agree: text exactly, numbers within tolerance."""
    ta, tb = tokens(a), tokens(b)
    if len(ta) != len(tb):
        return False, "different structure"
    for (ka, va), (kb, vb) in zip(ta, tb):
        if ka != kb:
            return False, "different structure"
        if ka == "t" and va != vb:
            return False, "text %r vs %r" % (va, vb)
        if ka == "n":
            if math.isnan(va) or math.isnan(vb):
                if not (math.isnan(va) and math.isnan(vb)):
                    return False, "%r vs %r" % (va, vb)
            elif va != vb and abs(va - vb) > rel * max(abs(va), abs(vb)) + abs_:
                return False, "%r vs %r" % (va, vb)
    return True, ""


def run(bin_, args, timeout=120):
    p = subprocess.run([bin_] + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# Programs whose output is chaotic in rounding, with their own relative
# tolerance: 1,350 f32 Adam steps with dropout amplify the last bits of
# every product (on the CPU, eager and graph mode are 4% apart in the
# epoch-30 loss; cuBLAS rounds differently again).
LOOSE = {"examples/digits_mlp.adj": 0.1}


def parity_one(bin_, path):
    """(compared, failure or None) for one program."""
    try:
        rc, cpu, _ = run(bin_, ["run", path])
    except subprocess.TimeoutExpired:
        return False, None
    if rc != 0:
        return False, None  # programs that are meant to fail
    try:
        rc, gpu, err = run(bin_, ["run", path, "--device", "cuda"])
    except subprocess.TimeoutExpired:
        return True, "timed out on the GPU"
    if rc != 0:
        return True, "exit %d: %s" % (rc, err.strip()[:300])
    ok, why = same(cpu, gpu, rel=LOOSE.get(path, 1e-4))
    return True, None if ok else why


def parity(bin_):
    import concurrent.futures
    progs = [os.path.join(d, f) for d in ("tests/programs", "examples")
             for f in sorted(os.listdir(os.path.join(ROOT, d))) if f.endswith(".adj")]
    jobs = int(os.environ.get("GPU_CHECK_JOBS", min(8, os.cpu_count() or 1)))
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda f: (f,) + parity_one(bin_, f), progs))
    checked = sum(1 for _, c, _ in results if c)
    failed = [(f, why) for f, _, why in results if why]
    print("parity: %d programs compared, %d differ (%.0f s, %d at a time)"
          % (checked, len(failed), time.time() - t0, jobs))
    for f, why in failed:
        print("  %s: %s" % (f, why))
    return not failed


def tick_times(bin_, source, name, extra_args=(), timeout=240):
    """Runs a program that prints `tick` once per evaluation; returns the
    median time between ticks after two warm-up evaluations."""
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, name + ".adj")
    with open(path, "w") as fh:
        fh.write(source)
    p = subprocess.Popen([bin_, "run", path] + list(extra_args), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stamps = []
    deadline = time.time() + timeout
    for line in p.stdout:
        if line.startswith("tick"):
            stamps.append(time.perf_counter())
        if time.time() > deadline:
            p.kill()
            break
    err = p.stderr.read()
    if p.wait() != 0 or len(stamps) < 4:
        raise RuntimeError("%s failed: %s" % (name, err.strip()[:400]))
    gaps = [b - a for a, b in zip(stamps[2:], stamps[3:])]
    return statistics.median(gaps)


def torch_times():
    """PyTorch on the GPU: the same three cases, or None when unavailable."""
    try:
        import torch
        import torch.nn.functional as F
        import numpy as np
    except Exception:
        return None, "PyTorch not installed"
    if not torch.cuda.is_available():
        return None, "PyTorch sees no GPU"
    dev = torch.device("cuda")

    def timed(fn, reps=20):
        fn()
        fn()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    out = {}
    g = torch.Generator(device=dev).manual_seed(0)

    def init(n_in, n_out):
        w = torch.randn(n_in, n_out, generator=g, device=dev) * math.sqrt(2.0 / n_in)
        return [w.requires_grad_(), torch.zeros(n_out, device=dev, requires_grad=True)]
    params = init(784, 2048) + init(2048, 2048) + init(2048, 10)
    x = torch.randn(1024, 784, generator=g, device=dev)
    labels = torch.randint(0, 10, (1024,), generator=g, device=dev)

    def mlp():
        w1, b1, w2, b2, w3, b3 = params
        h = torch.relu(x @ w1 + b1)
        h = torch.relu(h @ w2 + b2)
        loss = F.cross_entropy(h @ w3 + b3, labels)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, gr in zip(params, grads):
                p.sub_(0.01 * gr)
        return loss.item()
    out["mlp"] = timed(mlp)

    sys.path.insert(0, os.path.join(ROOT, "benches"))
    import compare  # the CPU comparison's GMM data loading and index helper
    a, mu, icf, xx, gamma, m = compare.load_gmm("d20_K50")
    idx, mask = compare.lower_index(mu.shape[1])
    idx, mask = torch.from_numpy(idx).to(dev), torch.from_numpy(mask).to(dev)
    ta, tmu, ticf = (torch.tensor(v, device=dev, requires_grad=True) for v in (a, mu, icf))
    tx = torch.tensor(xx, device=dev)

    def gmm():
        k, d = tmu.shape
        n = tx.shape[0]
        lower = torch.where(mask, ticf[:, idx], torch.zeros((), dtype=ticf.dtype, device=dev))
        q = lower + torch.exp(ticf[:, :d])[:, :, None] * torch.eye(d, dtype=ticf.dtype, device=dev)
        sum_q = ticf[:, :d].sum(1)
        xc = tx[None, :, :] - tmu[:, None, :]
        qx = xc @ q.transpose(1, 2)
        main = (ta + sum_q)[:, None] - 0.5 * (qx * qx).sum(2)
        lse = torch.logsumexp(main, 0).sum()
        n2 = d + m + 1.0
        lmg = 0.25 * d * (d - 1) * math.log(math.pi) + sum(math.lgamma(0.5 * n2 - 0.5 * j) for j in range(d))
        c = n2 * d * (math.log(gamma) - 0.5 * math.log(2.0)) - lmg
        frob = (torch.exp(ticf[:, :d]) ** 2).sum() + (ticf[:, d:] ** 2).sum()
        prior = 0.5 * gamma * gamma * frob - m * sum_q.sum() - k * c
        v = -n * d * 0.5 * math.log(2 * math.pi) + lse - n * torch.logsumexp(ta, 0) + prior
        gr = torch.autograd.grad(v, (ta, tmu, ticf))
        return v.item(), gr
    out["gmm"] = timed(gmm)

    xs = torch.randn(1 << 24, generator=g, device=dev)

    def chain():
        with torch.no_grad():
            return torch.tanh(2.0 * xs + 1.0) * torch.sigmoid(xs) - xs / 3.0
    out["chain"] = timed(chain)
    return out, "PyTorch %s" % torch.__version__


MLP = """import nn

fn forward(p, x) {
    let h1 = relu(nn.dense(p.l1, x));
    let h2 = relu(nn.dense(p.l2, h1));
    nn.dense(p.l3, h2)
}

fn loss(p, x, labels) = cross_entropy(forward(p, x), labels)

fn train_step(p, x, labels) {
    let (l, g) = value_and_grad(loss)(p, x, labels);
    (tree_map(|w, dw| w - 0.01 * dw, p, g), l)
}

fn main() {
    let p0 = {
        l1: nn.dense_init(784, 2048, seed = 1),
        l2: nn.dense_init(2048, 2048, seed = 2),
        l3: nn.dense_init(2048, 10, seed = 3),
    };
    let x = randn([1024, 784], seed = 4);
    let labels = i64(floor(rand([1024], seed = 5) * 10.0));
    let mut p = p0;
    let mut l = 0.0;
    for i in 0..REPS {
        (p, l) = train_step(p, x, labels);
        print("tick", l);
    }
    print("value", l);
}
"""


def gmm_source(reps):
    with open(os.path.join(ROOT, "benches", "programs", "gmm.adj")) as fh:
        text = fh.read()
    text = text.replace('import "../../examples/gmm.adj"',
                        'import "%s"' % os.path.join(ROOT, "examples", "gmm.adj"))
    data = os.path.join(ROOT, "benches", "data", "gmm", "d20_K50")
    f = lambda n: 'load_npy("%s")' % os.path.join(data, n)
    return text + "\nfn main() {\n    let w = %s;\n    gradient_loop(%s, %s, %s, %s, w[0], w[1], %d);\n}\n" % (
        f("wishart.npy"), f("alpha.npy"), f("means.npy"), f("icf.npy"), f("x.npy"), reps)


def chain_source(reps):
    with open(os.path.join(ROOT, "benches", "programs", "map.adj")) as fh:
        return fh.read() + "\nfn main() = run(%d)\n" % reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    bin_ = os.path.abspath(args.bin)

    ok = parity(bin_)
    if os.environ.get("SKIP_BENCH") == "1":
        sys.exit(0 if ok else 1)

    rc, devs, _ = run(bin_, ["devices"])
    name = next((l.split(": ", 1)[1].split(",")[0] for l in devs.splitlines() if l.startswith("cuda:0:")), "?")
    env_bw, env_tf = os.environ.get("GPU_PEAK_GBS"), os.environ.get("GPU_PEAK_TFLOPS")
    peak = next((p for p in PEAKS if p[0] in name), None)
    bw = float(env_bw) if env_bw else (peak[1] if peak else None)
    f32 = float(env_tf) if env_tf else (peak[2] if peak else None)
    f64 = peak[3] if peak else None

    b, n_chain = 1024, 1 << 24
    mlp_flops = 6.0 * b * (784 * 2048 + 2048 * 2048 + 2048 * 10)
    k, d, n = 50, 20, 1000
    gmm_flops = 3 * 2.0 * k * n * d * d  # the dominant batched product, forward and backward
    cases = [
        ("MLP train step, batch 1024, 784-2048-2048-10, f32", "mlp",
         lambda dev: tick_times(bin_, MLP.replace("REPS", "30"), "mlp", dev), None, mlp_flops, f32),
        ("GMM gradient, d=20 K=50 n=1000, f64", "gmm",
         lambda dev: tick_times(bin_, gmm_source(30), "gmm", dev), None, gmm_flops, f64),
        ("16M-element f32 chain (benches/programs/map.adj)", "chain",
         lambda dev: tick_times(bin_, chain_source(30), "chain", dev), 2 * 4 * n_chain, None, None),
    ]
    torch_t, torch_what = torch_times()
    rows = []
    for what, key, fn, bytes_, flops, peak_tf in cases:
        try:
            gpu = fn(["--device", "cuda"])
        except Exception as e:  # a failed case is reported, the rest still run
            print("%s: %s" % (what, e), file=sys.stderr)
            ok, gpu = False, None
        try:
            cpu = fn([])
        except Exception as e:
            print("%s (CPU): %s" % (what, e), file=sys.stderr)
            cpu = None
        pt = torch_t.get(key) if torch_t else None
        frac = "—"
        if gpu and bytes_ and bw:
            frac = "%.0f%% of %.0f GB/s" % (100 * bytes_ / gpu / 1e9 / bw, bw)
        elif gpu and flops and peak_tf:
            frac = "%.1f%% of %.1f TFLOP/s" % (100 * flops / gpu / 1e12 / peak_tf, peak_tf)
        ms = lambda t: "%.3f ms" % (t * 1e3) if t else "—"
        rows.append((what, ms(gpu), ms(pt), ms(cpu), frac))

    print()
    print("GPU: %s; %s" % (name, torch_what))
    print()
    print("| case | Adjoint --device cuda | PyTorch (GPU) | Adjoint CPU | of peak |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| %s |" % " | ".join(r))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
