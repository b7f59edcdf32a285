"""Cold ``ollie.optimize`` of a small CNN (``ollie.testing.cnns``, w=16, 32x32, batch 1) from
an empty cache directory, for two source trees alternating (each run a fresh process with a
fresh private cache directory): wall time, CPU time of the process and of its compile
workers, the number of functions numba compiled into the cache (``.nbc`` files), and the
numba compilations (or cache loads) in the process with the seconds they took.

Usage: ``python benchmarks/cold_optimize.py SRC_A SRC_B [MODEL] [TIME_BUDGET] [PAIRS]``
(``SRC_*``: a ``src`` folder put first on ``PYTHONPATH``; default squeezenet, 2 s, 2 pairs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, os, resource, sys, time, pathlib
import torch
import ollie
from ollie.testing import cnns
import numba.core.dispatcher as nd
n = [0]; t = [0.0]
orig = nd.Dispatcher.compile
def c(self, sig):
    s = time.perf_counter(); r = orig(self, sig); t[0] += time.perf_counter() - s; n[0] += 1
    return r
nd.Dispatcher.compile = c
name, budget = sys.argv[1], float(sys.argv[2])
model = cnns.build(name, w=16, size=32)
x = torch.randn(1, 3, 32, 32)
w0 = time.perf_counter()
prog = ollie.optimize(model, (x,), device="cpu", time_budget=budget)
wall = time.perf_counter() - w0
ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
root = pathlib.Path(os.environ["OLLIE_CACHE_DIR"])
nbc = len(list(root.rglob("*.nbc")))
with torch.no_grad():
    ok = torch.allclose(prog(x), model(x), rtol=1e-3, atol=1e-3)
print("RESULT", json.dumps({"src": ollie.__file__, "wall_s": round(wall, 1),
      "cpu_self_s": round(ru.ru_utime + ru.ru_stime, 1),
      "cpu_workers_s": round(rc.ru_utime + rc.ru_stime, 1),
      "numba_compiles_main": n[0], "numba_compile_main_s": round(t[0], 1), "nbc_files": nbc,
      "matches_torch": bool(ok)}))
"""


def run(src: str, model: str, budget: float) -> dict:
    """One cold optimisation with ``src`` first on the path, in a fresh cache directory."""
    with tempfile.TemporaryDirectory(prefix="ollie-cold-") as cache:
        env = {**os.environ, "PYTHONPATH": src, "OLLIE_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", CHILD, model, str(budget)], env=env,
                             capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv: list[str]) -> None:
    a, b = argv[0], argv[1]
    model = argv[2] if len(argv) > 2 else "squeezenet"
    budget = float(argv[3]) if len(argv) > 3 else 2.0
    pairs = int(argv[4]) if len(argv) > 4 else 2
    print("| pair | tree | wall s | CPU process s | CPU workers s | numba functions | "
          "compiles in process (s) | correct |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i in range(pairs):
        for src in (a, b):
            r = run(src, model, budget)
            print(f"| {i + 1} | {src} | {r['wall_s']} | {r['cpu_self_s']} | "
                  f"{r['cpu_workers_s']} | {r['nbc_files']} | {r['numba_compiles_main']} "
                  f"({r['numba_compile_main_s']}) | {r['matches_torch']} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
