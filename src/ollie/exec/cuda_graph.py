"""CUDA graphs: a function captured once and then replayed, so that a program of many small
kernels does not pay Python's and the driver's launch overhead for each of them on every call.

:class:`Graphed` wraps a zero-argument function that reads fixed ("static") tensors and
returns tensors. Its first call runs the function as it is: generated Triton kernels compile
and autotune there, and autotuning cannot be captured. Its second call warms the function up
on a side stream and captures it into a ``torch.cuda.CUDAGraph``; every later call replays
that graph and returns the same output tensors, overwritten. A function that cannot be captured
(one that synchronises with the host, e.g. an operator run on the CPU) keeps running as it
is, and the reason is logged once. Python's garbage collector is off during a capture: a
collected object that holds another CUDA graph would reset it mid-capture and invalidate the
capture. A capture that fails can leave PyTorch's default CUDA random generator marked as
capturing (its capture end raised before the generator's epilogue), after which every random
operator on the device raises ("Offset increment outside graph capture"): :func:`release_rng`
then gives the current device's generator a fresh state with the same seed and offset.

The settings' ``cuda_graphs`` (:mod:`ollie.settings`; ``OLLIE_CUDA_GRAPHS=0`` in the
environment) turns capture off everywhere (:func:`enabled`, from :mod:`ollie.tune.graphs`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

from ollie.tune.graphs import enabled

log = logging.getLogger(__name__)
T = TypeVar("T")


class Graphed(Generic[T]):
    """``fn`` run as it is on the first call, captured on the second, replayed afterwards."""

    def __init__(self, fn: Callable[[], T], name: str = "function") -> None:
        self.fn = fn
        self.name = name
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: T | None = None
        self.calls = 0
        self.failed: str | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> T:
        if self.graph is not None:
            self.graph.replay()
            return self.out  # type: ignore[return-value]
        self.calls += 1
        if self.failed is not None or self.calls == 1:
            return self.fn()
        collecting = gc.isenabled()
        gc.disable()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn()
        except Exception as exc:  # not capturable: run it as it is from now on
            self.failed = f"{type(exc).__name__}: {exc}"
            log.info("%s runs without a CUDA graph (capture failed: %s)", self.name,
                     self.failed)
            torch.cuda.synchronize()
            release_rng()
            return self.fn()
        finally:
            if collecting:
                gc.enable()
        self.graph, self.out = graph, out
        graph.replay()
        return out


def release_rng() -> bool:
    """Give the current CUDA device's default random generator a fresh state (same seed and
    offset) when a failed capture left it marked as capturing, which a one-number random draw
    shows (the draw advances the offset); True when it was. A graph captured earlier with
    random operators keeps the old state object (PyTorch's ``graphsafe_set_state``). Other
    devices are not touched (a draw would create a context on each)."""
    i = torch.cuda.current_device()
    gen = torch.cuda.default_generators[i]
    try:
        torch.empty(1, device=f"cuda:{i}").uniform_()
    except RuntimeError as exc:
        if "graph capture" not in str(exc) or not hasattr(gen, "graphsafe_set_state"):
            raise
        gen.graphsafe_set_state(gen.clone_state())
        log.info("cuda:%d's random generator released after a failed capture", i)
        return True
    return False


__all__ = ["Graphed", "enabled", "release_rng"]
