"""``ollie bench models --compile-mode``: torch.compile's mode for its peer, max-autotune by
default on CUDA (as the issue's GPU comparison asks), the default mode on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from ollie.bench import models, models_report
from ollie.cli import build_parser


@pytest.mark.parametrize("device, given, used", [
    ("cpu", None, "default"), ("cuda", None, "max-autotune"),
    ("cpu", "max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_the_mode_reaches_the_run(monkeypatch, tmp_path: Path, device, given, used):
    seen = {}
    monkeypatch.setattr(models, "_run_all",
                        lambda *a, **kw: seen.update(mode=kw["compile_mode"]) or 0)
    assert models.main(("tiny",), (1,), 0.5, tmp_path, device=device,
                       compile_mode=given) == 0
    assert seen == {"mode": used}


def test_run_one_compiles_in_that_mode(monkeypatch):
    import torch

    modes = []

    def spy(module, **kw):
        modes.append(kw.get("mode"))
        raise RuntimeError("not compiled in this test")  # a failing peer is a recorded note

    monkeypatch.setattr(torch, "compile", spy)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    monkeypatch.setattr(models, "build", lambda name, batch: (net, (torch.randn(1, 3, 8, 8),)))
    monkeypatch.setattr(models.ollie, "optimize", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("stop after the peers")))
    with pytest.raises(RuntimeError, match="stop after the peers"):
        models.run_one("tiny", 1, 0.5, {"matmul_flops": 1e11, "copy_bytes": 1e10},
                       log=lambda *a: None, compile_mode="max-autotune")
    assert modes == ["max-autotune"]


def test_cli_flag_and_report_header():
    args = build_parser().parse_args(["bench", "models", "--compile-mode", "max-autotune"])
    assert args.compile_mode == "max-autotune"
    assert build_parser().parse_args(["bench", "models"]).compile_mode is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "models", "--compile-mode", "fast"])
    info = {"date": "2099-01-01 00:00", "cpu": "test CPU", "cores": 2, "torch": "x",
            "onnxruntime": "y", "python": "3", "matmul_flops": 1e11, "copy_bytes": 1e10,
            "loadavg_start": 0.5, "budget": 1.0}
    assert "torch.compile mode 'max-autotune'" in models_report.markdown(
        [], {**info, "compile_mode": "max-autotune"})
