"""Test helpers: the program of a module's original operators (what Ollie keeps when no
rewrite wins), with feeds and the graph executor's reference outputs; a program whose first
kernel is marked with the set of groups switched on (for tests of the program-context step);
a small model of two inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from ollie.program.program import Program


def original_program(m: nn.Module, x: torch.Tensor) -> tuple[Program, dict, dict]:
    """``m``'s graph as one ``Node`` kernel per operator, feeds ``{input: x}`` and the
    reference outputs of :func:`ollie.graph.run_graph`."""
    from ollie.graph import run_graph
    from ollie.optimizer.final import all_nodes
    from ollie.optimizer.model import to_graph

    graph = to_graph(m, (x,))
    prog = all_nodes(graph)
    feeds = {graph.input_names[0]: x}
    return prog, feeds, run_graph(graph, feeds)


def marked_assembler(prog: Program) -> Callable[[frozenset[str]], Program]:
    """``assemble(on)``: ``prog`` with its first kernel's parameter ``test_on`` listing the
    groups in ``on`` (a stand-in for the program-context step's assembly, which a test's
    patched run reads back)."""
    def assemble(on: frozenset[str]) -> Program:
        first = prog.kernels[0]
        marked = replace(first, params={**first.params, "test_on": sorted(on)})
        return Program(prog.inputs, prog.outputs, [marked, *prog.kernels[1:]],
                       prog.constants)

    return assemble


class TwoInputs(nn.Module):
    """``relu(conv3x3(a) + b)`` on ``[n, 3, h, w]`` inputs, weights drawn from ``seed``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(a) + b)
