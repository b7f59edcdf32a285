"""Compiling generated CPU kernels ahead of their first use, side by side on every core.

numba compiles a generated module in one thread, and compiling the candidates' modules one
after another is most of a cold optimisation. The candidates of one subprogram are known
before any of them runs, so their modules can be compiled side by side: :func:`precompile`
writes the module text of every form :func:`ollie.codegen.cpu.choose_source` will try
(``staged/<form>/<file>`` under the kernel cache directory) and the nest modules those texts
hold (:mod:`ollie.codegen.nests`, each distinct nest once), and imports the nest modules not
compiled yet in one process per core (this one, and fresh Python processes that import only
numba), whose numba writes the machine code to each file's ``__pycache__``. When the kernel
is then compiled for real, :func:`~ollie.codegen.cpu.choose_source` loads a staged form with
the same text instead of compiling it (its nests load numba's code; numba 0.68 stamps its
cache with the text's hash) and removes the staged files (:func:`unstage`). The variants
of a kernel for the layouts its inputs arrive in are found by running the candidates once
without compiling them (:func:`ollie.exec.dispatch.discovering`), then compiled the same
way.

The Winograd transforms (:func:`ollie.kernels.winograd_codegen.precompile`) go through
:func:`compile_side_by_side` too: their functions compile on their first call, so a worker
compiles them for the signatures it is given, into the same cache.

Compiling ahead changes nothing else: the module texts, the choice between forms (timed in
the calling process) and the files left in the cache are those of compiling on first use. A
worker that fails or times out, or staged code that does not load, only leaves its modules to
be compiled on first use in the calling process. :attr:`ollie.settings.Settings.precompile`
(``OLLIE_PRECOMPILE=0`` in the environment) turns this off.

Why, with the measurements: docs/design/011-compiling-kernels-ahead.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ollie.codegen.nests import split_module
from ollie.ir import Expr
from ollie.settings import current

log = logging.getLogger(__name__)

STAGED = "staged"
"""Subdirectory of the kernel cache directory holding the forms compiled ahead."""

STALE_SECONDS = 3600.0
"""Staged files older than this are removed when kernels are next compiled ahead: a form
compiled ahead but never used (a candidate that failed its check before that kernel was
built, a layout a check saw and the timing did not)."""

TIMEOUT = 900.0
"""Seconds a worker may take for its share before it is stopped (its modules are then
compiled in the calling process when they are used)."""

_WORKER = """
import importlib.util, json, os, sys
from numba.core.sigutils import normalize_signature
failed = 0
for path, signatures in json.loads(sys.argv[1]):
    try:
        # under the name the calling process imports it by (ollie.codegen.cache), which
        # numba's cache records
        name = "ollie_kernels." + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        for function, signature in signatures:
            getattr(module, function).compile(tuple(normalize_signature(signature)[0]))
    except Exception as exc:
        print(f"{path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        failed += 1
sys.exit(1 if failed else 0)
"""
"""A worker: imports each module it is given (argument: JSON ``[[path, [[function,
signature], ...]], ...]``), which compiles the functions that declare their signatures, and
compiles the listed functions of a lazily compiled module for the listed signatures (their
argument types, the key numba's cache stores a call's code under)."""

Signatures = Mapping[Path, Sequence[tuple[str, str]]]
"""Per module, ``(function, signature)`` pairs to compile after importing it."""


def enabled() -> bool:
    """Whether compiling ahead is on (the current settings' ``precompile``)."""
    return current().precompile


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def staged_path(path: Path, form: str) -> Path:
    """Where the ``form`` of the kernel module ``path`` is staged."""
    return path.parent / STAGED / form / path.name


def staged(path: Path, form: str, text: str) -> Path | None:
    """The staged ``form`` of the kernel module ``path`` if it holds ``text``, else None."""
    p = staged_path(path, form)
    try:
        return p if p.read_text() == text else None
    except OSError:
        return None


def compiled(p: Path) -> bool:
    """Whether numba's cache beside the module ``p`` holds code for it."""
    cache = p.parent / "__pycache__"
    return cache.is_dir() and any(cache.glob(f"{p.stem}.*.nbi"))


def unstage(p: Path) -> None:
    """Remove the staged module ``p`` and numba's code for it."""
    for f in [p, *sorted((p.parent / "__pycache__").glob(f"{p.stem}.*"))]:
        with contextlib.suppress(OSError):
            f.unlink()


def _stage(p: Path, text: str) -> None:
    """Write ``text`` to ``p`` atomically (replacing a stale text)."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".tmp_{os.getpid()}_{threading.get_ident()}_{p.name}")
    tmp.write_text(text)
    os.replace(tmp, p)


def _prune(staging: Path) -> None:
    """Remove staged modules older than :data:`STALE_SECONDS` (and numba's code for them)."""
    cutoff = time.time() - STALE_SECONDS
    for p in staging.glob("*/*.py"):
        try:
            old = p.stat().st_mtime < cutoff
        except OSError:
            continue
        if old:
            unstage(p)


def pending(exprs: Iterable[Expr], cache_dir: Path | None = None) -> list[Path]:
    """Stage the forms of every kernel of ``exprs`` that is neither compiled in this process
    nor on disk; the files numba has not compiled yet: the nest modules of those forms
    (:mod:`ollie.codegen.nests`, each once, unless compiled on disk or in this process) and
    the staged forms that are imported whole."""
    from ollie.codegen.cache import default_cache_dir, ensure_nest, nest_loaded
    from ollie.codegen.cpu import is_loaded, module_stem, source_forms
    from ollie.fingerprint import canonical_form

    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    _prune(directory / STAGED)
    todo: list[Path] = []
    nests: set[Path] = set()
    seen: set[Expr] = set()
    for expr in exprs:
        if expr in seen or is_loaded(expr, directory):
            continue
        seen.add(expr)
        path = directory / f"{module_stem(expr)}.py"
        if path.exists():
            continue
        try:
            forms = source_forms(expr, canonical_form(expr))
        except Exception as exc:  # it fails again, and is reported, when used
            log.debug("no source for %s: %s", path.name, exc)
            continue
        for form, text in forms.items():
            p = staged_path(path, form)
            if staged(path, form, text) is None:
                _stage(p, text)
            split = split_module(text)
            if split is not None:  # its nest modules are what numba compiles
                for nest in split.nests.values():
                    n = ensure_nest(directory, nest)
                    if n not in nests and not compiled(n) and not nest_loaded(directory, nest):
                        nests.add(n)
                        todo.append(n)
            elif not compiled(p):
                todo.append(p)
    return todo


def _shares(paths: list[Path], n: int) -> list[list[Path]]:
    """``paths`` in ``n`` lists of about equal text size (longest first, each to the
    lightest list): compile time grows with a module's size."""
    sized = sorted(((p.stat().st_size, p) for p in paths), key=lambda t: (-t[0], str(t[1])))
    shares: list[tuple[int, list[Path]]] = [(0, []) for _ in range(n)]
    for size, p in sized:
        i = min(range(n), key=lambda j: shares[j][0])
        shares[i] = (shares[i][0] + size, [*shares[i][1], p])
    return [s for _, s in shares if s]


def _run(share: list[Path], signatures: Signatures, failures: list[str]) -> None:
    task = json.dumps([[str(p), [list(s) for s in signatures.get(p, ())]] for p in share])
    try:
        res = subprocess.run([sys.executable, "-c", _WORKER, task],
                             capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        failures.append(f"worker for {len(share)} module(s): {exc}")
        return
    if res.returncode != 0:
        failures.append(res.stderr.strip()[-2000:] or f"exit status {res.returncode}")


def _compile_here(share: list[Path], signatures: Signatures, failures: list[str]) -> None:
    """Compile ``share`` in this process (imported as :mod:`ollie.codegen.cache` imports a
    kernel module, so numba's cache names it the same; then forgotten again)."""
    from numba.core.sigutils import normalize_signature

    from ollie.codegen.cache import load_path, unload_path

    for p in share:
        try:
            module = load_path(p)
            for function, signature in signatures.get(p, ()):
                getattr(module, function).compile(tuple(normalize_signature(signature)[0]))
        except Exception as exc:  # numba's compile errors have many types
            failures.append(f"{p}: {type(exc).__name__}: {exc}")
        finally:
            unload_path(p)


def precompile(exprs: Iterable[Expr], cache_dir: Path | None = None,
               workers: int | None = None) -> int:
    """Compile the CPU kernels of ``exprs`` ahead (see the module doc) in up to ``workers``
    processes (default: one per core), this one included; returns how many module forms were
    compiled.
    Does nothing when fewer than two forms need compiling (a worker would only add its
    start-up) or when it is turned off (:func:`enabled`)."""
    if not enabled():
        return 0
    try:
        todo = pending(exprs, cache_dir)
    except OSError as exc:  # an unwritable cache directory: kernels compile when used
        log.warning("kernels not compiled ahead: %s", exc)
        return 0
    return compile_side_by_side(todo, workers)


def compile_side_by_side(todo: list[Path], workers: int | None = None,
                         signatures: Signatures | None = None) -> int:
    """Import the modules ``todo`` (numba functions that declare their signatures compile
    then, into numba's cache beside each file) in up to ``workers`` processes (default: one
    per core), this one included, each module imported by the name :mod:`ollie.codegen.cache`
    gives it, and compile the functions ``signatures`` lists for a module for those
    signatures (all of a module's in one process: they share numba's index file); returns
    how many modules are compiled afterwards. Does nothing for fewer than two modules or when
    turned off (:func:`enabled`)."""
    signatures = signatures or {}
    n = min(workers or cores(), len(todo))
    if not enabled() or n < 2 or len(todo) < 2:
        return 0
    start = time.perf_counter()
    failures: list[str] = []
    own, *others = _shares(todo, n)
    threads = [threading.Thread(target=_run, args=(share, signatures, failures), daemon=True)
               for share in others]
    for t in threads:
        t.start()
    _compile_here(own, signatures, failures)  # this process takes a share meanwhile
    for t in threads:
        t.join()
    done = sum(compiled(p) for p in todo)
    for text in failures:
        log.warning("compiling kernels ahead failed (they compile when used): %s", text)
    log.info("compiled %d of %d kernel module forms ahead in %d processes in %.1f s", done,
             len(todo), n, time.perf_counter() - start)
    return done


__all__ = ["STAGED", "TIMEOUT", "compile_side_by_side", "compiled", "cores", "enabled", "pending",
           "precompile", "staged", "unstage"]
