"""Shared fixtures of the executor tests."""

from __future__ import annotations

import numpy as np
import pytest

import ollie
from ollie.optimizer.select import candidate_program
from ollie.testing.clock import stopped_clock

CONV = """
A: [2, 8, 6, 6]
K: [4, 8, 3, 3]
L<n=0:2, f=0:4, h=0:6, w=0:6> Sum<c=0:8, r=0:3, s=0:3> A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s]
"""


@pytest.fixture(scope="module")
def matmul_program():
    """``(expr, program, weight)``: a derived Matmul + eOperator program of a small 3x3
    convolution (``CONV``), its weight ``K`` a constant."""
    expr = ollie.parse(CONV)
    # a stopped clock: the search runs to its depth and finds the same programs however busy
    # the machine (as every search in the tests that needs a particular program)
    res = ollie.derive(expr, max_depth=2, time_budget=30, clock=stopped_clock)
    cand = next(c for c in res.candidates
                if {"Matmul", "eOp"} <= {k.kind for k in c.kernels})
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    return expr, candidate_program(cand, expr, {"K": weight}), weight
