"""A whole program: runtime inputs, constants (weights), kernels in execution order, outputs.

Programs are what candidates, subprogram optimisations and optimised models become; they are
post-processed (:mod:`ollie.program.postprocess`), executed (:mod:`ollie.runtime.executor`)
and saved / loaded here. The file format is a folder holding ``program.json`` (structure;
each kernel's expression as text, re-parsed on load) and ``constants.npz``.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ollie.errors import OllieError
from ollie.ir import format_expr, parse
from ollie.program.kernel import Kernel, View

FORMAT_VERSION = 1


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
                declared = getattr(k.params["node"], "attrs", {}).get("output_shapes") or ()
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
        return " -> ".join(k.kind if k.kind != "eOp" else f"eOp{list(k.output_shape)}"
                           for k in self.kernels)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT_VERSION, "inputs": [[n, list(s)] for n, s in self.inputs],
               "outputs": list(self.outputs),
               "kernels": [kernel_to_json(k) for k in self.kernels]}
        (path / "program.json").write_text(json.dumps(doc, indent=1))
        np.savez(path / "constants.npz", **self.constants)

    @classmethod
    def load(cls, path: str | Path) -> Program:
        path = Path(path)
        try:
            doc = json.loads((path / "program.json").read_text())
            with np.load(path / "constants.npz") as z:
                constants = {n: z[n] for n in z.files}
        except (OSError, ValueError) as exc:
            raise OllieError(f"{path}: not a saved Ollie program ({exc})") from None
        if doc.get("format") != FORMAT_VERSION:
            raise OllieError(f"{path}: unsupported program format {doc.get('format')}")
        prog = cls(tuple((n, tuple(s)) for n, s in doc["inputs"]), tuple(doc["outputs"]),
                   [kernel_from_json(k) for k in doc["kernels"]], constants)
        prog.check()
        return prog


def kernel_to_json(k: Kernel) -> dict:
    params = {p: v for p, v in k.params.items() if _jsonable(v)}
    doc = {"kind": k.kind, "params": params, "inputs": list(k.inputs), "output": k.output,
           "expr": None if k.expr is None else format_expr(k.expr),
           "views": [None if v is None else [v.offset, list(v.sizes), list(v.strides)]
                     for v in k.views],
           "shape": None if k.shape is None else list(k.shape)}
    if k.kind == "Node":
        # the graph node (its attributes may hold torch callables or ONNX protos): pickled;
        # load programs only from sources you trust, as with any pickle
        doc["node"] = base64.b64encode(pickle.dumps(k.params["node"])).decode()
    return doc


def kernel_from_json(d: Mapping) -> Kernel:
    views = tuple(None if v is None else View(v[0], tuple(v[1]), tuple(v[2]))
                  for v in d.get("views", ()))
    params = dict(d["params"])
    if d["kind"] == "Node":
        params["node"] = pickle.loads(base64.b64decode(d["node"]))
    return Kernel(d["kind"], params, tuple(d["inputs"]), d["output"],
                  None if d["expr"] is None else parse(d["expr"]), views,
                  None if d.get("shape") is None else tuple(d["shape"]))


def _jsonable(v: object) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True
