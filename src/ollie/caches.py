"""Process-wide state of a search: the memo caches and the garbage collector's schedule.

Fingerprinting and zero analysis memoise per scope (``functools.lru_cache``). Within one search
those caches pay off; once it ends they only keep IR objects alive: after the CNN end-to-end
tests, ~2.3 M of the process's ~3.5 M objects tracked by the garbage collector, which costs
memory and makes every later full collection slower (in the user's own code too).

A search allocates millions of long-lived, acyclic IR objects (states, caches), so CPython's
automatic full collections keep rescanning a growing heap: alone, a 3 s search spent ~20% of
its time in them, and in a process that already held millions of objects one collection took
~2 s. :func:`search_scope` wraps every ``ollie.derive`` (so each subprogram's search inside
``ollie.optimize`` too): it defers automatic full collections (young generations are still
collected) until the search returns, then restores the schedule and releases the caches.
Measured on the 2-core VM: ``derive(conv5x5 small, time_budget=20)`` explored 319 -> 413
states, peak RSS 532 -> 560 MB; InfoGAN b1 ``optimize(time_budget=10)`` peak RSS 1062 ->
1054 MB, same time (deferring through the whole ``optimize`` instead took 46.8 -> 40.9 s but
1096 -> 1352 MB: not done). ``ollie.optimize`` releases the caches when it returns.
(Freezing the pre-existing objects, ``gc.freeze``, was measured too: no gain, since the
search's own allocations trigger the collections.) Nested scopes are no-ops.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

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
            _saved = gc.get_threshold()
            gc.set_threshold(_saved[0], _saved[1], max(_saved[2], DEFERRED_FULL_COLLECTIONS))
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                release_caches()


__all__ = ["DEFERRED_FULL_COLLECTIONS", "release_caches", "search_scope"]
