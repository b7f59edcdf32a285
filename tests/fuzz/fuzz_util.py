"""Fuzzing suite: generated inputs that must never crash Ollie (issue: safe to run).

Each fuzz test draws ``examples(default)`` cases: a bounded number in ``make test``, many
more in ``make fuzz`` (which sets ``OLLIE_FUZZ_EXAMPLES``). A "crash" is any exception that
is not an :class:`ollie.OllieError`; a "wrong output" is a result that differs from the
reference (eager PyTorch, ONNX Runtime or the reference interpreter).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES_ENV = "OLLIE_FUZZ_EXAMPLES"


def examples(default: int) -> int:
    """How many cases a fuzz test draws: ``default`` (bounded, for ``make test``) unless
    ``$OLLIE_FUZZ_EXAMPLES`` asks for more (``make fuzz``)."""
    env = os.environ.get(FUZZ_EXAMPLES_ENV)
    return max(default, int(env)) if env else default


def fuzz_settings(default: int, **kwargs: object) -> settings:
    """Hypothesis settings of a fuzz test drawing ``examples(default)`` cases, derandomized
    (the same cases on every run of ``make test``; ``make fuzz`` draws fresh ones)."""
    long_run = FUZZ_EXAMPLES_ENV in os.environ
    return settings(max_examples=examples(default), deadline=None, derandomize=not long_run,
                    suppress_health_check=list(HealthCheck), database=None, **kwargs)
