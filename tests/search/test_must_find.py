"""The programs the search must find by itself, from the plain expression, with no per-case
code (small sizes of the operator cases; the real sizes are timed by the search benchmark),
within a bound on its derivation (depth and explorative states), not on seconds: the search
runs on a stopped clock, so what it finds does not depend on how fast the machine is."""

import numpy as np
import pytest

import ollie
from ollie.bench.cases import CASES
from ollie.semantics.check import random_inputs
from ollie.testing.clock import stopped_clock

MAX_DEPTH = 2
MAX_STATES = 16
"""The derivation each program must be found within: explorative steps and states visited
(guided steps within each state are not bounded here)."""


@pytest.mark.timing
@pytest.mark.parametrize("name", sorted(CASES))
def test_search_finds_the_paper_program(name):
    case = CASES[name]
    expr = ollie.parse(case.small)
    res = ollie.derive(expr, max_depth=MAX_DEPTH, time_budget=60.0, target=case.target,
                       stop_at_target=True, max_candidates=64, max_states=MAX_STATES,
                       clock=stopped_clock)
    assert "target" in res.stats["first_found"], (
        f"{case.what}: not found; stats {res.stats}")
    found = res.stats["first_found"]["target"]
    assert found["depth"] <= MAX_DEPTH and found["states_visited"] <= MAX_STATES, found
    hits = [c for c in res.candidates if case.target(c)]
    assert hits, f"{case.what}: found but not among the verified candidates"
    cand = hits[0]
    assert cand.verified and cand.derivation
    inputs = random_inputs(expr, seed=7)
    np.testing.assert_allclose(cand.run(inputs), ollie.interpret(expr, inputs),
                               rtol=1e-4, atol=1e-4)
