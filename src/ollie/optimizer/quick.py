"""The quick whole-program library comparison of ``ollie.optimize`` (:func:`quick_regions`):
made instead of the full one (:func:`ollie.optimizer.final.libraries`) when a total time
budget left subprograms unsearched or is spent, so its time is bounded: a program against its
ONNX Runtime regions and those of the model's original operators, a few interleaved rounds of
whole-program calls."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from ollie.errors import OllieError
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.libraries import (
    ALTERNATIVE_MARGIN,
    PER_OPERATOR,
    REGIONS,
    LibraryDecision,
    compiled_anew,
    rel_err,
    variant,
)
from ollie.program.program import Program, program_digest
from ollie.settings import current
from ollie.tune.cache import CostCache, device_key
from ollie.tune.decide import MARGIN, faster

if TYPE_CHECKING:
    from ollie.optimizer.model import OptimizeConfig

log = logging.getLogger(__name__)

QUICK_ROUNDS = 5
"""Interleaved rounds of :func:`quick_regions` (a whole program per sample)."""

QUICK_SECONDS = 5.0
"""Later rounds of :func:`quick_regions` stop after this long (each of its two
measurements)."""

LONG_CALL_SECONDS = 1.0
"""A whole program whose checking run took at least this long (each variant's) is timed by
:func:`quick_regions` without warm-up or lead calls: that run warmed it up, and a call lasting
twenty times :data:`~ollie.tune.measure.SETTLED_LEAD_SECONDS` reaches its steady speed early
in itself. docs/design/040-long-program-comparison.md."""


def quick_regions(prog: Program, feeds: Mapping[str, torch.Tensor],
                  want: Mapping[str, torch.Tensor], cfg: OptimizeConfig, notes: list[str],
                  cache: CostCache | None, alternatives: Mapping[str, Program] | None = None,
                  build: Callable[[Program], CompiledProgram] = compiled_anew
                  ) -> tuple[Program, LibraryDecision | None]:
    """The one whole-program library comparison made when a total budget left subprograms
    unsearched or is spent (its time is bounded: part of the end-to-end check,
    :meth:`ollie.optimizer.budget.Budget.overshoot_bound`): ``prog`` against its ONNX Runtime
    regions (:data:`~ollie.optimizer.libraries.REGIONS`: no code compiled, one session per
    region) and against those of each of ``alternatives`` (the model's original operators
    when a subprogram was rewritten: a rewrite that breaks a region can lose the program),
    :data:`QUICK_ROUNDS` interleaved rounds (without warm-up and lead calls when every
    variant's checking run took :data:`LONG_CALL_SECONDS` or more: a large model at a large
    batch), and as many again when a variant's median is
    :data:`~ollie.tune.decide.MARGIN` below ``prog``'s without confidence yet (a whole
    program of a large model gets few samples in :data:`QUICK_SECONDS`, and one noisy round
    among three decides nothing). A variant must match ``want``; ``prog``'s
    regions are kept only when faster than ``prog`` with confidence
    (:func:`ollie.tune.decide.faster`), or, when the second measurement still decides
    nothing (a busy machine's spread widens the margin), ahead by the margin on the medians
    of all rounds: each variant is a checked program of the model, ``prog``'s regions run its
    own operators and an alternative's the original ones, so no incumbent needs protecting
    and the medians are the best estimate there is; an alternative's regions, when faster
    than ``prog`` in either sense and ``prog``'s best is not :data:`~ollie.optimizer.libraries.
    ALTERNATIVE_MARGIN` faster than them (as :func:`~ollie.optimizer.libraries.
    choose_libraries` keeps an alternative). The decision is cached apart from
    :func:`libraries`' (a comparison of every variant). ``build``: as :func:`libraries`'."""
    # looked up when called: tests script the timings (ollie.tune.measure.measure_rounds)
    from ollie.tune.measure import Timings, measure_rounds, settled_lead

    alternatives = alternatives or {}
    offered: dict[str, tuple[Program, LibraryDecision | None]] = {PER_OPERATOR: (prog, None)}
    for alt, base in ((None, prog), *alternatives.items()):
        regions = variant(base, REGIONS)
        if regions is not None:
            decision = LibraryDecision(REGIONS, alt)
            offered[decision.name] = (regions, decision)
    if len(offered) < 2:
        return prog, None
    key = f"libraries-quick|{program_digest(prog)}|{REGIONS}|{device_key(cfg.device)}"
    if alternatives:  # the alternatives and the margin they win by are part of the key
        key += "|" + "+".join(f"{a}:{program_digest(p)}" for a, p in alternatives.items()) + \
            f"|margin{ALTERNATIVE_MARGIN:g}"
    doc = cache.get_decision(key) if cache is not None else None
    if doc not in offered:
        fns: dict[str, Callable[[], object]] = {}
        spinning: set[str] = set()
        clock = current().measure_clock
        first: dict[str, float] = {}
        for name, (p, _) in offered.items():
            try:
                compiled = build(p)
                start = clock()
                got = compiled.run(feeds)
                first[name] = clock() - start
            except (OllieError, RuntimeError, ValueError) as exc:  # the regions are optional
                log.info("%s not compared: %s", name, exc)
                if name == PER_OPERATOR:
                    return prog, None
                continue
            if name != PER_OPERATOR and any(rel_err(got[o], want[o]) > cfg.check_rtol
                                            for o in want):
                continue
            spinning |= {name} if compiled.spins else set()
            fns[name] = functools.partial(compiled, *[feeds[n] for n, _ in p.inputs])
        if len(fns) < 2:
            return prog, None
        long = min(first[n] for n in fns) >= LONG_CALL_SECONDS

        def rounds(seed: int) -> Timings:
            return measure_rounds(fns, "cpu", rounds=QUICK_ROUNDS, max_seconds=QUICK_SECONDS,
                                  warmup=0 if long else 2, min_sample=0.02,
                                  lead_calls=0 if long else 1, settle=cfg.settle,
                                  lead_seconds=0.0 if long else settled_lead(cfg.settle),
                                  settle_around=spinning, seed=seed)

        def winners(timed: Timings) -> list[str]:
            return [n for n in fns if n != PER_OPERATOR and
                    faster(timed.samples[n], timed.samples[PER_OPERATOR]).decided]

        def ahead(timed: Timings) -> list[str]:
            return [n for n in fns if n != PER_OPERATOR and
                    timed.median(n) < (1 - MARGIN) * timed.median(PER_OPERATOR)]

        timed = rounds(0)
        wins = winners(timed)
        by_medians = False
        if any(n not in wins for n in ahead(timed)):  # ahead, not yet with confidence: as
            more = rounds(1)                          # many rounds again, on all of them
            timed = Timings({n: timed.samples[n] + more.samples[n] for n in fns})
            wins = winners(timed)
            if not wins and ahead(timed):  # still undecided (a busy machine's spread):
                wins, by_medians = ahead(timed), True  # the medians decide
        doc = min([PER_OPERATOR] + [n for n in wins if n == REGIONS], key=timed.median)
        others = [n for n in wins if n != REGIONS]
        if others:
            alt = min(others, key=timed.median)
            if timed.median(doc) > (1 - ALTERNATIVE_MARGIN) * timed.median(alt):
                doc = alt
        notes.append(f"convolution libraries, quick comparison: {doc} ("
                     + ", ".join(f"{n} {timed.median(n) * 1e3:.3f} ms" for n in fns)
                     + f"; {len(timed.samples[PER_OPERATOR])} rounds"
                     + (f", calls of {LONG_CALL_SECONDS:g} s or more: no warm-up or lead "
                        "calls" if long else "")
                     + ("; no lead with confidence, decided by the medians" if by_medians
                        else "") + ")")
        if cache is not None:
            cache.put_decision(key, doc)
    return offered[doc]


__all__ = ["LONG_CALL_SECONDS", "QUICK_ROUNDS", "QUICK_SECONDS", "quick_regions"]
