"""G2BMM and GBMM matching: MODELS.md's definitions, centred / shifted band ranges, fused or
missing batch, permuted layouts, mismatches (offset, range, coefficient, groups), and property
tests over random widths and dilations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from match_testutil import check_kernels, parse_match

from ollie.match import Mismatch, match_all, match_g2bmm, match_gbmm

G2 = """Q: [2, 30, 8]
K: [2, 30, 8]
L<b=0:2, i=0:30, j=0:5> Sum<k=0:8> Q[b, i, k] * K[b, i + 3*j - 6, k]
"""
GB = """S: [2, 30, 5]
V: [2, 30, 8]
L<b=0:2, i=0:30, n=0:8> Sum<j=0:5> S[b, i, j] * V[b, i + 3*j - 6, n]
"""


def bparams(res, *keys):
    return tuple(res.params[k] for k in keys)


def test_g2bmm_models_definition():
    e, res = parse_match(match_g2bmm, G2)
    res = check_kernels(res, e)
    assert bparams(res, "b", "m", "w", "k", "d") == (2, 30, 2, 8, 3)
    assert len(res.kernels) == 1 and res.mapping["m"] == ("i",) and res.mapping["b"] == ("b",)


def test_g2bmm_centred_range_swapped_reads():
    e, res = parse_match(match_g2bmm, """Q: [2, 30, 8]
K: [2, 30, 8]
L<b=0:2, i=0:30, j=-2:3> Sum<k=0:8> K[b, i + 3*j, k] * Q[b, i, k]""")
    res = check_kernels(res, e)
    assert bparams(res, "w", "d") == (2, 3) and len(res.kernels) == 1


def test_g2bmm_fused_batch_permuted_layout_and_output_eop():
    e, res = parse_match(match_g2bmm, """Q: [2, 3, 20, 4]
K: [4, 20, 2, 3]
L<i=0:20, b=0:2, h=0:3, j=0:3> Sum<k=0:4> Q[b, h, i, k] * K[k, i + 2*j - 2, b, h]""")
    res = check_kernels(res, e)
    assert bparams(res, "b", "m", "w", "k", "d") == (6, 20, 1, 4, 2)
    assert [k.kind for k in res.kernels] == ["G2BMM", "eOp"]


def test_g2bmm_no_batch_and_padded_first_operand():
    e, res = parse_match(match_g2bmm, """Q: [20, 4]
K: [20, 4]
L<i=0:20, j=0:3> Sum<k=0:4> Q[i, k + 1] * K[i + j - 1, k]""")
    res = check_kernels(res, e)
    assert bparams(res, "b", "m", "w", "d") == (1, 20, 1, 1)
    assert [k.kind for k in res.kernels] == ["eOp", "G2BMM"]


def test_g2bmm_mismatches():
    _, res = parse_match(match_g2bmm, G2.replace("i + 3*j - 6", "i + 3*j"))
    assert isinstance(res, Mismatch)
    (issue,) = res.issues
    assert issue.kind == "offset" and (issue.expected, issue.actual) == (-6, 0)
    assert issue.iterators == ("i", "j")
    _, res = parse_match(match_g2bmm, G2.replace("j=0:5", "j=0:4"))
    assert res.issues[0].kind == "range" and res.issues[0].actual == 4
    _, res = parse_match(match_g2bmm, G2.replace("i + 3*j - 6", "2*i + 3*j - 6"))
    assert res.issues[0].kind == "coefficient" and res.issues[0].actual == (2, 3)
    _, res = parse_match(match_g2bmm, G2.replace("i=0:30", "i=0:20"))
    assert res.issues[0].kind == "range" and res.issues[0].iterators == ("i",)
    _, res = parse_match(match_g2bmm, G2.replace("Q[b, i, k]", "Q[b, i + j, k]"))
    assert isinstance(res, Mismatch)
    assert any(i.kind == "group" for i in res.issues)


def test_gbmm_models_definition_and_transposed_v():
    e, res = parse_match(match_gbmm, GB)
    res = check_kernels(res, e)
    assert bparams(res, "b", "m", "w", "n", "d") == (2, 30, 2, 8, 3)
    e, res = parse_match(match_gbmm, """S: [2, 30, 5]
V: [8, 30, 2]
L<b=0:2, i=0:30, n=0:8> Sum<j=-2:3> V[n, i + 3*j, b] * S[b, i, j + 2]""")
    res = check_kernels(res, e)
    assert bparams(res, "w", "d", "n") == (2, 3, 8) and len(res.kernels) == 1


def test_gbmm_mismatches():
    _, res = parse_match(match_gbmm, GB.replace("i + 3*j - 6", "i + 3*j - 3"))
    assert res.issues[0].kind == "offset" and res.issues[0].expected == -6
    _, res = parse_match(match_gbmm, GB.replace("S[b, i, j]", "S[b, i, j] * S[b, i, j]"))
    assert res.issues[0].kind == "body"


def test_registry_reports_every_operator():
    import ollie

    e = ollie.parse(G2)
    got = match_all(e.root, e.inputs)
    assert set(got) == {"Matmul", "Conv", "G2BMM", "GBMM"}
    assert got["G2BMM"] and not got["GBMM"]
    assert not got["Matmul"] and got["Matmul"].of_kind("mixed")[0].iterators == ("i", "j")


# --------------------------------------------------------------------- property
@st.composite
def band_like(draw, op: str):
    w, d, m = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(3, 12))
    nb, nf = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    bs = [(f"b{t}", draw(st.integers(1, 2))) for t in range(nb)]
    fs = [(f"f{t}", draw(st.integers(1, 3))) for t in range(nf)]
    jlo = draw(st.sampled_from([0, -w, 1]))
    o = -d * (jlo + w)
    band = f"i + {d}*j + {o}"
    j_or_f = [("j", 2 * w + 1, f"j - {jlo}")] if op == "GBMM" else [(n, s, n) for n, s in fs]
    first = [(n, s, n) for n, s in bs] + [("i", m, "i")] + j_or_f
    second = [(n, s, n) for n, s in bs] + [("i", m, band)] + [(n, s, n) for n, s in fs]
    first, second = draw(st.permutations(first)), draw(st.permutations(second))
    trav = [(n, 0, s) for n, s in bs] + [("i", 0, m)]
    trav += [("j", jlo, jlo + 2 * w + 1)] if op == "G2BMM" else [(n, 0, s) for n, s in fs]
    summ = [(n, 0, s) for n, s in fs] if op == "G2BMM" else [("j", jlo, jlo + 2 * w + 1)]
    if draw(st.booleans()):
        trav = draw(st.permutations(trav))
    fmt = lambda its: ", ".join(f"{a}={lo}:{hi}" for a, lo, hi in its)  # noqa: E731
    a = f"A[{', '.join(x[2] for x in first)}]"
    b = f"B[{', '.join(x[2] for x in second)}]"
    body = f"{a} * {b}" if draw(st.booleans()) else f"{b} * {a}"
    head = f"L<{fmt(trav)}>" + (f" Sum<{fmt(summ)}>" if summ else "")
    text = f"A: {[x[1] for x in first]}\nB: {[x[1] for x in second]}\n{head} {body}"
    return text, w, d, m


@given(band_like("G2BMM"), st.integers(0, 2))
def test_random_g2bmm(case, seed):
    text, w, d, m = case
    e, res = parse_match(match_g2bmm, text)
    res = check_kernels(res, e, seed)
    assert bparams(res, "w", "m") == (w, m), text
    if w > 0:
        assert res.params["d"] == d


@given(band_like("GBMM"), st.integers(0, 2))
def test_random_gbmm(case, seed):
    text, w, d, m = case
    e, res = parse_match(match_gbmm, text)
    res = check_kernels(res, e, seed)
    assert bparams(res, "w", "m", "d") == (w, m, d), text
