"""Lowerings of 2-D convolutions: ``Conv2d`` and ``ConvTranspose2d`` (NCHW layout).

Conv2d, weight ``W[F, C/groups, KH, KW]``, stride (sh, sw), dilation (dh, dw), padding
(top pt, left pl, bottom, right), ``Fg = F / groups`` and ``Cg = C / groups``::

    L<n, f, h, w> Sum<c=0:Cg, r, s>
        X[n, (f / Fg)*Cg + c, sh*h + dh*r - pt, sw*w + dw*s - pl] * W[f, c, r, s]

(the group term is just ``c`` when groups == 1). Padding is the zero read outside ``X``.

ConvTranspose2d, weight ``W[Cin, Cout/groups, KH, KW]``, as a gather over the input: the input
pixel ``y`` scatters into output row ``h = sh*y - pt + dh*r``, so the kernel tap is
``r = u / dh`` with ``u = h + pt - sh*y`` when ``dh`` divides ``u``::

    L<n, c, h, w> Sum<f=0:Cig, y, x>
        X[n, (c / Cog)*Cig + f, y, x] * W[(c / Cog)*Cig + f, c % Cog, tap(u_h), tap(u_w)]

With dilation 1 the tap is ``u`` itself: taps outside ``[0, K)`` read 0. With dilation ``d > 1``
the tap is ``u / d + M*(u % d)`` where ``M = K - floor(umin / d)`` and ``umin`` is the minimum of
``u`` over the iterator ranges (see :func:`_tap`).

A bias ``B[F]`` is added by an outer scope ``L<n, f, h, w> {conv}[n, f, h, w] + B[f]``: under
the ``Sum`` it would be added once per summation point.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ollie.errors import UnsupportedError
from ollie.ir import BinOp, Scope, var
from ollie.ir.index import Affine
from ollie.lower.common import (
    Input,
    Lowered,
    check_rank,
    finish,
    int_tuple,
    iters,
    padding4,
    read,
    read_scope,
    scope,
    shape_error,
    take_inputs,
)


def _groups(op: str, groups: object) -> int:
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise UnsupportedError(f"{op}: attribute 'groups' must be a positive int, got {groups!r}")
    return int(groups)


def _with_bias(op: str, conv: Scope, bias: Input | None, out_channels: int) -> Scope:
    """``conv`` itself, or ``L<...> {conv}[...] + B[f]`` when a bias is given."""
    if bias is None:
        return conv
    (nb,) = check_rank(op, "B", bias, 1)
    if nb != out_channels:
        raise shape_error(op, f"bias '{bias[0]}' must have {out_channels} elements",
                          B=bias)
    outer = conv.traversal
    body = BinOp("+", read_scope(conv, outer), read(bias[0], (var(outer[1].name),)))
    return scope(outer, (), body)


def conv2d(inputs: Sequence[Input], *, stride: object = 1, padding: object = 0,
           dilation: object = 1, groups: object = 1) -> Lowered:
    """``Conv2d``: X [N, C, H, W], W [F, C/groups, KH, KW], optional B [F]."""
    op = "Conv2d"
    x, w, b = take_inputs(op, inputs, ("X", "W"), ("B",))
    n_, c_, h_, w_ = check_rank(op, "X", x, 4)
    f_, cg, kh, kw = check_rank(op, "W", w, 4)
    sh, sw = int_tuple(op, "stride", stride, 2)
    dh, dw = int_tuple(op, "dilation", dilation, 2)
    pt, pl, pb, pr = padding4(op, padding)
    g = _groups(op, groups)
    if c_ % g or f_ % g or cg != c_ // g:
        raise shape_error(op, f"with groups={g}, X channels ({c_}) and W output channels "
                          f"({f_}) must be multiples of groups and W dimension 1 must be "
                          "X channels / groups", X=x, W=w)
    ho = (h_ + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (w_ + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise shape_error(op, f"empty output ({ho}x{wo}): kernel larger than the padded input",
                          X=x, W=w)
    fg = f_ // g
    n, f, h, ww = var("n"), var("f"), var("h"), var("w")
    c, r, s = var("c"), var("r"), var("s")
    cin = c if g == 1 else (f // fg) * cg + c
    body = BinOp("*",
                 read(x[0], (n, cin, sh * h + dh * r - pt, sw * ww + dw * s - pl)),
                 read(w[0], (f, c, r, s)))
    conv = scope(iters("nfhw", (n_, f_, ho, wo)), iters("crs", (cg, kh, kw)), body)
    return finish(op, (x, w, b), _with_bias(op, conv, b, f_))


def _tap(u: Affine, d: int, k: int, ranges: dict[str, tuple[int, int]]) -> Affine:
    """Kernel index read for the dilated offset ``u = d * tap``.

    With ``d == 1`` it is ``u``: offsets outside ``[0, k)`` read 0. With ``d > 1`` only offsets
    that are multiples of ``d`` hit a tap, so we read ``u / d + M*(u % d)`` with
    ``M = k - floor(umin / d)``, ``umin`` the minimum of ``u`` over the iterator ranges:

    * ``u % d == 0``: the index is ``u / d``, the tap (out of ``[0, k)`` reads 0);
    * ``u % d >= 1``: the index is ``>= floor(umin / d) + M = k``, out of range, so it reads 0.

    Both cases are exact for every iterator value, so the expression equals the transposed
    convolution without any guard.
    """
    if d == 1:
        return u
    umin = u.bounds(ranges)[0]
    m = k - umin // d
    return u // d + m * (u % d)


def conv_transpose2d(inputs: Sequence[Input], *, stride: object = 1, padding: object = 0,
                     output_padding: object = 0, dilation: object = 1,
                     groups: object = 1) -> Lowered:
    """``ConvTranspose2d``: X [N, Cin, H, W], W [Cin, Cout/groups, KH, KW], optional B [Cout]."""
    op = "ConvTranspose2d"
    x, w, b = take_inputs(op, inputs, ("X", "W"), ("B",))
    n_, cin, h_, w_ = check_rank(op, "X", x, 4)
    wc, cog, kh, kw = check_rank(op, "W", w, 4)
    sh, sw = int_tuple(op, "stride", stride, 2)
    dh, dw = int_tuple(op, "dilation", dilation, 2)
    pt, pl, pb, pr = padding4(op, padding)
    oph, opw = int_tuple(op, "output_padding", output_padding, 2, minimum=0)
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise UnsupportedError(f"{op}: attribute 'output_padding'={output_padding!r} must be "
                               "smaller than max(stride, dilation) in each dimension")
    g = _groups(op, groups)
    if cin % g or wc != cin:
        raise shape_error(op, f"W must have X's {cin} input channels in dimension 0 and "
                          f"groups={g} must divide them", X=x, W=w)
    cig, cout = cin // g, cog * g
    ho = (h_ - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1
    wo = (w_ - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1
    if ho < 1 or wo < 1:
        raise shape_error(op, f"empty output ({ho}x{wo}): padding larger than the output",
                          X=x, W=w)
    traversal = iters("nchw", (n_, cout, ho, wo))
    summation = iters("fyx", (cig, h_, w_))
    ranges = {it.name: it.range for it in traversal + summation}
    n, c, h, ww = var("n"), var("c"), var("h"), var("w")
    f, y, xx = var("f"), var("y"), var("x")
    if g == 1:
        cin_idx, cout_idx = f, c
    else:
        cin_idx, cout_idx = (c // cog) * cig + f, c % cog
    tap_h = _tap(h + pt - sh * y, dh, kh, ranges)
    tap_w = _tap(ww + pl - sw * xx, dw, kw, ranges)
    body = BinOp("*", read(x[0], (n, cin_idx, y, xx)),
                 read(w[0], (cin_idx, cout_idx, tap_h, tap_w)))
    conv = scope(traversal, summation, body)
    return finish(op, (x, w, b), _with_bias(op, conv, b, cout))
