"""Graphs with integer inputs through ``torch.compile(model, backend="ollie")``
(:mod:`ollie.optimizer.int_inputs`): the nodes turning token ids and an integer attention mask
into floating-point tensors run in PyTorch, and the program Ollie makes of the rest serves
calls with any ids, not only the ids it was optimised with."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import fx, nn

import ollie  # noqa: F401 - registers the backend
from ollie.optimizer import backend
from ollie.optimizer.int_inputs import part_nodes, split_at_floats, varying_integers

pytestmark = pytest.mark.usefixtures("fast_backend")


class _Encoder(nn.Module):
    """BERT's pattern: token and position embeddings summed, an integer attention mask made a
    float bias of the scores, a feed-forward layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(50, 8), nn.Embedding(16, 8)
        self.register_buffer("positions", torch.arange(16))
        self.norm = nn.LayerNorm(8)
        self.q, self.ff = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.tok(ids) + self.pos(self.positions[: ids.shape[1]]))
        bias = (1.0 - mask[:, None, :].float()) * -1e4
        scores = self.q(h) @ h.transpose(1, 2) / 8 ** 0.5 + bias
        return self.ff(torch.relu(torch.softmax(scores, -1) @ h))


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8 + seed % 3:] = 0
    return torch.randint(0, 50, (2, 12), generator=gen), mask


def _served_for_three_ids(model: nn.Module, caplog) -> None:
    """``model`` compiled with the backend matches eager for three sets of ids and masks,
    each served by the program: no call ran the graph unchanged."""
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        compiled = torch.compile(model, backend="ollie")
        for seed in range(3):
            ids, mask = _inputs(seed)
            torch.testing.assert_close(compiled(ids, mask), model(ids, mask), rtol=1e-4,
                                       atol=1e-5)
    assert "unchanged" not in caplog.text and "other values" not in caplog.text


def test_the_program_serves_other_ids(monkeypatch, caplog):
    seen, served = [], []
    real = backend.optimize

    def spy(model, inputs, *args, **kwargs):
        seen.append([(tuple(t.shape), t.dtype) for t in inputs])
        opt = real(model, inputs, *args, **kwargs)
        return lambda *a: served.append(1) or opt(*a)

    monkeypatch.setattr(backend, "optimize", spy)
    _served_for_three_ids(_Encoder().eval(), caplog)
    # one program, of the floating-point tensors the ids and the mask became
    assert len(seen) == 1 and all(dtype == torch.float32 for _, dtype in seen[0])
    assert (2, 12, 8) in [shape for shape, _ in seen[0]]
    assert len(served) == 1 + 3  # the backend's own check, then every call


def _traced(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[fx.GraphModule]:
    graphs: list[fx.GraphModule] = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=keep)(*inputs)
    return graphs


def test_the_cut_ends_at_the_first_floating_point_tensors():
    (gm, inputs), = _traced(_Encoder().eval(), _inputs(0))
    assert [type(inputs[i]) for i in varying_integers(inputs)] == [torch.Tensor] * 2
    part = part_nodes(gm, inputs)
    targets = {str(n.target) for n in part}
    # the lookups and the mask's cast are cut off; the sum, the norm and the bias stay
    assert any("embedding" in t for t in targets) and any("float" in t for t in targets)
    assert not any("layer_norm" in t or "add" in t or "mul" in t for t in targets), targets
    split = split_at_floats(gm, inputs)
    assert split is not None
    torch.testing.assert_close(split.joined(split.rest)(*inputs), gm(*inputs))
    # the rest reads the floating-point tensors, and no integer input but the buffer
    rest = split.rest_inputs(inputs)
    assert varying_integers(rest) == [] and any(
        isinstance(x, torch.Tensor) and not x.is_floating_point() for x in rest)
    # the position embedding, read from a buffer, stays a constant of the rest
    assert sum("embedding" in str(n.target) for n in split.rest.graph.nodes) == 1


def test_integers_meeting_floats_in_one_operator_are_not_cut():
    class Where(nn.Module):
        def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return torch.where(keep, x * 2, x)

    (gm, inputs), = _traced(Where(), (torch.randn(4), torch.rand(4) > 0.5))
    assert part_nodes(gm, inputs) == set() and split_at_floats(gm, inputs) is None


class _BoolMasked(nn.Module):
    """DeBERTa's pattern: the integer mask made a boolean that meets the scores in one
    ``masked_fill``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.q = nn.Embedding(50, 8), nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids)
        keep = mask.bool()[:, None, :]
        scores = (self.q(h) @ h.transpose(1, 2)).masked_fill(~keep, -1e4)
        return torch.softmax(scores, -1) @ h


def test_a_boolean_mask_crosses_as_floats(monkeypatch, caplog):
    (gm, inputs), = _traced(_BoolMasked().eval(), _inputs(0))
    split = split_at_floats(gm, inputs)
    assert split is not None
    rest = split.rest_inputs(inputs)
    assert varying_integers(rest) == []  # the mask reaches the rest as 0.0 / 1.0
    torch.testing.assert_close(split.joined(split.rest)(*inputs), gm(*inputs))
    _served_for_three_ids(_BoolMasked().eval(), caplog)
