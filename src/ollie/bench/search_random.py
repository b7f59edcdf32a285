"""Search benchmark on random shapes (``ollie bench search --random-shapes N``): for every
family of :data:`ollie.bench.shapes.FAMILIES`, ``N`` shapes drawn at random (seeded), each
derived once to ``depth`` with ``budget`` seconds as ``ollie.optimize`` derives (the whole
budget, no stop at the target, :data:`REPORTED` candidates verified and reported). Reported
per family: how many searches found the family's target program, how many reported it among
their candidates (of the draws whose expression is compute-bound on the search's roofline,
:func:`ollie.search.derive.compute_bound`, and of all: for a memory-bound one an eOperator
program is a fair first choice), and the median and 95th percentile of the time to find it
(a search that did not find it counts its whole search time, so these are lower bounds when
some were not found). Results go to
``search_random.md`` and ``search_random.json`` in the output folder.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import ollie
from ollie.bench.shapes import FAMILIES, draw
from ollie.errors import ConfigError
from ollie.search import derive
from ollie.search.derive import compute_bound
from ollie.tune.roofline import DEFAULT_ROOFLINE

REPORTED = 8
"""Candidates reported per search (``OptimizeConfig.max_candidates``)."""


@dataclass
class ShapeRow:
    family: str
    sizes: dict
    found: bool
    reported: bool
    compute_bound: bool
    seconds: float  # to the target, or the whole search when not found
    wall: float


def run(n: int, families: Sequence[str] = tuple(FAMILIES), depth: int = 7,
        budget: float = 30.0, seed: int = 0, log: Callable[[str], object] = print
        ) -> list[ShapeRow]:
    """``n`` random shapes per family, each searched once (see the module doc)."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ConfigError(f"no random shapes for {', '.join(unknown)} "
                          f"(families: {', '.join(FAMILIES)})")
    rows: list[ShapeRow] = []
    for i, name in enumerate(families):
        family = FAMILIES[name]
        rng = np.random.default_rng([seed, i])
        for _ in range(n):
            sizes = draw(family, rng)
            expr = ollie.parse(family.text(sizes))
            t0 = time.perf_counter()
            res = derive(expr, max_depth=depth, time_budget=budget, target=family.target,
                         max_candidates=REPORTED)
            hit = res.stats["first_found"].get("target")
            row = ShapeRow(name, sizes, hit is not None,
                           any(family.target(c) for c in res.candidates),
                           compute_bound(expr, DEFAULT_ROOFLINE),
                           hit["seconds"] if hit else res.stats["search_seconds"],
                           time.perf_counter() - t0)
            rows.append(row)
            log(f"{name:18} {sizes}: " + (f"found in {row.seconds:.2f} s" if row.found else
                                          "not found") +
                (f", among the first {REPORTED}" if row.reported else "") +
                f" ({row.wall:.1f} s wall)")
    return rows


def summarize(rows: Sequence[ShapeRow]) -> list[str]:
    """Markdown: one line per family."""
    out = [f"| family | found | among the first {REPORTED}: compute-bound draws | all draws "
           "| median s to find | p95 s |", "|---|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r.family for r in rows):
        mine = [r for r in rows if r.family == name]
        bound = [r for r in mine if r.compute_bound]
        secs = np.array([r.seconds for r in mine])
        out.append(f"| {name} | {_share(sum(r.found for r in mine), len(mine))} | "
                   f"{_share(sum(r.reported for r in bound), len(bound))} | "
                   f"{_share(sum(r.reported for r in mine), len(mine))} | "
                   f"{np.median(secs):.2f} | {np.percentile(secs, 95):.2f} |")
    return out


def _share(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "0/0"


def main(n: int, families: Sequence[str] = tuple(FAMILIES), depth: int = 7,
         budget: float = 30.0, out: str | Path = "benchmarks/results", seed: int = 0) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = run(n, families, depth, budget, seed)
    cpu = platform.processor() or platform.machine()
    lines = [f"# Search on random shapes ({cpu}, {n} shapes per family, depth {depth}, "
             f"budget {budget:g} s, seed {seed}, {time.perf_counter() - t0:.0f} s in all)", "",
             *summarize(rows)]
    (out / "search_random.md").write_text("\n".join(lines) + "\n")
    (out / "search_random.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print("\n".join(lines))
    print(f"\nwrote {out / 'search_random'}.md, .json")
    return 0
