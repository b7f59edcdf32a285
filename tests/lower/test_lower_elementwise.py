"""Element-wise lowerings (unary, broadcast binary, BiasAdd, BatchNorm) against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_testutil import check_op, rand, t

import ollie
from ollie.lower import lower

UNARY = {
    "Relu": torch.relu, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Exp": torch.exp,
    "Log": torch.log, "Sqrt": torch.sqrt, "Abs": torch.abs, "Neg": torch.neg,
    "Identity": lambda x: x,
}
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


@pytest.mark.parametrize("kind", sorted(UNARY))
@settings(max_examples=8)
@given(shape=shapes, seed=st.integers(0, 1000))
def test_unary_matches_torch(kind: str, shape: tuple, seed: int) -> None:
    x = rand(shape, seed, positive=kind in ("Log", "Sqrt"))
    check_op(kind, {"X": x}, UNARY[kind](t(x)))


@settings(max_examples=15)
@given(shape=shapes, seed=st.integers(0, 1000), alpha=st.sampled_from([0.01, 0.2, 0.0, -1.5]))
def test_leaky_relu_matches_torch(shape: tuple, seed: int, alpha: float) -> None:
    x = rand(shape, seed)
    check_op("LeakyRelu", {"X": x}, F.leaky_relu(t(x), alpha), alpha=alpha)


def test_leaky_relu_form_and_default() -> None:
    low = lower("LeakyRelu", [("X", (2, 3))], alpha=0.5)
    assert ollie.format(low.expr).endswith(
        "L<i0=0:2, i1=0:3> max(X[i0, i1], 0) + 0.5 * min(X[i0, i1], 0)\n")
    x = rand((5,), 2)
    check_op("LeakyRelu", {"X": x}, F.leaky_relu(t(x)))


BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
    "Max": torch.maximum, "Min": torch.minimum,
}


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))

    def operand() -> tuple[int, ...]:
        rank = draw(st.integers(1, len(out)))
        return tuple(1 if draw(st.booleans()) else d for d in out[len(out) - rank:])

    return operand(), operand()


@pytest.mark.parametrize("kind", sorted(BINARY))
@settings(max_examples=12)
@given(pair=broadcast_pair(), seed=st.integers(0, 1000))
def test_binary_broadcast_matches_torch(kind: str, pair: tuple, seed: int) -> None:
    sa, sb = pair
    a = rand(sa, seed)
    b = rand(sb, seed + 1)
    if kind == "Div":  # keep denominators away from zero
        b = np.where(b < 0, -1, 1).astype(np.float32) * (np.abs(b) + 0.5)
    check_op(kind, {"A": a, "B": b}, BINARY[kind](t(a), t(b)))


def test_binary_reads_index_zero_on_broadcast_dims() -> None:
    low = lower("Add", [("A", (2, 3, 4)), ("B", (1, 4))])
    assert ollie.format(low.expr).endswith(
        "L<i0=0:2, i1=0:3, i2=0:4> A[i0, i1, i2] + B[0, i2]\n")


def test_binary_same_input_twice() -> None:
    x = rand((2, 3), 4)
    low = lower("Mul", [("X", (2, 3)), ("X", (2, 3))])
    np.testing.assert_allclose(ollie.interpret(low.expr, {"X": x}), x * x, rtol=1e-6)


@settings(max_examples=20)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=5).map(tuple),
       seed=st.integers(0, 1000))
def test_bias_add_matches_torch(shape: tuple, seed: int) -> None:
    x, b = rand(shape, seed), rand((shape[1],), seed + 1)
    view = [1] * len(shape)
    view[1] = shape[1]
    check_op("BiasAdd", {"X": x, "B": b}, t(x) + t(b).reshape(view))


@settings(max_examples=20)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=5).map(tuple),
       seed=st.integers(0, 1000), affine=st.booleans(), eps=st.sampled_from([1e-5, 1e-3]))
def test_batch_norm_matches_torch(shape: tuple, seed: int, affine: bool, eps: float) -> None:
    c = shape[1]
    x = rand(shape, seed)
    rng = np.random.default_rng(seed)
    mean, var = rng.standard_normal(c), rng.random(c) + 0.05
    gamma, beta = (rng.standard_normal(c), rng.standard_normal(c)) if affine else (None, None)
    want = F.batch_norm(t(x), torch.tensor(mean, dtype=torch.float32),
                        torch.tensor(var, dtype=torch.float32),
                        None if gamma is None else torch.tensor(gamma, dtype=torch.float32),
                        None if beta is None else torch.tensor(beta, dtype=torch.float32),
                        training=False, eps=eps)
    low = check_op("BatchNorm", {"X": x}, want, mean=mean, var=var, gamma=gamma, beta=beta,
                   eps=eps)
    assert set(low.consts) == {"bn_scale", "bn_shift"}
    assert all(v.dtype == np.float32 and v.shape == (c,) for v in low.consts.values())


def test_batch_norm_folds_in_float64() -> None:
    mean, var = np.array([1.0, -2.0]), np.array([0.5, 4.0])
    gamma, beta = np.array([2.0, 3.0]), np.array([0.1, 0.2])
    low = lower("BatchNorm", [("X", (1, 2, 3))], mean=mean, var=var, gamma=gamma, beta=beta,
                eps=1e-5)
    scale = gamma / np.sqrt(var + 1e-5)
    np.testing.assert_array_equal(low.consts["bn_scale"], scale.astype(np.float32))
    np.testing.assert_array_equal(low.consts["bn_shift"], (beta - mean * scale).astype(np.float32))
    assert ollie.format(low.expr).endswith(
        "L<i0=0:1, i1=0:2, i2=0:3> X[i0, i1, i2] * bn_scale[i1] + bn_shift[i1]\n")


def test_batch_norm_constant_names_avoid_the_input() -> None:
    low = lower("BatchNorm", [("bn_scale", (1, 2))], mean=[0, 0], var=[1, 1])
    assert set(low.consts) == {"bn_scale_1", "bn_shift"}
