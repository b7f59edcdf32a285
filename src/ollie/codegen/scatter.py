"""Scatter form of a selective sum: iterate the input in memory order and add into the output.

A gather loop nest (:mod:`ollie.codegen.emit`) runs over the output and reads the input. For
``L<l...> Sum<s...> X[A (l, s) + b]`` (a single read, affine indices) whose index matrix ``A``
is square and unimodular (``det A = +-1``), the map from iterator points to input elements is a
bijection of the integer lattices, so ``(l, s) = A^-1 (k - b)`` and

    out[l] = sum over input elements k with A^-1 (k - b) inside the iterator ranges of X[k]

(a point whose read is out of bounds contributes the 0 it reads). The scatter nest visits ``k``
in row-major order, so the input is streamed contiguously, and adds ``X[k]`` to
``out[l(k)]``. Every iterator range becomes a clamp of the loop bounds of the innermost input
dimension its inverse depends on (no test in the loop body). This is the natural form of a
strided ConvTranspose's selective add (``Y[n, y, x, c, h + 1 - 2*y, w + 1 - 2*x]``): its gather
reads every tap of an output row from a different 4 KiB-apart cache line, its scatter reads
each line once, in order.

Parallel loop: the leading input dimensions ``k_d`` that alone determine a traversal iterator
(``l_j = +-k_d + c``) are fused into one ``prange``; distinct values then write disjoint output
elements, so there are no races. The output is zeroed first: per parallel item when those
dimensions are the leading output dimensions in order and unclamped (the item's output is one
contiguous slice), otherwise by a separate parallel pass.

Neither form wins everywhere (2-core VM, median ms: ConvTranspose add [16,64,28,28] gather 0.96,
scatter 0.59; 3x3 offset-add [16,256,14,14] gather 1.23, scatter 3.63: its 3-trip inner loops
and read-modify-writes do not vectorise), so :func:`~ollie.codegen.cpu.choose_source` times both
when an expression has a parallel scatter form and keeps the faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import prod

from ollie.ir import Access, Expr


@dataclass(frozen=True)
class ScatterForm:
    """The inverse map of a unimodular single-read sum (see the module docstring).

    ``inverse[i]``: (coefficients over the input dimensions, constant) of iterator ``i``
    (traversal iterators first, then summation iterators); ``ranges[i]``: its ``[lo, hi)``.
    """

    input_name: str
    input_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    n_traversal: int
    inverse: tuple[tuple[tuple[int, ...], int], ...]
    ranges: tuple[tuple[int, int], ...]

    def level_of(self, i: int) -> int:
        """The innermost input dimension iterator ``i`` depends on (-1: none)."""
        coefs = self.inverse[i][0]
        return max((d for d, c in enumerate(coefs) if c), default=-1)

    def parallel_levels(self) -> int:
        """How many leading input dimensions form the ``prange`` (0: none)."""
        count = 0
        for d in range(len(self.input_shape)):
            if not any(self._only(j, d) for j in range(self.n_traversal)):
                break
            # its loop bounds must not depend on other dimensions (fused loop of fixed extent)
            if any(self.level_of(i) == d and self._deps(i) != {d}
                   for i in range(len(self.inverse))):
                break
            count += 1
        return count

    def _deps(self, i: int) -> set[int]:
        return {d for d, c in enumerate(self.inverse[i][0]) if c}

    def _only(self, j: int, d: int) -> bool:
        coefs = self.inverse[j][0]
        return coefs[d] in (1, -1) and self._deps(j) == {d}


def _invert(matrix: list[list[int]]) -> list[list[int]] | None:
    """The integer inverse of a square integer matrix, None when it is singular or the inverse
    is not integral (``det != +-1``)."""
    n = len(matrix)
    aug = [[Fraction(v) for v in row] + [Fraction(int(i == j)) for j in range(n)]
           for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if aug[r][col] != 0), None)
        if pivot is None:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        p = aug[col][col]
        aug[col] = [v / p for v in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                f = aug[r][col]
                aug[r] = [a - f * b for a, b in zip(aug[r], aug[col], strict=True)]
    inv = [row[n:] for row in aug]
    if any(v.denominator != 1 for row in inv for v in row):
        return None
    return [[int(v) for v in row] for row in inv]


def flattened(expr: Expr) -> Expr | None:
    """``expr`` with its nested scopes inlined (as :func:`ollie.codegen.plan.make_plan` inlines
    them: only where the nested scope's ranges are implied by its read's bounds, so the
    result is exact), when that leaves one loop nest reading inputs only; None otherwise.
    A selective sum over a re-laid-out Matmul output (``Sum<y, x> {L<..., t=-1:3, ...>
    T[..., t + 1, ...]}[..., h - 2*y, ...]``) becomes a single read with a scatter form."""
    from ollie.codegen.plan import make_plan
    from ollie.ir import Scope, map_body

    plan = make_plan(expr)
    if len(plan.nests) != 1 or not plan.inlined or plan.nests[0].post is not None:
        return None  # (a function the nest applies as it stores is not part of its scope)
    names = {b.ident: b.input_name for b in plan.inputs}
    scope = plan.nests[0].scope

    def visit(node: object) -> Access | None:
        if isinstance(node, Access) and node.source in names:
            return Access(names[node.source], node.indices)
        return None

    return Expr(expr.decls, Scope(scope.traversal, scope.summation, map_body(scope.body, visit)))


def scatter_form(expr: Expr, max_terms: int) -> ScatterForm | None:
    """The scatter form of ``expr`` when its root is a single affine read of an input whose
    index matrix is unimodular, and it sums fewer than ``max_terms`` points (float32
    accumulation, as the gather nest); None otherwise."""
    root = expr.root
    body = root.body
    if not isinstance(body, Access) or body.is_scope or not root.summation:
        return None
    if prod(it.size for it in root.summation) >= max_terms:
        return None
    iters = root.iters
    names = [it.name for it in iters]
    if len(body.indices) != len(iters) or not all(ix.is_linear for ix in body.indices):
        return None
    if any(not ix.vars() <= set(names) for ix in body.indices):
        return None
    matrix = [[ix.coef(n) for n in names] for ix in body.indices]
    inv = _invert(matrix)
    if inv is None:
        return None
    consts = [ix.const for ix in body.indices]
    inverse = tuple((tuple(row), -sum(c * b for c, b in zip(row, consts, strict=True)))
                    for row in inv)
    return ScatterForm(body.source, expr.inputs[body.source], root.shape,
                       len(root.traversal), inverse, tuple(it.range for it in iters))


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _lin(coefs: tuple[int, ...], const: int, upto: int) -> str:
    """``sum(c * k_d for d < upto) + const`` as source text."""
    parts = [f"{c}*k{d}" if c != 1 else f"k{d}" for d, c in enumerate(coefs[:upto]) if c]
    if const or not parts:
        parts.append(str(const))
    return " + ".join(parts).replace("+ -", "- ")


def _bounds(form: ScatterForm, d: int) -> tuple[list[str], list[str]]:
    """Lower and upper clamp expressions of input dimension ``d``'s loop (besides 0 and its
    size): for each iterator whose innermost dependence is ``d``, ``lo <= a*k_d + rest < hi``."""
    lows, highs = [], []
    for i, (coefs, const) in enumerate(form.inverse):
        if form.level_of(i) != d:
            continue
        a = coefs[d]
        rest = _lin(coefs, const, d)
        lo, hi = form.ranges[i]
        if a > 0:  # k >= ceil((lo - rest) / a), k < ceil((hi - rest) / a)
            lows.append(f"-((({rest}) - {lo}) // {a})")
            highs.append(f"-((({rest}) - {hi}) // {a})")
        else:  # k > (rest - hi) / |a|, k <= (rest - lo) / |a|
            lows.append(f"(({rest}) - {hi}) // {-a} + 1")
            highs.append(f"(({rest}) - {lo}) // {-a} + 1")
    return lows, highs


def _const_range(form: ScatterForm, d: int) -> tuple[int, int]:
    """The loop range of a parallel dimension: its clamps (the same as :func:`_bounds`
    computes as text) are constants."""
    lo, hi = 0, form.input_shape[d]
    for i, (coefs, const) in enumerate(form.inverse):
        if form.level_of(i) != d:
            continue
        a, (vlo, vhi) = coefs[d], form.ranges[i]
        if a > 0:
            lo, hi = max(lo, -((const - vlo) // a)), min(hi, -((const - vhi) // a))
        else:
            lo, hi = max(lo, (const - vhi) // -a + 1), min(hi, (const - vlo) // -a + 1)
    return lo, max(lo, hi)


def emit_scatter_module(form: ScatterForm, header: dict[str, str]) -> str:
    """Source of the kernel module (same interface as :func:`~ollie.codegen.emit.emit_module`:
    ``INPUTS`` and ``run(in_0, out)`` on flat float32 buffers)."""
    rank = len(form.input_shape)
    par = form.parallel_levels()
    ranges = [_const_range(form, d) for d in range(par)]
    in_strides = _strides(form.input_shape)
    out_strides = _strides(form.out_shape)
    out_size = prod(form.out_shape)
    # per-item zeroing: the parallel dims are output dims 0..par-1 (coef +1), unclamped
    lead: list[int] = []
    for d in range(par):
        j = next((j for j in range(form.n_traversal) if form._only(j, d)), None)
        lead.append(-1 if j is None else j)
    per_item = (par > 0 and lead == list(range(par))
                and all(form.inverse[d][0][d] == 1 for d in range(par))
                and all(ranges[d] == (form.ranges[d][0] - form.inverse[d][1],
                                      form.ranges[d][1] - form.inverse[d][1])
                        for d in range(par)))
    def deco(sig: str) -> str:
        return (f'@njit("{sig}", parallel=True, fastmath=False, cache=True, '
                'error_model="numpy", boundscheck=False)')

    lines = ['"""Generated by ollie.codegen.cpu, scatter form (do not edit).', ""]
    lines += ["    " + ln for ln in header["text"].splitlines()]
    lines += ['"""', "", "import numpy as np", "from numba import njit, prange  # noqa: F401", ""]
    lines += [f"{k} = {v!r}" for k, v in header.items() if k != "text"]
    lines += [f"INPUTS = ({form.input_name!r},)", "", ""]
    if not per_item:
        lines += [deco("void(float32[::1])"), "def zero(out):",
                  f"    for _i in prange({out_size}):", "        out[_i] = 0.0", "", ""]
    lines += [deco("void(float32[::1], float32[::1])"), "def scatter(in_0, out):",
              f'    """Adds every input element into its output element ({par} parallel '
              f'dimension(s), zeroed {"per item" if per_item else "beforehand"})."""']
    depth = 1
    if par:
        extents = [hi - lo for lo, hi in ranges]
        lines.append(f"    for _p in prange({prod(extents)}):")
        depth = 2
        rem = "_p"
        for d in range(par - 1, -1, -1):
            pad = "    " * depth
            if d:
                lines.append(f"{pad}k{d} = {rem} % {extents[d]} + {ranges[d][0]}")
                lines.append(f"{pad}_q{d} = {rem} // {extents[d]}")
                rem = f"_q{d}"
            else:
                lines.append(f"{pad}k0 = {rem} + {ranges[0][0]}")
        if per_item:
            base = sum(out_strides[d] * (form.inverse[d][1] - form.ranges[d][0])
                       for d in range(par))
            first = " + ".join([*(f"{out_strides[d]}*k{d}" for d in range(par)), str(base)])
            span = out_strides[par - 1]
            pad = "    " * depth
            lines.append(f"{pad}_z = {first}")
            lines.append(f"{pad}for _i in range(_z, _z + {span}):")
            lines.append(f"{pad}    out[_i] = 0.0")
    src = " + ".join(f"{s}*k{d}" for d, s in enumerate(in_strides))
    dst_terms = []
    for j in range(form.n_traversal):
        coefs, const = form.inverse[j]
        dst_terms.append(f"{out_strides[j]}*({_lin(coefs, const - form.ranges[j][0], rank)})")
    stmt = f"out[np.uint64({' + '.join(dst_terms)})] += in_0[np.uint64({src})]"
    for d in range(par, rank):
        pad = "    " * depth
        lows, highs = _bounds(form, d)
        size = form.input_shape[d]
        lines.append(f"{pad}_lo{d} = max({', '.join(['0', *lows])})" if lows
                     else f"{pad}_lo{d} = 0")
        lines.append(f"{pad}_hi{d} = min({', '.join([str(size), *highs])})" if highs
                     else f"{pad}_hi{d} = {size}")
        lines.append(f"{pad}for k{d} in range(_lo{d}, _hi{d}):")
        depth += 1
    lines.append("    " * depth + stmt)
    lines += ["", "", "def run(in_0, out):",
              '    """Zeroes and scatters (flat float32 buffers)."""']
    if not per_item:
        lines.append("    zero(out)")
    lines.append("    scatter(in_0, out)")
    return "\n".join(lines) + "\n"
