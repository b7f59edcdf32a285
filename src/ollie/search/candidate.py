"""Candidate programs found by the search, their verification and their identity.

A :class:`Candidate` is a sequence of kernels (library operators and eOperators) computing the
original expression from its inputs, the derivation that led to it (rule names, paper names,
in order, with a note and the expression after each step for ``--explain``), and whether it was
verified: executed on random inputs and compared with the reference interpreter (at sampled
output positions when the output is large). Only verified candidates are reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ollie.exec.reference import run_kernels
from ollie.fingerprint import fingerprint
from ollie.ir import Expr
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.semantics import interpret
from ollie.semantics.check import random_inputs, sample_positions


@dataclass(frozen=True)
class Step:
    """One derivation step: the rule, what it did, and the expression after it."""

    rule: str
    note: str
    expr: str


@dataclass
class Candidate:
    """A program of kernels computing the original expression."""

    kernels: list[Kernel]
    output: str
    steps: list[Step] = field(default_factory=list)
    verified: bool = False
    max_error: float = math.nan
    cost: float = math.nan  # estimated seconds (rough model), for ordering before measurement
    found_at_depth: int = 0

    @property
    def derivation(self) -> list[str]:
        """Rule names applied, in order (paper names, snake_case)."""
        return [s.rule for s in self.steps]

    @property
    def key(self) -> str:
        """Identity for deduplication: a digest of the kernel sequence (kinds, parameters,
        and each kernel's expression with produced tensors hashed by their producers)."""
        return program_key(self.kernels)

    @property
    def library_kinds(self) -> list[str]:
        return [k.kind for k in self.kernels if k.kind is not KernelKind.EOP]

    def run(self, inputs: Mapping[str, object]) -> np.ndarray:
        """Execute the kernels on ``inputs``; returns the numpy result."""
        tensors = {n: torch.as_tensor(np.asarray(v, dtype=np.float32)) for n, v in inputs.items()}
        out = run_kernels(self.kernels, tensors)
        return out[self.output].detach().cpu().numpy()

    def summary(self) -> str:
        parts = []
        for k in self.kernels:
            if k.kind is KernelKind.EOP:
                parts.append(f"eOp{list(k.output_shape)}")
            else:
                shown = ",".join(f"{p}={v}" for p, v in k.params.items()
                                 if isinstance(v, (int, bool)))
                parts.append(f"{k.kind}({shown})")
        return " -> ".join(parts)

    def to_json(self) -> dict:
        return {"kernels": [k.to_json() for k in self.kernels],
                "derivation": self.derivation,
                "verified": self.verified,
                "max_error": self.max_error,
                "estimated_seconds": self.cost}


def program_key(kernels: Sequence[Kernel]) -> str:
    defs: dict[str, str] = {}
    parts = []
    for k in kernels:
        node = k.params.node if isinstance(k.params, NodeParams) else None
        fp = fingerprint(k.expr, defs) if k.expr is not None else \
            repr(node) + repr(k.shape) + "".join(defs.get(n, n) for n in k.inputs)
        params = sorted((p, v) for p, v in k.params.items() if isinstance(v, (int, bool, float)))
        defs[k.output] = fp + k.kind
        parts.append(fp + k.kind + repr(params))
    return "|".join(parts)


def verify_candidate(cand: Candidate, expr: Expr, inputs: Mapping[str, np.ndarray],
                     samples: int, rtol: float, atol: float,
                     reference: tuple[np.ndarray, np.ndarray] | None = None
                     ) -> tuple[bool, float]:
    """Run ``cand`` and compare with the interpreter at ``samples`` random output positions
    (all positions when fewer). Returns (ok, max relative error)."""
    if reference is None:
        reference = reference_sample(expr, inputs, samples)
    pos, want = reference
    try:
        got_full = cand.run(inputs)
    except Exception as exc:  # a kernel failing to run disqualifies the candidate
        raise VerificationError(f"candidate failed to run: {exc}") from exc
    if got_full.shape != expr.shape:
        return False, math.inf
    got = got_full[tuple(pos.T)] if pos.size else got_full.reshape(-1)
    err = np.abs(got.astype(np.float64) - want)
    scale = np.abs(want) * rtol + atol
    ok = bool(np.all(err <= scale)) and bool(np.all(np.isfinite(got)))
    denom = float(np.max(np.abs(want))) if want.size else 1.0
    return ok, float(np.max(err) / max(denom, 1e-30)) if err.size else 0.0


def reference_sample(expr: Expr, inputs: Mapping[str, np.ndarray], samples: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Sampled reference values ``(positions, values)`` of ``expr`` on ``inputs``."""
    rng = np.random.default_rng(0)
    pos = sample_positions(expr.shape, samples, rng)
    vals = interpret(expr, inputs, at=pos).astype(np.float64)
    return pos, vals


class VerificationError(RuntimeError):
    """A candidate could not be executed."""


__all__ = ["Candidate", "Step", "program_key", "random_inputs", "reference_sample",
           "verify_candidate"]
