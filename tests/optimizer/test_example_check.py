"""The end-to-end check runs on the example inputs as well as on random ones
(ollie.optimizer.final.confirm): a float attention mask of zeros exercises the attention,
while any random standard-normal mask masks every position and hides a wrong kernel there (as
Longformer's did). A deliberately wrong kernel, injected into the compiled programs, must be
caught on the example inputs by ``ollie.optimize`` and by the torch.compile backend."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

import ollie
from ollie.exec import executor
from ollie.optimizer import backend
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.final import example_error
from ollie.program.params import KernelKind

# no whole-program library choice: an ONNX Runtime regions variant would run the scores
# without the broken kernel (this file is about the check, not the library choice)
FAST = dict(time_budget=0.5, max_depth=1, max_candidates=1, use_cache=False, context=False,
            settle=0.0, choose_libraries=False)
N = 6


class Masked(nn.Module):
    """Attention scores masked where ``mask != 0`` (transformers' float masks): a random
    mask masks everything, and the output is the mean of ``x``'s rows whatever the scores."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = (self.q(x) @ x.T) / 4
        scores = scores.masked_fill(mask[None, :] != 0, -1e4)
        return torch.softmax(scores, -1) @ x


@pytest.fixture
def broken_scores(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Compiled programs' eOperators of the scores' shape compute twice their value (the
    reference executor and the original operators run as they are stay right). Returns the
    outputs it broke."""
    broke: list[str] = []
    real = executor.compile_kernel

    def compile_kernel(k, *args, **kwargs):
        fn = real(k, *args, **kwargs)
        if k.kind is not KernelKind.EOP or tuple(k.output_shape) != (N, N):
            return fn
        broke.append(k.output)
        return lambda env, out: fn(env, out) * 2

    monkeypatch.setattr(executor, "compile_kernel", compile_kernel)
    return broke


def inputs(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(N, 8, generator=torch.Generator().manual_seed(3)), mask


def test_zero_mask_catches_the_wrong_kernel(broken_scores, caplog) -> None:
    torch.manual_seed(0)
    model = Masked().eval()
    x, mask = inputs(torch.zeros(N))
    with caplog.at_level(logging.WARNING, logger="ollie"):
        prog = ollie.optimize(model, (x, mask), **FAST)
    assert broken_scores, "no eOperator of the scores' shape: the test exercises nothing"
    text = " ".join(prog.notes)
    assert "on the example inputs (output" in text and "falling back" in text, prog.notes
    assert any("example inputs" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        torch.testing.assert_close(prog(x, mask), model(x, mask), rtol=1e-5, atol=1e-5)


def test_random_mask_hides_it(broken_scores) -> None:
    """The same wrong kernel passes a check whose example mask is random, like the random
    draws: the optimised program is kept (the control for the test above)."""
    torch.manual_seed(0)
    model = Masked().eval()
    x, mask = inputs(torch.randn(N, generator=torch.Generator().manual_seed(4)))
    prog = ollie.optimize(model, (x, mask), **FAST)
    assert broken_scores
    assert not any("falling back" in n for n in prog.notes), prog.notes
    assert any("checked against" in n and "on the example inputs" in n for n in prog.notes)
    zero = torch.zeros(N)
    with torch.no_grad():
        assert (prog(x, zero) - model(x, zero)).abs().max() > 1e-2  # the kernel is wrong


def test_backend_checks_the_inputs_dynamo_passes(broken_scores, monkeypatch, caplog) -> None:
    torch.manual_seed(0)
    model = Masked().eval()
    monkeypatch.setattr(backend, "BACKEND_CONFIG", OptimizeConfig(**FAST))
    torch._dynamo.reset()
    x, mask = inputs(torch.zeros(N))
    try:
        with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ollie"):
            compiled = torch.compile(model, backend="ollie")
            got, want = compiled(x, mask), model(x, mask)
    finally:
        torch._dynamo.reset()
    assert broken_scores
    assert any("on the example inputs" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_example_error_compares_non_finite_values() -> None:
    want = {"y": torch.tensor([1.0, -math.inf, math.nan, 4.0])}
    assert example_error({"y": torch.tensor([1.0, -math.inf, math.nan, 4.0])}, want) == \
        (0.0, "y")
    err, out = example_error({"y": torch.tensor([1.0, -math.inf, math.nan, 3.0])}, want)
    assert out == "y" and err == pytest.approx(0.25)
    for bad in ([1.0, math.inf, math.nan, 4.0], [1.0, -math.inf, 0.0, 4.0],
                [math.nan, -math.inf, math.nan, 4.0]):
        assert example_error({"y": torch.tensor(bad)}, want)[0] == math.inf


def test_no_program_when_not_even_the_original_operators_match(monkeypatch) -> None:
    """When every program Ollie builds is wrong on the model's output (here: every compiled
    kernel producing it doubles its value, the original operators' too), ``optimize``
    returns none: the fallback is checked like the programs before it, and the error names
    it, instead of a program that disagrees with the model."""
    real = executor.compile_kernel
    broke: list[str] = []

    def compile_kernel(k, *args, **kwargs):
        fn = real(k, *args, **kwargs)
        if tuple(k.output_shape) != (N, 8):
            return fn
        broke.append(k.output)
        return lambda env, out: fn(env, out) * 2

    monkeypatch.setattr(executor, "compile_kernel", compile_kernel)
    torch.manual_seed(0)
    model = Masked().eval()
    with pytest.raises(ollie.OllieError, match="not even its original operators") as info:
        ollie.optimize(model, inputs(torch.zeros(N)), **FAST)
    assert broke, "no kernel of the output's shape: the test exercises nothing"
    assert "original operators' program disagrees with the model" in str(info.value)
