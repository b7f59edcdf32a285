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
