"""``ollie bench models --cpu-time``: every time is the calling thread's CPU time, every
system on that one thread; the report says so."""

from __future__ import annotations

import time
from pathlib import Path

import numba
import pytest

from ollie.bench import models, models_report
from ollie.cli import build_parser
from ollie.errors import ConfigError
from ollie.settings import current


def test_cpu_time_runs_on_one_thread_with_the_thread_clock(monkeypatch, tmp_path: Path):
    seen: dict = {}

    def run_all(*args, **kwargs):
        seen.update(clock=current().measure_clock, threads=args[5], cpu_time=args[-1],
                    numba=numba.get_num_threads())
        return 0

    monkeypatch.setattr(models, "_run_all", run_all)
    before = numba.get_num_threads()
    try:
        assert models.main(("tiny",), (1,), 0.5, tmp_path, cache_dir=str(tmp_path / "c"),
                           cpu_time=True) == 0
    finally:
        numba.set_num_threads(before)
    assert seen == {"clock": time.thread_time, "threads": 1, "cpu_time": True, "numba": 1}
    assert current().measure_clock is not time.thread_time  # only for the run


@pytest.mark.parametrize("kwargs", [{"threads": 2}, {"device": "cuda"}])
def test_cpu_time_refuses_several_threads_or_a_gpu(tmp_path: Path, kwargs: dict):
    with pytest.raises(ConfigError, match="one thread"):
        models.main(("tiny",), (1,), 0.5, tmp_path, cpu_time=True, **kwargs)


def test_cli_flag_and_report_header():
    assert build_parser().parse_args(["bench", "models", "--cpu-time"]).cpu_time
    assert not build_parser().parse_args(["bench", "models"]).cpu_time
    info = {"date": "2099-01-01 00:00", "cpu": "test CPU", "cores": 2, "torch": "x",
            "onnxruntime": "y", "python": "3", "matmul_flops": 1e11, "copy_bytes": 1e10,
            "loadavg_start": 0.5, "budget": 1.0}
    assert "CPU time of the calling thread" in models_report.markdown(
        [], {**info, "clock": "thread CPU time"})
    assert "CPU time" not in models_report.markdown([], {**info, "clock": "wall"})
