"""Structural checks of expressions built in code (the parser checks text as it reads it).

:func:`verify` raises :class:`~ollie.errors.ExprError` naming the scope and the problem:
duplicate or empty iterators, unbound iterators (scopes are closed), undeclared tensors,
rank mismatches, bad declarations.
"""

from __future__ import annotations

from collections.abc import Mapping

from ollie.errors import ExprError
from ollie.ir.nodes import Access, Expr, Scope, accesses


def verify(expr: Expr) -> Expr:
    """Check ``expr`` is well formed; return it unchanged (raises ExprError otherwise)."""
    seen: set[str] = set()
    for name, shape in expr.decls:
        if name in seen:
            raise ExprError(f"tensor '{name}' declared twice")
        seen.add(name)
        if not shape:
            raise ExprError(f"tensor '{name}' has rank 0: declare scalars with shape [1]")
        if any((not isinstance(d, int)) or d <= 0 for d in shape):
            raise ExprError(f"tensor '{name}' has a non-positive dimension in {list(shape)}")
    verify_scope(expr.root, expr.inputs)
    return expr


def verify_scope(scope: Scope, decls: Mapping[str, tuple[int, ...]], where: str = "root") -> None:
    """Check one scope and, recursively, the scopes it reads."""
    names: set[str] = set()
    for it in scope.iters:
        if it.name in names:
            raise ExprError(f"{where} scope: iterator '{it.name}' declared twice")
        names.add(it.name)
        if it.hi <= it.lo:
            raise ExprError(f"{where} scope: empty range {it.lo}:{it.hi} for '{it.name}'")
    for acc in accesses(scope.body):
        _check_access(acc, names, decls, where)


def _check_access(acc: Access, names: set[str], decls: Mapping, where: str) -> None:
    for idx in acc.indices:
        free = idx.vars() - names
        if free:
            raise ExprError(f"{where} scope: unbound iterator(s) {sorted(free)} in index {idx}")
    if isinstance(acc.source, Scope):
        rank = len(acc.source.traversal)
        if len(acc.indices) != rank:
            raise ExprError(f"{where} scope: nested scope of rank {rank} indexed with "
                            f"{len(acc.indices)} index expression(s)")
        verify_scope(acc.source, decls, where + ">nested")
        return
    if acc.source not in decls:
        raise ExprError(f"{where} scope: tensor '{acc.source}' is not declared")
    rank = len(decls[acc.source])
    if len(acc.indices) != rank:
        raise ExprError(f"{where} scope: tensor '{acc.source}' has rank {rank} but is indexed "
                        f"with {len(acc.indices)} index expression(s)")
