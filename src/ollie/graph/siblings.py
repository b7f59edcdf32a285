"""Sibling groups: compute operators that read the same activation and otherwise only
constants, and that merge into one expression over their constants.

Two kinds of group, a node in at most one:

* *twins* compute the same function of constants of the same shapes (the Q/K/V projections
  of an attention layer): merged by stacking (:func:`ollie.rules.inter.merge_expressions`);
* *concatenable* members differ in the extent of one output iterator that indexes only their
  constants (Inception's 1x1 branches with 64/96/16 channels), and/or in their summation
  ranges (a 1x1 convolution next to a 3x3 one: SqueezeNet's expand pair, ResNet's downsample
  next to the block's first convolution): merged by concatenation with relaxation
  (:func:`ollie.rules.inter_merge.concat_merge`).

A group is always convex: its members depend only on the shared activation and constants, so
no path leaves the group and re-enters it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ollie.errors import OllieError
from ollie.fingerprint import fingerprint
from ollie.graph.ir import COMPUTE_OPS, Graph, Node
from ollie.ir import Expr, rename_expr
from ollie.rules.inter_merge import concat_merge

log = logging.getLogger(__name__)

MAX_GROUP = 8
"""Most members of one group (larger sets of siblings are cut into groups of this size, in
graph order)."""

MAX_GROWTH = 2.0
"""Most work a concatenated group may do over its members' summed
(:attr:`~ollie.rules.inter_merge.ConcatMerge.growth`): relaxing a 1x1 next to a 3x3
convolution of as many channels does 1.8x, a 1x7 next to a 7x1 one 3.5x (note
docs/design/027-concat-merge.md)."""


def canonical_members(exprs: Sequence[Expr], act: str
                      ) -> tuple[list[Expr], list[tuple[str, ...]], dict[str, str]]:
    """The members' expressions with the shared activation ``act`` renamed ``x0`` and member
    ``i``'s other tensors (its constants) ``w<i>_<j>`` in declaration order; each member's
    constants (the holes of a merge); and the inverse renaming (canonical -> graph name)."""
    out, holes, inverse = [], [], {"x0": act}
    for i, e in enumerate(exprs):
        own = [n for n, _ in e.decls if n != act]
        names = {act: "x0", **{c: f"w{i}_{j}" for j, c in enumerate(own)}}
        inverse.update({v: k for k, v in names.items()})
        out.append(rename_expr(e, names))
        holes.append(tuple(names[c] for c in own))
    return out, holes, inverse


def concatenable(exprs: Sequence[Expr], act: str, max_growth: float = MAX_GROWTH) -> bool:
    """Whether expressions reading ``act`` and otherwise only their own constants merge by
    concatenation (with relaxation; :func:`~ollie.rules.inter_merge.concat_merge`) into one
    that does at most ``max_growth`` times their work."""
    canon, holes, _ = canonical_members(exprs, act)
    try:
        return concat_merge(canon, holes).growth <= max_growth
    except OllieError:
        return False


def sibling_groups(graph: Graph, max_group: int = MAX_GROUP, concat: bool = False
                   ) -> list[tuple[Node, ...]]:
    """The groups of 2..``max_group`` compute nodes (:data:`~ollie.graph.ir.COMPUTE_OPS`, not
    opaque, one output) that read one activation tensor and otherwise only constants
    (initializers, or constants of their lowering). Twins first: nodes whose lowered
    expressions are equal once each node's constants are renamed to placeholders in
    declaration order. Then, with ``concat``, among the nodes of one activation left over,
    greedily in graph order, nodes that are :func:`concatenable` with the group so far (without
    it, twins only). Members are in graph
    order; groups are ordered by their first member. A node that cannot be lowered belongs to
    no group."""
    buckets: dict[tuple[str, str], list[Node]] = {}
    lowered: dict[str, tuple[str, Expr]] = {}
    for node in graph.nodes:
        if node.op not in COMPUTE_OPS or node.opaque or len(node.outputs) != 1:
            continue
        found = _candidate(graph, node)
        if found is not None:
            act, expr, key = found
            lowered[node.name] = (act, expr)
            buckets.setdefault((act, key), []).append(node)
    groups: list[tuple[Node, ...]] = []
    left: dict[str, list[Node]] = {}
    for (act, _), members in buckets.items():
        for at in range(0, len(members), max_group):
            chunk = tuple(members[at:at + max_group])
            if len(chunk) >= 2:
                groups.append(chunk)
            else:
                left.setdefault(act, []).extend(chunk)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    for act, nodes in left.items() if concat else ():
        groups += _concat_groups(sorted(nodes, key=lambda n: order[n.name]), act, lowered,
                                 max_group)
    return sorted(groups, key=lambda g: order[g[0].name])


def _concat_groups(nodes: list[Node], act: str, lowered: dict[str, tuple[str, Expr]],
                   max_group: int) -> list[tuple[Node, ...]]:
    """Greedy groups of concatenable nodes (graph order), each of 2..``max_group``."""
    out: list[tuple[Node, ...]] = []
    rest = list(nodes)
    while len(rest) >= 2:
        group = [rest.pop(0)]
        for node in list(rest):
            if len(group) < max_group and concatenable(
                    [lowered[n.name][1] for n in (*group, node)], act):
                group.append(node)
                rest.remove(node)
        if len(group) >= 2:
            out.append(tuple(group))
    return out


def _candidate(graph: Graph, node: Node) -> tuple[str, Expr, str] | None:
    """(the activation ``node`` reads, its lowered expression, the fingerprint of that
    expression with the constants renamed to ``#c0, #c1, ...``, names no tensor can have), or
    None when it reads no activation or more than one."""
    try:
        low = graph.lower_node(node)
    except OllieError as exc:
        log.debug("%s: not a sibling candidate (%s)", node.describe(), exc)
        return None
    constant = set(graph.initializers) | set(low.consts)
    activations = [n for n, _ in low.expr.decls if n not in constant]
    if len(activations) != 1:
        return None
    names = {n: f"#c{i}" for i, n in enumerate(n for n, _ in low.expr.decls if n in constant)}
    return activations[0], low.expr, fingerprint(rename_expr(low.expr, names))


__all__ = ["MAX_GROUP", "MAX_GROWTH", "canonical_members", "concatenable", "sibling_groups"]
