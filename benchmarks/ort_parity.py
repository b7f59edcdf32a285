"""Ollie's program against ONNX Runtime on the whole model, where the program is one ONNX
Runtime region: the graph each session runs after ONNX Runtime's own optimisations, and
repeated alternating timings of the two.

    python benchmarks/ort_parity.py SPEC [REPEATS [BATCH]]

``SPEC``: a model of ``ollie bench models`` (``tv:efficientnet_b0``, ...) at batch ``BATCH``
(default 1), optimised with the default settings into ``OLLIE_CACHE_DIR`` (warm: the stored
program). Prints whether the program runs as one region, the operator counts of both graphs
before and after ONNX Runtime's graph optimisations (the benchmark's peer runs
``ollie.frontend.to_onnx_model``'s export; the region's graph is captured where its session is
made), then ``REPEATS`` (default 10) timings as ``ollie bench models`` times a model (15
alternating rounds, each after the cores went idle) and the median ratio. A model whose two
optimised graphs agree runs the same kernels in both: what one timing shows between them is
the machine's noise.
"""

from __future__ import annotations

import collections
import statistics
import sys
import tempfile
from pathlib import Path


def _optimised_ops(model: object) -> collections.Counter:
    """Operator counts of ``model`` (an ONNX ModelProto) after ONNX Runtime's optimisations."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(Path(tmp) / "optimised.onnx")
        so.log_severity_level = 3  # its warning that the file is specific to this CPU
        ort.InferenceSession(model.SerializeToString(), so,  # type: ignore[attr-defined]
                             providers=["CPUExecutionProvider"])
        done = onnx.load(so.optimized_model_filepath)
    return collections.Counter(n.op_type for n in done.graph.node)


def _as_model(graph: object, weights: dict) -> object:
    """The captured region ``graph`` with its external ``weights`` inlined, as a model."""
    import numpy as np
    from onnx import GraphProto, helper, numpy_helper

    g = GraphProto()
    g.CopyFrom(graph)  # type: ignore[arg-type]
    kept = [i for i in g.initializer if i.name not in weights]
    del g.initializer[:]
    g.initializer.extend(kept + [numpy_helper.from_array(np.ascontiguousarray(v, np.float32), n)
                                 for n, v in weights.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2, 3):
        print(__doc__)
        return 2
    import torch

    import ollie
    import ollie.libs.ort_conv as ort_conv
    from ollie.bench.baselines import ort_session
    from ollie.bench.models import build
    from ollie.exec.executor import CompiledProgram
    from ollie.frontend import to_onnx_model
    from ollie.tune.measure import SETTLE_SECONDS, measure_alternating, settled_lead

    captured: list[tuple[object, dict]] = []
    make_session = ort_conv.session

    def capture(graph, spinning=False, weights=None):  # type: ignore[no-untyped-def]
        captured.append((graph, dict(weights or {})))
        return make_session(graph, spinning, weights)

    ort_conv.session = capture
    module, inputs = build(argv[0], int(argv[2]) if len(argv) == 3 else 1)
    prog = ollie.optimize(module, inputs)
    print(prog.notes[-2][-110:])
    captured.clear()
    compiled = CompiledProgram(prog.program)  # its sessions made again, captured
    print(f"{argv[0]}: {len(prog.program.kernels)} kernels, "
          f"{'one ONNX Runtime region' if compiled.whole is not None else 'not one region'}")
    peer_model = to_onnx_model(module, inputs)
    graphs = {"ORT on the export": peer_model}
    if compiled.whole is not None and captured:
        graphs["Ollie's region"] = _as_model(*max(captured, key=lambda c: len(c[0].node)))
    for name, model in graphs.items():
        raw = collections.Counter(n.op_type for n in model.graph.node)  # type: ignore[attr-defined]
        done = _optimised_ops(model)
        print(f"  {name}: {sum(raw.values())} nodes -> {sum(done.values())} after ONNX "
              f"Runtime's optimisations: {dict(done.most_common())}")
    peer = ort_session(peer_model.SerializeToString(), torch.get_num_threads(), spinning=True)
    feed = {i.name: t.numpy() for i, t in zip(peer.get_inputs(), inputs, strict=True)}
    fns = {"ORT": lambda: peer.run(None, feed), "Ollie": lambda: prog(*inputs)}
    ratios = []
    for _ in range(int(argv[1]) if len(argv) >= 2 else 10):
        t = measure_alternating(fns, rounds=15, max_seconds=90.0, min_sample=0.02,
                                lead_calls=1, settle=SETTLE_SECONDS,
                                lead_seconds=settled_lead(SETTLE_SECONDS))
        ratios.append(t["ORT"] / t["Ollie"])
        print(f"  ORT {t['ORT'] * 1e3:.3f} ms, Ollie {t['Ollie'] * 1e3:.3f} ms: "
              f"{ratios[-1]:.3f}x", flush=True)
    print(f"median {statistics.median(ratios):.3f}x over ORT (range {min(ratios):.3f}-"
          f"{max(ratios):.3f}x, {len(ratios)} timings)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
