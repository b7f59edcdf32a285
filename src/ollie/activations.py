"""The one table of element-wise functions that kernels fuse or emit: per function, its name
in expressions and in a kernel's ``activation`` parameter, its ONNX operator, its torch
functions, whether it is a oneDNN post-op, and whether ``f(0) = 0``.

:data:`FUNCTIONS` holds every unary function the ONNX Runtime regions emit;
:data:`ACTIVATIONS` the ones a library kernel applies to its output (oneDNN post-ops under
the same name; ONNX Runtime's fused activations; the epilogues of generated eOperators and
matrix products). Consumers derive their views of it: :data:`ollie.libs.onednn.POST_OPS`,
:data:`ollie.exec.linear.ACTIVATIONS`, :data:`ollie.backends.onnxrt.build.ACT`,
:data:`ollie.passes.postprocess.ACTIVATIONS`. It imports nothing of Ollie (and torch only
when a torch function is asked for), so every package may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Function:
    """One element-wise unary function."""

    name: str
    """Its name in expressions (``relu(x)``) and as a kernel's ``activation`` parameter."""
    onnx: str
    """The ONNX operator computing it."""
    torch_name: str
    """The torch function computing it: ``torch.<torch_name>``; in place ``torch.<name>_``."""
    post_op: bool
    """Whether it is an activation: a oneDNN convolution / matmul post-op of this name, and a
    fused activation of library kernels."""
    zero_at_zero: bool
    """Whether ``f(0) = 0`` (``f`` of a read outside its tensor is 0)."""

    @property
    def torch(self) -> Callable[[Any], Any]:
        """``torch.<torch_name>``."""
        import torch

        return getattr(torch, self.torch_name)

    @property
    def torch_inplace(self) -> Callable[[Any], Any]:
        """``torch.<torch_name>_``, in place on its argument."""
        import torch

        return getattr(torch, self.torch_name + "_")


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function("relu", "Relu", "relu", post_op=True, zero_at_zero=True),
    Function("tanh", "Tanh", "tanh", post_op=True, zero_at_zero=True),
    Function("sigmoid", "Sigmoid", "sigmoid", post_op=True, zero_at_zero=False),
    Function("exp", "Exp", "exp", post_op=False, zero_at_zero=False),
    Function("log", "Log", "log", post_op=False, zero_at_zero=False),
    Function("sqrt", "Sqrt", "sqrt", post_op=False, zero_at_zero=True),
    Function("abs", "Abs", "abs", post_op=False, zero_at_zero=True),
)}
"""Every element-wise unary function kernels fuse or emit, by name."""

ACTIVATIONS: dict[str, Function] = {n: f for n, f in FUNCTIONS.items() if f.post_op}
"""The activations (``relu``, ``tanh``, ``sigmoid``): functions a library kernel applies to its
output, by name."""


def identity(x: Any) -> Any:
    """``x`` itself: no activation."""
    return x


__all__ = ["ACTIVATIONS", "FUNCTIONS", "Function", "identity"]
