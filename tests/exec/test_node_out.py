"""Graph operators run as they are write into the executor's reused buffers where they can
(``ollie.exec.node.writes_out``): softmax writes into the buffer it is given, agrees with the
reference executor, and a program reuses that buffer across calls (a fresh large output is
page-faulted in on every call)."""

from __future__ import annotations

import torch

from ollie.exec.dispatch import compile_kernel
from ollie.exec.executor import CompiledProgram
from ollie.exec.node import writes_out
from ollie.graph import Graph, Node, run_graph
from ollie.optimizer.final import node_kernel
from ollie.program.program import Program


def _softmax_graph(shape: tuple[int, ...], axis: int) -> Graph:
    g = Graph([("x", shape)], ["y"], [Node("Softmax", ("x",), ("y",), {"axis": axis})], {})
    return g.infer_shapes()


def test_softmax_writes_into_the_given_buffer() -> None:
    torch.manual_seed(0)
    for shape, axis in (((3, 5, 7), -1), ((2, 6, 4), 1)):
        g = _softmax_graph(shape, axis)
        k = node_kernel(g, g.nodes[0])
        assert writes_out(k)
        x = torch.randn(shape) * 4
        want = run_graph(g, {"x": x})["y"]
        out = torch.full(shape, float("nan"))
        got = compile_kernel(k)({"x": x}, out)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        # without a buffer (or with one of another shape) it returns a fresh tensor
        torch.testing.assert_close(compile_kernel(k)({"x": x}, None), want)
        other = torch.empty(shape[::-1])
        fresh = compile_kernel(k)({"x": x}, other)
        assert fresh.data_ptr() != other.data_ptr()
        torch.testing.assert_close(fresh, want)


def test_program_reuses_the_softmax_buffer_across_calls() -> None:
    torch.manual_seed(1)
    g = _softmax_graph((4, 9, 33), -1)
    k = node_kernel(g, g.nodes[0])
    prog = Program((("x", (4, 9, 33)),), ("y",), [k], {})
    compiled = CompiledProgram(prog, "cpu")
    assert compiled.cached == [True]
    with torch.inference_mode():
        for _ in range(3):
            x = torch.randn(4, 9, 33)
            y = compiled(x)
            torch.testing.assert_close(y, torch.softmax(x, -1))
            del y   # released: the next call may write into the same buffer
    assert compiled.buffers is not None and compiled.buffers.reused >= 1
