"""Matching a scope to a (batched) Matmul ``C[b, m, n] = Sum_k A[b, m, k] * B[b, k, n]``.

Iterator groups (the paper's Table "iterator mapping table"): ``b`` = (A, B, O),
``m`` = (A, O), ``n`` = (B, O), ``k`` = (A, B). Both role assignments (X = A, Y = B and
X = B, Y = A, i.e. ``C^T = B^T A^T``) are tried. A group may hold several iterators (fused into
one BLAS dimension) or none (size 1); iterators in any other group, and dimensions mixing
groups, are a :class:`Mismatch`.

Each operand is read through a strided view when its canonical matrix is one (see
:mod:`ollie.match.layout`; ``trans_a`` / ``trans_b`` say the inner BLAS dimension is the row),
else a layout eOperator materialises it. The output is direct when the scope's traversal order
is (b, m, n) flattened, else an output eOperator re-lays it out. The cheapest plan (fewest
elements copied) wins. Example::

    C: [4, 1, 5, 7]
    D: [3, 4, 6, 3]
    L<b=1:4, m=0:5, n=0:3> Sum<k=0:6> C[b, 0, m, 1 + k] * D[b - 1, b, k, n]
    -> Matmul b=3 m=5 n=3 k=6, A = view of C (offset 36), B = view of D, no eOp
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ollie.ir import Scope, make_expr
from ollie.match.common import foreign_groups, label_of, mixed_issue, pin_unit_iterators, sizes
from ollie.match.layout import (
    blas_trans,
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
from ollie.match.result import LAYOUT, LAYOUT_TRANSFORM, Issue, MatchResult, Mismatch, mismatch
from ollie.match.table import IterTable, Operand, build_table
from ollie.program.kernel import Kernel, View
from ollie.program.params import KernelKind, MatmulParams

OP = KernelKind.MATMUL
_GROUPS = ("XYO", "XO", "YO", "XY")


@dataclass(frozen=True)
class _Plan:
    a: Operand
    b: Operand
    groups: tuple[tuple[str, ...], ...]   # b, m, n, k
    view_a: View | str                   # a reason string: needs a layout eOp
    view_b: View | str
    direct: bool

    def cost(self, table: IterTable) -> tuple[int, int]:
        gb, gm, gn, gk = (sizes(table, g) for g in self.groups)
        copied = 0
        copied += gb * gm * gk if isinstance(self.view_a, str) else 0
        copied += gb * gk * gn if isinstance(self.view_b, str) else 0
        copied += gb * gm * gn if not self.direct else 0
        eops = isinstance(self.view_a, str) + isinstance(self.view_b, str) + (not self.direct)
        return copied, eops


def _blas_view(op: Operand, groups: list[tuple[str, ...]], ranges: Mapping) -> View | str:
    v = operand_view(op.indices, op.shape, groups, ranges)
    if isinstance(v, View) and blas_trans(v) is None:
        return (f"strides {list(v.strides[-2:])} of sizes {list(v.sizes[-2:])} have no "
                "unit-stride dimension (BLAS layout)")
    return v


def _plans(table: IterTable, ra: str, rb: str) -> list[_Plan]:
    a, b = table.operand(ra), table.operand(rb)
    gb = table.group("XYO")
    gm = table.group(label_of((ra, "O")))
    gn = table.group(label_of((rb, "O")))
    gk = table.group("XY")
    maps = [iterator_strides(a.indices, a.shape), iterator_strides(b.indices, b.shape)]
    ranges = table.ranges
    out = []
    for ob, om, on, ok in order_choices([gb, gm, gn, gk], maps, [False] * 4):
        va = _blas_view(a, [ob, om, ok], ranges)
        vb = _blas_view(b, [ob, ok, on], ranges)
        direct = same_layout(table.traversal, ob + om + on, ranges)
        out.append(_Plan(a, b, (ob, om, on, ok), va, vb, direct))
    return out


def match_matmul(scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str | None = None,
                 *, layout_eops: bool = True) -> MatchResult | Mismatch:
    """Match ``scope`` to Matmul; ``name`` is the final output tensor (fresh when None).
    With ``layout_eops=False`` an operand or output that needs a copy is a LAYOUT mismatch."""
    table = build_table(scope, decls)
    if isinstance(table, Mismatch):
        return Mismatch(OP, table.issues)
    table = pin_unit_iterators(table, _GROUPS)
    issues = foreign_groups(table, OP, _GROUPS)
    issues += [mixed_issue(OP, table, d) for d in table.mixed()]
    if issues:
        return mismatch(OP, issues)
    plans = _plans(table, "X", "Y") + _plans(table, "Y", "X")
    plan = min(plans, key=lambda p: p.cost(table))
    notes = _notes(plan)
    if notes and not layout_eops:
        return mismatch(OP, notes)
    return _build(table, plan, decls, name, notes)


def _notes(plan: _Plan) -> list[Issue]:
    out = []
    for role, op, v in (("A", plan.a, plan.view_a), ("B", plan.b, plan.view_b)):
        if isinstance(v, str):
            out.append(Issue(LAYOUT, f"operand {role} ({op.name}) is not a strided view: {v}",
                             tensor=op.name, hint=LAYOUT_TRANSFORM))
    if not plan.direct:
        out.append(Issue(LAYOUT, "the output order is not (b, m, n): output eOperator",
                         tensor=None, hint=LAYOUT_TRANSFORM))
    return out


def _build(table: IterTable, plan: _Plan, decls: Mapping[str, tuple[int, ...]],
           name: str | None, notes: list[Issue]) -> MatchResult:
    scope = table.scope
    names = names_for(decls, name, "C")
    gb, gm, gn, gk = plan.groups
    kernels: list[Kernel] = []
    reads, srcs, views, trans = {}, {}, {}, {}
    kdecls: dict[str, tuple[int, ...]] = {}
    for role, op, v, dims in (("A", plan.a, plan.view_a, gb + gm + gk),
                              ("B", plan.b, plan.view_b, gb + gk + gn)):
        if isinstance(v, str):
            its = iters_of(scope, dims)
            eop = layout_eop(op.access, its, decls, names.sub(role))
            kernels.append(eop)
            reads[op.role] = read_at(eop.output, its)
            srcs[role] = eop.output
            kdecls[eop.output] = eop.output_shape
            groups = (gb, gm, gk) if role == "A" else (gb, gk, gn)
            views[role] = contiguous_view([sizes(table, g) for g in groups])
        else:
            reads[op.role] = op.access
            srcs[role] = op.name
            kdecls[op.name] = op.shape
            views[role] = v
        trans[role] = bool(blas_trans(views[role]))
    out_iters = iters_of(scope, gb + gm + gn)
    traversal = scope.traversal if plan.direct else out_iters
    if plan.direct and not kernels:
        lib_scope = scope
    else:
        body = product_body(table.scale, reads["X"], reads["Y"])
        lib_scope = Scope(traversal, scope.summation, body)
    lib_out = names.output if plan.direct else names.sub("mm")
    params = MatmulParams(b=sizes(table, gb), m=sizes(table, gm), n=sizes(table, gn),
                          k=sizes(table, gk), trans_a=trans["A"], trans_b=trans["B"],
                          alpha=table.scale)
    kernels.append(Kernel(OP, params, (srcs["A"], srcs["B"]), lib_out,
                          make_expr(kdecls, lib_scope), (views["A"], views["B"])))
    if not plan.direct:
        kernels.append(output_eop(lib_out, out_iters, scope, names.output))
    mapping = {"b": gb, "m": gm, "n": gn, "k": gk, "A": (plan.a.role,), "B": (plan.b.role,)}
    return MatchResult(OP, tuple(kernels), names.output, mapping, tuple(notes))
