"""The whole-model time budget of ``ollie.optimize`` (:attr:`OptimizeConfig.total_budget`)
and the decision-cache keys of subprograms.

A :class:`Budget` is started when ``ollie.optimize`` is called (it covers importing the model
too). By default (:data:`AUTO`) its total is :func:`default_total`, scaled with the number of
distinct subprograms and capped; None: unbounded. Every phase of an optimisation runs inside
it and is timed (:meth:`Budget.phase`; the report's note lists them): importing, the
searches, the selections (compiling, verifying and measuring candidates), sibling merges and
chain fusion, post-processing and compiling the whole program, the end-to-end check with its
library comparison, and the program context step.

The searches share what is left of the total less a reserve for the end of the optimisation
(:data:`TAIL_FRACTION`: the end-to-end check, the library comparison, the context step).
Each distinct subprogram still to be searched gets ``min(time_budget, max(MIN_SHARE,
(left - reserve) / n - overhead))``, ``n`` the distinct subprograms still to search whose
decision is not cached (:meth:`Budget.plan`), ``overhead`` the mean time a search's selection
took beyond its share so far; the selection's measurements last at most as long as that
share, and it compiles and measures only the few plausible candidates
(:mod:`ollie.optimizer.plausible`); a sibling merge, a fused chain or a linear region gets one
such share for all its searches, builds as few candidates, and measures them for as long
(:class:`ollie.optimizer.plausible.Allowance`). Once the searches' part is spent, or what is
left of it is less than that overhead, a subprogram not decided before (in this
optimisation, or in the decision cache) keeps its original operator without a search (its
report says ``"time budget"``).

Every later phase checks the budget and falls back to the best program so far: sibling
merges, chain fusion and linear regions are not tried once no search would start
(:meth:`Budget.out_of_time`; the budget's note names them, :meth:`Budget.may_try`),
whole-program comparisons that are not cached are skipped once a subprogram went unsearched or
the budget is spent (:meth:`Budget.may_compare`), the program context step's comparisons end
when it is spent (a switch not confirmed by then is not made; :mod:`ollie.optimizer.context`),
and once the budget is spent no choice
among implementations is measured any more (:attr:`ollie.settings.Settings.new_choices`,
:meth:`Budget.may_choose`): an operator whose library was not chosen before runs the
framework's implementation, built alone (no Winograd transforms compiled, no probes); a
subprogram left unsearched runs PyTorch's implementation, pinned in the program. So the
budget is exceeded by at most (:meth:`Budget.overshoot_bound`): the work in flight when it
ran out (one subprogram's search and selection, whose measurement is bounded by its share, or
one library choice) and the end-to-end check, which always runs (a returned program is always
checked) but measures no new choice except the bounded comparison with ONNX Runtime regions
(:func:`ollie.optimizer.quick.quick_regions`).

Time is read from :attr:`ollie.settings.Settings.budget_clock` (tests inject a fake clock; the
test suite stops it for every other test).
Why these constants: docs/design/029-cold-budget.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, Protocol

from ollie.fingerprint import fingerprint
from ollie.optimizer.rename import canonical_names
from ollie.optimizer.select import layout_key
from ollie.search.config import GUIDED_DEPTH
from ollie.tune.cache import CostCache, device_key

if TYPE_CHECKING:
    from ollie.graph import Graph, Node
    from ollie.optimizer.config import OptimizeConfig

MIN_SHARE = 1.0
"""Seconds of search a subprogram gets at least while the total budget lasts: less finds
little beyond the original operator."""

AUTO: Literal["auto"] = "auto"
"""The default :attr:`OptimizeConfig.total_budget`: :func:`default_total` seconds."""

AUTO_BASE = 30.0
"""Seconds of a default total budget before its subprograms are counted: importing the model,
checking the program, and the one-off costs the first selection pays (the roofline probe,
compiling library code), which a small model's searches must not be left without."""

AUTO_PER_SUBPROGRAM = 1.25
"""Seconds a default total budget adds per distinct subprogram (distinct compute expression)."""

AUTO_CAP = 120.0
"""The largest default total budget, in seconds."""

TAIL_FRACTION = 0.25
"""The part of a total budget the searches leave to the end of the optimisation (the
end-to-end check, its library comparison and the program context step)."""

TIME_BUDGET = "time budget"
"""The reason a subprogram kept its original operator without a search once the total budget
was spent (:attr:`ollie.optimizer.report.SubprogramReport.refused`)."""


def default_total(distinct: int) -> float:
    """The default total budget (:data:`AUTO`) of a model with ``distinct`` distinct
    subprograms: :data:`AUTO_BASE` plus :data:`AUTO_PER_SUBPROGRAM` each, at most
    :data:`AUTO_CAP` seconds."""
    return min(AUTO_CAP, AUTO_BASE + AUTO_PER_SUBPROGRAM * max(0, distinct))


class SearchSettings(Protocol):
    """The settings naming a subprogram's search (:class:`ollie.optimizer.config.
    OptimizeConfig` has them)."""

    @property
    def max_depth(self) -> int: ...
    @property
    def guided_depth(self) -> int: ...
    @property
    def time_budget(self) -> float: ...
    @property
    def max_candidates(self) -> int: ...


def search_key(cfg: SearchSettings) -> str:
    """The part of a cached decision's key naming the search that made it:
    ``depth<d>|budget<s>|cands<n>``, with ``|guided<g>`` after the depth when the guided
    depth is not the default (:data:`ollie.search.config.GUIDED_DEPTH`; keys made before it
    was a setting stay valid)."""
    guided = "" if cfg.guided_depth == GUIDED_DEPTH else f"|guided{cfg.guided_depth}"
    return f"depth{cfg.max_depth}{guided}|budget{cfg.time_budget:g}|cands{cfg.max_candidates}"


def decision_key(cfg: OptimizeConfig, expr_fingerprint: str, channels_last: frozenset[str],
                 partial: bool = False) -> str:
    """The decision-cache key of a subprogram searched under ``cfg``; ``partial``: for a
    decision searched with less than ``cfg.time_budget`` seconds (a share of the total
    budget), kept apart so that a search with the full budget is never replaced by it."""
    # "decision3": the key's version, bumped when what a decision holds changes
    # (history: docs/design/010-caches.md)
    return (f"decision3|{expr_fingerprint}|{device_key(cfg.device)}|{search_key(cfg)}"
            f"{layout_key(channels_last)}{'|partial' if partial else ''}")


class Budget:
    """The time left of a total budget (``total`` seconds; None: unbounded; :data:`AUTO`:
    :func:`default_total`, fixed by :meth:`plan`) and the share of it each subprogram's
    search gets (at most ``cap`` seconds), on ``clock``, from ``start`` (default: now)."""

    def __init__(self, total: float | Literal["auto"] | None, cap: float,
                 clock: Callable[[], float], start: float | None = None) -> None:
        self.auto = total == AUTO
        self.total: float | None = default_total(0) if total == AUTO else \
            None if total is None else float(total)
        self.cap = cap
        self.clock = clock
        self.start = clock() if start is None else start
        self.pending: dict[str, str] = {}
        """Node -> fingerprint of the compute nodes still to search (:meth:`plan`)."""
        self.searches = 0
        self.overhead_s = 0.0  # summed time of selection beyond the search shares
        self.skipped: list[str] = []
        """The nodes that kept their original operator because the budget ran out."""
        self.untried: list[str] = []
        """The subprograms of several nodes (sibling merges, fused chains, linear regions, by
        label) not tried because the budget ran out (:meth:`may_try`)."""
        self.phases: dict[str, float] = {}
        """Seconds spent per phase (:meth:`phase`), in the order they first ran."""

    @property
    def bounded(self) -> bool:
        return self.total is not None

    @property
    def reserve(self) -> float:
        """Seconds the searches leave to the end of the optimisation (:data:`TAIL_FRACTION`)."""
        return 0.0 if self.total is None else TAIL_FRACTION * self.total

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds left (infinite when unbounded)."""
        return math.inf if self.total is None else self.total - self.elapsed()

    def search_left(self) -> float:
        """Seconds left to the searches and their selections: :meth:`left` less
        :attr:`reserve`."""
        return self.left() - self.reserve

    def spent(self) -> bool:
        return self.left() <= 0

    def out_of_time(self) -> bool:
        """Whether no search would start now (:meth:`share`), or a subprogram was already
        left unsearched for the budget: what remains of it then goes to no optional work of
        the search phase (sibling merging, chain fusion)."""
        return self.share() is None or bool(self.skipped)

    def may_try(self, label: str) -> bool:
        """Whether the subprogram of several nodes ``label`` (a sibling merge, a fused chain, a
        linear region) may be decided now: not :meth:`out_of_time`. When not, it is recorded
        (:attr:`untried`, :meth:`describe`)."""
        if self.out_of_time():
            self.not_tried(label)
            return False
        return True

    def not_tried(self, label: str) -> None:
        """Record that the subprogram of several nodes ``label`` was not tried for the budget
        (:attr:`untried`, reported by :meth:`describe`)."""
        self.untried.append(label)

    def may_compare(self) -> bool:
        """Whether the whole-program comparisons not cached (library variants, the context
        step) may run: the budget is not spent and no subprogram was left unsearched for it
        (they time the whole program many times and compile what a variant needs, without a
        deadline of their own)."""
        return not (self.spent() or self.skipped)

    def may_choose(self) -> bool:
        """Whether a choice among implementations not made before may still be measured (the
        budget is not spent): :attr:`ollie.settings.Settings.new_choices` while optimising."""
        return not self.spent()

    @contextmanager
    def phase(self, name: str, timed: bool = True) -> Iterator[None]:
        """Time the block as phase ``name`` (:attr:`phases`; a phase run again adds up);
        ``timed`` off: the block runs, untimed (it does no work of the phase)."""
        if not timed:
            yield
            return
        t0 = self.clock()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + self.clock() - t0

    def plan(self, graph: Graph, nodes: list[Node], cfg: OptimizeConfig,
             constants: Mapping[str, object], cache: CostCache | None) -> None:
        """Note which of ``nodes`` (compute operators) will be searched: those that lower to
        an expression whose decision is not in ``cache`` (looked up for the inputs measured
        channels-last as a convolution's output usually is, and not). An estimate: layouts
        are only known as the optimizer goes. A default total (:data:`AUTO`) is fixed here:
        :func:`default_total` of the number of distinct expressions of ``nodes``. A
        subprogram left unsearched by a budget of the same total before (:meth:`share_for`)
        is not searched either."""
        if not self.bounded:
            return
        lowered: list[tuple[str, str, frozenset[str]]] = []
        for node in nodes:
            try:
                expr, names = canonical_names(graph.lower_node(node).expr)
            except Exception:  # not lowered: kept as it is, no search
                continue
            lowered.append((node.name, fingerprint(expr), frozenset(
                canon for orig, canon in names.items()
                if orig not in constants and len(graph.shape(orig)) == 4)))
        if self.auto:
            self.total = default_total(len({fp for _, fp, _ in lowered}))
        for name, fp, acts in lowered:
            if cache is not None and any(
                    cache.get_decision(key) is not None for cl in {frozenset(), acts}
                    for key in (*self.keys(cfg, fp, cl), self.skip_key(cfg, fp, cl))):
                continue
            self.pending[name] = fp

    def keys(self, cfg: OptimizeConfig, fp: str, channels_last: frozenset[str]) -> list[str]:
        """The decision keys a subprogram's decision is looked up by (:func:`decision_key`;
        under a total budget, the partial one too)."""
        return [decision_key(cfg, fp, channels_last, partial)
                for partial in ((False, True) if self.bounded else (False,))]

    def skip_key(self, cfg: OptimizeConfig, fp: str, channels_last: frozenset[str]) -> str:
        """The key recording that a budget of this total left the subprogram unsearched."""
        return f"{decision_key(cfg, fp, channels_last, True)}|skipped{self.total or 0:g}"

    def share_for(self, cache: CostCache | None, cfg: OptimizeConfig, fp: str,
                  channels_last: frozenset[str]) -> float | None:
        """:meth:`share` for a subprogram not decided before; None, without a search, also
        when a budget of the same total left it unsearched before (recorded in ``cache``
        whenever that happens): optimising the same model again with the same budget makes
        the same program, warm, and a larger budget searches it."""
        key = self.skip_key(cfg, fp, channels_last)
        if not self.bounded or cache is None:
            return self.share()
        if cache.get_decision(key) is not None:
            return None
        share = self.share()
        if share is None:
            cache.put_decision(key, "{}")
        return share

    def share(self) -> float | None:
        """Seconds of search for the next subprogram searched; None when the budget is spent
        or what is left is less than the mean time selection took beyond the searches so
        far."""
        if not self.bounded:
            return self.cap
        left = self.search_left()
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

    def overshoot_bound(self, selection_s: float, check_s: float, compile_s: float) -> float:
        """The most seconds an optimisation may run past its total budget, given the longest
        a selection's compiling and verifying take (``selection_s``; its search and its
        measurement last at most its share each, so a search started with ``L`` seconds of
        the searches' part left ends at most ``max(cap, 2 min(cap, MIN_SHARE)) + selection_s
        - L`` after it), the end-to-end check (``check_s``: with the whole-program
        comparisons started before the budget was spent and the quick regions comparison; no
        new library choice measured) and one library choice, its builds and probes, in flight
        when the budget was spent (``compile_s``). No search starts once the searches' part
        (all but :attr:`reserve`) is spent: only the search in flight then, the check and
        that choice reach past the budget."""
        if self.total is None:
            return math.inf
        search = max(self.cap, 2 * min(self.cap, MIN_SHARE)) + selection_s
        return max(0.0, search - self.reserve) + check_s + compile_s

    def describe(self) -> str:
        """A note on the budget's use and the time of each phase (empty when unbounded)."""
        if self.total is None:
            return ""
        text = (f"total time budget {self.total:g} s{' (default)' if self.auto else ''}: "
                f"{self.elapsed():.1f} s used")
        if self.phases:
            text += " (" + ", ".join(f"{n} {s:.1f} s" for n, s in self.phases.items()) + ")"
        if self.skipped:
            text += (f"; {len(self.skipped)} subprogram(s) kept their original operator "
                     f"without a search ({', '.join(self.skipped[:5])}"
                     f"{', ...' if len(self.skipped) > 5 else ''})")
        if self.untried:
            text += (f"; {len(self.untried)} merge(s), chain(s) or region(s) not tried "
                     f"({'; '.join(self.untried[:3])}{'; ...' if len(self.untried) > 3 else ''})")
        return text


__all__ = ["AUTO", "AUTO_BASE", "AUTO_CAP", "AUTO_PER_SUBPROGRAM", "MIN_SHARE", "TAIL_FRACTION",
           "TIME_BUDGET", "Budget", "decision_key", "default_total"]
