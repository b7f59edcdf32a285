"""``ollie demo`` (``make demo``): optimise the InfoGAN generator (batch 1, CPU) from the zoo,
show what was derived for each subprogram, check the result against PyTorch and print the
measured end-to-end speedup (PyTorch eager and Ollie timed alternately in one process)."""

from __future__ import annotations

import sys
import time

import torch

from ollie.bench.baselines import cores
from ollie.tune.measure import SETTLE_SECONDS, SETTLED_LEAD_SECONDS, measure_alternating

DEMO_CANDIDATES = 4
"""Candidates measured per subprogram in the demo (``ollie.optimize``'s default: 8). Measuring
a candidate compiles its generated eOperators first (cold numba caches), most of a cold demo's
time (docs/design/011-compiling-kernels-ahead.md)."""


DEMO_SETTLE = 0.1
"""Seconds idle before the samples of a program whose ONNX Runtime session spins, in the
demo's program-level comparisons (``ollie.optimize``'s default: :data:`~ollie.tune.measure.
SETTLE_SECONDS`, 0.2): long enough for the session's threads to go idle after a run, and at
batch 1 nearly every sample of those comparisons settles, so the shorter settle shortens the
demo without worse choices. The demo's final speedup is measured with the default. Why this
value (measured): docs/design/002-measurement-protocol.md."""


def main(model: str = "infogan", batch: int = 1, budget: float = 15.0,
         candidates: int = DEMO_CANDIDATES) -> int:
    """Run the demo; returns a process exit status."""
    import ollie
    import ollie.zoo

    torch.set_num_threads(cores())
    module, inputs = ollie.zoo.get(model, batch=batch)
    print(f"Ollie demo: {ollie.zoo.MODELS[model].description}, batch {batch}, CPU "
          f"({cores()} threads)\n")

    def progress(node: str, done: int, total: int) -> None:
        if node:
            print(f"  [{done + 1}/{total}] deriving {node} ...", flush=True)

    t0 = time.perf_counter()
    opt = ollie.optimize(module, inputs, device="cpu", time_budget=budget,
                         max_candidates=candidates, progress=progress, settle=DEMO_SETTLE)
    print(f"\noptimised in {time.perf_counter() - t0:.1f} s\n")
    print(opt.summary())
    # the rewrite with the best speedup alone: kept, or found but not kept in the program
    found = [(r, r.chosen, r.optimized_ms, r.derivation, True) for r in opt.report
             if r.derivation] + \
        [(r, r.not_kept["program"], r.not_kept["ms"], r.not_kept["derivation"], False)
         for r in opt.report if r.not_kept and r.not_kept.get("derivation")]
    if found:
        r, program, ms, derivation, kept = max(found, key=lambda f: f[0].original_ms /
                                               max(f[2], 1e-9))
        print(f"\nderivation found for {r.node} ({r.op}):")
        for i, rule in enumerate(derivation, 1):
            print(f"  {i:2}. {rule}")
        print(f"  -> {program}: {ms:.3f} ms alone against {r.original_ms:.3f} ms for the "
              "original operator" + ("" if kept else "; not kept: in the whole program it "
                                     "was not measurably faster")
              + ("; not faster alone, kept: the whole program was faster with it"
                 if r.in_program else ""))
    with torch.no_grad():
        want = module(*inputs)
        got = opt(*inputs)
        err = float((got - want).abs().max() / want.abs().max())
        # timed as the model benchmark times it: each sample after the cores went idle (an
        # ONNX Runtime region whose threads spin is slowed right after eager's OpenMP threads:
        # docs/design/002-measurement-protocol.md), then 50 ms of untimed calls
        times = measure_alternating({"PyTorch eager": lambda: module(*inputs),
                                     "Ollie": lambda: opt(*inputs)}, rounds=15,
                                    min_sample=0.02, lead_calls=1, settle=SETTLE_SECONDS,
                                    lead_seconds=SETTLED_LEAD_SECONDS)
    eager, ours = times["PyTorch eager"], times["Ollie"]
    print(f"\noutput matches PyTorch: max relative error {err:.1e}")
    print(f"end to end: PyTorch eager {eager * 1e3:.3f} ms, Ollie {ours * 1e3:.3f} ms, "
          f"speedup {eager / ours:.2f}x")
    return 0 if err < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
