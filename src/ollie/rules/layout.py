"""Data layout transformation of an input tensor (used by guided derivation).

A tensor ``T`` read by a scope is replaced by a re-laid-out copy ``T'`` — a nested scope over
``T``, which becomes a layout eOperator once instantiated (evaluated at optimisation time when
``T`` is a weight) — and every read of ``T`` in that scope is rewritten to read ``T'``:

* **split** dimension ``d`` by ``k``: ``T'[.., q, r, ..] = T[.., k*q + r, ..]``; a read
  ``T[.., e, ..]`` becomes ``T'[.., e / k, e % k, ..]`` (exact for every ``e``, padding
  included: ``e`` is out of range exactly when ``e / k`` is, or ``k*q + r`` is outside ``T``,
  where ``T'`` holds 0). Not NaN-exact where ``k`` does not divide the dimension and a read
  that leaves it is a factor of a product: ``T[e]`` there is a structural zero, ``T'``'s
  element an ordinary 0, so ``0 * NaN`` of the other factor is NaN (the Conv5x5 -> Conv3x3
  program reads its 5x5 kernel through such a 6x6 copy; see docs/design/015);
* **merge** dimensions ``d, d+1``: ``T'[.., z, ..] = T[.., z / D1, z % D1, ..]``; a read
  ``T[.., a, b, ..]`` becomes ``T'[.., D1*a + b, ..]``, exact when every ``b`` read stays in
  ``[0, D1)`` (checked);
* **permute** dimensions: ``T'[perm(i)] = T[i]``.

Indices are simplified with the scope's ranges, so ``(4*q + r + 4*j) / 4`` becomes ``q + j``
when ``0 <= r < 4``.

Before / after (split dimension 1 of ``K`` by 4)::

    L<i=0:8, j=0:3> K[0, i + 4*j]
    L<i=0:8, j=0:3> { L<a=0:1, q=0:2, r=0:4> K[a, 4*q + r] }[0, (i + 4*j) / 4, i % 4]
"""

from __future__ import annotations

from collections.abc import Sequence

from ollie.errors import ExprError
from ollie.ir import Access, Affine, Expr, Iter, Node, Scope, accesses, map_body, var
from ollie.rules.base import Derived, Path, derive_each_scope, register


def _dim_iters(shape: Sequence[int]) -> list[Iter]:
    return [Iter(f"d{i}", 0, d) for i, d in enumerate(shape)]


def _rewrite_reads(scope: Scope, tensor: str | Scope, new_source: Scope,
                   fn) -> Scope:
    ranges = scope.ranges

    def visit(node: Node) -> Node | None:
        if isinstance(node, Access) and node.source == tensor:
            idx = tuple(i.simplify(ranges) for i in fn(node.indices))
            return Access(new_source, idx)
        return None

    return Scope(scope.traversal, scope.summation, map_body(scope.body, visit))


def split_dim(scope: Scope, tensor: str | Scope, shape: Sequence[int], dim: int, k: int
              ) -> Scope:
    """Read ``tensor`` (of ``shape``) through a copy whose dimension ``dim`` is split by k.

    ``tensor`` may also be a nested scope read by ``scope`` (``shape`` is then ignored): its
    dimension ranges over values ``[lo, hi)`` and the quotient ranges over the values
    ``[lo // k, (hi - 1) // k + 1)``."""
    if isinstance(tensor, Scope):
        its = [Iter(f"d{i}", t.lo, t.hi) for i, t in enumerate(tensor.traversal)]
    else:
        its = _dim_iters(shape)
    lo, hi = its[dim].lo, its[dim].hi
    if not 1 < k < hi - lo:
        raise ExprError(f"layout split of dim {dim} by {k}: factor out of range")
    q, r = Iter("q", lo // k, (hi - 1) // k + 1), Iter("r", 0, k)
    new_its = [*its[:dim], q, r, *its[dim + 1:]]
    idx = [var(it.name) for it in its]
    idx[dim] = var("q") * k + var("r")
    new_src = Scope(tuple(new_its), (), Access(tensor, tuple(idx)))

    def fn(ix: tuple[Affine, ...]) -> tuple[Affine, ...]:
        return (*ix[:dim], ix[dim] // k, ix[dim] % k, *ix[dim + 1:])

    return _rewrite_reads(scope, tensor, new_src, fn)


def merge_dims(scope: Scope, tensor: str, shape: Sequence[int], dim: int) -> Scope:
    """Read ``tensor`` through a copy whose dimensions ``dim`` and ``dim+1`` are fused."""
    d1 = shape[dim + 1]
    for acc in accesses(scope.body):
        if acc.source == tensor:
            lo, hi = acc.indices[dim + 1].bounds(scope.ranges)
            if lo < 0 or hi >= d1:
                raise ExprError(f"layout merge of {tensor} dims {dim},{dim + 1}: a read leaves "
                                f"[0, {d1}) in dimension {dim + 1}")
    its = _dim_iters(shape)
    z = Iter("z", 0, shape[dim] * d1)
    new_its = [*its[:dim], z, *its[dim + 2:]]
    idx = [var(it.name) for it in its]
    idx[dim], idx[dim + 1] = var("z") // d1, var("z") % d1
    new_src = Scope(tuple(new_its), (), Access(tensor, tuple(idx)))

    def fn(ix: tuple[Affine, ...]) -> tuple[Affine, ...]:
        return (*ix[:dim], ix[dim] * d1 + ix[dim + 1], *ix[dim + 2:])

    return _rewrite_reads(scope, tensor, new_src, fn)


def permute_dims(scope: Scope, tensor: str, shape: Sequence[int], perm: Sequence[int]) -> Scope:
    """Read ``tensor`` through a copy with dimensions in order ``perm`` (T' dim i = T dim
    perm[i])."""
    if sorted(perm) != list(range(len(shape))):
        raise ExprError(f"layout permutation {list(perm)} is not a permutation")
    its = _dim_iters(shape)
    new_src = Scope(tuple(its[p] for p in perm), (), Access(tensor, tuple(var(it.name)
                                                                           for it in its)))
    return _rewrite_reads(scope, tensor, new_src, lambda ix: tuple(ix[p] for p in perm))


def _apply(scope: Scope, path: Path, expr: Expr) -> list[tuple[Scope, str]]:
    """Structure-driven proposals: split a dimension by a coefficient used in it."""
    out: list[tuple[Scope, str]] = []
    shapes = expr.inputs
    for acc in accesses(scope.body):
        if not isinstance(acc.source, str):
            continue
        for dim, idx in enumerate(acc.indices):
            for k in sorted({abs(c) for c in idx.linear_coefs().values()} - {0, 1}):
                try:
                    new = split_dim(scope, acc.source, shapes[acc.source], dim, k)
                except ExprError:
                    continue
                note = f"split {acc.source} dim {dim} by {k}"
                if all(note != n for _, n in out):
                    out.append((new, note))
    return out


@register("data_layout_transformation")
def data_layout_transformation(expr: Expr) -> list[Derived]:
    """Split an input tensor's dimension by a coefficient its reads use (guided derivation
    calls :func:`split_dim`, :func:`merge_dims`, :func:`permute_dims` directly)."""
    return derive_each_scope(expr, "data_layout_transformation", _apply)
