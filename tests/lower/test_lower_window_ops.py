"""Slice / Pad / Expand / Unfold / ReduceSum / ReduceMean lowerings against torch, and the
reference executor (``ollie.graph.run_graph``) against the lowerings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_testutil import check_op, rand, t

import ollie
from ollie.errors import ShapeError, UnsupportedError
from ollie.graph import Graph, Node, run_graph
from ollie.lower import lower

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def _executor_agrees(op: str, x: np.ndarray, attrs: dict) -> None:
    g = Graph([("x", x.shape)], ["y"], [Node(op, ("x",), ("y",), attrs)]).infer_shapes()
    got = run_graph(g, {"x": torch.from_numpy(x)})["y"].numpy()
    low = g.lower_node(g.nodes[0])
    want = ollie.interpret(low.expr, {"x": x})
    assert got.shape == want.shape == tuple(low.output_shape) == g.shape("y")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=40)
@given(shapes, st.data(), st.integers(0, 99))
def test_slice_matches_python_slicing(shape: tuple, data: st.DataObject, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[axis]
    start = data.draw(st.integers(-size - 1, size - 1))
    end = data.draw(st.one_of(st.none(), st.integers(-size, size + 2)))
    step = data.draw(st.integers(1, 3))
    want = t(rand(shape, seed))[(slice(None),) * (axis % len(shape)) + (slice(start, end, step),)]
    x = rand(shape, seed)
    attrs = {"axis": axis, "start": start, "end": end, "step": step}
    if want.numel() == 0:
        with pytest.raises(ShapeError, match="empty slice"):
            lower("Slice", [("X", shape)], **attrs)
        return
    check_op("Slice", {"X": x}, want, **attrs)
    _executor_agrees("Slice", x, attrs)


def test_slice_reads_start_plus_step_times_i() -> None:
    low = lower("Slice", [("X", (2, 8, 3))], axis=1, start=1, end=7, step=2)
    assert ollie.format(low.expr).endswith("L<i0=0:2, i1=0:3, i2=0:3> X[i0, 2*i1 + 1, i2]\n")


@settings(max_examples=30)
@given(shapes, st.data(), st.integers(0, 99))
def test_pad_matches_torch(shape: tuple, data: st.DataObject, seed: int) -> None:
    rank = len(shape)
    pads = data.draw(st.lists(st.integers(0, 3), min_size=2 * rank, max_size=2 * rank))
    x = rand(shape, seed)
    torch_pads: list[int] = []
    for k in reversed(range(rank)):
        torch_pads += [pads[k], pads[rank + k]]
    check_op("Pad", {"X": x}, F.pad(t(x), torch_pads), pads=pads)
    _executor_agrees("Pad", x, {"pads": pads})


@settings(max_examples=30)
@given(shapes, st.data(), st.integers(0, 99))
def test_expand_matches_torch(shape: tuple, data: st.DataObject, seed: int) -> None:
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    ones = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    src = tuple(1 if o else d for o, d in zip(ones, shape, strict=True))
    x = rand(src, seed)
    target = (*lead, *shape)
    check_op("Expand", {"X": x}, t(x).expand(target), shape=target)
    _executor_agrees("Expand", x, {"shape": target})


def test_expand_broadcasts_both_ways_as_onnx() -> None:
    x = rand((3, 1), 2)
    check_op("Expand", {"X": x}, t(x).expand(3, 4), shape=(1, 4))
    with pytest.raises(ShapeError, match="broadcast"):
        lower("Expand", [("X", (3, 2))], shape=(4,))


@settings(max_examples=30)
@given(shapes, st.data(), st.integers(0, 99))
def test_unfold_matches_torch(shape: tuple, data: st.DataObject, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    size = data.draw(st.integers(1, shape[axis]))
    step = data.draw(st.integers(1, 3))
    x = rand(shape, seed)
    attrs = {"axis": axis, "size": size, "step": step}
    check_op("Unfold", {"X": x}, t(x).unfold(axis, size, step), **attrs)
    _executor_agrees("Unfold", x, attrs)


def test_unfold_window_past_the_axis_is_a_shape_error() -> None:
    with pytest.raises(ShapeError, match="window size 4"):
        lower("Unfold", [("X", (2, 3))], axis=1, size=4, step=1)


@settings(max_examples=40)
@given(shapes, st.data(), st.booleans(), st.booleans(), st.integers(0, 99))
def test_reduce_matches_torch(shape: tuple, data: st.DataObject, keep: bool, mean: bool,
                              seed: int) -> None:
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                              unique_by=lambda a: a % rank))
    op = "ReduceMean" if mean else "ReduceSum"
    x = rand(shape, seed)
    attrs = {"axes": axes, "keepdims": int(keep)}
    if len(axes) == rank and not keep:
        with pytest.raises(UnsupportedError, match="rank-0"):
            lower(op, [("X", shape)], **attrs)
        return
    fn = torch.mean if mean else torch.sum
    check_op(op, {"X": x}, fn(t(x), dim=axes, keepdim=keep), **attrs)
    _executor_agrees(op, x, attrs)


@pytest.mark.parametrize(("op", "attrs", "why"), [
    ("Slice", {"axis": 0, "start": 0, "end": 2, "step": 0}, "'step' must be >= 1"),
    ("Slice", {"axis": 2, "start": 0}, "out of range"),
    ("Pad", {"pads": (1, -1, 0, 0)}, "values >= 0"),
    ("Pad", {"pads": (1, 1)}, "must hold 4 values"),
    ("Expand", {"shape": (0, 3)}, "ints >= 1"),
    ("Unfold", {"axis": 0, "size": 0, "step": 1}, "must be >= 1"),
    ("ReduceSum", {"axes": ()}, "at least one axis"),
])
def test_bad_attributes_are_unsupported(op: str, attrs: dict, why: str) -> None:
    with pytest.raises(UnsupportedError, match=why):
        lower(op, [("X", (2, 3))], **attrs)
