"""The calling convention shared by every eOperator backend: :class:`CompiledKernel`.

A compiled kernel is called as ``kernel(inputs, out=None)``: ``inputs`` maps declared tensor
names to arrays (numpy arrays, or CPU torch tensors; converted to float32 C-contiguous when they
are not already), ``out`` is an optional float32 C-contiguous array of the expression's shape
that receives the result. The result array is returned (``out`` itself when given).
Only the tensors the expression reads are required; a missing one or one whose shape differs
from its declaration raises :class:`~ollie.errors.ShapeError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ollie.errors import ShapeError
from ollie.ir import Expr, tensor_names


def as_float32(value: Any) -> np.ndarray:
    """``value`` as a float32 C-contiguous, writeable-or-not numpy array (no copy if it is)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        value = value.detach().cpu()
        if str(value.dtype) != "torch.float32":
            value = value.float()
        value = value.numpy()
    return np.ascontiguousarray(value, dtype=np.float32)


class CompiledKernel:
    """A callable computing ``expr``; subclasses implement :meth:`_run` on checked arrays."""

    backend = "abstract"

    def __init__(self, expr: Expr) -> None:
        self.expr = expr
        self.shape = tuple(expr.shape)
        declared = expr.inputs
        self.input_names = tuple(sorted(tensor_names(expr.root)))
        self.input_shapes = tuple(tuple(declared[n]) for n in self.input_names)

    def __call__(self, inputs: Mapping[str, Any], out: np.ndarray | None = None) -> np.ndarray:
        arrays = self.check_inputs(inputs)
        out = self.check_out(out)
        self._run(arrays, out)
        return out

    def check_inputs(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """The read tensors, in :attr:`input_names` order, as float32 C-contiguous arrays."""
        arrays = []
        for name, shape in zip(self.input_names, self.input_shapes, strict=True):
            if name not in inputs:
                raise ShapeError(f"missing input tensor '{name}' (declared shape {list(shape)})"
                                 f" for eOp {self._describe()}")
            arr = as_float32(inputs[name])
            if arr.shape != shape:
                raise ShapeError(f"input tensor '{name}' has shape {list(arr.shape)}, expected "
                                 f"{list(shape)} for eOp {self._describe()}")
            arrays.append(arr)
        return arrays

    def check_out(self, out: np.ndarray | None) -> np.ndarray:
        """``out`` checked (float32, C-contiguous, right shape), or a new array."""
        if out is None:
            return np.empty(self.shape, dtype=np.float32)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ShapeError("'out' must be a writeable float32 C-contiguous numpy array")
        if out.shape != self.shape:
            raise ShapeError(f"'out' has shape {list(out.shape)}, expected {list(self.shape)}")
        return out

    def _run(self, arrays: list[np.ndarray], out: np.ndarray) -> None:
        raise NotImplementedError

    def _describe(self) -> str:
        text = str(self.expr).replace("\n", " ")
        return text if len(text) < 100 else text[:97] + "..."

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={list(self.shape)}, inputs={list(self.input_names)})"
