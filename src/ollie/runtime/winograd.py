"""Winograd convolutions ``F(m x m, r x r)`` on the CPU: fewer multiplications for stride-1
convolutions with small square kernels.

A stride-1 convolution computes ``m x m`` outputs of a tile from an ``n x n`` input patch,
``n = m + r - 1``. With the Cook-Toom matrices ``A^T`` (``m x n``), ``G`` (``n x r``) and
``B^T`` (``n x n``) built from ``n - 1`` interpolation points and infinity
(:func:`matrices`), one output tile is

    Y = A^T [ sum_c (G g_{k,c} G^T) .* (B^T d_c B) ] A

so the channel sum becomes ``n*n`` independent matrix products, one per transformed position
``xi``: ``M[:, xi] = V[:, xi] @ U[xi]^T`` with ``V`` ``[tiles, n*n, C]`` (the input
transform), ``U[xi]`` ``[K, C]`` (the weight transform, done once when the convolution is
built) and ``M`` ``[tiles, n*n, K]``. For ``r = 3``: ``F(4x4, 3x3)`` does
``36 / (16 * 9) = 1/4`` of the direct convolution's multiplications in the products, at the
price of two memory-bound transforms (the input and output pass through ``36/16`` as many
elements).

A dilated convolution (dilation ``d``) is the same on the lattice of positions congruent
modulo ``d``: a tile holds outputs ``o + d*i`` and reads inputs ``o - pad + d*j``, so it needs
no re-laid-out copy of the input.

The transforms are generated numba kernels (the matrices' non-zero coefficients written out,
so the inner loop over channels vectorises), stored in the kernel cache
(:mod:`ollie.codegen.cache`); the products are one call of oneDNN's grouped 1x1 convolution
with the ``U`` packed once (:func:`ollie.runtime.onednn.packed_conv2d`: ``V`` is a
channels-last ``[1, n*n*C, tiles, 1]`` image, ``n*n`` groups). On the 2-core VM
(2026-11-24) it ran the 36 products at 389-436 GFLOP/s for 128-512 channels, against 272-348
for 36 calls of oneDNN's matmul; both ran ~250 for 64 channels. Bias, a residual
``r`` (``f(conv(x) + r)``) and ReLU are applied in the output transform; other activations
after it. The output is channels-last (the transforms' natural layout: channels innermost).

Numerics. The products sum ``C`` terms in float32 like a direct convolution; the transforms
add and scale by the matrices' entries (for ``F(4, 3)``: integers up to 8 and ``1/24``), which
amplifies rounding by a small constant factor: relative errors ~1e-6 for ``F(2, 3)``, ~1e-5
for ``F(4, 3)`` on random data, checked against ``F.conv2d`` when the convolution is built
(:func:`ollie.runtime.onednn._checked`), like every library convolution.

:func:`winograd_conv2d` returns the convolution, or ``None`` where it does not apply (stride,
groups, a non-square or 1x1 kernel, no oneDNN matmul).
"""

from __future__ import annotations

import logging
import threading
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F

from ollie.runtime import onednn

log = logging.getLogger(__name__)

TILE = {3: 4}
"""Output tile ``m`` per kernel size ``r``: ``F(4x4, 3x3)``. Larger tiles need points whose
powers grow fast (worse rounding). ``F(2x2, 5x5)`` (also ``n = 6``) measured 2-4x slower than
oneDNN on SRCNN's 5x5 layers (few output channels: small products, large transforms)."""

KERNEL_VERSION = 5

WHOLE_BYTES = 48 << 20
BLOCK_BYTES = 8 << 20
"""Transformed input plus products of all tiles up to ``WHOLE_BYTES``: one pass (one product
call); above, blocks of about ``BLOCK_BYTES`` of tiles, transformed, multiplied and transformed
back in turn, so the block stays in the caches. On the 2-core VM (32 MiB L3, 1 MiB L2 per
core; 2026-11-24), with 4/8/16/32 MiB blocks against one pass: ResNet-18's [16, 64, 56, 56]
layer (58 MB of both) took 7.1/6.4/7.7/8.6 ms against 12.3; its [16, 128, 28, 28] layer
(29 MB) 4.9/4.4/4.5/4.2 against 4.1, and CSRNet's [16, 512, 14, 14] (38 MB) 18.9/17.2/15.2/14.1
against 12.5 (a product call per block does less per call, at a lower rate)."""
"""Part of the generated modules' names: bumped when the generated code changes."""



def _points(count: int) -> list[Fraction]:
    """``0, 1, -1, 2, -2, 1/2, -1/2, 3, -3, ...``: the interpolation points (small values and
    their reciprocals keep the matrices' entries small)."""
    pts = [Fraction(0)]
    k = 1
    while len(pts) < count:
        for p in (Fraction(k), Fraction(-k), Fraction(1, k + 1), Fraction(-1, k + 1)):
            if p not in pts:
                pts.append(p)
        k += 1
    return pts[:count]


def _poly_mul(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def matrices(m: int, r: int) -> tuple[list[list[Fraction]], ...]:
    """``(A^T, G, B^T)`` of ``F(m, r)`` (exact fractions; ``A^T`` is ``m x n``, ``G``
    ``n x r``, ``B^T`` ``n x n``, ``n = m + r - 1``): for a 1-D correlation
    ``y[i] = sum_k g[k] d[i + k]`` of a length-``n`` input, ``y = A^T ((G g) * (B^T d))``."""
    n = m + r - 1
    pts = _points(n - 1)
    at = [[p ** i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for p in pts:
        den = Fraction(1)
        for q in pts:
            if q != p:
                den *= p - q
        g.append([p ** k / den for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    bt = []
    for j in range(n - 1):
        poly = [Fraction(1)]
        for q in pts[:j] + pts[j + 1:]:
            poly = _poly_mul(poly, [-q, Fraction(1)])
        bt.append([*poly, Fraction(0)])
    full = [Fraction(1)]
    for q in pts:
        full = _poly_mul(full, [-q, Fraction(1)])
    bt.append(full)
    return at, g, bt


# ------------------------------------------------------------------------ code generation
def _lincomb(coefs: list[Fraction], names: list[str]) -> str:
    terms = []
    for c, name in zip(coefs, names, strict=True):
        if c == 0:
            continue
        if c == 1:
            terms.append(f"+ {name}")
        elif c == -1:
            terms.append(f"- {name}")
        else:
            terms.append(f"{'+' if c > 0 else '-'} np.float32({float(abs(c))!r}) * {name}")
    if not terms:
        return "np.float32(0.0)"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _loops(mat: list[list[Fraction]], rows: int, n: int, src: str, dst: str,
           left: bool) -> list[str]:
    """One loop over channels ``c`` per output element: ``dst(i, j) = sum_k mat[i][k]
    src(k, j)`` (``left``) or ``sum_k mat[j][k] src(i, k)``; ``src`` / ``dst`` format an
    element's array access from ``(i, j)``. A loop stores one stream and reads at most a few
    (the matrices are sparse), so LLVM vectorises it over ``c`` without giving up on the
    runtime alias checks a loop body with dozens of streams would need."""
    lines = []
    for i in range(rows):
        for j in range(rows if not left else n):
            if left:
                expr = _lincomb(mat[i], [src.format(k, j) for k in range(n)])
            else:
                expr = _lincomb(mat[j], [src.format(i, k) for k in range(n)])
            lines += ["for c in range(C):", f"    {dst.format(i, j)} = {expr}"]
    return lines


def _indent(lines: list[str], depth: int) -> str:
    return "".join("    " * depth + line + "\n" for line in lines)


def _source(m: int, r: int, canonical: str) -> str:
    at, _, bt = matrices(m, r)
    n = m + r - 1
    nn = n * n
    # input: h = B^T d (by columns), V = h B (by rows)
    t_in = _loops(bt, n, n, "patch[{0} * N_ + {1}, c]", "h[{0} * N_ + {1}, c]", True) + \
        _loops(bt, n, n, "h[{0} * N_ + {1}, c]", "V[t, {0} * N_ + {1}, c]", False)
    # output: h = A^T M (by columns), acc = h A (by rows)
    t_out = _loops(at, m, n, "M[t, {0} * N_ + {1}, c]", "h[{0} * N_ + {1}, c]", True) + \
        _loops(at, m, n, "h[{0} * N_ + {1}, c]", "acc[{0} * M_ + {1}, c]", False)
    return f'''"""Generated by ollie.runtime.winograd: F({m}x{m}, {r}x{r}) transforms."""
import numpy as np
from numba import njit, prange

CANONICAL = {canonical!r}
N_ = {n}
M_ = {m}


@njit(fastmath=False, cache=True)
def _tile_input(x, V, patch, h, t, b, y0, x0, dil):
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    for i in range(N_):
        yy = y0 + dil * i
        for j in range(N_):
            xx = x0 + dil * j
            p = i * N_ + j
            if yy >= 0 and yy < H and xx >= 0 and xx < W:
                for c in range(C):
                    patch[p, c] = x[b, c, yy, xx]
            else:
                for c in range(C):
                    patch[p, c] = np.float32(0.0)
{_indent(t_in, 1)}

@njit(parallel=True, fastmath=False, cache=True)
def transform_input(x, V, t0, count, pad_t, pad_l, dil, th, tw, chunk):
    C = x.shape[1]
    per = th * tw
    for q in prange((count + chunk - 1) // chunk):
        patch = np.empty(({nn}, C), np.float32)
        h = np.empty(({nn}, C), np.float32)
        for tl in range(q * chunk, min(count, (q + 1) * chunk)):
            t = t0 + tl
            b = t // per
            rr = t - b * per
            ty = rr // tw
            tx = rr - ty * tw
            y0 = ty % dil + (ty // dil) * dil * M_ - pad_t
            x0 = tx % dil + (tx // dil) * dil * M_ - pad_l
            _tile_input(x, V, patch, h, tl, b, y0, x0, dil)


@njit(fastmath=False, cache=True)
def _tile_output(M, Y, bias, res, mode, h, acc, t, b, y0, x0, dil):
    Ho, Wo, C = Y.shape[1], Y.shape[2], Y.shape[3]
{_indent(t_out, 1)}    for i in range(M_):
        yy = y0 + dil * i
        if yy >= Ho:
            break
        for j in range(M_):
            xx = x0 + dil * j
            if xx >= Wo:
                break
            a = i * M_ + j
            if mode == 0:
                for c in range(C):
                    Y[b, yy, xx, c] = acc[a, c] + bias[c]
            elif mode == 1:
                for c in range(C):
                    v = acc[a, c] + bias[c]
                    Y[b, yy, xx, c] = v if v > 0 else np.float32(0.0)
            elif mode == 2:
                for c in range(C):
                    Y[b, yy, xx, c] = acc[a, c] + bias[c] + res[b, c, yy, xx]
            else:
                for c in range(C):
                    v = acc[a, c] + bias[c] + res[b, c, yy, xx]
                    Y[b, yy, xx, c] = v if v > 0 else np.float32(0.0)


@njit(parallel=True, fastmath=False, cache=True)
def transform_output(M, Y, bias, res, mode, t0, count, dil, th, tw, chunk):
    C = Y.shape[3]
    per = th * tw
    for q in prange((count + chunk - 1) // chunk):
        h = np.empty(({m * n}, C), np.float32)
        acc = np.empty(({m * m}, C), np.float32)
        for tl in range(q * chunk, min(count, (q + 1) * chunk)):
            t = t0 + tl
            b = t // per
            rr = t - b * per
            ty = rr // tw
            tx = rr - ty * tw
            y0 = ty % dil + (ty // dil) * dil * M_
            x0 = tx % dil + (tx // dil) * dil * M_
            _tile_output(M, Y, bias, res, mode, h, acc, tl, b, y0, x0, dil)
'''


_MODULES: dict[str, object] = {}


def _module(m: int, r: int):
    """The transforms of ``F(m, r)`` (generated, from the kernel cache)."""
    from ollie.codegen.cache import default_cache_dir, load_module
    from ollie.codegen.cpu import _configure_numba

    canonical = f"winograd v{KERNEL_VERSION} F({m},{r})"
    mod = _MODULES.get(canonical)
    if mod is None:
        _configure_numba()
        stem = f"ollie_winograd_v{KERNEL_VERSION}_F{m}x{r}"
        mod, _ = load_module(default_cache_dir(), stem, canonical, f"{stem}_b",
                             lambda: _source(m, r, canonical))
        _MODULES[canonical] = mod
    return mod


# ------------------------------------------------------------------------ the convolution
def _weights(weight: torch.Tensor, m: int) -> list[torch.Tensor]:
    """``U[xi]`` ``[K, C]`` (contiguous) for each transformed position ``xi = i*n + j``:
    ``G w G^T`` per (output, input) channel, computed in float64."""
    r = weight.shape[-1]
    g = torch.tensor([[float(v) for v in row] for row in matrices(m, r)[1]],
                     dtype=torch.float64)
    u = torch.einsum("ia,kcab,jb->ijkc", g, weight.double(), g)  # [n, n, K, C]
    n = u.shape[0]
    return [u[i, j].float().contiguous() for i in range(n) for j in range(n)]


def _tiles(size: int, m: int, dil: int) -> int:
    """Tiles along one output dimension: ``dil`` residue classes of ``ceil(len / m)``."""
    per_class = -(-size // dil)
    return dil * -(-per_class // m)


def applies(weight_shape: tuple[int, ...], stride: tuple[int, int], groups: int) -> bool:
    """Whether a convolution with these parameters has a Winograd form here."""
    return (len(weight_shape) == 4 and weight_shape[2] == weight_shape[3]
            and weight_shape[2] in TILE and tuple(stride) == (1, 1) and groups == 1)


def winograd_conv2d(weight: torch.Tensor, input_shape: tuple[int, ...],
                    stride: tuple[int, int], padding: tuple[int, int],
                    dilation: tuple[int, int], bias: torch.Tensor | None = None,
                    groups: int = 1, activation: str | None = None,
                    residual: bool = False) -> onednn.Conv | None:
    """``x -> f(conv2d(x, weight, bias, 1, padding, dilation))`` (``(x, r) -> f(conv2d(...) +
    r)`` with ``residual``) for inputs of ``input_shape`` by ``F(m x m, r x r)``; ``None``
    where it does not apply or does not agree with ``F.conv2d`` on a random input."""
    if not (onednn._usable(weight) and applies(tuple(weight.shape), stride, groups)
            and len(input_shape) == 4 and activation in onednn.POST_OPS
            and dilation[0] == dilation[1]):
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().float().contiguous()
    r = w.shape[-1]
    m = TILE[r]
    nb, c, h, wd = input_shape
    k = w.shape[0]
    dil = int(dilation[0])
    ho = h + 2 * padding[0] - dil * (r - 1)
    wo = wd + 2 * padding[1] - dil * (r - 1)
    if ho <= 0 or wo <= 0 or c != w.shape[1]:
        return None
    th, tw = _tiles(ho, m, dil), _tiles(wo, m, dil)
    tiles = nb * th * tw
    relu = activation == "relu"
    post = onednn.POST_OPS[None if relu else activation]
    try:
        mod = _module(m, r)
    except Exception as exc:  # numba's compile errors have many types
        log.warning("Winograd F(%d, %d) transforms did not compile: %s", m, r, exc)
        return None
    us = _weights(w, m)
    nn = len(us)
    # tiles in blocks of at most ``block`` (V and M of a block stay in the caches); the nn
    # products of a block as one grouped 1x1 convolution: V [block, nn, C] is a channels-last
    # [1, nn*C, block, 1] image, its output [1, nn*K, block, 1] is M [block, nn, K]
    per_tile = 4 * nn * (c + k)
    block = tiles if tiles * per_tile <= WHOLE_BYTES else max(1, BLOCK_BYTES // per_tile)
    sizes = sorted({block, tiles % block} - {0})
    products = {s: onednn.packed_conv2d(torch.cat(us).reshape(nn * k, c, 1, 1),
                                        (1, nn * c, s, 1), (1, 1), (0, 0), (1, 1), None, nn)
                for s in sizes}
    if any(p is None for p in products.values()):
        return None
    no_res = np.zeros((1, 1, 1, 1), np.float32)
    bias_np = (torch.zeros(k) if b is None else b).numpy()
    mode = int(relu) + 2 * int(residual)
    local = threading.local()

    def workspace() -> torch.Tensor:
        v = getattr(local, "v", None)
        if v is None:
            v = local.v = torch.empty(block, nn, c)
        return v

    def run(x: torch.Tensor, res: torch.Tensor | None = None) -> torch.Tensor:
        v = workspace()
        xn = x.detach().numpy() if x.is_contiguous() or onednn.is_channels_last(x) \
            else x.detach().contiguous().numpy()
        y = torch.empty(nb, ho, wo, k)
        yn = y.numpy()
        rn = no_res if res is None else res.detach().numpy()
        for t0 in range(0, tiles, block):
            count = min(block, tiles - t0)
            chunk = max(1, count // 16)
            vb = v[:count]
            mod.transform_input(xn, vb.numpy(), t0, count, padding[0], padding[1], dil, th, tw,
                                chunk)
            out = products[count](vb.reshape(1, count, 1, nn * c).permute(0, 3, 1, 2))
            ms = out.permute(0, 2, 3, 1).reshape(count, nn, k)
            mod.transform_output(ms.numpy(), yn, bias_np, rn, mode, t0, count, dil, th, tw,
                                 chunk)
        return post(y.permute(0, 3, 1, 2))

    if residual:
        def conv(x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            return run(x, res)
    else:
        def conv(x: torch.Tensor) -> torch.Tensor:
            return run(x)

    ref = onednn._post(activation, residual, lambda x: F.conv2d(
        x, w, b, 1, tuple(padding), (dil, dil)))
    return onednn._checked(conv, ref, tuple(input_shape), residual)


__all__ = ["TILE", "applies", "matrices", "winograd_conv2d"]
