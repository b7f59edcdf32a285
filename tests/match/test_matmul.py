"""Matmul matching: worked examples, views and trans flags, layout eOperators, mismatches,
and a property test over random matmul-like expressions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from match_testutil import check_kernels, expect_match, parse_match

import ollie
from ollie.match import MatchResult, Mismatch, match_matmul
from ollie.program import View


def run(text: str) -> tuple[MatchResult | Mismatch, ollie.Expr]:
    e, res = parse_match(match_matmul, text)
    return res, e


def test_worked_example_inner_scope():
    res, e = run("A: [8, 5, 5]\nK: [3, 3, 6, 8]\n"
                 "L<t1=0:5, t2=0:5, r=0:3, s=0:3, f=0:6> Sum<c=0:8> A[c, t1, t2] * K[r, s, f, c]")
    res = check_kernels(res, e)
    p = res.params
    assert (p["b"], p["m"], p["n"], p["k"]) == (1, 25, 54, 8)
    assert p["trans_a"] is True and p["trans_b"] is True
    assert len(res.kernels) == 1 and not res.eops
    assert res.mapping["m"] == ("t1", "t2") and res.mapping["n"] == ("r", "s", "f")
    assert res.mapping["k"] == ("c",)
    assert res.library.views[0] == View(0, (1, 25, 8), (0, 1, 25))


def test_paper_bmm_variant_uses_views_with_offsets():
    res, e = run("C: [4, 1, 5, 7]\nD: [3, 4, 6, 3]\n"
                 "L<b=1:4, m=0:5, n=0:3> Sum<k=0:6> C[b, 0, m, 1 + k] * D[b - 1, b, k, n]")
    res = check_kernels(res, e)
    assert len(res.kernels) == 1
    assert dict(res.params) | {} == {"b": 3, "m": 5, "n": 3, "k": 6, "trans_a": False,
                                     "trans_b": False, "alpha": 1.0}
    va, vb = res.library.views
    assert va == View(36, (3, 5, 6), (35, 7, 1))
    assert vb == View(18, (3, 6, 3), (90, 3, 1))
    assert res.library.expr.root == e.root   # the kernel computes the scope itself


def test_output_transposed_picks_swapped_roles():
    res, e = run("A: [5, 7]\nB: [7, 3]\nL<n=0:3, m=0:5> Sum<k=0:7> 2 * A[m, k] * B[k, n]")
    res = check_kernels(res, e)
    assert len(res.kernels) == 1 and res.params["alpha"] == 2.0
    assert (res.params["m"], res.params["n"]) == (3, 5)
    assert res.mapping["A"] == ("Y",)


def test_padding_needs_a_layout_eop():
    res, e = run("A: [5, 7]\nB: [7, 3]\nL<m=0:5, n=0:3> Sum<k=0:7> A[m + 1, k] * B[k, n]")
    res = check_kernels(res, e)
    assert [k.kind for k in res.kernels] == ["eOp", "Matmul"]
    assert res.notes[0].kind == "layout" and "padding" in res.notes[0].message
    assert res.eops[0].params["bound"] == "memory"


def test_interleaved_output_needs_an_output_eop():
    res, e = run("A: [2, 3, 4]\nB: [4, 5]\n"
                 "L<m1=0:2, n=0:5, m2=0:3> Sum<k=0:4> A[m1, m2, k] * B[k, n]")
    res = check_kernels(res, e)
    assert [k.kind for k in res.kernels] == ["Matmul", "eOp"]
    assert res.params["m"] == 6


def test_batched_permuted_and_fused_groups():
    res, e = run("A: [4, 3, 2, 5]\nB: [5, 2, 6]\n"
                 "L<b=0:2, i=0:4, j=0:3, n=0:6> Sum<k=0:5> A[i, j, b, k] * B[k, b, n]")
    res = check_kernels(res, e)
    assert (res.params["b"], res.params["m"], res.params["n"], res.params["k"]) == (2, 12, 6, 5)


def test_divmod_in_one_group_is_a_layout_eop():
    res, e = run("A: [3, 4, 5]\nB: [5, 2]\n"
                 "L<m=0:12, n=0:2> Sum<k=0:5> A[m / 4, m % 4, k] * B[k, n]")
    res = check_kernels(res, e)
    assert res.params["m"] == 12


def test_outer_product_and_dot():
    res, e = run("A: [4]\nB: [3]\nL<i=0:4, j=0:3> A[i] * B[j]")
    res = check_kernels(res, e)
    assert res.params["k"] == 1
    res, e = run("A: [4]\nB: [4]\nL<z=0:1> Sum<k=0:4> A[k] * B[k]")
    res = check_kernels(res, e)
    assert (res.params["m"], res.params["n"], res.params["k"]) == (1, 1, 4)


def test_mismatch_conv_names_mixed_dimension():
    res, _ = run("A: [1, 4, 7, 7]\nK: [3, 4, 3, 3]\n"
                 "L<n=0:1, f=0:3, h=0:7, w=0:7> Sum<c=0:4, r=0:3, s=0:3> "
                 "A[n, c, h+r-1, w+s-1] * K[f, c, r, s]")
    assert isinstance(res, Mismatch) and not res
    mixed = res.of_kind("mixed")
    assert [(i.tensor, i.dim, i.iterators) for i in mixed] == [("A", 2, ("h", "r")),
                                                               ("A", 3, ("w", "s"))]
    assert all(i.hint == "variable_substitution" for i in mixed)
    assert "h + r - 1" in mixed[0].message


@pytest.mark.parametrize("text, group, its", [
    ("A: [4, 5, 3]\nB: [5, 2]\nL<m=0:4, n=0:2> Sum<k=0:5, u=0:3> A[m, k, u] * B[k, n]",
     "X", ("u",)),
    ("A: [4, 5]\nB: [5, 2]\nL<m=0:4, z=0:3, n=0:2> Sum<k=0:5> A[m, k] * B[k, n]", "O", ("z",)),
    ("A: [4, 5]\nB: [5, 2]\nL<m=0:4, n=0:2> Sum<k=0:5, q=0:2> A[m, k] * B[k, n]", "-", ("q",)),
])
def test_mismatch_names_the_group(text, group, its):
    res, _ = run(text)
    assert isinstance(res, Mismatch)
    (issue,) = res.issues
    assert issue.kind == "group" and issue.group == group and issue.iterators == its


def test_strict_mode_reports_layout():
    _, res = parse_match(lambda s, d: match_matmul(s, d, layout_eops=False),
                         "A: [5, 7]\nB: [7, 3]\nL<m=0:5, n=0:3> Sum<k=0:7> A[m, k - 1] * B[k, n]")
    assert isinstance(res, Mismatch) and res.kinds == {"layout"}
    assert res.issues[0].tensor == "A" and res.issues[0].hint == "layout_transformation"


def test_output_name_and_fresh_intermediates():
    e = ollie.parse("A: [5, 7]\nB: [7, 3]\nL<m=0:5, n=0:3> Sum<k=0:7> A[m, k - 1] * B[k, n]")
    res = expect_match(match_matmul(e.root, e.inputs, "T7"))
    assert res.output == "T7" and res.kernels[-1].output == "T7"
    assert res.kernels[0].output not in ("A", "B", "T7")


# --------------------------------------------------------------------- property
NAMES = ("a", "b", "c", "d", "e", "g", "h", "i")


@st.composite
def matmul_like(draw) -> str:
    names = iter(NAMES)
    groups = {g: [next(names) for _ in range(draw(st.integers(0, 2)))]
              for g in ("b", "m", "n", "k")}
    rng = {n: (draw(st.integers(-1, 1)), draw(st.integers(1, 3))) for g in groups.values()
           for n in g}

    def tensor(its: list[str]) -> tuple[list[int], list[str]]:
        dims = []
        for n in its:
            lo, size = rng[n]
            coef = draw(st.sampled_from([1, 1, 1, 2, -1]))
            slack = draw(st.integers(0, 2))
            shift = draw(st.integers(-1, slack + 1)) if draw(st.booleans()) else slack // 2
            first = lo if coef > 0 else lo + size - 1   # where the index is smallest
            dims.append((abs(coef) * (size - 1) + 1 + slack,
                         f"{coef}*{n} + {shift - coef * first}"))
        for _ in range(draw(st.integers(0, 1))):
            size = draw(st.integers(1, 2))
            dims.append((size, str(draw(st.integers(0, size - 1)))))
        order = draw(st.permutations(range(len(dims))))
        dims = [dims[i] for i in order] or [(1, "0")]
        return [d[0] for d in dims], [d[1] for d in dims]

    sa, ia = tensor(groups["b"] + groups["m"] + groups["k"])
    sb, ib = tensor(groups["b"] + groups["k"] + groups["n"])
    trav = draw(st.permutations(groups["b"] + groups["m"] + groups["n"])) or []
    summ = draw(st.permutations(groups["k"]))
    if not trav:
        trav, rng["z"] = ["z"], (0, 1)
    fmt = ", ".join
    head = f"L<{fmt(f'{n}={rng[n][0]}:{rng[n][0] + rng[n][1]}' for n in trav)}>"
    if summ:
        head += f" Sum<{fmt(f'{n}={rng[n][0]}:{rng[n][0] + rng[n][1]}' for n in summ)}>"
    x, y = f"A[{fmt(ia)}]", f"B[{fmt(ib)}]"
    if draw(st.booleans()):
        x, y = y, x
    scale = draw(st.sampled_from(["", "2 * ", "-"]))
    return f"A: {sa}\nB: {sb}\n{head} {scale}{x} * {y}"


@given(matmul_like(), st.integers(0, 3))
def test_random_matmul_like_expressions_match_and_agree(text, seed):
    res, e = run(text)
    check_kernels(res, e, seed)
