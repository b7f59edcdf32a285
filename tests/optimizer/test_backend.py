"""``torch.compile(model, backend="ollie")`` never takes a model down: training graphs run on
the default path (gradients equal eager's), and any failure of Ollie, while optimising or when
the program runs, falls back to the graph with one warning naming the cause."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
from torch import nn

import ollie  # noqa: F401  (registers the backend)
from ollie.optimizer import backend

FAST = {"time_budget": 0.5, "max_depth": 1, "context": False, "settle": 0.0,
        "choose_libraries": False, "max_candidates": 2, "use_cache": False}


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(backend, "BACKEND_CONFIG", replace(backend.BACKEND_CONFIG, **FAST))
    yield
    torch._dynamo.reset()


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


@pytest.mark.parametrize("error", [KeyError("x"), ValueError("bad"), AssertionError()])
def test_an_internal_error_while_optimising_falls_back(monkeypatch, caplog, error):
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(backend, "optimize", broken)
    model = _mlp().eval()
    x = torch.randn(4, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        got = torch.compile(model, backend="ollie")(x)
        want = model(x)
    assert torch.allclose(got, want)
    assert type(error).__name__ in caplog.text and "unchanged" in caplog.text


def test_a_program_that_fails_when_called_falls_back(monkeypatch, caplog):
    real = backend.optimize

    def failing(*args, **kwargs):
        opt = real(*args, **kwargs)

        def run(*a):
            raise RuntimeError("kernel exploded")

        return run if opt is not None else None

    monkeypatch.setattr(backend, "optimize", failing)
    model = _mlp().eval()
    x = torch.randn(4, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
        compiled = torch.compile(model, backend="ollie")
        first, second = compiled(x), compiled(x)
        want = model(x)
    assert torch.allclose(first, want) and torch.allclose(second, want)
    assert caplog.text.count("kernel exploded") == 1
