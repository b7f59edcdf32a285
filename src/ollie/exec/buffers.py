"""Kernel output buffers reused across calls of a program (CPU), once nothing holds them.

A large fresh CPU allocation is mapped and page-faulted in on every call (glibc returns big
blocks to the system when they are freed), which can cost more than the kernel writing it
(measured: docs/design/003-library-kernels-on-the-cpu.md).
:class:`BufferCache` keeps the numpy arrays behind the tensors it hands out; a tensor made by
``torch.from_numpy`` (and every view of it) holds a reference to its array, so an array whose
only references are the cache's own is free: the caller has dropped every tensor that used it,
and it is handed out again. Results a caller keeps are never overwritten; at most
``per_shape`` arrays per shape are tracked (past that, allocations are
plain), so a caller keeping every result does not grow the cache without bound.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

_OWN_REFS = 3  # the cache's list, the loop variable, getrefcount's argument


class BufferCache:
    """``get(shape)``: a float32 CPU tensor of ``shape``, reusing a released one if any."""

    def __init__(self, per_shape: int = 4) -> None:
        self.per_shape = per_shape
        self.arrays: dict[tuple[int, ...], list[np.ndarray]] = {}
        self.reused = self.allocated = 0

    def get(self, shape: tuple[int, ...]) -> torch.Tensor:
        arrays = self.arrays.setdefault(tuple(shape), [])
        for a in arrays:
            if sys.getrefcount(a) <= _OWN_REFS:
                self.reused += 1
                return torch.from_numpy(a)
        self.allocated += 1
        a = np.empty(shape, dtype=np.float32)
        if len(arrays) < self.per_shape:
            arrays.append(a)
        return torch.from_numpy(a)
