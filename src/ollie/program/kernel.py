"""Kernels: one library operator call (Matmul, Conv, G2BMM, GBMM) or one eOperator.

A :class:`Kernel` names the tensors it reads and the tensor it writes, carries the parameters
of API.md (``params``) and, always, the exact expression it computes (``expr``), whose declared
inputs are the kernel's input tensors. ``expr`` is the oracle: whatever backend executes the
kernel must agree with ``ollie.interpret(kernel.expr, ...)``.

A library kernel may read an operand through a :class:`View` (offset and strides into the
operand's flat storage, as BLAS and ``torch.as_strided`` take them) instead of a copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ollie.ir import Expr

KINDS = ("Matmul", "Conv", "G2BMM", "GBMM", "eOp")


@dataclass(frozen=True, slots=True)
class View:
    """A strided view of a tensor's flat storage: element ``i`` (a multi-index over ``sizes``)
    is ``flat[offset + sum(i[d] * strides[d])]``. Strides may be 0 (broadcast)."""

    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Kernel:
    """One step of a candidate program."""

    kind: str
    params: Mapping[str, object]
    inputs: tuple[str, ...]
    output: str
    expr: Expr
    views: tuple[View | None, ...] = field(default=())

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.expr.shape

    def to_json(self) -> dict:
        """The kernel as API.md's JSON: kind and params (eOp params hold the expression text)."""
        return {"kind": self.kind, "params": dict(self.params)}
