"""Small rewriting helpers shared by rules: index maps over one scope level, name sets."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ollie.ir import Access, Affine, Iter, Node, Scope, map_body


def map_indices(body: Node, fn: Callable[[Affine], Affine]) -> Node:
    """Rewrite every index of every access at this scope level (nested scopes are closed,
    so only the indices *into* them change, never their bodies)."""

    def visit(node: Node) -> Node | None:
        if isinstance(node, Access):
            new = tuple(fn(i) for i in node.indices)
            if new != node.indices:
                return Access(node.source, new)
        return None

    return map_body(body, visit)


def subst_body(body: Node, mapping: Mapping[str, Affine],
               ranges: Mapping[str, tuple[int, int]] | None = None) -> Node:
    """Substitute iterators in every index at this level; simplify with ``ranges`` if given."""
    if ranges is None:
        return map_indices(body, lambda i: i.subst(mapping))
    return map_indices(body, lambda i: i.subst(mapping).simplify(ranges))


def rename_iters(scope: Scope, names: Mapping[str, str]) -> Scope:
    """Rename some of ``scope``'s own iterators (the body is rewritten accordingly)."""
    from ollie.ir import var

    def ren(it: Iter) -> Iter:
        return Iter(names.get(it.name, it.name), it.lo, it.hi)

    body = subst_body(scope.body, {o: var(n) for o, n in names.items()})
    return Scope(tuple(map(ren, scope.traversal)), tuple(map(ren, scope.summation)), body)


def iter_names(scope: Scope) -> set[str]:
    return {it.name for it in scope.iters}
