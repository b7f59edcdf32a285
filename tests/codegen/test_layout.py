"""Permuted input declarations (``ollie.codegen.layout``) and the executor reading permuted
(channels-last) tensors in place: the interpreter is the oracle."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.codegen.layout import dense_permutation, permute_inputs
from ollie.exec.executor import CompiledProgram
from ollie.program.kernel import Kernel
from ollie.program.program import Program
from ollie.semantics import random_inputs
from ollie.testing.strategies import exprs


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_dense_permutation_finds_the_order_of_any_permuted_array(shape, rnd):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    base = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(
        [shape[d] for d in perm])
    inverse = [perm.index(d) for d in range(len(shape))]
    t = base.permute(inverse)  # shape == `shape`, memory in `perm` order
    assert tuple(t.shape) == tuple(shape)
    found = dense_permutation(t.shape, t.stride())
    assert found is not None
    assert t.permute(found).is_contiguous()
    # read in that order, the elements come in memory order
    assert torch.equal(t.permute(found).reshape(-1), base.reshape(-1))


def test_dense_permutation_rejects_strided_views():
    t = torch.zeros(4, 6)[:, ::2]
    assert dense_permutation(t.shape, t.stride()) is None
    t = torch.zeros(4, 6)[:, :3]
    assert dense_permutation(t.shape, t.stride()) is None


@settings(max_examples=25, deadline=None)
@given(exprs(depth=1), st.randoms(use_true_random=False))
def test_permuted_declarations_compute_the_same_tensor(expr, rnd):
    inputs = random_inputs(expr, 2)
    perms = {}
    for name, shape in expr.decls:
        perm = list(range(len(shape)))
        rnd.shuffle(perm)
        perms[name] = tuple(perm)
    rewritten = permute_inputs(expr, perms)
    permuted = {n: np.ascontiguousarray(np.transpose(a, perms[n])) for n, a in inputs.items()}
    np.testing.assert_array_equal(ollie.interpret(rewritten, permuted),
                                  ollie.interpret(expr, inputs))


def test_executor_reads_a_channels_last_input_in_place(compiled_eops):
    """A channels-last tensor (a oneDNN conv output) reaches the generated code as it lies in
    memory: a kernel for the permuted declaration is compiled, no row-major copy is made."""
    compiled_exprs = compiled_eops
    expr = ollie.parse("""
        T: [2, 8, 5, 3]
        L<n=0:2, c=0:8, h=0:5, w=0:3> Sum<r=0:2> T[n, c, h + r - 1, w] * T[n, c, 4 - h, w]
    """)
    kernel = Kernel("eOp", {}, ("T",), "out", expr)
    prog = Program((("T", (2, 8, 5, 3)),), ("out",), [kernel], {})
    compiled = CompiledProgram(prog, "cpu")
    t = torch.randn(2, 8, 5, 3).contiguous(memory_format=torch.channels_last)
    want = ollie.interpret(expr, {"T": t.contiguous().numpy()})
    got = compiled.run({"T": t})["out"]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert [dict(e.decls)["T"] for e in compiled_exprs] == [(2, 8, 5, 3), (2, 5, 3, 8)]
    # a row-major input runs the plain kernel: same values, nothing compiled
    got2 = compiled.run({"T": t.contiguous()})["out"]
    np.testing.assert_allclose(got2.numpy(), want, rtol=1e-5, atol=1e-6)
    assert len(compiled_exprs) == 2
