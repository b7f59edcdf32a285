"""Reshape / Flatten / Transpose / Concat lowerings against torch."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_testutil import check_op, rand, t

import ollie
from ollie.lower import lower

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


def _factorisations(n: int, rank: int, draw: st.DrawFn) -> list[int]:
    dims = []
    for _ in range(rank - 1):
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        n //= d
    return [*dims, n]


@st.composite
def reshape_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int]]:
    shape = draw(shapes)
    target = _factorisations(math.prod(shape), draw(st.integers(1, 4)), draw)
    if draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return shape, target


@settings(max_examples=40)
@given(reshape_cases(), st.integers(0, 1000))
def test_reshape_matches_torch(case: tuple, seed: int) -> None:
    shape, target = case
    x = rand(shape, seed)
    check_op("Reshape", {"X": x}, t(x).reshape(target), shape=target)


def test_reshape_zero_copies_the_input_dimension() -> None:
    x = rand((2, 3, 4), 1)
    check_op("Reshape", {"X": x}, t(x).reshape(2, 12), shape=[0, -1])


def test_reshape_splits_aligned_blocks_without_div_mod_across_them() -> None:
    low = lower("Reshape", [("X", (2, 3, 4))], shape=(6, -1))
    assert ollie.format(low.expr).endswith("L<i0=0:6, i1=0:4> X[i0 / 3, i0 % 3, i1]\n")
    low = lower("Reshape", [("X", (4, 6))], shape=(2, 2, 3, 2))
    assert ollie.format(low.expr).endswith("X[2*n + c, 2*h + w]\n")


@settings(max_examples=25)
@given(shapes, st.data(), st.integers(0, 1000))
def test_flatten_matches_torch(shape: tuple, data: st.DataObject, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape)))
    a = axis + len(shape) if axis < 0 else axis
    x = rand(shape, seed)
    want = t(x).reshape(math.prod(shape[:a]), math.prod(shape[a:]))
    check_op("Flatten", {"X": x}, want, axis=axis)


@settings(max_examples=25)
@given(shapes, st.data(), st.integers(0, 1000))
def test_transpose_matches_torch(shape: tuple, data: st.DataObject, seed: int) -> None:
    perm = data.draw(st.permutations(range(len(shape))))
    x = rand(shape, seed)
    check_op("Transpose", {"X": x}, t(x).permute(*perm), perm=perm)


def test_transpose_default_reverses() -> None:
    x = rand((2, 3, 4), 3)
    check_op("Transpose", {"X": x}, t(x).permute(2, 1, 0))


@settings(max_examples=25)
@given(shapes, st.data(), st.integers(0, 1000))
def test_concat_matches_torch(shape: tuple, data: st.DataObject, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    count = data.draw(st.integers(1, 3))
    arrays = {}
    for k in range(count):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 3))
        arrays[f"X{k}"] = rand(tuple(s), seed + k)
    want = torch.cat([t(a) for a in arrays.values()], dim=axis)
    check_op("Concat", arrays, want, axis=axis)


def test_concat_form() -> None:
    low = lower("Concat", [("A", (2, 3)), ("B", (2, 2))], axis=1)
    assert ollie.format(low.expr).endswith("L<i0=0:2, i1=0:5> A[i0, i1] + B[i0, i1 - 3]\n")
