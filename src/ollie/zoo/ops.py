"""Longformer's banded products as real PyTorch operators: ``torch.ops.ollie.g2bmm`` and
``torch.ops.ollie.gbmm`` (``torch.library`` custom ops with fake implementations, so that
``torch.export`` / FX trace each as ONE node and the ONNX export writes one ``ollie.G2BMM`` /
``ollie.GBMM`` node).

Semantics (MODELS.md), reads outside ``[0, M)`` are zero::

    G2BMM: S[b, i, j] = Sum_k Q[b, i, k] * K[b, i + d*(j - w), k],   j in [0, 2w+1)
    GBMM:  O[b, i, n] = Sum_j S[b, i, j] * V[b, i + d*(j - w), n]

The CPU implementation is self-contained (it is the oracle of whole-model checks, so it does
not reuse the optimizer's kernels): the dilation is removed by regrouping rows by ``i % d``
(row ``i = p*d + r`` only meets rows of the same residue ``r``), then each block of rows is one
dense ``bmm`` against the window of rows it can reach, and the band is read out of (or written
into) the dense block with a strided view. ``g2bmm_reference`` / ``gbmm_reference`` are the
plain loops over ``j`` used to test it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ollie.errors import ShapeError

__all__ = ["g2bmm", "g2bmm_reference", "gbmm", "gbmm_reference"]


# --------------------------------------------------------------------- checks
def _check(op: str, a: torch.Tensor, b: torch.Tensor, width: int, dilation: int,
           band_first: bool) -> None:
    if a.dim() != 3 or b.dim() != 3:
        raise ShapeError(f"{op}: inputs must have rank 3, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    if width < 0 or dilation < 1:
        raise ShapeError(f"{op}: width must be >= 0 and dilation >= 1, got width={width}, "
                         f"dilation={dilation}")
    if band_first:  # GBMM: S [B, M, 2w+1], V [B, M, N]
        if a.shape[:2] != b.shape[:2] or a.shape[2] != 2 * width + 1:
            raise ShapeError(f"{op}: expected S [B, M, {2 * width + 1}] and V [B, M, N], got "
                             f"{list(a.shape)} and {list(b.shape)}")
    elif a.shape != b.shape:
        raise ShapeError(f"{op}: Q and K must have the same shape, got {list(a.shape)} and "
                         f"{list(b.shape)}")


# --------------------------------------------------------------------- dilation regrouping
def _regroup(x: torch.Tensor, d: int) -> torch.Tensor:
    """[B, M, C] -> [B*d, P, C] with P = ceil(M/d): row ``i = p*d + r`` goes to batch
    ``b*d + r``, position ``p`` (missing rows are zero)."""
    if d == 1:
        return x
    bsz, m, c = x.shape
    p = -(-m // d)
    if p * d != m:
        x = F.pad(x, (0, 0, 0, p * d - m))
    return x.reshape(bsz, p, d, c).transpose(1, 2).reshape(bsz * d, p, c)


def _ungroup(y: torch.Tensor, bsz: int, m: int, d: int) -> torch.Tensor:
    if d == 1:
        return y
    _, p, c = y.shape
    return y.reshape(bsz, d, p, c).transpose(1, 2).reshape(bsz, p * d, c)[:, :m].contiguous()


def _block(p: int, w: int) -> int:
    """Rows per dense block: the dense product is ``blk x (blk + 2w)`` for ``2w+1`` useful
    columns, so blocks near the band width waste little."""
    return max(1, min(p, max(32, min(256, 2 * w + 1))))


def _band_view(dense: torch.Tensor, w: int) -> torch.Tensor:
    """The ``[B, c, 2w+1]`` band ``dense[b, r, r + j]`` of a contiguous ``[B, c, c + 2w]``."""
    bsz, c, cols = dense.shape
    return dense.as_strided((bsz, c, 2 * w + 1), (c * cols, cols + 1, 1),
                            dense.storage_offset())


def _g2bmm_plain(q: torch.Tensor, k: torch.Tensor, w: int) -> torch.Tensor:
    bsz, p, _ = q.shape
    kp = F.pad(k, (0, 0, w, w))  # kp[:, t] = k[:, t - w]
    out = q.new_empty(bsz, p, 2 * w + 1)
    blk = _block(p, w)
    for i0 in range(0, p, blk):
        c = min(blk, p - i0)
        dense = torch.bmm(q[:, i0:i0 + c], kp[:, i0:i0 + c + 2 * w].transpose(1, 2))
        out[:, i0:i0 + c] = _band_view(dense.contiguous(), w)
    return out


def _gbmm_plain(s: torch.Tensor, v: torch.Tensor, w: int) -> torch.Tensor:
    bsz, p, _ = s.shape
    vp = F.pad(v, (0, 0, w, w))
    out = v.new_empty(bsz, p, v.shape[2])
    blk = _block(p, w)
    for i0 in range(0, p, blk):
        c = min(blk, p - i0)
        dense = s.new_zeros(bsz, c, c + 2 * w)
        _band_view(dense, w).copy_(s[:, i0:i0 + c])
        out[:, i0:i0 + c] = torch.bmm(dense, vp[:, i0:i0 + c + 2 * w])
    return out


# --------------------------------------------------------------------- custom ops
def _g2bmm_impl(q: torch.Tensor, k: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    _check("G2BMM", q, k, width, dilation, band_first=False)
    bsz, m, _ = q.shape
    s = _g2bmm_plain(_regroup(q, dilation), _regroup(k, dilation), width)
    return _ungroup(s, bsz, m, dilation)


def _gbmm_impl(s: torch.Tensor, v: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    _check("GBMM", s, v, width, dilation, band_first=True)
    bsz, m, _ = v.shape
    o = _gbmm_plain(_regroup(s, dilation), _regroup(v, dilation), width)
    return _ungroup(o, bsz, m, dilation)


def _define() -> None:
    """Register ``ollie::g2bmm`` / ``ollie::gbmm`` unless something already did."""
    ns = torch.ops.ollie
    try:
        ns.g2bmm  # noqa: B018 - probe
    except (AttributeError, RuntimeError):
        op = torch.library.custom_op("ollie::g2bmm", mutates_args=())(_g2bmm_op)
        op.register_fake(_g2bmm_fake)
    try:
        ns.gbmm  # noqa: B018 - probe
    except (AttributeError, RuntimeError):
        op = torch.library.custom_op("ollie::gbmm", mutates_args=())(_gbmm_op)
        op.register_fake(_gbmm_fake)


def _g2bmm_op(q: torch.Tensor, k: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    return _g2bmm_impl(q, k, width, dilation)


def _g2bmm_fake(q: torch.Tensor, k: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], 2 * width + 1)


def _gbmm_op(s: torch.Tensor, v: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    return _gbmm_impl(s, v, width, dilation)


def _gbmm_fake(s: torch.Tensor, v: torch.Tensor, width: int, dilation: int) -> torch.Tensor:
    return v.new_empty(v.shape[0], v.shape[1], v.shape[2])


_define()


def g2bmm(q: torch.Tensor, k: torch.Tensor, width: int, dilation: int = 1) -> torch.Tensor:
    """``torch.ops.ollie.g2bmm``: Q, K [B, M, K] -> S [B, M, 2*width+1]."""
    return torch.ops.ollie.g2bmm(q, k, int(width), int(dilation))


def gbmm(s: torch.Tensor, v: torch.Tensor, width: int, dilation: int = 1) -> torch.Tensor:
    """``torch.ops.ollie.gbmm``: S [B, M, 2*width+1], V [B, M, N] -> O [B, M, N]."""
    return torch.ops.ollie.gbmm(s, v, int(width), int(dilation))


# --------------------------------------------------------------------- plain references
def _shifted(x: torch.Tensor, offset: int) -> torch.Tensor:
    """``x[:, i + offset]`` for every row ``i`` (zero outside)."""
    m = x.shape[1]
    out = torch.zeros_like(x)
    lo, hi = max(0, -offset), min(m, m - offset)
    if lo < hi:
        out[:, lo:hi] = x[:, lo + offset:hi + offset]
    return out


def g2bmm_reference(q: torch.Tensor, k: torch.Tensor, width: int,
                    dilation: int = 1) -> torch.Tensor:
    """G2BMM as a loop over the band slots ``j`` (slow, obviously correct)."""
    _check("G2BMM", q, k, width, dilation, band_first=False)
    cols = [(q * _shifted(k, dilation * (j - width))).sum(-1) for j in range(2 * width + 1)]
    return torch.stack(cols, dim=-1)


def gbmm_reference(s: torch.Tensor, v: torch.Tensor, width: int,
                   dilation: int = 1) -> torch.Tensor:
    """GBMM as a loop over the band slots ``j`` (slow, obviously correct)."""
    _check("GBMM", s, v, width, dilation, band_first=True)
    out = torch.zeros_like(v)
    for j in range(2 * width + 1):
        out += s[:, :, j:j + 1] * _shifted(v, dilation * (j - width))
    return out
