"""Traversal merging.

Paper: ``L_x Sum_y { L_z f(T[tau(z)]) }[Phi(x, y)]  =>  L_x Sum_y f(T[tau(Phi(x, y))])``
where ``Phi(X x Y)`` lies inside ``Z``: a nested scope is inlined into its reader, removing a
scope. Index composition is exact for any index (div/mod included): the canonical form then
simplifies e.g. ``8*(x / 8) + x % 8`` to ``x``.

Conditions, checked from ranges: every read of the nested scope stays inside its traversal
ranges (outside, the read gives 0 but the inlined body might not). A nested scope with its own
summation is inlined only when the reader's body is a product in which the read is one factor
(``Sum_y (Sum_w g) * h == Sum_y Sum_w g * h``); its summation iterators join the reader's.
A nested scope read where its structural zero could annihilate a product
(:func:`~ollie.ir.structural.annihilating_reads`) is inlined only when its body can never be a
structural zero: its elements are ordinary values, the inlined body's out-of-range reads would
annihilate the product where the original multiplies a NaN or an infinity by an ordinary 0
(allowed within :func:`~ollie.rules.base.assume_finite_inputs`: exact for finite inputs).

Distributing a product over a nested sum is exact for finite values but not with infinities
(``(1 + 0) * inf`` is inf, ``1 * inf + 0 * inf`` is NaN): that inlining is not NaN-exact.

Before / after::

    L<x=0:32> { L<i=0:4, j=0:8> A[i, j] * 2 }[x / 8, x % 8]
    L<x=0:32> A[x / 8, x % 8] * 2
"""

from __future__ import annotations

from collections.abc import Mapping

from ollie.ir import Access, BinOp, Const, Expr, Iter, Neg, Node, Scope, map_body, var
from ollie.ir.structural import annihilating_reads, may_be_structural, source_extents
from ollie.rules.base import (
    Derived,
    Path,
    derive_each_scope,
    finite_inputs_assumed,
    fresh_name,
    register,
)
from ollie.rules.common import iter_names, subst_body


def _is_factor(body: Node, target_pos: int) -> bool:
    """True when the ``target_pos``-th scope access is a factor of a product-only body."""
    count = [0]

    def walk(node: Node) -> bool | None:
        # returns True if found as factor, False if found elsewhere, None if not found
        if isinstance(node, Access):
            if isinstance(node.source, Scope):
                hit = count[0] == target_pos
                count[0] += 1
                return True if hit else None
            return None
        if isinstance(node, Neg):
            return walk(node.x)
        if isinstance(node, BinOp) and node.op == "*":
            a = walk(node.lhs)
            b = walk(node.rhs)
            return a if a is not None else b
        if isinstance(node, BinOp) and node.op == "/" and isinstance(node.rhs, Const):
            return walk(node.lhs)
        if isinstance(node, Const):
            return None
        # any other node: a scope access inside is not a plain factor
        found = _contains_target(node, count, target_pos)
        return False if found else None

    return walk(body) is True


def _contains_target(node: Node, count: list[int], target_pos: int) -> bool:
    from ollie.ir import accesses

    found = False
    for acc in accesses(node):
        if isinstance(acc.source, Scope):
            if count[0] == target_pos:
                found = True
            count[0] += 1
    return found


def inline(scope: Scope, target_pos: int,
           shapes: Mapping[str, tuple[int, ...]] | None = None) -> Scope | None:
    """Inline the ``target_pos``-th nested scope read by ``scope``'s body, or None. ``shapes``
    (the declared tensors' shapes): what tells whether the inlined body may read outside a
    tensor (None: every read may)."""
    reads = [a for a in _scope_accesses(scope.body)]
    acc = reads[target_pos]
    inner = acc.source
    assert isinstance(inner, Scope), "_scope_accesses keeps the reads of nested scopes only"
    ranges = scope.ranges
    for idx, it in zip(acc.indices, inner.traversal, strict=True):
        lo, hi = idx.bounds(ranges)
        if lo < it.lo or hi >= it.hi:
            return None
    if inner.summation and not _is_factor(scope.body, target_pos):
        return None
    live = [flag for a, flag in annihilating_reads(scope.body) if isinstance(a.source, Scope)]
    if live[target_pos] and not inner.summation and not finite_inputs_assumed() and \
            (shapes is None or
             may_be_structural(inner.body, inner.ranges, source_extents(shapes))):
        return None  # an ordinary element would become a structural zero of the product
    taken = iter_names(scope)
    renames = {it.name: fresh_name(it.name, taken) for it in inner.summation}
    mapping = {it.name: idx for it, idx in zip(inner.traversal, acc.indices, strict=True)}
    mapping.update({o: var(n) for o, n in renames.items()})
    new_sum = tuple(Iter(renames[it.name], it.lo, it.hi) for it in inner.summation)
    all_ranges = {**ranges, **{it.name: it.range for it in new_sum}}
    inlined = subst_body(inner.body, mapping, all_ranges)
    count = [0]

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and isinstance(node.source, Scope):
            k = count[0]
            count[0] += 1
            if k == target_pos:
                return inlined
        return None

    body = map_body(scope.body, fn)
    return Scope(scope.traversal, scope.summation + new_sum, body)


def _scope_accesses(body: Node) -> list[Access]:
    from ollie.ir import accesses

    return [a for a in accesses(body) if isinstance(a.source, Scope)]


def _apply(scope: Scope, path: Path, expr: Expr) -> list[tuple[Scope, str]]:
    out = []
    for pos in range(len(_scope_accesses(scope.body))):
        new = inline(scope, pos, expr.inputs)
        if new is not None:
            out.append((new, f"inline nested scope #{pos}"))
    return out


@register("traversal_merging")
def traversal_merging(expr: Expr) -> list[Derived]:
    """Inline every nested scope whose reads stay inside its ranges."""
    return derive_each_scope(expr, "traversal_merging", _apply)
