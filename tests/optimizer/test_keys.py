"""Decisions and keys as values: their one textual or JSON form, read back where it is."""

from __future__ import annotations

from ollie.optimizer.keys import SubprogramKey
from ollie.optimizer.libraries import PER_OPERATOR, REGIONS, LibraryDecision, alternative_of


def test_library_decisions_round_trip_through_their_json():
    for d in (LibraryDecision(REGIONS), LibraryDecision(PER_OPERATOR, "original operators")):
        assert LibraryDecision.from_json(d.to_json()) == d
    assert LibraryDecision(PER_OPERATOR, "original operators").name == \
        "original operators: per operator"
    assert alternative_of(LibraryDecision(REGIONS)) is None and alternative_of(None) is None
    # an entry of another form (the old text) or malformed: not a decision (timed again)
    for doc in (None, "original operators: per operator", "[]", '{"choice": 3}'):
        assert LibraryDecision.from_json(doc) is None


def test_subprogram_keys_and_their_alternatives():
    key = SubprogramKey("fp", frozenset({"x1", "x0"}))
    assert key.text == "fp|cl:x0,x1" and SubprogramKey("fp").text == "fp"
    alt = key.with_alternative(2)
    assert alt.text == "fp|cl:x0,x1|alternative2" and alt.base == key and key.base == key
