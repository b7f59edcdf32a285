"""Fused contraction chains in the model optimiser (:mod:`ollie.graph.chains`).

A chain (a summing node and the window, padding, layout and product nodes feeding only it) is
one subprogram when that is faster than its nodes run alone:

1. **expression fusion**: each node is lowered and the chain becomes an
   :class:`~ollie.ir.exprprogram.ExprProgram` whose Sum-free defs are inlined into their
   readers (:func:`ollie.rules.inter_program.normalize_program`), leaving one expression for
   the sink's output, over the chain's inputs renamed ``x0, x1, ...``;
2. its nested scopes are inlined (**traversal merging**, repeated while it applies) and the
   flat expression is derived (:func:`ollie.search.derive`), both within
   :func:`~ollie.rules.base.assume_finite_inputs`: a zero-padded window read by a product
   becomes reads whose padding is a structural zero, so Longformer's ``pad / unfold / mul /
   sum`` matches G2BMM. That rewrite is exact for finite inputs only
   (docs/design/026-finite-inputs.md);
3. each candidate is checked against the reference interpreter on the *fused, unflattened*
   expression (strict semantics) and timed against the chain's nodes as the optimiser
   decided them alone (:func:`ollie.optimizer.select.select_program`); the fastest replaces
   them only when faster with confidence.

Decisions are memoised per canonical fused expression and kept in the decision cache
(:data:`CHAIN_VERSION`), checked to fit before they are reused.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ollie.errors import OllieError
from ollie.exec.executor import CompiledProgram
from ollie.fingerprint import fingerprint
from ollie.graph import Graph
from ollie.graph.chains import Chain
from ollie.ir import Expr, format_expr, rename_expr
from ollie.ir.exprprogram import ExprProgram
from ollie.optimizer.budget import search_key
from ollie.optimizer.memory import memory_guard
from ollie.optimizer.outcome import Placed
from ollie.optimizer.plausible import Allowance
from ollie.optimizer.region import MergeSettings, Part
from ollie.optimizer.rename import rename_kernels
from ollie.optimizer.report import SubprogramReport
from ollie.optimizer.select import as_input, select_program
from ollie.passes.postprocess import postprocess
from ollie.program.kernel import Kernel
from ollie.program.program import Program, constant_array
from ollie.program.serialize import FormatError, kernel_from_json, kernel_to_json
from ollie.rules.base import assume_finite_inputs
from ollie.rules.inter_program import normalize_program
from ollie.rules.traversal_merging import traversal_merging
from ollie.search import SearchConfig, derive
from ollie.search.candidate import Candidate, Step, program_key
from ollie.search.config import machine_roofline
from ollie.tune.cache import CostCache, device_key

log = logging.getLogger(__name__)

CHAIN_VERSION = 1
"""Part of a chain decision's cache key: bumped whenever what a decision holds changes."""

MAX_FLATTEN = 16
"""Most traversal-merging steps taken to flatten a fused chain before its search."""


@dataclass
class ChainOutcome:
    """The decision for one distinct chain on canonical names (inputs ``x<i>``, output
    ``y0``). ``kernels`` None: the nodes keep their own decisions."""

    kernels: list[Kernel] | None
    label: str
    derivation: list[str]
    original_s: float
    optimized_s: float
    candidates: int
    unconfirmed: bool = False

    def to_json(self) -> str:
        kernels = None if self.kernels is None else [kernel_to_json(k) for k in self.kernels]
        return json.dumps({**self.__dict__, "kernels": kernels})

    @classmethod
    def from_json(cls, text: str, inputs: Mapping[str, tuple[int, ...]],
                  shape: tuple[int, ...]) -> ChainOutcome:
        """The decision of a document of :meth:`to_json`, checked to compute ``y0`` of
        ``shape`` from canonical inputs of ``inputs``' shapes; ``FormatError``,
        ``ValueError``, ``TypeError`` or ``KeyError`` when it does not."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise FormatError("a chain decision is a JSON object")
        out = cls(**{**doc, "kernels": None if doc["kernels"] is None else
                     [kernel_from_json(k) for k in doc["kernels"]]})
        if out.kernels is not None:
            prog = Program(tuple(inputs.items()), ("y0",), out.kernels, {})
            prog.validate()
            if tuple(prog.tensor_shapes()["y0"]) != tuple(shape):
                raise FormatError("a chain decision's output has another shape")
        return out


FusedChain = Placed[ChainOutcome]
"""A chain as the model optimiser places it."""


def fused_expression(graph: Graph, chain: Chain
                     ) -> tuple[Expr, dict[str, str], dict[str, np.ndarray]] | None:
    """The chain's nodes fused into one expression of the sink's output over the chain's
    inputs renamed ``x0, x1, ...`` (their renaming, and the constants the lowering made), or
    None when the nodes do not lower or do not fuse into one expression."""
    defs, consts = [], {}
    produced = {n.outputs[0] for n in chain.members}
    decls: dict[str, tuple[int, ...]] = {}
    try:
        for node in chain.nodes:
            low = graph.lower_node(node)
            consts.update({n: np.asarray(v, np.float32) for n, v in low.consts.items()})
            decls.update((n, tuple(s)) for n, s in low.expr.decls if n not in produced)
            defs.append((node.outputs[0], low.expr))
        ep = ExprProgram(tuple(decls.items()), tuple(defs), (chain.sink.outputs[0],))
        ep.verify()
        fused = normalize_program(ep)
    except OllieError as exc:
        log.info("chain at %s not fused: %s", chain.sink.name, exc)
        return None
    if len(fused.defs) != 1:
        return None
    expr = fused.defs[0][1]
    names = {n: f"x{i}" for i, (n, _) in enumerate(expr.decls)}
    return rename_expr(expr, names), names, consts


def flatten(expr: Expr) -> tuple[Expr, int]:
    """``expr`` with nested scopes inlined by traversal merging (at most :data:`MAX_FLATTEN`
    steps, each the rule's first application), and the number of steps; call it within
    :func:`~ollie.rules.base.assume_finite_inputs` to inline zero-padded windows."""
    steps = 0
    while steps < MAX_FLATTEN:
        derived = traversal_merging(expr)
        if not derived:
            break
        expr = derived[0].expr
        steps += 1
    return expr, steps


def fuse_chain(graph: Graph, chain: Chain, individual: Sequence[Kernel],
               constants: Mapping[str, np.ndarray], config: MergeSettings,
               cache: CostCache | None, rng: np.random.Generator,
               memo: dict[str, ChainOutcome], allowance: Allowance) -> FusedChain | None:
    """The decision for ``chain`` (see the module docstring); ``individual`` holds the
    kernels its nodes got alone (the baseline), ``constants`` every constant tensor of the
    model by name, ``allowance`` what deciding it may spend. None when the chain does not
    fuse into one expression."""
    fused = fused_expression(graph, chain)
    if fused is None:
        return None
    expr, names, consts = fused
    constants = {**constants, **consts}
    inverse = {v: k for k, v in names.items()}
    key = f"chain|{fingerprint(expr)}"
    reused = key in memo
    if not reused:
        ckey, lookups = allowance.keys(
            f"{key}|chain{CHAIN_VERSION}|{device_key(config.device)}|"
            f"{search_key(config)}")
        found = None
        for lookup in lookups:
            doc = None if cache is None else cache.get_decision(lookup)
            if doc is None:
                continue
            try:
                found = ChainOutcome.from_json(doc, dict(expr.decls), tuple(expr.shape))
                break
            except (OllieError, ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring a malformed cached chain decision (%s)", str(exc)[:200])
        memo[key] = found or _decide(chain, expr, inverse, individual, constants, config,
                                     cache, rng, allowance)
        if cache is not None and found is None and not memo[key].unconfirmed:
            try:
                cache.put_decision(ckey, memo[key].to_json())
            except FormatError as exc:
                log.info("chain at %s: decision not cached (%s)", chain.sink.name, exc)
    out = memo[key]
    sink = chain.sink
    kernels = [] if out.kernels is None else \
        rename_kernels(out.kernels, inverse, "y0", sink.outputs[0], prefix=sink.name)
    ops = "+".join(n.op for n in chain.nodes)
    report = SubprogramReport(sink.name, sink.op, ops, out.label, list(out.derivation),
                              out.original_s * 1e3, out.optimized_s * 1e3, reused,
                              out.candidates, nodes=[n.name for n in chain.nodes])
    timed = math.isfinite(out.original_s)  # nothing verified: nothing was timed
    kept = ("fused into " + out.label if out.kernels is not None else
            "not fused (measured on a busy machine, not confirmed; not cached)"
            if out.unconfirmed else "not fused (its nodes are faster alone)" if timed else
            "not fused (no fused program verified; nothing timed)")
    note = f"chain {', '.join(n.name for n in chain.nodes)}: {kept}" + (
        f" ({out.original_s * 1e3:.3g} ms alone -> {out.optimized_s * 1e3:.3g} ms)"
        if timed else "")
    return FusedChain(key, out, kernels, report, note)


def _decide(chain: Chain, expr: Expr, inverse: Mapping[str, str],
            individual: Sequence[Kernel], constants: Mapping[str, np.ndarray],
            config: MergeSettings, cache: CostCache | None,
            rng: np.random.Generator, allowance: Allowance) -> ChainOutcome:
    """Flatten, search, verify and measure the fused chain against its nodes alone."""
    # a constant as the expression declares it (a scalar of the model is a [1] tensor there)
    inputs = {x: (np.reshape(constants[n], expr.inputs[x]) if n in constants else
                  rng.standard_normal(expr.inputs[x]).astype(np.float32))
              for x, n in inverse.items()}
    programs: list[tuple[Candidate, Program]] = []
    fuse = Step("expression_fusion", f"{len(chain.nodes)} nodes", format_expr(expr))
    with memory_guard(), assume_finite_inputs():
        flat, merges = flatten(expr)
        steps = [fuse, *(Step("traversal_merging", "flatten the fused chain", "")
                         for _ in range(merges))]
        res = derive(flat, max_depth=config.max_depth, time_budget=allowance.seconds,
                     config=SearchConfig(max_candidates=config.max_candidates, seed=config.seed,
                                         guided_depth=config.guided_depth,
                                         roofline=machine_roofline(config.device, cache)))
    consts = {x: constant_array(v) for x, v in inputs.items() if inverse[x] in constants}
    acts = tuple((x, tuple(v.shape)) for x, v in inputs.items() if x not in consts)
    for cand in allowance.first(res.candidates, config.max_candidates):
        kernels = rename_kernels(list(cand.kernels), {}, cand.output, "y0", prefix="c")
        try:
            prog = postprocess(Program(acts, ("y0",), kernels, consts))
        except Exception as exc:  # a candidate that fails to post-process is only skipped
            log.warning("chain candidate %s failed to post-process: %s", cand.summary(), exc)
            continue
        programs.append((replace(cand, kernels=kernels, output="y0",
                                 steps=[*steps, *cand.steps]), prog))
    alone = rename_kernels(list(individual), {n: x for x, n in inverse.items()},
                           chain.sink.outputs[0], "y0", prefix="b")
    read = {n for k in alone for n in k.inputs}
    base = Program(acts, ("y0",), alone,
                   {**{n: constant_array(v) for n, v in constants.items() if n in read},
                    **consts})
    compiled = CompiledProgram(postprocess(base), config.device)
    feed = {x: as_input(v, config.device, False) for x, v in inputs.items() if x not in consts}
    sel = select_program({"y0": expr}, programs, lambda: compiled.run(feed), inputs,
                         config.device, cache,
                         baseline_key=f"chain-nodes|{program_key(base.kernels)}",
                         **allowance.measuring())
    best = sel.best
    if best.candidate is None:
        return ChainOutcome(None, "its nodes alone", [], sel.baseline.seconds,
                            sel.baseline.seconds, res.stats["candidates"], sel.unconfirmed)
    return ChainOutcome(list(best.candidate.kernels), best.label, best.candidate.derivation,
                        sel.baseline.seconds, best.seconds, res.stats["candidates"])


def chain_baseline(chain: Chain, parts: Sequence[Part], chosen: Sequence[Kernel]
                   ) -> list[Kernel]:
    """The kernels the chain's members got alone (their ``parts``) followed by its sink's
    ``chosen``: what the chain runs when not fused."""
    members = {n.name for n in chain.members}
    return [k for p in parts if p.nodes[0].name in members for k in p.chosen] + list(chosen)


def splice(fused: FusedChain, chain: Chain, parts: Sequence[Part], kernels: list[Kernel],
           report: list[SubprogramReport], start: int) -> list[Part]:
    """Take the chain's members' kernels out of ``kernels`` and replace the report entries
    from ``start`` on by the chain's (both in place); the parts without the members', plus
    one part for the whole chain."""
    members = {n.name for n in chain.members}
    drop = {id(k) for p in parts if p.nodes[0].name in members for k in p.chosen}
    kernels[:] = [k for k in kernels if id(k) not in drop]
    report[start:] = [fused.report]
    return [p for p in parts if p.nodes[0].name not in members] + \
        [Part(chain.nodes, fused.key, fused.kernels)]


__all__ = ["CHAIN_VERSION", "ChainOutcome", "FusedChain", "chain_baseline", "flatten",
           "fuse_chain", "fused_expression", "splice"]
