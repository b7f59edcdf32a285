"""Whole-model checks: every zoo model through from_torch and through ONNX (to_onnx ->
from_onnx) runs on the reference executor with the module's output, and every non-opaque node
lowers to an expression with the node's shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from frontend_testutil import REL_TOL, model, onnx_model, rel_err

import ollie.zoo as zoo
from ollie.frontend import from_onnx, from_torch, to_onnx
from ollie.graph import Graph, run_graph

# expected operator counts of the from_torch graphs
TORCH_OPS = {
    "infogan": {"ConvTranspose2d": 5, "Relu": 4, "Tanh": 1},
    "dcgan": {"ConvTranspose2d": 5, "Relu": 4, "Tanh": 1},
    "srcnn": {"Conv2d": 3, "Relu": 2},
    "gcn": {"Add": 32, "BatchNorm": 53, "Conv2d": 87, "ConvTranspose2d": 5, "MaxPool2d": 1,
            "Relu": 58},
    "resnet18": {"Add": 8, "BatchNorm": 20, "Conv2d": 20, "Gemm": 1, "GlobalAveragePool": 1,
                 "MaxPool2d": 1, "Relu": 17, "Reshape": 1},
    "csrnet": {"Conv2d": 6, "Relu": 6},
    "longformer": {"Add": 6, "G2BMM": 1, "GBMM": 1, "MatMul": 5, "Relu": 2, "Reshape": 8,
                   "Softmax": 1, "Transpose": 4},
}


def check_lowering(graph: Graph) -> int:
    n = 0
    for node in graph.lowerable_nodes():
        low = graph.lower_node(node)
        assert tuple(low.output_shape) == graph.shapes[node.outputs[0]], node
        n += 1
    return n


@pytest.mark.parametrize("name", zoo.NAMES)
def test_from_torch(name: str) -> None:
    module, x, y = model(name)
    graph = from_torch(module, (x,), name=name)
    assert graph.op_counts() == TORCH_OPS[name]
    assert "Opaque" not in graph.op_counts()
    out = run_graph(graph, {graph.input_names[0]: x})
    assert list(out) == graph.outputs
    assert rel_err(out[graph.outputs[0]], y) < REL_TOL
    assert graph.shapes[graph.outputs[0]] == tuple(y.shape)
    assert check_lowering(graph) == len(graph.nodes) - graph.op_counts().get("MaxPool2d", 0) \
        - graph.op_counts().get("Softmax", 0)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_from_onnx(name: str) -> None:
    _, x, y = model(name)
    graph = from_onnx(onnx_model(name))
    counts = graph.op_counts()
    assert "Opaque" not in counts
    assert "BatchNorm" not in counts  # the exporter folds inference BatchNorm
    if name in ("gcn", "resnet18"):
        assert counts["Conv2d"] == TORCH_OPS[name]["Conv2d"]
    out = graph(x)  # positional call of the reference executor
    assert rel_err(out, y) < REL_TOL
    check_lowering(graph)


TRANSFORMERS = {
    "bert": ({"seq": 32, "hidden": 64, "heads": 4, "ffn": 128},
             {"Add": 8, "Div": 1, "MatMul": 8, "Opaque[gelu]": 1, "Opaque[layer_norm]": 2,
              "Reshape": 4, "Softmax": 1, "Transpose": 5}),
    "longformer_plain": ({"seq": 48, "width": 3, "dilation": 2},
                         {"Add": 6, "MatMul": 5, "Mul": 2, "Pad": 2, "ReduceSum": 2, "Relu": 2,
                          "Reshape": 10, "Slice": 2, "Softmax": 1, "Transpose": 4,
                          "Unfold": 2}),
}


@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_transformers_from_torch(name: str) -> None:
    options, ops = TRANSFORMERS[name]
    module, (x,) = zoo.get(name, batch=2, **options)
    graph = from_torch(module, (x,), name=name)
    assert graph.op_counts() == ops
    with torch.no_grad():
        y = module(x)
    assert rel_err(graph(x), y) < REL_TOL
    assert check_lowering(graph) == len(graph.lowerable_nodes())


def test_onnx_file_and_onnxruntime_baseline(tmp_path) -> None:
    import onnxruntime as ort

    module, x, y = model("srcnn")
    path = to_onnx(module, (x,), tmp_path / "srcnn.onnx")
    graph = from_onnx(path)
    assert graph.name == "srcnn"
    assert rel_err(run_graph(graph, {"input": x})[graph.outputs[0]], y) < REL_TOL
    _, x, y = model("resnet18")  # the exported CNNs run on ONNX Runtime (the baseline)
    sess = ort.InferenceSession(onnx_model("resnet18").SerializeToString(),
                                providers=["CPUExecutionProvider"])
    (ort_out,) = sess.run(None, {"input": x.numpy()})
    assert rel_err(torch.from_numpy(ort_out), y) < REL_TOL


def test_longformer_onnx_custom_domain() -> None:
    proto = onnx_model("longformer")
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert ("ollie", "G2BMM") in ops and ("ollie", "GBMM") in ops
    g2 = next(n for n in proto.graph.node if n.op_type == "G2BMM")
    attrs = {a.name: a.i for a in g2.attribute}
    assert attrs == {"width": 16, "dilation": 4}


def test_fold_batchnorm_option() -> None:
    module, x, y = model("resnet18")
    graph = from_torch(module, (x,), fold_batchnorm=True)
    assert "BatchNorm" not in graph.op_counts()
    assert rel_err(graph(x), y) < REL_TOL
    assert np.all([graph.initializers[n].dtype == np.float32 for n in graph.initializers])
