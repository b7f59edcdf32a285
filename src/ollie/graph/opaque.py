"""Opaque nodes: operators without an expression, executed as they are.

Two backends, chosen by ``attrs["backend"]``:

* ``"onnxruntime"``: ``attrs["onnx_node"]`` is an ONNX ``NodeProto`` whose inputs / outputs are
  renamed ``in0, in1, ...`` / ``out0, ...`` (an empty name stays empty: an omitted optional
  input), run as a single-node model with ``attrs["opset_imports"]``
  (``((domain, version), ...)``); sessions are cached per node and input signature.
* ``"torch"``: ``attrs["target"]`` is a callable called with ``attrs["args"]`` /
  ``attrs["kwargs"]`` in which :class:`TensorRef` ``(i)`` stands for the node's input ``i``; a
  tuple / list result gives the outputs in order. A torch operator overload (``aten`` ops,
  usually) is stored as an :class:`OpRef`, its qualified name: overloads cannot be pickled,
  and a node must be (program digests and ``save``).

Both carry ``output_shapes`` and ``output_dtypes`` (numpy dtype names) for shape inference.
:func:`run_onnx_node` is also the frontends' constant-folding fallback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ollie.errors import OllieError, UnsupportedError

_SESSIONS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class TensorRef:
    """Placeholder for input ``index`` of an opaque torch node in its ``args`` / ``kwargs``."""

    index: int


@dataclass(frozen=True)
class OpRef:
    """A torch operator overload by name, ``torch.ops.<namespace>.<name>.<overload>``:
    callable like the overload, and picklable (an overload object is not)."""

    namespace: str
    name: str
    overload: str

    @classmethod
    def of(cls, op: Any) -> OpRef:
        """The reference to overload ``op``."""
        return cls(str(op.namespace), str(op._overloadpacket.__name__), str(op._overloadname))

    def resolve(self) -> Callable[..., Any]:
        try:
            return getattr(getattr(getattr(torch.ops, self.namespace), self.name), self.overload)
        except (AttributeError, RuntimeError) as e:
            raise UnsupportedError(f"torch operator {self} is not available in this PyTorch "
                                   f"({torch.__version__})") from e

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.namespace}::{self.name}.{self.overload}"


# --------------------------------------------------------------------- attribute builders
def torch_opaque_attrs(target: Callable[..., Any], args: Any, kwargs: dict[str, Any],
                       output_shapes: Sequence[Sequence[int]],
                       output_dtypes: Sequence[str]) -> dict[str, Any]:
    """Attributes of an opaque node calling ``target`` (an overload is kept as an
    :class:`OpRef`)."""
    if isinstance(target, torch._ops.OpOverload):
        target = OpRef.of(target)
    return {"backend": "torch", "op_type": _target_name(target), "target": target,
            "args": args, "kwargs": dict(kwargs),
            "output_shapes": [tuple(int(d) for d in s) for s in output_shapes],
            "output_dtypes": list(output_dtypes)}


def onnx_opaque_attrs(node: Any, opset_imports: Sequence[tuple[str, int]],
                      output_shapes: Sequence[Sequence[int]],
                      output_dtypes: Sequence[str]) -> dict[str, Any]:
    """``node``: an ONNX NodeProto (copied, inputs / outputs renamed ``inK`` / ``outK``)."""
    import onnx

    proto = onnx.NodeProto()
    proto.CopyFrom(node)
    for k, name in enumerate(node.input):
        proto.input[k] = f"in{k}" if name else ""
    for k in range(len(node.output)):
        proto.output[k] = f"out{k}"
    return {"backend": "onnxruntime", "op_type": node.op_type, "domain": node.domain,
            "onnx_node": proto, "opset_imports": tuple((d, int(v)) for d, v in opset_imports),
            "output_shapes": [tuple(int(d) for d in s) for s in output_shapes],
            "output_dtypes": list(output_dtypes)}


def _target_name(target: Any) -> str:
    if isinstance(target, OpRef):
        return target.name if target.overload == "default" else \
            f"{target.name}.{target.overload}"
    name = getattr(target, "__name__", None) or repr(target)
    overload = getattr(target, "_overloadname", None)
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        name = getattr(packet, "__name__", name)
        if overload and overload != "default":
            name = f"{name}.{overload}"
    return str(name)


# --------------------------------------------------------------------- execution
def run_opaque(node: Any, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run opaque ``node`` (an ``ollie.graph.Node``) on its input tensors."""
    backend = node.attrs.get("backend")
    if backend == "torch":
        return _run_torch(node.attrs, tensors)
    if backend == "onnxruntime":
        arrays = [t.detach().cpu().numpy() for t in tensors]
        outs = run_onnx_node(node.attrs["onnx_node"], node.attrs["opset_imports"], arrays)
        return [torch.from_numpy(np.array(o, copy=True)) for o in outs]
    raise UnsupportedError(f"opaque node '{node.name}' has no known backend ({backend!r})")


def meta_outputs(node: Any) -> list[torch.Tensor] | None:
    """Meta tensors of an opaque node's declared outputs (None when not declared)."""
    shapes = node.attrs.get("output_shapes")
    dtypes = node.attrs.get("output_dtypes")
    if shapes is None or dtypes is None or len(shapes) != len(node.outputs):
        return None
    return [torch.empty(tuple(s), dtype=torch_dtype(d), device="meta")
            for s, d in zip(shapes, dtypes, strict=True)]


def _substitute(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, TensorRef):
        return tensors[obj.index]
    if isinstance(obj, list):
        return [_substitute(o, tensors) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_substitute(o, tensors) for o in obj)
    if isinstance(obj, dict):
        return {k: _substitute(v, tensors) for k, v in obj.items()}
    return obj


def strided_window(x: torch.Tensor, perm: Sequence[int], size: Sequence[int],
                   stride: Sequence[int], offset: int) -> torch.Tensor:
    """``torch.as_strided`` over the values of ``x``, whatever its memory layout: element
    ``i`` of the result is ``flat[offset + sum(i[k] * stride[k])]``, ``flat`` the values of
    ``x.permute(perm)`` in row-major order. ``as_strided`` itself reads ``x``'s storage, so its
    result depends on how ``x`` is laid out in memory, which a program does not keep (an
    operator's output is a new contiguous tensor, or a view); the importer
    (:mod:`ollie.frontend.torch_views`) fixes the traced layout in ``perm`` and ``offset``.
    The result may be a view of ``x``."""
    flat = x.permute(*perm).contiguous().view(-1)
    return torch.as_strided(flat, tuple(size), tuple(stride), flat.storage_offset() + offset)


def _run_torch(attrs: dict[str, Any], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    out = attrs["target"](*_substitute(attrs["args"], tensors),
                          **_substitute(attrs["kwargs"], tensors))
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


# --------------------------------------------------------------------- onnxruntime
def run_onnx_node(node: Any, opset_imports: Sequence[tuple[str, int]],
                  arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run one ONNX node on numpy arrays with onnxruntime. ``arrays`` are the values of the
    node's non-empty inputs, in order (an empty input name is an omitted optional input)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    proto, feeds, value_infos = single_node(node, arrays)
    sig = (proto.SerializeToString(), tuple(opset_imports),
           tuple((n, a.dtype.str, a.shape) for n, a in feeds.items()))
    with _LOCK:
        sess = _SESSIONS.get(sig)
    if sess is None:
        outputs = [helper.make_value_info(f"out{k}", onnx.TypeProto())
                   for k in range(len(node.output)) if node.output[k]]
        opsets = [helper.make_opsetid(d, v) for d, v in opset_imports]
        graph = helper.make_graph([proto], "opaque", value_infos, outputs)
        model = helper.make_model(graph, opset_imports=opsets,
                                  ir_version=min(helper.find_min_ir_version_for(opsets), 10))
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            sess = ort.InferenceSession(model.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
        except Exception as e:
            raise UnsupportedError(f"onnxruntime cannot run node '{node.name}' "
                                   f"({node.domain or 'ai.onnx'}.{node.op_type}): "
                                   f"{_first_line(e)}") from None
        with _LOCK:
            if len(_SESSIONS) > 512:
                _SESSIONS.clear()
            _SESSIONS[sig] = sess
    try:
        return list(sess.run(None, feeds))
    except Exception as e:
        raise OllieError(f"onnxruntime failed on node '{node.name}' ({node.op_type}): "
                         f"{_first_line(e)}") from None


def single_node(node: Any, arrays: Sequence[np.ndarray]) -> tuple[Any, dict, list]:
    """A copy of ``node`` with inputs ``inK`` / outputs ``outK``, the feeds and the input
    value infos (see :func:`run_onnx_node` for ``arrays``)."""
    import onnx
    from onnx import helper

    proto = onnx.NodeProto()
    proto.CopyFrom(node)
    feeds: dict[str, np.ndarray] = {}
    value_infos = []
    it = iter(arrays)
    for k, name in enumerate(node.input):
        if not name:
            continue
        a = np.asarray(next(it))
        proto.input[k] = f"in{k}"
        feeds[f"in{k}"] = a
        value_infos.append(helper.make_tensor_value_info(
            f"in{k}", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    for k in range(len(node.output)):
        proto.output[k] = f"out{k}"
    return proto, feeds, value_infos


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# --------------------------------------------------------------------- dtypes
def torch_dtype(name: str) -> torch.dtype:
    """numpy dtype name -> torch dtype."""
    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(name))).dtype
    except TypeError:
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            return dt
        raise UnsupportedError(f"unsupported tensor element type '{name}'") from None


def dtype_name(dtype: torch.dtype) -> str:
    """torch dtype -> numpy dtype name (torch's own name when numpy has none)."""
    try:
        return str(torch.empty(0, dtype=dtype).numpy().dtype)
    except TypeError:
        return str(dtype).removeprefix("torch.")
