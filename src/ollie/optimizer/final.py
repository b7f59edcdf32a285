"""The optimised program's last steps in ``ollie.optimize``: the end-to-end check against the
original model on random inputs and on the example inputs, and the program-level choice of
libraries and (after a rewrite) of the original operators, kept in the cost cache.

The check runs every program it returns on the example inputs too (:func:`confirm`): random
standard-normal inputs miss what only the values a user passes exercise (a float attention
mask of zeros, where any non-zero value masks every position). The first of (post-processed
program, program without post-processing, every operator as it is) that matches the model is
kept; on the CPU, :func:`ollie.optimizer.libraries.choose_libraries` then times its library
variants, and, when some subprogram was rewritten,
those of the model's original operators (post-processed the same way): a rewrite that won
alone can lose in the program (an isolated original operator runs with cold caches; in an
ONNX Runtime region, ONNX Runtime fuses it with its neighbours).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from ollie.errors import OllieError
from ollie.exec.dispatch import pin_cuda_configs
from ollie.exec.executor import CompiledProgram
from ollie.exec.precision import full_fp32, tf32
from ollie.graph import Graph, Node, run_graph
from ollie.optimizer.libraries import (
    ALTERNATIVE_MARGIN,
    CHOICES,
    LibraryDecision,
    choose_libraries,
    compiled_anew,
    has_choices,
    rel_err,
)
from ollie.optimizer.quick import quick_regions
from ollie.optimizer.structure import OutputStructure
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.program.program import Program, program_digest
from ollie.settings import current
from ollie.tune.cache import CostCache, device_key

if TYPE_CHECKING:
    from ollie.optimizer.model import OptimizeConfig

log = logging.getLogger(__name__)

ORIGINAL = "original operator"
"""A report's ``chosen`` for a subprogram kept as it is."""

ORIGINALS = "original operators"
"""The program-level alternative to the optimised program (:func:`checked`)."""

TF32_FACTOR = 2.0
"""Where cuDNN / cuBLAS may use TensorFloat-32 (PyTorch's default for cuDNN), the end-to-end
check compares with the model run in full float32 and allows this many times the model's own
error as PyTorch runs it (or ``check_rtol``, if larger): an optimised program must be about as
accurate as the original, not bit-close to one rounding of it."""


def node_kernel(graph: Graph, node: Node) -> Kernel:
    """``node`` run as it is, by the reference executor."""
    return Kernel(KernelKind.NODE, NodeParams(node=node, op=node.op), tuple(node.inputs),
                  node.outputs[0], None, (), tuple(graph.shape(node.outputs[0])))


def all_nodes(graph: Graph) -> Program:
    """Every operator of the model run as it is (the fallback)."""
    return Program(tuple((n, tuple(graph.shape(n))) for n in graph.input_names),
                   tuple(graph.outputs), [node_kernel(graph, n) for n in graph.nodes],
                   dict(graph.initializers))


@dataclass
class Reference:
    """Random inputs, the model's outputs on them in full float32, and the relative error a
    program may have against them; ``examples`` / ``example_want``: the example inputs and
    the model's outputs on them (empty when there are none)."""

    feeds: dict[str, torch.Tensor]
    want: dict[str, torch.Tensor]
    rtol: float
    examples: dict[str, torch.Tensor] = field(default_factory=dict)
    example_want: dict[str, torch.Tensor] = field(default_factory=dict)
    built: dict[int, CompiledProgram] = field(default_factory=dict, repr=False)
    """The programs compiled for the check (:meth:`compiled`), by the identity of the program
    object; each keeps its program alive, so an identity is never reused while it is here."""
    structure: OutputStructure | None = None
    """What the model returns around its outputs, where the reference ran the model itself
    (:func:`module_reference`)."""

    def compiled(self, prog: Program, device: str) -> CompiledProgram:
        """``prog`` ready to run on ``device``: the one compiled for it earlier in this check
        when there is one (same program object, device and implementations), else a new one
        (kept for the next call). The check, the example inputs' confirmation and the
        returned model then run one compiled program, built once."""
        done = self.built.get(id(prog))
        if done is None or done.program is not prog or \
                done.device != torch.empty(0, device=device).device or \
                done.impls != current().implementations:
            done = self.built[id(prog)] = CompiledProgram(prog, device)
        return done

    def builder(self, prog: Program, device: str) -> Callable[[Program], CompiledProgram]:
        """How a comparison of ``prog``'s library variants compiles each: ``prog`` (the
        per-operator variant) as compiled for this check (:meth:`compiled`), others anew."""
        return lambda p: self.compiled(p, device) if p is prog else CompiledProgram(p, device)


def example_feeds(graph: Graph, examples: Sequence[object] | torch.Tensor | None, device: str,
                  notes: list[str]) -> dict[str, torch.Tensor]:
    """``examples`` (one tensor per graph input, in order; a lone tensor is one input) as
    float32 feeds on ``device``; empty, with a note, when they do not fit the graph's
    inputs."""
    if examples is None:
        return {}
    if isinstance(examples, torch.Tensor):
        examples = (examples,)
    tensors = [x for x in examples if isinstance(x, torch.Tensor)]
    if len(tensors) != len(examples) or len(tensors) != len(graph.inputs) or any(
            tuple(x.shape) != tuple(s) or not x.is_floating_point()
            for x, (_, s) in zip(tensors, graph.inputs, strict=True)):
        notes.append("the example inputs do not fit the graph's inputs: the end-to-end check "
                     "runs on random inputs only")
        return {}
    return {n: x.detach().to(device=device, dtype=torch.float32)
            for (n, _), x in zip(graph.inputs, tensors, strict=True)}


def random_feeds(graph: Graph, cfg: OptimizeConfig) -> dict[str, torch.Tensor]:
    """The end-to-end check's random inputs: standard normal, seeded by ``cfg.seed``."""
    rng = np.random.default_rng(cfg.seed + 1)
    return {n: torch.as_tensor(rng.standard_normal(s).astype(np.float32), device=cfg.device)
            for n, s in graph.inputs}


def reference(graph: Graph, cfg: OptimizeConfig, notes: list[str],
              examples: Sequence[object] | torch.Tensor | None = None) -> Reference:
    """The end-to-end check's reference for ``graph`` (random inputs seeded by ``cfg.seed``,
    and ``examples``, the example inputs, when given and fitting the graph's inputs)."""
    feeds = random_feeds(graph, cfg)
    with full_fp32():
        want = run_graph(graph, feeds)
    rtol = cfg.check_rtol
    if tf32(cfg.device):
        # the model itself, as PyTorch runs it here, is only this close to float32
        own = max(rel_err(got, want[o]) for o, got in run_graph(graph, feeds).items()
                  if o in want)
        rtol = max(rtol, TF32_FACTOR * own)
        notes.append(f"TensorFloat-32 is on: the model itself is within {own:.2e} of float32; "
                     f"the check allows {rtol:.2e}")
    ex = example_feeds(graph, examples, cfg.device, notes)
    if ex:
        with full_fp32():
            ex_want = run_graph(graph, ex)
        return Reference(feeds, want, rtol, ex, ex_want)
    return Reference(feeds, want, rtol)


def module_reference(module: torch.nn.Module, graph: Graph, cfg: OptimizeConfig,
                     examples: Sequence[object] | torch.Tensor | None = None,
                     import_rtol: float = 0.0) -> Reference | None:
    """A :func:`reference` whose outputs come from ``module``, the torch module ``graph`` was
    imported from (the same random inputs; the example inputs when they fit), allowing
    ``import_rtol`` more than ``cfg.check_rtol``: a program within ``check_rtol`` of a graph
    that is within ``import_rtol`` of its module is within their sum of the module. Saves
    running the graph where the module was already checked against it. None off the CPU
    (where TF32 sets the allowance), for a module in training mode, and where the module
    fails on the graph's inputs or its outputs do not line up with the graph's (one tensor
    per output): the caller then uses :func:`reference`."""
    from torch.utils._pytree import tree_leaves

    if torch.device(cfg.device).type != "cpu" or module.training:
        return None
    feeds = random_feeds(graph, cfg)

    structures: list[OutputStructure] = []

    def run(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        try:
            with torch.no_grad(), full_fp32():
                raw = module(*inputs.values())
        except Exception as exc:  # the graph's inputs are not the module's arguments
            log.info("the program is checked through the graph (%s: %s)", type(exc).__name__, exc)
            return None
        out = [t for t in tree_leaves(raw) if isinstance(t, torch.Tensor)]
        if [tuple(t.shape) for t in out] != [tuple(graph.shape(o)) for o in graph.outputs]:
            return None
        structures.append(OutputStructure.of(raw, len(graph.outputs)))
        return {o: t.detach().float() for o, t in zip(graph.outputs, out, strict=True)}

    want = run(feeds)
    ex = example_feeds(graph, examples, cfg.device, [])
    ex_want = run(ex) if ex else {}
    if want is None or ex_want is None:
        return None
    return Reference(feeds, want, cfg.check_rtol + import_rtol, ex, ex_want,
                     structure=structures[0])


def example_error(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]
                  ) -> tuple[float, str]:
    """The largest relative error (:func:`~ollie.optimizer.libraries.rel_err`, over the
    finite values) of ``got`` against ``want`` and the output it is on; infinite where a
    non-finite value (a -inf mask, a NaN) differs."""
    worst, where = 0.0, ""
    for name, w in want.items():
        g, w = torch.as_tensor(got[name]).double(), w.double()
        fin = torch.isfinite(w)
        same = torch.equal(torch.isnan(g), torch.isnan(w)) and \
            torch.equal(g[~fin & ~torch.isnan(w)], w[~fin & ~torch.isnan(w)])
        err = rel_err(g[fin], w[fin]) if same and bool(fin.any()) else \
            (0.0 if same else math.inf)
        if err > worst or not where:
            worst, where = err, name
    return worst, where


def confirm(prog: Program, ref: Reference, cfg: OptimizeConfig, label: str,
            notes: list[str], warn: bool = True) -> float | None:
    """``prog``'s relative error on the example inputs (:func:`example_error`; 0 when there
    are none) when within ``ref.rtol``, else None, and a note (with ``warn`` a warning too)
    naming the output and the error."""
    if not ref.examples:
        return 0.0
    try:
        got = ref.compiled(prog, cfg.device).run(ref.examples)
        err, out = example_error(got, ref.example_want)
    except Exception as exc:  # a program that fails is not used, whatever the cause
        err, out = math.inf, f"none: it failed to run ({type(exc).__name__}: {exc})"
    if err <= ref.rtol:
        return err
    text = (f"{label} program disagrees with the model on the example inputs (output "
            f"'{out}': relative error {err:.2e}, allowed {ref.rtol:.2e})")
    notes.append(text)
    if warn:
        log.warning("%s; not used", text)
    return None


def agrees(prog: Program, ref: Reference, cfg: OptimizeConfig, label: str,
           notes: list[str]) -> bool:
    """Whether ``prog`` matches the model on the check's random inputs (``ref``) within
    ``ref.rtol``; when not (or when it fails to run), a note and a warning say so. A library
    choice applied from the cache is checked so before it is used, like one just timed."""
    try:
        got = ref.compiled(prog, cfg.device).run(ref.feeds)
        err = max(rel_err(got[o], w) for o, w in ref.want.items())
    except Exception as exc:  # a program that fails is not used, whatever the cause
        err, why = math.inf, f"failed to run ({type(exc).__name__}: {exc})"
    else:
        why = f"relative error {err:.2e}, allowed {ref.rtol:.2e}"
    if err <= ref.rtol:
        return True
    text = f"{label} program disagrees with the model on random inputs ({why})"
    notes.append(text)
    log.warning("%s; not used", text)
    return False


def checked(graph: Graph, prog: Program, raw: Program, cfg: OptimizeConfig,
            notes: list[str], cache: CostCache | None = None,
            originals: Program | None = None, ref: Reference | None = None,
            timed: bool = True) -> tuple[Program, LibraryDecision | None, str]:
    """The first of (``prog``, ``raw``, every operator as it is) that matches the model on
    random inputs and on the example inputs (``ref``, made here if not given: random inputs
    only), with its libraries chosen on the CPU (``originals``: the original operators as an
    alternative program, offered when some subprogram was rewritten; a choice that fails on
    the example inputs is dropped; a program that raises is not used). A fallback is logged
    as a warning naming why; when the original operators do not match either (a model too
    ill-conditioned in float32 for any program to be checked against it, or a bug), no
    program is returned: :class:`~ollie.errors.OllieError` names the errors of all three.
    Returns the program, the library decision
    (:func:`~ollie.optimizer.libraries.choose_libraries`; :func:`~ollie.optimizer.
    libraries.alternative_of` it is :data:`ORIGINALS` when that alternative was kept) and
    which program it is: ``"optimised"``, ``"without post-processing"`` or ``"fallback"``.
    ``timed`` off (the total time budget is spent, or it left subprograms unsearched):
    libraries only as a cached decision or the quick comparison says (:func:`libraries`)."""
    ref = ref or reference(graph, cfg, notes)
    first = len(notes)
    feeds, want = ref.feeds, ref.want
    for label, candidate in (("optimised", prog), ("without post-processing", raw)):
        found = _matching(candidate, ref, graph, cfg, label, notes)
        if found is None:
            continue
        candidate = found
        alternatives = {ORIGINALS: originals} if originals is not None else {}
        chosen, decision = libraries(candidate, feeds, want, cfg, notes, cache, alternatives,
                                     timed, ref.builder(candidate, "cpu"))
        if chosen is not candidate and (
                not agrees(chosen, ref, cfg, "library choice's", notes) or
                confirm(chosen, ref, cfg, "library choice's", notes) is None):
            return candidate, None, label
        return chosen, decision, label
    why = "; ".join(n for n in notes[first:] if "disagrees" in n or "failed" in n)
    notes.append("falling back to the original operators")
    log.warning("the optimised program disagrees with the model; falling back to the "
                "original operators (%s)", why)
    fallback = _matching(all_nodes(graph), ref, graph, cfg, "original operators'", notes)
    if fallback is None:
        raise OllieError(f"{graph.name}: no program Ollie can build matches the model, not "
                         f"even its original operators ({notes[-1]}; before them: {why}); "
                         "the model may be too ill-conditioned in float32 to check a program "
                         "against it")
    chosen = libraries(fallback, feeds, want, cfg, notes, cache, timed=timed)[0]
    if chosen is not fallback and confirm(chosen, ref, cfg, "library choice's", notes) is None:
        chosen = fallback  # its variants are checked on the random inputs as they are timed
    return chosen, None, "fallback"


def _matching(prog: Program, ref: Reference, graph: Graph, cfg: OptimizeConfig, label: str,
              notes: list[str]) -> Program | None:
    """``prog`` (on CUDA with its launch configurations fixed, :func:`_pinned`) when it runs
    and matches the model within ``ref.rtol`` on the random inputs and on the example
    inputs (:func:`confirm`), a note giving its errors; else None and a note naming
    ``label``'s program and why."""
    try:
        got = ref.compiled(prog, cfg.device).run(ref.feeds)
        err = max(rel_err(got[o], ref.want[o]) for o in graph.outputs)
        if err <= ref.rtol and torch.device(cfg.device).type == "cuda":
            prog, err = _pinned(prog, err, ref.feeds, ref.want, graph, cfg)
    except Exception as exc:  # a program that fails is not used, whatever the cause
        notes.append(f"{label} program failed to run: "
                     f"{exc if isinstance(exc, OllieError) else repr(exc)}")
        return None
    if err > ref.rtol:
        notes.append(f"{label} program disagrees with the model (relative error {err:.2e})")
        return None
    on_examples = confirm(prog, ref, cfg, label, notes, warn=False)
    if on_examples is None:
        return None
    notes.append(f"checked against the original model: max relative error {err:.2e}"
                 + (f", {on_examples:.2e} on the example inputs" if ref.examples else ""))
    return prog


def _pinned(prog: Program, err: float, feeds: Mapping[str, torch.Tensor],
            want: Mapping[str, torch.Tensor], graph: Graph, cfg: OptimizeConfig
            ) -> tuple[Program, float]:
    """``prog`` (which just ran on the GPU, with relative error ``err``) with its generated
    kernels' launch configurations fixed as the autotuner chose them
    (:func:`~ollie.exec.dispatch.pin_cuda_configs`), and its error run so: the program
    returned, saved and loaded elsewhere runs exactly the code that was checked."""
    try:
        kernels = pin_cuda_configs(prog.kernels)
        if all(a is b for a, b in zip(kernels, prog.kernels, strict=True)):
            return prog, err
        pinned = replace(prog, kernels=kernels)
        got = CompiledProgram(pinned, cfg.device).run(feeds)
    except OllieError:
        raise
    except Exception as exc:  # Triton's compile errors have many types
        # the program as checked, autotuned when it is loaded again (ollie.load says so)
        log.warning("could not fix the launch configurations of the generated kernels: %r",
                    exc)
        return prog, err
    return pinned, max(rel_err(got[o], want[o]) for o in graph.outputs)


def libraries(prog: Program, feeds: Mapping[str, torch.Tensor],
              want: Mapping[str, torch.Tensor], cfg: OptimizeConfig, notes: list[str],
              cache: CostCache | None, alternatives: Mapping[str, Program] | None = None,
              timed: bool = True, build: Callable[[Program], CompiledProgram] = compiled_anew
              ) -> tuple[Program, LibraryDecision | None]:
    """:func:`~ollie.optimizer.libraries.choose_libraries` on the CPU, its decision kept in
    ``cache`` under a digest of the programs' kernels and the device; returns the program
    and the decision (None: ``prog`` as it is, nothing chosen). ``timed`` off: only a
    decision found in ``cache`` is applied; without one the variants are not timed (a note
    says so) but for :func:`~ollie.optimizer.quick.quick_regions`, whose time is bounded.
    ``build``: how a variant is compiled (:meth:`Reference.builder`; default:
    :func:`compiled_anew`)."""
    if not cfg.choose_libraries or torch.device(cfg.device).type != "cpu":
        return prog, None
    alternatives = alternatives or {}
    # the choices offered are part of the key: a new choice is timed, not skipped
    digests = "+".join(program_digest(p) for p in (prog, *alternatives.values()))
    # so is the margin an alternative wins by: a decision made under another is not reused;
    # "called": variants timed through ``CompiledProgram.__call__``; "2": decisions as JSON
    # (key history: docs/design/010-caches.md)
    key = f"libraries2-called|{digests}|{'+'.join(CHOICES)}|{'+'.join(alternatives)}|" \
        f"margin{ALTERNATIVE_MARGIN:g}|{device_key(cfg.device)}"
    decided = LibraryDecision.from_json(cache.get_decision(key)) if cache is not None else None
    if decided is None and not timed:
        if alternatives or has_choices(prog):
            notes.append("convolution libraries and the original operators not compared in "
                         "the whole program: the total time budget ran out and no choice "
                         "was cached")
            return quick_regions(prog, feeds, want, cfg, notes, cache, alternatives, build)
        return prog, None
    prog, decision, note = choose_libraries(prog, feeds, want, cfg.check_rtol, decided,
                                            alternatives, settle=cfg.settle, build=build)
    if note:
        notes.append(note)
    if cache is not None and decision is not None and decision != decided:
        cache.put_decision(key, decision.to_json())
    return prog, decision


__all__ = ["ORIGINAL", "ORIGINALS", "Reference", "all_nodes", "checked", "confirm",
           "example_error", "example_feeds", "libraries", "node_kernel", "reference"]
