"""Process-wide memo caches of the derivation machinery, and dropping them.

Fingerprinting and zero analysis memoise per scope (``functools.lru_cache``). Within one search
those caches pay off; once it ends they only keep IR objects alive: after the CNN end-to-end
tests, ~2.3 M of the process's ~3.5 M objects tracked by the garbage collector, which costs
memory and makes every later full collection slower (in the user's own code too).
:func:`release_caches` is called when a top-level ``ollie.derive`` or ``ollie.optimize``
returns. (Freezing the pre-existing objects during a search, ``gc.freeze``, was measured too:
no gain, since the search's own allocations trigger the full collections.)
"""

from __future__ import annotations


def release_caches() -> None:
    """Drop the per-scope memo caches (they refill on demand)."""
    from ollie.fingerprint import clear_cache as clear_fingerprints
    from ollie.rules.zeros import clear_cache as clear_zeros

    clear_fingerprints()
    clear_zeros()


__all__ = ["release_caches"]
