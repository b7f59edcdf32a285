"""Which linear regions the optimiser derives as subprograms
(:func:`ollie.graph.partition.multi_compute` over a partition whose boundaries include the
nodes decided otherwise), and the node order it runs them in
(:func:`ollie.graph.partition.node_order`: every region contiguous)."""

from __future__ import annotations

import numpy as np
import torch

from ollie.frontend.builder import GraphBuilder
from ollie.graph.partition import Region, multi_compute, node_order, partition
from ollie.optimizer.model import to_graph
from ollie.zoo.gcn import GCNBlock
from ollie.zoo.resnet import BasicBlock


def _names(nodes) -> list[str]:
    return [n.name for n in nodes]


def _topological(graph, order) -> bool:
    seen = set(graph.input_names) | set(graph.initializers)
    for n in order:
        if not set(n.inputs) <= seen:
            return False
        seen.update(n.outputs)
    return sorted(_names(order)) == sorted(_names(graph.nodes))


def test_gcn_block_is_one_region_to_derive():
    graph = to_graph(GCNBlock(8, 4).eval(), (torch.randn(1, 8, 12, 12),))
    (region,) = multi_compute(partition(graph))
    assert region.compute == 4 and region.outputs == tuple(graph.outputs)
    assert _names(region.nodes)[-1] == "add"


def test_a_boundary_node_is_left_out_of_the_regions():
    graph = to_graph(GCNBlock(8, 4).eval(), (torch.randn(1, 8, 12, 12),))
    items = partition(graph, boundaries={"add"})
    (region,) = multi_compute(items)
    assert [n.op for n in region.nodes] == ["Conv2d"] * 4
    assert len(region.outputs) == 2  # left2 and right2, which the add reads
    assert multi_compute(items, min_compute=5) == []


def test_resnet_block_regions_need_two_compute_operators():
    graph = to_graph(BasicBlock(8, 16, stride=2).eval(), (torch.randn(1, 8, 16, 16),))
    items = partition(graph)
    # conv1 + downsample (siblings over x); conv2 + add holds one compute operator only
    (pair,) = multi_compute(items)
    assert [n.op for n in pair.nodes] == ["Conv2d", "Conv2d"]
    # a sibling group is decided apart: its members are boundaries, nothing is left to derive
    assert multi_compute(partition(graph, boundaries=set(_names(pair.nodes)))) == []
    order = node_order(items)
    assert _topological(graph, order)
    at = [order.index(n) for n in pair.nodes]
    assert at[1] == at[0] + 1  # contiguous, though the graph runs relu(conv1) between them
    by_name = {n.name: i for i, n in enumerate(graph.nodes)}
    assert by_name[pair.nodes[1].name] - by_name[pair.nodes[0].name] > 1


def test_node_order_makes_every_region_contiguous():
    """Region {a, c} (siblings over x); relu(a) sits between them in the graph's order."""
    b = GraphBuilder("g", track_shapes=True)
    rng = np.random.default_rng(0)
    x = b.add_input("x", (1, 2, 3, 3))

    def conv(name: str) -> str:
        w = b.add_const(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
        return b.emit1("Conv2d", [x, w], {}, name)

    a = conv("a")
    r = b.emit1("Relu", [a])
    c = conv("c")
    b.add_output(r)
    b.add_output(c)
    graph = b.finish()
    items = partition(graph)
    (region,) = multi_compute(items)
    order = node_order(items)
    assert _topological(graph, order)
    assert [n.op for n in order] == ["Conv2d", "Conv2d", "Relu"]
    assert isinstance(region, Region) and list(region.nodes) == order[:2]
