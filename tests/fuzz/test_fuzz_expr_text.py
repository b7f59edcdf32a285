"""Fuzzing the expression text: malformed text gets an OllieError, never a crash.

Valid texts are mutated at random: characters and tokens deleted, inserted, replaced or
duplicated, truncation, duplicated lines, huge numbers, deep nesting, non-ASCII characters and
NUL bytes. The valid texts are the examples of EXPR_SYNTAX.md, what ``ollie.lower`` writes for
a few operators, and random well-formed expressions (``ollie.testing.strategies.exprs``).
``ollie.parse`` must either raise an :class:`~ollie.OllieError` or return an expression that
prints, parses back to the same fingerprint and canonical text, and interprets on small random
inputs, in full and at sampled positions, to the same values (or raises an OllieError, e.g. for
sizes over the limits given here). ``ollie derive FILE`` on fuzzed files (bytes, so invalid
UTF-8 too) exits 0 or 2, with a one-line message naming the file on 2.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import numpy as np
from fuzz_util import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

import ollie
from ollie.cli import main
from ollie.errors import OllieError
from ollie.lower import lower
from ollie.semantics import random_inputs, sample_positions
from ollie.testing.strategies import exprs

SYNTAX_EXAMPLES = [
    """# Conv3x3, NCHW input, FCRS weight, padding 1
A: [1, 512, 7, 7]
K: [512, 512, 3, 3]
L<n=0:1, f=0:512, h=0:7, w=0:7> Sum<c=0:512, r=0:3, s=0:3>
    A[n, c, h+r-1, w+s-1] * K[f, c, r, s]
""",
    """# Matmul C[m, n] = A[m, k] B[k, n]
A: [64, 32]
B: [32, 16]
L<m=0:64, n=0:16> Sum<k=0:32> A[m, k] * B[k, n]
""",
    """X: [1, 8, 2, 2]
W: [8, 4, 4, 4]
L<n=0:1, c=0:4, h=0:4, w=0:4> Sum<f=0:8, y=0:2, x=0:2>
    X[n, f, y, x] * W[f, c, h + 1 - 2*y, w + 1 - 2*x]
""",
    """# G2BMM with width 2 and dilation 3
Q: [2, 100, 8]
K: [2, 100, 8]
L<b=0:2, i=0:100, j=0:5> Sum<k=0:8> Q[b, i, k] * K[b, i + 3*j - 6, k]
""",
    """A: [4, 8]
L<x=0:32> { L<i=0:4, j=0:8> A[i, j] * 2 }[x / 8, x % 8] + -2 * relu(A[0, x % 8])
""",
    """A: [3, 5]
L<i=-1:4, j=0:5> max(A[i, j], 0.5) / sqrt(abs(A[(i + 1) % 3, 4 - j]) + 1e-3) - tanh(A[i, j])
""",
]

LOWERED = [
    ("Conv2d", [("X", (1, 3, 6, 6)), ("W", (4, 3, 3, 3))], {"padding": 1, "stride": 2}),
    ("ConvTranspose2d", [("X", (1, 4, 3, 3)), ("W", (4, 2, 4, 4))], {"padding": 1, "stride": 2}),
    ("G2BMM", [("Q", (1, 8, 4)), ("K", (1, 8, 4))], {"width": 1, "dilation": 2}),
    ("Gemm", [("A", (3, 4)), ("B", (4, 5)), ("C", (5,))], {}),
    ("Reshape", [("X", (2, 3, 4))], {"shape": (6, 4)}),
    ("LeakyRelu", [("X", (2, 3))], {"alpha": 0.1}),
    ("Sigmoid", [("X", (2, 3))], {}),
]

HUGE = ["1152921504606846976", "1152921504606846977", "4611686018427387904", "99999999999",
        "2147483648", "1" + "0" * 29, "9" * 5000, "1e400", "1" + "0" * 400, "0" * 30 + "7"]
ODD = ["\x00", "é", "∑", "\u00a0", "\u200b", "٣", "😀", "\ufeff", "\t", "\r", "\n", "#"]
TOKENS = ["L", "Sum", "<", ">", "{", "}", "[", "]", "(", ")", ",", ":", "=", "+", "-", "*",
          "/", "%", "relu", "max", "exp", "i", "j", "k", "A", "X", "0", "1", "-1", "2", "0.5",
          "L<i=0:2>", "Sum<k=0:3>", "{ L<i=0:2> ", " }[i]"]
_TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|.", re.S)

MUTATIONS = ["delete", "insert", "replace", "replace", "token", "token", "token", "truncate",
             "line", "huge", "huge", "huge", "nest", "nest", "nest", "odd", "number", "number",
             "number", "operator", "operator", "index", "index"]

# limits for interpreting fuzzed expressions: small, so that big ones fail fast
MAX_BYTES = 1 << 24
MAX_WORK = 1 << 21


@functools.cache
def seeds() -> tuple[str, ...]:
    lowered = [ollie.format(lower(kind, ins, **attrs).expr) for kind, ins, attrs in LOWERED]
    return tuple(SYNTAX_EXAMPLES + lowered)


@st.composite
def mutation(draw: st.DrawFn, text: str) -> str:
    """``text`` with one random mutation."""
    n = len(text)
    body = max(text.find("L<"), 0) if draw(st.booleans()) else 0  # mostly past declarations
    pos = draw(st.integers(body, n))
    end = draw(st.integers(pos, min(n, pos + 12)))
    kind = draw(st.sampled_from(MUTATIONS))
    if kind == "delete":
        return text[:pos] + text[end:]
    if kind == "insert":
        return text[:pos] + draw(st.text(min_size=1, max_size=4)) + text[pos:]
    if kind == "replace":
        return text[:pos] + draw(st.sampled_from(TOKENS)) + text[end:]
    if kind == "token":
        toks = _TOKEN.findall(text)
        i = draw(st.integers(0, max(len(toks) - 1, 0)))
        op = draw(st.sampled_from(["drop", "dup", "swap", "sub"]))
        if not toks:
            return draw(st.sampled_from(TOKENS))
        if op == "drop":
            del toks[i]
        elif op == "dup":
            toks.insert(i, toks[i])
        elif op == "swap" and i + 1 < len(toks):
            toks[i], toks[i + 1] = toks[i + 1], toks[i]
        else:
            toks[i] = draw(st.sampled_from(TOKENS))
        return "".join(toks)
    if kind == "number":  # often stays valid: exercises odd ranges, shapes and indices
        nums = [m.span() for m in re.finditer(r"\d+", text)]
        if nums:
            a, b = draw(st.sampled_from(nums))
            return text[:a] + str(draw(st.integers(0, 12))) + text[b:]
    if kind == "operator":
        ops = [m.start() for m in re.finditer(r"[-+*/%]|relu|tanh|max|min", text)]
        if ops:
            a = draw(st.sampled_from(ops))
            b = a + len(re.match(r"[-+*/%]|\w+", text[a:]).group())
            new = draw(st.sampled_from(["+", "-", "*", "/", "%", "exp", "log", "min", "abs"]))
            return text[:a] + new + text[b:]
    if kind == "index":  # a compound index in place of an iterator read inside brackets
        names = sorted(set(re.findall(r"(\w+)=-?\d", text)))
        spots = [m.span(1) for m in re.finditer(r"[\[,]\s*(\w+)\s*(?=[\],+\-*/%])", text)]
        if names and spots:
            a, b = draw(st.sampled_from(spots))
            return text[:a] + draw(index_texts(tuple(names))) + text[b:]
    if kind == "truncate":
        return text[:pos]
    if kind == "line":
        lines = text.splitlines(keepends=True) or [""]
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:i + 1] + lines[i:])
    if kind == "huge":
        nums = [m.span() for m in re.finditer(r"\d+", text)]
        big = draw(st.sampled_from(HUGE))
        if nums and draw(st.booleans()):
            a, b = draw(st.sampled_from(nums))
            return text[:a] + big + text[b:]
        return text[:pos] + big + text[pos:]
    if kind == "nest":
        reads = [m.span() for m in re.finditer(r"[A-Za-z_]\w*\[[^\[\]]*\]", text)]
        if reads and draw(st.booleans()):
            pos, end = draw(st.sampled_from(reads))
        k = draw(st.sampled_from([2, 40, 49, 50, 51, 99, 100, 101, 150, 300]))
        opener, closer = draw(st.sampled_from([("(", ")"), ("-", ""), ("relu(", ")"),
                                               ("max(0, ", ")"), ("{ L<t=0:2> ", " }[0]"),
                                               ("A[i] + ", ""), ("[", "]")]))
        return text[:pos] + opener * k + text[pos:end] + closer * k + text[end:]
    return text[:pos] + draw(st.sampled_from(ODD)) + text[pos:]


def index_texts(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Random index expressions over ``names``: sums, products, floor division, modulo."""
    leaves = st.one_of(st.sampled_from(names), st.integers(-3, 9).map(str))
    return st.recursive(leaves, lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-"]), sub).map(" ".join),
        st.tuples(st.integers(-3, 4), sub).map(lambda t: f"{t[0]}*({t[1]})"),
        st.tuples(sub, st.sampled_from(["/", "%"]), st.integers(1, 8)).map(
            lambda t: f"({t[0]}) {t[1]} {t[2]}"),
        sub.map(lambda t: f"-({t})")), max_leaves=6)


@st.composite
def fuzzed_texts(draw: st.DrawFn) -> str:
    text = draw(st.one_of(st.sampled_from(seeds()), exprs(depth=2).map(ollie.format)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3]))):
        text = draw(mutation(text))
    return text


def check_text(text: str) -> None:
    """The contract of ``ollie.parse`` on any text (see the module docstring)."""
    try:
        expr = ollie.parse(text)
    except OllieError:
        return
    assert isinstance(expr, ollie.Expr)
    printed = ollie.format(expr)
    again = ollie.parse(printed)
    assert again == expr and ollie.format(again) == printed
    assert ollie.fingerprint(again) == ollie.fingerprint(expr)
    try:
        inputs = random_inputs(expr, max_bytes=MAX_BYTES)
        full = ollie.interpret(expr, inputs, max_bytes=MAX_BYTES, max_work=MAX_WORK)
        at = sample_positions(expr.shape, 5, 0, max_bytes=MAX_BYTES)
        sampled = ollie.interpret(expr, inputs, at=at, max_bytes=MAX_BYTES, max_work=MAX_WORK)
    except OllieError:
        return
    assert full.shape == expr.shape and full.dtype == np.float32
    np.testing.assert_allclose(sampled, full[tuple(at.T)], rtol=1e-4, atol=1e-5)


@fuzz_settings(300)
@given(fuzzed_texts())
def test_parse_fuzzed_text_never_crashes(text):
    check_text(text)


SYNTAX_CHARS = st.sampled_from(list("ALSumrelx<>{}[](),:=+-*/%0123456789.eij \n#"))


@fuzz_settings(300)
@given(st.one_of(st.text(max_size=60), st.text(SYNTAX_CHARS, max_size=60),
                 st.text(SYNTAX_CHARS, max_size=40).map(lambda t: "A: [3]\nL<i=0:3> " + t)))
def test_parse_arbitrary_text_never_crashes(text):
    check_text(text)


@fuzz_settings(10)
@given(fuzzed_texts(), st.sampled_from([b"", b"", b"", b"", b"\xff", b"\xc3(", b"\xef\xbb\xbf"]),
       st.integers(0, 1 << 16))
def test_derive_fuzzed_file_exits_0_or_2(capsys, text, extra, where):
    data = text.encode()
    where = where % (len(data) + 1)
    data = data[:where] + extra + data[where:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzzed.expr"
        path.write_bytes(data)
        capsys.readouterr()
        status = main(["derive", str(path), "--max-depth", "1", "--time-budget", "1"])
        err = capsys.readouterr().err
    assert status in (0, 2)
    if status == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ollie: error: "), err
        assert str(path) in lines[0], err
