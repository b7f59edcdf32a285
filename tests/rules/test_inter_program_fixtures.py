"""The inter-expression program rules on three fixtures (Q/K/V projections with a bias each,
a 1x1 -> bias -> transpose -> 1x1 chain, a fire module with twin 1x1 expands next to a 3x3):
how often each rule applies, before and after normalisation, and every application checked
against the oracle with NaN and infinities in the inputs."""

from __future__ import annotations

import numpy as np
import pytest

from ollie.ir import parse_program
from ollie.rules.inter_program import PROGRAM_RULES, normalize_program
from ollie.semantics.program import interpret_program

FIXTURES = {
    "qkv": """\
x: [1, 8, 16]
Wq: [16, 16]
Wk: [16, 16]
Wv: [16, 16]
bq: [16]
bk: [16]
bv: [16]
Q = L<b=0:1, s=0:8, n=0:16> Sum<k=0:16> x[b, s, k] * Wq[k, n]
K = L<b=0:1, s=0:8, n=0:16> Sum<k=0:16> x[b, s, k] * Wk[k, n]
V = L<b=0:1, s=0:8, n=0:16> Sum<k=0:16> x[b, s, k] * Wv[k, n]
Qb = L<b=0:1, s=0:8, n=0:16> Q[b, s, n] + bq[n]
Kb = L<b=0:1, s=0:8, n=0:16> K[b, s, n] + bk[n]
Vb = L<b=0:1, s=0:8, n=0:16> V[b, s, n] + bv[n]
out Qb, Kb, Vb
""",
    "chain": """\
x: [1, 8, 16]
W1: [16, 8]
b1: [16]
W2: [8, 16]
Y1 = L<n=0:1, c=0:16, p=0:16> Sum<k=0:8> W1[c, k] * x[n, k, p]
B1 = L<n=0:1, c=0:16, p=0:16> Y1[n, c, p] + b1[c]
T1 = L<n=0:1, p=0:16, c=0:16> B1[n, c, p]
Y2 = L<n=0:1, p=0:16, f=0:8> Sum<c=0:16> T1[n, p, c] * W2[c, f]
out Y2
""",
    "fire": """\
x: [1, 8, 6, 6]
Ws: [4, 8]
We1: [8, 4]
We2: [8, 4]
We3: [8, 4, 3, 3]
S = L<n=0:1, c=0:4, h=0:6, w=0:6>
    relu({ L<n=0:1, c=0:4, h=0:6, w=0:6> Sum<k=0:8> Ws[c, k] * x[n, k, h, w] }[n, c, h, w])
E1 = L<n=0:1, f=0:8, h=0:6, w=0:6> Sum<c=0:4> We1[f, c] * S[n, c, h, w]
E2 = L<n=0:1, f=0:8, h=0:6, w=0:6> Sum<c=0:4> We2[f, c] * S[n, c, h, w]
E3 = L<n=0:1, f=0:8, h=0:6, w=0:6> Sum<c=0:4, r=0:3, s=0:3>
    We3[f, c, r, s] * S[n, c, h + r - 1, w + s - 1]
out E1, E2, E3
""",
}

# fixture: (defs, defs after normalisation, {rule: applications on the normalised program})
COUNTS = {
    "qkv": (6, 6, {"expression_fusion": 3, "expression_splitting": 1, "expression_merging": 3}),
    "chain": (4, 2, {"expression_fusion": 1, "expression_splitting": 1,
                     "expression_merging": 0}),
    "fire": (4, 4, {"expression_fusion": 1, "expression_splitting": 1, "expression_merging": 2}),
}


def _inputs(ep, seed=0):
    rng = np.random.default_rng(seed)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in ep.inputs}
    for k, v in enumerate(out.values()):
        v.reshape(-1)[k % v.size] = (np.nan, np.inf, -np.inf)[k % 3]
    return out


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_applications_per_rule_and_each_keeps_the_outputs(name):
    ep = parse_program(FIXTURES[name])
    norm = normalize_program(ep)
    defs, normalised, counts = COUNTS[name]
    assert (len(ep.defs), len(norm.defs)) == (defs, normalised)
    inputs = _inputs(ep)
    want = interpret_program(ep, inputs)
    got = interpret_program(norm, inputs)
    for o in ep.outputs:
        np.testing.assert_allclose(got[o], want[o], rtol=1e-5, atol=1e-5, equal_nan=True)
    for rule, fn in PROGRAM_RULES.items():
        derived = fn(norm)
        assert len(derived) == counts[rule], (rule, [d.note for d in derived])
        for d in derived:
            got = interpret_program(d.program, inputs)
            for o in ep.outputs:
                np.testing.assert_allclose(got[o], want[o], rtol=1e-5, atol=1e-5,
                                           equal_nan=True, err_msg=f"{rule}: {d.note}")


def test_fire_expands_merge_into_one_wider_1x1():
    norm = normalize_program(parse_program(FIXTURES["fire"]))
    inner = PROGRAM_RULES["expression_merging"](norm)[0]
    assert inner.note.startswith("merge E1, E2 into E1_E2 (stack, g_at=inner)")
    merged = dict(inner.program.defs)["E1_E2"]
    # g sits just before f: (g, f) is one output-channel group of 16
    assert [it.name for it in merged.root.traversal[:3]] == ["n", "g", "f"]
    assert merged.shape == (1, 2, 8, 6, 6)
