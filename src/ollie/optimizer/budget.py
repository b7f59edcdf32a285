"""The whole-model time budget of ``ollie.optimize`` (:attr:`OptimizeConfig.total_budget`)
and the decision-cache keys of subprograms.

A :class:`Budget` is started when the optimizer starts. Each distinct subprogram still to be
searched gets a share of what is left: ``min(time_budget, max(MIN_SHARE, left / n -
overhead))``, ``n`` the distinct subprograms still to search whose decision is not cached
(:meth:`Budget.plan` estimates them before the first search), ``overhead`` the mean time a
search's selection (compilation, verification, measurement) took beyond its share so far;
the selection's measurements last at most as long as that share (fewer rounds: a rewrite
must then be faster by more to be kept). Once the budget is spent, or what is left is less
than that overhead (a search would end past it), a subprogram not decided before (in this
optimisation, or in the decision cache) keeps its original operator without a search (its
report says ``"time budget"``).

The budget can be exceeded by one subprogram's search and selection (the first one's, whose
overhead is not known when it starts; it also pays one-off costs such as measuring the
machine's roofline), then by the end-to-end check, which always runs (the program's first
run also picks each convolution's implementation by measurement, once per configuration:
:func:`ollie.exec.conv.best_conv`); whole-program comparisons that are not cached are
skipped once it is spent or a subprogram went unsearched for it (:meth:`Budget.out_of_time`).

Without a total budget (None), every subprogram gets ``time_budget`` seconds, as before.
Time is read from :attr:`ollie.settings.Settings.search_clock` (tests inject a fake clock).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ollie.fingerprint import fingerprint
from ollie.optimizer.rename import canonical_names
from ollie.optimizer.select import layout_key
from ollie.tune.cache import CostCache, device_key

if TYPE_CHECKING:
    from ollie.graph import Graph, Node
    from ollie.optimizer.config import OptimizeConfig

MIN_SHARE = 1.0
"""Seconds of search a subprogram gets at least while the total budget lasts: less finds
little beyond the original operator."""

TIME_BUDGET = "time budget"
"""The reason a subprogram kept its original operator without a search once the total budget
was spent (:attr:`ollie.optimizer.report.SubprogramReport.refused`)."""


def decision_key(cfg: OptimizeConfig, expr_fingerprint: str, channels_last: frozenset[str],
                 partial: bool = False) -> str:
    """The decision-cache key of a subprogram searched under ``cfg``; ``partial``: for a
    decision searched with less than ``cfg.time_budget`` seconds (a share of the total
    budget), kept apart so that a search with the full budget is never replaced by it."""
    # "decision3": the key's version, bumped when what a decision holds changes
    # (history: docs/design/010-caches.md)
    return (f"decision3|{expr_fingerprint}|{device_key(cfg.device)}|depth{cfg.max_depth}|"
            f"budget{cfg.time_budget:g}|cands{cfg.max_candidates}"
            f"{layout_key(channels_last)}{'|partial' if partial else ''}")


class Budget:
    """The time left of a total budget (``total`` seconds, None: unbounded) and the share of
    it each subprogram's search gets (at most ``cap`` seconds), on ``clock``."""

    def __init__(self, total: float | None, cap: float, clock: Callable[[], float]) -> None:
        self.total = total
        self.cap = cap
        self.clock = clock
        self.start = clock()
        self.pending: dict[str, str] = {}
        """Node -> fingerprint of the compute nodes still to search (:meth:`plan`)."""
        self.searches = 0
        self.overhead_s = 0.0  # summed time of selection beyond the search shares
        self.skipped: list[str] = []
        """The nodes that kept their original operator because the budget ran out."""

    @property
    def bounded(self) -> bool:
        return self.total is not None

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds left (infinite when unbounded)."""
        return math.inf if self.total is None else self.total - self.elapsed()

    def spent(self) -> bool:
        return self.left() <= 0

    def out_of_time(self) -> bool:
        """Whether the budget is spent, or a subprogram was already left unsearched for it:
        what remains of it then goes to no optional work (sibling merging, whole-program
        comparisons not cached)."""
        return self.spent() or bool(self.skipped)

    def plan(self, graph: Graph, nodes: list[Node], cfg: OptimizeConfig,
             constants: Mapping[str, object], cache: CostCache | None) -> None:
        """Note which of ``nodes`` (compute operators) will be searched: those that lower to
        an expression whose decision is not in ``cache`` (looked up for the inputs measured
        channels-last as a convolution's output usually is, and not). An estimate: layouts
        are only known as the optimizer goes."""
        if not self.bounded:
            return
        for node in nodes:
            try:
                expr, names = canonical_names(graph.lower_node(node).expr)
            except Exception:  # not lowered: kept as it is, no search
                continue
            fp = fingerprint(expr)
            acts = frozenset(canon for orig, canon in names.items()
                             if orig not in constants and len(graph.shape(orig)) == 4)
            if cache is not None and any(
                    cache.get_decision(decision_key(cfg, fp, cl, partial)) is not None
                    for cl in {frozenset(), acts} for partial in (False, True)):
                continue
            self.pending[node.name] = fp

    def share(self) -> float | None:
        """Seconds of search for the next subprogram searched; None when the budget is spent
        or what is left is less than the mean time selection took beyond the searches so
        far."""
        if not self.bounded:
            return self.cap
        left = self.left()
        overhead = self.overhead_s / self.searches if self.searches else 0.0
        if left <= 0 or (self.searches and overhead >= left):
            return None
        n = max(1, len(set(self.pending.values())))
        return min(self.cap, max(MIN_SHARE, left / n - overhead))

    def searched(self, share: float, seconds: float) -> None:
        """A search given ``share`` seconds took ``seconds`` with its selection."""
        self.searches += 1
        self.overhead_s += max(0.0, seconds - share)

    def decided(self, node: str) -> None:
        """``node`` is decided (searched, reused, cached or kept): its expression need not be
        searched again."""
        fp = self.pending.pop(node, None)
        if fp is not None:
            for other in [n for n, f in self.pending.items() if f == fp]:
                del self.pending[other]

    def describe(self) -> str:
        """A note on the budget's use (empty when unbounded)."""
        if self.total is None:
            return ""
        text = f"total time budget {self.total:g} s: {self.elapsed():.1f} s used"
        if self.skipped:
            text += (f"; {len(self.skipped)} subprogram(s) kept their original operator "
                     f"without a search ({', '.join(self.skipped[:5])}"
                     f"{', ...' if len(self.skipped) > 5 else ''})")
        return text


__all__ = ["MIN_SHARE", "TIME_BUDGET", "Budget", "decision_key"]
