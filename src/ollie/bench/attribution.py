"""Where the end-to-end speed comes from (``ollie bench models --attribution``).

Per model and batch, besides Ollie's program (derivation and the kernel library, (c)), three
more programs are optimised from the same persistent cache:

* (0) every subprogram's original operator on the vendor libraries only
  (``derivation=False, kernel_library=False``: oneDNN, MKL, PyTorch, ONNX Runtime);
* (a) derived programs on the vendor libraries (``kernel_library=False``);
* (b) the original operators with Ollie's kernel library (``derivation=False``: Winograd
  convolutions, the blocked GEMM, the band kernels, max pooling, :mod:`ollie.policy`).

All four are timed in the same interleaved run as PyTorch eager, torch.compile and ONNX
Runtime (:func:`ollie.bench.models.timed`); the row's ``attribution`` holds each program's
time and its speedup over (0), and the report an attribution table with geometric means
(:func:`ollie.bench.models_report.attribution_markdown`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import ollie
from ollie.errors import OllieError
from ollie.optimizer.libraries import rel_err

BASE = "(0)"
"""The label of the original operators on the vendor libraries."""
OLLIE = "(c)"
"""The label of Ollie's program (derivation and the kernel library): the benchmark's
``"Ollie"``."""
PROGRAMS: dict[str, dict[str, bool]] = {
    BASE: {"derivation": False, "kernel_library": False},
    "(a)": {"derivation": True, "kernel_library": False},
    "(b)": {"derivation": False, "kernel_library": True},
}
"""The extra programs and the :class:`~ollie.optimizer.config.OptimizeConfig` switches each is
optimised with; (c) is Ollie's program with both on."""
LABELS = {BASE: "originals, vendor libraries", "(a)": "derived, vendor libraries",
          "(b)": "originals, kernel library", OLLIE: "derived, kernel library"}
"""What each label stands for."""
RTOL = 1e-3
"""Largest relative error of a program accepted as correct."""


def programs(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], device: str,
             budget: float, ref: torch.Tensor, row: dict,
             log: Callable[[str], object] = print,
             total_budget: float | str | None = "auto") -> dict[str, Callable[[], object]]:
    """The programs of :data:`PROGRAMS` for ``module`` on ``inputs``, each optimised with a
    search budget of ``budget`` seconds per distinct subprogram and checked against ``ref``
    (the module's output) and, with ``total_budget``, at most that many seconds per
    optimisation of the model; returns a call of each by label. ``row`` gets, per label, the
    optimisation seconds (``attribution_optimize_s``) and the relative error (``errors``), and
    a note for a program that is wrong or failed (left out of the timing)."""
    fns: dict[str, Callable[[], object]] = {}
    seconds = row.setdefault("attribution_optimize_s", {})
    for label, flags in PROGRAMS.items():
        t0 = time.perf_counter()
        try:
            prog = ollie.optimize(module, inputs, device, time_budget=budget,
                                  total_budget=total_budget, **flags)
        except OllieError as e:
            row["notes"].append(f"{label} ({LABELS[label]}) failed: {e}")
            continue
        seconds[label] = time.perf_counter() - t0
        with torch.inference_mode():
            err = row["errors"][label] = rel_err(prog(*inputs).cpu(), ref)
        if err >= RTOL:
            row["notes"].append(f"{label} ({LABELS[label]}) WRONG (relative error {err:.1e}); "
                                "not timed")
            continue
        log(f"  {label} {LABELS[label]}: optimised in {seconds[label]:.1f} s, "
            f"rel err {err:.1e}")
        fns[label] = lambda prog=prog: prog(*inputs)
    return fns


def attribution(times_ms: dict[str, float]) -> dict:
    """From the times of one row (``"Ollie"`` is (c)): each program's time and its speedup
    over (0) (``speedup``), and (c)'s speedup over the best peer; {} without a time of
    (0)."""
    ms = {label: times_ms[key] for label, key in ((BASE, BASE), ("(a)", "(a)"),
                                                   ("(b)", "(b)"), (OLLIE, "Ollie"))
          if key in times_ms}
    if BASE not in ms:
        return {}
    return {"ms": ms, "speedup": {k: ms[BASE] / v for k, v in ms.items() if k != BASE}}


__all__ = ["BASE", "LABELS", "OLLIE", "PROGRAMS", "RTOL", "attribution", "programs"]
