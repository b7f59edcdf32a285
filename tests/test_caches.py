"""A search's memo caches and the collector's schedule (ollie.caches): full collections deferred
while a search runs (unless the settings say not to), restored and the caches released after."""

import gc
import importlib

import ollie
from ollie.bench.cases import CASES
from ollie.settings import using
from ollie.testing.clock import stopped_clock


def test_search_scope_defers_full_collections_and_releases_caches():
    """During a search automatic full collections are deferred and the per-scope memo caches
    fill; when it returns the collector's schedule is restored and the caches are dropped
    (they would otherwise keep millions of IR objects alive in the user's process)."""
    fp = importlib.import_module("ollie.fingerprint")
    zeros = importlib.import_module("ollie.rules.zeros")
    caches = importlib.import_module("ollie.caches")
    before = gc.get_threshold()
    seen = {}

    def probe(_stats: dict) -> None:
        seen["cached"] = fp._scope_text.cache_info().currsize
        seen["threshold"] = gc.get_threshold()

    expr = ollie.parse(CASES["conv3x3"].small)
    ollie.derive(expr, max_depth=2, guided_depth=2, time_budget=30.0, max_candidates=1,
                 progress=probe, clock=stopped_clock)  # the same states however busy the machine
    assert seen["cached"] > 0
    assert seen["threshold"][:2] == before[:2]
    assert seen["threshold"][2] == max(before[2], caches.DEFERRED_FULL_COLLECTIONS)
    assert gc.get_threshold() == before
    assert fp._scope_text.cache_info().currsize == 0
    assert fp._used_names.cache_info().currsize == 0
    assert zeros._nonzero.cache_info().currsize == 0


def test_the_search_scope_defers_full_collections_only_when_asked():
    from ollie.caches import DEFERRED_FULL_COLLECTIONS, search_scope

    before = gc.get_threshold()
    with search_scope():
        assert gc.get_threshold()[2] >= DEFERRED_FULL_COLLECTIONS
    assert gc.get_threshold() == before
    with using(defer_full_collections=False), search_scope():
        assert gc.get_threshold() == before
    assert gc.get_threshold() == before
