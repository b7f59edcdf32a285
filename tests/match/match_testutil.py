"""Helpers of the matching tests: random inputs, and the check that a match's kernels, run by
the runtime, agree with the interpreter on the original scope (and each kernel with its own
expression)."""

from __future__ import annotations

import numpy as np
import torch

import ollie
from ollie.exec.reference import run_kernels
from ollie.ir import Expr
from ollie.match import MatchResult, Mismatch

RTOL = 1e-4
ATOL = 1e-4


def rand_inputs(expr: Expr, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}


def expect_match(res: MatchResult | Mismatch) -> MatchResult:
    assert isinstance(res, MatchResult), str(res)
    return res


def check_kernels(res: MatchResult | Mismatch, expr: Expr, seed: int = 0) -> MatchResult:
    """Run ``res``'s kernels on random inputs; compare with ``ollie.interpret(expr)``."""
    res = expect_match(res)
    ins = rand_inputs(expr, seed)
    env = run_kernels(res.kernels, {n: torch.from_numpy(a) for n, a in ins.items()})
    got = env[res.output].numpy()
    want = ollie.interpret(expr, ins)
    assert got.shape == expr.root.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    for k in res.kernels:  # every kernel computes exactly its own expression
        own = ollie.interpret(k.expr, {n: env[n].numpy() for n in k.expr.inputs})
        np.testing.assert_allclose(env[k.output].numpy(), own, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{k.kind} -> {k.output}")
    names = [k.output for k in res.kernels]
    assert names[-1] == res.output and len(set(names)) == len(names)
    assert not set(names) & set(expr.inputs)
    return res


def parse_match(matcher, text: str) -> tuple[Expr, MatchResult | Mismatch]:
    e = ollie.parse(text)
    return e, matcher(e.root, e.inputs)
