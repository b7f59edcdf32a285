"""Launch configurations of generated CUDA kernels: fixed per stage, read back from Triton's
autotuner, recorded in a checked program (``cuda_configs``) and kept through save / load, so a
loaded program runs the code that was checked instead of autotuning again."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.codegen import compile_eop
from ollie.exec.dispatch import CUDA_CONFIGS, pin_cuda_configs
from ollie.optimizer.report import unpinned_kernels
from ollie.program.program import Program
from ollie.settings import using

triton = pytest.importorskip("triton", reason="triton is not installed")
cuda = pytest.importorskip("ollie.codegen.cuda")

TWO_STAGES = """
A: [6, 5]
L<i=0:6, j=0:5> Sum<k=-1:6> { L<a=0:6, b=-1:5> Sum<c=0:2> A[a, b + c] }[i, k] * A[i, j]
"""

@pytest.fixture(autouse=True)
def _compiled_mode():
    """The kernels as built for a GPU (loading them needs none), not Triton's interpreter;
    the in-process kernels, whose autotuners these tests mark, are forgotten after each."""
    with using(cuda_interpret=False):
        yield
    cuda.clear_cache()


def _stages(text: str) -> int:
    return len(cuda.compile_cuda(text, interpret=False).stages)


def test_per_stage_configs_fix_each_launch():
    assert _stages(TWO_STAGES) == 2
    k = cuda.compile_cuda(TWO_STAGES, interpret=False, configs=[(128, 2), (256, 4)])
    assert k.configs == ((128, 2), (256, 4)) and k.tuned_configs() == k.configs
    assert "@triton.autotune(" not in k.source
    same = cuda.compile_cuda(TWO_STAGES, interpret=False, config=(512, 8))
    assert same.configs == ((512, 8), (512, 8))


@pytest.mark.parametrize("kw, match", [
    ({"configs": [(128, 2)]}, "1 .* pair.*2 kernel"),
    ({"configs": [(128, 2, 1), (128, 2)]}, "pair"),
    ({"configs": [(100, 2), (128, 2)]}, "power of two"),
    ({"config": (128, 2), "configs": [(128, 2), (128, 2)]}, "not both"),
])
def test_bad_configs_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        cuda.compile_cuda(TWO_STAGES, interpret=False, **kw)


def test_interpreter_refuses_configs_and_compile_eop_ignores_pinned_ones():
    with pytest.raises(ValueError, match="interpret=True"):
        cuda.compile_cuda(TWO_STAGES, interpret=True, configs=[(128, 2), (128, 2)])
    with using(cuda_interpret=True):
        k = compile_eop(TWO_STAGES, "cuda", cuda_configs=[[128, 2], [128, 2]])
    assert k.interpret and k.configs is None  # the interpreter has one block size of its own


def _mark_tuned(kernel, picks):
    """What Triton's autotuner records after its first call on a GPU."""
    for fn, (block, warps) in zip(kernel.functions, picks, strict=True):
        fn.best_config = triton.Config({"BLOCK": block}, num_warps=warps)


def test_tuned_configs_are_read_from_the_autotuner():
    k = cuda.compile_cuda(TWO_STAGES, interpret=False)
    assert k.configs is None and k.tuned_configs() is None  # nothing ran yet
    _mark_tuned(k, [(256, 4), (1024, 8)])
    assert k.tuned_configs() == ((256, 4), (1024, 8))
    assert cuda.compile_cuda(TWO_STAGES, interpret=False,
                             configs=k.tuned_configs()).configs == ((256, 4), (1024, 8))


def test_pinned_configs_are_recorded_and_survive_save_and_load(tmp_path, matmul_program):
    _, prog, _ = matmul_program
    eops = [k for k in prog.kernels if k.kind == "eOp"]
    assert pin_cuda_configs(prog.kernels) == prog.kernels  # nothing ran on a GPU: unchanged
    picks = {}
    for k in eops:
        compiled = compile_eop(k.expr, "cuda")
        picks[k.output] = [(128, 4)] * len(compiled.stages)
        _mark_tuned(compiled, picks[k.output])
    pinned = pin_cuda_configs(prog.kernels)
    assert unpinned_kernels(prog) == [k.output for k in eops]
    assert unpinned_kernels(Program(prog.inputs, prog.outputs, pinned, prog.constants)) == []
    for k in pinned:
        if k.kind == "eOp":
            assert k.params[CUDA_CONFIGS] == [list(c) for c in picks[k.output]]
        else:
            assert CUDA_CONFIGS not in k.params
    Program(prog.inputs, prog.outputs, pinned, prog.constants).save(tmp_path / "p")
    loaded = Program.load(tmp_path / "p")
    for k in loaded.kernels:
        if k.kind == "eOp":
            assert k.params[CUDA_CONFIGS] == [list(c) for c in picks[k.output]]
            fixed = compile_eop(k.expr, "cuda", cuda_configs=k.params[CUDA_CONFIGS])
            assert fixed.configs == tuple(picks[k.output])


class _Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.conv = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return torch.tanh(self.conv(torch.relu(self.up(x))) + 1.0)


def test_optimized_program_runs_through_the_cuda_backend_in_the_interpreter():
    """The whole model fused into generated code, its 0-d constant (``+ 1.0``) declared
    ``[1]`` in the expression: the CUDA kernels read it as that reshape, as the CPU code reads
    every tensor flat (they refused it, so on a GPU such a program fell back to the original
    operators)."""
    from ollie.exec.executor import CompiledProgram

    torch.manual_seed(0)
    m = _Generator().eval()
    x = torch.randn(2, 16, 6, 6)
    opt = ollie.optimize(m, (x,), time_budget=4.0, max_candidates=4, use_cache=False,
                         settle=0.0, choose_libraries=False, context=False)
    assert any(k.kind == "eOp" for k in opt.program.kernels), opt.summary()
    assert any(v.ndim == 0 for v in opt.program.constants.values())
    with using(cuda_interpret=True):
        got = CompiledProgram(opt.program, "cpu", backend="cuda").run({"x": x})
    with torch.no_grad():
        torch.testing.assert_close(got[opt.program.outputs[0]], m(x), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_a_cpu_program_loaded_on_a_gpu_says_its_kernels_were_not_checked_there(tmp_path):
    torch.manual_seed(0)
    m = _Generator().eval()
    x = torch.randn(2, 16, 6, 6)
    opt = ollie.optimize(m, (x,), time_budget=4.0, max_candidates=4, use_cache=False,
                         settle=0.0, choose_libraries=False, context=False)
    assert unpinned_kernels(opt.program)
    opt.save(tmp_path / "p")
    on_gpu = ollie.load(tmp_path / "p", device="cuda")
    assert any("no launch configuration checked on a GPU" in n for n in on_gpu.notes)
    assert not any("launch configuration" in n for n in ollie.load(tmp_path / "p").notes)
    with torch.no_grad():
        torch.testing.assert_close(on_gpu(x.cuda()).cpu(), m(x), rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
def test_checked_program_pins_what_ran_and_runs_it_again_after_load(tmp_path, matmul_program):
    from ollie.exec.executor import CompiledProgram

    _, prog, _ = matmul_program
    a = torch.randn(2, 8, 6, 6, device="cuda")
    first = CompiledProgram(prog, "cuda", cuda_graphs=False).run({"A": a})  # autotunes
    pinned = Program(prog.inputs, prog.outputs, pin_cuda_configs(prog.kernels), prog.constants)
    assert all(CUDA_CONFIGS in k.params for k in pinned.kernels if k.kind == "eOp")
    pinned.save(tmp_path / "p")
    cuda.clear_cache()  # as in a new process
    loaded = Program.load(tmp_path / "p")
    again = CompiledProgram(loaded, "cuda", cuda_graphs=False).run({"A": a})
    out = prog.outputs[0]
    torch.testing.assert_close(again[out], first[out])


@pytest.mark.gpu
def test_optimized_gpu_program_is_pinned_and_loads_without_autotuning(tmp_path):
    torch.manual_seed(0)
    m = _Generator().eval().cuda()
    x = torch.randn(2, 16, 6, 6, device="cuda")
    opt = ollie.optimize(m, (x,), device="cuda", time_budget=4.0, max_candidates=4,
                         use_cache=False)
    assert not any("failed to run" in n or "falling back" in n for n in opt.notes), opt.notes
    eops = [k for k in opt.program.kernels if k.kind == "eOp"]
    assert eops and all(CUDA_CONFIGS in k.params for k in eops), opt.summary()
    opt.save(tmp_path / "p")
    cuda.clear_cache()  # as in a new process
    again = ollie.load(tmp_path / "p", device="cuda")
    for k in again.program.kernels:
        if k.kind == "eOp":
            fixed = compile_eop(k.expr, "cuda", cuda_configs=k.params[CUDA_CONFIGS])
            assert "@triton.autotune(" not in fixed.source
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(again(x), opt(x))
    torch.testing.assert_close(again(x), want, rtol=1e-3, atol=1e-4)


def test_a_fused_activation_pins_the_code_for_its_argument():
    from ollie.program.kernel import Kernel

    expr = ollie.parse("A: [4, 3]\nL<i=0:4, j=0:3> tanh(A[i, j] + 1)")
    k = Kernel("eOp", {"expr": ollie.format(expr), "activation": "tanh"}, ("A",), "y", expr)
    inner = compile_eop(k.without_activation().expr, "cuda")  # what runs on the GPU
    _mark_tuned(inner, [(128, 2)] * len(inner.stages))
    (pinned,) = pin_cuda_configs([k])
    assert pinned.params[CUDA_CONFIGS] == [[128, 2]] * len(inner.stages)
    assert pinned.without_activation().params[CUDA_CONFIGS] == pinned.params[CUDA_CONFIGS]


def test_a_failure_to_fix_the_configurations_keeps_the_checked_program(monkeypatch, matmul_program):
    """Fixing the launch configurations builds the kernels again: if that fails (Triton's
    compile errors have many types), the program that was checked is kept, autotuned as
    before, and OllieErrors still reach the end-to-end check."""
    import importlib

    final = importlib.import_module("ollie.optimizer.final")
    from ollie.errors import OllieError

    _, prog, _ = matmul_program

    def broken(_kernels):
        raise RuntimeError("triton: compilation failed")

    monkeypatch.setattr(final, "pin_cuda_configs", broken)
    assert final._pinned(prog, 1e-6, {}, {}, None, None) == (prog, 1e-6)

    def refused(_kernels):
        raise OllieError("no such kernel")

    monkeypatch.setattr(final, "pin_cuda_configs", refused)
    with pytest.raises(OllieError):
        final._pinned(prog, 1e-6, {}, {}, None, None)
    monkeypatch.setattr(final, "pin_cuda_configs", list)  # nothing ran on a GPU
    assert final._pinned(prog, 1e-6, {}, {}, None, None) == (prog, 1e-6)
