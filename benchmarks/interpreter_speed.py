"""Speed and peak memory of the reference interpreter on real layer sizes.

Times a 3x3 convolution (1.85 G multiply-adds) and a dilated G2BMM, fully and sampled at 1000
output positions, and prints seconds and peak traced memory (tracemalloc: numpy allocations)
plus the process's peak resident memory. Run: ``.venv/bin/python benchmarks/interpreter_speed.py``.
"""

from __future__ import annotations

import resource
import time
import tracemalloc

import numpy as np

from ollie import interpret, parse
from ollie.semantics import random_inputs, sample_positions

CASES = {
    "conv3x3": """
        A: [16, 256, 14, 14]
        K: [256, 256, 3, 3]
        L<n=0:16, f=0:256, h=0:14, w=0:14> Sum<c=0:256, r=0:3, s=0:3>
            A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s]
    """,
    "g2bmm": """
        Q: [8, 2000, 64]
        K: [8, 2000, 64]
        L<b=0:8, i=0:2000, j=0:201> Sum<k=0:64> Q[b, i, k] * K[b, i + 4*j - 400, k]
    """,
}


def _measure(fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, seconds, peak


def main() -> None:
    for name, text in CASES.items():
        expr = parse(text)
        inputs = random_inputs(expr)
        full, t_full, m_full = _measure(lambda e=expr, i=inputs: interpret(e, i))
        at = sample_positions(expr.shape, 1000, np.random.default_rng(0))
        part, t_part, m_part = _measure(lambda e=expr, i=inputs, p=at: interpret(e, i, at=p))
        err = float(np.abs(part - full[tuple(at.T)]).max())
        print(f"{name:8s} full    {t_full:6.2f} s  peak {m_full / 2**20:7.1f} MiB  "
              f"shape {list(full.shape)}")
        print(f"{name:8s} sampled {t_part:6.2f} s  peak {m_part / 2**20:7.1f} MiB  "
              f"1000 positions, max |sampled - full| = {err:.2e}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
