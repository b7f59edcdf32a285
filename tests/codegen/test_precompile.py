"""Generated kernels compiled ahead in worker processes (``ollie.codegen.precompile``), and
layout variants of a kernel recorded instead of compiled (``ollie.exec.dispatch.
discovering``): the kernels used afterwards are the same and compute the same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ollie
from ollie.codegen import precompile as pre
from ollie.codegen.cpu import compile_cpu, source_forms
from ollie.exec.dispatch import discovering
from ollie.exec.executor import CompiledProgram
from ollie.program.kernel import Kernel
from ollie.program.program import Program
from ollie.semantics import random_inputs
from ollie.settings import from_environ, using

SCATTER = """
    Y: [2, 5, 4, 3, 4, 4]
    L<n=0:2, c=0:3, h=0:10, w=0:8> Sum<y=0:5, x=0:4> Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]
"""
"""A selective sum with a gather and a scatter form (both are compiled and timed)."""

GATHER = """
    A: [3, 6, 7]
    L<i=0:3, j=0:6, k=0:7> Sum<r=0:3> A[i, j, k + r - 1] * A[i, j, 6 - k]
"""
"""An expression with only the gather form."""


@pytest.fixture(autouse=True)
def _enabled():
    """Compiling ahead on, whatever the environment running the tests says."""
    with using(precompile=True):
        yield


def _loaded_from_cache(kernel) -> bool:
    functions = [f for f in vars(kernel.module).values() if hasattr(f, "stats")]
    return bool(functions) and all(sum(f.stats.cache_hits.values()) >= 1 and
                                   not sum(f.stats.cache_misses.values()) for f in functions)


def _agrees(kernel, expr, seed: int) -> None:
    inputs = random_inputs(expr, seed=seed)
    np.testing.assert_allclose(kernel(inputs), ollie.interpret(expr, inputs), rtol=1e-5,
                               atol=1e-5)


def test_kernels_compiled_ahead_load_without_compiling(tmp_path):
    exprs = [ollie.parse(SCATTER), ollie.parse(GATHER)]
    assert [len(source_forms(e)) for e in exprs] == [2, 1]
    assert pre.precompile(exprs, cache_dir=tmp_path, workers=2) == 3
    for seed, expr in enumerate(exprs):
        kernel = compile_cpu(expr, cache_dir=tmp_path)
        assert _loaded_from_cache(kernel)  # numba's code from the workers, not compiled here
        _agrees(kernel, expr, seed)
    # the staged forms are removed once used, and there is nothing left to compile
    assert not list((tmp_path / pre.STAGED).rglob("*.py"))
    assert pre.precompile(exprs, cache_dir=tmp_path, workers=2) == 0


def test_a_worker_that_fails_leaves_its_kernels_to_compile_when_used(tmp_path, monkeypatch,
                                                                    caplog):
    def broken(*args, **kwargs):
        raise OSError("no process for you")

    monkeypatch.setattr(pre.subprocess, "run", broken)
    exprs = [ollie.parse(SCATTER), ollie.parse(GATHER)]
    with caplog.at_level("WARNING", logger="ollie.codegen.precompile"):
        done = pre.precompile(exprs, cache_dir=tmp_path, workers=2)
    assert 1 <= done < 3  # this process compiled its own share only
    assert any("no process for you" in r.getMessage() for r in caplog.records)
    for seed, expr in enumerate(exprs):
        _agrees(compile_cpu(expr, cache_dir=tmp_path), expr, seed)


def test_a_staged_form_whose_code_does_not_load_is_compiled_here(tmp_path, caplog):
    expr = ollie.parse(GATHER)
    other = ollie.parse(SCATTER)
    assert pre.precompile([expr, other], cache_dir=tmp_path, workers=2) == 3
    for f in (tmp_path / pre.STAGED).rglob("*.nbc"):
        f.write_bytes(b"not numba's code")
    for seed, e in enumerate((expr, other)):
        _agrees(compile_cpu(e, cache_dir=tmp_path), e, seed)


def test_turned_off_by_the_environment(tmp_path):
    with using(from_environ({"OLLIE_PRECOMPILE": "0"})):
        assert pre.precompile([ollie.parse(SCATTER), ollie.parse(GATHER)],
                              cache_dir=tmp_path) == 0
    assert not (tmp_path / pre.STAGED).exists()


def test_one_form_is_left_to_compile_when_used(tmp_path):
    assert pre.precompile([ollie.parse(GATHER)], cache_dir=tmp_path, workers=2) == 0


def test_discovering_records_a_layout_variant_instead_of_compiling_it(compiled_eops):
    compiled = compiled_eops
    expr = ollie.parse("""
        T: [2, 8, 5, 3]
        L<n=0:2, c=0:8, h=0:5, w=0:3> Sum<r=0:2> T[n, c, h + r - 1, w] * T[n, c, 4 - h, w]
    """)
    prog = Program((("T", (2, 8, 5, 3)),), ("out",), [Kernel("eOp", {}, ("T",), "out", expr)],
                   {})
    run = CompiledProgram(prog, "cpu")
    t = torch.randn(2, 8, 5, 3).contiguous(memory_format=torch.channels_last)
    want = ollie.interpret(expr, {"T": t.contiguous().numpy()})
    with discovering() as found:
        got = run.run({"T": t})["out"]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert [dict(e.decls)["T"] for e in found] == [(2, 5, 3, 8)]
    assert [dict(e.decls)["T"] for e in compiled] == [(2, 8, 5, 3)]  # the variant: not yet
    got = run.run({"T": t})["out"]  # outside the context: compiled and used
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert [dict(e.decls)["T"] for e in compiled] == [(2, 8, 5, 3), (2, 5, 3, 8)]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_shares_split_by_size(tmp_path, n):
    paths = []
    for i, size in enumerate([50, 40, 30, 20, 10]):
        p = tmp_path / f"m{i}.py"
        p.write_text("#" * size)
        paths.append(p)
    shares = pre._shares(paths, n)
    assert sorted(p for s in shares for p in s) == sorted(paths) and len(shares) == n
    sizes = [sum(p.stat().st_size for p in s) for s in shares]
    assert max(sizes) - min(sizes) <= 50


def test_stale_staged_forms_are_removed(tmp_path):
    import os

    exprs = [ollie.parse(SCATTER), ollie.parse(GATHER)]
    pre.pending(exprs, cache_dir=tmp_path)
    staged = sorted((tmp_path / pre.STAGED).rglob("*.py"))
    assert len(staged) == 3
    old = staged[0].stat().st_mtime - pre.STALE_SECONDS - 1
    os.utime(staged[0], (old, old))
    pre._prune(tmp_path / pre.STAGED)
    assert sorted((tmp_path / pre.STAGED).rglob("*.py")) == staged[1:]
