"""Fake clocks for tests: time that moves only as the test says, so that what a time budget or
a measurement allows depends on the code alone, not on how fast or how busy the machine is.

They plug into every time source Ollie reads: :attr:`ollie.search.SearchConfig.clock`
(``ollie.derive(..., clock=...)``), the ``clock=`` of :func:`ollie.tune.measure.measure`,
:func:`ollie.tune.measure.measure_alternating` and :func:`ollie.optimizer.select.select`, and
the settings' ``search_clock`` / ``measure_clock`` for every search or measurement that is not
given one (``with ollie.settings.using(search_clock=stopped_clock): ...``).
"""

from __future__ import annotations

from collections.abc import Callable


def stopped_clock() -> float:
    """A clock that never advances: a search's time budget is never spent (it is bounded by
    its depth, its states and its candidates alone), every measured time is 0."""
    return 0.0


class FakeClock:
    """A clock that reads ``now`` seconds. Each reading then moves it on by ``tick`` (0: it
    moves only by :meth:`advance`); ``readings`` counts the readings.

    Sums of binary fractions (``2**-10``, ``3 * 2**-12``, ...) are exact in floating point:
    pick ticks and costs so when a test compares computed times exactly."""

    def __init__(self, tick: float = 0.0, start: float = 0.0) -> None:
        self.tick = tick
        self.now = start
        self.readings = 0

    def __call__(self) -> float:
        """The current time; then the clock moves on by ``tick``."""
        t = self.now
        self.now += self.tick
        self.readings += 1
        return t

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (what a piece of work "takes")."""
        self.now += seconds

    def costing(self, seconds: float, fn: Callable[[], object] | None = None
                ) -> Callable[[], object]:
        """A function that calls ``fn`` (if any) and then advances the clock by ``seconds``:
        it takes exactly that long on this clock."""

        def call() -> object:
            out = fn() if fn is not None else None
            self.advance(seconds)
            return out

        return call
