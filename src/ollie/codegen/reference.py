"""The reference eOperator backend: :func:`compile_reference` wraps ``ollie.interpret``.

Slow (vectorised numpy in float64) but exact by definition; used by tests as the oracle with the
compiled-kernel calling convention, and as a fallback where no code generator applies.
"""

from __future__ import annotations

import numpy as np

from ollie.codegen.kernel import CompiledKernel
from ollie.ir import Expr, parse
from ollie.semantics import interpret


class ReferenceKernel(CompiledKernel):
    """Evaluates its expression with the reference interpreter on every call."""

    backend = "reference"

    def _run(self, arrays: list[np.ndarray], out: np.ndarray) -> None:
        named = dict(zip(self.input_names, arrays, strict=True))
        out[...] = interpret(self.expr, named)


def compile_reference(expr: Expr | str) -> CompiledKernel:
    """A kernel computing ``expr`` with :func:`ollie.interpret` (same calling convention as
    :func:`ollie.codegen.cpu.compile_cpu`)."""
    if isinstance(expr, str):
        expr = parse(expr)
    return ReferenceKernel(expr)
