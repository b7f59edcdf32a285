"""Runtime glue shared by the Winograd convolutions (:mod:`ollie.kernels.winograd`, per
output phase, and :mod:`ollie.kernels.winograd_overlap`, overlap-add): the input as a
channels-last array, per-thread workspaces, the convolution's call signature, the direct
convolution on inputs with NaN or infinities."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np
import torch

from ollie.libs import onednn

CHANNELS_LAST_PLANE = 1 << 14
"""An NCHW input whose planes hold this many elements or more is copied to channels-last
before the input transform (:func:`input_array`); smaller ones are read in place. The input
transform reads a patch's channels one plane apart, and across planes of 64 KiB or more every
read is another page; below, the copy costs more than it saves. Why this threshold
(measured): docs/design/004-winograd-convolutions.md."""


def input_array(x: torch.Tensor, big_planes: bool) -> np.ndarray:
    """``x`` (``[N, C, H, W]``) as a ``[N, H, W, C]`` float32 array: a view of a channels-last
    or contiguous ``x``, after a copy to channels-last where its planes are large
    (``big_planes``: :data:`CHANNELS_LAST_PLANE`) or it is neither."""
    x = x.detach()
    if not onednn.is_channels_last(x) and (big_planes or not x.is_contiguous()):
        x = x.contiguous(memory_format=torch.channels_last)
    return x.permute(0, 2, 3, 1).numpy()


NO_RESIDUAL = np.zeros((1, 1, 1, 1), np.float32)
"""The residual argument of an output transform that adds none."""


def residual_array(res: torch.Tensor | None) -> np.ndarray:
    """The residual ``[N, C, H, W]`` as the ``[N, H, W, C]`` array an output transform reads
    (:data:`NO_RESIDUAL` for none)."""
    return NO_RESIDUAL if res is None else res.detach().permute(0, 2, 3, 1).numpy()


def thread_workspace(make: Callable[[], tuple[torch.Tensor, ...]]
                     ) -> Callable[[], tuple[torch.Tensor, ...]]:
    """A function returning this thread's buffers, built by ``make`` on its first call in
    the thread (a convolution may run in several threads at once)."""
    local = threading.local()

    def workspace() -> tuple[torch.Tensor, ...]:
        bufs = getattr(local, "bufs", None)
        if bufs is None:
            bufs = local.bufs = make()
        return bufs

    return workspace


def as_conv(run: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
            residual: bool) -> onednn.Conv:
    """``run(x, r)`` as a convolution's callable: ``(x, r)`` with ``residual``, else
    ``(x)``."""
    if residual:
        def conv(x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            return run(x, res)
    else:
        def conv(x: torch.Tensor) -> torch.Tensor:
            return run(x, None)
    return conv


def exact_if_nonfinite(conv: onednn.Conv, exact: onednn.Conv, residual: bool) -> onednn.Conv:
    """``conv`` (a Winograd convolution) on a finite input, ``exact`` (the direct convolution,
    same signature) on an input holding a NaN or an infinity. A Winograd transform mixes every
    element of a tile, so one NaN or infinity would make the whole output tile NaN, where the
    direct convolution (and the model) puts NaN or an infinity only in the outputs whose
    window reads it. The test is one sum over the input: finite for every finite input whose
    sum does not overflow (one that does also takes the exact path)."""
    if residual:
        def guarded_residual(x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
            return conv(x, res) if math.isfinite(x.sum()) else exact(x, res)
        return guarded_residual

    def guarded(x: torch.Tensor) -> torch.Tensor:
        return conv(x) if math.isfinite(x.sum()) else exact(x)
    return guarded


__all__ = ["CHANNELS_LAST_PLANE", "NO_RESIDUAL", "as_conv", "exact_if_nonfinite", "input_array",
           "residual_array", "thread_workspace"]
