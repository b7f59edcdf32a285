"""The program-context step with more rewritten subprograms than it switches, and cached
choices that do not fit the program: never a ``KeyError``, the choice is made again. Times
are injected (no clock)."""

from __future__ import annotations

import json

import torch
from torch import nn

from ollie.optimizer import context
from ollie.optimizer.context import MAX_GROUPS, Group, cached_refine, refine
from ollie.optimizer.final import Reference
from ollie.testing.programs import marked_assembler, original_program
from ollie.tune.cache import CostCache


def _program():
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU()).eval()
    prog, feeds, want = original_program(m, torch.randn(1, 2, 5, 5))

    assemble = marked_assembler(prog)

    return assemble, feeds, want


def _fake_times(fast: set[str]):
    """``_time`` measuring 1.0 for every choice, 0.9 for one that switches off a key of
    ``fast`` (each such single switch wins, and together they win more)."""
    def timed(choices, runner, spinning=frozenset(), rounds=0, settle=0.0, max_seconds=0.0):
        out = {}
        for on in dict.fromkeys(choices):
            if runner(on) is not None:
                off = len(fast - on)
                out[on] = 1.0 - 0.1 * off
        return out

    return timed


def test_more_groups_than_switched_never_raise(monkeypatch):
    assemble, feeds, want = _program()
    keys = [f"g{i:02d}" for i in range(MAX_GROUPS + 3)]
    # the groups beyond MAX_GROUPS save least: they are on at the start, never switched
    groups = [Group(k, (f"node_{k}",), 1.0 - i * 0.01) for i, k in enumerate(keys)]
    monkeypatch.setattr(context, "_time", _fake_times({"g00", "g01"}))
    out = refine(assemble, groups, frozenset(keys), "per operator", feeds, want, 1e-3)
    assert out is not None
    assert out.on == frozenset(keys) - {"g00", "g01"}  # both switched off, confirmed together


def test_a_cached_choice_naming_unknown_groups_is_made_again(monkeypatch):
    assemble, feeds, want = _program()
    groups = [Group("a", ("node_a",), 1.0), Group("b", ("node_b",), 0.5)]
    monkeypatch.setattr(context, "_time", _fake_times({"a"}))
    cache = CostCache(":memory:")
    ref = Reference(feeds, want, 1e-3)
    first = cached_refine(assemble, groups, frozenset({"a", "b"}), "per operator", ref, cache,
                          "cpu", settle=0.0)
    assert first is not None and first.on == frozenset({"b"})
    ((key, _),) = cache.db.execute("SELECT key, doc FROM decisions").fetchall()
    for doc in (json.dumps(["a", "no_such_group"]), "{not json", json.dumps({"a": 1})):
        cache.put_decision(key, doc)
        again = cached_refine(assemble, groups, frozenset({"a", "b"}), "per operator", ref,
                              cache, "cpu", settle=0.0)
        assert again is not None and again.on == frozenset({"b"})
        assert "(cached)" not in again.note
