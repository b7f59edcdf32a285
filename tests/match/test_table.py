"""The iterator mapping table: groups, coefficients, mixed and non-affine dimensions, body
checks, printing."""

from __future__ import annotations

import ollie
from ollie.match import IterTable, Mismatch, build_table

WORKED = """A: [8, 5, 5]
K: [3, 3, 6, 8]
L<t1=0:5, t2=0:5, r=0:3, s=0:3, f=0:6> Sum<c=0:8> A[c, t1, t2] * K[r, s, f, c]
"""

CONV = """A: [1, 4, 7, 7]
K: [3, 4, 3, 3]
L<n=0:1, f=0:3, h=0:7, w=0:7> Sum<c=0:4, r=0:3, s=0:3> A[n, c, h+r-1, w+s-1] * K[f, c, r, s]
"""


def table(text: str) -> IterTable:
    e = ollie.parse(text)
    t = build_table(e.root, e.inputs)
    assert isinstance(t, IterTable), str(t)
    return t


def test_worked_example_groups():
    t = table(WORKED)
    assert t.groups() == {"XO": ("t1", "t2"), "YO": ("r", "s", "f"), "XY": ("c",)}
    assert t.x.name == "A" and t.y.name == "K" and t.scale == 1.0
    assert not t.mixed() and not t.nonaffine()
    assert [d.coefs for d in t.dims_of("X")] == [{"c": 1}, {"t1": 1}, {"t2": 1}]


def test_bmm_variant_coefficients_and_constants():
    t = table("C: [4, 1, 5, 7]\nD: [3, 4, 6, 3]\n"
              "L<b=1:4, m=0:5, n=0:3> Sum<k=0:6> C[b, 0, m, 1 + k] * D[b - 1, b, k, n]")
    assert t.groups() == {"XYO": ("b",), "XO": ("m",), "YO": ("n",), "XY": ("k",)}
    x1 = t.dims_of("X")[1]
    assert x1.groups == () and x1.const == 0
    assert t.dims_of("X")[3].const == 1
    assert t.dims_of("Y")[0].coefs == {"b": 1} and t.dims_of("Y")[0].const == -1


def test_conv_mixed_dimensions():
    t = table(CONV)
    mixed = t.mixed()
    assert [(d.tensor, d.dim) for d in mixed] == [("A", 2), ("A", 3)]
    assert mixed[0].groups == ("XO", "XY") and mixed[0].coefs == {"h": 1, "r": 1}
    assert mixed[0].const == -1


def test_other_groups_and_nonaffine():
    t = table("A: [4, 6]\nB: [6]\nL<m=0:4, z=0:2> Sum<k=0:6, u=0:3, q=0:2> "
              "A[m, (k + u) / 2] * B[k % 6]")
    assert t.group("O") == ("z",) and t.group("X") == ("u",) and t.group("-") == ("q",)
    assert [(d.tensor, d.dim) for d in t.nonaffine()] == [("A", 1), ("B", 0)]
    assert [(d.tensor, d.dim) for d in t.mixed()] == [("A", 1)]


def test_constant_factor_and_negation():
    t = table("A: [2, 3]\nB: [3, 2]\nL<i=0:2, j=0:2> Sum<k=0:3> -(2 * A[i, k]) * B[k, j] / 4")
    assert t.scale == -0.5


def test_body_mismatches():
    for text, word in [
        ("A: [2, 3]\nL<i=0:2> Sum<k=0:3> A[i, k]", "1 tensor"),
        ("A: [2, 3]\nL<i=0:2> Sum<k=0:3> A[i, k] * A[i, k] * A[i, k]", "3 tensor"),
        ("A: [2, 3]\nL<i=0:2> Sum<k=0:3> A[i, k] + A[i, k]", "not a product"),
        ("A: [2, 3]\nL<i=0:2> Sum<k=0:3> relu(A[i, k]) * A[i, k]", "not a product"),
        ("A: [2, 3]\nL<i=0:2> Sum<k=0:3> { L<a=0:2, b=0:3> A[a, b] }[i, k] * A[i, k]",
         "nested scope"),
    ]:
        e = ollie.parse(text)
        t = build_table(e.root, e.inputs)
        assert isinstance(t, Mismatch) and not t
        assert t.issues[0].kind == "body" and word in t.issues[0].message, str(t)


def test_table_print():
    text = str(table(CONV))
    assert "XO    | n=0:1, h=0:7, w=0:7" in text
    assert "XY    | c=0:4, r=0:3, s=0:3" in text
    assert "X:A[2] | h + r - 1 | h:1 r:1 | XO,XY MIXED" in text
