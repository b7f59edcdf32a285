"""Generated selective adds (transposed-convolution sums): residue-split against clamped, and
tanh applied in a pass of its own against fused, timed side by side in one process.

Usage::

    .venv/bin/python benchmarks/selective_add.py [--rounds 15]

Cases: ``Sum<y, x> T[n, c, h - 2*y + 1, w - 2*x + 1, y, x]`` (a 4x4 stride-2 transposed
convolution's taps summed), the taps read taps-major (``[n, c, 4, 4, y, x]``, NCHW from the
Matmul) or channels-last (``[n, y, x, c, 4, 4]``, a oneDNN 1x1 convolution's NHWC output),
for the output sizes of ``--cases``. ``clamped`` turns residue splitting off
(``residue.MAX_RESIDUE_NESTS = 1``), ``split`` is the default; ``warm`` times back-to-back
calls (median of interleaved rounds), ``cold`` one call after reading 64 MB (median of
``--rounds`` calls). Then DCGAN b16's last eOperator, ``tanh`` of the [16,3,64,64] sum over
NHWC taps, with tanh fused into the residue nests (``emit.SEPARATE_POSTS = ()``) and as the
flat pass (the default); their outputs must agree bit for bit. Each variant is compiled into a
directory of its own (kernels are cached by expression, not by generator setting).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ollie.codegen import emit, residue
from ollie.codegen.cpu import clear_memory_cache, compile_cpu
from ollie.tune.measure import measure_alternating

CASES = ((64, 28), (3, 64), (128, 16), (32, 128), (16, 224))
"""(channels, output size) of the [16, C, H, H] selective adds."""


def _texts(c: int, h: int) -> dict[str, str]:
    y = h // 2
    it = f"L<n=0:16, c=0:{c}, h=0:{h}, w=0:{h}> Sum<y=0:{y}, x=0:{y}>"
    return {"NCHW": f"T: [16, {c}, 4, 4, {y}, {y}]\n{it} T[n, c, h - 2*y + 1, w - 2*x + 1, y, x]",
            "NHWC": f"T: [16, {y}, {y}, {c}, 4, 4]\n{it} T[n, y, x, c, h - 2*y + 1, w - 2*x + 1]"}


def _compile(text: str, tmp: Path, label: str, **patch: object) -> Callable:
    """``text`` compiled with module attributes ``patch`` set (``residue__X=``, ``emit__X=``)
    for the compilation; ``compile_cpu`` picks the gather or scatter form as usual."""
    modules = {"residue": residue, "emit": emit}
    saved = {}
    for key, value in patch.items():
        mod, attr = key.split("__")
        saved[key] = getattr(modules[mod], attr)
        setattr(modules[mod], attr, value)
    try:
        clear_memory_cache()
        return compile_cpu(text, cache_dir=tmp / label)
    finally:
        for key, value in saved.items():
            mod, attr = key.split("__")
            setattr(modules[mod], attr, value)
        clear_memory_cache()


def _cold(fn: Callable[[], object], rounds: int) -> float:
    big = np.ones(64 << 20, np.uint8)
    times = []
    for _ in range(rounds):
        big.sum()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="ollie-selective-add-") as d:
        tmp = Path(d)
        print("| output | taps | clamped warm ms | split warm ms | clamped cold ms | "
              "split cold ms |")
        print("|---|---|---:|---:|---:|---:|")
        for c, h in CASES:
            for layout, text in _texts(c, h).items():
                shape = [int(v) for v in text.split("]")[0].split("[")[1].split(",")]
                x = rng.standard_normal(shape, dtype=np.float32)
                out = np.empty((16, c, h, h), np.float32)
                kernels = {"clamped": _compile(text, tmp, f"c{c}{h}{layout}",
                                               residue__MAX_RESIDUE_NESTS=1),
                           "split": _compile(text, tmp, f"s{c}{h}{layout}")}
                fns = {k: (lambda f=f, x=x, out=out: f({"T": x}, out=out))
                       for k, f in kernels.items()}
                a, b = kernels["clamped"]({"T": x}), kernels["split"]({"T": x})
                assert np.allclose(a, b, rtol=1e-5, atol=1e-5), (c, h, layout)
                warm = measure_alternating(fns, "cpu", rounds=args.rounds, min_sample=0.02)
                cold = {k: _cold(f, args.rounds) for k, f in fns.items()}
                print(f"| [16,{c},{h},{h}] | {layout} | {warm['clamped'] * 1e3:.3f} | "
                      f"{warm['split'] * 1e3:.3f} | {cold['clamped'] * 1e3:.3f} | "
                      f"{cold['split'] * 1e3:.3f} |", flush=True)
        text = _texts(3, 64)["NHWC"]
        head, body = text.split("\n")
        loops, summed = body.split(" Sum")
        tanh = f"{head}\n{loops} tanh({{ {loops} Sum{summed} }}[n, c, h, w])"
        x = rng.standard_normal([16, 32, 32, 3, 4, 4], dtype=np.float32)
        outs = {k: np.empty((16, 3, 64, 64), np.float32) for k in ("fused", "pass")}
        kernels = {"fused": _compile(tanh, tmp, "tanh_fused", emit__SEPARATE_POSTS=()),
                   "pass": _compile(tanh, tmp, "tanh_pass")}
        fns = {k: (lambda f=f, o=outs[k]: f({"T": x}, out=o)) for k, f in kernels.items()}
        for f in fns.values():
            f()
        same = np.array_equal(outs["fused"], outs["pass"], equal_nan=True)
        warm = measure_alternating(fns, "cpu", rounds=args.rounds, min_sample=0.02)
        print(f"\ntanh of the [16,3,64,64] NHWC selective add: fused {warm['fused'] * 1e3:.3f} ms, "
              f"as a pass {warm['pass'] * 1e3:.3f} ms; bit-identical: {same}")


if __name__ == "__main__":
    main()
