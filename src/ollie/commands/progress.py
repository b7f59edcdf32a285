"""Progress display for long CLI work: a tqdm bar on a terminal, nothing otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable


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
