"""The fast G2BMM / GBMM kernels (ollie.kernels.band) against a straightforward reference
(a loop over the band offsets j with zero padding, float64): random shapes, widths and
dilations (M < 2w+1, M < tile, M % d != 0), both code paths with small tiles and budgets,
strided operands and ``out`` tensors, and the library path (matched kernels run by
``run_kernels``) against ``ollie.interpret``.

(Named test_band_kernels.py: tests/match/test_band.py owns the module name ``test_band``.)
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ollie
from ollie.exec.reference import run_kernels
from ollie.kernels import band
from ollie.match import MatchResult, match_g2bmm, match_gbmm

F64 = torch.float64


def ref_g2bmm(q: torch.Tensor, k: torch.Tensor, w: int, d: int) -> torch.Tensor:
    bsz, m, _ = q.shape
    out = q.new_zeros((bsz, m, 2 * w + 1))
    for j in range(2 * w + 1):
        off = d * (j - w)
        lo, hi = max(0, -off), min(m, m - off)
        if lo < hi:
            out[:, lo:hi, j] = (q[:, lo:hi] * k[:, lo + off:hi + off]).sum(-1)
    return out


def ref_gbmm(s: torch.Tensor, v: torch.Tensor, w: int, d: int) -> torch.Tensor:
    bsz, m, _ = s.shape
    out = v.new_zeros((bsz, m, v.shape[2]))
    for j in range(2 * w + 1):
        off = d * (j - w)
        lo, hi = max(0, -off), min(m, m - off)
        if lo < hi:
            out[:, lo:hi] += s[:, lo:hi, j, None] * v[:, lo + off:hi + off]
    return out


# (wide tile, wide from 2w+1 >=, narrow tile, narrow budget, wide budget in bytes): the
# defaults, then small ones that send these small shapes through the wide path (one or
# several batches per step) / many narrow blocks / tiny chunks
CONFIGS = [
    None,
    (2, 1, 64, 1 << 25, 1 << 27),
    (3, 1, 2, 256, 1),
    (5, 3, 3, 1, 300),
    (4, 1000, 1, 1 << 20, 1 << 20),
    (1, 1, 5, 100, 1),
    (8, 5, 4, 1000, 2000),
]


@contextmanager
def tiles(config: tuple[int, ...] | None):
    if config is None:
        yield
        return
    names = ("_TILE", "_WIDE_MIN_J", "_NARROW_TILE", "_BUDGET", "_WIDE_BUDGET")
    with mock.patch.multiple(band, **dict(zip(names, config, strict=True))):
        yield


def rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64)


shapes = st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 8),
                   st.integers(0, 6), st.integers(1, 4))


@given(shapes, st.sampled_from(range(len(CONFIGS))), st.integers(0, 3))
def test_g2bmm_matches_reference(shape, config, seed):
    b, m, k, w, d = shape
    q, kk = rand(b, m, k, seed=seed), rand(b, m, k, seed=seed + 10)
    with tiles(CONFIGS[config]):
        got = band.g2bmm(q, kk, w, d)
    torch.testing.assert_close(got, ref_g2bmm(q, kk, w, d), rtol=1e-10, atol=1e-10)


@given(shapes, st.sampled_from(range(len(CONFIGS))), st.integers(0, 3))
def test_gbmm_matches_reference(shape, config, seed):
    b, m, n, w, d = shape
    s, v = rand(b, m, 2 * w + 1, seed=seed), rand(b, m, n, seed=seed + 10)
    with tiles(CONFIGS[config]):
        got = band.gbmm(s, v, w, d)
    torch.testing.assert_close(got, ref_gbmm(s, v, w, d), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1], CONFIGS[3], CONFIGS[6]])
@pytest.mark.parametrize(("m", "w", "d"), [(130, 20, 1), (131, 20, 3), (37, 30, 2),
                                           (5, 9, 1), (64, 3, 4)])
def test_strided_operands_and_out(config, m, w, d):
    """Non-contiguous q / k / s / v, and ``out`` as a strided slice or with a non-unit
    column stride; ``out`` is returned and the bytes around it stay untouched."""
    b, k, j = 2, 3, 2 * w + 1
    q = rand(b, k, m, seed=1).transpose(1, 2)
    kk = rand(b, m, 2 * k, seed=2)[:, :, ::2]
    s = rand(b, j + 3, m, seed=3).transpose(1, 2)[:, :, 1:j + 1]
    v = rand(m, b, k, seed=4).transpose(0, 1)
    with tiles(config):
        big = torch.full((b, m, j + 5), 7.0, dtype=F64)
        got = band.g2bmm(q, kk, w, d, out=big[:, :, 2:j + 2])
        assert got.data_ptr() == big[:, :, 2:].data_ptr()
        torch.testing.assert_close(got, ref_g2bmm(q, kk, w, d))
        assert (big[:, :, :2] == 7).all() and (big[:, :, j + 2:] == 7).all()
        col = torch.zeros((b, j, m), dtype=F64).transpose(1, 2)       # column stride m
        torch.testing.assert_close(band.g2bmm(q, kk, w, d, out=col), ref_g2bmm(q, kk, w, d))
        outg = torch.full((b, m, k + 1), 7.0, dtype=F64)
        torch.testing.assert_close(band.gbmm(s, v, w, d, out=outg[:, :, 1:]),
                                   ref_gbmm(s, v, w, d))
        assert (outg[:, :, 0] == 7).all()


def test_float32_longer_band_and_wide_path():
    """Default tiles: the wide path (2w+1 >= 512) with clipped windows, d = 1 and 3."""
    for m, w, d in [(700, 300, 1), (650, 260, 3), (200, 300, 1)]:
        q, k = rand(2, m, 16, seed=m).float(), rand(2, m, 16, seed=w).float()
        s = rand(2, m, 2 * w + 1, seed=d).float()
        torch.testing.assert_close(band.g2bmm(q, k, w, d),
                                   ref_g2bmm(q.double(), k.double(), w, d).float(),
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(band.gbmm(s, k, w, d),
                                   ref_gbmm(s.double(), k.double(), w, d).float(),
                                   rtol=1e-4, atol=1e-4)


def test_bad_arguments():
    q = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError):
        band.g2bmm(q, torch.zeros(2, 6, 3), 1)
    with pytest.raises(ValueError):
        band.g2bmm(q, q, -1)
    with pytest.raises(ValueError):
        band.g2bmm(q, q, 1, 0)
    with pytest.raises(ValueError):
        band.g2bmm(q, q, 1, out=torch.zeros(2, 5, 4))
    with pytest.raises(ValueError):
        band.gbmm(torch.zeros(2, 5, 4), q, 1)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    for m, w, d in [(300, 40, 1), (301, 40, 3), (700, 300, 1), (650, 260, 4)]:
        q, k, s = rand(2, m, 8, seed=1), rand(2, m, 8, seed=2), rand(2, m, 2 * w + 1, seed=3)
        for fn, a, b in ((band.g2bmm, q, k), (band.gbmm, s, k)):
            got = fn(a.cuda(), b.cuda(), w, d).cpu()
            torch.testing.assert_close(got, fn(a, b, w, d))


# ----------------------------------------------------------------------------- library
def run_library(matcher, text: str, seed: int = 0) -> MatchResult:
    e = ollie.parse(text)
    res = matcher(e.root, e.inputs)
    assert isinstance(res, MatchResult), str(res)
    assert any(k.kind in ("G2BMM", "GBMM") for k in res.kernels)
    rng = np.random.default_rng(seed)
    ins = {n: rng.standard_normal(sh).astype(np.float32) for n, sh in e.decls}
    env = run_kernels(res.kernels, {n: torch.from_numpy(a) for n, a in ins.items()})
    np.testing.assert_allclose(env[res.output].numpy(), ollie.interpret(e, ins),
                               rtol=1e-4, atol=1e-4)
    return res


LIBRARY_CASES = [
    (match_g2bmm, "Q: [2, 30, 8]\nK: [2, 30, 8]\n"
     "L<b=0:2, i=0:30, j=0:7> Sum<k=0:8> Q[b, i, k] * K[b, i + 2*j - 6, k]"),
    (match_g2bmm, "Q: [2, 30, 8]\nK: [2, 30, 8]\n"
     "L<b=0:2, i=0:30, j=-3:4> Sum<k=0:8> K[b, i + 4*j, k] * Q[b, i, k] * 0.5"),
    (match_g2bmm, "Q: [2, 3, 20, 4]\nK: [4, 20, 2, 3]\n"
     "L<i=0:20, b=0:2, h=0:3, j=0:3> Sum<k=0:4> Q[b, h, i, k] * K[k, i + 2*j - 2, b, h]"),
    (match_g2bmm, "Q: [1, 700, 4]\nK: [1, 700, 4]\n"
     "L<b=0:1, i=0:700, j=0:601> Sum<k=0:4> Q[b, i, k] * K[b, i + j - 300, k]"),
    (match_gbmm, "S: [2, 30, 7]\nV: [2, 30, 8]\n"
     "L<b=0:2, i=0:30, n=0:8> Sum<j=0:7> S[b, i, j] * V[b, i + 3*j - 9, n]"),
    (match_gbmm, "S: [2, 30, 5]\nV: [2, 8, 30]\n"
     "L<b=0:2, i=0:30, n=0:8> Sum<j=0:5> 2 * S[b, i, j] * V[b, n, i + j - 2]"),
    (match_gbmm, "S: [1, 650, 521]\nV: [1, 650, 4]\n"
     "L<b=0:1, i=0:650, n=0:4> Sum<j=0:521> S[b, i, j] * V[b, i + 3*j - 780, n]"),
]


@pytest.mark.parametrize(("matcher", "text"), LIBRARY_CASES)
def test_library_kernels_match_interpreter(matcher, text):
    run_library(matcher, text)


@given(st.integers(0, 5), st.integers(1, 4), st.integers(1, 25), st.booleans(),
       st.integers(0, 2))
def test_library_random_bands(w, d, m, gbmm, seed):
    j = 2 * w + 1
    if gbmm:
        text = (f"S: [2, {m}, {j}]\nV: [2, {m}, 3]\nL<b=0:2, i=0:{m}, n=0:3> Sum<j=0:{j}> "
                f"S[b, i, j] * V[b, i + {d}*j - {d * w}, n]")
    else:
        text = (f"Q: [2, {m}, 3]\nK: [2, {m}, 3]\nL<b=0:2, i=0:{m}, j=0:{j}> Sum<k=0:3> "
                f"Q[b, i, k] * K[b, i + {d}*j - {d * w}, k]")
    run_library(match_gbmm if gbmm else match_g2bmm, text, seed)
