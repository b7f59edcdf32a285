"""Contraction chains: a summing operator together with the window, padding, layout and
product operators that feed only it.

A model written in plain tensor operations often spells one library operator as several
nodes: Longformer's banded attention ``(q.unsqueeze(-1) * unfold(pad(k))).sum(-2)`` is a
``Reshape``, a ``Pad``, an ``Unfold``, a ``Slice``, a ``Mul`` of two activations and a
``ReduceSum``, which together compute one G2BMM. Each node alone is a layout or element-wise
eOperator; only their composition is a contraction a library operator computes. A
:class:`Chain` is such a composition: the *sink* (a node whose operator sums,
:data:`SUM_OPS`) and the nodes of :data:`ABSORBED_OPS` upstream of it whose outputs only the
chain reads. The optimizer fuses a chain into one expression (expression fusion) and derives
it (:mod:`ollie.optimizer.chains`).

A chain is convex: every member's output is read only by members or the sink, so every path
out of a member runs through the sink. Its inputs are produced before any member runs, and
its members' outputs are read by nobody else, so the chain can run at the sink's place.
"""

from __future__ import annotations

from dataclasses import dataclass

from ollie.graph.ir import COMPUTE_OPS, Graph, Node

SUM_OPS: frozenset[str] = frozenset({*COMPUTE_OPS, "ReduceSum"})
"""Operators a chain may end in: their expressions sum (a contraction)."""

ABSORBED_OPS: frozenset[str] = frozenset({
    "Reshape", "Flatten", "Transpose", "Identity", "Pad", "Unfold", "Slice", "Expand", "Mul"})
"""Operators a chain may absorb upstream of its sink: layout, window and padding operators
and element-wise products (no summation of their own)."""

WINDOW_OPS: frozenset[str] = frozenset({"Pad", "Unfold", "Slice", "Expand", "Mul"})
"""A chain is only formed when it absorbs one of these: a sink behind reshapes and transposes
alone is already one library operator's expression (strides), derived as a single node."""

MAX_MEMBERS = 12
"""Most nodes absorbed into one chain (nearest to the sink first)."""


@dataclass(frozen=True)
class Chain:
    """A sink node, the absorbed nodes in graph order, and the chain's inputs (tensors the
    members and the sink read that no member produces, constants included), in first-read
    order."""

    sink: Node
    members: tuple[Node, ...]
    inputs: tuple[str, ...]

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The members then the sink (graph order)."""
        return (*self.members, self.sink)


def contraction_chains(graph: Graph, max_members: int = MAX_MEMBERS) -> list[Chain]:
    """Every chain of ``graph`` (see the module docstring), ordered by sink. A node is absorbed
    when its operator is in :data:`ABSORBED_OPS`, it is not opaque, has one output that is not
    a graph output, and every reader of that output is the sink or an absorbed node; a chain
    absorbing no :data:`WINDOW_OPS` node is not returned. Chains are disjoint: a node already
    absorbed is not absorbed again, and no sink is a member of another chain."""
    readers: dict[str, list[Node]] = {}
    producer: dict[str, Node] = {}
    for node in graph.nodes:
        for t in node.inputs:
            readers.setdefault(t, []).append(node)
        for t in node.outputs:
            producer[t] = node
    outputs = set(graph.outputs)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    taken: set[str] = set()
    chains: list[Chain] = []
    for sink in reversed(graph.nodes):  # later sinks first: an earlier sink may not be absorbed
        if sink.op not in SUM_OPS or sink.opaque or sink.name in taken or len(sink.outputs) != 1:
            continue
        inside = {sink.name}
        members: list[Node] = []
        frontier = list(sink.inputs)
        while frontier and len(members) < max_members:
            t = frontier.pop(0)
            p = producer.get(t)
            if p is None or p.name in inside or p.name in taken or p.opaque or \
                    p.op not in ABSORBED_OPS or len(p.outputs) != 1 or t in outputs or \
                    any(r.name not in inside for r in readers.get(t, [])):
                continue
            inside.add(p.name)
            members.append(p)
            frontier.extend(p.inputs)
        if not any(m.op in WINDOW_OPS for m in members):
            continue
        members.sort(key=lambda n: order[n.name])
        produced = {m.outputs[0] for m in members}
        inputs: list[str] = []
        for n in (*members, sink):
            inputs += [t for t in n.inputs if t not in produced and t not in inputs]
        taken.update(inside)
        chains.append(Chain(sink, tuple(members), tuple(inputs)))
    return sorted(chains, key=lambda c: order[c.sink.name])


__all__ = ["ABSORBED_OPS", "MAX_MEMBERS", "SUM_OPS", "WINDOW_OPS", "Chain",
           "contraction_chains"]
