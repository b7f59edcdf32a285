"""Lowerings of strided reads, padding, broadcasting and reductions: ``Slice``, ``Pad``,
``Expand``, ``Unfold``, ``ReduceSum``, ``ReduceMean``.

Each is one scope whose body reads its input at affine positions; reads outside the input
give 0, which is exactly zero padding::

    L<i0=0:2, i1=0:3, i2=0:8> X[i0, 1 + 2*i1, i2]             # Slice axis 1, 1:7:2
    L<i0=0:2, i1=0:9> X[i0, i1 - 1]                            # Pad (0, 1, 0, 2): X [2, 6]
    L<i0=0:2, i1=0:6> X[0, i1]                                 # Expand [1, 6] -> [2, 6]
    L<i0=0:2, i1=0:3, i2=0:3> X[i0, 2*i1 + i2]                 # Unfold axis 1, size 3, step 2
    L<i0=0:2, i1=0:1> Sum<r0=0:6> X[i0, r0]                    # ReduceSum axes (1,), keepdims
    L<i0=0:2> Sum<r0=0:6> X[i0, r0] * 0.16666666666666666      # ReduceMean axes (1,)

The attributes follow ONNX where ONNX has the operator (``Pad``'s ``pads`` are all the
begins, then all the ends; ``Expand`` broadcasts both ways; ``ReduceSum`` / ``ReduceMean``
take ``axes`` and ``keepdims``), and PyTorch's ``Tensor.unfold`` for ``Unfold``. ``Slice``
takes one axis: ``start``, ``end``, ``step`` with Python's rules (negative values count from
the end, bounds are clamped; ``step >= 1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ollie.errors import UnsupportedError
from ollie.ir import BinOp, Const, Node, var
from ollie.ir.index import Affine, as_affine
from ollie.lower.common import (
    Input,
    Lowered,
    axis_index,
    broadcast_indices,
    broadcast_shapes,
    finish,
    generic_names,
    iters,
    read,
    scope,
    shape_error,
    take_inputs,
)


def _int(op: str, attr: str, value: object) -> int:
    if isinstance(value, bool):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be an int, got {value!r}")
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be an int, "
                               f"got {value!r}") from None


def _ints(op: str, attr: str, value: object) -> tuple[int, ...]:
    try:
        return tuple(_int(op, attr, v) for v in value)  # type: ignore[attr-defined]
    except TypeError:
        raise UnsupportedError(f"{op}: attribute '{attr}' must be a sequence of ints, "
                               f"got {value!r}") from None


def _one(op: str, inputs: Sequence[Input]) -> Input:
    """The single input ``X`` of ``op``."""
    (x,) = take_inputs(op, inputs, ("X",))
    assert x is not None
    return x


def slice_bounds(size: int, start: int | None, end: int | None, step: int
                 ) -> tuple[int, int, int]:
    """``(start, end, length)`` of ``range(size)[start:end:step]`` (Python's rules, step >= 1)."""
    lo, hi, _ = slice(start, end, step).indices(size)
    return lo, hi, max(0, -(-(hi - lo) // step))


def slice_(inputs: Sequence[Input], *, axis: object, start: object = 0,
           end: object = None, step: object = 1) -> Lowered:
    """``Slice`` of one axis: output position ``i`` reads ``X[..., start + step*i, ...]``."""
    op = "Slice"
    x = _one(op, inputs)
    sx = x[1]
    a = axis_index(op, "axis", axis, len(sx))
    st = _int(op, "step", step)
    if st < 1:
        raise UnsupportedError(f"{op}: attribute 'step' must be >= 1, got {step!r}")
    lo, _, length = slice_bounds(sx[a], _int(op, "start", start),
                                 None if end is None else _int(op, "end", end), st)
    if length < 1:
        raise shape_error(op, f"empty slice {start}:{end}:{step} of axis {a}", X=x)
    out_shape = (*sx[:a], length, *sx[a + 1:])
    names = generic_names(len(sx))
    idx: list[Affine] = [var(nm) for nm in names]
    idx[a] = lo + st * idx[a]
    return finish(op, (x,), scope(iters(names, out_shape), (), read(x[0], idx)))


def pad(inputs: Sequence[Input], *, pads: object) -> Lowered:
    """``Pad`` with zeros: ``pads`` = (begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}),
    all >= 0."""
    op = "Pad"
    x = _one(op, inputs)
    sx = x[1]
    p = _ints(op, "pads", pads)
    rank = len(sx)
    if len(p) != 2 * rank or any(v < 0 for v in p):
        raise UnsupportedError(f"{op}: attribute 'pads'={pads!r} must hold {2 * rank} values "
                               ">= 0 (all begins, then all ends)")
    out_shape = tuple(d + p[k] + p[rank + k] for k, d in enumerate(sx))
    names = generic_names(rank)
    idx = [var(nm) - p[k] for k, nm in enumerate(names)]
    return finish(op, (x,), scope(iters(names, out_shape), (), read(x[0], idx)))


def expand(inputs: Sequence[Input], *, shape: object) -> Lowered:
    """``Expand`` (ONNX): X broadcast with ``shape``; dimensions of size 1 are repeated."""
    op = "Expand"
    x = _one(op, inputs)
    target = _ints(op, "shape", shape)
    if not target or any(d < 1 for d in target):
        raise UnsupportedError(f"{op}: attribute 'shape'={shape!r} must hold ints >= 1")
    out_shape = broadcast_shapes(op, {"X": x, "shape": target})
    names = generic_names(len(out_shape))
    idx = broadcast_indices(x[1], [var(nm) for nm in names])
    return finish(op, (x,), scope(iters(names, out_shape), (), read(x[0], idx)))


def unfold(inputs: Sequence[Input], *, axis: object, size: object, step: object) -> Lowered:
    """``Unfold`` (``Tensor.unfold``): windows of ``size`` along ``axis`` every ``step``; the
    window index replaces ``axis`` and the position in the window is a new last axis::

        Y[..., i, ..., j] = X[..., step*i + j, ...]
    """
    op = "Unfold"
    x = _one(op, inputs)
    sx = x[1]
    a = axis_index(op, "axis", axis, len(sx))
    sz, st = _int(op, "size", size), _int(op, "step", step)
    if sz < 1 or st < 1:
        raise UnsupportedError(f"{op}: attributes 'size' and 'step' must be >= 1, got "
                               f"size={size!r}, step={step!r}")
    if sz > sx[a]:
        raise shape_error(op, f"window size {sz} exceeds axis {a}", X=x)
    count = (sx[a] - sz) // st + 1
    out_shape = (*sx[:a], count, *sx[a + 1:], sz)
    names = generic_names(len(out_shape))
    idx: list[Affine] = [var(nm) for nm in names[:-1]]
    idx[a] = st * idx[a] + var(names[-1])
    return finish(op, (x,), scope(iters(names, out_shape), (), read(x[0], idx)))


def _reduce(op: str, x: Input, axes: object, keepdims: object, mean: bool) -> Lowered:
    sx = x[1]
    rank = len(sx)
    try:
        listed = list(axes)  # type: ignore[call-overload]
    except TypeError:
        listed = [axes]
    red = sorted({axis_index(op, "axes", _int(op, "axes", v), rank) for v in listed})
    if not red:
        raise UnsupportedError(f"{op}: attribute 'axes' must name at least one axis")
    keep = bool(keepdims)
    if not keep and len(red) == rank:
        raise UnsupportedError(f"{op}: reducing every axis without keepdims gives a rank-0 "
                               "tensor, which is not supported")
    kept = [k for k in range(rank) if k not in red]
    out_shape = tuple(1 if k in red else sx[k] for k in range(rank)) if keep else \
        tuple(sx[k] for k in kept)
    out_names = generic_names(len(out_shape))
    sum_names = tuple(f"r{k}" for k in range(len(red)))
    idx: list[Affine] = [as_affine(0)] * rank
    for k, ax in enumerate(red):
        idx[ax] = var(sum_names[k])
    for pos, ax in enumerate(kept):
        idx[ax] = var(out_names[ax if keep else pos])
    body: Node = read(x[0], idx)
    if mean:
        body = BinOp("*", body, Const(1.0 / math.prod(sx[k] for k in red)))
    root = scope(iters(out_names, out_shape), iters(sum_names, [sx[k] for k in red]), body)
    return finish(op, (x,), root)


def reduce_sum(inputs: Sequence[Input], *, axes: object, keepdims: object = 1) -> Lowered:
    """``ReduceSum`` over ``axes`` (``keepdims``: reduced axes stay, of size 1)."""
    x = _one("ReduceSum", inputs)
    return _reduce("ReduceSum", x, axes, keepdims, mean=False)


def reduce_mean(inputs: Sequence[Input], *, axes: object, keepdims: object = 1) -> Lowered:
    """``ReduceMean`` over ``axes``: the sum times the reciprocal of the reduced size."""
    x = _one("ReduceMean", inputs)
    return _reduce("ReduceMean", x, axes, keepdims, mean=True)
