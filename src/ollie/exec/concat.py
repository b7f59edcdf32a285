"""Concatenations inside an eOperator, run by ``torch.cat`` before its generated CPU code.

Post-processing fuses a ``Concat`` with the element-wise operators around it (DenseNet: each
layer's concatenation of every earlier feature map, then BatchNorm and ReLU), so a model holds
one such eOperator per number of concatenated tensors. The generated code of each is a
pattern of its own (:mod:`ollie.codegen.pattern` shares a pattern only between equal bodies),
a numba compile of seconds, and one more per layout of its inputs (a channels-last
convolution output read in place). :func:`split_concat` cuts the concatenation off: it runs
as ``torch.cat`` into a contiguous buffer, and the rest of the eOperator reads that buffer,
the same pattern at every layer. Why (measured): docs/design/035-concat-eoperators.md.

A concatenation here is a scope ``L<x...> A[x...] + B[x..., x_d - a, x...] + ...`` (no
summation, every iterator from 0) whose terms read whole declared tensors laid end to end
along one axis ``d``: each term is zero outside its tensor, so the sum is the concatenation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ollie.ir import Expr
from ollie.ir.index import Var
from ollie.ir.nodes import Access, BinOp, Scope, accesses, make_expr, map_body, tensor_names


@dataclass(frozen=True)
class ConcatSplit:
    """An eOperator as a concatenation then ``rest``: ``torch.cat([parts...], axis)`` is the
    tensor ``name`` (shaped ``shape``) that ``rest`` reads; ``rest`` is None when the
    eOperator is the concatenation itself."""

    parts: tuple[str, ...]
    axis: int
    name: str
    shape: tuple[int, ...]
    rest: Expr | None

    def cat(self, env: Mapping[str, torch.Tensor], out: torch.Tensor | None = None
            ) -> torch.Tensor:
        """The concatenation of the parts read from ``env`` (into ``out`` when it is a
        contiguous tensor of the right shape; else a new contiguous tensor)."""
        tensors = [env[n] for n in self.parts]
        if out is None or not out.is_contiguous() or tuple(out.shape) != self.shape:
            out = torch.empty(self.shape, dtype=tensors[0].dtype)
        return torch.cat(tensors, dim=self.axis, out=out)


def split_concat(expr: Expr) -> ConcatSplit | None:
    """``expr`` as a concatenation and the rest (see the module docstring): the root scope
    itself when it is a concatenation (``rest`` None), else the first nested scope its body
    reads that is one; None when there is none."""
    decls = expr.inputs
    whole = _concatenation(expr.root, decls)
    if whole is not None:
        parts, axis = whole
        return ConcatSplit(parts, axis, "", expr.shape, None)
    for acc in accesses(expr.root.body):
        if not isinstance(acc.source, Scope):
            continue
        found = _concatenation(acc.source, decls)
        if found is None:
            continue
        parts, axis = found
        inner = acc.source
        name = _fresh("cat", decls)

        def swap(node: object, inner: Scope = inner, name: str = name) -> object | None:
            if isinstance(node, Access) and node.source == inner:
                return Access(name, node.indices)
            return None

        root = Scope(expr.root.traversal, expr.root.summation, map_body(expr.root.body, swap))
        read = tensor_names(root)
        rest = make_expr([(name, inner.shape)] + [(n, s) for n, s in expr.decls if n in read],
                         root)
        return ConcatSplit(parts, axis, name, inner.shape, rest)
    return None


def _concatenation(scope: Scope, decls: dict[str, tuple[int, ...]]
                   ) -> tuple[tuple[str, ...], int] | None:
    """``(tensors in order, axis)`` when ``scope`` is a concatenation of declared tensors."""
    if scope.summation or any(it.lo != 0 for it in scope.traversal):
        return None
    terms, stack = [], [scope.body]
    while stack:
        node = stack.pop()
        if isinstance(node, BinOp) and node.op == "+":
            stack += [node.rhs, node.lhs]
        elif isinstance(node, Access) and isinstance(node.source, str):
            terms.append(node)
        else:
            return None
    if len(terms) < 2:
        return None
    axis: int | None = None
    placed = []
    for acc in terms:
        dims = decls.get(acc.source)  # type: ignore[arg-type]
        if dims is None or len(acc.indices) != len(scope.traversal) or len(dims) != len(
                acc.indices):
            return None
        start = 0
        for k, (q, it) in enumerate(zip(acc.indices, scope.traversal, strict=True)):
            if q.terms != ((Var(it.name), 1),):
                return None
            if q.const != 0 or dims[k] != it.size:
                if axis not in (None, k):
                    return None
                axis, start = k, -q.const
        placed.append((start, dims, acc.source))
    if axis is None:
        return None
    placed.sort(key=lambda t: t[0])
    edge = 0
    for start, dims, _ in placed:
        if start != edge:
            return None  # a gap or an overlap: not a concatenation
        edge += dims[axis]
    if edge != scope.traversal[axis].size:
        return None
    return tuple(str(src) for _, _, src in placed), axis


def _fresh(base: str, taken: dict[str, tuple[int, ...]]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    return name


__all__ = ["ConcatSplit", "split_concat"]
