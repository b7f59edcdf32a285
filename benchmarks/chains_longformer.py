"""Fused contraction chains on the plain-PyTorch Longformer (zoo ``longformer_plain``): the
model optimised with ``fuse_chains`` on and off (same cache folder, so every other decision is
shared), then eager PyTorch and both programs timed interleaved in one process
(``ollie.tune.measure.measure_alternating``), medians printed with the ratios. Also prints
each chain's decision (its note) and the kernels of the fused programs.

Run: ``PYTHONPATH=src python benchmarks/chains_longformer.py [--seq 512] [--width 32]
[--dilation 4] [--time-budget 10]``.
"""

from __future__ import annotations

import argparse
import time

import torch

import ollie
import ollie.zoo
from ollie.tune.measure import measure_alternating


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--dilation", type=int, default=4)
    ap.add_argument("--time-budget", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    m, (x,) = ollie.zoo.get("longformer_plain", seq=args.seq, width=args.width,
                            dilation=args.dilation)
    progs = {}
    for on in (True, False):
        t = time.perf_counter()
        progs[on] = ollie.optimize(m, (x,), time_budget=args.time_budget, fuse_chains=on)
        print(f"fuse_chains={on}: optimised in {time.perf_counter() - t:.1f} s")
        for note in progs[on].notes:
            if note.startswith(("chain ", "checked against", "kept the original")):
                print("  note:", note)
    kinds = sorted({str(k.kind) for k in progs[True].program.kernels})
    print("kernel kinds with chains fused:", ", ".join(kinds))
    with torch.inference_mode():
        fns = {"eager": lambda: m(x), "chains off": lambda: progs[False](x),
               "chains on": lambda: progs[True](x)}
        med = measure_alternating(fns, rounds=args.rounds, warmup=2, max_seconds=120)
    for name, s in med.items():
        print(f"{name:11} {s * 1e3:9.3f} ms")
    print(f"chains on vs off: {med['chains off'] / med['chains on']:.2f}x; "
          f"on vs eager: {med['eager'] / med['chains on']:.2f}x; "
          f"off vs eager: {med['eager'] / med['chains off']:.2f}x")


if __name__ == "__main__":
    main()
