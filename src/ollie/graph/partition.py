"""The linear-region partition of a graph: the program splitting of the paper's Algorithm 1.

:func:`partition` cuts a graph into *regions* (subprograms of several operators) at the
non-linear operators, the way the paper splits a program "using non-linear activation
operators as the splitting points". A node is *linear* (:func:`is_linear`) when its operator is
a compute operator (:data:`~ollie.graph.ir.COMPUTE_OPS`) or one of :data:`LINEAR_OPS` (sums,
affine BatchNorm, layout, window, padding, averaging and summing operators), or a ``Mul`` by a
constant / ``Div`` by a constant (:func:`constant_tensors`). Every other node is a
*boundary*: the activations (``Relu``, ``Tanh``, ``Sigmoid``, ``Exp``, ``Log``, ``Sqrt``,
``Abs``, ``Max``, ``Min``, ``LeakyRelu``),
opaque nodes (``MaxPool2d`` and ``Softmax`` included), a ``Mul`` of two activations, and any
operator not listed.

The algorithm is a union-find over the linear nodes, visited in the graph's topological order.
At each node it first tries to unite the node with the producers of its activation inputs
(*chain* edges, in input order), then with the earlier linear readers of the same activation
tensors (*sibling* edges; the Q/K/V projections of an attention layer, the branches of an
Inception or GCN block). Constant tensors make no edge: a node computing a constant from
constants stays on its own, before all its readers. A union is accepted only when

* the union stays *convex* in the graph contracted by the regions so far: no path leaves the
  merged region and re-enters it, directly or through another region (reachability bitsets
  over the topological order, updated after each accepted union), so the regions contracted
  to single nodes always form a DAG; and
* the merged region stays within :class:`RegionLimits` (nodes, compute operators, outputs,
  members reading one input tensor).

The result is greedy: a region grows as the topological order reaches its nodes, and a union
refused once is not tried again. A region without a compute operator comes back as its single
nodes, so a graph of boundaries and lone layout operators partitions exactly as it did node by
node. Why the limits have their values: docs/design/021-linear-region-partition.md.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Sequence
from dataclasses import dataclass

from ollie.errors import OllieError, check_settings
from ollie.graph.ir import COMPUTE_OPS, Graph, GraphError, Node

LINEAR_OPS: frozenset[str] = frozenset({
    *COMPUTE_OPS, "Add", "Sub", "BiasAdd", "BatchNorm", "Neg", "Identity", "Reshape", "Flatten",
    "Transpose", "Concat", "AvgPool2d", "GlobalAveragePool", "Slice", "Pad", "Expand",
    "Unfold", "ReduceSum", "ReduceMean"})
"""Operators whose nodes are linear (affine) in their activation inputs, whatever they read.
``Mul`` and ``Div`` are linear only by a constant (:func:`is_linear`)."""


@dataclass(frozen=True)
class RegionLimits:
    """Bounds of one region of several nodes: at most ``max_nodes`` nodes, ``max_compute``
    compute operators, ``max_outputs`` output tensors, and ``max_group`` nodes reading the same
    input tensor of the region (a sibling group). A region of one node is never refused."""

    max_nodes: int = 24
    max_compute: int = 6
    max_outputs: int = 4
    max_group: int = 8

    def __post_init__(self) -> None:
        check_settings("RegionLimits", {
            name: (getattr(self, name), isinstance(getattr(self, name), int)
                   and getattr(self, name) >= 1, "an int >= 1")
            for name in ("max_nodes", "max_compute", "max_outputs", "max_group")})


@dataclass(frozen=True)
class Region:
    """A convex set of nodes of a graph, run as one subprogram.

    ``nodes``: in the graph's (topological) order. ``inputs``: the tensors the nodes read that
    no node of the region produces and that are not initializers (graph inputs and tensors of
    other items), in the order of first read. ``outputs``: the tensors the region produces that
    a node outside the region reads or that are graph outputs, in production order."""

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def compute(self) -> int:
        """Number of compute operators (``COMPUTE_OPS``) among the nodes."""
        return sum(n.op in COMPUTE_OPS for n in self.nodes)

    def __repr__(self) -> str:
        ops = ", ".join(n.op for n in self.nodes)
        return f"Region([{ops}], inputs={list(self.inputs)}, outputs={list(self.outputs)})"


Item = Region | Node
"""An element of a partition: a region, or a node on its own."""


def constant_tensors(graph: Graph) -> frozenset[str]:
    """The initializers and the outputs of the non-opaque nodes that read only constants."""
    const = set(graph.initializers)
    for node in graph.nodes:
        if node.inputs and not node.opaque and all(i in const for i in node.inputs):
            const.update(node.outputs)
    return frozenset(const)


def is_linear(node: Node, constants: Container[str]) -> bool:
    """Whether ``node`` is linear (see the module docstring); ``constants``: the constant
    tensors of its graph (:func:`constant_tensors`)."""
    if node.opaque:
        return False
    if node.op == "Mul":
        return any(i in constants for i in node.inputs)
    if node.op == "Div":
        return len(node.inputs) == 2 and node.inputs[1] in constants
    if node.op == "BatchNorm":  # affine only with constant statistics
        return all(i in constants for i in node.inputs[1:])
    return node.op in LINEAR_OPS


def region_of(graph: Graph, nodes: Sequence[Node]) -> Region:
    """The :class:`Region` of ``nodes`` (nodes of ``graph``): its nodes in graph order, its
    inputs and its outputs (see :class:`Region`)."""
    members = {id(n) for n in nodes}
    ordered = tuple(n for n in graph.nodes if id(n) in members)
    if len(ordered) != len(members):
        raise GraphError(f"graph '{graph.name}': region_of was given nodes of another graph")
    produced = {o for n in ordered for o in n.outputs}
    inputs = dict.fromkeys(i for n in ordered for i in n.inputs
                           if i not in produced and i not in graph.initializers)
    read_outside = {i for n in graph.nodes if id(n) not in members for i in n.inputs}
    wanted = read_outside | set(graph.outputs)
    outputs = tuple(o for n in ordered for o in n.outputs if o in wanted)
    return Region(ordered, tuple(inputs), outputs)


def partition(graph: Graph, limits: RegionLimits | None = None,
              boundaries: Container[str] = ()) -> list[Item]:
    """Cut ``graph`` into linear regions (see the module docstring); the nodes named in
    ``boundaries`` are treated as boundaries (subprograms decided otherwise).

    Returns every node of ``graph`` exactly once, inside a :class:`Region` (one that holds a
    compute operator) or as itself, in a topological order of the items: each item reads only
    graph inputs, initializers and outputs of earlier items."""
    return _Partitioner(graph, limits or RegionLimits(), boundaries).run()


def multi_compute(items: Sequence[Item], min_compute: int = 2) -> list[Region]:
    """The regions among ``items`` holding at least ``min_compute`` compute operators: those
    the optimiser derives as one subprogram."""
    return [it for it in items if isinstance(it, Region) and it.compute >= min_compute]


def node_order(items: Sequence[Item]) -> list[Node]:
    """The nodes of ``items`` (a :func:`partition`) item by item, each region's in graph
    order: a topological order of the graph in which every region's nodes are contiguous,
    so a region can run in the place of its last node."""
    return [n for it in items for n in (it.nodes if isinstance(it, Region) else (it,))]


class _Partitioner:
    """The state of one :func:`partition` run. Nodes are indices into ``graph.nodes``; sets of
    nodes are int bitsets (bit ``i`` for node ``i``)."""

    def __init__(self, graph: Graph, limits: RegionLimits, boundaries: Container[str]) -> None:
        self.graph = graph
        self.limits = limits
        self.nodes = graph.nodes
        n = len(self.nodes)
        self.const = constant_tensors(graph)
        self.linear = [is_linear(node, self.const) and node.name not in boundaries
                       for node in self.nodes]
        self.compute = [node.op in COMPUTE_OPS for node in self.nodes]
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for t in dict.fromkeys(node.inputs):
                self.readers.setdefault(t, []).append(i)
            for o in node.outputs:
                self.producer[o] = i
        self.reader_bits = {t: sum(1 << r for r in rs) for t, rs in self.readers.items()}
        self.graph_outputs = set(graph.outputs)
        # union-find; per root: its members, and (outside them) what it reaches / what reaches
        # it in the graph contracted by the current regions
        self.parent = list(range(n))
        self.members = [1 << i for i in range(n)]
        self.down = [0] * n
        self.up = [0] * n
        for i in range(n):  # ancestors, in topological order
            for t in self.nodes[i].inputs:
                p = self.producer.get(t)
                if p is not None:
                    self.up[i] |= (1 << p) | self.up[p]
        for i in reversed(range(n)):  # descendants, in reverse order
            for t in self.nodes[i].outputs:
                for c in self.readers.get(t, ()):
                    self.down[i] |= (1 << c) | self.down[c]
        self.roots = set(range(n))

    # ------------------------------------------------------------------ union-find
    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> bool:
        """Unite the regions of ``a`` and ``b`` when the result is convex and within the
        limits; whether they are now one region."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        merged = self.members[ra] | self.members[rb]
        down = (self.down[ra] | self.down[rb]) & ~merged
        up = (self.up[ra] | self.up[rb]) & ~merged
        if down & up or not self.within_limits(merged):
            return False
        root, other = min(ra, rb), max(ra, rb)
        self.parent[other] = root
        self.members[root] = merged
        self.down[root], self.up[root] = down, up
        self.roots.discard(other)
        for r in self.roots:
            if r == root:
                continue
            if self.down[r] & merged:
                self.down[r] |= merged | down
            if self.up[r] & merged:
                self.up[r] |= merged | up
        return True

    def within_limits(self, merged: int) -> bool:
        lim = self.limits
        idx = _bits(merged)
        if len(idx) > lim.max_nodes or sum(self.compute[i] for i in idx) > lim.max_compute:
            return False
        outputs = 0
        reads: dict[str, int] = {}
        for i in idx:
            node = self.nodes[i]
            for o in node.outputs:
                if o in self.graph_outputs or self.reader_bits.get(o, 0) & ~merged:
                    outputs += 1
            for t in dict.fromkeys(node.inputs):
                p = self.producer.get(t)
                if t not in self.graph.initializers and (p is None or not merged >> p & 1):
                    reads[t] = reads.get(t, 0) + 1
        return outputs <= lim.max_outputs and all(c <= lim.max_group for c in reads.values())

    # ------------------------------------------------------------------ the algorithm
    def run(self) -> list[Item]:
        for i, node in enumerate(self.nodes):
            if not self.linear[i]:
                continue
            acts = [t for t in dict.fromkeys(node.inputs) if t not in self.const]
            for t in acts:  # chain edges: producer -> this node
                p = self.producer.get(t)
                if p is not None and self.linear[p]:
                    self.union(p, i)
            for t in acts:  # sibling edges: earlier linear readers of the same activation
                for s in self.readers[t]:
                    if s >= i:
                        break
                    if self.linear[s]:
                        self.union(s, i)
        return self.ordered_items()

    def region(self, members: list[int]) -> Region:
        """The :class:`Region` of the nodes ``members`` (ascending indices); what
        :func:`region_of` computes, from the reader bitsets."""
        mask = sum(1 << i for i in members)
        nodes = tuple(self.nodes[i] for i in members)
        inputs = dict.fromkeys(
            t for n in nodes for t in n.inputs if t not in self.graph.initializers
            and not (t in self.producer and mask >> self.producer[t] & 1))
        outputs = tuple(o for n in nodes for o in n.outputs
                        if o in self.graph_outputs or self.reader_bits.get(o, 0) & ~mask)
        return Region(nodes, tuple(inputs), outputs)

    def ordered_items(self) -> list[Item]:
        """The items (regions with a compute operator, other nodes alone) in a topological
        order of the contracted graph, earliest first node first among the ready ones."""
        groups: dict[int, list[int]] = {}
        for i in range(len(self.nodes)):
            groups.setdefault(self.find(i), []).append(i)
        item_of = [0] * len(self.nodes)
        items: list[list[int]] = []
        for members in sorted(groups.values()):
            if len(members) > 1 and not any(self.compute[i] for i in members):
                parts = [[i] for i in members]
            else:
                parts = [members]
            for part in parts:
                for i in part:
                    item_of[i] = len(items)
                items.append(part)
        succ: list[set[int]] = [set() for _ in items]
        indeg = [0] * len(items)
        for i, node in enumerate(self.nodes):
            for t in node.inputs:
                p = self.producer.get(t)
                if p is None or item_of[p] == item_of[i] or item_of[i] in succ[item_of[p]]:
                    continue
                succ[item_of[p]].add(item_of[i])
                indeg[item_of[i]] += 1
        ready = [(items[k][0], k) for k in range(len(items)) if not indeg[k]]
        heapq.heapify(ready)
        out: list[Item] = []
        while ready:
            _, k = heapq.heappop(ready)
            if len(items[k]) == 1 and not self.compute[items[k][0]]:
                out.append(self.nodes[items[k][0]])
            else:
                out.append(self.region(items[k]))
            for s in succ[k]:
                indeg[s] -= 1
                if not indeg[s]:
                    heapq.heappush(ready, (items[s][0], s))
        if len(out) != len(items):  # the convexity test keeps the contracted graph a DAG
            raise OllieError(f"graph '{self.graph.name}': the partition has a cycle (a bug)")
        return out


def _bits(x: int) -> list[int]:
    """The indices of the set bits of ``x``, ascending."""
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out
