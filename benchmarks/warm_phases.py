"""Where one warm ``ollie.optimize`` call of a new process goes, phase by phase.

    python benchmarks/warm_phases.py SPEC CACHE_DIR

``SPEC``: a model of ``ollie bench models`` (``hf:bert``, ``tv:vit_b_16``, ...), batch 1;
``CACHE_DIR``: a warm cache (``OLLIE_CACHE_DIR``; optimise once into it). Prints the call's
wall time and the seconds spent in each phase of the recall path
(:mod:`ollie.optimizer.recall`): the module key, reading the program, the module run for the
check's reference, building the program, the program on the random and on the example
inputs, and the matrix products' first choice (:func:`ollie.exec.linear.chosen_product`,
part of the program's first run).
Run it in several processes, alternating with another checkout's (``PYTHONPATH=<other>/src``)
on its own copy of the cache: an entry records one module key, and two versions whose keys
differ would take turns missing it.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    os.environ["OLLIE_CACHE_DIR"] = argv[1]
    import ollie
    from ollie.bench.models import build
    from ollie.exec import executor, linear
    from ollie.optimizer import recall

    spent: dict[str, float] = {}

    def timed(label: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
        return run

    for owner, name, label in ((recall, "module_key", "module key"),
                               (recall, "recall", "program read"),
                               (recall, "module_reference", "module reference"),
                               (recall, "agrees", "program on random inputs"),
                               (recall, "confirm", "program on example inputs"),
                               (linear, "chosen_product", "products' first choice")):
        if not hasattr(owner, name):  # an older checkout: its products chose by best_product
            name = "best_product"
        setattr(owner, name, timed(label, getattr(owner, name)))
    executor.CompiledProgram.__init__ = timed("program built",
                                              executor.CompiledProgram.__init__)
    module, inputs = build(argv[0], 1)
    t0 = time.perf_counter()
    prog = ollie.optimize(module, inputs)
    wall = time.perf_counter() - t0
    print(f"{argv[0]}: {wall:.2f} s; " + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items()))
    print(prog.notes[-2][-100:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
