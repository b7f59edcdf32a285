"""Loop nests compiled once per text (``ollie.codegen.nests``): kernels holding the same nest
share one compiled function, compute what the interpreter computes, and a nest file is
imported only when it holds the text its digest names."""

from __future__ import annotations

import logging
import sys

import pytest

import ollie
from ollie.codegen import cpu
from ollie.codegen.cpu import compile_cpu, generate_source
from ollie.codegen.nests import NEST_DIR, split_module
from ollie.testing.kernels import assert_agrees, nest_functions


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No kernel or nest module of another test in this process."""
    monkeypatch.setattr(cpu, "_KERNELS", {})
    for name in [m for m in sys.modules if m.startswith("ollie_kernels.")]:
        monkeypatch.delitem(sys.modules, name)


SCALE = "A: [6, 7]\nL<i=0:6, j=0:7> A[i, j] * 3.0 + 1.0"
SCALE_RENAMED = "B: [6, 7]\nL<p=0:6, q=0:7> B[p, q] * 3.0 + 1.0"
"""The same computation under other names: another kernel module, the same nest."""

TWO_NESTS = """
    A: [6, 7]
    L<i=0:6, j=0:7> { L<i=0:6, j=0:7> Sum<k=0:7> A[i, k] * A[i, j] }[i, 6 - j] * 2.0
"""
"""A materialised scope: two nests."""



def test_a_split_module_keeps_run_and_moves_every_function():
    split = split_module(generate_source(ollie.parse(TWO_NESTS)))
    assert split is not None and sorted(split.nests) == ["nest_0", "nest_1"]
    assert "def run(" in split.rest and "@njit" not in split.rest
    for text in split.nests.values():
        assert "def nest(a0, " in text and "@njit(" in text
        compile(text, "<nest>", "exec")  # a module of its own


def test_modules_not_generated_by_the_cpu_backend_are_imported_whole():
    text = generate_source(ollie.parse(SCALE))
    assert split_module(text.replace("ollie.codegen.cpu", "someone else", 1)) is None
    helper = text.replace("def run(", "@njit\ndef helper():\n    pass\n\n\ndef run(")
    assert split_module(helper) is None  # a function without a signature


def test_kernels_that_hold_the_same_nest_share_one_compiled_function(tmp_path):
    first, second = ollie.parse(SCALE), ollie.parse(SCALE_RENAMED)
    k1 = compile_cpu(first, cache_dir=tmp_path)
    k2 = compile_cpu(second, cache_dir=tmp_path)
    assert k1.path != k2.path  # two kernel modules ...
    assert nest_functions(k1) == nest_functions(k2)  # ... one nest, compiled once
    assert len(list((tmp_path / NEST_DIR).glob("nest_*.py"))) == 1
    (nest,) = nest_functions(k1)
    assert sum(nest.stats.cache_hits.values()) + sum(nest.stats.cache_misses.values()) == 1
    assert_agrees(k1, first, 0)
    assert_agrees(k2, second, 1)


def test_a_kernel_of_several_nests_matches_the_interpreter_and_reloads(tmp_path):
    expr = ollie.parse(TWO_NESTS)
    assert_agrees(compile_cpu(expr, cache_dir=tmp_path), expr, 2)
    cpu._KERNELS.clear()
    for name in [m for m in sys.modules if m.startswith("ollie_kernels.")]:
        del sys.modules[name]  # as in a new process
    kernel = compile_cpu(expr, cache_dir=tmp_path)
    assert kernel.from_disk and len(nest_functions(kernel)) == 2
    assert all(sum(f.stats.cache_hits.values()) == 1 and not sum(f.stats.cache_misses.values())
               for f in nest_functions(kernel))  # numba's cached code, not compiled again
    assert_agrees(kernel, expr, 3)


def test_a_line_planted_in_a_nest_module_never_runs(tmp_path, caplog):
    e = ollie.parse(SCALE)
    compile_cpu(e, cache_dir=tmp_path)
    (path,) = (tmp_path / NEST_DIR).glob("nest_*.py")
    marker = tmp_path / "ran.txt"
    path.write_text(path.read_text() + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    cpu._KERNELS.clear()
    for name in [m for m in sys.modules if m.startswith("ollie_kernels.")]:
        del sys.modules[name]  # as in a new process
    with caplog.at_level(logging.WARNING):
        kernel = compile_cpu(e, cache_dir=tmp_path)
    assert not marker.exists()
    assert "does not hold the text named by its digest" in caplog.text
    assert "open(" not in path.read_text()
    assert_agrees(kernel, e, 4)
