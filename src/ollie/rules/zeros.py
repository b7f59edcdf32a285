"""Zero analysis: where a scope body is provably zero, from zero padding and ranges alone.

``nonzero_interval(body, ranges, name, shapes)`` gives the half-open interval of values of
iterator ``name`` outside which ``body`` is exactly zero for every value of the other iterators
and of every tensor, NaN and infinities included (structural zeros,
:mod:`ollie.semantics.interpreter`). A read ``T[..., a*x + rest, ...]`` is a structural zero
unless ``0 <= a*x + rest < dim``; a product is one where a factor is (so the product
intersects its factors' *structural* intervals: ``relu(A[x - 9]) * B[x]`` is ``0 * NaN`` where
``B`` is NaN, only a product with a finite literal keeps its other factor's zeros), a quotient
where its numerator is (a quotient by a finite non-zero literal keeps its numerator's zeros),
sums take the hull, ``relu/tanh/abs/sqrt`` keep their argument's zeros (``relu(0)`` is 0, but
not a structural zero), and anything not provably zero (``exp``, ``sigmoid``) gives the whole
range. The analysis is conservative: it may miss zeros, never invents them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

from ollie.ir import Access, BinOp, Call, Const, Neg, Node, Scope, Var

Interval = tuple[int, int]
ZERO_PRESERVING = ("relu", "tanh", "abs", "sqrt")


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def access_extents(acc: Access, shapes: Mapping[str, tuple[int, ...]]) -> list[Interval]:
    """Half-open index ranges that read non-padding elements, per dimension."""
    if isinstance(acc.source, Scope):
        return [it.range for it in acc.source.traversal]
    return [(0, d) for d in shapes[acc.source]]


def read_interval(acc: Access, ranges: Mapping[str, tuple[int, int]], name: str,
                  shapes: Mapping[str, tuple[int, ...]]) -> Interval:
    """Values of ``name`` for which ``acc`` can read inside its tensor (hull, half-open)."""
    lo, hi = ranges[name]
    for idx, (dlo, dhi) in zip(acc.indices, access_extents(acc, shapes), strict=True):
        a = idx.coef(name)
        if name in idx.vars() and not (a and _only_top_level(idx, name)):
            continue  # used through div/mod: no conclusion
        rmin, rmax = idx.bounds({**ranges, name: (0, 1)})  # the rest: x contributes 0
        if a == 0:
            if rmax < dlo or rmin > dhi - 1:
                return (lo, lo)  # always out of bounds
            continue
        # dlo <= a*x + rest <= dhi - 1 for some rest
        tlo, thi = dlo - rmax, dhi - 1 - rmin
        if a > 0:
            xlo, xhi = _ceil_div(tlo, a), thi // a
        else:
            xlo, xhi = _ceil_div(thi, a), tlo // a
        lo, hi = max(lo, xlo), min(hi, xhi + 1)
    return (lo, max(lo, hi))


def _only_top_level(idx, name: str) -> bool:
    """``name`` appears only as a plain top-level term of ``idx`` (not inside div/mod)."""
    return all(isinstance(atom, Var) or name not in atom.arg.vars() for atom, _ in idx.terms)


def nonzero_interval(body: Node, ranges: Mapping[str, tuple[int, int]], name: str,
                     shapes: Mapping[str, tuple[int, ...]]) -> Interval:
    """Hull of the values of ``name`` where ``body`` may be non-zero (half-open)."""
    return _nonzero(body, tuple(sorted(ranges.items())), name,
                    tuple(sorted((k, tuple(v)) for k, v in shapes.items())))


@lru_cache(maxsize=1 << 16)
def _nonzero(body: Node, ranges_t: tuple, name: str, shapes_t: tuple) -> Interval:
    return _nonzero_interval(body, dict(ranges_t), name, dict(shapes_t))


def clear_cache() -> None:
    """Drop the memo of :func:`nonzero_interval` (see ``ollie.caches``)."""
    _nonzero.cache_clear()


def _nonzero_interval(body: Node, ranges: Mapping[str, tuple[int, int]], name: str,
                      shapes: Mapping[str, tuple[int, ...]]) -> Interval:
    return _intervals(body, ranges, name, shapes)[0]


def _intervals(body: Node, ranges: Mapping[str, tuple[int, int]], name: str,
               shapes: Mapping[str, tuple[int, ...]]) -> tuple[Interval, Interval]:
    """``(value, structural)``: hulls of the values of ``name`` where ``body`` may be
    non-zero, and where it may be other than a structural zero."""
    full = ranges[name]
    if isinstance(body, Const):
        return ((full[0], full[0]) if body.value == 0 else full), full
    if isinstance(body, Access):
        r = read_interval(body, ranges, name, shapes)
        return r, r
    if isinstance(body, Neg):
        return _intervals(body.x, ranges, name, shapes)
    if isinstance(body, BinOp):
        va, sa = _intervals(body.lhs, ranges, name, shapes)
        if body.op == "/":
            return (va if _finite_const(body.rhs, nonzero=True) else sa), sa
        vb, sb = _intervals(body.rhs, ranges, name, shapes)
        if body.op == "*":
            lo, hi = max(sa[0], sb[0]), min(sa[1], sb[1])
            s = (lo, max(lo, hi))
            if _finite_const(body.rhs):
                return va, s
            if _finite_const(body.lhs):
                return vb, s
            return s, s
        return _hull(va, vb), _hull(sa, sb)
    assert isinstance(body, Call)
    if body.fn in ZERO_PRESERVING:
        return _intervals(body.args[0], ranges, name, shapes)[0], full
    if body.fn in ("max", "min"):
        return _hull(*(_intervals(a, ranges, name, shapes)[0] for a in body.args)), full
    return full, full


def _finite_const(node: Node, nonzero: bool = False) -> bool:
    return isinstance(node, Const) and math.isfinite(node.value) and \
        (not nonzero or node.value != 0.0)


def _hull(a: Interval, b: Interval) -> Interval:
    if a[0] >= a[1]:
        return b
    if b[0] >= b[1]:
        return a
    return (min(a[0], b[0]), max(a[1], b[1]))
