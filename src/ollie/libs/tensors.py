"""Tensors as kernels read them: a kernel's input read through its program view
(:func:`kernel_input`: a strided view of the flattened tensor, or the tensor itself where the
view reads it as it is), the test for such an identity view (:func:`flat_identity`), and
float32 conversion (:func:`as_tensor`). Shared by the reference executor
(:mod:`ollie.exec.reference`), the dispatch of library kernels (:mod:`ollie.exec.dispatch`)
and the ONNX Runtime regions (:mod:`ollie.backends.onnxrt`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from ollie.errors import ShapeError
from ollie.libs.onednn import dense
from ollie.program.kernel import Kernel, View


def as_tensor(x: object) -> torch.Tensor:
    """``x`` (a tensor, array or nested sequence) as a float32 tensor."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def kernel_input(kernel: Kernel, i: int, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Input ``i`` of ``kernel``, read through its view when it has one."""
    name = kernel.inputs[i]
    try:
        t = as_tensor(tensors[name])
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
    if flat_identity(view, t.numel()) and tuple(t.shape) == tuple(view.sizes) and \
            dense(t) is t:
        # the view reads the tensor as it is: keep its memory format (a channels-last
        # convolution output stays channels-last instead of being transposed into NCHW)
        return t
    flat = t.contiguous().reshape(-1)
    # (as_strided's offset counts from the storage's start: a tensor that is itself a view,
    # e.g. one output of a split, starts further in)
    return torch.as_strided(flat, view.sizes, view.strides, flat.storage_offset() + view.offset)


def flat_identity(view: View, numel: int) -> bool:
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


__all__ = ["as_tensor", "flat_identity", "kernel_input"]
