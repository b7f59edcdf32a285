"""Interpreter argument errors: missing tensors, wrong shapes, bad sample positions."""

from __future__ import annotations

import numpy as np
import pytest

from ollie import ShapeError, interpret, parse

EXPR = parse("A: [2, 3]\nB: [3]\nUnused: [7]\nL<i=0:2> Sum<k=0:3> A[i, k] * B[k]")


def test_missing_tensor_names_it():
    with pytest.raises(ShapeError, match=r"'B'.*\[3\]"):
        interpret(EXPR, {"A": np.zeros((2, 3))})


def test_wrong_shape_names_tensor_and_shapes():
    with pytest.raises(ShapeError, match=r"'A'.*\[3, 2\].*\[2, 3\]"):
        interpret(EXPR, {"A": np.zeros((3, 2)), "B": np.zeros(3)})


def test_declared_but_unread_tensor_not_required():
    out = interpret(EXPR, {"A": np.ones((2, 3)), "B": np.ones(3)})
    np.testing.assert_array_equal(out, [3.0, 3.0])


@pytest.mark.parametrize("at", [
    np.zeros((2, 2), np.int64),  # wrong rank
    np.zeros(3, np.int64),  # not [P, rank]
    np.array([[0.5]]),  # not integers
    np.array([[2]]),  # outside the output
    np.array([[-1]]),
])
def test_bad_sample_positions(at):
    with pytest.raises(ShapeError):
        interpret(EXPR, {"A": np.ones((2, 3)), "B": np.ones(3)}, at=at)


def test_empty_sample():
    out = interpret(EXPR, {"A": np.ones((2, 3)), "B": np.ones(3)}, at=np.zeros((0, 1), int))
    assert out.shape == (0,) and out.dtype == np.float32
