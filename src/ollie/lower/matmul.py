"""Lowerings of the contractions: ``MatMul`` / ``BatchMatMul`` (numpy matmul semantics),
``Gemm`` (ONNX), and Longformer's banded products ``G2BMM`` and ``GBMM``.

MatMul of ``A[..., M, K]`` and ``B[..., K, N]``, batch dimensions broadcast (a size-1 batch
dimension reads index 0); a 1-D ``A`` is a row vector and a 1-D ``B`` a column vector whose
unit dimension is dropped from the result, as in ``numpy.matmul``::

    L<b, m, n> Sum<k> A[b, m, k] * B[0, k, n]        # A [2, M, K], B [1, K, N]

Gemm ``Y = alpha * op(A) @ op(B) + beta * C``: the product is its own scope and the scaling
and the (broadcast) ``C`` are added by an outer scope, never under the ``Sum``::

    L<m, n> { L<m, n> Sum<k> A[k, m] * B[k, n] }[m, n] * 0.5 + C[0, n] * 2

G2BMM (width w, dilation d) and GBMM (see MODELS.md); reads outside the sequence give 0::

    L<b, i, j=0:2w+1> Sum<k> Q[b, i, k] * K[b, i + d*j - d*w, k]
    L<b, i, n> Sum<j=0:2w+1> S[b, i, j] * V[b, i + d*j - d*w, n]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ollie.errors import ShapeError, UnsupportedError
from ollie.ir import BinOp, Const, Node, var
from ollie.ir.index import Affine
from ollie.lower.common import (
    Input,
    Lowered,
    broadcast_indices,
    broadcast_shapes,
    check_rank,
    finish,
    int_tuple,
    iters,
    read,
    read_scope,
    scope,
    shape_error,
    take_inputs,
)


def _batch_names(rank: int) -> tuple[str, ...]:
    return ("b",) if rank == 1 else tuple(f"b{k}" for k in range(rank))


def _matmul(op: str, inputs: Sequence[Input]) -> Lowered:
    a, b = take_inputs(op, inputs, ("A", "B"))
    sa, sb = a[1], b[1]
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    ka = sa[-1]
    kb = sb[0] if b_vec else sb[-2]
    if ka != kb:
        raise shape_error(op, f"contracted dimensions differ ({ka} vs {kb})", A=a, B=b)
    batch_a = () if a_vec else sa[:-2]
    batch_b = () if b_vec else sb[:-2]
    try:
        batch = broadcast_shapes(op, {"A": batch_a, "B": batch_b})
    except ShapeError:
        raise shape_error(op, "batch dimensions do not broadcast", A=a, B=b) from None
    bnames = _batch_names(len(batch))
    bidx = [var(nm) for nm in bnames]
    m, n, k = var("m"), var("n"), var("k")
    names, shape = list(bnames), list(batch)
    if not a_vec:
        names.append("m")
        shape.append(sa[-2])
    if not b_vec:
        names.append("n")
        shape.append(sb[-1])
    a_idx = (k,) if a_vec else (*broadcast_indices(batch_a, bidx), m, k)
    b_idx = (k,) if b_vec else (*broadcast_indices(batch_b, bidx), k, n)
    body = BinOp("*", read(a[0], a_idx), read(b[0], b_idx))
    root = scope(iters(names, shape), iters("k", (ka,)), body)
    return finish(op, (a, b), root)


def matmul(inputs: Sequence[Input]) -> Lowered:
    """``MatMul`` with numpy/ONNX semantics (1-D operands, broadcast batch dimensions)."""
    return _matmul("MatMul", inputs)


def batch_matmul(inputs: Sequence[Input]) -> Lowered:
    """``BatchMatMul``: the MatMul lowering (batch dimensions broadcast)."""
    return _matmul("BatchMatMul", inputs)


def _scalar(op: str, attr: str, value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be a number, got {value!r}") \
            from None
    if not math.isfinite(v):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be finite, got {value!r}")
    return v


def _flag(op: str, attr: str, value: object) -> bool:
    if value not in (0, 1, False, True):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be 0 or 1, got {value!r}")
    return bool(value)


def _scaled(x: Node, factor: float) -> Node:
    return x if factor == 1.0 else BinOp("*", x, Const(factor))


def gemm(inputs: Sequence[Input], *, alpha: object = 1.0, beta: object = 1.0,
         transA: object = 0, transB: object = 0) -> Lowered:
    """``Gemm``: ``alpha * op(A) @ op(B) + beta * C`` with C broadcast to [M, N]."""
    op = "Gemm"
    a, b, c = take_inputs(op, inputs, ("A", "B"), ("C",))
    sa, sb = check_rank(op, "A", a, 2), check_rank(op, "B", b, 2)
    al, be = _scalar(op, "alpha", alpha), _scalar(op, "beta", beta)
    ta, tb = _flag(op, "transA", transA), _flag(op, "transB", transB)
    mm_, ka = (sa[1], sa[0]) if ta else sa
    kb, nn_ = (sb[1], sb[0]) if tb else sb
    if ka != kb:
        raise shape_error(op, f"contracted dimensions differ ({ka} vs {kb}) with "
                          f"transA={int(ta)}, transB={int(tb)}", A=a, B=b)
    m, n, k = var("m"), var("n"), var("k")
    body = BinOp("*", read(a[0], (k, m) if ta else (m, k)), read(b[0], (n, k) if tb else (k, n)))
    out = iters("mn", (mm_, nn_))
    product = scope(out, iters("k", (ka,)), body)
    use_c = c is not None and be != 0.0
    if use_c:
        sc = check_rank(op, "C", c, (1, 2))
        try:
            ok = broadcast_shapes(op, {"C": sc, "Y": (mm_, nn_)}) == (mm_, nn_)
        except ShapeError:
            ok = False
        if not ok:
            raise shape_error(op, f"C does not broadcast to the output [{mm_}, {nn_}]",
                              A=a, B=b, C=c)
    if not use_c and al == 1.0:
        return finish(op, (a, b, c), product)
    outer: Node = _scaled(read_scope(product, out), al)
    if use_c:
        outer = BinOp("+", outer, _scaled(read(c[0], broadcast_indices(c[1], (m, n))), be))
    return finish(op, (a, b, c), scope(out, (), outer))


def _band(op: str, width: object, dilation: object) -> tuple[int, int]:
    (w,) = int_tuple(op, "width", width, 1, minimum=0)
    (d,) = int_tuple(op, "dilation", dilation, 1, minimum=1)
    return w, d


def _band_index(i: Affine, j: Affine, w: int, d: int) -> Affine:
    """``i + d*(j - w)``: the sequence position of band slot ``j`` around row ``i``."""
    return i + d * j - d * w


def g2bmm(inputs: Sequence[Input], *, width: object, dilation: object = 1) -> Lowered:
    """``G2BMM``: Q [B, M, K], K [B, M, K] -> S [B, M, 2w+1]."""
    op = "G2BMM"
    q, kt = take_inputs(op, inputs, ("Q", "K"))
    sq, sk = check_rank(op, "Q", q, 3), check_rank(op, "K", kt, 3)
    if sq != sk:
        raise shape_error(op, "Q and K must have the same shape", Q=q, K=kt)
    w, d = _band(op, width, dilation)
    b, i, j, k = var("b"), var("i"), var("j"), var("k")
    body = BinOp("*", read(q[0], (b, i, k)), read(kt[0], (b, _band_index(i, j, w, d), k)))
    root = scope(iters("bij", (sq[0], sq[1], 2 * w + 1)), iters("k", (sq[2],)), body)
    return finish(op, (q, kt), root)


def gbmm(inputs: Sequence[Input], *, width: object = None, dilation: object = 1) -> Lowered:
    """``GBMM``: S [B, M, 2w+1], V [B, M, N] -> O [B, M, N]; ``width`` defaults to
    ``(S.shape[2] - 1) / 2``."""
    op = "GBMM"
    s, v = take_inputs(op, inputs, ("S", "V"))
    ss, sv = check_rank(op, "S", s, 3), check_rank(op, "V", v, 3)
    if width is None:
        if ss[2] % 2 == 0:
            raise shape_error(op, "S's last dimension must be odd (2*width + 1)", S=s)
        width = (ss[2] - 1) // 2
    w, d = _band(op, width, dilation)
    if ss[:2] != sv[:2] or ss[2] != 2 * w + 1:
        raise shape_error(op, f"expected S [B, M, {2 * w + 1}] and V [B, M, N] for width {w}",
                          S=s, V=v)
    b, i, n, j = var("b"), var("i"), var("n"), var("j")
    body = BinOp("*", read(s[0], (b, i, j)), read(v[0], (b, _band_index(i, j, w, d), n)))
    root = scope(iters("bin", (sv[0], sv[1], sv[2])), iters("j", (ss[2],)), body)
    return finish(op, (s, v), root)

