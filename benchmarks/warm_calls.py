"""Warm ``ollie.optimize`` calls of one model in one process, as a user re-running a script.

    python benchmarks/warm_calls.py SPEC CACHE_DIR [CALLS]

``SPEC``: a model of ``ollie bench models`` (``tv:resnet18``, ``hf:bert``, ...), batch 1;
``CACHE_DIR``: the cache directory (``OLLIE_CACHE_DIR``; optimise once into an empty one to
make it warm); ``CALLS``: how many calls (default 4). Prints each call's wall time, the
system and user CPU time and minor page faults it took (memory touched for the first time is
most of a warm call's system time on a virtual machine: docs/design/037-constants-in-place.md)
and the end of the last note (how the program was found). Run it in several processes,
alternating with another checkout's (``PYTHONPATH=<other>/src``) and its own cache, for a
side-by-side comparison (docs/design/036-module-key.md).
"""

from __future__ import annotations

import os
import resource
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    spec, cache = argv[0], argv[1]
    calls = int(argv[2]) if len(argv) == 3 else 4
    os.environ["OLLIE_CACHE_DIR"] = cache
    import ollie
    from ollie.bench.models import build

    module, inputs = build(spec, 1)
    for i in range(calls):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        prog = ollie.optimize(module, inputs)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        print(f"{spec} call {i + 1}: {wall:.2f} s (sys {r1.ru_stime - r0.ru_stime:.2f} s, "
              f"user {r1.ru_utime - r0.ru_utime:.2f} s, {r1.ru_minflt - r0.ru_minflt} "
              f"page faults); {prog.notes[-2][-70:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
