"""Where a body's structural zeros can matter, from its structure and ranges alone.

A read outside its tensor's (or nested scope's) region is a *structural zero*: it annihilates
a product it is a factor of, and a quotient it is the numerator of, even where the other
operand is NaN or infinite (the semantics of :mod:`ollie.semantics.interpreter`). A negation
of a structural zero is one, and so is a sum or difference of two; a literal or a function call
never is. An element of a nested scope read inside its region is an ordinary value.

* :func:`annihilating_reads` tells, per read of a body, whether its being a structural zero can
  annihilate a product or a quotient (it reaches a factor or a numerator through negations,
  sums and differences only). A read that cannot only ever adds its 0 to a sum or passes it to
  a function: moving it between inside and outside a region that holds zeros there (boundary
  rules, inlining, materialising) changes nothing.
* :func:`may_be_structural` tells whether a body may be a structural zero at some point of
  given iterator ranges (conservative: True unless every way to one is ruled out by ranges).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from ollie.ir.nodes import Access, BinOp, Call, Neg, Node, Scope

Extents = Callable[[Access], Sequence[tuple[int, int]]]
"""The half-open index range of each dimension of a read's source."""


def annihilating_reads(body: Node) -> list[tuple[Access, bool]]:
    """Every read of ``body`` in :func:`~ollie.ir.nodes.accesses` order, with whether a
    structural zero there can annihilate a product or a quotient."""
    return list(_walk(body, False))


def _walk(node: Node, live: bool) -> Iterator[tuple[Access, bool]]:
    if isinstance(node, Access):
        yield node, live
    elif isinstance(node, Neg):
        yield from _walk(node.x, live)
    elif isinstance(node, BinOp):
        if node.op in "+-":
            yield from _walk(node.lhs, live)
            yield from _walk(node.rhs, live)
        elif node.op == "*":
            yield from _walk(node.lhs, True)
            yield from _walk(node.rhs, True)
        else:
            yield from _walk(node.lhs, True)
            yield from _walk(node.rhs, False)
    elif isinstance(node, Call):
        for a in node.args:
            yield from _walk(a, False)


def source_extents(shapes: Mapping[str, Sequence[int]]) -> Extents:
    """:data:`Extents` of reads of the tensors ``shapes`` (``[0, d)``) and of nested scopes
    (their traversal ranges)."""
    def extents(acc: Access) -> Sequence[tuple[int, int]]:
        if isinstance(acc.source, Scope):
            return [it.range for it in acc.source.traversal]
        return [(0, d) for d in shapes[acc.source]]
    return extents


def may_read_outside(acc: Access, ranges: Mapping[str, tuple[int, int]],
                     extents: Extents) -> bool:
    """Whether ``acc`` may read outside its source for iterators in ``ranges`` (half-open)."""
    for idx, (lo, hi) in zip(acc.indices, extents(acc), strict=True):
        a, b = idx.bounds(ranges)
        if a < lo or b >= hi:
            return True
    return False


def may_be_structural(node: Node, ranges: Mapping[str, tuple[int, int]],
                      extents: Extents) -> bool:
    """Whether ``node`` may be a structural zero for some iterator values in ``ranges``."""
    if isinstance(node, Access):
        return may_read_outside(node, ranges, extents)
    if isinstance(node, Neg):
        return may_be_structural(node.x, ranges, extents)
    if isinstance(node, BinOp):
        a = may_be_structural(node.lhs, ranges, extents)
        if node.op == "*":
            return a or may_be_structural(node.rhs, ranges, extents)
        if node.op == "/":
            return a
        return a and may_be_structural(node.rhs, ranges, extents)
    return False
