"""``as_strided`` in imported torch graphs (ollie.frontend.torch_views): its result depends on
its input's memory layout when traced, which a program does not keep; it is imported as a
window over the input's values in that layout's order (``strided_window``), so the optimised
program, whose operators write new contiguous tensors, computes what the module computes.
The pattern is Longformer's chunking of a transposed tensor (``hf:longformer``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.errors import UnsupportedError
from ollie.frontend import from_torch
from ollie.frontend.torch_views import dense_order
from ollie.graph import run_graph
from ollie.graph.execute import run_node
from ollie.graph.opaque import strided_window
from ollie.program.serialize import decode, encode

FAST = dict(time_budget=0.5, max_depth=1, max_candidates=1, use_cache=False, context=False,
            settle=0.0)


class Chunks(nn.Module):
    """Longformer's ``_chunk``: heads split off a projection, transposed (a view: batch 1),
    then overlapping chunks of the sequence taken by ``as_strided`` with the view's strides,
    multiplied by a second projection's chunks."""

    def __init__(self, hidden: int = 16, heads: int = 2, window: int = 4) -> None:
        super().__init__()
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.heads, self.window = heads, window

    def chunk(self, x: torch.Tensor) -> torch.Tensor:
        seq, _, hidden = x.shape
        h = x.view(seq, 1, self.heads, hidden // self.heads).transpose(0, 1)
        h = h.transpose(1, 2).reshape(self.heads, seq, hidden // self.heads)
        h = h.view(self.heads, seq // (2 * self.window), 2 * self.window, h.size(2))
        size, stride = list(h.size()), list(h.stride())
        size[1] = size[1] * 2 - 1
        stride[1] = stride[1] // 2
        return h.as_strided(size=size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(0, 1)  # [seq, 1, hidden]
        q, k = self.chunk(self.q(x)), self.chunk(self.k(x))
        return torch.einsum("bcxd,bcyd->bcxy", q, k)


@pytest.mark.parametrize("sizes,strides,perm", [
    ((2, 3), (3, 1), (0, 1)),
    ((2, 3), (1, 2), (1, 0)),
    ((4, 4, 8, 8), (8, 256, 32, 1), (1, 2, 0, 3)),
    ((1, 3, 1), (7, 1, 9), (0, 2, 1)),
    ((2, 3), (4, 1), None),   # a gap: rows of 4 with 3 read
    ((2, 3), (1, 1), None),   # overlapping
])
def test_dense_order(sizes, strides, perm) -> None:
    assert dense_order(sizes, strides) == perm
    if perm is not None:  # x.permute(perm) is row-major over the same storage
        x = torch.empty_strided(sizes, strides)
        assert x.permute(perm).is_contiguous()


def test_window_depends_on_values_not_layout() -> None:
    base = torch.randn(4, 6)
    x = base.t()  # [6, 4], strides (1, 6): column-major
    want = torch.as_strided(x, (3, 5), (6, 1))  # reads base's storage row by row
    for layout in (x, x.contiguous(), x.contiguous().t().contiguous().t()):
        torch.testing.assert_close(strided_window(layout, (1, 0), (3, 5), (6, 1), 0), want,
                                   rtol=0, atol=0)


def test_imported_as_strided_is_layout_independent() -> None:
    torch.manual_seed(0)
    model = Chunks().eval()
    x = torch.randn(1, 16, 16)
    graph = from_torch(model, (x,))
    nodes = [n for n in graph.nodes if n.attrs.get("op_type") == "strided_window"]
    assert len(nodes) == 2
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(run_graph(graph, [x])[graph.outputs[0]], want)
    # the node gives the same window of a contiguous copy of its input (what a program's
    # operators produce) as of the input laid out as traced
    env = {graph.inputs[0][0]: x, **{n: torch.as_tensor(v) for n, v in
                                     graph.initializers.items()}}
    for node in graph.nodes:
        args = [env[i] for i in node.inputs]
        if node in nodes:
            dense = run_node(node, [a.contiguous() for a in args])[0]
            torch.testing.assert_close(dense, run_node(node, args)[0], rtol=0, atol=0)
        env.update(zip(node.outputs, run_node(node, args), strict=True))


def test_optimised_program_matches_the_module() -> None:
    torch.manual_seed(1)
    model = Chunks().eval()
    x = torch.randn(1, 16, 16)
    prog = ollie.optimize(model, (x,), **FAST)
    assert not any("disagrees" in n or "falling back" in n for n in prog.notes), prog.notes
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(prog(x), model(x), rtol=1e-5, atol=1e-5)
            x = torch.randn(1, 16, 16)


def test_window_outside_the_input_values_is_refused() -> None:
    class Gap(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2)[:, :3].as_strided((2, 4), (4, 1)) + 1

    with pytest.raises(UnsupportedError, match="as_strided"):
        from_torch(Gap(), (torch.randn(4, 4),))


def test_window_keeps_its_offset() -> None:
    class Offset(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = (x * 2)[1:]  # a view starting one row in
            return y.as_strided((2, 3), (3, 1), 3 + 1) + 1  # absolute storage offset

    x = torch.randn(4, 3)
    graph = from_torch(Offset(), (x,))
    torch.testing.assert_close(run_graph(graph, [x])[graph.outputs[0]], Offset()(x))


def test_window_is_saved_by_name() -> None:
    assert decode(encode(strided_window, "test"), "test") is strided_window
