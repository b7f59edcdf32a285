"""``torch.compile(model, backend="ollie")`` never takes a model down: training graphs run on
the default path (gradients equal eager's), and any failure of Ollie, while optimising or when
the program runs, falls back to the graph with one warning naming the cause."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
from torch import nn

import ollie  # registers the backend
from ollie.optimizer import backend
from ollie.optimizer import model as optimizer_model
from ollie.optimizer.config import OptimizeConfig

SHIPPED = backend.BACKEND_CONFIG
pytestmark = pytest.mark.usefixtures("fast_backend")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def test_training_through_the_backend_keeps_gradients(caplog):
    model, ref = _mlp().train(), _mlp().train()
    x = torch.randn(4, 6)
    with caplog.at_level(logging.WARNING, logger="ollie"):
        compiled = torch.compile(model, backend="ollie")
        compiled(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.grad is not None
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert "needs gradients" in caplog.text


def test_inference_under_no_grad_is_optimised():
    model = _mlp().eval()
    x = torch.randn(4, 6)
    calls = []
    real = backend.optimize

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    backend.optimize, saved = spy, backend.optimize
    try:
        with torch.no_grad():
            got = torch.compile(model, backend="ollie")(x)
            want = model(x)
    finally:
        backend.optimize = saved
    assert calls and torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def _compiled_mlp(monkeypatch, caplog, optimize) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP through the backend with ``optimize`` in place of Ollie's: (its output, eager's);
    Ollie's warnings in ``caplog``."""
    monkeypatch.setattr(backend, "optimize", optimize)
    model = _mlp().eval()
    x = torch.randn(4, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        return torch.compile(model, backend="ollie")(x), model(x)


@pytest.mark.parametrize("error", [KeyError("x"), ValueError("bad"), AssertionError()])
def test_an_internal_error_while_optimising_falls_back(monkeypatch, caplog, error):
    def broken(*args, **kwargs):
        raise error

    got, want = _compiled_mlp(monkeypatch, caplog, broken)
    assert torch.allclose(got, want)
    assert type(error).__name__ in caplog.text and "unchanged" in caplog.text


def test_a_program_that_fails_when_called_falls_back(monkeypatch, caplog):
    real = backend.optimize

    def failing(*args, **kwargs):
        opt = real(*args, **kwargs)
        calls = []

        def run(*a):  # right on the backend's own check, then failing
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("kernel exploded")
            return opt(*a)

        return run if opt is not None else None

    monkeypatch.setattr(backend, "optimize", failing)
    model = _mlp().eval()
    x = torch.randn(4, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        compiled = torch.compile(model, backend="ollie")
        first, second = compiled(x), compiled(x)
        want = model(x)
    assert torch.allclose(first, want) and torch.allclose(second, want)
    assert caplog.text.count("kernel exploded") == 1 and "from now on" in caplog.text


def test_a_program_that_disagrees_with_the_graph_is_not_used(monkeypatch, caplog):
    # e.g. the original operators Ollie falls back to when its own checks fail, for a model
    # too ill-conditioned in float32 for another float32 computation to match it
    real = backend.optimize

    def off(*args, **kwargs):
        opt = real(*args, **kwargs)

        def wrong(*a):  # the program returns the graph's containers (a tuple)
            out = opt(*a)
            return tuple(o * 1.01 for o in (out if isinstance(out, (tuple, list)) else (out,)))

        return wrong

    got, want = _compiled_mlp(monkeypatch, caplog, off)
    assert torch.equal(got, want)
    assert "disagrees with the graph" in caplog.text and "unchanged" in caplog.text


class _Branchy(nn.Module):
    """A data-dependent branch (a graph break: two graphs), a dict output and a size."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
        y = torch.relu(self.c1(x))
        if y.sum().item() > -1e30:
            y = y * 2.0
        z = self.c2(y)
        return {"feat": z, "logits": self.head(z.mean((2, 3)))}, z.shape[0]


def _spying(monkeypatch) -> list[list[torch.Tensor]]:
    """The example inputs of each call of ``optimize`` the backend makes, in order."""
    calls: list[list[torch.Tensor]] = []
    real = backend.optimize

    def spy(model, inputs, *args, **kwargs):
        calls.append(list(inputs))
        return real(model, inputs, *args, **kwargs)

    monkeypatch.setattr(backend, "optimize", spy)
    return calls


def _same(got, want) -> bool:
    (gd, gn), (wd, wn) = got, want
    return gn == wn and gd.keys() == wd.keys() and all(
        torch.allclose(gd[k], wd[k], rtol=1e-4, atol=1e-5) for k in wd)


def test_graph_breaks_dicts_and_new_batch_sizes_are_optimised(monkeypatch, caplog):
    calls = _spying(monkeypatch)
    model = _Branchy().eval()
    compiled = torch.compile(model, backend="ollie")
    seen = []
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        for batch in (1, 2, 3, 2):
            x = torch.randn(batch, 3, 12, 12)
            assert _same(compiled(x), model(x))
            seen.append(len(calls))
    # two graphs (the break) at batch 1; the dynamic-shape recompile is then optimised once
    # per new batch size (2 graphs each), and batch 2 again reuses its programs
    assert seen == [2, 4, 6, 6]
    assert "unchanged" not in caplog.text


def test_shapes_beyond_the_specialisation_limit_run_unchanged(monkeypatch, caplog):
    calls = _spying(monkeypatch)
    monkeypatch.setattr(backend, "MAX_SPECIALISATIONS", 1)
    model = _mlp().eval()
    compiled = torch.compile(model, backend="ollie")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        for batch in (2, 3, 4, 5):
            x = torch.randn(batch, 6)
            assert torch.allclose(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(calls) == 2  # batch 2 (static graph) and batch 3 (the first dynamic one)
    assert caplog.text.count("input shapes for one graph") == 1


class _WithIds(nn.Module):
    """BERT's pattern: an integer buffer (position ids) beside the float parameters, all of
    which dynamo passes to the backend as graph inputs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(6, 4)
        self.pos = nn.Parameter(torch.randn(8, 4))
        self.register_buffer("ids", torch.arange(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.pos[self.ids[: x.shape[0]]]


def test_parameters_and_integer_buffers_are_constants(monkeypatch, caplog):
    seen = _spying(monkeypatch)
    model = _WithIds().eval()
    x = torch.randn(5, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        compiled = torch.compile(model, backend="ollie")
        assert torch.allclose(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert "unchanged" not in caplog.text
        # the program's only input is x: parameters and buffers are its constants
        assert [tuple(t.shape) for t in seen[0]] == [(5, 6)]
        model.fc.weight.mul_(2.0)  # a changed parameter: the program no longer applies
        assert torch.allclose(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert caplog.text.count("changed since the graph was optimised") == 1


class _Masked(nn.Module):
    """Longformer's pattern: a boolean mask among the inputs of a graph."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, self.fc(x), x)


def test_boolean_inputs_are_constants_checked_at_each_call(monkeypatch, caplog):
    seen = _spying(monkeypatch)
    model = _Masked().eval()
    x, mask = torch.randn(4, 6), torch.rand(4, 6) > 0.5
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        compiled = torch.compile(model, backend="ollie")
        assert torch.allclose(compiled(x, mask), model(x, mask), rtol=1e-4, atol=1e-5)
        assert "unchanged" not in caplog.text
        assert [tuple(t.shape) for t in seen[0]] == [(4, 6)]
        other = ~mask
        assert torch.allclose(compiled(x, other), model(x, other), rtol=1e-4, atol=1e-5)
    assert "other values" in caplog.text


def test_compile_after_optimize_reuses_its_decisions(monkeypatch, ollie_settings, tmp_path):
    # the backend's settings are ollie.optimize's defaults, so decisions cached by one serve
    # the other (with other search settings, a torch.compile after ollie.optimize of the same
    # model searched every subprogram again)
    assert OptimizeConfig() == SHIPPED
    ollie_settings(cache_dir=tmp_path)
    cfg = replace(backend.BACKEND_CONFIG, use_cache=True)  # the fast settings, cached
    monkeypatch.setattr(backend, "BACKEND_CONFIG", cfg)
    searched = []
    real = optimizer_model.derive
    monkeypatch.setattr(optimizer_model, "derive",
                        lambda *a, **k: searched.append(1) or real(*a, **k))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    ollie.optimize(model, x, config=cfg)
    assert searched
    searched.clear()
    with torch.no_grad():
        got = torch.compile(model, backend="ollie")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
    assert not searched
