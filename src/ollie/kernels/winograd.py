"""Winograd convolutions ``F(m x m, r x r)`` on the CPU: fewer multiplications for stride-1
convolutions with small square kernels, and for strided transposed convolutions computed per
output phase.

A stride-1 convolution (2x2, 3x3 or 5x5 kernels, :data:`TILE`) computes ``m x m`` outputs of a
tile from an ``n x n`` input patch, ``n = m + r - 1``. With the Cook-Toom matrices ``A^T``
(``m x n``), ``G`` (``n x r``) and ``B^T`` (``n x n``) built from ``n - 1`` interpolation
points and infinity (:func:`matrices`), one output tile is

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

The transforms are generated numba kernels (:mod:`ollie.kernels.winograd_codegen`: per tile a
pass down the columns and one along the rows, each loop over channels computing a whole
column or row, vectorised), generated per channel block, stored in the kernel cache
(:mod:`ollie.codegen.cache`) and compiled side by side before a convolution's candidates are
built (:func:`ollie.kernels.winograd_codegen.precompile`). The products of all parts (the
output phases of a strided transposed convolution, :func:`phase_parts`; one part otherwise)
are one call of oneDNN's grouped 1x1 convolution with ``U`` packed once or of the
register-blocked kernel of :mod:`ollie.kernels.blocked_gemm`, whichever measured faster for the
shape with cold caches (:func:`ollie.kernels.blocked_gemm.grouped_products`); each transform
likewise takes all parts in one call. A transposed convolution whose phases are each an
``r x r`` convolution is also built in the overlap-add form
(:mod:`ollie.kernels.winograd_overlap`), and the faster form kept (:func:`_fastest_tile`).
Bias, a residual ``r`` (``f(conv(x) + r)``) and ReLU are applied in the output transform;
other activations after it. The output is channels-last (the transforms' natural layout:
channels innermost).

Numerics. The products sum ``C`` terms in float32 like a direct convolution; the transforms
add and scale by the matrices' entries (for ``F(4, 3)``: integers up to 8 and ``1/24``), which
amplifies rounding by a small constant factor: errors up to ~2e-5 of the largest output
magnitude on random data (ResNet-18 and CSRNet layers), checked against ``F.conv2d`` when the
convolution is built (:func:`ollie.libs.onednn.checked`), like every library convolution.
A tile's transforms mix all its elements, so an input holding a NaN or an infinity runs the
direct convolution instead (:func:`ollie.kernels.winograd_common.exact_if_nonfinite`): NaN
and infinities land where the model puts them, not over whole tiles.

:func:`winograd_conv2d` and :func:`winograd_conv_transpose2d` return the convolution (``f(x)``,
or ``f(x, r)`` with a residual), or ``None`` where it does not apply (stride, groups, a kernel
size without a tile in :data:`TILE`, no oneDNN in this torch) or disagrees with the torch
function on a random input. The tile chosen for a configuration is remembered for the process.

Why Winograd, these tiles and these transforms (with the measurements):
docs/design/004-winograd-convolutions.md; transposed convolutions:
docs/design/005-winograd-transposed-convolutions.md; the products:
docs/design/006-blocked-gemm-micro-kernel.md.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F

from ollie.kernels import blocked_gemm, winograd_overlap
from ollie.kernels.winograd_codegen import block as channel_block
from ollie.kernels.winograd_codegen import input_module, matrices, output_module
from ollie.kernels.winograd_codegen import precompile as codegen_precompile
from ollie.kernels.winograd_common import (
    CHANNELS_LAST_PLANE,
    as_conv,
    exact_if_nonfinite,
    input_array,
    residual_array,
    thread_workspace,
)
from ollie.libs import onednn
from ollie.tune.choice import Choices, shared

log = logging.getLogger(__name__)

TILE = {2: 4, 3: 4, 5: 4}
"""Output tile ``m`` per kernel size ``r``: ``F(4x4, 3x3)`` (``n = 6``: 4x fewer
multiplications), ``F(4x4, 5x5)`` (``n = 8``: 6.25x fewer; points up to +-2 and +-1/2,
errors up to ~1e-5 of the largest output on SRCNN's layers) and ``F(4x4, 2x2)`` (``n = 5``:
2.56x fewer; the phases of 4x4 stride-2 transposed convolutions, :func:`phase_parts`).
Smaller tiles for these kernels (``F(2x2, 2x2)``, ``F(2x2, 5x5)``) transform more input per
output and are offered only where :func:`tile_sizes` says so; larger ones (``F(6x6)``,
``F(8x8)``) need interpolation points whose powers grow fast (larger rounding errors) and have
more weight matrices per phase. Why these sizes (measured):
docs/design/004-winograd-convolutions.md."""

SMALL_TILE = 2
"""The smaller output tile: ``F(2x2, r x r)`` is also built, and the faster of it and the
:data:`TILE` form kept (:func:`_fastest_tile`: timed alone with cold caches, as every library
choice), for the convolutions :func:`tile_sizes` names. Its products do more multiplications
but read ``(r + 1)**2`` weight matrices against the :data:`TILE` form's ``(m + r - 1)**2``.
Why: docs/design/004-winograd-convolutions.md."""

WHOLE_BYTES = 48 << 20
BLOCK_BYTES = 8 << 20
"""Transformed input plus products of all tiles up to ``WHOLE_BYTES``: one pass (one product
call); above, blocks of about ``BLOCK_BYTES`` of tiles, transformed, multiplied and transformed
back in turn, so that a block stays in the caches. Why these values (measured alone and in
whole programs): docs/design/004-winograd-convolutions.md."""


# ------------------------------------------------------------------------ the convolution
def transformed_weights(weight: torch.Tensor, m: int) -> list[torch.Tensor]:
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
    if not (onednn.usable(weight) and applies(tuple(weight.shape), stride, groups)
            and len(input_shape) == 4 and activation in onednn.POST_OPS
            and dilation[0] == dilation[1] and input_shape[1] == weight.shape[1]):
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().float().contiguous()
    r, dil = w.shape[-1], int(dilation[0])
    ho = input_shape[2] + 2 * padding[0] - dil * (r - 1)
    wo = input_shape[3] + 2 * padding[1] - dil * (r - 1)
    parts = [(w, tuple(padding), 0)]
    conv = _fastest_tile(lambda m: _build(parts, b, input_shape, (ho, wo), dil, 1, activation,
                                          residual, m),
                         parts, input_shape, (ho, wo), dil,
                         (input_shape[0], w.shape[0], ho, wo), residual,
                         ("Conv2d", tuple(w.shape), tuple(input_shape), tuple(padding), dil,
                          b is None, activation, residual))
    ref = onednn.with_epilogue(activation, residual, lambda x: F.conv2d(
        x, w, b, 1, tuple(padding), (dil, dil)))
    return None if conv is None else onednn.checked(
        exact_if_nonfinite(conv, ref, residual), ref, tuple(input_shape), residual)


def _phase_taps(k: int, s: int, p: int) -> list[list[tuple[int, int]]]:
    """Per output phase ``a`` of a transposed convolution (kernel ``k``, stride ``s``, padding
    ``p``; output ``s*u + a`` reads input ``u + d`` through tap ``k_ = a + p - s*d``): the
    ``(d, k_)`` pairs."""
    return [[((a + p - t) // s, t) for t in range(k) if (a + p - t) % s == 0]
            for a in range(s)]


def applies_transposed(weight_shape: tuple[int, ...], stride: tuple[int, int],
                       padding: tuple[int, int], dilation: tuple[int, int],
                       groups: int) -> bool:
    """Whether a transposed convolution with these parameters has a Winograd form here
    (:func:`winograd_conv_transpose2d`; the output size is checked when it is built)."""
    if not (len(weight_shape) == 4 and weight_shape[2] == weight_shape[3]
            and stride[0] == stride[1] > 1 and padding[0] == padding[1]
            and tuple(dilation) == (1, 1) and groups == 1):
        return False
    taps = _phase_taps(weight_shape[2], stride[0], padding[0])
    if any(not t for t in taps):
        return False
    ds = [d for t in taps for d, _ in t]
    return max(ds) - min(ds) + 1 in TILE or _phase_window(taps) is not None


def _phase_window(taps: list[list[tuple[int, int]]]) -> int | None:
    """The kernel size ``r`` of every phase's own convolution (:func:`phase_parts`), or None
    unless each phase reads ``r`` consecutive input offsets with ``r`` in :data:`TILE`."""
    sizes = {len(t) for t in taps}
    if len(sizes) != 1 or (r := sizes.pop()) not in TILE:
        return None
    for t in taps:
        ds = sorted(d for d, _ in t)
        if ds != list(range(ds[0], ds[0] + r)):
            return None
    return r


def transposed_as_phases(weight: torch.Tensor, stride: int, padding: int
                         ) -> tuple[torch.Tensor, int] | None:
    """A stride-``s`` transposed convolution (weight ``[C, K, k, k]``) as one stride-1
    convolution with ``s*s*K`` output channels, one group of ``K`` per output phase
    ``(a, b)`` (output ``(s*u + a, s*v + b)`` is channel ``(a*s + b)*K + o`` at ``(u, v)``):
    ``(weight [s*s*K, C, r, r], left padding)``, the window ``r`` spanning every phase's
    input offsets (taps a phase does not read are zero). None when a phase reads nothing."""
    c, kk, k = weight.shape[0], weight.shape[1], weight.shape[2]
    taps = _phase_taps(k, stride, padding)
    if any(not t for t in taps):
        return None
    lo = min(d for t in taps for d, _ in t)
    r = max(d for t in taps for d, _ in t) - lo + 1
    out = torch.zeros(stride, stride, kk, c, r, r, dtype=weight.dtype)
    wt = weight.permute(1, 0, 2, 3)  # [K, C, k, k]
    for a, ta in enumerate(taps):
        for bb, tb in enumerate(taps):
            for dy, ky in ta:
                for dx, kx in tb:
                    out[a, bb, :, :, dy - lo, dx - lo] = wt[:, :, ky, kx]
    return out.reshape(stride * stride * kk, c, r, r), -lo


def phase_parts(weight: torch.Tensor, stride: int, padding: int
                ) -> list[tuple[torch.Tensor, tuple[int, int], int]] | None:
    """A stride-``s`` transposed convolution (weight ``[C, K, k, k]``) as ``s*s`` stride-1
    convolutions, one per output phase ``(a, b)``: ``(weight [K, C, r, r], (top, left)
    padding, phase a*s + b)``, each reading only its own taps. None unless every phase reads
    ``r`` consecutive input offsets per dimension with ``r`` in :data:`TILE` (4x4 stride-2
    kernels: 2x2 per phase, ``F(4x4, 2x2)``).

    Against :func:`transposed_as_phases` (one ``F(4x4, 3x3)`` over a window spanning every
    phase's offsets, zero taps included), per output and channel pair the products do 25/16
    instead of 36/16 multiplications and the transformed weights are ``100*C*K`` floats
    instead of ``144*C*K`` (the weight itself: ``16*C*K``), at the price of one input
    transform per phase. The window form is built only where this returns None: per phase
    measured faster in whole programs (docs/design/005-winograd-transposed-convolutions.md)."""
    taps = _phase_taps(weight.shape[2], stride, padding)
    if _phase_window(taps) is None:
        return None
    wt = weight.permute(1, 0, 2, 3)  # [K, C, k, k]
    parts = []
    for a, ta in enumerate(taps):
        ky = [kk for _, kk in sorted(ta)]
        for bb, tb in enumerate(taps):
            kx = [kk for _, kk in sorted(tb)]
            w = wt[:, :, ky][:, :, :, kx].contiguous()
            parts.append((w, (-min(ta)[0], -min(tb)[0]), a * stride + bb))
    return parts


def winograd_conv_transpose2d(weight: torch.Tensor, input_shape: tuple[int, ...],
                              stride: tuple[int, int], padding: tuple[int, int],
                              output_padding: tuple[int, int], dilation: tuple[int, int],
                              bias: torch.Tensor | None = None, groups: int = 1,
                              activation: str | None = None, residual: bool = False
                              ) -> onednn.Conv | None:
    """``x -> f(conv_transpose2d(x, weight, bias, stride, padding, output_padding))`` by the
    output phases: one Winograd convolution per phase where each phase's taps form a kernel
    of :data:`TILE` (:func:`phase_parts`; InfoGAN's and DCGAN's 4x4 stride-2 layers: 2x2 per
    phase), and then also the overlap-add form (:mod:`ollie.kernels.winograd_overlap`), the
    faster kept (:func:`_fastest_tile`); else one over a window spanning all phases
    (:func:`transposed_as_phases`). The output transform writes each phase's elements to their
    interleaved positions. ``None`` where none applies (square stride and kernel, no dilation
    or groups, every phase the same size) or the result does not agree with
    ``F.conv_transpose2d`` on a random input."""
    s = int(stride[0])
    if not (onednn.usable(weight) and len(input_shape) == 4
            and applies_transposed(tuple(weight.shape), stride, padding, dilation, groups)
            and activation in onednn.POST_OPS and input_shape[1] == weight.shape[0]):
        return None
    k, p = weight.shape[2], int(padding[0])
    hout = (input_shape[2] - 1) * s - 2 * p + k + output_padding[0]
    wout = (input_shape[3] - 1) * s - 2 * p + k + output_padding[1]
    if hout % s or wout % s:
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().float().contiguous()
    parts = phase_parts(w, s, p)
    overlap = None
    if parts is None:
        phases = transposed_as_phases(w, s, p)
        if phases is None:
            return None
        wp, lo = phases
        parts = [(wp, (lo, lo), 0)]
    else:
        def overlap(m: int) -> onednn.Conv | None:
            return winograd_overlap.build(parts, b, input_shape, (hout // s, wout // s), s,
                                          activation, residual, m)
    conv = _fastest_tile(lambda m: _build(parts, b, input_shape, (hout // s, wout // s), 1, s,
                                          activation, residual, m),
                         parts, input_shape, (hout // s, wout // s), 1,
                         (input_shape[0], w.shape[1], hout, wout), residual,
                         ("ConvTranspose2d", tuple(w.shape), tuple(input_shape), s, p,
                          tuple(output_padding), b is None, activation, residual), overlap)
    ref = onednn.with_epilogue(activation, residual, lambda x: F.conv_transpose2d(
        x, w, b, s, p, tuple(output_padding)))
    return None if conv is None else onednn.checked(
        exact_if_nonfinite(conv, ref, residual), ref, tuple(input_shape), residual)


Part = tuple[torch.Tensor, tuple[int, int], int]
def tile_sizes(parts: list[Part], out_size: tuple[int, int], dil: int) -> list[int]:
    """The output tiles ``m`` to try for ``parts`` (:func:`_build`, outputs ``out_size`` per
    phase): :data:`TILE`, and :data:`SMALL_TILE` where the :data:`TILE` form's transformed
    weights exceed the largest CPU cache (at most :data:`CACHE_MAX_BYTES`), its products do
    more multiplications (tiles mostly past the output: a 2x2 output per phase, InfoGAN's
    448 -> 256 layer), or one tile covers the output (per residue class): then each of the
    ``(m + r - 1)**2`` weight matrices of a product serves one row per batch entry, and
    reading the weights costs more than the multiplications saved. Why (measured):
    docs/design/004-winograd-convolutions.md."""
    from ollie.tune.measure import llc_bytes

    r = parts[0][0].shape[-1]
    m = TILE[r]
    if m <= SMALL_TILE:
        return [m]
    rows = sum(w.shape[0] for w, _, _ in parts)
    weight_bytes = 4 * (m + r - 1) ** 2 * rows * channel_block(parts[0][0].shape[1])

    def products(t: int) -> int:
        return _tiles(out_size[0], t, dil) * _tiles(out_size[1], t, dil) * (t + r - 1) ** 2

    one_tile = _tiles(out_size[0], m, dil) * _tiles(out_size[1], m, dil) == dil * dil
    small = weight_bytes > min(llc_bytes(), CACHE_MAX_BYTES) or \
        products(SMALL_TILE) < products(m) or one_tile
    return [m, SMALL_TILE] if small else [m]


CACHE_MAX_BYTES = 32 << 20
"""The most :func:`tile_sizes` takes the largest cache to hold, whatever the machine reports:
a virtual machine may report its host's whole last-level cache (cf.
:data:`ollie.tune.measure.EVICT_MAX_BYTES`), under which no layer's transformed weights would
count as exceeding it. 32 MiB is the L3 of the machine the rule was measured on. Why:
docs/design/004-winograd-convolutions.md."""


def _fastest_tile(build, parts: list[Part], input_shape: tuple[int, ...],
                  out_size: tuple[int, int], dil: int, out_shape: tuple[int, ...],
                  residual: bool, key: tuple, overlap=None,
                  choices: Choices | None = None) -> onednn.Conv | None:
    """``build(m)`` for the one size of :func:`tile_sizes`, or the fastest of those built
    and of ``overlap(m)`` (the overlap-add form of a transposed convolution,
    :mod:`ollie.kernels.winograd_overlap`, offered for the :data:`TILE` size) where given
    (:meth:`ollie.tune.choice.Choices.fastest`, cold caches; ``out_shape``: the output's, for the
    residual input). The choice is remembered per ``key`` (the convolution's configuration):
    a later build for it builds only the chosen form; ``choices``: the table asked (default
    :func:`ollie.tune.choice.shared`)."""
    r, kp = parts[0][0].shape[-1], parts[0][0].shape[0]
    forms = {f"F({m}x{m})": (build, m, (("in", input_shape[1]), ("out", kp)))
             for m in tile_sizes(parts, out_size, dil)}
    if overlap is not None:
        forms[f"overlap F({TILE[r]}x{TILE[r]})"] = (
            overlap, TILE[r], (("lin_in", input_shape[1]), ("lin_out", kp)))
    key = ("Winograd tile", *key)
    choices = choices if choices is not None else shared()
    chosen = choices.get(key)
    # the transforms of the forms built, compiled side by side first
    codegen_precompile([(kind, m, r, ch)
                        for _, m, kinds in ([forms[chosen]] if chosen in forms
                                            else forms.values())
                        for kind, ch in kinds])
    if chosen in forms:
        make, m, _ = forms[chosen]
        conv = make(m)
        if conv is not None:
            return conv
    usable = {n: f for n, (make, m, _) in forms.items() if (f := make(m)) is not None}
    if len(usable) <= 1:
        return next(iter(usable.values()), None)

    def probe() -> tuple[torch.Tensor, ...]:
        x = torch.randn(input_shape)
        return (x, torch.randn(out_shape)) if residual else (x,)

    return choices.fastest(usable, tuple(input_shape), key, probe)


def _build(parts: list[Part], b: torch.Tensor | None, input_shape: tuple[int, ...],
           out_size: tuple[int, int], dil: int, s: int, activation: str | None,
           residual: bool, m: int | None = None) -> onednn.Conv | None:
    """The Winograd convolution ``F(m x m, r x r)`` (``m``: :data:`TILE` by default) over
    inputs of ``input_shape`` of ``parts``, each ``(w, padding, ph0)``: weight ``w``
    (``[P*K, C, r, r]``, the same ``r`` for all) computes output phases ``ph0 .. ph0 + P - 1``
    (phase ``ph``: outputs ``(s*u + ph // s, s*v + ph % s)``, ``out_size`` of them per phase)
    from the input padded by ``padding`` on the top and left; ``b``: the bias of the ``K``
    output channels."""
    r = parts[0][0].shape[-1]
    m = TILE[r] if m is None else m
    nb, c = input_shape[0], input_shape[1]
    kp = parts[0][0].shape[0]
    if any(w.shape[0] != kp for w, _, _ in parts):
        return None
    k = kp * len(parts) // (s * s)
    ho, wo = out_size
    if ho <= 0 or wo <= 0:
        return None
    th, tw = _tiles(ho, m, dil), _tiles(wo, m, dil)
    tiles = nb * th * tw
    relu = activation == "relu"
    post = onednn.POST_OPS[None if relu else activation]
    cb = channel_block(c)
    try:
        imod = input_module(m, r, c)
        omod = output_module(m, r, kp)
    except Exception as exc:  # numba's compile errors have many types
        log.warning("Winograd F(%d, %d) transforms did not compile: %s", m, r, exc)
        return None
    nn = (m + r - 1) ** 2
    groups = len(parts) * nn
    # tiles in blocks of at most ``block`` (V and M of a block stay in the caches); the
    # products of a block, nn per part, as one grouped 1x1 convolution: V [block, P, nn, cb]
    # (C channels and zeros up to the transforms' channel block cb) is a channels-last
    # [1, P*nn*cb, block, 1] image, its output [1, P*nn*K', block, 1] is M [block, P, nn, K']
    per_tile = 4 * groups * (cb + kp)
    block = tiles if tiles * per_tile <= WHOLE_BYTES else max(1, BLOCK_BYTES // per_tile)
    sizes = sorted({block, tiles % block} - {0})
    u = torch.zeros(groups, kp, cb)
    u[:, :, :c] = torch.stack([x for w, _, _ in parts for x in transformed_weights(w, m)])
    products = {n: blocked_gemm.grouped_products(u, n) for n in sizes}
    if any(p is None for p in products.values()):
        return None
    bias = (torch.zeros(k) if b is None else b).repeat(kp // k).numpy()
    pads = np.array([pad for _, pad, _ in parts], np.int64).reshape(len(parts), 2)
    ph0s = np.array([ph0 for _, _, ph0 in parts], np.int64)
    mode = int(relu) + 2 * int(residual)
    big_planes = c > 1 and input_shape[2] * input_shape[3] >= CHANNELS_LAST_PLANE
    # V (channels c.. stay zero) and the products
    workspace = thread_workspace(lambda: (torch.zeros(block, groups, cb),
                                          torch.empty(block, groups, kp)))

    def run(x: torch.Tensor, res: torch.Tensor | None) -> torch.Tensor:
        v, mw = workspace()
        xn = input_array(x, big_planes)
        y = torch.empty(nb, s * ho, s * wo, k)
        yn = y.numpy()
        rn = residual_array(res)
        for t0 in range(0, tiles, block):
            count = min(block, tiles - t0)
            chunk = max(1, count // 16)
            vb = v[:count]
            imod.transform_input(xn, vb.reshape(count, len(parts), nn * cb).numpy(), t0,
                                 count, pads, dil, th, tw, chunk)
            ms = products[count](vb, mw[:count]).reshape(count, len(parts), nn, kp)
            omod.transform_output(ms.numpy(), yn, bias, rn, mode, s, ph0s, ho, wo, t0, count,
                                  dil, th, tw, chunk)
        return post(y.permute(0, 3, 1, 2))

    return as_conv(run, residual)


__all__ = ["TILE", "applies", "applies_transposed", "matrices", "phase_parts",
           "transposed_as_phases", "winograd_conv2d", "winograd_conv_transpose2d"]
