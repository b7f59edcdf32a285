"""Matrix products kept transposed: another layout of an intermediate tensor.

A ``Matmul`` kernel computes ``C[b, m, n] = Sum_k A[b, m, k] * B[b, k, n]``. When only
eOperators read ``C`` (generated kernels that read it through their expressions, not a
library or the caller), the program may as well keep ``C^T[b, n, m] = Sum_k B^T[b, n, k] *
A^T[b, k, m]`` and have its readers index it with the ``m`` and ``n`` dimensions swapped: the
same values in another layout, and the same product with its operands' roles exchanged.

Which orientation runs faster depends on the library's kernel for the shape. A strided
transposed convolution derived as a product of its weight and its input pixels has a tall
``m`` (output channels times kernel taps) and a short ``n`` (input pixels); MKL computes it
as ``[m, k]`` (a transposed view of the weight) times ``[k, n]`` far slower than as
``[n, k] @ [k, m]`` (measured: docs/design/003-library-kernels-on-the-cpu.md). Both
orientations are candidates: the measured selection (:mod:`ollie.optimizer.select`) times the
program with its products transposed (:func:`transposed_products`) next to the program as
derived, and both are checked against the reference first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ollie.ir import Access, Node, Scope, make_expr, map_body
from ollie.match.eop import make_eop
from ollie.match.layout import blas_trans
from ollie.program.kernel import Kernel, View, as_int
from ollie.program.params import KernelKind, MatmulParams, make_params
from ollie.program.program import Program

TALL = 32
"""A product is transposed only when it has at least this many times more rows than columns
(:func:`transposable`): the transposed orientation gained on the tallest products and nothing
at 16 times or less, and timing both orientations of every product costs optimisation time.
Why this value (measured): docs/design/003-library-kernels-on-the-cpu.md."""

TRANSPOSED = "transposed"
"""The parameter marking a ``Matmul`` kernel that computes its product transposed (its output
holds ``C^T``; :func:`transpose_product`)."""


def _groups(k: Kernel) -> tuple[int, int] | None:
    """``(j1, j2)``: the output dimensions ``[:j1]``, ``[j1:j2]``, ``[j2:]`` of Matmul ``k``
    that flatten to its ``b``, ``m`` and ``n`` (None when they do not)."""
    shape = tuple(k.output_shape)
    p = k.params
    assert isinstance(p, MatmulParams)
    b, m, n = as_int(p.b), as_int(p.m), as_int(p.n)
    j1 = next((j for j in range(len(shape) + 1) if math.prod(shape[:j]) == b), None)
    if j1 is None:
        return None
    j2 = next((j for j in range(j1, len(shape) + 1) if math.prod(shape[j1:j]) == m), None)
    if j2 is None or math.prod(shape[j2:]) != n:
        return None
    return j1, j2


def _readers(prog: Program, name: str) -> list[int]:
    return [i for i, k in enumerate(prog.kernels) if name in k.inputs]


def transposable(prog: Program, i: int) -> bool:
    """Whether kernel ``i`` of ``prog`` is a ``Matmul`` (tall: ``m >= TALL * n`` rows, ``n > 1``
    columns; two 3-D operand views; no transposition yet) whose output only eOperators read,
    each through its expression (no view), and the program does not return."""
    k = prog.kernels[i]
    p = k.params
    if not isinstance(p, MatmulParams) or k.expr is None or p.transposed or \
            k.output in prog.outputs or len(k.views) != 2 or \
            any(v is None or len(v.sizes) != 3 for v in k.views):
        return False
    m, n = as_int(p.m), as_int(p.n)
    if n < 2 or m < TALL * n or _groups(k) is None:
        return False
    readers = [prog.kernels[r] for r in _readers(prog, k.output)]
    return bool(readers) and all(
        c.kind is KernelKind.EOP and c.expr is not None and
        all(j >= len(c.views) or c.views[j] is None
            for j, n in enumerate(c.inputs) if n == k.output)
        for c in readers)


def _swap(v: View) -> View:
    """``v`` with its last two dimensions exchanged (a transposed matrix view)."""
    return View(v.offset, (v.sizes[0], v.sizes[2], v.sizes[1]),
                (v.strides[0], v.strides[2], v.strides[1]))


def _permute_reads(scope: Scope, name: str, perm: Sequence[int]) -> Scope:
    """``scope`` reading tensor ``name`` permuted: a read ``T[e_0, .., e_r]`` becomes
    ``T'[e_perm[0], .., e_perm[r]]`` (nested scopes included)."""

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access):
            src = node.source
            if isinstance(src, Scope):
                return Access(_permute_reads(src, name, perm), node.indices)
            if src == name:
                return Access(src, tuple(node.indices[p] for p in perm))
        return None

    return Scope(scope.traversal, scope.summation, map_body(scope.body, fn))


def transpose_product(prog: Program, i: int) -> Program:
    """``prog`` with Matmul kernel ``i`` (:func:`transposable`) computing ``C^T`` (operands
    exchanged and transposed, output dimensions ``b, n, m``) and its readers reading it so."""
    k = prog.kernels[i]
    assert k.expr is not None
    groups = _groups(k)
    assert groups is not None
    j1, j2 = groups
    rank = len(k.output_shape)
    perm = [*range(j1), *range(j2, rank), *range(j1, j2)]
    root = k.expr.root
    trav = tuple(root.traversal[p] for p in perm)
    v0, v1 = k.views
    assert v0 is not None and v1 is not None, "a transposable product reads two views"
    a, b = _swap(v1), _swap(v0)
    q = k.params
    assert isinstance(q, MatmulParams)
    params = replace(q, m=q.n, n=q.m, trans_a=bool(blas_trans(a)),
                     trans_b=bool(blas_trans(b)), transposed=True)
    expr = make_expr(k.expr.decls, Scope(trav, root.summation, root.body))
    kernels = list(prog.kernels)
    kernels[i] = Kernel(k.kind, params, (k.inputs[1], k.inputs[0]), k.output, expr, (a, b))
    shape = tuple(expr.shape)
    for r in _readers(prog, k.output):
        c = kernels[r]
        assert c.expr is not None
        decls = {n: (shape if n == k.output else tuple(s)) for n, s in c.expr.decls}
        new = make_eop(_permute_reads(c.expr.root, k.output, perm), decls, c.output)
        merged = make_params(KernelKind.EOP, {**c.params, **new.params})
        kernels[r] = Kernel(KernelKind.EOP, merged, new.inputs, c.output,
                            new.expr, ())
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


def transposed_products(prog: Program) -> Program | None:
    """``prog`` with every :func:`transposable` product transposed, or None when there is
    none."""
    out = prog
    for i in range(len(prog.kernels)):
        if transposable(out, i):
            out = transpose_product(out, i)
    return None if out is prog else out


__all__ = ["TRANSPOSED", "transposable", "transpose_product", "transposed_products"]
