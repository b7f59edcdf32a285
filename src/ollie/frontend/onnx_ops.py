"""Converters of ONNX operators to graph operators, keyed by ``(domain, op_type)`` (domain
``""`` is the default ONNX domain). A converter returns one graph tensor name per ONNX output
(``None`` for outputs it does not provide), or raises :class:`Fallback` to keep the node as an
``Opaque`` node run by onnxruntime.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ollie.errors import ShapeError

if TYPE_CHECKING:
    from ollie.frontend.onnx_import import OnnxImporter

Result = list[str | None]
Converter = Callable[["OnnxImporter", Any, dict[str, Any]], Result]
CONVERTERS: dict[tuple[str, str], Converter] = {}
_FLOATS = ("float32", "float64", "float16")


class Fallback(Exception):
    """Keep this node opaque."""


def register(*names: str, domain: str = "") -> Callable[[Converter], Converter]:
    """Decorator: register a converter under each ONNX op type of ``domain``."""
    def deco(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[(domain, n)] = fn
        return fn

    return deco


def require(cond: bool, why: str) -> None:
    """Raise :class:`Fallback` with ``why`` unless ``cond``."""
    if not cond:
        raise Fallback(why)


def float_io(imp: OnnxImporter, node: Any) -> None:
    """Fall back unless every input of ``node`` is a floating-point tensor."""
    for i in node.input:
        if i:
            require(imp.dtype(i) in _FLOATS, f"input '{i}' is not floating point")


# --------------------------------------------------------------------- padding rules
def _auto_pads(auto_pad: str, sizes: tuple[int, ...], kernel: tuple[int, ...],
               strides: tuple[int, ...], dilations: tuple[int, ...]) -> list[int]:
    """ONNX pads ``[b0, b1, e0, e1]`` for SAME_UPPER / SAME_LOWER / VALID."""
    n = len(sizes)
    if auto_pad == "VALID":
        return [0] * (2 * n)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _spatial_attrs(imp: OnnxImporter, node: Any, a: dict[str, Any], kernel: tuple[int, ...]
                   ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, int, int, int]]:
    """(strides, dilations, (top, left, bottom, right)) of a 2-D conv / pool."""
    strides = tuple(a.get("strides", (1, 1)))
    dilations = tuple(a.get("dilations", (1, 1)))
    auto_pad = a.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("", "NOTSET"):
        pads = list(a.get("pads", (0, 0, 0, 0)))
    else:
        sizes = imp.shape(node.input[0])[2:]
        pads = _auto_pads(auto_pad, tuple(sizes), kernel, strides, dilations)  # type: ignore
    require(len(pads) == 4 and len(strides) == 2 and len(dilations) == 2, "not 2-D")
    return strides, dilations, (pads[0], pads[1], pads[2], pads[3])


def _padding_attr(p: tuple[int, int, int, int]) -> tuple[int, ...]:
    return (p[0], p[1]) if (p[0], p[1]) == (p[2], p[3]) else p


# --------------------------------------------------------------------- convolutions
@register("Conv")
def _conv(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    w = imp.shape(node.input[1])
    require(len(w) == 4 and len(imp.shape(node.input[0])) == 4, "only 2-D convolutions")
    strides, dilations, pads = _spatial_attrs(imp, node, a, w[2:])
    attrs = {"stride": strides, "dilation": dilations, "padding": _padding_attr(pads),
             "groups": int(a.get("group", 1))}
    return [imp.emit("Conv2d", node, node.input, attrs)]


@register("ConvTranspose")
def _conv_transpose(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    xs, w = imp.shape(node.input[0]), imp.shape(node.input[1])
    require(len(w) == 4 and len(xs) == 4, "only 2-D transposed convolutions")
    strides = tuple(a.get("strides", (1, 1)))
    dilations = tuple(a.get("dilations", (1, 1)))
    out_pad = tuple(a.get("output_padding", (0, 0)))
    auto_pad = a.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    out_shape = a.get("output_shape")
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        targets = list(out_shape)[-2:] if out_shape is not None else \
            [xs[2 + i] * strides[i] for i in range(2)]
        begins, ends = [], []
        for i in range(2):
            full = strides[i] * (xs[2 + i] - 1) + out_pad[i] + (w[2 + i] - 1) * dilations[i] + 1
            total = full - targets[i]
            require(total >= 0, "output_shape larger than the full output")
            small, big = total // 2, total - total // 2
            upper = auto_pad == "SAME_UPPER"
            begins.append(small if upper else big)
            ends.append(big if upper else small)
        pads = (begins[0], begins[1], ends[0], ends[1])
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    else:
        p = list(a.get("pads", (0, 0, 0, 0)))
        pads = (p[0], p[1], p[2], p[3])
    attrs = {"stride": strides, "dilation": dilations, "padding": _padding_attr(pads),
             "output_padding": out_pad, "groups": int(a.get("group", 1))}
    return [imp.emit("ConvTranspose2d", node, node.input, attrs)]


# --------------------------------------------------------------------- matmul family
@register("Gemm")
def _gemm(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    ins = [i for i in node.input if i]
    if len(ins) == 3 and len(imp.shape(ins[2])) == 0:
        c = imp.const(ins[2])
        require(c is not None, "scalar C that is not a constant")
        names = [imp.value(ins[0]), imp.value(ins[1]),
                 imp.b.add_const(np.reshape(c, (1,)), f"{ins[2]}_1d")]
        return [imp.emit("Gemm", node, names, _gemm_attrs(a), resolved=True)]
    return [imp.emit("Gemm", node, ins, _gemm_attrs(a))]


def _gemm_attrs(a: dict[str, Any]) -> dict[str, Any]:
    return {"alpha": float(a.get("alpha", 1.0)), "beta": float(a.get("beta", 1.0)),
            "transA": int(a.get("transA", 0)), "transB": int(a.get("transB", 0))}


@register("MatMul")
def _matmul(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    return [imp.emit("MatMul", node, node.input, {})]


def _band(op: str) -> Converter:
    def conv(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
        attrs = {"width": int(a["width"]), "dilation": int(a.get("dilation", 1))}
        return [imp.emit(op, node, node.input, attrs)]

    return conv


for _dom in ("ollie", "ai.ollie"):
    CONVERTERS[(_dom, "G2BMM")] = _band("G2BMM")
    CONVERTERS[(_dom, "GBMM")] = _band("GBMM")


# --------------------------------------------------------------------- element-wise
def _unary(op: str) -> Converter:
    def conv(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
        float_io(imp, node)
        return [imp.emit(op, node, node.input[:1], {})]

    return conv


for _name in ("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg"):
    CONVERTERS[("", _name)] = _unary(_name)


@register("LeakyRelu")
def _leaky(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    return [imp.emit("LeakyRelu", node, node.input, {"alpha": float(a.get("alpha", 0.01))})]


def _scalar_input(imp: OnnxImporter, node: Any, k: int, what: str) -> float | None:
    """Optional input ``k`` of ``node`` as a Python float (it must be a constant)."""
    name = node.input[k] if len(node.input) > k else ""
    if not name:
        return None
    v = imp.const(name)
    require(v is not None and np.size(v) == 1, f"{what} is not a constant scalar")
    return float(np.asarray(v).reshape(()))


@register("Pow")
def _pow(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    e = _scalar_input(imp, node, 1, "exponent")
    y = None if e is None else imp.b.power(imp.value(node.input[0]), e, node.output[0])
    require(y is not None, f"exponent {e} has no element-wise form")
    return [y]


@register("Reciprocal")
def _reciprocal(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    return [imp.b.reciprocal(imp.value(node.input[0]), node.output[0])]


@register("Clip")
def _clip(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    lo = _scalar_input(imp, node, 1, "min") if "min" not in a else float(a["min"])
    hi = _scalar_input(imp, node, 2, "max") if "max" not in a else float(a["max"])
    return [imp.b.clip(imp.value(node.input[0]), lo, hi, node.output[0])]


@register("HardSigmoid")
def _hard_sigmoid(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    return [imp.b.hard_sigmoid(imp.value(node.input[0]), float(a.get("alpha", 0.2)),
                               float(a.get("beta", 0.5)), node.output[0])]


@register("HardSwish")
def _hard_swish(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    return [imp.b.hard_swish(imp.value(node.input[0]), node.output[0])]


def _variadic(op: str) -> Converter:
    def conv(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
        float_io(imp, node)
        ins = [i for i in node.input if i]
        require(len(ins) >= 1, "no inputs")
        if len(ins) == 1:
            return [imp.value(ins[0])]
        acc = imp.value(ins[0])
        for k, other in enumerate(ins[1:]):
            last = k == len(ins) - 2
            acc = imp.emit(op, node, [acc, imp.value(other)], {}, resolved=True,
                           hint=None if last else f"{node.output[0]}_{k}")
        return [acc]

    return conv


for _name, _op in (("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Div", "Div"),
                   ("Sum", "Add"), ("Max", "Max"), ("Min", "Min")):
    CONVERTERS[("", _name)] = _variadic(_op)


# --------------------------------------------------------------------- normalisation
@register("BatchNormalization")
def _batch_norm(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    require(not a.get("training_mode", 0), "training-mode BatchNormalization")
    require(all(not o for o in node.output[1:]), "statistics outputs used")
    require(len(imp.shape(node.input[0])) >= 2, "rank < 2")
    require(all(imp.const(i) is not None for i in node.input[1:5]),
             "statistics are not constants")
    attrs = {"eps": float(a.get("epsilon", 1e-5))}
    return [imp.emit("BatchNorm", node, node.input[:5], attrs)]


# --------------------------------------------------------------------- pooling
def _pool_out(size: int, k: int, s: int, lo: int, hi: int, ceil_mode: bool) -> int:
    span = size + lo + hi - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + lo:
        out -= 1
    return out


def _onnx_pool_out(size: int, k: int, s: int, lo: int, hi: int, ceil_mode: bool) -> int:
    span = size + lo + hi - k
    return (-(-span // s) if ceil_mode else span // s) + 1


def _pool_common(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> dict[str, Any]:
    xs = imp.shape(node.input[0])
    kernel = tuple(a["kernel_shape"])
    require(len(xs) == 4 and len(kernel) == 2, "only 2-D pooling")
    strides, dilations, pads = _spatial_attrs(imp, node, a, kernel)
    ceil_mode = bool(a.get("ceil_mode", 0))
    if ceil_mode:  # PyTorch drops a last window starting in the trailing padding; ONNX may not
        for i in range(2):
            ek = dilations[i] * (kernel[i] - 1) + 1
            args = (xs[2 + i], ek, strides[i], pads[i], pads[2 + i], True)
            require(_pool_out(*args) == _onnx_pool_out(*args), "ceil_mode window rule")
    return {"kernel_size": kernel, "stride": strides, "padding": _padding_attr(pads),
            "ceil_mode": ceil_mode, "dilation": dilations}


@register("MaxPool")
def _max_pool(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    require(len(node.output) < 2 or not node.output[1], "indices output used")
    require(not a.get("storage_order", 0), "storage_order")
    attrs = _pool_common(imp, node, a)
    return [imp.emit("MaxPool2d", node, node.input[:1], attrs)]


@register("AveragePool")
def _avg_pool(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    attrs = _pool_common(imp, node, a)
    require(attrs.pop("dilation") == (1, 1), "dilated average pooling")
    attrs["count_include_pad"] = bool(a.get("count_include_pad", 0))
    return [imp.emit("AvgPool2d", node, node.input[:1], attrs)]


@register("GlobalAveragePool")
def _gap(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    require(len(imp.shape(node.input[0])) >= 3, "rank < 3")
    return [imp.emit("GlobalAveragePool", node, node.input, {})]


@register("Softmax")
def _softmax(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    float_io(imp, node)
    rank = len(imp.shape(node.input[0]))
    old = imp.opset < 13
    axis = int(a.get("axis", 1 if old else -1))
    axis = axis + rank if axis < 0 else axis
    require(not old or axis == rank - 1, "opset < 13 softmax over several axes")
    return [imp.emit("Softmax", node, node.input, {"axis": axis})]


# --------------------------------------------------------------------- data movement
def _reshape_to(imp: OnnxImporter, node: Any, target: tuple[int, ...]) -> Result:
    x = node.input[0]
    require(len(target) > 0, "reshape to a scalar")
    if target == imp.shape(x):
        return [imp.value(x)]
    return [imp.emit("Reshape", node, [x], {"shape": target})]


@register("Reshape")
def _reshape(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    spec = imp.const(node.input[1])
    require(spec is not None, "shape is not a constant")
    xs = imp.shape(node.input[0])
    dims = [int(d) for d in np.asarray(spec).reshape(-1)]
    if a.get("allowzero", 0):
        require(0 not in dims, "allowzero with a zero dimension")
    dims = [xs[k] if d == 0 else d for k, d in enumerate(dims)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known <= 0 or math.prod(xs) % known:
            raise ShapeError(f"cannot reshape {list(xs)} to {dims}: -1 cannot be inferred")
        dims[dims.index(-1)] = math.prod(xs) // known
    if math.prod(dims) != math.prod(xs) or any(d < 0 for d in dims):
        raise ShapeError(f"cannot reshape {list(xs)} to {dims}")
    return _reshape_to(imp, node, tuple(dims))


def const_axes(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> list[int] | None:
    """The ``axes`` attribute, or the constant second input; None when neither is given."""
    if "axes" in a:
        return [int(v) for v in a["axes"]]
    if len(node.input) > 1 and node.input[1]:
        v = imp.const(node.input[1])
        require(v is not None, "axes are not constants")
        return [int(x) for x in np.asarray(v).reshape(-1)]
    return None


@register("Squeeze")
def _squeeze(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    xs = imp.shape(node.input[0])
    axes = const_axes(imp, node, a)
    drop = {k for k, d in enumerate(xs) if d == 1} if axes is None else \
        {ax + len(xs) if ax < 0 else ax for ax in axes}
    return _reshape_to(imp, node, tuple(d for k, d in enumerate(xs) if k not in drop))


@register("Unsqueeze")
def _unsqueeze(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    xs = list(imp.shape(node.input[0]))
    axes = const_axes(imp, node, a)
    require(axes is not None, "no axes")
    rank = len(xs) + len(axes)  # type: ignore[arg-type]
    for ax in sorted(ax + rank if ax < 0 else ax for ax in axes):  # type: ignore[union-attr]
        xs.insert(ax, 1)
    return _reshape_to(imp, node, tuple(xs))


@register("Flatten")
def _flatten(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    rank = len(imp.shape(node.input[0]))
    axis = int(a.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    return [imp.emit("Flatten", node, node.input, {"axis": axis})]


@register("Transpose")
def _transpose(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    rank = len(imp.shape(node.input[0]))
    perm = tuple(int(p) for p in a.get("perm", range(rank - 1, -1, -1)))
    if perm == tuple(range(rank)):
        return [imp.value(node.input[0])]
    return [imp.emit("Transpose", node, node.input, {"perm": perm})]


@register("Concat")
def _concat(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    ins = [i for i in node.input if i and math.prod(imp.shape(i)) > 0]
    require(len(ins) > 0, "all inputs empty")
    if len(ins) == 1:
        return [imp.value(ins[0])]
    rank = len(imp.shape(ins[0]))
    axis = int(a["axis"])
    return [imp.emit("Concat", node, ins, {"axis": axis + rank if axis < 0 else axis})]


@register("Identity")
def _identity(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    return [imp.value(node.input[0])]


@register("Dropout")
def _dropout(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    require(len(node.output) < 2 or not node.output[1], "mask output used")
    if len(node.input) > 2 and node.input[2]:
        training = imp.const(node.input[2])
        require(training is not None and not bool(np.asarray(training)), "training mode")
    return [imp.value(node.input[0])]


@register("Cast")
def _cast(imp: OnnxImporter, node: Any, a: dict[str, Any]) -> Result:
    from onnx import helper

    to = str(np.dtype(helper.tensor_dtype_to_np_dtype(int(a["to"]))))
    require(to == imp.dtype(node.input[0]), "a real conversion")
    return [imp.value(node.input[0])]
