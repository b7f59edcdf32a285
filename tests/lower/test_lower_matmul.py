"""MatMul / BatchMatMul / Gemm / G2BMM / GBMM lowerings against torch."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_testutil import check_op, g2bmm_ref, gbmm_ref, rand, t

import ollie
from ollie.lower import lower


@st.composite
def matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
    rank_a, rank_b = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = [draw(st.integers(1, 3)) for _ in range(max(rank_a, rank_b) - 2)]

    def batch_of(rank: int) -> list[int]:
        dims = batch[len(batch) - (rank - 2):] if rank > 2 else []
        return [1 if draw(st.booleans()) else d for d in dims]  # broadcast some dims

    sa = (k,) if rank_a == 1 else (*batch_of(rank_a), m, k)
    sb = (k,) if rank_b == 1 else (*batch_of(rank_b), k, n)
    return sa, sb


@settings(max_examples=40)
@given(matmul_shapes(), st.integers(0, 1000), st.sampled_from(["MatMul", "BatchMatMul"]))
def test_matmul_matches_torch(shapes: tuple, seed: int, kind: str) -> None:
    sa, sb = shapes
    arrays = {"A": rand(sa, seed), "B": rand(sb, seed + 1)}
    check_op(kind, arrays, torch.matmul(t(arrays["A"]), t(arrays["B"])))


def test_matmul_is_the_documented_form() -> None:
    text = "A: [64, 32]\nB: [32, 16]\nL<m=0:64, n=0:16> Sum<k=0:32> A[m, k] * B[k, n]"
    assert lower("MatMul", [("A", (64, 32)), ("B", (32, 16))]).expr == ollie.parse(text)


def test_matmul_same_tensor_twice() -> None:
    a = rand((3, 3), 1)
    low = lower("MatMul", [("A", (3, 3)), ("A", (3, 3))])
    assert low.expr.decls == (("A", (3, 3)),)
    np.testing.assert_allclose(ollie.interpret(low.expr, {"A": a}), a @ a, rtol=1e-4,
                               atol=1e-4)


@settings(max_examples=30)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5), st.booleans(), st.booleans(),
       st.sampled_from([1.0, 0.5, -2.0]), st.sampled_from([1.0, 0.0, 0.25]),
       st.sampled_from(["none", "n", "1n", "m1", "mn", "11", "1"]), st.integers(0, 1000))
def test_gemm_matches_reference(m: int, k: int, n: int, ta: bool, tb: bool, alpha: float,
                                beta: float, c_kind: str, seed: int) -> None:
    arrays = {"A": rand((k, m) if ta else (m, k), seed),
              "B": rand((n, k) if tb else (k, n), seed + 1)}
    c_shape = {"none": None, "n": (n,), "1n": (1, n), "m1": (m, 1), "mn": (m, n),
               "11": (1, 1), "1": (1,)}[c_kind]
    a, b = t(arrays["A"]), t(arrays["B"])
    want = alpha * ((a.T if ta else a) @ (b.T if tb else b))
    if c_shape is not None:
        arrays["C"] = rand(c_shape, seed + 2)
        want = want + beta * t(arrays["C"])
    check_op("Gemm", arrays, want, alpha=alpha, beta=beta, transA=int(ta), transB=int(tb))


def test_gemm_bias_is_outside_the_sum() -> None:
    low = lower("Gemm", [("A", (4, 3)), ("B", (3, 5)), ("C", (5,))])
    assert low.expr.root.summation == ()
    assert ollie.format(low.expr).endswith(
        "L<m=0:4, n=0:5> { L<m=0:4, n=0:5> Sum<k=0:3> A[m, k] * B[k, n] }[m, n] + C[n]\n")


@settings(max_examples=30)
@given(st.integers(1, 2), st.integers(1, 12), st.integers(1, 5), st.integers(0, 3),
       st.integers(1, 3), st.integers(0, 1000))
def test_g2bmm_matches_reference(b: int, m: int, k: int, w: int, d: int, seed: int) -> None:
    arrays = {"Q": rand((b, m, k), seed), "K": rand((b, m, k), seed + 1)}
    check_op("G2BMM", arrays, g2bmm_ref(t(arrays["Q"]), t(arrays["K"]), w, d), width=w,
             dilation=d)


@settings(max_examples=30)
@given(st.integers(1, 2), st.integers(1, 12), st.integers(1, 5), st.integers(0, 3),
       st.integers(1, 3), st.integers(0, 1000), st.booleans())
def test_gbmm_matches_reference(b: int, m: int, n: int, w: int, d: int, seed: int,
                                infer_width: bool) -> None:
    arrays = {"S": rand((b, m, 2 * w + 1), seed), "V": rand((b, m, n), seed + 1)}
    attrs = {"dilation": d} if infer_width else {"width": w, "dilation": d}
    check_op("GBMM", arrays, gbmm_ref(t(arrays["S"]), t(arrays["V"]), w, d), **attrs)


def test_g2bmm_is_the_documented_form() -> None:
    text = """Q: [2, 100, 8]
K: [2, 100, 8]
L<b=0:2, i=0:100, j=0:5> Sum<k=0:8> Q[b, i, k] * K[b, i + 3*j - 6, k]"""
    low = lower("G2BMM", [("Q", (2, 100, 8)), ("K", (2, 100, 8))], width=2, dilation=3)
    assert low.expr == ollie.parse(text)
    assert low.output_shape == (2, 100, 5)


def test_gbmm_form() -> None:
    low = lower("GBMM", [("S", (2, 100, 5)), ("V", (2, 100, 8))], width=2, dilation=3)
    assert ollie.format(low.expr).endswith(
        "L<b=0:2, i=0:100, n=0:8> Sum<j=0:5> S[b, i, j] * V[b, i + 3*j - 6, n]\n")


def test_matmul_vector_vector_is_a_scalar_scope() -> None:
    a, b = rand((5,), 1), rand((5,), 2)
    low = check_op("MatMul", {"A": a, "B": b}, torch.dot(t(a), t(b)))
    assert low.output_shape == () and low.expr.root.traversal == ()
