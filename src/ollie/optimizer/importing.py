"""Models into graphs for the optimiser (:func:`to_graph`): a ``torch.nn.Module`` through
torch.export, an ``.onnx`` path or an ``onnx.ModelProto``; identities removed, BatchNorm
folded, float32 only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ollie.errors import OllieError, UnsupportedError
from ollie.graph import Graph


def to_graph(model: object, example_inputs: Sequence[torch.Tensor] | torch.Tensor | None,
             check: bool = True) -> Graph:
    """The graph of a torch module, an ONNX path or an ONNX ModelProto, identities removed and
    BatchNorm folded. ``example_inputs``: a sequence of tensors, one per model input (a lone
    tensor is one input); a module needs them (they fix every shape), an ONNX model's
    symbolic dimensions are fixed by their shapes (its fixed ones must match). A module's
    graph is checked against the module on new inputs (:func:`checked_import`; ``check`` off: the
    caller does that before it uses the graph for anything but a cache lookup). A model
    that is not float32 raises :class:`~ollie.errors.UnsupportedError` saying what to
    convert."""
    from ollie.frontend import from_onnx, from_torch, onnx_import, torch_check
    from ollie.graph.passes import eliminate_identity, fold_batchnorm

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise OllieError("optimize(module, example_inputs): example inputs are needed to "
                             "trace a torch module")
        inputs = tuple(example_inputs)
        problem = torch_check.float32_problem(model, inputs)
        if problem is not None:
            raise UnsupportedError(problem)
        graph = fold_batchnorm(eliminate_identity(from_torch(model, inputs)))
        return checked_import(graph, model, inputs) if check else graph
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


def checked_import(graph: Graph, model: object,
                   example_inputs: Sequence[torch.Tensor] | torch.Tensor | None) -> Graph:
    """``graph`` once it is checked against ``model`` when that is a torch module
    (:func:`ollie.frontend.torch_check.check_import`, which raises where they differ)."""
    from ollie.frontend import torch_check

    if isinstance(model, torch.nn.Module) and example_inputs is not None:
        inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else \
            tuple(example_inputs)
        torch_check.check_import(graph, model, inputs)
    return graph


__all__ = ["checked_import", "to_graph"]
