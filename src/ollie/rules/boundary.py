"""Boundary relaxing and boundary tightening.

Paper: ``L_{x in X} f  <=>  L_{x in X'} f`` where the elements of ``X' - X`` are never used
(or are zero, the value a read outside the range gives anyway).

*Tightening* shrinks
  - a nested scope's traversal range to where its body may be non-zero (zero padding facts,
    :mod:`ollie.rules.zeros`) and where its reader actually reads;
  - any scope's summation range to where the body may be non-zero.
*Relaxing* enlarges
  - a nested scope's traversal range to cover every value its reader reads, when the body is
    provably zero on the added values (so reads there still give 0) — this lets traversal
    merging inline the scope;
  - a nested scope's traversal range to where one of its reads covers a whole tensor dimension,
    when the reader never reads the added values;
  - a summation range to cover a whole tensor dimension when the body is zero on the added
    values.
Every decision comes from range analysis; no size is special.

NaN and infinities stay exact (structural zeros, :mod:`ollie.semantics.interpreter`): a term
dropped from or added to a sum is exactly 0 (:mod:`ollie.rules.zeros` proves values zero even
where other reads are NaN or infinite). A nested scope's element inside its range is an ordinary
value and a read outside it a structural zero, so a nested scope read where its zero can
annihilate a product (:func:`~ollie.rules.base.read_annihilates`) only loses or gains values its
reader never reads.

Before / after (tightening: ``A[t - 1]`` is zero unless ``1 <= t < 6``)::

    A: [5]
    L<h=0:5> Sum<r=0:3> { L<t=0:7> A[t - 1] }[h + r]
    L<h=0:5> Sum<r=0:3> { L<t=1:6> A[t - 1] }[h + r]
"""

from __future__ import annotations

from collections.abc import Mapping

from ollie.ir import Expr, Iter, Scope, accesses
from ollie.rules.base import (
    Derived,
    Path,
    derive_each_scope,
    parent_reads,
    read_annihilates,
    register,
)
from ollie.rules.zeros import access_extents, nonzero_interval

Interval = tuple[int, int]


def with_range(scope: Scope, name: str, lo: int, hi: int) -> Scope:
    """``scope`` with iterator ``name`` (traversal or summation) ranging over ``lo:hi``."""
    def upd(it: Iter) -> Iter:
        return Iter(name, lo, hi) if it.name == name else it

    return Scope(tuple(map(upd, scope.traversal)), tuple(map(upd, scope.summation)), scope.body)


def read_hull(root: Scope, path: Path, dim: int) -> Interval | None:
    """Half-open hull of the values the reader reads along ``dim`` of the scope at ``path``."""
    parent, reads = parent_reads(root, path)
    if parent is None:
        return None
    bounds = [acc.indices[dim].bounds(parent.ranges) for acc in reads]
    if not bounds:
        return None
    return min(a for a, _ in bounds), max(b for _, b in bounds) + 1


def tighten(scope: Scope, path: Path, expr: Expr) -> list[tuple[Scope, str]]:
    """Boundary tightening of the scope at ``path`` of ``expr``: per iterator whose range can
    shrink (to where the body may be nonzero and, for a traversal iterator, to what the reader
    reads), the scope with that range tightened and a description ``"i=lo:hi -> lo':hi'"``."""
    shapes = expr.inputs
    out = []
    factor = bool(path) and read_annihilates(expr.root, path)
    for dim, it in enumerate(scope.traversal if path else ()):
        lo, hi = it.range if factor else \
            nonzero_interval(scope.body, scope.ranges, it.name, shapes)
        hull = read_hull(expr.root, path, dim)
        if hull is not None:
            lo, hi = max(lo, hull[0]), min(hi, hull[1])
        lo, hi = max(lo, it.lo), min(hi, it.hi)
        if lo < hi and (lo, hi) != it.range:
            out.append((with_range(scope, it.name, lo, hi),
                        f"{it.name}={it.lo}:{it.hi} -> {lo}:{hi}"))
    for it in scope.summation:
        lo, hi = nonzero_interval(scope.body, scope.ranges, it.name, shapes)
        if lo < hi and (lo, hi) != it.range:
            out.append((with_range(scope, it.name, lo, hi),
                        f"{it.name}={it.lo}:{it.hi} -> {lo}:{hi}"))
    return out


def zero_outside(scope: Scope, name: str, old: Interval, new: Interval,
                 shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Body provably zero for ``name`` in ``new`` minus ``old``."""
    ranges = {**scope.ranges, name: new}
    lo, hi = nonzero_interval(scope.body, ranges, name, shapes)
    return lo >= hi or (old[0] <= lo and hi <= old[1])


def _extent_candidates(scope: Scope, name: str, shapes) -> list[Interval]:
    """Ranges of ``name`` on which a read ``T[.., name + c, ..]`` covers a whole dimension."""
    out = []
    for acc in accesses(scope.body):
        for idx, (dlo, dhi) in zip(acc.indices, access_extents(acc, shapes), strict=True):
            if idx.vars() == {name} and idx.is_linear and idx.coef(name) == 1:
                cand = (dlo - idx.const, dhi - idx.const)
                if cand not in out:
                    out.append(cand)
    return out


def _relax(scope: Scope, path: Path, expr: Expr) -> list[tuple[Scope, str]]:
    shapes = expr.inputs
    out = []
    factor = bool(path) and read_annihilates(expr.root, path)
    for dim, it in enumerate(scope.traversal if path else ()):
        cur = it.range
        hull = read_hull(expr.root, path, dim)
        cands = []
        if hull is not None and not factor:
            cand = (min(cur[0], hull[0]), max(cur[1], hull[1]))
            if cand != cur and zero_outside(scope, it.name, cur, cand, shapes):
                cands.append(cand)
        read_inside = hull is None or (cur[0] <= hull[0] and hull[1] <= cur[1])
        for ext in _extent_candidates(scope, it.name, shapes):
            cand = (min(cur[0], ext[0]), max(cur[1], ext[1]))
            if cand != cur and cand not in cands and (
                    read_inside or (not factor and
                                    zero_outside(scope, it.name, cur, cand, shapes))):
                cands.append(cand)
        for lo, hi in cands:
            out.append((with_range(scope, it.name, lo, hi),
                        f"{it.name}={it.lo}:{it.hi} -> {lo}:{hi}"))
    for it in scope.summation:
        for ext in _extent_candidates(scope, it.name, shapes):
            cand = (min(it.lo, ext[0]), max(it.hi, ext[1]))
            if cand != it.range and zero_outside(scope, it.name, it.range, cand, shapes):
                out.append((with_range(scope, it.name, *cand),
                            f"{it.name}={it.lo}:{it.hi} -> {cand[0]}:{cand[1]}"))
    return out


@register("boundary_tightening")
def boundary_tightening(expr: Expr) -> list[Derived]:
    """Shrink ranges to where results may be non-zero and are read."""
    return derive_each_scope(expr, "boundary_tightening", tighten)


@register("boundary_relaxing")
def boundary_relaxing(expr: Expr) -> list[Derived]:
    """Enlarge ranges where the added elements are zero or never read."""
    return derive_each_scope(expr, "boundary_relaxing", _relax)
