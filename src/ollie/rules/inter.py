"""Inter-expression rules: expression splitting, merging and fusion.

They act on several expressions at once (the expressions of one subprogram, each producing a
named tensor), so they live in their own table :data:`INTER_RULES`.

* ``expression_splitting``: ``L_{x in X} f  =>  L_{x in X1} f ~ L_{x in X2} f``: the traversal
  range of one output iterator is cut in two; the results are concatenated along it.
* ``expression_merging``: two expressions with identical computation over different tensors,
  ``L_x f(T1) ~ L_x f(T2)``, become one ``L_{g, x} f(S[g, ...])`` where ``S`` stacks ``T1``
  and ``T2`` (a scope: ``{L<g=0:1,..> T1}[g,..] + {L<g=1:2,..> T2}[g,..]``, exact by zero
  padding); e.g. Matmuls sharing an input become one batched Matmul. Output ``g`` of the
  merged expression is the ``g``-th original result. :func:`merge_expressions` merges ``N``
  expressions, places ``g`` where asked (``"inner"``: Matmuls sharing an input become one
  Matmul whose ``n`` is the members' summed) and returns the slices giving back each result.
* ``expression_fusion``: chain rule: a consumer's reads of a tensor produced by another
  expression are replaced by that expression's scope (operator fusion).

Before / after (fusion of ``T = L<i=0:4> A[i] * 2`` into ``L<i=0:4> relu(T[i])``)::

    L<i=0:4> relu(T[i])
    L<i=0:4> relu({ L<i=0:4> A[i] * 2 }[i])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from ollie.errors import ExprError
from ollie.ir import (
    Access,
    BinOp,
    Expr,
    Iter,
    Node,
    Scope,
    accesses,
    const,
    map_body,
    tensor_names,
    var,
)
from ollie.rules.base import fresh_name
from ollie.rules.common import iter_names

INTER_RULES: dict[str, Callable] = {}


def _inter(name: str):
    def deco(fn):
        INTER_RULES[name] = fn
        return fn
    return deco


@_inter("expression_splitting")
def expression_splitting(expr: Expr, dim: int, at: int) -> tuple[Expr, Expr]:
    """Split the root traversal iterator ``dim`` at value ``at`` into two expressions whose
    results, concatenated along ``dim``, equal ``expr``'s."""
    root = expr.root
    it = root.traversal[dim]
    if not it.lo < at < it.hi:
        raise ExprError(f"expression splitting: {at} is not inside {it.name}={it.lo}:{it.hi}")
    parts = []
    for lo, hi in ((it.lo, at), (at, it.hi)):
        trav = tuple(Iter(t.name, lo, hi) if k == dim else t for k, t in enumerate(root.traversal))
        parts.append(Expr(expr.decls, Scope(trav, root.summation, root.body)))
    return parts[0], parts[1]


def _rename_tensors(body: Node, names: dict[str, str]) -> Node:
    """``body`` with its reads of each tensor in ``names`` renamed at once (not inside nested
    scopes)."""
    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and isinstance(node.source, str) and node.source in names:
            return Access(names[node.source], node.indices)
        return None
    return map_body(body, fn)


def merge_expressions(exprs: Sequence[Expr], holes: Sequence[Sequence[str]],
                      g_at: int | Literal["inner"] = 0) -> tuple[Expr, list[Expr]]:
    """Merge ``N >= 2`` expressions that compute the same function of different tensors into
    one: ``L_x f(T_1) ~ ... ~ L_x f(T_N)  =>  M = L_{g, x} f(S[g, ...])`` (paper, expression
    merging), and return ``M`` with the slices ``T_i = L<..> M[.., i, ..]`` that give back
    each original result (each declares only ``M``, named ``merged``).

    ``holes[i]`` names the tensors in which ``exprs[i]`` differs from the others, one per hole
    position and in the same order for every expression: renaming ``holes[i][j]`` to
    ``holes[0][j]`` must turn ``exprs[i]`` into ``exprs[0]`` (same traversal, summation and
    body; every other declared tensor declared alike), and the tensors of one position have one
    shape. For each position, ``S_j`` stacks the hole tensors along a new first dimension, a
    scope whose parts are exact by zero padding
    (``{L<g=i:i+1, ..> T_i[..]}[g, ..]`` summed over ``i``).

    ``g_at`` places the new traversal iterator ``g`` among the root's: an index (``0``: a
    leading, batched ``g``), or ``"inner"``: just before the first traversal iterator that
    indexes only hole tensors (a Matmul's ``n`` reading ``W[k, n]``), which makes ``(g, n)``
    one contiguous output dimension group (one GEMM with a direct output); when no such
    iterator exists, ``"inner"`` is ``0``. New iterators get fresh names. Raises
    :class:`~ollie.errors.ExprError` when the expressions do not fit (a hole read inside a
    nested scope included)."""
    n = len(exprs)
    if n < 2 or len(holes) != n or len({len(h) for h in holes}) != 1 or not holes[0]:
        raise ExprError("expression merging: needs >= 2 expressions and one equally long, "
                        "non-empty tuple of hole tensors per expression")
    first = exprs[0]
    shapes = [dict(e.decls) for e in exprs]
    hole_sets = [set(h) for h in holes]
    for j, name in enumerate(holes[0]):
        shape = shapes[0].get(name)
        if shape is None or any(shapes[i].get(holes[i][j]) != shape for i in range(n)):
            raise ExprError(f"expression merging: the tensors of hole {j} "
                            f"({', '.join(h[j] for h in holes)}) must be declared with one shape")
    others = {k: v for k, v in first.decls if k not in hole_sets[0]}
    for i, e in enumerate(exprs):
        if {k: v for k, v in e.decls if k not in hole_sets[i]} != others:
            raise ExprError("expression merging: the tensors other than the holes must be "
                            "declared alike")
        body = _rename_tensors(e.root.body, dict(zip(holes[i], holes[0], strict=True)))
        if body != first.root.body or e.root.traversal != first.root.traversal or \
                e.root.summation != first.root.summation:
            raise ExprError("expression merging: the expressions do not compute the same "
                            "function")
        if any(hole_sets[i] & tensor_names(a.source) for a in accesses(e.root.body)
               if isinstance(a.source, Scope)):
            raise ExprError("expression merging: a hole tensor is read inside a nested scope")
    root = first.root
    taken = iter_names(root)
    g = fresh_name("g", taken)
    pos = _g_position(root, hole_sets[0], g_at)
    stacked: dict[str, Scope] = {}
    for j, name in enumerate(holes[0]):
        dims = [Iter(fresh_name(f"d{k}", taken), 0, d)
                for k, d in enumerate(shapes[0][name])]
        idx = tuple(var(d.name) for d in dims)
        stack: Node | None = None
        for i in range(n):
            part = Access(Scope((Iter(g, i, i + 1), *dims), (), Access(holes[i][j], idx)),
                          (var(g), *idx))
            stack = part if stack is None else BinOp("+", stack, part)
        assert stack is not None
        stacked[name] = Scope((Iter(g, 0, n), *dims), (), stack)

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and isinstance(node.source, str) and \
                node.source in stacked:
            return Access(stacked[node.source], (var(g), *node.indices))
        return None

    trav = list(root.traversal)
    trav.insert(pos, Iter(g, 0, n))
    merged_root = Scope(tuple(trav), root.summation, map_body(root.body, fn))
    decls = dict(first.decls)
    for i in range(1, n):
        decls.update((h, shapes[i][h]) for h in holes[i])
    merged = Expr(tuple(decls.items()), merged_root)
    return merged, [_slice(merged, pos, i) for i in range(n)]


def _g_position(root: Scope, holes: set[str], g_at: int | str) -> int:
    """Where the merged traversal iterator goes (:func:`merge_expressions`' ``g_at``)."""
    if isinstance(g_at, int):
        if not 0 <= g_at <= len(root.traversal):
            raise ExprError(f"expression merging: g_at={g_at} is outside 0..{len(root.traversal)}")
        return g_at
    if g_at != "inner":
        raise ExprError(f"expression merging: g_at must be an index or 'inner', got {g_at!r}")
    in_holes: set[str] = set()
    elsewhere: set[str] = set()
    for acc in accesses(root.body):
        used = set().union(*(ix.vars() for ix in acc.indices)) if acc.indices else set()
        (in_holes if isinstance(acc.source, str) and acc.source in holes else elsewhere
         ).update(used)
    return next((k for k, it in enumerate(root.traversal)
                 if it.name in in_holes and it.name not in elsewhere), 0)


def _slice(merged: Expr, pos: int, i: int) -> Expr:
    """``L<t..> merged[t.., i, t..]`` (the ``i``-th result, ``g`` at position ``pos``)."""
    shape = merged.shape
    its = [Iter(f"t{k}", 0, d) for k, d in enumerate(d for k, d in enumerate(shape)
                                                    if k != pos)]
    idx = [var(it.name) for it in its]
    idx.insert(pos, const(i))
    return Expr((("merged", tuple(shape)),), Scope(tuple(its), (), Access("merged",
                                                                           tuple(idx))))


@_inter("expression_merging")
def expression_merging(e1: Expr, e2: Expr, t1: str, t2: str) -> Expr:
    """Merge ``e1`` and ``e2``, identical except that ``e1`` reads ``t1`` where ``e2`` reads
    ``t2`` (same shapes), into one expression with a new leading output dimension of size 2
    (:func:`merge_expressions` with ``g_at=0``)."""
    return merge_expressions((e1, e2), ((t1,), (t2,)), 0)[0]


@_inter("expression_fusion")
def expression_fusion(consumer: Expr, name: str, producer: Expr) -> Expr:
    """Replace the consumer's reads of tensor ``name`` by the producer's scope (chain rule)."""
    if consumer.inputs.get(name) != producer.shape:
        raise ExprError(f"expression fusion: '{name}' is declared {consumer.inputs.get(name)} "
                        f"but the producer computes {producer.shape}")
    root = producer.root
    offsets = [t.lo for t in root.traversal]

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and node.source == name:
            # tensor position p holds the producer's value at iterator value p + lo
            return Access(root, tuple(i + o for i, o in zip(node.indices, offsets, strict=True)))
        if isinstance(node, Access) and isinstance(node.source, Scope):
            # reads inside a nested scope too (x * g(mean(x)): a squeeze-excitation gate)
            inner = node.source
            return Access(Scope(inner.traversal, inner.summation, map_body(inner.body, fn)),
                          node.indices)
        return None

    body = map_body(consumer.root.body, fn)
    new_root = Scope(consumer.root.traversal, consumer.root.summation, body)
    decls = {k: v for k, v in consumer.decls if k != name}
    decls.update(producer.inputs)
    return Expr(tuple(decls.items()), new_root)
