"""AvgPool2d / GlobalAveragePool lowerings against torch; MaxPool2d and Softmax are opaque."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lower_testutil import check_op, rand, t

import ollie
from ollie.errors import UnsupportedError
from ollie.lower import LOWERINGS, OPAQUE_OPS, lower


@settings(max_examples=40)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
       k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       s=st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))),
       p=st.tuples(st.integers(0, 2), st.integers(0, 2)), include=st.booleans(),
       ceil=st.booleans(), seed=st.integers(0, 1000))
def test_avg_pool2d_matches_torch(n: int, c: int, h: int, w: int, k: tuple, s: tuple | None,
                                  p: tuple, include: bool, ceil: bool, seed: int) -> None:
    assume(p[0] <= k[0] // 2 and p[1] <= k[1] // 2)  # torch's restriction
    assume(h + 2 * p[0] >= k[0] and w + 2 * p[1] >= k[1])
    x = rand((n, c, h, w), seed)
    want = F.avg_pool2d(t(x), k, s, p, ceil_mode=ceil, count_include_pad=include)
    low = check_op("AvgPool2d", {"X": x}, want, kernel_size=k, stride=s, padding=p,
                   count_include_pad=include, ceil_mode=ceil)
    assert set(low.consts) <= {"pool_rcp"}


def test_avg_pool2d_asymmetric_padding_is_zero_padded_average() -> None:
    x = rand((1, 2, 6, 5), 9)
    xp = F.pad(t(x), (0, 1, 1, 2))  # left, right, top, bottom
    want = F.avg_pool2d(xp, (3, 2), (2, 1))
    check_op("AvgPool2d", {"X": x}, want, kernel_size=(3, 2), stride=(2, 1),
             padding=(1, 0, 2, 1))


def test_avg_pool2d_uniform_divisor_is_a_literal() -> None:
    low = lower("AvgPool2d", [("X", (1, 2, 5, 5))], kernel_size=3, stride=2, padding=1)
    assert low.consts == {}
    assert "Sum<r=0:3, s=0:3> X[n, c, 2*h + r - 1, 2*w + s - 1] * 0.111" in ollie.format(low.expr)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 7), (1, 2, 2, 3, 2)])
def test_global_average_pool_matches_torch(shape: tuple) -> None:
    x = rand(shape, 5)
    dims = tuple(range(2, len(shape)))
    check_op("GlobalAveragePool", {"X": x}, t(x).mean(dim=dims, keepdim=True))


def test_opaque_operators() -> None:
    assert {"MaxPool2d", "Softmax"} == OPAQUE_OPS
    assert set(LOWERINGS) >= OPAQUE_OPS
    with pytest.raises(UnsupportedError, match="MaxPool2d is an opaque operator"):
        lower("MaxPool2d", [("X", (1, 1, 4, 4))], kernel_size=2)
    with pytest.raises(UnsupportedError, match="Softmax is an opaque operator"):
        lower("Softmax", [("X", (2, 4))], axis=-1)
