"""``Node`` kernels: one graph operator run as it is (:func:`node_fn`), for
:func:`ollie.exec.dispatch.compile_kernel`. A convolution or matrix product with constant
weights runs through the fastest library implementation, NCHW max pooling on the CPU through
:mod:`ollie.kernels.pool`, softmax and max pooling into a given output buffer
(:func:`writes_out`); anything else through the graph's reference executor. Where the
implementation policy (:mod:`ollie.policy`) leaves Ollie's kernels out, max pooling runs on
PyTorch and G2BMM / GBMM operators as windowed ``torch.matmul`` products
(:mod:`ollie.libs.torch_band`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from ollie.errors import ShapeError
from ollie.exec import linear
from ollie.exec.conv import TORCH
from ollie.libs.onednn import POST_OPS
from ollie.policy import BAND, POOL, Implementations
from ollie.program import params as kp
from ollie.program.kernel import Kernel
from ollie.settings import current

if TYPE_CHECKING:
    from ollie.graph.ir import Node

Env = dict[str, torch.Tensor]
"""The tensors of a running program, by name."""
KernelFn = Callable[[Env, "torch.Tensor | None"], torch.Tensor]
"""A compiled kernel: ``fn(env, out) -> tensor`` (``out``: a buffer it may write into)."""


def node_fn(k: Kernel, constants: Mapping[str, torch.Tensor] | None = None,
            prefer: str | None = None, impls: Implementations | None = None) -> KernelFn:
    """A graph operator run as it is; a convolution whose weight (and bias) are constants of
    the program runs through the fastest library implementation
    (:func:`ollie.exec.conv.node_runner`), a MatMul / Gemm with a constant weight through
    the fastest matrix product (:func:`ollie.exec.linear.node_runner`), and NCHW max
    pooling on the CPU through :mod:`ollie.kernels.pool`. A ``residual`` convolution
    (post-processing folded a following residual addition into it) reads the residual as its
    last input and adds it before its ``activation``. ``prefer``: the convolution library a
    decision names (:func:`ollie.exec.dispatch.library_of`); ``prefer`` :data:`ollie.exec.conv.
    TORCH`: PyTorch's implementation (a convolution: plain ``conv2d``; anything else: the graph's
    reference executor). ``impls``: the implementations allowed (:mod:`ollie.policy`; default
    the settings')."""
    from ollie.graph import run_node

    impls = impls or current().implementations

    p = k.params
    assert isinstance(p, kp.NodeParams)
    node = p.node
    extra = list(node.outputs[1:])
    residual = bool(p.residual)
    ins = list(k.inputs[:-1] if residual else k.inputs)
    skip = k.inputs[-1] if residual else None
    act = p.activation
    post = POST_OPS[str(act)] if act else None
    if constants is not None and len(ins) in (2, 3) and not extra and \
            all(n in constants for n in ins[1:]) and ins[0] not in constants:
        from ollie.exec.conv import node_runner as conv_node_runner

        fast = conv_node_runner(node.op, dict(node.attrs),
                                constants[ins[1]],
                                constants[ins[2]] if len(ins) == 3 else None,
                                activation=str(act) if act else None, residual=residual,
                                prefer=prefer, impls=impls)
        conv = fast is not None
        if fast is None and prefer != TORCH:
            fast = linear.node_runner(node.op, dict(node.attrs),
                                      constants[ins[1]],
                                      constants[ins[2]] if len(ins) == 3 else None,
                                      activation=str(act) if act else None,
                                      residual=residual, impls=impls)
        if conv:   # the convolution writes into the buffer it is given, if any
            if skip is not None:
                return lambda env, out: fast(env[ins[0]], env[skip], out=out)
            return lambda env, out: fast(env[ins[0]], out=out)
        if fast is not None:
            if skip is not None:
                return lambda env, out: fast(env[ins[0]], env[skip])
            return lambda env, out: fast(env[ins[0]])
    if node.op == "MaxPool2d" and not residual and not act and not extra and \
            impls.allows(POOL):
        return _max_pool_fn(k, node)
    if node.op in BAND_OPS and not impls.allows(BAND) and not extra:
        return _vendor_band_fn(node, ins, skip, post)
    if node.op == "Softmax" and not residual and not act and not extra:
        return _softmax_fn(node)

    declared = [tuple(s) for s in dict(node.attrs).get("output_shapes") or ()]
    declared = declared[1:] if len(declared) == 1 + len(extra) else [None] * len(extra)

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        outs = run_node(node, [env[n] for n in ins])
        for name, t, want in zip(extra, outs[1:], declared, strict=True):
            if want is not None and tuple(t.shape) != want:  # later kernels trust it
                raise ShapeError(f"operator '{node.name}' output '{name}' has shape "
                                 f"{list(t.shape)}, declared {list(want)}")
            env[name] = t
        y = outs[0]
        if skip is not None:
            y = y + env[skip]
        return y if post is None else post(y)

    return run


BAND_OPS = ("G2BMM", "GBMM")
"""Graph operators of the band products."""


def _vendor_band_fn(node: Node, ins: list[str], skip: str | None,
                    post: Callable[[torch.Tensor], torch.Tensor] | None) -> KernelFn:
    """A G2BMM / GBMM operator (``width``, ``dilation``) on :mod:`ollie.libs.torch_band`."""
    from ollie.libs import torch_band

    a = dict(node.attrs)
    w, d = int(a["width"]), int(a.get("dilation", 1))
    op = torch_band.g2bmm if node.op == "G2BMM" else torch_band.gbmm

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        y = op(env[ins[0]], env[ins[1]], w, d)
        if skip is not None:
            y = y + env[skip]
        return y if post is None else post(y)

    return run


OUT_NODE_OPS = ("MaxPool2d", "Softmax")
"""Graph operators that, run as they are, can write into a given output buffer."""


def writes_out(k: Kernel) -> bool:
    """Node kernels that can write into a given output buffer (max pooling of NCHW tensors,
    softmax). A large tensor written into a reused buffer saves its first-touch page faults
    (docs/design/003-library-kernels-on-the-cpu.md)."""
    p = k.params
    return isinstance(p, kp.NodeParams) and p.op in OUT_NODE_OPS and \
        len(getattr(p.node, "outputs", ())) == 1 and not p.activation and not p.residual


def _softmax_fn(node: Node) -> KernelFn:
    """Softmax into ``out`` when one of the right shape is given, else a fresh tensor."""
    from ollie.graph import run_node

    dim = int(dict(node.attrs).get("axis", -1))
    name = node.inputs[0]

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        x = env[name]
        if out is not None and out.shape == x.shape and out.dtype == x.dtype and \
                out.device == x.device:
            return torch.softmax(x, dim, out=out)
        return run_node(node, [x])[0]

    return run


def _max_pool_fn(k: Kernel, node: Node) -> KernelFn:
    """NCHW-contiguous CPU inputs through :func:`ollie.kernels.pool.max_pool_runner`, others
    (channels-last: PyTorch is fast there) through the graph executor."""
    from ollie.graph import run_node
    from ollie.graph.execute import pad4, pair
    from ollie.kernels.pool import max_pool_runner

    a = dict(node.attrs)
    kernel = pair(a["kernel_size"])
    stride = kernel if a.get("stride") is None else pair(a["stride"])
    pads, dil = pad4(a.get("padding", 0)), pair(a.get("dilation", 1))
    ceil_mode = bool(a.get("ceil_mode", False))
    runners: dict[tuple[int, ...], Callable | None] = {}
    name = k.inputs[0]

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        x = env[name]
        y = None
        if x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous():
            shape = tuple(x.shape)
            if shape not in runners:
                runners[shape] = max_pool_runner(shape, kernel, stride, pads, dil, ceil_mode)
            fast = runners[shape]
            y = fast(x, out) if fast is not None else None
        return y if y is not None else run_node(node, [x])[0]

    return run
