"""from_torch on modules with in-place operators (``out += identity``, ``ReLU(inplace=True)``,
``Dropout(inplace=True)``, writes through views) and metadata checks (``.to(dtype)``): they
import as plain dataflow operators, checked against the module; a module that writes into its
own input is refused."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from ollie.errors import UnsupportedError
from ollie.frontend import from_torch


def check(module: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """The graph's operator counts, after checking it computes what ``module`` computes."""
    module.eval()
    graph = from_torch(module, (x,))
    with torch.no_grad():
        want = module(x.clone())
    torch.testing.assert_close(graph(x.clone()), want, rtol=1e-5, atol=1e-5)
    return graph.op_counts()


class Residual(nn.Module):
    """A ResNet / MobileNetV3 / EfficientNet pattern: in-place ReLU, dropout and residual sum."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.2, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.conv1(x))
        out = self.conv2(out)
        out += identity
        return self.drop(self.relu(out))


def test_in_place_residual_is_dataflow() -> None:
    counts = check(Residual(), torch.randn(1, 4, 6, 6))
    assert not any(op.startswith("Opaque") for op in counts), counts
    assert counts["Conv2d"] == 2 and counts["Add"] == 1 and counts["Relu"] == 2


def test_functionalisation_shows_no_torch_deprecation_warning() -> None:
    """torch's copy of the exported program warns about its own ``LeafSpec``; users never see
    it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_torch(Residual().eval(), (torch.randn(1, 4, 6, 6),))
    assert not [w for w in caught if "LeafSpec" in str(w.message)], \
        [str(w.message) for w in caught]


class ViewWrite(nn.Module):
    """A write into a view changes the tensor it views."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        v = y.view(-1)
        v.add_(1)
        y.mul_(x)
        return y * 3


class ReuseAfterWrite(nn.Module):
    """Later readers of a tensor written in place see the new value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x - 0.5
        z = torch.sigmoid(y)
        y.relu_()
        return torch.cat([y, z, y * z], dim=1)


@pytest.mark.parametrize("module", [ViewWrite(), ReuseAfterWrite()],
                         ids=["view-write", "reuse-after-write"])
def test_writes_reach_every_alias(module: nn.Module) -> None:
    counts = check(module, torch.randn(2, 3))
    assert not any(op.startswith("Opaque") for op in counts), counts


class WritesInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2


def test_module_writing_its_input_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="in place"):
        from_torch(WritesInput(), (torch.randn(2, 3),))


class Casts(nn.Module):
    """``.to(dtype)`` exports with ``_assert_tensor_metadata`` checks, which return nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = (x > 0).to(torch.float32)
        y = (x * 2.0)[:, :, None].to(torch.float32)
        return y * m[:, :, None] + (1.0 - m)[:, :, None]


def test_metadata_checks_are_dropped() -> None:
    counts = check(Casts(), torch.randn(2, 3))
    assert not any("assert" in op for op in counts), counts


class Chained(nn.Module):
    """Several writes into one tensor, read before, between and after them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 3.0
        before = torch.tanh(y)
        y.relu_()
        between = y * 2.0
        y.add_(before).mul_(x)
        return torch.cat([y, before, between], dim=1)


def _exported(module: nn.Module, x: torch.Tensor):
    return torch.export.export(module.eval(), (x,)).graph_module


@pytest.mark.parametrize("module", [Residual(), ReuseAfterWrite(), Chained()],
                         ids=["residual", "reuse-after-write", "chained"])
def test_fresh_tensors_written_in_place_become_functional_without_a_retrace(
        module: nn.Module) -> None:
    """Writes into a tensor an operator just made, which no view aliases, are rewritten by
    ``rewrite_in_place`` (no in-place call left), and the graph still computes the module."""
    from ollie.frontend.inplace import rewrite_in_place

    x = torch.randn(2, 4, 6, 6) if isinstance(module, Residual) else torch.randn(2, 3)
    gm = _exported(module, x)
    assert rewrite_in_place(gm)
    assert not any(getattr(n.target, "_schema", None) is not None and n.target._schema.is_mutable
                   for n in gm.graph.nodes)
    check(module, x)


@pytest.mark.parametrize("module", [ViewWrite(), WritesInput()], ids=["view-write", "input"])
def test_writes_others_can_see_are_left_to_torch_functionalisation(module: nn.Module) -> None:
    """A write through a view, or into an input, is not rewritten: the graph is left exactly
    as it was (torch's functionalisation handles it, or the module is refused)."""
    from ollie.frontend.inplace import rewrite_in_place

    gm = _exported(module, torch.randn(2, 3))
    before = str(gm.graph)
    assert not rewrite_in_place(gm)
    assert str(gm.graph) == before


class ViewOfResult(nn.Module):
    """A view of an in-place call's result sees the later writes into the tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        v = y.relu_().view(-1)
        y.add_(1)
        return v * 3


def test_a_view_of_an_in_place_result_is_left_to_torch_functionalisation() -> None:
    from ollie.frontend.inplace import rewrite_in_place

    gm = _exported(ViewOfResult(), torch.randn(2, 3))
    assert not rewrite_in_place(gm)
    check(ViewOfResult(), torch.randn(2, 3))  # the general way is right
