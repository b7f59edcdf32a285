"""Linear regions of several compute operators as subprograms in the model optimiser.

A region of :func:`ollie.graph.partition.partition` (the paper's Algorithm 1: the connected
linear nodes between non-linear and opaque operators) with two or more compute operators,
none of them in a sibling group or a contraction chain, is one subprogram when that is
faster than its nodes decided alone (GCN's global-convolution block: four convolutions and
their sum):

1. its nodes are lowered into an :class:`~ollie.ir.exprprogram.ExprProgram` over the
   region's inputs and constants (renamed canonically, ``x<i>`` and ``y<i>``), its Sum-free
   defs (bias and folded-BatchNorm adds, layout) fused into their readers unless they are
   region outputs (:func:`normalized`);
2. one step of the program rules (:data:`~ollie.rules.inter_program.PROGRAM_RULES`: merging,
   with its sum mode, then fusion and splitting; inside
   :func:`~ollie.rules.base.assume_finite_inputs`, see docs/design/026-finite-inputs.md)
   gives the derived programs; those whose reduction work grows past
   :data:`~ollie.rules.inter_sum.MAX_SUM_GROWTH`, those with a def traversing a range that does
   not start at 0 (kernels store tensors from index 0), and those with a def summing over a
   summing scope (compute fused into compute: no library operator computes it, and its
   search costs ten times a convolution's) are dropped, the others ranked (merges first,
   then fewest summing defs, then least work) and the first :data:`MAX_PROGRAMS` kept;
3. in each, a def the rules left as it was runs its node's kernels as decided alone; every
   other def with a ``Sum`` is derived (:func:`ollie.search.derive`, the region's time split
   among them, 20% evenly and 80% by reduction work), a Sum-free one is an eOperator. The
   derived def with the most work contributes up to :data:`MAX_VARIANTS` candidates, each
   one program;
4. every program is checked against the reference interpreter on every region output (the
   region's defs inlined into one expression per output) on random inputs and timed against
   the nodes as decided alone (:func:`ollie.optimizer.select.select_program`, confident
   verdict); the fastest replaces them only when faster with confidence.

Decisions are memoised per canonical region program and kept in the decision cache
(:data:`REGION_VERSION`), checked to fit before they are reused. Limits and their reasons:
docs/design/030-regions-sum-merge.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ollie.errors import ExprError, OllieError
from ollie.exec.executor import CompiledProgram
from ollie.fingerprint import fingerprint, program_fingerprint
from ollie.graph import Graph
from ollie.graph.partition import Region
from ollie.ir import Expr, Scope, accesses, format_program
from ollie.ir.exprprogram import ExprProgram
from ollie.match.eop import make_eop
from ollie.optimizer.budget import search_key
from ollie.optimizer.memory import memory_guard
from ollie.optimizer.outcome import Placed
from ollie.optimizer.plausible import Allowance
from ollie.optimizer.region import MergeSettings
from ollie.optimizer.rename import rename_kernels
from ollie.optimizer.report import SubprogramReport
from ollie.optimizer.select import as_input, select_program
from ollie.passes.postprocess import postprocess
from ollie.program.kernel import Kernel
from ollie.program.program import Program, constant_array
from ollie.program.serialize import FormatError, kernel_from_json, kernel_to_json
from ollie.rules.base import assume_finite_inputs
from ollie.rules.inter_program import apply_program_rules, has_sum, inline_def
from ollie.rules.inter_sum import MAX_SUM_GROWTH, program_work, reduction_points
from ollie.search import SearchConfig, derive
from ollie.search.candidate import Candidate, Step, program_key
from ollie.search.config import machine_roofline
from ollie.tune.cache import CostCache, device_key

log = logging.getLogger(__name__)

REGION_VERSION = 1
"""Part of a region decision's cache key: bumped whenever what a decision holds changes."""

MIN_COMPUTE = 2
"""Fewest compute operators of a region derived as one subprogram (one alone is a node)."""

MAX_PROGRAMS = 3
"""Most derived programs of one region searched (one rule step each)."""

MAX_VARIANTS = 4
"""Most candidates of a program's largest derived def turned into programs."""

RULE_ORDER = ("expression_merging", "expression_fusion", "expression_splitting")
"""The program rules applied to a region, in the order their programs are ranked."""


@dataclass
class RegionOutcome:
    """The decision for one distinct region on canonical names (inputs ``x<i>``, outputs
    the ``y<i>`` of :meth:`ExprProgram.canonical`). ``kernels`` None: the nodes keep their own
    decisions."""

    kernels: list[Kernel] | None
    outputs: tuple[str, ...]
    label: str
    derivation: list[str]
    original_s: float
    optimized_s: float
    candidates: int
    verified: list[tuple[str, float]]
    programs: list[str]
    """The derived programs searched: each one's rule and note."""
    unconfirmed: bool = False

    def to_json(self) -> str:
        kernels = None if self.kernels is None else [kernel_to_json(k) for k in self.kernels]
        return json.dumps({**self.__dict__, "kernels": kernels})

    @classmethod
    def from_json(cls, text: str, ep: ExprProgram, constants: Mapping[str, np.ndarray]
                  ) -> RegionOutcome:
        """The decision of a document of :meth:`to_json`, checked to compute ``ep``'s outputs
        (their shapes) from its inputs; ``FormatError``, ``ValueError``, ``TypeError`` or
        ``KeyError`` when it does not."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise FormatError("a region decision is a JSON object")
        out = cls(**{**doc, "outputs": tuple(doc["outputs"]),
                     "verified": [(str(a), float(b)) for a, b in doc["verified"]],
                     "kernels": None if doc["kernels"] is None else
                     [kernel_from_json(k) for k in doc["kernels"]]})
        if out.outputs != ep.outputs:
            raise FormatError("a region decision names other outputs")
        if out.kernels is not None:
            prog = _program(ep, out.kernels, constants)
            prog.validate()
            shapes, want = prog.tensor_shapes(), ep.shapes()
            if any(tuple(shapes[o]) != tuple(want[o]) for o in ep.outputs):
                raise FormatError("a region decision's outputs have other shapes")
        return out


DerivedRegion = Placed[RegionOutcome]
"""A region as the model optimiser places it."""


def lower_region(graph: Graph, region: Region, constants: Mapping[str, np.ndarray]
                 ) -> tuple[ExprProgram, dict[str, str], dict[str, np.ndarray]] | None:
    """The region's nodes as a canonical program (inputs: the region's inputs and the
    constants its nodes read), the renaming (model name -> canonical) and the constants the
    lowering made; None when a node does not lower or has several outputs."""
    defs: list[tuple[str, Expr]] = []
    consts: dict[str, np.ndarray] = {}
    decls: dict[str, tuple[int, ...]] = {}
    produced = {o for n in region.nodes for o in n.outputs}
    try:
        for node in region.nodes:
            if len(node.outputs) != 1:
                return None
            low = graph.lower_node(node)
            consts.update({n: np.asarray(v, np.float32) for n, v in low.consts.items()})
            decls.update((n, tuple(s)) for n, s in low.expr.decls if n not in produced)
            defs.append((node.outputs[0], low.expr))
        ep = ExprProgram(tuple(decls.items()), tuple(defs), region.outputs).tidy()
        ep.verify()
    except OllieError as exc:
        log.info("region at %s not lowered: %s", region.nodes[0].name, exc)
        return None
    known = {**constants, **consts}
    if not any(n not in known for n, _ in ep.inputs):
        return None
    canon, names = ep.canonical()
    return canon, names, consts


def output_exprs(ep: ExprProgram) -> dict[str, Expr]:
    """Each output of ``ep`` as one expression over its inputs (every def inlined into its
    readers): the reference a region's programs are checked against. Raises
    :class:`~ollie.errors.ExprError` when an inlined def grows past the fusion bounds."""
    for name, _ in ep.defs:
        if ep.readers().get(name):
            ep = inline_def(ep, name)
    defs = dict(ep.defs)
    return {o: defs[o] for o in ep.outputs}


def normalized(ep: ExprProgram) -> ExprProgram:
    """``ep`` with its Sum-free defs that are not outputs inlined into their readers
    (:func:`~ollie.rules.inter_program.inline_def`; one past the fusion bounds stays): an
    output is computed anyway, so its readers read it, and an adding output stays a def the
    sum merge can rewrite."""
    for name, _ in ep.defs:
        expr = dict(ep.defs).get(name)
        if expr is not None and name not in ep.outputs and not has_sum(expr.root) and \
                ep.readers().get(name):
            try:
                ep = inline_def(ep, name)
            except ExprError:
                continue
    return ep


def derived_programs(ep: ExprProgram) -> list[tuple[ExprProgram, Step]]:
    """One step of the program rules on the :func:`normalized` ``ep`` (module docstring,
    step 2): the derived programs, normalised, with the step that made each."""
    norm = normalized(ep)
    base = max(program_work(norm.defs, norm.outputs), 1)
    found = []
    with assume_finite_inputs():
        derived = apply_program_rules(norm, RULE_ORDER)
    for d in derived:
        prog = normalized(d.program)
        work = program_work(prog.defs, prog.outputs)
        if work > MAX_SUM_GROWTH * base or any(_nested_sums(e.root) or _offset(e.root)
                                                for _, e in prog.defs):
            continue
        summing = sum(has_sum(e.root) for _, e in prog.defs)
        found.append(((RULE_ORDER.index(d.rule), summing, work),
                      (prog, Step(d.rule, d.note, format_program(prog)))))
    found.sort(key=lambda f: f[0])
    return [f[1] for f in found[:MAX_PROGRAMS]]


def _offset(scope: Scope) -> bool:
    """Whether a def's scope traverses a range not starting at 0 (a part of a split def):
    kernels store every tensor from index 0, so such a def is not materialised."""
    return any(it.lo != 0 for it in scope.traversal)


def _nested_sums(scope: Scope) -> bool:
    """Whether a scope with a ``Sum`` reads a scope with a ``Sum`` (inside ``scope``)."""
    inner = [a.source for a in accesses(scope.body) if isinstance(a.source, Scope)]
    if scope.summation and any(has_sum(s) for s in inner):
        return True
    return any(_nested_sums(s) for s in inner)


def derive_region(graph: Graph, region: Region, individual: Mapping[str, list[Kernel]],
                  constants: Mapping[str, np.ndarray], config: MergeSettings,
                  allowance: Allowance, cache: CostCache | None, rng: np.random.Generator,
                  memo: dict[str, RegionOutcome]) -> DerivedRegion | None:
    """The decision for ``region`` (module docstring); ``individual`` holds each node's
    kernels as decided alone (by node name: the baseline), ``constants`` every constant of
    the model by name, ``allowance`` what deciding it may spend. None when the region does
    not lower or no rule applies to it."""
    lowered = lower_region(graph, region, constants)
    if lowered is None:
        return None
    ep, names, consts = lowered
    try:
        references = output_exprs(ep)
    except ExprError as exc:
        log.info("region at %s not derived: %s", region.nodes[0].name, exc)
        return None
    constants = {**constants, **consts}
    inverse = {v: k for k, v in names.items()}
    # each constant as the expressions declare it (a scalar of the model is a [1] tensor there)
    decls = dict(ep.inputs)
    canon_consts = {c: np.reshape(constants[m], decls[c]) if c in decls else constants[m]
                    for c, m in inverse.items() if m in constants}
    # constants the nodes' own decisions made keep their names, and name the decision
    extra = {t: constants[t] for n in region.nodes for k in individual[n.name]
             for t in k.inputs if t not in names and t in constants}
    canon_consts.update(extra)
    key = f"region|{program_fingerprint(ep)}" + (f"|{','.join(sorted(extra))}" if extra else "")
    reused = key in memo
    if not reused:
        # keyed by the configured search budget, not by this region's share of a total one
        # (which differs from run to run); a shorter search is kept apart ("|partial"), and a
        # bounded run reuses either, as subprogram decisions are (optimizer.budget.Budget.keys)
        ckey, lookups = allowance.keys(
            f"{key}|region{REGION_VERSION}|{device_key(config.device)}|"
            f"{search_key(config)}")
        found = None
        for lookup in lookups:
            doc = None if cache is None else cache.get_decision(lookup)
            if doc is None:
                continue
            try:
                found = RegionOutcome.from_json(doc, ep, canon_consts)
                break
            except (OllieError, ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring a malformed cached region decision (%s)", str(exc)[:200])
        if found is None:
            programs = derived_programs(ep)
            if not programs:
                return None
            found = _decide(region, ep, references, names, programs, individual,
                            canon_consts, config, allowance, cache, rng)
            if cache is not None and not found.unconfirmed:
                try:
                    cache.put_decision(ckey, found.to_json())
                except FormatError as exc:
                    log.info("region at %s: decision not cached (%s)", region.nodes[0].name,
                             exc)
        memo[key] = found
    out = memo[key]
    kernels = [] if out.kernels is None else rename_kernels(
        out.kernels, inverse, "", "", prefix=f"{region.nodes[0].name}_region")
    ops = "+".join(n.op for n in region.nodes)
    first = region.nodes[0]
    report = SubprogramReport(first.name, f"region of {len(region.nodes)}", ops, out.label,
                              list(out.derivation), out.original_s * 1e3,
                              out.optimized_s * 1e3, reused, out.candidates,
                              nodes=[n.name for n in region.nodes])
    return DerivedRegion(key, out, kernels, report, _note(region, out))


def _program(ep: ExprProgram, kernels: list[Kernel], consts: Mapping[str, np.ndarray]
             ) -> Program:
    acts = tuple((n, tuple(s)) for n, s in ep.inputs if n not in consts)
    read = {n for k in kernels for n in k.inputs}
    return Program(acts, ep.outputs, kernels,
                   {n: constant_array(v) for n, v in consts.items() if n in read})


def _decide(region: Region, ep: ExprProgram, references: Mapping[str, Expr],
            names: Mapping[str, str], programs: list[tuple[ExprProgram, Step]],
            individual: Mapping[str, list[Kernel]], canon_consts: Mapping[str, np.ndarray],
            config: MergeSettings, allowance: Allowance, cache: CostCache | None,
            rng: np.random.Generator) -> RegionOutcome:
    """Derive, verify and measure ``programs`` against the nodes decided alone."""
    inputs = {n: (canon_consts[n] if n in canon_consts else
                  rng.standard_normal(s).astype(np.float32)) for n, s in ep.inputs}
    alone = rename_kernels([k for n in region.nodes for k in individual[n.name]], names, "",
                           "", prefix="alone")
    original = dict(normalized(ep).defs)
    own = {n: fingerprint(e) for n, e in original.items()}
    candidates: list[tuple[Candidate, Program]] = []
    ncand = 0
    share = replace(allowance, seconds=allowance.seconds / len(programs))
    with memory_guard():
        for p, (prog, step) in enumerate(programs):
            built, found = _compose(prog, step, own, alone, share, config, cache, f"p{p}")
            ncand += found
            for cand in built:
                try:
                    candidates.append((cand, postprocess(_program(ep, cand.kernels,
                                                                  canon_consts))))
                except Exception as exc:  # a candidate that fails to post-process is skipped
                    log.warning("region candidate %s failed to post-process: %s",
                                cand.summary(), exc)
        base = postprocess(_program(ep, alone, canon_consts))
        base.validate()  # generated code trusts the shapes its kernels declare
        compiled = CompiledProgram(base, config.device)
        feed = {n: as_input(v, config.device) for n, v in inputs.items()
                if n not in canon_consts}
        sel = select_program(references, candidates, lambda: compiled.run(feed), inputs,
                             config.device, cache,
                             baseline_key=f"region-nodes|{program_key(base.kernels)}",
                             **allowance.measuring())
    verified = sorted(((m.label, m.seconds) for m in sel.measured), key=lambda v: v[1])
    searched = [f"{s.rule}: {s.note}" for _, s in programs]
    best = sel.best
    if best.candidate is None:
        return RegionOutcome(None, ep.outputs, "its nodes alone", [], sel.baseline.seconds,
                             sel.baseline.seconds, ncand, verified, searched, sel.unconfirmed)
    return RegionOutcome(list(best.candidate.kernels), ep.outputs, best.label,
                         best.candidate.derivation, sel.baseline.seconds, best.seconds, ncand,
                         verified, searched)


def _compose(prog: ExprProgram, step: Step, own: Mapping[str, str], alone: list[Kernel],
             allowance: Allowance, config: MergeSettings, cache: CostCache | None, tag: str
             ) -> tuple[list[Candidate], int]:
    """The candidates of one derived program (module docstring, step 3) as raw kernels, and
    the number of candidates its searches found."""
    derived = {n: e for n, e in prog.defs
               if has_sum(e.root) and own.get(n) != fingerprint(e)}
    work = {n: reduction_points(e.root) for n, e in derived.items()}
    total = max(sum(work.values()), 1)
    found: dict[str, list[Candidate]] = {}
    ncand = 0
    for n, e in derived.items():
        seconds = allowance.seconds * (0.2 / len(derived) + 0.8 * work[n] / total)
        res = derive(e, max_depth=config.max_depth, time_budget=seconds,
                     config=SearchConfig(max_candidates=config.max_candidates,
                                         guided_depth=config.guided_depth, seed=config.seed,
                                         roofline=machine_roofline(config.device, cache)))
        ncand += res.stats["candidates"]
        found[n] = allowance.first(res.candidates, config.max_candidates)
        if not found[n]:
            return [], ncand
    stop = {n for n, _ in prog.inputs} | {n for n, _ in prog.defs}
    main = max(derived, key=work.__getitem__) if derived else None
    variants = found[main][:MAX_VARIANTS] if main is not None else [None]
    out = []
    for v, variant in enumerate(variants):
        kernels: list[Kernel] = []
        steps = [step]
        for n, e in prog.defs:
            if n in derived:
                cand = variant if n == main else found[n][0]
                assert cand is not None
                kernels += rename_kernels(list(cand.kernels), {}, cand.output, n,
                                          prefix=f"{tag}v{v}_{n}")
                steps += cand.steps if n == main else []
            elif own.get(n) == fingerprint(e):
                kernels += _produce(alone, n, stop - {n})
            else:
                kernels.append(make_eop(e.root, e.inputs, n))
        out.append(Candidate(_needed(kernels, prog.outputs), prog.outputs[0], steps=steps))
    return out, ncand


def _produce(kernels: list[Kernel], name: str, stop: set[str]) -> list[Kernel]:
    """The kernels among ``kernels`` producing ``name`` and what it reads, up to the tensors
    in ``stop`` (the program's other defs and its inputs), in order."""
    producer = {k.output: k for k in kernels}
    keep: set[int] = set()
    todo = [name]
    while todo:
        k = producer.get(todo.pop())
        if k is not None and id(k) not in keep:
            keep.add(id(k))
            todo += [t for t in k.inputs if t not in stop]
    return [k for k in kernels if id(k) in keep]


def _needed(kernels: list[Kernel], outputs: Sequence[str]) -> list[Kernel]:
    """``kernels`` without those no output needs, in order, each tensor produced once."""
    producer: dict[str, Kernel] = {}
    for k in kernels:
        producer.setdefault(k.output, k)
    keep: set[int] = set()
    todo = list(outputs)
    while todo:
        got = producer.get(todo.pop())
        if got is not None and id(got) not in keep:
            keep.add(id(got))
            todo += list(got.inputs)
    seen: set[str] = set()
    out = []
    for k in kernels:
        if id(k) in keep and k.output not in seen:
            seen.add(k.output)
            out.append(k)
    return out


def _note(region: Region, out: RegionOutcome) -> str:
    """What deriving ``region`` found, for the optimiser's notes."""
    head = f"region {', '.join(n.name for n in region.nodes)}"
    tried = "; ".join(out.programs) or "no derived program"
    found = ", ".join(f"{label} {s * 1e3:.3f} ms" for label, s in out.verified) or "none"
    if out.kernels is None:
        why = ("measured under load and not confirmed: not kept, not cached" if
               out.unconfirmed else "none faster with confidence than its nodes alone: "
               "not kept")
        return (f"{head}: derived [{tried}]; verified: {found}; nodes alone "
                f"{out.original_s * 1e3:.3f} ms; {why}")
    return (f"{head}: derived [{tried}]; kept {out.label}, {out.optimized_s * 1e3:.3f} ms "
            f"against {out.original_s * 1e3:.3f} ms for its nodes alone")


__all__ = ["MAX_PROGRAMS", "MAX_VARIANTS", "MIN_COMPUTE", "REGION_VERSION", "DerivedRegion",
           "RegionOutcome", "derive_region", "derived_programs", "lower_region",
           "output_exprs"]
