"""Unexpected failures inside ``optimize`` and the CLI: a subprogram whose search or timing
fails keeps its original operator, an optional program-level step that fails is skipped, and
anything else becomes an ``OllieError`` (``optimize``) or one line and exit status 1 (CLI)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie import cli
from ollie.optimizer import model as model_mod

FAST = {"time_budget": 0.5, "max_depth": 1, "settle": 0.0, "choose_libraries": False,
        "max_candidates": 2, "use_cache": False}


def _model():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    return m, torch.randn(1, 3, 6, 6)


def test_an_allocation_failure_timing_the_original_keeps_it(monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("cannot allocate 48 GiB")

    monkeypatch.setattr(model_mod, "original_runner", no_memory)
    m, x = _model()
    prog = ollie.optimize(m, (x,), context=False, **FAST)
    with torch.no_grad():
        assert torch.allclose(prog(x), m(x), rtol=1e-4, atol=1e-5)
    assert any("kept as is" in n and "MemoryError" in n for n in prog.notes)


def test_a_failing_context_step_is_skipped(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("conv2d_3")

    monkeypatch.setattr(model_mod, "cached_refine", broken)
    monkeypatch.setattr(model_mod._Optimizer, "groups",
                        lambda self: [model_mod.Group("k", ("conv2d",), 1.0)])
    m, x = _model()
    prog = ollie.optimize(m, (x,), context=True, **FAST)
    with torch.no_grad():
        assert torch.allclose(prog(x), m(x), rtol=1e-4, atol=1e-5)
    assert any("program context step skipped: KeyError" in n for n in prog.notes)


def test_an_unexpected_error_becomes_an_ollie_error(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("frontend bug")

    monkeypatch.setattr(model_mod, "to_graph", broken)
    m, x = _model()
    with pytest.raises(ollie.OllieError, match="ValueError: frontend bug") as info:
        ollie.optimize(m, (x,), **FAST)
    assert isinstance(info.value.__cause__, ValueError)


def test_the_cli_reports_an_internal_error_in_one_line(monkeypatch, capsys, tmp_path):
    def broken(args):
        raise AttributeError("'NoneType' object has no attribute 'shape'")

    monkeypatch.setitem(cli._HANDLERS, "zoo", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setattr(cli, "build_parser", _parser_with(broken))
    assert cli.main(["zoo"]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error: AttributeError" in err[0]


def test_the_cli_refuses_a_tampered_program_in_one_line(capsys, tmp_path):
    (tmp_path / "program.json").write_text('{"format": 2, "inputs": 3}')
    import numpy as np

    np.savez(tmp_path / "constants.npz")
    assert cli.main(["run", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "program.json" in err[0]


def _parser_with(handler):
    real = cli.build_parser

    def build():
        parser = real()
        cli._HANDLERS["zoo"] = handler
        return parser

    return build


@pytest.mark.parametrize("device", ["mps", "nonsense", "cuda:x"]
                         + ([] if torch.cuda.is_available() else ["cuda"]))
def test_a_device_ollie_cannot_use_is_a_config_error(device):
    m, x = _model()
    with pytest.raises(ollie.ConfigError, match="device"):
        ollie.optimize(m, (x,), device=device, **FAST)
