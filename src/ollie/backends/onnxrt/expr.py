"""eOperator expressions and strided views as ONNX nodes, for ONNX Runtime regions.

:mod:`ollie.backends.onnxrt.region` runs consecutive program kernels as one ONNX Runtime session.
This module lets a generated eOperator, and a library kernel that reads its operands through
strided views (a ``Matmul`` over a re-laid-out tensor), be one step of such a session instead
of ending it.

A scope ``L<x...> Sum<y...> body`` becomes ONNX element-wise operators over a *grid* with one
axis per iterator (traversal axes first, then summation axes), each value broadcast over the
axes it does not depend on; a ``ReduceSum`` over the summation axes; an ``Expand`` to the
scope's shape when some traversal iterator is read by nothing. A read ``T[i...]`` becomes,
fastest first:

* ``Slice`` + ``Pad`` + ``Transpose`` + ``Reshape``, each only where needed, when each index
  is ``c*x + d`` (``c > 0``) with a different iterator per dimension (a whole tensor in order
  is a bare ``Reshape``: element-wise operands, biases). The slice takes the positions that
  exist, the pad adds the zeros read outside ``T`` around them (strided layouts, shifts).
  Indices that divide an iterator, take its remainder or add several iterators in one
  dimension (``x[i0, i2 / 64, i1, i2 % 64]``, ``x[i0, 64*h + d]``) read the same way, with
  ``Reshape`` splitting dimensions and iterators into digits (:mod:`ollie.backends.onnxrt.digits`);
* otherwise ``Gather`` of the flattened tensor at constant positions computed here with
  numpy, followed by ``Where`` with a constant mask when some positions lie outside ``T``
  (they read 0, as in the reference semantics; the gathered position is clipped first so
  NaN/inf never leak).

Structural zeros (:mod:`ollie.semantics.interpreter`): a product with a factor read outside
its tensor is exactly 0 even where the other factor is NaN or infinite, but a ``Pad`` or
``Where`` zero times NaN is NaN in ONNX. A product (or quotient) one of whose factors (its
numerator) may read outside its tensor, the other operand not a finite constant, raises
:class:`~ollie.errors.UnsupportedError`: the kernel then ends the region and runs as generated
code, which annihilates. Sums of reads (an OffsetAdd, a selective add) need nothing: a zero
added is exact.

A transposed convolution's selective add is one ``Col2Im`` (:mod:`ollie.backends.onnxrt.col2im`).
A sum of at most :data:`UNROLL` terms whose reads only become strided with its iterators fixed
(an OffsetAdd) is unrolled into that many shifted reads added up.

A nested scope is emitted first, as a tensor of its own shape read with the ``lo`` of its
traversal iterators as offset. Sizes are bounded (:data:`MAX_ELEMENTS`): a larger grid or
gather raises :class:`~ollie.errors.UnsupportedError`, and the kernel then ends the region.
Correctness is not assumed: a region is checked against its kernels run one by one when it is
built (:func:`ollie.backends.onnxrt.region.build_region`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from ollie.activations import FUNCTIONS
from ollie.backends.onnxrt.col2im import selective_add
from ollie.backends.onnxrt.reads import ScopeReads
from ollie.backends.onnxrt.views import (
    MAX_ELEMENTS,
    Emitter,
    broadcast,
    check_size,
    int_array,
    out_node,
    view_gathers,
    view_read,
)
from ollie.errors import UnsupportedError
from ollie.ir import Access, BinOp, Call, Const, Neg, Scope
from ollie.ir.index import var
from ollie.ir.nodes import Node, accesses
from ollie.ir.structural import may_be_structural

UNROLL = 16
"""A sum of at most this many terms whose reads need a ``Gather`` over the grid but are
strided with its iterators fixed is emitted as that many shifted reads added up."""

_UNARY = {n: f.onnx for n, f in FUNCTIONS.items()}
"""Unary functions (:data:`ollie.activations.FUNCTIONS`) and their ONNX operators."""
_ZERO_AT_ZERO = tuple(n for n, f in FUNCTIONS.items() if f.zero_at_zero)
"""Unary functions with ``f(0) = 0``: ``f`` of a read outside its tensor is 0."""
_BINARY = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "max": "Max", "min": "Min"}


# ------------------------------------------------------------------------------ scopes


class _Scope(ScopeReads):
    """Emits one scope over its grid."""

    def __init__(self, b: Emitter, scope: Scope, sources: Mapping[str, str],
                 nested: dict[Scope, str]) -> None:
        self.b, self.scope, self.sources, self.nested = b, scope, sources, nested
        self.iters = scope.iters
        self.axis = {it.name: i for i, it in enumerate(self.iters)}
        self.grid = tuple(it.size for it in self.iters)
        if min(self.grid, default=1) < 1:
            raise UnsupportedError("an empty iterator range")
        self.fixed = {it.name: it.lo for it in self.iters if it.size == 1}

    def ones(self) -> tuple[int, ...]:
        return (1,) * len(self.grid)

    def emit(self) -> str:
        nt = len(self.scope.traversal)
        folded = selective_add(self.b, self.scope, self._shape_of, self._whole)
        if folded is not None:
            return folded
        pooled = self._global_average() or self._average_pool()
        if pooled is not None:
            return pooled
        combos = self._unrolled()
        if combos is not None:
            value = self._unroll(combos)
        else:
            value = self._joined() or self._const(self.value(self.scope.body))
            shape = self.b.shapes[value]
            check_size(math.prod(shape), "an eOperator grid", math.prod(self.scope.shape))
            reduce = [a for a in range(nt, len(self.grid)) if shape[a] > 1]
            scale = math.prod(self.grid[a] for a in range(nt, len(self.grid))
                              if shape[a] == 1)
            if reduce:
                kept = tuple(1 if a in reduce else n for a, n in enumerate(shape))
                value = out_node(self.b, "ReduceSum",
                                [value, self.b.const("axes", int_array(reduce))], kept, "sum",
                                keepdims=1)
            if scale != 1:
                value = self._binary("Mul", value, self._scalar(float(scale)))
        value = self.b.reshape(value, self.b.shapes[value][:nt])
        if self.b.shapes[value] != self.scope.shape:
            value = out_node(self.b, "Expand", [value, self.b.const("shape", int_array(
                self.scope.shape))], self.scope.shape, "expand")
        return value

    def _terms(self) -> list[tuple[str | None, Access]] | None:
        """The terms ``(f, T[...])`` of a body ``A[...] + f(B[...]) + ...`` of at least two
        reads, each under at most one unary ``f`` with ``f(0) = 0`` (a term is then zero
        outside its tensor), else None."""
        terms, stack = [], [self.scope.body]
        while stack:
            node = stack.pop()
            if isinstance(node, BinOp) and node.op == "+":
                stack += [node.rhs, node.lhs]
            elif isinstance(node, Access):
                terms.append((None, node))
            elif isinstance(node, Call) and node.fn in _ZERO_AT_ZERO and \
                    len(node.args) == 1 and isinstance(node.args[0], Access):
                terms.append((node.fn, node.args[0]))
            else:
                return None
        return terms if len(terms) >= 2 else None

    def _joined(self) -> str | None:
        """A sum of reads whose positions inside their tensors tile the grid along one
        (split) dimension, as one ``Concat`` (:meth:`ScopeReads.joined`); else None."""
        terms = None if self.scope.summation else self._terms()
        if terms is None:
            return None
        parts = []
        for fn, acc in terms:
            plan = self.plan(acc, self.fixed)
            if plan is None:
                return None
            parts.append((acc, plan, None if fn is None else _UNARY[fn]))
        used = parts[0][1].digits
        return self.joined(parts, tuple(n if a in used else 1 for a, n in enumerate(self.grid)))

    def _scaled(self) -> tuple[Node, float] | None:
        """``(x, a)`` when the body is ``x * a`` (either order) with a constant ``a``."""
        body = self.scope.body
        if not (isinstance(body, BinOp) and body.op == "*"):
            return None
        for x, a in ((body.lhs, body.rhs), (body.rhs, body.lhs)):
            if isinstance(a, Const):
                return x, a.value
        return None

    def _global_average(self) -> str | None:
        """``L<a, b> Sum<r, s> f(...) * (1 / (R S))`` (two traversal axes, or four whose last
        two have size 1: a pooled ``[N, C, 1, 1]``, EfficientNet's squeeze-excitation), then
        the two summation axes, as ``f`` over the grid and one ONNX ``GlobalAveragePool``
        (ONNX Runtime keeps its blocked layout through it; a ``Mul`` and a ``ReduceSum``
        leave it); else None."""
        scope, scaled = self.scope, self._scaled()
        nt = len(scope.traversal)
        if nt not in (2, 4) or len(scope.summation) != 2 or self.grid[2:nt] not in ((), (1, 1)) \
                or scaled is None:
            return None
        inner, scale = scaled
        pooled = self.grid[nt:]
        if abs(scale * math.prod(pooled) - 1.0) > 1e-6:
            return None
        value = self.value(inner)
        if isinstance(value, float) or self.b.shapes[value] != self.grid:
            return None  # constant along some axis: the general form handles it
        value = self.b.reshape(value, (*self.grid[:2], *pooled))
        y = out_node(self.b, "GlobalAveragePool", [value], (*self.grid[:2], 1, 1), "gap")
        return self.b.reshape(y, scope.shape)

    def _average_pool(self) -> str | None:
        """``L<n, c, h, w> Sum<r, s> X[n, c, k*h + r, k*w + s] * (1 / k^2)`` over a whole
        input ``X`` of ``k*H x k*W`` (a ``k x k`` average pool, stride ``k``) as one ONNX
        ``AveragePool``, which ONNX Runtime keeps in its blocked layout (DenseNet's
        transitions); else None."""
        scope, scaled = self.scope, self._scaled()
        if len(self.grid) != 6 or len(scope.summation) != 2 or \
                any(it.lo != 0 for it in self.iters) or scaled is None:
            return None
        acc, scale = scaled
        n, c, h, w, r, s = (it.name for it in self.iters)
        k = self.iters[4].size
        if not isinstance(acc, Access) or isinstance(acc.source, Scope) or \
                self.iters[5].size != k or abs(scale * k * k - 1.0) > 1e-6:
            return None
        want = [var(n), var(c), k * var(h) + var(r), k * var(w) + var(s)]
        src = self.sources[acc.source]
        if list(acc.indices) != want or self.b.shapes[src] != (
                self.grid[0], self.grid[1], k * self.grid[2], k * self.grid[3]):
            return None
        return out_node(self.b, "AveragePool", [src], scope.shape, "avgpool",
                        kernel_shape=[k, k], strides=[k, k])

    def _shape_of(self, source: str | Scope) -> tuple[tuple[int, ...], list[int]]:
        """A read source's dimensions and the first position of each."""
        if isinstance(source, Scope):
            return source.shape, [it.lo for it in source.traversal]
        dims = self.b.shapes[self.sources[source]]
        return dims, [0] * len(dims)

    def _whole(self, source: str | Scope) -> str:
        """The ONNX value of an input tensor, or of a nested scope (emitted once)."""
        if not isinstance(source, Scope):
            return self.sources[source]
        if source not in self.nested:
            self.nested[source] = _Scope(self.b, source, self.sources, self.nested).emit()
        return self.nested[source]

    def _const(self, value: str | float) -> str:
        return self._scalar(value) if isinstance(value, float) else value

    def _unrolled(self) -> list[dict[str, int]] | None:
        """The summation iterators' values, when the sum is unrolled: it has at most
        :data:`UNROLL` terms, some read of the body needs a ``Gather`` over the whole grid and
        none does with the summation iterators fixed (an OffsetAdd: ``Sum<r> T[r, h + r]``
        becomes shifted slices); else None."""
        summed = [it for it in self.scope.summation if it.size > 1]
        if not summed or math.prod(it.size for it in summed) > UNROLL:
            return None
        reads = list(accesses(self.scope.body))
        if all(self.plan(acc, self.fixed) is not None for acc in reads):
            return None
        combos = [dict(zip((it.name for it in summed), values, strict=True))
                  for values in itertools.product(*(range(it.lo, it.hi) for it in summed))]
        if any(self.plan(acc, {**self.fixed, **c}) is None
               for acc in reads for c in combos):
            return None
        return combos

    def _unroll(self, combos: list[dict[str, int]]) -> str:
        base, total = self.fixed, None
        try:
            for combo in combos:
                self.fixed = {**base, **combo}
                term = self._const(self.value(self.scope.body))
                total = term if total is None else self._binary("Add", total, term)
        finally:
            self.fixed = base
        assert total is not None
        return total

    def _scalar(self, v: float) -> str:
        name = self.b.const("c", np.full(self.ones(), v, dtype=np.float32))
        self.b.shapes[name] = self.ones()
        return name

    def _binary(self, op: str, x: str, y: str) -> str:
        shape = broadcast(self.b.shapes[x], self.b.shapes[y])
        return out_node(self.b, op, [x, y], shape, op.lower())

    def value(self, node: Node) -> str | float:
        """The ONNX value of ``node`` over the grid (a float for a constant)."""
        if isinstance(node, Const):
            return float(node.value)
        if isinstance(node, Access):
            return self.read(node)
        if isinstance(node, Neg):
            x = self.value(node.x)
            if isinstance(x, float):
                return -x
            return out_node(self.b, "Neg", [x], self.b.shapes[x], "neg")
        if isinstance(node, BinOp):
            fused = self._hard_swish(node) if node.op == "*" else \
                self._batch_norm(node) if node.op == "+" else None
            if fused is not None:
                return fused
            if node.op in "*/":
                self._refuse_annihilation(node)
            return self._apply(_BINARY[node.op], (node.lhs, node.rhs))
        assert isinstance(node, Call), node
        clip = self._clip(node) if node.fn in ("max", "min") else None
        if clip is not None:
            return clip
        if node.fn in _UNARY:
            x = self._const(self.value(node.args[0]))
            return out_node(self.b, _UNARY[node.fn], [x], self.b.shapes[x], node.fn)
        return self._apply(_BINARY[node.fn], node.args)

    def _refuse_annihilation(self, node: BinOp) -> None:
        """Raise UnsupportedError for a product with a factor, or a quotient with a numerator,
        that may be a structural zero (a read outside its tensor: a ``Pad`` or ``Where`` zero
        here), unless the other operand is a finite constant (non-zero for a divisor): ONNX
        would compute ``0 * NaN`` (NaN) where the expression's product is exactly 0."""
        pairs = [(node.lhs, node.rhs), (node.rhs, node.lhs)] if node.op == "*" else \
            [(node.lhs, node.rhs)]

        def extents(acc: Access) -> list[tuple[int, int]]:
            dims, firsts = self._shape_of(acc.source)
            return [(f, f + d) for f, d in zip(firsts, dims, strict=True)]

        for factor, other in pairs:
            c = self._scalar_of(other)
            if c is not None and math.isfinite(c) and (node.op == "*" or c != 0.0):
                continue
            if may_be_structural(factor, self.scope.ranges, extents):
                text = " ".join(str(self.scope).split())
                raise UnsupportedError(
                    f"a {'product' if node.op == '*' else 'quotient'} of "
                    f"{{ {text if len(text) < 120 else text[:117] + '...'} }} may read outside "
                    "its tensor in a factor: the zero read would not annihilate NaN or "
                    "infinities in ONNX (generated code does)")

    def _scalar_of(self, node: Node) -> float | None:
        """The value of ``node`` when it is a literal or a read of a one-element constant."""
        if isinstance(node, Const):
            return float(node.value)
        if isinstance(node, Access) and isinstance(node.source, str) and \
                all(q.is_const and q.const == 0 for q in node.indices):
            value = getattr(self.b, "inits", {}).get(self.sources.get(node.source, ""))
            if value is not None and value.size == 1:
                return float(np.asarray(value).reshape(()))
        return None

    def _bounds(self, node: Node) -> tuple[Node, float | None, float | None] | None:
        """``(x, lo, hi)`` when ``node`` is ``min(max(x, lo), hi)``, either nesting, or one of
        the two (a missing bound None), with constant scalar bounds ``lo <= hi``; else
        None."""
        bounds: dict[str, float] = {}
        x: Node = node
        while isinstance(x, Call) and x.fn in ("max", "min") and len(x.args) == 2 and \
                x.fn not in bounds:
            # (either nesting: max(min(x, hi), lo) = min(max(x, lo), hi) when lo <= hi)
            a, b = (self._scalar_of(arg) for arg in x.args)
            if (a is None) == (b is None):
                break
            bounds[x.fn] = a if a is not None else b  # type: ignore[assignment]
            x = x.args[1] if a is not None else x.args[0]
        if not bounds or ("max" in bounds and "min" in bounds and bounds["max"] > bounds["min"]):
            return None
        return x, bounds.get("max"), bounds.get("min")

    def _clip(self, node: Call) -> str | None:
        """A clamp with constant scalar bounds (:meth:`_bounds`) as one ONNX ``Clip``, which
        ONNX Runtime fuses into a preceding convolution (as a ``Max`` and a ``Min`` with
        broadcast operands, it leaves the blocked layout around each), or ``clip(a x + b, 0,
        1)`` as one ``HardSigmoid``; else None."""
        parts = self._bounds(node)
        if parts is None:
            return None
        x, lo, hi = parts
        affine = self._affine(x) if (lo, hi) == (0.0, 1.0) else None
        if affine is not None:
            value = self._const(self.value(affine[0]))
            return out_node(self.b, "HardSigmoid", [value], self.b.shapes[value], "hardsigmoid",
                           alpha=affine[1], beta=affine[2])
        value = self._const(self.value(x))
        ins = [value] + [self.b.const(which, np.asarray(v, dtype=np.float32))
                         if v is not None else "" for v, which in ((lo, "lo"), (hi, "hi"))]
        while not ins[-1]:
            ins.pop()
        return out_node(self.b, "Clip", ins, self.b.shapes[value], "clip")

    def _hard_swish(self, node: BinOp) -> str | None:
        """``x * clip(x / 6 + 1 / 2, 0, 1)`` as one ONNX ``HardSwish``; else None."""
        for x, gate in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
            parts = self._bounds(gate)
            if parts is None or parts[1:] != (0.0, 1.0):
                continue
            affine = self._affine(parts[0])
            if affine is not None and affine[0] == x and abs(affine[1] - 1 / 6) < 1e-7 and \
                    abs(affine[2] - 0.5) < 1e-7:
                value = self._const(self.value(x))
                return out_node(self.b, "HardSwish", [value], self.b.shapes[value], "hardswish")
        return None

    def _batch_norm(self, node: BinOp) -> str | None:
        """``x * s[c] + b[c]`` over an element-wise 4-D grid whose axis 1 is ``c`` (``s``, ``b``
        1-D tensors read whole at ``c``) as one ``BatchNormalization`` with mean 0, variance 1
        and epsilon 0 (exactly ``x * s + b``): ONNX Runtime's layout transformer keeps it in
        its blocked layout, a ReLU after it fused (``Mul`` and ``Add`` leave that layout:
        DenseNet's batch norms after each concatenation); else None."""
        if len(self.grid) != 4 or self.scope.summation:
            return None
        it = self.iters[1]
        for prod, shift in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
            if not (isinstance(prod, BinOp) and prod.op == "*") or not self._channel(shift):
                continue
            for x, scale in ((prod.lhs, prod.rhs), (prod.rhs, prod.lhs)):
                if not self._channel(scale) or self._channel(x):
                    continue
                self._refuse_annihilation(prod)
                xv = self._const(self.value(x))
                s, b = (self.b.reshape(self.read(a), (it.size,))
                        for a in (scale, shift) if isinstance(a, Access))
                if self.b.shapes[xv] != self.grid:  # broadcast along some axis
                    return self._binary("Add", self._binary("Mul", xv, self.b.reshape(
                        s, (1, it.size, 1, 1))), self.b.reshape(b, (1, it.size, 1, 1)))
                zeros = self.b.const("mean", np.zeros(it.size, dtype=np.float32))
                ones = self.b.const("var", np.ones(it.size, dtype=np.float32))
                return out_node(self.b, "BatchNormalization", [xv, s, b, zeros, ones],
                                self.grid, "bn", epsilon=0.0)
        return None

    def _channel(self, node: Node) -> bool:
        """Whether ``node`` reads a 1-D input whole at grid axis 1's iterator."""
        it = self.iters[1]
        return isinstance(node, Access) and not isinstance(node.source, Scope) and \
            len(node.indices) == 1 and node.indices[0].as_var() == it.name and it.lo == 0 and \
            self.b.shapes[self.sources[node.source]] == (it.size,)

    def _affine(self, node: Node) -> tuple[Node, float, float] | None:
        """``(x, a, b)`` when ``node`` is ``x * a + b`` (either operand order) with constant
        scalars ``a`` and ``b``, else None."""
        if not (isinstance(node, BinOp) and node.op == "+"):
            return None
        for prod, shift in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
            b = self._scalar_of(shift)
            if b is None or not (isinstance(prod, BinOp) and prod.op == "*"):
                continue
            for x, scale in ((prod.lhs, prod.rhs), (prod.rhs, prod.lhs)):
                a = self._scalar_of(scale)
                if a is not None and self._scalar_of(x) is None:
                    return x, a, b
        return None

    def _apply(self, op: str, args: Sequence[Node]) -> str:
        names = [self._const(self.value(a)) for a in args]
        return self._binary(op, names[0], names[1])


def emit_scope(b: Emitter, scope: Scope, sources: Mapping[str, str]) -> str:
    """The ONNX value (shape ``scope.shape``) of ``scope``; ``sources`` maps each input tensor
    it reads to an ONNX value of the tensor's declared shape."""
    return _Scope(b, scope, sources, {}).emit()


__all__ = ["MAX_ELEMENTS", "UNROLL", "Emitter", "emit_scope", "view_gathers", "view_read"]
