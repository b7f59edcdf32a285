"""The end-to-end benchmark's output (:mod:`ollie.bench.models`): the summary (geometric-mean
speedups, warm re-optimisation), the markdown table, the attribution table of a run with
``--attribution`` (:func:`attribution_markdown`), the plot and the files written under the
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


def outcomes(row: dict) -> str:
    """A row's subprograms as ``derived / original / refused``, the refusals' reasons and the
    operators without an expression (run as they are) after them; ``n/a`` for a row measured
    before they were recorded."""
    t = row.get("subprograms")
    if t is None:
        return "n/a"
    why = ", ".join(f"{k} {v}" for k, v in t["reasons"].items())
    opaque = row.get("opaque_ops")
    return (f"{t['derived']} / {t['original']} / {t['refused']}" + (f" ({why})" if why else "")
            + (f"; {opaque} opaque ops" if opaque else ""))


def _seconds(budget: float | str) -> str:
    """A total budget as the table states it: ``"60 s"``, or ``"the default budget"``."""
    return f"{budget:g} s" if isinstance(budget, (int, float)) else "the default budget"


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("ollie_correct")]
    warm = {f"{r['model']} b{r['batch']}": {"first_s": r["optimize_s"],
                                            "second_s": r["reoptimize_s"],
                                            "ratio": r["reoptimize_s"] / r["optimize_s"],
                                            "new_process_s": r.get("warm_new_process_s")}
            for r in rows if "reoptimize_s" in r}
    return {"geomean_vs_best_peer": _geomean([r["speedup_vs_best"] for r in ok]),
            "geomean_vs_eager": _geomean([r["speedup_vs_eager"] for r in ok]),
            "rows_in_geomean": len(ok), "warm_reoptimization": warm,
            **({"attribution_geomean": attribution_geomeans(rows)}
               if any(r.get("attribution") for r in rows) else {})}


ATTRIBUTED = ("(a)", "(b)", "(c)")
"""The programs whose speedup over (0) the attribution table gives
(:mod:`ollie.bench.attribution`)."""


def attribution_geomeans(rows: list[dict]) -> dict[str, float]:
    """Geometric means over the rows with an attribution: each program's speedup over (0),
    and (c)'s over the best peer (``"(c)/best peer"``)."""
    done = [r for r in rows if r.get("attribution")]
    out = {k: _geomean([r["attribution"]["speedup"][k] for r in done
                        if k in r["attribution"]["speedup"]]) for k in ATTRIBUTED}
    out["(c)/best peer"] = _geomean([r["speedup_vs_best"] for r in done
                                     if r.get("ollie_correct")])
    return out


def attribution_markdown(rows: list[dict]) -> str:
    """The attribution table (rows of a run with ``--attribution``): per model and batch the
    time of (0), the original operators on the vendor libraries, the speedups over it of (a)
    derived programs on the vendor libraries, (b) the original operators with Ollie's kernel
    library and (c) both (Ollie's program), eager's time, the best peer's and (c)'s speedup
    over it; then a row of geometric means. Empty without such rows."""
    done = [r for r in rows if r.get("attribution")]
    if not done:
        return ""

    def x(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}x"

    lines = ["| model | batch | (0) ms | (a) derived, vendor | (b) originals, kernel library | "
             "(c) both | eager ms | best peer ms | (c)/best peer |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in done:
        a, t = r["attribution"], r["times_ms"]
        sp = a["speedup"]
        lines.append(f"| {r['model']} | {r['batch']} | {_ms(a['ms']['(0)'])} | "
                     + " | ".join(x(sp.get(k)) for k in ATTRIBUTED) +
                     f" | {_ms(t.get('eager'))} | {_ms(t[r['best_peer']])} ({r['best_peer']}) "
                     f"| {x(r['speedup_vs_best'])} |")
    g = attribution_geomeans(rows)
    lines.append("| geomean | | | " + " | ".join(x(g[k]) for k in ATTRIBUTED) +
                 f" | | | {x(g['(c)/best peer'])} |")
    return "\n".join(lines)


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
             f"{info['budget']:g} s per distinct subprogram"
             + (f", {_seconds(info['total_budget'])} per model" if info.get("total_budget") else "")
             + f". torch.compile mode '{info.get('compile_mode', 'default')}', weights frozen."
             + f" {info.get('precision', '')}"
             + (" Every time is CPU time of the calling thread, every system on that one "
                "thread (--cpu-time)." if info.get("clock") == "thread CPU time" else ""),
             "",
             "| model | batch | " + "".join(f"{p} ms | " for p in peers) + "Ollie ms | "
             "speedup vs eager | speedup vs best peer | roofline ms | optimisation s | "
             "warm s | subprograms derived / original / refused | notes |",
             "|---|---:|" + "---:|" * len(peers) + "---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        t = r.get("times_ms", {})
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['batch']} | " + "| " * (len(peers) + 6) +
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
            f"{_ms(r['roofline_ms'])} | {r['optimize_s']:.1f} | "
            + (f"{r['reoptimize_s']:.2f}" if "reoptimize_s" in r else "n/a")
            + f" | {outcomes(r)} | {'; '.join(notes)} |")
    lines += ["", f"Geometric-mean speedup of Ollie over the best of {' / '.join(peers)}: "
                  f"**{s['geomean_vs_best_peer']:.2f}x**; over PyTorch eager: "
                  f"**{s['geomean_vs_eager']:.2f}x** ({s['rows_in_geomean']} model/batch "
                  "pairs with a correct Ollie program).", "",
              "Warm re-optimisation (the persistent cache warm): the same model optimised "
              "again in the same process (second), and in a new process as a user re-running "
              "a script (imports and building the model not counted):", "",
              "| model | first s | second s | second/first | new process s |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {v['first_s']:.1f} | {v['second_s']:.2f} | {v['ratio']:.3f} | "
              + (f"{v['new_process_s']:.2f} |" if v.get("new_process_s") is not None
                 else "n/a |")
              for k, v in s["warm_reoptimization"].items()]
    table = attribution_markdown(rows)
    if table:
        lines += ["", "Where the speed comes from: (0) every subprogram's original operator on "
                  "the vendor libraries only (oneDNN, MKL, PyTorch, ONNX Runtime); (a) derived "
                  "programs on the vendor libraries; (b) the original operators with Ollie's "
                  "kernel library (Winograd, blocked GEMM, band kernels, max pooling); (c) both "
                  "(Ollie). Speedups over (0), all programs optimised from one cache and timed "
                  "in the same interleaved run as the peers:", "", table]
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
