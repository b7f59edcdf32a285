"""Reads with zero padding: ``T[idx...]`` over a box of a grid, in broadcast form.

A read source is either a :class:`DenseSource` (an input tensor, or a fully evaluated nested
scope with the ``lo`` of each traversal iterator as offset) or a :class:`SparseSource` (the
elements of a nested scope that a sampled evaluation reads, as sorted linear positions and
values). Index ``v`` of a source dimension reads position ``v - offset``; positions outside the
source read 0.

Three ways to read, fastest first:

* strided: every index is linear in iterators that own arange axes. The read is a strided view
  of the source, zero-padded (once per call and padding) so that every position it touches
  exists. No copy.
* fancy: numpy indexing with per-dimension slices where an index is ``c*x + d`` in range and
  ``x`` appears in no other dimension, integer arrays elsewhere (clipped, then masked with
  ``np.where`` so NaN/inf of the source never leak into padded positions).
* sparse: linear positions looked up with ``np.searchsorted``.

:func:`in_range` gives where a read lies inside its source (the reads outside are the
*structural zeros* of the interpreter's as-written evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ollie.ir.index import Affine
from ollie.semantics.grid import MAX_ELEMENTS, Box, Grid, iter_boxes, plan_blocks

_ITEM = 8  # float64


@dataclass(eq=False)
class DenseSource:
    """A float64 C-contiguous array read at ``index - offsets``."""

    name: str
    array: np.ndarray
    offsets: tuple[int, ...]
    _padded: dict[tuple, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def padded(self, pads: tuple[tuple[int, int], ...]) -> np.ndarray:
        """The array with ``pads`` zeros before/after each dimension (cached)."""
        if not any(lo or hi for lo, hi in pads):
            return self.array
        out = self._padded.get(pads)
        if out is None:
            out = np.pad(self.array, pads)
            self._padded[pads] = out
        return out


@dataclass(eq=False)
class SparseSource:
    """Some elements of a tensor: sorted unique linear positions ``keys`` and their values."""

    name: str
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    keys: np.ndarray
    values: np.ndarray


Source = DenseSource | SparseSource


def read(src: Source, indices: Sequence[Affine], grid: Grid, box: Box) -> np.ndarray:
    """Values of ``src[indices]`` over ``box`` in broadcast form (0 outside the source)."""
    if isinstance(src, SparseSource):
        return _sparse(src, indices, grid, box)
    view = _strided(src, indices, grid, box)
    return view if view is not None else _fancy(src, indices, grid, box)


def in_range(src: Source, indices: Sequence[Affine], grid: Grid, box: Box
             ) -> np.ndarray | bool | None:
    """Where ``src[indices]`` lies inside the source over ``box``: None when everywhere,
    False when nowhere, else a boolean array in broadcast form."""
    env = grid.env(_names(indices), box)
    mask = None
    for idx, off, dim in zip(indices, src.offsets, src.shape, strict=True):
        v = idx.evaluate(env) - off
        if not isinstance(v, np.ndarray):
            if not 0 <= v < dim:
                return False
        elif v.size and (v.min() < 0 or v.max() >= dim):
            m = (v >= 0) & (v < dim)
            mask = m if mask is None else mask & m
    return mask


def _names(indices: Sequence[Affine]) -> frozenset[str]:
    return frozenset().union(*(i.vars() for i in indices))


def _zeros(grid: Grid, box: Box, names: frozenset[str]) -> np.ndarray:
    return np.broadcast_to(np.float64(0.0), grid.box_shape(box, grid.axes(names)))


# --------------------------------------------------------------------- strided views
def _strided(src: DenseSource, indices: Sequence[Affine], grid: Grid, box: Box):
    names = _names(indices)
    if not all(i.is_linear for i in indices) or any(grid.start[n] is None for n in names):
        return None
    full = {n: grid.full_range(n) for n in names}
    pads = []
    for idx, off, dim in zip(indices, src.offsets, src.shape, strict=True):
        lo, hi = idx.bounds(full)
        pads.append((max(0, off - lo), max(0, hi - off - dim + 1)))
    padded_size = math.prod(d + lo + hi for d, (lo, hi) in zip(src.shape, pads, strict=True))
    if padded_size > 2 * src.array.size + (1 << 20):
        return None  # far out-of-range reads: mask instead of padding
    arr = src.padded(tuple(pads))
    elem = [s // _ITEM for s in arr.strides]
    first = {n: grid.start[n] + box[grid.axis_of[n]][0] for n in names}
    offset = 0
    for idx, off, (plo, _), es in zip(indices, src.offsets, pads, elem, strict=True):
        offset += (int(idx.evaluate(first)) - off + plo) * es
    shape = [1] * grid.ndim
    strides = [0] * grid.ndim
    for n in names:
        a = grid.axis_of[n]
        shape[a] = box[a][1] - box[a][0]
        strides[a] = _ITEM * sum(idx.coef(n) * es for idx, es in zip(indices, elem, strict=True))
    view = np.ndarray(tuple(shape), np.float64, buffer=arr, offset=offset * _ITEM,
                      strides=tuple(strides))
    view.flags.writeable = False
    return view


# --------------------------------------------------------------------- fancy indexing
def _slice_for(idx: Affine, off: int, dim: int, grid: Grid, box: Box, shared: set[str]):
    """A slice reading ``idx`` when it is ``c*x + d`` of an own-axis ``x`` and in range."""
    if len(idx.terms) != 1 or not idx.is_linear:
        return None
    (atom, c), = idx.terms
    name = atom.name
    if grid.start[name] is None or name in shared:
        return None
    a = grid.axis_of[name]
    lo, hi = box[a]
    first = c * (grid.start[name] + lo) + idx.const - off
    last = first + c * (hi - lo - 1)
    if min(first, last) < 0 or max(first, last) >= dim:
        return None
    stop = last + (1 if c > 0 else -1)
    return a, slice(first, stop if stop >= 0 else None, c)


def _fancy(src: DenseSource, indices: Sequence[Affine], grid: Grid, box: Box) -> np.ndarray:
    names = _names(indices)
    counts: dict[str, int] = {}
    for idx in indices:
        for n in idx.vars():
            counts[n] = counts.get(n, 0) + 1
    shared = {n for n, k in counts.items() if k > 1}
    env = grid.env(names, box)
    ix: list = []
    kinds: list[tuple[str, int]] = []  # ("s", axis) for a slice, ("a", -1) for an advanced index
    mask = None
    for idx, off, dim in zip(indices, src.offsets, src.shape, strict=True):
        sl = _slice_for(idx, off, dim, grid, box, shared)
        if sl is not None:
            kinds.append(("s", sl[0]))
            ix.append(sl[1])
            continue
        v = idx.evaluate(env) - off
        if not isinstance(v, np.ndarray):
            if not 0 <= v < dim:
                return _zeros(grid, box, names)
            ix.append(int(v))
            kinds.append(("i", -1))
            continue
        if v.min() < 0 or v.max() >= dim:
            m = (v >= 0) & (v < dim)
            mask = m if mask is None else mask & m
            v = np.clip(v, 0, dim - 1)
        ix.append(v)
        kinds.append(("a", -1))
    res = _to_broadcast_form(np.asarray(src.array[tuple(ix)]), kinds, grid.ndim)
    if mask is not None:
        res = np.where(mask, res, 0.0)
    return res


def _to_broadcast_form(res: np.ndarray, kinds: list[tuple[str, int]], ndim: int) -> np.ndarray:
    """Reorder the result of numpy mixed indexing into broadcast form (a view).

    ``kinds`` holds, per source dimension, ``("s", axis)`` for a slice along grid axis ``axis``,
    ``("a", -1)`` for an index array and ``("i", -1)`` for an integer. Without index arrays the
    result has the slice dimensions in order. With index arrays, numpy puts their broadcast
    shape (here in broadcast form over all ``ndim`` axes, of size 1 on slice axes) in place of
    the advanced indices when those are adjacent, else first; integers count as advanced.
    """
    slice_axes = [a for k, a in kinds if k == "s"]
    if not any(k == "a" for k, _ in kinds):
        dims = [("s", a) for a in slice_axes]
    else:
        adv = [d for d, (k, _) in enumerate(kinds) if k != "s"]
        adv_dims = [("a", g) for g in range(ndim)]
        if adv == list(range(adv[0], adv[-1] + 1)):
            before = [("s", a) for _, a in kinds[: adv[0]]]
            after = [("s", a) for _, a in kinds[adv[-1] + 1:]]
            dims = before + adv_dims + after
        else:
            dims = adv_dims + [("s", a) for a in slice_axes]
    # per grid axis: its slice dimension, else its advanced dimension (absent: a new axis)
    wanted = [("s", g) if g in slice_axes else ("a", g) for g in range(ndim)]
    perm = [dims.index(d) for d in wanted if d in dims]
    perm += [i for i in range(len(dims)) if i not in perm]  # size-1 leftovers go last
    out = res.transpose(perm)
    shape = [res.shape[dims.index(d)] if d in dims else 1 for d in wanted]
    return out.reshape(shape)


# --------------------------------------------------------------------- sparse sources
def _linear(src: SparseSource, indices: Sequence[Affine], env) -> tuple[object, object]:
    """Row-major linear positions (clipped) and the in-range mask (None when all in range)."""
    lin: object = 0
    mask = None
    mult = 1
    for idx, off, dim in reversed(list(zip(indices, src.offsets, src.shape, strict=True))):
        v = idx.evaluate(env) - off
        if isinstance(v, np.ndarray):
            if v.size and (v.min() < 0 or v.max() >= dim):
                m = (v >= 0) & (v < dim)
                mask = m if mask is None else mask & m
                v = np.clip(v, 0, dim - 1)
        elif not 0 <= v < dim:
            return None, False
        lin = lin + v * mult
        mult *= dim
    return lin, mask


def _sparse(src: SparseSource, indices: Sequence[Affine], grid: Grid, box: Box) -> np.ndarray:
    names = _names(indices)
    lin, mask = _linear(src, indices, grid.env(names, box))
    if mask is False or not len(src.keys):
        return _zeros(grid, box, names)
    lin = np.asarray(lin, dtype=np.int64)
    pos = np.minimum(np.searchsorted(src.keys, lin), len(src.keys) - 1)
    found = src.keys[pos] == lin
    if not (found if mask is None else found | ~mask).all():
        raise AssertionError(f"sampled nested scope {src.name}: a read position was not "
                             "evaluated")
    res = src.values[pos].reshape(grid.box_shape(box, grid.axes(names)))
    return res if mask is None else np.where(mask, res, 0.0)


def requested_keys(shape: tuple[int, ...], offsets: tuple[int, ...],
                   indices: Sequence[Affine], grid: Grid, limit: int | None = None
                   ) -> np.ndarray | None:
    """Sorted unique linear positions of ``shape`` that ``[indices]`` reads in range over the
    whole grid (chunked to bound memory); None as soon as more than ``limit`` are found."""
    probe = SparseSource("", shape, offsets, np.zeros(0, np.int64), np.zeros(0))
    names = _names(indices)
    axes = grid.axes(names)
    found = []
    count = 0
    for box in iter_boxes(grid, plan_blocks(grid, [axes], MAX_ELEMENTS), axes):
        lin, mask = _linear(probe, indices, grid.env(names, box))
        if mask is False:
            continue
        bshape = grid.box_shape(box, axes)
        lin = np.broadcast_to(np.asarray(lin, dtype=np.int64), bshape)
        if mask is not None:
            lin = lin[np.broadcast_to(mask, bshape)]
        found.append(np.unique(lin))
        count += len(found[-1])
        if limit is not None and count > limit:
            found = [np.unique(np.concatenate(found))]
            count = len(found[0])
            if count > limit:
                return None
    if not found:
        return np.zeros(0, np.int64)
    return np.unique(np.concatenate(found))
