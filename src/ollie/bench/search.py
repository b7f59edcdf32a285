"""Search benchmark (the paper's search-time figures): states and seconds per max depth, with
and without fingerprint pruning and guided derivation, and the time to find each case's
program.

For every case and configuration the search runs to each max depth in turn (search only: no
candidate verification), recording states visited and pruned, the number of states a search
without pruning would visit (counted exactly from the derivation graph), the search seconds,
and when the case's target program was first found. A configuration that exhausts the time
budget at some depth is not run deeper. Results go to ``search.md``, ``search.json`` and
``search.png`` in the output folder.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import ollie
from ollie.bench.cases import CASES
from ollie.search import derive

CONFIGS = {
    "hybrid": {"guided": True, "fingerprint_pruning": True},
    "explorative": {"guided": False, "fingerprint_pruning": True},
    "hybrid, no pruning": {"guided": True, "fingerprint_pruning": False},
    "explorative, no pruning": {"guided": False, "fingerprint_pruning": False},
}
DEFAULT_CASES = ("conv3x3", "convtranspose", "conv5x5", "g2bmm")


@dataclass
class Row:
    case: str
    config: str
    depth: int
    visited: int
    pruned: int
    unpruned: int | None
    seconds: float
    exhausted: bool
    found_seconds: float | None
    found_depth: int | None


def run(cases=DEFAULT_CASES, depths=range(1, 9), budget: float = 30.0,
        configs=tuple(CONFIGS), log=print) -> list[Row]:
    rows: list[Row] = []
    for name in cases:
        case = CASES[name]
        expr = ollie.parse(case.text)
        for cfg in configs:
            for depth in depths:
                t0 = time.perf_counter()
                res = derive(expr, max_depth=depth, time_budget=budget, max_candidates=0,
                             target=case.target, **CONFIGS[cfg])
                s = res.stats
                hit = s["first_found"].get("target")
                exhausted = s["search_seconds"] >= 0.95 * budget * 0.8
                row = Row(name, cfg, depth, s["states_visited"], s["states_pruned"],
                          s["unpruned_states"], s["search_seconds"], exhausted,
                          hit["seconds"] if hit else None, hit["depth"] if hit else None)
                rows.append(row)
                log(f"{name:14} {cfg:24} depth {depth}: {row.visited:7} states, "
                    f"{row.pruned:7} pruned, {row.seconds:7.2f} s"
                    + (f", target at {row.found_seconds:.2f} s (depth {row.found_depth})"
                       if hit else ", target not found")
                    + (" [budget exhausted]" if exhausted else "")
                    + f"  ({time.perf_counter() - t0:.1f} s wall)")
                if exhausted:
                    break
    return rows


def summarize(rows: list[Row]) -> list[str]:
    """Markdown: the per-depth table, then pruning ratios and time-to-find reductions."""
    out = ["| case | configuration | depth | states visited | pruned | without pruning "
           "| search s | target found at |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        found = f"{r.found_seconds:.3f} s (depth {r.found_depth})" if r.found_seconds \
            is not None else "-"
        unpruned = "-" if r.unpruned is None else str(r.unpruned)
        secs = f"{r.seconds:.2f}" + (" (budget)" if r.exhausted else "")
        out.append(f"| {r.case} | {r.config} | {r.depth} | {r.visited} | {r.pruned} | "
                   f"{unpruned} | {secs} | {found} |")
    out += ["", "| case | pruning removes (deepest complete depth) | time to find: hybrid | "
            "explorative | reduction |", "|---|---|---:|---:|---:|"]
    for case in dict.fromkeys(r.case for r in rows):
        mine = [r for r in rows if r.case == case]
        pruned = [r for r in mine if r.config == "explorative" and r.unpruned and
                  not r.exhausted]
        ratio = "-"
        if pruned:
            best = max(pruned, key=lambda r: r.depth)
            ratio = f"{100 * (1 - best.visited / best.unpruned):.1f}% at depth {best.depth} " \
                    f"({best.visited} of {best.unpruned})"
        hyb = _first_find(mine, "hybrid")
        exp = _first_find(mine, "explorative")
        red = f"{100 * (1 - hyb / exp):.1f}%" if hyb is not None and exp else "-"
        out.append(f"| {case} | {ratio} | {_fmt(hyb)} | {_fmt(exp)} | {red} |")
    return out


def _first_find(rows: list[Row], cfg: str) -> float | None:
    hits = [r.found_seconds for r in rows if r.config == cfg and r.found_seconds is not None]
    return min(hits) if hits else None


def _fmt(x: float | None) -> str:
    return "not found" if x is None else f"{x:.3f} s"


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r.case for r in rows))
    fig, axes = plt.subplots(2, len(cases), figsize=(4 * len(cases), 7), squeeze=False)
    for j, case in enumerate(cases):
        for cfg in CONFIGS:
            sel = [r for r in rows if r.case == case and r.config == cfg]
            if not sel:
                continue
            d = [r.depth for r in sel]
            axes[0][j].plot(d, [max(r.seconds, 1e-3) for r in sel], marker="o", label=cfg)
            axes[1][j].plot(d, [r.visited for r in sel], marker="o", label=cfg)
        axes[0][j].set_title(case)
        axes[0][j].set_yscale("log")
        axes[1][j].set_yscale("log")
        axes[0][j].set_ylabel("search seconds")
        axes[1][j].set_ylabel("states visited")
        axes[1][j].set_xlabel("max depth")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(cases=DEFAULT_CASES, depths=range(1, 9), budget: float = 30.0,
         out: str | Path = "benchmarks/results", configs=tuple(CONFIGS)) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(cases, depths, budget, configs)
    cpu = platform.processor() or platform.machine()
    lines = [f"# Search benchmark ({time.strftime('%Y-%m-%d')}, {cpu}, {_cores()} cores, "
             f"budget {budget:.0f} s per run)", "", *summarize(rows)]
    stem = "search" if tuple(configs) == tuple(CONFIGS) else "search_" + "_".join(
        c.replace(", ", "-").replace(" ", "-") for c in configs)
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (out / f"{stem}.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    plot(rows, out / f"{stem}.png")
    print("\n".join(lines))
    print(f"\nwrote {out / stem}.md, .json, .png")
    return 0


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
