"""Minimal execution of :class:`~ollie.program.kernel.Kernel` objects with PyTorch.

* ``Matmul``: ``torch.matmul`` on ``torch.as_strided`` views of the flattened operands
  (``kernel.views``; the views already encode ``trans_a`` / ``trans_b``), times ``alpha``.
* ``Conv``: ``torch.nn.functional.conv2d`` on the NCHW / FCRS views; asymmetric and negative
  padding (``ph``, ``ph_end``, ``pw``, ``pw_end``) is applied as a zero-filled window of the
  input rows and columns (pad or crop) before an unpadded convolution.
* ``G2BMM`` / ``GBMM``: :func:`ollie.kernels.band.g2bmm` / :func:`~ollie.kernels.band.gbmm`
  (blocked batched matmuls; dilated bands through the internal re-layout), times ``alpha``.
* ``eOp``: ``ollie.interpret(kernel.expr, ...)`` converted to torch.

The result always has ``kernel.output_shape`` (the shape of the kernel's expression).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from ollie.errors import UnsupportedError
from ollie.kernels import band
from ollie.libs.tensors import as_tensor, kernel_input
from ollie.program.kernel import Kernel
from ollie.program.params import (
    ConvParams,
    G2BMMParams,
    GBMMParams,
    KernelKind,
    MatmulParams,
)


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
    a, b = kernel_input(kernel, 0, tensors), kernel_input(kernel, 1, tensors)
    return _alpha(kernel, torch.matmul(a, b))


def _conv(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    p = kernel.params
    assert isinstance(p, ConvParams)
    x, w = kernel_input(kernel, 0, tensors), kernel_input(kernel, 1, tensors)
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
    q, k = kernel_input(kernel, 0, tensors), kernel_input(kernel, 1, tensors)
    w, d = _band(kernel)
    return _alpha(kernel, band.g2bmm(q, k, w, d))


def _gbmm(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    s, v = kernel_input(kernel, 0, tensors), kernel_input(kernel, 1, tensors)
    w, d = _band(kernel)
    return _alpha(kernel, band.gbmm(s, v, w, d))


def _eop(kernel: Kernel, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    from ollie.semantics import interpret

    ins = {n: kernel_input(kernel, i, tensors) for i, n in enumerate(kernel.inputs)}
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
    env = {n: as_tensor(t) for n, t in tensors.items()}
    for k in kernels:
        env[k.output] = run_kernel(k, env)
    return env
