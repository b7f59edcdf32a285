"""Guided derivation (paper Algorithm 2, GuidedDerive): derive toward library operators.

From the iterator-mapping-table answers of every scope (:class:`ScopeInfo`), propose the few
rule applications that remove a mismatch, instead of trying every rule:

* a dimension mixing traversal iterators with summation iterators (``h + r`` in a conv seen as
  a Matmul) -> **summation splitting** with those summation iterators outside;
* a dimension mixing several traversal iterators (``h + r`` once ``r`` is a traversal
  iterator) -> **variable substitution** (shift ``t = h + r``);
* a dimension ``k*e + u`` of an input tensor with ``0 <= u < k`` -> **data layout
  transformation** splitting that dimension by ``k``;
* a match with dilation ``d > 1`` -> **variable substitution** splitting the iterator that the
  dilated iterator offsets, by ``d`` (then the tensors' dimensions are split as above: the
  dilated operator becomes a non-dilated one over re-laid-out data);
* a Conv match whose kernel is larger than the sizes the fast convolution algorithms handle
  (:data:`FAST_CONV_KERNEL`, a property of the Conv target, not of any model) -> split the
  kernel-tap summation iterators by that size and sum the tiles outside.

After each step the expression is normalised: nested scopes that only re-index another scope
are inlined (traversal merging) and nested ranges are tightened (boundary tightening). Guided
steps do not count toward the explorative depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from math import gcd

from ollie.errors import ExprError
from ollie.fingerprint import FingerprintSet
from ollie.ir import Access, Affine, Expr, Scope, accesses, format_expr, var
from ollie.match import MatchResult, Mismatch
from ollie.match.result import BODY, MIXED
from ollie.program.params import ConvParams, G2BMMParams, GBMMParams, KernelKind
from ollie.rules.base import Path, replace_scope, scope_paths
from ollie.rules.boundary import read_hull, tighten, with_range, zero_outside
from ollie.rules.layout import split_dim
from ollie.rules.summation_splitting import split_summation
from ollie.rules.traversal_merging import inline
from ollie.rules.variable_substitution import build_shift, build_split, split_summation_iters
from ollie.search.candidate import Step
from ollie.search.instantiate import Instantiator, Option

FAST_CONV_KERNEL = 3
"""Kernel extent the fast convolution algorithms (Winograd F(2x2, 3x3) in oneDNN / cuDNN) are
built for: a property of the Conv target that guided derivation tiles larger kernels into."""


@dataclass(frozen=True)
class Proposal:
    expr: Expr
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Note:
    """One rule application of a guided move: the rule (paper name) and what it did."""

    rule: str
    text: str


@dataclass(frozen=True, slots=True)
class Move:
    """A guided proposal for one scope: the scope it rewrites that scope to, and the rule
    applications leading there, in order (a move may take several rules, e.g. tiling a kernel
    tap: a variable substitution, then a summation splitting)."""

    scope: Scope
    notes: tuple[Note, ...]


def _move(scope: Scope, rule: str, text: str) -> Move:
    return Move(scope, (Note(rule, text),))


def _step(rule: str, note: str, expr: Expr) -> Step:
    return Step(rule, note, format_expr(expr))


# --------------------------------------------------------------------- normalisation
def normalize(expr: Expr, max_rounds: int = 32) -> tuple[Expr, list[Step]]:
    """Inline pure re-indexing scopes and tighten nested ranges, to a fixpoint."""
    steps: list[Step] = []
    for _ in range(max_rounds):
        new = _normalize_once(expr)
        if new is None:
            break
        expr, step = new
        steps.append(step)
    return expr, steps


def _normalize_once(expr: Expr) -> tuple[Expr, Step] | None:
    for path, scope in scope_paths(expr.root):
        nested = [a.source for a in accesses(scope.body) if isinstance(a.source, Scope)]
        for pos, src in enumerate(nested):
            if src.summation or not isinstance(src.body, Access) or \
                    not isinstance(src.body.source, Scope):
                continue
            if not src.body.source.summation:
                # a re-indexing of a layout / element-wise scope: compose the two into one
                new_src = _inline_relaxed(expr, (*path, pos, 0), src, 0)
                if new_src is not None:
                    new = Expr(expr.decls, replace_scope(expr.root, (*path, pos), new_src))
                    return new, _step("traversal_merging", "compose re-indexing scopes", new)
                continue
            # a re-indexing of a computing scope: inline it into its reader
            new_scope = _inline_relaxed(expr, (*path, pos), scope, pos)
            if new_scope is not None:
                new = Expr(expr.decls, replace_scope(expr.root, path, new_scope))
                return new, _step("traversal_merging", "inline re-indexing scope", new)
        tight = tighten(scope, path, expr)
        if tight:
            # each proposal is sound for the current (larger) ranges of the others, hence
            # also after they shrink: apply them all at once
            new_scope = scope
            for proposal, _ in tight:
                for it in proposal.iters:
                    if it != new_scope.iter(it.name):
                        new_scope = with_range(new_scope, it.name, it.lo, it.hi)
            new = Expr(expr.decls, replace_scope(expr.root, path, new_scope))
            return new, _step("boundary_tightening", "; ".join(n for _, n in tight), new)
    return None


def _inline_relaxed(expr: Expr, child: Path, reader: Scope, pos: int) -> Scope | None:
    """Inline the ``pos``-th nested scope of ``reader`` (the child at path ``child``),
    relaxing the child's ranges first when the reader reads outside them where the child is
    zero anyway."""
    src = [a.source for a in accesses(reader.body) if isinstance(a.source, Scope)][pos]
    relaxed = _relax_to_reads(expr, child, src)
    if relaxed is not None:
        reader = replace_scope(reader, (pos,), relaxed)
    return inline(reader, pos, expr.inputs)


def _relax_to_reads(expr: Expr, path: Path, scope: Scope) -> Scope | None:
    """``scope`` (at ``path``) with every traversal range relaxed to cover the reader's reads,
    where boundary relaxing allows it (the added elements are provably zero); else None."""
    changed = False
    for dim, it in enumerate(scope.traversal):
        hull = read_hull(expr.root, path, dim)
        if hull is None or (it.lo <= hull[0] and hull[1] <= it.hi):
            continue
        cand = (min(it.lo, hull[0]), max(it.hi, hull[1]))
        if not zero_outside(scope, it.name, it.range, cand, expr.inputs):
            return None
        scope = with_range(scope, it.name, *cand)
        changed = True
    return scope if changed else None


# --------------------------------------------------------------------- proposals
def _mixed_dims(scope: Scope, res: Mismatch) -> Iterator[tuple[str, int]]:
    for issue in res.of_kind(MIXED):
        if issue.tensor is not None and issue.dim is not None:
            yield issue.tensor, issue.dim


def _index(scope: Scope, tensor: str | Scope, dim: int):
    for acc in accesses(scope.body):
        if acc.source == tensor:
            return acc.indices[dim]
    return None


def _proposals_for(expr: Expr, path: Path, scope: Scope, flat: Scope,
                   results: dict[str, MatchResult | Mismatch],
                   sources: dict[str, Scope]) -> Iterator[Move]:
    """The guided moves proposed for the scope at ``path``."""
    trav = {it.name for it in scope.traversal}
    summ = {it.name for it in scope.summation}
    for target, res in results.items():
        if isinstance(res, Mismatch):
            outer: set[str] = set()
            for tensor, dim in _mixed_dims(flat, res):
                idx = _index(flat, tensor, dim)
                if idx is None:
                    continue
                names = idx.vars()
                if names & summ and len(names & trav) >= 1:
                    outer |= names & summ
                lin = {n: c for n, c in idx.linear_coefs().items() if n in trav}
                if len(lin) >= 2:
                    comb = sum((var(n) * c for n, c in lin.items()), Affine())
                    for n, c in lin.items():
                        new = _attempt(build_shift, scope, n, comb * c) if abs(c) == 1 else None
                        if new is not None:
                            yield _move(new, "variable_substitution",
                                        f"shift {n} -> {comb * c} (toward {target})")
                operand: str | Scope | None = tensor if tensor in expr.inputs else \
                    sources.get(tensor)
                if operand is None:
                    continue
                oidx = _index(scope, operand, dim)
                k = _layout_factor(oidx, flat) if oidx is not None else 0
                shape = expr.inputs.get(tensor, ()) if isinstance(operand, str) else ()
                new = _attempt(split_dim, scope, operand, shape, dim, k) if k else None
                if new is not None:
                    yield _move(new, "data_layout_transformation",
                                f"split {tensor} dim {dim} by {k} (toward {target})")
            if outer and outer != summ:
                yield _move(split_summation(scope, tuple(sorted(outer))), "summation_splitting",
                            f"Sum<{','.join(sorted(outer))} | ...> (toward {target})")
        else:
            yield from _from_match(expr, scope, flat, target, res)


def _attempt(fn, *args) -> Scope | None:
    """``fn(*args)``, or None when the rule does not apply (ExprError: checked, not assumed)."""
    try:
        return fn(*args)
    except ExprError:
        return None


def _layout_factor(idx, flat: Scope) -> int:
    """``k`` when ``idx == k*e + u`` with a unit-coefficient iterator ``0 <= u < k``."""
    coefs = idx.linear_coefs()
    if not idx.is_linear or len(coefs) < 2:
        return 0
    ranges = flat.ranges
    for u, cu in coefs.items():
        if cu != 1:
            continue
        k = 0
        for n, c in coefs.items():
            if n != u:
                k = gcd(k, abs(c))
        k = gcd(k, abs(idx.const)) if idx.const else k
        lo, hi = ranges[u]
        if k > 1 and lo >= 0 and hi <= k:
            return k
    return 0


def _from_match(expr: Expr, scope: Scope, flat: Scope, target: str,
                res: MatchResult) -> Iterator[Move]:
    params = res.params
    dilations = [params.d] if isinstance(params, G2BMMParams | GBMMParams) else \
        [params.dh, params.dw] if isinstance(params, ConvParams) else []
    trav = {it.name: it for it in scope.traversal}
    for d in {int(x) for x in dilations if isinstance(x, int) and x > 1}:
        for acc in accesses(flat.body):
            for idx in acc.indices:
                coefs = idx.linear_coefs()
                for n, c in coefs.items():
                    if abs(c) == 1 and n in trav and trav[n].size > d and any(
                            abs(c2) == d for n2, c2 in coefs.items() if n2 != n):
                        new = _attempt(build_split, scope, n, d)
                        if new is not None:
                            yield _move(new, "variable_substitution", f"split {n} by {d} "
                                        f"(dilation, toward non-dilated {target})")
    if target == KernelKind.CONV and isinstance(params, ConvParams) and \
            params.sh == params.sw == params.dh == params.dw == 1:
        for role in ("r", "s"):
            taps = res.mapping.get(role, ())
            if len(taps) == 1 and scope.iter(taps[0]).size > FAST_CONV_KERNEL:
                yield from _tile(expr, scope, taps[0])


def _tile(expr: Expr, scope: Scope, tap: str) -> Iterator[Move]:
    try:
        split, tiles, _ = split_summation_iters(scope, tap, FAST_CONV_KERNEL, expr.inputs)
    except ExprError:
        return
    yield Move(split_summation(split, (tiles.name,)), (
        Note("variable_substitution", f"tile {tap} by {FAST_CONV_KERNEL} (Conv target kernel)"),
        Note("summation_splitting", "sum tiles outside")))


def proposals(expr: Expr, inst: Instantiator) -> list[Proposal]:
    """Guided proposals for every scope of ``expr`` whose match results are known."""
    out: list[Proposal] = []
    for path, scope in scope_paths(expr.root):
        info = inst.infos.get(scope)
        if info is None or (info.eop_bound != "compute" and not _contraction(info)):
            continue  # memory-bound element-wise / re-indexing scopes are fine as eOperators
        for move in _proposals_for(expr, path, scope, info.scope, info.results, info.sources):
            new = Expr(expr.decls, replace_scope(expr.root, path, move.scope))
            # (only the last rule's expression is shown: the moves before it are not
            # separate states of the search)
            *before, last = move.notes
            steps = [*(Step(n.rule, n.text, "") for n in before), _step(last.rule, last.text, new)]
            new, norm = normalize(new)
            out.append(Proposal(new, tuple(steps + norm)))
    return out


def _contraction(info) -> bool:
    """True when some target could read the scope as a product of two tensor reads."""
    return any(isinstance(r, MatchResult) or BODY not in r.kinds for r in info.results.values())


def guided_derive(expr: Expr, inst: Instantiator, depth: int, seen: FingerprintSet,
                  out_of_time: Callable[[], bool] = lambda: False,
                  ) -> list[tuple[Option, tuple[Step, ...]]]:
    """Instantiate ``expr`` and the expressions guided proposals lead to, breadth-first up to
    ``depth`` guided steps (so each is reached by its shortest guided derivation). ``seen``
    is shared across calls: a guided state reached from another explorative state is not
    derived again. Stops early once ``out_of_time()`` says so (asked before each expression's
    instantiation)."""
    found: list[tuple[Option, tuple[Step, ...]]] = []
    level: list[tuple[Expr, tuple[Step, ...]]] = [(expr, ())]
    for d in range(depth + 1):
        nxt: list[tuple[Expr, tuple[Step, ...]]] = []
        for e, steps in level:
            if out_of_time():
                return found
            found += [(opt, steps) for opt in inst.complete(e)]
            if d == depth:
                continue
            for prop in proposals(e, inst):
                if seen.add(prop.expr):
                    nxt.append((prop.expr, steps + prop.steps))
        level = nxt
    return found
