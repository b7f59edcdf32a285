"""Baselines the benchmarks compare with: PyTorch eager, ONNX Runtime (all optimisations,
threads = cores) and plain-PyTorch formulations of G2BMM / GBMM."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def fp32_everywhere(device: str) -> str:
    """On CUDA, turn TensorFloat-32 off in cuDNN and cuBLAS for every system of a benchmark
    (PyTorch lets cuDNN round float32 products to TF32 by default: outputs then differ from
    float32 by ~1e-3 of their magnitude, torch.compile's from eager's by as much, and no
    program can be checked to match within 1e-3). Returns a sentence for the results."""
    if torch.device(device).type != "cuda":
        return ""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return ("Every system computes in full float32: TensorFloat-32 is off in cuDNN and cuBLAS "
            "(PyTorch turns it on for cuDNN by default; outputs would then differ by ~1e-3).")


def ort_session(model_bytes: bytes, threads: int | None = None, spinning: bool = False):
    """An ONNX Runtime CPU session with every graph optimisation and ``threads`` intra-op
    threads (default: cores). Its threads busy-wait for work only with ``spinning`` (ONNX
    Runtime's default, as users run it: the model benchmark's peer, timed with
    ``measure_alternating(settle=...)`` because spinning threads keep taking the cores from
    whichever system runs next); the operator benchmarks turn it off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads or cores()
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def ort_single_op(op: str, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray],
                  out_shape: tuple[int, ...], **attrs) -> Callable[[], object]:
    """A callable running one ONNX operator (weights as initializers) in ONNX Runtime."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, [*inputs, *weights], ["Y"], **attrs)
    graph = helper.make_graph(
        [node], "op",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape))
         for n, v in inputs.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    sess = ort_session(model.SerializeToString())
    feed = {n: v.astype(np.float32) for n, v in inputs.items()}
    return lambda: sess.run(None, feed)


def g2bmm_formulations(q: torch.Tensor, k: torch.Tensor, w: int, d: int,
                       tiles: tuple[int, ...] = (128, 256, 512, 1024)
                       ) -> dict[str, Callable[[], torch.Tensor]]:
    """Plain PyTorch ways to compute a (dilated) G2BMM; the benchmark keeps the fastest.
    ``tiles``: the row-block sizes of the blocked formulation tried."""
    b, m, kk = q.shape
    pad = d * w

    def shifted_loop() -> torch.Tensor:
        kp = F.pad(k, (0, 0, pad, pad))
        out = q.new_empty(b, m, 2 * w + 1)
        for j in range(2 * w + 1):
            out[:, :, j] = (q * kp[:, j * d: j * d + m]).sum(-1)
        return out

    def windows_bmm(rows: int = 64) -> torch.Tensor:
        # strided windows of K (a view), multiplied in row chunks to bound memory
        kp = F.pad(k, (0, 0, pad, pad)).contiguous()
        s = kp.stride()
        out = q.new_empty(b, m, 2 * w + 1)
        for i0 in range(0, m, rows):
            n = min(rows, m - i0)
            win = kp.as_strided((b, n, 2 * w + 1, kk), (s[0], s[1], d * s[1], s[2]),
                                i0 * s[1])
            out[:, i0:i0 + n] = torch.matmul(win, q[:, i0:i0 + n].unsqueeze(-1)).squeeze(-1)
        return out

    def blocked(t: int) -> Callable[[], torch.Tensor]:
        # blocks of t rows: one batched GEMM of the block's rows against the K rows they can
        # reach ([r0 - dw, r0 + t + dw) clipped to [0, m)), then the band (every d-th column
        # along each row's diagonal) gathered by one strided copy; entries whose K row falls
        # outside [0, m) are masked to zero. Scratch allocated once, outside the timing.
        reach = d * w
        span = t + 2 * reach
        scratch = q.new_empty(b * t * span + 2 * span)
        cols = torch.arange(t, device=q.device)[:, None] + d * torch.arange(2 * w + 1,
                                                                            device=q.device)
        zero = q.new_zeros(())

        def run() -> torch.Tensor:
            out = q.new_empty(b, m, 2 * w + 1)
            for r0 in range(0, m, t):
                tr = min(t, m - r0)
                lo, hi = max(0, r0 - reach), min(m, r0 + tr + reach)
                c0, c1, wr = lo - (r0 - reach), hi - (r0 - reach), hi - lo
                p = scratch[span:span + b * tr * wr].view(b, tr, wr)
                torch.bmm(q[:, r0:r0 + tr], k[:, lo:hi].transpose(1, 2), out=p)
                band = scratch.as_strided((b, tr, 2 * w + 1), (tr * wr, wr + 1, d), span - c0)
                if c0 or c1 < tr + 2 * reach:
                    keep = (cols[:tr] >= c0) & (cols[:tr] < c1)
                    torch.where(keep, band, zero, out=out[:, r0:r0 + tr])
                else:
                    out[:, r0:r0 + tr] = band
            return out

        return run

    forms = {"shifted slices": shifted_loop, "strided windows + matmul": windows_bmm}
    for t in sorted({min(t, m) for t in tiles}):
        forms[f"blocked bmm, {t}-row blocks"] = blocked(t)
    return forms


def best_of(fns: dict[str, Callable[[], object]], device: str = "cpu") -> tuple[str, Callable]:
    """The fastest of several formulations: each is run once, those within 2x of the fastest
    are then timed (median of 3 after a warm-up), so a formulation 50x slower than the best is
    not run a dozen times."""
    import time

    from ollie.tune.measure import measure

    first: dict[str, float] = {}
    for name, fn in fns.items():
        t = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t
    fastest = min(first.values())
    times = {name: measure(fn, device, warmup=1, repeats=3) for name, fn in fns.items()
             if first[name] <= 2 * fastest}
    name = min(times, key=times.get)
    return name, fns[name]
