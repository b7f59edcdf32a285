"""ONNX Runtime regions of a model's program with derivation off, and that program per
operator against its regions variant (five alternating calls each):
``python benchmarks/regions_probe.py SPEC`` (``tv:NAME``, ``hf:NAME``)."""

from __future__ import annotations

import collections
import statistics
import sys
import time

import torch

import ollie
from ollie.backends.onnxrt import region as ort_region
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.libraries import REGIONS, variant
from ollie.zoo.external import build


def main(spec: str) -> None:
    m, inputs = build(spec)
    prog = ollie.optimize(m, inputs, derivation=False, total_budget=None, context=False,
                          choose_libraries=False).program
    marked = variant(prog, REGIONS)
    groups = ort_region.groups(marked) if marked is not None else []
    inside = {i for s, e in groups for i in range(s, e)}
    print(spec, "kernels", len(prog.kernels), "regions", len(groups), "outside",
          len(prog.kernels) - len(inside))
    outside: collections.Counter = collections.Counter()
    for i, k in enumerate(prog.kernels):
        if i not in inside:
            node = getattr(k.params, "node", None)
            outside[(k.kind.name, "") if node is None else
                    (node.op, node.attrs.get("op_type"))] += 1
    print(outside.most_common(8))
    if marked is None:
        return
    fns = (CompiledProgram(prog), CompiledProgram(marked))
    with torch.no_grad():
        want = m(*inputs)
        got = fns[1](*inputs)
        print("rel err", float((got - want).norm() / want.norm()))
    for f in fns:
        f(*inputs)
    times: list[list[float]] = [[], []]
    for _ in range(5):
        for j, f in enumerate(fns):
            t = time.perf_counter()
            f(*inputs)
            times[j].append(time.perf_counter() - t)
    print(f"per operator {statistics.median(times[0]) * 1e3:.2f} ms, "
          f"regions {statistics.median(times[1]) * 1e3:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
