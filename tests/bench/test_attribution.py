"""``ollie bench models --attribution``: the per-row attribution, the table with its geometric
means, the CLI flag, and the four programs built from one cache (with their timing stubbed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ollie.bench import attribution, models, models_report
from ollie.cli import build_parser


def _row(model: str, times: dict[str, float], best: str = "ORT") -> dict:
    row = {"model": model, "batch": 1, "times_ms": times, "ollie_correct": True,
           "best_peer": best, "speedup_vs_best": times[best] / times["Ollie"],
           "speedup_vs_eager": times["eager"] / times["Ollie"], "rewritten": "1/2",
           "bound": "compute", "notes": [], "roofline_ms": 0.5, "optimize_s": 3.0,
           "reoptimize_s": 0.3}
    row["attribution"] = attribution.attribution(times)
    return row


ROWS = [_row("srcnn", {"eager": 8.0, "ORT": 5.0, "(0)": 6.0, "(a)": 5.0, "(b)": 4.0,
                       "Ollie": 3.0}),
        _row("dcgan", {"eager": 4.0, "ORT": 2.0, "(0)": 2.0, "(a)": 2.5, "(b)": 2.0,
                       "Ollie": 1.0})]
INFO = {"date": "2099-01-01 00:00", "cpu": "test CPU", "cores": 2, "torch": "x",
        "onnxruntime": "y", "python": "3", "matmul_flops": 1e11, "copy_bytes": 1e10,
        "loadavg_start": 0.5, "budget": 1.0}


def test_attribution_of_a_row():
    a = ROWS[0]["attribution"]
    assert a["ms"] == {"(0)": 6.0, "(a)": 5.0, "(b)": 4.0, "(c)": 3.0}
    assert a["speedup"] == {"(a)": 1.2, "(b)": 1.5, "(c)": 2.0}
    assert attribution.attribution({"eager": 1.0, "Ollie": 1.0}) == {}


def test_attribution_table_and_geomeans():
    text = models_report.attribution_markdown(ROWS)
    lines = text.splitlines()
    assert lines[0].startswith("| model | batch | (0) ms | (a) derived, vendor")
    assert lines[2] == ("| srcnn | 1 | 6.000 | 1.20x | 1.50x | 2.00x | 8.000 | 5.000 (ORT) | "
                        "1.67x |")
    assert lines[3].startswith("| dcgan | 1 | 2.000 | 0.80x | 1.00x | 2.00x |")
    g = models_report.attribution_geomeans(ROWS)
    assert g["(a)"] == pytest.approx(math.sqrt(1.2 * 0.8))
    assert g["(c)/best peer"] == pytest.approx(math.sqrt(5 / 3 * 2))
    assert lines[-1] == (f"| geomean | | | {g['(a)']:.2f}x | {g['(b)']:.2f}x | "
                         f"{g['(c)']:.2f}x | | | {g['(c)/best peer']:.2f}x |")
    assert models_report.attribution_markdown([{k: v for k, v in ROWS[0].items()
                                                if k != "attribution"}]) == ""


def test_the_report_carries_the_attribution(tmp_path: Path):
    text = models_report.write(ROWS, INFO, tmp_path)
    assert "Where the speed comes from" in text and "| geomean |" in text
    doc = json.loads((tmp_path / "models.json").read_text())
    assert doc["summary"]["attribution_geomean"]["(c)"] == pytest.approx(2.0)
    plain = models_report.markdown([{k: v for k, v in r.items() if k != "attribution"}
                                    for r in ROWS], INFO)
    assert "Where the speed comes from" not in plain


def test_cli_flag():
    assert build_parser().parse_args(["bench", "models", "--attribution"]).attribution
    assert not build_parser().parse_args(["bench", "models"]).attribution


def test_four_programs_from_one_run(monkeypatch):
    """run_one with attribution optimises (0), (a), (b) with their switches besides Ollie's
    program (once: no warm re-optimisation), each with the model's time budget, and times all
    of them with the peers in one interleaved call."""
    calls: list[dict] = []

    class Program:
        def __init__(self, module):
            self.module = module
            self.report: list = []
            self.notes: list = []

        def __call__(self, *inputs):
            return self.module(*inputs)

    def optimize(module, inputs, device, **kwargs):
        calls.append(kwargs)
        return Program(module)

    timed_with: list[set] = []

    def measure(fns, *args, **kwargs):
        timed_with.append(set(fns))
        return {name: 1e-3 * (i + 1) for i, name in enumerate(fns)}

    monkeypatch.setattr(attribution.ollie, "optimize", optimize)
    monkeypatch.setattr(models.ollie, "optimize", optimize)
    monkeypatch.setattr(models, "measure_alternating", measure)
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3)).eval()
    monkeypatch.setattr(models, "build", lambda name, batch: (module, (torch.randn(1, 2, 6, 6),)))
    monkeypatch.setattr(torch, "compile", lambda m: m)
    row = models.run_one("tiny", 1, 0.5, {"matmul_flops": 1e11, "copy_bytes": 1e10},
                         log=lambda *_: None, attribution=True, total_budget=7.0)
    switches = [{k: c[k] for k in ("derivation", "kernel_library") if k in c} for c in calls]
    assert switches.count({}) == 1  # Ollie's program, cold only: no warm re-optimisation
    assert [s for s in switches if s] == list(attribution.PROGRAMS.values())
    assert [c["total_budget"] for c in calls] == [7.0] * 4  # every program gets the budget
    assert "reoptimize_s" not in row
    assert len(timed_with) == 1 and {"eager", "Ollie", "(0)", "(a)", "(b)"} <= timed_with[0]
    assert set(row["attribution"]["speedup"]) == {"(a)", "(b)", "(c)"}
