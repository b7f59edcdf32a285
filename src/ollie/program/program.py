"""A whole program: runtime inputs, constants (weights), kernels in execution order, outputs.

Programs are what candidates, subprogram optimisations and optimised models become; they are
post-processed (:mod:`ollie.passes.postprocess`), executed (:mod:`ollie.exec.executor`)
and saved / loaded here. The file format is a folder holding ``program.json`` (structure;
each kernel as data, its expression as text re-parsed on load: :mod:`ollie.program.serialize`)
and ``constants.npz`` (numpy arrays, read in place without pickle:
:mod:`ollie.program.constants_file`). Loading validates everything it
reads (:meth:`Program.validate`) and executes nothing from the folder.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ollie.errors import OllieError
from ollie.program import constants_file
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.program.serialize import (
    FormatError,
    kernel_from_json,
    kernel_to_json,
    name_of,
    shape_of,
)
from ollie.program.validate import validate_program

FORMAT_VERSION = 2
"""Version of the saved form. 2: graph operators as JSON data (:mod:`ollie.program.serialize`).
Version 1 programs load when they hold no graph operator (version 1 pickled those: such a
program is refused, with how to save it again)."""

MAX_PROGRAM_BYTES = 64 << 20
"""Largest ``program.json`` :meth:`Program.load` reads (the constants are in
``constants.npz``)."""


def constant_array(value: object) -> np.ndarray:
    """A program constant: floating-point values as float32 (the dtype Ollie computes in);
    integer and boolean ones (an opaque operator's indices, axes or sizes) keep their dtype."""
    a = np.asarray(value)
    return a if a.dtype.kind in "biu" else np.asarray(a, dtype=np.float32)


@dataclass
class Program:
    """Kernels computing ``outputs`` from ``inputs`` and ``constants``."""

    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[str, ...]
    kernels: list[Kernel]
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {n: tuple(s) for n, s in self.inputs}
        shapes.update({n: tuple(v.shape) for n, v in self.constants.items()})
        for k in self.kernels:
            shapes[k.output] = tuple(k.output_shape)
            if len(k.outputs) > 1:  # a multi-output graph node: its declared shapes
                node = k.params.node if isinstance(k.params, NodeParams) else None
                declared = getattr(node, "attrs", {}).get("output_shapes") or ()
                shapes.update({n: tuple(s) for n, s in zip(k.outputs[1:], declared[1:],
                                                                  strict=False)})
        return shapes

    def consumers(self) -> dict[str, list[int]]:
        """Tensor name -> indices of the kernels reading it."""
        out: dict[str, list[int]] = {}
        for i, k in enumerate(self.kernels):
            for name in dict.fromkeys(k.inputs):
                out.setdefault(name, []).append(i)
        return out

    def check(self) -> None:
        """Every kernel reads tensors defined before it; outputs are defined."""
        defined = {n for n, _ in self.inputs} | set(self.constants)
        for k in self.kernels:
            missing = [n for n in k.inputs if n not in defined]
            if missing:
                raise OllieError(f"program: kernel {k.kind} -> {k.output} reads undefined "
                                 f"tensor(s) {missing}")
            defined.update(k.outputs)
        missing = [n for n in self.outputs if n not in defined]
        if missing:
            raise OllieError(f"program: outputs {missing} are never computed")

    def summary(self) -> str:
        return " -> ".join(k.kind if k.kind is not KernelKind.EOP
                           else f"eOp{list(k.output_shape)}" for k in self.kernels)

    def validate(self) -> None:
        """:meth:`check`, and that every kernel reads tensors of the shapes it declares, its
        views lie within them, its parameters agree with them and a graph operator's declared
        output shapes are the ones it computes (:func:`ollie.program.validate.validate_program`).
        Raises :class:`~ollie.errors.OllieError` naming the kernel."""
        self.check()
        validate_program(self)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write ``program.json`` (structure, kernels as data: :mod:`ollie.program.serialize`)
        and ``constants.npz`` into the folder ``path``."""
        path = Path(path)
        doc = {"format": FORMAT_VERSION, "inputs": [[n, list(s)] for n, s in self.inputs],
               "outputs": list(self.outputs),
               "kernels": [kernel_to_json(k) for k in self.kernels]}
        text = json.dumps(doc, indent=1, allow_nan=False)
        path.mkdir(parents=True, exist_ok=True)
        (path / "program.json").write_text(text)
        constants_file.save(path / "constants.npz", self.constants)

    @classmethod
    def load(cls, path: str | Path) -> Program:
        """The program saved in folder ``path``, validated (:meth:`validate`). Nothing from the
        folder is executed or imported; a malformed, tampered or unknown one raises
        :class:`~ollie.errors.OllieError` naming the file and the field."""
        path = Path(path)
        where = path / "program.json"
        try:
            if where.stat().st_size > MAX_PROGRAM_BYTES:
                raise FormatError(f"{where}: larger than {MAX_PROGRAM_BYTES} bytes")
            doc = json.loads(where.read_bytes())
        except OSError as exc:
            raise OllieError(f"{path}: not a saved Ollie program ({exc.strerror or exc})"
                             ) from None
        except (ValueError, RecursionError) as exc:
            raise FormatError(f"{where}: not valid JSON ({str(exc)[:100]})") from None
        consts = path / "constants.npz"
        prog = cls(*_structure(doc, where),
                   {name_of(n, f"{consts}: constants"): a
                    for n, a in constants_file.load(consts).items()})
        try:
            prog.validate()
        except OllieError as exc:
            raise FormatError(f"{where}: {exc}") from None
        return prog


def _structure(doc: object, where: Path) -> tuple[tuple, tuple[str, ...], list[Kernel]]:
    """Inputs, outputs and kernels of a ``program.json`` document."""
    if not isinstance(doc, dict):
        raise FormatError(f"{where}: expected a JSON object")
    version = doc.get("format")
    if version not in (1, FORMAT_VERSION):
        raise FormatError(f"{where}: unsupported program format {version!r} (this Ollie reads "
                          f"formats 1 and {FORMAT_VERSION}); optimize the model again and save it")
    kernels = doc.get("kernels")
    if not isinstance(kernels, list):
        raise FormatError(f"{where}: 'kernels' must be a list")
    if version == 1 and any(isinstance(k, dict) and "node" in k for k in kernels):
        raise FormatError(f"{where}: a format 1 program stores graph operators as pickles, "
                          "which Ollie does not load (they can run arbitrary code); optimize the "
                          "model again with this version of Ollie and save it")
    try:
        inputs = tuple((name_of(n, f"{where}: inputs"), shape_of(s, f"{where}: inputs"))
                       for n, s in _pairs(doc.get("inputs"), where))
        outputs = doc.get("outputs")
        if not isinstance(outputs, list):
            raise FormatError(f"{where}: 'outputs' must be a list")
        outputs = tuple(name_of(n, f"{where}: outputs") for n in outputs)
        return inputs, outputs, [kernel_from_json(k, f"{where}: kernels[{i}]")
                                 for i, k in enumerate(kernels)]
    except RecursionError:
        raise FormatError(f"{where}: nested too deeply") from None


def _pairs(v: object, where: Path) -> list[tuple[object, object]]:
    if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
        raise FormatError(f"{where}: 'inputs' must be a list of [name, shape] pairs")
    return [(p[0], p[1]) for p in v]


def program_digest(prog: Program) -> str:
    """A digest of ``prog``'s inputs, outputs and kernels (not its constants)."""
    doc = json.dumps([prog.inputs, prog.outputs,
                      [kernel_to_json(kn, with_node=False) for kn in prog.kernels]],
                     sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


__all__ = ["FORMAT_VERSION", "Program", "constant_array", "kernel_from_json", "kernel_to_json",
           "program_digest"]
