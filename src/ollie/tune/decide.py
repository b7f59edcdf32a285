"""Whether one function is faster than another with confidence, from interleaved samples
(:func:`ollie.tune.measure.measure_rounds`), and whether a measurement was made on a machine
too busy to trust it (:func:`busy`).

:func:`faster` pairs the samples of one round, ``r_j = cand[j] / base[j]`` (a load that slows
one round slows both of its samples alike, so their ratio keeps), and bounds the median of
those ratios from above by an order statistic: with ``n`` ratios, the ``ceil(n/2 +
0.64 sqrt(n))``-th smallest is at least the median with about 90% confidence (the normal
approximation of the binomial count of ratios below the median). The candidate is faster
when that bound is below ``1 - margin``, where the margin is the larger of the caller's and
:data:`SPREAD_FACTOR` times the baseline's relative spread (its median absolute deviation over
its median): a baseline that varies by 20% from one sample to the next cannot show a 5% gain.
Why these constants: docs/design/022-confident-selection.md.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ollie.settings import current

MARGIN = 0.03
"""The least fraction of the baseline's time a candidate must save (before the spread widens
it, :func:`faster`)."""

SPREAD_FACTOR = 1.5
"""The margin is at least this many times the baseline's relative median absolute deviation
(about one standard deviation of normally distributed samples)."""

BOUND_Z = 0.64
"""Half the one-sided 90% normal quantile (1.2816 / 2): the order statistic
``ceil(n/2 + BOUND_Z sqrt(n))`` of ``n`` ratios bounds their median from above with about 90%
confidence."""

MIN_PAIRS = 3
"""Fewer paired samples than this (a cost-cache hit holds one median per function): the two
medians' ratio is compared with the margin instead."""

BUSY_LOAD = 0.5
"""A machine on which other processes keep more than this fraction of the cores busy (the
settings' ``load``, :func:`ollie.machine_load.others_load`) is busy (:func:`busy`)."""

BUSY_SPREAD = 0.10
"""A baseline whose relative median absolute deviation exceeds this was measured on a busy
machine (:func:`busy`)."""

RECHECK_ROUNDS = 7
"""Rounds of the second measurement of a choice made on a busy machine."""

RECHECK_SETTLE = 1.0
"""Seconds waited (the settings' ``sleep``) before that second measurement, so that a short
burst of other work can pass."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`faster`: ``ratio``, the median of the paired ratios (candidate
    over baseline); ``upper``, its one-sided 90% upper bound; ``margin``, the margin applied
    (the caller's, widened by the baseline's spread); ``decided``, whether the candidate is
    faster with confidence (``upper < 1 - margin``)."""

    ratio: float
    upper: float
    margin: float
    decided: bool


def relative_spread(samples: Sequence[float]) -> float:
    """The median absolute deviation of ``samples`` over their median (0.0 for fewer than two
    samples; infinity when the median is not positive)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    if not mid > 0:
        return math.inf
    return statistics.median(abs(s - mid) for s in samples) / mid


def upper_bound(ratios: Sequence[float]) -> float:
    """A one-sided 90% upper confidence bound of the median of ``ratios``: their
    ``ceil(n/2 + BOUND_Z sqrt(n))``-th smallest (the largest, for few of them)."""
    if not ratios:
        return math.inf
    n = len(ratios)
    k = min(n, math.ceil(n / 2 + BOUND_Z * math.sqrt(n)))
    return sorted(ratios)[k - 1]


def faster(cand: Sequence[float], base: Sequence[float], margin: float = MARGIN) -> Verdict:
    """Whether ``cand`` (seconds per sample, one per round) is faster than ``base`` (the same
    rounds) with confidence: the upper bound of the median paired ratio (:func:`upper_bound`)
    below ``1 - m``, with ``m = max(margin, SPREAD_FACTOR * relative_spread(base))``. With
    fewer than :data:`MIN_PAIRS` rounds in common (or lists of different lengths: a function
    not timed in rounds), the ratio of the medians stands for the bound. A baseline whose
    median is not positive (a stopped clock) decides nothing."""
    m = max(margin, SPREAD_FACTOR * relative_spread(base))
    if not cand or not base or not statistics.median(base) > 0:
        return Verdict(math.nan, math.inf, m, False)
    if len(cand) != len(base) or len(cand) < MIN_PAIRS:
        ratio = statistics.median(cand) / statistics.median(base)
        return Verdict(ratio, ratio, m, ratio < 1 - m)
    ratios = [c / b if b > 0 else math.inf for c, b in zip(cand, base, strict=True)]
    ratio, upper = statistics.median(ratios), upper_bound(ratios)
    return Verdict(ratio, upper, m, upper < 1 - m)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy(base: Sequence[float] = ()) -> bool:
    """Whether a measurement whose baseline took ``base`` seconds per sample was made on a busy
    machine: the settings' ``load`` (cores other processes keep busy) above
    :data:`BUSY_LOAD` per core, or the baseline's relative spread above the settings'
    ``busy_spread`` (:data:`BUSY_SPREAD` unless set)."""
    settings = current()
    limit = BUSY_SPREAD if settings.busy_spread is None else settings.busy_spread
    return settings.load() > BUSY_LOAD * cores() or relative_spread(base) > limit


__all__ = ["BOUND_Z", "BUSY_LOAD", "BUSY_SPREAD", "MARGIN", "MIN_PAIRS", "RECHECK_ROUNDS",
           "RECHECK_SETTLE", "SPREAD_FACTOR", "Verdict", "busy", "cores", "faster",
           "relative_spread", "upper_bound"]
