"""The program-level optimizer (paper Algorithm 1): ``ollie.optimize(model, ...)``.

1. Frontend: a ``torch.nn.Module`` (torch.export), an ``.onnx`` path or an ``onnx.ModelProto``
   becomes a graph; BatchNorm is folded into convolutions, identities removed.
2. The graph splits at its non-linear and opaque operators: every compute operator (Conv,
   ConvTranspose, MatMul, Gemm, G2BMM, GBMM) is a subprogram; the element-wise and layout
   operators around them become eOperators (fused with their neighbours later); operators
   without an expression (max pooling, softmax, unknown ones) run as they are (``Node``).
3. Each subprogram's expression is derived (hybrid derivation); identical subprograms (same
   expression up to tensor names: repeated blocks) are searched and measured once.
4. Measured selection against the original operator keeps the fastest verified program, so
   no subprogram gets slower.
5. Post-processing over the whole program: weights transformed at optimisation time, eOperator
   fusion across subprogram boundaries (an OffsetAdd with the following bias and ReLU),
   identity elimination.
6. The optimised program is checked against the original model on random inputs before it is
   returned; if it disagrees, Ollie falls back to the original operators and says so. On the
   CPU its libraries, and after a rewrite the original operators, are then chosen for the
   whole program by measurement (:mod:`ollie.optimizer.final`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ollie.caches import release_caches
from ollie.errors import OllieError, UnsupportedError, check_settings
from ollie.exec.dispatch import precompile_programs
from ollie.exec.executor import CompiledProgram
from ollie.fingerprint import fingerprint
from ollie.graph import COMPUTE_OPS, Graph, Node
from ollie.ir import Expr
from ollie.optimizer.context import Group, cached_refine
from ollie.optimizer.final import (
    ORIGINAL,
    ORIGINALS,
    checked,
    node_kernel,
    reference,
)
from ollie.optimizer.keys import SubprogramKey
from ollie.optimizer.libraries import ALTERNATIVE_MARGIN, PER_OPERATOR, alternative_of
from ollie.optimizer.memory import memory_guard
from ollie.optimizer.outcome import Outcome, cached_outcome
from ollie.optimizer.rename import rename_expr, rename_kernels
from ollie.optimizer.report import (
    Alternative,
    OptimizedModel,
    SubprogramReport,
    kept_originals,
    load,
    switched_on,
)
from ollie.optimizer.select import as_input, layout_key, select
from ollie.passes.postprocess import describe as describe_postprocess
from ollie.passes.postprocess import postprocess
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.program.program import Program, constant_array
from ollie.program.serialize import FormatError
from ollie.search import SearchConfig, derive
from ollie.search.config import machine_roofline
from ollie.search.instantiate import Instantiator
from ollie.tune.cache import CostCache, device_key
from ollie.tune.measure import SETTLE_SECONDS

log = logging.getLogger(__name__)
CHANNELS_LAST_OPS = ("Conv2d", "ConvTranspose2d")
"""Operators whose 4-D output the CPU runtime usually leaves channels-last (oneDNN), when kept
or run as a library ``Conv`` kernel."""
PASS_LAYOUT_OPS = ("Relu", "Tanh", "Sigmoid", "Add", "MaxPool2d")
"""Operators whose output keeps the memory format of a channels-last input: fused into the
convolution before them (activations, residual additions) or run by torch (max pooling)."""


@dataclass(frozen=True)
class OptimizeConfig:
    """Settings of :func:`optimize` (the CLI maps its flags onto these)."""

    device: str = "cpu"
    max_depth: int = 2
    time_budget: float = 30.0     # seconds of search per distinct subprogram
    max_candidates: int = 8       # candidates measured per subprogram
    use_cache: bool = True
    check_rtol: float = 1e-3
    seed: int = 0
    choose_libraries: bool = True  # CPU: time per-operator vs uniform convolution libraries
    context: bool = True          # CPU: switch each rewrite on / off in the whole program
    # CPU: seconds the cores idle before a sample next to an ONNX Runtime session whose threads
    # spin, in the whole-program comparisons (libraries, context); 0 skips it: a faster
    # optimisation whose comparisons of such programs are less faithful (the test suite)
    settle: float = SETTLE_SECONDS

    def __post_init__(self) -> None:
        kind, _, index = self.device.partition(":") if isinstance(self.device, str) else ("",
                                                                                        "", "")
        check_settings("OptimizeConfig", {
            "device": (self.device, kind in ("cpu", "cuda") and (not index or index.isdigit())
                       and (kind != "cuda" or torch.cuda.is_available()),
                       "'cpu', or 'cuda' / 'cuda:N' on a machine with a CUDA GPU"),
            "max_depth": (self.max_depth, self.max_depth >= 0, ">= 0"),
            "time_budget": (self.time_budget, self.time_budget > 0, "> 0 seconds"),
            "max_candidates": (self.max_candidates, self.max_candidates >= 0, ">= 0"),
            "check_rtol": (self.check_rtol, self.check_rtol > 0, "> 0"),
            "settle": (self.settle, self.settle >= 0, ">= 0 seconds"),
        })


# --------------------------------------------------------------------- frontend
def to_graph(model: object, example_inputs: Sequence[torch.Tensor] | torch.Tensor | None
             ) -> Graph:
    """The graph of a torch module, an ONNX path or an ONNX ModelProto, identities removed and
    BatchNorm folded. ``example_inputs``: a sequence of tensors, one per model input (a lone
    tensor is one input); a module needs them (they fix every shape), an ONNX model's
    symbolic dimensions are fixed by their shapes (its fixed ones must match). A module's
    graph is checked against the module on new inputs
    (:func:`ollie.frontend.torch_import.check_import`). A model that is not float32 raises
    :class:`~ollie.errors.UnsupportedError` saying what to convert."""
    from ollie.frontend import from_onnx, from_torch, onnx_import, torch_import
    from ollie.graph.passes import eliminate_identity, fold_batchnorm

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise OllieError("optimize(module, example_inputs): example inputs are needed to "
                             "trace a torch module")
        inputs = tuple(example_inputs)
        problem = torch_import.float32_problem(model, inputs)
        if problem is not None:
            raise UnsupportedError(problem)
        graph = fold_batchnorm(eliminate_identity(from_torch(model, inputs)))
        torch_import.check_import(graph, model, inputs)
        return graph
    if isinstance(model, (str, Path)) or type(model).__name__ == "ModelProto":
        proto, source = onnx_import.load_onnx(model)
        problem = onnx_import.float32_problem(proto, source)
        if problem is not None:
            raise UnsupportedError(problem)
        shapes = None if example_inputs is None else \
            onnx_import.example_shapes(proto, source, tuple(example_inputs))
        graph = from_onnx(proto, shapes, source=source)
        return fold_batchnorm(eliminate_identity(graph))
    raise OllieError(f"cannot optimize a {type(model).__name__}: expected a "
                     "torch.nn.Module, an .onnx path or an onnx.ModelProto")


# --------------------------------------------------------------------- the optimizer
class _Optimizer:
    def __init__(self, graph: Graph, config: OptimizeConfig,
                 progress: Callable[[str, int, int], None] | None) -> None:
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
        self.parts: list[tuple[Node, str | None, list[Kernel]]] = []
        """Per graph node: its decision key when a rewrite was chosen for it, and its kernels
        (:meth:`assemble`)."""
        self.rewrite_keys: dict[str, str] = {}
        """Decision key of each node that got a rewrite (:meth:`compute_node`)."""
        self.alternatives: dict[str, list[tuple[str, list[Kernel]]]] = {}
        """Per node whose original operator won alone: its alternatives' keys and kernels,
        switched on only by the context step (:meth:`assemble`)."""
        self.alternative_of: dict[str, Alternative] = {}
        """Each alternative by its key."""
        self.keys: dict[str, SubprogramKey] = {}
        """Each key above (:attr:`SubprogramKey.text`) as the value it names."""

    def run(self) -> Program:
        kernels: list[Kernel] = []
        total = sum(n.op in COMPUTE_OPS for n in self.graph.nodes)
        done = 0
        for node in self.graph.nodes:
            if node.op in COMPUTE_OPS:
                if self.progress:
                    self.progress(node.name, done, total)
                chosen = self.compute_node(node)
                done += 1
            else:
                chosen = self.other_node(node)
            kernels += chosen
            self.track_layout(node, chosen)
            self.parts.append((node, self.rewrite_keys.get(node.name), chosen))
        if self.progress:
            self.progress("", done, total)
        inputs = tuple((n, tuple(self.graph.shape(n))) for n in self.graph.input_names)
        return Program(inputs, tuple(self.graph.outputs), kernels, self.constants)

    def track_layout(self, node: Node, chosen: list[Kernel]) -> None:
        """Record whether ``node``'s output will likely be channels-last when the program runs
        on the CPU, given the kernels chosen for it: a convolution kept as it is or run as a
        library ``Conv`` kernel (oneDNN's packed convolutions write channels-last), or an
        operator of :data:`PASS_LAYOUT_OPS` reading such a tensor. Later subprograms reading
        it are measured with it channels-last."""
        out = node.outputs[0]
        if self.config.device != "cpu" or len(self.graph.shape(out)) != 4 or not chosen:
            return
        if node.op in CHANNELS_LAST_OPS:
            likely = chosen[-1].kind in (KernelKind.NODE, KernelKind.CONV)
        else:
            likely = node.op in PASS_LAYOUT_OPS and \
                any(n in self.channels_last for n in node.inputs)
        if likely:
            self.channels_last.add(out)

    def node_kernel(self, node: Node) -> list[Kernel]:
        """The node run as it is, by the reference executor."""
        return [node_kernel(self.graph, node)]

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
        best = next((o for o in opts if all(k.kind is KernelKind.EOP for k in o.kernels)),
                    opts[0])
        self.constants.update({n: np.asarray(v, np.float32) for n, v in low.consts.items()})
        return rename_kernels(list(best.kernels), {}, best.output, node.outputs[0],
                              prefix=node.name)

    def compute_node(self, node: Node) -> list[Kernel]:
        try:
            low = self.graph.lower_node(node)
        except OllieError as exc:
            self.note(f"{node.describe()}: kept as is ({exc})")
            return self.node_kernel(node)
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
                self.memo[key] = self.search(node, expr, weights, cl)
            except Exception as exc:  # never lose the model to one subprogram
                self.note(f"{node.describe()}: kept as is (its search failed: "
                          f"{_cause(exc)})")
                log.debug("search of %s failed", node.describe(), exc_info=True)
                return self.node_kernel(node)
        out = self.memo[key]
        self.report.append(SubprogramReport(node.name, node.op, node.op, out.label,
                                            out.derivation, out.original_s * 1e3,
                                            out.optimized_s * 1e3, reused, out.candidates))
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
        for node, key, chosen in self.parts:
            if key is not None:
                kernels += chosen if key in on else self.node_kernel(node)
                continue
            alt = next((ks for k, ks in self.alternatives.get(node.name, []) if k in on), None)
            kernels += chosen if alt is None else alt
        inputs = tuple((n, tuple(self.graph.shape(n))) for n in self.graph.input_names)
        return Program(inputs, tuple(self.graph.outputs), kernels, self.constants)

    def groups(self) -> list[Group]:
        """The distinct rewritten subprograms, with the time their rewrite saved alone, and
        the alternatives of those whose original won (:attr:`Group.alternative`)."""
        nodes: dict[str, list[str]] = {}
        for node, key, _ in self.parts:
            if key is not None:
                nodes.setdefault(key, []).append(node.name)
            for akey, _ in self.alternatives.get(node.name, []):
                nodes.setdefault(akey, []).append(node.name)
        out = []
        for key, names in nodes.items():
            alt = self.alternative_of.get(key)
            if alt is None:
                saving = self.memo[key].original_s - self.memo[key].optimized_s
            else:
                saving = self.memo[self.keys[key].base.text].original_s - alt.seconds
            out.append(Group(key, tuple(names), len(names) * max(saving, 0.0),
                             alt.label if alt is not None else ""))
        return out

    def search(self, node: Node, expr: Expr, weights: Mapping[str, np.ndarray],
               channels_last: frozenset[str] = frozenset()) -> Outcome:
        """The decision for a subprogram: from the decision cache, or by search + selection
        (inputs in ``channels_last`` measured as channels-last tensors)."""
        cfg = self.config
        # "decision2": the key's version, bumped when what a decision holds changes
        # (history: docs/design/010-caches.md)
        key = (f"decision2|{fingerprint(expr)}|{device_key(cfg.device)}|depth{cfg.max_depth}|"
               f"budget{cfg.time_budget:g}|cands{cfg.max_candidates}"
               f"{layout_key(channels_last)}")
        if self.cache is not None:
            doc = self.cache.get_decision(key)
            cached = None if doc is None else cached_outcome(doc, expr, weights)
            if cached is not None:
                return cached
        out = self._search(node, expr, weights, channels_last)
        if self.cache is not None:
            try:
                self.cache.put_decision(key, out.to_json())
            except FormatError as exc:  # a kernel Ollie cannot write as data: not cached
                log.info("%s: decision not cached (%s)", node.describe(), exc)
        return out

    def _search(self, node: Node, expr: Expr, weights: Mapping[str, np.ndarray],
                channels_last: frozenset[str]) -> Outcome:
        cfg = self.config
        inputs = {n: (weights[n] if n in weights else
                      self.rng.standard_normal(s).astype(np.float32)) for n, s in expr.decls}
        with memory_guard():
            res = derive(expr, max_depth=cfg.max_depth, time_budget=cfg.time_budget,
                         config=SearchConfig(max_candidates=cfg.max_candidates, seed=cfg.seed,
                                             roofline=machine_roofline(cfg.device, self.cache)))
            sel = select(expr, res.candidates,
                         self.original(node, expr, inputs, weights, channels_last),
                         inputs, weights, cfg.device, self.cache, limit=cfg.max_candidates,
                         channels_last=channels_last)
        best = sel.best
        ncand = res.stats["candidates"]
        if best.program is None or best.candidate is None:
            alternatives = [
                Alternative(list(m.candidate.kernels), m.candidate.output,
                             m.program.summary(), m.candidate.derivation, m.seconds)
                for m in sel.alternatives() if m.candidate is not None and
                m.program is not None] if torch.device(cfg.device).type == "cpu" else []
            return Outcome(None, None, "original operator", [], sel.baseline.seconds,
                            sel.baseline.seconds, ncand, alternatives)
        cand = best.candidate
        return Outcome(list(cand.kernels), cand.output, best.program.summary(),
                        cand.derivation, sel.baseline.seconds, best.seconds, ncand)

    def original(self, node: Node, expr: Expr, inputs: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray],
                 channels_last: frozenset[str] = frozenset()) -> Callable[[], object]:
        """The original operator as the optimised program would run it if kept (a ``Node``
        kernel of the executor, weights as constants: a convolution's weight packed once),
        on ``inputs``: the baseline every candidate must beat."""
        canon = Node(node.op, tuple(n for n, _ in expr.decls), node.outputs,
                     dict(node.attrs), node.name)
        kernel = Kernel(KernelKind.NODE, NodeParams(node=canon, op=canon.op), canon.inputs,
                        canon.outputs[0], None, (), tuple(expr.shape))
        prog = Program(tuple((n, s) for n, s in expr.decls if n not in weights),
                       (canon.outputs[0],), [kernel],
                       {n: np.asarray(v, np.float32) for n, v in weights.items()})
        compiled = CompiledProgram(prog, self.config.device)
        feed = {n: as_input(inputs[n], self.config.device, n in channels_last)
                for n, _ in prog.inputs}
        return lambda: compiled.run(feed)

    def note(self, text: str) -> None:
        log.warning(text)
        self.notes.append(text)


def _cause(exc: BaseException) -> str:
    """``exc`` in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


class InternalError(OllieError):
    """An unexpected failure inside Ollie (a bug): the message names the cause; the original
    exception is chained (``__cause__``)."""


def canonical_names(expr: Expr) -> tuple[Expr, dict[str, str]]:
    """``expr`` with its declared tensors renamed ``x0, x1, ...`` in declaration order (so
    identical subprograms fingerprint alike), and the renaming."""
    names = {n: f"x{i}" for i, (n, _) in enumerate(expr.decls)}
    return rename_expr(expr, names), names


def optimize(model: object, example_inputs: Sequence[torch.Tensor] | None = None,
             device: str = "cpu", config: OptimizeConfig | None = None,
             progress: Callable[[str, int, int], None] | None = None, **overrides: Any
             ) -> OptimizedModel:
    """Optimise a model (API.md): returns a callable program with a ``report``.

    ``model``: a ``torch.nn.Module`` (in eval mode for inference), a path to an ``.onnx``
    file or an ``onnx.ModelProto``. ``example_inputs``: one tensor per model input (a lone
    tensor is one input); a module needs them, and for an ONNX model their shapes fix its
    symbolic dimensions (``"batch"``), which cannot be optimised without them; only their
    shapes matter.

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
        return _optimize(model, example_inputs, cfg, progress)
    except OllieError:
        raise
    except Exception as exc:
        raise InternalError(f"optimize failed unexpectedly ({_cause(exc)}); the model itself "
                            "is unchanged. Please report this with the model") from exc
    finally:
        release_caches()


def _optimize(model: object, example_inputs: Sequence[torch.Tensor] | None,
              cfg: OptimizeConfig, progress: Callable[[str, int, int], None] | None
              ) -> OptimizedModel:
    t0 = time.perf_counter()
    graph = to_graph(model, example_inputs)
    opt = _Optimizer(graph, cfg, progress)
    raw = opt.run()
    prog = postprocess(raw)
    notes = [*opt.notes, describe_postprocess(raw, prog)]
    rewritten = any(r.chosen != ORIGINAL for r in opt.report)
    originals = postprocess(opt.assemble(frozenset())) if rewritten else None
    if torch.device(cfg.device).type == "cpu":  # kernels fused across subprograms: new code
        precompile_programs([p for p in (prog, originals) if p is not None])
    ref = reference(graph, cfg, notes)
    prog, decision, which = checked(graph, prog, raw, cfg, notes, opt.cache, originals, ref)
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
        try:
            refined = cached_refine(opt.assemble, groups, start, library, ref, opt.cache,
                                    cfg.device, cfg.settle)
        except Exception as exc:  # optional: the checked program stays
            notes.append(f"program context step skipped: {_cause(exc)}")
            log.warning("program context step skipped: %s", _cause(exc))
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
    notes.append(f"optimised in {time.perf_counter() - t0:.1f} s")
    return OptimizedModel(prog, report, notes, tuple(graph.input_names), cfg.device)


__all__ = ["OptimizeConfig", "OptimizedModel", "load", "optimize"]
