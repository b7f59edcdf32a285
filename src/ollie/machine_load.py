"""How busy other processes keep the machine: :func:`others_load`, the default of
:attr:`ollie.settings.Settings.load`.

A measured choice made while another job shares the cores is measured again before it is
kept (:func:`ollie.tune.decide.busy`). The one-minute load average counts this process's
own threads too, and lags by a minute: right after Ollie (or the framework it is called
from: a torch.compile, an eager warm-up) kept every core busy, the machine looks busy for
a minute although nothing else runs, and every choice is measured twice and not cached.
:func:`others_load` instead counts the CPU time the whole machine spent (``/proc/stat``)
less what this process and the children it waited for spent (:func:`os.times`), over the
last few seconds. Where ``/proc/stat`` cannot be read it falls back to the load average.
Why: docs/design/031-warm-optimisation.md.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

MIN_WINDOW = 0.5
"""Seconds a window of :func:`others_load` spans at least (``/proc/stat`` counts in ticks of
10 ms); a call sooner after the first sample reads the load average."""

MAX_AGE = 10.0
"""Samples older than this are dropped (but for the newest one old enough to be a base)."""

Sample = tuple[float, float, float]
"""(monotonic seconds, CPU seconds of the whole machine, CPU seconds of this process)."""



def load_average() -> float:
    """The one-minute load average, 0.0 where the system has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def cpu_sample(stat: str = "/proc/stat") -> Sample | None:
    """Now: the machine's busy CPU seconds (user, nice, system, irq, softirq, steal of
    ``stat``'s ``cpu`` line) and this process's (with the children it waited for); None when
    ``stat`` cannot be read or parsed."""
    try:
        with open(stat, encoding="ascii") as f:
            fields = f.readline().split()
        ticks = [int(v) for v in fields[1:9]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if fields[:1] != ["cpu"] or len(ticks) < 8 or hz <= 0:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    t = os.times()
    return (time.monotonic(), (user + nice + system + irq + softirq + steal) / hz,
            t.user + t.system + t.children_user + t.children_system)


class LoadMeter:
    """:func:`others_load` over the samples ``sample`` takes (default :func:`cpu_sample`; a test
    passes its own): call it for the cores other processes kept busy, on average since the
    newest sample at least :data:`MIN_WINDOW` old (every call takes one; :meth:`prime` takes
    a first); the load average when there is no such sample or none can be taken."""

    def __init__(self, sample: Callable[[], Sample | None] = cpu_sample) -> None:
        self.sample = sample
        self.samples: deque[Sample] = deque()
        self.lock = threading.Lock()

    def prime(self) -> None:
        """Take a first sample (the base of the first call's window)."""
        first = self.sample()
        if first is not None:
            with self.lock:
                self.samples.append(first)

    def __call__(self) -> float:
        now = self.sample()
        if now is None:
            return load_average()
        with self.lock:
            base = next((s for s in reversed(self.samples) if now[0] - s[0] >= MIN_WINDOW),
                        None)
            while self.samples and now[0] - self.samples[0][0] > MAX_AGE and \
                    self.samples[0] is not base:
                self.samples.popleft()
            if not self.samples or now[0] - self.samples[-1][0] >= MIN_WINDOW / 2:
                self.samples.append(now)
        if base is None:
            return load_average()
        return max(0.0, ((now[1] - base[1]) - (now[2] - base[2])) / (now[0] - base[0]))


_METER = LoadMeter()
_METER.prime()  # the first call's window starts when Ollie is imported


def others_load() -> float:
    """Cores kept busy by other processes over the last seconds (:class:`LoadMeter` on
    ``/proc/stat``): the default :attr:`ollie.settings.Settings.load`."""
    return _METER()


__all__ = ["MAX_AGE", "MIN_WINDOW", "LoadMeter", "Sample", "cpu_sample", "load_average",
           "others_load"]
