"""Measured selection: turn verified candidates into post-processed programs, check them again,
time them on the device (with the persistent cost cache), keep the fastest.

The original operator is always measured too (``baseline``, as Ollie would run it, and
``eager``, as the framework runs it), in the same interleaved rounds as the candidates, and a
candidate is chosen only when it is faster than both with confidence
(:func:`ollie.tune.decide.faster`), so a subprogram is not made slower by a mis-measurement on
a busy machine. A choice measured on a busy machine (:func:`ollie.tune.decide.busy`) is
measured again before it is kept (:func:`recheck`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ollie.codegen.precompile import precompile
from ollie.exec.dispatch import discovering, precompile_programs
from ollie.exec.executor import CompiledProgram
from ollie.exec.precision import tf32
from ollie.ir import Expr
from ollie.passes.postprocess import postprocess
from ollie.program.params import MatmulParams
from ollie.program.program import Program, constant_array
from ollie.search.candidate import Candidate, Step, program_key, reference_sample
from ollie.settings import current
from ollie.tune.cache import CostCache, device_key
from ollie.tune.decide import MARGIN, RECHECK_ROUNDS, RECHECK_SETTLE, Verdict, busy, faster
from ollie.tune.measure import Clock, Timings, measure_rounds

log = logging.getLogger(__name__)


ALTERNATIVE_WITHIN = 1.6
"""A candidate slower alone than the original by at most this factor is kept as an alternative
(:meth:`Selection.alternatives`), offered to the program-context step
(:mod:`ollie.optimizer.context`): a rewrite slower alone can make the whole program faster
where another library runs it, e.g. in an ONNX Runtime region (measured:
docs/design/008-program-context-step.md)."""

ALTERNATIVES = 1
"""Alternatives kept per subprogram (:meth:`Selection.alternatives`)."""


@dataclass
class Measured:
    """One measured program (or the baseline, ``program is None``)."""

    label: str
    seconds: float
    program: Program | None = None
    candidate: Candidate | None = None
    cached: bool = False
    samples: list[float] = field(default_factory=list)
    """Seconds per sample, one per round, aligned with the other programs' of the same
    measurement (empty: ``seconds`` alone, e.g. from the cost cache)."""

    def times(self) -> list[float]:
        """:attr:`samples`, or ``[seconds]`` when there are none."""
        return self.samples or [self.seconds]


@dataclass
class Selection:
    """The outcome for one expression: every measurement and the chosen program.
    ``baseline``: the original operator as Ollie runs it (a ``Node`` kernel, its library
    chosen by Ollie); ``eager``: the original as the framework runs it (PyTorch), when
    measured. ``unconfirmed``: the choice was made on a busy machine and a second measurement
    did not agree (:func:`recheck`): the framework's original is kept, and nothing of this
    selection may be cached."""

    baseline: Measured
    measured: list[Measured] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    margin: float = 0.0
    eager: Measured | None = None
    unconfirmed: bool = False

    def verdict(self, m: Measured, base: Measured) -> Verdict:
        """Whether ``m`` is faster than ``base`` with confidence, with this margin."""
        return faster(m.times(), base.times(), self.margin)

    @property
    def original(self) -> Measured:
        """The original as it is kept: :attr:`eager` when it is faster than :attr:`baseline`
        with confidence (the kept operator then runs PyTorch's implementation), else
        :attr:`baseline`."""
        if self.eager is not None and self.verdict(self.eager, self.baseline).decided:
            return self.eager
        return self.baseline

    @property
    def best(self) -> Measured:
        """The fastest (by median) of the candidates faster with confidence than the original
        both as Ollie runs it and as the framework does (:func:`ollie.tune.decide.faster`),
        else :attr:`original`; when :attr:`unconfirmed`, the framework's original."""
        if self.unconfirmed:
            return self.eager or self.baseline
        bases = [self.baseline, *([self.eager] if self.eager is not None else [])]
        winners = [m for m in self.measured
                   if all(self.verdict(m, b).decided for b in bases)]
        return min(winners, key=lambda m: m.seconds, default=self.original)

    @property
    def speedup(self) -> float:
        return self.baseline.seconds / self.best.seconds

    def alternatives(self, within: float = ALTERNATIVE_WITHIN,
                     limit: int = ALTERNATIVES) -> list[Measured]:
        """When the original won: the fastest candidate of each distinct program label
        (``Matmul -> eOp``, ``Conv -> eOp``, ...) measured at most ``within`` times the
        original's time alone, fastest first, at most ``limit`` of them (none when a candidate
        won). The program-level context step (:mod:`ollie.optimizer.context`) tries each in
        the whole program, where other libraries run it (an ONNX Runtime region) and its
        neighbours change its caches."""
        if self.best.program is not None or self.unconfirmed:
            return []
        out: dict[str, Measured] = {}
        for m in sorted(self.measured, key=lambda m: m.seconds):
            if m.program is not None and m.candidate is not None and \
                    m.seconds <= self.original.seconds * within and m.label not in out:
                out[m.label] = m
        return list(out.values())[:limit]


def candidate_program(cand: Candidate, expr: Expr, constants: Mapping[str, np.ndarray]
                      ) -> Program:
    """The candidate as a post-processed program; ``constants`` are weights (folded)."""
    inputs = tuple((n, s) for n, s in expr.decls if n not in constants)
    prog = Program(inputs, (cand.output,), list(cand.kernels),
                   {n: constant_array(v) for n, v in constants.items()})
    return postprocess(prog)


HOPELESS = 10.0
"""A program whose call right after its warm-up took more than this many times the fastest
one's is not timed further (:func:`ollie.tune.measure.measure_alternating`): it cannot be
chosen."""

TF32_TOLERANCE = 1e-3
"""Error allowed, relative to the output's largest magnitude, on a CUDA device where PyTorch
lets cuDNN / cuBLAS compute float32 products in TensorFloat-32 (10-bit mantissa): the original
operators compute so there too (a model's end-to-end check compares with float32 and allows
:data:`ollie.optimizer.final.TF32_FACTOR` times the model's own error)."""


def check_program(prog: Program, expr: Expr, inputs: Mapping[str, np.ndarray],
                  reference: tuple[np.ndarray, np.ndarray], device: str,
                  rtol: float = 1e-3, atol: float = 1e-4) -> tuple[bool, float]:
    """Run the compiled program and compare with the sampled reference values (within
    :data:`TF32_TOLERANCE` of their largest magnitude where :func:`tf32`)."""
    compiled = CompiledProgram(prog, device, cuda_graphs=False)
    feed = {n: v for n, v in inputs.items() if n in dict(prog.inputs)}
    out = compiled.run(feed)[prog.outputs[0]].detach().cpu().numpy()
    return _agrees(out, reference, device, rtol, atol)


def _agrees(out: np.ndarray, reference: tuple[np.ndarray, np.ndarray], device: str,
            rtol: float, atol: float) -> tuple[bool, float]:
    """``out`` against the sampled reference values (:func:`check_program`'s comparison)."""
    pos, want = reference
    got = out[tuple(pos.T)] if pos.size else out.reshape(-1)
    err = np.abs(got.astype(np.float64) - want)
    if tf32(device) and want.size:
        atol = max(atol, TF32_TOLERANCE * float(np.abs(want).max()))
    ok = bool(np.all(err <= np.abs(want) * rtol + atol)) and bool(np.all(np.isfinite(got)))
    return ok, float(err.max() / max(float(np.abs(want).max()), 1e-30)) if err.size else 0.0


def layout_key(channels_last: frozenset[str]) -> str:
    """The part of a cache key naming the inputs measured channels-last ("" for none)."""
    return f"|cl:{','.join(sorted(channels_last))}" if channels_last else ""


def as_input(value: np.ndarray, device: str, channels_last: bool = False) -> torch.Tensor:
    """``value`` as a tensor on ``device``; a 4-D one channels-last if asked."""
    t = torch.as_tensor(value, device=device)
    return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 \
        else t


def select(expr: Expr, candidates: list[Candidate], baseline: Callable[[], object],
           inputs: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray] | None = None,
           device: str = "cpu", cache: CostCache | None = None, limit: int = 8,
           samples: int = 512, margin: float = MARGIN, rounds: int = 15,
           max_seconds: float = 20.0, channels_last: frozenset[str] = frozenset(),
           library_variants: bool = False, clock: Clock | None = None,
           eager: Callable[[], object] | None = None) -> Selection:
    """Measure ``baseline`` (a zero-argument callable running the original operator on
    ``inputs``) and up to ``limit`` verified candidates (each also with its products kept
    transposed, :func:`transposed_candidate`, where that applies); keep the fastest. Inputs named in
    ``channels_last`` are fed to the candidates as channels-last tensors, the memory format
    they will have in the program (a convolution's output): a candidate that must first
    convert them pays for it (the caller feeds ``baseline`` the same way).

    All of them are timed together, in interleaved rounds (original, candidate 1, candidate 2,
    ..., original, ...), so that load on the machine affects them alike: timing them one after
    another let a busy moment make the original look slower than it is. ``eager``: a
    zero-argument callable running the original as the framework does (PyTorch, on the same
    inputs), timed in the same rounds. A candidate replaces the original only if it is faster
    than ``baseline`` and ``eager`` with confidence, by at least ``margin`` (a fraction,
    widened by the original's spread: :func:`ollie.tune.decide.faster`; noise must not pick a
    program that is really no faster; :attr:`Selection.best`). On a busy machine
    (:func:`ollie.tune.decide.busy`) the choice is measured again (:func:`recheck`); if that
    disagrees, the selection is :attr:`~Selection.unconfirmed` and nothing is put in the cost
    cache. When every one of them is in the cost cache (the same programs, shapes and device
    measured before), the cached medians are compared (with the margin) and nothing runs.

    ``library_variants`` (CPU): a candidate with library convolutions is also measured with
    every one of them fixed to each library of :data:`ollie.optimizer.libraries.UNIFORM` (each
    checked too), as ``ollie.optimize`` does for a whole program; otherwise each convolution
    runs the implementation chosen for its configuration alone, with cold caches
    (:meth:`ollie.tune.choice.Choices.fastest`).

    ``clock``: the time source of the measurement (:func:`~ollie.tune.measure.
    measure_rounds`'s; None: the current settings')."""
    constants = dict(constants or {})
    dev = device_key(device)
    shapes = ";".join(f"{n}{list(s)}" for n, s in expr.decls)
    layout = layout_key(channels_last)
    base_key = f"baseline|{shapes}|{dev}|{_expr_key(expr)}{layout}"
    reference = reference_sample(expr, inputs, samples)
    feed = {n: as_input(v, device, n in channels_last) for n, v in inputs.items()
            if n not in constants}
    rejected: list[str] = []
    verified: list[tuple[str, Program, Candidate, Callable[[], object]]] = []
    # each candidate as derived and, where it has a product only eOperators read, with that
    # product kept transposed (which orientation a library computes faster is measured)
    forms = [c for derived in candidates[:limit]
             for c in (derived, transposed_candidate(derived, expr)) if c is not None]
    built: list[tuple[Candidate, Program | Exception]] = []
    for cand in forms:
        try:
            built.append((cand, candidate_program(cand, expr, constants)))
        except Exception as exc:  # reported below, where the others are checked
            built.append((cand, exc))
    cpu = torch.device(device).type == "cpu"
    if cpu:  # their generated kernels compiled side by side in worker processes, ahead
        precompile_programs([p for _, p in built if isinstance(p, Program)])
    layouts = _verify(built, expr, inputs, reference, device, feed, shapes, dev, layout,
                      library_variants, rejected, verified)
    eager_key = f"eager|{shapes}|{dev}|{_expr_key(expr)}{layout}"
    keys = [base_key, *([eager_key] if eager is not None else []), *(k for k, *_ in verified)]
    hits = [cache.get(k) if cache is not None else None for k in keys]
    cached = all(h is not None for h in hits)
    fns: dict[str, Callable[[], object]] = {}
    if cached:
        timed = Timings({k: [float(h)] for k, h in zip(keys, hits, strict=True)
                         if h is not None})
    else:
        if cpu:  # the kernel variants the timing inputs' layouts need, compiled ahead too
            with discovering() as more:
                for *_, run in verified:
                    try:
                        run()
                    except Exception as exc:  # it fails again when timed and is dropped
                        log.debug("candidate failed on the timing inputs: %s", exc)
            precompile([*layouts, *more])
        fns = dict(zip(keys, [baseline, *([eager] if eager is not None else []),
                              *(v[3] for v in verified)], strict=True))
        timed = measure_rounds(fns, device, rounds=rounds, max_seconds=max_seconds,
                               min_sample=0.01, lead_calls=1, hopeless=HOPELESS, clock=clock)
    by_key = {k: Measured("original" if k == base_key else "eager" if k == eager_key else "",
                          timed.median(k), cached=cached,
                          samples=[] if cached else list(timed.samples[k])) for k in keys}
    for key, prog, cand, _ in verified:
        by_key[key] = replace(by_key[key], label=program_label(prog), program=prog,
                              candidate=cand)
    sel = Selection(by_key[base_key], [by_key[k] for k, *_ in verified], rejected, margin,
                    by_key.get(eager_key))
    if not cached:
        if busy(sel.baseline.times()):
            recheck(sel, fns, by_key, device, clock)
        if cache is not None and not sel.unconfirmed:
            for k, m in by_key.items():
                if math.isfinite(m.seconds):
                    cache.put(k, m.seconds)
    log.debug("selection%s: original %.3f ms%s; %s", " (cached)" if cached else "",
              sel.baseline.seconds * 1e3, f", eager {sel.eager.seconds * 1e3:.3f} ms"
              if sel.eager is not None else "", "; ".join(
                  f"{m.label} {m.seconds * 1e3:.3f} ms" for m in sel.measured))
    return sel


def recheck(sel: Selection, fns: Mapping[str, Callable[[], object]],
            by_key: Mapping[str, Measured], device: str = "cpu",
            clock: Clock | None = None) -> bool:
    """Measure the choice of ``sel`` again (made on a busy machine): after
    :data:`~ollie.tune.decide.RECHECK_SETTLE` seconds (the settings' ``sleep``), the original
    (as Ollie and as the framework run it) and the chosen candidate (or, when the original
    won, the fastest candidate), :data:`~ollie.tune.decide.RECHECK_ROUNDS` interleaved rounds
    (``fns`` and ``by_key``: each program's function and measurement by cost key). Returns
    whether the second measurement makes the same choice; when it does not, ``sel`` is marked
    :attr:`~Selection.unconfirmed`."""
    first = sel.best
    rival = first if first.program is not None else \
        min(sel.measured, key=lambda m: m.seconds, default=None)
    keep = [k for k, m in by_key.items() if k in fns and any(
        m is x for x in (sel.baseline, sel.eager, rival))]
    if len(keep) < 2:
        return True
    current().sleep(RECHECK_SETTLE)
    timed = measure_rounds({k: fns[k] for k in keep}, device, rounds=RECHECK_ROUNDS,
                           min_sample=0.01, lead_calls=1, clock=clock)
    again = {k: replace(by_key[k], seconds=timed.median(k), samples=list(timed.samples[k]))
             for k in keep}
    base_key = next(k for k in keep if by_key[k] is sel.baseline)
    eager_key = next((k for k in keep if by_key[k] is sel.eager), None)
    second = Selection(again[base_key], [again[k] for k in keep if by_key[k] is rival],
                       margin=sel.margin, eager=again.get(eager_key) if eager_key else None)
    agrees = next(k for k in keep if again[k] is second.best) == \
        next(k for k in keep if by_key[k] is first)
    if not agrees:
        sel.unconfirmed = True
    log.info("selection measured on a busy machine: %s, %s again (%s)", first.label,
             second.best.label, "confirmed" if agrees else "not confirmed: original kept")
    return agrees


def _verify(built: list[tuple[Candidate, Program | Exception]], expr: Expr,
            inputs: Mapping[str, np.ndarray], reference: tuple[np.ndarray, np.ndarray],
            device: str, feed: Mapping[str, torch.Tensor], shapes: str, dev: str,
            layout: str, library_variants: bool, rejected: list[str],
            verified: list[tuple[str, Program, Candidate, Callable[[], object]]]
            ) -> list[Expr]:
    """Check each built candidate program (and its library variants) against the
    ``reference``; append those that agree to ``verified`` as ``(cost key, program,
    candidate, run on feed)``, the others to ``rejected``. Returns the expressions of the
    kernel variants the checks' layouts needed (:func:`~ollie.exec.dispatch.discovering`:
    recorded, not compiled)."""
    with discovering() as layouts:
        for cand, prog in built:
            try:
                if isinstance(prog, Exception):
                    raise prog
                ok, err = check_program(prog, expr, inputs, reference, device)
            except Exception as exc:  # a candidate that fails is only skipped
                log.warning("candidate %s failed after post-processing: %s",
                            cand.summary(), exc)
                rejected.append(f"{cand.summary()}: {exc}")
                continue
            if not ok:
                log.error("post-processed candidate disagrees with the original "
                          "(error %.3g): %s", err, cand.summary())
                rejected.append(f"{cand.summary()}: error {err:.3g}")
                continue
            key = f"program|{program_key(prog.kernels)}|{shapes}|{dev}{layout}"
            if any(key == k for k, *_ in verified):
                continue  # the same program reached by another derivation
            args = {n: feed[n] for n, _ in prog.inputs}
            for vkey, variant in [(key, prog), *(_library_variants(key, prog, device)
                                                 if library_variants else [])]:
                if variant is not prog:
                    try:
                        agrees = check_program(variant, expr, inputs, reference, device)[0]
                    except Exception as exc:  # a variant that fails is only skipped
                        log.warning("library variant %s failed: %s",
                                    program_label(variant), exc)
                        agrees = False
                    if not agrees:
                        rejected.append(f"{program_label(variant)}: disagrees or fails")
                        continue
                compiled = CompiledProgram(variant, device)
                verified.append((vkey, variant, cand, functools.partial(compiled.run, args)))
    return layouts


def program_label(prog: Program) -> str:
    """``prog``'s summary, with the libraries its convolutions are fixed to, if any, and
    whether its products are kept transposed (:mod:`ollie.passes.orient`)."""
    libs = sorted({str(k.params.library) for k in prog.kernels if k.params.library})
    if any(isinstance(k.params, MatmulParams) and k.params.transposed for k in prog.kernels):
        libs.insert(0, "products transposed")
    return prog.summary() + (f" [{', '.join(libs)}]" if libs else "")


def transposed_candidate(cand: Candidate, expr: Expr) -> Candidate | None:
    """``cand`` with its products kept transposed (:func:`ollie.passes.orient.
    transposed_products`: a data layout transformation of their outputs), or None when no
    product of it qualifies."""
    from dataclasses import replace

    from ollie.ir import format_expr
    from ollie.passes.orient import transposed_products

    prog = Program(tuple(expr.decls), (cand.output,), list(cand.kernels), {})
    other = transposed_products(prog)
    if other is None:
        return None
    done = [k for k in other.kernels if isinstance(k.params, MatmulParams) and k.params.transposed]
    notes = ", ".join(f"{k.output} = ({k.inputs[0]} @ {k.inputs[1]}) kept transposed"
                      for k in done)
    step = Step("data_layout_transformation", notes,
                format_expr(done[-1].expr) if done[-1].expr is not None else "")
    return replace(cand, kernels=list(other.kernels), steps=[*cand.steps, step])


def _library_variants(key: str, prog: Program, device: str) -> list[tuple[str, Program]]:
    """``prog`` with its library convolutions fixed to each uniform library (CPU)."""
    from ollie.optimizer.libraries import UNIFORM, is_library_conv, with_library

    if torch.device(device).type != "cpu" or not any(is_library_conv(k) for k in prog.kernels):
        return []
    return [(f"{key}|lib:{lib}", with_library(prog, lib)) for lib in UNIFORM]


def _expr_key(expr: Expr) -> str:
    from ollie.fingerprint import fingerprint

    return fingerprint(expr)


def select_program(outputs: Mapping[str, Expr], programs: Sequence[tuple[Candidate, Program]],
                   baseline: Callable[[], object], inputs: Mapping[str, np.ndarray],
                   device: str = "cpu", cache: CostCache | None = None,
                   baseline_key: str | None = None, samples: int = 512,
                   margin: float = MARGIN, rounds: int = 15, max_seconds: float = 20.0,
                   channels_last: frozenset[str] = frozenset(),
                   clock: Clock | None = None) -> Selection:
    """:func:`select` for a subprogram with several outputs: ``outputs`` maps each output
    tensor to the expression defining it over ``inputs``' tensors; ``programs`` are
    post-processed programs computing all of them (with the candidate each came from), whose
    constants are among ``inputs``. Each is run and every output compared with the reference
    interpreter at up to ``samples`` positions; those that agree are timed with ``baseline``
    (a zero-argument callable running what the subprogram runs otherwise) in interleaved
    rounds, and the fastest replaces the baseline only when faster with confidence
    (:attr:`Selection.best`, :func:`ollie.tune.decide.faster`, at least ``margin``); measured on
    a busy machine, the winner is re-checked (:func:`recheck`). Times come from / go to
    ``cache`` when ``baseline_key`` names what the baseline runs, unless the re-check did not
    confirm the selection."""
    references = {o: reference_sample(e, inputs, samples) for o, e in outputs.items()}
    dev = device_key(device)
    shapes = ";".join(f"{n}{list(v.shape)}" for n, v in sorted(inputs.items()))
    layout = layout_key(channels_last)
    cpu = torch.device(device).type == "cpu"
    if cpu:
        precompile_programs([p for _, p in programs])
    rejected: list[str] = []
    verified: list[tuple[str, Program, Candidate, Callable[[], object]]] = []
    with discovering() as layouts:
        for cand, prog in programs:
            try:
                prog.validate()  # generated code trusts the shapes its kernels declare
                compiled = CompiledProgram(prog, device, cuda_graphs=False)
                got = compiled.run({n: inputs[n] for n, _ in prog.inputs})
                checks = [_agrees(got[o].detach().cpu().numpy(), ref, device, 1e-3, 1e-4)
                          for o, ref in references.items()]
            except Exception as exc:  # a program that fails is only skipped
                log.warning("program %s failed: %s", cand.summary(), exc)
                rejected.append(f"{cand.summary()}: {exc}")
                continue
            if not all(ok for ok, _ in checks):
                err = max(e for _, e in checks)
                log.error("program disagrees with the original (error %.3g): %s", err,
                          cand.summary())
                rejected.append(f"{cand.summary()}: error {err:.3g}")
                continue
            key = f"program|{program_key(prog.kernels)}|{shapes}|{dev}{layout}"
            if any(key == k for k, *_ in verified):
                continue
            feed = {n: as_input(inputs[n], device, n in channels_last) for n, _ in prog.inputs}
            verified.append((key, prog, cand,
                             functools.partial(CompiledProgram(prog, device).run, feed)))
    if cpu and layouts:
        precompile(layouts)
    base_key = None if baseline_key is None else f"baseline|{baseline_key}|{shapes}|{dev}{layout}"
    keys = [base_key or "baseline", *(k for k, *_ in verified)]
    hits = [cache.get(k) if cache is not None and base_key is not None else None for k in keys]
    cached = bool(verified) and all(h is not None for h in hits)
    if cached:
        secs = [float(h) for h in hits]  # type: ignore[arg-type]
    elif verified:
        fns = dict(zip(keys, [baseline, *(v[3] for v in verified)], strict=True))
        timed = measure_rounds(fns, device, rounds=rounds, max_seconds=max_seconds,
                               min_sample=0.01, lead_calls=1, hopeless=HOPELESS, clock=clock)
        secs = [timed.median(k) for k in keys]
    else:  # nothing to compare: the baseline is kept without being timed
        secs = [math.nan]
    series: list[list[float]] = [[] if cached or not verified else list(timed.samples[k])
                                 for k in keys]
    sel = Selection(Measured("original", secs[0], cached=cached, samples=series[0]),
                    margin=margin)
    sel.rejected = rejected
    for (_, prog, cand, _), t, ts in zip(verified, secs[1:], series[1:], strict=True):
        sel.measured.append(Measured(program_label(prog), t, prog, cand, cached, ts))
    if verified and not cached:
        if busy(sel.baseline.times()):
            by_key = dict(zip(keys, [sel.baseline, *sel.measured], strict=True))
            recheck(sel, fns, by_key, device, clock)
        if cache is not None and base_key is not None and not sel.unconfirmed:
            for k, t in zip(keys, secs, strict=True):
                if math.isfinite(t):
                    cache.put(k, t)
    return sel
