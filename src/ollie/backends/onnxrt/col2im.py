"""Selective adds as ONNX ``Col2Im``, for ONNX Runtime regions (:mod:`ollie.backends.onnxrt.expr`).

A derived transposed convolution is a product whose columns are summed into the image: the
selective add ``L<c..., h...> Sum<y...> T[..., h - s*y + p, ..., y, ...]``. Emitted as a grid,
that sum is a ``Gather`` or a chain of shifted slices; as one ``Col2Im`` it costs what ONNX
Runtime's own transposed convolution spends on it. :func:`selective_add` tries the one-stage
form, after merging the two-stage form into it (:func:`merged`), then the scope as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ollie.backends.onnxrt.views import Emitter, int_array, out_node
from ollie.ir import Access, Scope
from ollie.ir.index import Affine, Var, var
from ollie.ir.nodes import Iter

Shape = tuple[Sequence[int], Sequence[int]]
"""A read source's dimensions and the first position of each (non-zero for a nested scope
whose traversal iterators start elsewhere)."""


def selective_add(b: Emitter, scope: Scope, shape_of: Callable[[str | Scope], Shape],
                  whole: Callable[[str | Scope], str]) -> str | None:
    """The ONNX value of ``scope`` as one ``Col2Im`` (merged from two stages first where that
    keeps every value), or None when it is no selective add. ``shape_of``: a read source's
    :data:`Shape`; ``whole``: its ONNX value (a nested scope emitted once)."""
    merged_scope = merged(scope, shape_of)
    if merged_scope is not None:
        folded = col2im(b, merged_scope, shape_of, whole)
        if folded is not None:
            return folded
    return col2im(b, scope, shape_of, whole)


def merged(scope: Scope, shape_of: Callable[[str | Scope], Shape]) -> Scope | None:
    """``scope`` with the nested scope its one read reads inlined, when that scope's body
    is one read as well and inlining keeps every value: each of the nested scope's
    traversal iterators is either always read inside its range, or indexes the inner
    tensor alone (``i + c``) with every position valid in the inner tensor inside that
    range, so that a read outside the range (zero in the reference semantics) reads
    outside the inner tensor (zero as well). The nested scope's summation iterators join
    ``scope``'s (renamed where they clash). Else None. The two-stage selective add of a
    derived transposed convolution so becomes the one-stage form, one ``Col2Im``
    (:func:`col2im`), far faster than two ``Col2Im`` (measured:
    docs/design/009-onnx-runtime-regions.md)."""
    body = scope.body
    if not isinstance(body, Access) or not isinstance(body.source, Scope):
        return None
    inner = body.source
    read = inner.body
    if not isinstance(read, Access):
        return None
    ranges = scope.ranges
    taken = set(ranges)
    renamed: list[Iter] = []
    mapping: dict[str, Affine] = {it.name: e for it, e in
                                  zip(inner.traversal, body.indices, strict=True)}
    for it in inner.summation:
        name, k = it.name, 0
        while name in taken:
            k += 1
            name = f"{it.name}_{k}"
        taken.add(name)
        renamed.append(Iter(name, it.lo, it.hi))
        mapping[it.name] = var(name)
    dims, starts = shape_of(read.source)
    valid = [(a, a + n) for a, n in zip(starts, dims, strict=True)]  # the inner positions
    for it, e in zip(inner.traversal, body.indices, strict=True):
        lo, hi = e.bounds(ranges)
        if it.lo <= lo and hi < it.hi:
            continue  # always read inside the nested scope
        axes = [d for d, g in enumerate(read.indices) if it.name in g.vars()]
        if len(axes) != 1 or read.indices[axes[0]].terms != ((Var(it.name), 1),):
            return None
        shift = read.indices[axes[0]].const
        first, end = valid[axes[0]]
        if not (it.lo <= first - shift and end - shift <= it.hi):
            return None
    return Scope(scope.traversal, scope.summation + tuple(renamed),
                 Access(read.source, tuple(g.subst(mapping) for g in read.indices)))


def col2im(b: Emitter, scope: Scope, shape_of: Callable[[str | Scope], Shape],
           whole: Callable[[str | Scope], str]) -> str | None:
    """``scope`` as a selective add (the columns of a transposed convolution summed into its image):
    ``L<c..., h...> Sum<y...> T[...]`` whose one read indexes ``T`` by each leading
    traversal iterator ``c`` alone, each summation iterator ``y`` alone and, per spatial
    traversal iterator ``h``, one kernel position ``h - s*y + p`` (``s > 0``), as a
    ``Transpose`` + ``Reshape`` of ``T`` to ``[1, C*K, L]`` and one ONNX ``Col2Im``
    (image position ``s*y - p + k``, kernel positions outside ``T`` contributing
    nothing, as in the reference semantics); else None. Positions count from each
    iterator's and each nested scope's first one.

    ONNX Runtime's ``Col2Im`` lets a derived ``Matmul`` + selective add stay in a region
    (a ``Gather`` over the grid costs more). Whether the derived form is faster than the
    original transposed convolution depends on the layer, so which form runs is measured by
    the selection. The two-stage form (one spatial dimension per stage, the other read alone
    after it) is left to the general emission (:func:`merged` makes it one stage where that is
    exact): as two ``Col2Im`` with one-element kernels it is far slower. Figures:
    docs/design/009-onnx-runtime-regions.md."""
    body = scope.body
    if not isinstance(body, Access) or not scope.summation or \
            any(it.lo != 0 for it in scope.summation):
        return None
    size = {it.name: it.size for it in scope.iters}
    first = {it.name: it.lo for it in scope.traversal}
    trav = [it.name for it in scope.traversal]
    summ = {it.name for it in scope.summation}
    dims, lo = shape_of(body.source)  # a nested scope's element x is at x - lo
    alone: dict[str, int] = {}
    kernel: dict[str, tuple[int, str, int, int]] = {}  # h -> (dim of T, y, s, p)
    for d, q in enumerate(body.indices):
        terms = {a.name: c for a, c in q.terms if isinstance(a, Var)}
        if len(terms) != len(q.terms):
            return None
        # the position in T of the iterators' first positions
        at = q.const + sum(c * first.get(n, 0) for n, c in terms.items()) - lo[d]
        if len(terms) == 1 and next(iter(terms.values())) == 1:
            (v,) = terms
            if v in alone or at != 0 or dims[d] != size[v]:
                return None
            alone[v] = d
            continue
        if len(terms) != 2:
            return None
        (h, ch), (y, cy) = sorted(terms.items(), key=lambda t: t[0] in summ)
        if ch != 1 or cy >= 0 or h in summ or y not in summ or h in kernel:
            return None
        kernel[h] = (d, y, -cy, at)
    spatial = [h for h in trav if h in kernel]
    lead = [t for t in trav if t not in kernel]
    ys = [kernel[h][1] for h in spatial]
    if not spatial or trav != lead + spatial or set(alone) != set(lead) | summ or \
            len(set(ys)) != len(ys) or set(ys) != summ:
        return None
    ks, strides, begin, end = [], [], [], []
    for h in spatial:
        d, y, st, p = kernel[h]
        k, blocks = dims[d], size[y]
        after = (blocks - 1) * st + k - size[h] - p  # so that Col2Im counts `blocks`
        if p < 0 or after < 0:
            return None
        ks.append(k)
        strides.append(st)
        begin.append(p)
        end.append(after)
    perm = [alone[t] for t in lead] + [kernel[h][0] for h in spatial] + \
        [alone[y] for y in ys]
    src = whole(body.source)
    if perm != list(range(len(perm))):
        src = out_node(b, "Transpose", [src], tuple(dims[d] for d in perm),
                       "transpose", perm=perm)
    channels = math.prod(size[t] for t in lead)
    col = b.reshape(src, (1, channels * math.prod(ks),
                               math.prod(size[y] for y in ys)))
    image = tuple(size[h] for h in spatial)
    y = out_node(b, "Col2Im", [col, b.const("image", int_array(image)),
                                    b.const("block", int_array(ks))],
                 (1, channels, *image), "col2im", strides=strides, pads=begin + end)
    return b.reshape(y, scope.shape)


__all__ = ["Shape", "col2im", "merged", "selective_add"]
