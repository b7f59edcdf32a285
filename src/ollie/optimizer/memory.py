"""A cap on the process's address space while one subprogram is searched and measured, so that
a candidate with a huge intermediate fails its allocation instead of the whole process being
killed (Linux; a no-op elsewhere)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _meminfo(path: str, field: str) -> int:
    """A ``kB`` field of a /proc file, in bytes."""
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise ValueError(field)


@contextmanager
def memory_guard(fraction: float = 0.4) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``fraction`` of the memory
    available now (Linux), for the search and selection of one subprogram. Some candidates
    hold intermediates far larger than the operator (a summation split of a batch-16
    512-channel convolution keeps a [16, 512, 14, 14, 512, 3] tensor: 10 GB, 18 GB as the
    interpreter's float64); under the cap their allocation raises, and verification drops the
    candidate, instead of the kernel's OOM killer ending the whole process. No cap once CUDA is
    initialised: its driver maps address space of its own, beyond any such cap."""
    if torch.cuda.is_initialized():
        yield
        return
    try:
        import resource

        cap = _meminfo("/proc/self/status", "VmSize") + max(
            int(fraction * _meminfo("/proc/meminfo", "MemAvailable")), 1 << 30)
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield  # already capped at least as tightly
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


__all__ = ["memory_guard"]
