"""The CPU eOperator backend: :func:`compile_cpu` generates numba loop nests.

Pipeline: :func:`~ollie.codegen.plan.make_plan` inlines or materialises nested scopes into a
sequence of loop nests over flat buffers; :func:`~ollie.codegen.residue.split_residues` splits
strided selective sums by residue; :func:`~ollie.codegen.analysis.analyse` classifies
every read dimension by range analysis (which reads need bounds checks where, the interior
interval of the innermost traversal loop, clamped summation loops, how the leading loops are
fused into one ``prange``); :func:`~ollie.codegen.emit.emit_module` writes the Python source
(``@njit(parallel=True, fastmath=False, cache=True)`` functions with explicit signatures, so
they are compiled, or loaded from numba's cache, when the module is imported), and
:func:`~ollie.codegen.pattern.parametrise_module` makes the sizes of their outer loops
arguments (one compiled function per expression pattern);
:mod:`~ollie.codegen.cache` stores it on disk under a digest of the expression's text and
imports it once its text is checked to be one this module generates for the expression. Its
functions are compiled once per text for every kernel that holds them
(:mod:`~ollie.codegen.nests`): candidates and layers repeat the same loop nest. A
single affine read summed through a unimodular index map also has a *scatter* form
(:mod:`~ollie.codegen.scatter`: loop over the input, add into the output);
:func:`choose_source` times both forms once and the faster one is stored (with the code numba
compiled for its trial, so it is not compiled again).

Numerics. Reads are float32; the body is evaluated and summed in the accumulator type: float32
when the scope sums fewer than :data:`~ollie.codegen.analysis.FLOAT64_TERMS` (4096) terms, or
has no summation, float64 otherwise; the result is rounded to float32 once. With ``u = 2**-24``
(float32) and a body of ``d`` operations summed over ``n`` points (recursive summation),
``|computed - exact| <= ((n - 1) + d + 1) * u * sum(|term|) + O(u**2)``: at most about
``4097 * 6e-8 ~ 2.4e-4`` times the sum of the absolute values of the terms for float32 sums
(typically ``sqrt(n) * u`` relative), and ``n * 2**-53 * sum(|term|)`` plus one float32 rounding
(``u * |result|``) for float64 sums. Pairwise or Kahan summation is not used. The interpreter
(``ollie.interpret``) computes in float64 and rounds once, so results agree within these bounds.

NaN and infinities. The kernel computes the interpreter's semantics, structural zeros included:
a read outside its buffer (an input, or a materialised nested scope outside its ranges) is 0
and annihilates the product it is a factor of, and the quotient it is the numerator of, even
where the other operand is NaN or infinite (:mod:`ollie.codegen.body`); skipped summation
points (clamped and residue-split loops, scatter forms) are exactly those terms. An element of a
materialised nested scope is an ordinary value; a scope whose body may be a structural zero is
not inlined where its read is a factor (:mod:`ollie.codegen.plan`). So a NaN or an infinity in
an input reaches exactly the outputs whose terms read it, as in the interpreter.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from dataclasses import replace
from math import prod
from pathlib import Path

import numpy as np

from ollie.cachedir import checked_dir
from ollie.codegen.analysis import FLOAT64_TERMS, PARALLEL_MIN_POINTS, NestInfo, analyse
from ollie.codegen.cache import (
    adopt_numba_cache,
    decls_key,
    default_cache_dir,
    full_key,
    load_module,
    load_path,
    text_key,
    unload_path,
)
from ollie.codegen.emit import emit_module
from ollie.codegen.kernel import CompiledKernel
from ollie.codegen.pattern import parametrise_module
from ollie.codegen.plan import Plan, make_plan, residue_groups
from ollie.codegen.residue import split_residues
from ollie.codegen.scatter import emit_scatter_module, flattened, scatter_form
from ollie.fingerprint import canonical_form, fingerprint
from ollie.ir import Expr, format_expr, parse

log = logging.getLogger(__name__)

THREADING_LAYER_PRIORITY = ("omp", "tbb", "workqueue")
"""Order in which numba tries its threading layers, set when the process has not chosen one
(``NUMBA_THREADING_LAYER`` / ``NUMBA_THREADING_LAYER_PRIORITY`` unset) and no parallel numba
code ran yet. ``omp`` first: its workers spin briefly after a parallel loop, so the next launch
is cheap. Measured on the 2-core machine (numba 0.68;
docs/design/020-codegen-measurements.md): an empty parallel loop costs 1.3-1.6 us back to
back and 47 us after 10 ms idle with ``omp``, 60-120 us in every case with
``workqueue`` (which wakes sleeping threads per launch); the [16,256,14,14] offset-add after a
torch matmul 1.0-1.4 ms against 1.8-3.4 ms; InfoGAN b16 end to end 3-13% faster. (numba's
default puts ``tbb`` first, which this machine does not have.) Kernel calls are serialised by
:data:`_RUN_LOCK` (each already uses every core; ``workqueue``, when a user selects it, is not
thread-safe)."""

_RUN_LOCK = threading.Lock()

CHOICE_ROUNDS = 15
"""Timed rounds when :func:`choose_source` picks between the gather and scatter forms."""

_KERNELS: dict[tuple[Expr, str], CpuKernel] = {}


class CpuKernel(CompiledKernel):
    """A generated numba kernel (``source``: the module text, ``path``: its file)."""

    backend = "cpu"

    def __init__(self, expr: Expr, module, path: Path, from_disk: bool,
                 compile_seconds: float) -> None:
        super().__init__(expr)
        if tuple(module.INPUTS) != self.input_names:
            raise RuntimeError(f"kernel module {path} binds inputs {module.INPUTS}, expected "
                               f"{self.input_names}")
        self.module = module
        self.path = path
        self.from_disk = from_disk
        self.compile_seconds = compile_seconds
        self._fn = module.run

    @property
    def source(self) -> str:
        return self.path.read_text()

    def _run(self, arrays: list[np.ndarray], out: np.ndarray) -> None:
        flat = [(a if a.flags.writeable else a.copy()).reshape(-1) for a in arrays]
        with _RUN_LOCK:
            self._fn(*flat, out.reshape(-1))

    def run_flat(self, flat: list[np.ndarray], out: np.ndarray) -> None:
        """The generated code on flat float32 arrays in :attr:`input_names` order, no checks
        (for an executor whose shapes were checked when the program was built)."""
        with _RUN_LOCK:
            self._fn(*flat, out)


def configure_numba() -> None:
    """Set :data:`THREADING_LAYER_PRIORITY` unless the process chose a layer or an order, or
    already started one."""
    import numba
    from numba.np.ufunc import parallel

    chosen = any(os.environ.get(v) for v in ("NUMBA_THREADING_LAYER",
                                                 "NUMBA_THREADING_LAYER_PRIORITY"))
    if numba.config.THREADING_LAYER == "default" and not chosen and \
            not parallel._is_initialized:
        numba.config.THREADING_LAYER_PRIORITY = list(THREADING_LAYER_PRIORITY)


def generate_source(expr: Expr, canonical: str | None = None, form: str = "gather", *,
                    literal_sizes: bool = False) -> str:
    """The generated module text for ``expr`` (no caching, no import). ``form``: ``"gather"``
    (loop nests over the output, any expression) or ``"scatter"`` (over the input, see
    :mod:`ollie.codegen.scatter`; ValueError when ``expr`` has no scatter form). Sizes are
    arguments of the functions (:mod:`ollie.codegen.pattern`, serial nests in nested loops)
    unless ``literal_sizes`` (the form compiled per shape, one fused loop per nest, for
    comparisons)."""
    header = _header(expr, canonical)
    if form == "scatter":
        sf = scatter_form(expr, FLOAT64_TERMS)
        if sf is None or not sf.parallel_levels():
            raise ValueError(f"no parallel scatter form for {format_expr(expr)}")
        text = emit_scatter_module(sf, header)
    elif form == "gather":
        plan = split_residues(make_plan(expr))
        text = emit_module(plan, analyse_plan(plan), header, nested=not literal_sizes)
    else:
        raise ValueError(f"unknown kernel form {form!r} (gather or scatter)")
    return text if literal_sizes else parametrise_module(text)


def _header(expr: Expr, canonical: str | None) -> dict[str, str]:
    return {"text": format_expr(expr),
            "CANONICAL": canonical if canonical is not None else canonical_form(expr)}


def source_forms(expr: Expr, canonical: str | None = None) -> dict[str, str]:
    """The module texts :func:`choose_source` chooses from: ``{"gather": ...}``, and
    ``"scatter"`` where the expression has a parallel scatter form."""
    gather = generate_source(expr, canonical)
    sf = scatter_form(expr, FLOAT64_TERMS)
    if sf is None:
        flat = flattened(expr)
        sf = scatter_form(flat, FLOAT64_TERMS) if flat is not None else None
    if sf is None or not sf.parallel_levels():
        return {"gather": gather}
    scatter = parametrise_module(emit_scatter_module(sf, _header(expr, canonical)))
    return {"gather": gather, "scatter": scatter}


def choose_source(expr: Expr, canonical: str | None = None, path: Path | None = None) -> str:
    """The module text of the faster form: for an expression with a parallel scatter form
    both forms are compiled in a temporary directory and timed alternately on random inputs
    (median of :data:`CHOICE_ROUNDS` rounds); otherwise the gather form.

    ``path``: where the caller will store the text. The trial modules then take its file
    name, and numba's compiled code of the winner is copied beside it
    (:func:`~ollie.codegen.cache.adopt_numba_cache`), so that importing it compiles nothing
    again (each choice compiled three modules before: two trials and the winner). A form
    compiled ahead by :func:`ollie.codegen.precompile.precompile` (the same text, staged
    under ``path``'s directory) is used as it is: loading it compiles nothing."""
    from ollie.codegen.precompile import staged, unstage

    sources = source_forms(expr, canonical)
    if len(sources) == 1:
        ready = staged(path, "gather", sources["gather"]) if path is not None else None
        if ready is not None and path is not None:
            if _loads(ready, path.parent):
                unload_path(ready)
                _adopt(ready, path)
            unstage(ready)
        return sources["gather"]
    from ollie.tune.measure import measure_alternating

    rng = np.random.default_rng(0)
    flat = [rng.standard_normal(prod(shape), dtype=np.float32) for _, shape in expr.decls]
    out = np.empty(prod(expr.shape), np.float32)
    file_name = path.name if path is not None else f"trial_{fingerprint(expr)}.py"
    nests = path.parent if path is not None else default_cache_dir()
    with tempfile.TemporaryDirectory(prefix="ollie-choice-") as tmp:
        fns, trials, ready = {}, {}, []
        for name, text in sources.items():
            trial = staged(path, name, text) if path is not None else None
            if trial is not None and not _loads(trial, nests):
                unstage(trial)
                trial = None
            if trial is None:
                trial = Path(tmp) / name / file_name
                trial.parent.mkdir()
                trial.write_text(text)
            else:
                ready.append(trial)
            trials[name] = trial
            module = load_path(trial, nests)
            fns[name] = (lambda m=module: m.run(*flat, out))
        with _RUN_LOCK:
            times = measure_alternating(fns, "cpu", rounds=CHOICE_ROUNDS, min_sample=5e-3)
        for trial in trials.values():  # the trial modules are not kept
            unload_path(trial)
        best = min(times, key=times.get)
        if path is not None:
            _adopt(trials[best], path)
        for trial in ready:
            unstage(trial)
    log.debug("eOp form: %s (%s)", best,
              ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in times.items()))
    return sources[best]


def _loads(trial: Path, nests: Path) -> bool:
    """Whether the module at ``trial`` imports, its nest modules under ``nests`` (a form
    compiled ahead whose numba code does not load is compiled here instead, as if it had not
    been)."""
    try:
        load_path(trial, nests)
    except Exception as exc:  # numba's and importlib's errors have many types
        unload_path(trial)
        log.warning("kernel compiled ahead at %s did not load (%s); compiling it here",
                    trial, exc)
        return False
    return True


def _adopt(trial: Path, path: Path) -> None:
    """numba's compiled code of ``trial`` beside ``path`` (if that fails, importing ``path``
    compiles it)."""
    try:
        adopt_numba_cache(trial, path)
    except OSError as exc:
        log.debug("numba cache of %s not copied: %s", trial, exc)


def analyse_plan(plan: Plan) -> list[NestInfo]:
    """Range analysis of every nest of ``plan``. The residue nests of one nest (consecutive,
    with the same non-empty ``outer``) are emitted as one function with one fused loop, so
    whether that loop runs in parallel is decided by their points together: each residue nest
    alone can fall under :data:`~ollie.codegen.analysis.PARALLEL_MIN_POINTS` while the group
    does not (DCGAN b16's last selective add, 4 x 196,608 points, ran serially)."""
    buffers = plan.buffers
    infos = [analyse(nest, buffers) for nest in plan.nests]
    for k, j in residue_groups(plan.nests):
        group = infos[k:j]
        items = group[0].xblocks * prod(it.size for it in group[0].outer[:group[0].fused])
        points = sum(prod(it.size for it in info.scope.iters) for info in group)
        parallel = points >= PARALLEL_MIN_POINTS and items > 1
        infos[k:j] = [replace(info, parallel=parallel) for info in group]
    return infos


def compile_cpu(expr: Expr | str, *, cache_dir: str | Path | None = None) -> CompiledKernel:
    """Compile ``expr`` to a numba CPU kernel (see the module docstring).

    ``cache_dir`` holds the generated modules (default :func:`default_cache_dir`). Kernels are
    also cached in-process by expression. The returned kernel is called as
    ``kernel(inputs, out=None)`` (:class:`~ollie.codegen.kernel.CompiledKernel`).
    """
    if isinstance(expr, str):
        expr = parse(expr)
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = (expr, str(directory))
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    start = time.perf_counter()
    configure_numba()
    canonical = canonical_form(expr)
    stem = module_stem(expr)
    fallback = f"ollie_{full_key(canonical)}_{decls_key(expr.decls)}"
    def accept(text: str) -> bool:  # a form this code generator writes for expr
        return text in source_forms(expr, canonical).values()

    try:
        module, existed = load_module(directory, stem, canonical, fallback,
                                      lambda path: choose_source(expr, canonical, path), accept)
    except OSError as exc:  # the cache directory failed: a private temporary one instead
        directory = checked_dir(Path(tempfile.mkdtemp(prefix="ollie-kernels-")))
        log.warning("kernel cache %s unusable (%s); using %s", key[1], exc, directory)
        module, existed = load_module(directory, stem, canonical, fallback,
                                      lambda path: choose_source(expr, canonical, path), accept)
    seconds = time.perf_counter() - start
    kernel = CpuKernel(expr, module, Path(module.__file__), existed, seconds)
    log.debug("compiled eOp %s in %.2fs (%s)", stem, seconds,
              "from cache" if existed else "generated")
    _KERNELS[key] = kernel
    return kernel


def module_stem(expr: Expr) -> str:
    """The file stem of ``expr``'s kernel module in the cache directory: a digest of the
    expression's exact text (iterator names included), so that the module text is one of
    :func:`source_forms` of ``expr`` and can be checked before it is imported
    (:func:`ollie.codegen.cache.load_module`), and of its declarations."""
    return f"ollie_{text_key(format_expr(expr))}_{decls_key(expr.decls)}"


def is_loaded(expr: Expr, cache_dir: Path) -> bool:
    """Whether ``expr``'s kernel from ``cache_dir`` is already compiled in this process."""
    return (expr, str(cache_dir)) in _KERNELS


def clear_memory_cache() -> None:
    """Forget in-process kernels (the disk cache stays)."""
    _KERNELS.clear()
