"""Matching a scope to a 2-D convolution (NCHW input, FCRS weight, groups = 1)::

    L<n, f, h, w> Sum<c, r, s> X[n, c, sh*h + dh*r + oh, sw*w + dw*s + ow] * W[f, c, r, s]

up to the roles of the two reads, the order of tensor dimensions (read through a strided
view, else a layout eOperator to NCHW / FCRS), constant indices (fixed dimensions), missing
``n`` / ``c`` / ``f`` (size 1), several iterators per ``n`` / ``c`` / ``f`` group (fused) and
missing spatial axes. Iterator groups: ``n`` = (I, O), ``f`` = (K, O), ``c`` = (I, K); a
*spatial* dimension of the input combines one (I, O) iterator ``h`` and one (I, K) iterator
``r`` (positive coefficients ``sh``, ``dh``). An (I, O) iterator alone in an input dimension
after the channel dimension (or any but the first such) becomes a spatial axis with a 1-tap
kernel when fewer than two spatial dimensions mix.

Padding comes from the constant: with ``h = h' + lo_h`` and ``r = r' + lo_r`` the index is
``sh*h' + dh*r' + o``; the kernel reads rows ``o .. last - 1`` with
``last = sh*(Ho - 1) + dh*(R - 1) + 1 + o``. The input view keeps only the rows of that span
that hold data, ``[max(0, o), min(H, last))`` (negative padding is a crop of the view), so
``ph = max(0, o) - o`` and ``ph_end = last - min(H, last)`` are >= 0 and may differ
(asymmetric); ``h`` is the number of rows kept. Params: n, c, h, w, f, r, s, ph, pw, ph_end,
pw_end, sh, sw, dh, dw, groups (= 1), alpha (the body's constant factor).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ollie.ir import Access, Affine, Iter, Scope, make_expr, var
from ollie.match.common import (
    foreign_groups,
    fresh_iter,
    label_of,
    mixed_issue,
    pin_unit_iterators,
    sizes,
)
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
    GROUP,
    LAYOUT,
    LAYOUT_TRANSFORM,
    NONAFFINE,
    SUBSTITUTION,
    Issue,
    MatchResult,
    Mismatch,
    mismatch,
)
from ollie.match.table import IterTable, Operand, build_table
from ollie.program.kernel import Kernel, View
from ollie.program.params import ConvParams, KernelKind

OP = KernelKind.CONV
_GROUPS = ("XO", "YO", "XY")


@dataclass(frozen=True)
class _Axis:
    """One spatial axis: output iterator, kernel-tap iterator, input dimension, the normalised
    index ``stride*h' + dilation*r' + const`` and the rows ``[lo, hi)`` of the input dimension
    the kernel reads (those holding data; the rest is padding)."""

    out: str | None = None
    tap: str | None = None
    dim: int | None = None
    p: str | None = None   # iterator over rows [lo, hi) (for views and eOps)
    tensor_size: int = 1
    stride: int = 1
    dilation: int = 1
    const: int = 0
    lo: int = 0
    hi: int = 1

    @property
    def size_in(self) -> int:
        return self.hi - self.lo

    def span(self, table: IterTable) -> tuple[int, int, int]:
        """(Ho, R, one past the last row read)."""
        ho = table.size(self.out) if self.out else 1
        r = table.size(self.tap) if self.tap else 1
        return ho, r, self.stride * (ho - 1) + self.dilation * (r - 1) + 1 + self.const

    def params(self, table: IterTable) -> tuple[int, int, int, int, int, int, int]:
        """(H, R, pad, pad_end, stride, dilation, Ho)."""
        if self.out is None and self.tap is None:
            return 1, 1, 0, 0, 1, 1, 1
        ho, r, last = self.span(table)
        return (self.size_in, r, self.lo - self.const, last - self.hi, self.stride,
                self.dilation, ho)


@dataclass(frozen=True)
class _Plan:
    i: Operand
    k: Operand
    groups: tuple[tuple[str, ...], ...]      # n, c, f
    axes: tuple[_Axis, _Axis]
    i_indices: tuple[Affine, ...]            # input indices with spatial dims -> axis.p
    view_i: View | str
    view_k: View | str
    direct: bool

    def cost(self, table: IterTable) -> tuple[int, int]:
        n, c, f = (sizes(table, g) for g in self.groups)
        hw_in = self.axes[0].size_in * self.axes[1].size_in
        taps = [a.tap for a in self.axes if a.tap]
        outs = [a.out for a in self.axes if a.out]
        copied = (n * c * hw_in if isinstance(self.view_i, str) else 0)
        copied += f * c * sizes(table, taps) if isinstance(self.view_k, str) else 0
        copied += n * f * sizes(table, outs) if not self.direct else 0
        eops = isinstance(self.view_i, str) + isinstance(self.view_k, str) + (not self.direct)
        return copied, eops


def _spatial(table: IterTable, ri: str, io: set[str], ik: set[str]
             ) -> tuple[list[_Axis], list[Issue]]:
    """Spatial axes of the input (mixed dimensions, then promoted (I, O)-only dimensions)."""
    axes: list[_Axis] = []
    issues: list[Issue] = []
    dims = table.dims_of(ri)
    for d in dims:
        vio, vik = d.vars & io, d.vars & ik
        if not (vio and vik):
            continue
        if not d.affine:
            issues.append(Issue(NONAFFINE, f"{OP}: spatial dimension {d.dim} of {d.tensor} has "
                                f"a div/mod index {d.index}", tensor=d.tensor, dim=d.dim,
                                iterators=tuple(sorted(d.vars)), hint=SUBSTITUTION))
        elif len(vio) != 1 or len(vik) != 1:
            issues.append(mixed_issue(OP, table, d, "a spatial dimension combines exactly one "
                                      "output and one kernel iterator"))
        else:
            (h,), (r,) = tuple(vio), tuple(vik)
            sh, dh = d.index.coef(h), d.index.coef(r)
            if sh <= 0 or dh <= 0:
                issues.append(Issue(COEFFICIENT, f"{OP}: dimension {d.dim} of {d.tensor}: "
                                    f"stride {sh} of {h} and dilation {dh} of {r} must be "
                                    "positive", tensor=d.tensor, dim=d.dim, iterators=(h, r),
                                    expected="> 0", actual=(sh, dh), hint=SUBSTITUTION))
            else:
                axes.append(_Axis(h, r, d.dim, None, d.size, sh, dh))
    if len(axes) > 2:
        issues.append(Issue(GROUP, f"{OP}: {len(axes)} spatial dimensions, at most 2",
                            iterators=tuple(a.out or "" for a in axes), expected=2,
                            actual=len(axes), hint=SUBSTITUTION))
    used = {n for a in axes for n in (a.out, a.tap)}
    flagged = {i.dim for i in issues}
    for d in dims:
        if d.dim not in {a.dim for a in axes} | flagged and d.vars & used:
            issues.append(mixed_issue(OP, table, d, "a spatial iterator is used in a second "
                                      "dimension"))
    if issues:
        return axes, issues
    # promote (I, O)-only dimensions to 1-tap spatial axes
    c_dims = [d.dim for d in dims if d.vars & (ik - used)]
    c_pos = min(c_dims) if c_dims else None
    cands = [d for d in dims if d.affine and len(d.vars) == 1 and d.vars <= io
             and d.index.coef(next(iter(d.vars))) > 0
             and sum(1 for e in dims if e.vars & d.vars) == 1]
    for pos, d in reversed(list(enumerate(cands))):
        if len(axes) >= 2:
            break
        if pos > 0 or (c_pos is not None and d.dim > c_pos):
            (h,) = tuple(d.vars)
            axes.append(_Axis(h, None, d.dim, None, d.size, d.index.coef(h), 1))
    return axes, issues


def _normalise(table: IterTable, ax: _Axis, idx: Affine, p: str) -> _Axis:
    """Shift ``h`` and ``r`` to start at 0 and crop the input rows to those holding data
    (negative padding becomes a crop of the view, so pad and pad_end are >= 0)."""
    lo_h = table.scope.iter(ax.out).lo if ax.out else 0
    lo_r = table.scope.iter(ax.tap).lo if ax.tap else 0
    const = idx.const + ax.stride * lo_h + ax.dilation * lo_r
    ax = _Axis(ax.out, ax.tap, ax.dim, p, ax.tensor_size, ax.stride, ax.dilation, const)
    _, _, last = ax.span(table)
    lo, hi = max(0, const), min(ax.tensor_size, last)
    if hi <= lo:  # no row holds data: read one padding row (an eOp materialises it)
        lo, hi = const, const + 1
    return _Axis(ax.out, ax.tap, ax.dim, p, ax.tensor_size, ax.stride, ax.dilation, const,
                 lo, hi)


def _plans(table: IterTable, ri: str, rk: str) -> list[_Plan] | Mismatch:
    """The plans with ``ri`` the input and ``rk`` the kernel, or why there is none."""
    i_op, k_op = table.operand(ri), table.operand(rk)
    io, ik = set(table.group(label_of((ri, "O")))), set(table.group("XY"))
    found, issues = _spatial(table, ri, io, ik)
    issues += [mixed_issue(OP, table, d) for d in table.dims_of(rk) if d.mixed]
    if issues:
        return mismatch(OP, issues)
    found.sort(key=lambda a: a.dim or 0)
    axes: list[_Axis] = [_Axis()] * (2 - len(found))
    idx = list(i_op.indices)
    extra: dict[str, tuple[int, int]] = {}
    for ax in found:
        p = fresh_iter(table, f"p{ax.dim}")
        axes.append(_normalise(table, ax, i_op.indices[ax.dim or 0], p))
        idx[ax.dim or 0] = var(p)
        extra[p] = (axes[-1].lo, axes[-1].hi)
    used = {n for a in axes for n in (a.out, a.tap) if n}
    gn = tuple(n for n in table.group(label_of((ri, "O"))) if n not in used)
    gc = tuple(n for n in table.group("XY") if n not in used)
    gf = table.group(label_of((rk, "O")))
    ranges = {**table.ranges, **extra}
    maps = [iterator_strides(idx, i_op.shape), iterator_strides(k_op.indices, k_op.shape)]
    sp_h, sp_w = ([a.p] if a.p else [] for a in axes)
    taps = [[a.tap] if a.tap else [] for a in axes]
    outs = tuple(a.out for a in axes if a.out)
    plans = []
    for on, oc, of in order_choices([gn, gc, gf], maps, [False] * 3):
        vi = operand_view(idx, i_op.shape, [on, oc, sp_h, sp_w], ranges)
        vk = operand_view(k_op.indices, k_op.shape, [of, oc, *taps], ranges)
        direct = same_layout(table.traversal, on + of + outs, ranges)
        plans.append(_Plan(i_op, k_op, (on, oc, of), (axes[0], axes[1]), tuple(idx), vi, vk,
                           direct))
    return plans


def match_conv(scope: Scope, decls: Mapping[str, tuple[int, ...]], name: str | None = None,
               *, layout_eops: bool = True) -> MatchResult | Mismatch:
    """Match ``scope`` to Conv (see the module doc); ``name`` is the final output tensor."""
    table = build_table(scope, decls)
    if isinstance(table, Mismatch):
        return Mismatch(OP, table.issues)
    table = pin_unit_iterators(table, _GROUPS)
    issues = foreign_groups(table, OP, _GROUPS)
    if issues:
        return mismatch(OP, issues)
    plans: list[_Plan] = []
    failures: list[Mismatch] = []
    for ri, rk in (("X", "Y"), ("Y", "X")):
        got = _plans(table, ri, rk)
        if isinstance(got, Mismatch):
            failures.append(got)
        else:
            plans += got
    if not plans:
        return min(failures, key=lambda m: len(m.issues))
    plan = min(plans, key=lambda p: p.cost(table))
    notes = _notes(plan)
    if notes and not layout_eops:
        return mismatch(OP, notes)
    return _build(table, plan, decls, name, notes)


def _notes(plan: _Plan) -> list[Issue]:
    out = []
    for role, op, v in (("input", plan.i, plan.view_i), ("weight", plan.k, plan.view_k)):
        if isinstance(v, str):
            out.append(Issue(LAYOUT, f"{role} ({op.name}) is not a strided view: {v}",
                             tensor=op.name, hint=LAYOUT_TRANSFORM))
    if not plan.direct:
        out.append(Issue(LAYOUT, "the output order is not (n, f, h, w): output eOperator",
                         hint=LAYOUT_TRANSFORM))
    return out


def _build(table: IterTable, plan: _Plan, decls: Mapping[str, tuple[int, ...]],
           name: str | None, notes: list[Issue]) -> MatchResult:
    scope = table.scope
    names = names_for(decls, name, "Y")
    gn, gc, gf = plan.groups
    ha, wa = plan.axes
    kernels: list[Kernel] = []
    reads: dict[str, Access] = {}
    kdecls: dict[str, tuple[int, ...]] = {}
    (h_in, r, ph, ph_end, sh, dh, _), (w_in, s, pw, pw_end, sw, dw, _) = (
        ha.params(table), wa.params(table))
    if isinstance(plan.view_i, str):
        p_iters = [Iter(a.p, a.lo, a.hi) for a in plan.axes if a.p]
        its = (*iters_of(scope, gn + gc), *p_iters)
        eop = layout_eop(Access(plan.i.name, plan.i_indices), its, decls, names.sub("X"))
        kernels.append(eop)
        base = len(gn) + len(gc)
        spatial = [plan.i.indices[a.dim] - a.lo for a in plan.axes if a.p and a.dim is not None]
        reads[plan.i.role] = read_at(eop.output, its, dict(enumerate(spatial, base)))
        kdecls[eop.output] = eop.output_shape
        vi, src_i = contiguous_view([sizes(table, gn), sizes(table, gc), h_in, w_in]), eop.output
    else:
        reads[plan.i.role], vi, src_i = plan.i.access, plan.view_i, plan.i.name
        kdecls[plan.i.name] = plan.i.shape
    if isinstance(plan.view_k, str):
        its = iters_of(scope, gf + gc + tuple(a.tap for a in plan.axes if a.tap))
        eop = layout_eop(plan.k.access, its, decls, names.sub("W"))
        kernels.append(eop)
        reads[plan.k.role] = read_at(eop.output, its)
        kdecls[eop.output] = eop.output_shape
        vk, src_k = contiguous_view([sizes(table, gf), sizes(table, gc), r, s]), eop.output
    else:
        reads[plan.k.role], vk, src_k = plan.k.access, plan.view_k, plan.k.name
        kdecls[plan.k.name] = plan.k.shape
    out_iters = iters_of(scope, gn + gf + tuple(a.out for a in plan.axes if a.out))
    if plan.direct and not kernels:
        lib_scope = scope
    else:
        body = product_body(table.scale, reads["X"], reads["Y"])
        lib_scope = Scope(scope.traversal if plan.direct else out_iters, scope.summation, body)
    lib_out = names.output if plan.direct else names.sub("conv")
    params = ConvParams(n=sizes(table, gn), c=sizes(table, gc), h=h_in, w=w_in,
                        f=sizes(table, gf), r=r, s=s, ph=ph, pw=pw, ph_end=ph_end,
                        pw_end=pw_end, sh=sh, sw=sw, dh=dh, dw=dw, groups=1,
                        alpha=table.scale)
    kernels.append(Kernel(OP, params, (src_i, src_k), lib_out, make_expr(kdecls, lib_scope),
                          (vi, vk)))
    if not plan.direct:
        kernels.append(output_eop(lib_out, out_iters, scope, names.output))
    mapping = {"n": gn, "c": gc, "f": gf,
               "h": (ha.out,) if ha.out else (), "r": (ha.tap,) if ha.tap else (),
               "w": (wa.out,) if wa.out else (), "s": (wa.tap,) if wa.tap else (),
               "input": (plan.i.role,), "weight": (plan.k.role,)}
    return MatchResult(OP, tuple(kernels), names.output, mapping, tuple(notes))
