"""Grouped matrix products with few rows on the CPU, by a register-blocked micro-kernel: the
products of the Winograd convolutions (:mod:`ollie.kernels.winograd`), ``M[t, g, :] =
V[t, g, :] @ U[g]`` for every group ``g`` (a transformed position of an output phase), where
the rows ``t`` are the tiles, as few as the batch (a 2x2 or 4x4 output per phase, InfoGAN's
and DCGAN's transposed convolutions at b16: 16 rows).

The micro-kernel is written as LLVM vector IR inside numba (:func:`numba.extending.intrinsic`):
``R`` rows by ``NB = 16`` output channels (two 8-lane registers per row) accumulate in
registers over the whole channel sum, each step loading the weights' 16 values once and
broadcasting each row's input value once, with a software prefetch of the weights
:data:`PREFETCH_BYTES` ahead. The weights are packed once into panels ``[g, K/NB, C, NB]``
(one 64-byte line per channel), read in order; a panel is read from memory by its first
row block and from the caches by the others. Rows go in blocks of 6, then 4, 2, 1.

Why: oneDNN (and OpenBLAS, and numba's own loops) run such products far below the FMA rate,
because with 16 rows each weight value takes part in 16 multiply-adds only and the weights
(up to 16 MB per call) come from memory; the measurements are in
docs/design/006-blocked-gemm-micro-kernel.md. Which of the two runs a convolution's products
is measured (:func:`grouped_products`, cold caches, like every library choice); a matrix
product with a constant right operand is offered it too (:mod:`ollie.exec.linear`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ollie.tune.choice import Choices, shared

log = logging.getLogger(__name__)
Products = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

NB = 16
"""Output channels per micro-kernel call: two AVX2 registers per row."""

ROW_BLOCKS = (6, 4, 2, 1)
"""Rows per micro-kernel call, largest first: 6 rows x 2 registers = 12 accumulators, the
most that leave AVX2's 16 registers room for the weights and a broadcast input."""

PREFETCH_BYTES = 3072
"""How far ahead of the weights being read the kernel prefetches: 48 rows of a panel (the
fastest of the distances measured: docs/design/006-blocked-gemm-micro-kernel.md)."""

VECTOR = 8


def _micro_kernel(rows: int):  # type: ignore[no-untyped-def]
    """The numba intrinsic ``mk(V, U, O, iv, iu, io, C, sv, so)``: for ``r < rows``,
    ``O[io + r*so + j] = sum_c V[iv + r*sv + c] * U[iu + c*NB + j]`` (``j < NB``; flat
    float32 arrays)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    nv = NB // VECTOR

    @intrinsic
    def mk(typingctx, v, u, o, iv, iu, io, n, sv, so):  # type: ignore[no-untyped-def]
        sig = types.void(v, u, o, types.intp, types.intp, types.intp, types.intp, types.intp,
                         types.intp)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            av, au, ao, iv_, iu_, io_, n_, sv_, so_ = args
            f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
            vt = ir.VectorType(f32, VECTOR)
            i8p = ir.IntType(8).as_pointer()
            pv, pu, po = (context.make_array(t)(context, builder, a).data
                          for t, a in zip(signature.args[:3], (av, au, ao), strict=True))
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vt, [vt, vt, vt]), "llvm.fma.v8f32")
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0i8")
            zero = ir.Constant(vt, [0.0] * VECTOR)
            lanes0 = ir.Constant(ir.VectorType(i32, VECTOR), [0] * VECTOR)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)]
                    for _ in range(rows)]
            ahead = ir.Constant(i64, PREFETCH_BYTES // 4)
            with cgutils.for_range(builder, n_) as loop:
                c = loop.index
                base = builder.add(iu_, builder.mul(c, ir.Constant(i64, NB)))
                builder.call(prefetch, [builder.bitcast(builder.gep(pu, [builder.add(base, ahead)]),
                                                        i8p),
                                        ir.Constant(i32, 0), ir.Constant(i32, 3),
                                        ir.Constant(i32, 1)])
                ws = [builder.load(builder.bitcast(
                    builder.gep(pu, [builder.add(base, ir.Constant(i64, j * VECTOR))]),
                    vt.as_pointer()), align=4) for j in range(nv)]
                for r in range(rows):
                    at = builder.add(builder.add(iv_, builder.mul(sv_, ir.Constant(i64, r))), c)
                    one = builder.insert_element(ir.Constant(vt, ir.Undefined),
                                                 builder.load(builder.gep(pv, [at])),
                                                 ir.Constant(i32, 0))
                    x = builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined), lanes0)
                    for j in range(nv):
                        builder.store(builder.call(fma, [x, ws[j], builder.load(accs[r][j])]),
                                      accs[r][j])
            for r in range(rows):
                row = builder.add(io_, builder.mul(so_, ir.Constant(i64, r)))
                for j in range(nv):
                    at = builder.gep(po, [builder.add(row, ir.Constant(i64, j * VECTOR))])
                    builder.store(builder.load(accs[r][j]), builder.bitcast(at, vt.as_pointer()),
                                  align=4)
            return context.get_dummy_value()

        return sig, codegen

    return mk


# the parallel function's micro-kernels and numba's prange, set by _build_kernel
_prange: Any = None
_mk6: Any = None
_mk4: Any = None
_mk2: Any = None
_mk1: Any = None
_KERNEL: list[Callable[..., None]] = []
_LOCK = threading.Lock()


def _kernel() -> Callable[..., None]:
    """The parallel numba function ``(V, U, O, T, G, C, KB)`` over flat arrays: ``V``
    ``[T, G, C]``, ``U`` ``[G, KB, C, NB]`` (packed panels), ``O`` ``[T, G, KB*NB]``; one job
    per (group, panel), its rows in blocks of :data:`ROW_BLOCKS`. Built on first use, once
    per process, under a lock; numba's on-disk cache keeps the machine code between
    processes. The function reads its micro-kernels as globals of this module, not as
    closure variables: numba keys a cached closure by its variables' serialized form, which
    for an intrinsic differs in every process (each process compiled the kernel again and
    added one more entry to the cache)."""
    with _LOCK:
        if not _KERNEL:
            _KERNEL.append(_build_kernel())
    return _KERNEL[0]


def _build_kernel() -> Callable[..., None]:
    """The function :func:`_kernel` returns, built."""
    from numba import njit, prange

    module = globals()
    module.update(_prange=prange, **{f"_mk{r}": _micro_kernel(r) for r in ROW_BLOCKS})

    @njit(parallel=True, cache=True)
    def products(v, u, o, t, g, c, kb):  # type: ignore[no-untyped-def]
        k = kb * NB
        for job in _prange(g * kb):
            gi = job // kb
            pi = job - gi * kb
            iu = (gi * kb + pi) * c * NB
            r0 = 0
            while r0 + 6 <= t:
                _mk6(v, u, o, (r0 * g + gi) * c, iu, (r0 * g + gi) * k + pi * NB,
                     c, g * c, g * k)
                r0 += 6
            if r0 + 4 <= t:
                _mk4(v, u, o, (r0 * g + gi) * c, iu, (r0 * g + gi) * k + pi * NB,
                     c, g * c, g * k)
                r0 += 4
            if r0 + 2 <= t:
                _mk2(v, u, o, (r0 * g + gi) * c, iu, (r0 * g + gi) * k + pi * NB,
                     c, g * c, g * k)
                r0 += 2
            if r0 < t:
                _mk1(v, u, o, (r0 * g + gi) * c, iu, (r0 * g + gi) * k + pi * NB,
                     c, g * c, g * k)

    return products


def applies(out_channels: int) -> bool:
    """Whether products with ``out_channels`` per group run here (a multiple of :data:`NB`)."""
    return out_channels > 0 and out_channels % NB == 0


def pack(u: torch.Tensor) -> np.ndarray:
    """``U`` ``[G, K, C]`` (each group's weight, output channels first) as the flat panels
    ``[G, K/NB, C, NB]`` the kernel reads."""
    g, k, c = u.shape
    return np.ascontiguousarray(
        u.detach().float().reshape(g, k // NB, NB, c).permute(0, 1, 3, 2).numpy()).reshape(-1)


def blocked_products(u: torch.Tensor) -> Products:
    """``(V, out) -> out`` with ``out[t, g, :] = V[t, g, :] @ U[g]^T`` for ``U`` ``[G, K, C]``
    and contiguous float32 ``V`` ``[T, G, C]``, ``out`` ``[T, G, K]`` (:func:`applies` to
    ``K``)."""
    g, k, c = u.shape
    if not applies(k):
        raise ValueError(f"blocked products need a multiple of {NB} output channels, got {k}")
    panels, run = pack(u), _kernel()

    def products(v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if v.shape[1:] != (g, c) or out.shape != (v.shape[0], g, k) \
                or not (v.is_contiguous() and out.is_contiguous()):
            raise ValueError(f"blocked products of {g} x [{c} -> {k}]: got V {list(v.shape)}, "
                             f"out {list(out.shape)} (both contiguous)")
        run(v.numpy().reshape(-1), panels, out.numpy().reshape(-1), v.shape[0], g, c, k // NB)
        return out

    return products


def grouped_products(u: torch.Tensor, rows: int,
                     choices: Choices | None = None) -> Products | None:
    """``(V, out) -> M`` with ``M[t, g] = V[t, g] @ U[g]^T`` for the weights ``U``
    ``[G, K, C]`` and ``V`` ``[rows, G, C]`` (``out``: a ``[rows, G, K]`` buffer it may fill):
    the faster, measured with cold caches and remembered per shape, of oneDNN's grouped 1x1
    convolution with ``U`` packed (``V`` a channels-last ``[1, G*C, rows, 1]`` image) and
    :func:`blocked_products` (where it :func:`applies`); ``None`` where neither builds.
    ``choices``: the table asked (default :func:`ollie.tune.choice.shared`)."""
    from ollie.libs import onednn

    groups, k, c = u.shape

    def library() -> Products | None:
        conv = onednn.packed_conv2d(u.reshape(groups * k, c, 1, 1), (1, groups * c, rows, 1),
                                    (1, 1), (0, 0), (1, 1), None, groups)
        if conv is None:
            return None

        def run(v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            image = conv(v.reshape(1, rows, 1, groups * c).permute(0, 3, 1, 2))
            return image.permute(0, 2, 3, 1).reshape(rows, groups, k)
        return run

    def blocked() -> Products | None:
        if not applies(k):
            return None
        try:
            return blocked_products(u)
        except Exception as exc:  # numba's compile errors have many types
            log.warning("blocked Winograd products did not build: %s", exc)
            return None

    builders = {"oneDNN": library, "blocked": blocked}
    try:
        table = choices if choices is not None else shared()
        return table.fastest_of(builders, (rows, groups, c),
                                ("Winograd products", *u.shape, rows),
                                lambda: (torch.randn(rows, groups, c),
                                         torch.empty(rows, groups, k)))
    except ValueError:   # neither builds
        return None


__all__ = ["NB", "applies", "blocked_products", "grouped_products", "pack"]
