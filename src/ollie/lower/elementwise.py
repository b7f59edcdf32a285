"""Lowerings of element-wise operators: unary functions, broadcast binary arithmetic,
``BiasAdd`` and inference ``BatchNorm``.

Unary (one traversal iterator per dimension, no summation)::

    L<n, c, h, w> relu(X[n, c, h, w])
    L<i0, i1> max(X[i0, i1], 0) + 0.01 * min(X[i0, i1], 0)          # LeakyRelu(alpha=0.01)

Binary operators follow numpy broadcasting: shapes are right-aligned and an input dimension of
size 1 reads index 0::

    L<i0, i1, i2> A[i0, i1, i2] + B[0, i2]                            # A [2, 3, 4], B [1, 4]

BatchNorm (inference) folds its statistics at lowering time, in float64, into two constant
tensors ``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale``::

    L<n, c, h, w> X[n, c, h, w] * bn_scale[c] + bn_shift[c]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ollie.errors import ShapeError, UnsupportedError
from ollie.ir import BinOp, Call, Const, Node, neg, var
from ollie.ir.index import var as index_var
from ollie.lower.common import (
    Input,
    Lowered,
    broadcast_indices,
    broadcast_shapes,
    check_rank,
    finish,
    generic_names,
    iters,
    read,
    scope,
    shape_error,
    take_inputs,
    unique_name,
)

Lowering = Callable[..., Lowered]


def _pointwise(op: str, x: Input, build: Callable[[Node], Node]) -> Lowered:
    names = generic_names(len(x[1]))
    body = build(read(x[0], [var(nm) for nm in names]))
    return finish(op, (x,), scope(iters(names, x[1]), (), body))


def _make_unary(op: str, build: Callable[[Node], Node]) -> Lowering:
    def lowering(inputs: Sequence[Input]) -> Lowered:
        (x,) = take_inputs(op, inputs, ("X",))
        return _pointwise(op, x, build)

    lowering.__name__ = op.lower()
    lowering.__qualname__ = op.lower()
    lowering.__doc__ = f"``{op}``: element-wise over X of any rank."
    return lowering


def _call(fn: str) -> Callable[[Node], Node]:
    return lambda x: Call(fn, (x,))


UNARY_LOWERINGS: dict[str, Lowering] = {
    "Relu": _make_unary("Relu", _call("relu")),
    "Tanh": _make_unary("Tanh", _call("tanh")),
    "Sigmoid": _make_unary("Sigmoid", _call("sigmoid")),
    "Exp": _make_unary("Exp", _call("exp")),
    "Log": _make_unary("Log", _call("log")),
    "Sqrt": _make_unary("Sqrt", _call("sqrt")),
    "Abs": _make_unary("Abs", _call("abs")),
    "Neg": _make_unary("Neg", neg),
    "Identity": _make_unary("Identity", lambda x: x),
}


def leaky_relu(inputs: Sequence[Input], *, alpha: object = 0.01) -> Lowered:
    """``LeakyRelu``: ``max(x, 0) + alpha * min(x, 0)``."""
    op = "LeakyRelu"
    (x,) = take_inputs(op, inputs, ("X",))
    try:
        a = float(alpha)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UnsupportedError(f"{op}: attribute 'alpha' must be a number, got {alpha!r}") \
            from None
    if not np.isfinite(a):
        raise UnsupportedError(f"{op}: attribute 'alpha' must be finite, got {alpha!r}")

    def build(v: Node) -> Node:
        pos = Call("max", (v, Const(0.0)))
        if a == 0.0:
            return pos
        return BinOp("+", pos, BinOp("*", Const(a), Call("min", (v, Const(0.0)))))

    return _pointwise(op, x, build)


def _make_binary(op: str, build: Callable[[Node, Node], Node]) -> Lowering:
    def lowering(inputs: Sequence[Input]) -> Lowered:
        a, b = take_inputs(op, inputs, ("A", "B"))
        out = broadcast_shapes(op, {"A": a, "B": b})
        names = generic_names(len(out))
        idx = [var(nm) for nm in names]
        body = build(read(a[0], broadcast_indices(a[1], idx)),
                     read(b[0], broadcast_indices(b[1], idx)))
        return finish(op, (a, b), scope(iters(names, out), (), body))

    lowering.__name__ = op.lower()
    lowering.__qualname__ = op.lower()
    lowering.__doc__ = f"``{op}``: element-wise with numpy broadcasting."
    return lowering


def _binop(sym: str) -> Callable[[Node, Node], Node]:
    return lambda x, y: BinOp(sym, x, y)


def _fn2(fn: str) -> Callable[[Node, Node], Node]:
    return lambda x, y: Call(fn, (x, y))


BINARY_LOWERINGS: dict[str, Lowering] = {
    "Add": _make_binary("Add", _binop("+")),
    "Sub": _make_binary("Sub", _binop("-")),
    "Mul": _make_binary("Mul", _binop("*")),
    "Div": _make_binary("Div", _binop("/")),
    "Max": _make_binary("Max", _fn2("max")),
    "Min": _make_binary("Min", _fn2("min")),
}


def bias_add(inputs: Sequence[Input]) -> Lowered:
    """``BiasAdd``: X [N, C, ...] + B [C] broadcast along dimension 1."""
    op = "BiasAdd"
    x, b = take_inputs(op, inputs, ("X", "B"))
    sx = x[1]
    if len(sx) < 2:
        raise shape_error(op, "X must have rank >= 2 (N, C, ...)", X=x)
    (nb,) = check_rank(op, "B", b, 1)
    if nb != sx[1]:
        raise shape_error(op, f"B must have X's {sx[1]} channels", X=x, B=b)
    names = generic_names(len(sx))
    idx = [var(nm) for nm in names]
    body = BinOp("+", read(x[0], idx), read(b[0], (idx[1],)))
    return finish(op, (x, b), scope(iters(names, sx), (), body))


def _channel_vector(op: str, attr: str, value: object, channels: int,
                    default: float | None) -> np.ndarray:
    if value is None:
        if default is None:
            raise UnsupportedError(f"{op}: attribute '{attr}' is required")
        return np.full(channels, default, dtype=np.float64)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be an array of numbers") from None
    if arr.shape != (channels,):
        raise ShapeError(f"{op}: attribute '{attr}' must have shape [{channels}] (X's channels),"
                         f" got {list(arr.shape)}")
    return arr


def batch_norm(inputs: Sequence[Input], *, mean: object = None, var: object = None,
               gamma: object = None, beta: object = None, eps: object = 1e-5) -> Lowered:
    """``BatchNorm`` (inference) over X [N, C, ...]: ``x * scale[c] + shift[c]`` with
    ``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale`` folded at lowering
    time in float64 (``gamma`` defaults to ones, ``beta`` to zeros)."""
    op = "BatchNorm"
    (x,) = take_inputs(op, inputs, ("X",))
    sx = x[1]
    if len(sx) < 2:
        raise shape_error(op, "X must have rank >= 2 (N, C, ...)", X=x)
    ch = sx[1]
    mu = _channel_vector(op, "mean", mean, ch, None)
    sigma2 = _channel_vector(op, "var", var, ch, None)
    g = _channel_vector(op, "gamma", gamma, ch, 1.0)
    bt = _channel_vector(op, "beta", beta, ch, 0.0)
    try:
        e = float(eps)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UnsupportedError(f"{op}: attribute 'eps' must be a number, got {eps!r}") from None
    denom = sigma2 + e
    if not np.all(np.isfinite(denom)) or np.any(denom <= 0):
        raise UnsupportedError(f"{op}: attribute 'var' + eps must be positive and finite")
    scale = g / np.sqrt(denom)
    shift = bt - mu * scale
    s_name = unique_name("bn_scale", [x[0]])
    t_name = unique_name("bn_shift", [x[0], s_name])
    names = generic_names(len(sx))
    idx = [index_var(nm) for nm in names]  # ``var`` is an attribute here
    body = BinOp("+", BinOp("*", read(x[0], idx), read(s_name, (idx[1],))),
                 read(t_name, (idx[1],)))
    root = scope(iters(names, sx), (), body)
    return finish(op, (x,), root, {s_name: scale, t_name: shift})

