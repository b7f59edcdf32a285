"""Fingerprint pruning is exact: it never loses a candidate, and the number of states an
unpruned search visits is counted exactly from the pruned search's derivation graph."""

import importlib
import itertools
import math

import pytest

import ollie
from ollie.bench.cases import CASES
from ollie.search.derive import VERIFY_SHARE
from ollie.testing.clock import FakeClock, stopped_clock

derive_module = importlib.import_module("ollie.search.derive")


@pytest.mark.parametrize("name", ["conv3x3", "convtranspose"])
def test_pruning_loses_no_candidate_and_counts_exactly(name):
    expr = ollie.parse(CASES[name].small)
    # a stopped clock: both searches run to their depth, however busy the machine
    common = {"guided": False, "max_candidates": 0, "time_budget": 120.0,
              "clock": stopped_clock}
    for depth in (1, 2, 3):
        pruned = ollie.derive(expr, max_depth=depth, fingerprint_pruning=True, **common)
        full = ollie.derive(expr, max_depth=depth, fingerprint_pruning=False, **common)
        assert pruned.stats["unpruned_states"] == full.stats["states_visited"]
        assert pruned.stats["states_visited"] <= full.stats["states_visited"]
        # the pruned search finds exactly the programs the unpruned one finds
        assert pruned.found_keys == full.found_keys
        assert depth < 3 or pruned.found_keys


@pytest.mark.timing
def test_time_budget_is_honoured(monkeypatch):
    """The budget is checked between steps (one derived expression, one guided expression's
    instantiation, one verification), so a search ends at most about one step late: the stats
    say the longest time between two checks, and steps must be well under the budget. The
    exploration stops once its share of the budget (all but ``VERIFY_SHARE``) is spent; the
    rest is for verifying what it found, and verification stops when the next one might not
    fit. On a fake clock every derived expression takes ``2**-8`` s, every verification
    ``2**-7`` s, and nothing else takes time: a 0.125 s budget derives 26 expressions and
    verifies 2 programs, however fast the machine."""
    from ollie.rules import RULES

    clock = FakeClock()
    derivation, verification = 2.0 ** -8, 2.0 ** -7

    def costing(rule):
        def derive(expr):
            for d in rule(expr):
                clock.advance(derivation)
                yield d
        return derive

    def verify(*args, **kwargs):
        clock.advance(verification)
        return real_verify(*args, **kwargs)

    for name, rule in list(RULES.items()):
        monkeypatch.setitem(RULES, name, costing(rule))
    real_verify = derive_module.verify_candidate
    monkeypatch.setattr(derive_module, "verify_candidate", verify)
    expr = ollie.parse(CASES["conv3x3"].small)
    budget = 0.125
    stats = ollie.derive(expr, max_depth=7, time_budget=budget, clock=clock).stats
    step = stats["longest_step_seconds"]
    assert step == round(verification, 3) and step < budget / 2, stats
    explore = budget * (1 - VERIFY_SHARE)
    # the exploration ran until its share was spent, and stopped at the next check: the
    # expression derived across the deadline is dropped there
    assert stats["states_generated"] == math.ceil(explore / derivation) - 1, stats
    assert explore <= stats["search_seconds"] < explore + derivation, stats
    assert stats["unpruned_states"] is None, stats  # cut short: there was more to explore
    assert stats["states_visited"] >= 2, stats
    # then verification, within the budget: one program, and a second while the rest of the
    # budget was more than 1.2 times the slowest verification
    assert stats["candidates"] == 2 < stats["candidates_found"], stats
    assert stats["seconds"] == round(clock.now, 3) <= budget, stats


@pytest.mark.timing
def test_a_spent_budget_stops_the_search_after_the_step_in_progress():
    """A clock that reads 0 three times (the start, the first state's budget check, its
    guided derivation's first check), then 10 s, past the whole budget: the search stops at its
    next check, in the first state's guided derivation; no other state is visited, and the
    program found so far is still verified (a search that found programs returns one)."""
    expr = ollie.parse(CASES["conv3x3"].small)
    readings = itertools.chain(itertools.repeat(0.0, 3), itertools.repeat(10.0))
    res = ollie.derive(expr, max_depth=7, time_budget=3.0, clock=lambda: next(readings))
    stats = res.stats
    assert stats["states_visited"] == 1 and stats["states_generated"] == 0, stats
    assert stats["candidates_found"] >= 1 and stats["candidates"] == 1, stats
    assert res.candidates[0].verified
    assert stats["seconds"] == stats["longest_step_seconds"] == 10.0, stats
    # a clock that never reaches the budget: the same search goes on to other states
    more = ollie.derive(expr, max_depth=1, time_budget=3.0, clock=stopped_clock,
                        guided_depth=2).stats
    assert more["states_visited"] > 1 and more["unpruned_states"] is not None, more
