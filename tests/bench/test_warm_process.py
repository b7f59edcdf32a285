"""The benchmark's warm optimisation in a new process (ollie.bench.warm_process)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ollie.bench import models, models_report, warm_process


def _model(name: str, batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    return m, (torch.randn(batch, 3, 8, 8),)


def test_the_child_finds_the_program_the_cold_run_stored(ollie_settings, tmp_path, monkeypatch,
                                                        capsys):
    import ollie

    ollie_settings(cache_dir=tmp_path)
    monkeypatch.setattr(models, "build", _model)
    module, inputs = _model("tiny", 1)
    ollie.optimize(module, inputs, "cpu", time_budget=0.5, total_budget=None)  # cold
    args = {"spec": "tiny", "batch": 1, "device": "cpu", "budget": 0.5, "total_budget": None,
            "threads": torch.get_num_threads()}  # threads: part of the key, as passed
    assert warm_process.main([json.dumps(args)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["seconds"] > 0 and "found by the module's own key" in out["found"]


def test_a_child_that_fails_is_a_note_not_an_error(ollie_settings, tmp_path):
    ollie_settings(cache_dir=tmp_path)
    secs, why = warm_process.measure("no-such-model", 1, "cpu", 1.0, None, 1)
    assert secs is None and why.startswith("failed (exit 1)")


def test_a_row_and_the_report_carry_the_new_process_figure(monkeypatch):
    monkeypatch.setattr(models, "build", _model)
    monkeypatch.setattr(models, "measure_alternating",
                        lambda fns, *a, **k: {n: 1e-3 for n in fns})
    monkeypatch.setattr(torch, "compile", lambda m, **k: m)
    seen = []
    monkeypatch.setattr(warm_process, "measure",
                        lambda *a: seen.append(a) or (0.42, "found by the module's own key"))
    row = models.run_one("tiny", 1, 0.5, {"matmul_flops": 1e11, "copy_bytes": 1e10},
                         log=lambda *_: None, total_budget=None, new_process=True)
    assert seen == [("tiny", 1, "cpu", 0.5, None, torch.get_num_threads())]
    assert row["warm_new_process_s"] == 0.42
    assert "warm in a new process: found by the module's own key" in row["notes"]
    info = {"date": "2099-01-01 00:00", "cpu": "test CPU", "cores": 2, "torch": "x",
            "onnxruntime": "y", "python": "3", "matmul_flops": 1e11, "copy_bytes": 1e10,
            "loadavg_start": 0.5, "budget": 1.0}
    text = models_report.markdown([{**row, "measured": info["date"]}], info)
    assert "| tiny b1 |" in text and "| 0.42 |" in text


@pytest.mark.parametrize("flag, want", [([], True), (["--no-new-process-warm"], False)])
def test_cli_flag(flag, want):
    from ollie.cli import build_parser

    assert build_parser().parse_args(["bench", "models", *flag]).new_process is want
