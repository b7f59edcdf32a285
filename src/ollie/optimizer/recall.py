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
* :func:`~ollie.optimizer.module_key.module_key`: for a torch module, a digest of the module
  itself, recorded in its entry; :func:`recalled_module` finds the entry by it before the
  module is imported (``torch.export`` is most of a warm run's time otherwise).
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
import contextvars
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ollie.cachedir import cache_root
from ollie.errors import OllieError
from ollie.exec.executor import CompiledProgram
from ollie.frontend.torch_check import IMPORT_RTOL
from ollie.graph.ir import Graph
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.final import Reference, agrees, confirm, module_reference, reference
from ollie.optimizer.module_key import feed, module_key, settings_digest
from ollie.optimizer.report import OptimizedModel, SubprogramReport, read_saved, saved_structure
from ollie.program.params import KernelKind
from ollie.program.program import Program
from ollie.settings import current, using

log = logging.getLogger(__name__)

FOLDER = "programs"
"""The cache directory's subfolder holding the entries."""
MAX_ENTRIES = 16
"""At most this many models' programs are kept (the least recently used go first)."""
MAX_BYTES = 2 << 30
"""At most this many bytes of programs (mostly their weights) are kept."""
MODULE_KEY = "module.key"
"""An entry's file holding the key of the torch module its program was made for."""
SWITCH_INTERVAL_S = 2e-4
"""The interpreter's thread switch interval while a recalled program builds beside its
reference (Python's default is 5 ms): after each of its operators the reference's thread
waits for the building thread to hand over the interpreter lock, at most this long.
docs/design/039-warm-check-overlap.md."""


def model_key(graph: Graph, cfg: OptimizeConfig) -> str:
    """The digest naming ``graph`` optimised with ``cfg`` on this device (see the module)."""
    h = hashlib.sha256()
    settings_digest(h, cfg)
    feed(h, (graph.inputs, graph.outputs, graph.dtypes))
    for node in graph.nodes:
        feed(h, (node.op, node.inputs, node.outputs, node.attrs))
    for name in sorted(graph.initializers):
        feed(h, (name, graph.initializers[name]))
    return h.hexdigest()[:40]


def remembered(graph: Graph, cfg: OptimizeConfig,
               examples: Sequence[object] | torch.Tensor | None,
               make: Callable[[], OptimizedModel], t0: float | None = None,
               module: torch.nn.Module | None = None, mkey: str | None = None
               ) -> OptimizedModel:
    """The program stored for ``graph`` and ``cfg`` (:func:`recalled`; ``t0``: when this run
    started, for its note; ``module``: the torch module ``graph`` was imported from) when
    ``cfg.use_cache`` and the settings' :attr:`~ollie.settings.Settings.recall_programs`
    allow it and it passes its check; else ``make()``, stored for the next run unless some
    decision of it was not cached (a note says ``not cached``: measured on a busy machine and
    not confirmed), so that the next run decides again rather than repeat it. The entry also
    records ``mkey``, the module's key (:func:`key_of`), which :func:`recalled_module` finds
    it by."""
    if not cfg.use_cache or not current().recall_programs:
        return make()
    key = model_key(graph, cfg)
    hit = recalled(graph, cfg, key, examples, module)
    if hit is not None:
        if mkey is not None:
            _mark(_folder() / key, mkey)
        if t0 is not None:
            hit.notes.append(f"optimised in {time.perf_counter() - t0:.1f} s (this run)")
        return hit
    result = make()
    if not any("not cached" in n for n in result.notes):
        store(key, result, mkey)
    return result


def recalled_module(module: torch.nn.Module, mkey: str | None,
                    examples: Sequence[object] | torch.Tensor | None, cfg: OptimizeConfig,
                    t0: float | None = None) -> OptimizedModel | None:
    """The program stored for ``module`` on inputs like ``examples`` with ``cfg``, found by
    ``mkey``, its key (:func:`key_of`), without importing the module, when it matches the
    module itself on the check's random inputs and on the example inputs; None when the cache
    is off, ``mkey`` is None or names no entry, or the module cannot be run as the check's
    reference (the caller then imports it and looks up the graph's key). A program that
    fails the check is removed (a warning)."""
    if not cfg.use_cache or not current().recall_programs:
        return None
    key = None if mkey is None else _find(mkey)
    found = None if key is None else recall(key)
    if key is None or found is None:
        return None
    prog = found[0]
    shapes = prog.tensor_shapes()
    signature = Graph(list(prog.inputs), list(prog.outputs), [],
                      shapes={n: shapes[n] for n in (*dict(prog.inputs), *prog.outputs)})
    hit = _checked(key, found, lambda: module_reference(
        module, signature, cfg, examples, IMPORT_RTOL), cfg, signature,
        "; found by the module's own key, without importing it")
    if hit is not None and t0 is not None:
        hit.notes.append(f"optimised in {time.perf_counter() - t0:.1f} s (this run)")
    return hit


def key_of(module: torch.nn.Module | None, examples: Sequence[object] | torch.Tensor | None,
           cfg: OptimizeConfig) -> str | None:
    """``module``'s :func:`~ollie.optimizer.module_key.module_key` where the cache may recall
    a program by it: with the cache on, on the CPU (where a recalled program is checked
    against the module itself, :func:`~ollie.optimizer.final.module_reference`); else None."""
    if module is None or torch.device(cfg.device).type != "cpu" or not cfg.use_cache or \
            not current().recall_programs:
        return None
    return module_key(module, examples, cfg)


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
    found = recall(key)
    if found is None:
        return None
    return _checked(key, found, lambda: (
        module_reference(module, graph, cfg, examples, IMPORT_RTOL) if module is not None
        else None) or reference(graph, cfg, [], examples), cfg, graph)


def _build(prog: Program, cfg: OptimizeConfig) -> CompiledProgram | None:
    """``prog`` ready to run unchecked (its check follows), or None when it fails to build
    (the check then builds it again and reports why)."""
    try:
        return CompiledProgram(prog, cfg.device, check_regions=False)
    except Exception as exc:  # reported by the check
        log.info("the cached program failed to build: %s: %s", type(exc).__name__, exc)
        return None


def _beside_build(prog: Program, cfg: OptimizeConfig, make: Callable[[], Reference | None]
                  ) -> tuple[Reference | None, CompiledProgram | None]:
    """``make()``, the check's reference, and ``prog`` built (:func:`_build`). On the CPU,
    for a program with kernels outside ONNX Runtime regions, the reference is made on a
    worker thread while this one builds: the reference runs the model in PyTorch, whose
    operators leave the interpreter free, and building such a program loads kernel modules
    and numba's machine code, mostly Python. A program of regions only builds ONNX Runtime
    sessions, which compute on the cores the reference needs: there, and off the CPU (a
    CUDA program may capture a graph while it builds), one after the other, and not built
    when there is no reference. Why, measured: docs/design/039-warm-check-overlap.md. A
    choice among implementations that building would measure is protected as on any busy
    machine (:meth:`ollie.tune.choice.Choices.fastest` probes again before remembering)."""
    if torch.device(cfg.device).type != "cpu" or all(
            k.params.region is not None or k.kind is KernelKind.ALIAS for k in prog.kernels):
        ref = make()
        return ref, _build(prog, cfg) if ref is not None else None
    with short_switch_interval(), \
            ThreadPoolExecutor(1, thread_name_prefix="ollie-reference") as pool:
        pending = pool.submit(contextvars.copy_context().run, make)  # this block's settings
        built = _build(prog, cfg)
        return pending.result(), built


_SWITCH_LOCK = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """The interpreter's switch interval at most :data:`SWITCH_INTERVAL_S` inside the block;
    the interval from before the first of the blocks that overlap (optimisations on several
    threads) is restored when the last of them ends."""
    global _switch_users, _switch_saved
    with _SWITCH_LOCK:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, SWITCH_INTERVAL_S))
        _switch_users += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


def _checked(key: str, found: tuple[Program, list[SubprogramReport], list[str]],
             make: Callable[[], Reference | None], cfg: OptimizeConfig, graph: Graph,
             how: str = "") -> OptimizedModel | None:
    """The recalled entry ``found`` (stored under ``key``) as an :class:`OptimizedModel` of
    ``graph``'s inputs when it passes the check against the reference ``make()`` returns
    (made beside the program's build, :func:`_beside_build`; ``how`` ends its note); else
    None, and the entry is removed (but kept when ``make()`` gives no reference). The
    program's first run (on the random inputs) uses its matrix products' remembered
    implementations without checking each against ``torch.matmul`` (the settings'
    ``check_choices``): the run's outputs are checked."""
    t0 = time.perf_counter()
    prog, report, notes = found
    ref, built = _beside_build(prog, cfg, make)
    if ref is None:
        return None
    if built is not None:
        ref.built[id(prog)] = built
    failed: list[str] = []
    # the first run's products are checked through the program's outputs, not one by one
    with using(check_choices=False):
        fits = agrees(prog, ref, cfg, "the cached", failed)
    if not fits or confirm(prog, ref, cfg, "the cached", failed) is None:
        forget(key)
        return None
    notes = [f"{n} (the run that made this program)" if n.startswith("optimised in ") else n
             for n in notes]
    notes.append(f"the program an earlier run made for this model with these settings (from "
                 f"the cache, {key[:12]}; the notes above are that run's), checked again on "
                 f"random and example inputs in {time.perf_counter() - t0:.1f} s{how}")
    return OptimizedModel(prog, report, notes, tuple(graph.input_names), cfg.device,
                          compiled=ref.compiled(prog, cfg.device), structure=ref.structure or
                          saved_structure(_folder() / key, len(prog.outputs)))


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


def store(key: str, model: OptimizedModel, mkey: str | None = None) -> None:
    """Keep ``model`` under ``key`` (with ``mkey``, the module's key, to find it by); a
    failure to write logs and leaves the cache as it was."""
    folder = _folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".new-", dir=folder))
        try:
            model.save(scratch)
            if mkey is not None:
                (scratch / MODULE_KEY).write_text(mkey)
            os.replace(scratch, folder / key)
        except OSError:  # another process stored the same key first
            if not (folder / key / "program.json").is_file():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _evict(folder)
    except (OSError, OllieError) as exc:  # another process removing entries, a full disk
        log.info("optimised program not cached (%s)", exc)


def _mark(entry: Path, mkey: str) -> None:
    """Record ``mkey`` in the stored ``entry`` (found by its graph's key), for
    :func:`recalled_module`; a failure to write only logs."""
    try:
        if (entry / MODULE_KEY).read_text() == mkey:
            return
    except OSError:
        pass
    try:
        tmp = entry / f".{MODULE_KEY}.{os.getpid()}"
        tmp.write_text(mkey)
        os.replace(tmp, entry / MODULE_KEY)
    except OSError as exc:  # removed meanwhile by another process, a read-only cache
        log.info("module key not recorded (%s)", exc)


def _find(mkey: str) -> str | None:
    """The key of the stored entry recording the module key ``mkey``, or None."""
    try:
        entries = list(_folder().iterdir())
    except OSError:
        return None
    for p in entries:
        try:
            if not p.name.startswith(".") and (p / MODULE_KEY).read_text() == mkey:
                return p.name
        except OSError:  # no module key recorded, or removed meanwhile
            continue
    return None


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


__all__ = ["FOLDER", "MAX_BYTES", "MAX_ENTRIES", "MODULE_KEY", "SWITCH_INTERVAL_S", "forget",
           "key_of", "model_key", "recall", "recalled", "recalled_module", "remembered",
           "short_switch_interval", "store"]
