"""The on-disk kernel cache: generated modules written once, imported through importlib.

A kernel module lives at ``<cache dir>/kernels/ollie_<fingerprint>_<decls>.py`` where
``fingerprint`` is :func:`ollie.fingerprint` of the expression (identifies it up to iterator
renaming, summation order and commutative operands) and ``decls`` a short digest of the declared
input names and shapes and :data:`CODEGEN_VERSION` (the generated code binds inputs by name).
The module stores the expression's canonical form; a file whose canonical form differs (a digest
collision) is never used for another expression: the kernel then goes to a file named by the
digest of the full canonical form.

Files are written atomically and never rewritten: numba's ``cache=True`` keeps its machine code
in ``__pycache__`` beside the module, stamped with the file's text (a SHA-256 of it in numba
0.68; older versions used the modification time), so a second process importing the same
module loads compiled code instead of compiling.

The cache directory is ``$OLLIE_CACHE_DIR/kernels`` when that variable is set, else
``~/.cache/ollie/kernels``; callers may pass one explicitly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

CODEGEN_VERSION = 24
"""Bumped whenever the generated code changes meaning or form (part of every file key)."""


def default_cache_dir() -> Path:
    """``$OLLIE_CACHE_DIR/kernels`` or ``~/.cache/ollie/kernels``."""
    root = os.environ.get("OLLIE_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "ollie"
    return base / "kernels"


def decls_key(decls: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """Short digest of declared names and shapes and the code generator version."""
    text = f"v{CODEGEN_VERSION};" + ";".join(f"{n}:{list(s)}" for n, s in decls)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


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


def _import(path: Path) -> ModuleType:
    name = f"ollie_kernels.{path.stem}"
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == str(path):
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


def load_path(path: Path) -> ModuleType:
    """Import the kernel module at ``path`` (compiling its functions)."""
    return _import(path)


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
                generate: Callable[[Path], str]) -> tuple[ModuleType, bool]:
    """Import the kernel module ``stem`` from ``directory``, generating it when absent.

    ``generate(path)`` returns the text to write at ``path`` (it may also leave numba's
    compiled code for that text in ``path``'s ``__pycache__``, :func:`adopt_numba_cache`).
    Returns the module and whether it was already on disk. A module whose ``CANONICAL``
    differs from ``canonical`` is not used; ``fallback_stem`` names the file used instead.
    """
    for name in (stem, fallback_stem):
        path = directory / f"{name}.py"
        existed = path.exists()
        if not existed:
            write_once(path, generate(path))
        if f"CANONICAL = {canonical!r}\n" not in path.read_text():
            continue
        mod = _import(path)
        if getattr(mod, "CANONICAL", None) == canonical:
            return mod, existed
    raise RuntimeError(f"kernel cache file {directory / fallback_stem}.py does not hold the "
                       "expected expression; delete it")
