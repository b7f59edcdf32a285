"""Timing on the target device: median of repeated runs after warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(fn: Callable[[], object], device: str = "cpu", warmup: int = 2,
            repeats: int = 7, min_seconds: float = 0.0, max_seconds: float = 5.0) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs. Runs at least
    ``min_seconds`` in total (more repeats for very fast functions) and at most about
    ``max_seconds`` (fewer repeats for slow ones)."""
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(warmup):
            fn()
        _sync(device)
        first = (time.perf_counter() - t0) / max(warmup, 1)
        n = repeats
        if first > 0 and first * repeats > max_seconds:
            n = max(3, int(max_seconds / first))
        times = []
        start = time.perf_counter()
        while len(times) < n or time.perf_counter() - start < min_seconds:
            t = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t)
            if len(times) >= 1000:
                break
    return statistics.median(times)
