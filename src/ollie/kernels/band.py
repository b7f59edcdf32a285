"""Fast G2BMM and GBMM (Longformer's sliding-window attention products) with PyTorch.

    G2BMM: S[b, i, j] = Sum_k Q[b, i, k] * K[b, i + d*(j - w), k]     S: [B, M, 2w+1]
    GBMM:  O[b, i, n] = Sum_j S[b, i, j] * V[b, i + d*(j - w), n]     O: [B, M, N]

Rows outside ``[0, M)`` read as zero. Only ``torch`` tensor operations are used (strided
views, ``bmm``, ``where``, copies), so the same code runs on CPU and CUDA tensors.

**d == 1, wide band** (``2w+1 >= 512``): rows are cut into blocks of ``T`` rows (``T <= 512``,
about ``(2w+1)/4``, splitting ``M`` evenly); block ``r0`` needs the window of K rows
``[r0 - w, r0 + T + w)``, whose column ``c`` holds ``S[r0 + t, c - t]``. Per block, batched
over a chunk of ``B`` whose workspace is at most 16 MiB (at least one batch entry):

* G2BMM: ``P = Q_blk @ K_win^T`` with the window *clipped* to ``[0, M)`` (columns ``[c0, c1)``;
  no work on the zero padding, up to ~25 % less when ``w`` is comparable to ``M``) by one
  ``bmm`` into a contiguous workspace, then ``S[t, j] = P[t, t + j - c0]`` by one strided copy
  (for clipped blocks a ``where`` with a precomputed mask: the reads outside ``[c0, c1)`` land
  in the workspace's slack or in neighbouring rows and are replaced by 0);
* GBMM: the band of S is copied into a workspace ``A`` (``A[t, t + j] = S[r0 + t, j]``; zeroed
  once per call, only band positions are ever written), then ``O_blk = A[:, c0:c1] @ V[...]``
  (clipped window; a column range of A is a valid batched-GEMM operand) by one ``bmm``; the
  blocks are concatenated into ``O`` once per batch chunk.

So a step costs two large parallel operations, and the Python loop has ``M / T`` steps per
chunk. The work is ``(T + 2w) / (2w + 1)`` of the band's, less the clipped part.

**d == 1, narrow band** (small ``w``): every (batch, block) pair at once, chunked to 16 MiB:
``P = Q_blk [T, K] @ K_win [T + 2w, K]^T`` with ``K_win`` an ``as_strided`` window of the
zero-padded K (``matmul`` materialises it), then ``S[r0 + t, j] = P[t, t + j]`` is one strided
copy; GBMM scatters S into a zero buffer ``[T, T + 2w]`` through that view and multiplies by
the V windows. ``w == 0`` is an element-wise product.

**d > 1**: the re-layout the optimizer derives, done internally (not the blocked algorithm on
dilated windows, which does about ``d`` times the work): rows ``i = d*i' + r`` are regrouped by
residue ``r`` into ``[B*d, M_r, *]`` (one copy of Q and of K, resp. of V), which turns the
dilated band into ``d`` non-dilated ones; the ``[B, M, 2w+1]`` operand (S, out of G2BMM /
into GBMM) and O are read / written through strided ``[B, d, M_r, *]`` views of the caller's
tensors, which fuses the output re-layout into the band extraction. ``M % d != 0`` gives
two residue groups (``ceil(M/d)`` and ``M // d`` rows).

On the CPU the wide path keeps its workspace per thread across calls (a large fresh
allocation is page-faulted in on every call).

Why fewer, larger operations and these chunk sizes (measured): docs/design/017-band-kernels.md.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable

import torch

_TILE = 512            # largest row block of the wide path
_WIDE_MIN_J = 512      # 2w+1 from which the wide path is used
_NARROW_TILE = 64      # row block of the narrow path
_BUDGET = 1 << 24      # bytes of temporaries per narrow step (16 MiB)
_WIDE_BUDGET = 1 << 24  # bytes of the wide path's workspace per chunk (16 MiB)
"""The budgets bound each step's temporaries, so that a step's data stays in the caches:
cache-sized chunks beat fewer, larger steps (measured: docs/design/017-band-kernels.md)."""
_local = threading.local()

__all__ = ["g2bmm", "gbmm"]


def _view(t: torch.Tensor, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
          ) -> torch.Tensor:
    """``as_strided`` relative to ``t``'s own storage offset."""
    return torch.as_strided(t, size, stride, t.storage_offset() + offset)


def _check(a: torch.Tensor, b: torch.Tensor, w: int, d: int, a_last: int | None) -> None:
    if a.dim() != 3 or b.dim() != 3 or a.shape[:2] != b.shape[:2]:
        raise ValueError(f"band operands must be [B, M, *] with equal B, M; got "
                         f"{list(a.shape)} and {list(b.shape)}")
    if w < 0 or d < 1:
        raise ValueError(f"band needs w >= 0 and d >= 1 (got w={w}, d={d})")
    if a_last is not None and a.shape[2] != a_last:
        raise ValueError(f"S must be [B, M, 2w+1 = {a_last}], got {list(a.shape)}")


def _target(out: torch.Tensor | None, like: torch.Tensor, shape: tuple[int, ...]
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(tensor to compute into, caller's ``out`` to copy into afterwards or None)."""
    if out is None:
        return like.new_empty(shape), None
    if tuple(out.shape) != shape:
        raise ValueError(f"out has shape {list(out.shape)}, expected {list(shape)}")
    if out.dtype == like.dtype and out.device == like.device and out.stride(-1) == 1:
        return out, None
    return like.new_empty(shape), out


# ----------------------------------------------------------------------------- d == 1
def _lead_view(x: torch.Tensor, b0: int, n: int, offset: int, tail: tuple[int, int],
               tail_stride: tuple[int, int]) -> torch.Tensor:
    """View ``[n, *lead[1:], *tail]`` of ``x`` ([*lead, M, C]) from batch ``b0``, ``offset``
    elements into each ``[M, C]`` matrix, with ``tail_stride`` over its rows / columns."""
    lead, ls = x.shape[:-2], x.stride()[:-2]
    return _view(x, b0 * ls[0] + offset, (n, *lead[1:], *tail), (*ls, *tail_stride))


def _window(m: int, w: int, r0: int, tr: int) -> tuple[int, int]:
    """Columns ``[c0, c1)`` of the block window (K row ``r0 - w + c``) whose rows are in
    ``[0, m)``; ``c0 <= w`` and ``tr + 2w - c1 <= w`` since the block's rows are valid."""
    return max(0, w - r0), min(tr + 2 * w, m + w - r0)


def _tile(m: int, w: int) -> int:
    """Rows per block of the wide path: at most ``_TILE`` (fewer, larger steps), about
    ``(2w+1) / 4`` (the work is ``(T + 2w) / (2w + 1)`` of the band's), splitting m evenly."""
    tmax = max(1, min(_TILE, max(_TILE // 4, (2 * w + 1) // 4)))
    return -(-m // -(-m // tmax))


def _workspace(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A flat scratch tensor; on the CPU kept per thread across calls (large fresh allocations
    are page-faulted in on every call; CUDA has its caching allocator)."""
    if like.device.type != "cpu":
        return like.new_empty((numel,))
    cache: dict[torch.dtype, torch.Tensor] = _local.__dict__.setdefault("ws", {})
    ws = cache.get(like.dtype)
    if ws is None or ws.numel() < numel:
        cache[like.dtype] = ws = like.new_empty((numel,))
    return ws[:numel]


def _wide_plan(x: torch.Tensor, t: int, w: int, slack: int) -> tuple[int, int, torch.Tensor]:
    """(inner batch size, lead[0] per chunk, flat workspace) for the ``[*lead, M, 2w+1]``
    operand ``x``; the workspace is at most :data:`_WIDE_BUDGET`, or one lead entry's."""
    inner = math.prod(x.shape[1:-2])
    per = inner * t * (t + 2 * w)
    bc = max(1, min(x.shape[0], _WIDE_BUDGET // (per * x.element_size())))
    return inner, bc, _workspace(bc * per + 2 * slack, x)


@functools.lru_cache(maxsize=64)
def _clip_masks(m: int, w: int, t: int, device: torch.device) -> dict[int, torch.Tensor]:
    """For each block (start ``r0``) whose window is clipped: ``[tr, 2w+1]`` mask of the S
    entries whose window column ``t + j`` lies in the computed ``[c0, c1)``. Cached: built once
    per shape, so later calls copy nothing from the host (a CUDA graph cannot capture that)."""
    blocks = [(r0, *_window(m, w, r0, min(t, m - r0))) for r0 in range(0, m, t)]
    blocks = [(r0, c0, c1) for r0, c0, c1 in blocks if c0 or c1 < min(t, m - r0) + 2 * w]
    if not blocks:
        return {}
    tj = torch.arange(t, device=device)[:, None] + torch.arange(2 * w + 1, device=device)
    c0s = torch.tensor([b[1] for b in blocks], device=device)[:, None, None]
    c1s = torch.tensor([b[2] for b in blocks], device=device)[:, None, None]
    masks = (tj >= c0s) & (tj < c1s)
    return {r0: masks[i, :min(t, m - r0)] for i, (r0, _, _) in enumerate(blocks)}


def _g2bmm_wide(q: torch.Tensor, k: torch.Tensor, w: int, out: torch.Tensor) -> None:
    """``q``, ``k``: ``[prod(lead), M, K]``; ``out``: ``[*lead, M, 2w+1]`` (any strides).

    Per block: ``P = Q_blk @ K[c0:c1]^T`` (clipped window) into the workspace, then
    ``S[t, j] = P[t, t + j - c0]`` in one strided ``where``: reads outside ``[c0, c1)`` land in
    the workspace's slack or in other rows and are masked to 0 (only clipped blocks)."""
    m, j, rs = q.shape[1], 2 * w + 1, out.stride(-2)
    t = _tile(m, w)
    slack = t + 2 * w
    inner, bc, buf = _wide_plan(out, t, w, slack)
    masks, zero = _clip_masks(m, w, t, q.device), q.new_zeros(())
    for b0 in range(0, out.shape[0], bc):
        n = min(bc, out.shape[0] - b0)
        qs, ks = q[b0 * inner:(b0 + n) * inner], k[b0 * inner:(b0 + n) * inner]
        for r0 in range(0, m, t):
            tr = min(t, m - r0)
            c0, c1 = _window(m, w, r0, tr)
            wr = c1 - c0
            p = buf[slack:slack + n * inner * tr * wr].view(n * inner, tr, wr)
            torch.bmm(qs[:, r0:r0 + tr], ks[:, r0 - w + c0:r0 - w + c1].transpose(1, 2), out=p)
            ps = _view(buf, slack - c0, (n, *out.shape[1:-2], tr, j),
                       (*_plain((n, *out.shape[1:-2], tr * wr))[:-1], wr + 1, 1))
            dst = _lead_view(out, b0, n, r0 * rs, (tr, j), (rs, 1))
            if r0 in masks:
                torch.where(masks[r0], ps, zero, out=dst)
            else:
                dst.copy_(ps)


def _plain(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a contiguous tensor of ``shape``."""
    return torch.empty(shape, device="meta").stride()


def _gbmm_wide(s: torch.Tensor, v: torch.Tensor, w: int, out: torch.Tensor) -> None:
    """``s``: ``[*lead, M, 2w+1]`` and ``out``: ``[*lead, M, N]`` (any strides, unit column
    stride); ``v``: ``[prod(lead), M, N]``.

    Per block: the band of S is copied into a workspace ``A`` (``A[t, t + j] = S[t, j]``,
    zero elsewhere: zeroed once, then only band positions are written), then
    ``A[:, c0:c1] @ V[r0 - w + c0 : r0 - w + c1]`` (clipped window) by one ``bmm``; the
    block results are written to ``out`` once per batch chunk."""
    m, j, rs = s.shape[-2], 2 * w + 1, s.stride(-2)
    t = _tile(m, w)
    width, lead = t + 2 * w, s.shape[1:-2]
    inner, bc, buf = _wide_plan(s, t, w, 0)
    a = buf[:bc * inner * t * width].view(bc * inner, t, width).zero_()
    for b0 in range(0, s.shape[0], bc):
        n = min(bc, s.shape[0] - b0)
        vs = v[b0 * inner:(b0 + n) * inner]
        blocks = []
        for r0 in range(0, m, t):
            tr = min(t, m - r0)
            c0, c1 = _window(m, w, r0, tr)
            band = _view(a, 0, (n, *lead, tr, j),
                         (*_plain((n, *lead, t * width))[:-1], width + 1, 1))
            band.copy_(_lead_view(s, b0, n, r0 * rs, (tr, j), (rs, 1)))
            blocks.append(torch.bmm(a[:n * inner, :tr, c0:c1], vs[:, r0 - w + c0:r0 - w + c1]))
        blocks = [o.view(n, *lead, o.shape[1], o.shape[2]) for o in blocks]
        dst = out[b0:b0 + n]
        if dst.stride() == _plain(dst.shape):   # (cat's out= mishandles other strides)
            torch.cat(blocks, -2, out=dst)
        else:
            dst.copy_(torch.cat(blocks, -2))


def _narrow_plan(bsz: int, m: int, w: int, itemsize: int) -> tuple[int, int, int, int]:
    """(T, blocks per batch, batches per chunk, blocks per chunk) of the narrow path."""
    t = max(1, min(_NARROW_TILE, m))
    nb = -(-m // t)
    units = max(1, _BUDGET // (t * (t + 2 * w) * itemsize))
    nk = min(nb, units)
    return t, nb, (max(1, min(bsz, units // nk)) if nk == nb else 1), nk


def _padded(x: torch.Tensor, before: int, rows: int) -> torch.Tensor:
    """``x`` ([B, M, C]) with ``before`` zero rows in front, zero-filled to ``rows`` rows."""
    if before == 0 and rows == x.shape[1]:
        return x
    p = x.new_zeros((x.shape[0], rows, x.shape[2]))
    p[:, before:before + x.shape[1]] = x
    return p


def _windows(xp: torch.Tensor, b0: int, n: int, k0: int, nk: int, t: int, width: int
             ) -> torch.Tensor:
    """``[n, nk, width, C]`` overlapping windows (stride ``t`` rows) of padded ``xp``."""
    c = xp.shape[2]
    return _view(xp, b0 * xp.stride(0) + k0 * t * xp.stride(1), (n, nk, width, c),
                 (xp.stride(0), t * xp.stride(1), xp.stride(1), xp.stride(2)))


def _block_rows(x: torch.Tensor, b0: int, n: int, k0: int, nk: int, t: int, m: int
                ) -> list[tuple[torch.Tensor, slice, slice]]:
    """Views of rows ``[k0*t, min((k0+nk)*t, m))`` of ``x[b0:b0+n]``: (full blocks
    ``[n, nf, t, C]`` with the block slice, then the partial last block's ``[n, r, C]``)."""
    lo, hi = k0 * t, min((k0 + nk) * t, m)
    nf, r = (hi - lo) // t, (hi - lo) % t
    parts = []
    if nf:
        parts.append((x[b0:b0 + n, lo:lo + nf * t].unflatten(1, (nf, t)), slice(0, nf),
                      slice(0, t)))
    if r:
        parts.append((x[b0:b0 + n, lo + nf * t:hi], slice(nf, nf + 1), slice(0, r)))
    return parts


def _g2bmm_narrow(q: torch.Tensor, k: torch.Tensor, w: int, out: torch.Tensor) -> None:
    bsz, m, _ = q.shape
    t, nb, bc, kc = _narrow_plan(bsz, m, w, q.element_size())
    width, j = t + 2 * w, 2 * w + 1
    qp, kp = _padded(q, 0, nb * t), _padded(k, w, nb * t + 2 * w)
    for b0 in range(0, bsz, bc):
        for k0 in range(0, nb, kc):
            n, nk = min(bc, bsz - b0), min(kc, nb - k0)
            qb = qp[b0:b0 + n, k0 * t:(k0 + nk) * t].unflatten(1, (nk, t))
            p = torch.matmul(qb, _windows(kp, b0, n, k0, nk, t, width).transpose(-1, -2))
            band = p.as_strided((n, nk, t, j), (nk * t * width, t * width, width + 1, 1))
            for dst, blocks, rows in _block_rows(out, b0, n, k0, nk, t, m):
                src = band[:, blocks, rows]
                dst.copy_(src if dst.dim() == 4 else src[:, 0])


def _gbmm_narrow(s: torch.Tensor, v: torch.Tensor, w: int, out: torch.Tensor) -> None:
    bsz, m, j = s.shape
    t, nb, bc, kc = _narrow_plan(bsz, m, w, s.element_size())
    width = t + 2 * w
    vp = _padded(v, w, nb * t + 2 * w)
    buf = s.new_zeros((bc, kc, t, width))   # zero off the band, reused across chunks
    for b0 in range(0, bsz, bc):
        for k0 in range(0, nb, kc):
            n, nk = min(bc, bsz - b0), min(kc, nb - k0)
            a = buf[:n, :nk]
            band = a.as_strided((n, nk, t, j), (a.stride(0), t * width, width + 1, 1))
            parts = _block_rows(s, b0, n, k0, nk, t, m)
            for src, blocks, rows in parts:
                dst = band[:, blocks, rows]
                dst.copy_(src if src.dim() == 4 else src[:, None])
            o = torch.matmul(a, _windows(vp, b0, n, k0, nk, t, width))
            for dst, blocks, rows in _block_rows(out, b0, n, k0, nk, t, m):
                src = o[:, blocks, rows]
                dst.copy_(src if dst.dim() == 4 else src[:, 0])


def _per_lead(fn: Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], None],
              a: torch.Tensor, b: torch.Tensor, w: int, out: torch.Tensor) -> None:
    """Run a 3-D kernel over ``out``'s first batch dimension when it has several."""
    if out.dim() == 3:
        fn(a, b, w, out)
        return
    inner = out.shape[1]     # out: [B, cnt, M, C]
    for i in range(out.shape[0]):
        ai = a[i] if a.dim() == 4 else a[i * inner:(i + 1) * inner]
        fn(ai, b[i * inner:(i + 1) * inner], w, out[i])


def _wide(w: int) -> bool:
    return 2 * w + 1 >= max(_WIDE_MIN_J, _TILE)


def _g2bmm_d1(q: torch.Tensor, k: torch.Tensor, w: int, out: torch.Tensor) -> None:
    """d == 1; ``q``, ``k``: ``[prod(lead), M, K]``, ``out``: ``[*lead, M, 2w+1]``."""
    if w == 0:
        out[..., 0] = torch.linalg.vecdot(q, k).view(out.shape[:-1])
    elif _wide(w):
        _g2bmm_wide(q, k, w, out)
    else:
        _per_lead(_g2bmm_narrow, q, k, w, out)


def _gbmm_d1(s: torch.Tensor, v: torch.Tensor, w: int, out: torch.Tensor) -> None:
    """d == 1; ``s``: ``[*lead, M, 2w+1]``, ``v``: ``[prod(lead), M, N]``, ``out`` like s."""
    if w == 0:
        out.copy_(s * v.view(out.shape))
    elif _wide(w):
        _gbmm_wide(s, v, w, out)
    else:
        _per_lead(_gbmm_narrow, s, v, w, out)


# ----------------------------------------------------------------------------- d > 1
def _residue_groups(m: int, d: int) -> list[tuple[int, int, int]]:
    """(first residue, residue count, rows per residue) of the re-layout ``i = d*i' + r``."""
    e, full = m % d, m // d
    if e == 0:
        return [(0, d, full)]
    return [(0, e, full + 1)] + ([(e, d - e, full)] if full else [])


def _regroup(x: torch.Tensor, r0: int, cnt: int, rows: int, d: int) -> torch.Tensor:
    """View ``[B, cnt, rows, C]`` of ``x`` ([B, M, C]): ``[b, r, i'] = x[b, d*i' + r0 + r]``."""
    sb, sm, sc = x.stride()
    return _view(x, r0 * sm, (x.shape[0], cnt, rows, x.shape[2]), (sb, sm, d * sm, sc))


def _dilated(fn: Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], None],
             a: torch.Tensor, b: torch.Tensor, w: int, d: int, out: torch.Tensor,
             copy_a: bool) -> None:
    """Run the d == 1 kernel ``fn`` on each residue class (see the module doc)."""
    for r0, cnt, rows in _residue_groups(a.shape[1], d):
        av = _regroup(a, r0, cnt, rows, d)          # Q: one copy; S: read through the view
        if copy_a:
            av = av.contiguous().view(-1, rows, a.shape[2])
        bv = _regroup(b, r0, cnt, rows, d).contiguous().view(-1, rows, b.shape[2])
        fn(av, bv, w, _regroup(out, r0, cnt, rows, d))   # out written through the view


# ----------------------------------------------------------------------------- API
def g2bmm(q: torch.Tensor, k: torch.Tensor, w: int, d: int = 1,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """``S[b, i, j] = sum_k q[b, i, k] * k[b, i + d*(j - w), k]`` -> ``[B, M, 2w+1]``.

    ``q``, ``k``: ``[B, M, K]`` tensors (any strides, same dtype and device). ``out`` (any
    strides) receives the result when given; it must not overlap ``q`` or ``k``."""
    _check(q, k, w, d, None)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k need equal K: {list(q.shape)} vs {list(k.shape)}")
    bsz, m, _ = q.shape
    res, final = _target(out, q, (bsz, m, 2 * w + 1))
    if res.numel():
        k = k.to(q.dtype)
        if d == 1 or m <= 1:
            _g2bmm_d1(q, k, w, res)
        else:
            _dilated(_g2bmm_d1, q, k, w, d, res, True)
    return res if final is None else final.copy_(res)


def gbmm(s: torch.Tensor, v: torch.Tensor, w: int, d: int = 1,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """``O[b, i, n] = sum_j s[b, i, j] * v[b, i + d*(j - w), n]`` -> ``[B, M, N]``.

    ``s``: ``[B, M, 2w+1]``, ``v``: ``[B, M, N]``; ``out`` as for :func:`g2bmm`."""
    _check(s, v, w, d, 2 * w + 1)
    bsz, m, _ = s.shape
    res, final = _target(out, s, (bsz, m, v.shape[2]))
    if res.numel():
        v = v.to(s.dtype)
        if s.stride(-1) != 1:
            s = s.contiguous()
        if d == 1 or m <= 1:
            _gbmm_d1(s, v, w, res)
        else:
            _dilated(_gbmm_d1, s, v, w, d, res, False)
    return res if final is None else final.copy_(res)
