"""Ollie's settings: the one value holding every choice that is not an argument of a call.

:class:`Settings` (a frozen dataclass) holds the cache directory, whether generated kernels
compile ahead on every core, whether CUDA programs replay as CUDA graphs, whether CUDA
eOperators run on Triton's CPU interpreter, the clocks of time budgets and of measurements, the
sleep of a measurement's settle, what the garbage collector does while Ollie times or
searches, which implementations programs may run on (:mod:`ollie.policy`), and the load of
other processes that tells whether a measurement was made on a busy machine.

The process's settings are read from the environment once, at the first :func:`current`
(:func:`from_environ` says which variable sets which field; README.md lists them). Nothing
else in the library reads those variables, and nothing writes them. :func:`using` changes
fields for a block (a test, or a user who wants another cache directory for one
optimisation) and restores them after; the change is held in a :class:`contextvars.ContextVar`,
so it is seen by the code the block runs and by nothing running concurrently in other
threads or tasks. A thread started inside the block sees the process's settings unless it
runs in a copy of the block's context (:func:`contextvars.copy_context`). :func:`configure`
replaces the process's settings (what the command line does).

Functions that already take configuration (``SearchConfig.clock``, the ``clock=`` of the
measurement functions, ``cache_dir=`` of the code generators) still take it explicitly; an
argument left at None means "the current settings'". Why one settings value, and what it
replaced: docs/design/019-settings.md.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ollie.machine_load import others_load
from ollie.policy import ALL, Implementations

CACHE_DIR_ENV = "OLLIE_CACHE_DIR"
"""Names the cache directory (:attr:`Settings.cache_dir`)."""
PRECOMPILE_ENV = "OLLIE_PRECOMPILE"
"""``0`` turns compiling ahead off (:attr:`Settings.precompile`)."""
CUDA_GRAPHS_ENV = "OLLIE_CUDA_GRAPHS"
"""``0`` / ``false`` / ``no`` / ``off`` turns CUDA graph capture off
(:attr:`Settings.cuda_graphs`)."""
TRITON_INTERPRET_ENV = "TRITON_INTERPRET"
"""Triton's own switch for its CPU interpreter; ``1`` / ``true`` / ``yes`` / ``on`` also
makes Ollie build its CUDA eOperators for it (:attr:`Settings.cuda_interpret`)."""

Clock = Callable[[], float]
"""A time source: seconds from an arbitrary origin, never decreasing."""


def _always() -> bool:
    return True


class ChoiceStore(Protocol):
    """Where choices among implementations outlive the process (:attr:`Settings.choice_store`;
    :class:`ollie.tune.cache.CachedChoices`): ``recall`` the name stored for a key (the
    ``repr`` of a choice's configuration key), or None; ``record`` one."""

    def recall(self, key: str) -> str | None: ...

    def record(self, key: str, name: str) -> None: ...


@dataclass(frozen=True)
class Settings:
    """Every process-wide choice of Ollie, as one immutable value.

    ``cache_dir``: where measurements, decisions and generated kernels are kept; None:
    ``~/.cache/ollie``. Used only when private to the user (:mod:`ollie.cachedir`).
    ``kernel_dir``: where generated kernel modules (and numba's code for them) are kept when
    not under the cache directory; None: ``kernels`` under it. Kernels are keyed by their
    text, so one kernel directory may serve several cache directories (the test suite shares
    one among tests that each keep their own decisions).

    ``precompile``: compile the generated CPU kernels of a subprogram's candidates ahead, side
    by side on every core (:mod:`ollie.codegen.precompile`); off: each compiles on first use.

    ``cuda_graphs``: replay CUDA programs as CUDA graphs (:mod:`ollie.exec.cuda_graph`).

    ``cuda_interpret``: build CUDA eOperators for Triton's CPU interpreter (one block size,
    no autotuning) unless a call says otherwise (:func:`ollie.codegen.cuda.compile_cuda`).

    ``search_clock``: the time source of every search's time budget and statistics
    (:class:`ollie.search.SearchConfig`'s ``clock`` when it is None). ``measure_clock``: the
    time source of every measurement (:mod:`ollie.tune.measure`). A test's fake clocks:
    :mod:`ollie.testing.clock`. ``sleep``: how a measurement waits for other threads to go
    idle (its ``settle``); a test passes one that only records. ``budget_clock``: the time
    source of ``ollie.optimize``'s total budget (:mod:`ollie.optimizer.budget`); the test
    suite stops it for every test but those of the budget, so that what an optimisation
    searches does not depend on how busy the machine is.

    ``load``: how many cores other processes keep busy (:func:`ollie.machine_load.others_load`:
    the machine's CPU time less this process's over the last seconds; the one-minute load
    average where that cannot be read); a measured choice made while it is high is measured
    again before it is kept (:func:`ollie.tune.decide.busy`). A test passes a constant.
    ``busy_spread``: a baseline whose samples' relative spread is above it was measured on a
    busy machine too (None: :data:`ollie.tune.decide.BUSY_SPREAD`); the test suite sets it to
    infinity with ``load`` at 0, so that no test's choice depends on what else runs.

    ``pause_gc_while_timing``: Python's cyclic collector is off while a measurement times
    (:func:`ollie.tune.measure.gc_paused`).
    ``defer_full_collections``: automatic full collections wait until a search returns
    (:func:`ollie.caches.search_scope`).

    ``implementations``: the implementations a program compiled here may run on (the
    vendor libraries, and which of Ollie's hand-written kernels: :mod:`ollie.policy`);
    :class:`ollie.exec.executor.CompiledProgram` keeps the one in effect when it is built,
    and a restricted one joins every cache key of a choice or a measurement.

    ``new_choices``: asked before a choice among implementations that is not remembered
    yet is measured (:class:`ollie.tune.choice.Choices`: building every implementation packs
    weights, compiles Winograd transforms, then probes them); False: the framework's own
    implementation (the choice's baseline) is built alone and used, nothing remembered. The
    optimizer's total budget answers False once it is spent
    (:meth:`ollie.optimizer.budget.Budget.may_choose`).

    ``recall_programs``: ``ollie.optimize`` with its cache on returns the program an earlier
    run made for the same model and settings, checked again (:mod:`ollie.optimizer.recall`);
    off, a warm run assembles its program from the cost cache's decisions (what tests of
    those decisions need).

    ``check_choices``: a remembered (or preferred) implementation of a matrix product is run
    on its first operands and checked against ``torch.matmul`` before it is used
    (:func:`ollie.exec.linear.chosen_product`). A recalled program's first run turns it off
    (:mod:`ollie.optimizer.recall`): that run's outputs are checked against the model's
    instead, and a program that fails that check is not used.

    ``choices``: the choice among implementations measured so far: per configuration key,
    the name of the implementation that measured fastest (read and written only through
    :class:`ollie.tune.choice.Choices`, :func:`ollie.tune.choice.shared`). Shared by every
    :func:`using` block that does not replace it; ``using(choices={})`` gives a block a
    private, empty one. Not part of the settings' equality.
    """

    cache_dir: Path | None = None
    kernel_dir: Path | None = None
    precompile: bool = True
    cuda_graphs: bool = True
    cuda_interpret: bool = False
    search_clock: Clock = time.perf_counter
    measure_clock: Clock = time.perf_counter
    budget_clock: Clock = time.perf_counter
    sleep: Callable[[float], object] = time.sleep
    load: Callable[[], float] = others_load
    busy_spread: float | None = None
    pause_gc_while_timing: bool = True
    defer_full_collections: bool = True
    implementations: Implementations = ALL
    new_choices: Callable[[], bool] = _always
    recall_programs: bool = True
    check_choices: bool = True
    choices: dict[Hashable, str] = field(default_factory=dict, compare=False, repr=False)
    choice_store: ChoiceStore | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("cache_dir", "kernel_dir"):  # using(cache_dir="...") as with a Path
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))

    @property
    def cache_root(self) -> Path:
        """:attr:`cache_dir`, or ``~/.cache/ollie`` when it is None (usable or not)."""
        return self.cache_dir if self.cache_dir is not None else \
            Path.home() / ".cache" / "ollie"


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def from_environ(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings the variables of ``environ`` (default: the process's environment) ask
    for: ``OLLIE_CACHE_DIR`` (empty or unset: the default), ``OLLIE_PRECOMPILE=0``,
    ``OLLIE_CUDA_GRAPHS=0`` and ``TRITON_INTERPRET=1``; every other field its default."""
    env = os.environ if environ is None else environ
    cache = env.get(CACHE_DIR_ENV)
    return Settings(
        cache_dir=Path(cache) if cache else None,
        precompile=env.get(PRECOMPILE_ENV, "1") != "0",
        cuda_graphs=env.get(CUDA_GRAPHS_ENV, "1").strip().lower() not in _FALSE,
        cuda_interpret=env.get(TRITON_INTERPRET_ENV, "0").strip().lower() in _TRUE,
    )


_LOCK = threading.Lock()
_PROCESS: list[Settings] = []
_CURRENT: contextvars.ContextVar[Settings | None] = contextvars.ContextVar(
    "ollie_settings", default=None)


def process_settings() -> Settings:
    """The process's settings: :func:`from_environ` at the first call, or what
    :func:`configure` set since."""
    if not _PROCESS:
        with _LOCK:
            if not _PROCESS:
                _PROCESS.append(from_environ())
    return _PROCESS[0]


def current() -> Settings:
    """The settings in effect here: the innermost :func:`using` block's, else the process's."""
    here = _CURRENT.get()
    return here if here is not None else process_settings()


@contextmanager
def using(settings: Settings | None = None, /, **changes: object) -> Iterator[Settings]:
    """Run the block with ``settings`` (default: the current ones) changed by ``changes``
    (field names of :class:`Settings`; an unknown one raises TypeError); yields them.
    The settings in effect before come back when the block ends, however it ends."""
    base = settings if settings is not None else current()
    new = dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    token = _CURRENT.set(new)
    try:
        yield new
    finally:
        _CURRENT.reset(token)


def configure(settings: Settings | None = None, /, **changes: object) -> Settings:
    """Replace the process's settings by ``settings`` (default: the process's current ones)
    changed by ``changes``; returns them. For the command line and a program's start-up;
    inside a library call or a test, prefer :func:`using`."""
    new = dataclasses.replace(settings if settings is not None else process_settings(),
                              **changes)  # type: ignore[arg-type]
    with _LOCK:
        _PROCESS[:] = [new]
    return new


def reset() -> None:
    """Forget the process's settings: the next :func:`current` reads the environment again."""
    with _LOCK:
        _PROCESS.clear()


__all__ = ["CACHE_DIR_ENV", "CUDA_GRAPHS_ENV", "PRECOMPILE_ENV", "TRITON_INTERPRET_ENV",
           "ChoiceStore", "Clock", "Settings", "configure", "current", "from_environ",
           "process_settings", "reset", "using"]
