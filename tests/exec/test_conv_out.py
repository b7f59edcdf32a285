"""Convolutions write into reused buffers: oneDNN's packed convolution into a given buffer
(zeroed, then the convolution added in) or into its residual input, checked against
``F.conv2d``; programs plan it (a residual at its last use, large outputs into cached
buffers) and keep matching the module call after call."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ollie.exec import executor
from ollie.libs import onednn

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="no oneDNN in this torch")


@needs_onednn
@pytest.mark.parametrize("channels_last", [False, True])
def test_packed_conv_writes_into_buffer_and_residual(channels_last: bool) -> None:
    torch.manual_seed(0)
    shape = (2, 8, 11, 9)
    w, b = torch.randn(12, 8, 3, 3) * 0.2, torch.randn(12)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape).contiguous(memory_format=fmt)
    with torch.inference_mode():
        plain = onednn.packed_conv2d(w, shape, (1, 1), (1, 1), (1, 1), b, activation="relu")
        res = onednn.packed_conv2d(w, shape, (1, 1), (1, 1), (1, 1), b, activation="relu",
                                   residual=True)
        assert plain is not None and res is not None
        assert onednn.writes_into(plain) and onednn.writes_into(res)
        want = F.relu(F.conv2d(x, w, b, padding=1))
        fresh = plain(x)
        like = (fresh.shape, onednn.is_channels_last(fresh))
        buf = onednn.buffer_for(torch.full(want.shape, float("nan")), like)
        assert buf is not None
        got = plain(x, out=buf)
        assert got.data_ptr() == buf.data_ptr()
        assert onednn.is_channels_last(got) == like[1]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

        r = torch.randn(want.shape).contiguous(
            memory_format=torch.channels_last if like[1] else torch.contiguous_format)
        want_r = F.relu(F.conv2d(x, w, b, padding=1) + r)
        into_r = onednn.buffer_for(r, like, r)
        assert into_r is r
        got_r = res(x, r, out=r)
        assert got_r.data_ptr() == r.data_ptr()
        torch.testing.assert_close(got_r, want_r, rtol=1e-4, atol=1e-4)


def test_buffer_for_refuses_what_would_change_the_layout() -> None:
    like = (torch.Size([1, 4, 5, 6]), True)
    assert onednn.buffer_for(torch.empty(1, 4, 5, 7), like) is None   # another shape
    nchw = torch.empty(1, 4, 5, 6)
    assert onednn.buffer_for(nchw, like, nchw) is None   # a residual in the other layout
    view = onednn.buffer_for(nchw, like)
    assert view is not None and onednn.is_channels_last(view)
    assert view.data_ptr() == nchw.data_ptr()
    assert onednn.buffer_for(nchw, (nchw.shape, False)) is nchw


class _Block(nn.Module):
    """conv -> relu -> conv + skip -> relu (a ResNet basic block, no downsampling)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.stem = nn.Conv2d(3, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.stem(x))
        return torch.relu(self.b(torch.relu(self.a(s))) + s)


@needs_onednn
def test_program_writes_convolutions_into_residuals_and_buffers(monkeypatch) -> None:
    import ollie

    monkeypatch.setattr(executor, "CONV_OUT_MIN_BYTES", 0)   # every output into a buffer
    torch.manual_seed(2)
    m = _Block(8).eval()
    x = torch.randn(2, 3, 12, 10)
    prog = ollie.optimize(m, (x,), "cpu", derivation=False,
                          use_cache=False, choose_libraries=False)
    kernels = [replace(k, params={**k.params, "library": "oneDNN packed"})
               for k in prog.program.kernels]
    program = replace(prog.program, kernels=kernels)
    compiled = executor.CompiledProgram(program, "cpu")
    into = [(k, r) for k, r in zip(kernels, compiled.into, strict=True) if r is not None]
    assert len(into) == 1 and into[0][0].params.get("residual")
    assert all(c for k, c, r in zip(kernels, compiled.cached, compiled.into, strict=True)
               if executor.conv_takes_out(k) and r is None)
    written = []   # targets of oneDNN's in-place convolution
    inplace = onednn._add_into
    monkeypatch.setattr(onednn, "_add_into", lambda out, *a: written.append(out.data_ptr())
                        or inplace(out, *a))
    with torch.inference_mode():
        want = m(x)
        for _ in range(4):
            torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)
        for _ in range(2):
            x2 = torch.randn(2, 3, 12, 10)
            torch.testing.assert_close(compiled(x2), m(x2), rtol=1e-4, atol=1e-4)
    assert len(written) >= 3 * 5, "the convolutions did not write into buffers"
    assert compiled.buffers is not None and compiled.buffers.reused > 0
    # profiling times the in-place convolution on a copy of its residual: nothing the
    # program reads is changed, and every kernel gets a time
    times = compiled.profile({"x": x}, repeats=1)
    assert len(times) == len(kernels) and all(t > 0 for t in times)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)
