"""Strided views and shared helpers for emitting ONNX nodes (:mod:`ollie.backends.onnxrt.expr`,
:mod:`ollie.backends.onnxrt.region`).

:func:`view_read` turns a strided view of a tensor's flat storage into ONNX operators: a bare
``Reshape`` (then ``Transpose`` / ``Expand`` where needed) when the view reads the tensor whole
as a permutation of its row-major layout, else a ``Gather`` at constant positions computed
here with numpy. Sizes are bounded by :data:`MAX_ELEMENTS` (a larger gather raises
:class:`~ollie.errors.UnsupportedError`; the kernel then ends its ONNX Runtime region).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ollie.errors import UnsupportedError
from ollie.program.kernel import View

MAX_ELEMENTS = 1 << 23
"""Largest grid (product of a scope's iterator sizes over the axes a value spans), unless the
scope's own result is larger, and largest constant gather index this module and
:mod:`ollie.backends.onnxrt.expr` emit; beyond it the kernel stays outside the region."""


class Emitter(Protocol):
    """What these modules need from a graph builder (:class:`ollie.backends.onnxrt.build.Builder`):
    ``shapes`` maps each ONNX value to its static shape."""

    shapes: dict[str, tuple[int, ...]]

    def node(self, op: str, inputs: Sequence[str], base: str, **attrs: object) -> str: ...

    def const(self, name: str, value: np.ndarray | None = None) -> str: ...

    def reshape(self, name: str, shape: Sequence[int]) -> str: ...


def check_size(n: int, what: str, at_least: int = 0) -> None:
    """Raise :class:`~ollie.errors.UnsupportedError` when ``n`` exceeds :data:`MAX_ELEMENTS`
    and ``at_least`` (a grid may be as large as the tensor it computes)."""
    if n > max(MAX_ELEMENTS, at_least):
        raise UnsupportedError(f"{what} of {n} elements exceeds {max(MAX_ELEMENTS, at_least)} "
                               "for an ONNX region")


def int_array(values: Sequence[int]) -> np.ndarray:
    """``values`` as an int64 array (an ONNX shape or index constant)."""
    return np.asarray(list(values), dtype=np.int64)


def out_node(b: Emitter, op: str, inputs: Sequence[str], shape: tuple[int, ...],
                base: str, **attrs: object) -> str:
    """A node ``op`` of ``b`` whose output has static ``shape`` (recorded in ``b.shapes``)."""
    y = b.node(op, inputs, base, **attrs)
    b.shapes[y] = shape
    return y


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``shapes`` (of equal rank, sizes 1 or n) broadcast to."""
    return tuple(max(dims) for dims in zip(*shapes, strict=True))


# ------------------------------------------------------------------------------ views


def _permuted(view: View, numel: int) -> list[int] | None:
    """The dimensions of ``view`` it steps through (size > 1, stride > 0), outermost first in
    the tensor's memory, when ``view`` reads a ``numel``-element tensor whole as a permutation
    of its row-major layout (broadcast over stride-0 dimensions); else None."""
    moving = [d for d, (n, s) in enumerate(zip(view.sizes, view.strides, strict=True))
              if n != 1 and s != 0]
    order = sorted(moving, key=lambda d: -view.strides[d])
    expect = 1
    for d in reversed(order):
        if view.strides[d] != expect:
            return None
        expect *= view.sizes[d]
    return order if view.offset == 0 and expect == numel else None


def view_gathers(view: View | None, numel: int) -> bool:
    """Whether :func:`view_read` reads ``view`` of a ``numel``-element tensor with a
    ``Gather`` (not a ``Reshape`` / ``Transpose`` / ``Expand``)."""
    return view is not None and _permuted(view, numel) is None


def view_positions(view: View, numel: int) -> np.ndarray:
    """The flat positions (int64, shape ``view.sizes``) ``view`` reads in a tensor of
    ``numel`` elements; UnsupportedError when one lies outside it."""
    pos = np.full((1,) * len(view.sizes), view.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(view.sizes, view.strides, strict=True)):
        shape = [1] * len(view.sizes)
        shape[d] = n
        pos = pos + np.arange(n, dtype=np.int64).reshape(shape) * s
    pos = np.broadcast_to(pos, tuple(view.sizes))
    if int(pos.min(initial=0)) < 0 or int(pos.max(initial=0)) >= numel:
        raise UnsupportedError("a view reads outside its tensor")
    return pos


def view_read(b: Emitter, name: str, view: View | None) -> str:
    """The ONNX value of shape ``view.sizes`` that ``view`` reads from the flat storage of
    ``name`` (``name`` itself when ``view`` is None)."""
    if view is None:
        return name
    numel = math.prod(b.shapes[name])
    sizes = tuple(view.sizes)
    order = _permuted(view, numel)
    if order is not None:
        # the tensor's memory as the dimensions it steps through, permuted into view order,
        # broadcast over stride-0 ones
        y = b.reshape(name, tuple(sizes[d] for d in order))
        moving = sorted(order)
        if order != moving:
            perm = [order.index(d) for d in moving]
            y = out_node(b, "Transpose", [y], tuple(sizes[d] for d in moving), "transpose",
                        perm=perm)
        narrow = tuple(n if d in order else 1 for d, n in enumerate(sizes))
        y = b.reshape(y, narrow)
        if narrow != sizes:
            y = out_node(b, "Expand", [y, b.const("sizes", int_array(sizes))], sizes, "expand")
        return y
    check_size(math.prod(sizes), "a strided view")
    pos = view_positions(view, numel)
    flat = b.reshape(name, (numel,))
    return out_node(b, "Gather", [flat, b.const("positions", np.ascontiguousarray(pos))], sizes,
                   "view", axis=0)


__all__ = ["MAX_ELEMENTS", "Emitter", "broadcast", "check_size", "int_array", "out_node",
           "view_gathers", "view_positions", "view_read"]
