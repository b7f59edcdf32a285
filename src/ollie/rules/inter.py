"""Inter-expression rules: expression splitting, merging and fusion.

They act on several expressions at once (the expressions of one subprogram, each producing a
named tensor), so they live in their own table :data:`INTER_RULES`.

* ``expression_splitting``: ``L_{x in X} f  =>  L_{x in X1} f ~ L_{x in X2} f``: the traversal
  range of one output iterator is cut in two; the results are concatenated along it.
* ``expression_merging``: two expressions with identical computation over different tensors,
  ``L_x f(T1) ~ L_x f(T2)``, become one ``L_{g, x} f(S[g, ...])`` where ``S`` stacks ``T1``
  and ``T2`` (a scope: ``{L<g=0:1,..> T1}[g,..] + {L<g=1:2,..> T2}[g,..]``, exact by zero
  padding); e.g. Matmuls sharing an input become one batched Matmul. Output ``g`` of the
  merged expression is the ``g``-th original result.
* ``expression_fusion``: chain rule: a consumer's reads of a tensor produced by another
  expression are replaced by that expression's scope (operator fusion).

Before / after (fusion of ``T = L<i=0:4> A[i] * 2`` into ``L<i=0:4> relu(T[i])``)::

    L<i=0:4> relu(T[i])
    L<i=0:4> relu({ L<i=0:4> A[i] * 2 }[i])
"""

from __future__ import annotations

from collections.abc import Callable

from ollie.errors import ExprError
from ollie.ir import Access, BinOp, Expr, Iter, Node, Scope, accesses, map_body, tensor_names, var
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


def _rename_tensor(body: Node, old: str, new: str) -> Node:
    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and node.source == old:
            return Access(new, node.indices)
        return None
    return map_body(body, fn)


@_inter("expression_merging")
def expression_merging(e1: Expr, e2: Expr, t1: str, t2: str) -> Expr:
    """Merge ``e1`` and ``e2``, identical except that ``e1`` reads ``t1`` where ``e2`` reads
    ``t2`` (same shapes), into one expression with a new leading output dimension of size 2."""
    shapes = {**e1.inputs, **e2.inputs}
    if shapes.get(t1) != shapes.get(t2) or shapes.get(t1) is None:
        raise ExprError(f"expression merging: {t1} and {t2} must be declared with one shape")
    if _rename_tensor(e2.root.body, t2, t1) != e1.root.body or \
            e1.root.traversal != e2.root.traversal or e1.root.summation != e2.root.summation:
        raise ExprError("expression merging: the expressions do not compute the same function")
    if any(t1 in tensor_names(a.source) for a in accesses(e1.root.body)
           if isinstance(a.source, Scope)):
        raise ExprError(f"expression merging: '{t1}' is read inside a nested scope")
    shape = shapes[t1]
    dims = [Iter(f"d{i}", 0, d) for i, d in enumerate(shape)]
    idx = tuple(var(d.name) for d in dims)
    part1 = Access(Scope((Iter("g", 0, 1), *dims), (), Access(t1, idx)), (var("g"), *idx))
    part2 = Access(Scope((Iter("g", 1, 2), *dims), (), Access(t2, idx)), (var("g"), *idx))
    stacked = Scope((Iter("g", 0, 2), *dims), (), BinOp("+", part1, part2))
    g = "g"
    taken = iter_names(e1.root)
    while g in taken:
        g += "_"

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and node.source == t1:
            return Access(stacked, (var(g), *node.indices))
        return None

    root = Scope((Iter(g, 0, 2), *e1.root.traversal), e1.root.summation,
                 map_body(e1.root.body, fn))
    decls = dict(e1.decls)
    decls.update(e2.inputs)
    return Expr(tuple(decls.items()), root)


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
