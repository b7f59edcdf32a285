"""Lowerings of data-movement operators: ``Reshape``, ``Flatten``, ``Transpose``, ``Concat``.

Reshape maps each output position to the row-major flat index and back to an input position
with floor-division and modulo; the index expressions are then simplified with the iterator
ranges (``Affine.simplify``), which removes the div/mod wherever dimensions line up::

    L<i0=0:6, i1=0:4> X[i0 / 3, i0 % 3, i1]            # X [2, 3, 4] -> [6, 4]
    L<i0=0:4, i1=0:6> X[(6*i0 + i1) / 12, ((6*i0 + i1) / 4) % 3, (6*i0 + i1) % 4]

Concat along an axis is the sum of the inputs read at shifted positions: each output
position is inside exactly one input, and the other reads fall outside their tensors and
give 0, so the sum is exact::

    L<i0=0:2, i1=0:5> A[i0, i1] + B[i0, i1 - 3]       # A [2, 3], B [2, 2], axis 1
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ollie.errors import ShapeError, UnsupportedError
from ollie.ir import BinOp, Node, var
from ollie.ir.index import Affine, as_affine
from ollie.lower.common import (
    Input,
    Lowered,
    Shape,
    axis_index,
    finish,
    generic_names,
    iters,
    read,
    scope,
    shape_error,
    take_inputs,
)


def _strides(shape: Shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _blocks(a: Shape, b: Shape) -> list[tuple[int, int, int, int]]:
    """Split two shapes of equal size into aligned blocks ``(a_lo, a_hi, b_lo, b_hi)``: the
    row-major products of ``a[a_lo:a_hi]`` and ``b[b_lo:b_hi]`` are equal, so each block
    reshapes independently of the others."""
    pa, pb = [1], [1]  # prefix products
    for d in a:
        pa.append(pa[-1] * d)
    for d in b:
        pb.append(pb[-1] * d)
    out: list[tuple[int, int, int, int]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        i0, j0 = i, j
        if i < len(a):
            i += 1
        else:
            j += 1
        while pa[i] != pb[j]:  # advance the side with the smaller prefix (sizes are equal)
            if pa[i] < pb[j]:
                i += 1
            else:
                j += 1
        out.append((i0, i, j0, j))
    return out


def _reshape_expr(op: str, x: Input, out_shape: Shape) -> Lowered:
    sx = x[1]
    names = generic_names(len(out_shape))
    traversal = iters(names, out_shape)
    ranges = {it.name: it.range for it in traversal}
    idx: list[Affine] = []
    for a_lo, a_hi, b_lo, b_hi in _blocks(sx, out_shape):
        flat: Affine = as_affine(0)  # the block's row-major offset, from the output iterators
        for nm, st in zip(names[b_lo:b_hi], _strides(out_shape[b_lo:b_hi]), strict=True):
            flat = flat + st * var(nm)
        block = sx[a_lo:a_hi]
        for k, (d, st) in enumerate(zip(block, _strides(block), strict=True)):
            e = flat // st
            if k > 0:  # the block's leading index needs no modulo: flat < prod(block)
                e = e % d
            idx.append(e.simplify(ranges))
    return finish(op, (x,), scope(traversal, (), read(x[0], idx)))


def reshape(inputs: Sequence[Input], *, shape: object) -> Lowered:
    """``Reshape`` to ``shape`` (one ``-1`` inferred; ``0`` copies the input dimension at the
    same position, as in ONNX)."""
    op = "Reshape"
    (x,) = take_inputs(op, inputs, ("X",))
    sx = x[1]
    try:
        target = [int(d) for d in shape]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise UnsupportedError(f"{op}: attribute 'shape' must be a sequence of ints, "
                               f"got {shape!r}") from None
    if not target:
        raise UnsupportedError(f"{op}: attribute 'shape' must not be empty (rank-0 output)")
    if target.count(-1) > 1 or any(d < -1 for d in target):
        raise UnsupportedError(f"{op}: attribute 'shape'={target} may hold one -1 and no "
                               "other negative value")
    for k, d in enumerate(target):
        if d == 0:
            if k >= len(sx):
                raise UnsupportedError(f"{op}: attribute 'shape'={target}: 0 at position {k} "
                                       f"but X has rank {len(sx)}")
            target[k] = sx[k]
    total = math.prod(sx)
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        if total % known:
            raise shape_error(op, f"cannot infer -1 in shape {target}", X=x)
        target[target.index(-1)] = total // known
    if math.prod(target) != total:
        raise shape_error(op, f"target shape {target} has a different number of elements",
                          X=x)
    return _reshape_expr(op, x, tuple(target))


def flatten(inputs: Sequence[Input], *, axis: object = 1) -> Lowered:
    """``Flatten`` (ONNX): X -> [prod(shape[:axis]), prod(shape[axis:])]."""
    op = "Flatten"
    (x,) = take_inputs(op, inputs, ("X",))
    sx = x[1]
    a = axis_index(op, "axis", axis, len(sx), inclusive=True)
    return _reshape_expr(op, x, (math.prod(sx[:a]), math.prod(sx[a:])))


def transpose(inputs: Sequence[Input], *, perm: object = None) -> Lowered:
    """``Transpose``: output dimension ``i`` is input dimension ``perm[i]`` (default:
    reversed)."""
    op = "Transpose"
    (x,) = take_inputs(op, inputs, ("X",))
    sx = x[1]
    rank = len(sx)
    if perm is None:
        p = list(range(rank))[::-1]
    else:
        try:
            p = [int(v) for v in perm]  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise UnsupportedError(f"{op}: attribute 'perm' must be a sequence of ints, "
                                   f"got {perm!r}") from None
        p = [v + rank if v < 0 else v for v in p]
        if sorted(p) != list(range(rank)):
            raise UnsupportedError(f"{op}: attribute 'perm'={perm!r} is not a permutation "
                                   f"of the {rank} dimensions of X {list(sx)}")
    out_shape = tuple(sx[v] for v in p)
    names = generic_names(rank)
    idx: list[Affine] = [as_affine(0)] * rank
    for i, v in enumerate(p):
        idx[v] = var(names[i])
    return finish(op, (x,), scope(iters(names, out_shape), (), read(x[0], idx)))


def concat(inputs: Sequence[Input], *, axis: object) -> Lowered:
    """``Concat`` along ``axis``: the sum of the inputs read at shifted positions."""
    op = "Concat"
    if not inputs:
        raise ShapeError(f"{op}: expected at least one input, got none")
    first = inputs[0][1]
    rank = len(first)
    a = axis_index(op, "axis", axis, rank)
    for name, s in inputs:
        if len(s) != rank or any(d != e for k, (d, e) in enumerate(zip(s, first, strict=True))
                                 if k != a):
            raise shape_error(op, f"input '{name}' does not match the first input outside "
                              f"axis {a}", **{f"input{k}": t for k, t in enumerate(inputs)})
    total = int(np.sum([s[a] for _, s in inputs]))
    out_shape = (*first[:a], total, *first[a + 1:])
    names = generic_names(rank)
    idx = [var(nm) for nm in names]
    body: Node | None = None
    offset = 0
    for name, s in inputs:
        shifted = [*idx[:a], idx[a] - offset, *idx[a + 1:]]
        term = read(name, shifted)
        body = term if body is None else BinOp("+", body, term)
        offset += s[a]
    assert body is not None
    return finish(op, tuple(inputs), scope(iters(names, out_shape), (), body))
