"""Equivalence checks built on the interpreter: random inputs, sampled positions, comparison.

``compare(a, b, inputs, n=...)`` evaluates two expressions at the same ``n`` random output
positions (or everywhere) and reports whether they agree within tolerance; it is what rule,
matcher and kernel tests use to check that a rewrite keeps the meaning of an expression.
:func:`random_inputs` (also what the search verifies candidates on) and
:func:`sample_positions` refuse, with :class:`~ollie.errors.ResourceError`, to allocate more
than ``max_bytes`` (default :data:`~ollie.semantics.limits.MAX_BYTES`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ollie.ir.nodes import Expr
from ollie.ir.parser import parse
from ollie.semantics.interpreter import interpret
from ollie.semantics.limits import MAX_BYTES, check_bytes, size_text


class Comparison(NamedTuple):
    """Result of :func:`compare`; unpacks as ``ok, max_abs_err, max_rel_err``."""

    ok: bool
    max_abs_err: float
    max_rel_err: float


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def sample_positions(shape: tuple[int, ...], n: int,
                     rng: np.random.Generator | int | None = None, *,
                     max_bytes: int | None = MAX_BYTES) -> np.ndarray:
    """``n`` distinct random storage positions of ``shape`` as int64 [n, rank], in row-major
    order; every position when ``n >= prod(shape)``."""
    shape = tuple(int(d) for d in shape)
    size = math.prod(shape)
    count = max(min(int(n), size), 0)
    check_bytes(8 * count * max(len(shape), 1), max_bytes,
                f"sampling {count} positions of shape {list(shape)}",
                "sample_positions(..., max_bytes=...)")
    if n >= size:
        flat = np.arange(size, dtype=np.int64)
    else:
        flat = np.sort(_rng(rng).choice(size, size=max(int(n), 0), replace=False))
    if not shape:
        return np.zeros((len(flat), 0), dtype=np.int64)
    return np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)


def random_inputs(expr: Expr | str, seed: int = 0, *, max_bytes: int | None = MAX_BYTES
                  ) -> dict[str, np.ndarray]:
    """Standard normal float32 arrays for every declared tensor of ``expr``; raises
    :class:`~ollie.errors.ResourceError` (naming the largest tensor) when they would take more
    than ``max_bytes`` bytes in all (None: no limit)."""
    if isinstance(expr, str):
        expr = parse(expr)
    sizes = {name: 4 * math.prod(shape) for name, shape in expr.decls}
    if sizes:
        big = max(sizes, key=sizes.__getitem__)
        what = f"'{big}' {list(expr.inputs[big])}"
        what = f"making random input {what}" if len(sizes) == 1 else \
            f"making random inputs for {len(sizes)} tensors (the largest, {what}, " \
            f"{size_text(sizes[big])})"
        check_bytes(sum(sizes.values()), max_bytes, what, "random_inputs(..., max_bytes=...)")
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in expr.decls}


def compare(expr_a: Expr | str, expr_b: Expr | str, inputs: Mapping[str, Any] | None = None,
            n: int | None = None, rtol: float = 1e-4, atol: float = 1e-5,
            seed: int = 0) -> Comparison:
    """Evaluate both expressions (at the same ``n`` random positions when ``n`` is given) on
    ``inputs`` (default: :func:`random_inputs` of ``expr_a``) and compare element-wise.

    Elements agree when ``|a - b| <= atol + rtol * max(|a|, |b|)``, or when both are NaN, or
    both the same infinity. Expressions of different shapes never agree.
    """
    if isinstance(expr_a, str):
        expr_a = parse(expr_a)
    if isinstance(expr_b, str):
        expr_b = parse(expr_b)
    if expr_a.shape != expr_b.shape:
        return Comparison(False, math.inf, math.inf)
    if inputs is None:
        inputs = random_inputs(expr_a, seed)
    at = None if n is None else sample_positions(expr_a.shape, n, seed)
    a = interpret(expr_a, inputs, at=at).astype(np.float64)
    b = interpret(expr_b, inputs, at=at).astype(np.float64)
    return _compare_arrays(a, b, rtol, atol)


def _compare_arrays(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> Comparison:
    with np.errstate(all="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        err = np.where(same, 0.0, np.abs(a - b))
        err = np.where(np.isnan(err), np.inf, err)
        scale = np.maximum(np.abs(a), np.abs(b))
        rel = np.where(err == 0, 0.0, err / np.where(scale == 0, 1.0, scale))
        rel = np.where(np.isnan(rel), np.inf, rel)
        ok = bool(np.all(err <= atol + rtol * np.where(np.isfinite(scale), scale, 0.0)))
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    return Comparison(ok, max_abs, max_rel)


def assert_equivalent(expr_a: Expr | str, expr_b: Expr | str,
                      inputs: Mapping[str, Any] | None = None, n: int | None = None,
                      rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0) -> None:
    """Raise AssertionError (with both texts and the errors) unless :func:`compare` agrees."""
    res = compare(expr_a, expr_b, inputs, n=n, rtol=rtol, atol=atol, seed=seed)
    if not res.ok:
        raise AssertionError(
            f"expressions differ (max abs err {res.max_abs_err:.3g}, max rel err "
            f"{res.max_rel_err:.3g}):\n{expr_a}\n{expr_b}")
