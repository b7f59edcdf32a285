"""``ollie demo`` (``make demo``): the main job on a built-in model.

For now it lowers each operator of the InfoGAN generator (MODELS.md, batch 1) to its tensor
algebra expression, evaluates the expression with the reference interpreter and checks it
against PyTorch, printing the expression text, the error and the time taken.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from ollie.ir import format_expr
from ollie.lower import lower
from ollie.semantics import interpret

# (in channels, out channels, kernel, stride, padding, input spatial size)
INFOGAN_LAYERS = [
    (228, 448, 2, 1, 0, 1),
    (448, 256, 4, 2, 1, 2),
    (256, 128, 4, 2, 1, 4),
    (128, 64, 4, 2, 1, 8),
    (64, 3, 4, 2, 1, 16),
]


def main(batch: int = 1, seed: int = 0) -> int:
    """Lower and check every InfoGAN generator layer; return a process exit status."""
    torch.manual_seed(seed)
    print(f"InfoGAN generator, batch {batch}: lowering each ConvTranspose2d to an expression\n")
    worst = 0.0
    for i, (cin, cout, k, s, p, size) in enumerate(INFOGAN_LAYERS):
        x = torch.randn(batch, cin, size, size)
        w = torch.randn(cin, cout, k, k) / (cin * k * k) ** 0.5
        low = lower("ConvTranspose2d", [("X", tuple(x.shape)), ("W", tuple(w.shape))],
                    stride=s, padding=p)
        t0 = time.perf_counter()
        got = interpret(low.expr, {"X": x.numpy(), "W": w.numpy()})
        seconds = time.perf_counter() - t0
        ref = F.conv_transpose2d(x, w, stride=s, padding=p).numpy()
        err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
        worst = max(worst, err)
        print(f"layer {i + 1}: ConvTranspose2d {cin}->{cout} k{k} s{s} p{p}, "
              f"input {list(x.shape)} -> output {list(got.shape)}")
        print("  " + format_expr(low.expr).rstrip().replace("\n", "\n  "))
        print(f"  interpreter {seconds * 1e3:.1f} ms, max relative error vs PyTorch {err:.2e}\n")
    ok = worst < 1e-5
    print(("all layers agree with PyTorch" if ok else "MISMATCH against PyTorch") +
          f" (worst relative error {worst:.2e})")
    return 0 if ok else 1
