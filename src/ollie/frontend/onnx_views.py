"""Converters of ONNX ``Slice``, ``Split``, ``Pad``, ``Expand``, ``ReduceSum`` and
``ReduceMean`` (registered into :data:`ollie.frontend.onnx_ops.CONVERTERS` on import) to the
graph operators the torch frontend makes of the same calls (:mod:`ollie.lower.window_ops`):
a multi-axis ``Slice`` becomes one ``Slice`` per sliced axis, a ``Split`` one ``Slice`` per
output, and a ``ReduceMean`` over the spatial axes of a rank >= 3 tensor a
``GlobalAveragePool``.

Starts, ends, axes, steps, split sizes, pads and shapes must be constants; a negative step,
a padding mode other than ``constant``, a non-zero pad value, a negative pad, a rank-0
result or a non-float tensor keeps the node opaque (run by onnxruntime).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ollie.frontend.onnx_ops import Result, const_axes, register, require
from ollie.lower.window_ops import slice_bounds

if TYPE_CHECKING:
    from ollie.frontend.onnx_import import OnnxImporter

_FLOAT_TYPES = ("float32", "float64", "float16")


def _float_input(imp: OnnxImporter, node: Any) -> None:
    require(imp.dtype(node.input[0]) in _FLOAT_TYPES, "input is not floating point")


def _const_ints(imp: OnnxImporter, node: Any, k: int, what: str) -> list[int] | None:
    """Input ``k`` of ``node`` as ints (None when absent); Fallback when not a constant."""
    if len(node.input) <= k or not node.input[k]:
        return None
    v = imp.const(node.input[k])
    require(v is not None, f"{what} is not a constant")
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


@register("Slice")
def _slice(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    _float_input(imp, node)
    xs = imp.shape(node.input[0])
    if "starts" in a:  # opset < 10: attributes
        starts, ends = [int(v) for v in a["starts"]], [int(v) for v in a["ends"]]
        axes = [int(v) for v in a.get("axes", range(len(starts)))]
        steps = [1] * len(starts)
    else:
        starts = _const_ints(imp, node, 1, "starts") or []
        ends = _const_ints(imp, node, 2, "ends") or []
        axes = _const_ints(imp, node, 3, "axes") or list(range(len(starts)))
        steps = _const_ints(imp, node, 4, "steps") or [1] * len(starts)
    require(len(starts) == len(ends) == len(axes) == len(steps), "mismatched slice lists")
    require(all(s >= 1 for s in steps), "a step < 1")
    y = imp.value(node.input[0])
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        ax = _norm(axis, len(xs))
        lo, hi, length = slice_bounds(xs[ax], start, end, step)
        require(length >= 1, "an empty slice")
        if length == xs[ax]:
            continue
        y = imp.emit("Slice", node, [y], {"axis": ax, "start": lo, "end": hi, "step": step},
                     resolved=True)
    return [y]


@register("Split")
def _split(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    _float_input(imp, node)
    xs = imp.shape(node.input[0])
    ax = _norm(int(a.get("axis", 0)), len(xs))
    n = len(node.output)
    sizes = _const_ints(imp, node, 1, "split") or [int(v) for v in a.get("split", ())]
    if not sizes:
        part = -(-xs[ax] // int(a.get("num_outputs", n)))
        sizes = [min(part, xs[ax] - k * part) for k in range(n)]
    require(len(sizes) == n and sum(sizes) == xs[ax] and min(sizes) >= 1,
            f"split sizes {sizes} do not cover axis {ax} of {list(xs)}")
    x = imp.value(node.input[0])
    out: list[str | None] = []
    start = 0
    for k, size in enumerate(sizes):
        if not node.output[k]:
            out.append(None)
        elif size == xs[ax]:
            out.append(x)
        else:
            out.append(imp.emit("Slice", node, [x], {"axis": ax, "start": start,
                                                     "end": start + size, "step": 1},
                                resolved=True, hint=node.output[k]))
        start += size
    return out


@register("Pad")
def _pad(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    _float_input(imp, node)
    mode = a.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    require(mode == "constant", f"padding mode {mode!r}")
    rank = len(imp.shape(node.input[0]))
    if "pads" in a:  # opset < 11
        pads, value = [int(v) for v in a["pads"]], float(a.get("value", 0.0))
        axes = list(range(rank))
    else:
        pads = _const_ints(imp, node, 1, "pads") or []
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            v = imp.const(node.input[2])
            require(v is not None, "the pad value is not a constant")
            flat = np.asarray(v).reshape(-1)
            value = float(flat[0]) if flat.size else 0.0
        axes = [_norm(x, rank) for x in (_const_ints(imp, node, 3, "axes") or range(rank))]
    require(value == 0.0, f"padding with {value}, not 0")
    require(len(pads) == 2 * len(axes) and min(pads, default=0) >= 0,
            "negative or malformed pads")
    full = [0] * (2 * rank)
    for k, ax in enumerate(axes):
        full[ax], full[rank + ax] = pads[k], pads[len(axes) + k]
    if not any(full):
        return [imp.value(node.input[0])]
    return [imp.emit("Pad", node, node.input[:1], {"pads": tuple(full)})]


@register("Expand")
def _expand(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    _float_input(imp, node)
    shape = _const_ints(imp, node, 1, "shape")
    require(shape is not None and all(d >= 1 for d in shape), "shape not constant / not >= 1")
    xs = imp.shape(node.input[0])
    target = tuple(int(d) for d in np.broadcast_shapes(xs, tuple(shape)))  # type: ignore[arg-type]
    if target == xs:
        return [imp.value(node.input[0])]
    return [imp.emit("Expand", node, node.input[:1], {"shape": target})]


def _reduce(op: str) -> Any:
    def convert(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
        _float_input(imp, node)
        rank = len(imp.shape(node.input[0]))
        axes = const_axes(imp, node, a)
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [imp.value(node.input[0])]
            axes = list(range(rank))
        keep = int(a.get("keepdims", 1))
        norm = sorted({_norm(int(x), rank) for x in axes})
        require(bool(keep) or len(norm) < rank, "a rank-0 result")
        if op == "ReduceMean" and rank >= 3 and norm == list(range(2, rank)):
            # the mean over the spatial axes, as the torch frontend imports it
            xs = imp.shape(node.input[0])
            y = imp.emit("GlobalAveragePool", node, node.input[:1], {},
                         hint=None if keep else f"{node.output[0]}_gap")
            return [y if keep else imp.emit("Reshape", node, [y], {"shape": xs[:2]},
                                            resolved=True)]
        return [imp.emit(op, node, node.input[:1], {"axes": tuple(norm), "keepdims": keep})]

    return convert


register("ReduceSum")(_reduce("ReduceSum"))
register("ReduceMean")(_reduce("ReduceMean"))
