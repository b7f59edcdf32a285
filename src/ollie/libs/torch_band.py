"""G2BMM and GBMM (Longformer's sliding-window attention products) written the way a PyTorch
user writes them: the window of rows each row reads, as an ``as_strided`` view of the
zero-padded operand, then one batched matrix product of every row with its window.

    G2BMM: S[b, i, j] = Sum_k Q[b, i, k] * K[b, i + d*(j - w), k]     S: [B, M, 2w+1]
    GBMM:  O[b, i, n] = Sum_j S[b, i, j] * V[b, i + d*(j - w), n]     O: [B, M, N]

Rows outside ``[0, M)`` read as zero. This is the vendor-library path of the band products
(:data:`ollie.policy.BAND` switched off): no blocking, no regrouping of dilated rows, and the
window view is materialised by ``torch.matmul`` (``2w+1`` copies of each row of the windowed
operand). Ollie's own kernels: :mod:`ollie.kernels.band`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["g2bmm", "gbmm"]


def _check(a: torch.Tensor, b: torch.Tensor, w: int, d: int) -> None:
    if a.dim() != 3 or b.dim() != 3 or a.shape[:2] != b.shape[:2]:
        raise ValueError(f"band operands must be [B, M, *] with equal B, M; got "
                         f"{list(a.shape)} and {list(b.shape)}")
    if w < 0 or d < 1:
        raise ValueError(f"band needs w >= 0 and d >= 1 (got w={w}, d={d})")


def windows(x: torch.Tensor, w: int, d: int) -> torch.Tensor:
    """``[B, M, 2w+1, C]`` view: ``[b, i, j] = x[b, i + d*(j - w)]`` (zero outside
    ``[0, M)``), over a zero-padded copy of ``x`` (``[B, M, C]``)."""
    bsz, m, c = x.shape
    xp = F.pad(x, (0, 0, w * d, w * d)).contiguous()
    s0, s1, s2 = xp.stride()
    return xp.as_strided((bsz, m, 2 * w + 1, c), (s0, s1, d * s1, s2))


def g2bmm(q: torch.Tensor, k: torch.Tensor, w: int, d: int = 1) -> torch.Tensor:
    """``S[b, i, j] = sum_k q[b, i, k] * k[b, i + d*(j - w), k]`` -> ``[B, M, 2w+1]``
    (``q``, ``k``: ``[B, M, K]``)."""
    _check(q, k, w, d)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k need equal K: {list(q.shape)} vs {list(k.shape)}")
    win = windows(k.to(q.dtype), w, d)                       # [B, M, 2w+1, K]
    return torch.matmul(q.unsqueeze(2), win.transpose(2, 3)).squeeze(2)


def gbmm(s: torch.Tensor, v: torch.Tensor, w: int, d: int = 1) -> torch.Tensor:
    """``O[b, i, n] = sum_j s[b, i, j] * v[b, i + d*(j - w), n]`` -> ``[B, M, N]``
    (``s``: ``[B, M, 2w+1]``, ``v``: ``[B, M, N]``)."""
    _check(s, v, w, d)
    if s.shape[2] != 2 * w + 1:
        raise ValueError(f"S must be [B, M, 2w+1 = {2 * w + 1}], got {list(s.shape)}")
    win = windows(v.to(s.dtype), w, d)                       # [B, M, 2w+1, N]
    return torch.matmul(s.unsqueeze(2), win).squeeze(2)
