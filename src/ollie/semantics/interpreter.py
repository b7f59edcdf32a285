"""The reference interpreter: the one definition of what an expression means.

``interpret(expr, inputs)`` evaluates the root scope. A scope ``L<x...> Sum<y...> body`` computes,
at every traversal point, the sum over all summation points of ``body``. Arithmetic is float64,
the result is rounded to float32 once at the end.

Structural zeros. A read outside a tensor's (or a nested scope's) region is 0, and it is a
*structural zero*: the term it belongs to is not there, as padding behaves in the operators
expressions come from. At one point of the body, as written:

* a read outside its source is a structural zero; a read inside is its element's value (an
  element of a nested scope is an ordinary value, zero or not: a nested scope is a tensor);
* ``a * b`` is exactly ``+0`` when ``a`` or ``b`` is a structural zero, whatever the other
  (NaN and infinities included), and is then a structural zero itself;
* ``a / b`` is exactly ``+0``, and a structural zero, when ``a`` is one (``b`` is used as a
  value: ``x / A[-1]`` is ``x / 0``);
* ``-a`` is a structural zero when ``a`` is one; ``a + b`` and ``a - b`` when both are;
* literals and function calls are ordinary values (``exp`` of a structural zero is 1).

For finite values this is plain arithmetic (``0 * x`` is 0, up to the sign of a zero); it
differs only where plain arithmetic would give NaN from a read outside its source times NaN or
an infinity (or over 0), so that NaN and infinities in the inputs reach exactly the outputs
whose terms read them.

How (see ``semantics/`` siblings): the body is normalised into a sum of terms (``terms.py``);
each term's factors are evaluated over only the axes of the iterators they use (``gather.py``
for reads, element-wise otherwise), then contracted to the output axes (``contract.py``), with
plain arithmetic. Wherever the result is not finite, the body is evaluated again as written
with structural zeros (:func:`_redo_non_finite`), at those points only: that is exact, since a
finite result involved only finite values. The iteration space is split into boxes so that no
intermediate exceeds ``MAX_ELEMENTS`` elements (``grid.py``). A nested scope is closed, hence a
constant tensor: it is evaluated once per call and read by iterator value. In sampled
evaluation (``at=``) the traversal iterators take their values from the sampled points along
one shared axis, and a nested scope is evaluated only at the positions those points read when
these are few enough. Every evaluation (full, sampled, chunked; of the root or of a dense or
sparse nested scope) goes through the same re-evaluation.

Limits (``limits.py``): one call holds at most ``max_bytes`` in arrays that grow with the
expression (inputs as float64, evaluated scopes) and evaluates at most ``max_work`` iteration
points; either is checked before the allocation or the evaluation, and going over raises
:class:`~ollie.errors.ResourceError`. Sums over iterators that a term does not use cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ollie.errors import ExprError, ShapeError, UnsupportedError
from ollie.ir.nodes import Access, Expr, Scope, accesses, tensor_names
from ollie.ir.parser import MAX_RANK, parse
from ollie.semantics.contract import contract
from ollie.semantics.gather import (
    DenseSource,
    Source,
    SparseSource,
    in_range,
    read,
    requested_keys,
)
from ollie.semantics.grid import MAX_ELEMENTS, Box, Grid, iter_boxes, plan_blocks
from ollie.semantics.limits import MAX_BYTES, MAX_WORK, Budget
from ollie.semantics.terms import Factor, Term, eval_factor, eval_written, expand

SPARSE_FRACTION = 0.25
"""A sampled evaluation evaluates a nested scope only at the positions it reads when these are
at most this fraction of the scope's size (else it evaluates the whole scope, which is faster
per element)."""


def interpret(expr: Expr | str, inputs: Mapping[str, Any], *, at: Any = None,
              max_bytes: int | None = MAX_BYTES, max_work: int | None = MAX_WORK) -> np.ndarray:
    """Evaluate ``expr`` on ``inputs`` (name -> numpy array or CPU torch tensor).

    Returns a float32 array of shape ``expr.shape``, or with ``at`` (int array [P, rank] of output
    storage positions) a float32 array [P] of those elements only. Raises
    :class:`~ollie.errors.ShapeError` when a tensor the expression reads is missing or has a
    shape other than the declared one, and :class:`~ollie.errors.ResourceError` when the
    evaluation would hold more than ``max_bytes`` bytes or evaluate more than ``max_work``
    iteration points (None: no limit; see :mod:`ollie.semantics.limits`).
    """
    if isinstance(expr, str):
        expr = parse(expr)
    budget = Budget(max_bytes, max_work)
    ev = _Evaluator(_input_sources(expr, inputs, budget), budget)
    with np.errstate(all="ignore"):
        if at is None:
            out = ev.materialise(expr.root).array
        else:
            points = _check_points(at, expr.shape)
            out = ev.evaluate(expr.root, Grid.at_points(expr.root, points))
        return np.asarray(out, dtype=np.float32)  # beyond float32's range: inf


# --------------------------------------------------------------------- argument checks
def _to_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        value = value.detach().cpu()
        try:
            return value.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks
            return value.float().numpy()
    return np.asarray(value)


def _input_sources(expr: Expr, inputs: Mapping[str, Any], budget: Budget
                   ) -> dict[str, DenseSource]:
    declared = expr.inputs
    out: dict[str, DenseSource] = {}
    for name in sorted(tensor_names(expr.root)):
        if name not in declared:
            raise ExprError(f"tensor '{name}' is read but not declared")
        shape = tuple(declared[name])
        if name not in inputs:
            raise ShapeError(f"missing input tensor '{name}' (declared shape {list(shape)})")
        arr = _to_array(inputs[name])
        if arr.shape != shape:
            raise ShapeError(f"input tensor '{name}' has shape {list(arr.shape)}, "
                             f"expected {list(shape)}")
        budget.alloc(8 * arr.size,
                     lambda n=name, s=shape: f"input tensor '{n}' {list(s)} as float64")
        arr = np.ascontiguousarray(arr, dtype=np.float64)
        out[name] = DenseSource(name, arr, (0,) * len(shape))
    return out


def _check_points(at: Any, shape: tuple[int, ...]) -> np.ndarray:
    points = _to_array(at)
    if points.ndim != 2 or points.shape[1] != len(shape):
        raise ShapeError(f"'at' must be an integer array [P, {len(shape)}] of output positions, "
                         f"got shape {list(points.shape)}")
    if points.size and not np.issubdtype(points.dtype, np.integer):
        raise ShapeError(f"'at' must hold integers, got dtype {points.dtype}")
    points = points.astype(np.int64)
    if points.size and ((points < 0).any() or (points >= np.asarray(shape)).any()):
        raise ShapeError(f"'at' holds positions outside the output shape {list(shape)}")
    return points


# --------------------------------------------------------------------- evaluation
class _Evaluator:
    """Evaluates scopes of one call; nested scopes are materialised at most once."""

    def __init__(self, tensors: dict[str, DenseSource], budget: Budget) -> None:
        self.tensors = tensors
        self.budget = budget
        self.materialised: dict[Scope, DenseSource] = {}

    def materialise(self, scope: Scope) -> DenseSource:
        """The whole scope as a tensor read at ``value - lo`` (cached)."""
        src = self.materialised.get(scope)
        if src is None:
            values = self.evaluate(scope, Grid.full(scope))
            src = DenseSource(_describe(scope), values, tuple(it.lo for it in scope.traversal))
            self.materialised[scope] = src
        return src

    def evaluate(self, scope: Scope, grid: Grid) -> np.ndarray:
        """float64 values of ``scope`` over the output axes of ``grid``."""
        if len(scope.iters) > MAX_RANK:
            raise UnsupportedError(f"{_describe(scope)} has {len(scope.iters)} iterators; the "
                                   f"interpreter handles at most {MAX_RANK}")
        self.budget.alloc(8 * math.prod(grid.out_shape),
                          lambda: f"the values of {_describe(scope)} {list(grid.out_shape)}")
        out = np.zeros(grid.out_shape)
        if 0 in grid.sizes:  # no point to evaluate (a sample of none): nothing to read either
            return out
        sources = self._sources(scope, grid)
        for term in expand(scope.body):
            _add_term(term, grid, sources, out, self.budget, scope)
        _redo_non_finite(scope, grid, sources, out, self.budget)
        return out

    def _sources(self, scope: Scope, grid: Grid) -> dict[str | Scope, Source]:
        sources: dict[str | Scope, Source] = {}
        nested: dict[Scope, list[Access]] = {}
        for acc in accesses(scope.body):
            if isinstance(acc.source, Scope):
                nested.setdefault(acc.source, []).append(acc)
            else:
                sources[acc.source] = self.tensors[acc.source]
        for sub, accs in nested.items():
            if not grid.sampled or sub in self.materialised:
                sources[sub] = self.materialise(sub)
            else:
                sources[sub] = self._sampled_source(sub, accs, grid)
        return sources

    def _sampled_source(self, sub: Scope, accs: list[Access], grid: Grid) -> Source:
        offsets = tuple(it.lo for it in sub.traversal)
        size = math.prod(sub.shape)
        limit = int(SPARSE_FRACTION * size)
        for acc in accs:
            self.budget.work(math.prod(grid.sizes[a] for a in grid.axes(_names(acc))),
                             lambda: f"the positions of {_describe(sub)} read")
        found = [requested_keys(sub.shape, offsets, acc.indices, grid, limit) for acc in accs]
        keys = None if any(k is None for k in found) else np.unique(np.concatenate(found))
        if size <= 1 or keys is None or len(keys) > limit:
            return self.materialise(sub)
        points = np.stack(np.unravel_index(keys, sub.shape), axis=1) if len(keys) else \
            np.zeros((0, len(sub.shape)), np.int64)
        values = self.evaluate(sub, Grid.at_points(sub, points))
        return SparseSource(_describe(sub), sub.shape, offsets, keys, values)


def _redo_non_finite(scope: Scope, grid: Grid, sources: Mapping[str | Scope, Source],
                     out: np.ndarray, budget: Budget) -> None:
    """Re-evaluate the body as written where ``out`` is inf or NaN.

    Term-wise evaluation reassociates (distributes products over sums, sums one operand of a
    product before multiplying, scales sums by constants) and multiplies the zeros of reads
    outside their sources like any value: exact up to float64 rounding for finite values, but
    not where inf or NaN occur. A finite result means every value involved was finite (barring
    float64 overflow), so only non-finite results need the body as written, with structural
    zeros (:func:`~ollie.semantics.terms.eval_written`; a structural zero changes a value only
    where plain arithmetic gives NaN: ``0 * NaN``, ``0 * inf``, ``0 / 0``, which no operation
    or function turns back into a number): evaluated element-wise at each such point and every
    summation point, then summed (in chunks of points, so that their positions stay small).
    """
    flat = out.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat))
    if not len(bad):
        return
    chunk = max(1, MAX_ELEMENTS // max(1, out.ndim, grid.points.shape[1] if grid.sampled else 1))
    term = Term(1.0, (Factor(scope.body),))
    for start in range(0, len(bad), chunk):
        part = bad[start:start + chunk]
        if grid.sampled:
            points = grid.points[part]
        elif out.ndim:
            points = np.stack(np.unravel_index(part, out.shape), axis=1)
        else:
            points = np.zeros((len(part), 0), np.int64)
        values = np.zeros(len(part))
        _add_term(term, Grid.at_points(scope, points), sources, values, budget, scope,
                  written=True)
        flat[part] = values


def _describe(scope: Scope) -> str:
    text = str(scope)
    return "{ " + (text if len(text) < 60 else text[:57] + "...") + " }"


def _add_term(term: Term, grid: Grid, sources: Mapping[str | Scope, Source],
              out: np.ndarray, budget: Budget, scope: Scope, written: bool = False) -> None:
    """``out += Sum<summation axes> term`` (broadcast over the output axes it does not use);
    the points of the axes the term uses are charged to ``budget`` first. ``written``: the
    term is one factor, the body, evaluated as written with structural zeros
    (:func:`~ollie.semantics.terms.eval_written`)."""

    def plain(box: Box):
        return lambda acc: read(sources[acc.source], acc.indices, grid, box)

    def masked(box: Box):
        def read_masked(acc: Access):
            src = sources[acc.source]
            return read(src, acc.indices, grid, box), in_range(src, acc.indices, grid, box)
        return read_masked

    def eval_at(f: Factor, box: Box):
        if written:
            return eval_written(f.node, masked(box))
        return eval_factor(f, plain(box))

    coef = np.float64(term.coef)
    factors: list[tuple[Factor, frozenset[int]]] = []
    for f in term.factors:
        axes = grid.axes(f.iters)
        if axes:
            factors.append((f, axes))
        else:  # a constant factor (reads at constant indices, functions of them)
            coef = coef * np.asarray(eval_at(f, grid.full_box())).reshape(())
    used = frozenset().union(*(axes for _, axes in factors))
    budget.work(math.prod(grid.sizes[a] for a in used), lambda: f"a term of {_describe(scope)}")
    mult = _as_float(math.prod(n for a, n in enumerate(grid.sizes)
                               if grid.is_summed(a) and a not in used))
    out_axes = sorted(a for a in used if not grid.is_summed(a))
    if not factors:
        out += coef * mult
        return
    post = coef * mult
    block = plan_blocks(grid, [axes for _, axes in factors] + [frozenset(out_axes)],
                        MAX_ELEMENTS)
    cache: dict[int, tuple[tuple, np.ndarray]] = {}
    for box in iter_boxes(grid, block, used):
        ops = []
        for i, (f, axes) in enumerate(factors):
            key = tuple(box[a] for a in sorted(axes))
            hit = cache.get(i)
            if hit is not None and hit[0] == key:
                value = hit[1]
            else:
                value = np.broadcast_to(eval_at(f, box), grid.box_shape(box, axes))
                value = value.reshape([box[a][1] - box[a][0] for a in sorted(axes)])
                cache[i] = (key, value)
            ops.append(value)
        res = contract(ops, [sorted(axes) for _, axes in factors], out_axes)
        if post != 1:
            res = res * post
        target = tuple(slice(*box[a]) for a in range(grid.n_out))
        out[target] += res.reshape(grid.box_shape(box, out_axes)[: grid.n_out])


def _as_float(n: int) -> float:
    """``float(n)``, or inf past the float range (a count of summation points)."""
    return float(n) if n < 1e308 else math.inf


def _names(acc: Access) -> frozenset[str]:
    return frozenset().union(*(i.vars() for i in acc.indices))
