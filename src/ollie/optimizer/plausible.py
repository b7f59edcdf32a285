"""The candidates of a subprogram worth compiling, verifying and measuring under a total time
budget: the few plausible ones, chosen by their roofline estimate before anything is built.

The search reports its candidates in :func:`ollie.search.derive.rank` order (the cheapest of
each library signature first, by the machine's roofline, :mod:`ollie.tune.roofline`). Under
a total budget (:mod:`ollie.optimizer.budget`) only the first :data:`PLAUSIBLE` of them are
built, and of those only the ones whose estimate is not :data:`FAR_BEHIND` the original
operator's measured time: a roofline estimate is a lower bound of a program's time (peak
rates, no cache misses), so a candidate estimated well above what the original measures
cannot win and its compile would be wasted. Why these numbers:
docs/design/029-cold-budget.md.

Subprograms of several nodes (sibling merges, fused chains, linear regions) get an
:class:`Allowance`: their share of the total budget as search time, the first
:data:`PLAUSIBLE` candidates of each search, and measurements bounded by that share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict, TypeVar

from ollie.optimizer.budget import MIN_SHARE
from ollie.search.candidate import Candidate
from ollie.tune.measure import measure

T = TypeVar("T")

PLAUSIBLE = 3
"""Candidates built and measured per subprogram under a total budget (8 without one,
:attr:`ollie.optimizer.config.OptimizeConfig.max_candidates`)."""

FAR_BEHIND = 2.0
"""A candidate whose roofline estimate exceeds this many times the original operator's
measured time is not built (its estimate is a lower bound; 2 leaves room for a roofline
probed on a busy machine)."""


def original_seconds(run: Callable[[], object], device: str = "cpu") -> float:
    """A quick median of the original operator ``run`` (a zero-argument callable): three
    calls after one warm-up (which also makes its library choice)."""
    return measure(run, device, warmup=1, repeats=3, max_seconds=1.0)


def plausible(candidates: Sequence[Candidate], original_s: float, limit: int = PLAUSIBLE,
              far: float = FAR_BEHIND) -> list[Candidate]:
    """The first ``limit`` of ``candidates`` (in their rank order) whose estimated seconds
    (:attr:`Candidate.cost`; unknown: kept) are at most ``far`` times ``original_s``, the
    original operator's measured time (not a positive, finite time, as on a stopped clock:
    no candidate dropped for it)."""
    keep: list[Candidate] = []
    for cand in candidates:
        if len(keep) >= limit:
            break
        if 0 < original_s < math.inf and math.isfinite(cand.cost) and \
                cand.cost > far * original_s:
            continue
        keep.append(cand)
    return keep


class Measuring(TypedDict, total=False):
    """Keyword arguments bounding a selection's measurements."""

    max_seconds: float


@dataclass(frozen=True)
class Allowance:
    """What deciding one subprogram of several nodes may spend: ``seconds`` of search (its
    share of a total budget, or the configured per-subprogram budget ``configured``) and,
    under a total budget (``bounded``), only the first :data:`PLAUSIBLE` candidates of each
    search, measured for at most ``max(seconds, MIN_SHARE)`` seconds."""

    seconds: float
    configured: float
    bounded: bool = False

    def first(self, candidates: Sequence[T], cap: int) -> list[T]:
        """The candidates to build, in their rank order: the first ``cap`` (at least one),
        and no more than :data:`PLAUSIBLE` under a total budget."""
        n = max(cap, 1)
        return list(candidates[:min(n, PLAUSIBLE) if self.bounded else n])

    def measuring(self) -> Measuring:
        """The keyword arguments bounding a selection's measurements
        (:func:`ollie.optimizer.select.select_program`)."""
        return Measuring(max_seconds=max(self.seconds, MIN_SHARE)) if self.bounded else \
            Measuring()

    def keys(self, full: str) -> tuple[str, tuple[str, ...]]:
        """For a decision whose cache key is ``full`` when searched for the configured
        budget: the key this one is stored under (``full|partial`` when searched for less,
        kept apart so that it never replaces a full search) and the keys it is looked up
        by, in order (a bounded run reuses either)."""
        partial = f"{full}|partial"
        store = partial if self.seconds < self.configured else full
        return store, (full, partial) if self.bounded or store == partial else (full,)


__all__ = ["FAR_BEHIND", "PLAUSIBLE", "Allowance", "Measuring", "original_seconds",
           "plausible"]
