"""Conv matching: standard, strided / dilated / asymmetrically padded / cropped convolutions,
permuted layouts, missing batch and spatial axes, mismatches, and a property test over random
convolution attributes written as expressions."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from match_testutil import check_kernels, parse_match

from ollie.match import Mismatch, match_conv

CONV3 = """A: [1, 4, 7, 7]
K: [3, 4, 3, 3]
L<n=0:1, f=0:3, h=0:7, w=0:7> Sum<c=0:4, r=0:3, s=0:3> A[n, c, h+r-1, w+s-1] * K[f, c, r, s]
"""


def params(res, *keys):
    return tuple(res.params[k] for k in keys)


def test_conv3x3_pad1():
    e, res = parse_match(match_conv, CONV3)
    res = check_kernels(res, e)
    assert len(res.kernels) == 1 and res.library.expr.root == e.root
    assert params(res, "n", "c", "h", "w", "f", "r", "s") == (1, 4, 7, 7, 3, 3, 3)
    assert params(res, "ph", "pw", "ph_end", "pw_end", "sh", "sw", "dh", "dw") == (
        1, 1, 1, 1, 1, 1, 1, 1)
    assert res.params["groups"] == 1
    assert res.mapping["h"] == ("h",) and res.mapping["r"] == ("r",)


def test_nhwc_rscf_roles_swapped_strided_dilated_shifted():
    e, res = parse_match(match_conv, """A: [2, 7, 9, 4]
K: [3, 2, 5, 4]
L<n=0:2, f=0:5, h=-1:3, w=0:4> Sum<c=0:4, r=0:3, s=1:3>
    K[r, s - 1, f, c] * A[n, 2*h + r, w + 2*s - 1, c]""")
    res = check_kernels(res, e)
    assert len(res.kernels) == 1   # NHWC input and RSFC weight are strided views
    assert params(res, "sh", "sw", "dh", "dw", "r", "s") == (2, 1, 1, 2, 3, 2)
    assert params(res, "ph", "pw", "ph_end", "pw_end") == (2, 0, 0, 0)
    assert res.mapping["input"] == ("Y",)


def test_negative_padding_is_a_cropped_view():
    e, res = parse_match(match_conv, """X: [1, 2, 8, 8]
W: [3, 2, 3, 3]
L<n=0:1, f=0:3, h=0:4, w=0:5> Sum<c=0:2, r=0:3, s=0:3>
    X[n, c, h + r + 1, w + s + 2] * W[f, c, r, s]""")
    res = check_kernels(res, e)
    assert params(res, "ph", "pw", "ph_end", "pw_end", "h", "w") == (0, 0, 0, 1, 6, 6)
    assert res.library.views[0].offset == 8 + 2


def test_missing_batch_and_weight_needing_a_flip_eop():
    e, res = parse_match(match_conv, """A: [4, 6, 9]
K: [5, 4, 3, 3]
L<f=0:5, h=0:6, w=0:9> Sum<c=0:4, r=0:3, s=0:3> A[c, h+r-1, w+s-1] * K[f, c, 2-r, s]""")
    res = check_kernels(res, e)
    assert [k.kind for k in res.kernels] == ["eOp", "Conv"]
    assert res.params["n"] == 1 and "negative stride" in res.notes[0].message


def test_one_by_k_and_one_dimensional():
    e, res = parse_match(match_conv, """A: [2, 4, 6, 9]
K: [5, 4, 3]
L<n=0:2, f=0:5, h=0:6, w=0:7> Sum<c=0:4, s=0:3> A[n, c, h, w + s] * K[f, c, s]""")
    res = check_kernels(res, e)
    assert params(res, "n", "h", "r", "s") == (2, 6, 1, 3)
    e, res = parse_match(match_conv, """A: [2, 4, 9]
K: [5, 4, 3]
L<n=0:2, f=0:5, w=0:7> Sum<c=0:4, s=0:3> A[n, c, w + s] * K[f, c, s]""")
    res = check_kernels(res, e)
    assert params(res, "n", "h", "w", "r", "s") == (2, 1, 9, 1, 3)


def test_constant_indices_padding_on_batch_and_output_eop():
    e, res = parse_match(match_conv, """A: [3, 2, 4, 6, 6]
K: [4, 5, 3, 3]
L<h=0:6, f=0:5, n=0:2, w=0:4> Sum<c=0:4, r=0:3, s=0:3>
    A[n + 2, 1, c, h + r - 1, w + s] * K[c, f, r, s]""")
    res = check_kernels(res, e)
    assert [k.kind for k in res.kernels] == ["eOp", "Conv", "eOp"]   # n + 1 reads padding
    assert params(res, "n", "c", "f") == (2, 4, 5)


def test_fused_channel_groups():
    e, res = parse_match(match_conv, """A: [1, 2, 3, 5, 5]
K: [4, 2, 3, 3]
L<f=0:4, h=0:3, w=0:3> Sum<c1=0:2, c2=0:3, r=0:3> A[0, c1, c2, h + r, w] * K[f, c1, c2, r]""")
    res = check_kernels(res, e)
    assert params(res, "c", "r", "s") == (6, 3, 1)
    assert len(res.kernels) == 1


def test_mismatch_negative_dilation():
    _, res = parse_match(match_conv, CONV3.replace("h+r-1", "h-r+1"))
    assert isinstance(res, Mismatch)
    (issue,) = res.issues
    assert issue.kind == "coefficient" and issue.iterators == ("h", "r") and issue.dim == 2


def test_mismatch_depthwise_group():
    _, res = parse_match(match_conv, """A: [1, 4, 7, 7]
K: [4, 3, 3]
L<n=0:1, c=0:4, h=0:5, w=0:5> Sum<r=0:3, s=0:3> A[n, c, h+r, w+s] * K[c, r, s]""")
    assert isinstance(res, Mismatch)
    assert res.issues[0].kind == "group" and res.issues[0].group == "XYO"
    assert res.issues[0].iterators == ("c",)


def test_mismatch_mixed_dimensions():
    _, res = parse_match(match_conv, CONV3.replace("h+r-1", "h+r+s"))
    assert isinstance(res, Mismatch) and res.kinds == {"mixed"}
    assert res.issues[0].iterators == ("h", "r", "s")
    _, res = parse_match(match_conv, """A: [1, 4, 7, 7]
K: [8, 3, 3]
L<n=0:1, f=0:3, h=0:5, w=0:5> Sum<c=0:4, r=0:3, s=0:3> A[n, c, h+r, w+s] * K[f + c, r, s]""")
    assert isinstance(res, Mismatch)
    assert res.issues[0].kind == "mixed" and res.issues[0].tensor == "K"


# --------------------------------------------------------------------- property
@st.composite
def conv_like(draw):
    n = draw(st.integers(0, 2))
    c, f = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sp = []
    for _ in range(2):
        size, k = draw(st.integers(3, 6)), draw(st.integers(1, 3))
        stride, dil = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        pad0, pad1 = draw(st.integers(-1, 2)), draw(st.integers(-1, 2))
        out = (size + pad0 + pad1 - dil * (k - 1) - 1) // stride + 1
        assume(out >= 1)
        o0, k0 = draw(st.integers(-1, 1)), draw(st.integers(0, 1))
        sp.append(dict(size=size, k=k, stride=stride, dil=dil, pad0=pad0, pad1=pad1, out=out,
                       o0=o0, k0=k0))
    (h, w), (r, s) = ("h", "w"), ("r", "s")
    xdims = [("c", c, "c")]
    if n:
        xdims.insert(0, ("n", n, "n"))
    for (o, t), a in zip(((h, r), (w, s)), sp, strict=True):
        const = -a["pad0"] - a["stride"] * a["o0"] - a["dil"] * a["k0"]
        xdims.append((o, a["size"], f"{a['stride']}*{o} + {a['dil']}*{t} + {const}"))
    if draw(st.booleans()):
        xdims.append(("z", 2, str(draw(st.integers(0, 1)))))
    wdims = [("f", f, "f"), ("c", c, "c")] + [
        (t, a["k"], f"{t} - {a['k0']}") for t, a in zip((r, s), sp, strict=True)]
    if draw(st.integers(0, 2)) == 0:
        xdims = draw(st.permutations(xdims))
        wdims = draw(st.permutations(wdims))
    trav = [("n", 0, n)] if n else []
    trav += [("f", 0, f)] + [(o, a["o0"], a["o0"] + a["out"])
                             for o, a in zip((h, w), sp, strict=True)]
    if draw(st.integers(0, 3)) == 0:
        trav = draw(st.permutations(trav))
    summ = [("c", 0, c)] + [(t, a["k0"], a["k0"] + a["k"]) for t, a in zip((r, s), sp,
                                                                           strict=True)]
    x = f"X[{', '.join(d[2] for d in xdims)}]"
    wt = f"W[{', '.join(d[2] for d in wdims)}]"
    body = f"{x} * {wt}" if draw(st.booleans()) else f"{wt} * {x}"
    fmt = lambda its: ", ".join(f"{a}={lo}:{hi}" for a, lo, hi in its)  # noqa: E731
    text = (f"X: {[d[1] for d in xdims]}\nW: {[d[1] for d in wdims]}\n"
            f"L<{fmt(trav)}> Sum<{fmt(summ)}> {body}")
    return text, n, c, f, sp


@given(conv_like(), st.integers(0, 2))
def test_random_convolutions_match_and_agree(case, seed):
    text, n, c, f, sp = case
    e, res = parse_match(match_conv, text)
    res = check_kernels(res, e, seed)
    p = res.params
    assert (p["n"], p["c"], p["f"]) == (max(n, 1), c, f), text
    keys = (("h", "ph", "ph_end", "sh", "dh", "r"), ("w", "pw", "pw_end", "sw", "dw", "s"))
    for axis, pad, end, st_, dil, k in keys:   # the first spatial dimension of X is "h"
        a = sp[("h", "w").index(res.mapping[axis][0])]
        assert p[pad] == max(a["pad0"], 0) and 0 <= p[end] <= max(a["pad1"], 0), text
        assert p[k] == a["k"]
        if a["k"] > 1:
            assert p[dil] == a["dil"]
        if a["out"] > 1:
            assert p[st_] == a["stride"]


@pytest.mark.parametrize("swap", [False, True])
def test_alpha_from_constant_factor(swap):
    text = CONV3.replace("A[n, c, h+r-1, w+s-1] * K[f, c, r, s]",
                         "K[f, c, r, s] * 0.5 * A[n, c, h+r-1, w+s-1]" if swap else
                         "-A[n, c, h+r-1, w+s-1] * K[f, c, r, s]")
    e, res = parse_match(match_conv, text)
    res = check_kernels(res, e)
    assert res.params["alpha"] == (0.5 if swap else -1.0)
