"""The end-to-end benchmark's roofline counter and table, and the optimizer's memory guard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ollie.bench.models import graph_costs
from ollie.optimizer.memory import memory_guard
from ollie.optimizer.model import to_graph


def test_graph_costs_counts_conv_and_linear_flops() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                      nn.Linear(8 * 4 * 4, 10)).eval()
    g = to_graph(m, (torch.randn(2, 3, 4, 4),))
    flops, nbytes = graph_costs(g)
    assert flops == 2 * (2 * 8 * 4 * 4) * (3 * 3 * 3) + 2 * (2 * 10) * (8 * 4 * 4)
    weights = sum(p.numel() for p in m.parameters()) * 4
    assert nbytes >= weights + 4 * (2 * 3 * 4 * 4 + 2 * 10)


def test_graph_costs_conv_transpose_per_input_element() -> None:
    m = nn.ConvTranspose2d(6, 4, 4, stride=2, padding=1, bias=False).eval()
    g = to_graph(m, (torch.randn(1, 6, 2, 2),))
    flops, _ = graph_costs(g)
    assert flops == 2 * (6 * 2 * 2) * (4 * 4 * 4)


def test_memory_guard_caps_and_restores_the_address_space() -> None:
    resource = pytest.importorskip("resource")
    try:
        avail = next(int(ln.split()[1]) * 1024 for ln in
                     Path("/proc/meminfo").read_text().splitlines()
                     if ln.startswith("MemAvailable"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/meminfo")
    before = resource.getrlimit(resource.RLIMIT_AS)
    with memory_guard(0.4):
        assert resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
        with pytest.raises(MemoryError):
            np.empty(int(0.8 * avail), dtype=np.uint8)
        small = np.ones(1 << 20)  # ordinary work still runs
        assert small.sum() == 1 << 20
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_markdown_marks_rows_kept_from_another_run() -> None:
    import json

    from ollie.bench.models_report import markdown

    saved = Path(__file__).parents[2] / "benchmarks" / "results" / "models.json"
    doc = json.loads(saved.read_text())
    rows = [r for r in doc["rows"] if "skipped" not in r][:2]
    info = dict(doc["machine"], date="2099-01-01 00:00")
    rows[0] = dict(rows[0], measured=info["date"])
    rows[1] = {k: v for k, v in rows[1].items() if k != "measured"}
    lines = [ln for ln in markdown(rows, info).splitlines() if ln.startswith("| ")][1:]
    assert "kept from" not in lines[0]
    assert "kept from the run of an earlier date" in lines[1]


def test_repeated_timings_give_medians_and_the_speedup_range(monkeypatch) -> None:
    import json

    from ollie.bench import models, models_report

    samples = iter([{"eager": 4.0, "ORT": 3.0, "Ollie": 2.0},
                    {"eager": 6.0, "ORT": 2.0, "Ollie": 2.5},
                    {"eager": 5.0, "ORT": 4.0, "Ollie": 1.0}])
    monkeypatch.setattr(models, "measure_alternating", lambda *a, **k: next(samples))
    row: dict = {}
    times = models.timed({}, "cpu", 3, row)
    assert times == {"eager": 5.0, "ORT": 3.0, "Ollie": 2.0}
    assert row["repeats"] == 3 and len(row["repeat_times_ms"]) == 3
    assert row["speedup_vs_eager_range"] == [2.0, 5.0]
    assert row["speedup_vs_best_range"] == [0.8, 4.0]   # best peer per timing: ORT
    # one timing: nothing added
    monkeypatch.setattr(models, "measure_alternating",
                        lambda *a, **k: {"eager": 4.0, "Ollie": 2.0})
    one: dict = {}
    assert models.timed({}, "cpu", 1, one) == {"eager": 4.0, "Ollie": 2.0} and not one
    # the table says so
    saved = Path(__file__).parents[2] / "benchmarks" / "results" / "models.json"
    doc = json.loads(saved.read_text())
    r = dict(next(r for r in doc["rows"] if "skipped" not in r), **row)
    info = dict(doc["machine"], date=r.get("measured", ""))
    line = [ln for ln in models_report.markdown([r], info).splitlines() if ln.startswith("| ")][1]
    assert "medians of 3 timings, over which Ollie ran 2.00-5.00x over eager and " \
           "0.80-4.00x over the best peer" in line


def test_the_table_gives_warm_time_and_the_subprograms_outcomes() -> None:
    import json

    from ollie.bench.models_report import markdown

    saved = Path(__file__).parents[2] / "benchmarks" / "results" / "models.json"
    doc = json.loads(saved.read_text())
    old = next(r for r in doc["rows"] if "skipped" not in r and "subprograms" not in r)
    new = dict(old, subprograms={"derived": 3, "original": 1, "refused": 2,
                                 "reasons": {"time budget": 2}}, opaque_ops=4)
    skipped = {"model": "x", "batch": 1, "skipped": "too big"}
    info = dict(doc["machine"], date=old.get("measured", ""), total_budget=60.0)
    text = markdown([old, new, skipped], info)
    assert "20 s per distinct subprogram, 60 s per model" in text.replace(
        f"{info['budget']:g} s per distinct", "20 s per distinct")
    header, _, *lines = [ln for ln in text.splitlines() if ln.startswith("| model | batch |")
                         or ln.startswith(("|---", f"| {old['model']} |", "| x |"))][:5]
    assert "| optimisation s | warm s | subprograms derived / original / refused | notes |" \
        in header
    cells = header.count("|")
    assert all(ln.count("|") == cells for ln in lines), lines
    assert f"| {old['reoptimize_s']:.2f} | n/a |" in lines[0]
    assert f"| {old['reoptimize_s']:.2f} | 3 / 1 / 2 (time budget 2); 4 opaque ops |" in lines[1]


def test_a_row_tallies_the_subprograms_and_passes_the_total_budget(monkeypatch) -> None:
    from ollie.bench import models
    from ollie.optimizer.report import SubprogramReport

    calls: list[dict] = []
    report = [SubprogramReport("c0", "Conv2d", "Conv2d", "Conv", ["a"], 2.0, 1.0),
              SubprogramReport("c1", "Conv2d", "Conv2d", "original operator", [], 0.0, 0.0,
                               refused="time budget")]

    class Optimized:
        def __init__(self, module: nn.Module) -> None:
            self.module, self.report, self.notes = module, report, []

        def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.module(*inputs)

    def optimize(module, inputs, device, **kwargs):
        calls.append(kwargs)
        return Optimized(module)

    module = nn.Sequential(nn.Conv2d(2, 2, 3), nn.MaxPool2d(2)).eval()
    monkeypatch.setattr(models.ollie, "optimize", optimize)
    monkeypatch.setattr(models, "measure_alternating",
                        lambda fns, *a, **k: {n: 1e-3 for n in fns})
    monkeypatch.setattr(models, "build", lambda name, batch: (module, (torch.randn(1, 2, 8, 8),)))
    monkeypatch.setattr(torch, "compile", lambda m: m)
    row = models.run_one("tiny", 1, 0.5, {"matmul_flops": 1e11, "copy_bytes": 1e10},
                         log=lambda *_: None, total_budget=7.0)
    assert [c["total_budget"] for c in calls] == [7.0, 7.0]  # cold and warm
    assert row["subprograms"] == {"derived": 1, "original": 0, "refused": 1,
                                  "reasons": {"time budget": 1}}
    assert row["opaque_ops"] == 1  # the max pooling runs as it is
    assert "optimize_s" in row and "reoptimize_s" in row
