"""Test-suite wide settings: GPU tests skip without CUDA; hypothesis profiles.

Hypothesis profile "ci" (deterministic, 50 examples, no deadline) is the default;
set ``HYPOTHESIS_PROFILE=dev`` for 200 examples per property.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", deadline=None, max_examples=50, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is available."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip_gpu)
