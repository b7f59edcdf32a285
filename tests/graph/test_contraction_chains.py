"""Contraction chains: the plain-PyTorch Longformer's banded products are found as two chains
(pad / unfold / slice / product / sum), the custom-operator Longformer and CNNs have none, and
a node whose output is read outside a chain is not absorbed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import ollie
from ollie.graph.chains import WINDOW_OPS, contraction_chains
from ollie.optimizer.importing import to_graph
from ollie.testing import cnns


def test_plain_longformer_has_one_chain_per_banded_product():
    m, x = ollie.zoo.get("longformer_plain", seq=32, width=4, dilation=2)
    g = to_graph(m, x)
    chains = contraction_chains(g)
    assert [c.sink.op for c in chains] == ["ReduceSum", "ReduceSum"]
    order = [n.name for n in g.nodes]
    for c in chains:
        ops = {n.op for n in c.members}
        assert {"Pad", "Unfold", "Slice", "Mul"} <= ops
        assert [order.index(n.name) for n in c.nodes] == sorted(order.index(n.name)
                                                                for n in c.nodes)
        produced = {n.outputs[0] for n in c.members}
        # every member's output is read only inside the chain
        for n in g.nodes:
            if n not in c.nodes:
                assert not produced & set(n.inputs)
        assert not produced & set(c.inputs)
    # disjoint
    names = [n.name for c in chains for n in c.nodes]
    assert len(names) == len(set(names))


def test_models_without_windows_have_no_chains():
    m, x = ollie.zoo.get("longformer", seq=32, width=4, dilation=2)
    assert contraction_chains(to_graph(m, x)) == []
    model = cnns.build("vgg", w=8, size=16)
    assert contraction_chains(to_graph(model, (torch.randn(1, 3, 16, 16),))) == []


class _Shared(nn.Module):
    """A windowed product whose padded tensor is also an output: the Pad stays outside."""

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        padded = F.pad(k, (0, 0, 2, 2))
        window = padded.unfold(1, 5, 1)
        return (q.unsqueeze(-1) * window).sum(-2), padded


def test_a_node_read_outside_is_not_absorbed():
    q, k = torch.randn(1, 8, 4), torch.randn(1, 8, 4)
    g = to_graph(_Shared(), (q, k))
    chains = contraction_chains(g)
    assert len(chains) == 1
    ops = [n.op for n in chains[0].members]
    assert "Pad" not in ops and "Unfold" in ops and set(ops) & WINDOW_OPS
    assert any(n.op == "Pad" and n.outputs[0] in chains[0].inputs for n in g.nodes)
