"""Reads of a tensor over a scope's grid as ONNX nodes (:class:`ScopeReads`, the read half of
the scope emitter of :mod:`ollie.backends.onnxrt.expr`): a strided read as ``Slice`` + ``Pad``
+ ``Transpose`` + ``Reshape`` where each index is ``c*x + d`` with its own iterator, or becomes
so once dimensions and iterators are split into digits (:meth:`ScopeReads.plan`), else a
``Gather`` at constant positions and a ``Where`` for the positions outside the tensor (they
read 0)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ollie.backends.onnxrt.digits import ReadPlan, plan_read
from ollie.backends.onnxrt.views import Emitter, check_size, int_array, out_node
from ollie.errors import UnsupportedError
from ollie.ir import Access, Iter, Scope


class ScopeReads:
    """Reads over the grid of one scope; the emitter of the scope (a subclass) provides the
    grid and :meth:`_scalar`."""

    b: Emitter
    scope: Scope
    sources: Mapping[str, str]
    nested: dict[Scope, str]
    iters: tuple[Iter, ...]
    axis: dict[str, int]
    grid: tuple[int, ...]
    fixed: dict[str, int]

    def __init__(self, b: Emitter, scope: Scope, sources: Mapping[str, str],
                 nested: dict[Scope, str]) -> None:
        raise NotImplementedError  # the emitter's own constructor builds the grid

    def emit(self) -> str:
        """The ONNX value of the whole scope (the emitter's)."""
        raise NotImplementedError

    def _scalar(self, v: float) -> str:
        raise NotImplementedError

    def read(self, acc: Access) -> str:
        """``acc`` over the grid, broadcast over the axes its indices do not use."""
        src = self.source_value(acc)
        dims, offsets = self.source(acc)
        if len(dims) != len(acc.indices):
            raise UnsupportedError(f"a read of {len(acc.indices)} indices from a tensor of "
                                   f"rank {len(dims)}")
        fixed = self.fixed
        used = sorted({self.axis[v] for q in acc.indices for v in q.vars() if v not in fixed})
        sub = tuple(self.grid[a] if a in used else 1 for a in range(len(self.grid)))
        plan = self.plan(acc, fixed)
        if plan is not None:  # no larger than the grid, which the scope bounds
            return self.strided(src, plan, sub)
        check_size(math.prod(sub), "a gathered read")
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
        flat = np.zeros(sub, dtype=np.int64)
        for p, n in zip(pos, dims, strict=True):
            flat = flat * n + np.clip(p, 0, n - 1)
        numel = math.prod(dims)
        flat_src = self.b.reshape(src, (numel,))
        y = out_node(self.b, "Gather", [flat_src, self.b.const("positions", flat)], sub,
                    "read", axis=0)
        if not valid.all():
            y = out_node(self.b, "Where", [self.b.const("inside", valid), y, self._scalar(0.0)],
                        sub, "pad")
        return y

    def source_value(self, acc: Access) -> str:
        """The ONNX value ``acc`` reads: an input, or a nested scope emitted once."""
        if not isinstance(acc.source, Scope):
            return self.sources[acc.source]
        src = self.nested.get(acc.source)
        if src is None:
            src = self.nested[acc.source] = type(self)(self.b, acc.source, self.sources,
                                                       self.nested).emit()
        return src

    def source(self, acc: Access) -> tuple[tuple[int, ...], list[int]]:
        """The shape of what ``acc`` reads and the position of its first element: a nested
        scope starts at the ``lo`` of its traversal iterators."""
        if isinstance(acc.source, Scope):
            return acc.source.shape, [it.lo for it in acc.source.traversal]
        dims = self.b.shapes[self.sources[acc.source]]
        return dims, [0] * len(dims)

    def plan(self, acc: Access, fixed: Mapping[str, int]) -> ReadPlan | None:
        """The strided plan of ``acc`` (:func:`ollie.backends.onnxrt.digits.plan_read`) with
        the iterators of ``fixed`` replaced by their values, or None (a ``Gather``)."""
        dims, offsets = self.source(acc)
        if len(dims) != len(acc.indices):
            return None
        return plan_read(acc.indices, dims, offsets, self.iters, self.axis, fixed)

    def strided(self, src: str, plan: ReadPlan, sub: tuple[int, ...]) -> str:
        """``Reshape`` (split dimensions) + ``Slice`` + ``Pad`` (zeros, when the read reaches
        outside the tensor) + ``Transpose`` + ``Reshape`` + ``Expand`` (over the digits the
        read does not use): the reads of a :class:`ReadPlan`, or the tensor itself (reshaped)
        when the read is the whole tensor in order."""
        y = self._cut(src, plan)
        return self._scalar(0.0) if y is None else self._arrange(y, plan, sub)

    def joined(self, parts: Sequence[tuple[Access, ReadPlan, str | None]],
               sub: tuple[int, ...]) -> str | None:
        """A sum of reads ``(access, plan, ONNX unary operator or None)`` whose plans differ
        only in the offset of one dimension, along which the positions inside each source
        tile the read end to end (elsewhere each reads zeros: ShuffleNet's channel shuffle of
        two halves), as one ``Concat`` of the parts inside, then one ``Transpose`` +
        ``Reshape``; else None (and nothing emitted)."""
        base = parts[0][1]
        if any(len(p.dims) != len(base.dims) or p.digits != base.digits for _, p, _ in parts):
            return None
        axes = {j for _, p, _ in parts[1:]
                for j, (e, f) in enumerate(zip(p.dims, base.dims, strict=True)) if e != f}
        if len(axes) != 1:
            return None
        (j,) = axes
        g = base.dims[j][2]
        if g is None or any(p.dims[j][0] != 1 or p.dims[j][2] != g for _, p, _ in parts):
            return None
        windows = []
        for acc, plan, fn in parts:
            pos = _positions(plan, plan.shape)
            if pos is not None:
                windows.append((pos[3][j], pos[4][j], acc, plan, fn))
        windows.sort(key=lambda t: t[0])
        edge = 0
        for a, b, *_ in windows:
            if a != edge:
                return None  # a gap or an overlap
            edge = b
        if edge != g.size or len(windows) < 2:
            return None
        pieces = []
        for _, _, acc, plan, fn in windows:
            y = self._cut(self.source_value(acc), plan, whole=j)
            assert y is not None
            pieces.append(y if fn is None else out_node(self.b, fn, [y], self.b.shapes[y],
                                                         "unary"))
        shape = list(self.b.shapes[pieces[0]])
        shape[j] = edge
        y = out_node(self.b, "Concat", pieces, tuple(shape), "join", axis=j)
        return self._arrange(y, base, sub)

    def _cut(self, src: str, plan: ReadPlan, whole: int | None = None) -> str | None:
        """The positions of ``plan`` inside ``src`` (``Reshape``, ``Slice``), zeros around them
        (``Pad``), in the source's dimension order; None when none is inside. ``whole``: a
        dimension not padded (it holds only the positions inside)."""
        dims = plan.shape
        pos = _positions(plan, dims)
        if pos is None:
            return None
        starts, steps, lengths, first, last = pos
        y = self.b.reshape(src, dims) if dims != self.b.shapes[src] else src
        # the positions inside the tensor: a slice, then zeros around it (a pad of the read,
        # not of the tensor: an OffsetAdd term reading a small tensor over a large grid)
        begin = [s + st * a for s, st, a in zip(starts, steps, first, strict=True)]
        inside = [b - a for a, b in zip(first, last, strict=True)]
        if any(b != 0 or st != 1 or n != dim
               for b, st, n, dim in zip(begin, steps, inside, dims, strict=True)):
            ends = [b + st * (n - 1) + 1 for b, st, n in zip(begin, steps, inside,
                                                            strict=True)]
            y = out_node(self.b, "Slice", [y, self.b.const("starts", int_array(begin)),
                                          self.b.const("ends", int_array(ends)),
                                          self.b.const("axes", int_array(range(len(dims)))),
                                          self.b.const("steps", int_array(steps))],
                        tuple(inside), "slice")
        before = [0 if d == whole else a for d, a in enumerate(first)]
        after = [0 if d == whole else n - b
                 for d, (n, b) in enumerate(zip(lengths, last, strict=True))]
        if any(before) or any(after):
            shape = tuple(inside[d] if d == whole else n for d, n in enumerate(lengths))
            y = out_node(self.b, "Pad", [y, self.b.const("pads", int_array(before + after))],
                        shape, "pad", mode="constant")
        return y

    def _arrange(self, y: str, plan: ReadPlan, sub: tuple[int, ...]) -> str:
        """``y`` (the read in the source's dimension order, :meth:`_cut`) in grid order:
        ``Transpose`` + ``Reshape`` + ``Expand`` over the digits the read does not use."""
        lengths = self.b.shapes[y]
        # the dimensions of more than one position, in grid order: a transpose of only
        # those (ONNX Runtime copies whole blocks when the innermost dimensions stay in place;
        # a size-1 dimension moved last would make it copy element by element)
        moving = [d for d, (_, _, g) in enumerate(plan.dims) if g is not None and lengths[d] > 1]
        order = sorted(moving, key=lambda d: plan.dims[d][2].order)  # type: ignore[union-attr]
        if order != moving:
            y = self.b.reshape(y, tuple(lengths[d] for d in moving))
            y = out_node(self.b, "Transpose", [y], tuple(lengths[d] for d in order),
                        "transpose", perm=[moving.index(d) for d in order])
        read = {g for _, _, g in plan.dims if g is not None}
        digits = [g for a in sorted(plan.digits) for g in plan.digits[a]]
        narrow = tuple(g.size if g in read else 1 for g in digits)
        if any(g not in read for g in digits):
            full = tuple(g.size for g in digits)
            y = out_node(self.b, "Expand", [self.b.reshape(y, narrow),
                                           self.b.const("sizes", int_array(full))],
                        full, "expand")
        return self.b.reshape(y, sub)


def _positions(plan: ReadPlan, dims: Sequence[int]
               ) -> tuple[list[int], list[int], list[int], list[int], list[int]] | None:
    """Per dimension of ``plan`` over a source reshaped to ``dims``: the first position read,
    the step, the number of positions, and the window ``[first, last)`` of those inside the
    source; None when some dimension has none inside."""
    starts, steps, lengths = [], [], []
    for c, d, g in plan.dims:
        starts.append(d if g is None else d + c * g.lo)
        steps.append(1 if g is None else c)
        lengths.append(1 if g is None else g.size)
    first = [-(s // st) if s < 0 else 0 for s, st in zip(starts, steps, strict=True)]
    last = [min(n, (dim - 1 - s) // st + 1) if dim - 1 - s >= 0 else 0
            for s, st, n, dim in zip(starts, steps, lengths, dims, strict=True)]
    if any(b <= a for a, b in zip(first, last, strict=True)):
        return None
    return starts, steps, lengths, first, last


__all__ = ["ScopeReads"]
