"""Examples of the linear-region partition: attention (zoo Longformer), the GCN block, a ResNet
downsampling block, SqueezeNet fire modules, and hand-built graphs for the edge cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ollie.zoo as zoo
from ollie.errors import ConfigError
from ollie.frontend.builder import GraphBuilder
from ollie.graph import Graph, GraphError, Node, run_graph
from ollie.graph.partition import Region, RegionLimits, partition, region_of
from ollie.optimizer.model import to_graph
from ollie.testing import cnns
from ollie.testing.partitions import check_partition, item_index, run_items
from ollie.zoo.gcn import GCNBlock
from ollie.zoo.resnet import BasicBlock

LIMITS = RegionLimits()


def _checked(graph: Graph, limits: RegionLimits = LIMITS) -> list[Region | Node]:
    items = partition(graph, limits)
    check_partition(graph, items, limits)
    feeds = {n: torch.randn(s) for n, s in graph.inputs}
    want, got = run_graph(graph, feeds), run_items(graph, items, feeds)
    for o in graph.outputs:
        torch.testing.assert_close(got[o], want[o], rtol=1e-6, atol=1e-6)
    return items


def _ops(item: Region | Node) -> list[str]:
    return [n.op for n in item.nodes] if isinstance(item, Region) else [item.op]


def test_longformer_first_region_holds_qkv_and_g2bmm():
    module, x = zoo.get("longformer", seq=32, width=4, dilation=2)
    graph = to_graph(module, x)
    items = _checked(graph)
    first = items[0]
    assert isinstance(first, Region)
    ops = _ops(first)
    assert sorted(ops) == sorted(["MatMul", "Add", "Reshape", "Transpose", "Reshape"] * 3
                                 + ["G2BMM"])
    assert first.compute == 4 and first.inputs == tuple(graph.input_names)
    by_op = {n.op: n for n in graph.nodes}
    v = by_op["GBMM"].inputs[1]  # the value projection, read by the next region
    assert set(first.outputs) == {by_op["G2BMM"].outputs[0], v}
    # the softmax is a boundary; GBMM and the first feed-forward projection form one region
    assert _ops(items[1]) == ["Softmax"]
    assert _ops(items[2]) == ["GBMM", "Reshape", "Transpose", "Reshape", "MatMul", "Add"]
    assert items[2].inputs == (by_op["Softmax"].outputs[0], v)


def test_gcn_block_is_one_region():
    graph = to_graph(GCNBlock(8, 4).eval(), (torch.randn(1, 8, 16, 16),))
    (region,) = _checked(graph)
    assert isinstance(region, Region)
    assert sorted(_ops(region)) == ["Add"] + ["Conv2d"] * 4
    assert region.inputs == tuple(graph.input_names)
    assert region.outputs == tuple(graph.outputs)


def test_resnet_downsample_block_stays_convex():
    """conv1 (3x3 s2) and the downsampling conv (1x1 s2) read x; the sibling union of the two
    is convex and accepted. The add joins conv2 (its first operand), and cannot also join the
    region of conv1: conv1 -> relu -> conv2 -> add would leave it and re-enter."""
    graph = to_graph(BasicBlock(8, 16, stride=2).eval(), (torch.randn(1, 8, 16, 16),))
    items = _checked(graph)
    assert [_ops(it) for it in items] == [["Conv2d", "Conv2d"], ["Relu"], ["Conv2d", "Add"],
                                          ["Relu"]]
    x = graph.input_names[0]
    assert [n.inputs[0] for n in items[0].nodes] == [x, x]
    assert [n.attrs["stride"] for n in items[0].nodes] == [(2, 2), (2, 2)]
    where = item_index(items)
    add = next(n for n in graph.nodes if n.op == "Add")
    conv1 = items[0].nodes[0]
    assert where[id(add)] != where[id(conv1)]


def test_squeezenet_fire_expands_are_one_region_and_concat_stays_outside():
    graph = to_graph(cnns.build("squeezenet", w=16, size=32), (torch.randn(1, 3, 32, 32),))
    items = _checked(graph)
    producer = graph.producers()
    where = item_index(items)
    concats = [n for n in graph.nodes if n.op == "Concat"]
    assert len(concats) == 3
    for cat in concats:
        relus = [producer[t] for t in cat.inputs]
        assert [r.op for r in relus] == ["Relu", "Relu"]
        e1, e3 = (producer[r.inputs[0]] for r in relus)
        region = items[where[id(e1)]]
        assert isinstance(region, Region) and region.nodes == (e1, e3)
        assert e1.inputs[0] == e3.inputs[0]
        assert [n.attrs["padding"] for n in region.nodes] == [(0, 0), (1, 1)]
        assert where[id(cat)] != where[id(e1)]


def _builder() -> tuple[GraphBuilder, np.random.Generator]:
    return GraphBuilder("g", track_shapes=True), np.random.default_rng(0)


def _conv(b: GraphBuilder, rng: np.random.Generator, x: str) -> str:
    w = b.add_const(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
    return b.emit1("Conv2d", [x, w], {}, "conv")


def test_convexity_counts_paths_through_other_regions():
    """{a, d} is convex in the graph, but a -> relu -> v1 and v2 -> relu -> d pass through the
    region {v1, v2}: contracted, a union of a and d would be a cycle."""
    b, rng = _builder()
    x = b.add_input("x", (1, 2, 3, 3))
    y = b.add_input("y", (1, 2, 3, 3))
    a = _conv(b, rng, x)
    r1 = b.emit1("Relu", [a])
    t = b.emit1("Relu", [y])
    v1 = b.emit1("Add", [r1, t], {}, "v1")
    v2 = _conv(b, rng, t)
    d = b.emit1("Add", [b.emit1("Relu", [v2]), x], {}, "d")
    b.add_output(v1)
    b.add_output(d)
    graph = b.finish()
    items = _checked(graph)
    where = item_index(items)
    by_out = {n.outputs[0]: n for n in graph.nodes}
    assert where[id(by_out[v1])] == where[id(by_out[v2])]  # siblings over t
    assert where[id(by_out[a])] != where[id(by_out[d])]


def test_limits_bound_regions_and_bare_layout_nodes_stay_nodes():
    b, rng = _builder()
    h = b.add_input("x", (1, 2, 3, 3))
    for _ in range(5):
        h = _conv(b, rng, h)
    b.add_output(b.emit1("Transpose", [b.emit1("Relu", [h])], {"perm": (0, 1, 3, 2)}))
    graph = b.finish()
    items = _checked(graph, RegionLimits(max_compute=2))
    assert [_ops(it) for it in items] == [["Conv2d"] * 2, ["Conv2d"] * 2, ["Conv2d"], ["Relu"],
                                          ["Transpose"]]
    assert isinstance(items[-1], Node)
    assert len(_checked(graph, RegionLimits(max_nodes=1))) == len(graph.nodes)


def test_mul_and_div_are_linear_only_by_a_constant():
    b, rng = _builder()
    x = b.add_input("x", (1, 2, 3, 3))
    c = b.add_const(np.float32(2.0), "c")
    a = _conv(b, rng, x)
    scaled = b.emit1("Div", [b.emit1("Mul", [c, a]), c])  # linear: joins the conv
    inverse = b.emit1("Div", [c, scaled])                 # c / x: a boundary
    b.add_output(_conv(b, rng, b.emit1("Mul", [inverse, inverse])))  # x * x: a boundary
    graph = b.finish()
    items = _checked(graph)
    assert [_ops(it) for it in items] == [["Conv2d", "Mul", "Div"], ["Div"], ["Mul"],
                                          ["Conv2d"]]


@pytest.mark.parametrize("field", ["max_nodes", "max_compute", "max_outputs", "max_group"])
def test_limits_are_checked(field):
    with pytest.raises(ConfigError, match=field):
        RegionLimits(**{field: 0})


def test_partition_command_prints_the_regions(capsys):
    from ollie.cli import main

    args = ["partition", "zoo:longformer", "-O", "seq=32", "-O", "width=4", "-O", "dilation=2",
            "--repeat", "1", "--list"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "28 nodes (7 compute) -> 7 items: 3 regions (3 of several nodes), 4 single nodes" in out
    assert "region sizes (nodes:count): 2:1 6:1 16:1" in out
    assert out.count("Region([") == 3
    assert main(["partition", "zoo:longformer", "-O", "seq"]) == 2
    assert "KEY=INT" in capsys.readouterr().err


def test_region_of_refuses_nodes_of_another_graph():
    b, rng = _builder()
    b.add_output(_conv(b, rng, b.add_input("x", (1, 2, 3, 3))))
    graph = b.finish()
    other = Node("Relu", ("x",), ("y",))
    with pytest.raises(GraphError, match="another graph"):
        region_of(graph, [graph.nodes[0], other])
    assert region_of(graph, graph.nodes) == Region(tuple(graph.nodes), ("x",), tuple(graph.outputs))


def test_every_lowered_operator_is_classified():
    """An operator added to the lowerings is a boundary until it is listed here and, if
    linear, in LINEAR_OPS (a boundary is safe, but may split a region needlessly)."""
    from ollie.graph.partition import LINEAR_OPS
    from ollie.lower import LOWERINGS

    by_constant = {"Mul", "Div"}
    boundaries = {"Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Abs", "Max", "Min",
                  "LeakyRelu", "MaxPool2d", "Softmax"}
    assert LINEAR_OPS.issubset(LOWERINGS)
    assert set(LOWERINGS) - LINEAR_OPS == by_constant | boundaries


def test_onnx_import_partitions_like_the_torch_import(tmp_path):
    from ollie.frontend import to_onnx

    x = torch.randn(1, 8, 16, 16)
    path = tmp_path / "gcn_block.onnx"
    to_onnx(GCNBlock(8, 4).eval(), (x,), str(path))
    graph = to_graph(str(path), (x,))
    (region,) = _checked(graph)
    assert sorted(_ops(region)) == ["Add"] + ["Conv2d"] * 4


def test_a_node_computing_a_constant_joins_no_region():
    b, rng = _builder()
    x = b.add_input("x", (1, 2, 3, 3))
    wt = b.emit1("Transpose", [b.add_const(rng.standard_normal((3, 3)).astype(np.float32))],
                 {"perm": (1, 0)})
    y = b.emit1("MatMul", [b.emit1("Relu", [b.emit1("MatMul", [x, wt])]), wt])
    b.add_output(y)
    graph = b.finish()
    items = _checked(graph)
    assert [_ops(it) for it in items] == [["Transpose"], ["MatMul"], ["Relu"], ["MatMul"]]
    assert isinstance(items[0], Node) and items[1].inputs == (x, wt)
