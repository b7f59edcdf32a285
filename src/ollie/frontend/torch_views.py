"""Converters of ``aten`` slicing, padding, broadcasting and reduction operators (registered
into :data:`ollie.frontend.torch_ops.HANDLERS` on import):

* ``split.Tensor`` / ``split_with_sizes`` / ``chunk`` / ``unbind`` / ``narrow`` /
  ``slice.Tensor`` / ``select.int`` -> ``Slice`` (one per used result; ``select`` and
  ``unbind`` add a ``Reshape`` that drops the axis);
* ``expand`` / ``expand_as`` -> ``Expand``; ``pad`` (constant mode) / ``constant_pad_nd``
  with value 0 -> ``Pad``; ``unfold`` -> ``Unfold``;
* ``as_strided`` -> an opaque :func:`~ollie.graph.opaque.strided_window`: ``as_strided``
  reads its input's memory, so its result depends on the input's layout when traced (a
  Longformer's overlapping chunks of a transposed tensor); the window is taken over the
  input's values in that layout's order instead, which no program can change. An input whose
  traced layout is not a permutation of a dense one, or a window reaching outside its values,
  raises :class:`~ollie.errors.UnsupportedError` (it reads memory the graph does not hold);
* ``sum.dim_IntList`` -> ``ReduceSum``; ``mean.dim`` -> ``GlobalAveragePool`` over the
  spatial axes of a rank >= 3 tensor, else ``ReduceMean``;
* ``roll`` along given dimensions -> ``Slice``, ``Slice``, ``Concat`` per dimension.

Sizes come from the shapes ``torch.export`` recorded; anything else (a non-zero pad value,
negative padding, a rank-0 result, a non-float tensor) raises :class:`Fallback` and the node
stays opaque.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

from torch import fx

from ollie.errors import UnsupportedError
from ollie.frontend.torch_ops import (
    Fallback,
    Result,
    is_float,
    meta_val,
    norm_axis,
    out_shape,
    register,
    shape,
)
from ollie.graph.opaque import TensorRef, dtype_name, strided_window, torch_opaque_attrs
from ollie.lower.window_ops import slice_bounds

if TYPE_CHECKING:
    from ollie.frontend.torch_import import TorchImporter


def _float(node: fx.Node) -> None:
    if not is_float(node):
        raise Fallback("not a floating-point tensor")


def _slice(imp: TorchImporter, x: str, axis: int, start: int, end: int, step: int,
           hint: str) -> str:
    return imp.b.emit1("Slice", [x], {"axis": axis, "start": start, "end": end, "step": step},
                       hint)


def _drop_axis(imp: TorchImporter, y: str, target: tuple[int, ...], hint: str) -> str:
    if not target:
        raise Fallback("a rank-0 result")
    return imp.b.emit1("Reshape", [y], {"shape": target}, hint)


def _used_items(node: fx.Node) -> set[int]:
    """Indices of the results of ``node`` that its users read (all users are getitem)."""
    used: set[int] = set()
    for u in node.users:
        if u.target is not operator.getitem:
            raise Fallback("a list result used whole")
        used.add(int(u.args[1]))  # type: ignore[arg-type]
    return used


def _pieces(node: fx.Node, axis_arg: Any, rank: int) -> tuple[int, list[int]]:
    """(axis, size of each result along it) of a split from the recorded result shapes."""
    vals = node.meta.get("val")
    if not isinstance(vals, (list, tuple)):
        raise Fallback("no recorded results")
    axis = norm_axis(int(axis_arg), rank)
    sizes = []
    for v in vals:
        s = getattr(v, "shape", None)
        if s is None or len(s) != rank:
            raise Fallback("unknown result shape")
        sizes.append(int(s[axis]))
    return axis, sizes


@register("split.Tensor", "split_with_sizes.default", "chunk.default",
          "unsafe_split.Tensor", "unsafe_split_with_sizes.default", "unbind.int")
def _split(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    _float(a["self"])
    xs = shape(a["self"])
    x = imp.tensor(a["self"])
    unbind = "unbind" in str(node.target)
    if unbind:
        axis = norm_axis(int(a.get("dim", 0)), len(xs))
        sizes = [1] * xs[axis]
    else:
        axis, sizes = _pieces(node, a.get("dim", 0), len(xs))
    used = _used_items(node)
    out: list[str | None] = []
    start = 0
    for k, size in enumerate(sizes):
        if k not in used:
            out.append(None)
        elif size == xs[axis]:
            out.append(x)
        else:
            hint = f"{node.name}_{k}"
            y = _slice(imp, x, axis, start, start + size, 1, f"{hint}_slice" if unbind else hint)
            out.append(_drop_axis(imp, y, xs[:axis] + xs[axis + 1:], hint) if unbind else y)
        start += size
    return out


@register("slice.Tensor")
def _slice_tensor(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    _float(node)
    xs = shape(a["self"])
    axis = norm_axis(int(a.get("dim", 0)), len(xs))
    step = int(a.get("step") or 1)
    start, end, length = slice_bounds(xs[axis], a.get("start"), a.get("end"), step)
    if length < 1:
        raise Fallback("an empty slice")
    return _window(imp, node, a["self"], xs[axis] == length, axis, start, end, step)


def _window(imp: TorchImporter, node: fx.Node, source: Any, whole: bool, axis: int,
            start: int, end: int, step: int) -> Result:
    """``source`` itself when the window is ``whole``, else its Slice node."""
    x = imp.tensor(source)
    return x if whole else _slice(imp, x, axis, start, end, step, node.name)


@register("narrow.default")
def _narrow(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    _float(node)
    xs = shape(a["self"])
    axis = norm_axis(int(a["dim"]), len(xs))
    start = int(a["start"])
    start = start + xs[axis] if start < 0 else start
    length = int(a["length"])
    return _window(imp, node, a["self"], length == xs[axis], axis, start, start + length, 1)


@register("select.int")
def _select(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    _float(node)
    xs = shape(a["self"])
    axis = norm_axis(int(a["dim"]), len(xs))
    index = int(a["index"])
    index = index + xs[axis] if index < 0 else index
    target = out_shape(node)
    if not target:
        raise Fallback("a rank-0 result")
    x = imp.tensor(a["self"])
    y = x if xs[axis] == 1 else \
        _slice(imp, x, axis, index, index + 1, 1, f"{node.name}_slice")
    return _drop_axis(imp, y, target, node.name)


@register("expand.default", "expand_as.default", "broadcast_to.default")
def _expand(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    _float(node)
    target = out_shape(node)
    x = imp.tensor(a["self"])
    if target == shape(a["self"]):
        return x
    return imp.b.emit1("Expand", [x], {"shape": target}, node.name)


def _pad(imp: TorchImporter, node: fx.Node, a: dict[str, Any], value: Any) -> Result:
    _float(node)
    if value is not None and float(value) != 0.0:
        raise Fallback(f"padding with {value}, not 0")
    xs = shape(a["self"])
    rank = len(xs)
    torch_pads = [int(p) for p in a["pad"]]
    if len(torch_pads) % 2 or len(torch_pads) > 2 * rank or any(p < 0 for p in torch_pads):
        raise Fallback("negative or malformed padding")
    pads = [0] * (2 * rank)
    for k in range(len(torch_pads) // 2):  # torch lists the last dimension first
        pads[rank - 1 - k] = torch_pads[2 * k]
        pads[2 * rank - 1 - k] = torch_pads[2 * k + 1]
    x = imp.tensor(a["self"])
    if not any(pads):
        return x
    return imp.b.emit1("Pad", [x], {"pads": tuple(pads)}, node.name)


@register("pad.default")
def _pad_default(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if a.get("mode", "constant") != "constant":
        raise Fallback(f"padding mode {a.get('mode')!r}")
    return _pad(imp, node, a, a.get("value"))


@register("constant_pad_nd.default")
def _constant_pad_nd(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    return _pad(imp, node, a, a.get("value", 0))


@register("unfold.default")
def _unfold(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    _float(node)
    rank = len(shape(a["self"]))
    if rank == 0:
        raise Fallback("unfold of a scalar")
    attrs = {"axis": norm_axis(int(a["dimension"]), rank), "size": int(a["size"]),
             "step": int(a["step"])}
    return imp.b.emit1("Unfold", [imp.tensor(a["self"])], attrs, node.name)


def dense_order(sizes: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The permutation ``perm`` of the axes for which a tensor of these sizes and strides is
    ``x.permute(perm)`` of a row-major one (axes of size 1 first), or None when its layout is
    not one (overlapping, or with gaps)."""
    perm = tuple(sorted(range(len(sizes)),
                        key=lambda d: (sizes[d] != 1, -strides[d] if sizes[d] != 1 else 0, d)))
    want = 1
    for d in reversed(perm):
        if sizes[d] != 1:
            if strides[d] != want:
                return None
            want *= sizes[d]
    return perm


@register("as_strided.default")
def _as_strided(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    val = meta_val(a["self"])
    try:
        sizes = tuple(int(d) for d in val.shape)
        strides = tuple(int(d) for d in val.stride())
        base = int(val.storage_offset())
        size = [int(d) for d in a["size"]]
        stride = [int(d) for d in a["stride"]]
        start = base if a.get("storage_offset") is None else int(a["storage_offset"])
    except (AttributeError, TypeError, ValueError, RuntimeError):
        raise UnsupportedError(f"fx node '{node.name}' (as_strided): the layout of its input "
                               "is not known, and its result depends on it") from None
    perm = dense_order(sizes, strides)
    offset = start - base
    numel = math.prod(sizes)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if perm is None or (0 not in size and (offset < 0 or last >= numel or min(stride) < 0)):
        raise UnsupportedError(
            f"fx node '{node.name}' (as_strided): sizes {size}, strides {stride}, offset "
            f"{start} over an input of sizes {list(sizes)}, strides {list(strides)}, offset "
            f"{base} read memory outside the input's values")
    attrs = torch_opaque_attrs(strided_window, (TensorRef(0), list(perm), size, stride, offset),
                               {}, [out_shape(node)], [dtype_name(val.dtype)])
    return imp.b.emit1("Opaque", [imp.tensor(a["self"])], attrs, node.name)


def _reduce_axes(a: dict[str, Any], rank: int) -> list[int]:
    dims = a.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_axis(int(d), rank) for d in dims})


def _reduce(imp: TorchImporter, node: fx.Node, a: dict[str, Any], op: str) -> Result:
    _float(node)
    if a.get("dtype") is not None:
        raise Fallback("a reduction with a dtype change")
    xs = shape(a["self"])
    if not out_shape(node):
        raise Fallback("a rank-0 result")
    axes = _reduce_axes(a, len(xs))
    keep = bool(a.get("keepdim"))
    return imp.b.emit1(op, [imp.tensor(a["self"])], {"axes": tuple(axes), "keepdims": int(keep)},
                       node.name)


@register("sum.dim_IntList")
def _sum(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    return _reduce(imp, node, a, "ReduceSum")


@register("mean.dim")
def _mean(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    xs = shape(a["self"])
    if len(xs) < 3 or _reduce_axes(a, len(xs)) != list(range(2, len(xs))) \
            or a.get("dtype") is not None or not is_float(node):
        return _reduce(imp, node, a, "ReduceMean")
    keep = bool(a.get("keepdim"))
    y = imp.b.emit1("GlobalAveragePool", [imp.tensor(a["self"])], {},
                    node.name if keep else f"{node.name}_gap")
    if keep:
        return y
    return imp.b.emit1("Reshape", [y], {"shape": out_shape(node)}, node.name)


@register("roll.default")
def _roll(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    """``torch.roll`` along given dimensions: per dimension, the last ``shift`` entries
    concatenated before the others (``Slice``, ``Slice``, ``Concat``: y[i] = x[(i - shift)
    mod n]), which eOperators and ONNX Runtime regions express (Swin's shifted windows)."""
    shifts, dims = a.get("shifts"), a.get("dims")
    shifts = [shifts] if isinstance(shifts, int) else list(shifts or ())
    dims = [dims] if isinstance(dims, int) else list(dims or ())
    if not is_float(node) or not dims or len(dims) != len(shifts) or \
            not all(isinstance(v, int) for v in (*shifts, *dims)):
        raise Fallback("a roll of the flattened tensor, or symbolic shifts")
    sizes = shape(a["self"])
    x = y = imp.tensor(a["self"])
    for shift, dim in zip(shifts, dims, strict=True):
        axis = norm_axis(dim, len(sizes))
        n = sizes[axis]
        k = shift % n if n else 0
        if k:
            y = imp.b.emit1("Concat", [_slice(imp, y, axis, n - k, n, 1, f"{node.name}_tail"),
                                       _slice(imp, y, axis, 0, n - k, 1, f"{node.name}_head")],
                            {"axis": axis}, node.name)
    return y if y != x else imp.b.emit1("Identity", [x], hint=node.name)
