"""Warm run time of generated CPU kernel modules imported whole (their numba functions in the
module) against split into nest modules (``ollie.codegen.nests``, as ``ollie.codegen.cache``
imports them): the same text, one process, one input and output buffer, timed alternately
(min over 7 alternations, order swapped each time, of 5 repeats of about 2 ms of calls).
Prints the ratio split / whole per kernel and whether the outputs are bit-identical.

Usage: ``python benchmarks/nest_split_warm.py KERNEL_DIR [N]``: the N largest
``ollie_*.py`` kernel modules of ``KERNEL_DIR`` (e.g. ``$OLLIE_CACHE_DIR/kernels``), default 10.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

from kernel_pair import time_pair

from ollie.codegen.cache import load_path
from ollie.ir import parse


def _whole(path: Path):
    spec = importlib.util.spec_from_file_location(f"whole_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(kernel: Path, tmp: Path) -> str:
    """One kernel module imported both ways and timed; a line of results."""
    text = kernel.read_text()
    (tmp / "whole").mkdir(exist_ok=True)
    (tmp / "split").mkdir(exist_ok=True)
    whole_path, split_path = tmp / "whole" / f"w{kernel.name}", tmp / "split" / kernel.name
    whole_path.write_text(text)
    split_path.write_text(text)
    whole, split = _whole(whole_path), load_path(split_path, tmp)
    expr = parse("\n".join(ln[4:] for ln in text.split('"""')[1].splitlines()[2:]))
    best, same = time_pair(expr, ("whole", whole), ("split", split))
    return (f"{kernel.name[:22]} out={list(expr.shape)} whole {best['whole'] * 1e6:.1f} us "
            f"split {best['split'] * 1e6:.1f} us ratio {best['split'] / best['whole']:.3f} "
            f"bit-identical={same}")


def main(argv: list[str]) -> None:
    n = int(argv[1]) if len(argv) > 1 else 10
    kernels = sorted(Path(argv[0]).glob("ollie_*.py"), key=lambda p: -p.stat().st_size)[:n]
    with tempfile.TemporaryDirectory(prefix="ollie-split-") as tmp:
        for kernel in kernels:
            if "CANONICAL = " in kernel.read_text():
                print(compare(kernel, Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
