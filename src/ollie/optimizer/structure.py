"""What a torch module returns, around its tensors (:class:`OutputStructure`): the tuples, lists
and dicts (any container torch's pytree knows) of its output, which of their leaves are the
program's outputs (in order, as the import numbers them) and which are other values (None,
numbers, text). An optimised program called like the module then returns what the module
returns: ``out["out"]`` of a torchvision segmentation model, a 1-tuple, a dict of heads.

Kept beside a saved program as JSON (:meth:`OutputStructure.to_json`: torch's own pytree
serialisation of the containers, which names types, and the leaves) and read back by
:meth:`OutputStructure.from_json`, which only maps those names to the container types
registered in this process: nothing is imported or executed. A container torch cannot
serialise (a namedtuple nobody registered) is kept in the process that made the program and
not saved: a loaded program then returns its outputs as a tensor or a tuple of tensors.
Why: docs/design/042-integer-inputs-in-the-backend.md (decision 2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.utils._pytree import (
    TreeSpec,
    tree_flatten,
    tree_unflatten,
    treespec_dumps,
    treespec_loads,
)

from ollie.errors import OllieError

if TYPE_CHECKING:
    from ollie.optimizer.report import OptimizedModel

M = TypeVar("M", bound="OptimizedModel")

Leaf = tuple[str, Any]
"""``("output", i)``: the program's output ``i``; ``("value", v)``: the constant ``v``."""

CONSTANTS = (type(None), bool, int, float, str)
"""The non-tensor leaves a structure keeps (as returned, and in its JSON)."""


@dataclass(frozen=True)
class OutputStructure:
    """The containers of a module's output (``spec``) and what each of its leaves is
    (:data:`Leaf`); ``spec`` None: the program's outputs as they are (a tensor, or a tuple
    for several), where the module returns that or something this cannot rebuild."""

    spec: TreeSpec | None
    leaves: tuple[Leaf, ...] = ()

    @classmethod
    def of(cls, value: object, outputs: int) -> OutputStructure:
        """The structure of ``value``, a module's output whose tensor leaves are the
        program's ``outputs`` outputs in order; the plain one (``spec`` None) where its other
        leaves are not :data:`CONSTANTS`, its tensors are not ``outputs`` in number, or it
        is already a tensor or a tuple of several tensors."""
        flat, spec = tree_flatten(value)
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        if len(tensors) != outputs or not all(isinstance(x, (torch.Tensor, *CONSTANTS))
                                              for x in flat):
            return cls(None)
        plain = isinstance(value, torch.Tensor) or (
            type(value) is tuple and len(value) > 1 and
            all(isinstance(x, torch.Tensor) for x in value))
        if plain:
            return cls(None)
        leaves: list[Leaf] = []
        for x in flat:
            leaves.append(("output", sum(kind == "output" for kind, _ in leaves))
                          if isinstance(x, torch.Tensor) else ("value", x))
        return cls(spec, tuple(leaves))

    def rebuild(self, outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> Any:
        """The module's output made of the program's ``outputs`` (as
        :class:`~ollie.exec.executor.CompiledProgram` returns them)."""
        if self.spec is None:
            return outputs
        outs: Sequence[torch.Tensor] = outputs if isinstance(outputs, tuple) else (outputs,)
        return tree_unflatten([outs[v] if kind == "output" else v for kind, v in self.leaves],
                              self.spec)

    def to_json(self) -> dict | None:
        """The JSON :meth:`from_json` reads; None where torch cannot serialise a container
        (the structure is then not saved)."""
        if self.spec is None:
            return {"spec": None, "leaves": []}
        try:
            spec = treespec_dumps(self.spec)
        except Exception:  # a container type with no serialised name (a namedtuple)
            return None
        return {"spec": spec, "leaves": [list(leaf) for leaf in self.leaves]}

    @classmethod
    def from_json(cls, doc: object, outputs: int) -> OutputStructure:
        """The structure :meth:`to_json` wrote for a program of ``outputs`` outputs; raises
        :class:`~ollie.errors.OllieError` saying what is wrong with ``doc`` (a container
        type not registered in this process, leaves that do not number the outputs in order
        or are not :data:`CONSTANTS`)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("leaves"), list):
            raise OllieError("'outputs' must be an object with a list of 'leaves'")
        if doc.get("spec") is None:
            return cls(None)
        if not isinstance(doc["spec"], str):
            raise OllieError("'outputs.spec' must be text")
        try:
            spec = treespec_loads(doc["spec"])
        except Exception as exc:  # unknown container type names, malformed JSON
            raise OllieError(f"output containers not read ({str(exc)[:120]})") from exc
        leaves: list[Leaf] = []
        for leaf in doc["leaves"]:
            if not (isinstance(leaf, list) and len(leaf) == 2 and leaf[0] in ("output", "value")
                    and isinstance(leaf[1], CONSTANTS)):
                raise OllieError(f"output leaf {leaf!r} is not ['output', i] or ['value', v]")
            leaves.append((leaf[0], leaf[1]))
        numbers = [v for kind, v in leaves if kind == "output"]
        if numbers != list(range(outputs)) or any(type(v) is not int for v in numbers) or \
                spec.num_leaves != len(leaves):
            raise OllieError(f"the output leaves do not number the program's {outputs} "
                             "output(s) in order")
        return cls(spec, tuple(leaves))




def structure_of(module: torch.nn.Module, examples: Sequence[object] | torch.Tensor | None,
                 outputs: int) -> OutputStructure | None:
    """The :class:`OutputStructure` of ``module``'s output on ``examples`` (run once, without
    gradients), or None where it fails on them."""
    if examples is None:
        return None
    args = (examples,) if isinstance(examples, torch.Tensor) else tuple(examples)
    try:
        with torch.no_grad():
            return OutputStructure.of(module(*args), outputs)
    except Exception:  # the program then returns its outputs as they are
        return None


def with_structure(module: torch.nn.Module | None,
                   examples: Sequence[object] | torch.Tensor | None, model: M) -> M:
    """``model`` (an :class:`~ollie.optimizer.report.OptimizedModel` of ``module``) with its
    ``structure`` found by :func:`structure_of` where it has none and there is a module."""
    if module is not None and model.structure is None:
        model.structure = structure_of(module, examples, len(model.program.outputs))
    return model


__all__ = ["CONSTANTS", "Leaf", "OutputStructure", "structure_of", "with_structure"]
