"""Confident comparisons (ollie.tune.decide) on scripted samples, and every sample of an
interleaved measurement kept aligned by round (ollie.tune.measure.measure_rounds) on a fake
clock: no wall-clock time is asserted."""

from __future__ import annotations

import math

import pytest

from ollie.testing.clock import FakeClock
from ollie.tune import decide
from ollie.tune.decide import MARGIN, busy, faster, relative_spread, upper_bound
from ollie.tune.measure import measure_alternating, measure_rounds

# a load factor per round, the same for both functions timed in it (what interleaving is
# for), with a relative median absolute deviation of 2%
LOAD = [1.00, 1.02, 0.98, 1.03, 0.97, 1.01, 0.99, 1.02, 0.98, 1.00, 1.04, 0.96, 1.02, 0.98,
        1.00]
# each sample's own jitter, independent between the two functions
JITTER_A = [0.004, -0.003, 0.002, -0.004, 0.001, 0.003, -0.002, 0.0, -0.001, 0.004, -0.003,
            0.002, -0.004, 0.001, 0.0]
JITTER_B = JITTER_A[5:] + JITTER_A[:5]


def _samples(scale: float, load: list[float], jitter: list[float]) -> list[float]:
    return [scale * f * (1 + j) for f, j in zip(load, jitter, strict=True)]


def test_five_percent_faster_with_two_percent_spread_wins():
    base = _samples(1.0, LOAD, JITTER_A)
    cand = _samples(0.95, LOAD, JITTER_B)
    assert relative_spread(base) == pytest.approx(0.02, abs=0.005)
    v = faster(cand, base)
    assert v.ratio == pytest.approx(0.95, abs=0.01)
    assert v.margin == pytest.approx(MARGIN, abs=0.002)
    assert v.ratio <= v.upper < 1 - v.margin and v.decided


def test_five_percent_faster_with_twenty_percent_spread_loses():
    wide = [1 + 10 * (f - 1) for f in LOAD]  # the same rounds, ten times the spread
    base = _samples(1.0, wide, JITTER_A)
    cand = _samples(0.95, wide, JITTER_B)
    assert relative_spread(base) == pytest.approx(0.20, abs=0.05)
    v = faster(cand, base)
    assert v.ratio == pytest.approx(0.95, abs=0.01)  # still 5% faster on the median...
    assert v.margin >= 0.25 and not v.decided        # ...but not with confidence


@pytest.mark.parametrize("scale, wins", [(0.90, True), (0.99, False)])
@pytest.mark.parametrize("round_", [0, 7, 14])
@pytest.mark.parametrize("slowed", ["cand", "base", "both"])
def test_one_load_spike_does_not_flip_the_verdict(scale, wins, round_, slowed):
    """A spike (another job takes the cores for one round: 3x there) slowing the candidate,
    the baseline or both in one round leaves the verdict as it was."""
    base = _samples(1.0, LOAD, JITTER_A)
    cand = _samples(scale, LOAD, JITTER_B)
    assert faster(cand, base).decided is wins
    if slowed in ("cand", "both"):
        cand[round_] *= 3
    if slowed in ("base", "both"):
        base[round_] *= 3
    assert faster(cand, base).decided is wins


def test_the_upper_bound_is_an_order_statistic_above_the_median():
    ratios = [0.1 * i for i in range(1, 16)]  # n = 15: ceil(7.5 + 0.64 * sqrt(15)) = 10
    assert upper_bound(ratios) == pytest.approx(1.0)
    assert upper_bound([0.5, 0.7]) == 0.7  # few ratios: the largest
    assert upper_bound([]) == math.inf


def test_without_paired_rounds_the_medians_are_compared_with_the_margin():
    """A cached median (one value) or a function not timed in rounds: the ratio of the
    medians must beat the margin."""
    assert faster([0.5], [1.0]).decided
    assert not faster([0.98], [1.0]).decided
    assert faster([0.5, 0.5, 0.5], [1.0]).decided  # lengths differ: medians
    # a stopped clock (every time 0) decides nothing
    assert not faster([0.0] * 5, [0.0] * 5).decided


def test_busy_reads_the_settings_load_and_the_spread(ollie_settings):
    quiet = [1.0, 1.01, 0.99, 1.0]
    ollie_settings(load=lambda: 0.0, busy_spread=None)  # the default spread limit
    assert not busy(quiet) and not busy()
    assert busy([1.0, 1.3, 0.8, 1.0, 1.25])  # 20% spread
    ollie_settings(load=lambda: decide.BUSY_LOAD * decide.cores() + 0.1)
    assert busy(quiet)


def test_busy_reads_the_load_of_other_processes_by_default(monkeypatch, ollie_settings):
    from ollie import machine_load
    from ollie.settings import Settings

    assert Settings().load is machine_load.others_load  # the default, the suite's is 0
    n = decide.cores()
    others = decide.BUSY_LOAD * n + 0.5  # cores kept busy by another process
    samples = iter([(0.0, 0.0, 0.0), (1.0, n, n), (2.0, n + others, n)])
    meter = machine_load.LoadMeter(lambda: next(samples))
    meter.prime()
    ollie_settings(load=meter)
    # this process kept every core busy for a second, nothing else ran: not busy
    assert not busy([1.0, 1.0, 1.0])
    # then another process kept more than BUSY_LOAD of them busy for a second: busy
    assert busy([1.0, 1.0, 1.0])


def test_the_load_meter_falls_back_to_the_load_average(monkeypatch):
    import os

    from ollie import machine_load

    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 0.0, 0.0), raising=False)
    assert machine_load.LoadMeter(lambda: None)() == 7.0  # no /proc/stat
    first = machine_load.LoadMeter(lambda: (5.0, 1.0, 1.0))
    assert first() == 7.0  # no sample old enough to span a window yet
    assert machine_load.cpu_sample("/nonexistent/stat") is None
    real = machine_load.cpu_sample()
    if real is not None:  # Linux: a parsed sample of this machine
        assert real[1] >= 0 and real[2] >= 0


@pytest.mark.timing
def test_measure_rounds_keeps_every_sample_aligned_by_round(ollie_settings):
    """Each round has one sample of every function; a hopeless one is timed once, after its
    warm-up, and dropped from the rounds; the medians are measure_alternating's."""
    clock = FakeClock()
    ollie_settings(measure_clock=clock)
    costs = {"a": 2.0 ** -10, "b": 2.0 ** -9, "slow": 2.0 ** -2}

    def fn(name):
        return clock.costing(costs[name])

    t = measure_rounds({n: fn(n) for n in costs}, rounds=4, warmup=1, hopeless=10.0)
    assert t.dropped == frozenset({"slow"}) and t.samples["slow"] == [costs["slow"]]
    assert len(t.samples["a"]) == len(t.samples["b"]) == 4
    assert t.samples["a"] == [2.0 ** -10] * 4 and t.median("b") == 2.0 ** -9
    assert measure_alternating({n: fn(n) for n in costs}, rounds=4, warmup=1,
                               hopeless=10.0) == t.medians()
