"""Property: derivations keep NaN and infinities exactly where the source expression has them.

With structural zeros (a read outside its tensor annihilates the products it is a factor of,
:mod:`ollie.semantics.interpreter`), ``interpret(derived) == interpret(source)`` holds for
inputs holding NaN and infinities too, NaN positions included, for every rule application but
two kinds, not NaN-exact by construction (:func:`not_nan_exact`):

* traversal merging of a nested scope *with summation* into a product distributes the product
  over the sum (``Sum_y (Sum_w g) * h -> Sum_y Sum_w g * h``), exact for finite values only
  (``(1 + 0) * inf`` is inf, ``1 * inf + 0 * inf`` is NaN);
* a data layout split of a dimension by a factor that does not divide it, where a read that
  leaves the dimension is a factor of a product: the copy holds an ordinary 0 where the read
  was a structural zero (``A: [5]``, ``A[3*i + j] * B[...]`` with ``3*i + j = 5``, split by 3:
  ``{ L<q=0:2, r=0:3> A[3*q + r] }[1, 2]`` is an element of the copy, 0, times a NaN is NaN).
  The Conv5x5 -> Conv3x3 program reads its kernel through such a copy.

The paper's Conv3x3 -> Matmul + OffsetAdd derivation is replayed on random padded
convolutions, every application of each step's rule checked.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.ir import Expr, Scope, accesses
from ollie.ir.structural import annihilating_reads
from ollie.rules import RULES, Derived
from ollie.rules.base import scope_at
from ollie.semantics.check import _compare_arrays
from ollie.testing.strategies import exprs, inputs_with_specials, padded_products

_INLINE = re.compile(r"inline nested scope #(\d+) at (?:root|scope ([\d.]+))$")


_SPLIT = re.compile(r"split (\w+) dim (\d+) by (\d+) at (?:root|scope ([\d.]+))$")


def _path(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")) if text else ()


def not_nan_exact(source: Expr, d: Derived) -> bool:
    """Whether ``d`` is one of the two kinds of application that are not NaN-exact (see the
    module docstring): it inlines a nested scope with summation into a product, or splits a
    dimension by a factor that does not divide it where a read leaving it is a factor."""
    m = _INLINE.match(d.note) if d.rule == "traversal_merging" else None
    if m is not None:
        reader = scope_at(source.root, _path(m.group(2)))
        inner = [a.source for a in accesses(reader.body) if isinstance(a.source, Scope)]
        return bool(inner[int(m.group(1))].summation)  # type: ignore[union-attr]
    m = _SPLIT.match(d.note) if d.rule == "data_layout_transformation" else None
    if m is not None:
        name, dim, k = m.group(1), int(m.group(2)), int(m.group(3))
        size = source.inputs[name][dim]
        scope = scope_at(source.root, _path(m.group(4)))
        return size % k != 0 and any(
            live and acc.source == name and
            not 0 <= acc.indices[dim].bounds(scope.ranges)[0] <=
            acc.indices[dim].bounds(scope.ranges)[1] < size
            for acc, live in annihilating_reads(scope.body))
    return False


def assert_nan_exact(source: Expr, derived: Expr, inputs: dict[str, np.ndarray],
                     what: str) -> None:
    want = ollie.interpret(source, inputs).astype(np.float64)
    got = ollie.interpret(derived, inputs).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    res = _compare_arrays(got, want, 1e-5, 1e-5)
    assert res.ok, f"{what}: max abs err {res.max_abs_err}, rel {res.max_rel_err}"


def check_rule(name: str, expr: Expr, inputs: dict[str, np.ndarray], limit: int = 12) -> int:
    """Every application of rule ``name`` (up to ``limit``) is NaN-exact on ``inputs``;
    returns how many were checked."""
    checked = 0
    for d in RULES[name](expr)[:limit]:
        if not_nan_exact(expr, d):
            continue
        assert_nan_exact(expr, d.expr, inputs,
                         f"{name}: {d.note}\n{ollie.format(expr)}\n->\n{ollie.format(d.expr)}")
        checked += 1
    return checked


@pytest.mark.parametrize("name", sorted(RULES))
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=40, deadline=None)
@given(expr=st.one_of(exprs(depth=1), padded_products()), data=st.data())
def test_rule_keeps_nan_and_infinities(name, expr, data):
    check_rule(name, expr, data.draw(inputs_with_specials(expr, max_specials=2)))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=15, deadline=None)
@given(expr=padded_products(), data=st.data())
def test_two_step_derivations_keep_nan_and_infinities(expr, data):
    inputs = data.draw(inputs_with_specials(expr, max_specials=2))
    for name in sorted(RULES):
        for d in RULES[name](expr)[:3]:
            if not_nan_exact(expr, d):
                continue
            for other in sorted(RULES):
                for d2 in RULES[other](d.expr)[:3]:
                    if not not_nan_exact(d.expr, d2):
                        assert_nan_exact(expr, d2.expr, inputs, f"{d.note} -> {d2.note}")


@st.composite
def padded_convolutions(draw) -> tuple[Expr, int]:
    """A 2-D convolution with zero padding ``p`` (stride 1, output as large as the padding
    allows) and its padding."""
    n, c, f = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    r, s = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    p = draw(st.integers(1, min(r, s) - 1))
    h, w = draw(st.integers(max(2, r - 2 * p), 6)), draw(st.integers(max(2, s - 2 * p), 6))
    ho, wo = h + 2 * p - r + 1, w + 2 * p - s + 1
    text = (f"A: [{n}, {c}, {h}, {w}]\nK: [{f}, {c}, {r}, {s}]\n"
            f"L<n=0:{n}, f=0:{f}, h=0:{ho}, w=0:{wo}> Sum<c=0:{c}, r=0:{r}, s=0:{s}> "
            f"A[n, c, h + r - {p}, w + s - {p}] * K[f, c, r, s]")
    return ollie.parse(text), p


CHAIN = (
    ("summation_splitting", r"^Sum<r,s \| c>"),
    ("variable_substitution", r"^shift h -> h \+ r at scope 0$"),
    ("variable_substitution", r"^shift w -> s \+ w at scope 0\.0$"),
    ("traversal_merging", r"at scope 0$"),
    ("traversal_merging", r"at root$"),
    ("boundary_tightening", r"^t=.* at scope 0$"),
    ("boundary_tightening", r"^t1=.* at scope 0$"),
)
"""The paper's Conv3x3 -> Matmul + OffsetAdd derivation (tests/rules/test_rules_examples.py),
step by step: a rule and the note of the application followed."""


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=12, deadline=None)
@given(case=padded_convolutions(), data=st.data())
def test_conv_to_matmul_and_offset_add_keeps_nan_and_infinities(case, data):
    """NaN and infinities in the input image (and the weights): the source expression has NaN
    and infinities exactly where ``F.conv2d`` has them (padding annihilates, as in the
    operator), and every application of each rule along the derivation keeps them."""
    expr, pad = case
    inputs = data.draw(inputs_with_specials(expr, max_specials=2))
    image = dict(inputs, K=np.random.default_rng(0).standard_normal(
        expr.inputs["K"]).astype(np.float32))
    want = F.conv2d(torch.from_numpy(image["A"]), torch.from_numpy(image["K"]),
                    padding=pad).numpy()
    got = ollie.interpret(expr, image)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    e = expr
    for rule, note in CHAIN:
        assert check_rule(rule, e, inputs, limit=40) > 0
        e = next(d.expr for d in RULES[rule](e) if re.search(note, d.note))
        assert_nan_exact(expr, e, inputs, f"{rule} ({note}):\n{ollie.format(e)}")
    matmul = [a.source for a in accesses(e.root.body) if isinstance(a.source, Scope)]
    assert len(matmul) == 1 and len(matmul[0].summation) == 1  # Matmul inside, OffsetAdd out
