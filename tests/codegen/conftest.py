"""Shared fixtures of the code generator tests: generated kernels go to a fresh directory per
test module, not the user's cache; a record of the kernels compiled."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    """``OLLIE_CACHE_DIR`` set to a fresh directory for the module, restored afterwards."""
    old = os.environ.get("OLLIE_CACHE_DIR")
    os.environ["OLLIE_CACHE_DIR"] = str(tmp_path_factory.mktemp("ollie_cache"))
    yield
    if old is None:
        del os.environ["OLLIE_CACHE_DIR"]
    else:
        os.environ["OLLIE_CACHE_DIR"] = old


@pytest.fixture
def compiled_eops(monkeypatch):
    """The expressions ``ollie.codegen.compile_eop`` is called with during the test, in order
    (it still compiles them)."""
    import ollie.codegen

    compiled = []
    real = ollie.codegen.compile_eop

    def spy(expr, backend="cpu"):
        compiled.append(expr)
        return real(expr, backend)

    monkeypatch.setattr(ollie.codegen, "compile_eop", spy)
    return compiled
