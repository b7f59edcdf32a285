"""A warm ``ollie.optimize`` in a new process: what a user re-running a script waits for.

:func:`measure` starts ``python -m ollie.bench.warm_process JSON`` (the model, batch, device,
budgets and threads as one JSON object) with the calling process's cache directory
(``OLLIE_CACHE_DIR``) and environment.
The child builds the model as :func:`ollie.bench.models.build` does (seeded, so the same
weights), optimises it once with those settings and prints one JSON line: the seconds the
call took (imports and the model's construction excluded) and the end of the program's last
note, which says how the stored program was found. The benchmark's other warm figure, a
second call in the same process, reuses that process's imports, compiled kernels and touched
memory; this one does not (docs/design/037-constants-in-place.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ollie.settings import CACHE_DIR_ENV, current

TIMEOUT_S = 600.0
"""The longest a child may run (a miss optimises the model again, cold)."""


def measure(spec: str, batch: int, device: str, budget: float,
            total_budget: float | str | None, threads: int) -> tuple[float | None, str]:
    """Seconds of a warm ``ollie.optimize`` of ``spec`` at ``batch`` in a new process, and
    how its program was found; (None, why) when the child failed or ran out of time."""
    env = dict(os.environ)
    env[CACHE_DIR_ENV] = str(current().cache_root)
    args = {"spec": spec, "batch": batch, "device": device, "budget": budget,
            "total_budget": total_budget, "threads": threads}
    cmd = [sys.executable, "-m", "ollie.bench.warm_process", json.dumps(args)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no result within {TIMEOUT_S:.0f} s"
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"failed (exit {done.returncode}): {tail[:200]}"
    out = json.loads(lines[-1])
    return float(out["seconds"]), str(out["found"])


def main(argv: list[str]) -> int:
    """The child: ``JSON`` (see :func:`measure`); prints one JSON line."""
    args = json.loads(argv[0])
    device = args["device"]
    import torch

    import ollie
    from ollie.bench.models import build

    torch.set_num_threads(args["threads"])
    module, inputs = build(args["spec"], args["batch"])
    module = module.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    t0 = time.perf_counter()
    prog = ollie.optimize(module, inputs, device, time_budget=args["budget"],
                          total_budget=args["total_budget"])
    seconds = time.perf_counter() - t0
    found = next((n for n in reversed(prog.notes) if "from the cache" in n),
                 "no stored program found: optimised again")
    print(json.dumps({"seconds": seconds, "found": found[-90:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
