"""Keep every CPU core busy until stopped: one busy-looping process per core.

    python tools/cpu_hog.py [--procs N]

Starts ``N`` (default: the cores this process may run on) child processes that spin in a pure
Python loop at normal priority, prints ``ready <N>`` once they are started, and runs until it
receives SIGTERM or SIGINT (or its parent exits); then it kills its children and waits for
them. Used by ``make test-load`` (the whole suite on a loaded machine) and by the test suite's
``cpu_hog`` fixture (tests/conftest.py: the tests marked ``timing`` run with it).

No orphans: each child exits on its own when this process is gone (Linux: it is sent SIGKILL
when its parent dies; elsewhere it polls its parent id), and this process stops likewise when
its own parent dies, so even a killed test run leaves no spinning process behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import os, signal, sys
parent = int(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which kills us
try:  # Linux: SIGKILL as soon as the parent dies
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
n = 0
while True:
    n += 1
    if n % 200000 == 0 and os.getppid() != parent:  # the parent is gone: stop
        break
"""


def cores() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _die_with_parent() -> None:
    """Linux: receive SIGTERM when the parent process dies (a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run(procs: int) -> int:
    """Spin ``procs`` children until SIGTERM / SIGINT or the parent's exit; 0 on a clean stop."""
    parent = os.getppid()
    _die_with_parent()
    stop = {"now": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    children = [subprocess.Popen([sys.executable, "-S", "-c", CHILD, str(os.getpid())],
                                 stdin=subprocess.DEVNULL)
                for _ in range(procs)]
    try:
        print(f"ready {procs}", flush=True)
        while not stop["now"] and os.getppid() == parent:
            time.sleep(0.05)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        for child in children:
            child.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=cores(),
                   help="busy processes to start (default: one per core, %(default)s here)")
    args = p.parse_args(argv)
    return run(max(1, args.procs))


if __name__ == "__main__":
    sys.exit(main())
