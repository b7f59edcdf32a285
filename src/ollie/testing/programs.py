"""Test helper: the program of a module's original operators (what Ollie keeps when no rewrite
wins), with feeds and the graph executor's reference outputs."""

from __future__ import annotations

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
