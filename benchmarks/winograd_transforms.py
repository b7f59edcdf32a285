"""The Winograd transform modules of this checkout's generator against those of another
revision's (``git show REV:src/ollie/kernels/winograd_codegen.py``), side by side: the seconds
numba takes to compile each module (every signature compiled ahead, each in a fresh process
with an empty directory, alternating), then, in one process, both generators' transforms on
the same arrays (outputs compared bit for bit, medians of alternating calls).

Usage: ``python benchmarks/winograd_transforms.py REV [ROUNDS]`` (default 2 compile rounds).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

GENERATOR = "src/ollie/kernels/winograd_codegen.py"
COMPILE_CASES = [("in", 4, 3, 64), ("out", 4, 3, 64), ("in", 2, 3, 64), ("out", 2, 3, 64),
                 ("in", 4, 5, 64)]
RUN_CASES = [(1, 64, 56, True), (1, 128, 28, True), (1, 256, 14, True), (8, 64, 56, True),
             (1, 64, 14, False), (1, 512, 7, True)]
"""``(batch, channels, size, channels-last)`` of a 3x3 convolution's transforms, F(4x4, 3x3)."""

CHILD = """
import importlib.util, sys, time
from ollie.codegen.cpu import configure_numba
configure_numba()
spec = importlib.util.spec_from_file_location("gen", sys.argv[1])
gen = importlib.util.module_from_spec(spec); spec.loader.exec_module(gen)
kind, m, r, cb = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
source = (gen._input_source if kind == "in" else gen._output_source)(m, r, cb, "bench")
path = sys.argv[6] + "/transform.py"
open(path, "w").write(source.replace("cache=True", "cache=False"))
spec = importlib.util.spec_from_file_location("transform", path)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
name, sigs = ("transform_input", gen.INPUT_SIGNATURES) if kind == "in" else \\
    ("transform_output", gen.OUTPUT_SIGNATURES)
start = time.perf_counter()
for sig in sigs:
    getattr(mod, name).compile(sig)
print(time.perf_counter() - start)
"""


def generator(path: Path, name: str) -> ModuleType:
    """The generator module at ``path``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_seconds(gen: Path, case: tuple[str, int, int, int]) -> float:
    """Seconds a fresh process takes to compile the module ``case`` of generator ``gen``."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", CHILD, str(gen), *map(str, case), tmp],
                              capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def transforms(gen: ModuleType, cb: int, tag: str, tmp: str) -> tuple[ModuleType, ModuleType]:
    """The F(4x4, 3x3) input and output transform modules of ``gen`` for block ``cb``."""
    mods = []
    for kind, make in (("in", gen._input_source), ("out", gen._output_source)):
        path = Path(tmp) / f"{tag}_{kind}_{cb}.py"
        path.write_text(make(4, 3, cb, tag).replace("cache=True", "cache=False"))
        mods.append(generator(path, path.stem))
    return mods[0], mods[1]


def run_side_by_side(gens: dict[str, ModuleType], tmp: str) -> None:
    """Both generators' transforms on each of :data:`RUN_CASES`, compared and timed."""
    import numba

    numba.set_num_threads(2)
    rng = np.random.default_rng(0)
    print("| input | input transform ms, before / now | output transform ms, before / now |")
    print("| --- | --- | --- |")
    for nb, c, size, cl in RUN_CASES:
        cb = gens["now"].block(c)
        mods = {tag: transforms(g, cb, tag, tmp) for tag, g in gens.items()}
        tiles = -(-size // 4)
        count = nb * tiles * tiles
        x = rng.random((nb, size, size, c), np.float32) if cl else \
            rng.random((nb, c, size, size), np.float32).transpose(0, 2, 3, 1)
        v = np.zeros((count, 1, 36 * cb), np.float32)
        prods = rng.random((count, 1, 36, c), np.float32)
        y = np.empty((nb, size, size, c), np.float32)
        args_in = (x, v, 0, count, np.array([[1, 1]], np.int64), 1, tiles, tiles,
                   max(1, count // 16))
        args_out = (prods, y, rng.random(c, np.float32), np.zeros((1, 1, 1, 1), np.float32), 1,
                    1, np.zeros(1, np.int64), size, size, 0, count, 1, tiles, tiles,
                    max(1, count // 16))
        outs = []
        for imod, omod in mods.values():
            imod.transform_input(*args_in)
            omod.transform_output(*args_out)
            outs.append((v.copy(), y.copy()))
        same = all(np.array_equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(30):
            for tag, (imod, omod) in mods.items():
                for kind, fn, args in (("in", imod.transform_input, args_in),
                                       ("out", omod.transform_output, args_out)):
                    start = time.perf_counter()
                    fn(*args)
                    times.setdefault((tag, kind), []).append(time.perf_counter() - start)
        ms = {k: statistics.median(t) * 1e3 for k, t in times.items()}
        print(f"| [{nb}, {c}, {size}, {size}] {'NHWC' if cl else 'NCHW'}"
              f"{'' if same else ' (OUTPUTS DIFFER)'} | {ms['before', 'in']:.3f} / "
              f"{ms['now', 'in']:.3f} | {ms['before', 'out']:.3f} / {ms['now', 'out']:.3f} |",
              flush=True)


def main() -> None:
    rev = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before_codegen.py"
        before.write_text(subprocess.run(["git", "show", f"{rev}:{GENERATOR}"], cwd=root,
                                         capture_output=True, text=True, check=True).stdout)
        paths = {"before": before, "now": root / GENERATOR}
        print(f"compile seconds per module, every signature (medians of {rounds}, "
              "alternating fresh processes)")
        print("| module | before | now |")
        print("| --- | --- | --- |")
        for case in COMPILE_CASES:
            secs: dict[str, list[float]] = {"before": [], "now": []}
            for _ in range(rounds):
                for tag, path in paths.items():
                    secs[tag].append(compile_seconds(path, case))
            kind, m, r, cb = case
            print(f"| {kind} F({m}, {r}) block {cb} | {statistics.median(secs['before']):.1f} | "
                  f"{statistics.median(secs['now']):.1f} |", flush=True)
        gens = {tag: generator(path, f"gen_{tag}") for tag, path in paths.items()}
        run_side_by_side(gens, tmp)


if __name__ == "__main__":
    main()
