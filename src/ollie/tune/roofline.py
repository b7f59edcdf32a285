"""The machine's roofline: peak matrix-product rate, copy bandwidth and per-kernel launch time.

:class:`Roofline` holds three numbers the search's cost model (:func:`ollie.search.instantiate.
kernel_cost`) uses to rank candidates before any is measured. :data:`DEFAULT_ROOFLINE` holds
fixed constants (a machine-independent order, what ``ollie derive`` uses unless asked);
:func:`roofline_for` measures this machine once per :func:`~ollie.tune.cache.device_key` and
keeps the result in the cost cache (keys ``roofline|<device key>|<field>``) and in the
process, so later optimisations read it back.

The probes (also used by the benchmarks): :func:`matmul_rate`, large square float32 products
(``torch.matmul`` and any other implementation a caller offers, e.g. oneDNN's, whichever is
fastest); :func:`copy_bandwidth`, a large tensor copy; :func:`launch_seconds`, a one-element
copy. Each keeps its best run: a busy machine only slows. Every time is read from ``clock``
(None: the settings' ``measure_clock``); a probe whose clock does not advance (a test's stopped
clock) yields :data:`DEFAULT_ROOFLINE`, which is then neither stored nor kept.
Why these probes and constants: docs/design/024-roofline-ranking.md.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ollie.settings import Clock, current
from ollie.tune.cache import CostCache, device_key
from ollie.tune.measure import measure


@dataclass(frozen=True)
class Roofline:
    """``peak_flops``: float32 FLOP/s of a large matrix product; ``bandwidth``: bytes/s of a
    large copy (read + write); ``launch_s``: seconds a kernel costs beyond its work."""

    peak_flops: float
    bandwidth: float
    launch_s: float

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which work is compute-bound on this machine."""
        return self.peak_flops / self.bandwidth

    def __post_init__(self) -> None:
        for name in ("peak_flops", "bandwidth"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"Roofline.{name} must be finite and > 0, got {v!r}")
        if not (math.isfinite(self.launch_s) and self.launch_s >= 0):
            raise ValueError(f"Roofline.launch_s must be finite and >= 0, got {self.launch_s!r}")


DEFAULT_ROOFLINE = Roofline(peak_flops=50e9, bandwidth=10e9, launch_s=5e-6)
"""The machine-independent model: a modest CPU (50 GFLOP/s, 10 GB/s, 5 µs per kernel)."""

Products = Callable[[torch.Tensor, torch.Tensor], Mapping[str, Callable[..., object]]]
"""Implementations of ``a @ b`` to probe besides ``torch.matmul`` (name -> function of a, b)."""

PROBE_MATMUL = 1024
"""Rows of the square product :func:`measure_roofline` times (2 GFLOP: milliseconds on a CPU)."""
PROBE_MBYTES = 128
"""Megabytes :func:`measure_roofline` copies: more than the last-level cache of most CPUs."""

FIELDS = ("peak_flops", "bandwidth", "launch_s")
_known: dict[tuple[str, object], Roofline] = {}
_lock = threading.Lock()


def matmul_rate(sizes: tuple[int, ...] = (1024, 2048), device: str = "cpu",
                products: Products | None = None, repeats: int = 5, runs: int = 3,
                clock: Clock | None = None) -> float:
    """FLOP/s of large square float32 matrix products, the best run of ``torch.matmul`` and
    of every implementation ``products(a, b)`` offers (0.0 when the clock does not advance)."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        c = torch.empty(n, n, device=device)
        impls: list[Callable[..., object]] = [lambda x, y, c=c: torch.matmul(x, y, out=c)]
        if products is not None:
            impls += list(products(a, b).values())
        for impl in impls:
            def fn(impl: Callable[..., object] = impl, a: torch.Tensor = a,
                   b: torch.Tensor = b) -> object:
                return impl(a, b)

            secs = min(measure(fn, device, repeats=repeats, clock=clock) for _ in range(runs))
            if secs > 0:
                best = max(best, 2 * n ** 3 / secs)
    return best


def copy_bandwidth(device: str = "cpu", mbytes: int = 256, repeats: int = 5, runs: int = 3,
                   clock: Clock | None = None) -> float:
    """Bytes per second of a large tensor copy (read + write), best of ``runs`` runs (0.0 when
    the clock does not advance)."""
    n = mbytes * (1 << 20) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    secs = min(measure(lambda: dst.copy_(src), device, repeats=repeats, clock=clock)
               for _ in range(runs))
    return 2 * 4 * n / secs if secs > 0 else 0.0


def launch_seconds(device: str = "cpu", clock: Clock | None = None) -> float:
    """Seconds of a one-element copy: what calling a kernel costs beyond its work."""
    src = torch.zeros(1, device=device)
    dst = torch.empty_like(src)
    return min(measure(lambda: dst.copy_(src), device, repeats=50, clock=clock)
               for _ in range(3))


def measure_roofline(device: str = "cpu", products: Products | None = None,
                     clock: Clock | None = None) -> Roofline:
    """This machine's roofline, probed now (about a second on a CPU), or
    :data:`DEFAULT_ROOFLINE` when ``clock`` does not advance."""
    launch = launch_seconds(device, clock)
    if not (math.isfinite(launch) and launch > 0):
        return DEFAULT_ROOFLINE
    peak = matmul_rate((PROBE_MATMUL,), device, products, repeats=3, runs=2, clock=clock)
    bw = copy_bandwidth(device, PROBE_MBYTES, repeats=3, runs=2, clock=clock)
    if not (math.isfinite(peak) and peak > 0 and math.isfinite(bw) and bw > 0):
        return DEFAULT_ROOFLINE
    return Roofline(peak, bw, launch)


def roofline_for(device: str = "cpu", cache: CostCache | None = None,
                 products: Products | None = None, clock: Clock | None = None) -> Roofline:
    """The roofline of ``device``: kept in this process (per device key and clock), else read
    from ``cache``, else measured (:func:`measure_roofline`) and stored there."""
    dev = device_key(device)
    clock = clock if clock is not None else current().measure_clock
    with _lock:
        known = _known.get((dev, clock))
        if known is not None:
            return known
        keys = [f"roofline|{dev}|{f}" for f in FIELDS]
        stored = [cache.get(k) for k in keys] if cache is not None else [None] * 3
        roof = None
        if all(v is not None for v in stored):
            try:
                roof = Roofline(*(float(v) for v in stored))  # type: ignore[arg-type]
            except ValueError:  # a malformed row: measure again
                roof = None
        if roof is None:
            roof = measure_roofline(device, products, clock)
            if roof is DEFAULT_ROOFLINE:
                return roof
            if cache is not None:
                for k, f in zip(keys, FIELDS, strict=True):
                    cache.put(k, getattr(roof, f))
        _known[(dev, clock)] = roof
        return roof


def forget() -> None:
    """Drop the rooflines kept in this process (the cost cache keeps its copy)."""
    with _lock:
        _known.clear()


__all__ = ["DEFAULT_ROOFLINE", "Roofline", "copy_bandwidth", "forget", "launch_seconds",
           "matmul_rate", "measure_roofline", "roofline_for"]
