"""Library convolutions on the CPU: weights packed once for oneDNN, and the choice of the
fastest implementation per configuration.

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
random input when it is built; a disagreement also gives ``None``. :func:`best_conv` times
oneDNN-packed, plain torch, ONNX Runtime (:mod:`ollie.runtime.ort_conv`) and, for large enough
convolutions with a Winograd form, a Winograd convolution (:mod:`ollie.runtime.winograd`) once
per configuration with cold caches and keeps the fastest; :func:`node_runner` does this for
graph nodes (the original operators a program keeps) on the first call for each input shape.
Why packed weights and a measured choice: docs/design/003-library-kernels-on-the-cpu.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
Conv = Callable[..., torch.Tensor]
"""A convolution: ``f(x)``, or ``f(x, r)`` for one with a residual input."""


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


POST_OPS: dict[str | None, Conv] = {None: _identity, "relu": torch.relu, "tanh": torch.tanh,
                                    "sigmoid": torch.sigmoid}
"""Activations oneDNN applies as a convolution post-op (``None``: none), with their torch
functions (the reference the packed convolution is checked against)."""


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


def _checked(run: Conv, ref: Conv, input_shape: tuple[int, ...],
             residual: bool = False) -> Conv | None:
    """``run`` if it agrees with ``ref`` on random arguments (:func:`probes`), else None. One
    that takes an ``out`` buffer (:func:`writes_into`) is also checked writing into a
    NaN-filled one and, with a residual, into the residual itself; where that fails it is
    used without buffers."""
    with torch.inference_mode():
        args = probes(input_shape, ref, residual)
        want = ref(*args)
        if not _agrees(run(*args), want):
            log.warning("a library convolution disagrees with torch for input %s; not used",
                        list(input_shape))
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


def _post(activation: str | None, residual: bool, conv: Conv) -> Conv:
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


def _usable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and available()


def packed_conv2d(weight: torch.Tensor, input_shape: tuple[int, ...],
                  stride: tuple[int, int], padding: tuple[int, int],
                  dilation: tuple[int, int], bias: torch.Tensor | None = None,
                  groups: int = 1, activation: str | None = None,
                  residual: bool = False) -> Conv | None:
    """``x -> f(conv2d(x, weight, bias, stride, padding, dilation, groups))`` for NCHW inputs
    of ``input_shape``, with ``weight`` packed now and ``f`` the ``activation`` (one of
    :data:`POST_OPS`, applied by oneDNN as a post-op; None: identity); with ``residual``,
    ``(x, r) -> f(conv2d(x, ...) + r)`` (oneDNN's binary add post-op). ``None`` where that is
    not possible."""
    if not _usable(weight) or activation not in POST_OPS:
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    pad, st, dil = list(padding), list(stride), list(dilation)
    attr = activation or "none"
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
                    return binary(dense(x), dense(r), packed, b, pad, st, dil, groups, "add",
                                  None, activation, [], "")
                if out is not r:
                    out.copy_(r)
                return _add_into(out, dense(x), packed, b, pad, st, dil, groups, "add",
                                 None, activation, [], "")
        else:
            def run(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
                if out is None:
                    return op(dense(x), packed, b, pad, st, dil, groups, attr, [], "")
                return _add_into(out.zero_(), dense(x), packed, b, pad, st, dil, groups,
                                 "add", None, activation, [], "")

        run.takes_out = True  # type: ignore[attr-defined]
        ref = _post(activation, residual, lambda x: F.conv2d(x, w, b, st, pad, dil, groups))
        return _checked(run, ref, input_shape, residual)
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
    if not _usable(weight) or activation not in POST_OPS or residual:
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    pad, opad, st, dil = list(padding), list(output_padding), list(stride), list(dilation)
    attr = activation or "none"
    try:
        packed = torch.ops.mkldnn._reorder_convolution_transpose_weight(
            w, pad, opad, st, dil, groups, list(input_shape))
        op = torch.ops.mkldnn._convolution_transpose_pointwise

        def run(x: torch.Tensor) -> torch.Tensor:
            return op(dense(x), packed, b, pad, opad, st, dil, groups, attr, [], "")

        post = POST_OPS[activation]
        return _checked(
            run, lambda x: post(F.conv_transpose2d(x, w, b, st, pad, opad, groups, dil)),
            input_shape)
    except (RuntimeError, NotImplementedError) as exc:
        log.info("no packed oneDNN transposed convolution for input %s: %s",
                 list(input_shape), exc)
        return None


ANY_OF = " or "
"""Joins implementation names in a ``prefer`` (:func:`fastest_of`): the fastest of them."""

WINOGRAD = "Winograd"
"""The name of the Winograd convolutions (:func:`ollie.runtime.winograd.winograd_conv2d`,
:func:`~ollie.runtime.winograd.winograd_conv_transpose2d`) among the implementations."""

CONV_OPS = ("Conv2d", "ConvTranspose2d")
"""Graph operators :func:`node_runner` runs through :func:`best_conv`."""

WINOGRAD_MIN_FLOPS = 24e6
"""A Winograd candidate (:mod:`ollie.runtime.winograd`) is built, its transforms compiled and
timed, only for convolutions doing at least this many floating-point operations directly
(:func:`direct_flops`): below, its three passes cost more than the multiplications they save,
and compiling a channel block's transforms (seconds) is never paid back. Why this value
(measured): docs/design/004-winograd-convolutions.md."""

_CHOICES: dict[tuple, str] = {}
"""Per convolution configuration: the name of the implementation that measured fastest."""


def fastest(impls: dict[str, Conv | None], input_shape: tuple[int, ...],
            key: tuple | None = None,
            make_args: Callable[[], tuple[torch.Tensor, ...]] | None = None) -> Conv:
    """The fastest of the available ``impls`` (``None``: unavailable) on a random input of
    ``input_shape`` (or on the arguments ``make_args()`` returns, built only when timing is
    needed), timed alternately for a few rounds with cold caches
    (:func:`ollie.tune.measure.evict_caches` before each call: in a program, a convolution's
    weight and input are rarely still cached, and an implementation that re-lays out the
    weight on every call looks faster warm than it runs); the choice is remembered per
    ``key``.
    Packing removes oneDNN's per-call weight reorder, but for some shapes the primitive for the
    packed layout, or another library's kernel, is faster: the choice is measured, like a cuDNN
    benchmark-mode algorithm choice."""
    from ollie.tune.measure import evict_caches, measure_alternating

    usable = {n: f for n, f in impls.items() if f is not None}
    if not usable:
        raise ValueError("no convolution implementation to choose from")
    if len(usable) == 1:
        return next(iter(usable.values()))
    if key is not None and _CHOICES.get(key) in usable:
        return usable[_CHOICES[key]]
    probe = make_args() if make_args is not None else (torch.randn(input_shape),)
    times = measure_alternating({n: (lambda f=f: f(*probe)) for n, f in usable.items()},
                                rounds=7, warmup=1, max_seconds=3.0, prepare=evict_caches)
    name = min(times, key=times.__getitem__)
    log.debug("convolution %s: %s (%s)", list(input_shape), name,
              ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in times.items()))
    if key is not None:
        _CHOICES[key] = name
    return usable[name]


def fastest_of(builders: dict[str, Callable[[], Conv | None]], input_shape: tuple[int, ...],
               key: tuple, make_args: Callable[[], tuple[torch.Tensor, ...]] | None = None,
               prefer: str | None = None) -> Conv:
    """:func:`fastest` over implementations built by ``builders`` (each returns a callable or
    None); once a choice is remembered for ``key`` only the chosen one is built (building an
    implementation packs a weight or creates an ONNX Runtime session). ``prefer``: the name
    of the implementation to use, without measuring, when it can be built (a program-level
    choice, :mod:`ollie.optimizer.libraries`); names joined by :data:`ANY_OF`: the fastest
    of those that can be built, measured."""
    if prefer is not None and ANY_OF in prefer:  # the fastest of these, measured
        subset = {n: builders[n] for n in prefer.split(ANY_OF) if n in builders}
        if subset:
            builders, key, prefer = subset, (*key, prefer), None
    if prefer in builders:
        impl = builders[prefer]()  # type: ignore[index]
        if impl is not None:
            return impl
    chosen = _CHOICES.get(key)
    if chosen in builders:
        impl = builders[chosen]()
        if impl is not None:
            return impl
    return fastest({name: build() for name, build in builders.items()}, input_shape, key,
                   make_args)


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
    Winograd form (:func:`ollie.runtime.winograd.applies`,
    :func:`~ollie.runtime.winograd.applies_transposed`) and does at least
    :data:`WINOGRAD_MIN_FLOPS`."""
    from ollie.runtime import winograd

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
              prefer: str | None = None) -> Conv:
    """``x -> f(op(x, weight, bias, ...))`` (``op``: ``"Conv2d"`` / ``"ConvTranspose2d"``;
    with ``residual``, ``(x, r) -> f(op(x, ...) + r)``) by the fastest of oneDNN with the
    weight packed, plain torch, ONNX Runtime and, where one applies and the convolution does at
    least :data:`WINOGRAD_MIN_FLOPS`, a Winograd convolution
    (:mod:`ollie.runtime.winograd`), measured once per configuration
    (:func:`fastest_of`) on inputs in the memory format they will have (``channels_last``:
    the output of a packed oneDNN convolution is; an implementation that needs NCHW pays for
    the conversion in its time). ``prefer`` names an implementation to use without
    measuring when it is available (:func:`fastest_of`)."""
    from ollie.runtime import winograd
    from ollie.runtime.ort_conv import ort_conv

    def conv(x: torch.Tensor) -> torch.Tensor:
        if op == "Conv2d":
            return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        return F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups,
                                  dilation)

    plain = _post(activation, residual, conv)

    def packed() -> Conv | None:
        if op == "Conv2d":
            return packed_conv2d(weight, input_shape, stride, padding, dilation, bias, groups,
                                 activation, residual)
        return packed_conv_transpose2d(weight, input_shape, stride, padding, output_padding,
                                       dilation, bias, groups, activation, residual)

    key = (op, tuple(weight.shape), input_shape, stride, padding, dilation, groups,
           output_padding, activation, bias is None, residual, channels_last)
    builders: dict[str, Callable[[], Conv | None]] = {
        "oneDNN packed": packed, "torch": lambda: plain,
        "ONNX Runtime": lambda: ort_conv(op, weight, bias, input_shape, stride, padding,
                                         dilation, groups, output_padding, activation,
                                         residual)}
    if offers_winograd(op, tuple(weight.shape), input_shape, stride, padding, dilation, groups):
        builders[WINOGRAD] = (lambda: winograd.winograd_conv2d(
            weight, input_shape, stride, padding, dilation, bias, groups, activation,
            residual)) if op == "Conv2d" else (lambda: winograd.winograd_conv_transpose2d(
                weight, input_shape, stride, padding, output_padding, dilation, bias, groups,
                activation, residual))
    return fastest_of(builders, input_shape, key,
                      lambda: probes(input_shape, plain, residual, channels_last), prefer)


def node_runner(op: str, attrs: dict, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None = None, residual: bool = False,
                prefer: str | None = None) -> Conv | None:
    """For a ``Conv2d`` / ``ConvTranspose2d`` graph node with constant ``weight`` (and
    ``bias``) and symmetric padding: a callable running it (then adding the residual, then
    ``activation``) with the :func:`best_conv` implementation, chosen on the first call for
    each input shape and memory format (``prefer``: see :func:`best_conv`); ``out=``: a
    buffer the result may be written into (:func:`writes_into`; used when the chosen
    implementation can). ``None`` for other nodes."""
    from ollie.graph.execute import _pad4, _pair

    if op not in CONV_OPS or not _usable(weight) or \
            activation not in POST_OPS:
        return None
    top, left, bottom, right = _pad4(attrs.get("padding", 0))
    if (top, left) != (bottom, right):
        return None
    pad = (top, left)
    st, dil = _pair(attrs.get("stride", 1)), _pair(attrs.get("dilation", 1))
    groups = int(attrs.get("groups", 1))
    opad = _pair(attrs.get("output_padding", 0))
    cache: dict[tuple[tuple[int, ...], bool], Conv] = {}
    made: Made = {}

    def run(x: torch.Tensor, *residual_input: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        shape = tuple(x.shape)
        key = (shape, is_channels_last(x))
        fn = cache.get(key)
        if fn is None:
            fn = cache[key] = best_conv(op, weight, bias, shape, st, pad, dil, groups, opad,
                                        activation, residual, key[1], prefer)
        return call_into(fn, (x, *residual_input), out, made, key)

    return run
