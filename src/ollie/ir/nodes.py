"""Expression nodes: iterators, scopes, tensor reads and float arithmetic.

An :class:`Expr` is a list of input-tensor declarations and a root :class:`Scope`.
A scope ``L<x...> Sum<y...> body`` has ordered traversal iterators (its output dimensions, in
layout order), unordered summation iterators and a float body. A scope is *closed*: its body
refers only to its own iterators; a nested scope is a tensor that the enclosing body reads
through an :class:`Access` by iterator value (reads outside its ranges give 0).

All nodes are frozen, hashable dataclasses; equal structure means equal values. Build negation
through :func:`neg` (which folds constants), so that printing and parsing round-trip.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Union

from ollie.errors import ExprError
from ollie.ir.index import Affine

UNARY_FUNCS = ("relu", "tanh", "sigmoid", "exp", "log", "sqrt", "abs")
BINARY_FUNCS = ("max", "min")
FUNC_ARITY = {**{f: 1 for f in UNARY_FUNCS}, **{f: 2 for f in BINARY_FUNCS}}
BIN_OPS = ("+", "-", "*", "/")


@dataclass(frozen=True, slots=True)
class Iter:
    """An iterator bound by a scope, ranging over the half-open interval ``[lo, hi)``."""

    name: str
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo

    @property
    def range(self) -> tuple[int, int]:
        return (self.lo, self.hi)


@dataclass(frozen=True, slots=True)
class Const:
    """A float32 literal (finite)."""

    value: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ExprError(f"non-finite constant {self.value!r} in expression")


@dataclass(frozen=True, slots=True)
class Access:
    """A read of an input tensor (``source`` is its name) or of a nested :class:`Scope`."""

    source: str | Scope
    indices: tuple[Affine, ...]

    @property
    def is_scope(self) -> bool:
        return isinstance(self.source, Scope)


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus (never of a :class:`Const`: use :func:`neg`)."""

    x: Node

    def __post_init__(self) -> None:
        if isinstance(self.x, Const):
            raise ExprError("Neg(Const) is not canonical: use ollie.ir.neg()")


@dataclass(frozen=True, slots=True)
class BinOp:
    """``lhs op rhs`` for op in ``+ - * /``."""

    op: str
    lhs: Node
    rhs: Node

    def __post_init__(self) -> None:
        if self.op not in BIN_OPS:
            raise ExprError(f"unknown binary operator {self.op!r}")


@dataclass(frozen=True, slots=True)
class Call:
    """A function application: relu, tanh, sigmoid, exp, log, sqrt, abs, max, min."""

    fn: str
    args: tuple[Node, ...]

    def __post_init__(self) -> None:
        arity = FUNC_ARITY.get(self.fn)
        if arity is None:
            raise ExprError(f"unknown function {self.fn!r}")
        if len(self.args) != arity:
            raise ExprError(f"{self.fn} takes {arity} argument(s), got {len(self.args)}")


Node = Union[Const, Access, Neg, BinOp, Call]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class Scope:
    """``L<traversal> Sum<summation> body``: a tensor defined element-wise."""

    traversal: tuple[Iter, ...]
    summation: tuple[Iter, ...]
    body: Node
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.traversal, self.summation, self.body)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def iters(self) -> tuple[Iter, ...]:
        return self.traversal + self.summation

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(it.size for it in self.traversal)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """``{name: (lo, hi)}`` for every iterator of this scope."""
        return {it.name: it.range for it in self.iters}

    def iter(self, name: str) -> Iter:
        for it in self.iters:
            if it.name == name:
                return it
        raise ExprError(f"scope has no iterator '{name}'")

    def __str__(self) -> str:
        from ollie.ir.printer import format_scope

        return format_scope(self)


@dataclass(frozen=True, slots=True)
class Expr:
    """Input declarations (name, shape) in written order, and the root scope."""

    decls: tuple[tuple[str, tuple[int, ...]], ...]
    root: Scope

    @property
    def inputs(self) -> dict[str, tuple[int, ...]]:
        return dict(self.decls)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.root.shape

    def __str__(self) -> str:
        from ollie.ir.printer import format_expr

        return format_expr(self)


# --------------------------------------------------------------------- builders
def neg(x: Node) -> Node:
    """Unary minus, folding constants and double negation."""
    if isinstance(x, Const):
        return Const(-x.value)
    if isinstance(x, Neg):
        return x.x
    return Neg(x)


def add(a: Node, b: Node) -> Node:
    return BinOp("+", a, b)


def mul(a: Node, b: Node) -> Node:
    return BinOp("*", a, b)


def make_expr(decls: Mapping[str, tuple[int, ...]] | tuple, root: Scope) -> Expr:
    """Build an :class:`Expr` from a ``{name: shape}`` mapping (or pairs) and a root scope."""
    items = decls.items() if isinstance(decls, Mapping) else decls
    return Expr(tuple((n, tuple(int(d) for d in s)) for n, s in items), root)


# --------------------------------------------------------------------- traversal helpers
def children(node: Node) -> tuple[Node, ...]:
    """Direct float sub-expressions of a body node (not descending into scopes)."""
    if isinstance(node, BinOp):
        return (node.lhs, node.rhs)
    if isinstance(node, Neg):
        return (node.x,)
    if isinstance(node, Call):
        return node.args
    return ()


def accesses(node: Node) -> Iterator[Access]:
    """Every :class:`Access` of a body, in print order (not descending into scopes)."""
    if isinstance(node, Access):
        yield node
        return
    for child in children(node):
        yield from accesses(child)


def map_body(node: Node, fn) -> Node:
    """Rebuild a body bottom-up; ``fn(node)`` returns a replacement or None to keep it."""
    if isinstance(node, BinOp):
        lhs, rhs = map_body(node.lhs, fn), map_body(node.rhs, fn)
        if lhs is not node.lhs or rhs is not node.rhs:
            node = BinOp(node.op, lhs, rhs)
    elif isinstance(node, Neg):
        x = map_body(node.x, fn)
        if x is not node.x:
            node = neg(x)
    elif isinstance(node, Call):
        args = tuple(map_body(a, fn) for a in node.args)
        if any(a is not b for a, b in zip(args, node.args, strict=True)):
            node = Call(node.fn, args)
    rep = fn(node)
    return node if rep is None else rep


def nested_scopes(scope: Scope) -> Iterator[Scope]:
    """Every scope read (transitively) by ``scope``'s body, innermost first, with repeats."""
    for acc in accesses(scope.body):
        if isinstance(acc.source, Scope):
            yield from nested_scopes(acc.source)
            yield acc.source


def tensor_names(scope: Scope) -> set[str]:
    """Names of input tensors read anywhere in ``scope`` (nested scopes included)."""
    names = set()
    for acc in accesses(scope.body):
        if isinstance(acc.source, Scope):
            names |= tensor_names(acc.source)
        else:
            names.add(acc.source)
    return names


def rename_expr(expr: Expr, names: Mapping[str, str]) -> Expr:
    """``expr`` with declared tensors renamed (reads inside nested scopes too)."""

    def scope(s: Scope) -> Scope:
        def fn(node: Node) -> Node | None:
            if isinstance(node, Access):
                src = node.source
                return Access(names.get(src, src) if isinstance(src, str) else scope(src),
                              node.indices)
            return None

        return Scope(s.traversal, s.summation, map_body(s.body, fn))

    return Expr(tuple((names.get(n, n), sh) for n, sh in expr.decls), scope(expr.root))
