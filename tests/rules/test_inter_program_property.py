"""Property tests of the inter-expression rules on expression programs
(:mod:`ollie.rules.inter_program`): every application keeps every output, NaN and infinities
included, against the oracle :func:`ollie.semantics.program.interpret_program`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ollie.ir import format_program, parse_program
from ollie.rules.inter_program import (
    PROGRAM_RULES,
    apply_program_rules,
    has_sum,
    normalize_program,
)
from ollie.semantics.program import interpret_program
from ollie.testing.strategies import expr_programs, program_inputs

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60,
                    deadline=None)


def _same_outputs(ep, derived, inputs):
    assert derived.outputs == ep.outputs
    assert derived.inputs == ep.inputs
    want = interpret_program(ep, inputs)
    got = interpret_program(derived, inputs)
    for o in ep.outputs:
        assert got[o].shape == want[o].shape, o
        np.testing.assert_allclose(got[o], want[o], rtol=1e-5, atol=1e-5, equal_nan=True,
                                   err_msg=f"output {o}")


@pytest.mark.parametrize("rule", sorted(PROGRAM_RULES))
@SETTINGS
@given(ep=expr_programs(), data=st.data())
def test_program_rule_keeps_every_output_with_specials(rule, ep, data):
    inputs = data.draw(program_inputs(ep, specials=True))
    derived = PROGRAM_RULES[rule](ep)
    event(f"{rule}: {min(len(derived), 3)}{'+' if len(derived) >= 3 else ''} applications")
    for d in derived:
        assert d.rule == rule and d.note
        d.program.verify()
        _same_outputs(ep, d.program, inputs)
        assert parse_program(format_program(d.program)) == d.program


@SETTINGS
@given(ep=expr_programs(), data=st.data())
def test_normalize_program_is_exact_and_leaves_no_pure_def_with_readers(ep, data):
    inputs = data.draw(program_inputs(ep, specials=True))
    norm = normalize_program(ep)
    norm.verify()
    _same_outputs(ep, norm, inputs)
    readers = norm.readers()
    for name, expr in norm.defs:
        if not has_sum(expr.root):
            assert not readers[name], f"{name} has no Sum but is still read"
    assert normalize_program(norm) == norm


@SETTINGS
@given(ep=expr_programs(), data=st.data())
def test_two_rule_steps_keep_every_output(ep, data):
    inputs = data.draw(program_inputs(ep, specials=False))
    first = apply_program_rules(ep)
    if not first:
        return
    d1 = data.draw(st.sampled_from(first))
    for d2 in apply_program_rules(d1.program)[:6]:
        _same_outputs(ep, d2.program, inputs)


@SETTINGS
@given(ep=expr_programs())
def test_program_text_round_trips(ep):
    text = format_program(ep)
    assert parse_program(text) == ep
    assert format_program(parse_program(text)) == text
