"""Subprograms of several nodes under a total budget (issue 45): a sibling merge and a fused
chain search for their share of the budget, not the configured per-subprogram budget, build
only the first ``PLAUSIBLE`` candidates of each search, and measure them for at most that
share; their decisions are cached apart from a full search's. Without a total budget they
get the configured budget and ``max_candidates``. One the budget leaves no time for is not
tried, and the budget's note names it. Searches run on a stopped clock and return
a scripted number of candidates: what is counted is what was asked, never a time."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.optimizer import chains, region
from ollie.optimizer.budget import MIN_SHARE, Budget
from ollie.optimizer.plausible import PLAUSIBLE, Allowance
from ollie.search import DeriveResult
from ollie.testing.clock import stopped_clock
from ollie.zoo.longformer import g2bmm_torch

SHARE = 0.25
"""The share of the total budget every search gets here (``Budget.share`` scripted)."""

FAST = dict(max_depth=0, time_budget=2.0, max_candidates=4, use_cache=False, context=False,
            choose_libraries=False, settle=0, kernel_library=False)


class _Attention(nn.Module):
    """Q/K/V projections of one input (one sibling group)."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x):
        return (self.q(x) @ self.k(x).transpose(1, 2)).relu() @ self.v(x)


def _attention():
    torch.manual_seed(0)
    return _Attention().eval(), (torch.randn(1, 4, 8),)


class _Band(nn.Module):
    """One banded product in plain PyTorch (pad, unfold, product, sum: one chain)."""

    def forward(self, q, k):
        return g2bmm_torch(q, k, 2, 1)


def _chain():
    torch.manual_seed(0)
    return _Band().eval(), (torch.randn(2, 12, 8), torch.randn(2, 12, 8))


CASES = {
    # module whose searches and selection are watched, the model, its switches
    "sibling merge": (region, _attention, dict(merge_siblings=True, fuse_chains=False)),
    "fused chain": (chains, _chain, dict(merge_siblings=False, fuse_chains=True)),
}


def _watch(monkeypatch, mod) -> tuple[list[float], list[tuple[int, float | None]]]:
    """Record each search's time budget and each selection's (candidates, max_seconds) in
    ``mod``; every search returns its candidates repeated to more than ``max_candidates``."""
    searches: list[float] = []
    selections: list[tuple[int, float | None]] = []
    real_derive, real_select = mod.derive, mod.select_program

    def derive(expr, **kw):
        searches.append(kw["time_budget"])
        res = real_derive(expr, **kw)
        return DeriveResult(list(res.candidates) * 4, res.stats, res.expr)

    def select_program(outputs, programs, *args, **kw):
        selections.append((len(programs), kw.get("max_seconds")))
        return real_select(outputs, programs, *args, **kw)

    monkeypatch.setattr(mod, "derive", derive)
    monkeypatch.setattr(mod, "select_program", select_program)
    return searches, selections


@pytest.mark.parametrize("case", list(CASES))
def test_a_several_node_subprogram_spends_its_share_of_a_total_budget(
        case, ollie_settings, monkeypatch, tmp_path):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock, cache_dir=tmp_path)
    mod, make, switches = CASES[case]
    searches, selections = _watch(monkeypatch, mod)
    monkeypatch.setattr(Budget, "share", lambda self: SHARE)
    m, inputs = make()
    ollie.optimize(m, inputs, **FAST, **switches, total_budget=1000.0)
    assert searches and selections
    assert sum(searches) <= SHARE * len(selections) + 1e-9  # the forms split one share
    # the first PLAUSIBLE of each search are built (a search per form for a merge)
    assert all(0 < n <= PLAUSIBLE * len(searches) for n, _ in selections)
    assert {s for _, s in selections} == {max(SHARE, MIN_SHARE)}

    searches.clear()
    selections.clear()
    monkeypatch.undo()
    searches, selections = _watch(monkeypatch, mod)
    ollie.optimize(m, inputs, **FAST, **switches, total_budget=None)
    assert searches and sum(searches) == pytest.approx(FAST["time_budget"] * len(selections))
    assert all(n > PLAUSIBLE for n, _ in selections)  # max_candidates of each search
    assert {s for _, s in selections} == {None}  # select_program's own bound


def test_a_shorter_search_is_stored_apart_and_a_bounded_run_reuses_either():
    full = Allowance(2.0, 2.0)
    assert full.keys("k") == ("k", ("k",))
    assert Allowance(2.0, 2.0, bounded=True).keys("k") == ("k", ("k", "k|partial"))
    assert Allowance(0.5, 2.0, bounded=True).keys("k") == ("k|partial", ("k", "k|partial"))
    assert full.first(list(range(20)), 8) == list(range(8))
    assert full.first(list(range(20)), 0) == [0]
    assert Allowance(0.5, 2.0, bounded=True).first(list(range(20)), 8) == list(range(PLAUSIBLE))
    assert full.measuring() == {}
    assert Allowance(0.5, 2.0, bounded=True).measuring() == {"max_seconds": MIN_SHARE}


def test_what_the_budget_left_untried_is_named_in_its_note(ollie_settings, monkeypatch,
                                                           tmp_path):
    """A sibling merge the total budget leaves no time for is not tried, and the budget's
    note says so; the members keep their own decisions."""
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock, cache_dir=tmp_path)
    monkeypatch.setattr(Budget, "out_of_time", lambda self: True)
    m, inputs = _attention()
    opt = ollie.optimize(m, inputs, **FAST, merge_siblings=True, fuse_chains=False,
                         total_budget=1000.0)
    note = next(n for n in opt.notes if n.startswith("total time budget"))
    assert "; 1 merge(s), chain(s) or region(s) not tried (siblings linear_mm, linear_1_mm, " \
        "linear_2_mm)" in note, note
    assert all(len(r.nodes) == 1 for r in opt.report)
    with torch.no_grad():
        torch.testing.assert_close(opt(*inputs), m(*inputs), rtol=1e-4, atol=1e-5)


def test_the_note_names_the_first_three_untried():
    budget = Budget(10.0, 1.0, stopped_clock)
    for name in "abcd":
        budget.not_tried(f"region at {name}")
    assert budget.describe().endswith(
        "; 4 merge(s), chain(s) or region(s) not tried (region at a; region at b; "
        "region at c; ...)")
