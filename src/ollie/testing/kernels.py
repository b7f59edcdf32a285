"""Test helpers for generated CPU kernels: checking one against the reference interpreter,
and listing the compiled loop-nest functions its module holds."""

from __future__ import annotations

from typing import Any

import numpy as np

from ollie.ir import Expr
from ollie.semantics import interpret, random_inputs


def assert_agrees(kernel: Any, expr: Expr, seed: int) -> None:
    """``kernel`` (a compiled CPU kernel of ``expr``) gives the interpreter's result on
    random inputs drawn with ``seed`` (rtol = atol = 1e-5)."""
    inputs = random_inputs(expr, seed=seed)
    np.testing.assert_allclose(kernel(inputs), interpret(expr, inputs), rtol=1e-5, atol=1e-5)


def nest_functions(kernel: Any) -> list[Any]:
    """The numba functions (they have compile ``stats``) of ``kernel``'s module."""
    return [f for f in vars(kernel.module).values() if hasattr(f, "stats")]


__all__ = ["assert_agrees", "nest_functions"]
