"""The programs the search must find by itself, from the plain expression, with no per-case
code (small sizes of the operator cases; the real sizes are timed by the search benchmark)."""

import numpy as np
import pytest

import ollie
from ollie.bench.cases import CASES
from ollie.semantics.check import random_inputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_search_finds_the_paper_program(name):
    case = CASES[name]
    expr = ollie.parse(case.small)
    res = ollie.derive(expr, max_depth=2, time_budget=60.0, target=case.target,
                       stop_at_target=True, max_candidates=64)
    assert "target" in res.stats["first_found"], (
        f"{case.what}: not found; stats {res.stats}")
    hits = [c for c in res.candidates if case.target(c)]
    assert hits, f"{case.what}: found but not among the verified candidates"
    cand = hits[0]
    assert cand.verified and cand.derivation
    inputs = random_inputs(expr, seed=7)
    np.testing.assert_allclose(cand.run(inputs), ollie.interpret(expr, inputs),
                               rtol=1e-4, atol=1e-4)
