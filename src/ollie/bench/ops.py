"""Operator-level benchmark (the paper's Table 3): original vs optimised time per case.

For each case: derive candidates (``time_budget`` seconds), select the fastest verified
program by measurement against the original operator (a candidate with library convolutions
also with all of them on oneDNN, as ``ollie.optimize`` tries for a whole program; without
that, each runs the implementation chosen for its configuration alone with cold caches), then
time side by side, in interleaved
rounds in one process: PyTorch eager, ONNX Runtime (convolutions), the best plain PyTorch
formulation (G2BMM) and Ollie's program, each in steady state (a sample is one untimed call,
then at least 20 ms of back-to-back calls: a layer of a model served in a loop). Also
reported: each eOperator's achieved memory bandwidth as a fraction of this machine's measured
copy bandwidth. Writes ``ops.md``, ``ops.json`` and ``ops.png``.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import ollie
from ollie.bench.baselines import best_of, cores, fp32_everywhere, g2bmm_formulations, ort_single_op
from ollie.bench.cases import CASES
from ollie.exec import cuda_graph
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.select import program_label, select
from ollie.program.params import EOpParams
from ollie.semantics.check import random_inputs
from ollie.tune.cache import CostCache
from ollie.tune.measure import measure_alternating
from ollie.tune.roofline import copy_bandwidth

DEFAULT_CASES = ("conv3x3", "convtranspose", "conv5x5", "g2bmm")


GRAPHED = " + CUDA graph"
"""Suffix of a baseline replayed as a CUDA graph (on CUDA, where Ollie's programs are)."""


def same_size_copy(nbytes: int, device: str) -> float:
    """Bytes per second of a copy moving ``nbytes`` (read + write), timed as
    :meth:`~ollie.exec.executor.CompiledProgram.profile` times a kernel (on CUDA a graph of
    back-to-back calls): the reference for an eOperator moving as many bytes, whose data sits
    in the same level of cache (an H100's 50 MB L2 holds many of them)."""
    from ollie.exec.executor import PROFILE_CALLS

    src = torch.empty(max(1, nbytes // 8), device=device)
    dst = torch.empty_like(src)
    graphs = torch.device(device).type == "cuda" and cuda_graph.enabled()
    calls = PROFILE_CALLS if graphs else 1

    def fn() -> object:
        return [dst.copy_(src) for _ in range(calls)]

    fn = cuda_graph.Graphed(fn, "copy") if graphs else fn
    secs = measure_alternating({"copy": fn}, device, rounds=5, min_sample=1e-3)["copy"]
    return 2 * 4 * src.numel() * calls / secs


def _baselines(name: str, expr, inputs: dict[str, np.ndarray], device: str) -> dict:
    """The case's original operator(s), first the one the selection measures against. On
    CUDA: PyTorch's, also replayed as a CUDA graph (output copied, as Ollie's programs do); ONNX
    Runtime only on the CPU (a CPU baseline says nothing of a GPU program)."""
    t = {n: torch.as_tensor(v, device=device) for n, v in inputs.items()}
    out_shape = expr.shape
    ort = torch.device(device).type == "cpu"
    base: dict = {}
    if name in ("conv3x3", "conv5x5", "conv1x7", "conv9x9"):
        k = inputs["K"].shape[2]
        pad = k // 2
        base["PyTorch eager"] = lambda: F.conv2d(t["A"], t["K"], padding=pad)
        if ort:
            base["ONNX Runtime"] = ort_single_op("Conv", {"A": inputs["A"]},
                                                 {"K": inputs["K"]}, out_shape, pads=[pad] * 4)
    elif name == "convtranspose":
        base["PyTorch eager"] = lambda: F.conv_transpose2d(t["X"], t["W"], stride=2, padding=1)
        if ort:
            base["ONNX Runtime"] = ort_single_op("ConvTranspose", {"X": inputs["X"]},
                                                 {"W": inputs["W"]}, out_shape, strides=[2, 2],
                                                 pads=[1, 1, 1, 1])
    elif name == "g2bmm":
        q = expr.root
        w = (q.traversal[2].size - 1) // 2
        d = -q.body.rhs.indices[1].const // w
        label, fn = best_of(g2bmm_formulations(t["Q"], t["K"], w, d), device)
        base[f"best plain PyTorch ({label})"] = fn
    else:
        raise KeyError(name)
    if torch.device(device).type == "cuda" and cuda_graph.enabled():
        first, fn = next(iter(base.items()))
        graphed = cuda_graph.Graphed(fn, first)
        base = {first + GRAPHED: lambda: graphed().clone(), **base}
    return base


CONSTANTS = {"conv3x3": ("K",), "conv5x5": ("K",), "conv1x7": ("K",), "conv9x9": ("K",),
             "convtranspose": ("W",), "g2bmm": ()}


def run_case(name: str, budget: float, device: str, cache: CostCache, copy_bw: float,
             log=print) -> dict:
    case = CASES[name]
    expr = ollie.parse(case.text)
    inputs = random_inputs(expr, seed=0)
    consts = {n: inputs[n] for n in CONSTANTS[name]}
    t0 = time.perf_counter()
    res = ollie.derive(expr, max_depth=2, time_budget=budget, max_candidates=16)
    log(f"{name}: {res.stats['candidates']} verified candidates in "
        f"{time.perf_counter() - t0:.1f} s")
    base = _baselines(name, expr, inputs, device)
    first = next(iter(base.values()))
    # as ollie.optimize does for a whole program, a candidate's library convolutions are also
    # timed with one library for all (select's library_variants)
    sel = select(expr, res.candidates, first, inputs, consts, device, cache, limit=16,
                 library_variants=True)
    best = sel.best
    fns = dict(base)
    # every program the selection timed (interleaved with the original operator)
    measured = {"original operator": sel.baseline.seconds * 1e3}
    for m in sorted(sel.measured, key=lambda m: m.seconds):
        measured.setdefault(m.label, m.seconds * 1e3)
    row = {"case": name, "what": case.what, "candidates": res.stats["candidates"],
           "search_seconds": res.stats["seconds"], "program": "original operator",
           "eops": [], "selection_ms": measured}
    if best.program is not None:
        compiled = CompiledProgram(best.program, device)
        feed = {n: torch.as_tensor(inputs[n], device=device) for n, _ in best.program.inputs}
        fns["Ollie"] = lambda: compiled.run(feed)
        row["program"] = program_label(best.program)
        row["derivation"] = best.candidate.derivation if best.candidate else []
        for k, secs in zip(best.program.kernels, compiled.profile(feed), strict=True):
            if isinstance(k.params, EOpParams):
                nbytes = int(k.params.bytes or 0)
                bw = nbytes / secs
                eop = {"shape": list(k.output_shape), "ms": secs * 1e3, "GBps": bw / 1e9,
                       "of_copy": bw / copy_bw}
                if torch.device(device).type == "cuda":
                    eop["of_same_size_copy"] = bw / same_size_copy(nbytes, device)
                row["eops"].append(eop)
    # steady state, as in `ollie bench models`: an untimed call, then >= 20 ms of
    # back-to-back calls per sample, so no system pays for waking its thread pool after
    # another system ran
    times = measure_alternating(fns, device, min_sample=0.02, lead_calls=1)
    row["times_ms"] = {k: v * 1e3 for k, v in times.items()}
    ollie_ms = row["times_ms"].get("Ollie", row["times_ms"][next(iter(base))])
    row["ollie_ms"] = ollie_ms
    row["speedup_vs"] = {k: v / ollie_ms for k, v in row["times_ms"].items() if k != "Ollie"}
    log(f"  {row['program']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in
                                            row["times_ms"].items()))
    return row


def table(rows: list[dict], copy_bw: float) -> list[str]:
    out = [f"copy bandwidth: {copy_bw / 1e9:.1f} GB/s", "",
           "| case | baselines (ms) | Ollie (ms) | speedup | program | eOp bandwidth |",
           "|---|---|---:|---|---|---|"]
    for r in rows:
        bases = "; ".join(f"{k} {v:.3f}" for k, v in r["times_ms"].items() if k != "Ollie")
        sp = "; ".join(f"{v:.2f}x vs {k}" for k, v in r["speedup_vs"].items())
        bw = "; ".join(f"{e['GBps']:.1f} GB/s ({100 * e['of_copy']:.0f}%" +
                       (f", {100 * e['of_same_size_copy']:.0f}% of a same-size copy)"
                        if "of_same_size_copy" in e else ")") for e in r["eops"])
        out.append(f"| {r['case']} | {bases} | {r['ollie_ms']:.3f} | {sp} | {r['program']} | "
                   f"{bw or '-'} |")
    out += ["", "Programs timed by the measured selection (interleaved with the original "
            "operator; ms, fastest first):", ""]
    for r in rows:
        sel = "; ".join(f"{k} {v:.3f}" for k, v in list(r.get("selection_ms", {}).items())[:6])
        out.append(f"* {r['case']}: {sel}")
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.5 + 2 * len(rows), 4))
    labels = sorted({k for r in rows for k in r["times_ms"]})
    width = 0.8 / len(labels)
    for i, lab in enumerate(labels):
        xs = [j + i * width for j, r in enumerate(rows) if lab in r["times_ms"]]
        ys = [r["times_ms"][lab] for r in rows if lab in r["times_ms"]]
        ax.bar(xs, ys, width, label=lab)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["case"] for r in rows])
    ax.set_ylabel("ms (log)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(cases=DEFAULT_CASES, budget: float = 60.0, device: str = "cpu",
         out: str | Path = "benchmarks/results") -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cores())
    cache = CostCache()
    precision = fp32_everywhere(device)
    bw = copy_bandwidth(device)
    rows = [run_case(name, budget, device, cache, bw) for name in cases]
    cpu = platform.processor() or platform.machine()
    where = f"{device}, {cpu}, {cores()} cores"
    notes: list[str] = []
    if torch.device(device).type == "cuda":
        where = f"{device}: {torch.cuda.get_device_name(device)}, host {cpu}, {cores()} cores"
        notes = [f"{precision} Ollie's programs replay as CUDA graphs"
                 f"{'' if cuda_graph.enabled() else ' (off: OLLIE_CUDA_GRAPHS=0)'}; "
                 f"'{GRAPHED.strip(' +')}' baselines are the original operator replayed so too. "
                 "ONNX Runtime is timed on the CPU only. eOp bandwidth: bytes moved / time "
                 "of the kernel replayed back to back, as a share of the large copy below and "
                 "of a copy of as many bytes timed the same way (data that fits in L2 moves "
                 "faster than DRAM allows).", ""]
    lines = [f"# Operator benchmark ({time.strftime('%Y-%m-%d')}, {where}, "
             f"torch {torch.__version__})", "", *notes, *table(rows, bw)]
    suffix = "" if device == "cpu" else "_" + device.split(":")[0]
    (out / f"ops{suffix}.md").write_text("\n".join(lines) + "\n")
    (out / f"ops{suffix}.json").write_text(json.dumps(rows, indent=1, default=str))
    plot(rows, out / f"ops{suffix}.png")
    print("\n".join(lines))
    return 0
