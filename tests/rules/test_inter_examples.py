"""Before / after examples of the N-ary expression merging (:func:`merge_expressions`):
Matmuls sharing their input (the Q/K/V projections of attention) become one Matmul."""

import numpy as np
import pytest

import ollie
from ollie.errors import ExprError
from ollie.rules.inter import merge_expressions

QKV = "A: [2, 4]\n{w}: [4, 3]\nL<m=0:2, n=0:3> Sum<k=0:4> A[m, k] * {w}[k, n]"
STACKED = ("{ L<g=0:3, d0=0:4, d1=0:3> { L<g=0:1, d0=0:4, d1=0:3> Wq[d0, d1] }[g, d0, d1]"
           " + { L<g=1:2, d0=0:4, d1=0:3> Wk[d0, d1] }[g, d0, d1]"
           " + { L<g=2:3, d0=0:4, d1=0:3> Wv[d0, d1] }[g, d0, d1] }")


def _three():
    names = ("Wq", "Wk", "Wv")
    return [ollie.parse(QKV.format(w=w)) for w in names], [(w,) for w in names]


def _check(merged, slices, exprs):
    rng = np.random.default_rng(0)
    inp = {n: rng.standard_normal(s).astype(np.float32) for n, s in merged.decls}
    out = ollie.interpret(merged, inp)
    for e, sl in zip(exprs, slices, strict=True):
        np.testing.assert_allclose(ollie.interpret(sl, {"merged": out}),
                                   ollie.interpret(e, inp), rtol=1e-5, atol=1e-6)


def test_three_matmuls_sharing_an_input_inner_g():
    exprs, holes = _three()
    merged, slices = merge_expressions(exprs, holes, "inner")
    # g goes just before n, the iterator only the weights read: (g, n) is one GEMM n group
    assert ollie.format(merged).splitlines()[-1] == (
        f"L<m=0:2, g=0:3, n=0:3> Sum<k=0:4> A[m, k] * {STACKED}[g, k, n]")
    assert [ollie.format(s).splitlines()[-1] for s in slices] == [
        f"L<t0=0:2, t1=0:3> merged[t0, {i}, t1]" for i in range(3)]
    assert merged.shape == (2, 3, 3)
    _check(merged, slices, exprs)


def test_three_matmuls_sharing_an_input_leading_g():
    exprs, holes = _three()
    merged, slices = merge_expressions(exprs, holes, 0)
    assert ollie.format(merged).splitlines()[-1] == (
        f"L<g=0:3, m=0:2, n=0:3> Sum<k=0:4> A[m, k] * {STACKED}[g, k, n]")
    assert ollie.format(slices[2]).splitlines()[-1] == "L<t0=0:2, t1=0:3> merged[2, t0, t1]"
    _check(merged, slices, exprs)


def test_merged_matmul_instantiates_as_one_matmul():
    from ollie.program.params import KernelKind
    from ollie.search.instantiate import Instantiator

    exprs, holes = _three()
    merged, _ = merge_expressions(exprs, holes, "inner")
    opts = Instantiator((KernelKind.MATMUL,)).complete(merged)
    mm = [o for o in opts if any(k.kind is KernelKind.MATMUL for k in o.kernels)]
    assert mm, "no Matmul program for the merged expression"
    k = next(k for k in mm[0].kernels if k.kind is KernelKind.MATMUL)
    assert k.output_shape == (2, 3, 3)  # n = 3 members x 3, the output written directly
    assert mm[0].kernels[-1] is k


def test_merging_refuses_different_functions_and_shapes():
    exprs, holes = _three()
    other = ollie.parse("A: [2, 4]\nWx: [4, 3]\nL<m=0:2, n=0:3> Sum<k=0:4> A[m, k] + Wx[k, n]")
    with pytest.raises(ExprError, match="same function"):
        merge_expressions([exprs[0], other], [("Wq",), ("Wx",)], 0)
    wide = ollie.parse(QKV.format(w="Wx").replace("[4, 3]", "[4, 5]").replace("0:3", "0:5"))
    with pytest.raises(ExprError, match="one shape"):
        merge_expressions([exprs[0], wide], [("Wq",), ("Wx",)], "inner")
    with pytest.raises(ExprError):
        merge_expressions(exprs[:1], holes[:1], 0)
