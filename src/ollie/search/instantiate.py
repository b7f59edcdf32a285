"""Expression instantiation: turn every scope of an expression into kernels.

Bottom-up over the scope tree: a nested scope is instantiated first and replaced by a read of
its output tensor (position = value - lo); then the scope itself gets one option per library
operator that matches it (:mod:`ollie.match`, layout eOperators included) and, when it is
memory-bound, an eOperator. A compute-bound scope that no library operator matches has no
option, so the expression is not (yet) instantiable: the paper keeps compute-bound work in
library operators and generates only memory-bound eOperators.

Match results are cached per (scope, input shapes), so states sharing sub-scopes share work.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ollie.fingerprint import fingerprint
from ollie.ir import Access, Expr, Node, Scope, accesses, map_body
from ollie.match import MATCHERS, MatchResult, Mismatch, make_eop
from ollie.program.kernel import Kernel, as_int
from ollie.program.params import (
    LIBRARY_KINDS,
    ConvParams,
    EOpParams,
    G2BMMParams,
    GBMMParams,
    MatmulParams,
)
from ollie.tune.roofline import DEFAULT_ROOFLINE, Roofline

T = TypeVar("T")

EOP_SLOWDOWN = 1.5
"""Generated kernels reach about 1/1.5 of the copy bandwidth
(docs/design/024-roofline-ranking.md)."""
WINOGRAD_GAIN = 2.25
"""A stride-1, non-dilated 3x3 convolution runs as Winograd (the kernel library's and the
vendors'): its multiplications divided by F(2x2, 3x3)'s 2.25, the smaller of the tiles' gains."""
SMALL_DIM = 16
"""A matrix-product dimension below this runs at ``d / SMALL_DIM`` of the peak rate (vector
registers and tiles of 16 floats are left partly empty)."""


@dataclass(frozen=True)
class Option:
    """One way to compute a scope: kernels (in order), the output tensor, an estimated cost."""

    kernels: tuple[Kernel, ...]
    output: str
    cost: float
    rules: tuple[str, ...] = ()  # instantiation rules used ("operator_matching", ...)


def _efficiency(*dims: int) -> float:
    eff = 1.0
    for d in dims:
        eff *= min(1.0, max(d, 1) / SMALL_DIM)
    return eff


def _work(p: object) -> tuple[float, float]:
    """(FLOPs, efficiency) of a library operator's parameters."""
    if isinstance(p, MatmulParams):
        return 2.0 * p.b * p.m * p.n * p.k, _efficiency(p.m, p.n, p.k)
    if isinstance(p, ConvParams):
        ph_end = p.ph if p.ph_end is None else p.ph_end
        pw_end = p.pw if p.pw_end is None else p.pw_end
        oh = max(1, (p.h + p.ph + ph_end - p.dh * (p.r - 1) - 1) // p.sh + 1)
        ow = max(1, (p.w + p.pw + pw_end - p.dw * (p.s - 1) - 1) // p.sw + 1)
        groups = p.groups or 1
        flops = 2.0 * p.n * p.f * oh * ow * (p.c // groups) * p.r * p.s
        if (p.r, p.s, p.sh, p.sw, p.dh, p.dw) == (3, 3, 1, 1, 1, 1):
            flops /= WINOGRAD_GAIN
        return flops, _efficiency(p.f // groups, p.n * oh * ow, p.c // groups * p.r * p.s)
    if isinstance(p, G2BMMParams):
        return 2.0 * p.b * p.m * (2 * p.w + 1) * p.k, _efficiency(2 * p.w + 1, p.k)
    if isinstance(p, GBMMParams):
        return 2.0 * p.b * p.m * (2 * p.w + 1) * p.n, _efficiency(2 * p.w + 1, p.n)
    return 0.0, 1.0


def kernel_cost(k: Kernel, roofline: Roofline | None = None) -> float:
    """Estimated seconds of library or eOperator kernel ``k`` (one with an expression) on
    ``roofline`` (None: :data:`~ollie.tune.roofline.DEFAULT_ROOFLINE`): its launch time plus,
    for an eOperator, ``EOP_SLOWDOWN`` times its bytes over the bandwidth, for a library
    operator the roofline time ``max(FLOPs / (peak * efficiency), bytes / bandwidth)`` (FLOPs
    of Winograd for the 3x3 convolutions it applies to; efficiency below 1 for dimensions
    under :data:`SMALL_DIM`; bytes: float32 inputs and output)."""
    roof = roofline or DEFAULT_ROOFLINE
    p = k.params
    if isinstance(p, EOpParams):
        return roof.launch_s + EOP_SLOWDOWN * as_int(p.bytes or 0) / roof.bandwidth
    flops, eff = _work(p)
    assert k.expr is not None, "library and eOperator kernels carry their expression"
    elems = sum(math.prod(shape) for shape in k.expr.inputs.values()) + \
        math.prod(k.output_shape)
    return roof.launch_s + max(flops / (roof.peak_flops * eff), 4.0 * elems / roof.bandwidth)


def library_signature(kernels: Iterable[Kernel]) -> tuple[tuple, ...]:
    """What distinguishes programs by their library operators: the sorted set of
    ``(Conv, r, s, sh, sw, dh, dw)``, ``(Matmul, batched)`` and ``(G2BMM | GBMM, d)`` of
    ``kernels`` (``()`` for a program of eOperators only)."""
    sig: set[tuple] = set()
    for k in kernels:
        p = k.params
        if isinstance(p, ConvParams):
            sig.add((str(k.kind), p.r, p.s, p.sh, p.sw, p.dh, p.dw))
        elif isinstance(p, MatmulParams):
            sig.add((str(k.kind), p.b > 1))
        elif isinstance(p, G2BMMParams | GBMMParams):
            sig.add((str(k.kind), p.d))
        elif k.kind in LIBRARY_KINDS:
            sig.add((str(k.kind),))
    return tuple(sorted(sig))


def diverse(items: Iterable[T], cost: Callable[[T], float],
            signature: Callable[[T], Hashable]) -> list[T]:
    """``items`` with the cheapest of each signature first (by cost), then the rest by cost."""
    firsts: dict[Hashable, T] = {}
    rest: list[T] = []
    for item in sorted(items, key=cost):
        sig = signature(item)
        if sig in firsts:
            rest.append(item)
        else:
            firsts[sig] = item
    return [*firsts.values(), *rest]


@dataclass
class ScopeInfo:
    """What instantiation learned about one scope: its match results (for guided derivation)."""

    scope: Scope            # the scope with nested scopes replaced by tensor reads
    decls: dict[str, tuple[int, ...]]
    results: dict[str, MatchResult | Mismatch]
    eop_bound: str
    sources: dict[str, Scope] = field(default_factory=dict)  # output tensor -> nested scope


@dataclass
class Instantiator:
    """Caches and settings shared by every instantiation of one search."""

    targets: tuple[str, ...]
    keep: int = 3
    roofline: Roofline | None = None  # the cost model's machine (None: the default)
    _cache: dict = field(default_factory=dict)
    infos: dict = field(default_factory=dict)

    def name_for(self, scope: Scope, decls: Mapping[str, tuple[int, ...]]) -> str:
        defs = {n: n for n in decls}
        return "t" + fingerprint(scope, defs)[:10]

    def options(self, scope: Scope, decls: Mapping[str, tuple[int, ...]]) -> list[Option]:
        """Options to compute ``scope``, at most ``keep``: the cheapest of each distinct
        :func:`library_signature` first, then the next cheapest (returned best first; empty
        when not instantiable)."""
        key = (scope, tuple(sorted((n, decls[n]) for n in _direct_tensors(scope)
                                   if n in decls)))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        out = self._options(scope, dict(decls))
        self._cache[key] = out
        return out

    def _options(self, scope: Scope, decls: dict[str, tuple[int, ...]]) -> list[Option]:
        per_child: list[list[Option]] = []
        for nested in _nested(scope):
            opts = self.options(nested, decls)
            if not opts:
                return []
            per_child.append(opts)
        found: list[Option] = []
        for combo in itertools.islice(itertools.product(*per_child), self.keep * self.keep):
            found += self._own_options(scope, decls, list(combo))
        unique: dict[tuple, Option] = {}
        for opt in sorted(found, key=lambda o: o.cost):
            unique.setdefault(tuple((k.kind, k.output) for k in opt.kernels), opt)
        kept = diverse(unique.values(), lambda o: o.cost,
                       lambda o: library_signature(o.kernels))
        return sorted(kept[: self.keep], key=lambda o: o.cost)

    def _own_options(self, scope: Scope, decls: Mapping[str, tuple[int, ...]],
                     children: list[Option]) -> list[Option]:
        """Options for ``scope`` once its nested scopes are computed by ``children``."""
        decls = dict(decls)
        flat = _replace_nested(scope, children)
        for opt, nested in zip(children, _nested(scope), strict=True):
            decls[opt.output] = nested.shape
        child_kernels = tuple(itertools.chain.from_iterable(o.kernels for o in children))
        child_cost = sum(o.cost for o in children)
        child_rules = tuple(itertools.chain.from_iterable(o.rules for o in children))
        name = self.name_for(flat, decls)
        results = {t: MATCHERS[t](flat, decls, name) for t in self.targets}
        eop = make_eop(flat, decls, name)
        assert isinstance(eop.params, EOpParams)
        sources = {o.output: s for o, s in zip(children, _nested(scope), strict=True)}
        self.infos.setdefault(scope, ScopeInfo(flat, decls, results,
                                               str(eop.params.bound), sources))
        own: list[tuple[tuple[Kernel, ...], str]] = [
            (res.kernels, "operator_matching") for res in results.values()
            if isinstance(res, MatchResult)]
        if eop.params.bound == "memory":
            own.append(((eop,), "eoperator_generation"))
        return [Option(child_kernels + kernels, name,
                       child_cost + sum(kernel_cost(k, self.roofline) for k in kernels),
                       (*child_rules, rule))
                for kernels, rule in own]

    def complete(self, expr: Expr) -> list[Option]:
        """Options computing the whole expression (empty when not instantiable)."""
        return self.options(expr.root, expr.inputs)


def _nested(scope: Scope) -> list[Scope]:
    """The scopes ``scope``'s body reads directly (in print order, with repeats)."""
    return [a.source for a in accesses(scope.body) if isinstance(a.source, Scope)]


def _direct_tensors(scope: Scope) -> set[str]:
    return {a.source for a in accesses(scope.body) if isinstance(a.source, str)}


def _replace_nested(scope: Scope, children: list[Option]) -> Scope:
    """``scope`` reading each nested scope's output tensor instead (position = value - lo)."""
    it = iter(children)

    def fn(node: Node) -> Node | None:
        if isinstance(node, Access) and isinstance(node.source, Scope):
            opt = next(it)
            idx = tuple(i - t.lo for i, t in zip(node.indices, node.source.traversal,
                                                  strict=True))
            return Access(opt.output, idx)
        return None

    return Scope(scope.traversal, scope.summation, map_body(scope.body, fn))
