"""The minimal library runtime, checked against direct formulas (independent of matching)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ollie
from ollie.errors import ShapeError, UnsupportedError
from ollie.exec.reference import run_kernel, run_kernels, window
from ollie.program import Kernel, View


def test_window_pads_crops_and_handles_disjoint_ranges():
    x = torch.arange(1.0, 5.0)
    assert window(x, 0, -2, 8).tolist() == [0, 0, 1, 2, 3, 4, 0, 0]
    assert window(x, 0, 1, 2).tolist() == [2, 3]
    assert window(x, 0, 6, 3).tolist() == [0, 0, 0]
    assert window(x, 0, -5, 2).tolist() == [0, 0]
    assert window(x, 0, 0, 4) is x


def _kernel(kind, params, inputs, text, views=()):
    return Kernel(kind, params, inputs, "Y", ollie.parse(text), views)


def test_matmul_through_views_and_alpha():
    text = "A: [3, 4]\nB: [2, 4]\nL<m=0:3, n=0:2> Sum<k=0:4> A[m, k] * B[n, k]"
    k = _kernel("Matmul", {"b": 1, "m": 3, "n": 2, "k": 4, "trans_a": False, "trans_b": True,
                           "alpha": 2.0}, ("A", "B"), text,
                (View(0, (1, 3, 4), (0, 4, 1)), View(0, (1, 4, 2), (0, 1, 4))))
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    env = run_kernels([k], {"A": a, "B": b})
    torch.testing.assert_close(env["Y"], 2 * a @ b.T)
    assert set(env) == {"A", "B", "Y"}
    with pytest.raises(ShapeError, match="expected"):
        run_kernel(k, {"A": torch.randn(4, 3), "B": b})
    with pytest.raises(ShapeError, match="missing"):
        run_kernel(k, {"A": a})


def test_conv_asymmetric_padding_and_crop():
    text = ("X: [1, 2, 6, 6]\nW: [3, 2, 3, 3]\nL<n=0:1, f=0:3, h=0:4, w=0:3> "
            "Sum<c=0:2, r=0:3, s=0:3> X[n, c, 2*h + r - 2, w + s + 1] * W[f, c, r, s]")
    params = {"n": 1, "c": 2, "h": 6, "w": 6, "f": 3, "r": 3, "s": 3, "ph": 2, "ph_end": 1,
              "pw": -1, "pw_end": 0, "sh": 2, "sw": 1, "dh": 1, "dw": 1, "groups": 1}
    k = _kernel("Conv", params, ("X", "W"), text, (None, None))
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    want = F.conv2d(F.pad(x, (-1, 0, 2, 1)), w, stride=(2, 1))
    torch.testing.assert_close(run_kernel(k, {"X": x, "W": w}), want)


def _band_reference(q, k, w, d):
    b, m, _ = q.shape
    out = np.zeros((b, m, 2 * w + 1), np.float32)
    for i in range(m):
        for j in range(2 * w + 1):
            t = i + d * (j - w)
            if 0 <= t < m:
                out[:, i, j] = (q[:, i] * k[:, t]).sum(-1)
    return out


def test_g2bmm_and_gbmm_follow_models_md():
    rng = np.random.default_rng(0)
    q, kk = rng.standard_normal((2, 9, 4), np.float32), rng.standard_normal((2, 9, 4),
                                                                             np.float32)
    g2 = _kernel("G2BMM", {"b": 2, "m": 9, "w": 2, "k": 4, "d": 2}, ("Q", "K"),
                 "Q: [2, 9, 4]\nK: [2, 9, 4]\nL<b=0:2, i=0:9, j=0:5> Sum<k=0:4> "
                 "Q[b, i, k] * K[b, i + 2*j - 4, k]")
    s = run_kernel(g2, {"Q": torch.from_numpy(q), "K": torch.from_numpy(kk)}).numpy()
    np.testing.assert_allclose(s, _band_reference(q, kk, 2, 2), rtol=1e-5, atol=1e-5)
    gb = _kernel("GBMM", {"b": 2, "m": 9, "w": 2, "n": 4, "d": 2}, ("S", "V"),
                 "S: [2, 9, 5]\nV: [2, 9, 4]\nL<b=0:2, i=0:9, n=0:4> Sum<j=0:5> "
                 "S[b, i, j] * V[b, i + 2*j - 4, n]")
    o = run_kernel(gb, {"S": torch.from_numpy(s), "V": torch.from_numpy(kk)}).numpy()
    want = np.zeros((2, 9, 4), np.float32)
    for i in range(9):
        for j in range(5):
            t = i + 2 * (j - 2)
            if 0 <= t < 9:
                want[:, i] += s[:, i, j, None] * kk[:, t]
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)


def test_unknown_kind():
    with pytest.raises(UnsupportedError, match="Pool"):  # (raised when the kernel is built)
        k = _kernel("Pool", {}, ("A",), "A: [2]\nL<i=0:2> A[i]")
        run_kernel(k, {"A": torch.zeros(2)})
