"""Persistent cost cache (SQLite): measured seconds keyed by what was measured.

A key is a string the caller builds from the candidate program's identity (the fingerprint
of its kernel sequence), the input shapes and the device description (:func:`device_key`), so
re-optimising the same model on the same machine reuses every measurement. A second table
keeps decisions: which program was chosen for a subprogram (by its expression's fingerprint),
the library choice and the program-context switches, so that a warm re-optimisation skips the
search and the program-level comparisons. Why, and what each key version changed:
docs/design/010-caches.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import sqlite3
import time
from pathlib import Path

import torch

from ollie.cachedir import cache_root
from ollie.settings import current

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """The cache directory (:func:`ollie.cachedir.cache_root`: the settings' directory when
    private and writable)."""
    return cache_root()


RUNTIME_VERSION = 23
"""Part of every cost and decision key (:func:`device_key`): bump it whenever kernels or the
executor change in a way that changes measured times, so that measurements and decisions of an
older runtime are not reused (what each version changed: docs/design/010-caches.md)."""


def device_key(device: str) -> str:
    """A description of the device (and runtime version) measurements are valid for; on CUDA
    also whether cuDNN / cuBLAS may use TensorFloat-32 and whether programs replay as CUDA
    graphs (either changes the times); under a restricted implementation policy (the
    settings' :attr:`~ollie.settings.Settings.implementations`, :mod:`ollie.policy`), also
    its key, so that no choice or time made with the kernel library is reused without it."""
    policy = current().implementations.key
    return _device(device) + (f":{policy}" if policy else "")


def _device(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        from ollie.tune import graphs

        flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        tf32 = "tf32" + "".join(str(int(f)) for f in flags)
        return f"v{RUNTIME_VERSION}:cuda:{torch.cuda.get_device_name()}:torch{torch.__version__}:" \
               f"{tf32}:graphs{int(graphs.enabled())}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"v{RUNTIME_VERSION}:cpu:{platform.machine()}:{platform.processor() or '-'}:{cores}c:" \
           f"torch{torch.__version__}:threads{torch.get_num_threads()}"


class CostCache:
    """``get(key)`` / ``put(key, seconds)`` backed by an SQLite file (or memory).

    A cache that cannot be used (a corrupt or truncated file, a read-only or missing
    directory, a path under a regular file, a database locked past :data:`TIMEOUT`) never
    stops the optimizer: the cache logs one warning naming the file and why, then keeps what it
    learns in memory for the rest of the process (:attr:`degraded` says why). Several
    processes may share one file (SQLite's locking; a writer waits up to :data:`TIMEOUT`)."""

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            path = default_cache_dir() / "costs.sqlite"
        self.path = str(path)
        self.degraded: str | None = None
        self.hits = self.misses = 0
        try:
            self.db = self._open(self.path)
        except (sqlite3.Error, OSError) as exc:
            self.db = self._fallback(exc)

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=TIMEOUT)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS costs (key TEXT PRIMARY KEY, "
                       "seconds REAL NOT NULL, created REAL NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS decisions (key TEXT PRIMARY KEY, "
                       "doc TEXT NOT NULL, created REAL NOT NULL)")
            db.commit()
            db.execute("SELECT count(*) FROM costs").fetchone()  # a corrupt file fails here
            db.execute("SELECT count(*) FROM decisions").fetchone()
        except BaseException:
            db.close()
            raise
        return db

    def _fallback(self, exc: BaseException) -> sqlite3.Connection:
        """Switch to an in-memory cache after ``exc``, with one warning."""
        if self.degraded is None:
            self.degraded = f"{type(exc).__name__}: {exc}"
            log.warning("cost cache %s is not usable (%s); measurements and decisions are kept "
                        "in memory for this run (delete the file if it is corrupt)", self.path,
                        self.degraded)
        return self._open(":memory:")

    def _run(self, sql: str, args: tuple, write: bool = False) -> tuple | None:
        """One statement (committed when ``write``); on a failure of the file, the same in
        the in-memory fallback."""
        for _ in range(2):
            try:
                row = self.db.execute(sql, args).fetchone()
                if write:
                    self.db.commit()
                return row
            except sqlite3.Error as exc:
                if self.degraded is not None:
                    raise
                with contextlib.suppress(sqlite3.Error):
                    self.db.close()
                self.db = self._fallback(exc)
        return None

    def get(self, key: str) -> float | None:
        row = self._run("SELECT seconds FROM costs WHERE key = ?", (key,))
        value = _number(row[0]) if row is not None else None
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str, seconds: float) -> None:
        self._run("INSERT OR REPLACE INTO costs VALUES (?, ?, ?)",
                  (key, float(seconds), time.time()), write=True)

    def get_decision(self, key: str) -> str | None:
        """A stored decision document (JSON text), e.g. a subprogram's chosen program. The
        caller validates it before using it (a cache file is not trusted to be well formed)."""
        row = self._run("SELECT doc FROM decisions WHERE key = ?", (key,))
        return row[0] if row is not None and isinstance(row[0], str) else None

    def put_decision(self, key: str, doc: str) -> None:
        self._run("INSERT OR REPLACE INTO decisions VALUES (?, ?, ?)",
                  (key, doc, time.time()), write=True)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()


class CachedChoices:
    """A :class:`ollie.settings.ChoiceStore` in a :class:`CostCache`'s decisions: the choices
    among implementations (:class:`ollie.tune.choice.Choices`) of one device, under
    ``choice|<device key>|<choice key>`` (:func:`device_key`: a new runtime version, another
    machine or thread count, or a restricted implementation policy reads none of them)."""

    def __init__(self, cache: CostCache, device: str) -> None:
        self.cache = cache
        self.prefix = f"choice|{device_key(device)}|"

    def recall(self, key: str) -> str | None:
        """The name stored for ``key``, or None (a malformed entry: None)."""
        doc = self.cache.get_decision(self.prefix + key)
        return doc if doc is not None and 0 < len(doc) <= MAX_NAME and doc.isprintable() \
            else None

    def record(self, key: str, name: str) -> None:
        self.cache.put_decision(self.prefix + key, name)


MAX_NAME = 200
"""The longest implementation name :class:`CachedChoices` reads back (a longer entry is not a
name Ollie wrote)."""


def choice_store(use_cache: bool, device: str) -> CachedChoices | None:
    """The store an optimisation on ``device`` keeps its choices among implementations in: the
    default cache's (:class:`CachedChoices`) when it uses the cache and runs on the CPU (where
    those choices are made), else None."""
    return CachedChoices(CostCache(), "cpu") if use_cache and device == "cpu" else None


TIMEOUT = 30.0
"""Seconds a statement waits for another process's lock on the cache file."""


def _number(v: object) -> float | None:
    """A stored time: a finite, non-negative number, else None (a malformed row)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return float(v)
    return None
