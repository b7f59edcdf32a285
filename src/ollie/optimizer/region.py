"""Subprograms of several graph nodes in the model optimiser: sibling merging.

A sibling group (:func:`ollie.graph.siblings.sibling_groups`: compute operators reading one
activation and otherwise only constants, computing the same function of their constants, e.g.
an attention layer's Q/K/V projections, or concatenable ones, e.g. SqueezeNet's 1x1 / 3x3
expand pair) becomes one subprogram when that is faster:

1. each member is lowered, its tensors renamed canonically (the activation ``x0``, member
   ``i``'s constants ``w<i>_<j>``), and the members are merged into one expression ``M``:
   twins by stacking (:func:`ollie.rules.inter.merge_expressions`, with the new iterator ``g``
   leading and "inner": one Matmul with ``n`` the members' ``n`` summed), others by
   concatenation along their differing output iterator with their summation ranges relaxed to
   the hull (:func:`ollie.rules.inter_merge.concat_merge`: one convolution over the
   concatenated, zero-padded weights; exact for finite activations only, see there). The
   slices ``y<i>`` give back each member's output as eOperators (post-processing fuses them
   into their consumers, and folds the stacking of the constants at optimisation time);
2. each form of ``M`` is derived (:func:`ollie.search.derive`, the time budget shared among
   the forms), and each candidate, with the slices, is a program with one output per member;
3. every program is checked against the reference interpreter on every output and timed
   against the members run as their own decisions would run them
   (:func:`ollie.optimizer.select.select_program`); the fastest replaces them only when it is
   faster by :data:`MERGE_MARGIN`. Otherwise each member keeps its own decision.

Decisions are memoised per canonical merged expression (identical groups: one search) and
kept in the decision cache (:data:`MERGE_VERSION`), checked to fit before they are reused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import numpy as np

from ollie.errors import ExprError, OllieError
from ollie.exec.executor import CompiledProgram
from ollie.fingerprint import fingerprint
from ollie.graph import Graph, Node
from ollie.graph.siblings import canonical_members
from ollie.ir import Expr, format_expr, rename_expr
from ollie.match.eop import make_eop
from ollie.optimizer.budget import SearchSettings, search_key
from ollie.optimizer.memory import memory_guard
from ollie.optimizer.plausible import Allowance
from ollie.optimizer.rename import rename_kernels
from ollie.optimizer.report import SubprogramReport
from ollie.optimizer.select import MARGIN, as_input, layout_key, select_program
from ollie.passes.postprocess import postprocess
from ollie.program.kernel import Kernel
from ollie.program.program import Program, constant_array
from ollie.program.serialize import FormatError, kernel_from_json, kernel_to_json
from ollie.rules.inter import merge_expressions
from ollie.rules.inter_merge import concat_merge
from ollie.search import SearchConfig, derive
from ollie.search.candidate import Candidate, Step, program_key
from ollie.search.config import machine_roofline
from ollie.tune.cache import CostCache, device_key

log = logging.getLogger(__name__)

MERGE_VERSION = 1
"""Part of a merge decision's cache key: bumped whenever what a decision holds changes."""

MERGE_MARGIN = MARGIN
"""A merged program must be this much faster (fraction of the members' time) to be kept."""

G_PLACEMENTS: tuple[int | Literal["inner"], ...] = ("inner", 0)
"""The forms of the merged expression derived: ``g`` inner (one GEMM), ``g`` leading."""


class MergeSettings(SearchSettings, Protocol):
    """The settings sibling merging reads (:class:`ollie.optimizer.model.OptimizeConfig`):
    the search's (:class:`~ollie.optimizer.budget.SearchSettings`), the device and the seed."""

    @property
    def device(self) -> str: ...
    @property
    def seed(self) -> int: ...


@dataclass
class Part:
    """The kernels the model optimiser placed for ``nodes`` (one node, or a merged group),
    and their decision key when a rewrite was chosen for them (None otherwise)."""

    nodes: tuple[Node, ...]
    key: str | None
    chosen: list[Kernel]


@dataclass
class MergeOutcome:
    """The decision for one distinct sibling group, on canonical names (``x0``, ``w<i>_<j>``,
    outputs ``y<i>``). ``kernels`` None: the members keep their own decisions."""

    kernels: list[Kernel] | None
    outputs: tuple[str, ...]
    label: str
    derivation: list[str]
    original_s: float
    optimized_s: float
    candidates: int
    verified: list[tuple[str, float]] = field(default_factory=list)
    """Each verified merged program's label and time alone (seconds), fastest first."""
    unconfirmed: bool = False
    """Measured on a busy machine and not confirmed by a second measurement
    (:func:`ollie.optimizer.select.recheck`): the members keep their own decisions and the
    decision is not cached."""

    def to_json(self) -> str:
        kernels = None if self.kernels is None else [kernel_to_json(k) for k in self.kernels]
        return json.dumps({**self.__dict__, "kernels": kernels})

    @classmethod
    def from_json(cls, text: str, inputs: Mapping[str, np.ndarray],
                  shapes: Sequence[tuple[int, ...]]) -> MergeOutcome:
        """The decision of a document of :meth:`to_json`, checked to compute outputs of
        ``shapes`` from the canonical ``inputs`` (``x0`` and the constants);
        :class:`~ollie.program.serialize.FormatError`, ``ValueError``, ``TypeError`` or
        ``KeyError`` when it does not."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise FormatError("a merge decision is a JSON object")
        out = cls(**{**doc, "outputs": tuple(doc["outputs"]),
                     "verified": [(str(a), float(b)) for a, b in doc.get("verified", [])],
                     "kernels": None if doc["kernels"] is None else
                     [kernel_from_json(k) for k in doc["kernels"]]})
        if len(out.outputs) != len(shapes):
            raise FormatError("a merge decision names one output per member")
        if out.kernels is not None:
            prog = Program((("x0", tuple(inputs["x0"].shape)),), out.outputs, out.kernels,
                           {n: constant_array(v) for n, v in inputs.items() if n != "x0"})
            prog.validate()
            got = prog.tensor_shapes()
            if [tuple(got[o]) for o in out.outputs] != [tuple(s) for s in shapes]:
                raise FormatError("a merge decision's outputs have other shapes")
        return out


@dataclass
class MergedGroup:
    """A sibling group as the model optimiser places it: its decision key and outcome, its
    kernels on the model's tensor names (empty when not kept), its report entry, and a note
    for the notes of the result."""

    key: str
    outcome: MergeOutcome
    kernels: list[Kernel]
    report: SubprogramReport
    note: str


def merge_siblings(graph: Graph, nodes: Sequence[Node], individual: Sequence[list[Kernel]],
                   constants: Mapping[str, np.ndarray], config: MergeSettings,
                   cache: CostCache | None, rng: np.random.Generator,
                   channels_last: frozenset[str], memo: dict[str, MergeOutcome],
                   allowance: Allowance) -> MergedGroup | None:
    """The decision for the sibling group ``nodes`` (see the module docstring);
    ``individual`` holds each member's kernels as decided alone (the baseline), ``constants``
    every constant tensor of the model by name (the members' lowering constants included),
    ``channels_last`` the tensors the program likely holds channels-last, ``allowance`` what
    deciding it may spend. None when the members cannot be merged (neither stacked as twins
    nor concatenated)."""
    try:
        lows = [graph.lower_node(n) for n in nodes]
    except OllieError as exc:
        log.info("siblings %s not merged: %s", _names(nodes), exc)
        return None
    acts = {n for low in lows for n, _ in low.expr.decls if n not in constants}
    if len(acts) != 1:
        return None
    act = acts.pop()
    exprs, holes, inverse = canonical_members([low.expr for low in lows], act)
    try:
        forms = _forms(exprs, holes)
    except OllieError as exc:
        log.info("siblings %s not merged: %s", _names(nodes), exc)
        return None
    cl = frozenset({"x0"}) if act in channels_last else frozenset()
    key = f"merge|{fingerprint(forms[0][0])}{layout_key(cl)}"
    reused = key in memo
    if not reused:
        weights = {k: constants[v] for k, v in inverse.items() if k != "x0"}
        ckey, lookups = allowance.keys(
            f"{key}|merge{MERGE_VERSION}|{device_key(config.device)}|"
            f"{search_key(config)}")
        found = None if cache is None else next(
            (got for k in lookups
             if (got := _cached(cache.get_decision(k), graph, act, weights, exprs))), None)
        memo[key] = found or _decide(graph, nodes, individual, constants, config, cache, rng,
                                     cl, act, exprs, forms, weights, allowance)
        if cache is not None and found is None and not memo[key].unconfirmed:
            try:
                cache.put_decision(ckey, memo[key].to_json())
            except FormatError as exc:  # a kernel Ollie cannot write as data: not cached
                log.info("siblings %s: decision not cached (%s)", _names(nodes), exc)
    out = memo[key]
    ys = out.outputs
    inverse.update({y: n.outputs[0] for y, n in zip(ys, nodes, strict=True)})
    kernels = [] if out.kernels is None else \
        rename_kernels(out.kernels, inverse, ys[0], nodes[0].outputs[0], prefix=nodes[0].name)
    op = f"{nodes[0].op} x{len(nodes)}"
    report = SubprogramReport(nodes[0].name, op, op, out.label, list(out.derivation),
                              out.original_s * 1e3, out.optimized_s * 1e3, reused,
                              out.candidates, nodes=[n.name for n in nodes])
    return MergedGroup(key, out, kernels, report, _note(nodes, out))


def _cached(doc: str | None, graph: Graph, act: str, weights: Mapping[str, np.ndarray],
            exprs: Sequence[Expr]) -> MergeOutcome | None:
    """The cached decision ``doc`` when well formed and fitting (else None: decided again)."""
    if doc is None:
        return None
    inputs = {"x0": np.zeros(graph.shape(act), np.float32), **weights}
    try:
        return MergeOutcome.from_json(doc, inputs, [e.shape for e in exprs])
    except (OllieError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring a malformed cached merge decision (%s); deciding again",
                    str(exc)[:200])
        return None


def _forms(exprs: list[Expr], holes: list[tuple[str, ...]]
           ) -> list[tuple[Expr, list[Expr], str]]:
    """The merged expression, its slices and a description, for each distinct placement of
    ``g`` when the members are twins (stacking); otherwise the one concatenation (with
    relaxation, :func:`~ollie.rules.inter_merge.concat_merge`)."""
    out: list[tuple[Expr, list[Expr], str]] = []
    seen: set[str] = set()
    try:
        for g_at in G_PLACEMENTS:
            merged, slices = merge_expressions(exprs, holes, g_at)
            fp = fingerprint(merged)
            if fp not in seen:
                seen.add(fp)
                out.append((merged, slices, f"g at {g_at}"))
    except ExprError:
        cat = concat_merge(exprs, holes)
        return [(cat.merged, cat.slices, cat.note)]
    return out


def _decide(graph: Graph, nodes: Sequence[Node], individual: Sequence[list[Kernel]],
            constants: Mapping[str, np.ndarray], config: MergeSettings,
            cache: CostCache | None, rng: np.random.Generator, cl: frozenset[str], act: str,
            exprs: list[Expr], forms: list[tuple[Expr, list[Expr], str]],
            weights: dict[str, np.ndarray], allowance: Allowance) -> MergeOutcome:
    """Search, verify and measure the merged forms against the members' own decisions."""
    ys = tuple(f"y{i}" for i in range(len(nodes)))
    x = rng.standard_normal(graph.shape(act)).astype(np.float32)
    inputs = {"x0": x, **weights}
    programs: list[tuple[Candidate, Program]] = []
    ncand = 0
    with memory_guard():
        for merged, slices, how in forms:
            res = derive(merged, max_depth=config.max_depth,
                         time_budget=allowance.seconds / len(forms),
                         config=SearchConfig(max_candidates=config.max_candidates,
                                             guided_depth=config.guided_depth,
                                             seed=config.seed,
                                             roofline=machine_roofline(config.device, cache)))
            ncand += res.stats["candidates"]
            step = Step("expression_merging", f"{len(nodes)} siblings, {how}",
                        format_expr(merged))
            for cand in allowance.first(res.candidates, config.max_candidates):
                built = _with_slices(cand, merged, slices, ys, step, weights)
                if built is not None:
                    programs.append(built)
        baseline, base_key = _baseline(graph, nodes, individual, constants, config.device,
                                       act, x, bool(cl))
        sel = select_program(dict(zip(ys, exprs, strict=True)), programs, baseline, inputs,
                             config.device, cache, baseline_key=base_key,
                             margin=MERGE_MARGIN, channels_last=cl,
                             **allowance.measuring())
    verified = sorted(((m.label, m.seconds) for m in sel.measured), key=lambda v: v[1])
    best = sel.best
    if best.candidate is None:
        return MergeOutcome(None, ys, "their own decisions", [], sel.baseline.seconds,
                            sel.baseline.seconds, ncand, verified, sel.unconfirmed)
    return MergeOutcome(list(best.candidate.kernels), ys, best.label,
                        best.candidate.derivation, sel.baseline.seconds, best.seconds, ncand,
                        verified)


def _with_slices(cand: Candidate, merged: Expr, slices: list[Expr], ys: tuple[str, ...],
                 step: Step, weights: Mapping[str, np.ndarray]
                 ) -> tuple[Candidate, Program] | None:
    """The candidate for ``merged`` followed by one slice eOperator per output ``ys[i]``, as
    raw kernels (a :class:`Candidate` whose derivation starts with ``step``) and as a
    post-processed program; None when its tensor names clash with ``ys``."""
    used = {n for k in cand.kernels for n in (*k.inputs, k.output)}
    if used & set(ys):
        return None
    sliced = [make_eop(rename_expr(s, {"merged": cand.output}).root,
                       {cand.output: tuple(merged.shape)}, y)
              for s, y in zip(slices, ys, strict=True)]
    kernels = [*cand.kernels, *sliced]
    prog = Program((("x0", tuple(merged.inputs["x0"])),), ys, kernels,
                   {n: constant_array(v) for n, v in weights.items()})
    try:
        prog = postprocess(prog)
    except Exception as exc:  # a candidate that fails to post-process is only skipped
        log.warning("merged candidate %s failed to post-process: %s", cand.summary(), exc)
        return None
    return replace(cand, kernels=kernels, output=ys[0], steps=[step, *cand.steps]), prog


def _baseline(graph: Graph, nodes: Sequence[Node], individual: Sequence[list[Kernel]],
              constants: Mapping[str, np.ndarray], device: str, act: str, x: np.ndarray,
              channels_last: bool) -> tuple[Callable[[], object], str]:
    """The members run as their own decisions would (post-processed), on ``x``, and a cache
    key naming what it runs."""
    kernels = [k for ks in individual for k in ks]
    read = {n for k in kernels for n in k.inputs}
    prog = Program(((act, tuple(graph.shape(act))),), tuple(n.outputs[0] for n in nodes),
                   kernels, {n: constant_array(v) for n, v in constants.items() if n in read})
    prog = postprocess(prog)
    compiled = CompiledProgram(prog, device)
    feed = {act: as_input(x, device, channels_last)}
    return (lambda: compiled.run(feed)), f"members|{program_key(prog.kernels)}"


def _names(nodes: Sequence[Node]) -> str:
    return ", ".join(n.name for n in nodes)


def _note(nodes: Sequence[Node], out: MergeOutcome) -> str:
    """What the merge of ``nodes`` found, for the optimiser's notes."""
    head = f"siblings {_names(nodes)} merged into one subprogram"
    if not out.verified:
        return f"{head}: no merged program verified; each keeps its own decision"
    found = f"{len(out.verified)} program(s) verified (" + \
        "; ".join(f"{label} {s * 1e3:.3f} ms" for label, s in out.verified) + ")"
    if out.kernels is None and out.unconfirmed:
        return (f"{head}: {found}; measured under load and not confirmed by a second "
                "measurement: not kept, not cached")
    if out.kernels is None:
        return (f"{head}: {found}, none faster with confidence (margin at least "
                f"{MERGE_MARGIN:.0%}) than the members' own decisions "
                f"({out.original_s * 1e3:.3f} ms): not kept")
    return (f"{head}: {found}; kept {out.label}, {out.optimized_s * 1e3:.3f} ms against "
            f"{out.original_s * 1e3:.3f} ms")


__all__ = ["G_PLACEMENTS", "MERGE_MARGIN", "MergeOutcome", "MergeSettings", "MergedGroup",
           "Part", "merge_siblings"]
