"""Inter-expression rules as a rule table on expression programs.

A program rule is a function ``rule(ep) -> list[DerivedProgram]`` returning every application
of the rule to the :class:`~ollie.ir.exprprogram.ExprProgram` ``ep``, each a verified program
with the same inputs and outputs (names, shapes and values: the oracle is
:func:`ollie.semantics.program.interpret_program`). Rules are registered once by their paper
name in :data:`PROGRAM_RULES`; a rule that does not apply returns ``[]`` and never raises on a
well-formed program. They build on the single-expression rules of :mod:`ollie.rules.inter`:

* ``expression_fusion``: a def is inlined into every def reading it (its reads replaced by its
  scope); the def is dropped unless it is an output. Inlining a def without any ``Sum`` (a
  layout or element-wise def) is exact and always wanted: :func:`normalize_program` does all
  of those. Inlining a def with a ``Sum`` (compute into compute) is a choice: the rule
  proposes one program per def that has readers.
* ``expression_splitting``: the largest def (traversal points times summation points) is cut
  at the midpoint of its first traversal iterator of size >= 2 into two defs, and a def
  keeping its name concatenates them (a sum of two zero-padded reads, exact). One proposal
  per program, to keep the branching small.
* ``expression_merging``: defs that are renamed twins (equal fingerprints once every tensor
  they read is renamed to a placeholder in order of first read, the key
  :mod:`ollie.graph.siblings` uses for nodes) and mutually independent are merged by
  :func:`ollie.rules.inter.merge_expressions` (stack mode, ``g_at`` ``"inner"`` then ``0``);
  the merged def is followed by slice defs keeping the members' names, so readers do not
  change. At most :data:`MAX_MERGE_GROUPS` groups (largest first) of at most
  :data:`MAX_GROUP` members each. Its *sum* mode (:mod:`ollie.rules.inter_sum`) merges the
  contractions a def adds (GCN's ``left2 + right2``) into one over a concatenated reduction;
  a merge exact only for finite inputs is proposed only inside
  :func:`~ollie.rules.base.assume_finite_inputs`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from math import prod

from ollie.errors import ExprError
from ollie.fingerprint import fingerprint, program_fingerprint
from ollie.ir import (
    Access,
    BinOp,
    Call,
    Expr,
    Node,
    Scope,
    accesses,
    children,
    rename_expr,
    tensor_names,
    var,
)
from ollie.ir.exprprogram import ExprProgram
from ollie.ir.nodes import FUNC_ARITY
from ollie.rules.base import fresh_name
from ollie.rules.inter import expression_fusion, expression_splitting, merge_expressions
from ollie.rules.inter_sum import sum_rewrites

MAX_GROUP = 8
"""Most members merged into one def (larger twin sets are cut in program order)."""

MAX_MERGE_GROUPS = 3
"""Most twin groups ``expression_merging`` proposes per program (the largest first)."""

MAX_FUSED_NODES = 4096
"""Most body nodes (nested scopes' included) of a def made by inlining: inlining a def read
``r`` times multiplies its size by ``r``, so chains of such defs would grow exponentially.
A fusion beyond it is not done (normalisation keeps the def);
docs/design/025-program-text.md."""

MAX_FUSED_DEPTH = 60
"""Deepest def made by inlining, in levels (a nested scope or call counts two, any other node
one), well within the parser's ``MAX_DEPTH`` so the printed program parses again and the
later stages' recursion stays bounded."""

RESERVED = frozenset({"L", "Sum", *FUNC_ARITY})
"""Names of the expression syntax no tensor may take (new def names avoid them)."""


@dataclass(frozen=True, slots=True)
class DerivedProgram:
    """One application of a program rule: the derived program and what was done."""

    program: ExprProgram
    rule: str
    note: str


ProgramRule = Callable[[ExprProgram], list[DerivedProgram]]
PROGRAM_RULES: dict[str, ProgramRule] = {}


def register_program_rule(name: str) -> Callable[[ProgramRule], ProgramRule]:
    """Register a program rule under its paper name."""

    def deco(fn: ProgramRule) -> ProgramRule:
        if name in PROGRAM_RULES:
            raise ValueError(f"program rule {name!r} registered twice")
        PROGRAM_RULES[name] = fn
        return fn

    return deco


def apply_program_rules(ep: ExprProgram, names: tuple[str, ...] | None = None
                        ) -> list[DerivedProgram]:
    """One step: every application of the rules ``names`` (default: all, in registration
    order) to ``ep``, without duplicates (by :func:`~ollie.fingerprint.program_fingerprint`,
    the original's included)."""
    seen = {program_fingerprint(ep)}
    out = []
    for name in names or tuple(PROGRAM_RULES):
        for d in PROGRAM_RULES[name](ep):
            key = program_fingerprint(d.program)
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out


# --------------------------------------------------------------------- program plumbing
def _rebuild(ep: ExprProgram, defs: list[tuple[str, Expr]],
             rank: dict[str, float] | None = None) -> ExprProgram:
    """A verified program over ``ep``'s inputs and outputs with ``defs`` in a topological
    order (stable: by ``rank``, then by position), dead defs dropped, declarations tidied."""
    by_name = dict(defs)
    live: set[str] = set()
    stack = [o for o in ep.outputs]
    while stack:
        n = stack.pop()
        if n in by_name and n not in live:
            live.add(n)
            stack.extend(tensor_names(by_name[n].root))
    kept = [(n, e) for n, e in defs if n in live]
    pos = {n: (rank or {}).get(n, float(k)) for k, (n, _) in enumerate(kept)}
    deps = {n: tensor_names(e.root) & live for n, e in kept}
    waiting = {n: len(d) for n, d in deps.items()}
    users: dict[str, list[str]] = {n: [] for n in deps}
    for n, d in deps.items():
        for m in d:
            users[m].append(n)
    ready = [(pos[n], n) for n, c in waiting.items() if c == 0]
    heapq.heapify(ready)
    ordered: list[tuple[str, Expr]] = []
    while ready:
        _, n = heapq.heappop(ready)
        ordered.append((n, by_name[n]))
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (pos[u], u))
    if len(ordered) != len(kept):
        raise ExprError("expression program: the defs read each other in a cycle")
    out = ExprProgram(ep.inputs, tuple(ordered), ep.outputs).tidy()
    out.verify()
    return out


def has_sum(scope: Scope) -> bool:
    """Whether ``scope`` or a scope it reads sums over an iterator."""
    return bool(scope.summation) or any(has_sum(a.source) for a in accesses(scope.body)
                                        if isinstance(a.source, Scope))


def _deps(ep: ExprProgram) -> dict[str, set[str]]:
    """For every def, the defs it reads directly or through other defs."""
    out: dict[str, set[str]] = {}
    for name, expr in ep.defs:
        direct = {d for d in tensor_names(expr.root) if d in out}
        out[name] = direct.union(*(out[d] for d in direct))
    return out


def _size(node: Node, limit: int) -> tuple[int, int]:
    """(nodes, depth) of a body, nested scopes included; counting stops past ``limit``
    nodes."""
    if isinstance(node, Access):
        if not isinstance(node.source, Scope):
            return 1, 1
        n, d = _size(node.source.body, limit)
        return n + 1, d + 2
    n, d = 1, 0
    for child in children(node):
        cn, cd = _size(child, limit - n)
        n, d = n + cn, max(d, cd)
        if n > limit:
            break
    return n, d + (2 if isinstance(node, Call) else 1)


def inline_def(ep: ExprProgram, name: str) -> ExprProgram:
    """``ep`` with def ``name`` inlined into every def reading it (the chain rule,
    :func:`ollie.rules.inter.expression_fusion`) and dropped unless it is an output. Raises
    :class:`~ollie.errors.ExprError` when a fused def would exceed :data:`MAX_FUSED_NODES`
    or :data:`MAX_FUSED_DEPTH`."""
    producer = dict(ep.defs)[name]
    defs = []
    for n, e in ep.defs:
        if n != name and name in tensor_names(e.root):
            e = expression_fusion(e, name, producer)
            nodes, depth = _size(e.root.body, MAX_FUSED_NODES)
            if nodes > MAX_FUSED_NODES or depth > MAX_FUSED_DEPTH:
                raise ExprError(f"expression fusion: inlining {name} into {n} makes it too "
                                f"large ({nodes} nodes, depth {depth})")
        defs.append((n, e))
    return _rebuild(ep, defs)


def normalize_program(ep: ExprProgram) -> ExprProgram:
    """``ep`` with every def without a ``Sum`` (layout and element-wise defs) inlined into its
    readers, in program order, and dropped unless it is an output (exact: every value is
    computed by the same arithmetic). An output def stays, but its readers still inline it.
    A def whose inlining would exceed :data:`MAX_FUSED_NODES` or :data:`MAX_FUSED_DEPTH`
    stays too."""
    for name, _ in ep.defs:
        expr = dict(ep.defs).get(name)
        if expr is not None and not has_sum(expr.root) and ep.readers().get(name):
            try:
                ep = inline_def(ep, name)
            except ExprError:
                continue  # too large once inlined: the def stays
    return ep


# --------------------------------------------------------------------- fusion
@register_program_rule("expression_fusion")
def program_fusion(ep: ExprProgram) -> list[DerivedProgram]:
    """One program per def with readers: the def inlined into all of them."""
    out = []
    readers = ep.readers()
    for name, expr in ep.defs:
        if not readers.get(name):
            continue
        kind = "compute into compute" if has_sum(expr.root) else "exact: no Sum"
        try:
            derived = inline_def(ep, name)
        except ExprError:
            continue
        out.append(DerivedProgram(derived, "expression_fusion",
                                  f"inline {name} into {', '.join(readers[name])} ({kind})"))
    return out


# --------------------------------------------------------------------- splitting
def _points(expr: Expr) -> int:
    return prod(it.size for it in expr.root.iters)


@register_program_rule("expression_splitting")
def program_splitting(ep: ExprProgram) -> list[DerivedProgram]:
    """The largest def cut at the midpoint of its first traversal iterator of size >= 2 into
    ``NAME_lo`` and ``NAME_hi``; ``NAME`` becomes their concatenation."""
    if not ep.defs:
        return []
    name, expr = max(ep.defs, key=lambda d: _points(d[1]))
    root = expr.root
    dim = next((k for k, it in enumerate(root.traversal) if it.size >= 2), None)
    if dim is None:
        return []
    it = root.traversal[dim]
    at = it.lo + it.size // 2
    try:
        lo_part, hi_part = expression_splitting(expr, dim, at)
    except ExprError:
        return []
    taken = set(ep.shapes()) | RESERVED
    lo_name, hi_name = fresh_name(f"{name}_lo", taken), fresh_name(f"{name}_hi", taken)
    reads = []
    for part, start in ((lo_name, it.lo), (hi_name, at)):
        idx = tuple(var(t.name) - (start if k == dim else t.lo)
                    for k, t in enumerate(root.traversal))
        reads.append(Access(part, idx))
    concat = Expr(((lo_name, lo_part.shape), (hi_name, hi_part.shape)),
                  Scope(root.traversal, (), BinOp("+", reads[0], reads[1])))
    defs: list[tuple[str, Expr]] = []
    for n, e in ep.defs:
        defs += [(lo_name, lo_part), (hi_name, hi_part), (n, concat)] if n == name else [(n, e)]
    note = f"split {name} along {it.name} at {at}: {lo_name}, {hi_name}, concatenated"
    try:
        return [DerivedProgram(_rebuild(ep, defs), "expression_splitting", note)]
    except ExprError:
        return []


# --------------------------------------------------------------------- merging
def _read_order(scope: Scope) -> Iterator[str]:
    """Tensor names in order of reading (depth first, nested scopes where they are read)."""
    for acc in accesses(scope.body):
        if isinstance(acc.source, Scope):
            yield from _read_order(acc.source)
        else:
            yield acc.source


def _operands(expr: Expr) -> list[str]:
    return list(dict.fromkeys(_read_order(expr.root)))


def _twin_key(expr: Expr) -> str:
    """The fingerprint of ``expr`` with the tensors it reads renamed ``#t0, #t1, ...`` in
    order of first read (names no tensor can have)."""
    ops = _operands(expr)
    names = {n: f"#t{i}" for i, n in enumerate(ops)}
    shapes = expr.inputs
    return fingerprint(Expr(tuple((names[n], shapes[n]) for n in ops),
                            rename_expr(expr, names).root))


def _twin_groups(ep: ExprProgram) -> list[list[str]]:
    """Groups (2..:data:`MAX_GROUP` defs, program order) of mutually independent renamed
    twins, largest def first, at most :data:`MAX_MERGE_GROUPS`."""
    deps = _deps(ep)
    buckets: dict[str, list[str]] = {}
    for name, expr in ep.defs:
        if _operands(expr):
            buckets.setdefault(_twin_key(expr), []).append(name)
    groups: list[list[str]] = []
    for members in buckets.values():
        parts: list[list[str]] = []
        for m in members:
            home = next((g for g in parts if len(g) < MAX_GROUP and
                         all(m not in deps[o] and o not in deps[m] for o in g)), None)
            if home is None:
                parts.append([m])
            else:
                home.append(m)
        groups += [g for g in parts if len(g) >= 2]
    size = {n: _points(e) for n, e in ep.defs}
    groups.sort(key=lambda g: -sum(size[n] for n in g))
    return groups[:MAX_MERGE_GROUPS]


def merge_group(ep: ExprProgram, members: list[str], g_at: int | str
                ) -> tuple[ExprProgram, str] | None:
    """``ep`` with the twin defs ``members`` merged (``g_at`` as in
    :func:`~ollie.rules.inter.merge_expressions`) into one def followed by slice defs keeping
    the members' names, and the merged def's name; None when they do not merge (not twins,
    no operand differs, or an operand that differs is read inside a nested scope). Each
    member after the first is replaced by the first with its operands renamed, so twins
    written differently (iterator names, operand order of ``+``/``*``) merge too."""
    defs = dict(ep.defs)
    first = defs[members[0]]
    ops = [_operands(defs[m]) for m in members]
    if len({len(o) for o in ops}) != 1 or len({_twin_key(defs[m]) for m in members}) != 1:
        return None
    # equal keys: member i computes what the first computes on its own operands (equal
    # canonical forms mean equivalent expressions), written exactly like the first
    exprs = [first] + [rename_expr(first, dict(zip(ops[0], o, strict=True))) for o in ops[1:]]
    differ = [j for j in range(len(ops[0])) if len({o[j] for o in ops}) > 1]
    if not differ:
        return None
    holes = [tuple(o[j] for j in differ) for o in ops]
    try:
        merged, slices = merge_expressions(exprs, holes, g_at)  # type: ignore[arg-type]
    except ExprError:
        return None
    taken = set(ep.shapes()) | RESERVED
    base = "_".join(members) if len("_".join(members)) <= 32 else f"{members[0]}_merged"
    mname = fresh_name(base, taken)
    rank = {n: float(k) for k, (n, _) in enumerate(ep.defs)}
    rank[mname] = min(rank[m] for m in members) - 0.5
    new = [(mname, merged)]
    sl = dict(zip(members, slices, strict=True))
    new += [(n, rename_expr(sl[n], {"merged": mname}) if n in sl else e) for n, e in ep.defs]
    try:
        return _rebuild(ep, new, rank), mname
    except ExprError:
        return None


@register_program_rule("expression_merging")
def program_merging(ep: ExprProgram) -> list[DerivedProgram]:
    """Per twin group, the program with the group merged, ``g`` inner and leading; then
    every sum merge (:func:`~ollie.rules.inter_sum.sum_rewrites`)."""
    out = []
    for sr in sum_rewrites(ep, set(ep.shapes()) | RESERVED):
        try:
            out.append(DerivedProgram(_rebuild(ep, sr.defs), "expression_merging", sr.note))
        except ExprError:
            continue
    for members in _twin_groups(ep):
        seen = set()
        for g_at in ("inner", 0):
            res = merge_group(ep, members, g_at)
            if res is None:
                continue
            derived, mname = res
            key = program_fingerprint(derived)
            if key in seen:
                continue
            seen.add(key)
            note = (f"merge {', '.join(members)} into {mname} (stack, g_at={g_at}); "
                    "slices keep their names")
            out.append(DerivedProgram(derived, "expression_merging", note))
    return out


__all__ = ["MAX_GROUP", "MAX_MERGE_GROUPS", "PROGRAM_RULES", "DerivedProgram", "ProgramRule",
           "apply_program_rules", "has_sum", "inline_def", "merge_group", "normalize_program",
           "register_program_rule"]
