"""Parser limits: deep nesting, huge integers and ranks are ParseErrors with line:col, and every
expression the parser accepts prints, fingerprints and interprets without RecursionError."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import ollie
from ollie.errors import ParseError
from ollie.ir import verify
from ollie.ir.parser import MAX_DEPTH, MAX_INT, MAX_RANK
from ollie.semantics import random_inputs

HEAD = "A: [2]\nL<i=0:2> "


def _nested(opener: str, leaf: str, closer: str) -> Callable[[int], str]:
    return lambda k: HEAD + opener * k + leaf + closer * k


# family -> (text with k repetitions, largest k accepted at MAX_DEPTH = 100): a level per
# operator, negation, read or number, two per call, nested scope or index '/' '%', and one
# per parenthesis while open
FAMILIES: dict[str, tuple[Callable[[int], str], int]] = {
    "parentheses": (_nested("(", "A[i]", ")"), 99),
    "negated parentheses": (_nested("-(A[i] + ", "A[i]", ")"), 49),
    "operator chain": (lambda k: HEAD + " + ".join(["A[i]"] * (k + 1)), 99),
    "right-nested operators": (_nested("(A[i] - ", "A[i]", ")"), 98),
    "function calls": (_nested("relu(", "A[i]", ")"), 49),
    "binary calls": (_nested("max(A[i], ", "A[i]", ")"), 49),
    "nested scopes": (_nested("{ L<i=0:2> ", "A[i]", " }[i]"), 49),
    "scopes and operators": (_nested("{ L<i=0:2> A[i] + ", "A[i]", " }[i]"), 33),
    "minus and calls": (_nested("-relu(", "A[i]", ")"), 33),
    "index parentheses": (lambda k: HEAD + "A[" + "(" * k + "i" + ")" * k + "]", 100),
    "index div and mod": (lambda k: HEAD + "A[i" + " % 3 / 2" * (k // 2) + " % 3" * (k % 2)
                          + "]", 49),
    "index negations": (lambda k: HEAD + "A[" + "-(i + " * k + "i" + ")" * k + "]", 100),
}


def test_max_depth_is_documented():
    assert MAX_DEPTH == 100
    assert ollie.ir.parser.__doc__ and "MAX_DEPTH" in ollie.ir.parser.__doc__


@pytest.mark.parametrize("family", FAMILIES)
def test_nesting_past_the_limit_is_a_parse_error(family):
    text, largest = FAMILIES[family]
    ollie.parse(text(largest))
    for k in (largest + 1, 200, 3000):
        with pytest.raises(ParseError, match=rf"^2:\d+: .*deeper than {MAX_DEPTH} levels"):
            ollie.parse(text(k))


def test_signs_fold_at_any_count():
    assert ollie.parse(HEAD + "-" * 3001 + "A[i]") == ollie.parse(HEAD + "-A[i]")
    assert ollie.parse(HEAD + "-" * 3000 + "2") == ollie.parse(HEAD + "2")
    assert ollie.parse(HEAD + "A[" + "-" * 3000 + "i]") == ollie.parse(HEAD + "A[i]")


def _frames() -> int:
    f, n = sys._getframe(), 0
    while f is not None:
        f, n = f.f_back, n + 1
    return n


@contextmanager
def _stack_of(frames: int) -> Iterator[None]:
    """Run with at most ``frames`` more Python frames than the caller has."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_frames() + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize("family", FAMILIES)
def test_deepest_accepted_expression_survives_later_stages(family):
    text, largest = FAMILIES[family]
    text = text(largest)
    inputs = {"A": np.array([0.5, -0.25], np.float32)}
    # every stage within 600 frames: far below Python's default limit of 1000
    with _stack_of(600):
        expr = ollie.parse(text)
        printed = ollie.format(expr)
        again = ollie.parse(printed)
        assert again == expr and ollie.format(again) == printed
        assert ollie.fingerprint(again) == ollie.fingerprint(expr)
        verify(expr)
        full = ollie.interpret(expr, inputs)
        sampled = ollie.interpret(expr, inputs, at=np.array([[1]]))
    assert full.shape == (2,)
    np.testing.assert_allclose(sampled, full[1:], rtol=1e-6)


def test_derived_expressions_are_well_within_the_depth_limit():
    # what 13 derivation steps made of the G2BMM example (EXPR_SYNTAX.md): 13 nested scopes
    inner = "Sum<k=0:8> Q[b, t1, k] * K[b, t1 + 3*j - 6, k]"
    text = "Q: [2, 100, 8]\nK: [2, 100, 8]\nL<b=0:2, i=0:100, j=0:5> "
    for n in range(12):
        t = "t1" if n % 2 == 0 else "t"
        text += f"{{ L<b=0:2, {'t=6:106' if t == 't' else 't1=0:100'}, j=0:5> "
    text += "{ L<b=0:2, t1=0:100, j=0:5> " + inner + " }[b, t - 3*j, j]"
    for n in range(11):
        text += " }[b, t1 + 3*j, j]" if n % 2 == 0 else " }[b, t - 3*j, j]"
    text += " }[b, i + 3*j, j]"
    expr = ollie.parse(text)
    assert ollie.parse(ollie.format(expr)) == expr
    with pytest.raises(ParseError):  # twice as deep would not be: the limit has room
        ollie.parse(HEAD + "{ L<i=0:2> " * 2 * 26 + "A[i]" + " }[i]" * 2 * 26)


BIG = "1" + "0" * 29  # 10**29
RANK_ITERS = ", ".join(f"k{n}=0:1" for n in range(MAX_RANK))


@pytest.mark.parametrize("text, at, what", [
    (f"A: [4]\nL<i=0:4> A[i + {BIG}]", BIG, "is too large"),
    (f"A: [4]\nL<i=0:1{BIG}> A[i % 4]", "1" + BIG, "is too large"),
    (f"A: [4]\nL<i=-1{BIG}:0> A[i % 4]", "1" + BIG, "is too large"),
    (f"A: [4]\nL<i=0:4> Sum<k=0:{BIG}> A[i]", BIG, "is too large"),
    (f"A: [1{BIG}]\nL<i=0:4> A[i]", "1" + BIG, "is too large"),
    ("A: [4]\nL<i=0:4> A[i * " + "9" * 5000 + "]", "9" * 5000, "is too large"),
    ("A: [4]\nL<i=0:4> A[i] * 1e400", "1e400", "is too large"),
    ("A: [4]\nL<i=0:4> A[i] * " + "9" * 400, "9" * 400, "is too large"),
    (f"A: [4]\nL<i=0:4> A[i * {MAX_INT} * 4]", "i *", "takes values beyond"),
    (f"A: [4]\nL<i=0:4> A[(i * {MAX_INT} * 4) / 3]", "(i *", "takes values beyond"),
    (f"A: [4]\nL<i=0:4> A[i / {MAX_INT} / {MAX_INT}]", "i /", "takes values beyond"),
    (f"A: [4]\nL<i={-MAX_INT}:{2 - MAX_INT}> A[i - 1]", "i - 1", "takes values beyond"),
    (f"A: [4]\nL<i=0:{MAX_INT}, j=0:4> A[j]", "L<", "elements, more than 2**60"),
    (f"A: [{MAX_INT}, 2]\nL<j=0:4> A[j, 0]", "A:", "elements, more than 2**60"),
    ("A: [" + ", ".join(["1"] * (MAX_RANK + 1)) + "]\nL<i=0:4> A[i]", "A:",
     f"more than {MAX_RANK} dimensions"),
    (f"A: [4]\nL<{RANK_ITERS}> Sum<s=0:2> A[s]", "s=", f"at most {MAX_RANK} iterators"),
])
def test_huge_numbers_and_ranks_are_parse_errors(text, at, what):
    offset = text.index(at)
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    with pytest.raises(ParseError) as info:
        ollie.parse(text)
    assert str(info.value).startswith(f"{line}:{col}:"), str(info.value)
    assert what in str(info.value)


def test_integers_up_to_the_limit_parse_and_interpret():
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    e = ollie.parse(f"A: [4]\nL<i=0:4> A[i + {MAX_INT} - {MAX_INT}]")
    np.testing.assert_array_equal(ollie.interpret(e, {"A": a}), a)
    e = ollie.parse(f"A: [4]\nL<i=0:4> A[(i + {MAX_INT - 4}) % {MAX_INT}]")
    np.testing.assert_array_equal(ollie.interpret(e, {"A": a}), np.zeros(4))
    # a sum over 2**61 points that the body does not use: exact, and no whole-axis array
    e = ollie.parse(f"A: [4]\nL<i=0:4> Sum<k={-MAX_INT}:{MAX_INT}> A[i]")
    np.testing.assert_allclose(ollie.interpret(e, {"A": a}), a * 2.0**61, rtol=1e-6)
    e = ollie.parse("A: [" + ", ".join(["1"] * MAX_RANK) + "]\nL<"
                    + ", ".join(f"k{n}=0:1" for n in range(MAX_RANK)) + "> A["
                    + ", ".join(f"k{n}" for n in range(MAX_RANK)) + "] * 2")
    assert ollie.interpret(e, random_inputs(e)).shape == (1,) * MAX_RANK
