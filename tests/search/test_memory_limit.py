"""A candidate whose tensors exceed the search's memory limit is dropped before it runs: its
verification would run eOperators at full size through the float64 interpreter (on the 2-core
VM, deriving CSRNet's dilated convolution at batch 16 without the limit was killed by the
kernel's OOM killer at 24 GB resident)."""

import importlib
import math

import pytest

import ollie
from ollie.bench.cases import CASES
from ollie.search.config import SearchConfig
from ollie.testing.clock import stopped_clock

derive_module = importlib.import_module("ollie.search.derive")


def _largest(cand) -> int:
    return max(4 * math.prod(k.output_shape) for k in cand.kernels)


@pytest.mark.timing
def test_candidates_over_the_tensor_limit_are_dropped_without_running(monkeypatch):
    expr = ollie.parse(CASES["conv3x3"].small)
    # a stopped clock: both searches run to their depth and find the same programs, however
    # busy the machine (two guided steps per scope: a search to its end in seconds)
    common = {"max_depth": 2, "guided_depth": 2, "time_budget": 60.0, "max_candidates": 16,
              "clock": stopped_clock}
    assert SearchConfig().max_tensor_bytes is None  # default: a share of physical memory
    free = ollie.derive(expr, **common)  # the default drops none of these small programs
    sizes = sorted({_largest(c) for c in free.candidates})
    assert len(sizes) >= 2 and free.stats["too_large"] == 0
    limit = sizes[0]  # only the candidates with the smallest largest tensor fit
    ran = []
    real = derive_module.verify_candidate

    def spy(cand, *args, **kwargs):
        ran.append(cand)
        return real(cand, *args, **kwargs)

    monkeypatch.setattr(derive_module, "verify_candidate", spy)
    capped = ollie.derive(expr, max_tensor_bytes=limit, **common)
    assert capped.candidates and capped.stats["too_large"] > 0
    assert all(_largest(c) <= limit for c in capped.candidates)
    assert ran and all(_largest(c) <= limit for c in ran)  # the others never ran
