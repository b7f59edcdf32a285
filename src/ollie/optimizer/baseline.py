"""The originals every candidate of a subprogram is measured against: the original operator as
the optimised program would run it if kept (:func:`original_runner`: a ``Node`` kernel, its
library chosen by Ollie) and as the framework runs it (:func:`eager_runner`: PyTorch, through
the graph's reference executor), and how a kept original is made to run PyTorch's
implementation (:func:`torch_original`).

A candidate must beat both (:attr:`ollie.optimizer.select.Selection.best`), so a subprogram is
never slower than the framework running the original operator, whichever of Ollie's library
choices it would otherwise keep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np
import torch

from ollie.exec.conv import TORCH
from ollie.exec.executor import CompiledProgram
from ollie.graph import Node, run_node
from ollie.ir import Expr
from ollie.optimizer.select import as_input
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.program.program import Program


def canonical_node(node: Node, expr: Expr) -> Node:
    """``node`` reading ``expr``'s declared tensors (its canonical names) in order."""
    return Node(node.op, tuple(n for n, _ in expr.decls), node.outputs, dict(node.attrs),
                node.name)


def original_runner(node: Node, expr: Expr, inputs: Mapping[str, np.ndarray],
                    weights: Mapping[str, np.ndarray], device: str = "cpu",
                    channels_last: frozenset[str] = frozenset()) -> Callable[[], object]:
    """The original operator as the optimised program would run it if kept (a ``Node``
    kernel of the executor, weights as constants: a convolution's weight packed once), on
    ``inputs`` (those in ``channels_last`` as channels-last tensors)."""
    canon = canonical_node(node, expr)
    kernel = Kernel(KernelKind.NODE, NodeParams(node=canon, op=canon.op), canon.inputs,
                    canon.outputs[0], None, (), tuple(expr.shape))
    prog = Program(tuple((n, s) for n, s in expr.decls if n not in weights),
                   (canon.outputs[0],), [kernel],
                   {n: np.asarray(v, np.float32) for n, v in weights.items()})
    compiled = CompiledProgram(prog, device)
    feed = {n: as_input(inputs[n], device, n in channels_last) for n, _ in prog.inputs}
    return lambda: compiled.run(feed)


def eager_runner(node: Node, expr: Expr, inputs: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], device: str = "cpu",
                 channels_last: frozenset[str] = frozenset()) -> Callable[[], object]:
    """The original operator as the framework runs it: PyTorch's implementation
    (:func:`ollie.graph.run_node`) under ``torch.inference_mode``, on the same ``inputs`` as
    :func:`original_runner` (weights as tensors on ``device``)."""
    canon = canonical_node(node, expr)
    tensors = [as_input(np.asarray(weights[n] if n in weights else inputs[n], np.float32),
                        device, n in channels_last) for n in canon.inputs]

    def run() -> object:
        with torch.inference_mode():
            return run_node(canon, tensors)

    return run


def torch_original(kernel: Kernel) -> Kernel:
    """``kernel`` (an original operator kept as a ``Node``) running PyTorch's implementation
    (``params.library`` :data:`ollie.exec.conv.TORCH`)."""
    return replace(kernel, params=replace(kernel.params, library=TORCH))


__all__ = ["TORCH", "canonical_node", "eager_runner", "original_runner", "torch_original"]
