"""Lowerings of pooling: ``AvgPool2d``, ``GlobalAveragePool``; the opaque ``MaxPool2d``
and ``Softmax``.

Average pooling is a window sum times the reciprocal of the divisor::

    L<n, c, h, w> Sum<r=0:3, s=0:3> X[n, c, 2*h + r - 1, 2*w + s - 1] * 0.1111111111111111

When the divisor is not the same at every output position (``count_include_pad=False`` with
padding, or ``ceil_mode=True`` windows running past the padded input) the reciprocals are a
constant tensor ``pool_rcp[Ho, Wo]`` computed at lowering time with PyTorch's divisor rule,
and the body reads ``X[...] * pool_rcp[h, w]``.

Opaque operators. ``MaxPool2d`` is kept as an OPAQUE operator: the expression language has
only summation, no max-reduction, and writing the window as nested ``max(...)`` calls would
read the zero of padding (a max over padded windows must ignore the padding, and ``0`` can
exceed every real value). ``Softmax`` is opaque too (a normalisation across a reduction
that the optimizer does not derive through). The registry lists both in ``OPAQUE_OPS`` and
their lowerings raise :class:`UnsupportedError`; graphs keep them as library operators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ollie.errors import UnsupportedError
from ollie.ir import BinOp, Const, Node, var
from ollie.lower.common import (
    Input,
    Lowered,
    check_rank,
    finish,
    int_tuple,
    iters,
    padding4,
    read,
    scope,
    shape_error,
    take_inputs,
    unique_name,
)

OPAQUE_OPS: frozenset[str] = frozenset({"MaxPool2d", "Softmax"})


def _out_size(size: int, k: int, s: int, p_lo: int, p_hi: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (``ceil_mode`` drops a last window that would start in
    the trailing padding)."""
    span = size + p_lo + p_hi - k
    if span < 0:
        return 0
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p_lo:
        out -= 1
    return out


def _divisors(size: int, out: int, k: int, s: int, p_lo: int, p_hi: int,
              count_include_pad: bool) -> np.ndarray:
    """Per-output-position divisor along one axis, as PyTorch's avg_pool computes it."""
    d = np.empty(out, dtype=np.int64)
    for o in range(out):
        start = o * s - p_lo
        end = min(start + k, size + p_hi)
        pool = end - start
        start, end = max(start, 0), min(end, size)
        d[o] = pool if count_include_pad else end - start
    return d


def avg_pool2d(inputs: Sequence[Input], *, kernel_size: object, stride: object = None,
               padding: object = 0, count_include_pad: bool = True,
               ceil_mode: bool = False) -> Lowered:
    """``AvgPool2d`` over X [N, C, H, W]; ``stride`` defaults to the kernel size, padding is
    an int, (ph, pw) or (top, left, bottom, right)."""
    op = "AvgPool2d"
    (x,) = take_inputs(op, inputs, ("X",))
    n_, c_, h_, w_ = check_rank(op, "X", x, 4)
    kh, kw = int_tuple(op, "kernel_size", kernel_size, 2)
    sh, sw = (kh, kw) if stride is None else int_tuple(op, "stride", stride, 2)
    pt, pl, pb, pr = padding4(op, padding)
    ho = _out_size(h_, kh, sh, pt, pb, bool(ceil_mode))
    wo = _out_size(w_, kw, sw, pl, pr, bool(ceil_mode))
    if ho < 1 or wo < 1:
        raise shape_error(op, f"empty output ({ho}x{wo}) for kernel {kh}x{kw}", X=x)
    div_h = _divisors(h_, ho, kh, sh, pt, pb, bool(count_include_pad))
    div_w = _divisors(w_, wo, kw, sw, pl, pr, bool(count_include_pad))
    div = np.outer(div_h, div_w)
    n, c, h, w, r, s = (var(nm) for nm in "nchwrs")
    window = read(x[0], (n, c, sh * h + r - pt, sw * w + s - pl))
    consts: dict[str, np.ndarray] = {}
    factor: Node
    if np.all(div == kh * kw):
        factor = Const(1.0 / (kh * kw))
    else:
        name = unique_name("pool_rcp", [x[0]])
        consts[name] = 1.0 / np.maximum(div, 1).astype(np.float64)
        factor = read(name, (h, w))
    root = scope(iters("nchw", (n_, c_, ho, wo)), iters("rs", (kh, kw)),
                 BinOp("*", window, factor))
    return finish(op, (x,), root, consts)


def global_average_pool(inputs: Sequence[Input]) -> Lowered:
    """``GlobalAveragePool``: X [N, C, D1, ...] -> [N, C, 1, ...], the mean over D1, ..."""
    op = "GlobalAveragePool"
    (x,) = take_inputs(op, inputs, ("X",))
    sx = x[1]
    if len(sx) < 3:
        raise shape_error(op, "X must have rank >= 3 (N, C, spatial...)", X=x)
    spatial = sx[2:]
    if len(spatial) == 2:
        out_names, red_names = ("h", "w"), ("r", "s")
    else:
        out_names = tuple(f"o{k}" for k in range(len(spatial)))
        red_names = tuple(f"r{k}" for k in range(len(spatial)))
    body = BinOp("*", read(x[0], (var("n"), var("c"), *(var(nm) for nm in red_names))),
                 Const(1.0 / math.prod(spatial)))
    root = scope(iters(("n", "c", *out_names), (sx[0], sx[1], *(1 for _ in spatial))),
                 iters(red_names, spatial), body)
    return finish(op, (x,), root)


def _opaque(op: str, why: str) -> Callable[..., Lowered]:
    def lowering(inputs: Sequence[Input], **attrs: object) -> Lowered:
        raise UnsupportedError(f"{op} is an opaque operator: {why}; it is kept as a library "
                               "operator and has no expression")

    lowering.__name__ = op.lower()
    lowering.__qualname__ = op.lower()
    lowering.__doc__ = f"``{op}``: opaque ({why}); always raises UnsupportedError."
    return lowering


max_pool2d = _opaque("MaxPool2d", "the expression language has no max-reduction and zero "
                     "padding would be wrong for padded windows")
softmax = _opaque("Softmax", "a normalisation over a reduction, not a sum of products")
