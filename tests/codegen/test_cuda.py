"""Tests of the Triton (CUDA) eOperator generator, against the reference interpreter.

Without a GPU the generated kernels run in Triton's CPU interpreter (``compile_cuda(...,
interpret=True)``, which loads the kernels with Triton's interpreter whatever
``TRITON_INTERPRET`` says), and the GPU variant of every kernel is built ahead of time down
to a cubin for sm_80 (Triton bundles ptxas; no GPU needed), which catches what the interpreter
forgives (constexpr and typing rules of the real compiler). These tests skip when triton is not
installed. Tests marked ``gpu`` run the same cases compiled for CUDA on a GPU, autotuned and
under each configuration the autotuner may pick, random expressions too, plus a bandwidth
check. Source-text tests need no triton.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie import interpret as reference
from ollie.codegen.cuda import clear_cache, compile_cuda, triton_source
from ollie.codegen.cuda_plan import AUTOTUNE_CONFIGS, autotune_configs
from ollie.errors import ShapeError, UnsupportedError
from ollie.semantics import random_inputs
from ollie.settings import using
from ollie.testing.strategies import exprs, inputs_with_specials, padded_products


def _triton_works() -> str | None:
    """None when triton imports, else why not."""
    try:
        import triton.language  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install triton); generated kernels are not run"
    except Exception as err:  # a broken install must skip, not error
        return f"triton does not import: {err!r}"
    return None


_NO_TRITON = _triton_works()
needs_triton = pytest.mark.skipif(_NO_TRITON is not None, reason=_NO_TRITON or "")

CASES = {
    "offset_add_padding": """
        T: [3, 3, 2, 8, 14, 14]
        L<n=0:2, c=0:8, h=0:14, w=0:14> Sum<r=0:3, s=0:3> T[r, s, n, c, h + r - 1, w + s - 1]
    """,
    "negative_floordiv_mod": """
        A: [5, 4]
        B: [9]
        L<i=-7:9, j=-2:3> A[(i - 2*j) / 3 + 2, (i + j) % 4] - B[(-i) / 2 + 4] * B[(i - 8) % 9]
    """,
    "nested_scope_materialised": """
        A: [6, 5]
        L<i=0:6, j=0:5> Sum<k=-1:6>
            { L<a=0:6, b=-1:5> Sum<c=0:2> A[a, b + c] }[i, k] * sigmoid(A[i, j]) + tanh(0.3)
    """,
    "nested_scope_inlined_where": """
        A: [4, 6]
        L<x=-3:30> { L<i=0:4, j=0:6> relu(A[i, j]) + 1 }[x / 6 + 1, x % 6]
    """,
    "nested_scope_inlined_masked": """
        A: [3]
        L<x=0:6> Sum<k=0:3> { L<i=0:4, j=0:3> A[j] * 2 }[x, k]
    """,
    "nested_scope_two_levels": """
        A: [4, 4]
        L<i=0:4> Sum<j=0:4>
            { L<p=0:4, q=0:4> { L<u=-1:4, v=0:4> Sum<w=0:2> A[u, v + w] }[p - 1, q]
                              * exp(A[p, q]) }[i, j + 1]
    """,
    "transposed_conv_selective_add": """
        T: [1, 2, 2, 4, 4, 4]
        L<n=0:1, c=0:4, h=0:4, w=0:4> Sum<y=0:2, x=0:2> T[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]
    """,
    "transposed_conv_stride_divmod": """
        T: [4, 4, 1, 3, 2, 2]
        L<n=0:1, c=0:3, h=0:4, w=0:4> Sum<r=0:4, s=0:4>
            { L<r=0:4, s=0:4, n=0:1, c=0:3, y=0:2, p=0:1, x=0:2, q=0:1> T[r, s, n, c, y, x] }
            [r, s, n, c, (h + 1 - r) / 2, (h + 1 - r) % 2, (w + 1 - s) / 2, (w + 1 - s) % 2]
    """,
    "layout_split_channels": """
        A: [2, 16, 6, 6]
        L<n=0:2, c=0:4, h=0:6, w=0:6, k=0:4> A[n, 4*c + k, h, w]
    """,
    "layout_flatten_divmod": """
        B: [2, 4, 6, 6, 4]
        L<x=0:1152> B[x / 576, (x / 144) % 4, (x / 24) % 6, (x / 4) % 6, x % 4]
    """,
    "functions": """
        A: [5, 7]
        L<i=0:5, j=0:7> max(relu(A[i, j]), abs(A[i, j - 1])) + min(tanh(A[i, j]),
            sigmoid(A[i + 1, j])) + exp(A[i, j] * 0.5) + log(abs(A[i, j]) + 1)
            + sqrt(abs(A[i, j])) / (1 + abs(A[i, j]))
    """,
    "dynamic_loop_band": """
        Q: [2, 30, 12]
        K: [2, 30, 12]
        L<b=0:2, i=0:30, j=-2:3> Sum<k=0:12> Q[b, i, k] * K[b, i + 3*j, k]
    """,
    "unused_summation_scalar_body": """
        A: [3]
        L<i=0:4> Sum<j=0:3, k=0:5> A[j]
    """,
}


def _check(expr: ollie.Expr | str, *, device: str = "cpu", interpret: bool = True,
           cache_dir=None, seed: int = 0, config: tuple[int, int] | None = None,
           inputs: dict[str, np.ndarray] | None = None) -> None:
    """The kernel's output is the interpreter's (NaN where it has NaN, its infinities)."""
    expr = ollie.parse(expr) if isinstance(expr, str) else expr
    inputs = random_inputs(expr, seed) if inputs is None else inputs
    kernel = compile_cuda(expr, interpret=interpret, cache_dir=cache_dir, config=config)
    got = kernel({n: torch.from_numpy(a).to(device) for n, a in inputs.items()})
    assert got.shape == expr.shape and got.dtype == torch.float32
    np.testing.assert_allclose(got.cpu().numpy(), reference(expr, inputs),
                               rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ollie_kernels")


# --------------------------------------------------------------------- interpreter mode
@needs_triton
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_interpreter(name, cache_dir):
    _check(CASES[name], cache_dir=cache_dir)


@needs_triton
@settings(max_examples=20, deadline=None)
@given(expr=exprs(depth=2))
def test_random_expressions_match_interpreter(expr, cache_dir):
    _check(expr, cache_dir=cache_dir)


@needs_triton
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_with_nan_and_inf_matches_interpreter(name, cache_dir):
    """NaN and infinities in the inputs reach exactly the interpreter's outputs: a read out of
    bounds annihilates the products it is a factor of (``tl.where`` on its load mask)."""
    expr = ollie.parse(CASES[name])
    inputs = random_inputs(expr, 4)
    rng = np.random.default_rng(len(name))
    for a in inputs.values():  # the first and last elements (next to padding), and one more
        flat = a.reshape(-1)
        flat[[0, -1, rng.integers(0, flat.size)]] = [np.nan, -np.inf, np.inf]
    _check(expr, cache_dir=cache_dir, inputs=inputs)


@needs_triton
def test_derived_transposed_convolution_keeps_nan_where_the_model_does(cache_dir):
    """The gather of tests/codegen/test_nan_padding.py: NaN in two output columns, not the
    whole row the kernel's band of taps reads."""
    expr = ollie.parse("""
        x0: [2, 7, 1, 8]
        x1: [7, 1, 2, 2]
        L<n=0:2, c=0:7, h=0:2, w=0:9> Sum<f=0:1, y=0:1, x=0:8>
            x0[n, c + f, y, x] * x1[c + f, 0, h - y, w - x]""")
    inputs = random_inputs(expr, 0)
    inputs["x0"][0, 2, 0, 3] = np.nan
    _check(expr, cache_dir=cache_dir, inputs=inputs)
    got = compile_cuda(expr, interpret=True, cache_dir=cache_dir)(
        {n: torch.from_numpy(a) for n, a in inputs.items()})
    assert torch.isnan(got).sum() == 4  # columns 3 and 4 of rows 0 and 1 of image 0, channel 2


@needs_triton
@settings(max_examples=30, deadline=None)
@given(expr=padded_products(), data=st.data())
def test_padded_products_with_nan_and_inf_match_interpreter(expr, data, cache_dir):
    """Triton's interpreter: the kernel gives the interpreter's NaN positions and infinities
    (``tl.where`` on the load masks annihilates a product with a read out of bounds)."""
    _check(expr, cache_dir=cache_dir, inputs=data.draw(inputs_with_specials(expr, 2)))


@needs_triton
@settings(max_examples=20, deadline=None)
@given(expr=exprs(depth=2), data=st.data())
def test_random_expressions_with_nan_and_inf_match_interpreter(expr, data, cache_dir):
    _check(expr, cache_dir=cache_dir, inputs=data.draw(inputs_with_specials(expr)))


@needs_triton
def test_out_argument_and_cache(cache_dir):
    expr = ollie.parse(CASES["layout_split_channels"])
    k1 = compile_cuda(expr, interpret=True, cache_dir=cache_dir)
    assert compile_cuda(expr, interpret=True, cache_dir=cache_dir) is k1
    assert k1.path.is_file() and k1.path.parent == cache_dir
    assert k1.path.name.startswith(f"eop_{ollie.fingerprint(expr)[:20]}_")
    inputs = {n: torch.from_numpy(a) for n, a in random_inputs(expr, 3).items()}
    out = torch.full(expr.shape, float("nan"))
    assert k1(inputs, out=out) is out
    np.testing.assert_array_equal(out.numpy(), reference(expr, inputs))
    clear_cache()
    k2 = compile_cuda(expr, interpret=True, cache_dir=cache_dir)
    assert k2 is not k1 and k2.path == k1.path


@needs_triton
def test_bad_inputs_raise(cache_dir):
    kernel = compile_cuda(CASES["negative_floordiv_mod"], interpret=True, cache_dir=cache_dir)
    with pytest.raises(ShapeError, match="missing input tensor 'B'"):
        kernel({"A": torch.zeros(5, 4)})
    with pytest.raises(ShapeError, match="has shape"):
        kernel({"A": torch.zeros(4, 5), "B": torch.zeros(9)})
    with pytest.raises(ShapeError, match="'out'"):
        kernel({"A": torch.zeros(5, 4), "B": torch.zeros(9)}, out=torch.zeros(3))


@needs_triton
def test_gpu_kernel_refuses_cpu_tensors(cache_dir):
    kernel = compile_cuda("A: [3]\nL<i=0:3> A[i] + 1", interpret=False, cache_dir=cache_dir)
    with pytest.raises(ShapeError, match="need cuda tensors"):
        kernel({"A": torch.zeros(3)})


@needs_triton
def test_cache_dir_from_the_settings(tmp_path):
    with using(cache_dir=tmp_path, kernel_dir=None):
        kernel = compile_cuda("A: [3]\nL<i=0:3> A[2 - i] * 3", interpret=True)
    assert kernel.path.parent == tmp_path / "kernels"  # as the CPU kernels
    with using(cache_dir=tmp_path, kernel_dir=tmp_path / "elsewhere"):
        kernel = compile_cuda("A: [3]\nL<i=0:3> A[2 - i] * 3", interpret=True)
    assert kernel.path.parent == tmp_path / "elsewhere"  # the kernel directory set
    np.testing.assert_allclose(kernel({"A": torch.tensor([1.0, 2.0, 3.0])}).numpy(),
                               [9.0, 6.0, 3.0])


@needs_triton
@pytest.mark.parametrize("env", [None, "0", "1"])
def test_the_mode_asked_for_whatever_triton_interpret_says(monkeypatch, tmp_path, env):
    """``triton.jit`` follows ``TRITON_INTERPRET``; the kernels follow ``interpret`` (or the
    settings), and loading them leaves the environment as it was."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if env is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", env)
    scale = {None: 2, "0": 3, "1": 5}[env]  # a module of its own, loaded under this env
    text = f"A: [4]\nL<i=0:4> A[3 - i] * {scale}.0 + 1"
    for interpret, kind in ((True, InterpretedFunction), (False, JITFunction)):
        kernel = compile_cuda(text, interpret=interpret, cache_dir=tmp_path)
        assert kernel.interpret is interpret
        for f in kernel.functions:  # an autotuner launches its .fn
            assert isinstance(f if isinstance(f, kind) else f.fn, kind)
        assert os.environ.get("TRITON_INTERPRET") == env
    with using(cuda_interpret=True):
        got = compile_cuda(text, cache_dir=tmp_path)({"A": torch.arange(4.0)})
    np.testing.assert_allclose(got.numpy(), [3.0 * scale + 1, 2.0 * scale + 1, scale + 1, 1])


def test_compile_without_triton_raises(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(UnsupportedError, match="triton"):
        compile_cuda("A: [2]\nL<i=0:2> A[1 - i] + 7", interpret=True, cache_dir=tmp_path)


# --------------------------------------------------------------------- ahead-of-time CUDA build
AOT_TARGET = ("cuda", 80, 32)  # sm_80: compiling needs Triton's bundled ptxas, not a GPU


def _aot_compile(kernel) -> None:
    """Compile every kernel of ``kernel`` (built with ``interpret=False``) down to a cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for stage, fn in zip(kernel.stages, kernel.functions, strict=True):
        jit = getattr(fn, "fn", fn)  # the autotuner wraps the @jit function
        sig = {"out_ptr": "*fp32", **{f"p{i}": "*fp32" for i in range(len(stage.args))},
               "N": "i32", "BLOCK": "constexpr"}
        src = ASTSource(fn=jit, signature=sig, constexprs={"BLOCK": 128})
        compiled = triton.compile(src, target=GPUTarget(*AOT_TARGET))
        assert compiled.asm["cubin"]


@pytest.fixture(scope="module")
def aot(cache_dir):
    """Skips unless this triton can build CUDA code here (it can without a GPU)."""
    if _NO_TRITON is not None:
        pytest.skip(_NO_TRITON)
    try:
        _aot_compile(compile_cuda("A: [4]\nL<i=0:4> A[i]", interpret=False, cache_dir=cache_dir))
    except Exception as err:
        pytest.skip(f"triton cannot build CUDA kernels on this machine: {err!r}")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_builds_for_cuda(name, cache_dir, aot):
    _aot_compile(compile_cuda(CASES[name], interpret=False, cache_dir=cache_dir))


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=15, deadline=None)
@given(expr=exprs(depth=2))
def test_random_expressions_build_for_cuda(expr, cache_dir, aot):
    _aot_compile(compile_cuda(expr, interpret=False, cache_dir=cache_dir))


# --------------------------------------------------------------------- source text
def test_source_floor_division_of_negative_index_is_shifted():
    src = triton_source("A: [7]\nL<i=-3:9> A[i / 2] + A[i % 3]", autotune=False)
    assert "(t0 + 4) // 2 - 2" in src and "(t0 + 3) % 3" in src


def test_source_proven_bounds_are_not_checked():
    src = triton_source("A: [4, 6]\nL<i=0:4, j=0:5> A[i, j + 1]", autotune=False)
    assert "mask=omask," in src and ">=" not in src and src.count(" < ") == 1  # omask only


def test_source_single_value_check_is_an_equality():
    # p = 0:1 of the inner scope read at (h + 1 - r) % 2: one comparison, "== 0", not "< 1"
    text = triton_source(CASES["transposed_conv_stride_divmod"], autotune=False)
    assert " == 0\n" in text and " < 1\n" not in text


def test_fixed_config_needs_a_power_of_two_block(cache_dir):
    with pytest.raises(ValueError, match="power of two"):
        compile_cuda("A: [4]\nL<i=0:4> A[i]", interpret=False, cache_dir=cache_dir,
                     config=(96, 4))


def test_source_autotune_only_for_gpu():
    text = CASES["offset_add_padding"]
    assert "@triton.autotune(" in triton_source(text)
    assert "@triton.autotune(" not in triton_source(text, autotune=False)
    assert "tl.static_range(0, 3)" in triton_source(text)


def test_source_nested_scopes():
    assert triton_source(CASES["nested_scope_materialised"]).count("@triton.jit") == 2
    assert triton_source(CASES["nested_scope_inlined_where"]).count("@triton.jit") == 1
    assert "tl.where(" in triton_source(CASES["nested_scope_inlined_where"])


# --------------------------------------------------------------------- GPU
@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_on_gpu(name, cache_dir):
    _check(CASES[name], device="cuda", interpret=False, cache_dir=cache_dir)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_on_gpu_every_config(name, cache_dir):
    """Autotuning may pick any of its configurations, so each must compute the same: Triton 3.6
    once miscompiled ``transposed_conv_stride_divmod`` under ``BLOCK=128, num_warps=2`` alone."""
    expr = ollie.parse(CASES[name])
    for config in autotune_configs(math.prod(expr.shape)):
        try:
            _check(expr, device="cuda", interpret=False, cache_dir=cache_dir, config=config)
        except AssertionError as err:
            raise AssertionError(f"(BLOCK, num_warps) = {config}: {err}") from err


@pytest.mark.gpu
@needs_triton
@settings(max_examples=40, deadline=None)
@given(expr=exprs(depth=2), pick=st.integers(0, len(AUTOTUNE_CONFIGS) - 1))
def test_random_expressions_on_gpu_any_config(expr, pick, cache_dir):
    configs = autotune_configs(math.prod(expr.shape))
    _check(expr, device="cuda", interpret=False, cache_dir=cache_dir,
           config=configs[pick % len(configs)])


@pytest.mark.gpu
@needs_triton
def test_offset_add_bandwidth(cache_dir, capsys):
    text = """
        T: [3, 3, 16, 256, 14, 14]
        L<n=0:16, c=0:256, h=0:14, w=0:14> Sum<r=0:3, s=0:3> T[r, s, n, c, h + r - 1, w + s - 1]
    """
    expr = ollie.parse(text)
    inputs = random_inputs(expr, 0)
    t = torch.from_numpy(inputs["T"]).cuda()
    kernel = compile_cuda(expr, interpret=False, cache_dir=cache_dir)
    out = kernel({"T": t})
    np.testing.assert_allclose(out.cpu().numpy(), reference(expr, inputs), rtol=1e-4, atol=1e-4)
    copy_dst = torch.empty_like(t)

    def timed(fn, reps: int = 50) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps / 1e3

    t_eop = timed(lambda: kernel({"T": t}, out=out))
    t_copy = timed(lambda: copy_dst.copy_(t))
    eop_bytes = (t.numel() + out.numel()) * 4
    copy_bytes = 2 * t.numel() * 4
    gbs_eop, gbs_copy = eop_bytes / t_eop / 1e9, copy_bytes / t_copy / 1e9
    with capsys.disabled():
        print(f"\nOffsetAdd [16,256,14,14]: {t_eop * 1e6:.1f} us, {gbs_eop:.0f} GB/s; "
              f"device-to-device copy: {t_copy * 1e6:.1f} us, {gbs_copy:.0f} GB/s "
              f"({gbs_eop / gbs_copy:.0%} of copy)")
    assert math.isfinite(gbs_eop) and gbs_eop > 0
