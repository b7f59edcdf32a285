"""Matching band matrix products (Longformer's dilated sliding-window attention)::

    G2BMM: L<b, i, j> Sum<k> Q[b, i, k] * K[b, i + d*j + o, k]     S: [b, m, 2w+1]
    GBMM:  L<b, i, n> Sum<j> S[b, i, j] * V[b, i + d*j + o, n]     O: [b, m, n]

The library semantics (MODELS.md) read ``K[b, i + d*(j - w)]`` / ``V[...]`` for
``j in [0, 2w+1)``, zero outside ``[0, m)``. Groups: ``b`` and ``i`` are both (X, Y, O) and
are told apart by ``i`` sharing the *band dimension* of the second read with ``j`` (``i`` with
coefficient 1, ``j`` with the dilation ``d > 0``); ``j`` is (K, O) for G2BMM and (S, V) for
GBMM; ``k`` (G2BMM) is (Q, K), ``n`` (GBMM) is (V, O). ``b``, ``k`` and ``n`` may hold
several iterators (fused) or none.

With ``i = i' + lo_i`` and ``j = j' + lo_j`` the band index is ``i' + d*j' + c0``; the library
reads a window of ``m`` rows of the band tensor starting at ``base = c0 + d*w``. It matches
when every non-padding row the expression reads lies inside that window (for the usual
``L<i=0:m, j=0:2w+1> ... K[b, i + d*j - d*w, k]`` the window is the whole tensor); otherwise
the OFFSET issue gives the constant that centres ``j`` on ``i`` (``-d*(lo_j + w)``). The range
of ``j`` must be odd (``2w + 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ollie.ir import Access, Affine, Iter, Scope, make_expr, var
from ollie.match.common import (
    count_issue,
    foreign_groups,
    fresh_iter,
    label_of,
    mixed_issue,
    pin_unit_iterators,
)
from ollie.match.common import sizes as gsize
from ollie.match.layout import (
    contiguous_view,
    iterator_strides,
    iters_of,
    layout_eop,
    names_for,
    operand_view,
    order_choices,
    output_eop,
    product_body,
    read_at,
    same_layout,
)
from ollie.match.result import (
    COEFFICIENT,
    LAYOUT,
    LAYOUT_TRANSFORM,
    NONAFFINE,
    OFFSET,
    RANGE,
    RELAX,
    SUBSTITUTION,
    Issue,
    MatchResult,
    Mismatch,
    mismatch,
)
from ollie.match.table import IterTable, Operand, build_table
from ollie.program.kernel import Kernel, View
from ollie.program.params import G2BMMParams, GBMMParams, KernelKind, KernelParams

G2BMM, GBMM = KernelKind.G2BMM, KernelKind.GBMM


@dataclass(frozen=True)
class _Band:
    dim: int
    i: str
    j: str
    d: int
    w: int
    m: int
    base: int
    p: str


@dataclass(frozen=True)
class _Plan:
    table: IterTable
    first: Operand                       # Q (G2BMM) or S (GBMM)
    second: Operand                      # K or V: holds the band dimension
    b: tuple[str, ...]
    free: tuple[str, ...]                # k (G2BMM) or n (GBMM)
    band: _Band
    second_idx: tuple[Affine, ...]       # band dimension replaced by band.p
    view_1: View | str
    view_2: View | str
    direct: bool

    def cost(self, table: IterTable, op: str) -> tuple[int, int]:
        b, m, f = gsize(table, self.b), self.band.m, gsize(table, self.free)
        jn = 2 * self.band.w + 1
        first = b * m * (f if op == G2BMM else jn)
        copied = (first if isinstance(self.view_1, str) else 0)
        copied += b * m * f if isinstance(self.view_2, str) else 0
        copied += b * m * (jn if op == G2BMM else f) if not self.direct else 0
        eops = isinstance(self.view_1, str) + isinstance(self.view_2, str) + (not self.direct)
        return copied, eops


def _band_dim(op: str, table: IterTable, role: str, j: str) -> _Band | list[Issue]:
    dims = [d for d in table.dims_of(role) if j in d.vars]
    if len(dims) != 1:
        return [mixed_issue(op, table, d, f"{j} must appear in one dimension") for d in dims]
    d = dims[0]
    batch = [n for n in d.vars if table.label(n) == "XYO"]
    if not d.affine:
        return [Issue(NONAFFINE, f"{op}: band dimension {d.dim} of {d.tensor} index "
                      f"{d.index} has div/mod", tensor=d.tensor, dim=d.dim,
                      iterators=tuple(sorted(d.vars)), hint=SUBSTITUTION)]
    extra = [n for n in d.vars if n != j and n not in batch]
    issues = [count_issue(op, "m (shares the band dimension with j)", "XYO", tuple(batch),
                          1, 1)]
    if extra:
        issues.append(mixed_issue(op, table, d, f"only i and {j} may index the band"))
    out = [x for x in issues if x is not None]
    if out:
        return out
    (i,) = batch
    ci, dj = d.index.coef(i), d.index.coef(j)
    if ci != 1 or dj <= 0:
        return [Issue(COEFFICIENT, f"{op}: band index {d.index}: coefficient of {i} must be 1 "
                      f"(is {ci}) and of {j} positive (is {dj})", tensor=d.tensor, dim=d.dim,
                      iterators=(i, j), expected=(1, "> 0"), actual=(ci, dj),
                      hint=SUBSTITUTION)]
    nj = table.size(j)
    if nj % 2 == 0:
        return [Issue(RANGE, f"{op}: range of {j} has {nj} values; the band needs 2w+1 (odd)",
                      iterators=(j,), expected="odd", actual=nj, hint=RELAX)]
    w, m = (nj - 1) // 2, table.size(i)
    c0 = d.index.const + table.scope.iter(i).lo + dj * table.scope.iter(j).lo
    base = c0 + dj * w
    lo, hi = max(0, c0), min(d.size, c0 + m + 2 * dj * w)   # non-padding rows read
    if lo < hi and not (base <= lo and hi <= base + m):
        want = -dj * (table.scope.iter(j).lo + w)
        if want == d.index.const:   # centred, but i's range is not the band tensor's rows
            return [Issue(RANGE, f"{op}: {i} covers rows {base}..{base + m - 1} but the band "
                          f"reads data rows {lo}..{hi - 1} of {d.tensor}", tensor=d.tensor,
                          dim=d.dim, iterators=(i,), expected=(lo, hi), actual=(base, base + m),
                          hint=RELAX)]
        return [Issue(OFFSET, f"{op}: band index {d.index} has offset {d.index.const}; "
                      f"{op} needs {want} ({j} centred on {i})", tensor=d.tensor, dim=d.dim,
                      iterators=(i, j), expected=want, actual=d.index.const,
                      hint=SUBSTITUTION)]
    return _Band(d.dim, i, j, dj, w, m, base, fresh_iter(table, "p"))


def _plans(op: str, table: IterTable, r1: str, r2: str) -> list[_Plan] | Mismatch:
    """The plans with ``r1`` the first operand and ``r2`` the band one, or why there is none."""
    jl, fl = (label_of((r2, "O")), "XY") if op == G2BMM else ("XY", label_of((r2, "O")))
    allowed = ("XYO", "XY", label_of((r2, "O")))
    table = pin_unit_iterators(table, allowed)
    issues = foreign_groups(table, op, allowed)
    got = count_issue(op, "j", jl, table.group(jl), 1, 1)
    if issues or got:
        return mismatch(op, [*issues, *([got] if got else [])])
    band = _band_dim(op, table, r2, table.group(jl)[0])
    if isinstance(band, list):
        return mismatch(op, band)
    first, second = table.operand(r1), table.operand(r2)
    skip = {(r2, band.dim)}
    issues = [mixed_issue(op, table, d) for d in table.dims
              if d.mixed and (d.role, d.dim) not in skip]
    issues += [mixed_issue(op, table, d, f"{band.i} or {band.j} outside the band dimension")
               for d in table.dims_of(r2) if d.dim != band.dim and not d.mixed
               and d.vars & {band.i, band.j}]
    if issues:
        return mismatch(op, issues)
    gb = tuple(n for n in table.group("XYO") if n != band.i)
    gf = table.group(fl)
    idx2 = list(second.indices)
    idx2[band.dim] = var(band.p)
    ranges = {**table.ranges, band.p: (band.base, band.base + band.m)}
    maps = [iterator_strides(first.indices, first.shape), iterator_strides(idx2, second.shape)]
    plans = []
    for ob, of in order_choices([gb, gf], maps, [False, False]):
        third = of if op == G2BMM else (band.j,)
        v1 = operand_view(first.indices, first.shape, [ob, (band.i,), third], ranges)
        v2 = operand_view(idx2, second.shape, [ob, (band.p,), of], ranges)
        out = ob + (band.i,) + ((band.j,) if op == G2BMM else of)
        direct = same_layout(table.traversal, out, ranges)
        plans.append(_Plan(table, first, second, ob, of, band, tuple(idx2), v1, v2, direct))
    return plans


def _match(op: KernelKind, scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str | None,
           layout_eops: bool) -> MatchResult | Mismatch:
    table = build_table(scope, decls)
    if isinstance(table, Mismatch):
        return Mismatch(op, table.issues)
    plans: list[_Plan] = []
    failures: list[Mismatch] = []
    for r1, r2 in (("X", "Y"), ("Y", "X")):
        got = _plans(op, table, r1, r2)
        if isinstance(got, Mismatch):
            failures.append(got)
        else:
            plans += got
    if not plans:
        return min(failures, key=lambda m: _severity(m.issues))
    plan = min(plans, key=lambda p: p.cost(p.table, op))
    notes = []
    for role, o, v in (("first", plan.first, plan.view_1), ("band", plan.second, plan.view_2)):
        if isinstance(v, str):
            notes.append(Issue(LAYOUT, f"{role} operand ({o.name}) is not a strided view: {v}",
                               tensor=o.name, hint=LAYOUT_TRANSFORM))
    if not plan.direct:
        notes.append(Issue(LAYOUT, "the output order is not the operator's: output eOperator",
                           hint=LAYOUT_TRANSFORM))
    if notes and not layout_eops:
        return mismatch(op, notes)
    return _build(op, plan.table, plan, decls, name, notes)


def _severity(issues: Sequence[Issue]) -> tuple[int, int]:
    """Prefer reporting the role assignment that got furthest (fewer group issues)."""
    return sum(i.kind == "group" for i in issues), len(issues)


def _build(op: KernelKind, table: IterTable, plan: _Plan, decls: Mapping[str, tuple[int, ...]],
           name: str | None, notes: list[Issue]) -> MatchResult:
    scope, band = table.scope, plan.band
    names = names_for(decls, name, "S" if op == G2BMM else "O")
    third = plan.free if op == G2BMM else (band.j,)
    kernels: list[Kernel] = []
    reads: dict[str, Access] = {}
    srcs, views = [], []
    kdecls: dict[str, tuple[int, ...]] = {}
    p_iter = Iter(band.p, band.base, band.base + band.m)
    for k, (o, v) in enumerate(((plan.first, plan.view_1), (plan.second, plan.view_2))):
        if isinstance(v, str):
            mid = iters_of(scope, (band.i,)) if k == 0 else (p_iter,)
            last_names = third if k == 0 else plan.free
            its = (*iters_of(scope, plan.b), *mid, *iters_of(scope, last_names))
            idx = o.indices if k == 0 else plan.second_idx
            eop = layout_eop(Access(o.name, idx), its, decls, names.sub("AB"[k]))
            kernels.append(eop)
            repl = {} if k == 0 else {len(plan.b): o.indices[band.dim] - band.base}
            reads[o.role] = read_at(eop.output, its, repl)
            kdecls[eop.output] = eop.output_shape
            srcs.append(eop.output)
            views.append(contiguous_view([gsize(table, plan.b), band.m,
                                          gsize(table, last_names)]))
        else:
            reads[o.role] = o.access
            kdecls[o.name] = o.shape
            srcs.append(o.name)
            views.append(v)
    out_names = plan.b + (band.i,) + ((band.j,) if op == G2BMM else plan.free)
    out_iters = iters_of(scope, out_names)
    if plan.direct and not kernels:
        lib_scope = scope
    else:
        body = product_body(table.scale, reads["X"], reads["Y"])
        lib_scope = Scope(scope.traversal if plan.direct else out_iters, scope.summation, body)
    lib_out = names.output if plan.direct else names.sub(op.lower())
    free_key = "k" if op == G2BMM else "n"
    b, free = gsize(table, plan.b), gsize(table, plan.free)
    params: KernelParams = (
        G2BMMParams(b=b, m=band.m, w=band.w, k=free, d=band.d, alpha=table.scale)
        if op == G2BMM else
        GBMMParams(b=b, m=band.m, w=band.w, n=free, d=band.d, alpha=table.scale))
    kernels.append(Kernel(op, params, tuple(srcs), lib_out, make_expr(kdecls, lib_scope),
                          tuple(views)))
    if not plan.direct:
        kernels.append(output_eop(lib_out, out_iters, scope, names.output))
    mapping = {"b": plan.b, "m": (band.i,), "j": (band.j,), free_key: plan.free,
               "first": (plan.first.role,), "band": (plan.second.role,)}
    return MatchResult(op, tuple(kernels), names.output, mapping, tuple(notes))


def match_g2bmm(scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str | None = None,
                *, layout_eops: bool = True) -> MatchResult | Mismatch:
    """Match ``scope`` to G2BMM (see the module doc); ``name`` is the final output tensor."""
    return _match(G2BMM, scope, decls, name, layout_eops)


def match_gbmm(scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str | None = None,
               *, layout_eops: bool = True) -> MatchResult | Mismatch:
    """Match ``scope`` to GBMM (see the module doc); ``name`` is the final output tensor."""
    return _match(GBMM, scope, decls, name, layout_eops)
