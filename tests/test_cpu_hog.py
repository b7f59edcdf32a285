"""``tools/cpu_hog.py`` (behind the ``cpu_hog`` fixture and ``make test-load``): one busy
process per core while it runs, none left after it stops, even when it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CPU_HOG = Path(__file__).resolve().parent.parent / "tools" / "cpu_hog.py"

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="reads child processes from Linux's /proc")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cpu_ticks(pid: int) -> int:
    """User + system clock ticks ``pid`` has run."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _start(procs: int) -> tuple[subprocess.Popen, list[int]]:
    hog = subprocess.Popen([sys.executable, str(CPU_HOG), "--procs", str(procs)],
                           stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert hog.stdout is not None and hog.stdout.readline().split() == ["ready", str(procs)]
    children = _children(hog.pid)
    assert len(children) == procs
    return hog, children


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within  # a bound on waiting only: nothing is timed
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_cpu_hog_spins_one_process_per_core_and_stops_them():
    hog, children = _start(2)
    try:
        before = [_cpu_ticks(c) for c in children]
        while not all(_cpu_ticks(c) > b for c, b in zip(children, before, strict=True)):
            time.sleep(0.01)  # each child runs (a test would time out if one never did)
        assert all(_alive(c) for c in children)
    finally:
        hog.send_signal(signal.SIGTERM)
        assert hog.wait(timeout=10) == 0
        hog.stdout.close()
    assert _gone(children)


def test_cpu_hog_children_exit_when_it_is_killed():
    """No orphans: killed without a chance to clean up, its children stop by themselves."""
    hog, children = _start(1)
    hog.kill()
    hog.wait()
    hog.stdout.close()
    assert _gone(children)


def test_the_fixture_runs_one_busy_process_per_core(cpu_hog):
    assert cpu_hog == len(os.sched_getaffinity(0))
