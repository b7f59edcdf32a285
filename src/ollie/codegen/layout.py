"""Reading inputs in the memory order they come in: permuted declarations.

A library kernel may hand an eOperator a tensor that is a permutation of a dense array (oneDNN
writes convolution outputs channels-last; a ``[16, 4096, 2, 2]`` output viewed as
``[16, 256, 4, 4, 2, 2]`` has strides ``(16384, 16, 4, 1, 8192, 4096)``). Copying it to
row-major order before the generated code runs costs a full pass over memory: measured on the
InfoGAN transposed-convolution add, 126 us of copy for a 25 us kernel. Instead the expression
is rewritten to read the input as the dense array it is: the declaration's shape permuted and
every read's indices permuted the same way, an exact rewrite (element ``T[i]`` of the original
is element ``T'[i[perm]]`` of the permuted one), compiled as its own kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ollie.ir import Access, Expr, Node, Scope, map_body


def dense_permutation(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """``perm`` such that the dimensions of a tensor with ``shape`` and ``strides`` taken in
    that order are row-major contiguous, or ``None`` when the tensor is not a permutation of a
    dense array. Size-1 dimensions go where their stride says (any place is valid)."""
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return tuple(order)


def permute_inputs(expr: Expr, perms: Mapping[str, Sequence[int]]) -> Expr:
    """``expr`` reading each input ``name`` of ``perms`` through the permuted declaration
    ``shape[perm]`` (reads in nested scopes too)."""

    def scope(s: Scope) -> Scope:
        def fn(node: Node) -> Node | None:
            if not isinstance(node, Access):
                return None
            src = node.source
            if isinstance(src, Scope):
                return Access(scope(src), node.indices)
            perm = perms.get(src)
            if perm is None:
                return None
            return Access(src, tuple(node.indices[d] for d in perm))

        return Scope(s.traversal, s.summation, map_body(s.body, fn))

    decls = tuple((n, tuple(sh[d] for d in perms[n]) if n in perms else sh)
                  for n, sh in expr.decls)
    return Expr(decls, scope(expr.root))
