"""eOperator expressions and strided views as ONNX nodes, for ONNX Runtime regions.

:mod:`ollie.runtime.ort_region` runs consecutive program kernels as one ONNX Runtime session.
This module lets a generated eOperator, and a library kernel that reads its operands through
strided views (a ``Matmul`` over a re-laid-out tensor), be one step of such a session instead
of ending it.

A scope ``L<x...> Sum<y...> body`` becomes ONNX element-wise operators over a *grid* with one
axis per iterator (traversal axes first, then summation axes), each value broadcast over the
axes it does not depend on; a ``ReduceSum`` over the summation axes; an ``Expand`` to the
scope's shape when some traversal iterator is read by nothing. A read ``T[i...]`` becomes,
fastest first:

* ``Reshape`` when it reads ``T`` whole in its flat order (element-wise operands, biases);
* ``Slice`` (+ ``Transpose`` + ``Reshape``) when each index is ``c*x + d`` (``c > 0``) with a
  different iterator per dimension and every position it reads exists (strided layouts);
* ``Gather`` of the flattened tensor at constant positions computed here with numpy, followed
  by ``Where`` with a constant mask when some positions lie outside ``T`` (they read 0, as in
  the reference semantics; the gathered position is clipped first so NaN/inf never leak).

A nested scope is emitted first, as a tensor of its own shape read with the ``lo`` of its
traversal iterators as offset. Sizes are bounded (:data:`MAX_ELEMENTS`): a larger grid or
gather raises :class:`~ollie.errors.UnsupportedError`, and the kernel then ends the region.
Correctness is not assumed: a region is checked against its kernels run one by one when it is
built (:func:`ollie.runtime.ort_region.build_region`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from ollie.errors import UnsupportedError
from ollie.ir import Access, BinOp, Call, Const, Neg, Scope
from ollie.ir.index import Affine, Var
from ollie.ir.nodes import Node
from ollie.program.kernel import View

MAX_ELEMENTS = 1 << 23
"""Largest grid (product of a scope's iterator sizes over the axes a value spans) and largest
constant gather index this module emits; beyond it the kernel stays outside the region."""

_UNARY = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "abs": "Abs"}
_BINARY = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "max": "Max", "min": "Min"}


class Emitter(Protocol):
    """What this module needs from a graph builder (:class:`ollie.runtime.ort_region._Builder`):
    ``shapes`` maps each ONNX value to its static shape."""

    shapes: dict[str, tuple[int, ...]]

    def node(self, op: str, inputs: Sequence[str], base: str, **attrs: object) -> str: ...

    def const(self, name: str, value: np.ndarray | None = None) -> str: ...

    def reshape(self, name: str, shape: Sequence[int]) -> str: ...


def _check_size(n: int, what: str) -> None:
    if n > MAX_ELEMENTS:
        raise UnsupportedError(f"{what} of {n} elements exceeds {MAX_ELEMENTS} for an ONNX "
                               "region")


def _ints(values: Sequence[int]) -> np.ndarray:
    return np.asarray(list(values), dtype=np.int64)


def _out(b: Emitter, op: str, inputs: Sequence[str], shape: tuple[int, ...],
         base: str, **attrs: object) -> str:
    y = b.node(op, inputs, base, **attrs)
    b.shapes[y] = shape
    return y


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(dims) for dims in zip(*shapes, strict=True))


# ------------------------------------------------------------------------------ views


def view_read(b: Emitter, name: str, view: View | None) -> str:
    """The ONNX value of shape ``view.sizes`` that ``view`` reads from the flat storage of
    ``name`` (``name`` itself when ``view`` is None)."""
    if view is None:
        return name
    numel = math.prod(b.shapes[name])
    sizes, strides = tuple(view.sizes), tuple(view.strides)
    kept = [(n, s) for n, s in zip(sizes, strides, strict=True) if n != 1 and s != 0]
    expect, contiguous = 1, True
    for n, s in reversed(kept):
        contiguous &= s == expect
        expect *= n
    if view.offset == 0 and contiguous and expect == numel:
        # row-major over the dimensions it steps through, broadcast over stride-0 ones
        narrow = tuple(1 if s == 0 else n for n, s in zip(sizes, strides, strict=True))
        y = b.reshape(name, narrow)
        if narrow != sizes:
            y = _out(b, "Expand", [y, b.const("sizes", _ints(sizes))], sizes, "expand")
        return y
    _check_size(math.prod(sizes), "a strided view")
    pos = np.full((1,) * len(sizes), view.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(sizes, strides, strict=True)):
        shape = [1] * len(sizes)
        shape[d] = n
        pos = pos + np.arange(n, dtype=np.int64).reshape(shape) * s
    pos = np.broadcast_to(pos, sizes)
    if int(pos.min(initial=0)) < 0 or int(pos.max(initial=0)) >= numel:
        raise UnsupportedError("a view reads outside its tensor")
    flat = b.reshape(name, (numel,))
    return _out(b, "Gather", [flat, b.const("positions", np.ascontiguousarray(pos))], sizes,
                "view", axis=0)


# ------------------------------------------------------------------------------ scopes


class _Scope:
    """Emits one scope over its grid."""

    def __init__(self, b: Emitter, scope: Scope, sources: Mapping[str, str]) -> None:
        self.b, self.scope, self.sources = b, scope, sources
        self.iters = scope.iters
        self.axis = {it.name: i for i, it in enumerate(self.iters)}
        self.grid = tuple(it.size for it in self.iters)
        if min(self.grid, default=1) < 1:
            raise UnsupportedError("an empty iterator range")

    def ones(self) -> tuple[int, ...]:
        return (1,) * len(self.grid)

    def emit(self) -> str:
        value = self.value(self.scope.body)
        shape = self.b.shapes[value] if not isinstance(value, float) else self.ones()
        if isinstance(value, float):
            value = self.b.const("c", np.full(shape, value, dtype=np.float32))
            self.b.shapes[value] = shape
        _check_size(math.prod(shape), "an eOperator grid")
        nt = len(self.scope.traversal)
        reduce = [a for a in range(nt, len(self.grid)) if shape[a] > 1]
        scale = math.prod(self.grid[a] for a in range(nt, len(self.grid)) if shape[a] == 1)
        if reduce:
            kept = tuple(1 if a in reduce else n for a, n in enumerate(shape))
            value = _out(self.b, "ReduceSum", [value, self.b.const("axes", _ints(reduce))],
                         kept, "sum", keepdims=1)
        if scale != 1:
            value = self._binary("Mul", value, self._scalar(float(scale)))
        value = self.b.reshape(value, self.b.shapes[value][:nt])
        if self.b.shapes[value] != self.scope.shape:
            value = _out(self.b, "Expand", [value, self.b.const("shape", _ints(
                self.scope.shape))], self.scope.shape, "expand")
        return value

    def _scalar(self, v: float) -> str:
        name = self.b.const("c", np.full(self.ones(), v, dtype=np.float32))
        self.b.shapes[name] = self.ones()
        return name

    def _binary(self, op: str, x: str, y: str) -> str:
        shape = _broadcast(self.b.shapes[x], self.b.shapes[y])
        return _out(self.b, op, [x, y], shape, op.lower())

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
            return _out(self.b, "Neg", [x], self.b.shapes[x], "neg")
        if isinstance(node, BinOp):
            return self._apply(_BINARY[node.op], (node.lhs, node.rhs))
        assert isinstance(node, Call), node
        if node.fn in _UNARY:
            x = self.value(node.args[0])
            x = self._scalar(x) if isinstance(x, float) else x
            return _out(self.b, _UNARY[node.fn], [x], self.b.shapes[x], node.fn)
        return self._apply(_BINARY[node.fn], node.args)

    def _apply(self, op: str, args: Sequence[Node]) -> str:
        xs = [self.value(a) for a in args]
        names = [self._scalar(x) if isinstance(x, float) else x for x in xs]
        return self._binary(op, names[0], names[1])

    # -------------------------------------------------------------------------- reads

    def read(self, acc: Access) -> str:
        """``acc`` over the grid, broadcast over the axes its indices do not use."""
        if isinstance(acc.source, Scope):
            src = emit_scope(self.b, acc.source, self.sources)
            offsets = [it.lo for it in acc.source.traversal]
        else:
            src = self.sources[acc.source]
            offsets = [0] * len(self.b.shapes[src])
        dims = self.b.shapes[src]
        if len(dims) != len(acc.indices):
            raise UnsupportedError(f"a read of {len(acc.indices)} indices from a tensor of "
                                   f"rank {len(dims)}")
        fixed = {it.name: it.lo for it in self.iters if it.size == 1}
        used = sorted({self.axis[v] for q in acc.indices for v in q.vars() if v not in fixed})
        sub = tuple(self.grid[a] if a in used else 1 for a in range(len(self.grid)))
        _check_size(math.prod(sub), "a read")
        env: dict[str, object] = dict(fixed)
        for a in used:
            it = self.iters[a]
            shape = [1] * len(self.grid)
            shape[a] = it.size
            env[it.name] = np.arange(it.lo, it.hi, dtype=np.int64).reshape(shape)
        pos = [np.broadcast_to(np.asarray(q.evaluate(env), dtype=np.int64) - off, sub)
               for q, off in zip(acc.indices, offsets, strict=True)]
        valid = np.ones(sub, dtype=bool)
        for p, n in zip(pos, dims, strict=True):
            valid &= (p >= 0) & (p < n)
        if valid.all():
            strided = self._strided(src, acc.indices, offsets, fixed, sub)
            if strided is not None:
                return strided
        flat = np.zeros(sub, dtype=np.int64)
        for p, n in zip(pos, dims, strict=True):
            flat = flat * n + np.clip(p, 0, n - 1)
        numel = math.prod(dims)
        if valid.all() and flat.size == numel and \
                np.array_equal(flat.reshape(-1), np.arange(numel, dtype=np.int64)):
            return self.b.reshape(src, sub)
        flat_src = self.b.reshape(src, (numel,))
        y = _out(self.b, "Gather", [flat_src, self.b.const("positions", flat)], sub,
                 "read", axis=0)
        if not valid.all():
            y = _out(self.b, "Where", [self.b.const("inside", valid), y, self._scalar(0.0)],
                     sub, "pad")
        return y

    def _strided(self, src: str, indices: Sequence[Affine], offsets: Sequence[int],
                 fixed: Mapping[str, int], sub: tuple[int, ...]) -> str | None:
        """``Slice`` + ``Transpose`` + ``Reshape`` for indices ``c*x + d`` (``c > 0``, one
        iterator per dimension, positions known to exist), else None."""
        starts, ends, steps, axes_of = [], [], [], []
        seen: set[str] = set()
        for q, off in zip(indices, offsets, strict=True):
            q = q.subst(fixed) if fixed else q
            if not q.is_linear or len(q.terms) > 1:
                return None
            start = q.const - off
            if not q.terms:
                starts.append(start)
                ends.append(start + 1)
                steps.append(1)
                axes_of.append(None)
                continue
            atom, c = q.terms[0]
            assert isinstance(atom, Var)
            if c <= 0 or atom.name in seen:
                return None
            seen.add(atom.name)
            it = self.iters[self.axis[atom.name]]
            first = start + c * it.lo
            starts.append(first)
            ends.append(first + c * (it.size - 1) + 1)
            steps.append(c)
            axes_of.append(self.axis[atom.name])
        dims = self.b.shapes[src]
        y = src
        if any(s != 0 or e != n or st != 1
               for s, e, st, n in zip(starts, ends, steps, dims, strict=True)):
            shape = tuple(len(range(s, e, st)) for s, e, st in zip(starts, ends, steps,
                                                                   strict=True))
            y = _out(self.b, "Slice", [src, self.b.const("starts", _ints(starts)),
                                       self.b.const("ends", _ints(ends)),
                                       self.b.const("axes", _ints(range(len(dims)))),
                                       self.b.const("steps", _ints(steps))], shape, "slice")
        moving = [d for d, a in enumerate(axes_of) if a is not None]
        order = sorted(moving, key=lambda d: axes_of[d])  # type: ignore[arg-type, return-value]
        if order != moving:
            rest = [d for d in range(len(dims)) if axes_of[d] is None]
            perm = order + rest
            shape = tuple(self.b.shapes[y][d] for d in perm)
            y = _out(self.b, "Transpose", [y], shape, "transpose", perm=perm)
        return self.b.reshape(y, sub)


def emit_scope(b: Emitter, scope: Scope, sources: Mapping[str, str]) -> str:
    """The ONNX value (shape ``scope.shape``) of ``scope``; ``sources`` maps each input tensor
    it reads to an ONNX value of the tensor's declared shape."""
    return _Scope(b, scope, sources).emit()


__all__ = ["MAX_ELEMENTS", "Emitter", "emit_scope", "view_read"]
