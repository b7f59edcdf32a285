"""Renaming tensors of kernels: a subprogram's kernels are found on canonical tensor names
(``x0, x1, ...``) and placed into the model's program under its real names, with the
subprogram's temporaries prefixed so that reused subprograms never clash."""

from __future__ import annotations

from collections.abc import Mapping

from ollie.ir import rename_expr
from ollie.program.kernel import Kernel


def rename_kernels(kernels: list[Kernel], inputs: Mapping[str, str], output: str,
                   new_output: str, prefix: str) -> list[Kernel]:
    """Kernels reading ``inputs[name]`` for each canonical input, writing ``new_output``
    instead of ``output``, every other tensor they produce prefixed with ``prefix``."""
    names = dict(inputs)
    for k in kernels:
        names.setdefault(k.output, new_output if k.output == output else f"{prefix}_{k.output}")
    out = []
    for k in kernels:
        out.append(Kernel(k.kind, dict(k.params), tuple(names.get(n, n) for n in k.inputs),
                          names[k.output],
                          None if k.expr is None else rename_expr(k.expr, names),
                          k.views, k.shape))
    return out
