"""The machine's roofline: probed once per device key on the measurement clock, kept in the
cost cache and in the process, the fixed default when the clock does not advance."""

import pytest

from ollie.testing.clock import FakeClock, stopped_clock
from ollie.tune import roofline
from ollie.tune.cache import CostCache, device_key
from ollie.tune.roofline import DEFAULT_ROOFLINE, Roofline, roofline_for

TICK = 2 ** -10
PROBE_MATMUL = 64
PROBE_MBYTES = 1


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Small probes (the fake clock decides what they measure), nothing kept from before."""
    monkeypatch.setattr(roofline, "PROBE_MATMUL", PROBE_MATMUL)
    monkeypatch.setattr(roofline, "PROBE_MBYTES", PROBE_MBYTES)
    roofline.forget()
    yield
    roofline.forget()


def test_a_stopped_clock_gives_the_default_and_stores_nothing():
    cache = CostCache(":memory:")
    assert roofline_for("cpu", cache, clock=stopped_clock) is DEFAULT_ROOFLINE
    assert cache.get(f"roofline|{device_key('cpu')}|peak_flops") is None


def test_measured_once_then_read_back(monkeypatch):
    """Every probe sample takes one tick of the fake clock, so the rates follow from the probe
    sizes; the second process (a fresh memo) reads them from the cache without probing."""
    cache = CostCache(":memory:")
    clock = FakeClock(tick=TICK)
    roof = roofline_for("cpu", cache, clock=clock)
    assert roof == Roofline(peak_flops=2 * PROBE_MATMUL ** 3 / TICK,
                            bandwidth=2 * PROBE_MBYTES * (1 << 20) / TICK, launch_s=TICK)
    assert roof.ridge == pytest.approx(roof.peak_flops / roof.bandwidth)
    readings = clock.readings
    assert roofline_for("cpu", cache, clock=clock) is roof  # kept in the process
    assert clock.readings == readings

    roofline.forget()

    def no_probe(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr(roofline, "measure_roofline", no_probe)
    assert roofline_for("cpu", cache, clock=FakeClock(tick=TICK)) == roof


def test_a_malformed_stored_roofline_is_measured_again():
    cache = CostCache(":memory:")
    dev = device_key("cpu")
    for f in roofline.FIELDS:
        cache.put(f"roofline|{dev}|{f}", 0.0)  # a zero rate is not a roofline
    roof = roofline_for("cpu", cache, clock=FakeClock(tick=TICK))
    assert roof.launch_s == TICK and cache.get(f"roofline|{dev}|launch_s") == TICK


@pytest.mark.parametrize("bad", [dict(peak_flops=0.0), dict(bandwidth=float("nan")),
                                 dict(launch_s=-1.0)])
def test_roofline_rejects_impossible_rates(bad):
    fields = {"peak_flops": 1e9, "bandwidth": 1e9, "launch_s": 0.0, **bad}
    with pytest.raises(ValueError):
        Roofline(**fields)
