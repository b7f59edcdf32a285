"""Expression merging, sum mode: several contractions summed into one (inter-expression rule).

:func:`sum_merge` merges ``N >= 2`` contractions over one output iteration space that are
*added* (GCN's global-convolution block ``left2(left1(x)) + right2(right1(x))``, or a residual
add of two convolution branches): each member is ``L<T> Sum<S_i> F_i1[..] * F_i2[..] * ...``,
a product of reads whose operands may all differ (activations included). The sum of the
members is one contraction over a longer reduction: a *concatenation iterator* ``c`` (a
summation iterator every factor reads as a plain index, e.g. a convolution's input channel)
runs over the members' extents one after another, and each factor reads a scope ``C_j``
concatenating the members' factor tensors along the position ``c`` indexes::

    L<T> Sum<c=0:n_1+..+n_N, r=hull, ..> C_1[..c..] * C_2[..c..]

For two convolutions this is one convolution over the channel-concatenated inputs and the
input-channel-joined weights. Members whose other summation ranges differ (a 1 x k next to
a k x 1 window) are *relaxed* to the hull of the ranges, as
:func:`ollie.rules.inter_merge.concat_merge` does for siblings: each member's part of a
factor indexed by a relaxed iterator is restricted to that member's own range, so the added
terms read zero there. Members may read their operands at shifted positions (a 1 x k window
reads ``x[h, w + s - p]``, a k x 1 one ``y[h + r - p, w]``): each part is placed at its
member's offset, so ``C_j`` holds every member's operand, zero-padded to the hull.

Contract (NaN and infinities). The merge is exact for every input (up to float summation
order) when no range is relaxed and every member's part of each ``C_j`` covers ``C_j``'s range
outside the concatenation axis (:attr:`SumMerge.exact`); then every read outside a member's
operand is still outside ``C_j`` (a structural zero, note 015). Otherwise ``C_j`` holds zero
padding as *elements* (ordinary values) and a relaxed term ``x * 0`` is NaN where ``x`` is an
infinity: exact for finite inputs only, the contract of note 026 and of
:func:`~ollie.rules.inter_merge.concat_merge`'s relaxation. The program rule
(:mod:`ollie.rules.inter_program`) proposes an inexact merge only inside
:func:`ollie.rules.base.assume_finite_inputs`, and never one whose work grows past
:data:`MAX_SUM_GROWTH` (docs/design/030-regions-sum-merge.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from ollie.errors import ExprError
from ollie.ir import (
    Access,
    Affine,
    BinOp,
    Const,
    Expr,
    Iter,
    Node,
    Scope,
    accesses,
    map_body,
    tensor_names,
    var,
)
from ollie.ir.exprprogram import ExprProgram
from ollie.rules.base import finite_inputs_assumed, fresh_name
from ollie.rules.inter_merge import work

MAX_SUM_GROWTH = 2.0
"""Most reduction work of a program after a sum merge over before (:func:`program_work`):
the bound sibling concatenation uses (``ollie.graph.siblings.MAX_GROWTH``),
applied to the whole program, because a relaxed merge multiplies the merged contraction's
work (``k`` for a ``k x 1`` + ``1 x k`` pair) while the program's other defs (GCN's first
convolutions over the wide backbone features) stay; docs/design/030-regions-sum-merge.md."""


@dataclass(frozen=True)
class SumMerge:
    """The result of :func:`sum_merge`: the merged contraction, the concatenation iterator's
    name and each member's offset along it, the relaxed summation iterators, whether the
    merge is exact with NaN and infinities, and its work over the members' summed."""

    merged: Expr
    axis: str
    offsets: tuple[int, ...]
    relaxed: tuple[str, ...]
    exact: bool
    growth: float

    @property
    def note(self) -> str:
        """A short description of the merge (for a derivation step)."""
        text = (f"sum of {len(self.offsets)} along {self.axis} (offsets "
                f"{', '.join(map(str, self.offsets))})")
        text += f", relaxed {', '.join(self.relaxed)}" if self.relaxed else ""
        return text + ("" if self.exact else "; exact for finite inputs")


def factors(node: Node) -> list[Node]:
    """The factors of a product (``*`` chains); ``[node]`` when it is no product."""
    if isinstance(node, BinOp) and node.op == "*":
        return factors(node.lhs) + factors(node.rhs)
    return [node]


def subst_body(body: Node, mapping: dict[str, Affine]) -> Node:
    """``body`` with iterators replaced by index expressions in every read (nested scopes
    are closed: only the indices of their reads change)."""
    if not mapping:
        return body

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access):
            return Access(node.source, tuple(ix.subst(mapping) for ix in node.indices))
        return None
    return map_body(body, fn)


def sum_merge(members: Sequence[Expr]) -> SumMerge:
    """Merge the contractions ``members`` into one whose result is their sum (module
    docstring). Each member's root must have the same traversal (names and ranges), a
    summation, and a body that is a product of tensor reads and literals, with the same
    literals in the same places. Raises :class:`~ollie.errors.ExprError` when they do not
    fit."""
    if len(members) < 2:
        raise ExprError("sum merging: needs >= 2 contractions")
    roots = [e.root for e in members]
    r0 = roots[0]
    if any(r.traversal != r0.traversal for r in roots):
        raise ExprError("sum merging: the members have different output iteration spaces")
    if not r0.summation or any(len(r.summation) != len(r0.summation) for r in roots):
        raise ExprError("sum merging: the members sum over different numbers of iterators")
    names = [it.name for it in r0.summation]
    # member i's summation iterators renamed to member 0's, position by position
    bodies = [subst_body(r.body, {a.name: var(b) for a, b in zip(r.summation, names,
                                                                strict=True)
                                  if a.name != b}) for r in roots]
    prods = [factors(b) for b in bodies]
    if len({len(p) for p in prods}) != 1:
        raise ExprError("sum merging: the members have different numbers of factors")
    for j, f0 in enumerate(prods[0]):
        for p in prods[1:]:
            if isinstance(f0, Const) or isinstance(p[j], Const):
                if p[j] != f0:
                    raise ExprError("sum merging: the members use different literals")
            elif not all(isinstance(f, Access) and isinstance(f.source, str)
                         for f in (f0, p[j])):
                raise ExprError("sum merging: a factor is not a tensor read")
    reads = [j for j, f in enumerate(prods[0]) if isinstance(f, Access)]
    if not reads:
        raise ExprError("sum merging: no factor reads a tensor")
    axis = next((v for v in names if all(_plain_at(p[j], v) is not None and
                                          _plain_at(p[j], v) == _plain_at(prods[0][j], v)
                                          for p in prods for j in reads)), None)
    if axis is None:
        raise ExprError("sum merging: no summation iterator indexes every factor plainly")
    ranges = [{it_name: r.summation[k].range for k, it_name in enumerate(names)}
              for r in roots]
    sizes = [rg[axis][1] - rg[axis][0] for rg in ranges]
    offsets = tuple(sum(sizes[:i]) for i in range(len(members)))
    # member i's axis value v is the merged c = v - lo_i + off_i
    shifted = [subst_body(b, {axis: var(axis) + (rg[axis][0] - off)})
               for b, rg, off in zip(bodies, ranges, offsets, strict=True)]
    prods = [factors(b) for b in shifted]
    own = [{**rg, axis: (off, off + n)} for rg, off, n in zip(ranges, offsets, sizes,
                                                              strict=True)]
    hull = {v: (min(o[v][0] for o in own), max(o[v][1] for o in own)) for v in names}
    relaxed = tuple(v for v in names if v != axis and any(o[v] != hull[v] for o in own))
    for v in relaxed:
        if not any(_plain_at(prods[0][j], v) is not None for j in reads):
            raise ExprError(f"sum merging: {v} is relaxed but indexes no factor plainly")
    shapes = [e.inputs for e in members]
    exact = not relaxed
    merged_factors: list[Node] = []
    for j, f0 in enumerate(prods[0]):
        if isinstance(f0, Const):
            merged_factors.append(f0)
            continue
        scope, covers = _concat(f0, [p[j] for p in prods], shapes, own, axis)  # type: ignore
        exact = exact and covers
        merged_factors.append(Access(scope, f0.indices))  # type: ignore[union-attr]
    body = merged_factors[0]
    for f in merged_factors[1:]:
        body = BinOp("*", body, f)
    summation = tuple(Iter(v, *hull[v]) for v in names)
    decls: dict[str, tuple[int, ...]] = {}
    for e in members:
        decls.update(e.decls)
    merged = Expr(tuple(decls.items()), Scope(r0.traversal, summation, body))
    every = frozenset(decls)
    growth = work(merged.root, every) / sum(work(r, every) for r in roots)
    return SumMerge(merged, axis, offsets, relaxed, exact, growth)


def _plain_at(read: Node, v: str) -> int | None:
    """The one index position of ``read`` that is exactly iterator ``v`` when ``v`` occurs
    nowhere else in its indices; None otherwise."""
    if not isinstance(read, Access):
        return None
    at = [k for k, ix in enumerate(read.indices) if ix.as_var() == v]
    uses = [k for k, ix in enumerate(read.indices) if v in ix.vars()]
    return at[0] if len(at) == 1 and uses == at else None


def _concat(f0: Access, reads: list[Access], shapes: list[dict[str, tuple[int, ...]]],
            own: list[dict[str, tuple[int, int]]], axis: str) -> tuple[Scope, bool]:
    """The scope concatenating the members' ``reads`` of one factor, read at ``f0``'s
    indices; and whether every member's part covers the scope outside the axis."""
    rank = len(f0.indices)
    parts: list[tuple[list[Iter], Access]] = []
    for i, rd in enumerate(reads):
        shape = shapes[i][str(rd.source)]
        if len(rd.indices) != rank:
            raise ExprError("sum merging: the members read tensors of different ranks")
        dims, idx = [], []
        for k in range(rank):
            delta = rd.indices[k] - f0.indices[k]
            if not delta.is_const:
                raise ExprError("sum merging: the members index a factor differently")
            lo, hi = -delta.const, shape[k] - delta.const
            v = f0.indices[k].as_var()
            if v is not None and v in own[i]:
                lo, hi = max(lo, own[i][v][0]), min(hi, own[i][v][1])
            if hi <= lo:
                raise ExprError("sum merging: a member's factor is never read in range")
            dims.append(Iter(f"d{k}", lo, hi))
            idx.append(var(f"d{k}") + delta.const)
        parts.append((dims, Access(rd.source, tuple(idx))))
    hull = [Iter(f"d{k}", min(p[0][k].lo for p in parts), max(p[0][k].hi for p in parts))
            for k in range(rank)]
    at = _plain_at(f0, axis)
    assert at is not None  # the axis indexes every factor plainly (sum_merge)
    covers = all(p[0][k].range == hull[k].range for p in parts for k in range(rank)
                 if k != at)
    covers = covers and all(p[0][at].range == o[axis] for p, o in zip(parts, own,
                                                                      strict=True))
    total: Node | None = None
    for dims, rd in parts:
        part = Access(Scope(tuple(dims), (), rd), tuple(var(d.name) for d in hull))
        total = part if total is None else BinOp("+", total, part)
    assert total is not None
    return Scope(tuple(hull), (), total), covers


# --------------------------------------------------------------------- on programs
@dataclass(frozen=True)
class SumRewrite:
    """One sum merge in a program (:func:`sum_rewrites`): the program's defs with the adding
    def rewritten (the merged contraction is def ``merged``, the adding def's own name when
    nothing else is added), and a note."""

    defs: list[tuple[str, Expr]]
    merged: str
    note: str


def _summing(scope: Scope) -> bool:
    return bool(scope.summation) or any(_summing(a.source) for a in accesses(scope.body)
                                        if isinstance(a.source, Scope))


def _in_range(idx: tuple[Affine, ...], scope: Scope, ranges: dict[str, tuple[int, int]]
              ) -> bool:
    """Whether every read ``scope[idx]`` at iterator values ``ranges`` is inside it."""
    for ix, it in zip(idx, scope.traversal, strict=True):
        lo, hi = ix.bounds(ranges)
        if lo < it.lo or hi > it.hi - 1:
            return False
    return True


def _terms(body: Node, root: Scope, defs: dict[str, Expr], mergeable: set[str],
           taken: set[str]) -> tuple[list[Scope], list[Node]]:
    """The terms of the sum ``body`` of ``root``: the contractions (summing scopes over
    ``root``'s traversal, reached through ``+`` chains, in-range reads of element-wise nested
    scopes and of the ``mergeable`` defs) and the other terms."""
    ranges = {it.name: it.range for it in root.traversal}
    contractions: list[Scope] = []
    rest: list[Node] = []
    todo = [body]
    while todo:
        node = todo.pop(0)
        if isinstance(node, BinOp) and node.op == "+":
            todo[0:0] = [node.lhs, node.rhs]
            continue
        scope: Scope | None = None
        idx: tuple[Affine, ...] = ()
        if isinstance(node, Access) and isinstance(node.source, str) and \
                node.source in mergeable:
            scope = defs[node.source].root
            idx = tuple(ix + it.lo for ix, it in zip(node.indices, scope.traversal,
                                                     strict=True))
        elif isinstance(node, Access) and isinstance(node.source, Scope):
            scope, idx = node.source, node.indices
        if scope is None or not _in_range(idx, scope, ranges):
            rest.append(node)
            continue
        sub: dict[str, Affine] = dict(zip((it.name for it in scope.traversal), idx,
                                          strict=True))
        if not scope.summation:
            todo[0:0] = [subst_body(scope.body, sub)]
            continue
        sums = []
        for it in scope.summation:
            name = fresh_name(it.name, taken)
            taken.add(name)
            sums.append(Iter(name, it.lo, it.hi))
            sub[it.name] = var(name)
        contractions.append(Scope(root.traversal, tuple(sums), subst_body(scope.body, sub)))
    return contractions, rest


def sum_rewrites(ep: ExprProgram, taken: set[str]) -> list[SumRewrite]:
    """Every sum merge of ``ep``: per def without a root summation whose body adds the
    results of two or more contractions (its own nested ones, or defs only it reads that are
    not outputs, through element-wise defs such as a bias add), the contractions that
    :func:`sum_merge` merges, grouped by their numbers of summation iterators and factors.
    A merge exact only for finite inputs is proposed only inside
    :func:`~ollie.rules.base.assume_finite_inputs`; none grows past :data:`MAX_SUM_GROWTH`.
    ``taken``: names new defs and iterators must avoid (updated)."""
    defs = dict(ep.defs)
    shapes = ep.shapes()
    readers = ep.readers()
    outputs = set(ep.outputs)
    out = []
    for name, expr in ep.defs:
        root = expr.root
        if root.summation:
            continue
        mergeable = {d for d in tensor_names(root) if d in defs and d not in outputs
                     and readers.get(d) == [name] and _summing(defs[d].root)}
        iters = set(taken) | {it.name for it in root.traversal}
        contractions, rest = _terms(root.body, root, defs, mergeable, iters)
        groups: dict[tuple[int, int], list[Scope]] = {}
        for c in contractions:
            groups.setdefault((len(c.summation), len(factors(c.body))), []).append(c)
        for key, group in groups.items():
            if len(group) < 2:
                continue
            members = [Expr(tuple((n, shapes[n]) for n in sorted(tensor_names(s))), s)
                       for s in group]
            try:
                sm = sum_merge(members)
            except ExprError:
                continue
            if not (sm.exact or finite_inputs_assumed()):
                continue
            others = [Access(c, tuple(var(it.name) for it in root.traversal))
                      for k, grp in groups.items() if k != key for c in grp] + rest
            mname = fresh_name(f"{name}_sum", taken) if others else name
            taken.add(mname)
            new: list[tuple[str, Expr]] = []
            for n, e in ep.defs:
                if n != name:
                    new.append((n, e))
                    continue
                new.append((mname, sm.merged))
                if others:
                    body: Node = Access(mname, tuple(var(it.name) - it.lo
                                                     for it in root.traversal))
                    for o in others:
                        body = BinOp("+", body, o)
                    new.append((name, Expr((), Scope(root.traversal, (), body))))
            growth = program_work(new, ep.outputs) / max(program_work(ep.defs, ep.outputs), 1)
            if growth <= MAX_SUM_GROWTH:
                out.append(SumRewrite(new, mname, f"sum {name}: {sm.note}; program work "
                                      f"x{growth:.2f}"))
    return out


def reduction_points(scope: Scope) -> int:
    """Iteration points (traversal x summation) of every scope with a ``Sum`` in ``scope``,
    nested ones included (once per read), the measure ``ollie derive`` ranks programs by."""
    own = prod(it.size for it in scope.iters) if scope.summation else 0
    return own + sum(reduction_points(a.source) for a in accesses(scope.body)
                     if isinstance(a.source, Scope))


def program_work(defs: Sequence[tuple[str, Expr]], outputs: Sequence[str]) -> int:
    """The :func:`reduction_points` of the defs ``outputs`` need (copies and element-wise
    scopes, which stream at memory bandwidth, do not count)."""
    by_name = dict(defs)
    live: set[str] = set()
    todo = [o for o in outputs if o in by_name]
    while todo:
        n = todo.pop()
        if n not in live:
            live.add(n)
            todo += [d for d in tensor_names(by_name[n].root) if d in by_name]
    return sum(reduction_points(by_name[n].root) for n in live)


__all__ = ["MAX_SUM_GROWTH", "SumMerge", "SumRewrite", "factors", "program_work",
           "reduction_points", "subst_body", "sum_merge", "sum_rewrites"]
