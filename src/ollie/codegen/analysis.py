"""Range analysis of one loop nest: loop order, bounds-check classes, clamps, parallel split.

A nest computes ``L<t_0..t_n-1> Sum<s...> body`` with the summation loops innermost and the
traversal loops ordered by :func:`_loop_orders` (inputs walked contiguously; the output layout
order for gathers like the offset-add). ``x`` is the innermost traversal iterator. Every read
``B[q_0, ...]`` (``q_d`` = index minus the buffer's offset, in bounds when ``0 <= q_d < size_d``)
is classified per dimension:

``safe``     in bounds for every iterator value (:meth:`Affine.bounds` over the scope's ranges):
             never checked;
``zero``     never in bounds: the whole read is the constant 0;
``xlin``     ``q = a*x + R_o + R_s`` with ``a != 0`` and ``x`` not inside a div/mod, ``R_o`` the
             terms over outer traversal iterators (known when the x loop starts) and ``R_s`` the
             rest (summation iterators), bounded statically by ``[smin, smax]``: in bounds for
             ``x`` in an interval computed at run time before the x loop;
``guard``    ``q = R_o + R_s`` does not use ``x``: in bounds for the whole x loop when
             ``R_o + smin >= 0`` and ``R_o + smax < size``, tested at run time per x loop (this
             splits the second-innermost traversal loop into interior and boundary rows);
``checked``  uses ``x`` inside a div/mod: always checked.

The x loop is split into ``[x_lo, lo) + [lo, hi) + [hi, x_hi)``: the *interior* ``[lo, hi)``
is the intersection of the ``xlin`` intervals (empty when a guard fails) and runs with no
bounds check except on ``checked`` dimensions; the *boundary* parts check every dimension that
is not ``safe``.

A body that is one read (up to negation and scaling by a constant) is zero wherever the read is
out of bounds, so in the boundary parts a summation loop is *clamped* to the values for which a
dimension linear in its iterator stays in bounds (no check at all, exact: skipped terms are
exactly 0). The interior keeps every summation loop at its constant range (guards make that
safe), so short loops unroll: measured on the [16,256,14,14] conv3x3 offset-add, clamping the
interior's loops per row cost 1.5x.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from ollie.codegen.plan import Buffer, Nest
from ollie.ir import Access, Affine, Const, Iter, Node, accesses
from ollie.ir.index import FloorDiv, Var
from ollie.ir.nodes import BinOp, Neg

SAFE, ZERO, XLIN, GUARD, CHECKED = "safe", "zero", "xlin", "guard", "checked"

FLOAT64_TERMS = 4096
"""Sums of at least this many terms accumulate in float64, shorter ones in float32."""

PARALLEL_ITEMS = 64
"""Leading traversal loops are fused into one parallel loop until it has this many items."""

PARALLEL_MIN_POINTS = 1 << 18
"""Nests with fewer iteration points (traversal x summation) run serially: launching the
parallel loop cost 30-40 us with numba's workqueue layer (2 cores), the time of about 2**17
points of a memory-bound body. With the omp layer (now preferred, see
:data:`ollie.codegen.cpu.THREADING_LAYER_PRIORITY`) a launch costs 1.5 us back to back but
about 50 us once the workers slept; 2**15 and 2**13 measured no better end to end (InfoGAN
b1; docs/design/020-codegen-measurements.md), so the threshold stayed."""

X_BLOCK_MIN = 256
"""Smallest block of the innermost loop when it is cut into blocks for the parallel loop."""

X_TILE = 16
"""Tile of the innermost loop when the output's contiguous iterator moves inside it (a
transpose): each read row then gives one 64-byte line of float32 per tile, and the tile's
writes fill whole lines. Measured on the [16,32,224,224] NCHW -> NHWC transform: 1.6-2x
against reading contiguously with 32-float-strided writes over the whole image."""


_ZERO = Affine()


@dataclass(frozen=True, slots=True)
class Clamp:
    """``0 <= coef*it + rest < size`` bounds summation iterator ``it`` (rest: outer iterators)."""

    it: str
    coef: int
    rest: Affine
    size: int


@dataclass(frozen=True, slots=True)
class Dim:
    """One dimension of one read: ``q`` (index - offset) must lie in ``[0, size)``."""

    q: Affine
    size: int
    kind: str
    bounds: tuple[int, int]
    coef: int = 0
    runtime: Affine = _ZERO
    smin: int = 0
    smax: int = 0
    clamp: Clamp | None = None


@dataclass(frozen=True, slots=True)
class Read:
    """A read of a buffer: its dimensions and flat element offset."""

    buffer: Buffer
    dims: tuple[Dim, ...]
    flat: Affine
    zero: bool


@dataclass(frozen=True)
class NestInfo:
    """Everything the emitter needs about one nest."""

    nest: Nest
    outer: tuple[Iter, ...]
    x: Iter | None
    summation: tuple[Iter, ...]
    reads: dict[Access, Read]
    clampable: bool
    acc64: bool
    fused: int
    xblocks: int
    parallel: bool
    split: bool
    out_flat: Affine
    tile: Iter | None = None
    """Traversal iterator looped between the x tile loop and the x loop (see :data:`X_TILE`)."""

    @property
    def scope(self):
        return self.nest.scope

    def clamps(self, interior: bool) -> dict[str, list[Clamp]]:
        """Clamps applied in the interior or the boundary x loops, by summation iterator."""
        out: dict[str, list[Clamp]] = {}
        seen: set[Clamp] = set()
        if interior:
            return out
        for read in self.reads.values():
            if read.zero:
                continue
            for dim in read.dims:
                c = dim.clamp
                if c is None or c in seen:
                    continue
                seen.add(c)
                out.setdefault(c.it, []).append(c)
        return out

    def checked(self, dim: Dim, interior: bool) -> bool:
        """Whether ``dim`` is bounds-checked in the interior or the boundary x loops."""
        if dim.kind in (SAFE, ZERO):
            return False
        if interior:
            return dim.kind == CHECKED
        return dim.clamp is None

    @property
    def points(self) -> int:
        return prod(it.size for it in self.scope.iters)


def single_read(body: Node) -> Access | None:
    """The read when ``body`` is one read up to negation and scaling by non-zero constants."""
    while True:
        if isinstance(body, Access):
            return body
        if isinstance(body, Neg):
            body = body.x
        elif isinstance(body, BinOp) and body.op == "*" and isinstance(body.lhs, Const):
            body = body.rhs
        elif isinstance(body, BinOp) and body.op in "*/" and isinstance(body.rhs, Const) \
                and body.rhs.value != 0.0:
            body = body.lhs
        else:
            return None


def _x_linear(q: Affine, x: str) -> int | None:
    """Coefficient of ``x`` when it appears only as a top-level term (0 when absent)."""
    for atom, _ in q.terms:
        if not isinstance(atom, Var) and x in atom.arg.vars():
            return None
    return q.coef(x)


def _atom_vars(atom) -> frozenset[str]:
    return frozenset((atom.name,)) if isinstance(atom, Var) else atom.arg.vars()


def _split_runtime(q: Affine, outer: frozenset[str], ranges) -> tuple[Affine, int, int]:
    """``q`` (without x) as run-time part over ``outer`` iterators plus static bounds."""
    run = [(a, c) for a, c in q.terms if _atom_vars(a) <= outer]
    rest = [(a, c) for a, c in q.terms if not _atom_vars(a) <= outer]
    smin, smax = Affine(tuple(rest), 0).bounds(ranges) if rest else (0, 0)
    return Affine(tuple(run), q.const), smin, smax


def _clamp(q: Affine, size: int, sum_order: list[str]) -> Clamp | None:
    """A clamp of the innermost summation iterator of ``q`` when it appears linearly."""
    used = [s for s in sum_order if s in q.vars()]
    if not used:
        return None
    it = used[-1]
    coef = _x_linear(q, it)
    if not coef:
        return None
    return Clamp(it, coef, q - Affine(((Var(it), coef),), 0), size)


def _dim(q: Affine, size: int, info: dict) -> Dim:
    ranges, x, outer = info["ranges"], info["x"], info["outer"]
    lo, hi = q.bounds(ranges)
    if lo >= 0 and hi < size:
        return Dim(q, size, SAFE, (lo, hi))
    if hi < 0 or lo >= size:
        return Dim(q, size, ZERO, (lo, hi))
    clamp = _clamp(q, size, info["sum_order"]) if info["clampable"] else None
    coef = _x_linear(q, x) if x is not None else 0
    if coef is None:
        return Dim(q, size, CHECKED, (lo, hi), clamp=clamp)
    body = q - Affine(((Var(x), coef),), 0) if coef else q
    runtime, smin, smax = _split_runtime(body, outer, ranges)
    kind = XLIN if coef else GUARD
    return Dim(q, size, kind, (lo, hi), coef, runtime, smin, smax, clamp)


def _never(d: Dim, ranges) -> bool:
    """A guard or xlin dim that holds for no iterator values (the interior is always empty):
    its static part spans more than the dimension, or its run-time part never fits."""
    if d.kind not in (GUARD, XLIN):
        return False
    if d.smax - d.smin > d.size - 1:
        return True
    if d.kind == XLIN:
        return False
    rlo, rhi = d.runtime.bounds(ranges)
    return rhi + d.smin < 0 or rlo + d.smax >= d.size


def _weight(flat: Affine, name: str) -> float:
    """Average step of a flat offset when iterator ``name`` steps by one."""
    w = 0.0
    for atom, c in flat.terms:
        if isinstance(atom, Var):
            w += abs(c) if atom.name == name else 0
        else:
            step = abs(c * atom.arg.coef(name))
            w += step / atom.k if isinstance(atom, FloorDiv) else step
    return w


def _loop_orders(scope, flats: list[tuple[Buffer, Affine]], out: Affine
                 ) -> tuple[tuple[Iter, ...], tuple[Iter, ...]]:
    """Traversal and summation loops, outermost first.

    Loops are ordered by decreasing read stride (each read weighted by its buffer's size), so
    the innermost loops walk the (larger) inputs contiguously; ties go to the output stride,
    then to the written order. Measured on a [8,10000,64] split-by-4 transform: reading in
    order with four interleaved write streams ran 10x faster than writing in order with
    reads strided by 1 KB (four passes over the input).
    """
    def key(it: Iter, pos: int) -> tuple:
        read = sum(buf.size * _weight(flat, it.name) for buf, flat in flats)
        return (-read, -_weight(out, it.name), pos)

    trav = tuple(it for _, it in sorted(
        ((key(it, k), it) for k, it in enumerate(scope.traversal)), key=lambda t: t[0]))
    summ = tuple(it for _, it in sorted(
        ((key(it, k), it) for k, it in enumerate(scope.summation)), key=lambda t: t[0]))
    return trav, summ


def _flats(nest: Nest, buffers: dict[str, Buffer]
           ) -> tuple[dict[Access, tuple[Buffer, Affine]], Affine]:
    """Flat element offsets of every read and of the written element."""
    raw: dict[Access, tuple[Buffer, Affine]] = {}
    for acc in accesses(nest.scope.body):
        assert isinstance(acc.source, str), "plan the expression first"
        buf = buffers[acc.source]
        flat = Affine()
        for idx, off, stride in zip(acc.indices, buf.offsets, buf.strides, strict=True):
            flat = flat + (idx - off) * stride
        raw[acc] = (buf, flat)
    out = nest.target
    oflat = Affine()
    for idx, off, stride in zip(nest.out_indices(), out.offsets, out.strides, strict=True):
        oflat = oflat + (idx - off) * stride
    return raw, oflat


def _tile_iter(trav: tuple[Iter, ...], flats: list[tuple[Buffer, Affine]], out: Affine
               ) -> Iter | None:
    """The output's contiguous traversal iterator when x writes strided and it reads strided
    (a transpose): it is then looped inside tiles of x (see :data:`X_TILE`)."""
    if len(trav) < 2:
        return None
    x = trav[-1]
    if _weight(out, x.name) < X_TILE:
        return None
    for it in trav[:-1]:
        reads = [_weight(flat, it.name) for _, flat in flats]
        if _weight(out, it.name) == 1 and it.size > 1 and min(reads, default=0) >= X_TILE:
            return it
    return None


def loop_order(nest: Nest, buffers: dict[str, Buffer]
               ) -> tuple[tuple[Iter, ...], tuple[Iter, ...]]:
    """Traversal and summation loops of ``nest``, outermost first (see :func:`_loop_orders`)."""
    raw, oflat = _flats(nest, buffers)
    return _loop_orders(nest.scope, list(raw.values()), oflat)


def analyse(nest: Nest, buffers: dict[str, Buffer]) -> NestInfo:
    """Classify the reads of ``nest`` (see the module docstring) and plan its loops.

    ``nest.outer`` iterators go outermost and only they are fused into the parallel loop (the
    function is shared by the residue nests of one nest; whether it runs in parallel is then
    decided for the group by :func:`ollie.codegen.cpu.analyse_plan`)."""
    scope = nest.scope
    raw, oflat = _flats(nest, buffers)
    trav, summation = _loop_orders(scope, list(raw.values()), oflat)
    if nest.outer:
        head = tuple(scope.iter(n) for n in nest.outer)
        trav = head + tuple(it for it in trav if it.name not in nest.outer)
    x = trav[-1] if trav else None
    tile = _tile_iter(trav, list(raw.values()), oflat) if not nest.outer else None
    outer = tuple(it for it in trav[:-1] if it is not tile)
    clampable = bool(summation) and single_read(scope.body) is not None
    info = {
        "ranges": scope.ranges, "x": x.name if x else None,
        "outer": frozenset(it.name for it in outer),
        "sum_order": [it.name for it in summation], "clampable": clampable,
    }
    reads: dict[Access, Read] = {}
    for acc, (buf, flat) in raw.items():
        dims = tuple(_dim(idx - off, size, info)
                     for idx, off, size in zip(acc.indices, buf.offsets, buf.shape, strict=True))
        reads[acc] = Read(buf, dims, flat, any(d.kind == ZERO for d in dims))
    live = [d for r in reads.values() if not r.zero for d in r.dims]
    split = x is not None and any(d.kind in (XLIN, GUARD) for d in live) \
        and not any(_never(d, scope.ranges) for d in live)
    fusable = min(len(outer), len(nest.outer)) if nest.outer else len(outer)
    fused, items = 0, 1
    while fused < fusable and items < PARALLEL_ITEMS:
        items *= outer[fused].size
        fused += 1
    xblocks = 1
    if x is not None and items < PARALLEL_ITEMS and x.size >= 2 * X_BLOCK_MIN \
            and not nest.outer and tile is None:
        xblocks = min(ceil(x.size / X_BLOCK_MIN), ceil(PARALLEL_ITEMS / items))
    points = prod(it.size for it in scope.iters)
    parallel = points >= PARALLEL_MIN_POINTS and items * xblocks > 1
    terms = prod(it.size for it in summation)
    return NestInfo(nest, outer, x, summation, reads, clampable, terms >= FLOAT64_TERMS,
                    fused, xblocks, parallel, split, oflat, tile)
