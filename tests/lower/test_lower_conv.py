"""Conv2d and ConvTranspose2d lowerings against torch.nn.functional."""

from __future__ import annotations

import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lower_testutil import check_op, rand, t

import ollie
from ollie.ir import Scope
from ollie.lower import lower


@st.composite
def conv_cases(draw: st.DrawFn) -> dict:
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.integers(1, 6 // groups))
    fg = draw(st.integers(1, 6 // groups))
    if draw(st.booleans()):
        pad = draw(st.tuples(*[st.integers(0, 2)] * 4))  # top, left, bottom, right
    else:
        pad = draw(st.tuples(st.integers(0, 2), st.integers(0, 2)))
    return dict(
        n=draw(st.integers(1, 2)), c=groups * cg, f=groups * fg, groups=groups,
        h=draw(st.integers(1, 9)), w=draw(st.integers(1, 9)),
        kh=draw(st.integers(1, 4)), kw=draw(st.integers(1, 4)),
        stride=draw(st.tuples(st.integers(1, 3), st.integers(1, 3))),
        dilation=draw(st.tuples(st.integers(1, 3), st.integers(1, 3))),
        padding=pad, bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40)
@given(conv_cases())
def test_conv2d_matches_torch(p: dict) -> None:
    pad4 = p["padding"] if len(p["padding"]) == 4 else p["padding"] * 2
    pt, pl, pb, pr = pad4
    (sh, sw), (dh, dw) = p["stride"], p["dilation"]
    assume(p["h"] + pt + pb - dh * (p["kh"] - 1) - 1 >= 0)
    assume(p["w"] + pl + pr - dw * (p["kw"] - 1) - 1 >= 0)
    arrays = {"X": rand((p["n"], p["c"], p["h"], p["w"]), p["seed"]),
              "W": rand((p["f"], p["c"] // p["groups"], p["kh"], p["kw"]), p["seed"] + 1)}
    if p["bias"]:
        arrays["B"] = rand((p["f"],), p["seed"] + 2)
    xp = F.pad(t(arrays["X"]), (pl, pr, pt, pb))
    want = F.conv2d(xp, t(arrays["W"]), t(arrays["B"]) if p["bias"] else None,
                    stride=(sh, sw), padding=0, dilation=(dh, dw), groups=p["groups"])
    low = check_op("Conv2d", arrays, want, stride=p["stride"], padding=p["padding"],
                   dilation=p["dilation"], groups=p["groups"])
    root = low.expr.root
    # the bias is never under the Sum: it is added by an outer scope without summation
    if p["bias"]:
        assert root.summation == () and isinstance(root.body.lhs.source, Scope)
    else:
        assert {it.name for it in root.summation} == {"c", "r", "s"}


@st.composite
def conv_transpose_cases(draw: st.DrawFn) -> dict:
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    stride = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    dilation = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    out_pad = tuple(draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation,
                                                                        strict=True))
    asym = draw(st.booleans())
    pad = draw(st.tuples(*[st.integers(0, 2)] * (4 if asym else 2)))
    return dict(
        n=draw(st.integers(1, 2)), groups=groups,
        cin=groups * draw(st.integers(1, 6 // groups)),
        cog=draw(st.integers(1, 6 // groups)),
        h=draw(st.integers(1, 6)), w=draw(st.integers(1, 6)),
        kh=draw(st.integers(1, 4)), kw=draw(st.integers(1, 4)),
        stride=stride, dilation=dilation, output_padding=out_pad, padding=pad,
        bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40)
@given(conv_transpose_cases())
def test_conv_transpose2d_matches_torch(p: dict) -> None:
    pad4 = p["padding"] if len(p["padding"]) == 4 else p["padding"] * 2
    pt, pl, pb, pr = pad4
    (sh, sw), (dh, dw), (oph, opw) = p["stride"], p["dilation"], p["output_padding"]
    ho = (p["h"] - 1) * sh - pt - pb + dh * (p["kh"] - 1) + oph + 1
    wo = (p["w"] - 1) * sw - pl - pr + dw * (p["kw"] - 1) + opw + 1
    assume(ho >= 1 and wo >= 1)
    cout = p["cog"] * p["groups"]
    arrays = {"X": rand((p["n"], p["cin"], p["h"], p["w"]), p["seed"]),
              "W": rand((p["cin"], p["cog"], p["kh"], p["kw"]), p["seed"] + 1)}
    if p["bias"]:
        arrays["B"] = rand((cout,), p["seed"] + 2)
    # torch pads symmetrically only: compute with padding 0 and crop (top, left, bottom, right)
    full = F.conv_transpose2d(t(arrays["X"]), t(arrays["W"]),
                              t(arrays["B"]) if p["bias"] else None, stride=(sh, sw),
                              padding=0, output_padding=(oph, opw), groups=p["groups"],
                              dilation=(dh, dw))
    want = full[:, :, pt:pt + ho, pl:pl + wo]
    check_op("ConvTranspose2d", arrays, want, stride=p["stride"], padding=p["padding"],
             output_padding=p["output_padding"], dilation=p["dilation"], groups=p["groups"])


def test_conv_transpose2d_symmetric_padding_direct() -> None:
    arrays = {"X": rand((2, 4, 3, 4), 3), "W": rand((4, 2, 3, 2), 4), "B": rand((4,), 5)}
    want = F.conv_transpose2d(t(arrays["X"]), t(arrays["W"]), t(arrays["B"]), stride=(2, 3),
                              padding=(1, 1), output_padding=(1, 0), groups=2,
                              dilation=(2, 1))
    check_op("ConvTranspose2d", arrays, want, stride=(2, 3), padding=(1, 1),
             output_padding=(1, 0), groups=2, dilation=(2, 1))


def test_conv2d_is_the_documented_gather_form() -> None:
    text = """A: [1, 512, 7, 7]
K: [512, 512, 3, 3]
L<n=0:1, f=0:512, h=0:7, w=0:7> Sum<c=0:512, r=0:3, s=0:3>
    A[n, c, h+r-1, w+s-1] * K[f, c, r, s]"""
    low = lower("Conv2d", [("A", (1, 512, 7, 7)), ("K", (512, 512, 3, 3))], padding=1)
    assert low.expr == ollie.parse(text)
    assert low.output_shape == (1, 512, 7, 7) and low.consts == {}


def test_conv_transpose2d_is_the_documented_gather_form() -> None:
    text = """X: [1, 8, 2, 2]
W: [8, 4, 4, 4]
L<n=0:1, c=0:4, h=0:4, w=0:4> Sum<f=0:8, y=0:2, x=0:2>
    X[n, f, y, x] * W[f, c, h + 1 - 2*y, w + 1 - 2*x]"""
    low = lower("ConvTranspose2d", [("X", (1, 8, 2, 2)), ("W", (8, 4, 4, 4))], stride=2,
                padding=1)
    assert low.expr == ollie.parse(text)


def test_grouped_conv_reads_the_group_channel() -> None:
    low = lower("Conv2d", [("X", (1, 4, 5, 5)), ("W", (6, 2, 3, 3))], groups=2)
    assert "X[n, 2*(f / 3) + c, h + r, w + s]" in ollie.format(low.expr)


def test_dilated_conv_transpose_paper_layer() -> None:
    """The InfoGAN layer shape class (k4 s2 p1), with dilation 2, on a small batch."""
    arrays = {"X": rand((1, 8, 2, 2), 7), "W": rand((8, 4, 4, 4), 8)}
    want = F.conv_transpose2d(t(arrays["X"]), t(arrays["W"]), stride=2, padding=1,
                              dilation=2)
    check_op("ConvTranspose2d", arrays, want, stride=2, padding=1, dilation=2)
