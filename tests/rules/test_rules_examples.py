"""Before/after tests of every rule in the text syntax, and the paper's worked example
(Conv3x3 -> Matmul + OffsetAdd) replayed rule by rule, each step checked by the interpreter."""

import numpy as np
import pytest

import ollie
from ollie.rules import RULES
from ollie.rules.inter import expression_fusion, expression_merging, expression_splitting
from ollie.rules.layout import merge_dims, permute_dims, split_dim


def inputs_for(expr, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}


def assert_same(a, b):
    inp = inputs_for(a)
    np.testing.assert_allclose(ollie.interpret(b, inp), ollie.interpret(a, inp),
                               rtol=1e-5, atol=1e-5)


def pick(name, expr, note):
    """The application of rule ``name`` whose note contains ``note`` (checked exact)."""
    found = [d for d in RULES[name](expr) if note in d.note]
    assert found, f"{name}: no application '{note}' in {[d.note for d in RULES[name](expr)]}"
    assert_same(expr, found[0].expr)
    return found[0].expr


def body_text(expr):
    return ollie.format(expr).splitlines()[-1]


def test_summation_splitting_before_after():
    e = ollie.parse("A: [4, 3, 5]\nL<i=0:4> Sum<j=0:3, k=0:5> A[i, j, k]")
    d = pick("summation_splitting", e, "Sum<j | k>")
    assert body_text(d) == ("L<i=0:4> Sum<j=0:3> { L<i=0:4, j=0:3> Sum<k=0:5> A[i, j, k] }"
                            "[i, j]")
    assert len(RULES["summation_splitting"](e)) == 2  # {j | k} and {k | j}
    three = ollie.parse("A: [2, 2, 2]\nL<i=0:1> Sum<a=0:2, b=0:2, c=0:2> A[a, b, c]")
    assert len(RULES["summation_splitting"](three)) == 6


def test_variable_substitution_shift_before_after():
    e = ollie.parse("A: [7]\nL<r=0:3, h=0:5> A[h + r]")
    d = pick("variable_substitution", e, "shift h -> h + r")
    assert body_text(d) == "L<r=0:3, h=0:5> { L<r=0:3, t=0:7> A[t] }[r, r + h]"


def test_variable_substitution_merge_and_split():
    e = ollie.parse("A: [24]\nL<x=0:4, y=0:6> A[6*x + y]")
    d = pick("variable_substitution", e, "merge x,y")
    assert body_text(d) == "L<x=0:4, y=0:6> { L<xy=0:24> A[xy] }[6*x + y]"
    e = ollie.parse("A: [8, 4]\nL<i=0:8> A[i / 4, i % 4]")
    d = pick("variable_substitution", e, "split i by 4")
    assert body_text(d) == "L<i=0:8> { L<iq=0:2, ir=0:4> A[iq, ir] }[i / 4, i % 4]"
    # dilation: a coefficient next to i proposes splitting i by it
    e = ollie.parse("K: [12]\nL<i=0:8, j=0:3> K[i + 2*j]")
    pick("variable_substitution", e, "split i by 2")


def test_variable_substitution_checks_bijectivity():
    from ollie.errors import ExprError
    from ollie.ir import Iter, var
    from ollie.rules.variable_substitution import substitute

    scope = ollie.parse("A: [8]\nL<x=0:8> A[x]").root
    with pytest.raises(ExprError, match="not invertible"):
        substitute(scope, [Iter("y", 0, 4)], [var("x") // 2], {"x": var("y") * 2})
    with pytest.raises(ExprError, match="maps outside"):
        substitute(scope, [Iter("y", 0, 8)], [var("x") + 1], {"x": var("y") - 1})
    with pytest.raises(ExprError, match="not onto"):
        substitute(scope, [Iter("y", 0, 16)], [var("x") * 2], {"x": var("y") // 2})


def test_traversal_merging_before_after():
    e = ollie.parse("A: [4, 8]\nL<x=0:32> { L<i=0:4, j=0:8> A[i, j] * 2 }[x / 8, x % 8]")
    d = pick("traversal_merging", e, "inline")
    assert body_text(d) == "L<x=0:32> A[x / 8, x % 8] * 2"
    # div/mod composition simplifies exactly
    e = ollie.parse("A: [32]\nL<i=0:4, j=0:8> { L<x=0:32> A[x] }[8*i + j]")
    assert body_text(pick("traversal_merging", e, "inline")) == "L<i=0:4, j=0:8> A[8*i + j]"
    e = ollie.parse("A: [4, 8]\nL<x=0:32> { L<i=0:4, j=0:8> A[i, j] }[x / 8, x % 8]")
    assert "A[x / 8, x % 8]" in body_text(pick("traversal_merging", e, "inline"))
    # a scope with a summation is inlined when its read is a factor: sums merge
    e = ollie.parse("A: [3, 4]\nB: [3]\nL<i=0:3> B[i] * { L<i=0:3> Sum<k=0:4> A[i, k] }[i]")
    assert body_text(pick("traversal_merging", e, "inline")) == \
        "L<i=0:3> Sum<k=0:4> B[i] * A[i, k]"


def test_traversal_merging_refuses_out_of_range_reads():
    # reads at x = 4 hit the scope's padding (0) but the inlined body would read A[4 - 1]
    e = ollie.parse("A: [5]\nL<x=0:5> { L<i=0:4> A[i] }[x]")
    assert RULES["traversal_merging"](e) == []
    # and a summed scope read under a non-linear function is not inlined
    e = ollie.parse("A: [3, 4]\nL<i=0:3> relu({ L<i=0:3> Sum<k=0:4> A[i, k] }[i])")
    assert RULES["traversal_merging"](e) == []


def test_boundary_tightening_before_after():
    e = ollie.parse("A: [5]\nL<h=0:5> Sum<r=0:3> { L<t=0:7> A[t - 1] }[h + r]")
    d = pick("boundary_tightening", e, "t=0:7 -> 1:6")
    assert body_text(d) == "L<h=0:5> Sum<r=0:3> { L<t=1:6> A[t - 1] }[h + r]"
    # only what is read: the reader reads t in [2, 4]
    e = ollie.parse("A: [9]\nL<h=0:3> { L<t=0:9> A[t] }[h + 2]")
    assert "L<t=2:5>" in body_text(pick("boundary_tightening", e, "t=0:9 -> 2:5"))
    # summation range where the body is zero
    e = ollie.parse("A: [4]\nL<i=0:1> Sum<k=-3:9> A[k]")
    assert body_text(pick("boundary_tightening", e, "k=-3:9 -> 0:4")) == \
        "L<i=0:1> Sum<k=0:4> A[k]"


def test_boundary_relaxing_before_after():
    # the reader reads t in [0, 7); the scope is zero outside [1, 6): relax to cover the reads,
    # after which traversal merging may inline it
    e = ollie.parse("A: [5]\nL<h=0:5> Sum<r=0:3> { L<t=1:6> A[t - 1] }[h + r]")
    d = pick("boundary_relaxing", e, "t=1:6 -> 0:7")
    assert body_text(d) == "L<h=0:5> Sum<r=0:3> { L<t=0:7> A[t - 1] }[h + r]"
    assert "A[h + r - 1]" in body_text(pick("traversal_merging", d, "inline"))
    # never relax onto values that are read and may be non-zero
    e = ollie.parse("A: [9]\nL<h=0:3> { L<t=2:5> A[t] }[2*h]")
    assert all("2:5 -> 0" not in d.note for d in RULES["boundary_relaxing"](e))
    for d in RULES["boundary_relaxing"](e):
        assert_same(e, d.expr)


def test_data_layout_transformation():
    e = ollie.parse("K: [1, 12]\nL<i=0:8, j=0:3> K[0, i + 4*j]")
    d = pick("data_layout_transformation", e, "split K dim 1 by 4")
    assert "{ L<d0=0:1, q=0:3, r=0:4> K[d0, 4*q + r] }" in body_text(d)
    root = e.root
    for new in (split_dim(root, "K", (1, 12), 1, 3), permute_dims(root, "K", (1, 12), (1, 0))):
        assert_same(e, ollie.Expr(e.decls, new))
    e2 = ollie.parse("K: [3, 4]\nL<i=0:3, j=0:4> K[i, j] * 2")
    assert_same(e2, ollie.Expr(e2.decls, merge_dims(e2.root, "K", (3, 4), 0)))
    from ollie.errors import ExprError
    e3 = ollie.parse("K: [3, 4]\nL<i=0:3, j=0:5> K[i, j]")
    with pytest.raises(ExprError, match="leaves"):
        merge_dims(e3.root, "K", (3, 4), 0)


def test_inter_expression_rules():
    e = ollie.parse("A: [6, 4]\nB: [4, 5]\nL<m=0:6, n=0:5> Sum<k=0:4> A[m, k] * B[k, n]")
    inp = inputs_for(e)
    full = ollie.interpret(e, inp)
    e1, e2 = expression_splitting(e, 0, 2)
    np.testing.assert_allclose(np.concatenate([ollie.interpret(e1, inp),
                                               ollie.interpret(e2, inp)]), full, rtol=1e-6)
    # two Matmuls sharing A merge into one batched Matmul over a stacked weight
    f = ollie.parse("A: [6, 4]\nC: [4, 5]\nL<m=0:6, n=0:5> Sum<k=0:4> A[m, k] * C[k, n]")
    merged = expression_merging(e, f, "B", "C")
    inp["C"] = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    out = ollie.interpret(merged, inp)
    np.testing.assert_allclose(out[0], full, rtol=1e-5)
    np.testing.assert_allclose(out[1], ollie.interpret(f, inp), rtol=1e-5)
    # fusion: feed the Matmul into a ReLU consumer
    consumer = ollie.parse("T: [6, 5]\nL<i=0:6, j=0:5> relu(T[i, j])")
    fused = expression_fusion(consumer, "T", e)
    np.testing.assert_allclose(ollie.interpret(fused, inp), np.maximum(full, 0), rtol=1e-5)
    # a consumer reading the tensor inside a nested scope too (a squeeze-excitation gate,
    # x * sigmoid(mean(x))): every read is replaced, none left undeclared
    gate = ollie.parse("T: [6, 5]\nL<i=0:6, j=0:5> T[i, j] * sigmoid("
                       "{ L<a=0:6> Sum<b=0:5> T[a, b] * 0.2 }[i])")
    fused = expression_fusion(gate, "T", e)
    assert "T" not in fused.inputs
    want = ollie.interpret(gate, {"T": full.astype(np.float32)})
    np.testing.assert_allclose(ollie.interpret(fused, inp), want, rtol=1e-5, atol=1e-6)


CONV = """A: [1, 4, 5, 5]
K: [6, 4, 3, 3]
L<n=0:1, f=0:6, h=0:5, w=0:5> Sum<c=0:4, r=0:3, s=0:3> A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s]
"""


def test_paper_worked_example_conv3x3_to_matmul_and_offsetadd(capsys):
    """Figure 'derivation process': E1 -> summation splitting -> variable substitution (x2)
    -> traversal merging (x2) -> boundary tightening (x2): the inner scope is a Matmul over
    a plain view of A (m = t, t1; k = c; n = f, r, s), the outer an OffsetAdd."""
    e = ollie.parse(CONV)
    steps = [
        ("summation_splitting", "Sum<r,s | c>"),
        ("variable_substitution", "shift h -> h + r at scope 0"),
        ("variable_substitution", "shift w -> s + w at scope 0.0"),
        ("traversal_merging", "at scope 0"),
        ("traversal_merging", "at root"),
        ("boundary_tightening", "t=0:7 -> 1:6"),
        ("boundary_tightening", "t1=0:7 -> 1:6"),
    ]
    for rule, note in steps:
        e = pick(rule, e, note)
        print(f"{rule} ({note}):\n  {body_text(e)}")
    assert body_text(e) == (
        "L<n=0:1, f=0:6, h=0:5, w=0:5> Sum<r=0:3, s=0:3> "
        "{ L<n=0:1, f=0:6, t=1:6, t1=1:6, r=0:3, s=0:3> Sum<c=0:4> "
        "A[n, c, t - 1, t1 - 1] * K[f, c, r, s] }[n, f, h + r, w + s, r, s]")
    assert "summation_splitting" in capsys.readouterr().out


def test_rules_do_not_turn_ordinary_zeros_into_structural_ones_in_products():
    """An element of a nested scope is an ordinary value, a read outside it a structural zero
    (which annihilates NaN and infinities): where such a read is a factor of a product, rules
    move no read between the two (ollie.ir.structural); in sums they still do."""
    def notes(rule, text):
        return [d.note for d in RULES[rule](ollie.parse(text))]

    # traversal merging: the element t = 0 is an ordinary 0, A[-1] a structural one
    factor = "A: [4]\nB: [4]\nL<i=0:4> { L<t=0:4> A[t - 1] }[i] * B[i]"
    assert not notes("traversal_merging", factor)
    assert notes("traversal_merging", "A: [4]\nB: [4]\nL<i=0:4> { L<t=0:4> A[t - 1] }[i] + B[i]")
    assert notes("traversal_merging", "A: [4]\nB: [4]\nL<i=0:4> { L<t=0:4> A[t] * 2 }[i] * B[i]")
    # boundary tightening: only to what the reader reads when the read is a factor
    text = "A: [4]\nB: [6]\nL<i=0:6> { L<t=-1:6> A[t] }[i - 1] * B[i]"
    assert notes("boundary_tightening", text) == ["t=-1:6 -> -1:5 at scope 0"]
    assert notes("boundary_tightening", text.replace("] * B", "] + B")) == \
        ["t=-1:6 -> 0:4 at scope 0"]
    # boundary relaxing: never onto values the factor reads
    relaxed = "A: [4]\nB: [6]\nL<i=0:6> { L<t=0:4> A[t] }[i - 1] * B[i]"
    assert not notes("boundary_relaxing", relaxed)
    # a summation range keeps the terms that are 0 * NaN where a factor is only zero in value
    text = "A: [4]\nB: [9]\nL<i=0:1> Sum<k=-3:6> relu(A[k]) * B[k + 3]"
    assert notes("boundary_tightening", text) == []
    assert notes("boundary_tightening", text.replace("relu(A[k])", "A[k]")) == \
        ["k=-3:6 -> 0:4 at root"]
