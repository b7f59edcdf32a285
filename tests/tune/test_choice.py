"""The choice object (ollie.tune.choice): one table per Choices, read and written only through
it; the choosers ask the one they are given, else the table of the settings in effect."""

from __future__ import annotations

import torch

from ollie.settings import current, using
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


def test_fastest_of_builds_the_remembered_choice_only():
    built: list[str] = []

    def builder(name: str):
        def build():
            built.append(name)
            return _ident
        return build

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
