"""A warm ``ollie.optimize`` in a new process, this checkout against another revision, side
by side: each round runs one process of each (``python -m ollie.bench.warm_process``, the
figure of the models benchmark's "new process s" column: imports and the model's
construction not counted), alternating, on one warm cache.

Usage: ``python benchmarks/warm_alternating.py REV SPEC CACHE_DIR [ROUNDS]`` (default 5).
``SPEC``: a model of ``ollie bench models`` at batch 1 (``tv:vit_b_16``, ``hf:bert``, ...);
``CACHE_DIR``: a cache the model was optimised into with the default settings (both
revisions must find the same entry: a change of the module key or of the stored program's
format makes one of them miss, which the output says). ``REV`` is checked out into a
temporary git worktree and this checkout's ``src`` copied beside it (so that both are read
from one disk); one untimed process of each runs first. Prints every process's seconds, the
medians and the median of the rounds' ratios (this machine's noise moves whole rounds; a
round's two processes see it alike).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(src: Path, spec: str, cache: str) -> tuple[float, str]:
    """Seconds of one warm call in a new process importing Ollie from ``src``, and how its
    program was found."""
    from ollie.optimizer.config import OptimizeConfig

    default = OptimizeConfig()  # the settings the cache was filled with
    args = {"spec": spec, "batch": 1, "device": "cpu", "budget": default.time_budget,
            "total_budget": default.total_budget, "threads": os.cpu_count() or 1}
    env = {**os.environ, "PYTHONPATH": str(src), "OLLIE_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-m", "ollie.bench.warm_process", json.dumps(args)],
                          env=env, capture_output=True, text=True, check=True)
    out = json.loads([ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1])
    return float(out["seconds"]), str(out["found"])


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__)
        return 2
    rev, spec, cache = argv[:3]
    rounds = int(argv[3]) if len(argv) == 4 else 5
    with tempfile.TemporaryDirectory(prefix="ollie-rev-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other),
                        rev], check=True, capture_output=True)
        this = Path(tmp) / "this" / "src"  # both imported from the same disk, alike
        shutil.copytree(ROOT / "src", this, ignore=shutil.ignore_patterns("__pycache__"))
        trees = ((rev, other / "src"), ("this checkout", this))
        try:
            for _, src in trees:  # untimed: compiles both trees' bytecode and numba caches
                run(src, spec, cache)
            times: dict[str, list[float]] = {rev: [], "this checkout": []}
            for r in range(rounds):
                for name, src in trees:
                    seconds, found = run(src, spec, cache)
                    times[name].append(seconds)
                    print(f"round {r + 1} {name}: {seconds:.2f} s ({found})", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(other)], check=False, capture_output=True)
    for name, ts in times.items():
        print(f"{spec} {name}: median {statistics.median(ts):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in ts)})")
    ratios = [a / b for a, b in zip(times["this checkout"], times[rev], strict=True)]
    print(f"{spec} this checkout / {rev}, per round: median {statistics.median(ratios):.3f}, "
          f"faster in {sum(r < 1 for r in ratios)} of {len(ratios)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
