"""Training the digits MLP of examples/digits_mlp.adj from Python.

The model and its loss are Adjoint code (`loss` in examples/digits_mlp.adj:
64 inputs -> 512 relu units with dropout -> 10 logits, cross-entropy);
Adjoint compiles the loss and its gradient. Everything around it is
ordinary Python: NumPy loads the data and holds the parameters, the Adam
update is NumPy, and matplotlib plots the loss curve.

    pip install ./python            # once, from the repository root
    python python/examples/train_digits.py [--epochs 30] [--plot digits_loss_python.png]

Without matplotlib the plot is skipped with a message.
"""

# %% Setup
import argparse
import time
from pathlib import Path

import numpy as np

import adjoint

REPO = Path(__file__).resolve().parents[2]

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.003)
parser.add_argument("--plot", default="digits_loss_python.png",
                    help="where to draw the loss curve (PNG); '' for no plot")
parser.add_argument("--mode", default="graph", choices=["graph", "eager"])
args = parser.parse_args()

# %% Data: 8x8 images with pixel counts 0..16, and their digits. The first
# 1437 images train, the last 360 (other writers) test, as in the .adj file.
images = np.load(REPO / "examples/data/digits_images.npy").astype(np.float32) / 16.0
labels = np.load(REPO / "examples/data/digits_labels.npy").astype(np.int64)
train_x, train_y = images[:1437], labels[:1437]
test_x, test_y = images[1437:], labels[1437:]

# %% The model: `loss(p, x, y, seed)` of examples/digits_mlp.adj. Its
# gradient with respect to the parameter record `p` (a dict here) is
# compiled by Adjoint; `value_and_grad` gives the loss with it.
m = adjoint.load(REPO / "examples/digits_mlp.adj", mode=args.mode)
loss_and_grad = adjoint.value_and_grad(m.loss)

# Parameters as nn.mlp_init makes them: He-initialised hidden layer,
# Glorot-initialised output layer, zero biases. A dict is a record: the
# gradient comes back as a dict of the same shape.
rng = np.random.default_rng(1)


def dense(n_in, n_out, std):
    w = (rng.standard_normal((n_in, n_out)) * std).astype(np.float32)
    return {"w": w, "b": np.zeros(n_out, dtype=np.float32)}


params = {
    "hidden": dense(64, 512, np.sqrt(2.0 / 64)),
    "out": dense(512, 10, np.sqrt(2.0 / (512 + 10))),
}


# %% Adam, in NumPy, over the nested dicts.
def tree_map(f, *trees):
    if isinstance(trees[0], dict):
        return {k: tree_map(f, *(t[k] for t in trees)) for k in trees[0]}
    return f(*trees)


state = {"t": 0, "m": tree_map(np.zeros_like, params), "v": tree_map(np.zeros_like, params)}


def adam(params, grads, state, lr, b1=0.9, b2=0.999, eps=1e-8):
    t = state["t"] + 1
    m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1, c2 = 1 - b1**t, 1 - b2**t
    step = lambda p, m, v: (p - lr * (m / c1) / (np.sqrt(v / c2) + eps)).astype(p.dtype)
    return tree_map(step, params, m, v), {"t": t, "m": m, "v": v}


def accuracy(params, x, y):
    h = np.maximum(x @ params["hidden"]["w"] + params["hidden"]["b"], 0)
    logits = h @ params["out"]["w"] + params["out"]["b"]
    return float(np.mean(np.argmax(logits, axis=1) == y))


# %% Training: minibatches reshuffled every epoch.
steps = len(train_x) // args.batch
curve = []
start = time.perf_counter()
for epoch in range(args.epochs):
    order = np.random.default_rng(1000 + epoch).permutation(len(train_x))
    total = 0.0
    for s in range(steps):
        idx = order[s * args.batch:(s + 1) * args.batch]
        # The dropout seed is an int argument, and int arguments are part
        # of the signature Adjoint compiles for (a program may build shapes
        # from them): a new mask each epoch compiles once per epoch, not
        # once per step.
        loss, grads = loss_and_grad(params, train_x[idx], train_y[idx], epoch)
        params, state = adam(params, grads, state, lr=args.lr)
        total += float(loss)
    curve.append(total / steps)
    if (epoch + 1) % 5 == 0 or epoch == 0:
        print(f"epoch {epoch + 1:3d}  loss {curve[-1]:.4f}")
elapsed = time.perf_counter() - start

print(f"trained {args.epochs} epochs ({args.epochs * steps} steps) in {elapsed:.2f} s")
print(f"train accuracy: {accuracy(params, train_x, train_y):.4f}")
print(f"test accuracy:  {accuracy(params, test_x, test_y):.4f}")

# %% The loss curve.
if args.plot:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
    else:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(np.arange(1, len(curve) + 1), curve, marker="o", markersize=3)
        ax.set_xlabel("epoch")
        ax.set_ylabel("mean training loss")
        ax.set_title("digits MLP trained from Python with Adjoint")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"loss curve written to {args.plot}")
