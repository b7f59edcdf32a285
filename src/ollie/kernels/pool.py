"""Max pooling of NCHW tensors on the CPU (``MaxPool2d`` is an opaque operator: the expression
language has no max-reduction, so Ollie keeps it and runs it as fast as it can).

PyTorch's CPU ``max_pool2d`` is fast on channels-last tensors but several times slower on
NCHW-contiguous ones, and converting the layout first costs more than it saves (measured:
docs/design/003-library-kernels-on-the-cpu.md). This module pools NCHW planes with a numba
kernel, separably: per output row, the maximum over the window's input rows (contiguous rows:
vectorises) into a one-row buffer, then the maximum along that row's windows (no bounds checks
for the windows inside the row). Planes are spread over the threads with ``prange``.

NaN propagates as in PyTorch (a window holding a NaN gives NaN). Out-of-range positions
(padding) never take part. :func:`max_pool_runner` returns ``None`` for what the kernel does not
cover (and the caller falls back to PyTorch): non-CPU tensors, channels-last inputs (PyTorch is
fast there), windows containing no input element.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
import torch


@numba.njit(parallel=True, cache=True, fastmath=False, nogil=True)
def _pool_planes(x: np.ndarray, out: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                 pt: int, pl: int, dh: int, dw: int) -> None:  # pragma: no cover (numba)
    planes, h, w = x.shape
    ho, wo = out.shape[1], out.shape[2]
    # output columns [o_lo, o_hi) have every tap inside the row: no bounds checks there
    o_lo = min(wo, (pl + sw - 1) // sw)
    o_hi = o_lo
    for o in range(o_lo, wo):
        if o * sw - pl + (kw - 1) * dw < w:
            o_hi = o + 1
    for p in numba.prange(planes):
        tmp = np.empty(w, dtype=np.float32)
        src = x[p]
        dst = out[p]
        for o in range(ho):
            # the maximum over the window's rows (contiguous: vectorises) ...
            s0 = o * sh - pt
            first = True
            for t in range(kh):
                i = s0 + t * dh
                if 0 <= i < h:
                    r = src[i]
                    if first:
                        tmp[:] = r
                        first = False
                    else:
                        for q in range(w):
                            tmp[q] = np.maximum(tmp[q], r[q])  # NaN propagates
            # ... then along that row's windows
            d = dst[o]
            for q in range(o_lo, o_hi):
                s = q * sw - pl
                m = tmp[s]
                for t in range(1, kw):
                    m = np.maximum(m, tmp[s + t * dw])
                d[q] = m
            for q in list(range(0, o_lo)) + list(range(o_hi, wo)):
                s = q * sw - pl
                m = np.float32(-np.inf)
                for t in range(kw):
                    j = s + t * dw
                    if 0 <= j < w:
                        m = np.maximum(m, tmp[j])
                d[q] = m


def _out_size(size: int, k: int, s: int, lo: int, hi: int, d: int, ceil_mode: bool) -> int:
    span = d * (k - 1) + 1
    full = size + lo + hi - span
    n = (-(-full // s) if ceil_mode else full // s) + 1
    if ceil_mode and (n - 1) * s >= size + lo:  # last window must start inside input or pad
        n -= 1
    return n


def max_pool_runner(shape: tuple[int, ...], kernel: tuple[int, int], stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int],
                    ceil_mode: bool) -> Callable[..., torch.Tensor | None] | None:
    """A function ``(x, out=None)`` pooling NCHW-contiguous float32 CPU tensors ``x`` of
    ``shape`` (pads: top, left, bottom, right) into ``out`` (a contiguous tensor of the output's
    shape) or a new tensor; it returns ``None`` for other tensors. ``None`` instead of a function
    when some output window would hold no input element."""
    if len(shape) != 4:
        return None
    n, c, h, w = shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    pt, pl, pb, pr = pads
    ho = _out_size(h, kh, sh, pt, pb, dh, ceil_mode)
    wo = _out_size(w, kw, sw, pl, pr, dw, ceil_mode)
    if ho <= 0 or wo <= 0:
        return None
    # every window must hold an input element (else PyTorch's -inf / error semantics apply)
    for size, k, s, lo, d, no in ((h, kh, sh, pt, dh, ho), (w, kw, sw, pl, dw, wo)):
        for o in range(no):
            if not any(0 <= o * s - lo + t * d < size for t in range(k)):
                return None

    def run(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        if x.device.type != "cpu" or not x.is_contiguous() or x.dtype != torch.float32 or \
                tuple(x.shape) != tuple(shape):
            return None
        if out is None or tuple(out.shape) != (n, c, ho, wo) or not out.is_contiguous():
            out = torch.empty((n, c, ho, wo), dtype=torch.float32)
        _pool_planes(x.view(n * c, h, w).numpy(), out.view(n * c, ho, wo).numpy(),
                     kh, kw, sh, sw, pt, pl, dh, dw)
        return out

    return run
