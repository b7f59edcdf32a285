"""Sibling groups: compute operators that read the same activation and otherwise only
constants, and compute the same function of their constants (the Q/K/V projections of an
attention layer, the 1x1 branches of an Inception block).

Such a group can be merged into one expression (:func:`ollie.rules.inter.merge_expressions`)
with the constants as its holes. A group is always convex: its members depend only on the
shared activation and constants, so no path leaves the group and re-enters it.
"""

from __future__ import annotations

import logging

from ollie.errors import OllieError
from ollie.fingerprint import fingerprint
from ollie.graph.ir import COMPUTE_OPS, Graph, Node
from ollie.ir import rename_expr

log = logging.getLogger(__name__)

MAX_GROUP = 8
"""Most members of one group (larger sets of siblings are cut into groups of this size, in
graph order)."""


def sibling_groups(graph: Graph, max_group: int = MAX_GROUP) -> list[tuple[Node, ...]]:
    """The groups of 2..``max_group`` compute nodes (:data:`~ollie.graph.ir.COMPUTE_OPS`, not
    opaque, one output) that read one activation tensor and otherwise only constants
    (initializers, or constants of their lowering), and whose lowered expressions are equal
    once each node's constants are renamed to placeholders in declaration order (the same
    operator on constants of the same shapes). Members are in graph order; groups are ordered
    by their first member. A node that cannot be lowered belongs to no group."""
    buckets: dict[tuple[str, str], list[Node]] = {}
    for node in graph.nodes:
        if node.op not in COMPUTE_OPS or node.opaque or len(node.outputs) != 1:
            continue
        key = _sibling_key(graph, node)
        if key is not None:
            buckets.setdefault(key, []).append(node)
    groups: list[tuple[Node, ...]] = []
    for members in buckets.values():
        for at in range(0, len(members), max_group):
            chunk = tuple(members[at:at + max_group])
            if len(chunk) >= 2:
                groups.append(chunk)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    return sorted(groups, key=lambda g: order[g[0].name])


def _sibling_key(graph: Graph, node: Node) -> tuple[str, str] | None:
    """(the activation ``node`` reads, the fingerprint of its expression with the constants
    renamed to ``#c0, #c1, ...``, names no tensor can have), or None when it reads no
    activation or more than one."""
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
    return activations[0], fingerprint(rename_expr(low.expr, names))


__all__ = ["MAX_GROUP", "sibling_groups"]
