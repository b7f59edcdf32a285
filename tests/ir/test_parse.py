"""Text syntax: parse/format round trip, canonical printing, errors with line:col."""

import pytest
from hypothesis import given

import ollie
from ollie.errors import ExprError, OllieError, ParseError
from ollie.ir import Access, BinOp, Const, Iter, Neg, Scope, var, verify
from ollie.testing.strategies import exprs

CONV = """# Conv3x3, NCHW input, FCRS weight, padding 1
A: [1, 512, 7, 7]
K: [512, 512, 3, 3]
L<n=0:1, f=0:512, h=0:7, w=0:7> Sum<c=0:512, r=0:3, s=0:3>
    A[n, c, h+r-1, w+s-1] * K[f, c, r, s]
"""

TCONV = """X: [1, 8, 2, 2]
W: [8, 4, 4, 4]
L<n=0:1, c=0:4, h=0:4, w=0:4> Sum<f=0:8, y=0:2, x=0:2>
    X[n, f, y, x] * W[f, c, h + 1 - 2*y, w + 1 - 2*x]
"""


def test_conv_canonical_text():
    e = ollie.parse(CONV)
    assert ollie.format(e) == (
        "A: [1, 512, 7, 7]\nK: [512, 512, 3, 3]\n"
        "L<n=0:1, f=0:512, h=0:7, w=0:7> Sum<c=0:512, r=0:3, s=0:3> "
        "A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s]\n")
    assert str(e) == ollie.format(e)
    assert e.shape == (1, 512, 7, 7)
    assert e.inputs == {"A": (1, 512, 7, 7), "K": (512, 512, 3, 3)}


def test_structure_of_parsed_expression():
    e = ollie.parse(TCONV)
    root = e.root
    assert [it.name for it in root.traversal] == ["n", "c", "h", "w"]
    assert root.summation == (Iter("f", 0, 8), Iter("y", 0, 2), Iter("x", 0, 2))
    assert isinstance(root.body, BinOp) and root.body.op == "*"
    w = root.body.rhs
    assert isinstance(w, Access) and w.source == "W"
    assert w.indices[2] == var("h") - var("y") * 2 + 1


def test_nested_scope_and_negative_range():
    t = ("A: [4, 8]\n"
         "L<x=0:32> { L<i=-1:4, j=0:8> A[i, j] * 2 }[x / 8, x % 8] + -2 * relu(A[0, x % 8])")
    e = ollie.parse(t)
    acc = e.root.body.lhs
    assert isinstance(acc.source, Scope)
    assert acc.source.traversal[0] == Iter("i", -1, 4)
    assert ollie.parse(ollie.format(e)) == e


def test_operator_precedence_and_associativity():
    e = ollie.parse("A: [2]\nL<i=0:2> A[i] - (A[i] - A[i]) / (A[i] * 2) - -A[i]")
    body = e.root.body
    assert body.op == "-" and isinstance(body.rhs, Neg)
    assert body.lhs.op == "-" and body.lhs.rhs.op == "/"
    assert ollie.parse(ollie.format(e)) == e
    # a constant with unary minus is a negative constant
    assert ollie.parse("A: [2]\nL<i=0:2> -2").root.body == Const(-2.0)


@given(exprs(depth=1))
def test_round_trip(e):
    verify(e)
    text = ollie.format(e)
    e2 = ollie.parse(text)
    assert e2 == e
    assert ollie.format(e2) == text


@pytest.mark.parametrize("text, pos, what", [
    ("A: [3]\nL<i=0:3> B[i]", "2:10", "tensor 'B' is not declared"),
    ("A: [3]\nL<i=0:3> A[j]", "2:12", "unbound iterator 'j'"),
    ("A: [3]\nL<i=0:3> A[i, i]", "2:11", "rank 1"),
    ("A: [3]\nL<i=0:3 A[i]", "2:9", "expected ',' or '>'"),
    ("A: [3]\nL<i=0:3> A[i*i]", "2:13", "integer literal on one side"),
    ("A: [3]\nL<i=3:3> A[i]", "2:3", "empty range"),
    ("A: [3]\nL<i=0:3> A[i/0]", "2:14", "positive integer literal"),
    ("A: [3]\nL<i=0:3> foo(A[i])", "2:10", "unknown function 'foo'"),
    ("A: [3]\nL<i=0:3> A[i] $", "2:15", "unexpected character"),
    ("A: [3]\nL<i=0:3> A[i] +", "2:16", "expected a tensor read"),
    ("A: [3]\nA: [4]\nL<i=0:3> A[i]", "2:1", "declared twice"),
    ("A: [0]\nL<i=0:3> A[i]", "1:5", "positive"),
    ("A: [3]\nL<i=0:3, i=0:2> A[i]", "2:10", "declared twice"),
    ("A: [3]\nL<i=0:3> A[i] * i", "2:17", "used as a value"),
    ("A: [3]\nL<i=0:3> max(A[i])", "2:10", "takes 2 argument"),
    ("A: [3]\nL<i=0:3> A[1.5]", "2:12", "integers"),
    ("A: [3]\nL<i=0:3> {L<j=0:3> A[i]}[i]", "2:22", "unbound iterator 'i'"),
    ("", "1:1", "expected a declaration"),
    ("A: [3]\nL<i=0:3> A[i] A[i]", "2:15", "expected end of input"),
])
def test_parse_errors(text, pos, what):
    with pytest.raises(ParseError) as info:
        ollie.parse(text)
    assert str(info.value).startswith(pos + ":"), str(info.value)
    assert what in str(info.value)
    assert isinstance(info.value, OllieError)


def test_parse_error_names_source_file():
    with pytest.raises(ParseError, match=r"^conv.expr:2:10: "):
        ollie.parse("A: [3]\nL<i=0:3> B[i]", source="conv.expr")


def test_verify_catches_programmatic_mistakes():
    ok = Scope((Iter("i", 0, 3),), (), Access("A", (var("i"),)))
    verify(ollie.Expr((("A", (3,)),), ok))
    bad = [
        Scope((Iter("i", 0, 3),), (), Access("A", (var("j"),))),
        Scope((Iter("i", 0, 3),), (), Access("B", (var("i"),))),
        Scope((Iter("i", 0, 3),), (), Access("A", (var("i"), var("i")))),
        Scope((Iter("i", 0, 3), Iter("i", 0, 2)), (), Access("A", (var("i"),))),
        Scope((Iter("i", 2, 2),), (), Access("A", (var("i"),))),
        Scope((Iter("i", 0, 3),), (), Access(Scope((Iter("j", 0, 3),), (), Access(
            "A", (var("i"),))), (var("i"),))),
    ]
    for root in bad:
        with pytest.raises(ExprError):
            verify(ollie.Expr((("A", (3,)),), root))
    with pytest.raises(ExprError):
        Neg(Const(1.0))
    with pytest.raises(ExprError):
        Const(float("nan"))
