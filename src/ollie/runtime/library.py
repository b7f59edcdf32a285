"""Minimal execution of :class:`~ollie.program.kernel.Kernel` objects with PyTorch.

* ``Matmul``: ``torch.matmul`` on ``torch.as_strided`` views of the flattened operands
  (``kernel.views``; the views already encode ``trans_a`` / ``trans_b``), times ``alpha``.
* ``Conv``: ``torch.nn.functional.conv2d`` on the NCHW / FCRS views; asymmetric and negative
  padding (``ph``, ``ph_end``, ``pw``, ``pw_end``) is applied as a zero-filled window of the
  input rows and columns (pad or crop) before an unpadded convolution.
* ``G2BMM`` / ``GBMM``: :func:`ollie.runtime.band.g2bmm` / :func:`~ollie.runtime.band.gbmm`
  (blocked batched matmuls; dilated bands through the internal re-layout), times ``alpha``.
* ``eOp``: ``ollie.interpret(kernel.expr, ...)`` converted to torch.

The result always has ``kernel.output_shape`` (the shape of the kernel's expression).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from ollie.errors import ShapeError, UnsupportedError
from ollie.program.kernel import Kernel, View
from ollie.program.params import (
    ConvParams,
    G2BMMParams,
    GBMMParams,
    KernelKind,
    MatmulParams,
)
from ollie.runtime import band
from ollie.runtime.onednn import dense


def _as_tensor(x: object) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def _input(kernel: Kernel, i: int, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Input ``i`` of ``kernel``, read through its view when it has one."""
    name = kernel.inputs[i]
    try:
        t = _as_tensor(tensors[name])
    except KeyError:
        raise ShapeError(f"{kernel.kind} kernel -> {kernel.output}: missing input "
                         f"tensor '{name}'") from None
    shape = kernel.expr.inputs.get(name)
    if shape is not None and t.dim() == 0 and tuple(shape) == (1,):
        t = t.reshape(1)  # a graph scalar: expressions read rank-0 tensors as shape [1]
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ShapeError(f"{kernel.kind} kernel -> {kernel.output}: input '{name}' has shape "
                         f"{list(t.shape)}, expected {list(shape)}")
    view = kernel.views[i] if i < len(kernel.views) else None
    if view is None:
        return t
    if _flat_identity(view, t.numel()) and tuple(t.shape) == tuple(view.sizes) and \
            dense(t) is t:
        # the view reads the tensor as it is: keep its memory format (a channels-last
        # convolution output stays channels-last instead of being transposed into NCHW)
        return t
    flat = t.contiguous().reshape(-1)
    # (as_strided's offset counts from the storage's start: a tensor that is itself a view,
    # e.g. one output of a split, starts further in)
    return torch.as_strided(flat, view.sizes, view.strides, flat.storage_offset() + view.offset)


def _flat_identity(view: View, numel: int) -> bool:
    """Whether ``view`` reads every element of a ``numel``-element tensor in its flat order
    (offset 0, row-major strides; a size-1 dimension's stride does not matter)."""
    if view.offset != 0 or math.prod(view.sizes) != numel:
        return False
    expect = 1
    for size, stride in zip(reversed(view.sizes), reversed(view.strides), strict=True):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def window(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """``length`` entries of ``x`` along ``dim`` from ``start``; positions outside are 0."""
    size = x.shape[dim]
    if start == 0 and length == size:
        return x
    lo, hi = max(start, 0), min(start + length, size)

    def zeros(n: int) -> torch.Tensor:
        shape = list(x.shape)
        shape[dim] = n
        return x.new_zeros(shape)

    if hi <= lo:
        return zeros(length)
    parts = [zeros(lo - start), x.narrow(dim, lo, hi - lo), zeros(start + length - hi)]
    parts = [t for t in parts if t.shape[dim] > 0]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _alpha(kernel: Kernel, y: torch.Tensor) -> torch.Tensor:
    p = kernel.params
    alpha = float(p.alpha) if isinstance(p, MatmulParams | ConvParams | G2BMMParams |
                                         GBMMParams) else 1.0
    return y if alpha == 1.0 else y * alpha


def _matmul(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    a, b = _input(kernel, 0, tensors), _input(kernel, 1, tensors)
    return _alpha(kernel, torch.matmul(a, b))


def _conv(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    p = kernel.params
    assert isinstance(p, ConvParams)
    x, w = _input(kernel, 0, tensors), _input(kernel, 1, tensors)
    for dim, pad, pad_end in ((2, p.ph, p.ph_end), (3, p.pw, p.pw_end)):
        start, size = -int(pad), x.shape[dim]
        x = window(x, dim, start, size + int(pad) + int(pad if pad_end is None else pad_end))
    y = F.conv2d(x, w, stride=(int(p.sh), int(p.sw)), dilation=(int(p.dh), int(p.dw)))
    return _alpha(kernel, y)


def _band(kernel: Kernel) -> tuple[int, int]:
    p = kernel.params
    assert isinstance(p, G2BMMParams | GBMMParams)
    return int(p.w), int(p.d)


def _g2bmm(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    q, k = _input(kernel, 0, tensors), _input(kernel, 1, tensors)
    w, d = _band(kernel)
    return _alpha(kernel, band.g2bmm(q, k, w, d))


def _gbmm(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    s, v = _input(kernel, 0, tensors), _input(kernel, 1, tensors)
    w, d = _band(kernel)
    return _alpha(kernel, band.gbmm(s, v, w, d))


def _eop(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    from ollie.semantics import interpret

    ins = {n: _input(kernel, i, tensors) for i, n in enumerate(kernel.inputs)}
    device = next((t.device for t in ins.values()), torch.device("cpu"))
    arrays = {n: t.detach().cpu().numpy() for n, t in ins.items()}
    assert kernel.expr is not None, "an eOperator kernel carries its expression"
    res = np.ascontiguousarray(interpret(kernel.expr, arrays), dtype=np.float32)
    return torch.from_numpy(res).to(device)


RUNNERS: dict[str, Callable[[Kernel, Mapping[str, torch.Tensor]], torch.Tensor]] = {
    KernelKind.MATMUL: _matmul, KernelKind.CONV: _conv, KernelKind.G2BMM: _g2bmm,
    KernelKind.GBMM: _gbmm, KernelKind.EOP: _eop,
}


def run_kernel(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Execute one kernel on named tensors; the result has ``kernel.output_shape``."""
    runner = RUNNERS.get(kernel.kind)
    if runner is None:
        raise UnsupportedError(f"no runtime for kernel kind '{kernel.kind}' "
                               f"(known: {', '.join(RUNNERS)})")
    return runner(kernel, tensors).reshape(kernel.output_shape)


def run_kernels(kernels: Iterable[Kernel], tensors: Mapping[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """Execute kernels in order; returns every tensor (the inputs and each kernel's output)."""
    env = {n: _as_tensor(t) for n, t in tensors.items()}
    for k in kernels:
        env[k.output] = run_kernel(k, env)
    return env
