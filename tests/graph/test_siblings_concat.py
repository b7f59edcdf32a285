"""Sibling groups that merge by concatenation (with relaxation): SqueezeNet's fire modules
(1x1 and 3x3 expand convolutions of one squeeze output) and a ResNet basic block with a
downsample shortcut (its 1x1 stride-2 shortcut and the block's first 3x3 stride-2 conv)."""

import torch
from torch import nn

from ollie.graph.siblings import sibling_groups
from ollie.optimizer.importing import to_graph
from ollie.testing.cnns import build
from ollie.zoo.resnet import BasicBlock


def _groups(model, x, **kw):
    graph = to_graph(model.eval(), x)
    return graph, [[n.name for n in g] for g in sibling_groups(graph, **kw)]


def test_squeezenet_fire_expand_pairs_group():
    graph, groups = _groups(build("squeezenet", w=8, size=32), torch.randn(1, 3, 32, 32),
                            concat=True)
    assert len(groups) == 3  # one per fire module
    for names in groups:
        nodes = [n for n in graph.nodes if n.name in names]
        assert [n.op for n in nodes] == ["Conv2d", "Conv2d"]
        assert len({n.inputs[0] for n in nodes}) == 1  # one squeeze output
        kernels = sorted(graph.shape(n.inputs[1])[2] for n in nodes)
        assert kernels == [1, 3]
    # twins only (the default): no group, the expand convolutions differ in kernel size
    assert _groups(build("squeezenet", w=8, size=32), torch.randn(1, 3, 32, 32))[1] == []


def test_resnet_downsample_groups_with_the_first_conv():
    torch.manual_seed(0)
    block = BasicBlock(4, 8, stride=2)
    graph, groups = _groups(block, torch.randn(1, 4, 8, 8), concat=True)
    assert len(groups) == 1
    nodes = [n for n in graph.nodes if n.name in groups[0]]
    assert {graph.shape(n.inputs[1])[2] for n in nodes} == {1, 3}
    assert {n.attrs["stride"] for n in nodes} == {(2, 2)}
    # conv2 reads relu(conv1): not a sibling
    assert all(n.inputs[0] == graph.input_names[0] for n in nodes)


def test_siblings_with_other_strides_do_not_group():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(4, 6, 1)
            self.b = nn.Conv2d(4, 6, 3, stride=2, padding=1)

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum()

    assert _groups(Two(), torch.randn(1, 4, 8, 8), concat=True)[1] == []


def test_matmuls_with_other_widths_group_only_with_concat():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 6)
            self.c = nn.Linear(8, 4)  # reads another activation

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum() + self.c(torch.relu(x)).sum()

    x = torch.randn(2, 8)
    assert _groups(Mixed(), x)[1] == []
    assert len(_groups(Mixed(), x, concat=True)[1]) == 1


def test_twins_keep_their_group_and_a_node_is_in_one_group():
    """Two twins (1x1, 6 channels) and a third sibling (3x3): the twins stay a twin group, the
    third is left alone (a node belongs to at most one group)."""
    class Three(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 1)
            self.c = nn.Conv2d(4, 5, 3, padding=1)

        def forward(self, x):
            return self.a(x) + self.b(x) + self.c(x).sum()

    graph, groups = _groups(Three(), torch.randn(1, 4, 6, 6), concat=True)
    assert len(groups) == 1 and len(groups[0]) == 2
    assert all(graph.shape(n.inputs[1])[2] == 1 for n in graph.nodes if n.name in groups[0])


def test_relaxation_that_multiplies_the_work_does_not_group():
    """GCN's 7x1 next to a 1x7 convolution: the 7x7 hull does 3.5x their work (more than
    MAX_GROWTH); a 1x1 next to a 3x3 of as many channels does 1.8x and groups."""
    class Pair(nn.Module):
        def __init__(self, ka, kb) -> None:
            super().__init__()
            pa, pb = tuple(k // 2 for k in ka), tuple(k // 2 for k in kb)
            self.a = nn.Conv2d(4, 6, ka, padding=pa)
            self.b = nn.Conv2d(4, 6, kb, padding=pb)

        def forward(self, x):
            return self.a(x) + self.b(x)

    x = torch.randn(1, 4, 9, 9)
    assert _groups(Pair((7, 1), (1, 7)), x, concat=True)[1] == []
    assert len(_groups(Pair((1, 1), (3, 3)), x, concat=True)[1]) == 1
