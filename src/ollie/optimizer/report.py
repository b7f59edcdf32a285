"""What ``ollie.optimize`` returns and reports: :class:`OptimizedModel` (a callable program with
its per-subprogram :class:`SubprogramReport` and notes; ``save`` / :func:`load`), and the report
edits of the program-level steps: rewrites not kept (:func:`kept_originals`) and alternatives
switched on in the whole program (:class:`Alternative`, :func:`switched_on`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import InitVar, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from ollie.errors import OllieError
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.final import ORIGINAL
from ollie.optimizer.structure import OutputStructure
from ollie.policy import Implementations
from ollie.program.kernel import Kernel
from ollie.program.params import EOpParams
from ollie.program.program import Program, kernel_from_json, kernel_to_json

log = logging.getLogger(__name__)


@dataclass
class SubprogramReport:
    """What happened to one compute operator, or to a group of them merged into one subprogram
    (``nodes``; ``op`` e.g. ``"MatMul x3"``). ``not_kept``: the rewrite chosen for it alone
    (``program``, its ``ms`` measured alone, its ``derivation``) when the whole program was
    not measurably faster with it (:mod:`ollie.optimizer.libraries`,
    :mod:`ollie.optimizer.context`), else None. ``in_program``: the original operator was
    faster alone, and the context step kept this rewrite (``chosen``, ``optimized_ms`` its
    time alone) because the whole program was faster with it. ``eager_ms``: the original
    operator's time as the framework runs it (PyTorch), None when not measured (a report
    saved before it was). ``refused``: why the subprogram kept its original operator without
    a search and without times (``"time budget"``: the total budget ran out; ``"not
    lowered"``: it has no expression; ``"search failed"``), else None."""

    node: str
    op: str
    original: str
    chosen: str
    derivation: list[str]
    original_ms: float
    optimized_ms: float
    reused: bool = False
    candidates: int = 0
    not_kept: dict | None = None
    in_program: bool = False
    eager_ms: float | None = None
    nodes: list[str] = field(default_factory=list)
    """The graph nodes this subprogram covers: ``[node]``, or a merged sibling group's members
    (:mod:`ollie.optimizer.region`), ``node`` the first."""
    refused: str | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [self.node]

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class OptimizedModel:
    """A callable optimised program with its report; ``save`` / :func:`load`.
    ``implementations``: what the program may run on (:mod:`ollie.policy`; None: the
    settings' in effect when it is made, then set to those); saved with it. ``compiled``:
    ``program`` already compiled for ``device`` (the one the end-to-end check ran), used
    instead of compiling it again when it is that program with those implementations.
    ``structure``: what the model returns around the program's outputs (a dict, a 1-tuple;
    :class:`~ollie.optimizer.structure.OutputStructure`), None where not known (the outputs
    as they are: a tensor, or a tuple for several); saved with it where it can be."""

    program: Program
    report: list[SubprogramReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    input_names: tuple[str, ...] = ()
    device: str = "cpu"
    implementations: Implementations | None = None
    compiled: InitVar[CompiledProgram | None] = None
    structure: OutputStructure | None = None

    def __post_init__(self, compiled: CompiledProgram | None) -> None:
        fits = compiled is not None and compiled.program is self.program and \
            compiled.device == torch.empty(0, device=self.device).device and \
            self.implementations in (None, compiled.impls)
        self._compiled = compiled if compiled is not None and fits else \
            CompiledProgram(self.program, self.device, impls=self.implementations)
        self.implementations = self._compiled.impls

    def __call__(self, *inputs: object) -> Any:
        """The program's output(s) for ``inputs``, one per model input: tensors (or numpy
        arrays) of the example inputs' shapes on :attr:`device`, float32 or converted to it;
        anything else raises :class:`~ollie.errors.ShapeError` naming the input
        (:meth:`ollie.exec.executor.CompiledProgram.__call__`). The outputs come in the
        containers the model returns them in (:attr:`structure`), else as a tensor, or a
        tuple of tensors for several."""
        out = self._compiled(*inputs)
        return out if self.structure is None else self.structure.rebuild(out)

    def save(self, path: str | Path) -> None:
        """Write the program (:meth:`ollie.program.program.Program.save`) and its report into
        the folder ``path``; :func:`load` reads them back."""
        self.program.save(path)
        impls = self._compiled.impls
        outputs = self.structure.to_json() if self.structure is not None else None
        (Path(path) / "report.json").write_text(json.dumps(
            {"report": [r.to_json() for r in self.report], "notes": self.notes,
             **({"implementations": sorted(impls.allowed)} if impls.key else {}),
             **({"outputs": outputs} if outputs is not None else {})}, indent=1))

    def summary(self) -> str:
        lines = [f"{'subprogram':24} {'original':>10} {'optimized':>10} {'speedup':>8}  program"]
        for r in self.report:
            sp = r.original_ms / r.optimized_ms if r.optimized_ms else float("nan")
            more = f"+{len(r.nodes) - 1}" if len(r.nodes) > 1 else ""
            if r.refused is not None:
                lines.append(f"{(r.node + more + ' ' + r.op)[:24]:24} {'-':>10} {'-':>10} "
                             f"{'-':>8}  {r.chosen} (not searched: {r.refused})")
                continue
            lines.append(f"{(r.node + more + ' ' + r.op)[:24]:24} {r.original_ms:9.3f}ms "
                         f"{r.optimized_ms:9.3f}ms {sp:7.2f}x  {r.chosen}"
                         + (f" (eager {r.eager_ms:.3f}ms)" if r.eager_ms is not None else "")
                         + (" (reused)" if r.reused else "")
                         + (" (not faster alone; kept: the whole program was faster with "
                            "it)" if r.in_program else "")
                         + (f" (derived {r.not_kept['program']}, {r.not_kept['ms']:.3f}ms "
                            "alone: not kept)" if r.not_kept else "")
                         + (f" [nodes: {', '.join(r.nodes)}]" if len(r.nodes) > 1 else ""))
        counts = tally(self.report)
        if counts["refused"]:
            lines.append(f"subprograms: {counts['derived']} derived, {counts['original']} kept "
                         f"their original operator, {counts['refused']} not searched ("
                         + ", ".join(f"{why}: {n}" for why, n in counts["reasons"].items())
                         + ")")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def load(path: str | Path, device: str = "cpu") -> OptimizedModel:
    """Load a program saved by :meth:`OptimizedModel.save`: validated, nothing from the folder
    executed (:meth:`ollie.program.program.Program.load`). A malformed report is ignored with a
    warning (the program does not depend on it); fields of the report this version does not
    know are skipped."""
    prog, report, notes = read_saved(path)
    unpinned = unpinned_kernels(prog)
    if torch.device(device).type == "cuda" and unpinned:
        # optimised on the CPU, or saved before launch configurations were kept
        note = (f"{len(unpinned)} generated kernel(s) ({', '.join(unpinned[:3])}"
                f"{', ...' if len(unpinned) > 3 else ''}) have no launch configuration "
                "checked on a GPU: they are autotuned here, and this program was not checked "
                "with what the autotuner picks")
        log.warning("%s: %s", path, note)
        notes = [*notes, note]
    try:
        return OptimizedModel(prog, report, notes, tuple(n for n, _ in prog.inputs), device,
                              _saved_implementations(Path(path) / "report.json"),
                              structure=saved_structure(path, len(prog.outputs)))
    except OllieError:
        raise
    except Exception as exc:  # a well-formed program whose kernels cannot be built here
        raise OllieError(f"{path}: the saved program cannot be built "
                         f"({type(exc).__name__}: {str(exc)[:200]})") from exc


def read_saved(path: str | Path) -> tuple[Program, list[SubprogramReport], list[str]]:
    """The program (:meth:`ollie.program.program.Program.load`: validated, nothing executed),
    report and notes :meth:`OptimizedModel.save` wrote into folder ``path``; a malformed
    report is read as none (a warning)."""
    prog = Program.load(path)
    report, notes = _read_report(Path(path) / "report.json")
    return prog, report, notes


REPORT_FIELDS = {f.name: f for f in fields(SubprogramReport)}


def _read_report(path: Path) -> tuple[list[SubprogramReport], list[str]]:
    """The report and notes saved in ``report.json`` (none when absent or malformed)."""
    if not path.exists():
        return [], []
    try:
        doc = json.loads(path.read_bytes())
        entries, notes = doc.get("report", []), doc.get("notes", [])
        if not isinstance(entries, list) or not isinstance(notes, list):
            raise ValueError("'report' and 'notes' must be lists")
        report = [_report_entry(r) for r in entries]
        return report, [str(n) for n in notes]
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        log.warning("%s: report not read (%s); the program is loaded without it", path,
                    str(exc)[:200])
        return [], []


def _saved_implementations(path: Path) -> Implementations | None:
    """The implementation policy a program was saved with (``report.json``'s
    ``implementations``), or None: none saved (every implementation), or not readable (a
    warning; the settings' policy then applies)."""
    try:
        doc = json.loads(path.read_bytes()) if path.exists() else {}
        names = doc.get("implementations") if isinstance(doc, dict) else None
        if names is None:
            return None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("'implementations' must be a list of names")
        return Implementations(frozenset(names))
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("%s: implementation policy not read (%s); the settings' applies", path,
                    str(exc)[:200])
        return None


def saved_structure(path: str | Path, outputs: int) -> OutputStructure | None:
    """The output structure saved in folder ``path``'s ``report.json`` for a program of
    ``outputs`` outputs (:meth:`~ollie.optimizer.structure.OutputStructure.from_json`), or
    None: none saved, or not readable here (a warning; the outputs then come as they are)."""
    try:
        file = Path(path) / "report.json"
        doc = json.loads(file.read_bytes()) if file.exists() else {}
        found = doc.get("outputs") if isinstance(doc, dict) else None
        return None if found is None else OutputStructure.from_json(found, outputs)
    except (OSError, ValueError, RecursionError, OllieError) as exc:
        log.warning("%s: the model's output containers not read (%s); the program returns "
                    "its outputs as tensors", path, str(exc)[:200])
        return None


def _report_entry(doc: object) -> SubprogramReport:
    if not isinstance(doc, dict):
        raise ValueError("a report entry must be an object")
    known = {k: v for k, v in doc.items() if k in REPORT_FIELDS}
    entry = SubprogramReport(**known)
    for name in ("node", "op", "original", "chosen"):
        if not isinstance(getattr(entry, name), str):
            raise ValueError(f"report field '{name}' must be text")
    if not isinstance(entry.nodes, list) or not all(isinstance(n, str) for n in entry.nodes):
        raise ValueError("report field 'nodes' must be a list of node names")
    for name in ("original_ms", "optimized_ms"):
        if not isinstance(getattr(entry, name), (int, float)):
            raise ValueError(f"report field '{name}' must be a number")
    if entry.eager_ms is not None and not isinstance(entry.eager_ms, (int, float)):
        raise ValueError("report field 'eager_ms' must be a number or null")
    if entry.refused is not None and not isinstance(entry.refused, str):
        raise ValueError("report field 'refused' must be text or null")
    return entry


def tally(report: Iterable[SubprogramReport]) -> dict:
    """How many subprograms of ``report`` were ``derived`` (run a rewrite), kept their
    ``original`` operator after a search (no rewrite faster, or not kept in the whole program),
    or were ``refused`` a search (:attr:`SubprogramReport.refused`), with the ``reasons`` of
    the refusals counted (``{"time budget": 2}``). A merged group of operators counts once."""
    out: dict = {"derived": 0, "original": 0, "refused": 0, "reasons": {}}
    for r in report:
        if r.refused is not None:
            out["refused"] += 1
            out["reasons"][r.refused] = out["reasons"].get(r.refused, 0) + 1
        else:
            out["derived" if r.chosen != ORIGINAL else "original"] += 1
    return out


def unpinned_kernels(prog: Program) -> list[str]:
    """The outputs of ``prog``'s eOperators without launch configurations checked on a GPU
    (:data:`~ollie.exec.dispatch.CUDA_CONFIGS`): on a GPU they are autotuned when loaded."""
    return [k.output for k in prog.kernels
            if isinstance(k.params, EOpParams) and k.params.cuda_configs is None]


@dataclass
class Alternative:
    """A rewrite of a subprogram whose original operator won alone, offered to the program-context
    step (:mod:`ollie.optimizer.context`); ``seconds``: its time alone."""

    kernels: list[Kernel]
    output: str
    label: str
    derivation: list[str]
    seconds: float

    def to_doc(self) -> dict:
        return {**self.__dict__, "kernels": [kernel_to_json(k) for k in self.kernels]}

    @classmethod
    def from_doc(cls, doc: dict) -> Alternative:
        return cls(**{**doc, "kernels": [kernel_from_json(k) for k in doc["kernels"]]})


def kept_originals(report: list[SubprogramReport], nodes: Collection[str] | None = None
                   ) -> list[SubprogramReport]:
    """The report of a program that kept its original operators for ``nodes`` (default: all):
    those subprograms the original operator, the rewrite found for each recorded as
    ``not_kept``."""
    return [r if nodes is not None and r.node not in nodes else
            replace(r, chosen=ORIGINAL, derivation=[], optimized_ms=r.original_ms,
                    not_kept=None if r.chosen == ORIGINAL else
                    {"program": r.chosen, "ms": r.optimized_ms,
                     "derivation": list(r.derivation)})
            for r in report]


def switched_on(report: list[SubprogramReport], alternatives: Mapping[str, Alternative]
                ) -> list[SubprogramReport]:
    """The report with the subprograms of ``alternatives`` (by node; the original won alone,
    the context step switched this rewrite on) running it."""
    return [r if (alt := alternatives.get(r.node)) is None else
            replace(r, chosen=alt.label, derivation=list(alt.derivation),
                    optimized_ms=alt.seconds * 1e3, not_kept=None, in_program=True)
            for r in report]


__all__ = ["Alternative", "OptimizedModel", "SubprogramReport", "kept_originals", "load",
           "read_saved", "saved_structure", "switched_on", "tally", "unpinned_kernels"]
