"""The whole-model result cache: the checked program ``ollie.optimize`` returned for a model,
kept in the cache directory and returned again for the same model and settings.

The cost cache (:mod:`ollie.tune.cache`) keeps measurements and decisions, and a warm run
re-assembles a program from them; but a run whose total budget ran out skipped steps
(subprograms left unsearched, whole-program comparisons) that a warm run, with its budget
intact, would take: it would do more work than the cold run and could return another
program. This cache makes a warm run return exactly the cold run's program, checked again.

* :func:`model_key`: a digest of the imported graph (operators, attributes, tensor names and
  shapes, every weight's bytes), the optimisation settings, the device description
  (:func:`ollie.tune.cache.device_key`, which carries the runtime version and the
  implementation policy) and Ollie's version.
* :func:`store` saves a program with its report into ``<cache>/programs/<key>``
  (:meth:`ollie.optimizer.report.OptimizedModel.save`: data only), written to a scratch
  folder and renamed into place; the least recently used entries beyond
  :data:`MAX_ENTRIES` or :data:`MAX_BYTES` are removed.
* :func:`recall` loads one (:func:`ollie.optimizer.report.read_saved`: validated, nothing
  executed) or returns None; a malformed entry is removed with a warning. The caller checks
  a recalled program against the model on random and example inputs before using it, as it
  does a program it just made (:mod:`ollie.optimizer.final`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ollie.cachedir import cache_root
from ollie.errors import OllieError
from ollie.exec.executor import CompiledProgram
from ollie.frontend.torch_import import IMPORT_RTOL
from ollie.graph.ir import Graph
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.final import agrees, confirm, module_reference, reference
from ollie.optimizer.report import OptimizedModel, SubprogramReport, read_saved
from ollie.program.program import Program
from ollie.settings import current
from ollie.tune.cache import device_key

log = logging.getLogger(__name__)

FOLDER = "programs"
"""The cache directory's subfolder holding the entries."""
MAX_ENTRIES = 16
"""At most this many models' programs are kept (the least recently used go first)."""
MAX_BYTES = 2 << 30
"""At most this many bytes of programs (mostly their weights) are kept."""
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def model_key(graph: Graph, cfg: OptimizeConfig) -> str:
    """The digest naming ``graph`` optimised with ``cfg`` on this device (see the module)."""
    h = hashlib.blake2b(digest_size=20)
    settings = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    _feed(h, ("ollie", _version(), device_key(cfg.device), settings))
    _feed(h, (graph.inputs, graph.outputs, graph.dtypes))
    for node in graph.nodes:
        _feed(h, (node.op, node.inputs, node.outputs, node.attrs))
    for name in sorted(graph.initializers):
        _feed(h, (name, graph.initializers[name]))
    return h.hexdigest()


def _version() -> str:
    try:
        return importlib.metadata.version("ollie")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "source"


def _feed(h: Any, value: object) -> None:
    """Add ``value`` to the digest ``h``: arrays and tensors by dtype, shape and bytes,
    containers element by element, anything else by its text (memory addresses removed, so
    that a callable is named by what it is)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy() if value.device.type != "meta" else repr(value)
    if isinstance(value, np.ndarray):
        h.update(f"array{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value))  # the buffer itself: no copy when contiguous
    elif isinstance(value, dict):
        h.update(b"{")
        for k in sorted(value, key=str):
            _feed(h, k)
            _feed(h, value[k])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"(")
        for v in value:
            _feed(h, v)
        h.update(b")")
    elif hasattr(value, "SerializeToString"):  # an ONNX node of an opaque operator
        h.update(value.SerializeToString())
    else:
        h.update(_ADDRESS.sub("", repr(value)).encode())
        h.update(b";")


def remembered(graph: Graph, cfg: OptimizeConfig,
               examples: Sequence[object] | torch.Tensor | None,
               make: Callable[[], OptimizedModel], t0: float | None = None,
               module: torch.nn.Module | None = None) -> OptimizedModel:
    """The program stored for ``graph`` and ``cfg`` (:func:`recalled`; ``t0``: when this run
    started, for its note; ``module``: the torch module ``graph`` was imported from) when
    ``cfg.use_cache`` and the settings' :attr:`~ollie.settings.Settings.recall_programs`
    allow it and it passes its check; else ``make()``, stored for the next run unless some
    decision of it was not cached (a note says ``not cached``: measured on a busy machine and
    not confirmed), so that the next run decides again rather than repeat it."""
    if not cfg.use_cache or not current().recall_programs:
        return make()
    key = model_key(graph, cfg)
    hit = recalled(graph, cfg, key, examples, module)
    if hit is not None:
        if t0 is not None:
            hit.notes.append(f"optimised in {time.perf_counter() - t0:.1f} s (this run)")
        return hit
    result = make()
    if not any("not cached" in n for n in result.notes):
        store(key, result)
    return result


def recalled(graph: Graph, cfg: OptimizeConfig, key: str,
             examples: Sequence[object] | torch.Tensor | None,
             module: torch.nn.Module | None = None) -> OptimizedModel | None:
    """The program stored under ``key`` as an :class:`OptimizedModel`, when it matches
    ``graph`` on the check's random inputs and on the example inputs (as a program just made
    must, :mod:`ollie.optimizer.final`); one that does not is removed (a warning), and None.
    With ``module`` (on the CPU) it is checked against the module itself instead, within the
    import check's allowance more (:func:`~ollie.optimizer.final.module_reference`): the
    graph of a model whose program was stored passed that check, and a warm run does not
    repeat it. Its ONNX Runtime regions are not checked one by one: the check covers them."""
    t0 = time.perf_counter()
    found = recall(key)
    if found is None:
        return None
    prog, report, notes = found
    ref = (module_reference(module, graph, cfg, examples, IMPORT_RTOL) if module is not None
           else None) or reference(graph, cfg, [], examples)
    try:
        ref.built[id(prog)] = CompiledProgram(prog, cfg.device, check_regions=False)
    except Exception as exc:  # not used: the check below builds it again and reports why
        log.info("the cached program failed to build: %s: %s", type(exc).__name__, exc)
    failed: list[str] = []
    if not agrees(prog, ref, cfg, "the cached", failed) or \
            confirm(prog, ref, cfg, "the cached", failed) is None:
        forget(key)
        return None
    notes = [f"{n} (the run that made this program)" if n.startswith("optimised in ") else n
             for n in notes]
    notes.append(f"the program an earlier run made for this model with these settings (from "
                 f"the cache, {key[:12]}; the notes above are that run's), checked again on "
                 f"random and example inputs in {time.perf_counter() - t0:.1f} s")
    return OptimizedModel(prog, report, notes, tuple(graph.input_names), cfg.device,
                          compiled=ref.compiled(prog, cfg.device))


def _folder() -> Path:
    return cache_root() / FOLDER


def recall(key: str) -> tuple[Program, list[SubprogramReport], list[str]] | None:
    """The program, report and notes stored under ``key``, or None."""
    path = _folder() / key
    if not (path / "program.json").is_file():
        return None
    try:
        found = read_saved(path)
    except OllieError as exc:
        log.warning("cached program %s not used (%s); removed", path, str(exc)[:200])
        shutil.rmtree(path, ignore_errors=True)
        return None
    with contextlib.suppress(OSError):  # removed meanwhile by another process: still loaded
        os.utime(path)  # recently used
    return found


def forget(key: str) -> None:
    """Remove the entry ``key`` (a recalled program that failed its check)."""
    shutil.rmtree(_folder() / key, ignore_errors=True)


def store(key: str, model: OptimizedModel) -> None:
    """Keep ``model`` under ``key``; a failure to write logs and leaves the cache as it was."""
    folder = _folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".new-", dir=folder))
        try:
            model.save(scratch)
            os.replace(scratch, folder / key)
        except OSError:  # another process stored the same key first
            if not (folder / key / "program.json").is_file():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _evict(folder)
    except (OSError, OllieError) as exc:  # another process removing entries, a full disk
        log.info("optimised program not cached (%s)", exc)


def _evict(folder: Path, now: Callable[[], float] = time.time) -> None:
    """Remove the least recently used entries beyond :data:`MAX_ENTRIES` / :data:`MAX_BYTES`
    (and scratch folders older than an hour: a process that died while writing)."""
    entries = []
    for p in folder.iterdir():
        try:
            if p.name.startswith(".new-"):
                if now() - p.stat().st_mtime > 3600:
                    shutil.rmtree(p, ignore_errors=True)
                continue
            size = sum(f.stat().st_size for f in p.iterdir() if f.is_file()) \
                if p.is_dir() else 0
            entries.append((p.stat().st_mtime, size, p))
        except OSError:  # removed meanwhile by another process
            continue
    entries.sort(reverse=True)
    total = 0
    for i, (_, size, p) in enumerate(entries):
        total += size
        if i >= MAX_ENTRIES or (i > 0 and total > MAX_BYTES):
            shutil.rmtree(p, ignore_errors=True)


__all__ = ["FOLDER", "MAX_BYTES", "MAX_ENTRIES", "forget", "model_key", "recall", "recalled",
           "remembered", "store"]
