"""Which implementations a program may run on: the vendor libraries only, or also Ollie's
hand-written kernel library.

The vendor libraries (:data:`VENDOR`) are what a framework user calls: oneDNN (packed
convolutions, the matmul primitive), MKL (``torch.matmul``), PyTorch's own operators, ONNX
Runtime, and cuDNN / cuBLAS on a GPU. The kernel library (:data:`HAND_WRITTEN`) is Ollie's own:
the Winograd convolutions (:mod:`ollie.kernels.winograd`), the register-blocked GEMM
(:mod:`ollie.kernels.blocked_gemm`), the band kernels of G2BMM / GBMM
(:mod:`ollie.kernels.band`) and NCHW max pooling (:mod:`ollie.kernels.pool`).

An :class:`Implementations` value says which of these may be chosen. Every chooser of an
implementation takes one (a convolution's, :func:`ollie.exec.conv.best_conv`; a matrix
product's, :func:`ollie.exec.linear.best_product`; a band product's,
:mod:`ollie.exec.dispatch`; an original operator's, :func:`ollie.exec.node.node_fn`), and
:class:`ollie.exec.executor.CompiledProgram` passes its own down, by default the settings'
(:attr:`ollie.settings.Settings.implementations`, which the program-level library variants
of :mod:`ollie.optimizer.libraries` read too). A
restricted policy is part of every cache key of a choice or a measurement (:attr:`key`,
:func:`ollie.tune.cache.device_key`), so a vendor-only run never reuses a choice made with the
kernel library, and the reverse. This module imports nothing of Ollie but its errors: the
settings, the choosers and the caches all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ollie.errors import ConfigError

ONEDNN = "oneDNN"
"""oneDNN: packed convolutions, the matmul primitive (and its packed weights)."""
MKL = "MKL"
"""MKL through ``torch.matmul``."""
TORCH = "torch"
"""PyTorch's own operators (``conv2d``, ``matmul``, ``bmm``, ``max_pool2d``, ...)."""
ONNX_RUNTIME = "ONNX Runtime"
"""ONNX Runtime sessions (single convolutions, regions of library operators)."""
CUDA_LIBRARIES = "cuDNN/cuBLAS"
"""cuDNN and cuBLAS, through PyTorch on a GPU."""

WINOGRAD = "Winograd"
"""Ollie's Winograd convolutions (:mod:`ollie.kernels.winograd`)."""
BLOCKED_GEMM = "blocked GEMM"
"""Ollie's register-blocked GEMM with packed panels (:mod:`ollie.kernels.blocked_gemm`)."""
BAND = "band"
"""Ollie's G2BMM / GBMM kernels (:mod:`ollie.kernels.band`)."""
POOL = "pool"
"""Ollie's NCHW max pooling (:mod:`ollie.kernels.pool`)."""

VENDOR = frozenset({ONEDNN, MKL, TORCH, ONNX_RUNTIME, CUDA_LIBRARIES})
"""The vendor libraries: always allowed (every operator has a vendor implementation)."""
HAND_WRITTEN = frozenset({WINOGRAD, BLOCKED_GEMM, BAND, POOL})
"""Ollie's kernel library."""
EVERYTHING = VENDOR | HAND_WRITTEN


@dataclass(frozen=True)
class Implementations:
    """The implementations a program may be run on: ``allowed``, a set of the names above
    holding every vendor library (:data:`VENDOR`) and any of the hand-written kernels
    (:data:`HAND_WRITTEN`). :class:`~ollie.errors.ConfigError` (a ValueError) for a set
    without the vendor libraries or with an unknown name."""

    allowed: frozenset[str] = EVERYTHING

    def __post_init__(self) -> None:
        allowed = frozenset(self.allowed)
        object.__setattr__(self, "allowed", allowed)
        unknown = allowed - EVERYTHING
        if unknown:
            raise ConfigError(f"unknown implementations {sorted(unknown)} (known: "
                             f"{sorted(EVERYTHING)})")
        if not allowed >= VENDOR:
            raise ConfigError(f"the vendor libraries {sorted(VENDOR - allowed)} cannot be "
                             "switched off: every operator needs one implementation")

    def allows(self, name: str) -> bool:
        """Whether implementation ``name`` may be chosen."""
        return name in self.allowed

    @property
    def kernel_library(self) -> bool:
        """Whether every hand-written kernel is allowed."""
        return self.allowed >= HAND_WRITTEN

    @property
    def key(self) -> str:
        """What a cache key adds for this policy: ``""`` with every implementation allowed
        (so keys made before the policy existed stay valid), else ``"impls:"`` and the
        hand-written kernels allowed (``"impls:vendor"`` for none)."""
        extra = sorted(self.allowed & HAND_WRITTEN)
        if len(extra) == len(HAND_WRITTEN):
            return ""
        return "impls:" + ("+".join(extra) if extra else "vendor")

    def describe(self) -> str:
        """In words, for notes and reports."""
        extra = sorted(self.allowed & HAND_WRITTEN)
        if len(extra) == len(HAND_WRITTEN):
            return "vendor libraries and Ollie's kernel library"
        return "vendor libraries only" if not extra else \
            f"vendor libraries and {', '.join(extra)}"


ALL = Implementations(EVERYTHING)
"""The vendor libraries and the whole kernel library (the default)."""
VENDOR_ONLY = Implementations(VENDOR)
"""The vendor libraries only: the kernel library switched off."""

__all__ = ["ALL", "BAND", "BLOCKED_GEMM", "CUDA_LIBRARIES", "EVERYTHING", "HAND_WRITTEN",
           "MKL", "ONEDNN", "ONNX_RUNTIME", "POOL", "TORCH", "VENDOR", "VENDOR_ONLY",
           "WINOGRAD", "Implementations"]
