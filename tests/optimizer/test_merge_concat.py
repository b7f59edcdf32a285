"""Sibling merging by concatenation end to end: a SqueezeNet fire module's expand pair (a 1x1
and a 3x3 convolution of one input, 6 channels each, ReLU, Concat) becomes one subprogram, one
convolution over the concatenated weights (the 1x1 weight relaxed to the 3x3 window), verified
against the reference interpreter on both outputs and measured against the members; the
optimised program computes what the module does.

Measurement runs on a stopped clock; to test the kept path the measured times of the merged
programs are replaced after the real selection (which did verify them), so no assertion
depends on the machine's speed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.optimizer import region
from ollie.program.params import KernelKind
from ollie.testing.clock import stopped_clock

FAST = dict(max_depth=0, time_budget=2.0, use_cache=False, context=False,
            choose_libraries=False, settle=0, max_candidates=2)


class _Expand(nn.Module):
    """The expand half of a fire module (``ollie.testing.cnns._Fire`` without its squeeze);
    ``k3`` 1 gives two twin 1x1 convolutions (with biases: stacking does not apply, they are
    concatenated)."""

    def __init__(self, i: int = 4, e: int = 6, k3: int = 3) -> None:
        super().__init__()
        self.e1 = nn.Conv2d(i, e, 1)
        self.e3 = nn.Conv2d(i, e, k3, padding=k3 // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(self.e1(x)), torch.relu(self.e3(x))], 1)


def _fire(k3: int = 3) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _Expand(k3=k3).eval(), torch.randn(1, 4, 6, 6)


def _merged_faster(monkeypatch, factor: float) -> None:
    """Selections of merged programs measure the first Conv program at ``factor`` x the
    members' time, the others 1% slower each."""
    real = region.select_program

    def timed(*args, **kwargs):
        sel = real(*args, **kwargs)
        sel.baseline.seconds, sel.baseline.samples = 1e-3, []
        sel.unconfirmed = False
        ranked = sorted(sel.measured, key=lambda m: not m.label.startswith("Conv"))
        for i, m in enumerate(ranked):
            m.seconds, m.samples = factor * 1e-3 * (1 + 0.01 * i), []
        return sel

    monkeypatch.setattr(region, "select_program", timed)


@pytest.mark.parametrize("k3", [3, 1])
def test_fire_expand_pair_merged_into_one_convolution(ollie_settings, monkeypatch, k3):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock,
                   sleep=lambda s: None)
    _merged_faster(monkeypatch, 0.5)
    m, x = _fire(k3)
    opt = ollie.optimize(m, x, **FAST)
    merged = [r for r in opt.report if len(r.nodes) > 1]
    assert len(merged) == 1, opt.summary()
    r = merged[0]
    assert r.nodes == ["conv2d", "conv2d_1"] and r.op == "Conv2d x2"
    assert r.derivation[0] == "expression_merging" and r.chosen.startswith("Conv")
    assert r.optimized_ms == pytest.approx(0.5) and r.original_ms == pytest.approx(1.0)
    assert not any(e.node == "conv2d_1" for e in opt.report)
    convs = [k for k in opt.program.kernels if k.kind == KernelKind.CONV]
    assert any(k.params.f == 12 for k in convs), [k.params for k in convs]
    assert any(n.startswith("checked against the original model") for n in opt.notes)
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-5)
