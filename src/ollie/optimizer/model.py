"""The program-level optimizer (paper Algorithm 1): ``ollie.optimize(model, ...)``.

1. Frontend: a ``torch.nn.Module`` (torch.export), an ``.onnx`` path or an ``onnx.ModelProto``
   becomes a graph; BatchNorm is folded into convolutions, identities removed.
2. Subprograms: every compute operator (Conv, ConvTranspose, MatMul, Gemm, G2BMM, GBMM);
   sibling ones (Q/K/V) merged (:mod:`~ollie.optimizer.region`), window / pad / product
   chains fused into their sum (:mod:`~ollie.optimizer.chains`) and linear regions of several
   (:mod:`~ollie.optimizer.regions`) derived as one when faster. Element-wise
   and layout operators become eOperators; those without an expression run as they are.
3. Each subprogram's expression is derived (hybrid derivation); identical subprograms (same
   expression up to tensor names: repeated blocks) are searched and measured once.
4. Measured selection against the original operator keeps the fastest verified program.
5. Post-processing over the whole program: weights transformed at optimisation time, eOperator
   fusion across subprogram boundaries, identity elimination.
6. The program is checked against the model on random and on the example inputs; if it
   disagrees, Ollie falls back to the original operators and says so. On the CPU its
   libraries (and originals) are then chosen by measurement (:mod:`ollie.optimizer.final`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ollie.caches import release_caches
from ollie.errors import InternalError, OllieError
from ollie.exec.conv import TORCH
from ollie.exec.dispatch import precompile_programs
from ollie.fingerprint import fingerprint
from ollie.graph import COMPUTE_OPS, Graph, Node
from ollie.ir import Expr
from ollie.optimizer.baseline import eager_runner, original_runner, torch_original
from ollie.optimizer.budget import MIN_SHARE, TIME_BUDGET, Budget
from ollie.optimizer.chains import ChainOutcome
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.context import Group, cached_refine
from ollie.optimizer.final import ORIGINAL, ORIGINALS, checked, confirm, node_kernel, reference
from ollie.optimizer.importing import checked_import, to_graph
from ollie.optimizer.keys import SubprogramKey
from ollie.optimizer.layout import likely_channels_last
from ollie.optimizer.libraries import ALTERNATIVE_MARGIN, PER_OPERATOR, alternative_of
from ollie.optimizer.memory import memory_guard
from ollie.optimizer.multinode import MultiNode, cause
from ollie.optimizer.outcome import Outcome, cached_outcome
from ollie.optimizer.plausible import original_seconds, plausible
from ollie.optimizer.recall import key_of, recalled_module, remembered
from ollie.optimizer.region import MergeOutcome, Part
from ollie.optimizer.regions import RegionOutcome
from ollie.optimizer.rename import canonical_names, rename_kernels
from ollie.optimizer.report import (
    Alternative,
    OptimizedModel,
    SubprogramReport,
    kept_originals,
    load,
    switched_on,
)
from ollie.optimizer.select import select
from ollie.optimizer.structure import with_structure
from ollie.passes.postprocess import describe as describe_postprocess
from ollie.passes.postprocess import postprocess
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind
from ollie.program.program import Program, constant_array
from ollie.program.serialize import FormatError
from ollie.search import SearchConfig, derive
from ollie.search.config import machine_roofline
from ollie.search.instantiate import Instantiator
from ollie.settings import current, using
from ollie.tune.cache import CostCache, choice_store

log = logging.getLogger(__name__)


# --------------------------------------------------------------------- the optimizer
class _Optimizer(MultiNode):
    def __init__(self, graph: Graph, config: OptimizeConfig,
                 progress: Callable[[str, int, int], None] | None,
                 budget: Budget | None = None) -> None:
        self.graph = graph
        self.config = config
        self.progress = progress
        self.cache = CostCache() if config.use_cache else None
        self.memo: dict[str, Outcome] = {}
        self.report: list[SubprogramReport] = []
        self.notes: list[str] = []
        self.constants: dict[str, np.ndarray] = {
            n: constant_array(v) for n, v in graph.initializers.items()}
        self.rng = np.random.default_rng(config.seed)
        self.channels_last: set[str] = set()
        """4-D tensors the program will likely hold channels-last (:meth:`track_layout`)."""
        self.parts: list[Part] = []
        """Per graph node or merged sibling group: its decision key when a rewrite was chosen
        for it, and its kernels (:meth:`assemble`)."""
        self.merged: dict[str, MergeOutcome] = {}  # sibling groups' decisions by key
        self.chained: dict[str, ChainOutcome] = {}  # contraction chains' decisions by key
        self.regioned: dict[str, RegionOutcome] = {}  # linear regions' decisions by key
        self.rewrite_keys: dict[str, str] = {}
        """Decision key of each node that got a rewrite (:meth:`compute_node`)."""
        self.alternatives: dict[str, list[tuple[str, list[Kernel]]]] = {}
        """Per node whose original operator won alone: its alternatives' keys and kernels,
        switched on only by the context step (:meth:`assemble`)."""
        self.alternative_of: dict[str, Alternative] = {}
        """Each alternative by its key."""
        self.keys: dict[str, SubprogramKey] = {}
        """Each key above (:attr:`SubprogramKey.text`) as the value it names."""
        self.torch_originals: set[str] = set()
        """Nodes whose original operator runs PyTorch's implementation when kept."""
        self.budget = budget or Budget(config.total_budget, config.time_budget,
                                       current().budget_clock)

    def run(self) -> Program:
        kernels: list[Kernel] = []
        total = sum(n.op in COMPUTE_OPS for n in self.graph.nodes)
        done = 0
        groups, chains, regions, order = self.several_node_subprograms()
        decided: dict[str, list[Kernel]] = {}  # members decided alone, their group not merged
        placed: set[str] = set()  # members a merged group computes
        if self.config.derivation:
            self.budget.plan(self.graph, [n for n in self.graph.nodes if n.op in COMPUTE_OPS],
                             self.config, self.constants, self.cache)
        for node in order:
            if node.name in placed:
                done += 1
                continue
            start = len(self.report)
            if node.op in COMPUTE_OPS:
                if self.progress:
                    self.progress(node.name, done, total)
                done += 1
                group = self.to_try(groups.get(node.name))
                with self.budget.phase("merge", group is not None):
                    merged = None if group is None else self.sibling_group(group, decided)
                if group is not None and merged is not None:
                    kernels += merged
                    placed.update(n.name for n in group[1:])
                    continue
                chosen = decided.pop(node.name, None) or self.compute_node(node)
            else:
                chosen = self.other_node(node)
            chain = self.to_try(chains.get(node.name))
            with self.budget.phase("merge", chain is not None):
                fused = None if chain is None else self.fused_chain(chain, chosen, kernels,
                                                                    start)
            if fused is not None:
                kernels += fused
                self.track_layout(node, fused)
                continue
            kernels += chosen
            self.track_layout(node, chosen)
            self.parts.append(Part((node,), self.rewrite_keys.get(node.name), chosen))
            if (region := self.to_try(regions.get(node.name))) is not None:
                self.linear_region(region, kernels)
        if self.progress:
            self.progress("", done, total)
        inputs = tuple((n, tuple(self.graph.shape(n))) for n in self.graph.input_names)
        return Program(inputs, tuple(self.graph.outputs), kernels, self.constants)

    def track_layout(self, node: Node, chosen: list[Kernel]) -> None:
        """Record whether ``node``'s output will likely be channels-last (:func:`~ollie.
        optimizer.layout.likely_channels_last`): later subprograms reading it are measured so."""
        if likely_channels_last(self.graph, node, chosen, self.channels_last, self.config.device):
            self.channels_last.add(node.outputs[0])

    def node_kernel(self, node: Node) -> list[Kernel]:
        """The node run as it is (PyTorch's implementation where its selection says so)."""
        k = node_kernel(self.graph, node)
        return [torch_original(k) if node.name in self.torch_originals else k]

    def other_node(self, node: Node) -> list[Kernel]:
        """Element-wise / layout operators as eOperators; the rest run as they are."""
        if node.opaque or len(node.outputs) != 1:
            return self.node_kernel(node)
        try:
            low = self.graph.lower_node(node)
        except OllieError as exc:
            log.info("%s runs as is: %s", node.describe(), exc)
            return self.node_kernel(node)
        opts = Instantiator((KernelKind.MATMUL,)).complete(low.expr)
        if not opts:
            return self.node_kernel(node)
        # an element-wise product also matches a Matmul without a summation (k = 1): as an
        # eOperator it fuses with its neighbours and streams at copy bandwidth instead
        # (docs/design/013-eoperator-kernels.md)
        best = next((o for o in opts if all(k.kind is KernelKind.EOP for k in o.kernels)), opts[0])
        self.constants.update({n: np.asarray(v, np.float32) for n, v in low.consts.items()})
        return rename_kernels(list(best.kernels), {}, best.output, node.outputs[0],
                              prefix=node.name)

    def compute_node(self, node: Node) -> list[Kernel]:
        if not self.config.derivation:  # OptimizeConfig.derivation off: the original operator
            return self.node_kernel(node)
        try:
            return self.decide(node)
        finally:
            self.budget.decided(node.name)

    def refused(self, node: Node, reason: str) -> list[Kernel]:
        """``node`` kept as it is without a search, ``reason`` in its report; left by the
        total budget, it runs PyTorch's implementation (no library choice measured for it)."""
        if reason == TIME_BUDGET:
            self.torch_originals.add(node.name)
        self.report.append(SubprogramReport(node.name, node.op, node.op, ORIGINAL, [], 0.0,
                                            0.0, refused=reason))
        return self.node_kernel(node)

    def decide(self, node: Node) -> list[Kernel]:
        """The kernels of compute node ``node``: a rewrite, or its original operator."""
        try:
            low = self.graph.lower_node(node)
        except OllieError as exc:
            self.note(f"{node.describe()}: kept as is ({exc})")
            return self.refused(node, "not lowered")
        self.constants.update({n: np.asarray(v, np.float32) for n, v in low.consts.items()})
        expr, names = canonical_names(low.expr)
        weights = {canon: self.constants[orig] for orig, canon in names.items()
                   if orig in self.constants}
        cl = frozenset(canon for orig, canon in names.items()
                       if orig in self.channels_last and orig not in self.constants)
        skey = SubprogramKey(fingerprint(expr), cl)
        key = skey.text
        self.keys[key] = skey
        reused = key in self.memo
        if not reused:
            try:
                found = self.search(node, expr, weights, cl)
            except Exception as exc:  # never lose the model to one subprogram
                self.note(f"{node.describe()}: kept as is (its search failed: "
                          f"{cause(exc)})")
                log.debug("search of %s failed", node.describe(), exc_info=True)
                return self.refused(node, "search failed")
            if found is None:  # OptimizeConfig.total_budget spent, nothing decided before
                self.budget.skipped.append(node.name)
                return self.refused(node, TIME_BUDGET)
            self.memo[key] = found
        out = self.memo[key]
        if out.original_library == TORCH:
            self.torch_originals.add(node.name)
        self.report.append(SubprogramReport(
            node.name, node.op, node.op, out.label, out.derivation, out.original_s * 1e3,
            out.optimized_s * 1e3, reused, out.candidates,
            eager_ms=None if out.eager_s is None else out.eager_s * 1e3))
        inverse = {canon: orig for orig, canon in names.items()}
        if out.kernels is None:
            alts = [(skey.with_alternative(i), a) for i, a in enumerate(out.alternatives)]
            self.keys.update({akey.text: akey for akey, _ in alts})
            self.alternative_of.update({akey.text: a for akey, a in alts})
            self.alternatives[node.name] = [
                (akey.text, rename_kernels(a.kernels, inverse, a.output, node.outputs[0],
                                           prefix=node.name)) for akey, a in alts]
            return self.node_kernel(node)
        assert out.output is not None, "a chosen program names its output"
        kernels = rename_kernels(out.kernels, inverse, out.output, node.outputs[0],
                                 prefix=node.name)
        self.rewrite_keys[node.name] = key
        return kernels

    def assemble(self, on: frozenset[str]) -> Program:
        """The program with the rewrites whose decision key is in ``on`` and the original
        operators for the other rewritten subprograms; a subprogram whose original won alone
        runs its first alternative in ``on``, if any (:mod:`ollie.optimizer.context`)."""
        kernels: list[Kernel] = []
        for part in self.parts:
            if part.key is not None:
                kernels += part.chosen if part.key in on else \
                    [k for n in part.nodes for k in self.node_kernel(n)]
                continue
            alt = next((ks for k, ks in self.alternatives.get(part.nodes[0].name, [])
                        if k in on), None)
            kernels += part.chosen if alt is None else alt
        inputs = tuple((n, tuple(self.graph.shape(n))) for n in self.graph.input_names)
        return Program(inputs, tuple(self.graph.outputs), kernels, self.constants)

    def groups(self) -> list[Group]:
        """The distinct rewritten subprograms, with the time their rewrite saved alone, and
        the alternatives of those whose original won (:attr:`Group.alternative`)."""
        nodes: dict[str, list[str]] = {}
        uses: dict[str, int] = {}
        for part in self.parts:
            names = [n.name for n in part.nodes]
            alts = [akey for akey, _ in self.alternatives.get(names[0], [])]
            for key in ([part.key] if part.key is not None else []) + alts:
                nodes.setdefault(key, []).extend(names)
                uses[key] = uses.get(key, 0) + 1
        out = []
        for key, names in nodes.items():
            alt = self.alternative_of.get(key)
            if alt is None:
                done = (self.merged.get(key) or self.chained.get(key) or
                        self.regioned.get(key) or self.memo[key])
                saving = done.original_s - done.optimized_s
            else:
                saving = self.memo[self.keys[key].base.text].original_s - alt.seconds
            out.append(Group(key, tuple(names), uses[key] * max(saving, 0.0),
                             alt.label if alt is not None else ""))
        return out

    def search(self, node: Node, expr: Expr, weights: Mapping[str, np.ndarray],
               channels_last: frozenset[str] = frozenset()) -> Outcome | None:
        """The decision for a subprogram: from the decision cache, or by search + selection
        (inputs in ``channels_last`` measured as channels-last tensors) for its share of the
        total budget; None when that is spent (:mod:`ollie.optimizer.budget`)."""
        cfg = self.config
        fp = fingerprint(expr)
        keys = self.budget.keys(cfg, fp, channels_last)
        for key in keys:
            doc = None if self.cache is None else self.cache.get_decision(key)
            cached = None if doc is None else cached_outcome(doc, expr, weights)
            if cached is not None:
                return cached
        share = self.budget.share_for(self.cache, cfg, fp, channels_last)
        if share is None:
            return None
        t0 = self.budget.clock()
        out = self._search(node, expr, weights, channels_last, share)
        self.budget.searched(share, self.budget.clock() - t0)
        log.info("%s: searched for %.1f s, decided in %.1f s; %.1f s of the total budget left",
                 node.describe(), share, self.budget.clock() - t0, self.budget.left())
        key = keys[share < cfg.time_budget]  # a shorter search: kept apart
        if out.unconfirmed:
            self.note(f"{node.describe()}: measured under load; not cached")
        elif self.cache is not None:
            try:
                self.cache.put_decision(key, out.to_json())
            except FormatError as exc:  # a kernel Ollie cannot write as data: not cached
                log.info("%s: decision not cached (%s)", node.describe(), exc)
        return out

    def _search(self, node: Node, expr: Expr, weights: Mapping[str, np.ndarray],
                channels_last: frozenset[str], time_budget: float) -> Outcome:
        cfg = self.config
        inputs = {n: (weights[n] if n in weights else
                      self.rng.standard_normal(s).astype(np.float32)) for n, s in expr.decls}
        with memory_guard():
            with self.budget.phase("search"):
                roof = machine_roofline(cfg.device, self.cache)
                res = derive(expr, max_depth=cfg.max_depth, time_budget=time_budget, config=(
                    SearchConfig(max_candidates=cfg.max_candidates, seed=cfg.seed,
                                 guided_depth=cfg.guided_depth, roofline=roof)))
            args = (node, expr, inputs, weights, cfg.device, channels_last)
            original = original_runner(*args)
            cands, short = res.candidates, dict[str, Any]()
            with self.budget.phase("selection"):
                if self.budget.bounded:  # the few plausible candidates, measured for at most
                    # the search's share (ollie.optimizer.plausible)
                    cands = plausible(cands, original_seconds(original, cfg.device))
                    short = {"max_seconds": max(time_budget, MIN_SHARE)}
                sel = select(expr, cands, original, inputs, weights, cfg.device, self.cache,
                             limit=cfg.max_candidates, channels_last=channels_last,
                             eager=eager_runner(*args), **short)
        best = sel.best
        kept = best if best.program is None else sel.original  # the original, if it is kept
        ncand = res.stats["candidates"]
        if best.program is None or best.candidate is None:
            alternatives = [
                Alternative(list(m.candidate.kernels), m.candidate.output,
                             m.program.summary(), m.candidate.derivation, m.seconds)
                for m in sel.alternatives() if m.candidate is not None and
                m.program is not None] if torch.device(cfg.device).type == "cpu" else []
            out = Outcome(None, None, "original operator", [], sel.baseline.seconds,
                          best.seconds, ncand, alternatives)
        else:
            cand = best.candidate
            out = Outcome(list(cand.kernels), cand.output, best.program.summary(),
                          cand.derivation, sel.baseline.seconds, best.seconds, ncand)
        return replace(out, eager_s=sel.eager.seconds if sel.eager else None,
                       original_library=TORCH if kept is sel.eager else None,
                       unconfirmed=sel.unconfirmed)


def optimize(model: object, example_inputs: Sequence[torch.Tensor] | None = None,
             device: str = "cpu", config: OptimizeConfig | None = None,
             progress: Callable[[str, int, int], None] | None = None, **overrides: Any
             ) -> OptimizedModel:
    """Optimise a model (API.md): returns a callable program with a ``report``.

    ``model``: a ``torch.nn.Module`` (in eval mode for inference), a path to an ``.onnx``
    file or an ``onnx.ModelProto``. ``example_inputs``: one tensor per model input (a lone
    tensor is one input); a module needs them, and for an ONNX model their shapes fix its
    symbolic dimensions (``"batch"``), which cannot be optimised without them. A program
    that disagrees with the model on random inputs or on the example inputs is not used.

    Ollie optimises float32 models and its programs compute in float32: a module with a
    float16 / bfloat16 / float64 parameter or buffer, or a model whose inputs are not float32
    (an ONNX input of another element type, an example tensor of another dtype), is refused
    with an :class:`~ollie.errors.UnsupportedError` naming it and saying what to convert
    (``model.float()``, ``x.float()``). The program is then called with tensors (or numpy
    arrays) of the example inputs' shapes on ``device``, float32 or converted to it from
    another floating-point dtype, in any layout; an integer, boolean or complex input,
    another shape or device, a meta tensor or None raises a
    :class:`~ollie.errors.ShapeError` naming the input, what it expected and what it got
    (:meth:`ollie.exec.executor.CompiledProgram.__call__`). NaN and infinities in the
    inputs give NaN and infinities where the model gives them.

    Every error raised on purpose is an :class:`~ollie.errors.OllieError`."""
    cfg = replace(config or OptimizeConfig(), device=device, **overrides)
    try:
        with using(implementations=cfg.implementations()):  # OptimizeConfig.kernel_library
            result = _optimize(model, example_inputs, cfg, progress)
        result.notes[:0] = cfg.switch_notes()
        return result
    except OllieError:
        raise
    except Exception as exc:
        raise InternalError(f"optimize failed unexpectedly ({cause(exc)}); the model itself "
                            "is unchanged. Please report this with the model") from exc
    finally:
        release_caches()


def _optimize(model: object, example_inputs: Sequence[torch.Tensor] | None,
              cfg: OptimizeConfig, progress: Callable[[str, int, int], None] | None
              ) -> OptimizedModel:
    t0 = time.perf_counter()
    budget = Budget(cfg.total_budget, cfg.time_budget, current().budget_clock)
    module = model if isinstance(model, torch.nn.Module) else None
    mkey = key_of(module, example_inputs, cfg)
    # every phase in the budget; once it is spent, no new library choice is measured; the
    # choices measured are kept in the cache for the next process (tune.cache.choice_store)
    with using(new_choices=budget.may_choose,
               choice_store=choice_store(cfg.use_cache, cfg.device)):
        hit = None if module is None else recalled_module(module, mkey, example_inputs, cfg, t0)
        if hit is not None:  # found by the module's own key: not imported again
            return hit
        with budget.phase("import"):  # checked against a module unless its program is recalled
            graph = to_graph(model, example_inputs, check=False)
        return with_structure(module, example_inputs, remembered(
            graph, cfg, example_inputs, lambda: _optimize_graph(checked_import(
                graph, model, example_inputs), cfg, progress, example_inputs, budget, t0),
            t0, module, mkey))


def _optimize_graph(graph: Graph, cfg: OptimizeConfig,
                    progress: Callable[[str, int, int], None] | None,
                    example_inputs: Sequence[torch.Tensor] | None, budget: Budget,
                    t0: float) -> OptimizedModel:
    """:func:`_optimize` once the model is a graph (``t0``: when it started)."""
    opt = _Optimizer(graph, cfg, progress, budget)
    raw = opt.run()
    with budget.phase("program"):
        prog = postprocess(raw)
        rewritten = any(r.chosen != ORIGINAL for r in opt.report)
        originals = postprocess(opt.assemble(frozenset())) if rewritten else None
        if torch.device(cfg.device).type == "cpu":  # kernels fused across subprograms
            precompile_programs([p for p in (prog, originals) if p is not None])
    notes = [*opt.notes, describe_postprocess(raw, prog)]
    with budget.phase("check"):
        ref = reference(graph, cfg, notes, example_inputs)
        prog, decision, which = checked(graph, prog, raw, cfg, notes, opt.cache, originals,
                                        ref, timed=budget.may_compare())
    report = opt.report
    chosen_originals = alternative_of(decision) == ORIGINALS
    if chosen_originals:
        report = kept_originals(report)
        notes.append(f"kept the {ORIGINALS}: the whole program with the rewritten subprograms "
                     f"was not {ALTERNATIVE_MARGIN:.0%} faster than with them (times above)")
    groups = opt.groups() if which == "optimised" and cfg.context and \
        torch.device(cfg.device).type == "cpu" else []
    if groups:
        start = frozenset() if chosen_originals else \
            frozenset(g.key for g in groups if not g.alternative)
        t1 = time.perf_counter()
        library = decision.choice if decision is not None else PER_OPERATOR
        timed = budget.may_compare()
        try:
            with budget.phase("context"):
                refined = cached_refine(opt.assemble, groups, start, library, ref, opt.cache,
                                        cfg.device, cfg.settle, timed, budget.spent, budget.left)
        except Exception as exc:  # optional: the checked program stays
            notes.append(f"program context step skipped: {cause(exc)}")
            log.warning("program context step skipped: %s", cause(exc))
            refined = None
        if refined is not None and refined.on != start and \
                confirm(refined.program, ref, cfg, "program context step's", notes) is None:
            refined = None
        if refined is not None and refined.on != start:
            prog = refined.program
            off = {n for g in groups if not g.alternative and g.key not in refined.on
                   for n in g.nodes}
            report = switched_on(kept_originals(opt.report, off), {
                n: opt.alternative_of[g.key] for g in groups
                if g.alternative and g.key in refined.on for n in g.nodes})
        if refined is not None:
            notes.append(f"{refined.note}; {time.perf_counter() - t1:.1f} s")
        elif not timed:
            notes.append("program context step skipped: the total time budget ran out "
                         "and no choice was cached")
    notes += [budget.describe()] if budget.bounded else []
    notes.append(f"optimised in {time.perf_counter() - t0:.1f} s")
    return OptimizedModel(prog, report, notes, tuple(graph.input_names), cfg.device,
                          compiled=ref.compiled(prog, cfg.device))


__all__ = ["OptimizeConfig", "OptimizedModel", "load", "optimize"]
