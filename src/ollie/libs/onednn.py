"""Library convolutions on the CPU: weights packed once for oneDNN, and the calling convention
every convolution implementation follows (:data:`Conv`: checked against torch when built,
:func:`checked`; an activation and residual epilogue, :func:`with_epilogue`; output buffers,
:func:`writes_into`, :func:`call_into`).

PyTorch eager's ``conv2d`` / ``conv_transpose2d`` on the CPU re-lay out the weight into
oneDNN's blocked format on every call; for a program whose weights are constants (inference)
the re-layout can be done once, when the program is compiled, as torch.compile's weight
freezing and ONNX Runtime do. The packed weight is then used by
``torch.ops.mkldnn._convolution_pointwise`` / ``_convolution_transpose_pointwise`` (the same
oneDNN primitives, without the per-call reorder). oneDNN may return a channels-last tensor:
it is kept so (a following packed convolution reads it without a reorder; a generated
eOperator makes it contiguous first), and a channels-last input is taken as it is.

A convolution may also add a residual tensor before its activation (``f(conv(x) + r)``, a
ResNet block's skip connection): oneDNN's binary ``add`` post-op (for ``conv2d``), ONNX
Runtime's fused Conv+Add(+Relu), or torch's conv followed by in-place ``add_`` and activation.
The callables then take ``(x, r)``.

:func:`packed_conv2d` / :func:`packed_conv_transpose2d` return a callable, or ``None`` when
the path is unavailable (no oneDNN in this torch build, not a CPU float32 tensor, an input size
the primitive rejects). Every implementation is checked once against the torch function on a
random input when it is built, and on one holding NaN and infinities (they must come out where
torch puts them); a disagreement also gives ``None``. oneDNN's ReLU post-op turns NaN into 0,
so ReLU is applied by torch after the primitive (:func:`post_op`;
docs/design/041-nan-exact-relu.md). Which implementation a
convolution runs on (these, torch, ONNX Runtime, Winograd) is measured by
:func:`ollie.exec.conv.best_conv`.
Why packed weights and a measured choice: docs/design/003-library-kernels-on-the-cpu.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ollie.activations import ACTIVATIONS, identity

log = logging.getLogger(__name__)
Conv = Callable[..., torch.Tensor]
"""A convolution: ``f(x)``, or ``f(x, r)`` for one with a residual input."""


POST_OPS: dict[str | None, Conv] = {None: identity,
                                    **{n: a.torch for n, a in ACTIVATIONS.items()}}
"""Activations oneDNN applies as a convolution post-op (``None``: none; the others:
:data:`ollie.activations.ACTIVATIONS`), with their torch functions (the reference the packed
convolution is checked against)."""

NAN_EXACT_POST_OPS = frozenset({"tanh", "sigmoid"})
"""The activations oneDNN applies as a post-op giving NaN where torch's function does. Its ReLU
post-op (``max(x, 0)``) gives 0 for a NaN, where ``torch.relu`` gives NaN: a NaN in a model's
input would vanish from the output. :func:`post_op` applies the others after the primitive
(docs/design/041-nan-exact-relu.md)."""


def post_op(activation: str | None) -> tuple[str, Conv]:
    """(the post-op oneDNN's primitive is given for ``activation``, the in-place torch function
    applied to its result after it): the activation itself and identity for one of
    :data:`NAN_EXACT_POST_OPS`, else ``"none"`` and the activation's in-place torch function
    (``torch.relu_``: one more pass over the output, and NaN kept)."""
    if activation is None:
        return "none", identity
    if activation in NAN_EXACT_POST_OPS:
        return activation, identity
    return "none", ACTIVATIONS[activation].torch_inplace


def available() -> bool:
    """Whether this torch build has the oneDNN packed convolution."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
            and hasattr(torch._C._nn, "mkldnn_reorder_conv2d_weight"))


def probes(input_shape: tuple[int, ...], ref: Conv, residual: bool,
           channels_last: bool = False) -> tuple[torch.Tensor, ...]:
    """Random arguments for a convolution ``ref`` of inputs of ``input_shape``: ``(x,)``, or
    ``(x, r)`` with a residual ``r`` of the output's shape; channels-last tensors if asked."""
    fmt = torch.channels_last if channels_last and len(input_shape) == 4 else \
        torch.contiguous_format
    x = torch.randn(input_shape).contiguous(memory_format=fmt)
    if not residual:
        return (x,)
    with torch.inference_mode():
        shape = ref(x, torch.zeros(())).shape
    return x, torch.randn(shape).contiguous(memory_format=fmt)


def checked(run: Conv, ref: Conv, input_shape: tuple[int, ...],
             residual: bool = False) -> Conv | None:
    """``run`` if it agrees with ``ref`` on random arguments (:func:`probes`) and puts NaN and
    infinities where ``ref`` does on an input holding some (:func:`with_nonfinite`), else
    None. One that takes an ``out`` buffer (:func:`writes_into`) is also checked writing into
    a NaN-filled one and, with a residual, into the residual itself; where that fails it is
    used without buffers."""
    with torch.inference_mode():
        args = probes(input_shape, ref, residual)
        want = ref(*args)
        if not _agrees(run(*args), want):
            log.warning("a library convolution disagrees with torch for input %s; not used",
                        list(input_shape))
            return None
        special = (with_nonfinite(args[0]), *args[1:])
        if not same_nonfinite(run(*special), ref(*special)):
            log.warning("a library convolution puts NaN or infinities where torch does not "
                        "for input %s; not used", list(input_shape))
            return None
        if writes_into(run):
            try:
                into = [run(*args, out=torch.full(want.shape, float("nan")))]
                if residual:
                    r = args[1].clone()
                    into.append(run(args[0], r, out=r))
                ok = all(_agrees(got, want) for got in into)
            except (RuntimeError, NotImplementedError) as exc:
                log.info("convolution for input %s: no output buffers (%s)",
                         list(input_shape), exc)
                ok = False
            if not ok:
                run.takes_out = False  # type: ignore[attr-defined]
    return run


def with_nonfinite(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` (same memory format) with a NaN, +inf and -inf at three positions
    spread over its elements."""
    y = x.clone()
    for i, v in enumerate((math.nan, math.inf, -math.inf)):
        y[tuple(int(k) for k in np.unravel_index((i * y.numel()) // 3, y.shape))] = v
    return y


def same_nonfinite(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether ``got`` has NaN, +inf and -inf exactly where ``want`` has them."""
    return got.shape == want.shape and all(torch.equal(f(got), f(want)) for f in (
        torch.isnan, torch.isposinf, torch.isneginf))


def _agrees(got: torch.Tensor, want: torch.Tensor) -> bool:
    scale = float(want.abs().max()) + 1e-6
    return got.shape == want.shape and float((got - want).abs().max()) <= 1e-3 * scale


def writes_into(conv: Conv) -> bool:
    """Whether ``conv`` takes ``out=``: a buffer of the output's shape to write the result
    into (its contents are overwritten; with a residual ``r``, ``out`` may be ``r`` itself).
    A fresh large output is page-faulted in on every call, which costs more than zeroing a
    reused buffer (docs/design/003-library-kernels-on-the-cpu.md)."""
    return bool(getattr(conv, "takes_out", False))


def buffer_for(out: torch.Tensor, like: tuple[torch.Size, bool],
               residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """``out`` made a target for a convolution whose fresh output has ``like`` = (shape,
    channels-last?): a dense buffer of that shape viewed in that memory format (its contents
    are meaningless), or ``out`` itself when it is the ``residual`` and already in that
    format (the convolution adds into it). ``None`` when it cannot be: a later operator must
    see the layout the fresh output would have had."""
    shape, channels_last = like
    if out.shape != shape or (len(shape) != 4 and channels_last):
        return None
    if out is residual:
        fits = is_channels_last(out) if channels_last else out.is_contiguous()
        return out if fits else None
    if not out.is_contiguous():
        return None
    if channels_last:
        n, c, h, w = shape
        return out.view(n, h, w, c).permute(0, 3, 1, 2)
    return out


Made = dict[object, tuple[torch.Size, bool]]
"""Per call configuration: the shape and channels-last flag of a convolution's fresh output."""


def call_into(conv: Conv, args: tuple[torch.Tensor, ...], out: torch.Tensor | None,
              made: Made, key: object) -> torch.Tensor:
    """``conv(*args)`` (``args``: the input, then the residual if any), written into ``out``
    when ``conv`` can (:func:`writes_into`) and an earlier call with ``key`` showed the layout
    its output has (:func:`buffer_for`); else a fresh output, whose layout is recorded in
    ``made``."""
    if out is not None and writes_into(conv) and key in made:
        buf = buffer_for(out, made[key], *args[1:])
        if buf is not None:
            return conv(*args, out=buf)
    y = conv(*args)
    made[key] = (y.shape, is_channels_last(y))
    return y


def dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` if it is dense NCHW or channels-last (both are oneDNN inputs), else a copy."""
    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.contiguous()


def with_epilogue(activation: str | None, residual: bool, conv: Conv) -> Conv:
    """``x -> f(conv(x))`` or ``(x, r) -> f(conv(x) + r)`` (in place on the fresh output)."""
    post = POST_OPS[activation]
    if not residual:
        return lambda x: post(conv(x))

    def run(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = conv(x).add_(r)
        return y if activation is None else post(y)

    return run


def _add_into(out: torch.Tensor, *args: object) -> torch.Tensor:
    """oneDNN's convolution adding into ``out`` (``out = f(conv(x) + out)``), in place."""
    return torch.ops.mkldnn._convolution_pointwise_.binary(out, *args)


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is a channels-last 4-D tensor (and not also NCHW-contiguous)."""
    return x.dim() == 4 and not x.is_contiguous() and \
        x.is_contiguous(memory_format=torch.channels_last)


def usable(weight: torch.Tensor) -> bool:
    """Whether a convolution with ``weight`` can run on oneDNN here (a CPU float32 weight,
    :func:`available`)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and available()


def packed_conv2d(weight: torch.Tensor, input_shape: tuple[int, ...],
                  stride: tuple[int, int], padding: tuple[int, int],
                  dilation: tuple[int, int], bias: torch.Tensor | None = None,
                  groups: int = 1, activation: str | None = None,
                  residual: bool = False) -> Conv | None:
    """``x -> f(conv2d(x, weight, bias, stride, padding, dilation, groups))`` for NCHW inputs
    of ``input_shape``, with ``weight`` packed now and ``f`` the ``activation`` (one of
    :data:`POST_OPS`, applied by oneDNN as a post-op, ReLU by torch after it,
    :func:`post_op`; None: identity); with ``residual``,
    ``(x, r) -> f(conv2d(x, ...) + r)`` (oneDNN's binary add post-op). ``None`` where that is
    not possible."""
    if not usable(weight) or activation not in POST_OPS:
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    pad, st, dil = list(padding), list(stride), list(dilation)
    attr, after = post_op(activation)
    unary = None if attr == "none" else attr
    try:
        packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
            w.to_mkldnn(), pad, st, dil, groups, list(input_shape))
        op = torch.ops.mkldnn._convolution_pointwise
        run: Conv
        if residual:
            binary = op.binary

            def run(x: torch.Tensor, r: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
                if out is None:
                    return after(binary(dense(x), dense(r), packed, b, pad, st, dil, groups,
                                        "add", None, unary, [], ""))
                if out is not r:
                    out.copy_(r)
                return after(_add_into(out, dense(x), packed, b, pad, st, dil, groups, "add",
                                       None, unary, [], ""))
        else:
            def run(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
                if out is None:
                    return after(op(dense(x), packed, b, pad, st, dil, groups, attr, [], ""))
                return after(_add_into(out.zero_(), dense(x), packed, b, pad, st, dil, groups,
                                       "add", None, unary, [], ""))

        run.takes_out = True  # type: ignore[attr-defined]
        ref = with_epilogue(activation, residual, lambda x: F.conv2d(x, w, b, st, pad, dil, groups))
        return checked(run, ref, input_shape, residual)
    except (RuntimeError, NotImplementedError) as exc:
        log.info("no packed oneDNN convolution for input %s: %s", list(input_shape), exc)
        return None


def packed_conv_transpose2d(weight: torch.Tensor, input_shape: tuple[int, ...],
                            stride: tuple[int, int], padding: tuple[int, int],
                            output_padding: tuple[int, int], dilation: tuple[int, int],
                            bias: torch.Tensor | None = None, groups: int = 1,
                            activation: str | None = None, residual: bool = False
                            ) -> Conv | None:
    """As :func:`packed_conv2d` for ``conv_transpose2d`` (weight ``[C, F/groups, R, S]``;
    oneDNN has no binary post-op for it here: ``None`` with ``residual``)."""
    if not usable(weight) or activation not in POST_OPS or residual:
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    pad, opad, st, dil = list(padding), list(output_padding), list(stride), list(dilation)
    attr, after = post_op(activation)
    try:
        packed = torch.ops.mkldnn._reorder_convolution_transpose_weight(
            w, pad, opad, st, dil, groups, list(input_shape))
        op = torch.ops.mkldnn._convolution_transpose_pointwise

        def run(x: torch.Tensor) -> torch.Tensor:
            return after(op(dense(x), packed, b, pad, opad, st, dil, groups, attr, [], ""))

        post = POST_OPS[activation]
        return checked(
            run, lambda x: post(F.conv_transpose2d(x, w, b, st, pad, opad, groups, dil)),
            input_shape)
    except (RuntimeError, NotImplementedError) as exc:
        log.info("no packed oneDNN transposed convolution for input %s: %s",
                 list(input_shape), exc)
        return None


__all__ = ["POST_OPS", "Conv", "Made", "available", "buffer_for", "call_into", "checked",
           "dense", "is_channels_last", "packed_conv2d", "packed_conv_transpose2d", "probes",
           "usable", "with_epilogue", "writes_into"]
