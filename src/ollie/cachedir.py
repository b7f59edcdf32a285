"""The cache directory: where Ollie keeps measurements, decisions and generated kernels.

The directory is the settings' (:attr:`ollie.settings.Settings.cache_dir`, from the environment
unless changed), else ``~/.cache/ollie`` (created private, mode 0700).
What lies there is trusted as Ollie's own work: generated kernel modules are imported (after
their text is checked, :mod:`ollie.codegen.cache`) and numba loads its compiled code from
their ``__pycache__``, as Python does ``.pyc`` files. So a directory is used only when it is
private to the user: on POSIX owned by the user running Ollie and not writable by every user.
A directory that is not (or that cannot be created, is not a directory, or is not writable)
is not used: Ollie then works in a fresh private temporary directory for the rest of the
process, removed at exit, and logs one warning naming the path and the reason.
:func:`checked_dir` applies the same test to a subdirectory.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from ollie.settings import CACHE_DIR_ENV, current

log = logging.getLogger(__name__)

ENV = CACHE_DIR_ENV
"""The environment variable naming the cache directory (read by :mod:`ollie.settings`)."""

_LOCK = threading.Lock()
_CHECKED: dict[str, Path] = {}
_FALLBACK: list[Path] = []


def configured_root() -> Path:
    """The current settings' cache directory (``~/.cache/ollie`` by default), whether usable
    or not."""
    return current().cache_root


def cache_root() -> Path:
    """The cache directory to use: :func:`configured_root` when it is usable and private,
    else this process's private temporary directory (see the module docstring)."""
    return checked_dir(configured_root())


def checked_dir(path: Path) -> Path:
    """``path`` (created if missing) when it is a usable, private directory; otherwise a
    subdirectory of this process's private temporary directory, with one warning naming
    ``path`` and why. The answer is remembered per path for the process."""
    key = str(path)
    with _LOCK:
        hit = _CHECKED.get(key)
        if hit is not None:
            return hit
        why = problem(path)
        if why is None:
            use = path
        else:
            use = Path(tempfile.mkdtemp(prefix="d", dir=_fallback()))
            log.warning("cache directory %s is not used (%s); working without a persistent "
                        "cache in %s", path, why, use)
        _CHECKED[key] = use
        return use


def problem(path: Path) -> str | None:
    """Why ``path`` cannot be a cache directory, or None when it can (it is created, mode
    0700, when missing)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        return "it exists and is not a directory"
    except OSError as e:
        return f"it cannot be created: {e.strerror or e}"
    try:
        st = path.stat()
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if hasattr(os, "getuid"):
        if st.st_uid != os.getuid():
            return f"it is owned by another user (uid {st.st_uid}), so its files could run code"
        if st.st_mode & stat.S_IWOTH:
            return "every user may write to it, so its files could run code"
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def _fallback() -> Path:
    """This process's private temporary directory (removed at exit)."""
    if not _FALLBACK:
        tmp = Path(tempfile.mkdtemp(prefix="ollie-cache-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        _FALLBACK.append(tmp)
    return _FALLBACK[0]


def forget() -> None:
    """Forget which directories were checked (a test, or a directory that changed and
    should be checked again)."""
    with _LOCK:
        _CHECKED.clear()


__all__ = ["ENV", "cache_root", "checked_dir", "configured_root", "forget", "problem"]
