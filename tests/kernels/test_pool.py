"""The numba NCHW max pooling agrees with PyTorch's max_pool2d (padding, strides, dilation,
ceil mode, NaN), declines what it does not cover, and is what programs use for MaxPool2d."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ollie.kernels.pool import max_pool_runner


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 12), w=st.integers(1, 12),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       dh=st.integers(1, 2), dw=st.integers(1, 2), ceil=st.booleans(), data=st.data())
def test_max_pool_matches_torch(n, c, h, w, kh, kw, sh, sw, dh, dw, ceil, data):
    ph = data.draw(st.integers(0, kh // 2))
    pw = data.draw(st.integers(0, kw // 2))
    if dh * (kh - 1) + 1 > h + 2 * ph or dw * (kw - 1) + 1 > w + 2 * pw:
        return  # torch rejects an output of size < 1
    x = torch.randn(n, c, h, w)
    try:
        want = F.max_pool2d(x, (kh, kw), (sh, sw), (ph, pw), (dh, dw), ceil)
    except RuntimeError:
        return  # a configuration torch rejects
    run = max_pool_runner(tuple(x.shape), (kh, kw), (sh, sw), (ph, pw, ph, pw), (dh, dw), ceil)
    if run is None:  # only when some window would hold no input element
        return
    got = run(x)
    assert got.shape == want.shape
    assert torch.equal(got, want)


def test_max_pool_propagates_nan_and_declines_channels_last():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 2, 3] = float("nan")
    run = max_pool_runner((1, 2, 6, 6), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False)
    assert run is not None
    torch.testing.assert_close(run(x), F.max_pool2d(x, 3, 2, 1), equal_nan=True)
    assert torch.isnan(run(x)).sum() == torch.isnan(F.max_pool2d(x, 3, 2, 1)).sum() > 0
    assert run(x.contiguous(memory_format=torch.channels_last)) is None
    assert max_pool_runner((1, 2, 6), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False) is None


def test_programs_pool_nchw_tensors_with_the_numba_kernel(monkeypatch):
    from torch import nn

    import ollie
    from ollie.kernels import pool

    calls = []
    kernel = pool._pool_planes
    monkeypatch.setattr(pool, "_pool_planes", lambda *a: calls.append(1) or kernel(*a))
    torch.manual_seed(1)
    m = nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.Conv2d(3, 4, 3), nn.ReLU(),
                      nn.MaxPool2d(2)).eval()
    x = torch.randn(2, 3, 11, 10)
    prog = ollie.optimize(m, (x,), "cpu", derivation=False,
                          use_cache=False, settle=0.0)
    calls.clear()
    with torch.inference_mode():
        torch.testing.assert_close(prog(x), m(x), rtol=1e-5, atol=1e-6)
    assert calls, "the NCHW input was not pooled by the numba kernel"
    assert [k.params.get("op") for k in prog.program.kernels] == \
        ["MaxPool2d", "Conv2d", "MaxPool2d"]
