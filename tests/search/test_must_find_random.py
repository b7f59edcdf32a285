"""The programs the search must find, on random shapes of every operator case
(:data:`ollie.bench.shapes.FAMILIES`): not merely found, but among the first
:data:`OPTIMIZER_CAP` candidates reported, the ones ``ollie.optimize`` measures. The search
runs on a stopped clock, bounded by its depth and states, so what it reports depends on the
code alone. A draw whose expression is memory-bound on the default roofline (an eOperator is
then a fair first choice) must have its target found, not ranked.

Each family draws :data:`EXAMPLES` shapes, the same on every run; ``$OLLIE_MUST_FIND_EXAMPLES``
asks for more, fresh ones each run (as the fuzz suite's ``OLLIE_FUZZ_EXAMPLES`` does)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.bench.shapes import FAMILIES
from ollie.search.derive import compute_bound
from ollie.semantics.check import random_inputs
from ollie.testing.clock import stopped_clock
from ollie.tune.roofline import DEFAULT_ROOFLINE

MAX_DEPTH = 2
MAX_STATES = 16
OPTIMIZER_CAP = 8
"""``OptimizeConfig.max_candidates``: the candidates the optimizer measures."""
EXAMPLES = 2
EXAMPLES_ENV = "OLLIE_MUST_FIND_EXAMPLES"
MORE = os.environ.get(EXAMPLES_ENV)
SETTINGS = settings(max_examples=max(EXAMPLES, int(MORE or 0)), deadline=None,
                    derandomize=MORE is None, database=None,
                    suppress_health_check=list(HealthCheck))


def sizes(ranges) -> st.SearchStrategy[dict[str, int]]:
    return st.fixed_dictionaries({n: st.integers(lo, hi) for n, (lo, hi) in ranges.items()})


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_target_ranked_on_random_shapes(name):
    family = FAMILIES[name]

    @SETTINGS
    @given(sizes(family.ranges))
    def check(p):
        expr = ollie.parse(family.text(p))
        res = ollie.derive(expr, max_depth=MAX_DEPTH, time_budget=60.0, target=family.target,
                           max_candidates=OPTIMIZER_CAP, max_states=MAX_STATES,
                           clock=stopped_clock)
        assert "target" in res.stats["first_found"], f"{name} {p}: not found; {res.stats}"
        hits = [c for c in res.candidates if family.target(c)]
        if not compute_bound(expr, DEFAULT_ROOFLINE):
            return
        assert hits, (f"{name} {p}: found but not among the first {OPTIMIZER_CAP}: "
                      + "; ".join(c.summary() for c in res.candidates))
        inputs = random_inputs(expr, seed=3)
        np.testing.assert_allclose(hits[0].run(inputs), ollie.interpret(expr, inputs),
                                   rtol=1e-4, atol=1e-4)

    check()
