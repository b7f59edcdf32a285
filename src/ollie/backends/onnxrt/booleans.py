"""Boolean and integer tensors of a program and ONNX Runtime regions: a region binds float32
inputs and outputs only (:class:`ollie.backends.onnxrt.region.Region`), so a mask an opaque
operator casts to booleans (DeBERTa's, :mod:`ollie.backends.onnxrt.opaque`) is produced and
read within one region, or outside every region."""

from __future__ import annotations

from collections.abc import Sequence

from ollie.graph.ir import OPAQUE
from ollie.program.params import NodeParams
from ollie.program.program import Program


def booleans(prog: Program) -> frozenset[str]:
    """The results of ``prog``'s opaque operators that are not floating-point tensors
    (booleans, integers)."""
    return frozenset(
        k.output for k in prog.kernels if isinstance(k.params, NodeParams) and
        k.params.node.op == OPAQUE and not all(
            str(d).startswith("float")
            for d in k.params.node.attrs.get("output_dtypes", ("float32",))))


def _runs(flags: Sequence[bool]) -> list[int | None]:
    """The run (its first kernel) each flagged kernel belongs to, None for the others."""
    out: list[int | None] = []
    start = None
    for i, ok in enumerate(flags):
        start = (i if start is None else start) if ok else None
        out.append(start)
    return out


def confined(prog: Program, flags: list[bool], found: frozenset[str] | None = None
             ) -> list[bool]:
    """``flags`` with a non-floating-point result (:func:`booleans`) kept inside one run: a
    region binds float32 inputs and outputs only, so where such a tensor's producer or one of
    its readers is outside the run of the others (or it is a program output), none of them
    is in a region (repeated until no flag changes). ``found``: :func:`booleans` of ``prog``
    where the caller has it."""
    flags = list(flags)
    found = booleans(prog) if found is None else found
    producer = {k.output: i for i, k in enumerate(prog.kernels)}
    readers = {t: [i for i, k in enumerate(prog.kernels) if t in k.inputs] for t in found}
    changed = True
    while changed:
        changed = False
        run = _runs(flags)
        for t in found:
            group = [producer[t], *readers[t]]
            if any(flags[i] for i in group) and (
                    t in prog.outputs or any(run[i] != run[producer[t]] for i in group)):
                for i in group:
                    changed |= flags[i]
                    flags[i] = False
    return flags


__all__ = ["booleans", "confined"]
