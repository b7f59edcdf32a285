"""Errors of the lowering dispatcher, and properties common to every registered lowering."""

from __future__ import annotations

import numpy as np
import pytest

import ollie
from ollie.errors import OllieError, ShapeError, UnsupportedError
from ollie.lower import LOWERINGS, OPAQUE_OPS, Lowered, lower

# One valid call per non-opaque operator kind.
EXAMPLES: dict[str, tuple[list, dict]] = {
    "Conv2d": ([("X", (1, 2, 5, 5)), ("W", (3, 2, 3, 3)), ("B", (3,))], {"padding": 1}),
    "ConvTranspose2d": ([("X", (1, 2, 3, 3)), ("W", (2, 3, 2, 2))], {"stride": 2}),
    "MatMul": ([("A", (2, 3)), ("B", (3, 4))], {}),
    "BatchMatMul": ([("A", (2, 2, 3)), ("B", (2, 3, 4))], {}),
    "Gemm": ([("A", (2, 3)), ("B", (3, 4)), ("C", (4,))], {"alpha": 2.0}),
    "G2BMM": ([("Q", (1, 6, 3)), ("K", (1, 6, 3))], {"width": 1, "dilation": 2}),
    "GBMM": ([("S", (1, 6, 3)), ("V", (1, 6, 2))], {"width": 1}),
    **{k: ([("X", (2, 3))], {}) for k in
       ("Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Abs", "Neg", "Identity")},
    "LeakyRelu": ([("X", (2, 3))], {"alpha": 0.1}),
    **{k: ([("A", (2, 3)), ("B", (3,))], {}) for k in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
    "BiasAdd": ([("X", (2, 3, 4)), ("B", (3,))], {}),
    "BatchNorm": ([("X", (2, 3, 4))], {"mean": [0, 1, 2], "var": [1, 2, 3]}),
    "Reshape": ([("X", (2, 3, 4))], {"shape": (4, -1)}),
    "Flatten": ([("X", (2, 3, 4))], {"axis": 2}),
    "Transpose": ([("X", (2, 3, 4))], {"perm": (2, 0, 1)}),
    "Concat": ([("X", (2, 3)), ("Y", (2, 1))], {"axis": 1}),
    "Slice": ([("X", (2, 6))], {"axis": -1, "start": 1, "end": 6, "step": 2}),
    "Pad": ([("X", (2, 3))], {"pads": (0, 1, 2, 0)}),
    "Expand": ([("X", (1, 3))], {"shape": (2, 1)}),
    "Unfold": ([("X", (2, 6))], {"axis": 1, "size": 3, "step": 2}),
    "ReduceSum": ([("X", (2, 3, 4))], {"axes": (0, 2), "keepdims": 0}),
    "ReduceMean": ([("X", (2, 3, 4))], {"axes": (-1,)}),
    "AvgPool2d": ([("X", (1, 2, 5, 5))], {"kernel_size": 2}),
    "GlobalAveragePool": ([("X", (1, 2, 5, 5))], {}),
}


def test_every_registered_kind_has_an_example() -> None:
    assert set(EXAMPLES) | OPAQUE_OPS == set(LOWERINGS)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_lowered_is_verified_and_round_trips(kind: str) -> None:
    inputs, attrs = EXAMPLES[kind]
    low = lower(kind, inputs, **attrs)
    assert isinstance(low, Lowered)
    names = {n for n, _ in inputs} | set(low.consts)
    assert set(low.expr.inputs) == names
    assert low.expr.shape == low.output_shape
    assert ollie.parse(ollie.format(low.expr)) == low.expr
    assert all(c.dtype == np.float32 for c in low.consts.values())
    with pytest.raises(AttributeError):
        low.expr = low.expr  # type: ignore[misc]  # frozen


def test_unknown_operator() -> None:
    with pytest.raises(UnsupportedError, match="unknown operator 'Frobnicate'"):
        lower("Frobnicate", [("X", (2,))])


@pytest.mark.parametrize(("kind", "inputs", "attrs", "match"), [
    ("Conv2d", [("X", (1, 2, 5, 5)), ("W", (3, 2, 3, 3))], {"bogus": 1}, "Conv2d.*'bogus'"),
    ("Conv2d", [("X", (1, 2, 5, 5)), ("W", (3, 2, 3, 3))], {"stride": 0}, "Conv2d.*'stride'"),
    ("Conv2d", [("X", (1, 2, 5, 5)), ("W", (3, 2, 3, 3))], {"padding": (1, 1, 1)},
     "Conv2d.*'padding'"),
    ("Conv2d", [("X", (1, 2, 5, 5)), ("W", (3, 2, 3, 3))], {"groups": 0}, "Conv2d.*'groups'"),
    ("ConvTranspose2d", [("X", (1, 2, 3, 3)), ("W", (2, 3, 2, 2))],
     {"stride": 2, "output_padding": 2}, "ConvTranspose2d.*'output_padding'"),
    ("Gemm", [("A", (2, 3)), ("B", (3, 4))], {"transA": 2}, "Gemm.*'transA'"),
    ("G2BMM", [("Q", (1, 6, 3)), ("K", (1, 6, 3))], {}, "G2BMM.*'width'"),
    ("Transpose", [("X", (2, 3))], {"perm": (0, 0)}, "Transpose.*'perm'"),
    ("Reshape", [("X", (2, 3))], {"shape": (-1, -1)}, "Reshape.*'shape'"),
    ("Concat", [("X", (2, 3))], {"axis": 2}, "Concat.*'axis'"),
    ("BatchNorm", [("X", (2, 3))], {"mean": [0, 0, 0]}, "BatchNorm.*'var'"),
    ("BatchNorm", [("X", (2, 3))], {"mean": [0, 0, 0], "var": [-1, 1, 1]}, "BatchNorm.*'var'"),
])
def test_unsupported_attributes(kind: str, inputs: list, attrs: dict, match: str) -> None:
    with pytest.raises(UnsupportedError, match=match):
        lower(kind, inputs, **attrs)


@pytest.mark.parametrize(("kind", "inputs", "attrs", "match"), [
    ("Conv2d", [("X", (1, 2, 5)), ("W", (3, 2, 3, 3))], {}, r"Conv2d.*'X'.*\[1, 2, 5\]"),
    ("Conv2d", [("X", (1, 2, 5, 5)), ("W", (3, 3, 3, 3))], {}, r"Conv2d.*\[3, 3, 3, 3\]"),
    ("Conv2d", [("X", (1, 4, 5, 5)), ("W", (3, 2, 3, 3))], {"groups": 2}, "Conv2d.*groups"),
    ("Conv2d", [("X", (1, 2, 2, 2)), ("W", (3, 2, 3, 3))], {}, r"Conv2d.*empty output"),
    ("Conv2d", [("X", (1, 2, 5, 5)), ("W", (3, 2, 3, 3)), ("B", (4,))], {}, r"Conv2d.*\[4\]"),
    ("Conv2d", [("X", (1, 2, 5, 5))], {}, "Conv2d: expected 2 to 3 input"),
    ("ConvTranspose2d", [("X", (1, 2, 3, 3)), ("W", (3, 3, 2, 2))], {}, "ConvTranspose2d"),
    ("MatMul", [("A", (2, 3)), ("B", (4, 5))], {}, r"MatMul.*\[2, 3\].*\[4, 5\]"),
    ("MatMul", [("A", (2, 2, 3)), ("B", (3, 3, 4))], {}, r"MatMul.*batch"),
    ("Gemm", [("A", (2, 3)), ("B", (3, 4)), ("C", (3,))], {}, r"Gemm.*C"),
    ("G2BMM", [("Q", (1, 6, 3)), ("K", (1, 5, 3))], {"width": 1}, r"G2BMM.*\[1, 5, 3\]"),
    ("GBMM", [("S", (1, 6, 4)), ("V", (1, 6, 2))], {}, "GBMM"),
    ("GBMM", [("S", (1, 6, 5)), ("V", (1, 6, 2))], {"width": 1}, "GBMM"),
    ("Add", [("A", (2, 3)), ("B", (4,))], {}, r"Add.*\[2, 3\].*\[4\]"),
    ("BiasAdd", [("X", (2, 3)), ("B", (2,))], {}, "BiasAdd"),
    ("Reshape", [("X", (2, 3))], {"shape": (4, -1)}, r"Reshape.*\[2, 3\]"),
    ("Concat", [("X", (2, 3)), ("Y", (3, 3))], {"axis": 1}, r"Concat.*'Y'"),
    ("Relu", [("X", (0, 3))], {}, "Relu.*non-positive"),
    ("Relu", [("X", ())], {}, "Relu.*rank 0"),
    ("Relu", [("1X", (2,))], {}, "Relu.*name"),
    ("Relu", [("relu", (2,))], {}, "Relu.*name"),
    ("Mul", [("X", (2,)), ("X", (3,))], {}, "Mul.*'X'.*twice"),
    ("BatchNorm", [("X", (2, 3))], {"mean": [0, 0], "var": [1, 1]}, "BatchNorm.*'mean'"),
])
def test_shape_errors(kind: str, inputs: list, attrs: dict, match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        lower(kind, inputs, **attrs)


def test_errors_share_the_base_class() -> None:
    assert issubclass(ShapeError, OllieError) and issubclass(UnsupportedError, OllieError)
