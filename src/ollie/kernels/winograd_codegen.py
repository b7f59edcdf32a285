"""Code generation of the Winograd transforms (:mod:`ollie.kernels.winograd`): the Cook-Toom
matrices of ``F(m, r)`` (:func:`matrices`) and the numba modules of the input transform
(:func:`input_module`) and the output transform (:func:`output_module`), generated once per
``F(m, r)`` and channel block (:func:`block`) and kept in the kernel cache
(:mod:`ollie.codegen.cache`).

Per tile, each transform is two passes, down the columns then along the rows; a pass is a
loop over columns (rows) around one loop over channels that loads the column's ``n`` elements
and stores its results, with the matrices' non-zero coefficients written out (they are the
same for every column, so the column is a loop variable, not written out: the text numba
types and lowers is ``n`` times smaller). Scratch rows (and the transformed input's rows) are
a channel block long, a compile-time constant, so a row's offset is a constant times the
column plus a constant, all of a loop's scratch accesses fall into one of LLVM's runtime
alias-check groups and the loop vectorises; an index is that offset, set before the loop over
channels, plus the loop variable. Interior tiles read the input directly; tiles at the border
gather a zero-padded patch first.

Why this form (measured against one loop per transformed element, against offsets added into
the index, and against one loop per column written out): docs/design/004-winograd-convolutions.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

log = logging.getLogger(__name__)

KERNEL_VERSION = 12
"""Part of the generated modules' names: bump it whenever the generated text changes, so
that modules of an older generator in the kernel cache are not imported (history:
docs/design/010-caches.md)."""


def _points(count: int) -> list[Fraction]:
    """``0, 1, -1, 2, -2, 1/2, -1/2, 3, -3, ...``: the interpolation points (small values and
    their reciprocals keep the matrices' entries small)."""
    pts = [Fraction(0)]
    k = 1
    while len(pts) < count:
        for p in (Fraction(k), Fraction(-k), Fraction(1, k + 1), Fraction(-1, k + 1)):
            if p not in pts:
                pts.append(p)
        k += 1
    return pts[:count]


def _poly_mul(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def matrices(m: int, r: int) -> tuple[list[list[Fraction]], ...]:
    """``(A^T, G, B^T)`` of ``F(m, r)`` (exact fractions; ``A^T`` is ``m x n``, ``G``
    ``n x r``, ``B^T`` ``n x n``, ``n = m + r - 1``): for a 1-D correlation
    ``y[i] = sum_k g[k] d[i + k]`` of a length-``n`` input, ``y = A^T ((G g) * (B^T d))``."""
    n = m + r - 1
    pts = _points(n - 1)
    at = [[p ** i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for p in pts:
        den = Fraction(1)
        for q in pts:
            if q != p:
                den *= p - q
        g.append([p ** k / den for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    bt = []
    for j in range(n - 1):
        poly = [Fraction(1)]
        for q in pts[:j] + pts[j + 1:]:
            poly = _poly_mul(poly, [-q, Fraction(1)])
        bt.append([*poly, Fraction(0)])
    full = [Fraction(1)]
    for q in pts:
        full = _poly_mul(full, [-q, Fraction(1)])
    bt.append(full)
    return at, g, bt


def _const(c: Fraction) -> str:
    """The module-level name of the float32 constant ``c`` (:func:`float_constants` defines it)."""
    return "K_" + repr(float(c)).replace(".", "_").replace("-", "m").replace("+", "p")


def float_constants(*mats: list[list[Fraction]]) -> str:
    """Definitions of the float32 constants of ``mats``' entries other than 0 and +-1: numba
    takes a global's value as a compile-time constant, so the code is the same as with
    ``np.float32(...)`` at each use, which numba types call by call (the input transform of
    ``F(4x4, 2x2)`` typed 440 of them)."""
    values = sorted({abs(c) for m in mats for row in m for c in row} - {0, 1})
    return "".join(f"{_const(v)} = np.float32({float(v)!r})\n" for v in values)


def lincomb(coefs: list[Fraction], names: list[str]) -> str:
    """The source of ``sum_k coefs[k] * names[k]`` (zero terms dropped, +-1 unscaled)."""
    terms = []
    for c, name in zip(coefs, names, strict=True):
        if c == 0:
            continue
        if c == 1:
            terms.append(f"+ {name}")
        elif c == -1:
            terms.append(f"- {name}")
        else:
            terms.append(f"{'+' if c > 0 else '-'} {_const(abs(c))} * {name}")
    if not terms:
        return "np.float32(0.0)"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def block(channels: int) -> int:
    """The channel block a transform is generated for: ``channels`` rounded up to a multiple
    of 16 (up to 64) or of 64, so that few modules serve all channel counts. The transformed
    input has rows of this many channels; those past ``channels`` hold zeros (their
    transformed weights are zero too)."""
    step = 16 if channels <= 64 else 64
    return max(step, -(-channels // step) * step)


Access = Callable[[int, str], tuple[list[str], str]]
"""An element accessor of a transform pass: for row ``a`` of the column held in the loop
variable named by the second argument, the lines that set up its offset once per column
(before the loop over channels) and the element's expression at channel ``c``."""


def transform_pass(mat: list[list[Fraction]], rows: int, n: int, load: Access, store: Access,
                   cols: int, count: str) -> list[str]:
    """``dst(i, j) = sum_k mat[i][k] src(k, j)`` for ``i < rows``, ``j < cols``: one loop
    over columns ``j`` and in it one loop over channels ``c < count`` that loads the
    ``src(k, j)`` it needs and stores ``dst(0 .. rows-1, j)`` (``load`` / ``store`` give an
    element's access). The coefficients do not depend on ``j``, so the column is a runtime
    loop: the generated text, and numba's work typing it, is ``cols`` times smaller than one
    loop per column written out (docs/design/004-winograd-convolutions.md)."""
    used = [k for k in range(n) if any(mat[i][k] != 0 for i in range(rows))]
    setup: list[str] = []
    loads: dict[int, str] = {}
    for k in used:
        lines, loads[k] = load(k, "j")
        setup += lines
    stores = []
    for i in range(rows):
        lines, text = store(i, "j")
        setup += lines
        stores.append(text)
    body = [f"    for c in range({count}):"]
    body += [f"        d{k} = {loads[k]}" for k in used]
    body += [f"        {stores[i]} = " + lincomb(mat[i], [f"d{k}" for k in range(n)])
             for i in range(rows)]
    return [f"for j in range({cols}):", *("    " + line for line in dict.fromkeys(setup)),
            *body]


def scratch_row(array: str, width: int, cb: int, swap: bool = False) -> Access:
    """Element ``(a, j)`` of a scratch ``array`` of ``width``-row blocks of ``cb`` channels,
    at channel ``c`` (``(j, a)`` with ``swap``): an offset set once per column plus ``c``, so
    that every access of a loop over channels is the row's start plus the loop variable."""
    def access(a: int, j: str) -> tuple[list[str], str]:
        const, step = (a * cb, width * cb) if swap else (a * width * cb, cb)
        name = f"o_{array}{a}"
        return [f"{name} = {const} + {j} * {step}"], f"{array}[{name} + c]"
    return access


def input_access(dil: str) -> Access:
    """Element ``(k, j)`` of an input patch read in place from ``x`` (``[batch, row, column,
    channel]``): rows ``row0 .. row{n-1}`` are set before the pass (:func:`patch_rows`), the
    column from ``x0`` and the step ``dil``."""
    def access(k: int, j: str) -> tuple[list[str], str]:
        return [f"col = x0 + {dil} * {j}"], f"x[b, row{k}, col, c]"
    return access


def patch_rows(n: int, dil: str) -> list[str]:
    """The rows an :func:`input_access` pass reads: ``row{k} = y0 + dil * k``."""
    return [f"row{k} = y0 + {dil} * {k}" for k in range(n)]


def indented(lines: list[str], depth: int) -> str:
    """``lines`` as source text indented ``depth`` levels."""
    return "".join("    " * depth + line + "\n" for line in lines)


INPUT_SIGNATURES = (
    "void(float32[:, :, :, ::1], float32[:, :, ::1], int64, int64, int64[:, ::1], int64, int64, "
    "int64, int64)",
    "void(float32[:, :, :, :], float32[:, :, ::1], int64, int64, int64[:, ::1], int64, int64, "
    "int64, int64)")
"""The signatures of ``transform_input`` compiled ahead (:func:`precompile`): the input as a
C-contiguous channels-last array and as a strided one (an NCHW input read in place, as
:func:`ollie.kernels.winograd._build` does for small planes: copying it to channels-last
first was slower: docs/design/011-compiling-kernels-ahead.md). Other types compile on their
first call."""

OUTPUT_SIGNATURES = (
    "void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[::1], float32[:, :, :, ::1], "
    "int64, int64, int64[::1], int64, int64, int64, int64, int64, int64, int64, int64)",)
"""The signature of ``transform_output`` compiled ahead (no residual, or a channels-last
one)."""

_HEADER = '''"""Generated by ollie.kernels.winograd: F({m}x{m}, {r}x{r}) {what}."""
import numpy as np
from numba import njit, prange

CANONICAL = {canonical!r}
N_ = {n}
M_ = {m}
CB = {cb}
{constants}

@njit(fastmath=False, cache=True)
def _origin(t, per, tw, dil):
    """Tile ``t``: its batch entry and first output row and column (tiles of one residue
    class modulo ``dil`` hold outputs ``dil`` apart)."""
    b = t // per
    rr = t - b * per
    ty = rr // tw
    tx = rr - ty * tw
    return b, ty % dil + (ty // dil) * dil * M_, tx % dil + (tx // dil) * dil * M_
'''

_INPUT = '''

@njit(fastmath=False, cache=True)
def _tile_input(x, v, patch, h, b, y0, x0, dil):
    """``v``: this tile's transformed input, ``N_ * N_`` rows of ``CB``; ``x``: the input
    indexed ``[batch, row, column, channel]`` (any strides); the tile's patch starts at row
    ``y0`` and column ``x0`` (may be outside: zeros)."""
    H, W, C = x.shape[1], x.shape[2], x.shape[3]
    span = dil * (N_ - 1)
    if y0 >= 0 and y0 + span < H and x0 >= 0 and x0 + span < W:
{direct}    else:
        for i in range(N_):
            yy = y0 + dil * i
            for j in range(N_):
                xx = x0 + dil * j
                p = (i * N_ + j) * CB
                if yy >= 0 and yy < H and xx >= 0 and xx < W:
                    for c in range(C):
                        patch[p + c] = x[b, yy, xx, c]
                else:
                    for c in range(C):
                        patch[p + c] = np.float32(0.0)
{gathered}{rows}

@njit(parallel=True, fastmath=False, cache=True)
def transform_input(x, V, t0, count, pads, dil, th, tw, chunk):
    """Tiles ``t0 .. t0 + count - 1`` of ``x`` into ``V`` (``[count, P, N_ * N_ * CB]``: per
    tile one row per part ``p``, whose patch is offset by ``pads[p]`` (top, left); the
    channels past ``x``'s of each row are not written)."""
    per = th * tw
    for q in prange((count + chunk - 1) // chunk):
        patch = np.empty({nn} * CB, np.float32)
        h = np.empty({nn} * CB, np.float32)
        for tl in range(q * chunk, min(count, (q + 1) * chunk)):
            b, y0, x0 = _origin(t0 + tl, per, tw, dil)
            for p in range(V.shape[1]):
                _tile_input(x, V[tl, p], patch, h, b, y0 - pads[p, 0], x0 - pads[p, 1], dil)
'''

STORE = """if mode == 0:
    for c in range(K):
        Y[b, oy, ox, c] = a[c] + bs[c]
elif mode == 1:
    for c in range(K):
        v = a[c] + bs[c]
        Y[b, oy, ox, c] = v if v > 0 else np.float32(0.0)
elif mode == 2:
    for c in range(K):
        Y[b, oy, ox, c] = a[c] + bs[c] + res[b, oy, ox, c]
else:
    for c in range(K):
        v = a[c] + bs[c] + res[b, oy, ox, c]
        Y[b, oy, ox, c] = v if v > 0 else np.float32(0.0)
"""
"""An output transform's store of one output position's ``K`` channels ``a`` to
``Y[b, oy, ox]``, with the bias ``bs`` and, by ``mode``, ReLU (1, 3) and the residual ``res``
(2, 3)."""

_OUTPUT = '''

@njit(fastmath=False, cache=True)
def _tile_output(mt, Y, bias, res, mode, s, ph0, ho, wo, h, acc, b, y0, x0, dil):
    """``mt``: this tile's products ``[N_ * N_, K2]`` (``K2 = phases * K <= CB``); ``Y``:
    the output ``[batch, s * ho, s * wo, K]``; ``res``: the residual, indexed like ``Y``."""
    K2 = mt.shape[1]
    K = Y.shape[3]
    phases = K2 // K
{cols}{rows}    for i in range(M_):
        yy = y0 + dil * i
        if yy >= ho:
            break
        for j in range(M_):
            xx = x0 + dil * j
            if xx >= wo:
                break
            for ph in range(phases):
                oy = s * yy + (ph0 + ph) // s
                ox = s * xx + (ph0 + ph) % s
                o = (i * M_ + j) * CB + ph * K
                a = acc[o:o + K]
                bs = bias[ph * K:ph * K + K]
{store}

@njit(parallel=True, fastmath=False, cache=True)
def transform_output(M, Y, bias, res, mode, s, ph0s, ho, wo, t0, count, dil, th, tw, chunk):
    """Tiles ``t0 .. t0 + count - 1`` from their products ``M`` (``[count, P, N_ * N_,
    K2]``: per tile the products of each part ``p``, whose first output phase is ``ph0s[p]``)
    into ``Y``."""
    per = th * tw
    for q in prange((count + chunk - 1) // chunk):
        h = np.empty({mn} * CB, np.float32)
        acc = np.empty({mm} * CB, np.float32)
        for tl in range(q * chunk, min(count, (q + 1) * chunk)):
            b, y0, x0 = _origin(t0 + tl, per, tw, dil)
            for p in range(M.shape[1]):
                _tile_output(M[tl, p], Y, bias, res, mode, s, ph0s[p], ho, wo, h, acc, b, y0,
                             x0, dil)
'''


def _input_source(m: int, r: int, cb: int, canonical: str) -> str:
    """The input transform ``V = B^T d B`` of ``F(m, r)`` for up to ``cb`` channels."""
    _, _, bt = matrices(m, r)
    n = m + r - 1
    h = scratch_row("h", n, cb)
    # down the columns: h(i, j) = sum_k B^T[i][k] d(k, j); along the rows:
    # V(i, j) = sum_k B^T[j][k] h(i, k), generated as the column pass of the transpose
    direct = patch_rows(n, "dil") + transform_pass(bt, n, n, input_access("dil"), h, n, "C")
    gathered = transform_pass(bt, n, n, scratch_row("patch", n, cb), h, n, "C")
    rows = transform_pass(bt, n, n, scratch_row("h", n, cb, swap=True),
                          scratch_row("v", n, cb, swap=True), n, "C")
    return (_HEADER.format(m=m, r=r, what=f"input transform, up to {cb} channels",
                           canonical=canonical, n=n, cb=cb, constants=float_constants(bt))
            + _INPUT.format(direct=indented(direct, 2), gathered=indented(gathered, 2),
                            rows=indented(rows, 1), nn=n * n))


def _output_source(m: int, r: int, cb: int, canonical: str) -> str:
    """The output transform ``A^T M A`` of ``F(m, r)`` for up to ``cb`` channels, with the
    bias, residual and ReLU, written to each phase's interleaved positions."""
    at, _, _ = matrices(m, r)
    n = m + r - 1

    def products(k: int, j: str) -> tuple[list[str], str]:
        return [f"o_mt{k} = {k * n} + {j}"], f"mt[o_mt{k}, c]"

    cols = transform_pass(at, m, n, products, scratch_row("h", n, cb), n, "K2")
    rows = transform_pass(at, m, n, scratch_row("h", n, cb, swap=True),
                          scratch_row("acc", m, cb, swap=True), m, "K2")
    return (_HEADER.format(m=m, r=r, what=f"output transform, up to {cb} channels",
                           canonical=canonical, n=n, cb=cb, constants=float_constants(at))
            + _OUTPUT.format(cols=indented(cols, 1), rows=indented(rows, 1), mn=m * n,
                             mm=m * m, store=indented(STORE.splitlines(), 4)))


_MODULES: dict[str, object] = {}

_SOURCES = {"in": _input_source, "out": _output_source}
_FUNCTIONS = {"in": ("transform_input", INPUT_SIGNATURES),
              "out": ("transform_output", OUTPUT_SIGNATURES)}


def _source(kind: str) -> Callable[[int, int, int, str], str]:
    """The generator of a transform kind: ``"in"`` / ``"out"`` here, ``"lin_in"`` /
    ``"lin_out"`` the overlap-add form's (:mod:`ollie.kernels.winograd_overlap_codegen`)."""
    if kind in _SOURCES:
        return _SOURCES[kind]
    from ollie.kernels import winograd_overlap_codegen as overlap

    return overlap.SOURCES[kind]


def _function(kind: str) -> tuple[str, tuple[str, ...]]:
    """The function of a transform kind's module compiled ahead, and its signatures."""
    if kind in _FUNCTIONS:
        return _FUNCTIONS[kind]
    from ollie.kernels import winograd_overlap_codegen as overlap

    return overlap.FUNCTIONS[kind]


def _names(kind: str, m: int, r: int, cb: int) -> tuple[str, str]:
    """The canonical text and the file stem of a transform module."""
    version = KERNEL_VERSION
    if kind not in _SOURCES:
        from ollie.kernels.winograd_overlap_codegen import KERNEL_VERSION as version
    return (f"winograd v{version} {kind} F({m},{r}) block {cb}",
            f"ollie_winograd_v{version}_{kind}_F{m}x{r}_c{cb}")


def _module(kind: str, m: int, r: int, cb: int):
    from ollie.codegen.cache import default_cache_dir, load_module
    from ollie.codegen.cpu import configure_numba

    canonical, stem = _names(kind, m, r, cb)
    mod = _MODULES.get(canonical)
    if mod is None:
        configure_numba()
        mod, _ = load_module(default_cache_dir(), stem, canonical, f"{stem}_b",
                             lambda _path: _source(kind)(m, r, cb, canonical))  # compared
        _MODULES[canonical] = mod
    return mod


def input_module(m: int, r: int, channels: int):
    """The input transform of ``F(m, r)`` for ``channels`` input channels (generated for
    their :func:`block`, from the kernel cache)."""
    return _module("in", m, r, block(channels))


def output_module(m: int, r: int, channels: int):
    """The output transform of ``F(m, r)`` for products of ``channels`` channels."""
    return _module("out", m, r, block(channels))


def overlap_modules(m: int, r: int, in_channels: int, out_channels: int):
    """The overlap-add form's input and output transforms of ``F(m, r)``
    (:mod:`ollie.kernels.winograd_overlap_codegen`) for ``in_channels`` input channels and
    ``out_channels`` per output phase."""
    return (_module("lin_in", m, r, block(in_channels)),
            _module("lin_out", m, r, block(out_channels)))


def precompile(transforms: list[tuple[str, int, int, int]]) -> int:
    """Compile ahead, side by side in one process per core
    (:func:`ollie.codegen.precompile.compile_side_by_side`), the transform modules
    ``(kind, m, r, channels)`` (kind ``"in"`` / ``"out"``, as :func:`input_module` /
    :func:`output_module` take them, or ``"lin_in"`` / ``"lin_out"``,
    :func:`overlap_modules`) that are neither loaded in this process nor compiled in the
    kernel cache; their files are written to the cache as :func:`input_module` would.
    The functions of a transform module compile on their first call (for the types they get);
    here they are compiled for :data:`INPUT_SIGNATURES` / :data:`OUTPUT_SIGNATURES`, into
    numba's cache, which the first call then loads. Returns how many modules were compiled. A
    convolution's candidates need two to four (input and output transform per tile size),
    each taking seconds per signature to compile (docs/design/011-compiling-kernels-ahead.md)."""
    from ollie.codegen.cache import default_cache_dir, ensure_text
    from ollie.codegen.precompile import compile_side_by_side, compiled, enabled

    if not enabled():
        return 0
    directory = default_cache_dir()
    todo: dict[Path, list[tuple[str, str]]] = {}
    for kind, m, r, channels in dict.fromkeys(transforms):
        cb = block(channels)
        canonical, stem = _names(kind, m, r, cb)
        path = directory / f"{stem}.py"
        if canonical in _MODULES:
            continue
        try:
            if not ensure_text(path, _source(kind)(m, r, cb, canonical)):
                continue  # another text under this name: load_module uses the fallback
        except OSError as exc:  # an unwritable cache: the modules compile when used
            log.warning("Winograd transforms not compiled ahead: %s", exc)
            return 0
        if not compiled(path):
            name, signatures = _function(kind)
            todo[path] = [(name, sig) for sig in signatures]
    if todo:
        from ollie.codegen.cpu import configure_numba

        configure_numba()  # before this process compiles its share of parallel code
    return compile_side_by_side(list(todo), signatures=todo)


__all__ = ["INPUT_SIGNATURES", "KERNEL_VERSION", "OUTPUT_SIGNATURES", "block", "input_module",
           "matrices", "output_module", "overlap_modules", "precompile"]
