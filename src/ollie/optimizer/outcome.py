"""A subprogram's decision (:class:`Outcome`: the chosen program or the original operator,
with its measured times and the alternatives the program-context step may try), its JSON form
for the decision cache, and :func:`cached_outcome`, which reads one back only after checking
it fits the subprogram it is applied to; :class:`Placed`, a decision of several nodes (a
contraction chain, a linear region) as the model optimiser places it."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from ollie.errors import OllieError
from ollie.ir import Expr
from ollie.optimizer.report import Alternative, SubprogramReport
from ollie.program.kernel import Kernel
from ollie.program.program import Program, constant_array
from ollie.program.serialize import FormatError, kernel_from_json, kernel_to_json

log = logging.getLogger(__name__)

D = TypeVar("D")
"""The decision type of a :class:`Placed` subprogram."""


@dataclass
class Outcome:
    """The decision for one distinct subprogram (shared by identical ones)."""

    kernels: list[Kernel] | None    # the chosen candidate's kernels, None: the original
    output: str | None
    label: str
    derivation: list[str]
    original_s: float
    optimized_s: float
    candidates: int
    alternatives: list[Alternative] = field(default_factory=list)
    """When the original won alone: rewrites the context step tries in the whole program
    (:meth:`ollie.optimizer.select.Selection.alternatives`)."""
    eager_s: float | None = None
    """The original's time as the framework runs it (PyTorch), when measured."""
    original_library: str | None = None
    """The library the original operator runs when kept (:data:`ollie.exec.conv.TORCH`:
    PyTorch's implementation, faster than Ollie's own choice), None: Ollie's choice."""
    unconfirmed: bool = False
    """Decided on a busy machine and not confirmed by a second measurement: never cached
    (:attr:`ollie.optimizer.select.Selection.unconfirmed`)."""

    def to_json(self) -> str:
        kernels = None if self.kernels is None else [kernel_to_json(k) for k in self.kernels]
        return json.dumps({**self.__dict__, "kernels": kernels,
                           "alternatives": [a.to_doc() for a in self.alternatives]})

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        """The decision of a document of :meth:`to_json`; :class:`FormatError`,
        ``ValueError`` or ``TypeError`` when malformed."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise FormatError("a decision is a JSON object")
        if doc.get("kernels") is not None:
            doc["kernels"] = [kernel_from_json(k) for k in doc["kernels"]]
        doc["alternatives"] = [Alternative.from_doc(a) for a in doc.get("alternatives", [])]
        return cls(**doc)


def cached_outcome(doc: str, expr: Expr, weights: Mapping[str, np.ndarray]
                    ) -> Outcome | None:
    """The decision cached as ``doc`` for the subprogram ``expr``, when it is well formed and
    its kernels compute ``expr``'s output from ``expr``'s tensors with the shapes they
    declare (:meth:`Program.validate`); None otherwise (the subprogram is searched again)."""
    try:
        out = Outcome.from_json(doc)
        decls = tuple(expr.decls)
        for kernels, output in ([(out.kernels, out.output)] if out.kernels is not None else []) \
                + [(a.kernels, a.output) for a in out.alternatives]:
            if not isinstance(output, str):
                raise FormatError("a chosen program names its output")
            prog = Program(tuple((n, s) for n, s in decls if n not in weights), (output,),
                           list(kernels), {n: constant_array(weights[n]) for n, _ in decls
                                           if n in weights})
            prog.validate()
            if tuple(prog.tensor_shapes()[output]) != tuple(expr.shape):
                raise FormatError(f"its output has shape {prog.tensor_shapes()[output]}, the "
                                  f"subprogram {list(expr.shape)}")
        return out
    except (OllieError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring a malformed cached decision (%s); searching again",
                    str(exc)[:200])
        return None


@dataclass
class Placed(Generic[D]):
    """A subprogram of several nodes as the model optimiser places it: its decision key
    (switched off, its nodes run as the original operators), its decision, its kernels on
    the model's tensor names (empty when not kept), report entry and note."""

    key: str
    outcome: D
    kernels: list[Kernel]
    report: SubprogramReport
    note: str


__all__ = ["Outcome", "Placed", "cached_outcome"]
