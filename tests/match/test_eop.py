"""eOperator generation: params (expression text, flops, bytes, intensity, bound) and
execution through the runtime."""

from __future__ import annotations

import numpy as np
import torch

import ollie
from ollie.exec.reference import run_kernel
from ollie.match import COMPUTE_BOUND_INTENSITY, make_eop


def eop(text: str, name: str = "T"):
    e = ollie.parse(text)
    return e, make_eop(e.root, e.inputs, name)


def test_layout_copy_is_memory_bound():
    _, k = eop("A: [4, 6]\nB: [3]\nL<j=0:6, i=-1:4> A[i, j]")
    p = k.params
    assert k.kind == "eOp" and k.output == "T" and k.inputs == ("A",)
    assert ollie.parse(p["expr"]) == k.expr and "B" not in k.expr.inputs
    assert p["inputs"] == ["A"] and p["output_shape"] == [6, 5]
    assert p["flops"] == 0 and p["bytes"] == 4 * (24 + 30)
    assert p["intensity"] == 0.0 and p["bound"] == "memory"
    assert k.output_shape == (6, 5)


def test_reduction_with_reuse_is_compute_bound():
    _, k = eop("A: [64, 64]\nB: [64, 64]\nL<m=0:64, n=0:64> Sum<k=0:64> A[m, k] * B[k, n]")
    p = k.params
    assert p["flops"] == 64 ** 3 * 2 and p["bytes"] == 4 * 3 * 64 * 64
    assert p["intensity"] > COMPUTE_BOUND_INTENSITY and p["bound"] == "compute"


def test_small_reads_count_only_what_is_read_and_nested_scopes_add_flops():
    _, k = eop("A: [100, 100]\nL<i=0:10> relu(A[i, 0] + 1)")
    assert k.params["bytes"] == 4 * (10 + 10) and k.params["flops"] == 20
    _, k = eop("A: [4, 4]\nL<i=0:4> Sum<j=0:4> { L<a=0:4, b=0:4> A[a, b] * 2 }[i, j]")
    assert k.params["flops"] == 16 * 1 + 16 * 1


def test_eop_executes_through_the_interpreter():
    e, k = eop("A: [3, 5]\nL<j=0:5, i=-1:4> 2 * A[i, j] - 1")
    a = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    got = run_kernel(k, {"A": torch.from_numpy(a)})
    assert tuple(got.shape) == (5, 5) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ollie.interpret(e, {"A": a}), rtol=1e-6)
