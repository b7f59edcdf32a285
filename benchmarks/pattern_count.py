"""Distinct numba functions the kernel modules of a cache directory compile to, with sizes as
literals (one function per text, as before ``ollie.codegen.pattern``) and with outer sizes as
arguments (one per pattern): the same kernels, so the figure does not depend on which
candidates a time-bounded search happened to build. Each module's text is checked to be the
pattern form this tree generates for its expression.

Usage: ``python benchmarks/pattern_count.py KERNEL_DIR`` (e.g. ``$OLLIE_CACHE_DIR/kernels``
after an optimisation with this tree).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from ollie.codegen.cpu import generate_source
from ollie.codegen.nests import split_module
from ollie.ir import parse


def main(argv: list[str]) -> None:
    literal: set[str] = set()
    pattern: set[str] = set()
    modules = 0
    for path in sorted(Path(argv[0]).glob("ollie_*.py")):
        text = path.read_text()
        doc = text.split('"""')[1].splitlines()
        form = "scatter" if "scatter form" in doc[0] else "gather"
        expr = parse("\n".join(line[4:] for line in doc[2:]))
        canonical = next(ast.literal_eval(line[len("CANONICAL = "):])
                         for line in text.splitlines() if line.startswith("CANONICAL = "))
        if generate_source(expr, canonical, form) != text:
            print(f"skipped {path.name}: not this tree's pattern form")
            continue
        modules += 1
        for source, functions in ((generate_source(expr, canonical, form, literal_sizes=True),
                                   literal), (text, pattern)):
            split = split_module(source)
            functions.update(split.nests.values() if split is not None else [source])
    print(f"{modules} kernel modules: {len(literal)} distinct functions with literal sizes, "
          f"{len(pattern)} with outer sizes as arguments")


if __name__ == "__main__":
    main(sys.argv[1:])
