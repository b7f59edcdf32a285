"""Persistent cost cache (SQLite): measured seconds keyed by what was measured.

A key is a string the caller builds from the candidate program's identity (the fingerprint
of its kernel sequence), the input shapes and the device description, so re-optimising the
same model on the same machine reuses every measurement. A second table keeps decisions:
which program was chosen for a subprogram (by its expression's fingerprint), so that a warm
re-optimisation skips the search altogether.
"""

from __future__ import annotations

import os
import platform
import sqlite3
import time
from pathlib import Path

import torch


def default_cache_dir() -> Path:
    """``$OLLIE_CACHE_DIR`` or ``~/.cache/ollie``."""
    env = os.environ.get("OLLIE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ollie"


RUNTIME_VERSION = 22
"""Bumped whenever kernels or the executor change in a way that changes measured times (it is
part of every key, so measurements and decisions of an older runtime are not reused). 12:
program-level comparisons settle before a spinning variant's samples (decisions timed before
kept oneDNN over a faster ONNX Runtime region on InfoGAN b1). 13: softmax and convolutions
write into reused buffers (large outputs no longer page-faulted in on every call). 14: the
wide G2BMM / GBMM path works in cache-sized batch chunks. 15: Winograd convolutions (a new
per-operator candidate and program-level choice). 16: Winograd transposed convolutions per
output phase; the program-level choice "Winograd wherever it applies". 17: Winograd transforms
as vectorised column and row passes (1.03-1.8x faster convolutions). 18: Winograd convolutions
choose between F(4x4) and F(2x2) tiles; tanh computed in generated eOperator code. 19: matrix
products may run as ``(b.T @ a.T).T`` ("MKL transposed"); ONNX Runtime regions run through a
kept I/O binding. 20: Winograd's F(2x2) tile also tried where the F(4x4) weights exceed 32 MiB
whatever the cache the machine reports. 21: selective adds run in ONNX Runtime regions as
``Col2Im`` (regions at opset 18); a program that is one region is called straight through its
session. 22: a two-stage selective add is merged into one ``Col2Im`` in a region."""


def device_key(device: str) -> str:
    """A description of the device (and runtime version) measurements are valid for; on CUDA
    also whether cuDNN / cuBLAS may use TensorFloat-32 and whether programs replay as CUDA
    graphs (either changes the times)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        from ollie.runtime import cuda_graph

        flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        tf32 = "tf32" + "".join(str(int(f)) for f in flags)
        return f"v{RUNTIME_VERSION}:cuda:{torch.cuda.get_device_name()}:torch{torch.__version__}:" \
               f"{tf32}:graphs{int(cuda_graph.enabled())}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"v{RUNTIME_VERSION}:cpu:{platform.machine()}:{platform.processor() or '-'}:{cores}c:" \
           f"torch{torch.__version__}:threads{torch.get_num_threads()}"


class CostCache:
    """``get(key)`` / ``put(key, seconds)`` backed by an SQLite file (or memory)."""

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            path = default_cache_dir() / "costs.sqlite"
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.db = sqlite3.connect(self.path)
        self.db.execute("CREATE TABLE IF NOT EXISTS costs (key TEXT PRIMARY KEY, "
                        "seconds REAL NOT NULL, created REAL NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS decisions (key TEXT PRIMARY KEY, "
                        "doc TEXT NOT NULL, created REAL NOT NULL)")
        self.db.commit()
        self.hits = self.misses = 0

    def get(self, key: str) -> float | None:
        row = self.db.execute("SELECT seconds FROM costs WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return float(row[0])

    def put(self, key: str, seconds: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO costs VALUES (?, ?, ?)",
                        (key, float(seconds), time.time()))
        self.db.commit()

    def get_decision(self, key: str) -> str | None:
        """A stored decision document (JSON text), e.g. a subprogram's chosen program."""
        row = self.db.execute("SELECT doc FROM decisions WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put_decision(self, key: str, doc: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO decisions VALUES (?, ?, ?)",
                        (key, doc, time.time()))
        self.db.commit()

    def close(self) -> None:
        self.db.close()
