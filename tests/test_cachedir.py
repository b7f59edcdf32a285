"""The cache directory (ollie.cachedir): used only when it is a private, writable directory;
otherwise a private temporary one, with one warning naming the path and why."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import ollie
from ollie import cachedir
from ollie.codegen import cpu
from ollie.codegen.cpu import compile_cpu
from ollie.settings import using
from ollie.tune.cache import CostCache

EXPR = "A: [6, 7]\nL<i=0:6, j=0:7> A[i, j] * 3.0 + 1.0"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(cpu, "_KERNELS", {})
    cachedir.forget()
    yield
    cachedir.forget()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_cache_directory_others_may_write_is_not_used(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with using(cache_dir=shared), caplog.at_level(logging.WARNING):
        root = cachedir.cache_root()
        assert root != shared and not str(root).startswith(str(shared))
        assert str(shared) in caplog.text and "every user may write" in caplog.text
        assert cachedir.cache_root() == root and caplog.text.count(str(shared)) == 1  # once


def test_a_cache_path_under_a_regular_file_falls_back(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with using(cache_dir=blocker / "cache"):
        with caplog.at_level(logging.WARNING):
            root = cachedir.cache_root()
        assert root.is_dir() and str(blocker) in caplog.text
        e = ollie.parse(EXPR)
        kernel = compile_cpu(e)  # the default cache directory: the fallback
    a = np.ones((6, 7), np.float32)
    np.testing.assert_allclose(kernel({"A": a}), a * 4)


def test_a_read_only_cache_directory_is_not_used(tmp_path, caplog):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with using(cache_dir=ro):
            with caplog.at_level(logging.WARNING):
                root = cachedir.cache_root()
            if os.access(ro, os.W_OK):  # root may write anyway: then it is usable
                assert root == ro
            else:
                assert root != ro and str(ro) in caplog.text
            cache = CostCache()
            cache.put("k", 3.0)
            assert cache.get("k") == 3.0
    finally:
        ro.chmod(0o700)


def test_kernels_go_to_the_kernel_directory_when_one_is_set(tmp_path):
    with using(cache_dir=tmp_path / "cache", kernel_dir=None):
        under = compile_cpu(EXPR)
    assert under.path.parent == tmp_path / "cache" / "kernels"
    with using(cache_dir=tmp_path / "cache", kernel_dir=str(tmp_path / "kernels")):
        apart = compile_cpu(EXPR)
        costs = CostCache()
        costs.put("k", 1.0)
    assert apart.path.parent == tmp_path / "kernels"  # a str is taken as a Path
    assert (tmp_path / "cache" / "costs.sqlite").exists()  # decisions stay in the cache
    assert not (tmp_path / "kernels" / "costs.sqlite").exists()
    np.testing.assert_allclose(apart({"A": np.ones((6, 7), np.float32)}), np.full((6, 7), 4.0))
