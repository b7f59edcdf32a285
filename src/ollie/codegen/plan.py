"""Lowering an eOp expression to a sequence of loop nests over flat buffers.

Every tensor a generated kernel touches is a :class:`Buffer`: a declared input, a temporary
holding a materialised nested scope, or the output. A buffer is read by iterator value like a
scope: position ``v`` of dimension ``d`` is element ``v - offsets[d]``, and values outside
``[offsets[d], offsets[d] + shape[d])`` read 0 (inputs have offsets 0, temporaries the ``lo`` of
their scope's traversal iterators).

:func:`make_plan` rewrites the root scope so that every read names a buffer:

* a nested scope without summation whose reads stay inside its ranges (checked with
  :meth:`~ollie.ir.index.Affine.bounds` over the reading scope's iterator ranges) is *inlined*:
  its body is substituted at the read, its traversal iterators replaced by the read's indices
  (exact, since a scope is closed and every read is in range). A read that may leave the
  scope's range along some iterator is inlined too when the scope is a single (scaled) read of
  a buffer that is then out of its bounds as well, so the inlined read gives the same 0 (a
  re-indexing scope over padding, e.g. ``{L<t=2:226> C[t - 2]}[h + r]``). Inlining is skipped
  when it would recompute an expensive body many times per element (see :func:`_worth_inlining`),
  and where the read is a factor of a product (or a numerator) and the body may be a structural
  zero inside the scope's ranges: an element of a scope is an ordinary value, a structural zero
  of the inlined body would annihilate the product (:mod:`ollie.ir.structural`);
* a summation iterator of a single value is replaced by that value first;
* a scope whose body is one read of a nested scope with summation takes over the nested sum
  (:meth:`_Planner._merged`: ``Sum_x {Sum_y g}[idx] = Sum_x Sum_y g(idx, y)``) where that is
  exact and does no more work;
* any other nested scope is *materialised*: a loop nest (the same code generator) computes it
  into a float32 temporary before the nests that read it. Equal scopes are computed once.

A root scope that only copies one materialised temporary, or applies a unary function to it (no
summation, the read indexed by its own traversal iterators, the temporary's ranges equal to the
output's: ``f({L<...> Sum<...> ...}[i, j])``, an activation after a selective add), is not a
nest of its own: the nest computing the temporary writes the output, applying ``f`` to each
value as it stores it (:func:`_forward`; one pass over the output less, measured:
docs/design/020-codegen-measurements.md).

The nests come out in execution order; the last one writes the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ollie.ir import Access, Affine, Expr, Node, Scope, children, map_body, tensor_names, var
from ollie.ir.nodes import BinOp, Call, Const, Iter, Neg, accesses
from ollie.ir.structural import annihilating_reads, may_be_structural

POST_FUNCTIONS = ("relu", "tanh", "sigmoid", "exp", "log", "sqrt", "abs")
"""Unary functions a root scope may apply to the temporary it copies (:func:`_forward`)."""

INLINE_MAX_OPS = 4
"""A nested scope whose body has at most this many operations is always inlined when its reads
are in range; a costlier one only when it is read at most twice per element on average."""


@dataclass(frozen=True, slots=True)
class Buffer:
    """A flat float32 array of the generated code (identifier ``ident``)."""

    ident: str
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    input_name: str | None = None

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major element strides."""
        out = []
        acc = 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))


@dataclass(frozen=True, slots=True)
class Nest:
    """One loop nest: computes ``scope`` (whose reads name buffer identifiers) into ``target``."""

    scope: Scope
    target: Buffer
    out_index: tuple[Affine, ...] | None = None
    """The output element each point writes, by target dimension; ``None``: the traversal
    iterators in order (residue nests, :mod:`ollie.codegen.residue`, write strided subsets)."""
    outer: tuple[str, ...] = ()
    """Iterators looped outermost, in this order, by one function shared by consecutive nests
    with the same non-empty ``outer`` (the residue nests of one nest)."""
    post: str | None = None
    """A unary function (:data:`POST_FUNCTIONS`) applied to each computed value as it is
    stored: the root's ``f(tmp[i...])`` folded into the nest computing ``tmp``."""

    def out_indices(self) -> tuple[Affine, ...]:
        """:attr:`out_index`, or the traversal iterators."""
        if self.out_index is not None:
            return self.out_index
        return tuple(var(it.name) for it in self.scope.traversal)


@dataclass(frozen=True, slots=True)
class Plan:
    """Buffers and loop nests of one eOperator."""

    inputs: tuple[Buffer, ...]
    temps: tuple[Buffer, ...]
    nests: tuple[Nest, ...]
    output: Buffer
    inlined: int = 0
    """How many nested-scope reads were inlined."""

    @property
    def buffers(self) -> dict[str, Buffer]:
        return {b.ident: b for b in (*self.inputs, *self.temps, self.output)}


def _ops(node: Node) -> int:
    own = 1 if isinstance(node, (BinOp, Neg, Call)) else 0
    return own + sum(_ops(c) for c in children(node))


def _single_read(body: Node) -> Access | None:
    """The read if ``body`` is one read, negated or scaled by constants (zero when it is)."""
    if isinstance(body, Access):
        return body
    if isinstance(body, Neg):
        return _single_read(body.x)
    if isinstance(body, BinOp) and body.op == "*":
        if isinstance(body.lhs, Const):
            return _single_read(body.rhs)
        if isinstance(body.rhs, Const):
            return _single_read(body.lhs)
    return None


def _implied_by_read(read: Access, buf: Buffer, it: Iter) -> bool:
    """Whether ``read`` (of ``buf``) is out of bounds whenever ``it`` is outside its range:
    some dimension is indexed by ``it`` alone, and its in-bounds values lie inside the range."""
    for idx, size, origin in zip(read.indices, buf.shape, buf.offsets, strict=True):
        if not idx.is_linear or idx.vars() != {it.name}:
            continue
        a, c = idx.coef(it.name), idx.const
        lo_q, hi_q = origin - c, origin + size - 1 - c  # a*v in [lo_q, hi_q]
        lo, hi = (-(-lo_q // a), hi_q // a) if a > 0 else (-(-hi_q // a), lo_q // a)
        if lo >= it.lo and hi <= it.hi - 1:
            return True
    return False


def _inlinable(acc: Access, inner: Scope, reader: Scope, buffers: dict[str, Buffer]) -> bool:
    """Reads of ``inner`` stay in its ranges, or, where they may leave them, ``inner`` is one
    read of a buffer that is then out of bounds too (so the inlined body reads 0 there, as
    the scope would)."""
    ranges = reader.ranges
    read = _single_read(inner.body)
    buf = buffers.get(read.source) if read is not None and isinstance(read.source, str) \
        else None
    for idx, it in zip(acc.indices, inner.traversal, strict=True):
        lo, hi = idx.bounds(ranges)
        if lo >= it.lo and hi <= it.hi - 1:
            continue
        if read is None or buf is None or not _implied_by_read(read, buf, it):
            return False
    return True


def _worth_inlining(inner: Scope, reader: Scope) -> bool:
    if _ops(inner.body) <= INLINE_MAX_OPS:
        return True
    points = prod(it.size for it in reader.iters)
    return points <= 2 * prod(inner.shape)


class _Planner:
    def __init__(self, expr: Expr) -> None:
        declared = expr.inputs
        names = sorted(tensor_names(expr.root))
        self.inputs = {
            name: Buffer(f"in_{k}", tuple(declared[name]), (0,) * len(declared[name]), name)
            for k, name in enumerate(names)
        }
        self.temps: dict[Scope, Buffer] = {}
        self.nests: list[Nest] = []
        self.rewritten: dict[Scope, Scope] = {}
        self.inlined = 0

    def rewrite(self, scope: Scope) -> Scope:
        """``scope`` with every read naming a buffer (nested scopes inlined or materialised)
        and no summation iterator of a single value (:func:`_without_unit_sums`)."""
        done = self.rewritten.get(scope)
        if done is not None:
            return done
        original, scope = scope, _without_unit_sums(scope)
        merged = self._merged(scope)
        if merged is not None:
            self.rewritten[original] = merged
            return merged

        factors = {acc for acc, live in annihilating_reads(scope.body) if live}

        def visit(node: Node) -> Node | None:
            return self._access(node, scope, node in factors) if isinstance(node, Access) \
                else None

        out = Scope(scope.traversal, scope.summation, map_body(scope.body, visit))
        self.rewritten[original] = out
        return out

    def _merged(self, scope: Scope) -> Scope | None:
        """``scope`` (its reads naming buffers) with its body's one read of a nested scope
        ``{L<t...> Sum<y...> g}[idx]`` replaced by ``g`` at ``t = idx`` and its summation
        iterators added to ``scope``'s (renamed apart): ``Sum_x {Sum_y g}[idx(x)] = Sum_x
        Sum_y g(idx(x), y)`` where every read is in range or ``g`` is then a read out of
        bounds too (:func:`_inlinable`), and ``scope`` reads each element of the nested scope
        at most twice on average (:func:`_effective_points`; a selective add after a
        re-layout: one nest instead of two, no temporary). None when it does not apply."""
        acc = scope.body
        if not isinstance(acc, Access) or not isinstance(acc.source, Scope) or \
                not acc.source.summation:
            return None
        inner = self.rewrite(acc.source)
        buffers = {b.ident: b for b in (*self.inputs.values(), *self.temps.values())}
        if not inner.summation or not _inlinable(acc, inner, scope, buffers) or \
                _effective_points(scope, acc, inner) > 2 * prod(inner.shape):
            return None
        taken = {it.name for it in scope.iters} | {it.name for it in inner.iters}
        renamed = []
        for it in inner.summation:
            name = it.name
            while name in taken:
                name += "_"
            taken.add(name)
            renamed.append(Iter(name, it.lo, it.hi))
        sub = {it.name: idx for it, idx in zip(inner.traversal, acc.indices, strict=True)}
        sub |= {it.name: var(new.name) for it, new in zip(inner.summation, renamed,
                                                           strict=True)}

        def visit(node: Node) -> Node | None:
            if isinstance(node, Access):
                return Access(node.source, tuple(i.subst(sub) for i in node.indices))
            return None

        self.inlined += 1
        return Scope(scope.traversal, (*scope.summation, *renamed),
                     map_body(inner.body, visit))

    def _access(self, acc: Access, reader: Scope, factor: bool) -> Node:
        """``acc`` naming a buffer, or the body of its scope inlined; ``factor``: a structural
        zero of the read can annihilate a product (:func:`~ollie.ir.structural.
        annihilating_reads`), so a body that may itself be one is not inlined (the scope's
        elements are ordinary values, its inlined body's structural zeros would annihilate)."""
        if isinstance(acc.source, str):
            return Access(self.inputs[acc.source].ident, acc.indices)
        inner = self.rewrite(acc.source)
        buffers = {b.ident: b for b in (*self.inputs.values(), *self.temps.values())}

        def extents(read: Access) -> list[tuple[int, int]]:
            buf = buffers[read.source]  # type: ignore[index]
            return [(o, o + n) for o, n in zip(buf.offsets, buf.shape, strict=True)]

        if not inner.summation and _inlinable(acc, inner, reader, buffers) \
                and _worth_inlining(inner, reader) \
                and not (factor and may_be_structural(inner.body, inner.ranges, extents)):
            self.inlined += 1
            return _inline(inner, acc)
        buf = self.temps.get(inner)
        if buf is None:
            buf = Buffer(f"tmp_{len(self.temps)}", inner.shape,
                         tuple(it.lo for it in inner.traversal))
            self.temps[inner] = buf
            self.nests.append(Nest(inner, buf))
        return Access(buf.ident, acc.indices)


def _effective_points(reader: Scope, acc: Access, inner: Scope) -> int:
    """Points of ``reader`` whose read ``acc`` of ``inner`` can be in range: each summation
    iterator counts at most the values that keep some index it appears in (linearly, with
    coefficient ``a``) inside ``inner``'s range of that dimension (``ceil(size / |a|)``: the
    generated loops clamp or mask the rest)."""
    points = prod(it.size for it in reader.traversal)
    for it in reader.summation:
        trips = it.size
        for idx, dim in zip(acc.indices, inner.traversal, strict=True):
            a = idx.coef(it.name) if idx.is_linear else 0
            if a:
                trips = min(trips, -(-dim.size // abs(a)))
        points *= trips
    return points


def _without_unit_sums(scope: Scope) -> Scope:
    """``scope`` with each summation iterator of one value replaced by that value in its own
    reads (a sum of one term is the term): DCGAN's first eOperator, ``relu({L<n, c, h, w>
    Sum<y=0:1, x=0:1> M[n, c, h - y, w - x, y, x]}[n, c, h, w])``, then inlines to an
    element-wise loop."""
    unit = {it.name: it.lo for it in scope.summation if it.size == 1}
    if not unit:
        return scope

    def visit(node: Node) -> Node | None:
        if isinstance(node, Access):
            return Access(node.source, tuple(i.subst(unit) for i in node.indices))
        return None

    return Scope(scope.traversal, tuple(it for it in scope.summation if it.name not in unit),
                 map_body(scope.body, visit))


def _inline(inner: Scope, acc: Access) -> Node:
    """The body of ``inner`` (no summation) evaluated at the read's indices."""
    sub = {it.name: idx for it, idx in zip(inner.traversal, acc.indices, strict=True)}

    def visit(node: Node) -> Node | None:
        if isinstance(node, Access):
            return Access(node.source, tuple(i.subst(sub) for i in node.indices))
        return None

    return map_body(inner.body, visit)


def residue_groups(nests: tuple[Nest, ...] | list[Nest]) -> list[tuple[int, int]]:
    """``[start, stop)`` index ranges of ``nests`` emitted as one function each: consecutive
    nests with the same non-empty :attr:`Nest.outer` (the residue nests of one nest), or one
    nest alone."""
    ranges = []
    k = 0
    while k < len(nests):
        j = k + 1
        outer = nests[k].outer
        while outer and j < len(nests) and nests[j].outer == outer:
            j += 1
        ranges.append((k, j))
        k = j
    return ranges


def make_plan(expr: Expr) -> Plan:
    """The loop nests computing ``expr`` (see the module docstring)."""
    planner = _Planner(expr)
    root = planner.rewrite(expr.root)
    output = Buffer("out", expr.root.shape, tuple(it.lo for it in expr.root.traversal))
    temps = tuple(planner.temps.values())
    nests = (*planner.nests, Nest(root, output))
    forwarded = _forward(root, planner.nests, temps, output)
    if forwarded is not None:
        temps, nests = forwarded
    return Plan(tuple(planner.inputs.values()), temps, nests, output, planner.inlined)


def _forward(root: Scope, nests: list[Nest], temps: tuple[Buffer, ...], output: Buffer
             ) -> tuple[tuple[Buffer, ...], tuple[Nest, ...]] | None:
    """Temporaries and nests with the temporary ``root`` copies (or applies a function of
    :data:`POST_FUNCTIONS` to) written by its own nest into ``output`` (moved last: no later
    nest reads it), or None when ``root`` is not such a copy or another nest reads the
    temporary."""
    body, post = root.body, None
    if isinstance(body, Call) and body.fn in POST_FUNCTIONS and len(body.args) == 1:
        body, post = body.args[0], body.fn
    if root.summation or not isinstance(body, Access) or not isinstance(body.source, str):
        return None
    if body.indices != tuple(var(it.name) for it in root.traversal):
        return None
    target = next((b for b in temps if b.ident == body.source), None)
    if target is None or (target.shape, target.offsets) != (output.shape, output.offsets):
        return None
    own = [n for n in nests if n.target == target]
    if len(own) != 1 or own[0].post is not None or any(a.source == target.ident for n in nests
                            for a in accesses(n.scope.body)):
        return None
    rest = tuple(n for n in nests if n is not own[0])
    return (tuple(b for b in temps if b is not target),
            (*rest, Nest(own[0].scope, output, own[0].out_index, own[0].outer, post)))
