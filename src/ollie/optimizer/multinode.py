"""The model optimiser's subprograms of several nodes (:class:`MultiNode`, a part of
:class:`ollie.optimizer.model._Optimizer`): sibling groups (:mod:`ollie.optimizer.region`),
contraction chains (:mod:`ollie.optimizer.chains`) and linear regions
(:mod:`ollie.optimizer.regions`), each decided, and placed in the optimiser's parts and
report only when kept."""

from __future__ import annotations

import logging
from typing import TypeVar

import numpy as np

from ollie.errors import OllieError
from ollie.graph import Graph, Node
from ollie.graph.chains import Chain, contraction_chains
from ollie.graph.partition import Region, multi_compute, node_order, partition
from ollie.graph.siblings import sibling_groups
from ollie.optimizer.budget import Budget
from ollie.optimizer.chains import ChainOutcome, chain_baseline, fuse_chain, splice
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.plausible import Allowance
from ollie.optimizer.region import MergeOutcome, Part, merge_siblings
from ollie.optimizer.regions import MIN_COMPUTE, RegionOutcome, derive_region
from ollie.optimizer.report import Alternative, SubprogramReport
from ollie.program.kernel import Kernel
from ollie.tune.cache import CostCache

log = logging.getLogger(__name__)

Several = TypeVar("Several", tuple[Node, ...], Chain, Region)
"""A subprogram of several nodes: a sibling group, a contraction chain, a linear region."""


def cause(exc: BaseException) -> str:
    """``exc`` in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


class MultiNode:
    """Deciding sibling groups and contraction chains on the optimiser's state (the
    attributes below, set by the optimiser)."""

    graph: Graph
    config: OptimizeConfig
    cache: CostCache | None
    rng: np.random.Generator
    constants: dict[str, np.ndarray]
    channels_last: set[str]
    report: list[SubprogramReport]
    notes: list[str]
    parts: list[Part]
    merged: dict[str, MergeOutcome]
    chained: dict[str, ChainOutcome]
    regioned: dict[str, RegionOutcome]
    budget: Budget
    rewrite_keys: dict[str, str]
    alternatives: dict[str, list[tuple[str, list[Kernel]]]]
    alternative_of: dict[str, Alternative]

    def compute_node(self, node: Node) -> list[Kernel]:
        """``node`` decided alone (the optimiser's, which overrides this)."""
        raise NotImplementedError

    def track_layout(self, node: Node, chosen: list[Kernel]) -> None:
        """Record ``node``'s likely output layout (the optimiser's, which overrides this)."""
        raise NotImplementedError

    def note(self, text: str) -> None:
        log.warning(text)
        self.notes.append(text)

    def to_try(self, found: Several | None) -> Several | None:
        """``found`` (a sibling group, a contraction chain or a linear region the walk
        reached, or None) when the total budget lets it be decided now
        (:meth:`~ollie.optimizer.budget.Budget.may_try`, which records it otherwise)."""
        return found if found is not None and self.budget.may_try(label(found)) else None

    def allowance(self, label: str) -> Allowance | None:
        """What deciding the subprogram of several nodes ``label`` may spend: its share of
        the total budget (:meth:`~ollie.optimizer.budget.Budget.share`; None when none is
        left, and it is recorded as not tried) or, without a total budget, the configured
        search budget."""
        cfg = self.config
        seconds = self.budget.share() if self.budget.bounded else cfg.time_budget
        if seconds is None:
            self.budget.not_tried(label)
            return None
        return Allowance(seconds, cfg.time_budget, self.budget.bounded)

    def spent(self, allowance: Allowance, t0: float) -> None:
        """Account a decision of :meth:`allowance`, started at ``t0``, to the total budget
        (what it took beyond its share counts as overhead for the next shares)."""
        if self.budget.bounded:
            self.budget.searched(allowance.seconds, self.budget.clock() - t0)

    def sibling_group(self, group: tuple[Node, ...], decided: dict[str, list[Kernel]]
                      ) -> list[Kernel] | None:
        """Decide the members alone (into ``decided``), then merged (:mod:`~ollie.optimizer.
        region`): the merged kernels when faster, else None (each keeps its own decision)."""
        start = len(self.report)
        decided.update((n.name, self.compute_node(n)) for n in group)
        allowance = self.allowance(label(group))
        if allowance is None:
            return None
        t0 = self.budget.clock()
        try:
            merged = merge_siblings(self.graph, group, [decided[n.name] for n in group],
                                    self.constants, self.config, self.cache, self.rng,
                                    frozenset(self.channels_last), self.merged, allowance)
        except Exception as exc:  # never lose the model to one subprogram
            self.note(f"{label(group)}: not merged ({cause(exc)})")
            return None
        finally:
            self.spent(allowance, t0)
        self.notes += [merged.note] if merged is not None else []
        if merged is None or merged.outcome.kernels is None:
            return None
        for n in group:
            del decided[n.name]
            self.rewrite_keys.pop(n.name, None)
            self.alternatives.pop(n.name, None)
            self.track_layout(n, merged.kernels)
        self.report[start:] = [merged.report]
        self.parts.append(Part(group, merged.key, merged.kernels))
        return merged.kernels

    def fused_chain(self, chain: Chain, chosen: list[Kernel], kernels: list[Kernel],
                    start: int) -> list[Kernel] | None:
        """The chain's fused kernels when kept (:func:`~ollie.optimizer.chains.splice`)."""
        allowance = self.allowance(label(chain))
        if allowance is None:
            return None
        t0 = self.budget.clock()
        try:
            fused = fuse_chain(self.graph, chain, chain_baseline(chain, self.parts, chosen),
                               self.constants, self.config, self.cache, self.rng, self.chained,
                               allowance)
        except Exception as exc:  # never lose the model to one subprogram
            self.note(f"{label(chain)}: not fused ({cause(exc)})")
            return None
        finally:
            self.spent(allowance, t0)
        self.notes += [fused.note] if fused is not None else []
        if fused is None or fused.outcome.kernels is None:
            return None
        self.rewrite_keys.pop(chain.sink.name, None)
        self.alternatives.pop(chain.sink.name, None)
        self.parts = splice(fused, chain, self.parts, kernels, self.report, start)
        return fused.kernels

    def several_node_subprograms(self) -> tuple[dict[str, tuple[Node, ...]], dict[str, Chain],
                                                dict[str, Region], list[Node]]:
        """The subprograms of several nodes this optimisation decides: sibling groups by
        their first member, contraction chains by their sink, linear regions by their last
        node (none when derivation or their switch is off), and the order to walk the graph's
        nodes in (:meth:`regions_to_derive`)."""
        derive = self.config.derivation
        groups = {g[0].name: g for g in sibling_groups(self.graph, concat=True)
                  if self.config.merge_siblings and derive}
        chains = {c.sink.name: c for c in contraction_chains(self.graph)
                  if self.config.fuse_chains and derive
                  and not any(c.sink in g for g in groups.values())}
        regions, order = self.regions_to_derive(
            {n.name for g in (*groups.values(), *(c.nodes for c in chains.values())) for n in g})
        return groups, chains, regions, order

    def regions_to_derive(self, taken: set[str]) -> tuple[dict[str, Region], list[Node]]:
        """The linear regions to derive (:attr:`OptimizeConfig.derive_regions`), by their last
        node, with the nodes ``taken`` by other subprograms as boundaries, and the order to
        walk the graph's nodes in (the partition's, where every region is contiguous, when
        there is one; the graph's otherwise)."""
        if not (self.config.derive_regions and self.config.derivation):
            return {}, list(self.graph.nodes)
        try:
            items = partition(self.graph, boundaries=taken)
        except OllieError as exc:  # never lose the model to the partition
            self.note(f"linear regions not derived ({cause(exc)})")
            return {}, list(self.graph.nodes)
        regions = {r.nodes[-1].name: r for r in multi_compute(items, MIN_COMPUTE)}
        return regions, node_order(items) if regions else list(self.graph.nodes)

    def linear_region(self, region: Region, kernels: list[Kernel]) -> None:
        """Decide ``region`` (its nodes already placed, decided alone, at the end of
        ``kernels``' members); when kept, its kernels replace theirs (in ``kernels``, the
        parts and the report), placed after its last node."""
        allowance = self.allowance(label(region))
        if allowance is None:
            return
        members = {n.name for n in region.nodes}
        individual = {p.nodes[0].name: p.chosen for p in self.parts
                      if p.nodes[0].name in members}
        if set(individual) != members:
            return
        t0 = self.budget.clock()
        try:
            with self.budget.phase("merge"):
                done = derive_region(self.graph, region, individual, self.constants,
                                     self.config, allowance, self.cache, self.rng,
                                     self.regioned)
        except Exception as exc:  # never lose the model to one subprogram
            self.note(f"{label(region)}: not derived ({cause(exc)})")
            return
        finally:
            self.spent(allowance, t0)
        if done is None:
            return
        self.notes.append(done.note)
        if done.outcome.kernels is None:
            return
        drop = {id(k) for p in self.parts if p.nodes[0].name in members for k in p.chosen}
        kernels[:] = [k for k in kernels if id(k) not in drop] + done.kernels
        self.parts = [p for p in self.parts if p.nodes[0].name not in members] + \
            [Part(region.nodes, done.key, done.kernels)]
        self.report[:] = [r for r in self.report if r.node not in members] + [done.report]
        for n in region.nodes:
            self.rewrite_keys.pop(n.name, None)
            self.alternatives.pop(n.name, None)
            self.track_layout(n, done.kernels)


def label(found: tuple[Node, ...] | Chain | Region) -> str:
    """How notes name a sibling group, a contraction chain or a linear region."""
    if isinstance(found, Chain):
        return f"chain at {found.sink.name}"
    if isinstance(found, Region):
        return f"region at {found.nodes[0].name}"
    return f"siblings {', '.join(n.name for n in found)}"


__all__ = ["MultiNode", "cause", "label"]
