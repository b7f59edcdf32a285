"""The one table of operator lowerings, ``LOWERINGS``, and the dispatcher :func:`lower`.

``lower(kind, inputs, **attrs)`` looks ``kind`` up in ``LOWERINGS``, checks the input names and
shapes and the attribute names, and calls the lowering. Unknown operators, unknown attributes
and opaque operators (``OPAQUE_OPS``) raise :class:`~ollie.errors.UnsupportedError`; malformed
inputs raise :class:`~ollie.errors.ShapeError`.

    >>> low = lower("MatMul", [("A", (4, 3)), ("B", (3, 2))])
    >>> print(low.expr, end="")
    A: [4, 3]
    B: [3, 2]
    L<m=0:4, n=0:2> Sum<k=0:3> A[m, k] * B[k, n]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

from ollie.errors import UnsupportedError
from ollie.lower.common import Input, Lowered, normalize_inputs
from ollie.lower.conv import conv2d, conv_transpose2d
from ollie.lower.elementwise import (
    BINARY_LOWERINGS,
    UNARY_LOWERINGS,
    batch_norm,
    bias_add,
    leaky_relu,
)
from ollie.lower.matmul import batch_matmul, g2bmm, gbmm, gemm, matmul
from ollie.lower.pool import OPAQUE_OPS, avg_pool2d, global_average_pool, max_pool2d, softmax
from ollie.lower.shape_ops import concat, flatten, reshape, transpose
from ollie.lower.window_ops import expand, pad, reduce_mean, reduce_sum, slice_, unfold

LOWERINGS: dict[str, Callable[..., Lowered]] = {
    "Conv2d": conv2d,
    "ConvTranspose2d": conv_transpose2d,
    "MatMul": matmul,
    "BatchMatMul": batch_matmul,
    "Gemm": gemm,
    "G2BMM": g2bmm,
    "GBMM": gbmm,
    **UNARY_LOWERINGS,
    "LeakyRelu": leaky_relu,
    **BINARY_LOWERINGS,
    "BiasAdd": bias_add,
    "BatchNorm": batch_norm,
    "Reshape": reshape,
    "Flatten": flatten,
    "Transpose": transpose,
    "Concat": concat,
    "Slice": slice_,
    "Pad": pad,
    "Expand": expand,
    "Unfold": unfold,
    "ReduceSum": reduce_sum,
    "ReduceMean": reduce_mean,
    "AvgPool2d": avg_pool2d,
    "GlobalAveragePool": global_average_pool,
    "MaxPool2d": max_pool2d,
    "Softmax": softmax,
}


def _check_attrs(kind: str, fn: Callable[..., Lowered], attrs: dict[str, object]) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for name in attrs:
        if name not in known:
            listed = ", ".join(known) or "none"
            raise UnsupportedError(f"{kind}: unsupported attribute '{name}' "
                                   f"(supported: {listed})")
    missing = [n for n in known if params[n].default is inspect.Parameter.empty
               and n not in attrs]
    if missing:
        raise UnsupportedError(f"{kind}: missing required attribute '{missing[0]}'")


def lower(kind: str, inputs: Sequence[Input], **attrs: object) -> Lowered:
    """The expression of operator ``kind`` applied to ``inputs`` (``(name, shape)`` pairs)."""
    fn = LOWERINGS.get(kind)
    if fn is None:
        raise UnsupportedError(f"unknown operator '{kind}' (known: {', '.join(sorted(LOWERINGS))})")
    if kind in OPAQUE_OPS:
        return fn(inputs, **attrs)
    _check_attrs(kind, fn, attrs)
    return fn(normalize_inputs(kind, inputs), **attrs)
