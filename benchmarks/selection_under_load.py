"""Selection under load: optimise one convolution with and without a CPU hog, then time the
optimised program against PyTorch eager in a fresh, quiet process.

Cases: a GCN-style 1x7 convolution (``ollie.bench.cases`` ``conv1x7``: ``[1, 128, 17, 17]``,
128 filters, padding ``(0, 3)``) and a 5x5 convolution (SRCNN-like, ``[1, 64, 56, 56]``, 32
filters, padding 2). Each case is optimised in its own process (no decision or cost cache: a
fresh cache folder), once on the machine as it is and once while ``tools/cpu_hog.py`` keeps
every core busy; the program is saved. Then a fresh process without the hog loads it and
times it against the module run by PyTorch (``torch.inference_mode``), interleaved
(``measure_alternating``, 15 rounds), and prints ``eager / optimised`` (above 1: faster than
eager). On a machine shared with other work the "quiet" figures are approximate.

Run: ``PYTHONPATH=src python benchmarks/selection_under_load.py [--time-budget S]
[--cases conv1x7,conv5x5]`` (about 5 minutes on a 2-core VM).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "conv1x7": ((1, 128, 17, 17), dict(in_channels=128, out_channels=128, kernel_size=(1, 7),
                                        padding=(0, 3))),
    "conv5x5": ((1, 64, 56, 56), dict(in_channels=64, out_channels=32, kernel_size=5,
                                       padding=2)),
}


def _module(case: str):
    import torch
    from torch import nn

    shape, kw = CASES[case]
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(**kw)).eval(), torch.randn(*shape)


def optimise(case: str, out: str, budget: float) -> None:
    """Child: optimise ``case`` and save the program in ``out``; print what was chosen."""
    import ollie

    m, x = _module(case)
    t0 = time.perf_counter()
    opt = ollie.optimize(m, (x,), "cpu", time_budget=budget, max_depth=2, max_candidates=4)
    opt.save(out)
    r = opt.report[0]
    libs = sorted({str(k.params.library) for k in opt.program.kernels if k.params.library})
    print(json.dumps({"chosen": r.chosen, "original_ms": r.original_ms,
                      "optimized_ms": r.optimized_ms, "eager_ms": r.eager_ms,
                      "libraries": libs, "load": os.getloadavg()[0],
                      "notes": [n for n in opt.notes if "load" in n],
                      "seconds": time.perf_counter() - t0}))


def time_against_eager(case: str, saved: str) -> None:
    """Child: time the saved program against eager; print both medians."""
    import torch

    import ollie
    from ollie.tune.measure import measure_alternating

    m, x = _module(case)
    opt = ollie.load(saved)
    with torch.inference_mode():
        torch.testing.assert_close(opt(x), m(x), rtol=1e-3, atol=1e-4)
    t = measure_alternating({"eager": lambda: m(x), "ollie": lambda: opt(x)}, rounds=15,
                            min_sample=0.02, lead_calls=1)
    print(json.dumps({"eager_ms": t["eager"] * 1e3, "ollie_ms": t["ollie"] * 1e3,
                      "load": os.getloadavg()[0]}))


def _child(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-budget", type=float, default=5.0)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        if a.child[0] == "optimise":
            optimise(a.child[1], a.child[2], float(a.child[3]))
        else:
            time_against_eager(a.child[1], a.child[2])
        return
    print(f"loadavg at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus")
    for case in a.cases.split(","):
        for hog in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                env_cache = os.environ.get("OLLIE_CACHE_DIR")
                os.environ["OLLIE_CACHE_DIR"] = str(Path(tmp) / "cache")
                (Path(tmp) / "cache").mkdir(mode=0o700)
                proc = None
                if hog:
                    proc = subprocess.Popen([sys.executable, str(ROOT / "tools/cpu_hog.py")],
                                            stdout=subprocess.PIPE, text=True)
                    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
                try:
                    made = _child("--child", "optimise", case, str(Path(tmp) / "prog"),
                                  str(a.time_budget))
                finally:
                    if proc is not None:
                        proc.terminate()
                        proc.wait()
                timed = _child("--child", "time", case, str(Path(tmp) / "prog"))
                if env_cache is None:
                    os.environ.pop("OLLIE_CACHE_DIR")
                else:
                    os.environ["OLLIE_CACHE_DIR"] = env_cache
            ratio = timed["eager_ms"] / timed["ollie_ms"]
            eager = f"{made['eager_ms']:.3f}" if made["eager_ms"] is not None else "-"
            print(f"{case} {'hog ' if hog else 'idle'}: chosen {made['chosen']!r} "
                  f"{made['libraries'] or ''} (alone: original {made['original_ms']:.3f} ms, "
                  f"eager {eager} ms, chosen {made['optimized_ms']:.3f} ms; load "
                  f"{made['load']:.1f}; {made['seconds']:.0f} s) {made['notes'] or ''}\n"
                  f"    fresh process: ollie {timed['ollie_ms']:.3f} ms vs eager "
                  f"{timed['eager_ms']:.3f} ms -> {ratio:.2f}x of eager (load "
                  f"{timed['load']:.1f})", flush=True)


if __name__ == "__main__":
    main()
