"""Progress display for long CLI work (a derivation, a model's optimisation): a tqdm bar on a
terminal, nothing otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def search_progress(label: str, budget: float) -> tuple[Callable[[dict], None], Callable[[], None]]:
    """A callback showing search statistics against the time budget, and a closer."""
    if not sys.stderr.isatty():
        return (lambda stats: None), (lambda: None)
    from tqdm import tqdm

    bar = tqdm(total=round(budget, 1), desc=label, unit="s", leave=False,
               bar_format="{desc}: {bar} {n:.1f}/{total:.0f}s {postfix}")

    def update(stats: dict) -> None:
        bar.n = min(float(stats.get("seconds", 0.0)), bar.total)
        bar.set_postfix_str(f"states {stats['states_visited']} pruned {stats['states_pruned']} "
                            f"found {stats.get('candidates_found', 0)}", refresh=False)
        bar.refresh()

    return update, bar.close


def eta_seconds(elapsed: float, done: int, total: int, budget: float | None) -> float | None:
    """Seconds the optimisation of a model likely still takes, ``done`` of ``total``
    subprograms decided after ``elapsed`` seconds: at the rate so far, and at most what is
    left of the total ``budget`` (None: no limit); None when nothing is known yet (no budget,
    nothing done)."""
    rate = elapsed / done * (total - done) if done else None
    if budget is None:
        return rate
    left = max(0.0, budget - elapsed)
    return left if rate is None else min(left, rate)


def _clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(round(seconds), 60)
    return f"{m}:{s:02d}"


def optimize_progress(label: str, budget: float | None,
                      clock: Callable[[], float] = time.monotonic, file: TextIO | None = None
                      ) -> tuple[Callable[[str, int, int], None], Callable[[], None]]:
    """The progress callback of ``ollie.optimize`` (``progress(node, done, total)``) drawing
    a bar on a terminal: subprogram ``done`` of ``total``, the node being decided, the time
    elapsed and an ETA (:func:`eta_seconds`; ``budget``: the total time budget, None: none);
    and a closer. Nothing is drawn when ``file`` (default stderr) is not a terminal."""
    out = file if file is not None else sys.stderr
    if not out.isatty():
        return (lambda node, done, total: None), (lambda: None)
    from tqdm import tqdm

    start = clock()
    bars: list[tqdm] = []  # made at the first call, when the number of subprograms is known

    def update(node: str, done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(desc=label, total=total, leave=False, file=out,
                             bar_format="{desc} |{bar:20}| {n}/{total} subprograms{postfix}"))
        bar = bars[0]
        elapsed = clock() - start
        bar.total, bar.n = total, done
        eta = eta_seconds(elapsed, done, total, budget)
        bar.set_postfix_str(f"{_clock_text(elapsed)} elapsed, ETA {_clock_text(eta)}"
                            + (f" | {node}" if node else ""), refresh=False)
        bar.refresh()

    def close() -> None:
        for bar in bars:
            bar.close()

    return update, close
