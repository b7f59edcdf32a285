"""Transposed convolutions by overlap-add Winograd: the output phases share one input
transform.

A stride-``s`` transposed convolution whose ``s*s`` output phases are each an ``r x r``
stride-1 convolution of the same input (:func:`ollie.kernels.winograd.phase_parts`; 4x4
stride-2 kernels: 2x2 per phase) is computed per phase by ``F(m x m, r x r)`` in
:mod:`ollie.kernels.winograd`, each phase transforming its own overlapping ``n x n`` input
patches (``n = m + r - 1``): the transformed input is ``s*s * n*n / (m*m)`` times the input
(6.25x for ``F(4x4, 2x2)``), and writing it is memory-bound. Here the linear-convolution
form (:mod:`ollie.kernels.winograd_overlap_codegen`) transforms each non-overlapping ``m x m``
input tile once for all phases (``n*n / (m*m)`` times the input, 1.56x), the products of all
phases are one product per transformed position with the phases' output channels side by side
(``[tiles, C] @ [C, s*s*K]``, the same multiplications), and the output transform adds the
``r - 1`` rows and columns where neighbouring tiles' outputs overlap.

:func:`build` returns the convolution (``x -> f(conv_transpose2d(x) [+ r])``, channels-last
output like :mod:`ollie.kernels.winograd`'s), or ``None`` where it does not apply;
:func:`ollie.kernels.winograd.winograd_conv_transpose2d` offers it beside the per-phase form
and keeps the faster (measured, cold caches). Why (measured):
docs/design/005-winograd-transposed-convolutions.md.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ollie.kernels import blocked_gemm
from ollie.kernels.winograd_codegen import block as channel_block
from ollie.kernels.winograd_codegen import overlap_modules
from ollie.kernels.winograd_common import (
    CHANNELS_LAST_PLANE,
    as_conv,
    input_array,
    residual_array,
    thread_workspace,
)
from ollie.libs import onednn

log = logging.getLogger(__name__)

Part = tuple[torch.Tensor, tuple[int, int], int]

MAX_BYTES = 48 << 20
"""Transformed input plus products above this: not built (one pass over all tiles; the
per-phase form's tiles in blocks serve such sizes)."""


def tiles(size: int, m: int) -> int:
    """Input tiles along a dimension of ``size``: ``ceil(size / m)``."""
    return -(-size // m)


def output_tiles(out: int, m: int, offset: int) -> int:
    """Output tiles along a dimension of a phase with ``out`` outputs whose tile ``i`` starts
    at ``m * i + offset`` (``<= 0``): enough to cover every output."""
    return -(-(out - offset) // m)


def weights(parts: list[Part], m: int, cb: int) -> torch.Tensor:
    """``U`` ``[n*n, P*K, cb]``: per transformed position, ``G w' G^T`` of every phase's
    kernel flipped (``w'``: the linear form convolves; the same ``G`` as the correlation's,
    :func:`ollie.kernels.winograd.transformed_weights`), phases' output channels side by side, input
    channels past ``C`` zero."""
    from ollie.kernels.winograd import transformed_weights  # (winograd imports this module)

    per_phase = [torch.stack(transformed_weights(w.flip(-1, -2), m))
                 for w, _, _ in parts]                                            # [nn, K, C]
    u = torch.cat(per_phase, dim=1)                                               # [nn, P*K, C]
    out = torch.zeros(u.shape[0], u.shape[1], cb)
    out[:, :, :u.shape[2]] = u
    return out


def build(parts: list[Part], b: torch.Tensor | None, input_shape: tuple[int, ...],
          out_size: tuple[int, int], s: int, activation: str | None, residual: bool,
          m: int) -> onednn.Conv | None:
    """The overlap-add ``F(m x m, r x r)`` convolution over inputs of ``input_shape`` of the
    phases ``parts`` (each ``(w [K, C, r, r], (top, left) padding, phase)``, one per output
    phase, :func:`ollie.kernels.winograd.phase_parts`), ``out_size`` outputs per phase;
    ``b``: the bias; ``None`` where it does not apply (also where the overlaps, ``r - 1``
    rows and columns, would reach past the next tile: ``r - 1 > m``)."""
    r = parts[0][0].shape[-1]
    k, c = parts[0][0].shape[0], parts[0][0].shape[1]
    if r - 1 > m or len(parts) != s * s \
            or sorted(ph for _, _, ph in parts) != list(range(s * s)) \
            or any(tuple(w.shape) != (k, c, r, r) for w, _, _ in parts) \
            or any(pad[i] > r - 1 for _, pad, _ in parts for i in (0, 1)):
        return None
    nb, h, w = input_shape[0], input_shape[2], input_shape[3]
    ho, wo = out_size
    n = m + r - 1
    nn, th, tw = n * n, tiles(h, m), tiles(w, m)
    count = nb * th * tw
    cb = channel_block(c)
    kk = len(parts) * k
    if 4 * count * nn * (cb + kk) > MAX_BYTES:
        return None
    offs = np.array([[pad[0] - (r - 1), pad[1] - (r - 1)] for _, pad, _ in parts], np.int64)
    tys = np.array([output_tiles(ho, m, off) for off in offs[:, 0]], np.int64)
    txs = np.array([output_tiles(wo, m, off) for off in offs[:, 1]], np.int64)
    try:
        imod, omod = overlap_modules(m, r, c, k)
    except Exception as exc:  # numba's compile errors have many types
        log.warning("overlap-add Winograd F(%d, %d) transforms did not compile: %s", m, r, exc)
        return None
    products = blocked_gemm.grouped_products(weights(parts, m, cb), count)
    if products is None:
        return None
    phs = np.array([ph for _, _, ph in parts], np.int64)
    bias = (torch.zeros(k) if b is None else b.detach().float()).contiguous().numpy()
    relu = activation == "relu"
    post = onednn.POST_OPS[None if relu else activation]
    mode = int(relu) + 2 * int(residual)
    chunk = max(1, count // 16)
    big_planes = c > 1 and h * w >= CHANNELS_LAST_PLANE
    # V (channels c.. stay zero) and the products
    workspace = thread_workspace(lambda: (torch.zeros(count, nn, cb),
                                          torch.empty(count, nn, kk)))

    def run(x: torch.Tensor, res: torch.Tensor | None) -> torch.Tensor:
        v, mw = workspace()
        imod.transform_input(input_array(x, big_planes), v.reshape(count, nn * cb).numpy(),
                             th, tw, chunk)
        ms = products(v, mw)
        y = torch.empty(nb, s * ho, s * wo, k)
        omod.transform_output(ms.reshape(count, nn, len(parts), k).numpy(), y.numpy(), bias,
                              residual_array(res), mode, s, offs, phs, ho, wo, th, tw, tys,
                              txs)
        return post(y.permute(0, 3, 1, 2))

    return as_conv(run, residual)


__all__ = ["MAX_BYTES", "build", "output_tiles", "tiles", "weights"]
