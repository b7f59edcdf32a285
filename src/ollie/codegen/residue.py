"""Residue splitting of strided selective sums (transposed-convolution adds).

A nest whose body is one read (up to negation and constant scaling, so a read out of bounds
makes the whole term 0) and whose read has a dimension ``q = a*t + c*s + k`` (``t`` a traversal
iterator, ``s`` a summation iterator, ``k`` a constant, ``c = sigma*m*a`` with ``m >= 2``,
``sigma = +-1``) sums, for each ``t``, only the few ``s`` that put ``q`` in bounds, and *which*
ones depends on ``t mod m``: clamping ``s`` per point needs run-time divisions and masks.

Writing ``t = t.lo + m*tq + r`` (one nest per residue ``r`` in ``[0, m)``) and
``s = d - sigma*tq`` turns ``q`` into ``c*d + a*(t.lo + r) + k``: the in-bounds values of the
new summation iterator ``d`` are a range known at generation time (a constant trip count, no
clamp), and ``s``'s other dimensions become linear in the traversal iterator ``tq``, which the
range analysis splits into interior and boundary as usual. The substitution is exact; the
summation over ``d`` covers every in-bounds term provided ``s``'s own range is implied by the
read: some dimension ``e*s + k2`` (over ``s`` alone) is in bounds only for ``s`` inside its
range, so extending ``d`` past it adds exact zeros. Each residue nest writes its output
elements through :attr:`~ollie.codegen.plan.Nest.out_index`.

Measured on the InfoGAN [16,256,4,4] selective add (2x2 taps, stride 2): 9x faster than the
clamped and masked summation. Long quotient loops are split too (there used to be a limit of 4
values per residue class, from a measurement made while a residue group whose nests each fell
under :data:`~ollie.codegen.analysis.PARALLEL_MIN_POINTS` ran serially). With the residue
nests in one parallel loop (``benchmarks/selective_add.py``, 2 cores,
docs/design/020-codegen-measurements.md; results in
``benchmarks/results/selective_add.md``), warm ms, clamped -> split:

====================  ==============  ==============
output                taps-major      channels-last
====================  ==============  ==============
[16,64,28,28]         0.768 -> 0.241  0.339 -> 0.322
[16,3,64,64]          0.106 -> 0.037  0.093 -> 0.093
[16,128,16,16]        0.411 -> 0.190  0.228 -> 0.228
[16,32,128,128]       10.1 -> 5.68    25.5 -> 27.8
[16,16,224,224]       28.7 -> 7.96    50.7 -> 43.2
====================  ==============  ==============

Taps-major reads (a Matmul's output) gain 1.8-3.6x; channels-last reads (a oneDNN 1x1
convolution's NHWC output, strided by the channels) are within -9% to +17%, and within -3% to
+20% with the input evicted from the caches first.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ollie.codegen.analysis import loop_order, single_read
from ollie.codegen.plan import Buffer, Nest, Plan
from ollie.ir import Access, Affine, Iter, Node, Scope, map_body, var

MAX_RESIDUE_NESTS = 16
"""At most this many residue nests replace one nest (the product of the split strides)."""

@dataclass(frozen=True, slots=True)
class _Split:
    t: Iter
    s: Iter
    m: int
    sigma: int
    c: int
    k: int  # q - origin = a*t + c*s + k (origin: the buffer's first index along q)
    a: int
    bounds: tuple[int, int]  # in-bounds values of s implied by the read (inclusive)
    size: int  # size of q's dimension


def _implied(acc: Access, buf: Buffer, s: Iter) -> tuple[int, int] | None:
    """Inclusive range of ``s`` values the read can hold in bounds, when inside ``s``'s range.
    A dimension of ``buf`` holds indices ``[offset, offset + size)`` (a nested scope's
    traversal need not start at 0)."""
    for idx, size, origin in zip(acc.indices, buf.shape, buf.offsets, strict=True):
        if not idx.is_linear or idx.vars() != {s.name}:
            continue
        e, k2 = idx.coef(s.name), idx.const - origin
        if e > 0:
            lo, hi = -(k2 // e), (size - 1 - k2) // e
        else:
            lo, hi = -((size - 1 - k2) // -e), k2 // -e
        if s.lo <= lo and hi < s.hi:
            return lo, hi
    return None


def _find(scope: Scope, acc: Access, buf: Buffer) -> list[_Split]:
    trav = {it.name: it for it in scope.traversal}
    summ = {it.name: it for it in scope.summation}
    splits: list[_Split] = []
    used: set[str] = set()
    for idx, size, origin in zip(acc.indices, buf.shape, buf.offsets, strict=True):
        names = idx.vars()
        if not idx.is_linear or len(names) != 2:
            continue
        ts = [n for n in names if n in trav and n not in used]
        ss = [n for n in names if n in summ and n not in used]
        if len(ts) != 1 or len(ss) != 1:
            continue
        t, s = trav[ts[0]], summ[ss[0]]
        a, c = idx.coef(t.name), idx.coef(s.name)
        if c % a or abs(c // a) < 2 or t.size < 2:
            continue
        bounds = _implied(acc, buf, s)
        if bounds is None:
            continue
        m = abs(c // a)
        splits.append(_Split(t, s, m, c // (a * m), c, idx.const - origin, a, bounds, size))
        used |= {t.name, s.name}
    return splits


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def _residue_scope(scope: Scope, splits: list[_Split], residues: tuple[int, ...],
                   names: list[tuple[str, str]]) -> tuple[Scope, tuple[Affine, ...]] | None:
    sub: dict[str, Affine] = {}
    trav: dict[str, Iter] = {}
    summ: dict[str, Iter] = {}
    for sp, r, (tq, d) in zip(splits, residues, names, strict=True):
        nq = -(-(sp.t.size - r) // sp.m)
        if nq <= 0:
            return None
        # d's values with q = c*d + a*(t.lo + r) + k in bounds
        kk = sp.a * (sp.t.lo + r) + sp.k
        if sp.c > 0:
            lo, hi = -(kk // sp.c), (sp.size - 1 - kk) // sp.c
        else:
            lo, hi = -((sp.size - 1 - kk) // -sp.c), kk // -sp.c
        # and s = d - sigma*tq within its implied bounds for some tq in [0, nq)
        span = sp.sigma * (nq - 1)
        lo = max(lo, sp.bounds[0] + min(0, span))
        hi = min(hi, sp.bounds[1] + max(0, span))
        if hi < lo:
            return None
        sub[sp.t.name] = var(tq) * sp.m + (sp.t.lo + r)
        sub[sp.s.name] = var(d) - var(tq) * sp.sigma
        trav[sp.t.name] = Iter(tq, 0, nq)
        summ[sp.s.name] = Iter(d, lo, hi + 1)

    def visit(node: Node) -> Node | None:
        if isinstance(node, Access):
            return Access(node.source, tuple(i.subst(sub) for i in node.indices))
        return None

    new = Scope(tuple(trav.get(it.name, it) for it in scope.traversal),
                tuple(summ.get(it.name, it) for it in scope.summation),
                map_body(scope.body, visit))
    out = tuple(sub.get(it.name, var(it.name)) for it in scope.traversal)
    return new, out


def split_nest(nest: Nest, buffers: dict[str, Buffer]) -> list[Nest]:
    """``nest`` as residue nests (see the module docstring), or ``[nest]`` when none apply."""
    scope = nest.scope
    acc = single_read(scope.body)
    if nest.out_index is not None or acc is None or not scope.summation:
        return [nest]
    splits = _find(scope, acc, buffers[acc.source])
    total = 1
    kept = []
    for sp in splits:
        if total * sp.m <= MAX_RESIDUE_NESTS:
            kept.append(sp)
            total *= sp.m
    if not kept:
        return [nest]
    taken = {it.name for it in scope.iters}
    names = [(_fresh(f"{sp.t.name}_q", taken), _fresh(f"{sp.s.name}_d", taken)) for sp in kept]
    made = [_residue_scope(scope, kept, residues, names)
            for residues in product(*(range(sp.m) for sp in kept))]
    if any(m is None for m in made):  # some residue class holds no term: its outputs are zero
        return [nest]
    # the unsplit traversal loops enclose every residue nest (in their usual order), so a block
    # of input is read by all residues while it is in cache
    first = [Nest(sc, nest.target, idx, post=nest.post) for sc, idx in made]
    unsplit = {it.name for it in scope.traversal} - {sp.t.name for sp in kept}
    trav, _ = loop_order(first[0], buffers)
    outer = tuple(it.name for it in trav if it.name in unsplit)
    return [Nest(n.scope, n.target, n.out_index, outer, n.post) for n in first]


def split_residues(plan: Plan) -> Plan:
    """``plan`` with every nest that has a strided selective sum split by residue."""
    buffers = plan.buffers
    nests = tuple(n for nest in plan.nests for n in split_nest(nest, buffers))
    return Plan(plan.inputs, plan.temps, nests, plan.output, plan.inlined)
