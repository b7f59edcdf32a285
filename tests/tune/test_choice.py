"""The choice object (ollie.tune.choice): one table per Choices, read and written only through
it; the choosers ask the one they are given, else the table of the settings in effect."""

from __future__ import annotations

import pytest
import torch

from ollie.settings import current, using
from ollie.testing.clock import FakeClock
from ollie.tune import choice
from ollie.tune.choice import ANY_OF, Choices


def _ident(x: torch.Tensor) -> torch.Tensor:
    return x


def test_each_choices_object_keeps_its_own_table():
    a, b = Choices(), Choices()
    a.remember(("k", 1), "x")
    assert ("k", 1) in a and a.get(("k", 1)) == "x" and a[("k", 1)] == "x"
    assert ("k", 1) not in b and b.get(("k", 1)) is None and len(b) == 0
    assert list(a) == [("k", 1)]
    a.forget(("k", 1))
    a.forget(("k", 1))  # forgetting twice is fine
    assert len(a) == 0


def _recording(built: list[str]):
    """``builder(name)``: a builder that records ``name`` in ``built`` and returns
    :func:`_ident`."""
    def builder(name: str):
        def build():
            built.append(name)
            return _ident
        return build
    return builder


def test_fastest_of_builds_the_remembered_choice_only():
    built: list[str] = []
    builder = _recording(built)

    c = Choices()
    c.remember(("conv", 1), "b")
    assert c.fastest_of({"a": builder("a"), "b": builder("b")}, (2,), ("conv", 1)) is _ident
    assert built == ["b"]


def test_a_preferred_subset_is_keyed_apart_and_a_single_candidate_is_not_timed():
    c = Choices()
    got = c.fastest_of({"a": lambda: _ident, "b": lambda: None}, (2,), ("k",),
                       prefer=f"a{ANY_OF}b")
    assert got is _ident and len(c) == 0  # one usable: nothing measured, nothing remembered


def test_choosers_ask_the_settings_choices_unless_given_one():
    mine: dict = {}
    with using(choices=mine):
        assert choice.shared().table is mine
        choice.shared().remember(("k",), "a")
    assert mine == {("k",): "a"} and ("k",) not in choice.shared()
    outer = current().choices
    with using(precompile=False):  # a block that does not replace the table shares it
        assert choice.shared().table is outer


def _timings(**medians: float):
    from ollie.tune.measure import Timings

    return Timings({n: [t] * 7 for n, t in medians.items()})


def test_pick_replaces_the_framework_only_when_faster_with_confidence():
    """Cold and warm probes: another implementation is chosen only when faster than the
    baseline with confidence in one and not slower with confidence in the other."""
    from ollie.tune.choice import pick

    assert pick(_timings(torch=1.0, dnn=0.8), _timings(torch=1.0, dnn=0.8), "torch") == "dnn"
    assert pick(_timings(torch=1.0, dnn=0.8), _timings(torch=1.0, dnn=1.0), "torch") == "dnn"
    # faster cold, slower warm (a cold-probe choice slow in the program): the framework's
    assert pick(_timings(torch=1.0, dnn=0.8), _timings(torch=1.0, dnn=1.3), "torch") == "torch"
    # within the margin: the framework's
    assert pick(_timings(torch=1.0, dnn=0.99), _timings(torch=1.0, dnn=0.99), "torch") == \
        "torch"
    # no baseline: the least cold + warm
    assert pick(_timings(a=1.0, b=0.8), _timings(a=1.0, b=1.3)) == "a"


def _scripted_probes(monkeypatch, *probes):
    """``choice.probe`` returning the given (cold, warm) timings in turn."""
    left = list(probes)
    seen: list[tuple[str, ...]] = []

    def probe(impls, args, rounds=choice.PROBE_ROUNDS):
        seen.append(tuple(sorted(impls)))
        return left.pop(0)

    monkeypatch.setattr(choice, "probe", probe)
    return seen


def test_a_choice_made_under_load_is_remembered_only_if_probed_again_alike(monkeypatch,
                                                                           ollie_settings):
    def a(x):
        return x

    def b(x):
        return x

    slept: list[float] = []
    ollie_settings(load=lambda: 1e6, sleep=slept.append)  # a busy machine
    wins = (_timings(torch=1.0, dnn=0.5), _timings(torch=1.0, dnn=0.5))
    loses = (_timings(torch=1.0, dnn=1.5), _timings(torch=1.0, dnn=1.5))
    c = Choices()
    seen = _scripted_probes(monkeypatch, wins, loses)
    assert c.fastest({"torch": a, "dnn": b}, (2,), ("k",), baseline="torch") is a
    assert ("k",) not in c and len(slept) == 1 and seen == [("dnn", "torch")] * 2
    seen = _scripted_probes(monkeypatch, wins, wins)
    assert c.fastest({"torch": a, "dnn": b}, (2,), ("k",), baseline="torch") is b
    assert c.get(("k",)) == "dnn" and len(seen) == 2
    ollie_settings(load=lambda: 0.0)  # quiet, and a baseline without spread: one probe
    seen = _scripted_probes(monkeypatch, wins)
    assert c.fastest({"torch": a, "dnn": b}, (2,), ("k2",), baseline="torch") is b
    assert c.get(("k2",)) == "dnn" and len(seen) == 1


class _Store:
    """A :class:`ollie.settings.ChoiceStore` in a dict, recording what was asked."""

    def __init__(self, stored: dict[str, str] | None = None) -> None:
        self.stored = dict(stored or {})
        self.recalled: list[str] = []

    def recall(self, key: str) -> str | None:
        self.recalled.append(key)
        return self.stored.get(key)

    def record(self, key: str, name: str) -> None:
        self.stored[key] = name


def test_a_store_backs_the_table_by_the_text_of_plain_keys():
    store = _Store({repr(("conv", (1, 2), None, True, 0.5)): "b"})
    c = Choices(store=store)
    assert c.get(("conv", (1, 2), None, True, 0.5)) == "b"  # recalled, then in the table
    assert ("conv", (1, 2), None, True, 0.5) in c
    c.get(("conv", (1, 2), None, True, 0.5))
    assert len(store.recalled) == 1  # the table answers the second time
    c.remember(("gemm", 3), "x")
    assert store.stored[repr(("gemm", 3))] == "x"
    # a key that is not made of plain values has no stable text: never stored or recalled
    odd = ("conv", object())
    c.remember(odd, "y")
    assert c.get(odd) == "y" and len(store.stored) == 2
    assert choice.stored_key(odd) is None and choice.stored_key(("a", (1,))) == "('a', (1,))"


def test_shared_choices_use_the_settings_store_and_a_private_one_does_not():
    store = _Store({repr(("k",)): "a"})
    with using(choices={}, choice_store=store):
        assert choice.shared().get(("k",)) == "a"
        assert Choices().get(("k",)) is None
        c = Choices()
        c.remember(("private",), "p")
        assert repr(("private",)) not in store.stored
    with using(choices={}):
        assert choice.shared().get(("k",)) is None  # no store: memory only


def test_a_recalled_name_is_used_only_when_it_is_offered(ollie_settings):
    ollie_settings(sleep=lambda seconds: None)
    built: list[str] = []
    builder = _recording(built)
    offered = {"a": builder("a"), "b": builder("b")}
    # a stored name the chooser offers: only that one is built, nothing measured
    c = Choices(store=_Store({repr(("conv", 2)): "b"}))
    assert c.fastest_of(offered, (2,), ("conv", 2)) is _ident
    assert built == ["b"]
    # a stale name (an implementation no longer offered) is measured over, not used
    built.clear()
    c = Choices(store=_Store({repr(("conv", 3)): "gone"}))
    assert c.fastest_of(offered, (2,), ("conv", 3)) is _ident
    assert sorted(built) == ["a", "b"]


def test_an_empty_private_table_is_asked_not_the_shared_one():
    """``Choices`` has a length: an empty one is falsy, and still the table a chooser asks."""
    from ollie.exec.conv import best_conv
    from ollie.libs import onednn

    if not onednn.available():
        pytest.skip("torch built without oneDNN: a single implementation, nothing chosen")
    mine = Choices()
    # equal samples on a ticking fake clock: the measurement does not depend on the machine
    # (tests/conftest.py's QUIET settings also keep a spread from counting as load)
    with using(choices={"sentinel": "x"}, sleep=lambda s: None,
               measure_clock=FakeClock(tick=2.0 ** -10)):
        w = torch.randn(4, 3, 3, 3)
        best_conv("Conv2d", w, None, (1, 3, 8, 8), (1, 1), (1, 1), (1, 1), choices=mine)
        assert set(current().choices) == {"sentinel"}
    assert len(mine) == 1
