"""Process-wide state of a search: the memo caches and the garbage collector's schedule.

Fingerprinting and zero analysis memoise per scope (``functools.lru_cache``). Within one search
those caches pay off; once it ends they only keep IR objects alive, which costs memory and
makes every later full collection slower (in the user's own code too). :func:`release_caches`
drops them; they refill on demand.

A search allocates millions of long-lived, acyclic IR objects (states, caches), so CPython's
automatic full collections would keep rescanning a growing heap. :func:`search_scope` wraps
every ``ollie.derive`` (so each subprogram's search inside ``ollie.optimize`` too): it defers
automatic full collections (young generations are still collected) until the search returns,
then restores the collector's thresholds and releases the caches. Only the outermost scope
does this (a counter under a lock; nested scopes, also from other threads, are no-ops), and
only when the settings' ``defer_full_collections`` is on (:mod:`ollie.settings`; the caches
are released either way). ``ollie.optimize`` releases the caches when it returns.

Why, and why neither deferring through the whole ``ollie.optimize`` nor ``gc.freeze``
(measured): docs/design/016-garbage-collector-and-memo-caches.md.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ollie.settings import current

# a full collection waits for this many collections of the middle generation (default 10)
DEFERRED_FULL_COLLECTIONS = 1_000_000

_depth = 0
_saved: tuple[int, ...] = ()
_lock = threading.Lock()


def release_caches() -> None:
    """Drop the per-scope memo caches (they refill on demand)."""
    from ollie.fingerprint import clear_cache as clear_fingerprints
    from ollie.rules.zeros import clear_cache as clear_zeros

    clear_fingerprints()
    clear_zeros()


@contextmanager
def search_scope() -> Iterator[None]:
    """Run a top-level search with full collections deferred; release the caches after."""
    global _depth, _saved
    with _lock:
        _depth += 1
        if _depth == 1:
            _saved = gc.get_threshold() if current().defer_full_collections else ()
            if _saved:
                gc.set_threshold(_saved[0], _saved[1],
                                 max(_saved[2], DEFERRED_FULL_COLLECTIONS))
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if _saved:
                    gc.set_threshold(*_saved)
                release_caches()


__all__ = ["DEFERRED_FULL_COLLECTIONS", "release_caches", "search_scope"]
