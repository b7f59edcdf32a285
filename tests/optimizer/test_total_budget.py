"""``OptimizeConfig.total_budget``: each distinct subprogram searches for its share of what is
left of a whole-model budget, and once it is spent the remaining subprograms keep their
original operators (or a cached decision) and say so in the report. Time is a fake clock
(``budget_clock``) that the test moves on by one second per subprogram from the progress
callback: what is searched and what is skipped is counted, never timed. The searches are
recorded and find nothing (what they find is not what a budget decides), and measurements
run on a ticking fake clock, so that each optimisation takes little real time."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import ollie
from ollie.errors import ConfigError
from ollie.optimizer import model as model_mod
from ollie.optimizer.budget import (
    AUTO,
    AUTO_BASE,
    AUTO_CAP,
    AUTO_PER_SUBPROGRAM,
    MIN_SHARE,
    TAIL_FRACTION,
    TIME_BUDGET,
    Budget,
    decision_key,
    default_total,
)
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.final import ORIGINAL
from ollie.optimizer.report import SubprogramReport, tally
from ollie.search import DeriveResult
from ollie.testing.clock import FakeClock

FAST = dict(max_depth=1, max_candidates=1, settle=0.0, choose_libraries=False,
            context=False)
QUICK = dict(measure_clock=FakeClock(2**-4), sleep=lambda seconds: None)
"""Settings: measurements on a ticking fake clock (one for every test: the roofline is
measured once per clock), no sleeps."""


def _model() -> tuple[nn.Module, torch.Tensor]:
    """Three distinct convolutions (three subprograms)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.ReLU(),
                      nn.Conv2d(4, 2, 3, padding=1)).eval()
    return m, torch.randn(1, 3, 6, 6)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, "soon"])
def test_a_total_budget_must_be_positive(bad):
    with pytest.raises(ConfigError, match="total_budget must be None, 'auto' or > 0 seconds"):
        OptimizeConfig(total_budget=bad)
    assert OptimizeConfig().total_budget == AUTO  # the default budget
    assert OptimizeConfig(total_budget=None).total_budget is None
    assert OptimizeConfig(total_budget=5.0).total_budget == 5.0


def test_the_default_budget_scales_with_the_distinct_subprograms():
    assert default_total(0) == AUTO_BASE
    assert default_total(12) == AUTO_BASE + 12 * AUTO_PER_SUBPROGRAM
    assert default_total(10_000) == AUTO_CAP
    budget = Budget(AUTO, 30.0, FakeClock())
    assert budget.auto and budget.total == default_total(0) and budget.bounded


def test_each_subprogram_gets_its_share_of_what_is_left():
    clock = FakeClock()
    unbounded = Budget(None, 30.0, clock)
    clock.advance(1e6)
    assert unbounded.share() == 30.0 and not unbounded.spent() and unbounded.left() == math.inf

    clock = FakeClock()
    budget = Budget(20.0, 30.0, clock)
    assert budget.reserve == 20.0 * TAIL_FRACTION == 5.0  # left to the end of the run
    budget.pending = {"a": "f1", "b": "f2", "c": "f2", "d": "f3"}  # 3 distinct expressions
    assert budget.share() == pytest.approx(15.0 / 3)
    budget.decided("b")  # and "c", the same expression
    assert budget.pending == {"a": "f1", "d": "f3"}
    clock.advance(4.0)
    budget.searched(3.0, 4.0)  # a second of selection beyond the share
    assert budget.share() == pytest.approx((16.0 - 5.0) / 2 - 1.0)
    clock.advance(10.0)  # 1 s left to the searches: no more than a selection takes
    assert not budget.spent() and budget.share() is None
    assert budget.out_of_time()  # no search would start: no sibling merge either
    assert budget.may_compare()  # whole-program comparisons may still run
    budget.skipped.append("d")  # left unsearched: no optional work either
    assert budget.out_of_time() and not budget.may_compare()
    clock.advance(1.0)  # the searches' part spent; the reserve is not: library code compiles
    assert budget.share() is None and not budget.spent() and budget.may_choose()
    clock.advance(5.0)
    assert budget.spent() and budget.share() is None and not budget.may_choose()
    assert Budget(100.0, 2.0, FakeClock()).share() == 2.0  # the per-subprogram cap
    few = Budget(4.0, 30.0, FakeClock())
    few.pending = {"a": "f1", "b": "f2", "c": "f3", "d": "f4"}
    assert few.share() == MIN_SHARE  # the floor
    few.searched(MIN_SHARE, 0.5)  # ended early: no overhead
    assert few.share() == MIN_SHARE


def test_a_shorter_search_is_cached_apart():
    cfg = OptimizeConfig(time_budget=30.0)
    full = decision_key(cfg, "fp", frozenset({"x0"}))
    assert full.endswith("|budget30|cands8|cl:x0")
    assert decision_key(cfg, "fp", frozenset({"x0"}), partial=True) == full + "|partial"


def test_another_guided_depth_is_another_search(monkeypatch, optimize_cli_kwargs):
    """``guided_depth`` reaches every search, names its decisions in the cache (the default
    adds nothing: keys made before it was a setting stay valid) and is a CLI flag."""
    assert "guided" not in decision_key(OptimizeConfig(), "fp", frozenset())
    short = decision_key(OptimizeConfig(guided_depth=2), "fp", frozenset())
    assert "|depth2|guided2|budget30|" in short
    depths: list[int] = []

    def derive(expr, **kw):
        depths.append(kw["config"].guided_depth)
        return DeriveResult([], {"candidates": 0}, expr)

    monkeypatch.setattr(model_mod, "derive", derive)
    m, x = _model()
    ollie.optimize(m, x, guided_depth=3, use_cache=False, context=False)
    assert depths and set(depths) == {3}
    assert optimize_cli_kwargs(["optimize", "zoo:srcnn", "--guided-depth", "1"])[
        "guided_depth"] == 1
    assert "guided_depth" not in optimize_cli_kwargs(["optimize", "zoo:srcnn"])


def _optimize(clock: FakeClock, step: float = 1.0, **kwargs
              ) -> tuple[ollie.OptimizedModel, list[float]]:
    """Optimise :func:`_model`, the clock moving on ``step`` seconds per subprogram; returns
    the program and the time budget each search got."""
    m, x = _model()
    shares: list[float] = []

    def derive(expr, **kw):
        shares.append(kw["time_budget"])
        return DeriveResult([], {"candidates": 0}, expr)

    real_select = model_mod.select

    def select(*args, **kw):
        measured.append(kw.get("max_seconds"))
        return real_select(*args, **kw)

    measured: list[float | None] = []
    mp = pytest.MonkeyPatch()
    mp.setattr(model_mod, "derive", derive)
    mp.setattr(model_mod, "select", select)
    try:
        prog = ollie.optimize(m, (x,), progress=lambda node, done, total: clock.advance(step),
                              **{**FAST, **kwargs})
    finally:
        mp.undo()
    with torch.no_grad():
        assert torch.allclose(prog(x), m(x), rtol=1e-4, atol=1e-5)
    # a selection measures for as long as its search had at most
    assert measured == ([max(s, MIN_SHARE) for s in shares] if kwargs.get("total_budget")
                        else [None] * len(shares))
    return prog, shares


def test_a_spent_budget_keeps_the_remaining_subprograms(ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(search_clock=clock, budget_clock=clock, cache_dir=tmp_path, **QUICK)
    # the searches' part: 3.5 s less the reserve 0.875 s; t=1: 1.625 s left for 3
    # subprograms (floor 1 s); t=2: 0.625 s left for 2 (floor); t=3: spent; t=4 (the end of
    # the searches): the whole budget spent
    prog, shares = _optimize(clock, time_budget=30.0, total_budget=3.5, choose_libraries=True)
    assert shares == [MIN_SHARE, MIN_SHARE]
    assert [r.refused for r in prog.report] == [None, None, TIME_BUDGET]
    assert prog.report[2].chosen == ORIGINAL and prog.report[2].nodes == ["conv2d_2"]
    assert "(not searched: time budget)" in prog.summary()
    assert "1 not searched (time budget: 1)" in prog.summary()
    assert any(n.startswith("total time budget 3.5 s") and "conv2d_2" in n
               for n in prog.notes)
    # nothing timed for the whole program once it ran out
    assert any("not compared in the whole program: the total time budget ran out" in n
               for n in prog.notes)
    prog.save(tmp_path / "saved")
    assert [r.refused for r in ollie.load(tmp_path / "saved").report] == \
        [None, None, TIME_BUDGET]
    # again, spent from the first subprogram on: the decisions made above cost nothing (no
    # search); the subprogram never searched is still kept as it is
    again, shares = _optimize(clock, 10.0, time_budget=30.0, total_budget=3.5)
    assert shares == []
    assert [r.refused for r in again.report] == [None, None, TIME_BUDGET]


def test_a_budget_that_lasts_shares_it_out(ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(search_clock=clock, budget_clock=clock, cache_dir=tmp_path, **QUICK)
    # the searches' part: 8 s less the reserve 2 s; t=1: 5 s for 3; t=2: 4 s for 2; t=3: 3 s
    # for the last (searches take no time on the clock: no overhead)
    prog, shares = _optimize(clock, time_budget=30.0, total_budget=8.0)
    assert shares == pytest.approx([5.0 / 3, 4.0 / 2, 3.0])
    assert all(r.refused is None for r in prog.report)


def test_without_a_total_budget_every_search_gets_the_per_subprogram_budget(ollie_settings,
                                                                            tmp_path):
    clock = FakeClock()
    ollie_settings(search_clock=clock, budget_clock=clock, cache_dir=tmp_path, **QUICK)
    prog, shares = _optimize(clock, 1000.0, time_budget=0.5, total_budget=None)
    assert shares == [0.5, 0.5, 0.5]
    assert not any(n.startswith("total time budget") for n in prog.notes)


def test_tally_counts_derived_original_and_refused():
    def entry(chosen: str, refused: str | None = None) -> SubprogramReport:
        return SubprogramReport("n", "Conv2d", "Conv2d", chosen, [], 1.0, 1.0, refused=refused)

    report = [entry("Matmul"), entry(ORIGINAL), entry(ORIGINAL), entry(ORIGINAL, TIME_BUDGET),
              entry(ORIGINAL, TIME_BUDGET), entry(ORIGINAL, "not lowered")]
    assert tally(report) == {"derived": 1, "original": 2, "refused": 3,
                             "reasons": {TIME_BUDGET: 2, "not lowered": 1}}
    assert tally([]) == {"derived": 0, "original": 0, "refused": 0, "reasons": {}}
