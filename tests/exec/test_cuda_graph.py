"""CUDA graph replay of programs: same results as running kernel by kernel, results the caller
keeps are not overwritten, a function that cannot be captured still runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ollie
from ollie.exec import cuda_graph
from ollie.exec.executor import CompiledProgram
from ollie.settings import from_environ, using


def test_enabled_follows_the_environment():
    with using(from_environ({})):
        assert cuda_graph.enabled()
    for off in ("0", "false", "No", " off "):
        with using(from_environ({"OLLIE_CUDA_GRAPHS": off})):
            assert not cuda_graph.enabled()
    with using(from_environ({"OLLIE_CUDA_GRAPHS": "1"})):
        assert cuda_graph.enabled()


def test_cpu_programs_never_capture(matmul_program):
    _, prog, _ = matmul_program
    assert not CompiledProgram(prog, "cpu", cuda_graphs=True).cuda_graphs


@pytest.mark.gpu
def test_program_replayed_as_graph_matches_and_keeps_results(matmul_program):
    expr, prog, weight = matmul_program
    graphed = CompiledProgram(prog, "cuda", cuda_graphs=True)
    plain = CompiledProgram(prog, "cuda", cuda_graphs=False)
    out = prog.outputs[0]
    rng = np.random.default_rng(1)
    results = []
    for _ in range(4):  # run, capture, replay, replay
        a = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
        got = graphed.run({"A": a})[out]
        want = ollie.interpret(expr, {"A": a, "K": weight})
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(got, plain.run({"A": a})[out])
        results.append((got, want))
    assert graphed._graph is not None and graphed._graph.captured
    for got, want in results:  # earlier results were not overwritten by later replays
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=2e-3, atol=2e-3)
    times = graphed.profile({"A": torch.randn(2, 8, 6, 6, device="cuda")})
    assert len(times) == len(prog.kernels) and all(t > 0 for t in times)


@pytest.mark.gpu
def test_function_that_cannot_be_captured_runs_as_it_is():
    x = torch.arange(6.0, device="cuda")

    def host_sync() -> torch.Tensor:
        return x * float(x.sum().item())  # .item() synchronises: not capturable

    fn = cuda_graph.Graphed(host_sync, "host sync")
    for _ in range(3):
        torch.testing.assert_close(fn(), x * 15.0)
    assert not fn.captured and fn.failed
    # the failed capture left the device's random generator usable, and as seeded
    assert not cuda_graph.release_rng()
    torch.manual_seed(3)
    a = torch.randn(5, device="cuda")
    torch.manual_seed(3)
    torch.testing.assert_close(torch.randn(5, device="cuda"), a)
