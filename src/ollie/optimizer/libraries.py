"""Program-level choice of the convolution library on the CPU.

Each library convolution of a program (a ``Conv`` kernel with a constant weight, or an original
``Conv2d`` / ``ConvTranspose2d`` kept as a ``Node``) picks the fastest of oneDNN with a packed
weight, plain torch, ONNX Runtime and, where one applies, a Winograd convolution on its own
(:func:`ollie.exec.conv.best_conv`).
Timed alone, each choice is right; in a program, the implementations run on different thread
pools (torch's OpenMP workers, ONNX Runtime's own), and a pool that slept while another
library ran pays to wake its threads on every call, while the other pool's threads take the
cores: choices that win one at a time can lose together.

:func:`choose_libraries` therefore times the whole program with the per-operator choices
against its variants of :data:`CHOICES`: every convolution on one library of :data:`UNIFORM`,
the two Winograd variants (:data:`ONEDNN_WINOGRAD`, :data:`WINOGRAD_ALL`), and the program
whose runs of library operators are ONNX Runtime regions (:mod:`ollie.backends.onnxrt.region`: one
session per run, in ONNX Runtime's blocked layout from one convolution to the next), with the
other convolutions as chosen or on oneDNN (:data:`REGIONS`, :data:`REGIONS_ONEDNN`). It times
them in interleaved rounds (steady state), checks each variant against the reference outputs,
and keeps the fastest. ``ollie.optimize`` also passes the
model's original operators (post-processed) as an alternative program when some subprogram
was rewritten: a rewrite measured faster alone can be slower in the program, so the original
operators are a candidate at the program level too. The choice is recorded in the kernels'
``params["library"]`` / ``params["region"]``, so a saved program keeps it, and
``ollie.optimize`` stores it in the cost cache (a warm re-optimisation does not time the
program again).

Why choose per program, and the measurements behind each choice offered:
docs/design/007-program-level-library-choice.md.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from ollie.backends.onnxrt import region as ort_region
from ollie.errors import OllieError
from ollie.exec.conv import ANY_OF, CONV_OPS, WINOGRAD, offers_winograd
from ollie.program.kernel import Kernel
from ollie.program.params import ConvParams, KernelKind, NodeParams
from ollie.program.program import Program
from ollie.settings import current
from ollie.tune.measure import SETTLE_SECONDS, settled_lead

if TYPE_CHECKING:
    from ollie.exec.executor import CompiledProgram

log = logging.getLogger(__name__)

UNIFORM = ("oneDNN packed",)
"""Libraries tried for every convolution at once: oneDNN shares torch's thread pool with the
program's matmuls and other torch operators."""

ROUNDS = 9
"""Interleaved rounds of the whole-program comparison (at least 3 run)."""

MAX_SECONDS = 10.0
"""Later rounds stop after this long (a program of a few hundred ms per call)."""

ALTERNATIVE_MARGIN = 0.02
"""``prog`` must be this much faster (fraction of the time) than the fastest variant of an
alternative program to be kept over it: with the model's original operators as the
alternative, a rewritten program within noise of them is not kept
(docs/design/007-program-level-library-choice.md)."""

PER_OPERATOR = "per operator"
"""The decision to keep each convolution's own measured choice."""

REGIONS = ort_region.LIBRARY
"""The decision to run each maximal run of library operators as one ONNX Runtime session
(:mod:`ollie.backends.onnxrt.region`); convolutions outside the runs keep their own choice."""

REGIONS_ONEDNN = f"{REGIONS} + oneDNN packed"
"""ONNX Runtime regions with every convolution outside them on oneDNN: a per-operator ONNX
Runtime convolution between torch kernels pays for OpenMP threads that still busy-wait
(docs/design/007-program-level-library-choice.md)."""

ONEDNN_WINOGRAD = f"{UNIFORM[0]}{ANY_OF}{WINOGRAD}"
"""Every convolution on oneDNN, or on a Winograd convolution where one applies and measured
faster alone (:mod:`ollie.kernels.winograd`; both run on torch's threads; the per-operator
choice may also pick ONNX Runtime, whose threads then compete with torch's)."""

WINOGRAD_ALL = f"{WINOGRAD} wherever it applies"
"""Every convolution with a Winograd form on it, the others on oneDNN, without measuring each
alone. The per-operator measurement behind :data:`ONEDNN_WINOGRAD` starts from cold caches (a
program whose weights exceed the cache reads them from memory), and the Winograd form's
weights are several times larger (36/9 for a 3x3 kernel); a small model's weights stay in the
last-level cache from one call to the next, so the cold measurement can misjudge it: timed in
the whole program, the variant decides (measured:
docs/design/007-program-level-library-choice.md)."""

CHOICES = (*UNIFORM, ONEDNN_WINOGRAD, WINOGRAD_ALL, REGIONS, REGIONS_ONEDNN)
"""The decisions timed against :data:`PER_OPERATOR`."""


@dataclass(frozen=True, slots=True)
class LibraryDecision:
    """A decision of :func:`choose_libraries`: ``choice`` (:data:`PER_OPERATOR` or one of
    :data:`CHOICES`) applied to the program itself, or (``alternative`` given) to that
    alternative program. Its cached form is :meth:`to_json`, read back by :meth:`from_json`;
    ``name`` is how notes and timings show it."""

    choice: str
    alternative: str | None = None

    @property
    def name(self) -> str:
        return self.choice if self.alternative is None else f"{self.alternative}: {self.choice}"

    def to_json(self) -> str:
        return json.dumps({"choice": self.choice, "alternative": self.alternative})

    @classmethod
    def from_json(cls, doc: str | None) -> LibraryDecision | None:
        """The decision cached as ``doc``, or None (none, or not a document of
        :meth:`to_json`: timed again)."""
        try:
            d = json.loads(doc) if doc is not None else None
        except ValueError:
            return None
        if not isinstance(d, dict) or not isinstance(d.get("choice"), str) or \
                not isinstance(d.get("alternative"), str | None):
            return None
        return cls(d["choice"], d["alternative"])


def is_library_conv(k: Kernel) -> bool:
    """Whether ``k`` may run through :func:`ollie.exec.conv.best_conv`."""
    p = k.params
    return k.kind is KernelKind.CONV or (isinstance(p, NodeParams) and p.op in CONV_OPS)


def has_choices(prog: Program) -> bool:
    """Whether ``prog`` has library choices to compare: two library convolutions or more
    (:func:`is_library_conv`), or a matrix product (a ``Matmul`` kernel, a graph ``MatMul``
    or ``Gemm``) that an ONNX Runtime region may hold (:data:`REGIONS`)."""
    if sum(is_library_conv(k) for k in prog.kernels) >= 2:
        return True
    return any(k.kind is KernelKind.MATMUL or (isinstance(k.params, NodeParams) and
                                               k.params.op in ("MatMul", "Gemm"))
               for k in prog.kernels)


def winograd_applies(k: Kernel, prog: Program) -> bool:
    """Whether :func:`ollie.exec.conv.best_conv` would offer library convolution ``k``
    of ``prog`` a Winograd form (:func:`ollie.exec.conv.offers_winograd`: one exists and
    the convolution is large enough)."""
    from ollie.graph.execute import pad4, pair

    p = k.params
    if isinstance(p, ConvParams):
        groups = int(p.groups or 1)
        return offers_winograd(
            "Conv2d", (int(p.f), int(p.c) // groups, int(p.r), int(p.s)),
            (int(p.n), int(p.c), int(p.h), int(p.w)), (int(p.sh), int(p.sw)),
            (int(p.ph), int(p.pw)), (int(p.dh), int(p.dw)), groups)
    if not isinstance(p, NodeParams) or p.op not in CONV_OPS or len(k.inputs) < 2 or \
            k.inputs[1] not in prog.constants:
        return False
    op = p.op
    attrs = dict(p.node.attrs)
    top, left, bottom, right = pad4(attrs.get("padding", 0))
    input_shape = prog.tensor_shapes().get(k.inputs[0])
    return (top, left) == (bottom, right) and input_shape is not None and \
        offers_winograd(op, tuple(prog.constants[k.inputs[1]].shape), input_shape,
                        pair(attrs.get("stride", 1)), (top, left),
                        pair(attrs.get("dilation", 1)), int(attrs.get("groups", 1)))


def with_library(prog: Program, library: str) -> Program:
    """``prog`` with every library convolution fixed to ``library``."""
    kernels = [replace(k, params=replace(k.params, library=library)) if is_library_conv(k)
               else k for k in prog.kernels]
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


def compiled_anew(prog: Program) -> CompiledProgram:
    """``prog`` compiled anew on the CPU: how a variant is built by default."""
    from ollie.exec.executor import CompiledProgram

    return CompiledProgram(prog, "cpu")


def choose_libraries(prog: Program, feeds: Mapping[str, torch.Tensor],
                     want: Mapping[str, torch.Tensor], rtol: float,
                     decided: LibraryDecision | str | None = None,
                     alternatives: Mapping[str, Program] | None = None,
                     settle: float = SETTLE_SECONDS,
                     build: Callable[[Program], CompiledProgram] = compiled_anew
                     ) -> tuple[Program, LibraryDecision | None, str | None]:
    """The fastest of ``prog`` (per-operator library choices) and its variants of
    :data:`CHOICES` (uniform libraries, ONNX Runtime regions), timed on ``feeds``; a variant
    must match ``want`` within ``rtol`` (relative to each output's largest magnitude).
    ``alternatives``: other programs for the same outputs (``ollie.optimize`` offers the model's
    original operators when a subprogram was rewritten), timed with their own variants
    (decisions with an ``alternative``), and checked the same way. ``decided``: a decision
    made before (e.g. from the cost cache; a string: a choice for ``prog`` itself), applied
    without timing (a variant is still checked). ``settle``: seconds idle before the samples
    around a variant whose ONNX Runtime session spins (0: none). ``build``: how a variant is
    compiled (default: :func:`compiled_anew`; the optimizer's reuses the one its check built
    for ``prog``). Returns the program, the decision and a note (both None when there is
    nothing to choose)."""
    from ollie.tune.measure import measure_alternating

    alternatives = alternatives or {}
    if isinstance(decided, str):
        decided = LibraryDecision(decided)
    if not alternatives and not has_choices(prog):
        return prog, None, None
    if decided == LibraryDecision(PER_OPERATOR):  # nothing to check: ``prog`` as it is
        return prog, decided, f"convolution libraries: {_label(decided)} (cached)"
    variants: dict[str, Program] = {}
    decisions: dict[str, LibraryDecision] = {}  # by name
    bases: dict[str | None, Program] = {None: prog}
    bases.update(alternatives)
    for base, program in bases.items():
        choices = [PER_OPERATOR]
        if sum(is_library_conv(k) for k in program.kernels) >= 2:
            choices += CHOICES
        elif has_choices(program):  # products only: their regions are the one choice
            choices.append(REGIONS)
        for n in choices:
            d = LibraryDecision(n, base)
            if decided in (None, d) and (v := variant(program, n)) is not None:
                variants[d.name], decisions[d.name] = v, d
    if decided is not None and decided.name not in variants:  # stale: time them all
        return choose_libraries(prog, feeds, want, rtol, None, alternatives, settle=settle,
                                build=build)
    fns: dict[str, Callable[[], object]] = {}
    spinning: set[str] = set()
    for name, program in variants.items():
        try:
            compiled = build(program)
            if compiled.spins:
                spinning.add(name)
            got = compiled.run(feeds)  # the first call makes the per-operator choices
        except (OllieError, RuntimeError, ValueError) as exc:  # a variant is optional
            log.info("convolution libraries: %s failed to run: %s", name, exc)
            continue
        if name != PER_OPERATOR and any(rel_err(got[o], want[o]) > rtol for o in want):
            continue
        # timed as called in use: a program that is one ONNX Runtime region goes straight
        # through its session (``CompiledProgram.__call__``), cheaper than ``run``
        # (docs/design/009-onnx-runtime-regions.md)
        args = [feeds[n] for n, _ in program.inputs]
        fns[name] = functools.partial(compiled, *args)
    if decided is not None and list(fns) == [decided.name]:
        return variants[decided.name], decided, \
            f"convolution libraries: {_label(decided)} (cached)"
    if len(fns) < 2 or PER_OPERATOR not in fns:
        return prog, None, None
    # a variant whose ONNX Runtime session spins slows whichever runs after it, and is slowed
    # itself right after a torch variant: its samples and the ones following them start after
    # the cores went idle (measure_alternating's settle_around)
    times = measure_alternating(fns, "cpu", rounds=ROUNDS, min_sample=0.02, lead_calls=1,
                                max_seconds=MAX_SECONDS, settle=settle,
                                lead_seconds=settled_lead(settle), settle_around=spinning)
    best = min(times, key=times.__getitem__)
    others = [n for n in times if decisions[n].alternative is not None]
    if others and decisions[best].alternative is None:
        fallback = min(others, key=times.__getitem__)
        if times[best] > (1 - ALTERNATIVE_MARGIN) * times[fallback]:
            best = fallback  # not measurably faster than the alternative program
    detail = ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in times.items())
    chosen = decisions[best]
    return variants[best], chosen, f"convolution libraries: {_label(chosen)} ({detail})"


def alternative_of(decision: LibraryDecision | None) -> str | None:
    """The alternative program a decision of :func:`choose_libraries` picked, or None (the
    program itself)."""
    return decision.alternative if decision is not None else None


def variant(prog: Program, name: str) -> Program | None:
    """``prog`` under decision ``name`` (None: the decision does not apply to ``prog``, or
    names an implementation the settings' policy leaves out, :mod:`ollie.policy`)."""
    if name == PER_OPERATOR:
        return prog
    if name in (ONEDNN_WINOGRAD, WINOGRAD_ALL) and (
            not current().implementations.allows(WINOGRAD) or not any(
                is_library_conv(k) and winograd_applies(k, prog) for k in prog.kernels)):
        return None  # as UNIFORM[0]; or the policy leaves Winograd out (ollie.policy)
    if name == WINOGRAD_ALL:
        kernels = [replace(k, params=replace(k.params, library=WINOGRAD if winograd_applies(
            k, prog) else UNIFORM[0])) if is_library_conv(k) else k for k in prog.kernels]
        return Program(prog.inputs, prog.outputs, kernels, prog.constants)
    if name in (REGIONS, REGIONS_ONEDNN):
        marked = ort_region.mark_regions(prog)
        if marked is None or name == REGIONS:
            return marked
        outside = any(is_library_conv(k) and k.params.region is None for k in marked.kernels)
        return with_library(marked, UNIFORM[0]) if outside else None  # else: as REGIONS
    return with_library(prog, name)


def _label(decided: LibraryDecision) -> str:
    if decided.alternative is not None:
        return f"{decided.alternative}, {_label(LibraryDecision(decided.choice))}"
    decision = decided.choice
    if decision == PER_OPERATOR:
        return "chosen per operator"
    if decision == REGIONS:
        return f"{REGIONS} (others per operator)"
    if decision == REGIONS_ONEDNN:
        return f"{REGIONS} (others oneDNN packed)"
    if decision == ONEDNN_WINOGRAD:
        return f"{UNIFORM[0]}, {WINOGRAD} where faster"
    if decision == WINOGRAD_ALL:
        return f"{WINOGRAD} wherever it applies, others {UNIFORM[0]}"
    return f"all {decision}"


def rel_err(got: object, want: torch.Tensor) -> float:
    """Largest absolute difference over the largest magnitude of ``want`` (the end-to-end
    check's measure)."""
    g, w = torch.as_tensor(got).double(), want.double()
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))
