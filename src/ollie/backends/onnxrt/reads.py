"""Reads of a tensor over a scope's grid as ONNX nodes (:class:`ScopeReads`, the read half of
the scope emitter of :mod:`ollie.backends.onnxrt.expr`): a strided read as ``Slice`` + ``Pad``
+ ``Transpose`` + ``Reshape`` where each index is ``c*x + d`` with its own iterator
(:meth:`ScopeReads.pattern`), else a ``Gather`` at constant positions and a ``Where`` for the
positions outside the tensor (they read 0)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ollie.backends.onnxrt.views import Emitter, check_size, int_array, out_node
from ollie.errors import UnsupportedError
from ollie.ir import Access, Iter, Scope
from ollie.ir.index import Affine, Var


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
        if isinstance(acc.source, Scope):
            src = self.nested.get(acc.source)
            if src is None:
                src = self.nested[acc.source] = type(self)(self.b, acc.source, self.sources,
                                                           self.nested).emit()
            offsets = [it.lo for it in acc.source.traversal]
        else:
            src = self.sources[acc.source]
            offsets = [0] * len(self.b.shapes[src])
        dims = self.b.shapes[src]
        if len(dims) != len(acc.indices):
            raise UnsupportedError(f"a read of {len(acc.indices)} indices from a tensor of "
                                   f"rank {len(dims)}")
        fixed = self.fixed
        used = sorted({self.axis[v] for q in acc.indices for v in q.vars() if v not in fixed})
        sub = tuple(self.grid[a] if a in used else 1 for a in range(len(self.grid)))
        check_size(math.prod(sub), "a read")
        pattern = self.pattern(acc.indices, fixed)
        if pattern is not None:
            return self.strided(src, pattern, offsets, sub)
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

    def pattern(self, indices: Sequence[Affine], fixed: Mapping[str, int]
                 ) -> list[tuple[int, int, int | None]] | None:
        """Per dimension ``(c, d, axis)`` when each index is ``c*x + d`` (``c > 0``, a
        different iterator ``x`` on grid axis ``axis`` per dimension) or a constant ``d``
        (``c = 0``, no axis), with the iterators of ``fixed`` replaced by their values; else
        None."""
        out: list[tuple[int, int, int | None]] = []
        seen: set[str] = set()
        for q in indices:
            q = q.subst(fixed) if fixed and q.vars() & fixed.keys() else q
            if not q.is_linear or len(q.terms) > 1:
                return None
            if not q.terms:
                out.append((0, q.const, None))
                continue
            atom, c = q.terms[0]
            assert isinstance(atom, Var)
            if c <= 0 or atom.name in seen:
                return None
            seen.add(atom.name)
            out.append((c, q.const, self.axis[atom.name]))
        return out

    def strided(self, src: str, pattern: Sequence[tuple[int, int, int | None]],
                 offsets: Sequence[int], sub: tuple[int, ...]) -> str:
        """``Slice`` + ``Pad`` (zeros, when the read reaches outside the tensor) +
        ``Transpose`` + ``Reshape``: the reads of a :meth:`pattern`, or the tensor itself
        (reshaped) when the read is the whole tensor in order."""
        dims = self.b.shapes[src]
        starts, steps, lengths = [], [], []
        for (c, d, axis), off in zip(pattern, offsets, strict=True):
            if axis is None:
                starts.append(d - off)
                steps.append(1)
                lengths.append(1)
            else:
                it = self.iters[axis]
                starts.append(d + c * it.lo - off)
                steps.append(c)
                lengths.append(it.size)
        # the positions inside the tensor: a slice, then zeros around it (a pad of the read,
        # not of the tensor: an OffsetAdd term reading a small tensor over a large grid)
        first = [-(s // st) if s < 0 else 0 for s, st in zip(starts, steps, strict=True)]
        last = [min(n, (dim - 1 - s) // st + 1) if dim - 1 - s >= 0 else 0
                for s, st, n, dim in zip(starts, steps, lengths, dims, strict=True)]
        if any(b <= a for a, b in zip(first, last, strict=True)):
            return self._scalar(0.0)  # nothing inside: zeros
        y = src
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
        after = [n - b for n, b in zip(lengths, last, strict=True)]
        if any(first) or any(after):
            y = out_node(self.b, "Pad", [y, self.b.const("pads", int_array(first + after))],
                        tuple(lengths), "pad", mode="constant")
        moving = [d for d, (_, _, axis) in enumerate(pattern) if axis is not None]
        order = sorted(moving, key=lambda d: pattern[d][2])  # type: ignore[arg-type,return-value]
        if order != moving:
            perm = order + [d for d in range(len(dims)) if pattern[d][2] is None]
            y = out_node(self.b, "Transpose", [y], tuple(self.b.shapes[y][d] for d in perm),
                        "transpose", perm=perm)
        return self.b.reshape(y, sub)


__all__ = ["ScopeReads"]
