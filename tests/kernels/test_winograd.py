"""Winograd convolutions: the Cook-Toom matrices compute 1-D correlations exactly; the
F(4x4, 3x3) and F(4x4, 5x5) convolutions (generated transforms + oneDNN products) and the transposed
convolution as its output phases agree with the reference interpreter on random inputs
(padding, dilation, output padding, bias, residual, activations, both memory formats);
``best_conv`` can choose them."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.exec import conv as conv_choice
from ollie.kernels import winograd
from ollie.libs import onednn
from ollie.lower import lower
from ollie.testing.clock import FakeClock
from ollie.tune import choice

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="no oneDNN in this torch")


@given(m=st.integers(1, 5), r=st.integers(1, 5),
       data=st.lists(st.integers(-9, 9), min_size=20, max_size=20))
def test_matrices_compute_the_correlation_exactly(m: int, r: int, data: list[int]) -> None:
    at, g, bt = winograd.matrices(m, r)
    n = m + r - 1
    d = [Fraction(v) for v in data[:n]]
    w = [Fraction(v) for v in data[n:n + r]]
    gw = [sum(row[k] * w[k] for k in range(r)) for row in g]
    bd = [sum(row[k] * d[k] for k in range(n)) for row in bt]
    y = [sum(row[k] * gw[k] * bd[k] for k in range(n)) for row in at]
    assert y == [sum(w[k] * d[i + k] for k in range(r)) for i in range(m)]


def test_applies_only_to_stride_one_ungrouped_square_kernels() -> None:
    assert winograd.applies((8, 4, 3, 3), (1, 1), 1)
    assert not winograd.applies((8, 4, 3, 3), (2, 2), 1)
    assert not winograd.applies((8, 2, 3, 3), (1, 1), 2)
    assert not winograd.applies((8, 4, 1, 1), (1, 1), 1)
    assert winograd.applies((8, 4, 5, 5), (1, 1), 1)
    assert not winograd.applies((8, 4, 3, 1), (1, 1), 1)


def _interpreted(x: torch.Tensor, w: torch.Tensor, pad: int, dil: int) -> np.ndarray:
    n, c, h, wd = x.shape
    f, k = w.shape[0], w.shape[-1]
    ho, wo = h + 2 * pad - (k - 1) * dil, wd + 2 * pad - (k - 1) * dil
    expr = ollie.parse(
        f"A: {list(x.shape)}\nK: {list(w.shape)}\n"
        f"L<n=0:{n}, f=0:{f}, h=0:{ho}, w=0:{wo}> Sum<c=0:{c}, r=0:{k}, s=0:{k}> "
        f"A[n, c, h + {dil}*r - {pad}, w + {dil}*s - {pad}] * K[f, c, r, s]")
    return ollie.interpret(expr, {"A": x.numpy(), "K": w.numpy()})


@needs_onednn
@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 2), c=st.integers(1, 9), f=st.integers(1, 9),
       h=st.integers(1, 13), wd=st.integers(1, 13), pad=st.integers(0, 4),
       dil=st.integers(1, 3), bias=st.booleans(), residual=st.booleans(),
       act=st.sampled_from([None, "relu", "tanh"]), cl=st.booleans(),
       k=st.sampled_from(sorted(winograd.TILE)), seed=st.integers(0, 2**16))
def test_winograd_conv_matches_the_interpreter(n, c, f, h, wd, pad, dil, bias, residual, act,
                                               cl, k, seed) -> None:
    ho, wo = h + 2 * pad - (k - 1) * dil, wd + 2 * pad - (k - 1) * dil
    if ho <= 0 or wo <= 0:
        assert winograd.winograd_conv2d(torch.randn(f, c, k, k), (n, c, h, wd), (1, 1),
                                        (pad, pad), (dil, dil)) is None
        return
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, wd, generator=g)
    w = torch.randn(f, c, k, k, generator=g)
    b = torch.randn(f, generator=g) if bias else None
    r = torch.randn(n, f, ho, wo, generator=g)
    conv = winograd.winograd_conv2d(w, (n, c, h, wd), (1, 1), (pad, pad), (dil, dil), b,
                                    activation=act, residual=residual)
    assert conv is not None
    want = torch.from_numpy(_interpreted(x, w, pad, dil))
    if b is not None:
        want = want + b.reshape(1, -1, 1, 1)
    if residual:
        want = want + r
    want = onednn.POST_OPS[act](want)
    fmt = torch.channels_last if cl else torch.contiguous_format
    with torch.inference_mode():
        args = (x.contiguous(memory_format=fmt),) + ((r,) if residual else ())
        got = conv(*args)
        again = conv(*args)   # the workspace is reused
    assert got.shape == want.shape
    scale = float(want.abs().max()) + 1e-6
    assert float((got - want).abs().max()) <= 1e-4 * scale
    assert torch.equal(got, again)


@needs_onednn
def test_winograd_keeps_nan_within_the_tiles_that_read_it() -> None:
    torch.manual_seed(1)
    w = torch.randn(6, 5, 3, 3)
    conv = winograd.winograd_conv2d(w, (1, 5, 10, 10), (1, 1), (1, 1), (1, 1))
    assert conv is not None
    x = torch.randn(1, 5, 10, 10)
    x[0, 2, 4, 4] = float("nan")
    with torch.inference_mode():
        got, want = conv(x), F.conv2d(x, w, padding=1)
    nan = torch.isnan(want)
    assert nan.any() and bool(torch.isnan(got)[nan].all())
    # outputs 3..5 read input 4; a transform spreads NaN through its 4x4 output tile (tiles
    # 0 and 1 of each axis), never into another tile
    tiles = F.pad(torch.isnan(got), (0, 2, 0, 2)).reshape(1, 6, 3, 4, 3, 4).any(5).any(3)
    assert not tiles[:, :, 2, :].any() and not tiles[:, :, :, 2].any()


@needs_onednn
def test_best_conv_offers_winograd_and_a_preference_limits_the_choice(monkeypatch,
                                                                      ollie_settings) -> None:
    # equal samples on a ticking fake clock: the measurement does not depend on the machine
    # (tests/conftest.py's QUIET settings also keep a spread from counting as load)
    ollie_settings(measure_clock=FakeClock(tick=2.0 ** -10))
    torch.manual_seed(2)
    w, b = torch.randn(16, 16, 3, 3), torch.randn(16)
    choice.shared().clear()
    built: list[str] = []
    real = winograd.winograd_conv2d

    def spy(*args, **kwargs):
        built.append("winograd")
        return real(*args, **kwargs)

    monkeypatch.setattr(winograd, "winograd_conv2d", spy)
    prefer = f"{conv_choice.WINOGRAD}{conv_choice.ANY_OF}torch"
    # too small to pay back the transforms: no Winograd candidate is built
    conv_choice.best_conv("Conv2d", w, b, (2, 16, 12, 12), (1, 1), (1, 1), (1, 1),
                          activation="relu", prefer=prefer)
    assert built == []
    choice.shared().clear()
    monkeypatch.setattr(conv_choice, "WINOGRAD_MIN_FLOPS", 0)
    conv = conv_choice.best_conv("Conv2d", w, b, (2, 16, 12, 12), (1, 1), (1, 1), (1, 1),
                                 activation="relu", prefer=prefer)
    assert built == ["winograd"]
    key = next(k for k in choice.shared() if k[-1] == prefer)
    assert choice.shared()[key] in (conv_choice.WINOGRAD, "torch")
    x = torch.randn(2, 16, 12, 12)
    with torch.inference_mode():
        torch.testing.assert_close(conv(x), F.relu(F.conv2d(x, w, b, padding=1)),
                                   rtol=1e-4, atol=1e-4)
    # a strided convolution has no Winograd form: not built
    built.clear()
    conv_choice.best_conv("Conv2d", w, b, (2, 16, 12, 12), (2, 2), (1, 1), (1, 1))
    assert built == []


@pytest.mark.parametrize("op, wshape, xshape, stride, pad, dil", [
    ("Conv2d", (8, 3, 3, 3), (2, 3, 11, 9), (1, 1), (1, 1), (1, 1)),
    ("Conv2d", (6, 4, 5, 3), (1, 4, 12, 10), (2, 1), (2, 0), (1, 2)),
    ("ConvTranspose2d", (4, 6, 4, 4), (3, 4, 5, 7), (2, 2), (1, 1), (1, 1)),
])
def test_direct_flops_match_torchs_flop_counter(op, wshape, xshape, stride, pad, dil) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    w, x = torch.randn(wshape), torch.randn(xshape)
    with FlopCounterMode(display=False) as counter:
        if op == "Conv2d":
            F.conv2d(x, w, None, stride, pad, dil)
        else:
            F.conv_transpose2d(x, w, None, stride, pad, 0, 1, dil)
    assert conv_choice.direct_flops(op, wshape, xshape, stride, pad, dil) == \
        counter.get_total_flops()


def _interpreted_transposed(x: torch.Tensor, w: torch.Tensor, stride: int, pad: int,
                            opad: int) -> np.ndarray:
    low = lower("ConvTranspose2d", [("X", tuple(x.shape)), ("W", tuple(w.shape))],
                stride=stride, padding=pad, output_padding=opad)
    return np.asarray(ollie.interpret(low.expr, {"X": x.numpy(), "W": w.numpy(),
                                                 **low.consts}))


@needs_onednn
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 2), c=st.integers(1, 7), f=st.integers(1, 7),
       h=st.integers(1, 7), wd=st.integers(1, 7), k=st.integers(2, 6), stride=st.integers(2, 3),
       pad=st.integers(0, 3), opad=st.integers(0, 2), bias=st.booleans(),
       act=st.sampled_from([None, "relu", "tanh"]), seed=st.integers(0, 2**16))
def test_winograd_transposed_conv_matches_the_interpreter(n, c, f, h, wd, k, stride, pad,
                                                          opad, bias, act, seed) -> None:
    shape = (n, c, h, wd)
    applies = winograd.applies_transposed((c, f, k, k), (stride, stride), (pad, pad), (1, 1),
                                          1)
    hout, wout = (h - 1) * stride - 2 * pad + k + opad, (wd - 1) * stride - 2 * pad + k + opad
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(shape, generator=g), torch.randn(c, f, k, k, generator=g)
    b = torch.randn(f, generator=g) if bias else None
    conv = None
    if opad < stride and pad < k:
        conv = winograd.winograd_conv_transpose2d(w, shape, (stride, stride), (pad, pad),
                                                  (opad, opad), (1, 1), b, activation=act)
    if not (applies and opad < stride and pad < k and hout > 0 and wout > 0
            and hout % stride == 0 and wout % stride == 0):
        assert conv is None
        return
    assert conv is not None
    want = torch.from_numpy(_interpreted_transposed(x, w, stride, pad, opad))
    if b is not None:
        want = want + b.reshape(1, -1, 1, 1)
    want = onednn.POST_OPS[act](want)
    with torch.inference_mode():
        got = conv(x)
    assert got.shape == want.shape
    scale = float(want.abs().max()) + 1e-6
    assert float((got - want).abs().max()) <= 1e-4 * scale


def test_gan_layers_are_three_by_three_phase_convolutions() -> None:
    # DCGAN / InfoGAN: 4x4 kernels, stride 2, padding 1: 4 phases, each a 3x3 window with
    # the 2x2 taps it reads
    assert winograd.applies_transposed((8, 4, 4, 4), (2, 2), (1, 1), (1, 1), 1)
    assert not winograd.applies_transposed((8, 4, 4, 4), (1, 1), (0, 0), (1, 1), 1)
    wt = torch.randn(8, 4, 4, 4)
    phases, left = winograd.transposed_as_phases(wt, 2, 1)
    assert phases.shape == (16, 8, 3, 3) and left == 1
    assert int((phases != 0).sum()) == 4 * 4 * 8 * 4   # 4 taps per phase and channel pair


@needs_onednn
@pytest.mark.parametrize("per_phase", [True, False])
def test_gan_layer_per_phase_and_over_the_window_match_the_interpreter(monkeypatch,
                                                                       per_phase) -> None:
    # each phase of a 4x4 stride-2 kernel reads 2x2 taps: its own F(4x4, 2x2) convolution
    # (the default), or all phases as one F(4x4, 3x3) over the 3x3 window
    wt = torch.randn(8, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    parts = winograd.phase_parts(wt, 2, 1)
    assert parts is not None and len(parts) == 4
    assert [(tuple(w.shape), pad, ph) for w, pad, ph in parts] == [
        ((4, 8, 2, 2), (1, 1), 0), ((4, 8, 2, 2), (1, 0), 1),
        ((4, 8, 2, 2), (0, 1), 2), ((4, 8, 2, 2), (0, 0), 3)]
    _per_phase_only(monkeypatch)
    if not per_phase:
        monkeypatch.setattr(winograd, "phase_parts", lambda *a: None)
    x = torch.randn(2, 8, 5, 6, generator=torch.Generator().manual_seed(4))
    conv = winograd.winograd_conv_transpose2d(wt, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                              (1, 1), activation="relu")
    assert conv is not None
    want = torch.relu(torch.from_numpy(_interpreted_transposed(x, wt, 2, 1, 0)))
    with torch.inference_mode():
        got = conv(x)
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_channel_blocks_round_up_to_multiples_of_16_then_64() -> None:
    from ollie.kernels.winograd_codegen import block

    assert [block(c) for c in (1, 16, 17, 21, 64, 65, 128, 129, 512)] == \
        [16, 16, 32, 32, 64, 128, 128, 192, 512]


@needs_onednn
@pytest.mark.parametrize(("c", "f", "k", "dil", "cl"), [
    (21, 40, 3, 1, True), (70, 17, 3, 2, False), (33, 65, 5, 1, True), (20, 24, 2, 1, False)])
def test_winograd_conv_with_padded_channel_blocks_matches_the_interpreter(c, f, k, dil,
                                                                          cl) -> None:
    # channel counts that are not a multiple of their block (zero channels in V and U),
    # images large enough for interior tiles (read directly) beside border tiles (gathered)
    g = torch.Generator().manual_seed(c * f)
    x = torch.randn(2, c, 19, 23, generator=g)
    w = torch.randn(f, c, k, k, generator=g)
    b = torch.randn(f, generator=g)
    pad = dil * (k - 1) // 2
    span = dil * (k - 1) - 2 * pad
    r = torch.randn(2, f, 19 - span, 23 - span, generator=g)
    conv = winograd.winograd_conv2d(w, tuple(x.shape), (1, 1), (pad, pad), (dil, dil), b,
                                    activation="relu", residual=True)
    assert conv is not None
    want = torch.relu(torch.from_numpy(_interpreted(x, w, pad, dil)) + b.reshape(1, -1, 1, 1)
                      + r)
    fmt = torch.channels_last if cl else torch.contiguous_format
    with torch.inference_mode():
        got = conv(x.contiguous(memory_format=fmt), r)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


@needs_onednn
def test_winograd_transposed_conv_with_padded_channel_blocks_matches_the_interpreter() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 20, 11, 13, generator=g)
    wt = torch.randn(20, 33, 4, 4, generator=g)
    b = torch.randn(33, generator=g)
    conv = winograd.winograd_conv_transpose2d(wt, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                              (1, 1), b, activation="relu")
    assert conv is not None
    want = torch.relu(torch.from_numpy(_interpreted_transposed(x, wt, 2, 1, 0))
                      + b.reshape(1, -1, 1, 1))
    with torch.inference_mode():
        got = conv(x)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_the_small_tile_is_offered_where_it_multiplies_less_or_the_weights_exceed_the_cache(
        monkeypatch) -> None:
    w3 = torch.zeros(8, 8, 3, 3)
    parts = [(w3, (1, 1), 0)]
    # 14x14 outputs: F(4x4, 3x3) 16 tiles x 36 < F(2x2, 3x3) 49 tiles x 16: only F(4x4)
    assert winograd.tile_sizes(parts, (14, 14), 1) == [4]
    # 2x2 outputs: one 4x4 tile (36 products) against one 2x2 tile (16)
    assert winograd.tile_sizes(parts, (2, 2), 1) == [4, 2]
    # 4x4 outputs: one 4x4 tile (36 products, fewer) against four 2x2 tiles (64), but each
    # weight matrix then serves one tile per batch entry
    assert winograd.tile_sizes(parts, (4, 4), 1) == [4, 2]
    assert winograd.tile_sizes(parts, (5, 4), 1) == [4]
    # dilation 2: one tile per residue class
    assert winograd.tile_sizes(parts, (8, 8), 2) == [4, 2]
    assert winograd.tile_sizes(parts, (10, 8), 2) == [4]
    # transformed weights past the largest cache: 36 * 8 * 16 * 4 bytes > 1 KiB
    import sys

    monkeypatch.setattr(sys.modules["ollie.tune.measure"], "llc_bytes", lambda: 1024)
    assert winograd.tile_sizes(parts, (14, 14), 1) == [4, 2]
    # a cache reported larger than CACHE_MAX_BYTES (a VM reporting its host's) counts as that
    big = [(torch.zeros(8, 2 ** 13, 3, 3), (1, 1), 0)]  # 36 * 8 * 8192 * 4 bytes: 9 MiB
    monkeypatch.setattr(sys.modules["ollie.tune.measure"], "llc_bytes", lambda: 480 << 20)
    assert winograd.tile_sizes(big, (14, 14), 1) == [4]
    monkeypatch.setattr(winograd, "CACHE_MAX_BYTES", 4 << 20)
    assert winograd.tile_sizes(big, (14, 14), 1) == [4, 2]


@needs_onednn
@pytest.mark.parametrize(("k", "dil", "residual", "transposed"), [
    (3, 1, True, False), (3, 2, False, False), (5, 1, True, False), (2, 1, False, False),
    (4, 1, False, True)])
def test_small_tiles_match_the_interpreter(monkeypatch, k, dil, residual, transposed) -> None:
    # F(2x2, r x r) for every kernel size (the transposed case: its 2x2 phases), forced as the
    # only tile tried
    monkeypatch.setattr(winograd, "tile_sizes", lambda *a: [winograd.SMALL_TILE])
    _per_phase_only(monkeypatch)
    g = torch.Generator().manual_seed(k * 10 + dil)
    c, f = 20, 17
    x = torch.randn(2, c, 9, 11, generator=g)
    b = torch.randn(f, generator=g)
    if transposed:
        w = torch.randn(c, f, k, k, generator=g)
        conv = winograd.winograd_conv_transpose2d(w, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                                  (1, 1), b, activation="relu")
        want = torch.from_numpy(_interpreted_transposed(x, w, 2, 1, 0))
    else:
        w = torch.randn(f, c, k, k, generator=g)
        pad = dil * (k - 1) // 2
        conv = winograd.winograd_conv2d(w, tuple(x.shape), (1, 1), (pad, pad), (dil, dil), b,
                                        activation="relu", residual=residual)
        want = torch.from_numpy(_interpreted(x, w, pad, dil))
    _check_relu_conv(conv, x, want, b, residual, g)


@needs_onednn
@pytest.mark.parametrize(("transposed", "residual", "per_block"), [
    (True, True, 3), (True, False, 1), (False, True, 3)])
def test_tiles_in_blocks_match_the_interpreter(monkeypatch, transposed, residual,
                                               per_block) -> None:
    # past WHOLE_BYTES the tiles go in blocks (here of 1 or 3 tiles, the last block shorter),
    # each block's transforms and products, for all parts at once, in turn
    g = torch.Generator().manual_seed(7 + per_block)
    c, f = 12, 5
    x = torch.randn(2, c, 7, 6, generator=g)
    b = torch.randn(f, generator=g)
    if transposed:   # four parts (output phases), F(4x4, 2x2): 25 products each
        w = torch.randn(c, f, 4, 4, generator=g)
        groups, kp = 4 * 25, f
    else:            # one part, F(4x4, 3x3): 36 products
        w = torch.randn(f, c, 3, 3, generator=g)
        groups, kp = 36, f
    per_tile = 4 * groups * (winograd.channel_block(c) + kp)
    monkeypatch.setattr(winograd, "WHOLE_BYTES", 0)
    monkeypatch.setattr(winograd, "BLOCK_BYTES", per_block * per_tile)
    _per_phase_only(monkeypatch)
    monkeypatch.setattr(winograd, "tile_sizes",
                        lambda parts, *a: [winograd.TILE[parts[0][0].shape[-1]]])
    counts: list[int] = []   # tiles per input-transform call: one call per block
    real = winograd.input_module

    class Counted:
        def __init__(self, mod) -> None:
            self.mod = mod

        def transform_input(self, *args):
            counts.append(args[3])
            return self.mod.transform_input(*args)

    monkeypatch.setattr(winograd, "input_module", lambda *a: Counted(real(*a)))
    if transposed:
        conv = winograd.winograd_conv_transpose2d(w, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                                  (1, 1), b, activation="relu",
                                                  residual=residual)
        want = torch.from_numpy(_interpreted_transposed(x, w, 2, 1, 0))
    else:
        conv = winograd.winograd_conv2d(w, tuple(x.shape), (1, 1), (1, 1), (1, 1), b,
                                        activation="relu", residual=residual)
        want = torch.from_numpy(_interpreted(x, w, 1, 1))
    counts.clear()
    _check_relu_conv(conv, x, want, b, residual, g)
    # 7x6 outputs (per phase) in 4x4 tiles: 2 x 2 per image, 8 in all
    assert counts == [per_block] * (8 // per_block) + ([8 % per_block] if 8 % per_block else [])


def _per_phase_only(monkeypatch) -> None:
    """Transposed convolutions by their per-phase form only: the overlap-add form
    (:mod:`ollie.kernels.winograd_overlap`, tested in ``test_winograd_overlap.py``) not
    offered."""
    monkeypatch.setattr(winograd.winograd_overlap, "build", lambda *a, **k: None)


def _check_relu_conv(conv, x: torch.Tensor, want: torch.Tensor, b: torch.Tensor,
                     residual: bool, g: torch.Generator) -> None:
    """``conv`` (``f(conv(x) + b [+ r])`` with ReLU) agrees with ``want``, the interpreted
    convolution without bias, on ``x`` and a random residual ``r``."""
    assert conv is not None
    r = torch.randn(want.shape, generator=g)
    want = torch.relu(want + b.reshape(1, -1, 1, 1) + (r if residual else 0))
    with torch.inference_mode():
        got = conv(x, r) if residual else conv(x)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


@needs_onednn
def test_transforms_compiled_ahead_in_workers_load_without_compiling(tmp_path, monkeypatch,
                                                                     ollie_settings):
    """``winograd_codegen.precompile`` compiles a convolution's transform modules in worker
    processes, for an NCHW input read in place and a channels-last one; this process then
    loads numba's code for both instead of compiling it, and the convolution built on them
    agrees with ``F.conv2d``."""
    from ollie.kernels import winograd_codegen as wc

    ollie_settings(cache_dir=tmp_path, kernel_dir=None, precompile=True)  # an empty one
    monkeypatch.setattr(wc, "_MODULES", {})
    ollie_settings(choices={})
    specs = [("in", 4, 3, 12), ("out", 4, 3, 12)]
    assert wc.precompile(specs) == 2
    monkeypatch.setattr(winograd, "tile_sizes", lambda *a: [4])
    w, b = torch.randn(12, 12, 3, 3), torch.randn(12)
    x = torch.randn(2, 12, 9, 7)
    conv = winograd.winograd_conv2d(w, tuple(x.shape), (1, 1), (1, 1), (1, 1), b,
                                    activation="relu")
    assert conv is not None
    want = torch.relu(F.conv2d(x, w, b, 1, 1))
    for layout in (torch.contiguous_format, torch.channels_last):
        torch.testing.assert_close(conv(x.contiguous(memory_format=layout)), want, rtol=1e-4,
                                   atol=1e-4)
    for mod, name, variants in ((wc.input_module(4, 3, 12), "transform_input", 2),
                                (wc.output_module(4, 3, 12), "transform_output", 1)):
        stats = getattr(mod, name).stats
        assert sum(stats.cache_hits.values()) == variants
        assert not sum(stats.cache_misses.values())
    assert wc.precompile(specs) == 0  # loaded here: nothing to compile


@needs_onednn
@pytest.mark.parametrize(("engine", "transposed", "residual", "blocks"), [
    ("blocked", True, False, False), ("blocked", False, True, False),
    ("blocked", True, True, True), ("oneDNN", True, False, False)])
def test_products_by_either_engine_match_the_interpreter(monkeypatch, engine, transposed,
                                                         residual, blocks) -> None:
    # the products run by the register-blocked kernel or by oneDNN, the other one made
    # unavailable (32 output channels: whole panels of 16); with tiles in blocks, the last
    # block shorter
    if engine == "blocked":
        monkeypatch.setattr(winograd.onednn, "packed_conv2d", lambda *a, **k: None)
    else:
        monkeypatch.setattr(winograd.blocked_gemm, "applies", lambda k: False)
    used: list[str] = []
    real = winograd.blocked_gemm.blocked_products
    monkeypatch.setattr(winograd.blocked_gemm, "blocked_products",
                        lambda u: used.append("blocked") or real(u))
    monkeypatch.setattr(winograd, "tile_sizes",
                        lambda parts, *a: [winograd.TILE[parts[0][0].shape[-1]]])
    _per_phase_only(monkeypatch)
    g = torch.Generator().manual_seed(11 + int(transposed) + 2 * int(residual))
    c, f = 20, 32
    x = torch.randn(3, c, 7, 6, generator=g)
    b = torch.randn(f, generator=g)
    if blocks:
        monkeypatch.setattr(winograd, "WHOLE_BYTES", 0)
        monkeypatch.setattr(winograd, "BLOCK_BYTES",
                            5 * 4 * 100 * (winograd.channel_block(c) + f))
    if transposed:
        w = torch.randn(c, f, 4, 4, generator=g)
        conv = winograd.winograd_conv_transpose2d(w, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                                  (1, 1), b, activation="relu",
                                                  residual=residual)
        want = torch.from_numpy(_interpreted_transposed(x, w, 2, 1, 0))
    else:
        w = torch.randn(f, c, 3, 3, generator=g)
        conv = winograd.winograd_conv2d(w, tuple(x.shape), (1, 1), (1, 1), (1, 1), b,
                                        activation="relu", residual=residual)
        want = torch.from_numpy(_interpreted(x, w, 1, 1))
    # one products function per block size: the whole, or a block and the last block
    assert used == ["blocked"] * ((2 if blocks else 1) if engine == "blocked" else 0)
    _check_relu_conv(conv, x, want, b, residual, g)
