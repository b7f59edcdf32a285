"""Checks of a graph partition (:func:`ollie.graph.partition.partition`) written independently of
it, for its property and example tests.

:func:`check_partition` asserts the contract (every node once; regions hold a compute operator
and only linear nodes; inputs / outputs recomputed from the graph; convexity by a graph walk;
the limits; each item reads only what earlier items exported). :func:`run_items` runs the
items in order, each region from its declared inputs alone, with the reference executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ollie.graph import COMPUTE_OPS, Graph, Node, run_node
from ollie.graph.partition import Item, Region, RegionLimits, constant_tensors, is_linear


def item_nodes(item: Item) -> tuple[Node, ...]:
    """The nodes of an item (a region's nodes, or the node itself)."""
    return item.nodes if isinstance(item, Region) else (item,)


def item_index(items: Sequence[Item]) -> dict[int, int]:
    """``id(node)`` -> the position of the item holding it."""
    return {id(n): k for k, it in enumerate(items) for n in item_nodes(it)}


def _reaches_back(graph: Graph, members: set[int]) -> bool:
    """Whether a path leaves the node set ``members`` (ids) and re-enters it (forward walk
    from the readers outside the set of the tensors the set produces)."""
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n)
    inside = [n for n in graph.nodes if id(n) in members]
    stack = [r for n in inside for o in n.outputs for r in readers.get(o, ())
             if id(r) not in members]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for o in n.outputs:
            for r in readers.get(o, ()):
                if id(r) in members:
                    return True
                stack.append(r)
    return False


def check_partition(graph: Graph, items: Sequence[Item], limits: RegionLimits) -> None:
    """Assert that ``items`` is a valid partition of ``graph`` under ``limits`` (see the module
    docstring)."""
    seen = [id(n) for it in items for n in item_nodes(it)]
    assert sorted(seen) == sorted(id(n) for n in graph.nodes), "not every node exactly once"
    const = constant_tensors(graph)
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    read_by: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for t in dict.fromkeys(n.inputs):
            read_by.setdefault(t, []).append(n)
    available = set(graph.input_names) | set(graph.initializers)
    for it in items:
        if isinstance(it, Node):
            assert all(t in available for t in it.inputs), f"{it} runs before its inputs"
            available.update(it.outputs)
            continue
        nodes = it.nodes
        ids = {id(n) for n in nodes}
        assert [order[id(n)] for n in nodes] == sorted(order[id(n)] for n in nodes)
        assert any(n.op in COMPUTE_OPS for n in nodes), f"{it} has no compute operator"
        assert all(is_linear(n, const) for n in nodes), f"{it} holds a boundary node"
        produced = [o for n in nodes for o in n.outputs]
        ins = list(dict.fromkeys(t for n in nodes for t in n.inputs
                                 if t not in produced and t not in graph.initializers))
        assert list(it.inputs) == ins, (it.inputs, ins)
        outs = [o for o in produced if o in graph.outputs
                or any(id(r) not in ids for r in read_by.get(o, ()))]
        assert list(it.outputs) == outs, (it.outputs, outs)
        assert not _reaches_back(graph, ids), f"{it} is not convex"
        if len(nodes) > 1:
            assert len(nodes) <= limits.max_nodes
            assert sum(n.op in COMPUTE_OPS for n in nodes) <= limits.max_compute
            assert len(outs) <= limits.max_outputs
            for t in ins:
                assert sum(t in n.inputs for n in nodes) <= limits.max_group, (it, t)
        assert all(t in available for t in ins), f"{it} runs before its inputs"
        available.update(outs)
    assert all(o in available for o in graph.outputs)


@torch.no_grad()
def run_items(graph: Graph, items: Sequence[Item], feeds: Mapping[str, Any]
              ) -> dict[str, torch.Tensor]:
    """Run ``items`` in order with :func:`ollie.graph.run_node`: a region sees only its declared
    inputs and the initializers, and only its declared outputs are kept; returns the graph
    outputs by name."""
    env: dict[str, torch.Tensor] = {k: torch.as_tensor(v) for k, v in feeds.items()}
    inits = {k: torch.from_numpy(v.copy()) for k, v in graph.initializers.items()}
    for it in items:
        if isinstance(it, Node):
            local = env
            exported: Sequence[str] = it.outputs
        else:
            local = {t: env[t] for t in it.inputs}
            exported = it.outputs
        for n in item_nodes(it):
            args = [local[t] if t in local else inits[t] for t in n.inputs]
            local.update(zip(n.outputs, run_node(n, args), strict=True))
        env.update({t: local[t] for t in exported})
    return {o: env[o] if o in env else inits[o] for o in graph.outputs}
