"""The cost cache never stops the optimizer and never runs what it reads: a corrupt, truncated
or read-only cache degrades to memory with one warning naming the file; a decision planted in
it is data (a pickle in it never runs) and is checked against the subprogram it is applied
to; two processes share one cache directory."""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

import ollie
from ollie.tune.cache import CostCache

FAST = {"time_budget": 0.5, "max_depth": 1, "context": False, "settle": 0.0,
        "choose_libraries": False, "max_candidates": 2}


class _Payload:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "ran"))


def test_a_corrupt_cache_file_degrades_to_memory(tmp_path, caplog):
    path = tmp_path / "costs.sqlite"
    path.write_bytes(b"this is not an SQLite database" * 100)
    with caplog.at_level(logging.WARNING):
        cache = CostCache(path)
        cache.put("k", 1.5)
        assert cache.get("k") == 1.5
        cache.put_decision("d", "[]")
        assert cache.get_decision("d") == "[]"
    assert cache.degraded is not None
    assert caplog.text.count(str(path)) == 1  # one warning, naming the file


def test_a_truncated_cache_file_degrades_to_memory(tmp_path, caplog):
    path = tmp_path / "costs.sqlite"
    cache = CostCache(path)
    for i in range(200):
        cache.put(f"k{i}", float(i))
    cache.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING):
        cache = CostCache(path)
        for i in range(200):  # reads of a torn file fail at some page, not at open
            cache.get(f"k{i}")
        cache.put("new", 2.0)  # nothing raised: a torn file is read as far as it goes
        assert cache.get("new") == 2.0
    if cache.degraded is not None:  # SQLite noticed the tear: one warning naming the file
        assert caplog.text.count(str(path)) == 1


def test_a_read_only_cache_file_degrades_to_memory(tmp_path, monkeypatch, caplog):
    """The file opened read-only (as SQLite opens a file the user may not write; forced
    here, since root may write any file)."""
    path = tmp_path / "costs.sqlite"
    CostCache(path).close()
    connect = sqlite3.connect

    def read_only(database, *args, **kwargs):
        if str(database) == str(path):
            return connect(f"file:{path}?mode=ro", *args, uri=True, **kwargs)
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", read_only)
    with caplog.at_level(logging.WARNING):
        cache = CostCache(path)
        cache.put("k", 1.0)
        assert cache.get("k") == 1.0
    assert cache.degraded is not None and "readonly" in cache.degraded
    assert caplog.text.count(str(path)) == 1


def test_a_cache_path_under_a_regular_file_degrades(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING):
        cache = CostCache(blocker / "costs.sqlite")
        cache.put("k", 1.0)
    assert cache.get("k") == 1.0 and cache.degraded is not None


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    return m, torch.randn(1, 3, 6, 6)


def test_a_pickle_planted_in_a_cached_decision_never_runs(tmp_path, ollie_settings):
    ollie_settings(cache_dir=tmp_path / "cache")
    m, x = _model()
    ollie.optimize(m, (x,), **FAST)
    db = sqlite3.connect(tmp_path / "cache" / "costs.sqlite")
    rows = db.execute("SELECT key, doc FROM decisions").fetchall()
    assert rows, "the first optimisation cached its decisions"
    marker = tmp_path / "ran.txt"
    payload = base64.b64encode(pickle.dumps(_Payload(marker))).decode()
    planted = {"kind": "Node", "params": {}, "inputs": ["x0"], "output": "y", "expr": None,
               "views": [], "shape": [1], "node": payload}
    for key, doc in rows:
        try:
            d = json.loads(doc)
        except ValueError:
            continue
        if isinstance(d, dict):
            d["kernels"] = [planted]
            db.execute("UPDATE decisions SET doc = ? WHERE key = ?", (json.dumps(d), key))
    db.commit()
    db.close()
    try:
        prog = ollie.optimize(m, (x,), **FAST)
    finally:
        assert not marker.exists(), "reading the cached decision ran the pickle"
    with torch.no_grad():
        assert torch.allclose(prog(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_cached_decision_that_does_not_fit_is_searched_again(tmp_path, ollie_settings, caplog):
    ollie_settings(cache_dir=tmp_path / "cache", recall_programs=False)  # the decisions' path
    m, x = _model()
    ollie.optimize(m, (x,), **FAST)
    db = sqlite3.connect(tmp_path / "cache" / "costs.sqlite")
    for key, doc in db.execute("SELECT key, doc FROM decisions").fetchall():
        d = json.loads(doc)
        if isinstance(d, dict):  # an eOp reading a tensor the subprogram does not have
            d["kernels"] = [{"kind": "eOp", "params": {}, "inputs": ["zz"], "output": "y",
                             "expr": "zz: [3]\nL<i=0:3> zz[i]", "views": [], "shape": None}]
            d["output"] = "y"
            db.execute("UPDATE decisions SET doc = ? WHERE key = ?", (json.dumps(d), key))
    db.commit()
    db.close()
    with caplog.at_level(logging.WARNING):
        prog = ollie.optimize(m, (x,), **FAST)
    assert "malformed cached decision" in caplog.text
    with torch.no_grad():
        assert torch.allclose(prog(x), m(x), rtol=1e-4, atol=1e-5)


_SHARED = textwrap.dedent("""
    import sys, torch, ollie
    from torch import nn
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = torch.randn(1, 3, 6, 6)
    prog = ollie.optimize(m, (x,), time_budget=0.5, max_depth=1, context=False, settle=0.0,
                          choose_libraries=False, max_candidates=2)
    with torch.no_grad():
        err = float((prog(x) - m(x)).abs().max())
    print("ERR", err)
    sys.exit(0 if err < 1e-4 else 3)
""")


def test_two_processes_share_one_cache_directory(tmp_path):
    env = {**os.environ, "OLLIE_CACHE_DIR": str(tmp_path / "shared")}
    procs = [subprocess.Popen([sys.executable, "-c", _SHARED], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "ERR" in out
    assert (tmp_path / "shared" / "costs.sqlite").exists()


def test_choices_are_kept_per_device_key_and_malformed_entries_are_not_read(ollie_settings,
                                                                           tmp_path):
    from ollie.tune.cache import CachedChoices, CostCache, choice_store, device_key

    cache = CostCache(":memory:")
    store = CachedChoices(cache, "cpu")
    assert store.recall("('conv', 1)") is None
    store.record("('conv', 1)", "oneDNN packed")
    assert store.recall("('conv', 1)") == "oneDNN packed"
    assert cache.get_decision(f"choice|{device_key('cpu')}|('conv', 1)") == "oneDNN packed"
    cache.put_decision(f"choice|{device_key('cpu')}|('bad', 1)", "x\n" * 300)
    assert store.recall("('bad', 1)") is None
    assert choice_store(False, "cpu") is None and choice_store(True, "cuda") is None
    ollie_settings(cache_dir=tmp_path)
    kept = choice_store(True, "cpu")
    assert isinstance(kept, CachedChoices) and kept.cache.path == str(tmp_path / "costs.sqlite")
