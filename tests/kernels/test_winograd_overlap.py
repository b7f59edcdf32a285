"""Overlap-add Winograd transposed convolutions: the linear-convolution matrices compute the
full convolution exactly; the convolution (one input transform for every output phase, the
overlaps added in the output transform) agrees with the reference interpreter on random
inputs (tile sizes, strides, paddings, bias, residual, ReLU, both memory formats), keeps NaN
near where it entered, and is offered beside the per-phase form."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.kernels import winograd, winograd_overlap
from ollie.kernels.winograd_overlap_codegen import linear_matrices
from ollie.libs import onednn
from ollie.lower import lower
from ollie.tune import choice

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="no oneDNN in this torch")


@given(m=st.integers(1, 5), r=st.integers(1, 5),
       data=st.lists(st.integers(-9, 9), min_size=10, max_size=10))
def test_linear_matrices_compute_the_full_convolution_exactly(m: int, r: int,
                                                              data: list[int]) -> None:
    a, g, b = linear_matrices(m, r)
    n = m + r - 1
    x = [Fraction(v) for v in data[:m]]
    w = [Fraction(v) for v in data[m:m + r]]
    gw = [sum(row[k] * w[k] for k in range(r)) for row in g]
    ax = [sum(row[k] * x[k] for k in range(m)) for row in a]
    z = [sum(row[k] * gw[k] * ax[k] for k in range(n)) for row in b]
    assert z == [sum(w[k] * x[j - k] for k in range(r) if 0 <= j - k < m) for j in range(n)]


def _interpreted(x: torch.Tensor, w: torch.Tensor, stride: int, pad: int) -> torch.Tensor:
    low = lower("ConvTranspose2d", [("X", tuple(x.shape)), ("W", tuple(w.shape))],
                stride=stride, padding=pad)
    return torch.from_numpy(np.asarray(ollie.interpret(
        low.expr, {"X": x.numpy(), "W": w.numpy(), **low.consts})))


# (kernel, stride, padding) whose phases are each r x r consecutive taps, and whose outputs
# divide into the phases for some input size
PHASED = [(4, 2, 1), (4, 2, 0), (4, 2, 2), (4, 2, 3), (6, 2, 2), (6, 3, 0), (6, 3, 3),
          (9, 3, 3), (10, 2, 3)]


@needs_onednn
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 2), c=st.integers(1, 16), f=st.integers(1, 16),
       h=st.integers(1, 9), wd=st.integers(1, 9), form=st.sampled_from(PHASED),
       m=st.sampled_from([2, 4]), bias=st.booleans(), relu=st.booleans(),
       residual=st.booleans(), cl=st.booleans(), seed=st.integers(0, 2**16))
def test_overlap_transposed_conv_matches_the_interpreter(n, c, f, h, wd, form, m, bias, relu,
                                                         residual, cl, seed) -> None:
    # up to 16 channels: one channel block (its channels past c zero), so the examples share
    # their transforms' modules
    k, s, pad = form
    hout, wout = (h - 1) * s - 2 * pad + k, (wd - 1) * s - 2 * pad + k
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, c, h, wd, generator=g), torch.randn(c, f, k, k, generator=g)
    b = torch.randn(f, generator=g) if bias else None
    parts = winograd.phase_parts(w, s, pad)
    assert parts is not None and len(parts) == s * s
    if hout <= 0 or wout <= 0 or hout % s or wout % s:
        return
    if parts[0][0].shape[-1] - 1 > m:   # the overlaps would reach past the next tile
        assert winograd_overlap.build(parts, b, tuple(x.shape), (hout // s, wout // s), s,
                                      None, residual, m) is None
        return
    act = "relu" if relu else None
    conv = winograd_overlap.build(parts, b, tuple(x.shape), (hout // s, wout // s), s, act,
                                  residual, m)
    assert conv is not None
    want = _interpreted(x, w, s, pad) + (0 if b is None else b.reshape(1, -1, 1, 1))
    r = torch.randn(want.shape, generator=g)
    want = want + r if residual else want
    want = torch.relu(want) if relu else want
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        got = conv(x, r) if residual else conv(x)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4 * (float(want.abs().max()) + 1e-6)


@needs_onednn
def test_overlap_refuses_what_it_cannot_compute(monkeypatch) -> None:
    w = torch.randn(6, 5, 4, 4)
    parts = winograd.phase_parts(w, 2, 1)
    assert parts is not None
    shape = (2, 6, 5, 5)
    # not one part per phase (e.g. the window form's single part)
    assert winograd_overlap.build(parts[:3], None, shape, (5, 5), 2, None, False, 4) is None
    wp, lo = winograd.transposed_as_phases(w, 2, 1)
    assert winograd_overlap.build([(wp, (lo, lo), 0)], None, shape, (5, 5), 2, None, False,
                                  4) is None
    # transformed input and products past MAX_BYTES
    monkeypatch.setattr(winograd_overlap, "MAX_BYTES", 1024)
    assert winograd_overlap.build(parts, None, shape, (5, 5), 2, None, False, 4) is None


@needs_onednn
def test_overlap_keeps_nan_near_the_tile_that_read_it() -> None:
    # input tile (1, 1) of 4x4 (rows and columns 4..7) holds a NaN: its outputs, through
    # every phase, and the one-row and one-column overlaps into the next tiles may turn NaN;
    # outputs of tiles two away never do, nor another image's
    torch.manual_seed(2)
    w = torch.randn(5, 6, 4, 4)
    parts = winograd.phase_parts(w, 2, 1)
    conv = winograd_overlap.build(parts, None, (2, 5, 12, 12), (12, 12), 2, None, False, 4)
    assert conv is not None
    x = torch.randn(2, 5, 12, 12)
    x[0, 3, 5, 6] = float("nan")
    with torch.inference_mode():
        got = conv(x)
    nan = torch.isnan(got)
    want = torch.isnan(F.conv_transpose2d(x, w, None, 2, 1))
    assert want.any() and bool(nan[want].all())
    assert not nan[1].any()
    # phase outputs u = 4*tile + i + pad - 1 (i < 5): tile 1 reaches phase rows 3..8, output
    # rows 6..17 at most
    rows = nan[0].any(0).any(1).nonzero().flatten()
    cols = nan[0].any(0).any(0).nonzero().flatten()
    assert rows.min() >= 6 and rows.max() <= 17 and cols.min() >= 6 and cols.max() <= 17


@needs_onednn
def test_transposed_conv_offers_the_overlap_form_beside_the_per_phase_one(monkeypatch,
                                                                          ollie_settings
                                                                          ) -> None:
    offered: list[list[str]] = []
    real = choice.Choices.fastest

    def fastest(self, impls, *args, **kwargs):
        offered.append(sorted(impls))
        return real(self, impls, *args, **kwargs)

    ollie_settings(choices={})
    monkeypatch.setattr(choice.Choices, "fastest", fastest)
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(12, 16, 4, 4, generator=g), torch.randn(16, generator=g)
    x = torch.randn(2, 12, 8, 8, generator=g)
    conv = winograd.winograd_conv_transpose2d(w, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                              (1, 1), b, activation="relu")
    assert conv is not None
    assert ["F(4x4)", "overlap F(4x4)"] in offered
    want = torch.relu(_interpreted(x, w, 2, 1) + b.reshape(1, -1, 1, 1))
    with torch.inference_mode():
        got = conv(x)
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    # the window form (phases not r x r each) is not offered it
    offered.clear()
    w3 = torch.randn(12, 16, 3, 3, generator=g)
    winograd.winograd_conv_transpose2d(w3, tuple(x.shape), (2, 2), (1, 1), (1, 1), (1, 1))
    assert not any(name.startswith("overlap") for names in offered for name in names)
