"""G2BMM / GBMM at Longformer's operator size: plain PyTorch formulations vs the derived
(non-dilated) program of Ollie, on the CPU with ``torch.set_num_threads(2)``.

Cases (MODELS.md, PAPER.md Table 3): Q, K, V ``[8, 10000, 64]``, ``w = 1000``, ``d = 4``
(dilated), and ``d = 1`` at the same size. Every formulation writes into a preallocated
output (as a runtime with a memory plan would) and keeps its temporaries bounded.

* plain PyTorch, straight on the dilated operands:
  ``loop-j``      a loop over the 2w+1 offsets j with shifted slices (the old runtime);
  ``unfold-bmm``  as_strided windows K[b, i + d(j-w)] of the padded K, chunks of rows
                  materialised and multiplied by one bmm (a GEMV per row);
  ``full-gather`` full Q @ K^T per chunk of rows into a zero-margin buffer, then the band is
                  gathered with one strided copy (GBMM: band scattered into a zero buffer,
                  times all of V);
  ``blocked``     blocks of T = 1000 rows (the best of 250 / 500 / 1000 here): Q_blk @ K_win^T
                  over the window of T + 2dw rows clipped to [0, M), one batched bmm, band
                  extracted by one strided ``where`` (the d = 1 kernel's algorithm, on the
                  dilated window: ~d times the work); GBMM: band scattered into a zero
                  buffer, times the zero-padded V window (``blocked``) or the clipped one
                  (``blocked-clipped``);
* derived: the layout eOperators (Q and K, resp. S and V, re-laid out to ``[B*d, M/d, *]``,
  contiguous copies), the non-dilated kernel (ollie.kernels.band, d = 1) into ``[B*d, M/d, *]``
  and the output re-layout copy, all timed; ``derived-fused`` is ``band.g2bmm(..., d=4)``,
  which does the same internally but reads / writes the ``[B, M, 2w+1]`` operand through a
  strided view instead of copying it.

Timings: median of ``--runs`` runs (>= 5) after one warm-up, all formulations of a case
measured alternately in one process; loop-j and unfold-bmm (30-80 s a run, 20-100x the
others) are timed in ``--slow-runs`` runs (default 1, the first one, no separate warm-up).
``peak`` is the rise of the process's peak RSS during a formulation's timed runs
(preallocated inputs and outputs excluded). Every formulation's result is checked against
the derived one. Run: ``.venv/bin/python benchmarks/band_kernels.py`` (about 10 minutes;
``--quick`` leaves out loop-j and unfold-bmm: about 4 minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from ollie.kernels import band

B, M, K, W, D = 8, 10000, 64, 1000, 4
J = 2 * W + 1
CHUNK = 1 << 24           # bytes of a plain formulation's per-step temporaries (16 MiB)
LIMIT = 12 << 30          # skip formulations whose temporaries would exceed 12 GB
Fn = Callable[[], None]


# ----------------------------------------------------------------------------- G2BMM
def g2_loop_j(q, k, w, d, out) -> None:
    out.zero_()
    m = q.shape[1]
    for j in range(2 * w + 1):
        off = d * (j - w)
        lo, hi = max(0, -off), min(m, m - off)
        if lo < hi:
            out[:, lo:hi, j] = torch.linalg.vecdot(q[:, lo:hi], k[:, lo + off:hi + off])


def _pad_rows(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, 0, before, after))


def g2_unfold_bmm(q, k, w, d, out) -> None:
    bsz, m, kd = q.shape
    kp = _pad_rows(k, d * w, d * w)
    rows = max(1, 16 * CHUNK // (bsz * (2 * w + 1) * kd * 4))   # windows: 256 MiB a step
    for r0 in range(0, m, rows):
        r = min(rows, m - r0)
        win = kp.as_strided((bsz, r, 2 * w + 1, kd), (kp.stride(0), kd, d * kd, 1),
                            r0 * kd)   # K[b, i + d(j - w)] for i in [r0, r0 + r)
        out[:, r0:r0 + r] = torch.matmul(win, q[:, r0:r0 + r, :, None])[..., 0]


def g2_full_gather(q, k, w, d, out) -> None:
    bsz, m, _ = q.shape
    pad = d * w
    lp = m + 2 * pad
    rows = max(1, CHUNK // (lp * 4))
    buf = q.new_zeros((rows, lp))      # zero margins: the band's out-of-range reads
    for b in range(bsz):
        for r0 in range(0, m, rows):
            r = min(rows, m - r0)
            torch.mm(q[b, r0:r0 + r], k[b].t(), out=buf[:r, pad:pad + m])
            out[b, r0:r0 + r] = buf.as_strided((r, 2 * w + 1), (lp + 1, d), r0)


def _clip(m: int, r0: int, tr: int, reach: int) -> tuple[int, int, int, int]:
    """Window ``[r0 - reach, r0 + tr + reach)`` of a block clipped to ``[0, m)``: (lo, hi) in
    rows, (c0, c1) in window columns."""
    lo, hi = max(0, r0 - reach), min(m, r0 + tr + reach)
    return lo, hi, lo - (r0 - reach), hi - (r0 - reach)


def g2_blocked(q, k, w, d, out, t: int = 1000) -> None:
    """Blocks of t rows; P = Q_blk @ K[lo:hi]^T (window clipped to [0, M)) by one batched
    bmm into a contiguous scratch, then S[r0 + t', j] = P[t', t' + d*j - c0] by one strided
    ``where`` (positions outside [c0, c1) read other rows and are masked to 0)."""
    bsz, m, _ = q.shape
    j, reach = 2 * w + 1, d * w
    slack = t + 2 * reach
    buf = band._workspace(bsz * t * slack + 2 * slack, q)
    zero = q.new_zeros(())
    cols = torch.arange(t)[:, None] + d * torch.arange(j)     # window column of (t', j)
    for r0 in range(0, m, t):
        tr = min(t, m - r0)
        lo, hi, c0, c1 = _clip(m, r0, tr, reach)
        wr = hi - lo
        p = buf[slack:slack + bsz * tr * wr].view(bsz, tr, wr)
        torch.bmm(q[:, r0:r0 + tr], k[:, lo:hi].transpose(1, 2), out=p)
        ps = buf.as_strided((bsz, tr, j), (tr * wr, wr + 1, d), slack - c0)
        if c0 or c1 < tr + 2 * reach:
            mask = (cols[:tr] >= c0) & (cols[:tr] < c1)
            torch.where(mask, ps, zero, out=out[:, r0:r0 + tr])
        else:
            out[:, r0:r0 + tr] = ps


def relayout(x: torch.Tensor, d: int, buf: torch.Tensor) -> torch.Tensor:
    """Layout eOperator: ``[B, M, C] -> [B*d, M/d, C]`` with ``[b*d + r, i'] = x[b, d*i' + r]``."""
    bsz, m, c = x.shape
    buf.view(bsz, d, m // d, c).copy_(x.view(bsz, m // d, d, c).transpose(1, 2))
    return buf


def unlayout(y: torch.Tensor, d: int, out: torch.Tensor) -> None:
    """Output eOperator: ``[B*d, M/d, C] -> [B, M, C]``."""
    bsz, m, c = out.shape
    out.view(bsz, m // d, d, c).copy_(y.view(bsz, d, m // d, c).transpose(1, 2))


# ----------------------------------------------------------------------------- GBMM
def gb_loop_j(s, v, w, d, out) -> None:
    out.zero_()
    m = s.shape[1]
    for j in range(2 * w + 1):
        off = d * (j - w)
        lo, hi = max(0, -off), min(m, m - off)
        if lo < hi:
            out[:, lo:hi] += s[:, lo:hi, j, None] * v[:, lo + off:hi + off]


def gb_unfold_bmm(s, v, w, d, out) -> None:
    bsz, m, n = v.shape
    vp = _pad_rows(v, d * w, d * w)
    rows = max(1, 16 * CHUNK // (bsz * (2 * w + 1) * n * 4))
    for r0 in range(0, m, rows):
        r = min(rows, m - r0)
        win = vp.as_strided((bsz, r, 2 * w + 1, n), (vp.stride(0), n, d * n, 1), r0 * n)
        out[:, r0:r0 + r] = torch.matmul(s[:, r0:r0 + r, None, :], win)[..., 0, :]


def gb_full_gather(s, v, w, d, out) -> None:
    bsz, m, _ = s.shape
    pad = d * w
    lp = m + 2 * pad
    rows = max(1, CHUNK // (lp * 4))
    buf = s.new_empty((rows, lp))
    for b in range(bsz):
        for r0 in range(0, m, rows):
            r = min(rows, m - r0)
            buf[:r].zero_()            # the band moves with r0: clear the last one
            buf.as_strided((r, 2 * w + 1), (lp + 1, d), r0).copy_(s[b, r0:r0 + r])
            torch.mm(buf[:r, pad:pad + m], v[b], out=out[b, r0:r0 + r])


def gb_blocked(s, v, w, d, out, t: int = 1000) -> None:
    """Blocks of t rows: the band of S scattered (stride d) into a zero buffer [t, t + 2dw]
    of the padded window, times the window of the zero-padded V (one batched bmm, no
    clipping: clipping needs a per-matrix strided operand)."""
    bsz, m, n = v.shape
    reach = d * w
    width = t + 2 * reach
    vp = _pad_rows(v, reach, reach + t)
    a = band._workspace(bsz * t * width, s).view(bsz, t, width)
    a.zero_()                            # off the band: stays 0 (same places every block)
    for r0 in range(0, m, t):
        tr = min(t, m - r0)
        a.as_strided((bsz, tr, 2 * w + 1), (t * width, width + 1, d)).copy_(s[:, r0:r0 + tr])
        win = vp.as_strided((bsz, width, n), (vp.stride(0), n, 1), r0 * n)
        out[:, r0:r0 + tr] = torch.bmm(a, win)[:, :tr]


def gb_blocked_clipped(s, v, w, d, out, t: int = 1000) -> None:
    """As ``blocked`` with the window clipped to [0, M): the bmm reads a column range of the
    buffer (a strided operand: one GEMM per batch)."""
    bsz, m, _ = v.shape
    reach = d * w
    width = t + 2 * reach
    a = band._workspace(bsz * t * width, s).view(bsz, t, width)
    a.zero_()
    for r0 in range(0, m, t):
        tr = min(t, m - r0)
        lo, hi, c0, c1 = _clip(m, r0, tr, reach)
        a.as_strided((bsz, tr, 2 * w + 1), (t * width, width + 1, d)).copy_(s[:, r0:r0 + tr])
        out[:, r0:r0 + tr] = torch.bmm(a[:, :tr, c0:c1], v[:, lo:hi])


# ----------------------------------------------------------------------------- harness
def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) << 10 for x in f if x.startswith("VmHWM"))


def _reset_peak() -> int:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _peak_rss()


def measure(fns: dict[str, Fn], runs: int, after_first: Callable[[str], None],
            slow: dict[str, int]) -> dict[str, tuple[list[float], int]]:
    """Round 0 is the warm-up (each result checked by ``after_first``), then ``runs`` timed
    rounds, the formulations alternating within each round. A formulation in ``slow`` runs
    only in the first ``slow[name]`` rounds, round 0 timed too (no separate warm-up)."""
    times: dict[str, list[float]] = {n: [] for n in fns}
    peaks = dict.fromkeys(fns, 0)
    for it in range(runs + 1):
        for name, fn in fns.items():
            if name in slow and it >= slow[name]:
                continue
            base = _reset_peak()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if it or name in slow:
                times[name].append(dt)
                peaks[name] = max(peaks[name], _peak_rss() - base)
            if not it:
                after_first(name)
    return {n: (times[n], peaks[n]) for n in fns}


def table(title: str, res: dict[str, tuple[list[float], int]], derived: str,
          notes: dict[str, str]) -> None:
    med = {n: statistics.median(t) for n, (t, _) in res.items()}
    plain = [n for n in med if not n.startswith("derived")]
    best = min(plain, key=med.__getitem__) if plain else None
    print(f"\n{title}")
    print(f"{'formulation':<17}{'median ms':>11}{'min ms':>10}{'max ms':>10}{'runs':>5}"
          f"{'peak MiB':>9}{'/ derived':>10}  notes")
    for n, (t, peak) in res.items():
        print(f"{n:<17}{med[n] * 1e3:>11.1f}{min(t) * 1e3:>10.1f}{max(t) * 1e3:>10.1f}"
              f"{len(t):>5}{peak / 2**20:>9.0f}{med[n] / med[derived]:>9.2f}x  "
              f"{notes.get(n, '')}")
    if best:
        others = [n for n in med if n.startswith("derived") and n != derived]
        print(f"best plain ({best}) / {derived}: {med[best] / med[derived]:.2f}x" + "".join(
            f"; / {n}: {med[best] / med[n]:.2f}x" for n in others))


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    if err > 1e-4:
        raise AssertionError(f"{name}: relative error {err:.2e} vs the derived result")


def case(op: str, d: int, quick: bool, runs: int, slow_runs: int) -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(B, M, K if op == "G2BMM" else J, generator=g)
    b = torch.randn(B, M, K, generator=g)
    out_shape = (B, M, J) if op == "G2BMM" else (B, M, K)
    want, scratch = torch.empty(out_shape), torch.empty(out_shape)
    buf_a, buf_b, mid = torch.empty(a.shape), torch.empty(b.shape), torch.empty(out_shape)
    kern = band.g2bmm if op == "G2BMM" else band.gbmm
    plain = {"G2BMM": [("loop-j", g2_loop_j), ("unfold-bmm", g2_unfold_bmm),
                       ("full-gather", g2_full_gather), ("blocked", g2_blocked)],
             "GBMM": [("loop-j", gb_loop_j), ("unfold-bmm", gb_unfold_bmm),
                      ("full-gather", gb_full_gather), ("blocked", gb_blocked),
                      ("blocked-clipped", gb_blocked_clipped)]}[op]
    fns: dict[str, Fn] = {}
    if d > 1:
        def derived() -> None:
            ar, br = relayout(a, d, buf_a), relayout(b, d, buf_b)
            r = mid.view(B * d, M // d, -1)
            kern(ar.view(B * d, M // d, -1), br.view(B * d, M // d, -1), W, 1, out=r)
            unlayout(r, d, want)
        fns["derived"] = derived
        fns["derived-fused"] = lambda: kern(a, b, W, d, out=scratch)
    else:
        fns["derived"] = lambda: kern(a, b, W, 1, out=want)
    for name, f in plain:
        if not (quick and name in ("loop-j", "unfold-bmm")):
            fns[name] = lambda f=f: f(a, b, W, d, scratch)
    full = B * M * (M + 2 * d * W) * 4
    unfold = B * M * J * K * 4
    notes = {
        "derived": ("layout copies + band kernel (d=1) + output copy" if d > 1
                    else "band kernel (d=1)"),
        "derived-fused": "band kernel (d=4): same, operand through strided views",
        "full-gather": f"chunked rows; unchunked it would need {full / 2**30:.1f} GiB",
        "unfold-bmm": (f"chunked rows; all windows at once: {unfold / 2**30:.0f} GiB "
                       f"({'> 12 GB, not run' if unfold > LIMIT else 'fits'})"),
        "blocked": ("T=1000 rows, window clipped to [0, M)" if op == "G2BMM"
                    else "T=1000 rows, padded window"),
        "blocked-clipped": "T=1000 rows, window clipped to [0, M)",
    }

    def verify(name: str) -> None:
        if name != "derived":
            check(name, scratch, want)

    slow = {n: slow_runs for n in ("loop-j", "unfold-bmm") if n in fns}

    title = (f"{op} [B={B}, M={M}, {'K' if op == 'G2BMM' else 'N'}={K}], w={W}, d={d}  "
             f"(threads={torch.get_num_threads()}, runs={runs}, "
             f"load avg {os.getloadavg()[0]:.1f})")
    table(title, measure(fns, runs, verify, slow), "derived", notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs (at least 5)")
    ap.add_argument("--slow-runs", type=int, default=1,
                    help="runs of loop-j and unfold-bmm (30-80 s each on 2 cores)")
    ap.add_argument("--quick", action="store_true", help="leave out loop-j and unfold-bmm")
    ap.add_argument("--only", choices=["g2bmm", "gbmm", "d1"], help="run one case")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = [("G2BMM", D), ("GBMM", D), ("G2BMM", 1), ("GBMM", 1)]
    if args.only:
        cases = {"g2bmm": cases[:1], "gbmm": cases[1:2], "d1": cases[2:]}[args.only]
    for op, d in cases:
        case(op, d, args.quick, max(args.runs, 5), max(args.slow_runs, 1))


if __name__ == "__main__":
    main()
