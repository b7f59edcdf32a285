"""Warm run time of generated CPU kernels with their sizes as literals (compiled per shape)
against sizes as arguments (``ollie.codegen.pattern``, compiled per pattern): both module
texts of one expression and form, imported in one process, one input and output buffer, timed
alternately (min over 7 alternations, order swapped each time, of 5 repeats of about 2 ms of
calls). Prints, per kernel and form, both times, the ratio argument / literal and whether the
outputs are bit-identical.

Usage: ``python benchmarks/pattern_warm.py [NAME ...]`` (default: every kernel of
:data:`KERNELS`).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

from kernel_pair import time_pair

from ollie.codegen.cpu import configure_numba, generate_source, source_forms
from ollie.ir import parse

KERNELS = {
    "offset-add-3x3": "A: [1, 64, 32, 32]\nL<n=0:1, c=0:64, h=0:32, w=0:32> "
                      "Sum<r=0:3, s=0:3> A[n, c, h + r - 1, w + s - 1]",
    "offset-add-3x3-b16": "T: [16, 64, 14, 14, 3, 3]\nL<n=0:16, f=0:64, h=0:14, w=0:14> "
                          "Sum<r=0:3, s=0:3> T[n, f, h + r - 1, w + s - 1, r, s]",
    "bias-relu-nhwc": "A: [1, 56, 56, 64]\nB: [64]\nL<n=0:1, c=0:64, h=0:56, w=0:56> "
                      "relu(A[n, h, w, c] + B[c])",
    "bias-relu-small": "A: [1, 16, 8, 8]\nB: [16]\nL<n=0:1, c=0:16, h=0:8, w=0:8> "
                       "relu(A[n, c, h, w] + B[c])",
    "elementwise-7x7": "A: [1, 128, 7, 7]\nB: [128]\nL<n=0:1, c=0:128, h=0:7, w=0:7> "
                       "relu(A[n, c, h, w] * B[c] + B[c])",
    "elementwise-14x14": "A: [1, 128, 14, 14]\nB: [128]\nL<n=0:1, c=0:128, h=0:14, w=0:14> "
                         "relu(A[n, c, h, w] * B[c] + B[c])",
    "avgpool-2x2": "A: [1, 64, 32, 32]\nL<n=0:1, c=0:64, h=0:16, w=0:16> "
                   "Sum<y=0:2, x=0:2> A[n, c, 2*h + y, 2*w + x] * 0.25",
    "transposed-selective-add": "Y: [1, 3, 3, 64, 16, 16]\nL<n=0:1, c=0:64, h=0:32, w=0:32> "
                                "Sum<y=0:3, x=0:3> Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]",
    "split-divmod": "B: [4, 8, 96, 40]\nL<b=0:4, i=0:768, d=0:40> B[b, i % 8, i / 8, d]",
    "transpose": "A: [512, 256]\nL<i=0:256, j=0:512> A[j, i]",
    "channel-sum-64": "A: [1, 64, 16, 16]\nW: [32, 64]\nL<n=0:1, f=0:32, h=0:16, w=0:16> "
                      "Sum<c=0:64> A[n, c, h, w] * W[f, c]",
    "channel-sum-16": "A: [1, 16, 16, 16]\nW: [32, 16]\nL<n=0:1, f=0:32, h=0:16, w=0:16> "
                      "Sum<c=0:16> A[n, c, h, w] * W[f, c]",
    "channel-sum-256-nhwc": "A: [1, 8, 8, 256]\nW: [64, 256]\nL<n=0:1, f=0:64, h=0:8, w=0:8> "
                            "Sum<c=0:256> A[n, h, w, c] * W[f, c]",
}
"""Kernels of the shapes a small CNN's programs hold."""


def _load(text: str, path: Path):
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(name: str, form: str, tmp: Path) -> str:
    """One kernel form compiled both ways and timed; a line of results."""
    expr = parse(KERNELS[name])
    literal = _load(generate_source(expr, form=form, literal_sizes=True),
                    tmp / f"lit_{name.replace('-', '_')}_{form}.py")
    argument = _load(generate_source(expr, form=form),
                     tmp / f"arg_{name.replace('-', '_')}_{form}.py")
    best, same = time_pair(expr, ("literal", literal), ("argument", argument))
    return (f"| {name} | {form} | {list(expr.shape)} | {best['literal'] * 1e6:.1f} | "
            f"{best['argument'] * 1e6:.1f} | {best['argument'] / best['literal']:.3f} | "
            f"{same} |")


def main(argv: list[str]) -> None:
    configure_numba()
    names = argv or list(KERNELS)
    print("| kernel | form | output | literal us | argument us | ratio | bit-identical |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="ollie-pattern-") as tmp:
        for name in names:
            for form in source_forms(parse(KERNELS[name])):
                print(compare(name, form, Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
