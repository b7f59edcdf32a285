"""Converters of ``aten`` (and ``ollie``) operators to graph operators, keyed by
``"namespace::name.overload"``. A converter returns the output tensor name (a list for tuple
results, ``None`` entries for results that are not available), or raises :class:`Fallback` to
keep the node opaque.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

if TYPE_CHECKING:
    from ollie.frontend.torch_import import TorchImporter

Result = str | list[str | None] | None
Handler = Callable[["TorchImporter", fx.Node, dict[str, Any]], Result]
HANDLERS: dict[str, Handler] = {}


class Fallback(Exception):
    """Keep this node opaque."""


def bind(target: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Arguments by schema name, defaults filled in."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return {"args": args, **kwargs}
    out: dict[str, Any] = {}
    for k, arg in enumerate(schema.arguments):
        if k < len(args) and not arg.kwarg_only:
            out[arg.name] = args[k]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def register(*names: str) -> Callable[[Handler], Handler]:
    """Decorator: register a handler under each name (``aten::`` when no namespace given)."""
    def deco(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n if "::" in n else f"aten::{n}"] = fn
        return fn

    return deco


# --------------------------------------------------------------------- helpers
def meta_val(arg: Any) -> Any:
    """The example value (fake tensor, or tensor metadata) torch.export recorded for ``arg``."""
    if isinstance(arg, fx.Node):
        return arg.meta.get("val", arg.meta.get("tensor_meta"))
    return None


def shape(arg: Any) -> tuple[int, ...]:
    v = meta_val(arg)
    s = getattr(v, "shape", None)
    if s is None:
        raise Fallback(f"no shape for {arg!r}")
    try:
        return tuple(int(d) for d in s)
    except (TypeError, ValueError):
        raise Fallback(f"symbolic shape for {arg!r}") from None


def out_shape(node: fx.Node) -> tuple[int, ...]:
    return shape(node)


def is_float(node: fx.Node) -> bool:
    """Whether the value of ``node`` is a floating-point tensor."""
    v = meta_val(node)
    return getattr(v, "dtype", None) in (torch.float32, torch.float64, torch.float16,
                                         torch.bfloat16)


def _ints(v: Any, n: int = 2) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    t = tuple(int(x) for x in v)
    if len(t) == 1:
        return t * n
    if len(t) != n:
        raise Fallback(f"expected {n} values, got {v!r}")
    return t


def norm_axis(dim: int, rank: int) -> int:
    """``dim`` counted from the front (a negative ``dim`` counts from the end)."""
    return dim + rank if dim < 0 else dim


# --------------------------------------------------------------------- convolutions
def _same_padding(w_shape: tuple[int, ...], dilation: tuple[int, ...]
                  ) -> tuple[int, int, int, int]:
    th = dilation[0] * (w_shape[2] - 1)
    tw = dilation[1] * (w_shape[3] - 1)
    return (th // 2, tw // 2, th - th // 2, tw - tw // 2)


def _emit_conv(imp: TorchImporter, node: fx.Node, a: dict[str, Any], transposed: bool) -> str:
    if len(shape(a["weight"])) != 4 or len(shape(a["input"])) != 4:
        raise Fallback("only 2-D convolutions")
    dilation = _ints(a.get("dilation", 1))
    padding = a.get("padding", 0)
    if isinstance(padding, str):
        pad: tuple[int, ...] = (0, 0) if padding == "valid" else \
            _same_padding(shape(a["weight"]), dilation)
    else:
        pad = _ints(padding)
    attrs: dict[str, Any] = {"stride": _ints(a.get("stride", 1)), "padding": pad,
                             "dilation": dilation, "groups": int(a.get("groups", 1))}
    if transposed:
        attrs["output_padding"] = _ints(a.get("output_padding", 0))
    ins = [imp.tensor(a["input"]), imp.tensor(a["weight"])]
    if a.get("bias") is not None:
        ins.append(imp.tensor(a["bias"]))
    return imp.b.emit1("ConvTranspose2d" if transposed else "Conv2d", ins, attrs, node.name)


@register("conv2d.default", "conv2d.padding")
def _conv2d(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    return _emit_conv(imp, node, a, transposed=False)


@register("conv_transpose2d.input")
def _conv_t(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    return _emit_conv(imp, node, a, transposed=True)


@register("convolution.default", "_convolution.default")
def _convolution(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    return _emit_conv(imp, node, a, transposed=bool(a["transposed"]))


# --------------------------------------------------------------------- matmul family
@register("linear.default")
def _linear(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    xs, ws = shape(a["input"]), shape(a["weight"])
    if len(ws) != 2 or len(xs) < 2:
        raise Fallback("linear of a vector")
    x, w = imp.tensor(a["input"]), imp.tensor(a["weight"])
    b = imp.tensor(a["bias"]) if a.get("bias") is not None else None
    if len(xs) == 2:
        return imp.b.emit1("Gemm", [x, w] + ([b] if b else []), {"transB": 1}, node.name)
    wv = imp.const_value(w)
    if wv is not None:
        wt = imp.const(wv.t().contiguous(), f"{w}_T")
    else:
        wt = imp.b.emit1("Transpose", [w], {"perm": (1, 0)}, f"{w}_T")
    y = imp.b.emit1("MatMul", [x, wt], {}, f"{node.name}_mm" if b else node.name)
    return imp.b.emit1("Add", [y, b], {}, node.name) if b else y


@register("addmm.default")
def _addmm(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    ins = [imp.tensor(a["mat1"]), imp.tensor(a["mat2"]), imp.tensor(a["self"])]
    if len(shape(a["self"])) > 2:
        raise Fallback("addmm bias of rank > 2")
    attrs = {"alpha": float(a.get("alpha", 1)), "beta": float(a.get("beta", 1))}
    return imp.b.emit1("Gemm", ins, attrs, node.name)


@register("mm.default", "bmm.default", "matmul.default")
def _matmul(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    other = a.get("mat2", a.get("other"))
    return imp.b.emit1("MatMul", [imp.tensor(a["self"]), imp.tensor(other)], {}, node.name)


@register("ollie::g2bmm.default", "ollie::gbmm.default")
def _band(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    first, second = list(a)[:2]
    op = "G2BMM" if "g2bmm" in str(node.target) else "GBMM"
    attrs = {"width": int(a["width"]), "dilation": int(a["dilation"])}
    return imp.b.emit1(op, [imp.tensor(a[first]), imp.tensor(a[second])], attrs, node.name)


# --------------------------------------------------------------------- element-wise
_UNARY = {"relu": "Relu", "relu_": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "exp": "Exp",
          "log": "Log", "sqrt": "Sqrt", "abs": "Abs", "neg": "Neg"}


def _unary(op: str) -> Handler:
    def handler(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
        if not is_float(node):
            raise Fallback("non-float element-wise operator")
        return imp.b.emit1(op, [imp.float_tensor(a["self"])], {}, node.name)

    return handler


for _name, _op in _UNARY.items():
    HANDLERS[f"aten::{_name}.default"] = _unary(_op)


@register("pow.Tensor_Scalar")
def _pow(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    e = a.get("exponent")
    if not is_float(node) or isinstance(e, bool) or not isinstance(e, (int, float)):
        raise Fallback("non-float power or a tensor exponent")
    y = imp.b.power(imp.float_tensor(a["self"]), float(e), node.name)
    if y is None:
        raise Fallback(f"exponent {e} has no element-wise form")
    return y


def _fixed_power(exponent: float) -> Handler:
    def handler(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
        if not is_float(node):
            raise Fallback("non-float reciprocal")
        return imp.b.power(imp.float_tensor(a["self"]), exponent, node.name)

    return handler


HANDLERS["aten::rsqrt.default"] = _fixed_power(-0.5)
HANDLERS["aten::reciprocal.default"] = _fixed_power(-1.0)


@register("leaky_relu.default")
def _leaky(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    return imp.b.emit1("LeakyRelu", [imp.tensor(a["self"])],
                       {"alpha": float(a.get("negative_slope", 0.01))}, node.name)


@register("hardtanh.default", "hardtanh_.default")
def _hardtanh(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not is_float(node):
        raise Fallback("non-float hardtanh")
    return imp.b.clip(imp.tensor(a["self"]), float(a.get("min_val", -1.0)),
                      float(a.get("max_val", 1.0)), node.name)


@register("relu6.default", "relu6_.default")
def _relu6(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not is_float(node):
        raise Fallback("non-float relu6")
    return imp.b.clip(imp.tensor(a["self"]), 0.0, 6.0, node.name)


@register("clamp.default")
def _clamp(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    lo, hi = a.get("min"), a.get("max")
    if not is_float(node) or not all(v is None or isinstance(v, (int, float))
                                      for v in (lo, hi)):
        raise Fallback("non-float clamp or tensor bounds")
    return imp.b.clip(imp.tensor(a["self"]), None if lo is None else float(lo),
                      None if hi is None else float(hi), node.name)


@register("silu.default", "silu_.default")
def _silu(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not is_float(node):
        raise Fallback("non-float silu")
    return imp.b.silu(imp.tensor(a["self"]), node.name)


@register("hardsigmoid.default", "hardsigmoid_.default")
def _hardsigmoid(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not is_float(node):
        raise Fallback("non-float hardsigmoid")
    return imp.b.hard_sigmoid(imp.tensor(a["self"]), 1.0 / 6.0, 0.5, node.name)


@register("hardswish.default", "hardswish_.default")
def _hardswish(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not is_float(node):
        raise Fallback("non-float hardswish")
    return imp.b.hard_swish(imp.tensor(a["self"]), node.name)


_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max",
           "minimum": "Min"}


def _binary(op: str) -> Handler:
    def handler(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
        if not is_float(node) or a.get("rounding_mode") is not None:
            raise Fallback("non-float or rounding arithmetic")
        x, y = imp.float_tensor(a["self"]), imp.float_tensor(a["other"])
        alpha = a.get("alpha", 1)
        if alpha is not None and float(alpha) != 1.0:
            y = imp.b.emit1("Mul", [y, imp.scalar(float(alpha))], {}, f"{node.name}_alpha")
        return imp.b.emit1(op, [x, y], {}, node.name)

    return handler


for _name, _op in _BINARY.items():
    for _ov in ("Tensor", "Scalar", "default", "Tensor_mode"):
        HANDLERS[f"aten::{_name}.{_ov}"] = _binary(_op)


# --------------------------------------------------------------------- normalisation
def _bn(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> str:
    if a.get("running_mean") is None or a.get("running_var") is None:
        raise Fallback("batch norm without running statistics")
    c = shape(a["input"])[1]
    x = imp.tensor(a["input"])
    gamma = imp.tensor(a["weight"]) if a.get("weight") is not None else \
        imp.const(torch.ones(c), f"{node.name}_gamma")
    beta = imp.tensor(a["bias"]) if a.get("bias") is not None else \
        imp.const(torch.zeros(c), f"{node.name}_beta")
    ins = [x, gamma, beta, imp.tensor(a["running_mean"]), imp.tensor(a["running_var"])]
    return imp.b.emit1("BatchNorm", ins, {"eps": float(a["eps"])}, node.name)


def _only_first_used(node: fx.Node) -> bool:
    return all(u.target.__name__ == "getitem" and u.args[1] == 0 for u in node.users
               if hasattr(u.target, "__name__"))


@register("batch_norm.default")
def _batch_norm(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if a.get("training"):
        raise Fallback("training-mode batch norm")
    return _bn(imp, node, a)


@register("_native_batch_norm_legit_no_training.default")
def _batch_norm_nt(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not _only_first_used(node):
        raise Fallback("batch norm statistics outputs used")
    return [_bn(imp, node, a), None, None]


# --------------------------------------------------------------------- pooling
def _pool_attrs(a: dict[str, Any]) -> dict[str, Any]:
    k = _ints(a["kernel_size"])
    stride = a.get("stride")
    return {"kernel_size": k, "stride": _ints(stride) if stride else k,
            "padding": _ints(a.get("padding", 0)), "ceil_mode": bool(a.get("ceil_mode"))}


@register("max_pool2d.default")
def _max_pool(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if len(shape(a["self"])) != 4:
        raise Fallback("max pool of a 3-D tensor")
    attrs = {**_pool_attrs(a), "dilation": _ints(a.get("dilation", 1))}
    return imp.b.emit1("MaxPool2d", [imp.tensor(a["self"])], attrs, node.name)


@register("max_pool2d_with_indices.default")
def _max_pool_idx(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if not _only_first_used(node):
        raise Fallback("max pool indices used")
    return [_max_pool(imp, node, a), None]


@register("avg_pool2d.default")
def _avg_pool(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if a.get("divisor_override") is not None or len(shape(a["self"])) != 4:
        raise Fallback("avg pool with divisor_override / of a 3-D tensor")
    attrs = {**_pool_attrs(a), "count_include_pad": bool(a.get("count_include_pad", True))}
    return imp.b.emit1("AvgPool2d", [imp.tensor(a["self"])], attrs, node.name)


@register("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default")
def _adaptive_avg(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    xs = shape(a["self"])
    if len(xs) != 4:
        raise Fallback("adaptive pool of a 3-D tensor")
    oh, ow = _ints(a["output_size"])
    x = imp.tensor(a["self"])
    if (oh, ow) == (1, 1):
        return imp.b.emit1("GlobalAveragePool", [x], {}, node.name)
    if (oh, ow) == xs[2:]:
        return x
    if xs[2] % oh or xs[3] % ow:
        raise Fallback("adaptive pool with uneven windows")
    k = (xs[2] // oh, xs[3] // ow)
    return imp.b.emit1("AvgPool2d", [x], {"kernel_size": k, "stride": k}, node.name)


# --------------------------------------------------------------------- data movement
@register("view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints",
      "unsqueeze.default", "squeeze.dim", "squeeze.dims", "squeeze.default", "view_as.default",
      "reshape_as.default", "unflatten.int")
def _reshape(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    x = imp.tensor(a["self"])
    target = out_shape(node)
    if target == shape(a["self"]):
        return x
    if not target:
        raise Fallback("reshape to a scalar")
    return imp.b.emit1("Reshape", [x], {"shape": target}, node.name)


@register("contiguous.default", "clone.default", "alias.default", "detach.default",
      "lift_fresh_copy.default", "_to_copy.default", "to.dtype")
def _alias(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    src = a["self"]
    v_in, v_out = meta_val(src), meta_val(node)
    if getattr(v_in, "dtype", None) != getattr(v_out, "dtype", None) \
            or shape(src) != out_shape(node):
        raise Fallback("a copy that changes dtype or shape")
    return imp.tensor(src)


@register("dropout.default", "feature_dropout.default", "alpha_dropout.default")
def _dropout(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if a.get("train"):
        raise Fallback("dropout in training mode")
    return imp.tensor(a["input"])


@register("t.default", "numpy_T.default")
def _t(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    rank = len(shape(a["self"]))
    x = imp.tensor(a["self"])
    if rank < 2:
        return x
    return imp.b.emit1("Transpose", [x], {"perm": tuple(range(rank))[::-1]}, node.name)


@register("permute.default")
def _permute(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    rank = len(shape(a["self"]))
    perm = tuple(norm_axis(int(d), rank) for d in a["dims"])
    x = imp.tensor(a["self"])
    if perm == tuple(range(rank)):
        return x
    return imp.b.emit1("Transpose", [x], {"perm": perm}, node.name)


@register("transpose.int")
def _transpose(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    rank = len(shape(a["self"]))
    d0, d1 = norm_axis(int(a["dim0"]), rank), norm_axis(int(a["dim1"]), rank)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    x = imp.tensor(a["self"])
    if d0 == d1:
        return x
    return imp.b.emit1("Transpose", [x], {"perm": tuple(perm)}, node.name)


@register("cat.default", "concat.default")
def _cat(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    tensors = list(a["tensors"])
    rank = len(out_shape(node))
    ins = [imp.tensor(t) for t in tensors if shape(t) != (0,)]
    if len(ins) == 1:
        return ins[0]
    return imp.b.emit1("Concat", ins, {"axis": norm_axis(int(a.get("dim", 0)), rank)}, node.name)


@register("softmax.int", "_softmax.default")
def _softmax(imp: TorchImporter, node: fx.Node, a: dict[str, Any]) -> Result:
    if a.get("dtype") is not None or a.get("half_to_float"):
        raise Fallback("softmax with a dtype change")
    rank = len(shape(a["self"]))
    return imp.b.emit1("Softmax", [imp.tensor(a["self"])],
                       {"axis": norm_axis(int(a["dim"]), rank)}, node.name)
