"""Search configuration: a frozen :class:`SearchConfig` passed explicitly (never global)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ollie.errors import check_settings
from ollie.rules.base import INTRA_RULES
from ollie.tune.cache import CostCache
from ollie.tune.roofline import Roofline, roofline_for

TARGETS = ("Matmul", "Conv", "G2BMM", "GBMM")
GUIDED_DEPTH = 6
"""Guided steps allowed per scope by default (:attr:`SearchConfig.guided_depth`)."""


@dataclass(frozen=True)
class SearchConfig:
    """Budgets and switches of the hybrid derivation search.

    ``max_depth``: explorative derivation steps (guided steps do not count);
    ``time_budget``: seconds, the last fifth kept for verifying candidates. It is checked
    between steps (one derived expression, one guided expression's instantiation, one
    candidate's verification), so a search ends at most about one step late
    (``stats["longest_step_seconds"]``); a search that found programs always verifies at
    least one that fits ``max_tensor_bytes``, even past its budget;
    ``max_states``: expanded states; ``fingerprint_pruning`` / ``guided``: ablation switches;
    ``normalize``: after each explorative step, inline scopes that only re-index another
    scope and tighten nested ranges (exact rewrites that never make a program worse; they
    are recorded in the derivation); ``guided_depth``: guided steps allowed per scope;
    ``keep``: completions kept per scope;
    ``verify_samples``: output positions compared per candidate (all when the output is
    smaller); ``rtol`` / ``atol``: verification tolerances; ``max_candidates``: reported;
    ``stop_when_found``: stop exploring once a candidate using one of these library kinds is
    found; ``target``: a predicate on candidates whose first hit is timed in the statistics
    (``first_found["target"]``), and ends the exploration with ``stop_at_target`` (both used
    by the search benchmark to time how long finding a program takes);
    ``max_tensor_bytes``: a candidate with a tensor larger than this (float32 bytes of a
    kernel's output) is dropped without running: verification runs its eOperators at full
    size through the float64 interpreter (None: :func:`default_max_tensor_bytes`);
    ``clock``: the time source of the budget and of every time in the statistics (seconds from
    an arbitrary origin, never decreasing; None: the settings' ``search_clock`` when the search
    starts, :mod:`ollie.settings`, by default :func:`time.perf_counter`). The search
    reads it only where it checks the budget or records a time, so a fake clock (a test's:
    one that advances a fixed amount per reading, or never) makes where the search stops
    depend on the code alone;
    ``roofline``: the machine the cost model ranks candidates for
    (:func:`ollie.tune.roofline.roofline_for`; None: the fixed
    :data:`~ollie.tune.roofline.DEFAULT_ROOFLINE`, so a search's order does not depend on the
    machine). Candidates are verified and reported in the order of
    :func:`ollie.search.derive.rank`: the cheapest of each library signature first.
    """

    max_depth: int = 7
    time_budget: float = 60.0
    max_states: int = 200_000
    fingerprint_pruning: bool = True
    guided: bool = True
    targets: tuple[str, ...] = TARGETS
    rules: tuple[str, ...] = INTRA_RULES
    guided_depth: int = GUIDED_DEPTH
    keep: int = 3
    verify_samples: int = 512
    rtol: float = 1e-3
    atol: float = 1e-4
    max_candidates: int = 32
    seed: int = 0
    normalize: bool = True
    stop_when_found: tuple[str, ...] = ()
    target: Callable[[object], bool] | None = None
    stop_at_target: bool = False
    max_tensor_bytes: int | None = None
    clock: Callable[[], float] | None = None
    roofline: Roofline | None = None

    def __post_init__(self) -> None:
        mtb = self.max_tensor_bytes
        check_settings("SearchConfig", {
            "max_depth": (self.max_depth, self.max_depth >= 0, ">= 0"),
            "time_budget": (self.time_budget, self.time_budget > 0, "> 0 seconds"),
            "max_states": (self.max_states, self.max_states >= 1, ">= 1"),
            "guided_depth": (self.guided_depth, self.guided_depth >= 0, ">= 0"),
            "keep": (self.keep, self.keep >= 1, ">= 1"),
            "verify_samples": (self.verify_samples, self.verify_samples >= 1, ">= 1"),
            "rtol": (self.rtol, self.rtol > 0, "> 0"),
            "atol": (self.atol, self.atol >= 0, ">= 0"),
            "max_candidates": (self.max_candidates, self.max_candidates >= 0, ">= 0"),
            "max_tensor_bytes": (mtb, mtb is None or mtb > 0, "None or > 0 bytes"),
        })


TENSOR_MEMORY_FRACTION = 1 / 16
"""Default :attr:`SearchConfig.max_tensor_bytes` as a fraction of physical memory: a candidate
with a larger tensor is dropped before it runs (verification runs its eOperators at full size
through the float64 interpreter). Some derived re-layouts of large convolutions at batch 16
hold intermediates of several GiB, and deriving them without a limit can end the process in
the kernel's OOM killer. Why this fraction (measured):
docs/design/014-expressions-and-search.md."""


def default_max_tensor_bytes() -> int:
    """:data:`TENSOR_MEMORY_FRACTION` of this machine's physical memory (8 GiB when unknown)."""
    import os

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 0
    return int((total if total > 0 else 128 << 30) * TENSOR_MEMORY_FRACTION)


def machine_roofline(device: str = "cpu", cache: CostCache | None = None) -> Roofline:
    """The roofline of ``device`` for :attr:`SearchConfig.roofline`
    (:func:`ollie.tune.roofline.roofline_for`), its matrix-product rate the best of
    ``torch.matmul`` and, on the CPU, the other implementations Ollie's Matmul kernels choose
    from (:func:`ollie.exec.linear.implementations`)."""
    import torch

    from ollie.exec import linear

    cpu = torch.device(device).type == "cpu"
    return roofline_for(device, cache, linear.implementations if cpu else None)
