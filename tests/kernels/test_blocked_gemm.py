"""The register-blocked grouped products (:mod:`ollie.kernels.blocked_gemm`) agree with a
float64 reference on random inputs for any number of rows (the 6/4/2/1 row blocks), groups,
channels and output panels, and refuse shapes they do not handle; the kernel is one numba's
disk cache can give a new process."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ollie.kernels import blocked_gemm


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.integers(1, 5), rows=st.integers(1, 23), channels=st.integers(1, 70),
       panels=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_products_match_the_reference(groups, rows, channels, panels, seed) -> None:
    k = panels * blocked_gemm.NB
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(groups, k, channels, generator=g)
    v = torch.randn(rows, groups, channels, generator=g)
    out = torch.full((rows, groups, k), float("nan"))
    got = blocked_gemm.blocked_products(u)(v, out)
    assert got is out
    want = torch.einsum("tgc,gkc->tgk", v.double(), u.double())
    assert float((got.double() - want).abs().max()) <= 1e-5 * (float(want.abs().max()) + 1)


def test_nan_stays_in_the_rows_and_groups_that_read_it() -> None:
    u = torch.randn(2, 16, 9)
    v = torch.randn(7, 2, 9)
    v[3, 1, 4] = float("nan")
    got = blocked_gemm.blocked_products(u)(v, torch.empty(7, 2, 16))
    nan = torch.isnan(got)
    assert bool(nan[3, 1].all()) and int(nan.sum()) == 16


def test_output_channels_must_fill_whole_panels_and_shapes_must_match() -> None:
    assert blocked_gemm.applies(32) and not blocked_gemm.applies(24)
    assert not blocked_gemm.applies(0)
    with pytest.raises(ValueError, match="multiple of 16"):
        blocked_gemm.blocked_products(torch.randn(2, 24, 8))
    run = blocked_gemm.blocked_products(torch.randn(2, 16, 8))
    with pytest.raises(ValueError, match=r"got V \[3, 2, 9\]"):
        run(torch.randn(3, 2, 9), torch.empty(3, 2, 16))
    with pytest.raises(ValueError, match="contiguous"):
        run(torch.randn(2, 3, 8).transpose(0, 1), torch.empty(3, 2, 16))


def test_the_kernel_is_a_function_numba_can_find_in_its_disk_cache() -> None:
    """numba keys a cached function that closes over variables by their serialized form,
    which for the micro-kernels (intrinsics) differs in every process: the kernel must read
    them as module globals, so that a new process loads it instead of compiling it again."""
    kernel = blocked_gemm._kernel()
    assert kernel.py_func.__closure__ is None
    assert kernel._cache.__class__.__name__ != "NullCache"  # cache=True is in effect
