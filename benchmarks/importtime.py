"""Start-up cost: ``import torch``, ``import ollie`` and ``ollie --help`` as fresh processes,
alternating, medians of N; then ``torch.compile(model, backend="ollie")`` in a fresh process
that calls nothing else first, compared with eager.

Usage: ``python benchmarks/importtime.py [PYTHON] [N]`` (default: this interpreter, 5 rounds).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

BACKEND = """
import torch
m = torch.nn.Linear(4, 4).eval()
c = torch.compile(m, backend="ollie")
x = torch.ones(2, 4)
with torch.no_grad():
    print(float((c(x) - m(x)).abs().max()))
"""


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Seconds ``cmd`` took as a fresh process, and its result."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> None:
    py = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    cmds = {"import torch": [py, "-c", "import torch"],
            "import ollie": [py, "-c", "import ollie"],
            "ollie --help": [py, "-m", "ollie", "--help"]}
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(rounds):
        for name, cmd in cmds.items():
            secs, done = timed(cmd)
            if done.returncode:
                sys.exit(f"{name} failed: {done.stderr[-500:]}")
            times[name].append(secs)
    base = statistics.median(times["import torch"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name}: median {med:.2f} s of {len(values)} ({med / base:.2f}x import torch)")
    secs, done = timed([py, "-c", BACKEND])
    if done.returncode:
        sys.exit(f"torch.compile(backend='ollie') failed: {done.stderr[-500:]}")
    print(f"torch.compile(backend='ollie'): {secs:.2f} s, max abs diff to eager "
          f"{done.stdout.strip()}")


if __name__ == "__main__":
    main()
