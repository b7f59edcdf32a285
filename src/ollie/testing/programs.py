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
    from ollie.optimizer.model import OptimizeConfig, _Optimizer, to_graph

    graph = to_graph(m, (x,))
    opt = _Optimizer(graph, OptimizeConfig(use_cache=False), None)
    kernels = [k for n in graph.nodes for k in opt.node_kernel(n)]
    prog = Program(tuple((n, tuple(graph.shape(n))) for n in graph.input_names),
                   tuple(graph.outputs), kernels, dict(graph.initializers))
    feeds = {graph.input_names[0]: x}
    return prog, feeds, run_graph(graph, feeds)
