"""Measured selection: turn verified candidates into post-processed programs, check them again,
time them on the device (with the persistent cost cache), keep the fastest.

The original operator is always measured too (``baseline``), and a candidate is chosen only
when it is faster, so a subprogram is never made slower.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from ollie.ir import Expr
from ollie.program.postprocess import postprocess
from ollie.program.program import Program
from ollie.runtime.executor import CompiledProgram
from ollie.search.candidate import Candidate, program_key, reference_sample
from ollie.tune.cache import CostCache, device_key
from ollie.tune.measure import measure

log = logging.getLogger(__name__)


@dataclass
class Measured:
    """One measured program (or the baseline, ``program is None``)."""

    label: str
    seconds: float
    program: Program | None = None
    candidate: Candidate | None = None
    cached: bool = False


@dataclass
class Selection:
    """The outcome for one expression: every measurement and the chosen program."""

    baseline: Measured
    measured: list[Measured] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    @property
    def best(self) -> Measured:
        return min([self.baseline, *self.measured], key=lambda m: m.seconds)

    @property
    def speedup(self) -> float:
        return self.baseline.seconds / self.best.seconds


def candidate_program(cand: Candidate, expr: Expr, constants: Mapping[str, np.ndarray]
                      ) -> Program:
    """The candidate as a post-processed program; ``constants`` are weights (folded)."""
    inputs = tuple((n, s) for n, s in expr.decls if n not in constants)
    prog = Program(inputs, (cand.output,), list(cand.kernels),
                   {n: np.asarray(v, dtype=np.float32) for n, v in constants.items()})
    return postprocess(prog)


def check_program(prog: Program, expr: Expr, inputs: Mapping[str, np.ndarray],
                  reference: tuple[np.ndarray, np.ndarray], device: str,
                  rtol: float = 1e-3, atol: float = 1e-4) -> tuple[bool, float]:
    """Run the compiled program and compare with the sampled reference values."""
    compiled = CompiledProgram(prog, device)
    feed = {n: v for n, v in inputs.items() if n in dict(prog.inputs)}
    out = compiled.run(feed)[prog.outputs[0]].detach().cpu().numpy()
    pos, want = reference
    got = out[tuple(pos.T)] if pos.size else out.reshape(-1)
    err = np.abs(got.astype(np.float64) - want)
    ok = bool(np.all(err <= np.abs(want) * rtol + atol)) and bool(np.all(np.isfinite(got)))
    return ok, float(err.max() / max(float(np.abs(want).max()), 1e-30)) if err.size else 0.0


def select(expr: Expr, candidates: list[Candidate], baseline: Callable[[], object],
           inputs: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray] | None = None,
           device: str = "cpu", cache: CostCache | None = None, limit: int = 8,
           samples: int = 512) -> Selection:
    """Measure ``baseline`` (a zero-argument callable running the original operator on
    ``inputs``) and up to ``limit`` candidates; keep the fastest."""
    constants = dict(constants or {})
    dev = device_key(device)
    shapes = ";".join(f"{n}{list(s)}" for n, s in expr.decls)
    base = _timed(f"baseline|{shapes}|{dev}|{_expr_key(expr)}", baseline, device, cache)
    sel = Selection(Measured("original", base[0], cached=base[1]))
    reference = reference_sample(expr, inputs, samples)
    feed = {n: torch.as_tensor(v, device=device) for n, v in inputs.items()
            if n not in constants}
    for cand in candidates[:limit]:
        try:
            prog = candidate_program(cand, expr, constants)
            ok, err = check_program(prog, expr, inputs, reference, device)
        except Exception as exc:  # a candidate that fails is only skipped
            log.warning("candidate %s failed after post-processing: %s", cand.summary(), exc)
            sel.rejected.append(f"{cand.summary()}: {exc}")
            continue
        if not ok:
            log.error("post-processed candidate disagrees with the original (error %.3g): %s",
                      err, cand.summary())
            sel.rejected.append(f"{cand.summary()}: error {err:.3g}")
            continue
        compiled = CompiledProgram(prog, device)
        args = {n: feed[n] for n, _ in prog.inputs}
        key = f"program|{program_key(prog.kernels)}|{shapes}|{dev}"
        secs, cached = _timed(key, lambda c=compiled, a=args: c.run(a), device, cache)
        sel.measured.append(Measured(prog.summary(), secs, prog, cand, cached))
    return sel


def _expr_key(expr: Expr) -> str:
    from ollie.fingerprint import fingerprint

    return fingerprint(expr)


def _timed(key: str, fn: Callable[[], object], device: str, cache: CostCache | None
           ) -> tuple[float, bool]:
    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit, True
    secs = measure(fn, device, repeats=15, min_seconds=0.25)
    if cache is not None and math.isfinite(secs):
        cache.put(key, secs)
    return secs, False
