"""sample_positions, random_inputs and compare / assert_equivalent."""

from __future__ import annotations

import numpy as np
import pytest

from ollie import parse
from ollie.semantics import assert_equivalent, compare, random_inputs, sample_positions

CONV = """A: [1, 2, 5, 5]
K: [3, 2, 3, 3]
L<n=0:1, f=0:3, h=0:5, w=0:5> Sum<c=0:2, r=0:3, s=0:3>
    A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s]"""
# the same convolution with the kernel taps reversed and renamed
CONV_REVERSED = """A: [1, 2, 5, 5]
K: [3, 2, 3, 3]
L<n=0:1, f=0:3, h=0:5, w=0:5> Sum<c=0:2, u=-1:2, v=-1:2>
    A[n, c, h + u, w + v] * K[f, c, u + 1, v + 1]"""


def test_sample_positions_unique_in_range():
    pts = sample_positions((4, 5, 6), 50, np.random.default_rng(0))
    assert pts.shape == (50, 3) and pts.dtype == np.int64
    assert len({tuple(p) for p in pts}) == 50
    assert (pts >= 0).all() and (pts < [4, 5, 6]).all()


def test_sample_positions_all_when_n_large():
    pts = sample_positions((2, 3), 100, 0)
    assert sorted(map(tuple, pts)) == [(i, j) for i in range(2) for j in range(3)]
    assert sample_positions((), 5, 0).shape == (1, 0)


def test_random_inputs():
    x = random_inputs(parse(CONV), seed=3)
    assert set(x) == {"A", "K"}
    assert x["A"].shape == (1, 2, 5, 5) and x["A"].dtype == np.float32
    np.testing.assert_array_equal(x["K"], random_inputs(CONV, seed=3)["K"])


@pytest.mark.parametrize("n", [None, 10])
def test_compare_equivalent(n):
    ok, abs_err, rel_err = compare(parse(CONV), parse(CONV_REVERSED), n=n)
    assert ok and abs_err <= 1e-5 and rel_err <= 1e-5
    assert_equivalent(CONV, CONV_REVERSED, n=n)


def test_compare_different():
    other = CONV.replace("h + r - 1", "h + r - 2")
    res = compare(CONV, other, random_inputs(CONV, 1))
    assert not res.ok and res.max_abs_err > 1e-3
    with pytest.raises(AssertionError, match="differ"):
        assert_equivalent(CONV, other)
    assert not compare("A: [2]\nL<i=0:2> A[i]", "A: [2]\nL<i=0:1> A[i]").ok


def test_compare_nan_inf():
    a = "A: [3]\nL<i=0:3> log(A[i])"
    x = {"A": np.array([-1.0, 0.0, 2.0], np.float32)}
    assert compare(a, a, x).ok
    assert not compare(a, "A: [3]\nL<i=0:3> log(A[i] + 1)", x).ok
