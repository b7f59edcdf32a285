"""Program-context choice of rewrites (CPU): after the program-level library choice
(:mod:`ollie.optimizer.libraries`), each distinct rewritten subprogram is switched on or off
alone in the whole program and the program timed; a change is kept only when a second, longer
comparison confirms it.

A subprogram's rewrite is chosen by timing it alone (:mod:`ollie.optimizer.select`), and in
the program its neighbours change its caches and memory layouts: a rewrite faster alone can
make the program slower, and one that is not faster alone can make it faster. A subprogram
whose original operator won alone therefore offers its fastest rewrite measured within
:data:`ollie.optimizer.select.ALTERNATIVE_WITHIN` of it as a switch too, off at the start
(:attr:`Group.alternative`): in the program another library may run the rewrite (e.g. inside
an ONNX Runtime region).

:func:`refine` makes one greedy pass from the program-level choice ``start`` (all chosen
rewrites on, or all off when the original operators won). The :data:`MAX_GROUPS` groups with
the largest savings measured alone are switched, one at a time, and every single switch is
timed against the current choice in :data:`ROUNDS` interleaved rounds (steady state; samples
around a program whose ONNX Runtime session spins start after ``settle`` seconds idle). Then,
when a switch was faster by :data:`MARGIN`, or when several were not slower by more than
:data:`NOISE` (switches that each save 1-2% may save more together), a second comparison of
:data:`CONFIRM_ROUNDS` rounds times the best single switch and those switches together (at
most one alternative per subprogram) against the current choice; a change is kept only when it
wins this second comparison by :data:`MARGIN` too. Every variant is post-processed, given the
same library decision, and checked against the reference outputs before it is timed; a
variant that fails to run or disagrees is left out. A subprogram's switch covers every node
that shares its decision (identical subprograms, e.g. repeated blocks). :func:`cached_refine`
keeps the choice in the cost cache under :data:`DECISION_VERSION`.

Why this procedure, its margins and rounds (with the measurements):
docs/design/008-program-context-step.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ollie.errors import OllieError
from ollie.optimizer.final import Reference
from ollie.optimizer.libraries import rel_err, variant
from ollie.passes.postprocess import postprocess
from ollie.program.program import Program, program_digest
from ollie.tune.cache import CostCache, device_key
from ollie.tune.measure import SETTLE_SECONDS, settled_lead

log = logging.getLogger(__name__)

MARGIN = 0.02
"""A switch must make the program this much faster (fraction of its time) to be kept."""

DECISION_VERSION = 4
"""Part of the cached decisions' key: bump it whenever the procedure changes, so that decisions
of an older one are made again (what each version changed: docs/design/010-caches.md)."""

MAX_GROUPS = 12
"""Distinct rewrites switched at most (the largest savings measured alone first)."""

ROUNDS = 15
"""Interleaved rounds of a comparison (at least 3 run)."""

NOISE = 0.01
"""Single switches measured at most this much slower than the current choice may still win
together (docs/design/008-program-context-step.md)."""

CONFIRM_ROUNDS = 25
"""Interleaved rounds of the confirming comparison."""

MAX_SECONDS = 20.0
"""Later rounds of a comparison stop after this long."""


@dataclass(frozen=True)
class Group:
    """One distinct rewritten subprogram: its decision ``key``, the ``nodes`` that use it, and
    the time its rewrite saved alone, over all of them (``saving_s``). ``alternative``: the
    label of a rewrite of a subprogram whose original operator won alone (switched off at the
    start; "" for a chosen rewrite). Groups with the same ``nodes`` are alternatives of one
    subprogram: at most one of them is switched on."""

    key: str
    nodes: tuple[str, ...]
    saving_s: float
    alternative: str = ""


@dataclass
class Refined:
    """The outcome: the groups whose rewrite is on, the program and a note for the report."""

    on: frozenset[str]
    program: Program
    note: str
    complete: bool = True
    """False when ``stop`` ended the step before every switch was timed, or the budget
    (``left``) ended a comparison (not cached)."""


def refine(assemble: Callable[[frozenset[str]], Program], groups: Sequence[Group],
           start: frozenset[str], library: str, feeds: Mapping[str, torch.Tensor],
           want: Mapping[str, torch.Tensor], rtol: float,
           decided: frozenset[str] | None = None, settle: float = SETTLE_SECONDS,
           stop: Callable[[], bool] | None = None,
           left: Callable[[], float] | None = None) -> Refined | None:
    """Switch the rewrites of ``groups`` in the program ``assemble(on)`` (the raw program with
    the rewrites of the groups in ``on`` and the original operators elsewhere), starting from
    ``start``; every variant is post-processed and run under ``library`` (a decision of
    :func:`~ollie.optimizer.libraries.choose_libraries`). ``decided``: a choice made before
    (e.g. from the cost cache), checked and applied without timing. ``settle``: seconds idle
    before the samples around a variant whose ONNX Runtime session spins (0: none). ``stop``
    (the total budget spent): once it answers True before every variant is built, none is
    timed and ``start`` is returned, marked incomplete. ``left``: the seconds left of the total
    budget; each comparison lasts at most that long (at least three rounds), and a comparison
    that ends with the budget spent changes nothing: the current choice is returned, marked
    incomplete. None when there is nothing to switch or no variant ran."""
    from ollie.exec.dispatch import precompile_programs
    from ollie.exec.executor import CompiledProgram

    known = {g.key for g in groups}
    start = frozenset(k for k in start if k in known)  # switches of these groups only
    # every group's nodes, also of those beyond the MAX_GROUPS switched: ``start`` may have
    # them on (they stay as they are)
    nodes_of = {g.key: g.nodes for g in groups}
    groups = sorted(groups, key=lambda g: -g.saving_s)[:MAX_GROUPS]
    if not groups:
        return None
    names = {g.key: g.nodes[0] + (f" (x{len(g.nodes)})" if len(g.nodes) > 1 else "")
             + (f" as {g.alternative}" if g.alternative else "") for g in groups}
    built: dict[frozenset[str], Callable[[], object] | None] = {}
    programs: dict[frozenset[str], Program] = {}
    spinning: set[frozenset[str]] = set()

    made: dict[frozenset[str], Program | None] = {}

    def program(on: frozenset[str]) -> Program | None:
        if on not in made:
            made[on] = variant(postprocess(assemble(on)), library)
        return made[on]

    def precompile(ons: Sequence[frozenset[str]]) -> None:
        """The programs' generated kernels compiled ahead, side by side (those that fail to
        build fail again, and are reported, in ``runner``)."""
        progs = []
        for on in ons:
            with contextlib.suppress(OllieError, RuntimeError, ValueError):
                progs.append(program(on))
        precompile_programs([p for p in progs if p is not None])

    def runner(on: frozenset[str]) -> Callable[[], object] | None:
        if on not in built:
            built[on] = None
            try:
                prog = program(on)
                if prog is None:
                    return None
                compiled = CompiledProgram(prog, "cpu")
                got = compiled.run(feeds)
            except (OllieError, RuntimeError, ValueError) as exc:  # a variant is optional
                log.info("program context: %s failed to run: %s", _describe(on, start, names), exc)
                return None
            if all(rel_err(got[o], want[o]) <= rtol for o in want):
                programs[on] = prog
                if compiled.spins:
                    spinning.add(on)
                # timed as called in use (a one-region program straight through its session)
                args = [feeds[n] for n, _ in prog.inputs]
                built[on] = functools.partial(compiled, *args)
            else:
                log.info("program context: %s disagrees with the model",
                         _describe(on, start, names))
        return built[on]

    if decided is not None and not (decided ^ start) <= names.keys():
        decided = None  # switches of subprograms no longer among the groups: choose again
    if decided is not None:
        if runner(decided) is not None:
            return Refined(decided, programs[decided],
                           f"program context: {_describe(decided, start, names)} (cached)")
        decided = None
    if runner(start) is None:
        return None
    current = start
    stopped = stop or (lambda: False)
    singles = [current ^ {g.key} for g in groups]
    if not stopped():
        precompile(singles)
    built_singles, cut = [], False
    for on in singles:  # each variant built (a session, its check) while the budget lasts
        if stopped():
            cut = True
            break
        if runner(on) is not None:
            built_singles.append(on)
    if cut:
        return Refined(current, programs[current], "program context: as chosen (stopped at "
                       f"the time budget after building {len(built_singles)} of {len(singles)} "
                       "variants; none timed)", complete=False)
    singles = built_singles

    def limit() -> float:
        return MAX_SECONDS if left is None else min(MAX_SECONDS, max(0.0, left()))

    def spent() -> bool:
        return left is not None and left() <= 0

    def halted(detail: str) -> Refined:  # the budget ended a comparison: nothing changes
        return Refined(current, programs[current], f"program context: as chosen ({detail}; "
                       "stopped at the time budget, nothing confirmed)", complete=False)

    times = _time([current, *singles], runner, spinning, settle=settle, max_seconds=limit())
    if current not in times:
        return None
    base = times[current]
    level = sorted((on for on in singles if on in times and times[on] < base * (1 + NOISE)),
                   key=times.__getitem__)
    winners = [on for on in level if times[on] < base * (1 - MARGIN)]
    detail = _detail(times, start, names)
    pick = current
    together = _compatible(winners if len(winners) > 1 else level, current, nodes_of)
    together = together if len(together) > 1 else []
    if spent():
        return halted(detail)
    if winners or together:
        # confirm in a second, independent and longer comparison: the best single switch
        # and, when several were faster, all of them together, against the current choice
        choices = [current, level[0]]
        if together:
            choices.append(frozenset(current ^ set().union(*(on ^ current for on in together))))
        again = _time(choices, runner, spinning, rounds=CONFIRM_ROUNDS, settle=settle,
                      max_seconds=limit())
        if spent():
            return halted(detail + (f"; then {_detail(again, start, names)}" if again else ""))
        if current in again:
            detail += f"; then {_detail(again, start, names)}"
            fastest = min(again, key=again.__getitem__)
            if again[fastest] < again[current] * (1 - MARGIN):
                pick = fastest
            else:
                detail += "; not confirmed"
    return Refined(pick, programs[pick],
                   f"program context: {_describe(pick, start, names)} ({detail})")


def _compatible(switches: Sequence[frozenset[str]], current: frozenset[str],
                nodes_of: Mapping[str, tuple[str, ...]]) -> list[frozenset[str]]:
    """``switches`` (fastest first) without those switching on a second alternative of a
    subprogram an earlier one (or ``current``) already switched on."""
    taken = {nodes_of.get(k, (k,)) for k in current}
    out = []
    for on in switches:
        added = {nodes_of.get(k, (k,)) for k in on - current}
        if added & taken:
            continue
        taken |= added
        out.append(on)
    return out


def _detail(times: Mapping[frozenset[str], float], start: frozenset[str],
            names: Mapping[str, str]) -> str:
    return ", ".join(f"{_describe(on, start, names)} {t * 1e3:.3f} ms" for on, t in times.items())


def cached_refine(assemble: Callable[[frozenset[str]], Program], groups: Sequence[Group],
                  start: frozenset[str], library: str, ref: Reference,
                  cache: CostCache | None, device: str, settle: float = SETTLE_SECONDS,
                  timed: bool = True, stop: Callable[[], bool] | None = None,
                  left: Callable[[], float] | None = None) -> Refined | None:
    """:func:`refine` on the reference ``ref``, its choice kept in ``cache`` under the digests
    of the programs with all rewrites and with none (unless ``stop`` or ``left`` ended it
    early).
    ``timed`` off (the total time budget is spent): only a cached choice is applied; None
    without one."""
    key = decided = None
    if cache is not None:
        digests = "+".join(program_digest(postprocess(assemble(on)))
                           for on in (frozenset(g.key for g in groups), frozenset()))
        key = (f"context{DECISION_VERSION}|{digests}|{library}|{sorted(start)}|"
               f"{device_key(device)}")
        decided = _decision(cache.get_decision(key), {g.key for g in groups})
    if decided is None and not timed:
        return None
    refined = refine(assemble, groups, start, library, ref.feeds, ref.want, ref.rtol, decided,
                     settle, stop, left)
    if refined is not None and refined.complete and cache is not None and key is not None \
            and refined.on != decided:
        cache.put_decision(key, json.dumps(sorted(refined.on)))
    return refined


def _decision(doc: str | None, keys: set[str]) -> frozenset[str] | None:
    """A cached choice (a JSON list of group keys), when well formed and naming only groups
    of this program (``keys``); None otherwise (the choice is made again)."""
    if doc is None:
        return None
    try:
        on = json.loads(doc)
    except ValueError:
        on = None
    if not isinstance(on, list) or not all(isinstance(k, str) and k in keys for k in on):
        log.info("program context: ignoring a cached choice that does not fit this program")
        return None
    return frozenset(on)


def _time(choices: Sequence[frozenset[str]], runner,
          spinning: set[frozenset[str]] | frozenset = frozenset(), rounds: int = ROUNDS,
          settle: float = SETTLE_SECONDS, max_seconds: float = MAX_SECONDS
          ) -> dict[frozenset[str], float]:
    """Interleaved steady-state times of the programs of ``choices``; the samples of a program
    with an ONNX Runtime session that spins (``spinning``), and the samples that follow them,
    start after ``settle`` seconds idle (``measure_alternating``'s ``settle_around``)."""
    from ollie.tune.measure import measure_alternating

    fns = {on: fn for on in dict.fromkeys(choices) if (fn := runner(on)) is not None}
    if len(fns) < 2:
        return {}
    names = {f"v{i}": on for i, on in enumerate(fns)}
    times = measure_alternating({n: fns[on] for n, on in names.items()}, "cpu",
                                rounds=rounds, min_sample=0.02, lead_calls=1,
                                max_seconds=max_seconds, settle=settle,
                                lead_seconds=settled_lead(settle),
                                settle_around={n for n, on in names.items() if on in spinning})
    return {names[n]: t for n, t in times.items()}


def _describe(on: frozenset[str], start: frozenset[str], names: Mapping[str, str]) -> str:
    """``on`` relative to ``start``: ``+node`` for a rewrite switched on, ``-node`` off."""
    changed = sorted(("+" if key in on else "-") + names[key] for key in on ^ start)
    return " ".join(changed) or "as chosen"


__all__ = ["DECISION_VERSION", "MARGIN", "MAX_GROUPS", "NOISE", "Group", "Refined",
           "cached_refine", "refine"]
