"""The program text syntax (``ollie.ir.program_text``): ``NAME = <scope>`` defs after the
declarations and an ``out NAME, ...`` line; round trip with ``format_program``, errors with
``line:col``, and single expressions unchanged."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.errors import ParseError
from ollie.ir import format_program, is_program_text, parse, parse_program
from ollie.ir.exprprogram import ExprProgram
from ollie.testing.strategies import expr_programs

TEXT = """\
# a matmul, its bias and a transposed copy
x: [2, 4]
W: [4, 3]
b: [3]
Y = L<m=0:2, n=0:3> Sum<k=0:4> x[m, k] * W[k, n]
Z = L<m=0:2, n=0:3>
    Y[m, n] + b[n]
T = L<n=0:3, m=0:2> Z[m, n]
out T, Y
"""


def test_parse_program_reads_defs_in_order_with_implied_declarations():
    ep = parse_program(TEXT)
    assert isinstance(ep, ExprProgram)
    assert ep.inputs == (("x", (2, 4)), ("W", (4, 3)), ("b", (3,)))
    assert [n for n, _ in ep.defs] == ["Y", "Z", "T"]
    assert ep.outputs == ("T", "Y")
    defs = dict(ep.defs)
    assert defs["Y"].decls == (("x", (2, 4)), ("W", (4, 3)))
    assert defs["Z"].decls == (("b", (3,)), ("Y", (2, 3)))
    assert defs["T"].shape == (3, 2)
    assert ep.readers()["Z"] == ["T"]


def test_round_trip_is_canonical():
    ep = parse_program(TEXT)
    text = format_program(ep)
    assert text.splitlines()[-1] == "out T, Y"
    assert "Z = L<m=0:2, n=0:3> Y[m, n] + b[n]" in text
    assert parse_program(text) == ep
    assert format_program(parse_program(text)) == text


def test_tensor_named_out_and_program_detection():
    assert is_program_text(TEXT)
    assert is_program_text("x: [2]\nout = L<i=0:2> x[i]\nout out\n")
    ep = parse_program("out: [2]\nout2 = L<i=0:2> out[i]\nout out2\n")
    assert ep.outputs == ("out2",)
    for single in ("A: [2]\nL<i=0:2> A[i] * 2", "out: [2]\nL<i=0:2> out[i]", "",
                   "L<i=0:2, j=0:1> 1", "A: [2]\nL<i=0:2> A[i] \x00"):
        assert not is_program_text(single)
    assert ollie.parse("out: [2]\nL<i=0:2> out[i]").decls == (("out", (2,)),)


@pytest.mark.parametrize("text, where, what", [
    ("x: [2]\nout Y\n", "2:1:", "expected a declaration 'NAME: [...]' or a definition"),
    ("x: [2]\nY = L<i=0:2> x[i]\n", "3:1:", "expected a definition 'NAME = L<...>' or the "
                                           "outputs line 'out NAME, ...', found end of input"),
    ("x: [2]\nY = L<i=0:2> x[i]\nout x\n", "3:5:", "output 'x' is an input"),
    ("x: [2]\nY = L<i=0:2> x[i]\nout Z\n", "3:5:", "output 'Z' is not defined"),
    ("x: [2]\nY = L<i=0:2> x[i]\nout Y, Y\n", "3:8:", "listed twice"),
    ("x: [2]\nY = L<i=0:2> x[i]\nY = L<i=0:2> Y[i]\nout Y\n", "3:1:", "already defined"),
    ("x: [2]\nx = L<i=0:2> 1\nout x\n", "2:1:", "already defined"),
    ("x: [2]\nrelu = L<i=0:2> x[i]\nout relu\n", "2:1:", "reserved"),
    ("x: [2]\nY = L<i=0:2> Z[i]\nZ = L<i=0:2> x[i]\nout Y\n", "2:14:", "'Z' is not declared"),
    ("x: [2]\nY = x[0]\nout Y\n", "2:5:", "expected a scope 'L<...>' after 'Y ='"),
    ("x: [2]\nY = L<i=0:2> x[i]\nout Y Y\n", "3:7:", "expected ',' or end of input"),
    ("x: [2]\nY = L<i=0:2> x[i, i]\nout Y\n", "2:15:", "rank 1"),
])
def test_errors_name_line_and_column(text, where, what):
    with pytest.raises(ParseError) as err:
        parse_program(text, source="p.prog")
    msg = str(err.value)
    assert msg.startswith(f"p.prog:{where}") and what in msg, msg


def test_single_expression_text_is_not_a_program():
    with pytest.raises(ParseError, match="expected"):
        parse_program("A: [2]\nL<i=0:2> A[i]")
    e = parse("A: [2]\nL<i=0:2> A[i] * 2")
    assert e.shape == (2,)


PROGRAM_CHARS = st.sampled_from(list("ALSumrelxYZout<>{}[](),:=+-*/%0123456789.ij \n#"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(PROGRAM_CHARS, max_size=60).map(lambda t: "x: [3]\nY = L<i=0:3> " + t),
                 st.text(PROGRAM_CHARS, max_size=60).map(lambda t: "x: [3]\n" + t),
                 st.tuples(expr_programs(), st.integers(0, 400)).map(
                     lambda p: format_program(p[0])[:p[1]])))
def test_arbitrary_program_text_parses_or_raises_parse_error(text):
    """Text near the program syntax parses into a verified program, whose rules and
    normalisation then run without raising, or raises a ParseError, nothing else."""
    from ollie.rules.inter_program import apply_program_rules, normalize_program

    try:
        ep = parse_program(text)
    except ParseError as exc:
        assert str(exc).split(":")[0].isdigit()
        return
    ep.verify()
    apply_program_rules(normalize_program(ep))
