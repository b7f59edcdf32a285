"""Fixtures of the optimiser's tests: ``fast_backend``, the torch.compile backend with a
small search and a fresh dynamo around the test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from ollie.optimizer import backend

FAST_BACKEND = {"time_budget": 0.5, "max_depth": 1, "context": False, "settle": 0.0,
                "choose_libraries": False, "max_candidates": 2, "use_cache": False}
"""The backend's settings in these tests: a search that ends in a fraction of a second."""


@pytest.fixture
def fast_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The backend with :data:`FAST_BACKEND`, dynamo reset before and after the test."""
    torch._dynamo.reset()
    monkeypatch.setattr(backend, "BACKEND_CONFIG",
                        replace(backend.BACKEND_CONFIG, **FAST_BACKEND))
    yield
    torch._dynamo.reset()
