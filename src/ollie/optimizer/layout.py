"""Which tensors of a program being optimised will likely be channels-last on the CPU, so that
the subprograms reading them are measured with them so (:class:`ollie.optimizer.model.
_Optimizer` tracks them as it decides each node)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ollie.graph import Graph, Node
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind

CHANNELS_LAST_OPS = ("Conv2d", "ConvTranspose2d")
"""Operators whose 4-D output the CPU runtime usually leaves channels-last (oneDNN), when kept
or run as a library ``Conv`` kernel."""
PASS_LAYOUT_OPS = ("Relu", "Tanh", "Sigmoid", "Add", "MaxPool2d")
"""Operators whose output keeps the memory format of a channels-last input: fused into the
convolution before them (activations, residual additions) or run by torch (max pooling)."""


def likely_channels_last(graph: Graph, node: Node, chosen: Sequence[Kernel],
                         channels_last: Collection[str], device: str) -> bool:
    """Whether ``node``'s output will likely be channels-last when the program runs on the
    CPU, given the kernels chosen for it: a convolution kept as it is or run as a library
    ``Conv`` kernel (oneDNN's packed convolutions write channels-last), or an operator of
    :data:`PASS_LAYOUT_OPS` reading a tensor of ``channels_last``."""
    if device != "cpu" or len(graph.shape(node.outputs[0])) != 4 or not chosen:
        return False
    if node.op in CHANNELS_LAST_OPS:
        return chosen[-1].kind in (KernelKind.NODE, KernelKind.CONV)
    return node.op in PASS_LAYOUT_OPS and any(n in channels_last for n in node.inputs)


__all__ = ["CHANNELS_LAST_OPS", "PASS_LAYOUT_OPS", "likely_channels_last"]
