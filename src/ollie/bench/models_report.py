"""The end-to-end benchmark's output (:mod:`ollie.bench.models`): the summary (geometric-mean
speedups, warm re-optimisation), the markdown table, the plot and the files written under the
output folder (``models.md``, ``models.json``, ``models.png``; ``models_cuda.*`` on a GPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ollie.tune.measure import SETTLE_SECONDS, SETTLED_LEAD_SECONDS

GRAPHED = "eager + CUDA graph"
PEERS = ("eager", "torch.compile", "ORT", GRAPHED)
SYSTEMS = (*PEERS, "Ollie")

def _ms(v: float | None) -> str:
    return "n/a" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("ollie_correct")]
    warm = {f"{r['model']} b{r['batch']}": {"first_s": r["optimize_s"],
                                            "second_s": r["reoptimize_s"],
                                            "ratio": r["reoptimize_s"] / r["optimize_s"]}
            for r in rows if "reoptimize_s" in r}
    return {"geomean_vs_best_peer": _geomean([r["speedup_vs_best"] for r in ok]),
            "geomean_vs_eager": _geomean([r["speedup_vs_eager"] for r in ok]),
            "rows_in_geomean": len(ok), "warm_reoptimization": warm}


def markdown(rows: list[dict], info: dict) -> str:
    s = summary(rows)
    cpu = info.get("device", "cpu") == "cpu"
    peers = [p for p in PEERS if (p == "ORT" and cpu) or
             any(p in r.get("times_ms", {}) for r in rows)]
    gpu = f"GPU {info['gpu']}, host " if info.get("gpu") else ""
    lines = [f"# End-to-end benchmark ({info['date']}, {info.get('device', 'cpu')})", "",
             f"Machine: {gpu}{info['cpu']}, {info['cores']} cores ({info.get('threads', '?')} "
             f"threads per system), torch {info['torch']}, "
             f"onnxruntime {info['onnxruntime']}, Python {info['python']}; matmul rate "
             f"{info['matmul_flops'] / 1e9:.1f} GFLOP/s, copy bandwidth "
             f"{info['copy_bytes'] / 1e9:.1f} GB/s; load average {info['loadavg_start']:.2f} "
             f"at start, {info.get('loadavg_end', float('nan')):.2f} at end. Search budget "
             f"{info['budget']:g} s per distinct subprogram. {info.get('precision', '')}",
             "",
             "| model | batch | " + "".join(f"{p} ms | " for p in peers) + "Ollie ms | "
             "speedup vs eager | speedup vs best peer | roofline ms | optimisation s | notes |",
             "|---|---:|" + "---:|" * len(peers) + "---:|---:|---:|---:|---:|---|"]
    for r in rows:
        t = r.get("times_ms", {})
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['batch']} | " + "| " * (len(peers) + 5) +
                         f"| {r['skipped']} |")
            continue
        notes = [f"{r['rewritten']} subprograms rewritten", f"{r['bound']}-bound"] + r["notes"]
        if r.get("measured", "") != info["date"]:   # a row kept (--keep) from another run
            notes.insert(0, f"kept from the run of {r.get('measured', 'an earlier date')}")
        if r.get("repeats", 1) > 1:
            (e0, e1), (b0, b1) = r["speedup_vs_eager_range"], r["speedup_vs_best_range"]
            notes.insert(0, f"times: medians of {r['repeats']} timings, over which Ollie ran "
                            f"{e0:.2f}-{e1:.2f}x over eager and {b0:.2f}-{b1:.2f}x over the "
                            "best peer")
        lines.append(
            f"| {r['model']} | {r['batch']} | " + "".join(f"{_ms(t.get(p))} | " for p in peers) +
            f"{_ms(t.get('Ollie'))} | "
            f"{r['speedup_vs_eager']:.2f}x | {r['speedup_vs_best']:.2f}x ({r['best_peer']}) | "
            f"{_ms(r['roofline_ms'])} | {r['optimize_s']:.1f} | {'; '.join(notes)} |")
    lines += ["", f"Geometric-mean speedup of Ollie over the best of {' / '.join(peers)}: "
                  f"**{s['geomean_vs_best_peer']:.2f}x**; over PyTorch eager: "
                  f"**{s['geomean_vs_eager']:.2f}x** ({s['rows_in_geomean']} model/batch "
                  "pairs with a correct Ollie program).", "",
              "Warm re-optimisation (same model optimised again in the same process, "
              "persistent cache warm):", "",
              "| model | first s | second s | second/first |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['first_s']:.1f} | {v['second_s']:.2f} | {v['ratio']:.3f} |"
              for k, v in s["warm_reoptimization"].items()]
    lines += ["", "Roofline: max(FLOPs / matmul rate, bytes / copy bandwidth); FLOPs of the "
              "Conv/ConvTranspose/MatMul/Gemm/G2BMM/GBMM operators from their shapes, bytes = "
              "weights + input + output + intermediates of compute and opaque operators "
              "written and read once (element-wise operators fused). Times are medians of "
              "interleaved rounds in one process; a sample is untimed calls, then at least "
              "20 ms of back-to-back calls (steady state: each system's threads and caches as "
              "its own previous call left them); on the CPU each sample starts after "
              f"{SETTLE_SECONDS:g} s idle, so that threads a system left busy-waiting do not "
              f"slow the next one, and its untimed calls go on for {SETTLED_LEAD_SECONDS:g} s. "
              "ONNX Runtime runs with its default thread pool, whose threads spin."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "skipped" not in r]
    groups = [f"{r['model']}\nb{r['batch']}" for r in rows] + ["geomean"]
    fig, ax = plt.subplots(figsize=(2 + 0.9 * len(groups), 4))
    width = 0.8 / len(SYSTEMS)
    for i, name in enumerate(SYSTEMS):
        xs, ys = [], []
        for j, r in enumerate(rows):
            peers = [v for k, v in r["times_ms"].items() if k in PEERS]
            if name in r["times_ms"]:
                xs.append(j + i * width)
                ys.append(min(peers) / r["times_ms"][name])
        if ys:
            xs.append(len(rows) + i * width)
            ys.append(_geomean(ys))
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=7)
    ax.set_ylabel("speedup over the best peer")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def suffix(device: str) -> str:
    return "" if device == "cpu" else "_" + device.split(":")[0]


def write(rows: list[dict], info: dict, out: Path) -> str:
    text = markdown(rows, info)
    stem = "models" + suffix(info.get("device", "cpu"))
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(
        {"machine": info, "summary": summary(rows), "rows": rows}, indent=1, default=str))
    plot(rows, out / f"{stem}.png")
    return text
