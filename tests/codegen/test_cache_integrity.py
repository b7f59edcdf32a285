"""The kernel cache imports only code Ollie generated for the expression asked for: a line
planted in a cached kernel module never runs, the module is replaced."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import ollie
from ollie.codegen import cpu
from ollie.codegen.cpu import compile_cpu, module_stem


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(cpu, "_KERNELS", {})


EXPR = "A: [6, 7]\nL<i=0:6, j=0:7> A[i, j] * 3.0 + 1.0"


def test_a_line_planted_in_a_cached_kernel_never_runs(tmp_path, caplog):
    e = ollie.parse(EXPR)
    compile_cpu(e, cache_dir=tmp_path)
    path = tmp_path / f"{module_stem(e)}.py"
    assert path.exists()
    marker = tmp_path / "ran.txt"
    path.write_text(path.read_text() + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    cpu._KERNELS.clear()
    with caplog.at_level(logging.WARNING):
        kernel = compile_cpu(e, cache_dir=tmp_path)
    assert not marker.exists()
    assert "does not hold the code Ollie generates" in caplog.text
    assert "open(" not in path.read_text()  # replaced by the generated code
    a = np.random.default_rng(0).standard_normal((6, 7)).astype(np.float32)
    np.testing.assert_allclose(kernel({"A": a}), a * 3 + 1, rtol=1e-6)


def test_the_generated_module_is_reused_as_it_is(tmp_path, caplog):
    e = ollie.parse(EXPR)
    compile_cpu(e, cache_dir=tmp_path)
    cpu._KERNELS.clear()
    with caplog.at_level(logging.WARNING):
        kernel = compile_cpu(e, cache_dir=tmp_path)
    assert kernel.from_disk and "does not hold" not in caplog.text
