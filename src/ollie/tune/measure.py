"""Timing on the target device: medians of repeated runs after warm-up (:func:`measure`),
interleaved comparisons of several functions (:func:`measure_rounds`: every sample, aligned by
round; :func:`measure_alternating`: their medians), the collector
paused while timing (:func:`gc_paused`) and cold-cache timing (:func:`evict_caches`). Every
time is read from an injectable clock (:data:`Clock`: the ``clock=`` argument, else the
current settings' ``measure_clock``, :mod:`ollie.settings`), and every settle waits through
the settings' ``sleep``. Why this protocol, with the measurements behind its constants:
docs/design/002-measurement-protocol.md."""

from __future__ import annotations

import gc
import math
import random
import statistics
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from ollie.settings import Clock, current


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(fn: Callable[[], object], device: str = "cpu", warmup: int = 2,
            repeats: int = 7, min_seconds: float = 0.0, max_seconds: float = 5.0,
            clock: Clock | None = None) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs. Runs at least
    ``min_seconds`` in total (more repeats for very fast functions, at most 1000 runs) and at
    most about ``max_seconds`` (fewer repeats for slow ones, at least 3). Every time, the
    samples and both limits, is read from ``clock`` (None: the current settings')."""
    clock = clock if clock is not None else current().measure_clock
    with torch.inference_mode():
        t0 = clock()
        for _ in range(warmup):
            fn()
        _sync(device)
        first = (clock() - t0) / max(warmup, 1)
        n = repeats
        if first > 0 and first * repeats > max_seconds:
            n = max(3, int(max_seconds / first))
        times: list[float] = []
        start = clock()
        while len(times) < n or clock() - start < min_seconds:
            t = clock()
            fn()
            _sync(device)
            times.append(clock() - t)
            if len(times) >= 1000:
                break
    return statistics.median(times)


SETTLE_SECONDS = 0.2
"""A ``settle`` long enough for ONNX Runtime's spinning threads to go idle (see
:func:`measure_alternating`)."""

SETTLED_LEAD_SECONDS = 0.05
"""The ``lead_seconds`` that go with :data:`SETTLE_SECONDS`: after a settle, one lead call is
not enough for a program of several libraries' kernels to run at its steady-state speed
again, while a spinning ONNX Runtime session recovers within it
(docs/design/002-measurement-protocol.md)."""


def settled_lead(settle: float) -> float:
    """The ``lead_seconds`` that go with a ``settle``: :data:`SETTLED_LEAD_SECONDS` after one,
    none without (the lead calls then only as ``lead_calls`` asks)."""
    return SETTLED_LEAD_SECONDS if settle > 0 else 0.0


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as ``timeit`` does), on again after
    if it was on. In an optimisation's large heap a collection triggered by a program's own
    allocations takes a measurable share of a sample (docs/design/002-measurement-protocol.md).
    Does nothing when the current settings' ``pause_gc_while_timing`` is off."""
    if not current().pause_gc_while_timing:
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class Timings:
    """Every sample of an interleaved measurement (:func:`measure_rounds`), in seconds per call.

    ``samples[name][j]`` is the sample of function ``name`` in round ``j``: the lists of the
    functions timed in rounds have one sample per round, aligned, so that ``samples[a][j] /
    samples[b][j]`` compares two functions under the same load. A function in ``dropped``
    was not timed in rounds (``hopeless``); its list holds the one call timed after its
    warm-up."""

    samples: dict[str, list[float]]
    dropped: frozenset[str] = field(default_factory=frozenset)

    def median(self, name: str) -> float:
        """The median of ``name``'s samples."""
        return statistics.median(self.samples[name])

    def medians(self) -> dict[str, float]:
        """The median of each function's samples, by name."""
        return {name: self.median(name) for name in self.samples}


def measure_rounds(fns: dict[str, Callable[[], object]], device: str = "cpu",
                   rounds: int = 15, warmup: int = 2, max_seconds: float = 30.0,
                   min_sample: float = 0.0, shuffle: bool = True, seed: int = 0,
                   prepare: Callable[[], object] | None = None,
                   lead_calls: int = 0, hopeless: float | None = None,
                   settle: float = 0.0, lead_seconds: float = 0.0,
                   settle_around: Collection[str] | None = None,
                   clock: Clock | None = None) -> Timings:
    """Every sample of each function (:class:`Timings`), timed in interleaved rounds (a, b, c,
    a, b, c, ...) so that a noisy machine affects all of them alike; ratios of the samples of
    one round are then meaningful (:func:`ollie.tune.decide.faster` pairs them).

    ``shuffle``: each round runs the functions in a fresh (seeded) random order, so that none
    always follows the same one (a runtime whose threads keep spinning after it returns slows
    whatever runs next).

    A sample of a function faster than ``min_sample`` seconds times that many back-to-back
    calls (the count estimated from the warm-up; one call without a warm-up) and divides, so
    that timer and scheduling jitter do not dominate microsecond operators. At least 3 rounds
    run; later rounds stop once ``max_seconds`` have passed.

    ``prepare``: called before every sample, outside the timed region (e.g.
    :func:`evict_caches`, for cold-cache times); each sample is then one call.

    ``lead_calls``: untimed calls of a function right before each of its samples, so that a
    sample measures the function in the state its own previous call leaves (its thread pool
    awake, its buffers cached: a model served in a loop) rather than the state the previous
    function left (docs/design/002-measurement-protocol.md).

    ``hopeless``: a function whose call right after its warm-up took more than this many times
    the fastest one's is not timed in rounds; that call's time is returned (a selection among
    candidates loses nothing, and a very slow candidate costs no rounds next to fast ones).

    ``settle``: seconds slept before each sample (before its lead calls), so that threads the
    previous function left busy-waiting are idle again (ONNX Runtime's default thread pool
    spins after a run and slows whatever runs next: docs/design/002-measurement-protocol.md).

    ``lead_seconds``: after a settle, the lead calls go on for at least this long (their count
    estimated from the warm-up), so that the sample starts from a system running steadily
    again (cores back at speed, its threads awake), as in a serving loop.

    ``settle_around``: settle only before a sample of one of these functions (the ones whose
    threads spin) and before a sample that follows one of them; None: before every sample.
    Both sides matter: a spinning function slows the next one, and its own sample right after
    a torch function (OpenMP threads still busy-waiting, its own threads asleep) is slowed
    too (settling only after it misjudged a region: docs/design/002-measurement-protocol.md).

    ``clock``: the time source of every time here (warm-up, samples, ``max_seconds``; None:
    the current settings'); the settles wait through the current settings' ``sleep``
    (:func:`time.sleep` by default) whatever the clock."""
    clock = clock if clock is not None else current().measure_clock
    sleep = current().sleep
    with torch.inference_mode(), gc_paused():
        inner: dict[str, int] = {}
        lead: dict[str, int] = {}
        warm: dict[str, float] = {}
        for name, fn in fns.items():
            t = clock()
            for _ in range(warmup):
                fn()
            _sync(device)
            per = (clock() - t) / warmup if warmup > 0 else 0.0  # 0: not estimated
            if hopeless is not None and warmup > 0:
                # the first calls may build things (a library's choice, a compiled kernel):
                # the last call alone says how fast the function is
                t = clock()
                fn()
                _sync(device)
                warm[name] = clock() - t
            inner[name] = max(1, min(1000, int(min_sample / per))) if per > 0 and \
                prepare is None else 1
            lead[name] = max(lead_calls, min(10000, math.ceil(lead_seconds / per))) \
                if per > 0 and lead_seconds > 0 else lead_calls
        times: dict[str, list[float]] = {name: [] for name in fns}
        order = list(fns)
        if warm:
            assert hopeless is not None  # (only then are the warm calls timed)
            fastest = min(warm.values())
            for name, per in warm.items():
                if per > hopeless * fastest:
                    times[name].append(per)
                    order.remove(name)
        rng = random.Random(seed)
        start = clock()
        previous = list(fns)[-1] if fns else None  # the last one warmed up
        for r in range(rounds):
            if shuffle:
                rng.shuffle(order)
            for name in order:
                fn, n = fns[name], inner[name]
                if prepare is not None:
                    prepare()
                settled = settle > 0 and (settle_around is None or previous in settle_around
                                                or name in settle_around)
                if settled:
                    sleep(settle)
                for _ in range(lead[name] if settled else lead_calls):
                    fn()
                previous = name
                _sync(device)
                t = clock()
                for _ in range(n):
                    fn()
                _sync(device)
                times[name].append((clock() - t) / n)
            if r >= 2 and clock() - start > max_seconds:
                break
    return Timings(times, frozenset(fns) - frozenset(order))


def measure_alternating(fns: dict[str, Callable[[], object]], device: str = "cpu",
                        rounds: int = 15, warmup: int = 2, max_seconds: float = 30.0,
                        min_sample: float = 0.0, shuffle: bool = True, seed: int = 0,
                        prepare: Callable[[], object] | None = None,
                        lead_calls: int = 0, hopeless: float | None = None,
                        settle: float = 0.0, lead_seconds: float = 0.0,
                        settle_around: Collection[str] | None = None,
                        clock: Clock | None = None) -> dict[str, float]:
    """Median seconds of each function, timed as :func:`measure_rounds` times them (the same
    arguments)."""
    return measure_rounds(fns, device, rounds, warmup, max_seconds, min_sample, shuffle, seed,
                          prepare, lead_calls, hopeless, settle, lead_seconds, settle_around,
                          clock).medians()


def llc_bytes() -> int:
    """The largest CPU cache's size (Linux sysfs), 32 MiB when unknown."""
    from pathlib import Path

    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * mult)
    return max(sizes, default=32 << 20)


EVICT_MAX_BYTES = 64 << 20
"""The most :func:`evict_caches` writes. Some virtual machines report their host's whole last
level cache (hundreds of MiB), and writing 1.5x of that before every timed call would cost
more than most of the calls timed (docs/design/002-measurement-protocol.md)."""

_SCRATCH: list[np.ndarray] = []


def evict_caches() -> None:
    """Write a scratch buffer of 1.5x the largest CPU cache (at most :data:`EVICT_MAX_BYTES`),
    so that what a function reads next comes from memory, as a kernel's weights do in a
    program whose weights exceed the cache (every kernel runs once between two uses of its
    weights)."""
    if not _SCRATCH:
        nbytes = min(int(1.5 * llc_bytes()), EVICT_MAX_BYTES)
        _SCRATCH.append(np.empty(nbytes // 4, dtype=np.float32))
    _SCRATCH[0].fill(1.0)  # numpy: no inference-mode restrictions


__all__ = ["EVICT_MAX_BYTES", "SETTLED_LEAD_SECONDS", "SETTLE_SECONDS", "Clock", "Timings",
           "evict_caches", "gc_paused", "llc_bytes", "measure", "measure_alternating",
           "measure_rounds", "settled_lead"]
