"""Rewrites exact for finite inputs only (:func:`ollie.rules.base.assume_finite_inputs`):
traversal merging inlines a zero-padded window read by a product only inside the block, and
the inlined form equals the original on finite inputs (hypothesis over window shapes); with an
infinity in the other factor they differ exactly where the padding is read, which is why the
strict default refuses it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.rules.base import assume_finite_inputs, finite_inputs_assumed
from ollie.rules.traversal_merging import traversal_merging


def _window(m: int, c: int, w: int, d: int) -> str:
    """``S[i, j] = Sum_c Q[i, c] * P[i + d*j, c]`` with ``P`` = ``K`` zero-padded by
    ``w*d`` rows on each side (the plain-PyTorch banded product)."""
    r = w * d
    return (f"Q: [{m}, {c}]\nK: [{m}, {c}]\n"
            f"L<i=0:{m}, j=0:{2 * w + 1}> Sum<k=0:{c}> Q[i, k] * "
            f"{{ L<p=0:{m + 2 * r}, q=0:{c}> K[p - {r}, q] }}[i + {d}*j, k]")


def _flat(expr):
    out = traversal_merging(expr)
    return [d.expr for d in out if "{" not in ollie.format(d.expr)]


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), c=st.integers(1, 4), w=st.integers(1, 3), d=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_window_inlined_only_when_finite_inputs_assumed(m, c, w, d, seed):
    e = ollie.parse(_window(m, c, w, d))
    assert not finite_inputs_assumed() and _flat(e) == []
    with assume_finite_inputs():
        assert finite_inputs_assumed()
        flat = _flat(e)
    assert not finite_inputs_assumed()
    assert len(flat) == 1
    rng = np.random.default_rng(seed)
    feed = {"Q": rng.standard_normal((m, c)).astype(np.float32),
            "K": rng.standard_normal((m, c)).astype(np.float32)}
    np.testing.assert_allclose(ollie.interpret(flat[0], feed), ollie.interpret(e, feed),
                               rtol=1e-5, atol=1e-6)


def test_an_infinity_shows_why_the_default_refuses():
    e = ollie.parse(_window(4, 1, 1, 1))
    with assume_finite_inputs():
        (flat,) = _flat(e)
    feed = {"Q": np.full((4, 1), np.inf, np.float32), "K": np.ones((4, 1), np.float32)}
    want, got = ollie.interpret(e, feed), ollie.interpret(flat, feed)
    # row 0 reads the padding at j = 0: inf * 0 is NaN in the original, 0 once inlined
    assert np.isnan(want[0, 0]) and got[0, 0] == 0
    inside = ~np.isnan(want)
    np.testing.assert_array_equal(got[inside], want[inside])
