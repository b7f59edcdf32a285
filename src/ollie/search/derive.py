"""Hybrid derivation (paper Algorithm 2): explorative BFS plus guided derivation.

``derive(expr, ...)`` explores expressions breadth-first, applying every intra-expression rule
up to ``max_depth`` steps. A fingerprint set (exact: digest hits are confirmed by canonical
form) prunes states already seen; since the queue is breadth-first, the first time a state is
reached is at its smallest depth, so pruning later arrivals never hides a state that a
shallower path would have expanded further (the reference implementation's global visited set
with depth-first recursion had that bug). At every state, guided derivation derives toward the
library operators and instantiates; every complete program is a candidate, verified against
the reference interpreter on random inputs before it is reported, and deduplicated by its
kernel sequence.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ollie.caches import search_scope
from ollie.fingerprint import FingerprintSet
from ollie.ir import Expr, format_expr
from ollie.match.eop import scope_bytes, scope_flops
from ollie.rules import RULES
from ollie.search.candidate import (
    Candidate,
    Step,
    VerificationError,
    random_inputs,
    reference_sample,
    verify_candidate,
)
from ollie.search.config import SearchConfig, default_max_tensor_bytes
from ollie.search.guided import guided_derive, normalize
from ollie.search.instantiate import Instantiator, Option, diverse, library_signature
from ollie.settings import current
from ollie.tune.roofline import DEFAULT_ROOFLINE, Roofline

log = logging.getLogger(__name__)
VERIFY_SHARE = 0.2


@dataclass
class DeriveResult:
    """Candidates (in :func:`rank` order: the best estimated of each library signature
    first) and search statistics."""

    candidates: list[Candidate]
    stats: dict = field(default_factory=dict)
    expr: Expr | None = None
    found_keys: frozenset[str] = frozenset()  # every program found (verified or not)

    def to_json(self) -> dict:
        return {"stats": self.stats, "candidates": [c.to_json() for c in self.candidates]}


@dataclass
class _State:
    expr: Expr
    depth: int
    steps: tuple[Step, ...]
    index: int = 0


class _Search:
    def __init__(self, expr: Expr, config: SearchConfig,
                 progress: Callable[[dict], None] | None) -> None:
        self.expr = expr
        self.config = config
        self.progress = progress
        self.inst = Instantiator(config.targets, keep=config.keep, roofline=config.roofline)
        self.seen = FingerprintSet()
        self.guided_seen = FingerprintSet()
        self.inputs = random_inputs(expr, seed=config.seed)
        self.reference = reference_sample(expr, self.inputs, config.verify_samples)
        self.candidates: dict[str, Candidate] = {}
        self.rejected = 0
        self.too_large = 0  # candidates dropped for a tensor over the memory limit
        self.max_tensor_bytes = config.max_tensor_bytes if config.max_tensor_bytes is not None \
            else default_max_tensor_bytes()
        self.visited = self.pruned = self.generated = 0
        # derivation graph between distinct states (pruning on): state -> children states
        self.edges: dict[int, list[int]] = {}
        self.depth_reached = 0
        self.clock = config.clock if config.clock is not None else current().search_clock
        self.start = self.clock()
        self.deadline = self.start + config.time_budget
        # the last part of the budget is kept for verifying the candidates found
        self.search_deadline = self.start + config.time_budget * (1 - VERIFY_SHARE)
        self.found: dict[str, Candidate] = {}
        self.stop = False
        self.completed = False  # the exploration ran to its depth limit (not cut short)
        self.cut_short = False  # a state's children were left partly underived
        self.search_seconds = 0.0
        self.first_found: dict[str, dict] = {}  # library kind -> when first found
        # the longest step between two checks of the budget (one derived expression, one
        # guided expression's instantiation, one verification): a search may end at most
        # about this much past its budget
        self.longest_step = 0.0
        self.last_check = self.start

    def out_of_time(self) -> bool:
        """Whether the exploration's share of the budget is spent (and the step since the
        last check, for ``longest_step``)."""
        now = self.clock()
        self.longest_step = max(self.longest_step, now - self.last_check)
        self.last_check = now
        return now >= self.search_deadline

    def out_of_budget(self) -> bool:
        return self.out_of_time() or self.stop or self.visited >= self.config.max_states

    def run(self) -> DeriveResult:
        queue: deque[_State] = deque([_State(self.expr, 0, (), 0)])
        self.seen.add(self.expr)
        while queue and not self.out_of_budget():
            state = queue.popleft()
            self.expand(state, queue)
            if self.progress and self.visited % 16 == 0:
                self.progress(self.stats())
        self.completed = not queue and not self.cut_short
        self.search_seconds = self.clock() - self.start
        slowest = 0.0
        tried = 0
        roof = self.config.roofline or DEFAULT_ROOFLINE
        for cand in rank(self.found.values(), compute_bound(self.expr, roof)):
            if len(self.candidates) >= self.config.max_candidates:
                break
            # the first that fits in memory is always verified: a search that found programs
            # returns one
            if tried and self.deadline - self.clock() <= 1.2 * slowest:
                break
            t0 = self.clock()
            if self.verify(cand):
                tried += 1
            slowest = max(slowest, self.clock() - t0)
        self.longest_step = max(self.longest_step, slowest)
        result = list(self.candidates.values())  # in rank order
        return DeriveResult(result, self.stats(), self.expr, frozenset(self.found))

    def expand(self, state: _State, queue: deque[_State]) -> None:
        """Visit ``state``: instantiate it, then queue its children (the budget is checked
        after every instantiated program and every derived expression)."""
        self.visited += 1
        self.depth_reached = max(self.depth_reached, state.depth)
        self.instantiate(state)
        if state.depth >= self.config.max_depth:
            return
        children = self.edges.setdefault(state.index, [])
        for name in self.config.rules:
            for d in RULES[name](state.expr):
                if self.out_of_budget():
                    self.cut_short = True
                    return
                self.generated += 1
                expr, norm = (normalize(d.expr) if self.config.normalize
                              else (d.expr, []))
                if self.config.fingerprint_pruning:
                    new, index = self.seen.add_index(expr)
                    children.append(index)
                    if not new:
                        self.pruned += 1
                        continue
                else:
                    index = self.generated
                steps = (*state.steps, Step(d.rule, d.note, format_expr(d.expr)), *norm)
                queue.append(_State(expr, state.depth + 1, steps, index))

    def instantiate(self, state: _State) -> None:
        if self.config.guided:
            found = guided_derive(state.expr, self.inst, self.config.guided_depth,
                                  self.guided_seen, self.out_of_time)
        else:
            found = [(opt, ()) for opt in self.inst.complete(state.expr)]
        for opt, gsteps in found:
            self.add_candidate(opt, state, gsteps)
            if self.out_of_budget():
                return

    def add_candidate(self, opt: Option, state: _State, gsteps: tuple[Step, ...]) -> None:
        steps = list(state.steps) + list(gsteps) + [Step(r, "", "") for r in opt.rules]
        cand = Candidate(list(opt.kernels), opt.output, steps, cost=opt.cost,
                         found_at_depth=state.depth)
        self.found.setdefault(cand.key, cand)
        for kind in set(cand.library_kinds) or {"eOp"}:
            self.first_found.setdefault(kind, self._when(state))
            if kind in self.config.stop_when_found:
                self.stop = True
        target = self.config.target
        if target is not None and "target" not in self.first_found and target(cand):
            self.first_found["target"] = self._when(state)
            self.stop = self.stop or self.config.stop_at_target

    def _when(self, state: _State) -> dict:
        return {"seconds": round(self.clock() - self.start, 3), "depth": state.depth,
                "states_visited": self.visited}

    def verify(self, cand: Candidate) -> bool:
        """Run ``cand`` on random inputs against the interpreter; keep it only if it agrees.
        A candidate with a tensor over the memory limit is dropped without running. Returns
        whether it ran."""
        largest = max((4 * math.prod(k.output_shape) for k in cand.kernels), default=0)
        if largest > self.max_tensor_bytes:
            log.info("dropping a candidate with a %.2f GiB tensor (limit %.2f GiB): %s",
                     largest / 2**30, self.max_tensor_bytes / 2**30, cand.summary())
            self.too_large += 1
            return False
        try:
            ok, err = verify_candidate(cand, self.expr, self.inputs, self.config.verify_samples,
                                       self.config.rtol, self.config.atol, self.reference)
        except VerificationError as exc:
            log.warning("dropping a candidate that failed to run: %s", exc)
            self.rejected += 1
            return True
        if not ok:
            log.error("dropping a candidate that does not match the original "
                      "(relative error %.3g): %s", err, cand.summary())
            self.rejected += 1
            return True
        cand.verified = True
        cand.max_error = err
        self.candidates[cand.key] = cand
        return True

    def unpruned_states(self) -> int | None:
        """How many states a search without pruning would visit to the same depth: the
        number of derivation paths of length <= max_depth, counted as walks in the graph of
        distinct states (a state first reached at the last depth is never expanded, and no
        walk of allowed length continues past it). None when the search was cut short."""
        if not self.config.fingerprint_pruning or not self.completed:
            return None
        walks = {0: 1}
        total = 1
        for _ in range(self.depth_reached):
            nxt: dict[int, int] = {}
            for s, count in walks.items():
                for c in self.edges.get(s, ()):
                    nxt[c] = nxt.get(c, 0) + count
            walks = nxt
            total += sum(walks.values())
        return total

    def stats(self) -> dict:
        return {"states_visited": self.visited, "states_pruned": self.pruned,
                "states_generated": self.generated, "candidates": len(self.candidates),
                "candidates_found": len(self.found), "rejected": self.rejected,
                "too_large": self.too_large,
                "first_found": self.first_found, "unpruned_states": self.unpruned_states(),
                "seconds": round(self.clock() - self.start, 3),
                "search_seconds": round(self.search_seconds or self.clock() - self.start, 3),
                "max_depth": self.depth_reached,
                "longest_step_seconds": round(self.longest_step, 3)}


def rank(cands: Iterable[Candidate], compute_bound: bool = True) -> list[Candidate]:
    """The order candidates are verified and reported in: the cheapest (estimated) of each
    :func:`~ollie.search.instantiate.library_signature` first, then the others by cost, so that
    no signature is crowded out by a cheaper one's variants before measurement. Programs of
    eOperators only, for a ``compute_bound`` expression, keep one place among them: their
    cheapest, after the best of every library signature; the others come after every program
    with a library operator."""
    order = diverse(cands, lambda c: c.cost, lambda c: library_signature(c.kernels))
    if not compute_bound:
        return order
    eops = [c for c in order if not c.library_kinds]
    libs = [c for c in order if c.library_kinds]
    firsts = len({library_signature(c.kernels) for c in libs})
    return libs[:firsts] + eops[:1] + libs[firsts:] + eops[1:]


def compute_bound(expr: Expr, roofline: Roofline) -> bool:
    """Whether ``expr`` does more FLOPs per byte moved than ``roofline``'s ridge point."""
    nbytes = scope_bytes(expr.root, expr.inputs)
    return nbytes > 0 and scope_flops(expr.root) / nbytes > roofline.ridge


def derive(expr: Expr, max_depth: int = 7, time_budget: float = 60.0,
           config: SearchConfig | None = None,
           progress: Callable[[dict], None] | None = None, **overrides: Any) -> DeriveResult:
    """Hybrid derivation of one expression (API.md ``ollie.derive``). ``max_depth`` and
    ``time_budget`` replace those of ``config``; ``overrides`` replace its other
    :class:`SearchConfig` fields (e.g. ``clock``, the time source of the budget), each a value
    of its field's type."""
    cfg = config or SearchConfig()
    cfg = replace(cfg, max_depth=max_depth, time_budget=time_budget, **overrides)
    with search_scope():
        return _Search(expr, cfg, progress).run()
