"""Summation splitting.

Paper: ``L_x Sum_{s1,s2} f  =>  L_x Sum_{s1} { L_{x,s1} Sum_{s2} f }[x, s1]``.

Every non-trivial partition of a scope's summation iterators into an outer part ``s1`` and an
inner part ``s2`` gives one application; the inner scope traverses the outer traversal
iterators followed by ``s1``, and is read by iterator value, so it is exact for any body.

Before / after::

    L<i=0:4> Sum<j=0:3, k=0:5> A[i, j, k]
    L<i=0:4> Sum<j=0:3> { L<i=0:4, j=0:3> Sum<k=0:5> A[i, j, k] }[i, j]
"""

from __future__ import annotations

import itertools

from ollie.ir import Access, Expr, Scope, var
from ollie.rules.base import Derived, Path, derive_each_scope, register


def split_summation(scope: Scope, outer: tuple[str, ...]) -> Scope:
    """Split ``scope``'s summation into the iterators named ``outer`` and the rest."""
    s1 = tuple(it for it in scope.summation if it.name in outer)
    s2 = tuple(it for it in scope.summation if it.name not in outer)
    inner = Scope(scope.traversal + s1, s2, scope.body)
    read = Access(inner, tuple(var(it.name) for it in inner.traversal))
    return Scope(scope.traversal, s1, read)


def _apply(scope: Scope, path: Path, expr: Expr) -> list[tuple[Scope, str]]:
    names = [it.name for it in scope.summation]
    out = []
    for r in range(1, len(names)):
        for outer in itertools.combinations(names, r):
            inner = [n for n in names if n not in outer]
            out.append((split_summation(scope, outer),
                        f"Sum<{','.join(outer)} | {','.join(inner)}>"))
    return out


@register("summation_splitting")
def summation_splitting(expr: Expr) -> list[Derived]:
    """Every split of every scope's summation into an outer and an inner scope."""
    return derive_each_scope(expr, "summation_splitting", _apply)
