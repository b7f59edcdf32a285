"""Graph IR: validation, naming, shapes, lower_node, the executor's interface, passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ollie
from ollie.errors import OllieError, UnsupportedError
from ollie.graph import OPAQUE, Graph, GraphError, Node, TensorRef, run_graph, sanitize
from ollie.graph.opaque import torch_opaque_attrs
from ollie.graph.passes import eliminate_identity, fold_batchnorm

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_bn_graph() -> Graph:
    inits = {"w": rand(4, 3, 3, 3), "b": rand(4), "gamma": rand(4), "beta": rand(4),
             "mean": rand(4), "var": np.abs(rand(4)) + 0.5, "two": np.asarray(2.0, np.float32)}
    nodes = [
        Node("Conv2d", ("x", "w", "b"), ("c",), {"padding": 1}),
        Node("BatchNorm", ("c", "gamma", "beta", "mean", "var"), ("n",), {"eps": 1e-5}),
        Node("Relu", ("n",), ("r",)),
        Node("Mul", ("r", "two"), ("m",)),
        Node("Identity", ("m",), ("y",)),
    ]
    return Graph([("x", (2, 3, 5, 5))], ["y"], nodes, inits, "convbn").infer_shapes()


def test_shapes_and_counts() -> None:
    g = conv_bn_graph()
    assert g.shapes["c"] == (2, 4, 5, 5) and g.shapes["y"] == (2, 4, 5, 5)
    assert g.shapes["two"] == () and g.dtypes["y"] == "float32"
    assert g.op_counts() == {"BatchNorm": 1, "Conv2d": 1, "Identity": 1, "Mul": 1, "Relu": 1}
    assert [n.name for n in g.consumers()["r"]] == ["m"]
    assert g.producers()["n"].op == "BatchNorm"
    assert "convbn" in g.summary()


def test_lower_node_batchnorm_and_scalar() -> None:
    g = conv_bn_graph()
    bn = g.nodes[1]
    low = g.lower_node(bn)
    assert set(low.expr.inputs) == {"c"} | set(low.consts)
    c = rand(2, 4, 5, 5)
    want = F.batch_norm(torch.from_numpy(c), *(torch.from_numpy(g.initializers[k])
                                               for k in ("mean", "var", "gamma", "beta")))
    np.testing.assert_allclose(ollie.interpret(low.expr, {"c": c, **low.consts}), want.numpy(),
                               rtol=1e-4, atol=1e-5)
    mul = g.lower_node(g.nodes[3])  # the rank-0 scalar is lowered as shape (1,)
    assert mul.expr.inputs["two"] == (1,)


def test_run_graph_matches_torch_and_feeds() -> None:
    g = conv_bn_graph()
    x = torch.randn(2, 3, 5, 5)
    i = {k: torch.from_numpy(v) for k, v in g.initializers.items()}
    c = F.conv2d(x, i["w"], i["b"], padding=1)
    want = F.batch_norm(c, i["mean"], i["var"], i["gamma"], i["beta"]).relu() * 2
    torch.testing.assert_close(run_graph(g, {"x": x})["y"], want)
    torch.testing.assert_close(run_graph(g, [x])["y"], want)
    torch.testing.assert_close(g(x), want)
    torch.testing.assert_close(g(x=x.numpy()), want)


def test_passes() -> None:
    g = conv_bn_graph()
    x = torch.randn(2, 3, 5, 5)
    f = fold_batchnorm(g)
    assert f.op_counts() == {"Conv2d": 1, "Identity": 1, "Mul": 1, "Relu": 1}
    assert "gamma" not in f.initializers and "gamma" in g.initializers  # g is unchanged
    torch.testing.assert_close(f(x), g(x), rtol=1e-5, atol=1e-5)
    e = eliminate_identity(f)
    assert "Identity" not in e.op_counts() and e.outputs == ["y"]
    torch.testing.assert_close(e(x), g(x), rtol=1e-5, atol=1e-5)
    passthrough = Graph([("x", (2,))], ["y"], [Node("Identity", ("x",), ("y",))])
    assert eliminate_identity(passthrough.infer_shapes()).op_counts() == {"Identity": 1}


def test_opaque_torch_node() -> None:
    attrs = torch_opaque_attrs(torch.ops.aten.cumsum.default, (TensorRef(0), 1), {},
                               [(2, 3)], ["float32"])
    g = Graph([("x", (2, 3))], ["y"], [Node(OPAQUE, ("x",), ("y",), attrs)]).infer_shapes()
    assert g.shapes["y"] == (2, 3) and g.op_counts() == {"Opaque[cumsum]": 1}
    x = torch.randn(2, 3)
    torch.testing.assert_close(g(x), x.cumsum(1))
    with pytest.raises(UnsupportedError, match="opaque"):
        g.lower_node(g.nodes[0])
    assert g.lowerable_nodes() == []


def test_validation_errors() -> None:
    with pytest.raises(GraphError, match="undefined tensor 'z'"):
        Graph([("x", (2,))], ["y"], [Node("Relu", ("z",), ("y",))]).validate()
    with pytest.raises(GraphError, match="defined twice"):
        Graph([("x", (2,))], ["x"], [Node("Relu", ("x",), ("x",))]).validate()
    with pytest.raises(GraphError, match="invalid name"):
        Graph([("x.1", (2,))], ["y"], [Node("Relu", ("x.1",), ("y",))]).validate()
    with pytest.raises(GraphError, match="invalid name"):
        Graph([("relu", (2,))], ["relu"], []).validate()
    with pytest.raises(GraphError, match="unknown operator 'Frobnicate'"):
        Graph([("x", (2,))], ["y"], [Node("Frobnicate", ("x",), ("y",))]).validate()
    with pytest.raises(GraphError, match="output 'q'"):
        Graph([("x", (2,))], ["q"], []).validate()
    bad = Graph([("x", (2, 3))], ["y"], [Node("MatMul", ("x", "x"), ("y",), name="mm")])
    with pytest.raises(OllieError, match="'mm'"):
        bad.infer_shapes()


def test_sanitize() -> None:
    taken: set[str] = set()
    assert sanitize("/layer1/Conv_output_0", taken) == "layer1_Conv_output_0"
    assert sanitize("onnx::Conv_12", taken) == "onnx__Conv_12"
    assert sanitize("123", taken) == "t_123"
    assert sanitize("relu", taken) == "relu_1"  # expression-language function name
    assert sanitize("L", taken) == "L_1"
    assert sanitize("x", taken) == "x" and sanitize("x", taken) == "x_1"
    assert sanitize("", taken) == "t"


@pytest.mark.gpu
def test_run_graph_on_cuda() -> None:
    g = conv_bn_graph()
    x = torch.randn(2, 3, 5, 5)
    out = run_graph(g, {"x": x.cuda()})["y"]
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), g(x), rtol=1e-4, atol=1e-4)
