"""Operand layouts shared by the matchers: strided views, BLAS layouts, layout eOperators.

A library operator reads each operand as a canonical tensor whose dimensions are *groups* of
iterators (Matmul's A is ``[b, m, k]``; a group of several iterators is flattened in the
given order, an empty group has size 1). :func:`operand_view` decides whether that canonical
tensor is a strided :class:`~ollie.program.kernel.View` of the stored tensor: every index
linear, every read inside the tensor (no padding), strides non-negative and the iterators of a
group fusible (``stride(it_i) == size(it_{i+1}) * stride(it_{i+1})``, size-1 iterators
ignored). When it is not, the matcher materialises the canonical tensor with a layout eOperator
``L<group iterators...> X[tX]`` (which also materialises zero padding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise, product
from math import prod

from ollie.ir import Access, Affine, BinOp, Const, Iter, Node, Scope, var
from ollie.match.eop import make_eop
from ollie.program.kernel import Kernel, View

Ranges = Mapping[str, tuple[int, int]]


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return tuple(out)


def iterator_strides(indices: Sequence[Affine], shape: Sequence[int]) -> dict[str, int] | None:
    """Flat-storage stride of every iterator of linear ``indices`` (None if one is not linear)."""
    if not all(i.is_linear for i in indices):
        return None
    st = row_major_strides(shape)
    out: dict[str, int] = {}
    for d, idx in enumerate(indices):
        for name, c in idx.linear_coefs().items():
            out[name] = out.get(name, 0) + c * st[d]
    return out


def operand_view(indices: Sequence[Affine], shape: Sequence[int],
                 groups: Sequence[Sequence[str]], ranges: Ranges) -> View | str:
    """The View reading ``tensor[indices]`` as the canonical tensor ``groups``, or the reason
    it is not one (a sentence naming the dimension)."""
    env = {n: lo for n, (lo, _) in ranges.items()}
    grouped = {n for g in groups for n in g}
    for d, idx in enumerate(indices):
        if not idx.is_linear:
            return f"dimension {d} index {idx} is not affine (div/mod)"
        extra = idx.vars() - grouped
        if extra:
            return f"dimension {d} uses iterator(s) {sorted(extra)} outside the operator's groups"
        lo, hi = idx.bounds(ranges)
        if lo < 0 or hi >= shape[d]:
            return (f"dimension {d} index {idx} reads {lo}..{hi}, outside [0, {shape[d]}) "
                    "(zero padding)")
    strides = iterator_strides(indices, shape)
    assert strides is not None
    st = row_major_strides(shape)
    offset = sum(st[d] * int(idx.evaluate(env)) for d, idx in enumerate(indices))
    sizes, gstrides = [], []
    for g in groups:
        its = [n for n in g if ranges[n][1] - ranges[n][0] > 1]
        for n in its:
            if strides.get(n, 0) < 0:
                return f"iterator {n} has negative stride {strides[n]}"
        for a, b in pairwise(its):
            size_b = ranges[b][1] - ranges[b][0]
            if strides.get(a, 0) != size_b * strides.get(b, 0):
                return (f"iterators {' '.join(g)} are not fusible: stride({a}) = "
                        f"{strides.get(a, 0)} != size({b}) * stride({b}) = "
                        f"{size_b * strides.get(b, 0)}")
        sizes.append(prod(ranges[n][1] - ranges[n][0] for n in g))
        gstrides.append(strides.get(its[-1], 0) if its else 0)
    return View(int(offset), tuple(sizes), tuple(gstrides))


def contiguous_view(sizes: Sequence[int]) -> View:
    return View(0, tuple(sizes), row_major_strides(sizes))


def blas_trans(view: View) -> bool | None:
    """BLAS layout of the last two dimensions of ``view``: False when the last dimension has
    unit stride (row-major, leading dimension >= its size), True when the one before has
    (transposed), None when neither (a copy is needed)."""
    (r, c), (sr, sc) = view.sizes[-2:], view.strides[-2:]
    if (c == 1 or sc == 1) and (r == 1 or sr >= max(1, c)):
        return False
    if (r == 1 or sr == 1) and (c == 1 or sc >= max(1, r)):
        return True
    return None


def candidate_orders(group: Sequence[str], stride_maps: Iterable[dict[str, int] | None]
                     ) -> list[tuple[str, ...]]:
    """Flattening orders worth trying for ``group``: as given, then by decreasing stride in
    each operand (when known)."""
    out = [tuple(group)]
    for sm in stride_maps:
        if sm is not None and len(group) > 1:
            order = tuple(sorted(group, key=lambda n: -abs(sm.get(n, 0))))
            if order not in out:
                out.append(order)
    return out


def order_choices(groups: Sequence[Sequence[str]], stride_maps: Sequence[dict[str, int] | None],
                  fixed: Sequence[bool]) -> list[tuple[tuple[str, ...], ...]]:
    """Every combination of candidate orders; groups marked ``fixed`` keep their order."""
    per = [[tuple(g)] if f else candidate_orders(g, stride_maps)
           for g, f in zip(groups, fixed, strict=True)]
    return list(product(*per))


def nontrivial(names: Iterable[str], ranges: Ranges) -> tuple[str, ...]:
    """``names`` without size-1 iterators (they do not affect a layout)."""
    return tuple(n for n in names if ranges[n][1] - ranges[n][0] > 1)


def same_layout(a: Iterable[str], b: Iterable[str], ranges: Ranges) -> bool:
    """Whether two iterator orders give the same row-major layout."""
    return nontrivial(a, ranges) == nontrivial(b, ranges)


# --------------------------------------------------------------------- building kernels
def iters_of(scope: Scope, names: Iterable[str]) -> tuple[Iter, ...]:
    return tuple(scope.iter(n) for n in names)


def read_at(name: str, its: Sequence[Iter], replace: Mapping[int, Affine] | None = None
            ) -> Access:
    """Read tensor ``name`` produced by a scope over ``its`` at those iterators' values
    (position ``it - lo``); ``replace`` gives other index expressions for some positions."""
    idx = [var(it.name) - it.lo for it in its]
    for pos, e in (replace or {}).items():
        idx[pos] = e
    return Access(name, tuple(idx))


def product_body(scale: float, a: Node, b: Node) -> Node:
    body: Node = BinOp("*", a, b)
    return body if scale == 1.0 else BinOp("*", Const(scale), body)


def layout_eop(access: Access, its: Sequence[Iter], decls: Mapping[str, tuple[int, ...]],
               name: str) -> Kernel:
    """The layout eOperator ``L<its> access`` writing tensor ``name``."""
    return make_eop(Scope(tuple(its), (), access), decls, name)


def output_eop(c_name: str, c_iters: Sequence[Iter], scope: Scope, name: str) -> Kernel:
    """The eOperator writing the scope's layout from the operator output ``c_name`` (computed
    over ``c_iters``)."""
    shape = tuple(it.size for it in c_iters)
    return make_eop(Scope(scope.traversal, (), read_at(c_name, c_iters)), {c_name: shape}, name)


@dataclass(frozen=True)
class Names:
    """Fresh tensor names for one match: the output and its intermediates."""

    output: str
    taken: frozenset[str]

    def sub(self, suffix: str) -> str:
        base = f"{self.output}_{suffix}"
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}{k}", k + 1
        return name


def names_for(decls: Mapping[str, tuple[int, ...]], name: str | None, default: str) -> Names:
    taken = frozenset(decls)
    out = name or default
    k = 1
    while name is None and out in taken:
        out, k = f"{default}{k}", k + 1
    return Names(out, taken | {out})
