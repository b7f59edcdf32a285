"""Before / after examples of the inter-expression rules on expression programs, written in
the program text syntax (``NAME = <scope>`` defs, ``out NAME, ...``): Q/K/V merged by
stacking, a producer inlined into its element-wise consumer, a layout def normalised away, a
def split in two; each checked against the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from ollie.ir import format_program, parse_program
from ollie.rules.inter_program import (
    PROGRAM_RULES,
    apply_program_rules,
    normalize_program,
    register_program_rule,
)
from ollie.semantics.program import interpret_program

QKV = """\
x: [2, 4]
Wq: [4, 3]
Wk: [4, 3]
Wv: [4, 3]
Q = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * Wq[k, n]
K = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * Wk[k, n]
V = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * Wv[k, n]
out Q, K, V
"""
STACKED = ("{ L<g=0:3, d0=0:4, d1=0:3> { L<g=0:1, d0=0:4, d1=0:3> Wq[d0, d1] }[g, d0, d1]"
           " + { L<g=1:2, d0=0:4, d1=0:3> Wk[d0, d1] }[g, d0, d1]"
           " + { L<g=2:3, d0=0:4, d1=0:3> Wv[d0, d1] }[g, d0, d1] }")
HEAD = "x: [2, 4]\nWq: [4, 3]\nWk: [4, 3]\nWv: [4, 3]\n"

CHAIN = """\
x: [2, 4]
W: [4, 3]
b: [3]
Y = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * W[k, n]
Z = L<m=0:2, n=0:3> relu(Y[m, n] + b[n])
out Z
"""


def _check(before, after):
    after.verify()
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in before.inputs}
    next(iter(inputs.values())).reshape(-1)[0] = np.nan
    want, got = interpret_program(before, inputs), interpret_program(after, inputs)
    assert list(got) == list(want)
    for o in want:
        np.testing.assert_allclose(got[o], want[o], rtol=1e-5, atol=1e-6, equal_nan=True)


def test_qkv_stacked_with_g_inner_then_leading():
    ep = parse_program(QKV)
    merged = PROGRAM_RULES["expression_merging"](ep)
    assert [d.note for d in merged] == [
        "merge Q, K, V into Q_K_V (stack, g_at=inner); slices keep their names",
        "merge Q, K, V into Q_K_V (stack, g_at=0); slices keep their names"]
    assert format_program(merged[0].program) == HEAD + (
        f"Q_K_V = L<m=0:2, g=0:3, n=0:3> Sum<k=0:4> x[m, k] * {STACKED}[g, k, n]\n"
        "Q = L<t0=0:2, t1=0:3> Q_K_V[t0, 0, t1]\n"
        "K = L<t0=0:2, t1=0:3> Q_K_V[t0, 1, t1]\n"
        "V = L<t0=0:2, t1=0:3> Q_K_V[t0, 2, t1]\n"
        "out Q, K, V\n")
    assert format_program(merged[1].program) == HEAD + (
        f"Q_K_V = L<g=0:3, m=0:2, n=0:3> Sum<k=0:4> x[m, k] * {STACKED}[g, k, n]\n"
        "Q = L<t0=0:2, t1=0:3> Q_K_V[0, t0, t1]\n"
        "K = L<t0=0:2, t1=0:3> Q_K_V[1, t0, t1]\n"
        "V = L<t0=0:2, t1=0:3> Q_K_V[2, t0, t1]\n"
        "out Q, K, V\n")
    for d in merged:
        _check(ep, d.program)


def test_qkv_merged_with_g_inner_is_one_matmul():
    from ollie.program.params import KernelKind
    from ollie.search.instantiate import Instantiator

    merged = PROGRAM_RULES["expression_merging"](parse_program(QKV))[0].program
    opts = Instantiator((KernelKind.MATMUL,)).complete(dict(merged.defs)["Q_K_V"])
    assert any(k.kind is KernelKind.MATMUL and k.params["n"] == 9
               for o in opts for k in o.kernels)


def test_producer_inlined_into_its_elementwise_consumer():
    ep = parse_program(CHAIN)
    fused = PROGRAM_RULES["expression_fusion"](ep)
    assert [d.note for d in fused] == ["inline Y into Z (compute into compute)"]
    assert format_program(fused[0].program) == (
        "x: [2, 4]\nW: [4, 3]\nb: [3]\n"
        "Z = L<m=0:2, n=0:3> relu({ L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * W[k, n] }[m, n]"
        " + b[n])\n"
        "out Z\n")
    _check(ep, fused[0].program)


def test_output_producer_stays_when_inlined():
    ep = parse_program(CHAIN.replace("out Z", "out Z, Y"))
    (fused,) = PROGRAM_RULES["expression_fusion"](ep)
    assert [n for n, _ in fused.program.defs] == ["Y", "Z"]
    assert "Y[" not in format_program(fused.program).splitlines()[-2]
    _check(ep, fused.program)


def test_layout_def_is_normalised_into_its_reader():
    ep = parse_program("x: [4, 2]\nW: [4, 3]\n"
                       "T = L<m=0:2, k=0:4> x[k, m]\n"
                       "Y = L<m=0:2, n=0:3> Sum<k=0:4> T[m, k] * W[k, n]\n"
                       "out Y\n")
    norm = normalize_program(ep)
    assert format_program(norm) == (
        "x: [4, 2]\nW: [4, 3]\n"
        "Y = L<m=0:2, n=0:3> Sum<k=0:4> { L<m=0:2, k=0:4> x[k, m] }[m, k] * W[k, n]\n"
        "out Y\n")
    _check(ep, norm)


def test_largest_def_split_at_the_midpoint_and_concatenated():
    ep = parse_program(CHAIN)
    (split,) = PROGRAM_RULES["expression_splitting"](ep)
    assert split.note == "split Y along m at 1: Y_lo, Y_hi, concatenated"
    assert format_program(split.program) == (
        "x: [2, 4]\nW: [4, 3]\nb: [3]\n"
        "Y_lo = L<m=0:1, n=0:3> Sum<k=0:4> x[m, k] * W[k, n]\n"
        "Y_hi = L<m=1:2, n=0:3> Sum<k=0:4> x[m, k] * W[k, n]\n"
        "Y = L<m=0:2, n=0:3> Y_lo[m, n] + Y_hi[m - 1, n]\n"
        "Z = L<m=0:2, n=0:3> relu(Y[m, n] + b[n])\n"
        "out Z\n")
    _check(ep, split.program)


def test_rules_that_do_not_apply_return_nothing():
    single = parse_program("x: [1]\nY = L<i=0:1> x[i] * 2\nout Y\n")
    for rule in PROGRAM_RULES.values():
        assert rule(single) == []
    # twins reading one another are not independent: no merge
    chain = parse_program("x: [3]\nW: [3, 3]\nV: [3, 3]\n"
                          "A = L<i=0:3> Sum<k=0:3> x[k] * W[k, i]\n"
                          "B = L<i=0:3> Sum<k=0:3> A[k] * V[k, i]\n"
                          "out B\n")
    assert PROGRAM_RULES["expression_merging"](chain) == []


def test_apply_program_rules_dedups_and_a_rule_registers_once():
    derived = apply_program_rules(parse_program(QKV))
    assert sorted({d.rule for d in derived}) == ["expression_merging", "expression_splitting"]
    with pytest.raises(ValueError, match="registered twice"):
        register_program_rule("expression_fusion")(lambda ep: [])


def test_twins_written_differently_merge_as_the_first_writes_them():
    ep = parse_program("x: [2, 4]\nWq: [4, 3]\nWk: [4, 3]\n"
                       "Q = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * Wq[k, n] * 2\n"
                       "K = L<i=0:2, j=0:3> Sum<l=0:4> x[i, l] * (Wk[l, j] * 2)\n"
                       "out Q, K\n")
    merged = PROGRAM_RULES["expression_merging"](ep)
    assert [d.note.split(" (")[0] for d in merged] == ["merge Q, K into Q_K"] * 2
    text = format_program(merged[0].program)
    assert "Q_K = L<m=0:2, g=0:2, n=0:3> Sum<k=0:4> x[m, k] * {" in text
    for d in merged:
        _check(ep, d.program)
