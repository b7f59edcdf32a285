"""The on-disk kernel cache: generated modules written once, imported through importlib.

A kernel module lives at ``<cache dir>/kernels/ollie_<text>_<decls>.py`` where ``text`` is
a digest of the expression's exact text (:func:`text_key`) and ``decls`` a short digest of the
declared input names and shapes and :data:`CODEGEN_VERSION` (the generated code binds inputs by
name). The module stores the expression's canonical form; a file whose canonical form differs
(a digest collision) is never used for another expression: the kernel then goes to a file
named by the digest of the full canonical form.

Files are written atomically and not rewritten while they hold generated code: numba's
``cache=True`` keeps its machine code in ``__pycache__`` beside the module, stamped with the
file's text (a SHA-256 of it in numba 0.68; older versions used the modification time), so a
second process importing the same module loads compiled code instead of compiling.

The numba functions of a generated CPU kernel module are compiled from nest modules of their
own, ``nests/nest_<digest>.py``, named by a SHA-256 of their text and shared by every kernel
that holds the same function (:mod:`ollie.codegen.nests`); a nest module is imported only when
the file holds exactly the text taken from the checked kernel module. That text has the sizes
of its outer loops as arguments (:mod:`ollie.codegen.pattern`), so the key of a compiled
function is its pattern: kernels equal up to those sizes share it.

Nothing in the directory is imported on its name alone: :func:`load_module` imports a module
only when its text is one the code generator produces for that key (the caller says which,
``accept``); a file holding anything else, a line appended included, is logged, replaced by
freshly generated code and never imported. numba's compiled code in ``__pycache__`` is trusted
as Python trusts ``.pyc`` files: the directory must be private to the user
(:mod:`ollie.cachedir`).

The cache directory is ``kernels`` under :func:`ollie.cachedir.cache_root` (the settings'
directory, :mod:`ollie.settings`, when private and writable); callers may pass one explicitly.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from ollie.cachedir import cache_root, checked_dir
from ollie.codegen.nests import nest_path, nest_stem, split_module
from ollie.settings import current

log = logging.getLogger(__name__)

CODEGEN_VERSION = 26
"""Bumped whenever the generated code changes meaning or form (part of every file key)."""


def default_cache_dir() -> Path:
    """The settings' kernel directory (:attr:`ollie.settings.Settings.kernel_dir`), else
    ``kernels`` under the cache directory (:func:`ollie.cachedir.cache_root`); checked to be
    private and writable like it (else a private temporary one)."""
    chosen = current().kernel_dir
    return checked_dir(chosen if chosen is not None else cache_root() / "kernels")


def decls_key(decls: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """Short digest of declared names and shapes and the code generator version."""
    text = f"v{CODEGEN_VERSION};" + ";".join(f"{n}:{list(s)}" for n, s in decls)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def text_key(text: str) -> str:
    """Digest of an expression's exact text (the file key of its kernel module)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def full_key(canonical: str) -> str:
    """Digest of a whole canonical form (used when the fingerprint file is taken)."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:40]


def write_once(path: Path, data: str | bytes) -> bool:
    """Write ``data`` to ``path`` atomically unless the file exists; whether it was written."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        if path.exists():  # another process won the race: keep its file (and numba cache)
            return False
        os.replace(tmp, path)
        tmp = ""
        return True
    finally:
        if tmp:
            os.unlink(tmp)


def _import(path: Path, nests: Path | None = None) -> ModuleType:
    name = f"ollie_kernels.{path.stem}"
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == str(path):
        return mod
    text = _read(path)
    split = split_module(text) if text is not None else None
    if split is not None:  # its nests from their own modules, the rest executed here
        functions = {fn: load_nest(nests if nests is not None else path.parent, nest)
                     for fn, nest in split.nests.items()}
        mod = ModuleType(name)
        mod.__file__ = str(path)
        sys.modules[name] = mod
        try:
            exec(compile(split.rest, str(path), "exec"), mod.__dict__)
        except BaseException:
            del sys.modules[name]
            raise
        mod.__dict__.update(functions)
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def load_path(path: Path, nests: Path | None = None) -> ModuleType:
    """Import the kernel module at ``path`` (compiling its functions); the nest modules of a
    generated CPU kernel (:mod:`ollie.codegen.nests`) live under ``nests`` (default: the
    module's directory)."""
    return _import(path, nests)


def ensure_nest(directory: Path, text: str) -> Path:
    """The nest module holding ``text`` under the kernel cache ``directory``, written when
    absent and replaced when it holds another text (never imported then)."""
    path = nest_path(directory, text)
    if not write_once(path, text) and _read(path) != text:
        log.warning("nest module %s does not hold the text named by its digest: replaced, "
                    "not imported", path)
        _replace(path, text)
    return path


def nest_loaded(directory: Path, text: str) -> bool:
    """Whether the nest module holding ``text`` under ``directory`` is imported in this
    process."""
    mod = sys.modules.get(f"ollie_kernels.{nest_stem(text)}")
    return getattr(mod, "TEXT_DIGEST", None) == nest_stem(text) and \
        getattr(mod, "__file__", None) == str(nest_path(directory, text))


def load_nest(directory: Path, text: str) -> Callable:
    """The compiled ``nest`` function of the nest module holding ``text`` under
    ``directory`` (:mod:`ollie.codegen.nests`): from this process when already imported from
    there, else imported from the file, which is first made to hold exactly ``text`` (numba
    loads its cached machine code, or compiles it)."""
    if nest_loaded(directory, text):
        return sys.modules[f"ollie_kernels.{nest_stem(text)}"].nest
    mod = _import(ensure_nest(directory, text))
    mod.__dict__["TEXT_DIGEST"] = nest_stem(text)  # imported from a checked file
    return mod.nest


def adopt_numba_cache(trial: Path, path: Path) -> int:
    """Copy numba's compiled code of the module ``trial`` beside ``path``, a module of the
    same file name and text that is yet to be imported, so that importing ``path`` loads
    it instead of compiling again. Returns the number of files copied.

    numba keeps a module's code in ``__pycache__/<file stem>.<function>-<line>.pyXY.*``
    beside it, stamped with a hash of the module's text (not its path), so the files are
    valid for the same text under the same name anywhere. Files already there are kept.
    """
    if trial.name != path.name:
        raise ValueError(f"{trial} and {path} must have the same file name")
    src, dst = trial.parent / "__pycache__", path.parent / "__pycache__"
    files = sorted(src.glob(f"{trial.stem}.*")) if src.is_dir() else []
    return sum(write_once(dst / f.name, f.read_bytes()) for f in files)


def unload_path(path: Path) -> None:
    """Forget the module imported by :func:`load_path` from ``path``."""
    name = f"ollie_kernels.{path.stem}"
    if getattr(sys.modules.get(name), "__file__", None) == str(path):
        del sys.modules[name]


def load_module(directory: Path, stem: str, canonical: str, fallback_stem: str,
                generate: Callable[[Path], str],
                accept: Callable[[str], bool] | None = None) -> tuple[ModuleType, bool]:
    """Import the kernel module ``stem`` from ``directory``, generating it when absent.

    ``generate(path)`` returns the text to write at ``path`` (it may also leave numba's
    compiled code for that text in ``path``'s ``__pycache__``, :func:`adopt_numba_cache`).
    ``accept(text)``: whether ``text`` is one the generator produces for this module (default:
    the text ``generate`` would write, which is then generated to compare); a file holding
    another text is replaced by a generated one, never imported. Returns the module and
    whether it was already on disk. A module whose ``CANONICAL`` differs from ``canonical``
    (a digest collision) is not used; ``fallback_stem`` names the file used instead.
    """
    for name in (stem, fallback_stem):
        path = directory / f"{name}.py"
        existed = path.exists()
        if existed:
            text = _read(path)
            if text is None or f"CANONICAL = {canonical!r}\n" not in text:
                continue
            ok = accept(text) if accept is not None else text == generate(path)
            if not ok:
                log.warning("kernel cache file %s does not hold the code Ollie generates for "
                            "it: replaced, not imported", path)
                _replace(path, generate(path))
                existed = False
        else:
            write_once(path, generate(path))
        text = _read(path)
        if text is None or f"CANONICAL = {canonical!r}\n" not in text:
            continue
        mod = _import(path)
        if getattr(mod, "CANONICAL", None) == canonical:
            return mod, existed
    raise RuntimeError(f"kernel cache file {directory / fallback_stem}.py does not hold the "
                       "expected expression; delete it")


def ensure_text(path: Path, text: str) -> bool:
    """Make the file at ``path`` hold ``text``: written when absent; another text there that
    names the same ``CANONICAL`` (tampered with, or a stale form) is replaced. False when the
    file names another expression (a digest collision: the caller uses its fallback)."""
    if write_once(path, text):
        return True
    old = _read(path)
    if old == text:
        return True
    canonical = next((line for line in text.splitlines() if line.startswith("CANONICAL = ")),
                     None)
    if old is not None and canonical is not None and f"{canonical}\n" not in old:
        return False
    log.warning("kernel cache file %s does not hold the code Ollie generates for it: "
                "replaced, not imported", path)
    _replace(path, text)
    return True


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically over what is there, and drop numba's code for
    the old text."""
    for f in sorted((path.parent / "__pycache__").glob(f"{path.stem}.*")):
        with contextlib.suppress(OSError):
            f.unlink()
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = ""
    finally:
        if tmp:
            os.unlink(tmp)
