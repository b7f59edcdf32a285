"""Property tests of the linear-region partition on random graphs of linear and boundary
operators (``ollie.testing.strategies.linear_graphs``)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ollie.graph import Graph, Node, run_graph
from ollie.graph.partition import RegionLimits, constant_tensors, is_linear, partition
from ollie.testing.partitions import check_partition, item_index, run_items
from ollie.testing.strategies import linear_graphs

UNBOUNDED = RegionLimits(10**6, 10**6, 10**6, 10**6)
limits = st.one_of(
    st.just(RegionLimits()), st.just(UNBOUNDED),
    st.builds(RegionLimits, st.integers(1, 8), st.integers(1, 3), st.integers(1, 3),
              st.integers(1, 3)))
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _feeds(graph: Graph, seed: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {n: torch.from_numpy(rng.standard_normal(s).astype(np.float32))
            for n, s in graph.inputs}


@SETTINGS
@given(linear_graphs(), limits, st.integers(0, 2**16))
def test_partition_is_valid_and_runs_like_the_graph(graph, lim, seed):
    items = partition(graph, lim)
    check_partition(graph, items, lim)
    feeds = _feeds(graph, seed)
    want = run_graph(graph, feeds)
    got = run_items(graph, items, feeds)
    for name in graph.outputs:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6, equal_nan=True)


def _together(items, a, b) -> bool:
    """Whether nodes ``a`` and ``b`` are in one item, or both bare nodes (a region without a
    compute operator comes back as its nodes)."""
    where = item_index(items)
    ka, kb = where[id(a)], where[id(b)]
    return ka == kb or all(isinstance(items[k], Node) for k in (ka, kb))


@SETTINGS
@given(linear_graphs())
def test_unbounded_chain_edges_to_a_single_reader_are_united(graph):
    """A linear node whose only activation input comes from a linear node joins its region:
    nothing can lie on a path between them."""
    items = partition(graph, UNBOUNDED)
    const = constant_tensors(graph)
    producer = graph.producers()
    for n in graph.nodes:
        acts = {t for t in n.inputs if t not in graph.initializers}
        if len(acts) != 1 or not is_linear(n, const):
            continue
        p = producer.get(next(iter(acts)))
        if p is not None and is_linear(p, const):
            assert _together(items, p, n), (p, n)


@SETTINGS
@given(linear_graphs())
def test_unbounded_siblings_reading_one_tensor_are_united(graph):
    """Two linear nodes that read one activation tensor (and constants) share a region."""
    items = partition(graph, UNBOUNDED)
    const = constant_tensors(graph)
    by_input: dict[str, list] = {}
    for n in graph.nodes:
        acts = {t for t in n.inputs if t not in graph.initializers}
        if len(acts) == 1 and is_linear(n, const):
            by_input.setdefault(next(iter(acts)), []).append(n)
    for group in by_input.values():
        for a in group[1:]:
            assert _together(items, group[0], a), (group[0], a)
