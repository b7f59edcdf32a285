"""The meaning of an expression program (:class:`ollie.ir.exprprogram.ExprProgram`): its defs
interpreted in order by the reference interpreter. The oracle for subprograms with several
outputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ollie.errors import ShapeError
from ollie.ir.exprprogram import ExprProgram
from ollie.semantics.interpreter import interpret


def interpret_program(ep: ExprProgram, inputs: Mapping[str, Any],
                      at: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Each output of ``ep`` on ``inputs`` (name -> array of the declared shape), as float32
    arrays by output name. Every def is evaluated in full (later defs read it), except that an
    output named in ``at`` (int array [P, rank] of its positions) which no later def reads is
    evaluated only there. Raises :class:`~ollie.errors.ShapeError` when an input is missing
    or has another shape."""
    tensors: dict[str, Any] = {}
    for name, shape in ep.inputs:
        if name not in inputs:
            raise ShapeError(f"expression program: input '{name}' is missing")
        value = np.asarray(inputs[name], dtype=np.float32)
        if tuple(value.shape) != tuple(shape):
            raise ShapeError(f"expression program: input '{name}' has shape "
                             f"{list(value.shape)}, expected {list(shape)}")
        tensors[name] = value
    read = {d for _, e in ep.defs for d, _ in e.decls}
    out: dict[str, np.ndarray] = {}
    for name, expr in ep.defs:
        feed = {d: tensors[d] for d, _ in expr.decls}
        if at is not None and name in at and name not in read:
            out[name] = interpret(expr, feed, at=at[name])
            continue
        tensors[name] = interpret(expr, feed)
    out.update({o: tensors[o] for o in ep.outputs if o not in out})
    return {o: out[o] for o in ep.outputs}


__all__ = ["interpret_program"]
