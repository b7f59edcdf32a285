"""Fixtures wider than one test are set up on a quiet machine, like the tests themselves
(``tests/conftest.py``: ``pytest_fixture_setup``): a module's optimised model does not depend
on the machine's load when it was made."""

from __future__ import annotations

import pytest

from ollie.settings import current


@pytest.fixture(scope="module")
def load_at_setup() -> float:
    return current().load()


def test_module_fixtures_see_a_quiet_machine(load_at_setup):
    assert load_at_setup == 0.0
    assert current().load() == 0.0
