"""Expression merging, sum mode (:mod:`ollie.rules.inter_sum`): contractions added together
become one over a concatenated reduction; checked against the oracle
:func:`ollie.semantics.program.interpret_program`, NaN and infinities included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ollie.errors import ExprError
from ollie.ir import format_program, parse, parse_program
from ollie.rules.base import assume_finite_inputs
from ollie.rules.inter_program import PROGRAM_RULES, has_sum, normalize_program
from ollie.rules.inter_sum import MAX_SUM_GROWTH, program_work, sum_merge
from ollie.semantics.program import interpret_program
from ollie.testing.strategies import program_inputs, sum_programs

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60,
                    deadline=None)

GCN_BLOCK = """
x: [1, 6, 5, 5]
L1: [2, 6, 3, 1]
L2: [2, 2, 1, 3]
R1: [2, 6, 1, 3]
R2: [2, 2, 3, 1]
b: [2]
left1 = L<n=0:1, f=0:2, h=0:5, w=0:5> Sum<c=0:6, r=0:3, s=0:1>
    x[n, c, h + r - 1, w + s] * L1[f, c, r, s]
left2 = L<n=0:1, f=0:2, h=0:5, w=0:5>
    { L<n=0:1, f=0:2, h=0:5, w=0:5> Sum<c=0:2, r=0:1, s=0:3>
      left1[n, c, h + r, w + s - 1] * L2[f, c, r, s] }[n, f, h, w] + b[f]
right1 = L<n=0:1, f=0:2, h=0:5, w=0:5> Sum<c=0:6, r=0:1, s=0:3>
    x[n, c, h + r, w + s - 1] * R1[f, c, r, s]
right2 = L<n=0:1, f=0:2, h=0:5, w=0:5> Sum<c=0:2, r=0:3, s=0:1>
    right1[n, c, h + r - 1, w + s] * R2[f, c, r, s]
out = L<n=0:1, c=0:2, h=0:5, w=0:5> left2[0, c, h, w] + right2[0, c, h, w]
out out
"""


def _random(ep, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in ep.inputs}


def _close(ep, derived, inputs):
    want, got = interpret_program(ep, inputs), interpret_program(derived, inputs)
    for o in ep.outputs:
        np.testing.assert_allclose(got[o], want[o], rtol=1e-4, atol=1e-4, equal_nan=True,
                                   err_msg=o)


def _sum_merges(ep):
    return [d for d in PROGRAM_RULES["expression_merging"](ep) if d.note.startswith("sum ")]


def test_gcn_block_merges_into_one_convolution_for_finite_inputs():
    ep = normalize_program(parse_program(GCN_BLOCK))
    assert _sum_merges(ep) == []  # relaxed 1x3 / 3x1: exact for finite inputs only
    with assume_finite_inputs():
        derived = _sum_merges(ep)
    assert len(derived) == 1
    d = derived[0]
    assert "relaxed r, s" in d.note and "finite" in d.note
    summing = [n for n, e in d.program.defs if has_sum(e.root)]
    assert len(summing) == 3  # left1, right1 and the merged left2 + right2
    merged = dict(d.program.defs)[d.note.split()[1].rstrip(":") + "_sum"]
    assert [it.size for it in merged.root.summation] == [4, 3, 3]  # 2 + 2 channels, 3x3
    assert "left2" not in dict(d.program.defs) and "right2" not in dict(d.program.defs)
    for seed in range(3):
        _close(ep, d.program, _random(ep, seed))
    assert parse_program(format_program(d.program)) == d.program


def test_relaxed_merge_differs_only_with_an_infinity():
    ep = normalize_program(parse_program(GCN_BLOCK))
    with assume_finite_inputs():
        d = _sum_merges(ep)[0]
    inputs = _random(ep)
    inputs["x"][0, 0, 2, 2] = np.inf
    want = interpret_program(ep, inputs)["out"]
    got = interpret_program(d.program, inputs)["out"]
    assert np.isnan(got).sum() > np.isnan(want).sum()  # x * 0 in the relaxed window


def test_equal_windows_merge_exactly_without_the_finite_assumption():
    text = """
    A: [2, 4]
    B: [3, 4]
    V: [2, 2, 3]
    W: [2, 3, 3]
    T0 = L<f=0:2, h=0:4> Sum<c=0:2, r=0:3> A[c, h + r - 1] * V[f, c, r]
    T1 = L<f=0:2, h=0:4> Sum<c=0:3, r=0:3> B[c, h + r - 1] * W[f, c, r]
    Y = L<f=0:2, h=0:4> T0[f, h] + T1[f, h]
    out Y
    """
    ep = parse_program(text)
    derived = _sum_merges(ep)
    assert len(derived) == 1 and "finite" not in derived[0].note
    (name, merged), = derived[0].program.defs
    assert name == "Y" and merged.root.summation[0].size == 5
    inputs = _random(ep)
    inputs["A"][1, 2] = np.inf
    inputs["W"][0, 1, 1] = np.nan
    _close(ep, derived[0].program, inputs)


def test_sum_merge_refuses_members_that_do_not_fit():
    a = parse("A: [2, 3]\nV: [3, 4]\nL<m=0:2, n=0:4> Sum<k=0:3> A[m, k] * V[k, n]")
    b = parse("B: [2, 3]\nW: [3, 2]\nL<m=0:2, n=0:2> Sum<k=0:3> B[m, k] * W[k, n]")
    with pytest.raises(ExprError, match="output iteration spaces"):
        sum_merge([a, b])
    c = parse("B: [2, 3]\nW: [3, 4]\nL<m=0:2, n=0:4> Sum<k=0:3> B[m, k] + W[k, n]")
    with pytest.raises(ExprError):
        sum_merge([a, c])
    with pytest.raises(ExprError, match=">= 2"):
        sum_merge([a])


def test_growth_bound_refuses_a_merge_that_multiplies_the_program_work():
    # two 1x5 / 5x1 pairs of one channel: the merged 5x5 window does 2.5x the work
    text = """
    A: [1, 6, 6]
    B: [1, 6, 6]
    V: [1, 1, 5]
    W: [1, 5, 1]
    T0 = L<f=0:1, h=0:6, w=0:6> Sum<c=0:1, r=0:1, s=0:5>
      A[c, h + r, w + s - 2] * V[c, r, s]
    T1 = L<f=0:1, h=0:6, w=0:6> Sum<c=0:1, r=0:5, s=0:1>
      B[c, h + r - 2, w + s] * W[c, r, s]
    Y = L<f=0:1, h=0:6, w=0:6> T0[f, h, w] + T1[f, h, w]
    out Y
    """
    ep = parse_program(text)
    with assume_finite_inputs():
        assert _sum_merges(ep) == []
    assert MAX_SUM_GROWTH < 2.5
    assert program_work(ep.defs, ep.outputs) > 0


@SETTINGS
@given(ep=sum_programs(), data=st.data())
def test_sum_mode_is_exact_with_specials_when_proposed_strictly(ep, data):
    inputs = data.draw(program_inputs(ep, specials=True))
    derived = _sum_merges(ep)
    event(f"strict sum merges: {len(derived)}")
    for d in derived:
        d.program.verify()
        assert d.program.outputs == ep.outputs and d.program.inputs == ep.inputs
        _close(ep, d.program, inputs)


@SETTINGS
@given(ep=sum_programs(same_windows=True), data=st.data())
def test_equal_windows_always_merge_strictly(ep, data):
    inputs = data.draw(program_inputs(ep, specials=True))
    derived = _sum_merges(ep)
    assert len(derived) == 1
    _close(ep, derived[0].program, inputs)


@SETTINGS
@given(ep=sum_programs(), data=st.data())
def test_sum_mode_is_exact_for_finite_inputs_inside_the_assumption(ep, data):
    inputs = data.draw(program_inputs(ep, specials=False))
    with assume_finite_inputs():
        derived = _sum_merges(ep)
    event(f"finite sum merges: {len(derived)}")
    for d in derived:
        d.program.verify()
        _close(ep, d.program, inputs)
        assert parse_program(format_program(d.program)) == d.program


def test_a_chain_of_adds_merges_all_its_contractions():
    text = """
    A: [2, 4]
    B: [1, 4]
    C: [3, 4]
    U: [2, 2]
    V: [2, 1]
    W: [2, 3]
    b: [2]
    T0 = L<f=0:2, h=0:4> Sum<c=0:2> A[c, h] * U[f, c]
    T1 = L<f=0:2, h=0:4> Sum<c=0:1> B[c, h] * V[f, c]
    T2 = L<f=0:2, h=0:4> { L<f=0:2, h=0:4> Sum<c=0:3> C[c, h] * W[f, c] }[f, h] + b[f]
    S = L<f=0:2, h=0:4> T0[f, h] + T1[f, h]
    Y = L<f=0:2, h=0:4> S[f, h] + T2[f, h]
    out Y
    """
    ep = normalize_program(parse_program(text))
    (d,) = _sum_merges(ep)
    assert "sum of 3" in d.note and "finite" not in d.note
    merged = next(e for n, e in d.program.defs if has_sum(e.root))
    assert [it.size for it in merged.root.summation] == [6]  # 2 + 1 + 3 channels
    inputs = _random(ep)
    inputs["C"][2, 1] = -np.inf
    _close(ep, d.program, inputs)
