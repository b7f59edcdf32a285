"""Opaque torch operators an ONNX Runtime region still expresses: ``layer_norm`` (ONNX
``LayerNormalization``), ``gelu`` (its ``Erf`` or ``Tanh`` formula, which ONNX Runtime fuses
into one kernel), ``scaled_dot_product_attention`` without dropout or causality, with a
floating-point mask or none (``MatMul``, ``Add``, ``Softmax``, ``MatMul``; T5's position bias
is such a mask), and a boolean mask's operators: comparisons with a number (``Greater``,
...), its cast from or to floats (``Cast``), its negation (``Not``), ``masked_fill`` and
``where`` (``Where``; DeBERTa's scores). A boolean tensor lives
inside one region: produced and read there, never one of its inputs or outputs
(:func:`ollie.backends.onnxrt.region.spans`).

Ollie has no expression for these operators (they run as the aten operator, an ``Opaque``
node), so each ended a region: a transformer block or a ConvNeXt block was cut into a region
per linear layer, each paying a session call, around PyTorch's own layer norm. Expressed here,
a whole block can be one session, as when ONNX Runtime runs the exported model. The region is
checked against its kernels run one by one before it is used, as every region is
(:mod:`ollie.backends.onnxrt.region`). Why: docs/design/032-opaque-operators-in-regions.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ollie.graph import Node
from ollie.graph.opaque import OpRef, TensorRef

Emit = Callable[[Any, list[str], tuple, dict], str | None]
"""``(builder, inputs, args, kwargs) -> name of the result`` (None: not expressible)."""


def _target(node: Node) -> str | None:
    """``"namespace.name.overload"`` of an opaque torch node's operator, else None."""
    attrs = node.attrs
    target = attrs.get("target")
    if node.op != "Opaque" or attrs.get("backend") != "torch" or not isinstance(target, OpRef):
        return None
    return f"{target.namespace}.{target.name}.{target.overload}"


def _tensor(arg: object, ins: Sequence[str]) -> str | None:
    return ins[arg.index] if isinstance(arg, TensorRef) and 0 <= arg.index < len(ins) else None


def _arg(args: tuple, kwargs: Mapping[str, object], i: int, name: str,
         default: object) -> object:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _floating(b: Any, name: str) -> bool:
    """Whether the region tensor ``name`` holds floating-point values: a program constant of
    a floating-point dtype, or a computed tensor (a region reads only floating-point ones:
    :func:`ollie.backends.onnxrt.region.spans`)."""
    value = b.constants.get(name)
    if value is None:
        return True
    dtype = getattr(value, "dtype", None)
    return bool(getattr(dtype, "is_floating_point", False)) or \
        getattr(dtype, "kind", "") == "f"


def _layer_norm(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    x = _tensor(_arg(args, kwargs, 0, "input", None), ins)
    shape = _arg(args, kwargs, 1, "normalized_shape", None)
    weight, bias = _arg(args, kwargs, 2, "weight", None), _arg(args, kwargs, 3, "bias", None)
    eps = _arg(args, kwargs, 4, "eps", 1e-5)
    if x is None or not isinstance(shape, (list, tuple)) or not shape or \
            not all(isinstance(d, int) for d in shape) or not isinstance(eps, (int, float)):
        return None
    scale = _tensor(weight, ins) if weight is not None else b.const(
        "ln_scale", np.ones(tuple(shape), np.float32))
    shift = _tensor(bias, ins) if bias is not None else None
    if scale is None or (bias is not None and shift is None) or \
            tuple(b.shapes.get(scale, ())) != tuple(shape) or \
            (shift is not None and tuple(b.shapes.get(shift, ())) != tuple(shape)):
        return None
    return b.node("LayerNormalization", [x, scale] + ([shift] if shift else []), "ln",
                  axis=-len(shape), epsilon=float(eps))


def _gelu(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    x = _tensor(_arg(args, kwargs, 0, "self", None), ins)
    approximate = _arg(args, kwargs, 1, "approximate", "none")
    if x is None or approximate not in ("none", "tanh"):
        return None

    def c(v: float) -> str:
        return b.const("gelu_c", np.asarray(v, np.float32))

    if approximate == "none":  # x / 2 * (1 + erf(x / sqrt 2))
        inner = b.node("Erf", [b.node("Div", [x, c(math.sqrt(2.0))], "gelu_s")], "gelu_e")
    else:  # x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))
        cube = b.node("Mul", [b.node("Mul", [x, x], "gelu_x2"), x], "gelu_x3")
        poly = b.node("Add", [x, b.node("Mul", [cube, c(0.044715)], "gelu_k")], "gelu_p")
        inner = b.node("Tanh", [b.node("Mul", [poly, c(math.sqrt(2.0 / math.pi))],
                                       "gelu_s")], "gelu_t")
    half = b.node("Mul", [x, c(0.5)], "gelu_h")
    return b.node("Mul", [half, b.node("Add", [inner, c(1.0)], "gelu_1")], "gelu")


def _attention(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    q, k, v = (_tensor(_arg(args, kwargs, i, n, None), ins)
               for i, n in enumerate(("query", "key", "value")))
    mask_arg = _arg(args, kwargs, 3, "attn_mask", None)
    mask = _tensor(mask_arg, ins) if mask_arg is not None else None
    if q is None or k is None or v is None or \
            (mask_arg is not None and (mask is None or not _floating(b, mask))) or \
            _arg(args, kwargs, 4, "dropout_p", 0.0) != 0 or \
            _arg(args, kwargs, 5, "is_causal", False) or kwargs.get("enable_gqa", False):
        return None
    qs, ks = tuple(b.shapes.get(q, ())), tuple(b.shapes.get(k, ()))
    if len(qs) < 2 or len(ks) != len(qs) or qs[-1] != ks[-1] or qs[-1] <= 0:
        return None
    scale = kwargs.get("scale")
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else scale
    if not isinstance(scale, (int, float)):
        return None
    rank = len(ks)
    kt = b.node("Transpose", [k], "att_kt", perm=[*range(rank - 2), rank - 1, rank - 2])
    scores = b.node("Mul", [b.node("MatMul", [q, kt], "att_qk"),
                            b.const("att_scale", np.asarray(scale, np.float32))], "att_s")
    if mask is not None:  # a floating-point mask is added to the scores
        scores = b.node("Add", [scores, mask], "att_m")
    return b.node("MatMul", [b.node("Softmax", [scores], "att_p", axis=-1), v], "att")


def _cast(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    """``_to_copy`` / ``to`` to ``bool`` of a floating-point tensor (the mask the
    torch.compile backend passes as 0.0 / 1.0, :mod:`ollie.optimizer.int_inputs`), or to
    ``float32`` of a boolean one (an element-wise operand, :meth:`ollie.frontend.torch_import.
    TorchImporter.float_tensor`): ONNX ``Cast``, which maps values as PyTorch does (non-zero,
    NaN included, to true; true to 1.0)."""
    from onnx import TensorProto

    x = _tensor(_arg(args, kwargs, 0, "self", None), ins)
    dtype = _arg(args, kwargs, 1, "dtype", None)
    if x is None or len(args) > 2 or \
            set(kwargs) - {"dtype", "layout", "device", "non_blocking", "copy"} or \
            kwargs.get("layout") not in (None, torch.strided) or \
            kwargs.get("device") not in (None, torch.device("cpu")):
        return None
    if dtype is torch.bool and x not in b.bools:
        out = b.node("Cast", [x], "mask", to=TensorProto.BOOL)
        b.bools.add(out)
        return out
    if dtype is torch.float32 and x in b.bools:
        return b.node("Cast", [x], "unmask", to=TensorProto.FLOAT)
    return None


def _mask(b: Any, name: str | None) -> str | None:
    """The boolean ONNX tensor of mask ``name``: one cast in the region, or a boolean program
    constant as a boolean initializer; None for anything else."""
    if name is None:
        return None
    if name in b.bools:
        return name
    value = b.constants.get(name)
    if value is None or getattr(value, "dtype", None) not in (torch.bool, np.bool_):
        return None
    out = b.const("mask", np.ascontiguousarray(np.asarray(value, dtype=np.bool_)))
    b.bools.add(out)
    return out


def _masked_fill(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    """``masked_fill`` with a scalar value and a boolean mask (DeBERTa's scores): ONNX
    ``Where(mask, value, x)``."""
    x = _tensor(_arg(args, kwargs, 0, "self", None), ins)
    mask = _mask(b, _tensor(_arg(args, kwargs, 1, "mask", None), ins))
    value = _arg(args, kwargs, 2, "value", None)
    if x is None or x in b.bools or mask is None or isinstance(value, bool) or \
            not isinstance(value, (int, float)):
        return None
    return b.node("Where", [mask, b.const("fill", np.asarray(value, np.float32)), x], "filled")


def _not(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    """``bitwise_not`` / ``logical_not`` of a boolean mask: ONNX ``Not``."""
    x = _mask(b, _tensor(_arg(args, kwargs, 0, "self", None), ins))
    if x is None:
        return None
    out = b.node("Not", [x], "not")
    b.bools.add(out)
    return out


_COMPARISONS = {"gt": "Greater", "lt": "Less", "ge": "GreaterOrEqual", "le": "LessOrEqual",
                "eq": "Equal", "ne": "Equal"}
"""aten comparisons with a scalar and their ONNX operators (``ne``: ``Not`` of ``Equal``)."""


def _compare(name: str) -> Emit:
    def emit(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
        """A comparison of a floating-point tensor with a number: a boolean mask."""
        x = _tensor(_arg(args, kwargs, 0, "self", None), ins)
        other = _arg(args, kwargs, 1, "other", None)
        if x is None or x in b.bools or isinstance(other, bool) or \
                not isinstance(other, (int, float)):
            return None
        out = b.node(_COMPARISONS[name], [x, b.const("cmp", np.asarray(other, np.float32))],
                     name)
        out = b.node("Not", [out], "ne") if name == "ne" else out
        b.bools.add(out)
        return out

    return emit


def _where(b: Any, ins: list[str], args: tuple, kwargs: dict) -> str | None:
    """``torch.where(mask, x, y)`` with a boolean mask, each of ``x`` / ``y`` a floating-point
    tensor or a number: ONNX ``Where``."""
    mask = _mask(b, _tensor(_arg(args, kwargs, 0, "condition", None), ins))
    picks = []
    for i, name in ((1, "self"), (2, "other")):
        v = _arg(args, kwargs, i, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            picks.append(b.const("pick", np.asarray(v, np.float32)))
        else:
            t = _tensor(v, ins)
            if t is None or t in b.bools:
                return None
            picks.append(t)
    return None if mask is None else b.node("Where", [mask, *picks], "where")


EMITTERS: dict[str, Emit] = {
    "aten.layer_norm.default": _layer_norm,
    "aten.gelu.default": _gelu,
    "aten.scaled_dot_product_attention.default": _attention,
    "aten._to_copy.default": _cast,
    "aten.to.dtype": _cast,
    "aten.masked_fill.Scalar": _masked_fill,
    "aten.bitwise_not.default": _not,
    "aten.logical_not.default": _not,
    **{f"aten.{n}.Scalar": _compare(n) for n in _COMPARISONS},
    "aten.where.self": _where,
    "aten.where.ScalarOther": _where,
    "aten.where.ScalarSelf": _where,
}
"""The opaque torch operators a region expresses, by ``namespace.name.overload``."""

BOOLEAN_READERS = frozenset({"aten._to_copy.default", "aten.to.dtype", "aten.masked_fill.Scalar",
                             "aten.bitwise_not.default", "aten.logical_not.default",
                             "aten.where.self", "aten.where.ScalarOther",
                             "aten.where.ScalarSelf"})
"""The operators of :data:`EMITTERS` that may read a boolean tensor (the others are given
floating-point ones only: :func:`emit`)."""


def supported(node: Node) -> bool:
    """Whether ``node`` is an opaque torch operator of :data:`EMITTERS` (whether its
    arguments fit is known when it is emitted: :func:`emit`)."""
    target = _target(node)
    return target is not None and target in EMITTERS and len(node.outputs) == 1


def emit(builder: Any, node: Node, ins: list[str]) -> str | None:
    """The ONNX nodes of opaque ``node`` in ``builder`` (an
    :class:`ollie.backends.onnxrt.build.Builder`), its inputs under the ONNX names ``ins``;
    the name of its result, or None when its arguments are not ones it expresses."""
    target = _target(node)
    fn = EMITTERS.get(target) if target is not None else None
    if fn is None or (target not in BOOLEAN_READERS and builder.bools.intersection(ins)):
        return None
    args = node.attrs.get("args", ())
    kwargs = node.attrs.get("kwargs", {})
    return fn(builder, ins, tuple(args) if isinstance(args, (list, tuple)) else (),
              dict(kwargs) if isinstance(kwargs, Mapping) else {})


__all__ = ["BOOLEAN_READERS", "EMITTERS", "emit", "supported"]
