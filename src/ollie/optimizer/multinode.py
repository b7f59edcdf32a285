"""The model optimiser's subprograms of several nodes (:class:`MultiNode`, a part of
:class:`ollie.optimizer.model._Optimizer`): sibling groups (:mod:`ollie.optimizer.region`)
and contraction chains (:mod:`ollie.optimizer.chains`), each decided, and placed in the
optimiser's parts and report only when kept."""

from __future__ import annotations

import logging

import numpy as np

from ollie.graph import Graph, Node
from ollie.graph.chains import Chain
from ollie.optimizer.chains import ChainOutcome, chain_baseline, fuse_chain, splice
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.region import MergeOutcome, Part, merge_siblings
from ollie.optimizer.report import Alternative, SubprogramReport
from ollie.program.kernel import Kernel
from ollie.tune.cache import CostCache

log = logging.getLogger(__name__)


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

    def sibling_group(self, group: tuple[Node, ...], decided: dict[str, list[Kernel]]
                      ) -> list[Kernel] | None:
        """Decide the members alone (into ``decided``), then merged (:mod:`~ollie.optimizer.
        region`): the merged kernels when faster, else None (each keeps its own decision)."""
        start = len(self.report)
        decided.update((n.name, self.compute_node(n)) for n in group)
        try:
            merged = merge_siblings(self.graph, group, [decided[n.name] for n in group],
                                    self.constants, self.config, self.cache, self.rng,
                                    frozenset(self.channels_last), self.merged)
        except Exception as exc:  # never lose the model to one subprogram
            self.note(f"siblings {', '.join(n.name for n in group)}: not merged ({cause(exc)})")
            return None
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
        try:
            fused = fuse_chain(self.graph, chain, chain_baseline(chain, self.parts, chosen),
                               self.constants, self.config, self.cache, self.rng, self.chained)
        except Exception as exc:  # never lose the model to one subprogram
            self.note(f"chain at {chain.sink.name}: not fused ({cause(exc)})")
            return None
        self.notes += [fused.note] if fused is not None else []
        if fused is None or fused.outcome.kernels is None:
            return None
        self.rewrite_keys.pop(chain.sink.name, None)
        self.alternatives.pop(chain.sink.name, None)
        self.parts = splice(fused, chain, self.parts, kernels, self.report, start)
        return fused.kernels


__all__ = ["MultiNode", "cause"]
