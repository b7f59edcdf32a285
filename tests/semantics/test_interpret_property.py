"""Property test: the interpreter agrees with a brute-force loop evaluator on random scopes.

The brute-force evaluator below is written from EXPR_SYNTAX.md alone: it visits every traversal
point and every summation point with ``itertools.product``, evaluates indices with
``Affine.evaluate`` on Python ints and the body on float64 scalars, reads 0 outside a tensor or a
nested scope (indexed by iterator value) as a structural zero (a product with such a factor, or
a quotient with such a numerator, is 0 whatever the other operand; so are its negation and the
sum of two), and sums in loop order.
"""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ollie import interpret, parse
from ollie.ir import Access, BinOp, Call, Const, Expr, Iter, Scope, make_expr, neg, var
from ollie.semantics import gather, interpreter, random_inputs, sample_positions
from ollie.testing.strategies import inputs_with_specials, padded_products

FUNCS = {
    "relu": lambda x: max(x, 0.0) if not np.isnan(x) else x,
    "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "exp": np.exp,
    "log": np.log, "sqrt": np.sqrt, "abs": abs, "max": np.maximum, "min": np.minimum,
}


# --------------------------------------------------------------------- brute force
class Brute:
    """Per-point evaluation; also a magnitude bound (sum of |terms|) for the tolerance."""

    def __init__(self, inputs):
        self.inputs = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
        self.cache: dict[Scope, tuple[dict, dict]] = {}

    def scope(self, sc: Scope) -> tuple[dict, dict]:
        if sc not in self.cache:
            values, bounds = {}, {}
            t_ranges = [range(it.lo, it.hi) for it in sc.traversal]
            s_ranges = [range(it.lo, it.hi) for it in sc.summation]
            for tv in itertools.product(*t_ranges):
                total, bound = np.float64(0.0), 0.0
                for sv in itertools.product(*s_ranges):
                    env = dict(zip([it.name for it in sc.iters], tv + sv, strict=True))
                    v, m = self.body(sc.body, env)
                    total += v
                    bound += m
                values[tv], bounds[tv] = total, bound
            self.cache[sc] = values, bounds
        return self.cache[sc]

    def read(self, acc: Access, env) -> tuple[float, float, bool]:
        idx = tuple(int(i.evaluate(env)) for i in acc.indices)
        if isinstance(acc.source, Scope):
            values, bounds = self.scope(acc.source)
            if idx in values:
                return values[idx], bounds[idx], False
            return np.float64(0.0), 0.0, True
        arr = self.inputs[acc.source]
        if all(0 <= i < d for i, d in zip(idx, arr.shape, strict=True)):
            return arr[idx], abs(arr[idx]), False
        return np.float64(0.0), 0.0, True

    def body(self, node, env) -> tuple[float, float]:
        """Value and a bound on the magnitude of the rounding-sensitive parts."""
        v, m, _ = self.body_z(node, env)
        return v, m

    def body_z(self, node, env) -> tuple[float, float, bool]:
        """:meth:`body` and whether the value is a structural zero."""
        if isinstance(node, Const):
            return np.float64(node.value), abs(node.value), False
        if isinstance(node, Access):
            return self.read(node, env)
        if isinstance(node, BinOp):
            (a, ma, za), (b, mb, zb) = self.body_z(node.lhs, env), self.body_z(node.rhs, env)
            if node.op == "+":
                return a + b, ma + mb, za and zb
            if node.op == "-":
                return a - b, ma + mb, za and zb
            if node.op == "*":
                return (np.float64(0.0), 0.0, True) if za or zb else (a * b, ma * mb, False)
            if za:
                return np.float64(0.0), 0.0, True
            return a / b, abs(ma / b), False
        if isinstance(node, Call):
            args = [self.body_z(x, env)[0] for x in node.args]
            v = np.float64(FUNCS[node.fn](*args))
            return v, abs(v), False
        v, m, z = self.body_z(node.x, env)  # Neg
        return -v, m, z

    def run(self, expr: Expr) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(all="ignore"):
            values, bounds = self.scope(expr.root)
        out, mag = np.zeros(expr.shape), np.zeros(expr.shape)
        los = [it.lo for it in expr.root.traversal]
        for tv, v in values.items():
            pos = tuple(t - lo for t, lo in zip(tv, los, strict=True))
            out[pos], mag[pos] = v, bounds[tv]
        return out, mag


def assert_matches(actual: np.ndarray, expected: np.ndarray, mag: np.ndarray, text: str):
    exp32 = expected.astype(np.float32)
    with np.errstate(all="ignore"):
        nan_ok = np.isnan(actual) == np.isnan(exp32)
        equal = actual == exp32
        tol = 1e-5 * np.abs(exp32) + 1e-9 * np.where(np.isfinite(mag), mag, 0) + 1e-30
        near = np.abs(actual.astype(np.float64) - exp32) <= tol
    ok = nan_ok & (equal | near | (np.isnan(actual) & np.isnan(exp32)))
    assert ok.all(), f"{text}\nactual {actual[~ok]}\nexpected {exp32[~ok]}"


# --------------------------------------------------------------------- generators
TENSORS = {"A": (4,), "B": (3, 5), "C": (2, 3, 4)}


@st.composite
def indices(draw, names: list[str]):
    e = var(draw(st.sampled_from(names))) * draw(st.sampled_from([1, 1, 1, -1, 2, -2]))
    if len(names) > 1 and draw(st.booleans()):
        e = e + var(draw(st.sampled_from(names))) * draw(st.sampled_from([1, -1, 3]))
    e = e + draw(st.integers(-3, 3))
    kind = draw(st.sampled_from(["plain", "plain", "div", "mod"]))
    if kind == "div":
        e = e // draw(st.integers(2, 3))
    elif kind == "mod":
        e = e % draw(st.integers(2, 4))
    if draw(st.integers(0, 5)) == 0:
        e = e * 0 + draw(st.integers(-1, 4))  # constant index, maybe out of range
    return e


@st.composite
def reads(draw, names: list[str], depth: int):
    if depth > 0 and draw(st.integers(0, 4)) == 0:
        inner = draw(scopes(depth - 1))
        src: str | Scope = inner
        rank = len(inner.traversal)
    else:
        src = draw(st.sampled_from(sorted(TENSORS)))
        rank = len(TENSORS[src])
    return Access(src, tuple(draw(indices(names)) for _ in range(rank)))


@st.composite
def bodies(draw, names: list[str], depth: int, size: int = 3):
    if size <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 5)) == 0:
            return Const(float(draw(st.sampled_from([0.5, 2.0, -1.5, 0.0]))))
        return draw(reads(names, depth))
    kind = draw(st.sampled_from(["+", "-", "*", "*", "/", "call", "neg"]))
    if kind == "call":
        fn = draw(st.sampled_from(sorted(FUNCS)))
        arity = 2 if fn in ("max", "min") else 1
        return Call(fn, tuple(draw(bodies(names, depth, size - 1)) for _ in range(arity)))
    if kind == "neg":
        return neg(draw(bodies(names, depth, size - 1)))
    return BinOp(kind, draw(bodies(names, depth, size - 1)), draw(bodies(names, depth, size - 1)))


@st.composite
def iter_lists(draw, prefix: str, lo: int, hi: int):
    out = []
    for k in range(draw(st.integers(lo, hi))):
        start = draw(st.integers(-2, 2))
        out.append(Iter(f"{prefix}{k}", start, start + draw(st.integers(1, 4))))
    return tuple(out)


@st.composite
def scopes(draw, depth: int = 1):
    traversal = draw(iter_lists("t", 1, 3))
    summation = draw(iter_lists("s", 0, 2))
    names = [it.name for it in traversal + summation]
    return Scope(traversal, summation, draw(bodies(names, depth)))


@st.composite
def expressions(draw):
    expr = make_expr(TENSORS, draw(scopes()))
    return parse(str(expr))  # well-formed text that round-trips


@given(expressions(), st.integers(0, 3))
def test_interpreter_matches_brute_force(expr, seed):
    inputs = random_inputs(expr, seed)
    expected, mag = Brute(inputs).run(expr)
    actual = interpret(expr, inputs)
    assert actual.shape == expr.shape and actual.dtype == np.float32
    assert_matches(actual, expected, mag, str(expr))
    pts = sample_positions(expr.shape, 5, np.random.default_rng(seed))
    sampled = interpret(expr, inputs, at=pts)
    assert_matches(sampled, expected[tuple(pts.T)], mag[tuple(pts.T)], str(expr))


def check_chunked_and_sparse(expr, inputs, pts, expected, mag) -> None:
    """Chunked and sparse evaluation (tiny chunk limits, every scope sparse), full and at
    ``pts``, give the brute force's ``expected`` values."""
    with mock.patch.object(interpreter, "MAX_ELEMENTS", 8), \
            mock.patch.object(gather, "MAX_ELEMENTS", 8), \
            mock.patch.object(interpreter, "SPARSE_FRACTION", 1.0):
        actual = interpret(expr, inputs)
        sampled = interpret(expr, inputs, at=pts)
    assert_matches(actual, expected, mag, str(expr))
    assert_matches(sampled, expected[tuple(pts.T)], mag[tuple(pts.T)], str(expr))


@given(expressions())
def test_chunked_and_sparse_evaluation_match_brute_force(expr):
    inputs = random_inputs(expr, 1)
    expected, mag = Brute(inputs).run(expr)
    pts = sample_positions(expr.shape, 4, np.random.default_rng(0))
    check_chunked_and_sparse(expr, inputs, pts, expected, mag)


@given(expressions(), st.data())
def test_structural_zeros_with_nan_and_inf_match_brute_force(expr, data):
    """NaN and infinities in the inputs: full, sampled, chunked and sparse evaluation give the
    brute force's values (structural zeros annihilate them), NaN positions included."""
    inputs = data.draw(inputs_with_specials(expr, max_specials=2))
    expected, mag = Brute(inputs).run(expr)
    assert_matches(interpret(expr, inputs), expected, mag, str(expr))
    pts = sample_positions(expr.shape, 5, np.random.default_rng(0))
    assert_matches(interpret(expr, inputs, at=pts), expected[tuple(pts.T)], mag[tuple(pts.T)],
                   str(expr))
    check_chunked_and_sparse(expr, inputs, pts, expected, mag)


@given(padded_products(), st.data())
def test_padded_products_with_nan_and_inf_match_brute_force(expr, data):
    """Products of reads that leave their tensors, NaN and infinities in the inputs: full and
    sampled evaluation give the brute force's values, NaN positions included."""
    inputs = data.draw(inputs_with_specials(expr, max_specials=2))
    expected, mag = Brute(inputs).run(expr)
    assert_matches(interpret(expr, inputs), expected, mag, str(expr))
    pts = sample_positions(expr.shape, 6, np.random.default_rng(0))
    assert_matches(interpret(expr, inputs, at=pts), expected[tuple(pts.T)], mag[tuple(pts.T)],
                   str(expr))
