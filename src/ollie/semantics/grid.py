"""Evaluation grids of one scope: axes, iterator values, boxes and chunk plans.

A :class:`Grid` gives every iterator of a scope an axis and the integer values it takes along
that axis. In full evaluation each iterator owns an axis whose values are a contiguous range
(``arange(lo, hi)``, made when first read, and per box for an axis longer than
:data:`MAX_ELEMENTS`); traversal axes come first (in layout order), then summation axes. In
sampled evaluation all traversal iterators share one axis ``p`` (one position per sampled output
element) and take the sampled values along it; summation iterators still own their axes.

Arrays computed over a grid are kept in *broadcast form*: one dimension per grid axis, of the box
size on the axes the array depends on and of size 1 elsewhere.

A :data:`Box` is a half-open ``(start, stop)`` range of positions per axis. :func:`plan_blocks`
chooses block sizes so that no operand (a set of axes) exceeds :data:`MAX_ELEMENTS` elements and
:func:`iter_boxes` enumerates the boxes of such a plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ollie.ir.nodes import Scope

MAX_ELEMENTS = 1 << 24
"""Largest number of elements of any intermediate array (gathered operand, dense grid)."""

Box = tuple[tuple[int, int], ...]
Axes = frozenset[int]


@dataclass(frozen=True, eq=False)
class Grid:
    """Axes of one scope evaluation and where each iterator lives on them."""

    sizes: tuple[int, ...]
    n_out: int  # the first n_out axes are output axes, the others summation axes
    axis_of: Mapping[str, int]
    values: Mapping[str, np.ndarray]  # 1-D int64 values along a shared (sampled) axis
    start: Mapping[str, int | None]  # first value when the axis is the iterator's own arange
    points: np.ndarray | None = None  # sampled storage positions [P, rank] on axis 0
    _aranges: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def full(cls, scope: Scope) -> Grid:
        """One axis per iterator: traversal axes (layout order), then summation axes."""
        iters = scope.traversal + scope.summation
        return cls(
            sizes=tuple(it.size for it in iters),
            n_out=len(scope.traversal),
            axis_of={it.name: a for a, it in enumerate(iters)},
            values={},
            start={it.name: it.lo for it in iters},
        )

    @classmethod
    def at_points(cls, scope: Scope, points: np.ndarray) -> Grid:
        """Axis 0 holds the sampled storage positions ``points`` [P, rank]; then summation."""
        axis_of: dict[str, int] = {}
        values: dict[str, np.ndarray] = {}
        start: dict[str, int | None] = {}
        for d, it in enumerate(scope.traversal):
            axis_of[it.name] = 0
            values[it.name] = np.ascontiguousarray(points[:, d], dtype=np.int64) + it.lo
            start[it.name] = None
        for a, it in enumerate(scope.summation, start=1):
            axis_of[it.name] = a
            start[it.name] = it.lo
        sizes = (int(points.shape[0]), *(it.size for it in scope.summation))
        return cls(sizes, 1, axis_of, values, start, points=points)

    @property
    def sampled(self) -> bool:
        return self.points is not None

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.sizes[: self.n_out]

    def is_summed(self, axis: int) -> bool:
        return axis >= self.n_out

    def full_box(self) -> Box:
        return tuple((0, n) for n in self.sizes)

    def axes(self, names: Iterable[str]) -> Axes:
        """The axes on which iterators ``names`` live."""
        return frozenset(self.axis_of[n] for n in names)

    def box_shape(self, box: Box, axes: Iterable[int]) -> tuple[int, ...]:
        """Broadcast-form shape of an array that depends on ``axes`` within ``box``."""
        used = set(axes)
        return tuple(hi - lo if a in used else 1 for a, (lo, hi) in enumerate(box))

    def iter_values(self, name: str, box: Box) -> np.ndarray:
        """Values of iterator ``name`` within ``box``, in broadcast form."""
        a = self.axis_of[name]
        lo, hi = box[a]
        shape = [1] * self.ndim
        shape[a] = hi - lo
        first = self.start[name]
        if first is None:
            return self.values[name][lo:hi].reshape(shape)
        n = self.sizes[a]
        if n > MAX_ELEMENTS:
            return np.arange(first + lo, first + hi, dtype=np.int64).reshape(shape)
        values = self._aranges.get(name)
        if values is None:
            values = self._aranges[name] = np.arange(first, first + n, dtype=np.int64)
        return values[lo:hi].reshape(shape)

    def env(self, names: Iterable[str], box: Box) -> dict[str, np.ndarray]:
        """Iterator values for :meth:`Affine.evaluate` within ``box``."""
        return {n: self.iter_values(n, box) for n in names}

    def full_range(self, name: str) -> tuple[int, int]:
        """Half-open value range of an own-axis (arange) iterator."""
        first = self.start[name]
        assert first is not None, name
        return first, first + self.sizes[self.axis_of[name]]


def plan_blocks(grid: Grid, operands: Sequence[Axes], cap: int = MAX_ELEMENTS) -> list[int]:
    """Block size per axis so that every operand's box has at most ``cap`` elements.

    Repeatedly halves one axis of the largest operand: an output axis when it has one to split
    (no accumulation needed), else a summation axis; the largest block among those.
    """
    block = list(grid.sizes)

    def cost(op: Axes) -> int:
        return math.prod(block[a] for a in op)

    while operands:
        worst = max(operands, key=cost)
        if cost(worst) <= cap:
            break
        cands = [a for a in worst if block[a] > 1]
        a = max(cands, key=lambda a: (not grid.is_summed(a), block[a], -a))
        block[a] = -(-block[a] // 2)
    return block


def iter_boxes(grid: Grid, block: Sequence[int], axes: Iterable[int]) -> Iterator[Box]:
    """Boxes tiling the grid; only ``axes`` are split (by ``block``), others stay whole."""
    split = set(axes)
    per_axis = []
    for a, n in enumerate(grid.sizes):
        if a in split and block[a] < n:
            per_axis.append([(s, min(s + block[a], n)) for s in range(0, n, block[a])])
        else:
            per_axis.append([(0, n)])
    yield from itertools.product(*per_axis)
