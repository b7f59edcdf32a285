"""Convolutions run by ONNX Runtime's CPU kernels (MLAS): a third library implementation of a
convolution kernel, next to oneDNN with packed weights and eager PyTorch.

On some CPUs and shapes MLAS's convolution is much faster than oneDNN's
(docs/design/003-library-kernels-on-the-cpu.md); the runtime measures the implementations once
per configuration and keeps the fastest (:func:`ollie.exec.conv.best_conv`).

:func:`ort_conv` builds a one-node ONNX model (weights and bias as initializers, the input
shape fixed, the activation as a following node that ONNX Runtime fuses) and an inference
session with every graph optimisation, the same number of threads as PyTorch, and no
busy-waiting between runs (spinning threads would take the cores from the next kernel). The
result is checked against PyTorch on a random input; any failure gives ``None``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from ollie.activations import ACTIVATIONS

log = logging.getLogger(__name__)
Conv = Callable[..., torch.Tensor]


EXTERNAL_BYTES = 4096
"""Float32 weights of at least this many bytes go to :func:`session` beside the serialized
model (``weights``) rather than inside it: a region of a transformer holds hundreds of MB of
weights, and serializing them and parsing them back took most of a warm ``ollie.optimize``
(docs/design/034-warm-sessions.md). Smaller tensors (shapes, axes, scalars) stay in the model,
where ONNX Runtime's shape inference and constant folding read them."""


def session(graph: object, spinning: bool = False,
            weights: Mapping[str, np.ndarray] | None = None) -> object:
    """An ONNX Runtime CPU session for the ONNX ``graph`` (opset 18, for ``Col2Im``; checked
    first): every graph optimisation and PyTorch's number of threads. Its threads busy-wait
    for work only with ``spinning`` (ONNX Runtime's default): spinning threads keep taking
    the cores for a while after a run, from whatever kernel of the program runs next.

    ``weights``: initializers the nodes of ``graph`` read that are not in it (contiguous
    float32 arrays, names distinct from the graph's): ONNX Runtime copies them into the
    session before it optimises the graph, as if they were the model's own initializers,
    without a round trip through protobuf."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    weights = dict(weights or {})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    if weights:  # checked as inputs: the checker reads external data from files only
        check = onnx.ModelProto()
        check.CopyFrom(model)
        check.graph.input.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                               list(a.shape))
                                 for n, a in weights.items())
        onnx.checker.check_model(check.SerializeToString())
        model.graph.initializer.extend(_stub(n, a) for n, a in weights.items())
        data = model.SerializeToString()
    else:
        data = model.SerializeToString()  # once: a region's weights make it hundreds of MB
        onnx.checker.check_model(data)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if weights:
        names = list(weights)
        so.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(
            np.ascontiguousarray(weights[n], dtype=np.float32)) for n in names])
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _stub(name: str, array: np.ndarray) -> object:
    """A float32 initializer ``name`` shaped like ``array`` whose data is external: the
    place :meth:`onnxruntime.SessionOptions.add_external_initializers` fills."""
    from onnx import TensorProto

    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(array.shape),
                    data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "ollie-weights"), ("offset", "0"),
                       ("length", str(4 * array.size))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def ort_conv(op: str, weight: torch.Tensor, bias: torch.Tensor | None,
             input_shape: tuple[int, ...], stride: tuple[int, int], padding: tuple[int, int],
             dilation: tuple[int, int], groups: int = 1,
             output_padding: tuple[int, int] = (0, 0), activation: str | None = None,
             residual: bool = False) -> Conv | None:
    """``x -> f(op(x, weight, bias, ...))`` for ``op`` ``"Conv2d"`` / ``"ConvTranspose2d"``
    on float32 NCHW inputs of ``input_shape`` (with ``residual``: ``(x, r) -> f(op(x, ...) +
    r)``, an Add node ONNX Runtime fuses into the convolution); ``None`` where ONNX Runtime
    cannot run it."""
    if op not in ("Conv2d", "ConvTranspose2d") or (activation and activation not in ACTIVATIONS):
        return None
    try:
        from onnx import TensorProto, helper, numpy_helper

        w = weight.detach().cpu().float().contiguous()
        b = None if bias is None else bias.detach().cpu().float().contiguous()
        if op == "Conv2d":
            want = F.conv2d(torch.zeros(input_shape), w, b, stride, padding, dilation, groups)
        else:
            want = F.conv_transpose2d(torch.zeros(input_shape), w, b, stride, padding,
                                      output_padding, groups, dilation)
        out_shape = list(want.shape)
        attrs = dict(strides=list(stride), pads=[*padding, *padding], dilations=list(dilation),
                     group=groups, kernel_shape=list(w.shape[2:]))
        if op == "ConvTranspose2d":
            attrs["output_padding"] = list(output_padding)
        inits = [numpy_helper.from_array(w.numpy(), "W")]
        names = ["X", "W"]
        if b is not None:
            inits.append(numpy_helper.from_array(b.numpy(), "B"))
            names.append("B")
        conv_out = "C" if activation or residual else "Y"
        nodes = [helper.make_node("Conv" if op == "Conv2d" else "ConvTranspose", names,
                                  [conv_out], **attrs)]
        inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(input_shape))]
        if residual:
            inputs.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, out_shape))
            nodes.append(helper.make_node("Add", ["C", "Z"], ["S" if activation else "Y"]))
        if activation:
            nodes.append(helper.make_node(ACTIVATIONS[activation].onnx, ["S" if residual else "C"],
                                          ["Y"]))
        graph = helper.make_graph(
            nodes, "conv", inputs,
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out_shape)], inits)
        sess = session(graph)
    except Exception as exc:  # an unavailable backend is only skipped
        log.info("no ONNX Runtime convolution for input %s: %s", list(input_shape), exc)
        return None

    def run(x: torch.Tensor, *r: torch.Tensor) -> torch.Tensor:
        feed = {"X": x.detach().contiguous().numpy()}
        if r:
            feed["Z"] = r[0].detach().contiguous().numpy()
        return torch.from_numpy(sess.run(None, feed)[0])

    from ollie.libs.onednn import checked, with_epilogue

    def conv(x: torch.Tensor) -> torch.Tensor:
        if op == "Conv2d":
            return F.conv2d(x, w, b, stride, padding, dilation, groups)
        return F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)

    try:
        return checked(run, with_epilogue(activation, residual, conv), input_shape, residual)
    except Exception as exc:
        log.info("ONNX Runtime convolution failed for input %s: %s", list(input_shape), exc)
        return None


__all__ = ["ort_conv", "session"]
