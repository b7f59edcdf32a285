"""Float32 precision on CUDA: whether cuDNN / cuBLAS may round products to TensorFloat-32
(10-bit mantissa; PyTorch allows it in cuDNN by default), and a context that turns it off.

On the CPU neither applies: :func:`tf32` is False and :func:`full_fp32` changes nothing that
a CPU kernel reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def tf32(device: str | torch.device) -> bool:
    """Whether library kernels on ``device`` may compute float32 products in TF32."""
    return torch.device(device).type == "cuda" and bool(
        torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


@contextmanager
def full_fp32() -> Iterator[None]:
    """TF32 off in cuDNN and cuBLAS inside the block (restored after it)."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
