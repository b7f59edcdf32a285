"""The whole-model budget covers every phase (issue 45): the default budget, the phases timed,
the searches leaving a reserve to the end, no new library code compiled once the budget is
spent, the overshoot bounded, and only the plausible candidates built. Time is a fake clock
(``budget_clock``) that each stubbed phase moves on by what it "costs": what runs is counted,
never timed."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

import ollie
from ollie.exec.conv import TORCH
from ollie.libs import onednn
from ollie.optimizer import model as model_mod
from ollie.optimizer.budget import AUTO, TIME_BUDGET, Budget, default_total
from ollie.optimizer.plausible import FAR_BEHIND, PLAUSIBLE, plausible
from ollie.program.params import KernelKind
from ollie.program.program import Program
from ollie.search import DeriveResult
from ollie.search.candidate import Candidate
from ollie.settings import current
from ollie.testing.clock import FakeClock

FAST = dict(max_depth=1, max_candidates=1, settle=0.0, choose_libraries=False,
            context=False)
QUICK = dict(measure_clock=FakeClock(2**-4), sleep=lambda seconds: None)
"""Settings: measurements on a ticking fake clock, no sleeps."""


def _model() -> tuple[nn.Module, torch.Tensor]:
    """Three distinct convolutions (three subprograms)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.ReLU(),
                      nn.Conv2d(4, 2, 3, padding=1)).eval()
    return m, torch.randn(1, 3, 6, 6)


def _originals() -> tuple[Program, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`_model`'s operators as they are (a program), its input and the graph's outputs
    on it."""
    from ollie.graph import run_graph
    from ollie.optimizer.final import all_nodes
    from ollie.optimizer.importing import to_graph

    m, x = _model()
    graph = to_graph(m, (x,))
    feeds = {graph.input_names[0]: x}
    return all_nodes(graph), feeds, run_graph(graph, feeds)


def _run(clock: FakeClock, select_s: float, check_s: float, **kwargs
         ) -> tuple[ollie.OptimizedModel, list[tuple[float, float]], list[bool]]:
    """Optimise :func:`_model` with each search taking its whole share on ``clock``, each
    selection ``select_s`` seconds and the end-to-end check ``check_s``; returns the program,
    (start, share) of each search, and whether library code could be compiled during the
    check."""
    m, x = _model()
    searches: list[tuple[float, float]] = []
    compiles: list[bool] = []

    def derive(expr, **kw):
        searches.append((clock.now, kw["time_budget"]))
        clock.advance(kw["time_budget"])
        return DeriveResult([], {"candidates": 0}, expr)

    real_select, real_checked = model_mod.select, model_mod.checked

    def select(*args, **kw):
        clock.advance(select_s)
        return real_select(*args, **kw)

    def checked(*args, **kw):
        clock.advance(check_s)  # then asked, as the check's last convolution would
        compiles.append(current().new_choices())
        return real_checked(*args, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(model_mod, "derive", derive)
    mp.setattr(model_mod, "select", select)
    mp.setattr(model_mod, "checked", checked)
    try:
        prog = ollie.optimize(m, (x,), **{**FAST, **kwargs})
    finally:
        mp.undo()
    with torch.no_grad():
        assert torch.allclose(prog(x), m(x), rtol=1e-4, atol=1e-5)
    return prog, searches, compiles


def _budget_note(prog: ollie.OptimizedModel) -> str:
    return next(n for n in prog.notes if n.startswith("total time budget"))


def test_the_default_budget_is_scaled_with_the_model_and_every_phase_is_timed(
        ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(search_clock=clock, budget_clock=clock, cache_dir=tmp_path, **QUICK)
    prog, searches, compiles = _run(clock, select_s=0.5, check_s=0.25, time_budget=2.0)
    total = default_total(3)  # three distinct subprograms
    assert len(searches) == 3 and all(share == 2.0 for _, share in searches)
    note = _budget_note(prog)
    assert note.startswith(f"total time budget {total:g} s (default): 7.8 s used")
    # each phase with the seconds it took on the clock, in the order they first ran
    assert note.endswith("(import 0.0 s, search 6.0 s, selection 1.5 s, program 0.0 s, "
                         "check 0.2 s)")
    assert compiles == [True]


def test_the_budget_is_overshot_by_at_most_the_work_in_flight_and_the_check(
        ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(search_clock=clock, budget_clock=clock, cache_dir=tmp_path, **QUICK)
    total, cap, select_s, check_s = 6.0, 2.0, 4.0, 1.0
    prog, searches, compiles = _run(clock, select_s, check_s, time_budget=cap,
                                    total_budget=total)
    budget = Budget(total, cap, FakeClock())
    # searches start only while the searches' part (all but the reserve) lasts
    assert searches == [(0.0, (total - budget.reserve) / 3)]
    assert all(start < total - budget.reserve for start, _ in searches)
    assert [r.refused for r in prog.report] == [None, TIME_BUDGET, TIME_BUDGET]
    # those left unsearched run PyTorch's convolution: no library choice measured for them
    libs = {k.params.node.name: k.params.library for k in prog.program.kernels
            if k.kind is KernelKind.NODE}
    assert libs["conv2d_1"] == libs["conv2d_2"] == TORCH
    # the check always runs, but compiles no new library code once the budget is spent
    assert compiles == [False]
    assert clock.now == searches[0][1] + select_s + check_s > total
    assert clock.now <= total + budget.overshoot_bound(select_s, check_s, 0.0)
    assert budget.overshoot_bound(select_s, check_s, 0.0) == pytest.approx(
        cap + select_s - budget.reserve + check_s)
    assert Budget(None, cap, FakeClock()).overshoot_bound(1.0, 1.0, 1.0) == math.inf
    # again with the same budget: the same program, nothing searched (warm); a larger budget
    # searches what this one left
    clock.now = 0.0
    again, searches, _ = _run(clock, select_s, check_s, time_budget=cap, total_budget=total)
    assert searches == [] and [r.refused for r in again.report] == \
        [None, TIME_BUDGET, TIME_BUDGET]
    clock.now = 0.0
    more, searches, _ = _run(clock, select_s, check_s, time_budget=cap, total_budget=60.0)
    assert len(searches) == 2 and [r.refused for r in more.report] == [None, None, None]


def test_an_unbounded_optimisation_compiles_library_code_and_has_no_budget_note(
        ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(search_clock=clock, budget_clock=clock, cache_dir=tmp_path, **QUICK)
    prog, searches, compiles = _run(clock, 10.0, 10.0, time_budget=1.0, total_budget=None)
    assert len(searches) == 3 and compiles == [True]
    assert not any(n.startswith("total time budget") for n in prog.notes)


def _cand(cost: float) -> Candidate:
    return Candidate([], f"y{cost}", cost=cost)


def test_only_the_plausible_candidates_are_built():
    ranked = [_cand(c) for c in (1.0, 5.0, math.nan, 1.5, 0.5, 0.7)]
    # in rank order, at most PLAUSIBLE, none estimated FAR_BEHIND the original's 2 s
    assert plausible(ranked, 2.0) == [ranked[0], ranked[2], ranked[3]]
    assert plausible(ranked, 2.0, limit=5) == [ranked[i] for i in (0, 2, 3, 4, 5)]
    assert plausible(ranked, 5.0 / FAR_BEHIND, limit=2) == ranked[:2]  # at the limit: kept
    assert plausible(ranked, math.nan) == ranked[:PLAUSIBLE]  # not measured: by rank only
    assert plausible(ranked, 0.0) == ranked[:PLAUSIBLE]  # a stopped clock: likewise
    assert plausible([], 1.0) == []


def test_a_bounded_search_builds_only_the_plausible_candidates(ollie_settings, tmp_path):
    ollie_settings(search_clock=FakeClock(), cache_dir=tmp_path, **QUICK)
    m, x = _model()
    given: list[int] = []
    ranked = [_cand(1e-9 * (i + 1)) for i in range(6)]

    def derive(expr, **kw):
        return DeriveResult(ranked, {"candidates": len(ranked)}, expr)

    def select(expr, cands, *args, **kw):
        given.append(len(cands))
        return real_select(expr, [], *args, **kw)

    real_select = model_mod.select
    mp = pytest.MonkeyPatch()
    mp.setattr(model_mod, "derive", derive)
    mp.setattr(model_mod, "select", select)
    try:
        ollie.optimize(m, (x,), **{**FAST, "max_candidates": 8, "total_budget": 100.0})
        ollie.optimize(m, (x,), **{**FAST, "max_candidates": 8, "total_budget": None,
                                   "use_cache": False})
    finally:
        mp.undo()
    assert given == [PLAUSIBLE] * 3 + [6] * 3


def test_no_library_choice_is_measured_once_the_budget_says_no(ollie_settings):
    from ollie.tune.choice import Choices

    ollie_settings(new_choices=lambda: False)
    table = Choices({("known",): "b"})
    built: list[str] = []

    def builder(name):
        return lambda: built.append(name) or (lambda x: x)

    def no_args():
        raise AssertionError("nothing is measured")

    names = ("a", "b", "base")
    fn = table.fastest_of({n: builder(n) for n in names}, (1,), ("new",), no_args,
                          baseline="base")
    assert built == ["base"] and table.get(("new",)) is None  # built alone, not remembered
    table.fastest_of({n: builder(n) for n in names}, (1,), ("known",), no_args,
                     baseline="base")
    assert built == ["base", "b"]  # a choice made before is still used
    assert table.fastest({"a": abs, "base": fn}, (1,), ("other",), no_args, "base") is fn


@pytest.mark.skipif(not onednn.available(), reason="torch built without oneDNN")
def test_a_convolution_runs_the_framework_implementation_once_the_budget_says_no(
        tmp_path, ollie_settings):
    from ollie.exec.conv import best_conv

    # large enough for a Winograd candidate; nothing built or compiled for it
    ollie_settings(cache_dir=tmp_path, new_choices=lambda: False, choices={})
    w, x = torch.randn(64, 64, 3, 3), torch.randn(1, 64, 28, 28)
    conv = best_conv("Conv2d", w, None, tuple(x.shape), (1, 1), (1, 1), (1, 1))
    torch.testing.assert_close(conv(x), torch.nn.functional.conv2d(x, w, None, 1, 1),
                               rtol=1e-4, atol=1e-4)
    assert not current().choices and not list(tmp_path.rglob("*.nbi"))


def test_a_default_budget_is_fixed_by_the_plan():
    budget = Budget(AUTO, 30.0, FakeClock())
    assert budget.total == default_total(0)
    assert Budget(None, 30.0, FakeClock()).describe() == ""


def test_a_budget_that_left_subprograms_unsearched_compares_only_the_regions(
        ollie_settings, tmp_path):
    from ollie.optimizer.config import OptimizeConfig
    from ollie.optimizer.final import libraries
    from ollie.tune.cache import CostCache

    ollie_settings(cache_dir=tmp_path, **QUICK)
    prog, feeds, want = _originals()
    cfg = OptimizeConfig(settle=0.0)
    cache = CostCache()
    seen = []
    for allowed in (False, True):
        notes: list[str] = []
        with ollie.settings.using(new_choices=lambda allowed=allowed: allowed):
            got, decision = libraries(prog, feeds, want, cfg, notes, cache, timed=False)
        assert got is prog and decision is None  # equal times on the fake clock: kept
        seen.append([n.split(" (")[0] for n in notes if "quick comparison" in n])
    # compared once (spent or not: its time is bounded), then cached
    assert seen == [["convolution libraries, quick comparison: per operator"], []], notes


@pytest.mark.parametrize("seconds, kept", [
    # name -> seconds per call; the regions of the original operators win by far: kept
    ({"per operator": 2.0, "ONNX Runtime regions": 1.5,
      "original operators: ONNX Runtime regions": 1.0}, "original operators"),
    # the program's own regions more than ALTERNATIVE_MARGIN faster: they are kept
    ({"per operator": 2.0, "ONNX Runtime regions": 0.95,
      "original operators: ONNX Runtime regions": 1.0}, None),
    # the program's own regions faster, but by less than the margin: the alternative's
    ({"per operator": 2.0, "ONNX Runtime regions": 0.99,
      "original operators: ONNX Runtime regions": 1.0}, "original operators"),
    # no faster than the program itself: the program as it is
    ({"per operator": 1.0, "ONNX Runtime regions": 1.0,
      "original operators: ONNX Runtime regions": 1.0}, "program"),
])
def test_the_quick_comparison_offers_the_original_operators_regions(
        ollie_settings, tmp_path, monkeypatch, seconds, kept):
    """A rewrite can break an ONNX Runtime region: under a spent budget the quick comparison
    also times the regions of the model's original operators (the alternative), and keeps
    them as the full comparison would."""
    from ollie.graph import run_graph
    from ollie.optimizer.config import OptimizeConfig
    from ollie.optimizer.final import ORIGINALS, all_nodes, libraries
    from ollie.optimizer.importing import to_graph
    from ollie.optimizer.libraries import REGIONS
    from ollie.tune.cache import CostCache

    measure = importlib.import_module("ollie.tune.measure")  # the package exports a function

    ollie_settings(cache_dir=tmp_path, **QUICK)
    m, x = _model()
    graph = to_graph(m, (x,))
    prog, originals = all_nodes(graph), all_nodes(graph)
    feeds = {graph.input_names[0]: x}
    want = run_graph(graph, feeds)
    timed: list[set[str]] = []
    real = measure.measure_rounds

    def rounds(fns, *args, **kwargs):
        if not set(fns) <= set(seconds):  # a convolution's choice among implementations
            return real(fns, *args, **kwargs)
        timed.append(set(fns))
        wobble = [1.0, 1.01, 0.99, 1.02, 0.98]
        return measure.Timings({n: [seconds[n] * w for w in wobble] for n in fns})

    monkeypatch.setattr(measure, "measure_rounds", rounds)
    notes: list[str] = []
    got, decision = libraries(prog, feeds, want, OptimizeConfig(settle=0.0), notes,
                              CostCache(), {ORIGINALS: originals}, timed=False)
    assert timed == [set(seconds)]
    if kept == "original operators":
        assert decision is not None and decision.alternative == ORIGINALS
        assert decision.choice == REGIONS and got is not prog and got is not originals
    elif kept is None:
        assert decision is not None and decision.alternative is None
        assert decision.choice == REGIONS
    else:
        assert got is prog and decision is None
    # cached: the same answer again, nothing timed
    _, cached = libraries(prog, feeds, want, OptimizeConfig(settle=0.0), [], CostCache(),
                          {ORIGINALS: originals}, timed=False)
    assert len(timed) == 1 and cached == decision


def _scripted_quick_comparison(monkeypatch, samples: Callable[[int], dict[str, list[float]]]
                               ) -> list[set[str]]:
    """The quick comparison's ``i``-th timing of the per-operator program against its regions
    returns ``samples(i)`` (a convolution's choice among implementations is timed as usual);
    returns the list each such timing appends its functions to."""
    from ollie.optimizer.libraries import PER_OPERATOR, REGIONS

    measure = importlib.import_module("ollie.tune.measure")
    timed: list[set[str]] = []
    real = measure.measure_rounds

    def rounds(fns, *args, **kwargs):
        if set(fns) != {PER_OPERATOR, REGIONS}:  # a convolution's choice among implementations
            return real(fns, *args, **kwargs)
        timed.append(set(fns))
        return measure.Timings(samples(len(timed) - 1))

    monkeypatch.setattr(measure, "measure_rounds", rounds)
    return timed


def test_the_quick_comparison_measures_again_a_lead_one_noisy_round_left_undecided(
        ollie_settings, tmp_path, monkeypatch):
    """A large model's whole program gets few rounds in the quick comparison's time: its
    regions ahead on the median but not with confidence (one noisy round of three) are timed
    for as many rounds again, and kept when all the rounds together decide."""
    from ollie.optimizer.config import OptimizeConfig
    from ollie.optimizer.final import libraries
    from ollie.optimizer.libraries import PER_OPERATOR, REGIONS
    from ollie.tune.cache import CostCache

    ollie_settings(cache_dir=tmp_path, **QUICK)
    prog, feeds, want = _originals()
    calls: list[dict[str, list[float]]] = [
        {PER_OPERATOR: [2.0, 2.0, 2.0], REGIONS: [1.0, 1.0, 2.5]},  # ratios .5 .5 1.25
        {PER_OPERATOR: [2.0, 2.0, 2.0], REGIONS: [1.0, 1.0, 1.0]}]
    timed = _scripted_quick_comparison(monkeypatch, lambda i: calls[i])
    notes: list[str] = []
    got, decision = libraries(prog, feeds, want, OptimizeConfig(settle=0.0), notes,
                              CostCache(), timed=False)
    assert len(timed) == 2  # the first three rounds decided nothing
    assert decision is not None and decision.choice == REGIONS and got is not prog
    # a lead the first rounds decide is not measured again (another cache: not recalled)
    ollie_settings(cache_dir=tmp_path / "second")
    timed.clear()
    calls[0] = {PER_OPERATOR: [2.0, 2.0, 2.0], REGIONS: [1.0, 1.0, 1.1]}
    _, decision = libraries(prog, feeds, want, OptimizeConfig(settle=0.0), [], CostCache(),
                            timed=False)
    assert len(timed) == 1 and decision is not None and decision.choice == REGIONS


def test_a_lead_still_undecided_after_the_second_measurement_goes_by_the_medians(
        ollie_settings, tmp_path, monkeypatch):
    """On a busy machine the per-operator program's spread widens the margin until no lead
    is confident, however large: after both measurements the regions, ahead by the margin
    on the medians of all rounds, are kept, and the note says how it was decided. A lead
    within the margin is not."""
    from ollie.optimizer.config import OptimizeConfig
    from ollie.optimizer.final import libraries
    from ollie.optimizer.libraries import PER_OPERATOR, REGIONS
    from ollie.tune.cache import CostCache

    ollie_settings(cache_dir=tmp_path, **QUICK)
    prog, feeds, want = _originals()
    noisy = [1.0, 3.0, 2.0, 0.6, 2.2, 1.4]  # median 1.7, relative spread 0.35: margin 0.53
    samples = {PER_OPERATOR: noisy, REGIONS: [0.8] * 6}  # paired ratios' bound 0.8: undecided
    timed = _scripted_quick_comparison(monkeypatch, lambda i: dict(samples))
    notes: list[str] = []
    got, decision = libraries(prog, feeds, want, OptimizeConfig(settle=0.0), notes,
                              CostCache(), timed=False)
    assert len(timed) == 2  # measured again, still undecided
    assert decision is not None and decision.choice == REGIONS and got is not prog
    assert any("decided by the medians" in n for n in notes), notes
    # regions ahead by less than the margin on the medians: the program as it is
    ollie_settings(cache_dir=tmp_path / "second")
    timed.clear()
    samples[REGIONS] = [1.68] * 6  # the medians' ratio 0.99: within the margin
    notes.clear()
    got, decision = libraries(prog, feeds, want, OptimizeConfig(settle=0.0), notes,
                              CostCache(), timed=False)
    assert len(timed) == 1 and decision is None and got is prog
    assert not any("decided by the medians" in n for n in notes), notes


@pytest.mark.parametrize("tick, long", [(2**-4, False), (1.0, True)])
def test_the_quick_comparison_times_long_calls_without_warm_up_or_lead_calls(
        ollie_settings, tmp_path, monkeypatch, tick, long):
    """A whole program whose checking run took LONG_CALL_SECONDS or more (a large model at a
    large batch, seconds a call) is timed without warm-up and lead calls: that run warmed it
    up, and each of them would cost as much as a sample; shorter ones keep both."""
    from ollie.optimizer.config import OptimizeConfig
    from ollie.optimizer.final import libraries
    from ollie.optimizer.libraries import PER_OPERATOR, REGIONS
    from ollie.tune.cache import CostCache

    measure = importlib.import_module("ollie.tune.measure")
    ollie_settings(cache_dir=tmp_path, measure_clock=FakeClock(tick), sleep=lambda s: None)
    prog, feeds, want = _originals()
    asked: list[dict[str, object]] = []
    real = measure.measure_rounds

    def rounds(fns, *args, **kwargs):
        if set(fns) != {PER_OPERATOR, REGIONS}:  # a convolution's choice among implementations
            return real(fns, *args, **kwargs)
        asked.append(kwargs)
        return measure.Timings({PER_OPERATOR: [2.0] * 3, REGIONS: [1.0] * 3})

    monkeypatch.setattr(measure, "measure_rounds", rounds)
    notes: list[str] = []
    _, decision = libraries(prog, feeds, want, OptimizeConfig(settle=0.2), notes, CostCache(),
                            timed=False)
    assert decision is not None and decision.choice == REGIONS and len(asked) == 1
    assert (asked[0]["warmup"], asked[0]["lead_calls"]) == ((0, 0) if long else (2, 1))
    assert (asked[0]["lead_seconds"] == 0.0) == long
    assert any("no warm-up or lead calls" in n for n in notes) == long, notes
