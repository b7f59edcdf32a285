"""Convolutions with weights packed once (oneDNN, CPU): the library Conv kernel's fast path.

PyTorch eager's ``conv2d`` on the CPU re-lays out the weight into oneDNN's blocked format on
every call; for a program whose weights are constants (inference) the re-layout can be done
once, when the program is compiled, as torch.compile's weight freezing and ONNX Runtime do. The
packed weight is then used by ``torch.ops.mkldnn._convolution_pointwise`` (the same oneDNN
primitive, without the per-call reorder).

:func:`packed_conv2d` returns a callable, or ``None`` when the path is unavailable (no oneDNN
in this torch build, not a CPU tensor, an input size the primitive rejects), in which case the
caller keeps ``torch.nn.functional.conv2d``. Every packed convolution is checked once against
``conv2d`` on a random input when it is built; a disagreement also gives ``None``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
Conv = Callable[[torch.Tensor], torch.Tensor]


def available() -> bool:
    """Whether this torch build has the oneDNN packed convolution."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
            and hasattr(torch._C._nn, "mkldnn_reorder_conv2d_weight"))


def packed_conv2d(weight: torch.Tensor, input_shape: tuple[int, ...],
                  stride: tuple[int, int], padding: tuple[int, int],
                  dilation: tuple[int, int], bias: torch.Tensor | None = None) -> Conv | None:
    """``x -> conv2d(x, weight, bias, stride, padding, dilation)`` for NCHW inputs of
    ``input_shape``, with ``weight`` packed now; ``None`` where that is not possible."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not available():
        return None
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    pad, st, dil = list(padding), list(stride), list(dilation)
    try:
        packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
            w.to_mkldnn(), pad, st, dil, 1, list(input_shape))
        op = torch.ops.mkldnn._convolution_pointwise

        def run(x: torch.Tensor) -> torch.Tensor:
            return op(x.contiguous(), packed, b, pad, st, dil, 1, "none", [], "")

        with torch.inference_mode():
            probe = torch.randn(input_shape)
            want = F.conv2d(probe, w, b, stride=st, padding=pad, dilation=dil)
            got = run(probe)
        scale = float(want.abs().max()) + 1e-6
        if got.shape != want.shape or float((got - want).abs().max()) > 1e-3 * scale:
            log.warning("packed oneDNN convolution disagrees with conv2d for input %s; "
                        "using conv2d", list(input_shape))
            return None
    except (RuntimeError, NotImplementedError) as exc:
        log.info("no packed oneDNN convolution for input %s: %s", list(input_shape), exc)
        return None
    return run
