"""The choice of a convolution's implementation on the CPU: oneDNN with the weight packed
(:mod:`ollie.libs.onednn`), plain torch, ONNX Runtime (:mod:`ollie.libs.ort_conv`) and, for
large enough convolutions with a Winograd form, a Winograd convolution
(:mod:`ollie.kernels.winograd`; unless the implementation policy leaves it out,
:mod:`ollie.policy`), measured once per configuration with cold caches through a
:class:`ollie.tune.choice.Choices`; :func:`node_runner` does this for graph nodes (the original
operators a program keeps) on the first call for each input shape. It sits above both the
library bindings and the hand-written kernels it compares
(docs/design/018-package-layout.md). Why packed weights and a measured choice:
docs/design/003-library-kernels-on-the-cpu.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ollie.graph.execute import pad4, pair
from ollie.libs import onednn
from ollie.libs.onednn import Conv, Made
from ollie.policy import WINOGRAD, Implementations
from ollie.settings import current
from ollie.tune.choice import ANY_OF, Choices, shared

TORCH = "torch"
"""The name of PyTorch's own implementation (what the framework calls for the original
operator) among the implementations; the baseline a measured choice must beat with confidence
(:meth:`ollie.tune.choice.Choices.fastest`). A ``Node`` kernel whose ``params.library`` is
this runs PyTorch's implementation whatever its operator (:func:`ollie.exec.node.node_fn`)."""

CONV_OPS = ("Conv2d", "ConvTranspose2d")
"""Graph operators :func:`node_runner` runs through :func:`best_conv`."""

WINOGRAD_MIN_FLOPS = 24e6
"""A Winograd candidate (:mod:`ollie.kernels.winograd`) is built, its transforms compiled and
timed, only for convolutions doing at least this many floating-point operations directly
(:func:`direct_flops`): below, its three passes cost more than the multiplications they save,
and compiling a channel block's transforms (seconds) is never paid back. Why this value
(measured): docs/design/004-winograd-convolutions.md."""


def direct_flops(op: str, weight_shape: tuple[int, ...], input_shape: tuple[int, ...],
                 stride: tuple[int, int], padding: tuple[int, int],
                 dilation: tuple[int, int]) -> float:
    """Multiply-adds times two of a direct ``op`` (``"Conv2d"``: weight ``[K, C/g, r, s]``,
    ``2 * N * numel(weight) * OH * OW``; ``"ConvTranspose2d"``: weight ``[C, K/g, r, s]``,
    ``2 * N * numel(weight) * H * W``, the input's positions)."""
    taps = math.prod(weight_shape)
    if op == "ConvTranspose2d":
        return 2.0 * input_shape[0] * taps * input_shape[2] * input_shape[3]
    out = [(input_shape[2 + i] + 2 * padding[i] - dilation[i] * (weight_shape[2 + i] - 1) - 1)
           // stride[i] + 1 for i in range(2)]
    return 2.0 * input_shape[0] * taps * max(out[0], 0) * max(out[1], 0)


def offers_winograd(op: str, weight_shape: tuple[int, ...], input_shape: tuple[int, ...],
                    stride: tuple[int, int], padding: tuple[int, int],
                    dilation: tuple[int, int], groups: int = 1) -> bool:
    """Whether :func:`best_conv` builds a Winograd candidate for this convolution: it has a
    Winograd form (:func:`ollie.kernels.winograd.applies`,
    :func:`~ollie.kernels.winograd.applies_transposed`) and does at least
    :data:`WINOGRAD_MIN_FLOPS`."""
    from ollie.kernels import winograd

    if direct_flops(op, weight_shape, input_shape, stride, padding,
                    dilation) < WINOGRAD_MIN_FLOPS:
        return False
    if op == "Conv2d":
        return winograd.applies(weight_shape, stride, groups)
    return op == "ConvTranspose2d" and winograd.applies_transposed(
        weight_shape, stride, padding, dilation, groups)


def best_conv(op: str, weight: torch.Tensor, bias: torch.Tensor | None,
              input_shape: tuple[int, ...], stride: tuple[int, int], padding: tuple[int, int],
              dilation: tuple[int, int], groups: int = 1,
              output_padding: tuple[int, int] = (0, 0), activation: str | None = None,
              residual: bool = False, channels_last: bool = False,
              prefer: str | None = None, choices: Choices | None = None,
              impls: Implementations | None = None) -> Conv:
    """``x -> f(op(x, weight, bias, ...))`` (``op``: ``"Conv2d"`` / ``"ConvTranspose2d"``;
    with ``residual``, ``(x, r) -> f(op(x, ...) + r)``) by the fastest of oneDNN with the
    weight packed, plain torch, ONNX Runtime and, where one applies and the convolution does at
    least :data:`WINOGRAD_MIN_FLOPS`, a Winograd convolution
    (:mod:`ollie.kernels.winograd`), measured once per configuration
    (:meth:`~ollie.tune.choice.Choices.fastest_of`) on inputs in the memory format they will
    have (``channels_last``: the output of a packed oneDNN convolution is; an implementation
    that needs NCHW pays for the conversion in its time). ``prefer`` names an implementation
    to use without measuring when it is available (:meth:`ollie.tune.choice.Choices.fastest_of`);
    another implementation replaces plain torch (:data:`TORCH`, what the framework calls) only
    when measured faster with confidence (:meth:`ollie.tune.choice.Choices.fastest`);
    ``choices``: the choice table to ask (default :func:`ollie.tune.choice.shared`);
    ``impls``: the implementations allowed (default the settings'; without
    :data:`~ollie.policy.WINOGRAD` no Winograd candidate), part of the choice's key."""
    from ollie.kernels import winograd
    from ollie.libs import ort_conv


    def conv(x: torch.Tensor) -> torch.Tensor:
        if op == "Conv2d":
            return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        return F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups,
                                  dilation)

    plain = onednn.with_epilogue(activation, residual, conv)

    def packed() -> Conv | None:
        if op == "Conv2d":
            return onednn.packed_conv2d(weight, input_shape, stride, padding, dilation, bias,
                                        groups, activation, residual)
        return onednn.packed_conv_transpose2d(weight, input_shape, stride, padding,
                                              output_padding, dilation, bias, groups, activation,
                                              residual)

    key = (op, tuple(weight.shape), input_shape, stride, padding, dilation, groups,
           output_padding, activation, bias is None, residual, channels_last)
    impls = impls or current().implementations
    key = (*key, impls.key) if impls.key else key
    builders: dict[str, Callable[[], Conv | None]] = {
        "oneDNN packed": packed, TORCH: lambda: plain,
        "ONNX Runtime": lambda: ort_conv.ort_conv(op, weight, bias, input_shape, stride,
                                                  padding, dilation, groups, output_padding,
                                                  activation, residual)}
    if impls.allows(WINOGRAD) and offers_winograd(op, tuple(weight.shape), input_shape,
                                                   stride, padding, dilation, groups):
        builders[WINOGRAD] = (lambda: winograd.winograd_conv2d(
            weight, input_shape, stride, padding, dilation, bias, groups, activation,
            residual)) if op == "Conv2d" else (lambda: winograd.winograd_conv_transpose2d(
                weight, input_shape, stride, padding, output_padding, dilation, bias, groups,
                activation, residual))
    return (choices if choices is not None else shared()).fastest_of(
        builders, input_shape, key,
        lambda: onednn.probes(input_shape, plain, residual, channels_last), prefer, TORCH)


def node_runner(op: str, attrs: dict, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None = None, residual: bool = False,
                prefer: str | None = None, choices: Choices | None = None,
                impls: Implementations | None = None) -> Conv | None:
    """For a ``Conv2d`` / ``ConvTranspose2d`` graph node with constant ``weight`` (and
    ``bias``) and symmetric padding: a callable running it (then adding the residual, then
    ``activation``) with the :func:`best_conv` implementation, chosen on the first call for
    each input shape and memory format (``prefer``: see :func:`best_conv`); ``out=``: a
    buffer the result may be written into (:func:`writes_into`; used when the chosen
    implementation can). ``impls``: see :func:`best_conv`. ``None`` for other nodes."""
    if op not in CONV_OPS or not onednn.usable(weight) or \
            activation not in onednn.POST_OPS:
        return None
    top, left, bottom, right = pad4(attrs.get("padding", 0))
    if (top, left) != (bottom, right):
        return None
    pad = (top, left)
    st, dil = pair(attrs.get("stride", 1)), pair(attrs.get("dilation", 1))
    groups = int(attrs.get("groups", 1))
    opad = pair(attrs.get("output_padding", 0))
    cache: dict[tuple[tuple[int, ...], bool], Conv] = {}
    made: Made = {}

    def run(x: torch.Tensor, *residual_input: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        shape = tuple(x.shape)
        key = (shape, onednn.is_channels_last(x))
        fn = cache.get(key)
        if fn is None:
            fn = cache[key] = best_conv(op, weight, bias, shape, st, pad, dil, groups, opad,
                                        activation, residual, key[1], prefer, choices, impls)
        return onednn.call_into(fn, (x, *residual_input), out, made, key)

    return run


__all__ = ["ANY_OF", "CONV_OPS", "TORCH", "WINOGRAD", "WINOGRAD_MIN_FLOPS", "best_conv",
           "direct_flops", "node_runner", "offers_winograd"]
