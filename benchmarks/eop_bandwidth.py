"""Memory bandwidth of generated CPU eOperators, against the machine's copy bandwidth and torch.

Usage::

    .venv/bin/python benchmarks/eop_bandwidth.py [--reps 20] [--cache-dir DIR] [--cases a,b]

Copy bandwidth: ``np.copyto`` of a 256 MB float32 array, best of 5, counting bytes read plus
bytes written. Each case is a memory-bound eOperator of realistic size; its time is the median
of ``--reps`` calls after warm-up (output buffer preallocated), its bytes every input read once
plus the output written once; 'of copy' divides its median-time bandwidth by the copy
bandwidth, 'min of copy' its minimum-time bandwidth (the statistic of the copy figure, less
sensitive to this VM's 2x swings). The torch column is the same computation in torch eager (slicing
and adding, no interpreter), median of the same number of calls, single process, all threads.

Cases: the Conv3x3 -> Matmul OffsetAdd of ResNet-18's [1,512,7,7] layer and of a
[16,256,14,14] layer (both read the matmul output laid out [n, f, h, w, r, s]), the InfoGAN
ConvTranspose selective add ([16,256,4,4] output from a [16,2,2,256,4,4] matmul output, and a
bigger [16,64,28,28] one), a layout transform splitting dimension 1 of a [8,10000,64] tensor
by 4 (plain and div/mod form), the Conv5x5 (SRCNN) input layout transform NCHW -> NHWC of a
[16,32,224,224] tensor (the expression a derived candidate holds). Working sets below the
32 MB L3 can beat DRAM copy bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import ollie
from ollie.codegen.cpu import compile_cpu


@dataclass
class Case:
    name: str
    text: str
    torch_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor]


def offset_add_torch(t: dict[str, torch.Tensor]) -> torch.Tensor:
    x = t["T"]
    _, _, h, w, _, _ = x.shape
    xp = F.pad(x, (0, 0, 0, 0, 1, 1, 1, 1))
    out = xp[:, :, 0:h, 0:w, 0, 0].clone()
    for r in range(3):
        for s in range(3):
            if r or s:
                out += xp[:, :, r:r + h, s:s + w, r, s]
    return out


def conv_transpose_torch(t: dict[str, torch.Tensor]) -> torch.Tensor:
    y = t["Y"]
    n, ny, nx, c, kr, ks = y.shape
    outp = torch.zeros(n, c, 2 * ny + 2, 2 * nx + 2)
    for a in range(ny):
        for b in range(nx):
            outp[:, :, 2 * a:2 * a + kr, 2 * b:2 * b + ks] += y[:, a, b]
    return outp[:, :, 1:2 * ny + 1, 1:2 * nx + 1]


def split_torch(t: dict[str, torch.Tensor]) -> torch.Tensor:
    a = t["A"]
    return a.view(8, 2500, 4, 64).permute(0, 2, 1, 3).contiguous()


def merge_torch(t: dict[str, torch.Tensor]) -> torch.Tensor:
    b = t["B"]
    return b.permute(0, 2, 1, 3).reshape(8, 10000, 64)


def channels_last_torch(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return t["A"].permute(0, 2, 3, 1).contiguous()


CASES = [
    Case("OffsetAdd conv3x3 [1,512,7,7]", """
        T: [1, 512, 7, 7, 3, 3]
        L<n=0:1, f=0:512, h=0:7, w=0:7> Sum<r=0:3, s=0:3> T[n, f, h + r - 1, w + s - 1, r, s]
    """, offset_add_torch),
    Case("OffsetAdd conv3x3 [16,256,14,14]", """
        T: [16, 256, 14, 14, 3, 3]
        L<n=0:16, f=0:256, h=0:14, w=0:14> Sum<r=0:3, s=0:3>
            T[n, f, h + r - 1, w + s - 1, r, s]
    """, offset_add_torch),
    Case("ConvTranspose add [16,256,4,4]", """
        Y: [16, 2, 2, 256, 4, 4]
        L<n=0:16, c=0:256, h=0:4, w=0:4> Sum<y=0:2, x=0:2>
            Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]
    """, conv_transpose_torch),
    Case("ConvTranspose add [16,64,28,28]", """
        Y: [16, 14, 14, 64, 4, 4]
        L<n=0:16, c=0:64, h=0:28, w=0:28> Sum<y=0:14, x=0:14>
            Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]
    """, conv_transpose_torch),
    Case("Layout split [8,10000,64] by 4", """
        A: [8, 10000, 64]
        L<b=0:8, j=0:4, i=0:2500, d=0:64> A[b, 4*i + j, d]
    """, split_torch),
    Case("Layout merge (div/mod) [8,10000,64]", """
        B: [8, 4, 2500, 64]
        L<b=0:8, i=0:10000, d=0:64> B[b, i % 4, i / 4, d]
    """, merge_torch),
    # the input layout eOp of the Conv5x5 (SRCNN) -> Matmul derivation, as the search emits it
    Case("Layout NCHW->NHWC [16,32,224,224]", """
        A: [16, 32, 224, 224]
        L<n=0:16, t=2:226, t1=2:226, c=0:32> A[n, c, t - 2, t1 - 2]
    """, channels_last_torch),
]


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Bytes read + written per second by ``np.copyto`` (best of ``reps``)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def times(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(median, min) seconds of ``reps`` calls after three warm-up calls."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--cases", default="",
                        help="only the cases whose name contains one of these comma-separated "
                             "words (case-insensitive)")
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth (np.copyto 256 MB, read+write, best of 5): {copy_bw / 1e9:.2f} GB/s")
    threads = torch.get_num_threads()
    print(f"torch threads: {threads} (and 1); GB/s and 'of copy' use the median time, "
          "'min of copy' the minimum (the copy's statistic: best of 5)")
    header = (f"{'case':36s} {'compile':>7s} {'med ms':>8s} {'min ms':>8s} {'MB':>6s} "
              f"{'GB/s':>6s} {'of copy':>7s} {'min of copy':>11s} {'torch ms':>9s} "
              f"{'torch1 ms':>9s} {'speedup':>7s}")
    print(header)
    print("-" * len(header))
    words = [w.strip().lower() for w in args.cases.split(",") if w.strip()]
    for case in CASES:
        if words and not any(w in case.name.lower() for w in words):
            continue
        expr = ollie.parse(case.text)
        rng = np.random.default_rng(0)
        inputs = {n: rng.standard_normal(s, dtype=np.float32) for n, s in expr.decls}
        t0 = time.perf_counter()
        kernel = compile_cpu(expr, cache_dir=args.cache_dir)
        compile_s = time.perf_counter() - t0
        out = np.empty(expr.shape, np.float32)
        med, best = times(lambda k=kernel, x=inputs, o=out: k(x, o), args.reps)
        tin = {n: torch.from_numpy(a) for n, a in inputs.items()}
        t_torch, _ = times(lambda c=case, x=tin: c.torch_fn(x), args.reps)
        torch.set_num_threads(1)
        t_torch1, _ = times(lambda c=case, x=tin: c.torch_fn(x), args.reps)
        torch.set_num_threads(threads)
        np.testing.assert_allclose(kernel(inputs), case.torch_fn(tin).numpy(), rtol=1e-4,
                                   atol=1e-4)
        nbytes = 4 * (sum(a.size for a in inputs.values()) + out.size)
        bw = nbytes / med
        print(f"{case.name:36s} {compile_s:7.2f} {med * 1e3:8.3f} {best * 1e3:8.3f} "
              f"{nbytes / 1e6:6.1f} {bw / 1e9:6.2f} {bw / copy_bw:7.0%} "
              f"{nbytes / best / copy_bw:11.0%} {t_torch * 1e3:9.3f} "
              f"{t_torch1 * 1e3:9.3f} {min(t_torch, t_torch1) / med:6.1f}x")
    print(f"copy bandwidth again: {copy_bandwidth() / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
