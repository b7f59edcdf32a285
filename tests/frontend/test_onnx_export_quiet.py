"""The ONNX export keeps torch's C++ ONNX log off the terminal when it fails, and passes on
what the exported module prints when it succeeds."""

from __future__ import annotations

import pytest
import torch

from ollie.errors import OllieError
from ollie.frontend import to_onnx_model


class _Unexportable(torch.nn.Module):
    """A dilated unfold of a padded input: the TorchScript exporter refuses it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.pad(x.unsqueeze(1), (2, 2))
        return y.unfold(2, 3, 1).sum(-1)


class _Chatty(torch.nn.Module):
    """Prints the number of each call of ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print(f"forward call {self.calls}")
        self.calls += 1
        return x * 2


def test_failed_export_prints_nothing_and_says_why(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(OllieError, match="Unfold"):
        to_onnx_model(_Unexportable(), (torch.randn(2, 8),))
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err
    assert out == "" and err == ""


def test_successful_export_passes_output_on(capfd: pytest.CaptureFixture[str]) -> None:
    model = to_onnx_model(_Chatty(), (torch.randn(2, 3),))
    assert "Mul" in [n.op_type for n in model.graph.node]
    out, err = capfd.readouterr()
    assert "forward call 1" in out      # printed while torch traced it for the export
    assert "Custom opset domain" not in err  # the ollie domain, declared for every model
