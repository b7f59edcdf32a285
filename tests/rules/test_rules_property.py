"""Property: every derivation rule, on generated well-formed expressions, yields structurally
valid expressions that interpret to the same values as their source."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import ollie
from ollie.ir import verify
from ollie.rules import RULES
from ollie.testing.strategies import exprs


def _inputs(expr, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}


def check_rule(name, expr, limit=12):
    inputs = _inputs(expr)
    ref = ollie.interpret(expr, inputs)
    derived = RULES[name](expr)
    for d in derived[:limit]:
        verify(d.expr)
        assert d.rule == name
        got = ollie.interpret(d.expr, inputs)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{name}: {d.note}\n{expr}\n->\n{d.expr}")
        assert ollie.parse(ollie.format(d.expr)) == d.expr
    return derived


@pytest.mark.parametrize("name", sorted(RULES))
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(expr=exprs(depth=1))
def test_rule_preserves_semantics(name, expr):
    check_rule(name, expr)


@pytest.mark.parametrize("name", sorted(RULES))
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=25)
@given(expr=exprs(depth=1))
def test_two_step_derivations_preserve_semantics(name, expr):
    # apply the rule, then every rule again: chains exercise nested scopes built by rules
    for d in RULES[name](expr)[:3]:
        for other in sorted(RULES):
            check_rule(other, d.expr, limit=3)
