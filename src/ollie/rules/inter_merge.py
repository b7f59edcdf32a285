"""Expression merging by concatenation, with summation relaxation (inter-expression rules).

:func:`concat_merge` merges ``N >= 2`` expressions that read one shared operand and compute
the same function of their own constants (the *holes*), but

* differ in the extent of one traversal iterator that indexes only the holes and the output
  (the concatenation iterator: three 1x1 convolutions with 64, 96 and 16 output channels, or
  Matmuls with different ``n``), and/or
* differ in summation ranges (*relaxation*: a 1x1 convolution next to a 3x3 one with the same
  stride and dilation): the smaller window is shifted so that the shared reads line up, and
  its summation is relaxed to the hull of the members' windows.

The merged expression ``M`` ranges the concatenation iterator over the members' extents
summed, and reads, in place of each hole, a constant scope ``S`` concatenating the members'
hole tensors along it: member ``i``'s part ``{L<.., f=off_i:off_i+n_i, .., r=lo_i:hi_i, ..>
T_i[.., f - off_i, .., r - shift_i, ..]}`` reads outside its ranges as zero (a scope like the
stacked one of :func:`ollie.rules.inter.merge_expressions`, folded at optimisation time). The
slices ``L<..> M[.., t + off_i, ..]`` give back each member's result.

Everything is decided structurally: iterators are matched by position within each scope
(canonical renaming), a hole is a tensor in which the members differ, the concatenation
iterator is the one traversal iterator whose extent differs (or, when none does, the first
that unifies), and the summation shifts come from equating the shared reads' indices.

Contract (NaN and infinities). For finite values of the shared operand, every slice equals its
member exactly (up to float summation order). Relaxation adds terms ``x[..] * 0`` over the
hull; the zeros are elements of the constant scope ``S``, ordinary values (note 015: an element
of a nested scope is an ordinary value), so where the shared operand holds an infinity or a
NaN inside the hull but outside a member's own window, that member's slice is NaN where the
member is finite. This is the same class as a library convolution over zero-padded weights
(note 015, "Not covered"); without relaxation (pure concatenation) no term is added and NaN and
infinities stay exact. :func:`relax_expression` gives one member's relaxed form on its own,
whose padding is a *structural* zero (a read outside the padded scope): exact for every input,
like ``boundary_relaxing`` of a summation range. See docs/design/027-concat-merge.md.

Before / after (two Matmuls sharing ``A``, ``n`` = 2 and 3, concatenated along ``n``)::

    A: [4, 6]  W0: [6, 2]  W1: [6, 3]
    L<m=0:4, n=0:2> Sum<k=0:6> A[m, k] * W0[k, n]
    L<m=0:4, n=0:3> Sum<k=0:6> A[m, k] * W1[k, n]
    M = L<m=0:4, n=0:5> Sum<k=0:6> A[m, k] *
        { L<d0=0:6, d1=0:5> { L<d0=0:6, d1=0:2> W0[d0, d1] }[d0, d1]
                          + { L<d0=0:6, d1=2:5> W1[d0, d1 - 2] }[d0, d1] }[k, n]
    y0 = L<t0=0:4, t1=0:2> M[t0, t1]      y1 = L<t0=0:4, t1=0:3> M[t0, t1 + 2]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ollie.errors import ExprError
from ollie.ir import (
    Access,
    Affine,
    BinOp,
    Call,
    Const,
    Expr,
    Iter,
    Neg,
    Node,
    Scope,
    accesses,
    map_body,
    neg,
    tensor_names,
    var,
)


@dataclass(frozen=True)
class ConcatMerge:
    """The result of :func:`concat_merge`: the merged expression, one slice per member
    (declaring only ``merged``), the concatenated root traversal position and iterator, each
    member's offset along it, and the summation iterators relaxed (names in ``merged``)."""

    merged: Expr
    slices: list[Expr]
    axis: int
    iterator: str
    offsets: tuple[int, ...]
    relaxed: tuple[str, ...]
    growth: float
    """The merged expression's :func:`work` over the members' summed (1.0 without
    relaxation; a 1x1 next to a 3x3 convolution of as many channels: 1.8)."""

    @property
    def note(self) -> str:
        """A short description of the merge (for a derivation step)."""
        text = f"concat along {self.iterator} (offsets {', '.join(map(str, self.offsets))})"
        return text + (f", relaxed {', '.join(self.relaxed)}" if self.relaxed else "")


def concat_merge(exprs: Sequence[Expr], holes: Sequence[Sequence[str]],
                 relax: bool = True) -> ConcatMerge:
    """Merge ``exprs`` by concatenation (module docstring). ``holes[i]`` names the tensors
    only ``exprs[i]`` reads (its constants); every other declared tensor must be declared alike
    by all. With ``relax`` False, summation ranges must be equal. Raises
    :class:`~ollie.errors.ExprError` when the expressions do not fit."""
    n = len(exprs)
    if n < 2 or len(holes) != n:
        raise ExprError("concat merging: needs >= 2 expressions and one tuple of hole "
                        "tensors per expression")
    hole_sets = [frozenset(h) for h in holes]
    shared = [{k: v for k, v in e.decls if k not in hs} for e, hs in zip(exprs, hole_sets,
                                                                         strict=True)]
    if any(s != shared[0] for s in shared) or any(not hs for hs in hole_sets):
        raise ExprError("concat merging: the tensors other than the holes must be declared "
                        "alike, and each expression needs a hole")
    if any(hs & set(shared[0]) for hs in hole_sets):
        raise ExprError("concat merging: a hole is also a shared tensor")
    roots = [e.root for e in exprs]
    sizes = {len(r.traversal) for r in roots}
    if len(sizes) != 1:
        raise ExprError("concat merging: the outputs have different ranks")
    differ = [k for k in range(len(roots[0].traversal))
              if len({r.traversal[k].range for r in roots}) > 1]
    if len(differ) > 1:
        raise ExprError("concat merging: more than one output extent differs")
    tries = differ or list(range(len(roots[0].traversal)))
    error: ExprError | None = None
    for axis in tries:
        uni = _Unifier([dict(e.decls) for e in exprs], hole_sets, relax)
        try:
            root = uni.scope(roots, axis)
        except ExprError as exc:
            error = exc
            continue
        decls = dict(shared[0])
        for e, hs in zip(exprs, hole_sets, strict=True):
            decls.update((k, v) for k, v in e.decls if k in hs)
        merged = Expr(tuple(decls.items()), root)
        sizes_at = [r.traversal[axis].size for r in roots]
        offsets = tuple(sum(sizes_at[:i]) for i in range(n))
        slices = [_slice(merged, axis, off, size) for off, size in zip(offsets, sizes_at,
                                                                        strict=True)]
        every = frozenset().union(*hole_sets)
        growth = work(merged.root, every) / sum(work(e.root, hs) for e, hs in
                                               zip(exprs, hole_sets, strict=True))
        return ConcatMerge(merged, slices, axis, root.traversal[axis].name, offsets,
                           tuple(sorted(uni.relaxed)), growth)
    assert error is not None
    raise error


def relax_expression(expr: Expr, hull: Mapping[str, tuple[int, int]], holes: Sequence[str],
                     shift: Mapping[str, int] | None = None) -> Expr:
    """``expr`` with root summation iterator ``v`` renamed by ``v -> v - shift[v]`` and ranging
    over ``hull[v]``, every read of a hole tensor replaced by a padded scope (its tensor,
    shifted, inside the iterator's own range; a structural zero outside). Exact for every
    input, NaN and infinities included, when each relaxed iterator indexes a hole read that is
    a factor of the body; :class:`~ollie.errors.ExprError` otherwise."""
    shift = dict(shift or {})
    root = expr.root
    sums = {it.name: it for it in root.summation}
    if not set(hull) <= set(sums) or not set(shift) <= set(sums):
        raise ExprError("relaxation: only summation iterators of the root can be relaxed")
    moved = {v: (sums[v].lo + shift.get(v, 0), sums[v].hi + shift.get(v, 0)) for v in sums}
    for v, (lo, hi) in hull.items():
        if not (lo <= moved[v][0] and moved[v][1] <= hi):
            raise ExprError(f"relaxation: the hull {lo}:{hi} of {v} does not cover its range")
    hole_set = set(holes)
    relaxed = {v for v in hull if hull[v] != moved[v]}
    _check_annihilates(root.body, relaxed, hole_set)
    shapes = expr.inputs
    sub = {v: var(v) - d for v, d in shift.items() if d}

    def fn(node: Node) -> Node | None:
        if not isinstance(node, Access) or isinstance(node.source, Scope):
            return None
        idx = tuple(ix.subst(sub) for ix in node.indices)
        if node.source not in hole_set:
            return Access(node.source, idx)
        dims, reads, at = [], [], []
        for k, (ix, size) in enumerate(zip(node.indices, shapes[node.source], strict=True)):
            v = ix.as_var()
            d = f"d{k}"
            if v in shift or v in relaxed:
                lo, hi = moved[v]
                dims.append(Iter(d, max(lo, shift.get(v, 0)), min(hi, size + shift.get(v, 0))))
                reads.append(var(d) - shift.get(v, 0))
                at.append(var(v))
            else:
                if ix.vars() & (set(shift) | relaxed):
                    raise ExprError("relaxation: a relaxed iterator indexes a hole other "
                                    "than as a plain iterator")
                dims.append(Iter(d, 0, size))
                reads.append(var(d))
                at.append(ix)
        return Access(Scope(tuple(dims), (), Access(node.source, tuple(reads))), tuple(at))

    body = map_body(root.body, fn)
    summation = tuple(Iter(it.name, *hull.get(it.name, moved[it.name]))
                      for it in root.summation)
    return Expr(expr.decls, Scope(root.traversal, summation, body))


def work(scope: Scope, constants: frozenset[str] | set[str]) -> int:
    """Iteration points of ``scope`` and of the nested scopes it reads that read a tensor not
    in ``constants`` (scopes over constants only are folded at optimisation time)."""
    total = math.prod(it.size for it in scope.iters)
    for acc in accesses(scope.body):
        if isinstance(acc.source, Scope) and tensor_names(acc.source) - constants:
            total += work(acc.source, constants)
    return total


def _factors(node: Node) -> list[Node]:
    """The factors of a product (through negations); ``[node]`` when it is no product."""
    if isinstance(node, Neg):
        return _factors(node.x)
    if isinstance(node, BinOp) and node.op == "*":
        return _factors(node.lhs) + _factors(node.rhs)
    return [node]


def _check_annihilates(body: Node, relaxed: set[str], holes: set[str] | frozenset[str]
                       ) -> None:
    """Each relaxed iterator must index (as a plain iterator) a hole read that is a factor of
    the whole body, so that a point the relaxation adds reads 0 there and adds 0."""
    for v in relaxed:
        if not any(isinstance(f, Access) and isinstance(f.source, str) and f.source in holes
                   and any(ix.as_var() == v for ix in f.indices) for f in _factors(body)):
            raise ExprError(f"relaxation: {v} indexes no hole read that is a factor of the "
                            "body")


def _rename_iters(body: Node, names: Mapping[str, str]) -> Node:
    """``body`` with its iterators renamed in every read (nested scopes are closed)."""
    def fn(node: Node) -> Node | None:
        if isinstance(node, Access):
            return Access(node.source, tuple(ix.rename(names) for ix in node.indices))
        return None
    return map_body(body, fn)


class _Unifier:
    """Unifies the members' scopes, level by level (:func:`concat_merge`)."""

    def __init__(self, shapes: list[dict[str, tuple[int, ...]]],
                 holes: list[frozenset[str]], relax: bool) -> None:
        self.shapes, self.holes, self.relax = shapes, holes, relax
        self.relaxed: set[str] = set()
        self.n = len(shapes)

    def scope(self, scopes: Sequence[Scope], axis: int | None) -> Scope:
        """The merged scope of ``scopes``, concatenated along traversal ``axis`` (if any)."""
        s0 = scopes[0]
        if any(len(s.traversal) != len(s0.traversal) or len(s.summation) != len(s0.summation)
               for s in scopes):
            raise ExprError("concat merging: the scopes have different iterators")
        bodies = [_rename_iters(s.body, {a.name: b.name for a, b in zip(s.iters, s0.iters,
                                                                        strict=True)})
                  for s in scopes]
        shift: list[dict[str, int]] = [{} for _ in scopes]
        ranges: list[dict[str, tuple[int, int]]] = [{} for _ in scopes]
        trav = []
        for k, it0 in enumerate(s0.traversal):
            its = [s.traversal[k] for s in scopes]
            if k == axis:
                if any(it.lo != 0 for it in its):
                    raise ExprError("concat merging: the concatenated iterator must start at 0")
                off = 0
                for i, it in enumerate(its):
                    shift[i][it0.name], ranges[i][it0.name] = off, (off, off + it.size)
                    off += it.size
                trav.append(Iter(it0.name, 0, off))
            elif any(it.range != it0.range for it in its):
                raise ExprError("concat merging: a second traversal extent differs")
            else:
                trav.append(it0)
                for r in ranges:
                    r[it0.name] = it0.range
        self._summation_shifts(s0, scopes, bodies, shift)
        summation = []
        for k, it0 in enumerate(s0.summation):
            moved = [(s.summation[k].lo + shift[i].get(it0.name, 0),
                      s.summation[k].hi + shift[i].get(it0.name, 0))
                     for i, s in enumerate(scopes)]
            lo, hi = min(m[0] for m in moved), max(m[1] for m in moved)
            for i in range(self.n):  # the hull starts where member 0's range does
                shift[i][it0.name] = shift[i].get(it0.name, 0) + it0.lo - lo
                ranges[i][it0.name] = (moved[i][0] + it0.lo - lo, moved[i][1] + it0.lo - lo)
            hull = (it0.lo, it0.lo + hi - lo)
            summation.append(Iter(it0.name, *hull))
            if any(r[it0.name] != hull for r in ranges):
                if not self.relax:
                    raise ExprError("concat merging: summation ranges differ (relaxation off)")
                _check_annihilates(bodies[0], {it0.name}, self.holes[0])
                self.relaxed.add(it0.name)
        for i in range(self.n):
            shift[i] = {k: v for k, v in shift[i].items() if v}
        template = {it.name: it.range for it in (*trav, *summation)}
        body = self.node(bodies, shift, ranges, template)
        return Scope(tuple(trav), tuple(summation), body)

    def _summation_shifts(self, s0: Scope, scopes: Sequence[Scope], bodies: list[Node],
                          shift: list[dict[str, int]]) -> None:
        """Per member, the shift of each summation iterator that makes its reads of shared
        tensors index like member 0's (``v -> v - shift``), from the index positions holding
        exactly one summation iterator."""
        names = {it.name for it in s0.summation}
        reads0 = self._shared_reads(bodies[0], 0)
        for i in range(1, self.n):
            reads = self._shared_reads(bodies[i], i)
            if len(reads) != len(reads0):
                raise ExprError("concat merging: the members read the shared tensors "
                                "differently")
            for a0, a in zip(reads0, reads, strict=True):
                if a0.source != a.source or len(a0.indices) != len(a.indices):
                    raise ExprError("concat merging: the members read other shared tensors")
                for ix0, ix in zip(a0.indices, a.indices, strict=True):
                    diff = ix - ix0
                    used = [v for v in ix0.vars() & names if ix0.is_linear]
                    if not diff.is_const or len(used) != 1 or not diff.const:
                        continue
                    v = used[0]
                    coef = ix0.coef(v)
                    if not coef or diff.const % coef:
                        continue
                    d = diff.const // coef
                    if shift[i].setdefault(v, d) != d:
                        raise ExprError(f"concat merging: no one shift of {v} aligns the "
                                        "shared reads")

    def _shared_reads(self, body: Node, i: int) -> list[Access]:
        return [a for a in accesses(body)
                if isinstance(a.source, str) and a.source not in self.holes[i]]

    def node(self, nodes: list[Node], shift: list[dict[str, int]],
             ranges: list[dict[str, tuple[int, int]]], template: dict[str, tuple[int, int]]
             ) -> Node:
        """The merged body of the members' ``nodes`` (matching structure)."""
        a = nodes[0]
        if any(type(b) is not type(a) for b in nodes):
            raise ExprError("concat merging: the members compute different functions")

        def each(get) -> Node:
            return self.node([get(b) for b in nodes], shift, ranges, template)

        if isinstance(a, Const):
            if any(b != a for b in nodes):
                raise ExprError("concat merging: the members use different literals")
            return a
        if isinstance(a, Neg):
            return neg(each(lambda b: b.x))
        if isinstance(a, BinOp):
            if any(b.op != a.op for b in nodes):  # type: ignore[union-attr]
                raise ExprError("concat merging: the members compute different functions")
            return BinOp(a.op, each(lambda b: b.lhs), each(lambda b: b.rhs))
        if isinstance(a, Call):
            if any(b.fn != a.fn for b in nodes):  # type: ignore[union-attr]
                raise ExprError("concat merging: the members compute different functions")
            return Call(a.fn, tuple(each(lambda b, k=k: b.args[k])
                                    for k in range(len(a.args))))
        assert isinstance(a, Access)
        reads: list[Access] = nodes  # type: ignore[assignment]
        if isinstance(a.source, Scope):
            return self._nested(reads, shift)
        is_hole = [isinstance(b.source, str) and b.source in self.holes[i]
                   for i, b in enumerate(reads)]
        if any(is_hole) != all(is_hole):
            raise ExprError("concat merging: a hole read in one member is shared in another")
        if all(is_hole):
            return self._hole(reads, shift, ranges, template)
        moved = [_moved(b.indices, shift[i]) for i, b in enumerate(reads)]
        if any(b.source != a.source for b in reads) or any(m != moved[0] for m in moved):
            raise ExprError("concat merging: the members read a shared tensor differently")
        return Access(a.source, moved[0])

    def _nested(self, reads: list[Access], shift: list[dict[str, int]]) -> Access:
        """A read of nested scopes: merged recursively, concatenated along the index position
        that holds the concatenated iterator (if any)."""
        if any(not isinstance(b.source, Scope) for b in reads):
            raise ExprError("concat merging: the members compute different functions")
        moved = [_moved(b.indices, shift[i]) for i, b in enumerate(reads)]
        cat = {v for s in shift for v in s}
        axis = None
        for k in range(len(reads[0].indices)):
            plain = {b.indices[k].as_var() for b in reads}
            if len(plain) == 1 and (v := plain.pop()) is not None and v in cat:
                if any(v in b.indices[q].vars() for b in reads
                       for q in range(len(b.indices)) if q != k) or axis is not None:
                    raise ExprError("concat merging: a shifted iterator indexes a nested "
                                    "scope twice")
                axis = k
                continue
            if any(m[k] != moved[0][k] for m in moved) or moved[0][k].vars() & cat:
                raise ExprError("concat merging: the members read a nested scope differently")
        if axis is not None and any(s.get(reads[0].indices[axis].as_var() or "", 0) != o
                                    for s, o in zip(shift, _offsets(reads, axis), strict=True)):
            raise ExprError("concat merging: a nested scope is not concatenated like its "
                            "reader")
        scope = self.scope([b.source for b in reads], axis)  # type: ignore[misc]
        idx = list(moved[0])
        if axis is not None:
            idx[axis] = reads[0].indices[axis]
        return Access(scope, tuple(idx))

    def _hole(self, reads: list[Access], shift: list[dict[str, int]],
              ranges: list[dict[str, tuple[int, int]]], template: dict[str, tuple[int, int]]
              ) -> Access:
        """A read of the members' hole tensors: a read of their concatenation ``S``."""
        rank = len(reads[0].indices)
        shapes = [self.shapes[i][str(b.source)] for i, b in enumerate(reads)]
        if any(len(b.indices) != rank for b in reads):
            raise ExprError("concat merging: the hole tensors have different ranks")
        changed = {v for v in template
                   if any(s.get(v, 0) for s in shift) or any(r.get(v) != template[v]
                                                             for r in ranges)}
        dims, at, plain_vars = [], [], []
        for k in range(rank):
            plain = {b.indices[k].as_var() for b in reads}
            v = plain.pop() if len(plain) == 1 else None
            if v is not None and v in changed:
                plain_vars.append(v)
                dims.append(Iter(f"d{k}", *template[v]))
                at.append(var(v))
                continue
            moved = [_moved(b.indices, shift[i])[k] for i, b in enumerate(reads)]
            if any(m != moved[0] for m in moved) or moved[0].vars() & changed or \
                    len({s[k] for s in shapes}) != 1:
                raise ExprError("concat merging: the members read their holes differently")
            dims.append(Iter(f"d{k}", 0, shapes[0][k]))
            at.append(moved[0])
        if len(set(plain_vars)) != len(plain_vars):
            raise ExprError("concat merging: a hole is indexed twice by one iterator")
        parts: Node | None = None
        for i, b in enumerate(reads):
            pdims, pidx = [], []
            for k, d in enumerate(dims):
                v = b.indices[k].as_var()
                if v is not None and v in changed:
                    s = shift[i].get(v, 0)
                    lo, hi = max(ranges[i][v][0], s), min(ranges[i][v][1], s + shapes[i][k])
                    pdims.append(Iter(d.name, lo, max(lo, hi)))
                    pidx.append(var(d.name) - s)
                else:
                    pdims.append(d)
                    pidx.append(var(d.name))
            if any(d.size == 0 for d in pdims):
                continue
            part = Access(Scope(tuple(pdims), (), Access(b.source, tuple(pidx))),
                          tuple(var(d.name) for d in dims))
            parts = part if parts is None else BinOp("+", parts, part)
        if parts is None:
            raise ExprError("concat merging: a hole is never read")
        return Access(Scope(tuple(dims), (), parts), tuple(at))


def _moved(indices: tuple[Affine, ...], shift: Mapping[str, int]) -> tuple[Affine, ...]:
    """``indices`` in the merged iterators' values (``v -> v - shift[v]``)."""
    if not shift:
        return indices
    sub = {v: var(v) - d for v, d in shift.items()}
    return tuple(ix.subst(sub) for ix in indices)


def _offsets(reads: list[Access], axis: int) -> list[int]:
    """Each member's offset along ``axis`` of a nested scope it reads (the sizes before)."""
    sizes = [b.source.traversal[axis].size for b in reads]  # type: ignore[union-attr]
    return [sum(sizes[:i]) for i in range(len(sizes))]


def _slice(merged: Expr, axis: int, offset: int, size: int) -> Expr:
    """``L<t..> merged[t.., t_axis + offset, t..]`` with ``t_axis`` over ``0:size``."""
    shape = merged.shape
    its = [Iter(f"t{k}", 0, size if k == axis else d) for k, d in enumerate(shape)]
    idx = tuple(var(it.name) + (offset if k == axis else 0) for k, it in enumerate(its))
    return Expr((("merged", tuple(shape)),), Scope(tuple(its), (), Access("merged", idx)))


__all__ = ["ConcatMerge", "concat_merge", "relax_expression", "work"]
