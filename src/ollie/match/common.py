"""Helpers shared by the matchers: issue builders (iterator groups an operator has no place
for, groups with a wrong number of iterators, dimensions that mix groups) and the pinning of
size-1 iterators that sit in a group the operator has no place for (they are constants)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ollie.ir import Access, Node, Scope, map_body
from ollie.ir.printer import format_index
from ollie.match.result import GROUP, MIXED, SUBSTITUTION, SUM_SPLIT, Issue
from ollie.match.table import GROUP_ORDER, DimInfo, IterTable, build_table

_PLACE_WORDS = {"X": "the first read", "Y": "the second read", "O": "the output"}


def describe_group(label: str) -> str:
    if label == "-":
        return "no tensor and not the output"
    return " and ".join(_PLACE_WORDS[p] for p in label)


def pin_unit_iterators(table: IterTable, allowed: Iterable[str]) -> IterTable:
    """The table of the scope with every size-1 iterator of a group not in ``allowed`` replaced
    by its value in the body (and dropped from the summation): such iterators are constants,
    a size-1 output dimension stays and is ignored by the layouts."""
    ok = set(allowed)
    pins = {it.name: it.lo for it in table.scope.iters
            if it.size == 1 and table.label(it.name) not in ok and table.label(it.name) != "O"}
    if not pins:
        return table
    scope = table.scope

    def pin(node: Node) -> Node | None:
        if isinstance(node, Access):
            return Access(node.source, tuple(i.subst(pins) for i in node.indices))
        return None

    summation = tuple(it for it in scope.summation if it.name not in pins)
    new = Scope(scope.traversal, summation, map_body(scope.body, pin))
    got = build_table(new, {table.x.name: table.x.shape, table.y.name: table.y.shape})
    assert isinstance(got, IterTable)
    return got


def foreign_groups(table: IterTable, op: str, allowed: Iterable[str]) -> list[Issue]:
    """One GROUP issue per group that ``op`` has no place for and that holds an iterator of
    size > 1 (size-1 iterators are pinned by :func:`pin_unit_iterators`)."""
    ok = set(allowed)
    out = []
    for label in GROUP_ORDER:
        its = tuple(n for n in table.group(label) if table.size(n) > 1)
        if not its or label in ok:
            continue
        summed = [n for n in its if "O" not in table.places[n]]
        hint = SUM_SPLIT if summed else SUBSTITUTION
        out.append(Issue(GROUP, f"{op} has no iterator group {label} (appearing in "
                                f"{describe_group(label)}), which holds {', '.join(its)}: "
                                f"too many iterators there", group=label, iterators=its,
                         expected=0, actual=len(its), hint=hint))
    return out


def count_issue(op: str, role: str, label: str, its: tuple[str, ...], lo: int, hi: int
                ) -> Issue | None:
    """A GROUP issue when group ``label`` (the operator's ``role``) holds fewer than ``lo`` or
    more than ``hi`` iterators."""
    if lo <= len(its) <= hi:
        return None
    want = str(lo) if lo == hi else f"{lo} to {hi}"
    word = "too many" if len(its) > hi else "too few"
    return Issue(GROUP, f"{op} group {role} ({label}) needs {want} iterator(s), has "
                        f"{len(its)} ({', '.join(its) or 'none'}): {word}",
                 group=label, iterators=its, expected=want, actual=len(its),
                 hint=SUBSTITUTION)


def mixed_issue(op: str, table: IterTable, d: DimInfo, why: str = "") -> Issue:
    order = {it.name: i for i, it in enumerate(table.scope.iters)}
    its = tuple(sorted(d.vars, key=lambda n: order[n]))
    by_group = "; ".join(f"{g}: {' '.join(n for n in its if table.label(n) == g)}"
                         for g in d.groups)
    return Issue(MIXED, f"{op}: dimension {d.dim} of {d.tensor} ({d.role}) index "
                        f"{format_index(d.index, order)} mixes iterator groups ({by_group})"
                        + (f"; {why}" if why else ""),
                 group=",".join(d.groups), iterators=its, tensor=d.tensor, dim=d.dim,
                 hint=SUBSTITUTION)


def label_of(places: Iterable[str]) -> str:
    s = set(places)
    return "".join(p for p in ("X", "Y", "O") if p in s) or "-"


def sizes(table: IterTable, names: Iterable[str]) -> int:
    out = 1
    for n in names:
        out *= table.size(n)
    return out


def ranges_with(table: IterTable, extra: Mapping[str, tuple[int, int]]
                ) -> dict[str, tuple[int, int]]:
    out = dict(table.ranges)
    out.update(extra)
    return out


def fresh_iter(table: IterTable, base: str) -> str:
    taken = set(table.ranges)
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    return name
