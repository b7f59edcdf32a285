"""End-to-end benchmark (the paper's end-to-end figure): every zoo model at batch 1 and 16.

Per model and batch, in one process: build the module (``ollie.zoo.get``), optimise it with
``ollie.optimize`` (``budget`` seconds of search per distinct subprogram, ``total_budget``
seconds for the whole model if given, a fresh persistent cache so the first optimisation is
cold) and check its output against the module (relative
error < 1e-3), then time alternately (``measure_alternating``, interleaved rounds; each sample
is one untimed call followed by at least 20 ms of back-to-back calls, so every system is timed
in its steady state, as a model served in a loop runs; on the CPU a sample starts after 0.2 s
idle and 50 ms of untimed calls, which does not bias the ratio against samples of back-to-back
calls without idle time (measured: docs/design/002-measurement-protocol.md):

* PyTorch eager under ``torch.inference_mode``;
* ``torch.compile`` with frozen weights (``torch._inductor.config.freezing = True``) as users
  run it for inference, warmed up first (a failure is recorded, not fatal), in
  ``compile_mode`` (``--compile-mode``; default: ``"default"`` on the CPU, ``"max-autotune"``
  on CUDA, which autotunes its GEMM and convolution kernels and replays CUDA graphs);
* ONNX Runtime on the ``ollie.frontend.to_onnx`` export (all optimisations, threads = cores);
  the Longformer layer's ``ollie.G2BMM`` / ``ollie.GBMM`` custom operators have no ORT kernel,
  so it is "n/a" there;
* Ollie's optimised program.

With ``repeats`` (``--repeats N``) the alternating timing runs N times in a row; the table
gives each system's median and the notes the range of Ollie's speedups over the N timings
(a shared virtual machine has slow and fast spells).

With ``device="cuda"`` (``--device cuda``) the modules, inputs and Ollie's programs live on the
GPU; ONNX Runtime is left out (a CPU runtime says nothing of a GPU program) and PyTorch eager
replayed as a CUDA graph is a peer too ("eager + CUDA graph"), since Ollie's programs replay as
CUDA graphs (:mod:`ollie.exec.cuda_graph`); every system computes in full float32
(TensorFloat-32 off: :func:`~ollie.bench.baselines.fp32_everywhere`). The rates of the roofline are
the GPU's and the files are ``models_cuda.*``.

Also per model: a roofline lower bound ``max(FLOPs / matmul rate, bytes / copy bandwidth)``
with FLOPs counted from the graph (Conv, ConvTranspose, MatMul/Gemm, G2BMM, GBMM via shapes),
the matmul rate of a large ``torch.matmul`` (on the CPU, or oneDNN's matmul, whichever is
faster) and the copy bandwidth measured on this machine,
and bytes estimated as weights + model input and output + every materialised intermediate
(outputs of compute and opaque operators) written once and read once (element-wise operators
are assumed fused). And the warm re-optimisation times: the same model optimised again in the
same process with the persistent cache warm (second / first), and in a new process as a user
re-running a script does (:mod:`ollie.bench.warm_process`), and how many subprograms were
derived, kept their original operator or were refused a search, and why
(:func:`ollie.optimizer.report.tally`).

A model/batch whose largest intermediate would not fit three times in the available memory is
skipped and says so (Longformer at seq 10000, batch 16: the [128, 10000, 2001] scores alone
are 10 GB). Writes ``models.md``, ``models.json`` and ``models.png`` under ``out``
(:mod:`ollie.bench.models_report`).

With ``attribution`` (``--attribution``) three more programs of each model are optimised from
the same cache and timed in the same interleaved run: the original operators on the vendor
libraries only (0), derived programs on the vendor libraries (a), and the original operators
with Ollie's kernel library (b), Ollie's program being (c) (:mod:`ollie.bench.attribution`);
the report gets an attribution table. Such a run does not re-optimise the model warm (its
warm column is n/a).

``cnn:NAME`` models (``cnn:all``: every one) are the architectures of
:mod:`ollie.testing.cnns` (MobileNetV2, SqueezeNet, DenseNet, ... in the small: base width 32,
112 x 112 inputs), benchmarked the same way; give them their own ``out`` folder.
"""

from __future__ import annotations

import gc
import json
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import ollie
from ollie.bench import attribution as attrib
from ollie.bench import warm_process
from ollie.bench.baselines import cores, fp32_everywhere, ort_session
from ollie.bench.models_report import GRAPHED, PEERS, suffix, write
from ollie.errors import ConfigError
from ollie.optimizer.libraries import rel_err
from ollie.optimizer.report import tally
from ollie.settings import using
from ollie.tune import roofline
from ollie.tune.measure import (
    SETTLE_SECONDS,
    SETTLED_LEAD_SECONDS,
    measure_alternating,
)
from ollie.tune.roofline import copy_bandwidth

DEFAULT_MODELS = ("infogan", "dcgan", "srcnn", "gcn", "resnet18", "csrnet", "longformer")
DEFAULT_BATCHES = (1, 16)
RTOL = 1e-3
LOAD_WARN = 2.5


# --------------------------------------------------------------------- the machine
def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def machine(device: str = "cpu") -> dict:
    import onnxruntime

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": cores(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "loadavg_start": loadavg(),
            "device": device,
            **({"gpu": torch.cuda.get_device_name(device)} if device != "cpu" else {})}


def matmul_rate(sizes: tuple[int, ...] = (1024, 2048), device: str = "cpu") -> float:
    """FLOP/s of large square float32 matrix products (the best run: a busy machine only
    slows): ``torch.matmul``, and on the CPU also oneDNN's matmul primitive, which on some
    CPUs runs twice as fast as the MKL build PyTorch calls (:mod:`ollie.exec.linear`)."""
    from ollie.exec import linear

    def others(a: torch.Tensor, b: torch.Tensor) -> dict:
        return {n: f for n, f in linear.implementations(a, b).items() if n != "MKL"}

    return roofline.matmul_rate(sizes, device,
                                others if torch.device(device).type == "cpu" else None)


# --------------------------------------------------------------------- roofline
def graph_costs(graph) -> tuple[float, float]:
    """(FLOPs, bytes) of an ``ollie.graph.Graph`` (see the module docstring)."""
    from ollie.graph import COMPUTE_OPS

    def numel(t: str) -> int:
        return math.prod(graph.shape(t))

    flops = 0.0
    nbytes = float(sum(v.nbytes for v in graph.initializers.values()))
    nbytes += 4 * (sum(numel(n) for n in graph.input_names) + sum(map(numel, graph.outputs)))
    for node in graph.nodes:
        out = node.outputs[0]
        if node.op in COMPUTE_OPS:
            a, b = graph.shape(node.inputs[0]), graph.shape(node.inputs[1])
            if node.op == "Conv2d":            # W [F, C/g, R, S]
                flops += 2 * numel(out) * math.prod(b[1:])
            elif node.op == "ConvTranspose2d":  # W [C, F/g, R, S]: per input element
                flops += 2 * math.prod(a) * math.prod(b[1:])
            elif node.op == "Gemm":
                flops += 2 * numel(out) * (a[0] if node.attrs.get("transA") else a[1])
            else:  # MatMul, BatchMatMul, G2BMM (K), GBMM (2w+1): the reduced extent
                flops += 2 * numel(out) * a[-1]
        if (node.op in COMPUTE_OPS or node.opaque) and out not in graph.outputs:
            nbytes += 2 * 4 * numel(out)
    return flops, nbytes


# --------------------------------------------------------------------- one model, one batch
CNN_PREFIX = "cnn:"
CNN_WIDTH, CNN_SIZE = 32, 112
"""``cnn:NAME`` models: :mod:`ollie.testing.cnns` at base width 32 on 112 x 112 inputs."""


def expand(models: Sequence[str]) -> tuple[str, ...]:
    """Model names with ``cnn:all`` expanded to every architecture of
    :mod:`ollie.testing.cnns`, ``tv:all`` / ``hf:all`` to the torchvision / transformers
    suites (:mod:`ollie.zoo.external`)."""
    from ollie.testing.cnns import ARCHITECTURES
    from ollie.zoo.external import HF_MODELS, TORCHVISION_MODELS

    suites = {CNN_PREFIX + "all": [CNN_PREFIX + a for a in ARCHITECTURES],
              "tv:all": ["tv:" + a for a in TORCHVISION_MODELS],
              "hf:all": ["hf:" + a for a in HF_MODELS]}
    out: list[str] = []
    for m in models:
        out += suites.get(m, [m])
    return tuple(out)


def build(name: str, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A zoo model (``tv:NAME`` / ``hf:NAME`` included), or a ``cnn:NAME`` architecture with
    seeded inputs, for ``batch``."""
    if not name.startswith(CNN_PREFIX):
        return ollie.zoo.get(name, batch)
    from ollie.testing.cnns import build as build_cnn

    module = build_cnn(name.removeprefix(CNN_PREFIX), CNN_WIDTH, CNN_SIZE)
    gen = torch.Generator().manual_seed(0)
    return module, (torch.randn(batch, 3, CNN_SIZE, CNN_SIZE, generator=gen),)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:160] if text else ''}"


def _too_big(name: str, batch: int) -> str | None:
    """Why this model/batch cannot run here, or None."""
    if name != "longformer":
        return None
    o = ollie.zoo.MODELS["longformer"].options
    scores = batch * 8 * o["seq"] * (2 * o["width"] + 1) * 4
    try:
        avail = next(int(ln.split()[1]) * 1024 for ln in
                     Path("/proc/meminfo").read_text().splitlines()
                     if ln.startswith("MemAvailable"))
    except (OSError, StopIteration):
        return None
    if 3 * scores > avail:
        return (f"skipped on this machine: the attention scores alone are {scores / 2**30:.1f} "
                f"GiB (x3 for scores, probabilities and a peer's copy > "
                f"{avail / 2**30:.1f} GiB available)")
    return None


def run_one(name: str, batch: int, budget: float, rates: dict, log: Callable = print,
            device: str = "cpu", repeats: int = 1, attribution: bool = False,
            total_budget: float | str | None = "auto", compile_mode: str = "default",
            new_process: bool = False) -> dict:
    """One model and batch: build, check, optimise and time every system (``repeats``
    timings in a row, see :func:`timed`); with ``attribution``, also the programs of
    :mod:`ollie.bench.attribution`. ``budget``: search seconds per distinct subprogram;
    ``total_budget``: seconds for each optimisation of the model (``"auto"``: the default
    budget; None: no limit). The row gets the cold and (without ``attribution``) warm
    optimisation times and the subprograms' outcomes
    (:func:`~ollie.optimizer.report.tally`, ``subprograms``) and the count of operators
    without an expression, run as they are (``opaque_ops``)."""
    row: dict = {"model": name, "batch": batch, "times_ms": {}, "errors": {}, "notes": []}
    notes = row["notes"]
    module, inputs = build(name, batch)
    module = module.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    with torch.inference_mode():
        ref = module(*inputs).cpu()

    from ollie.optimizer.model import to_graph
    graph = to_graph(module, inputs)
    flops, nbytes = graph_costs(graph)
    row["opaque_ops"] = sum(n.opaque for n in graph.nodes)
    t_c, t_m = flops / rates["matmul_flops"], nbytes / rates["copy_bytes"]
    row.update(gflops=flops / 1e9, mbytes=nbytes / 1e6, roofline_ms=1e3 * max(t_c, t_m),
               bound="compute" if t_c >= t_m else "memory")

    fns: dict[str, Callable[[], object]] = {"eager": lambda: module(*inputs)}
    if device != "cpu":
        from ollie.exec.cuda_graph import Graphed

        graphed = Graphed(lambda: module(*inputs), GRAPHED)
        fns[GRAPHED] = lambda: graphed().clone()
    # torch.compile with frozen weights, warmed up
    try:
        torch._dynamo.reset()
        compiled = torch.compile(module, mode=compile_mode)
        t0 = time.perf_counter()
        # frozen while it compiles (on the first calls), without changing the process's config;
        # the output copied before the next call, which may replay into the same buffers
        with torch._inductor.config.patch(freezing=True), torch.inference_mode():
            got = compiled(*inputs).cpu()
            compiled(*inputs)
        row["compile_s"] = time.perf_counter() - t0
        row["errors"]["torch.compile"] = rel_err(got, ref)
        fns["torch.compile"] = lambda: compiled(*inputs)
        log(f"  torch.compile ({compile_mode}): compiled and warmed up in {row['compile_s']:.1f} s")
    except Exception as e:  # a peer's failure is a result
        notes.append(f"torch.compile failed: {_first_line(e)}")
    # ONNX Runtime
    if device != "cpu":
        notes.append("ORT n/a: timed on the CPU only")
    elif name == "longformer":
        notes.append("ORT n/a: G2BMM/GBMM export as custom-domain ollie ops, which have no "
                     "ONNX Runtime kernel")
    else:
        try:
            from ollie.frontend import to_onnx_model

            # ONNX Runtime's default thread pool (spinning), as users run it
            sess = ort_session(to_onnx_model(module, inputs).SerializeToString(),
                               torch.get_num_threads(), spinning=True)
            feed = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs, strict=True)}
            row["errors"]["ORT"] = rel_err(torch.from_numpy(sess.run(None, feed)[0]), ref)
            fns["ORT"] = lambda: sess.run(None, feed)
        except Exception as e:  # a failing peer is a result: one line says why
            notes.append(f"ORT n/a: {_first_line(e)}")
            log(f"  ORT n/a: {_first_line(e)}")
    # Ollie: cold, checked, then warm re-optimisation
    t0 = time.perf_counter()
    prog = ollie.optimize(module, inputs, device, time_budget=budget,
                          total_budget=total_budget)
    row["optimize_s"] = time.perf_counter() - t0
    if not attribution:  # an attribution run spends its time on (0), (a) and (b) instead
        t0 = time.perf_counter()
        ollie.optimize(module, inputs, device, time_budget=budget, total_budget=total_budget)
        row["reoptimize_s"] = time.perf_counter() - t0
        if new_process:  # as a user re-running a script: nothing of this process reused
            secs, how = warm_process.measure(name, batch, device, budget, total_budget,
                                             torch.get_num_threads())
            row["warm_new_process_s"] = secs
            notes.append(f"warm in a new process: {how}")
    with torch.inference_mode():
        row["errors"]["Ollie"] = err = rel_err(prog(*inputs).cpu(), ref)
    row["ollie_correct"] = err < RTOL
    if not row["ollie_correct"]:
        notes.append(f"Ollie output WRONG (relative error {err:.1e})")
    row["report"] = [r.to_json() for r in prog.report]
    rewritten = sum(r.chosen != "original operator" for r in prog.report)
    row["rewritten"] = f"{rewritten}/{len(prog.report)}"
    row["subprograms"] = tally(prog.report)
    notes += [n for n in prog.notes if not n.startswith(("optimised in", "checked against"))]
    warm = f" (warm {row['reoptimize_s']:.2f} s)" if "reoptimize_s" in row else ""
    log(f"  Ollie: optimised in {row['optimize_s']:.1f} s{warm}, "
        f"{row['rewritten']} subprograms rewritten, rel err {err:.1e}")
    fns["Ollie"] = lambda: prog(*inputs)
    if attribution:
        fns.update(attrib.programs(module, inputs, device, budget, ref, row, log,
                                   total_budget))
    for peer, e in row["errors"].items():
        if peer != "Ollie" and e >= RTOL:
            notes.append(f"{peer} relative error {e:.1e}")

    row["loadavg"] = loadavg()
    # steady state: a sample is untimed calls then >= 20 ms of back-to-back calls, so that
    # each system runs as when serving in a loop, not from the thread / cache state the
    # previously timed system left behind (see measure_alternating's lead_calls); on the CPU
    # each sample starts after the cores went idle, so that ONNX Runtime's spinning threads
    # (its default, and Ollie's regions that hold a whole network) do not slow the next system,
    # and its untimed calls go on long enough for the cores to be back at speed
    times = timed(fns, device, repeats, row)
    row["loadavg_after"] = loadavg()
    if max(row["loadavg"], row["loadavg_after"]) > LOAD_WARN:
        notes.append(f"machine busy while timing (load average {row['loadavg']:.1f} -> "
                     f"{row['loadavg_after']:.1f})")
    row["times_ms"] = {k: v * 1e3 for k, v in times.items()}
    if attribution:
        row["attribution"] = attrib.attribution(row["times_ms"])
    peers = {k: v for k, v in row["times_ms"].items() if k in PEERS}
    best = min(peers, key=peers.get)
    ms = row["times_ms"]["Ollie"]
    row.update(best_peer=best, speedup_vs_eager=row["times_ms"]["eager"] / ms,
               speedup_vs_best=peers[best] / ms)
    log("  " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["times_ms"].items()))
    return row


def timed(fns: dict[str, Callable[[], object]], device: str, repeats: int,
          row: dict) -> dict[str, float]:
    """Seconds per call of each of ``fns`` (one of them ``"Ollie"``): the median over
    ``repeats`` alternating timings in a row (:func:`measure_alternating`, 15 rounds each).
    With more than one, ``row`` gets each timing (``repeat_times_ms``) and the range of
    Ollie's speedup over eager and over the best peer across them: on a shared virtual
    machine one timing can land in a slow or a fast spell
    (docs/design/002-measurement-protocol.md)."""
    cpu = device == "cpu"
    samples = [measure_alternating(fns, device, rounds=15, max_seconds=90.0, min_sample=0.02,
                                   lead_calls=1, settle=SETTLE_SECONDS if cpu else 0,
                                   lead_seconds=SETTLED_LEAD_SECONDS if cpu else 0)
               for _ in range(max(1, repeats))]
    if len(samples) > 1:
        eager = [t["eager"] / t["Ollie"] for t in samples]
        best = [min(v for k, v in t.items() if k in PEERS) / t["Ollie"] for t in samples]
        row.update(repeats=len(samples),
                   repeat_times_ms=[{k: v * 1e3 for k, v in t.items()} for t in samples],
                   speedup_vs_eager_range=[min(eager), max(eager)],
                   speedup_vs_best_range=[min(best), max(best)])
    return {k: statistics.median(t[k] for t in samples) for k in samples[0]}


def main(models=DEFAULT_MODELS, batches=DEFAULT_BATCHES, budget: float = 20.0,
         out: str | Path = "benchmarks/results", keep: bool = False,
         cache_dir: str | None = None, threads: int | None = None,
         log: Callable = print, device: str = "cpu", repeats: int = 1,
         attribution: bool = False, total_budget: float | str | None = "auto",
         cpu_time: bool = False, compile_mode: str | None = None,
         new_process: bool = True) -> int:
    """Run the benchmark; ``keep``: keep the rows of other model/batch pairs already in
    ``out/models.json``; ``cache_dir``: the persistent cache (default: a fresh one, so the
    first optimisation of each model is cold); ``threads``: intra-op threads of every system
    (default: cores); ``repeats``: alternating timings per model and batch (:func:`timed`);
    ``attribution``: also time the programs of :mod:`ollie.bench.attribution`;
    ``total_budget``: seconds for each optimisation of a model (``"auto"``: the default
    budget, :func:`ollie.optimizer.budget.default_total`; None: no limit);
    ``cpu_time``: every time, the optimizer's and the benchmark's, is CPU time of the calling
    thread (:func:`time.thread_time`), with every system on that one thread (torch, numba,
    ONNX Runtime): on a machine other processes keep busy, a sample then counts the time the
    call ran, not the time it waited for a core (the other processes' pressure on the caches
    and memory still counts). CPU only; ``threads`` must be None or 1."""
    from ollie.optimizer.config import OptimizeConfig

    OptimizeConfig(time_budget=budget, total_budget=total_budget)  # a bad budget: ConfigError
    changes: dict = {}
    if cpu_time:
        if device != "cpu" or threads not in (None, 1):
            raise ConfigError("cpu_time measures one thread on the CPU: device 'cpu', "
                              "threads 1")
        import numba

        threads = 1
        numba.set_num_threads(1)  # the numba kernels' work runs on the calling thread
        changes["measure_clock"] = time.thread_time
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir or tempfile.mkdtemp(prefix="ollie-bench-cache-"))
    with using(cache_dir=cache, **changes):
        return _run_all(models, batches, budget, out, keep, threads, log, device, repeats,
                        attribution, total_budget, cpu_time, compile_mode=compile_mode or (
                            "default" if device == "cpu" else "max-autotune"),
                        new_process=new_process)


def _run_all(models: Sequence[str], batches: Sequence[int], budget: float, out: Path,
             keep: bool, threads: int | None, log: Callable, device: str,
             repeats: int, attribution: bool = False,
             total_budget: float | str | None = "auto", cpu_time: bool = False,
             compile_mode: str = "default", new_process: bool = False) -> int:
    """:func:`main` once its cache directory is set."""
    torch.set_num_threads(threads or cores())
    info = machine(device)
    info["precision"] = fp32_everywhere(device)
    info.update(threads=torch.get_num_threads(), matmul_flops=matmul_rate(device=device),
                copy_bytes=copy_bandwidth(device), budget=budget, total_budget=total_budget,
                clock="thread CPU time" if cpu_time else "wall", compile_mode=compile_mode)
    log(f"{info['cpu']}, {info['cores']} cores, {info['threads']} threads: matmul "
        f"{info['matmul_flops'] / 1e9:.1f} GFLOP/s, copy {info['copy_bytes'] / 1e9:.1f} GB/s, "
        f"load {info['loadavg_start']}")
    rows: list[dict] = []
    saved = out / f"models{suffix(device)}.json"
    if keep and saved.exists():
        rows = json.loads(saved.read_text())["rows"]
        for r in rows:  # one roofline for all rows: this run's rates
            if "gflops" in r:
                t_c = r["gflops"] * 1e9 / info["matmul_flops"]
                t_m = r["mbytes"] * 1e6 / info["copy_bytes"]
                r.update(roofline_ms=1e3 * max(t_c, t_m),
                         bound="compute" if t_c >= t_m else "memory")
    order = {m: i for i, m in enumerate(DEFAULT_MODELS)}
    for name in models:
        for batch in batches:
            log(f"{name} batch {batch}:")
            why = _too_big(name, batch)
            try:
                row = ({"model": name, "batch": batch, "skipped": why} if why else
                       run_one(name, batch, budget, info, log, device, repeats, attribution,
                               total_budget, compile_mode, new_process))
            except Exception as e:  # keep going, say what broke
                import traceback

                traceback.print_exc()
                row = {"model": name, "batch": batch, "skipped": f"failed: {_first_line(e)}"}
            row["measured"] = info["date"]
            if why or "skipped" in row:
                log(f"  {row['skipped']}")
            rows = [r for r in rows if (r["model"], r["batch"]) != (name, batch)] + [row]
            rows.sort(key=lambda r: (order.get(r["model"], 99), r["batch"]))
            info["loadavg_end"] = loadavg()
            write(rows, info, out)
            torch._dynamo.reset()
            gc.collect()
    log(write(rows, info, out))
    return 0
