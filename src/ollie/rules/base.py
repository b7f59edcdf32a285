"""Rule registry and the plumbing every derivation rule shares.

A rule is a function ``rule(expr) -> list[Derived]`` returning every application of the rule to
``expr``: one derived expression per application, anywhere in the expression (the root scope
and every nested scope). Rules never mutate their input (all nodes are immutable anyway).
Rules are registered once, by their paper name in snake_case, in :data:`RULES`.

Scopes are addressed by a *path*: the root is ``()``; ``path + (i,)`` is the scope read by the
``i``-th scope access (in print order) of the body of the scope at ``path``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ollie.ir import Access, Expr, Node, Scope, accesses, map_body
from ollie.ir.structural import annihilating_reads

Path = tuple[int, ...]

_FINITE: ContextVar[bool] = ContextVar("ollie_rules_finite_inputs", default=False)


@contextmanager
def assume_finite_inputs() -> Iterator[None]:
    """Within this block, rules may make rewrites that are exact for finite inputs only:
    :func:`~ollie.rules.traversal_merging.inline` inlines a nested scope whose padding zeros
    are ordinary elements of a product (a zero-padded window read by a product), where the
    inlined form reads the padding as a structural zero. With an infinity or a NaN in the
    other factor the original gives NaN there and the inlined form 0. Outside (the
    default) every rule is NaN-exact. The optimizer enters it for fused operator chains
    (:mod:`ollie.optimizer.chains`), whose programs are checked on finite random inputs
    like every other rewrite; docs/design/026-finite-inputs.md."""
    token = _FINITE.set(True)
    try:
        yield
    finally:
        _FINITE.reset(token)


def finite_inputs_assumed() -> bool:
    """Whether rewrites exact only for finite inputs are allowed here
    (:func:`assume_finite_inputs`)."""
    return _FINITE.get()


@dataclass(frozen=True, slots=True)
class Derived:
    """One application of a rule: the derived expression and what was done."""

    expr: Expr
    rule: str
    note: str


RuleFn = Callable[[Expr], list[Derived]]
RULES: dict[str, RuleFn] = {}
INTRA_RULES: tuple[str, ...] = (
    "summation_splitting",
    "variable_substitution",
    "traversal_merging",
    "boundary_relaxing",
    "boundary_tightening",
)


def register(name: str) -> Callable[[RuleFn], RuleFn]:
    """Register a rule under its paper name."""

    def deco(fn: RuleFn) -> RuleFn:
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        RULES[name] = fn
        return fn

    return deco


def apply_rule(name: str, expr: Expr) -> list[Derived]:
    """All applications of rule ``name`` to ``expr``."""
    return RULES[name](expr)


# --------------------------------------------------------------------- scope addressing
def scope_paths(scope: Scope, path: Path = ()) -> Iterator[tuple[Path, Scope]]:
    """Every scope reachable from ``scope`` with its path, outermost first."""
    yield path, scope
    i = 0
    for acc in accesses(scope.body):
        if isinstance(acc.source, Scope):
            yield from scope_paths(acc.source, (*path, i))
            i += 1


def scope_at(scope: Scope, path: Path) -> Scope:
    for i in path:
        scope = [a.source for a in accesses(scope.body) if isinstance(a.source, Scope)][i]
    return scope


def replace_scope(scope: Scope, path: Path, new: Scope) -> Scope:
    """Return ``scope`` with the sub-scope at ``path`` replaced by ``new``."""
    if not path:
        return new
    target, rest = path[0], path[1:]
    counter = itertools.count()

    def fn(node: Node) -> Node | None:
        if (isinstance(node, Access) and isinstance(node.source, Scope)
                and next(counter) == target):
            return Access(replace_scope(node.source, rest, new), node.indices)
        return None

    return Scope(scope.traversal, scope.summation, map_body(scope.body, fn))


def parent_reads(root: Scope, path: Path) -> tuple[Scope | None, list[Access]]:
    """The scope containing the scope at ``path`` and the accesses through which it reads it
    (exactly one: the addressed access)."""
    if not path:
        return None, []
    parent = scope_at(root, path[:-1])
    reads = [a for a in accesses(parent.body) if isinstance(a.source, Scope)]
    return parent, [reads[path[-1]]]


def read_annihilates(root: Scope, path: Path) -> bool:
    """Whether the read of the scope at ``path`` (not the root) by its parent is one whose
    structural zero can annihilate a product or a quotient
    (:func:`~ollie.ir.structural.annihilating_reads`): moving one of the values it reads
    between inside the scope's range (an ordinary value, zero or not) and outside (a
    structural zero) can then change NaN and infinities of the result."""
    parent = scope_at(root, path[:-1])
    live = [flag for acc, flag in annihilating_reads(parent.body) if isinstance(acc.source, Scope)]
    return live[path[-1]]


def with_root(expr: Expr, root: Scope) -> Expr:
    return Expr(expr.decls, root)


def fresh_name(base: str, taken: set[str]) -> str:
    """``base`` or ``base1``, ``base2``, ... whichever is not in ``taken`` (and record it)."""
    name, i = base, 1
    while name in taken:
        name = f"{base}{i}"
        i += 1
    taken.add(name)
    return name


def derive_each_scope(expr: Expr, name: str,
                      fn: Callable[[Scope, Path, Expr], list[tuple[Scope, str]]]
                      ) -> list[Derived]:
    """Apply a per-scope rewrite ``fn(scope, path, expr) -> [(new_scope, note)]`` at every
    scope of ``expr`` and wrap the results as :class:`Derived`."""
    out: list[Derived] = []
    for path, scope in list(scope_paths(expr.root)):
        for new_scope, note in fn(scope, path, expr):
            root = replace_scope(expr.root, path, new_scope)
            where = "root" if not path else "scope " + ".".join(map(str, path))
            out.append(Derived(with_root(expr, root), name, f"{note} at {where}"))
    return out
