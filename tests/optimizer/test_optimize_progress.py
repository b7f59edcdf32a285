"""``ollie optimize --time-budget S`` (the whole model's budget), ``--subprogram-budget S``
(each search's cap), the same flags of ``ollie bench models``, and the progress bar with its
ETA (drawn on a terminal only; time from a fake clock)."""

from __future__ import annotations

import io

import pytest

from ollie.cli import build_parser
from ollie.commands.progress import eta_seconds, optimize_progress
from ollie.testing.clock import FakeClock


def test_eta_from_the_rate_and_the_budget():
    assert eta_seconds(0.0, 0, 4, None) is None  # nothing known yet
    assert eta_seconds(10.0, 2, 4, None) == 10.0  # 5 s per subprogram, 2 to go
    assert eta_seconds(10.0, 0, 4, 60.0) == 50.0  # what is left of the budget
    assert eta_seconds(10.0, 2, 4, 15.0) == 5.0  # the budget ends first
    assert eta_seconds(10.0, 2, 4, 100.0) == 10.0  # the rate does
    assert eta_seconds(70.0, 1, 4, 60.0) == 0.0  # spent


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_shows_subprograms_elapsed_and_eta_on_a_terminal_only():
    clock = FakeClock()
    out = _Terminal()
    update, close = optimize_progress("optimizing m", 100.0, clock=clock, file=out)
    clock.advance(30.0)
    update("conv2d_1", 1, 4)
    text = out.getvalue()
    assert "1/4 subprograms, 0:30 elapsed, ETA 1:10 | conv2d_1" in text
    assert "None" not in text
    assert "conv2d_1" in text
    close()
    pipe = io.StringIO()  # not a terminal: nothing drawn
    update, close = optimize_progress("optimizing m", None, clock=clock, file=pipe)
    update("conv2d", 0, 4)
    close()
    assert pipe.getvalue() == ""


def test_optimize_flags_are_the_total_and_the_per_subprogram_budget(optimize_cli_kwargs):
    seen = optimize_cli_kwargs(["optimize", "zoo:srcnn", "--time-budget", "20",
                                "--subprogram-budget", "5"])
    assert seen["total_budget"] == 20.0 and seen["time_budget"] == 5.0
    seen = optimize_cli_kwargs(["optimize", "zoo:srcnn"])
    assert seen["total_budget"] == "auto" and seen["time_budget"] == 30.0  # the default
    seen = optimize_cli_kwargs(["optimize", "zoo:srcnn", "--time-budget", "None"])
    assert seen["total_budget"] is None  # no limit
    with pytest.raises(SystemExit):
        optimize_cli_kwargs(["optimize", "zoo:srcnn", "--time-budget", "soon"])



def test_optimize_help_says_the_time_budget_is_for_the_whole_model(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--time-budget S total seconds for the whole model, every phase included " \
        "(default 'auto': 30 s + 1.25 s per distinct subprogram, at most 120 s; 'none': no " \
        "limit)" in text
    assert "--subprogram-budget S search seconds per distinct subprogram" in text


def test_bench_models_takes_the_same_budgets(monkeypatch):
    from ollie.bench import models
    from ollie.commands import bench

    seen: dict = {}
    monkeypatch.setattr(models, "main", lambda *a, **k: seen.update(args=a, **k) or 0)
    args = build_parser().parse_args(["bench", "models", "--models", "srcnn", "--time-budget",
                                      "60", "--subprogram-budget", "4"])
    assert bench.run(args) == 0
    assert seen["total_budget"] == 60.0 and seen["args"][2] == 4.0
    args = build_parser().parse_args(["bench", "models", "--budget", "3"])
    assert args.budget == 3.0 and args.time_budget == "auto"
