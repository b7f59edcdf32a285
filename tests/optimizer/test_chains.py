"""Fused contraction chains end to end: the plain-PyTorch Longformer's banded products
(pad / unfold / slice / product / sum) are fused into one expression each, derived into the
library's G2BMM and GBMM, checked against the interpreter and the module, and kept only when
faster.

Measurement runs on a stopped clock; to test the kept path the measured times of the fused
programs are replaced after the real selection (which did verify them), so no assertion
depends on the machine's speed."""

from __future__ import annotations

import pytest
import torch

import ollie
from ollie.optimizer import chains
from ollie.testing.clock import stopped_clock

FAST = dict(max_depth=1, time_budget=2.0, use_cache=False, context=False,
            choose_libraries=False, settle=0, merge_siblings=False, kernel_library=False)


def _script(monkeypatch, factor: float) -> None:
    """Selections of fused chains measure programs with a band operator at ``factor`` x the
    nodes' time, every other program slower."""
    real = chains.select_program

    def timed(*args, **kwargs):
        sel = real(*args, **kwargs)
        sel.baseline.seconds, sel.baseline.samples = 1e-3, []
        sel.unconfirmed = False
        for m in sel.measured:
            band = "G2BMM" in m.label or "GBMM" in m.label
            m.seconds, m.samples = (factor if band else 3.0) * 1e-3, []
        return sel

    monkeypatch.setattr(chains, "select_program", timed)


def _model():
    m, (x,) = ollie.zoo.get("longformer_plain", seq=16, width=2, dilation=2)
    return m, x


def _close(opt, m, x) -> None:
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-5)


def test_banded_products_are_derived_into_g2bmm_and_gbmm(ollie_settings, monkeypatch):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _script(monkeypatch, 0.5)
    m, x = _model()
    opt = ollie.optimize(m, x, **FAST)
    fused = [r for r in opt.report if r.derivation[:1] == ["expression_fusion"]]
    assert len(fused) == 2
    assert [r.op for r in fused] == ["ReduceSum", "ReduceSum"]
    for r in fused:
        assert {"pad", "unfold", "mul"} <= {n.rstrip("_0123456789") for n in r.nodes}
        assert r.optimized_ms == pytest.approx(0.5) and r.original_ms == pytest.approx(1.0)
    assert "G2BMM" in fused[0].chosen and "GBMM" in fused[1].chosen
    kinds = {k.kind for k in opt.program.kernels}
    assert {"G2BMM", "GBMM"} <= kinds
    assert sum(n.startswith("chain ") and "fused into" in n for n in opt.notes) == 2
    assert any(n.startswith("checked against the original model") for n in opt.notes)
    _close(opt, m, x)


def test_slower_chains_keep_their_nodes(ollie_settings, monkeypatch):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _script(monkeypatch, 2.0)
    m, x = _model()
    opt = ollie.optimize(m, x, **FAST)
    assert not any(r.derivation[:1] == ["expression_fusion"] for r in opt.report)
    assert sum("not fused" in n for n in opt.notes) == 2
    assert not {"G2BMM", "GBMM"} & {k.kind for k in opt.program.kernels}
    _close(opt, m, x)


class ScaledAttention(torch.nn.Module):
    """Scores of heads split from one projection, ``q`` scaled by a Python number (Swin's
    attention): the scale is a 0-d constant of the model and a [1] tensor in the chain's
    expression."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(1, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
        scores = (q * 8 ** -0.5).matmul(k.transpose(-2, -1))
        return scores.softmax(-1).matmul(v)


def test_a_chain_reading_a_scalar_constant_is_decided(ollie_settings):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    m, x = ScaledAttention().eval(), torch.randn(1, 16, 32)
    opt = ollie.optimize(m, x, **FAST)
    scaled = [n for n in opt.notes if n.startswith("chain ") and ", mul," in n]
    assert len(scaled) == 1 and "Error" not in scaled[0], opt.notes
    _close(opt, m, x)


def test_a_chain_with_nothing_verified_says_so(ollie_settings, monkeypatch):
    """No fused program verified: the baseline is not timed, and the note says that instead
    of giving its time as NaN."""
    from ollie.search.derive import DeriveResult

    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    monkeypatch.setattr(chains, "derive", lambda expr, **kwargs: DeriveResult([], {
        "candidates": 0, "states_visited": 0, "states_pruned": 0, "seconds": 0.0,
        "max_depth": 0}))
    m, x = _model()
    opt = ollie.optimize(m, x, **FAST)
    notes = [n for n in opt.notes if n.startswith("chain ")]
    assert len(notes) == 2 and all("no fused program verified" in n for n in notes), notes
    assert not any("nan" in n for n in notes)
    _close(opt, m, x)
