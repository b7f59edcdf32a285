"""The JSON form of kernels and of the graph operators they run: data only, never code.

A saved program (:mod:`ollie.program.program`) and a cached decision
(:mod:`ollie.tune.cache`) hold kernels as the JSON documents of :func:`kernel_to_json`.
Reading one back (:func:`kernel_from_json`) builds values of a closed set of types and nothing
else; it never unpickles, imports or evaluates anything from the document:

* JSON scalars and lists as themselves; a non-finite float as ``{"$float": "inf"}``;
* ``{"$tuple": [...]}``, ``{"$dict": [[key, value], ...]}``, ``{"$slice": [a, b, c]}``,
  ``{"$ellipsis": 0}``;
* an opaque torch operator's input placeholder ``{"$ref": i}``
  (:class:`~ollie.graph.opaque.TensorRef`);
* a torch operator overload by qualified name, ``{"$op": "aten::conv2d.default"}``
  (:class:`~ollie.graph.opaque.OpRef`), resolved through ``torch.ops`` only in the namespaces
  of :data:`OP_NAMESPACES`; a plain Python function only if it is one of
  :data:`CALLABLES`, by name;
* ``{"$dtype": "float32"}``, ``{"$device": "cpu"}``, ``{"$memory_format": ...}``,
  ``{"$layout": ...}``: torch's enumerations, looked up by name among their known values;
* ``{"$array": {"dtype", "shape", "data"}}``: a small numeric numpy array (or, with
  ``"tensor": true``, a torch tensor), base64 of its bytes, of a numeric dtype only;
* ``{"$onnx": "<base64>"}``: an ONNX ``NodeProto`` in its protobuf encoding (protobuf parsing
  builds data; ONNX Runtime later runs it as one operator).

A graph operator (the ``node`` of a ``Node`` kernel) is ``{"op", "inputs", "outputs", "name",
"attrs"}``, its ``op`` one of :data:`ollie.lower.LOWERINGS` or ``"Opaque"``. Anything else in a
document raises :class:`~ollie.errors.OllieError` naming the kernel and the field; a value
that cannot be written (an arbitrary Python callable, an object of another type) raises it when
saving.
"""

from __future__ import annotations

import base64
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ollie.errors import OllieError
from ollie.graph.opaque import strided_window
from ollie.ir import format_expr, parse
from ollie.program.kernel import KINDS, Kernel, View
from ollie.program.params import KernelKind, NodeParams, ParamsError, make_params


class FormatError(OllieError):
    """A saved document (program, kernel, cached decision) that is malformed, refers to
    something Ollie does not know, or holds a value Ollie cannot save."""


OP_NAMESPACES = ("aten", "prims", "ollie")
"""``torch.ops`` namespaces a saved operator overload may name: PyTorch's own operators and
Ollie's (:mod:`ollie.zoo.ops`, registered before one is resolved)."""

CALLABLES: dict[str, Callable[..., Any]] = {
    **{f"operator.{f.__name__}": f
       for f in (operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv,
                 operator.floordiv, operator.mod, operator.neg, operator.pow)},
    "ollie.strided_window": strided_window,
}
"""Plain Python functions an opaque torch operator may call, by name."""

MAX_ARRAY_BYTES = 1 << 20
"""Largest numpy array or tensor kept inline in an attribute (weights are program constants)."""

NUMERIC_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32",
                  "float64")
"""Element types an inline array may have."""


# --------------------------------------------------------------------------- kernels
def kernel_to_json(k: Kernel, with_node: bool = True) -> dict[str, Any]:
    """The JSON document of kernel ``k`` (``with_node``: its graph operator, for a ``Node``
    kernel, included)."""
    where = f"kernel {k.kind} -> {k.output}"
    params = {p: encode(v, f"{where}: parameter '{p}'")
              for p, v in k.params.items() if p != "node"}
    doc: dict[str, Any] = {
        "kind": k.kind.value, "params": params, "inputs": list(k.inputs), "output": k.output,
        "expr": None if k.expr is None else format_expr(k.expr),
        "views": [None if v is None else [v.offset, list(v.sizes), list(v.strides)]
                  for v in k.views],
        "shape": None if k.shape is None else list(k.shape)}
    if isinstance(k.params, NodeParams) and with_node:
        doc["node"] = node_to_json(k.params.node, where)
    return doc


def kernel_from_json(d: object, where: str = "kernel") -> Kernel:
    """The kernel of document ``d`` (:func:`kernel_to_json`); :class:`FormatError` naming
    ``where`` and the field on anything malformed or unknown."""
    d = _mapping(d, where)
    kind_name = _field(d, "kind", str, where)
    if kind_name not in KINDS:
        raise FormatError(f"{where}: unknown kernel kind {kind_name!r} "
                          f"(known: {', '.join(KINDS)})")
    kind = KernelKind(kind_name)
    output = _name(_field(d, "output", str, where), f"{where}: output")
    where = f"{where} ({kind} -> {output})"
    inputs = tuple(_name(n, f"{where}: inputs") for n in _field(d, "inputs", list, where))
    params = {str(p): decode(v, f"{where}: parameter '{p}'")
              for p, v in _mapping(d.get("params", {}), f"{where}: params").items()}
    if "node" in params:
        raise FormatError(f"{where}: parameter 'node' is reserved")
    expr_text = d.get("expr")
    if expr_text is not None and not isinstance(expr_text, str):
        raise FormatError(f"{where}: 'expr' must be expression text or null")
    try:
        expr = None if expr_text is None else parse(expr_text)
    except OllieError as e:
        raise FormatError(f"{where}: expression: {e}") from None
    views = tuple(_view(v, f"{where}: views[{i}]")
                  for i, v in enumerate(_list(d.get("views", []), f"{where}: views")))
    shape_doc = d.get("shape")
    shape = None if shape_doc is None else _shape(shape_doc, f"{where}: shape")
    if kind is KernelKind.NODE:
        if "node" not in d:
            raise FormatError(f"{where}: a Node kernel needs its 'node'")
        node = node_from_json(d["node"], where)
        params["node"] = node
        params.setdefault("op", node.op)
        if shape is None:
            raise FormatError(f"{where}: a Node kernel needs its output 'shape'")
    elif expr is None:
        raise FormatError(f"{where}: a {kind} kernel needs its expression")
    try:
        return Kernel(kind, make_params(kind, params), inputs, output, expr, views, shape)
    except ParamsError as e:
        raise FormatError(f"{where}: {e}") from None


def _view(v: object, where: str) -> View | None:
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != 3:
        raise FormatError(f"{where}: a view is [offset, sizes, strides]")
    offset = _int(v[0], where)
    sizes, strides = _shape(v[1], where), tuple(_int(s, where) for s in _list(v[2], where))
    if len(sizes) != len(strides):
        raise FormatError(f"{where}: {len(sizes)} sizes but {len(strides)} strides")
    return View(offset, sizes, strides)


# --------------------------------------------------------------------------- graph nodes
def node_to_json(node: Any, where: str = "node") -> dict[str, Any]:
    """The JSON document of graph operator ``node`` (an :class:`ollie.graph.Node`)."""
    where = f"{where}: operator {node.op} '{node.name}'"
    return {"op": node.op, "inputs": list(node.inputs), "outputs": list(node.outputs),
            "name": node.name,
            "attrs": {str(a): encode(v, f"{where}: attribute '{a}'")
                      for a, v in node.attrs.items()}}


def node_from_json(d: object, where: str = "node") -> Any:
    """The graph operator of document ``d`` (:func:`node_to_json`)."""
    from ollie.graph import OPAQUE, Node
    from ollie.lower import LOWERINGS

    d = _mapping(d, f"{where}: node")
    op = _field(d, "op", str, f"{where}: node")
    if op != OPAQUE and op not in LOWERINGS:
        raise FormatError(f"{where}: unknown operator {op!r}")
    name = d.get("name", "")
    if not isinstance(name, str):
        raise FormatError(f"{where}: node 'name' must be text")
    where = f"{where}: operator {op} '{name}'"
    inputs = tuple(n if n == "" else _name(n, f"{where}: inputs")
                   for n in _field(d, "inputs", list, where))
    outputs = tuple(_name(n, f"{where}: outputs") for n in _field(d, "outputs", list, where))
    if not outputs:
        raise FormatError(f"{where}: an operator has at least one output")
    attrs = {str(a): decode(v, f"{where}: attribute '{a}'")
             for a, v in _mapping(d.get("attrs", {}), f"{where}: attrs").items()}
    if op == OPAQUE:
        backend = attrs.get("backend")
        if backend == "torch" and not callable(attrs.get("target")):
            raise FormatError(f"{where}: an opaque torch operator needs its 'target'")
        if backend == "onnxruntime" and type(attrs.get("onnx_node")).__name__ != "NodeProto":
            raise FormatError(f"{where}: an opaque ONNX operator needs its 'onnx_node'")
        if backend not in ("torch", "onnxruntime"):
            raise FormatError(f"{where}: unknown opaque backend {backend!r}")
    return Node(op, inputs, outputs, attrs, name)


# --------------------------------------------------------------------------- values
def encode(v: object, where: str) -> Any:
    """``v`` as JSON data (see the module docstring); :class:`FormatError` for a value of
    another type."""
    import torch

    from ollie.graph.opaque import OpRef, TensorRef

    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else {"$float": repr(f)}
    if isinstance(v, TensorRef):
        return {"$ref": v.index}
    if isinstance(v, OpRef):
        return {"$op": str(v)}
    if isinstance(v, list):
        return [encode(x, where) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [encode(x, where) for x in v]}
    if isinstance(v, dict):
        return {"$dict": [[encode(k, where), encode(x, where)] for k, x in v.items()]}
    if isinstance(v, slice):
        return {"$slice": [encode(v.start, where), encode(v.stop, where),
                           encode(v.step, where)]}
    if v is Ellipsis:
        return {"$ellipsis": 0}
    if isinstance(v, torch.dtype):
        return {"$dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"$device": str(v)}
    if isinstance(v, torch.memory_format):
        return {"$memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, torch.layout):
        return {"$layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.Tensor):
        return {"$array": {**_array_doc(v.detach().cpu().numpy(), where), "tensor": True}}
    if isinstance(v, np.ndarray):
        return {"$array": _array_doc(v, where)}
    if type(v).__name__ == "NodeProto" and hasattr(v, "SerializeToString"):
        return {"$onnx": base64.b64encode(v.SerializeToString()).decode()}
    for name, fn in CALLABLES.items():
        if v is fn:
            return {"$callable": name}
    raise FormatError(f"{where}: cannot save a value of type {type(v).__name__} ({v!r:.80})")


def decode(v: object, where: str) -> Any:
    """The value of JSON data ``v`` (:func:`encode`); :class:`FormatError` for anything not
    in the module docstring's list."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, list):
        return [decode(x, where) for x in v]
    if not isinstance(v, dict) or len(v) != 1:
        raise FormatError(f"{where}: malformed value {str(v)[:80]}")
    (tag, body), = v.items()
    fn = _DECODERS.get(tag)
    if fn is None:
        raise FormatError(f"{where}: unknown value type {tag!r}")
    return fn(body, where)


def _decode_float(body: object, where: str) -> float:
    if body not in ("inf", "-inf", "nan"):
        raise FormatError(f"{where}: malformed float {body!r}")
    return float(str(body))


def _decode_dict(body: object, where: str) -> dict:
    out = {}
    for item in _list(body, where):
        if not isinstance(item, list) or len(item) != 2:
            raise FormatError(f"{where}: a dict entry is [key, value]")
        key = decode(item[0], where)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise FormatError(f"{where}: a dict key must be a scalar")
        out[key] = decode(item[1], where)
    return out


def _decode_slice(body: object, where: str) -> slice:
    parts = _list(body, where)
    if len(parts) != 3 or not all(p is None or isinstance(p, int) for p in parts):
        raise FormatError(f"{where}: a slice is [start, stop, step] of integers or null")
    return slice(*parts)


def _decode_ref(body: object, where: str) -> Any:
    from ollie.graph.opaque import TensorRef

    return TensorRef(_int(body, where))


def _decode_op(body: object, where: str) -> Any:
    from ollie.graph.opaque import OpRef

    text = str(body) if isinstance(body, str) else ""
    ns, sep, rest = text.partition("::")
    name, dot, overload = rest.rpartition(".")
    if not (sep and dot and ns and name and overload) or \
            not all(p.replace("_", "a").isalnum() for p in (ns, name, overload)):
        raise FormatError(f"{where}: malformed operator name {body!r}")
    if ns not in OP_NAMESPACES:
        raise FormatError(f"{where}: operator {text} is outside the namespaces Ollie loads "
                          f"({', '.join(OP_NAMESPACES)})")
    if ns == "ollie":
        import ollie.zoo.ops  # noqa: F401 - registers torch.ops.ollie.*
    ref = OpRef(ns, name, overload)
    try:
        ref.resolve()
    except OllieError as e:
        raise FormatError(f"{where}: {e}") from None
    return ref


def _decode_callable(body: object, where: str) -> Callable[..., Any]:
    fn = CALLABLES.get(str(body))
    if fn is None:
        raise FormatError(f"{where}: unknown function {body!r} (known: "
                          f"{', '.join(CALLABLES)})")
    return fn


def _torch_enum(kind: str, cls_name: str) -> Callable[[object, str], Any]:
    """A decoder of the values of type ``torch.<cls_name>`` by their names in ``torch``'s
    namespace (looked up in the module's dictionary: no attribute hook runs)."""
    def decode_enum(body: object, where: str) -> Any:
        import torch

        value = vars(torch).get(body) if isinstance(body, str) else None
        if not isinstance(value, getattr(torch, cls_name)):
            raise FormatError(f"{where}: unknown torch {kind} {body!r}")
        return value

    return decode_enum


def _decode_device(body: object, where: str) -> Any:
    import torch

    text = str(body) if isinstance(body, str) else ""
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda", "meta") or (index and not index.isdigit()):
        raise FormatError(f"{where}: unknown device {body!r}")
    return torch.device(text)


def _array_doc(a: np.ndarray, where: str) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    if a.dtype.name not in NUMERIC_DTYPES:
        raise FormatError(f"{where}: cannot save an array of {a.dtype}")
    if a.nbytes > MAX_ARRAY_BYTES:
        raise FormatError(f"{where}: an inline array of {a.nbytes} bytes (at most "
                          f"{MAX_ARRAY_BYTES})")
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode()}


def _decode_array(body: object, where: str) -> Any:
    d = _mapping(body, where)
    dtype = d.get("dtype")
    if dtype not in NUMERIC_DTYPES:
        raise FormatError(f"{where}: unsupported array element type {dtype!r}")
    shape = _shape(d.get("shape"), where)
    data = d.get("data")
    if not isinstance(data, str) or len(data) > 2 * MAX_ARRAY_BYTES:
        raise FormatError(f"{where}: malformed array data")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise FormatError(f"{where}: array data is not base64") from None
    if len(raw) != math.prod(shape) * np.dtype(str(dtype)).itemsize:
        raise FormatError(f"{where}: {len(raw)} bytes of data for an array of shape "
                          f"{list(shape)} and type {dtype}")
    a = np.frombuffer(raw, dtype=str(dtype)).reshape(shape).copy()
    if d.get("tensor"):
        import torch

        return torch.from_numpy(a)
    return a


def _decode_onnx(body: object, where: str) -> Any:
    import onnx

    try:
        raw = base64.b64decode(str(body), validate=True)
        proto = onnx.NodeProto()
        proto.ParseFromString(raw)
    except Exception as e:  # protobuf's DecodeError, binascii's Error
        raise FormatError(f"{where}: malformed ONNX operator ({type(e).__name__})") from None
    return proto


_DECODERS: dict[str, Callable[[object, str], Any]] = {
    "$float": _decode_float,
    "$tuple": lambda body, where: tuple(decode(x, where) for x in _list(body, where)),
    "$dict": _decode_dict,
    "$slice": _decode_slice,
    "$ellipsis": lambda body, where: Ellipsis,
    "$ref": _decode_ref,
    "$op": _decode_op,
    "$callable": _decode_callable,
    "$dtype": _torch_enum("dtype", "dtype"),
    "$memory_format": _torch_enum("memory format", "memory_format"),
    "$layout": _torch_enum("layout", "layout"),
    "$device": _decode_device,
    "$array": _decode_array,
    "$onnx": _decode_onnx,
}


# --------------------------------------------------------------------------- checks
def _mapping(v: object, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise FormatError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _list(v: object, where: str) -> list:
    if not isinstance(v, list):
        raise FormatError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _field(d: Mapping[str, Any], key: str, typ: type, where: str) -> Any:
    if key not in d:
        raise FormatError(f"{where}: missing field '{key}'")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise FormatError(f"{where}: field '{key}' must be a {typ.__name__}")
    return v


MAX_INT = 1 << 62
"""Integers in a document (offsets, strides, sizes) lie within +-this."""


def _int(v: object, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or abs(v) > MAX_INT:
        raise FormatError(f"{where}: expected an integer, got {str(v)[:40]}")
    return v


def _shape(v: object, where: str) -> tuple[int, ...]:
    dims = tuple(_int(s, where) for s in _list(v, where))
    if any(s < 0 for s in dims):
        raise FormatError(f"{where}: negative size in {list(dims)}")
    return dims


def _name(v: object, where: str) -> str:
    if not isinstance(v, str) or not v.isidentifier():
        raise FormatError(f"{where}: {str(v)[:40]!r} is not a tensor name")
    return v


def shape_of(v: object, where: str) -> tuple[int, ...]:
    """A shape (list of non-negative integers) from a document."""
    return _shape(v, where)


def name_of(v: object, where: str) -> str:
    """A tensor name from a document."""
    return _name(v, where)


__all__ = ["CALLABLES", "MAX_ARRAY_BYTES", "OP_NAMESPACES", "FormatError", "decode", "encode",
           "kernel_from_json", "kernel_to_json", "name_of", "node_from_json", "node_to_json",
           "shape_of"]
