"""Hand-written interpreter cases checked against plain numpy / torch."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ollie import interpret, parse
from ollie.semantics import gather, interpreter, random_inputs, sample_positions


def run(text: str, inputs=None, seed: int = 0, **kw):
    expr = parse(text)
    inputs = random_inputs(expr, seed) if inputs is None else inputs
    return interpret(expr, inputs, **kw), inputs


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def close(actual, expected) -> None:
    """The interpreter's result is the float64 value rounded to float32."""
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, np.asarray(expected, dtype=np.float32),
                               rtol=1e-6, atol=1e-6)


def test_matmul():
    out, x = run("A: [64, 32]\nB: [32, 16]\nL<m=0:64, n=0:16> Sum<k=0:32> A[m, k] * B[k, n]")
    assert out.shape == (64, 16)
    close(out, f64(x["A"]) @ f64(x["B"]))


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_padding_vs_torch(stride):
    text = f"""A: [2, 5, 9, 9]
    K: [4, 5, 3, 3]
    L<n=0:2, f=0:4, h=0:{9 // stride}, w=0:{9 // stride}> Sum<c=0:5, r=0:3, s=0:3>
        A[n, c, {stride}*h + r - 1, {stride}*w + s - 1] * K[f, c, r, s]"""
    out, x = run(text)
    ref = F.conv2d(torch.tensor(f64(x["A"])), torch.tensor(f64(x["K"])), stride=stride,
                   padding=1).numpy()
    close(out, ref[:, :, : 9 // stride, : 9 // stride])


def test_conv_transpose_vs_torch():
    text = """X: [1, 8, 2, 2]
    W: [8, 4, 4, 4]
    L<n=0:1, c=0:4, h=0:4, w=0:4> Sum<f=0:8, y=0:2, x=0:2>
        X[n, f, y, x] * W[f, c, h + 1 - 2*y, w + 1 - 2*x]"""
    out, x = run(text)
    ref = F.conv_transpose2d(torch.tensor(f64(x["X"])), torch.tensor(f64(x["W"])), stride=2,
                             padding=1)
    close(out, ref.numpy())


def test_g2bmm_vs_loop():
    text = """Q: [2, 100, 8]
    K: [2, 100, 8]
    L<b=0:2, i=0:100, j=0:5> Sum<k=0:8> Q[b, i, k] * K[b, i + 3*j - 6, k]"""
    out, x = run(text)
    q, k = f64(x["Q"]), f64(x["K"])
    ref = np.zeros((2, 100, 5))
    for b in range(2):
        for i in range(100):
            for j in range(5):
                r = i + 3 * j - 6
                if 0 <= r < 100:
                    ref[b, i, j] = q[b, i] @ k[b, r]
    close(out, ref)


def test_nested_scope_read_by_value_negative_lo():
    text = """A: [8]
    L<h=0:8> Sum<r=0:3> { L<t=-1:8> A[t + 1] * 2 }[h + r - 1]"""
    out, x = run(text)
    a = f64(x["A"])
    inner = {t: 2 * a[t + 1] if t + 1 < 8 else 0.0 for t in range(-1, 8)}
    ref = [sum(inner.get(h + r - 1, 0.0) for r in range(3)) for h in range(8)]
    close(out, ref)


def test_nested_scope_outside_range_reads_zero():
    out, x = run("A: [8]\nL<i=0:8> { L<t=2:5> A[t] }[i]")
    a = f64(x["A"])
    close(out, [a[i] if 2 <= i < 5 else 0.0 for i in range(8)])


def test_nested_scope_result_storage_offset():
    out, x = run("A: [6]\nL<t=-3:3> A[t + 3] + 1")
    close(out, f64(x["A"]) + 1)


def test_div_mod_indices():
    out, x = run("A: [4, 8]\nL<x=0:32> A[x / 8, x % 8]")
    close(out, f64(x["A"]).reshape(-1))
    out, x = run("B: [5]\nL<x=-5:5> B[(x + 5) / 2] + B[x % 3]")
    b = f64(x["B"])
    close(out, [b[(v + 5) // 2] + b[v % 3] for v in range(-5, 5)])
    out, x = run("B: [5]\nL<x=-6:6> B[x / 2]")
    close(out, [b[v // 2] if 0 <= v // 2 < 5 else 0.0 for v in range(-6, 6)])


def test_zero_padding_and_reversal():
    out, x = run("A: [3]\nL<i=0:7> A[i - 2] - A[3 - i]")
    a = f64(x["A"])
    get = lambda v: a[v] if 0 <= v < 3 else 0.0  # noqa: E731
    close(out, [get(i - 2) - get(3 - i) for i in range(7)])


def test_constant_out_of_range_index_reads_zero():
    out, _ = run("A: [3, 3]\nL<i=0:3> A[i, 5] + A[-1, i] + 1")
    close(out, np.ones(3))


def test_diagonal_and_broadcast():
    out, x = run("A: [4, 4]\nB: [3]\nL<i=0:4, j=0:3> A[i, i] * B[j]")
    close(out, np.outer(np.diag(f64(x["A"])), f64(x["B"])))


@pytest.mark.parametrize("fn,ref", [
    ("relu", lambda v: np.maximum(v, 0)), ("tanh", np.tanh),
    ("sigmoid", lambda v: 1 / (1 + np.exp(-v))), ("exp", np.exp), ("log", np.log),
    ("sqrt", np.sqrt), ("abs", np.abs),
])
def test_unary_functions(fn, ref):
    out, x = run(f"A: [3, 4]\nL<i=0:3, j=0:4> {fn}(A[i, j])")
    with np.errstate(all="ignore"):
        expected = ref(f64(x["A"]))
    assert np.isnan(expected).any() == (fn in ("log", "sqrt"))
    close(out, expected)


def test_binary_functions_constants_neg():
    out, x = run("A: [5]\nB: [5]\nL<i=0:5> max(A[i], B[i]) - min(A[i], 0.5) * -2 / 4 + 1.5")
    a, b = f64(x["A"]), f64(x["B"])
    close(out, np.maximum(a, b) - np.minimum(a, 0.5) * -2 / 4 + 1.5)
    out, x = run("A: [5]\nL<i=0:5> -(2 * A[i] - 3) / 4")
    close(out, -(2 * f64(x["A"]) - 3) / 4)


def test_function_of_sum_times_read():
    text = ("A: [3, 4]\nB: [4, 5]\n"
            "L<i=0:3, j=0:5> Sum<k=0:4> relu(A[i, k]) * B[k, j] / (A[i, k] + 3)")
    out, x = run(text)
    a, b = f64(x["A"]), f64(x["B"])
    close(out, (np.maximum(a, 0) / (a + 3)) @ b)


def test_three_factor_product_and_unused_iterators():
    text = """A: [3, 4]
    B: [4, 5]
    C: [5, 2]
    L<i=0:3, j=0:2, u=0:2> Sum<k=0:4, l=0:5, z=0:3> A[i, k] * B[k, l] * C[l, j]"""
    out, x = run(text)
    ref = 3 * (f64(x["A"]) @ f64(x["B"]) @ f64(x["C"]))
    close(out, np.broadcast_to(ref[:, :, None], (3, 2, 2)))


def test_sum_of_terms_distributed():
    text = "A: [3]\nB: [4]\nC: [3, 4]\nL<i=0:3, j=0:4> (A[i] + B[j] - 1) * C[i, j]"
    out, x = run(text)
    a, b, c = f64(x["A"]), f64(x["B"]), f64(x["C"])
    close(out, (a[:, None] + b[None, :] - 1) * c)


def test_scalar_scope():
    out, x = run("A: [4]\nL<> Sum<i=0:4> A[i] * 2")
    assert out.shape == ()
    close(out, 2 * f64(x["A"]).sum())
    sampled, _ = run("A: [4]\nL<> Sum<i=0:4> A[i] * 2", at=np.zeros((3, 0), np.int64))
    close(sampled, np.full(3, 2 * f64(x["A"]).sum()))


def test_constant_body():
    out, _ = run("A: [2]\nL<i=0:2, j=0:3> Sum<k=0:4> 0.5")
    close(out, np.full((2, 3), 2.0))


def test_nan_does_not_leak_into_padding_but_propagates():
    a = np.arange(1.0, 5.0, dtype=np.float32)
    a[3] = np.nan
    # strided (linear) and fancy (div) reads, and a contraction through matmul
    out, _ = run("A: [4]\nL<i=0:8> A[i + 2] + A[(i + 6) / 2]", {"A": a})
    get = lambda v: a[v] if 0 <= v < 4 else 0.0  # noqa: E731
    expected = [get(i + 2) + get((i + 6) // 2) for i in range(8)]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    close(out, expected)
    m = np.ones((3, 4), np.float32)
    m[1, 2] = np.nan
    out, _ = run("M: [3, 4]\nB: [4, 2]\nL<i=0:3, j=0:2> Sum<k=0:4> M[i, k] * B[k, j]",
                 {"M": m, "B": np.zeros((4, 2), np.float32)})
    np.testing.assert_array_equal(np.isnan(out), [[False] * 2, [True] * 2, [False] * 2])
    out, _ = run("M: [3, 4]\nL<i=0:3, j=0:6> M[i, j - 1]", {"M": m})
    assert np.isnan(out).sum() == 1 and np.isnan(out[1, 3])


def test_inf_is_not_distributed():
    # (2 - 1) * inf is inf; distributing would give 2*inf - 1*inf = nan
    c = np.array([np.inf, 1.0], np.float32)
    inputs = {"A": np.array([2.0, 2.0], np.float32), "B": np.array([-1.0, 3.0], np.float32),
              "C": c}
    out, _ = run("A: [2]\nB: [2]\nC: [2]\nL<i=0:2, j=0:2> (A[i] + B[j]) * C[i]", inputs)
    close(out, [[np.inf, np.inf], [1.0, 5.0]])
    out, _ = run("A: [2]\nB: [2]\nL<i=0:3> Sum<k=0:2> A[k] / B[i - 1]", inputs)
    close(out, [np.inf, -4.0, 4 / 3])


def test_torch_and_integer_inputs_extra_ignored():
    a = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    out, _ = run("A: [2, 3]\nL<i=0:3, j=0:2> A[j, i]", {"A": a, "unused": np.zeros(1)})
    close(out, a.numpy().T)
    out, _ = run("A: [2, 3]\nL<i=0:3> Sum<j=0:2> A[j, i]",
                 {"A": torch.ones(2, 3, requires_grad=True)})
    close(out, np.full(3, 2.0))


def test_sampled_matches_full_with_nested_scopes():
    text = """A: [6, 7]
    B: [7, 5]
    L<i=0:6, j=0:5, t=-2:3> Sum<k=0:7> { L<u=-1:7, v=0:7> relu(A[u, v]) }[i - 1, k]
        * { L<p=0:7, q=0:5> Sum<r=0:2> B[p + r, q] }[k, j] + A[i, t + 2]"""
    full, x = run(text)
    pts = sample_positions(full.shape, 20, np.random.default_rng(1))
    for fraction in (0.0, 1.0):  # materialised / sparse nested evaluation
        with mock.patch.object(interpreter, "SPARSE_FRACTION", fraction):
            part = interpret(parse(text), x, at=pts)
        np.testing.assert_allclose(part, full[tuple(pts.T)], rtol=1e-6, atol=1e-6)


def test_chunked_evaluation_matches(monkeypatch):
    texts = [
        """A: [2, 3, 6, 6]
        K: [4, 3, 3, 3]
        L<n=0:2, f=0:4, h=0:6, w=0:6> Sum<c=0:3, r=0:3, s=0:3>
            A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s]""",
        """Q: [2, 20, 4]
        K: [2, 20, 4]
        L<b=0:2, i=0:20, j=0:5> Sum<k=0:4> Q[b, i, k] * K[b, i + 2*j - 4, k]""",
        """A: [5, 6]
        L<i=0:5> Sum<k=0:6, l=0:3> tanh(A[i, k] * A[(i + l) % 5, k]) + { L<t=0:5> A[t, t] }[i]""",
    ]
    expected = [run(t)[0] for t in texts]
    pts = [sample_positions(e.shape, 7, np.random.default_rng(0)) for e in expected]
    monkeypatch.setattr(interpreter, "MAX_ELEMENTS", 16)
    monkeypatch.setattr(gather, "MAX_ELEMENTS", 16)
    for text, exp, p in zip(texts, expected, pts, strict=True):
        np.testing.assert_allclose(run(text)[0], exp, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(run(text, at=p)[0], exp[tuple(p.T)], rtol=1e-6, atol=1e-6)


def test_mixed_slices_and_index_arrays():
    # a div index forces numpy indexing; the other dimensions become (reversed, strided) slices
    text = """C: [3, 7, 4]
    L<i=0:6, k=0:3, l=0:4> C[i / 2, 6 - 2*k, l] + C[i / 2, k + 1, 3 - l] * C[l % 3, 2*k, i / 3]"""
    out, x = run(text)
    c = f64(x["C"])
    ref = np.zeros((6, 3, 4))
    for i, k, m in np.ndindex(6, 3, 4):
        ref[i, k, m] = c[i // 2, 6 - 2 * k, m] + c[i // 2, k + 1, 3 - m] * c[m % 3, 2 * k, i // 3]
    close(out, ref)
    pts = sample_positions(out.shape, 9, np.random.default_rng(2))
    close(interpret(parse(text), x, at=pts), ref[tuple(pts.T)])


def test_bfloat16_torch_input():
    a = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    out, _ = run("A: [2]\nL<i=0:2> A[i] * 2", {"A": a})
    close(out, [3.0, -4.0])
