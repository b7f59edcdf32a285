"""Shared by the kernel benchmark scripts: two loaded generated kernel modules of one
expression timed against each other on the same inputs, alternately (7 turns, best of 5
repeats of about 2 ms each), and whether their outputs are bit-identical."""

from __future__ import annotations

import timeit
from math import prod
from types import ModuleType

import numpy as np

from ollie.ir import Expr


def time_pair(expr: Expr, first: tuple[str, ModuleType], second: tuple[str, ModuleType]
              ) -> tuple[dict[str, float], bool]:
    """Best seconds per call of each ``(name, module)`` (its ``run(*inputs, out)``) and
    whether both wrote the same bits."""
    rng = np.random.default_rng(0)
    decls = dict(expr.decls)
    flat = [rng.standard_normal(prod(decls[n]), dtype=np.float32) for n in first[1].INPUTS]
    a, b = np.empty(prod(expr.shape), np.float32), np.empty(prod(expr.shape), np.float32)
    first[1].run(*flat, a)
    second[1].run(*flat, b)
    same = bool(np.array_equal(a, b, equal_nan=True))
    fns = {name: (lambda m=m: m.run(*flat, a)) for name, m in (first, second)}
    calls = max(1, int(2e-3 / max(1e-7, timeit.timeit(fns[first[0]], number=3) / 3)))
    best = dict.fromkeys(fns, float("inf"))
    order = [first[0], second[0]]
    for k in range(7):
        for name in (order if k % 2 == 0 else order[::-1]):
            best[name] = min(best[name],
                             min(timeit.repeat(fns[name], number=calls, repeat=5)) / calls)
    return best, same
