"""eOperator generation: turn a scope into an ``eOp`` :class:`~ollie.program.kernel.Kernel`.

An eOperator is a generated kernel that computes its scope exactly (``kernel.expr``); codegen
backends and the reference interpreter execute it. Its params (API.md) are::

    expr          the expression text (ollie.format of kernel.expr)
    inputs        the tensors it reads, in declaration order
    output_shape  the output shape (the scope's shape)
    flops         arithmetic operations: per summation point, one per +, -, *, /, unary minus
                  and function call of the body, plus one accumulate when the scope sums;
                  nested scopes add their own count once (they are instantiated)
    bytes         bytes moved, float32: each input read once (at most its size, at most the
                  number of reads the scope makes of it) plus the output written once
    intensity     flops / bytes
    bound         "compute" when intensity > COMPUTE_BOUND_INTENSITY, else "memory"

The search prefers library operators for compute-bound parts and keeps eOperators for
memory-bound ones, as the paper does ("Discussion" of expression instantiation).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

from ollie.ir import Access, Call, Node, Scope, children, format_expr, make_expr, tensor_names
from ollie.ir.nodes import BinOp, Neg
from ollie.program.kernel import Kernel
from ollie.program.params import EOpParams, KernelKind

COMPUTE_BOUND_INTENSITY = 4.0
"""Flops per byte above which an eOperator counts as compute-bound. Matches the ridge point of
a balanced CPU/GPU roofline only roughly; its role is to flag eOps doing real arithmetic
(reductions with reuse) rather than data movement, which is below 1 flop/byte."""

BYTES_PER_ELEMENT = 4


def _ops(node: Node) -> int:
    own = 1 if isinstance(node, (BinOp, Neg, Call)) else 0
    return own + sum(_ops(c) for c in children(node))


def scope_flops(scope: Scope) -> int:
    """Arithmetic operations to compute ``scope`` once (see the module doc)."""
    points = prod(it.size for it in scope.iters)
    per_point = _ops(scope.body) + (1 if scope.summation else 0)
    nested = sum(scope_flops(acc.source) for acc in _reads(scope)
                 if isinstance(acc.source, Scope))
    return points * per_point + nested


def _reads(scope: Scope) -> list[Access]:
    out: list[Access] = []
    stack: list[Node] = [scope.body]
    while stack:
        node = stack.pop()
        if isinstance(node, Access):
            out.append(node)
        else:
            stack.extend(children(node))
    return out


def _read_counts(scope: Scope, counts: dict[str, int]) -> None:
    points = prod(it.size for it in scope.iters)
    for acc in _reads(scope):
        if isinstance(acc.source, Scope):
            _read_counts(acc.source, counts)
        else:
            counts[acc.source] = counts.get(acc.source, 0) + points


def scope_bytes(scope: Scope, decls: Mapping[str, tuple[int, ...]]) -> int:
    """Bytes moved by one execution of ``scope`` (see the module doc)."""
    counts: dict[str, int] = {}
    _read_counts(scope, counts)
    elems = sum(min(prod(decls[n]), c) for n, c in counts.items())
    return BYTES_PER_ELEMENT * (elems + prod(scope.shape))


def make_eop(scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str) -> Kernel:
    """The eOperator computing ``scope`` into tensor ``name``; ``decls`` must declare every
    tensor the scope reads (only those are declared in the kernel's expression)."""
    used = tensor_names(scope)
    inputs = tuple(n for n in decls if n in used)
    expr = make_expr({n: tuple(decls[n]) for n in inputs}, scope)
    flops = scope_flops(scope)
    nbytes = scope_bytes(scope, decls)
    intensity = flops / nbytes if nbytes else 0.0
    params = EOpParams(
        expr=format_expr(expr),
        inputs=list(inputs),
        output_shape=list(scope.shape),
        bound="compute" if intensity > COMPUTE_BOUND_INTENSITY else "memory",
        flops=int(flops),
        bytes=int(nbytes),
        intensity=float(intensity),
    )
    return Kernel(KernelKind.EOP, params, inputs, name, expr, ())
