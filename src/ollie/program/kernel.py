"""Kernels: one library operator call (Matmul, Conv, G2BMM, GBMM) or one eOperator.

A :class:`Kernel` names the tensors it reads and the tensor it writes, carries the parameters
of API.md (``params``) and, always, the exact expression it computes (``expr``), whose declared
inputs are the kernel's input tensors. ``expr`` is the oracle: whatever backend executes the
kernel must agree with ``ollie.interpret(kernel.expr, ...)``.

A ``Node`` kernel runs one graph operator that Ollie does not rewrite (max pooling, softmax,
an operator kept opaque, or an original operator that measured faster than every candidate)
with the reference executor of :mod:`ollie.graph`; it has no expression, only a ``shape``.

A library kernel may read an operand through a :class:`View` (offset and strides into the
operand's flat storage, as BLAS and ``torch.as_strided`` take them) instead of a copy.

``kind`` is a :class:`~ollie.program.params.KernelKind` and ``params`` the kind's typed
parameter object (:mod:`ollie.program.params`), itself a read-only mapping. A kernel built
from a string kind and a plain mapping of parameters gets both converted (an unknown kind
raises :class:`~ollie.errors.UnsupportedError`, parameters missing for the kind
:class:`~ollie.program.params.ParamsError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import SupportsIndex, SupportsInt

from ollie.errors import UnsupportedError
from ollie.ir import Expr
from ollie.program.params import PARAMS, KernelKind, KernelParams, NodeParams, make_params

KINDS = tuple(k.value for k in KernelKind)


def as_int(value: object) -> int:
    """``int(value)`` for a value of a kernel's ``params`` (typed ``object``): a Python or
    numpy integer, or what else ``int`` converts; raises the ``TypeError`` (a value ``int``
    does not take) or ``ValueError`` (a string that is no number) that ``int`` raises."""
    if isinstance(value, int | str | bytes | bytearray):  # (the common case, checked fast)
        return int(value)
    if isinstance(value, SupportsInt | SupportsIndex):  # numpy integers, floats, ...
        return int(value)
    raise TypeError("int() argument must be a string, a bytes-like object or a real number, "
                    f"not '{type(value).__name__}'")


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

    kind: KernelKind
    params: KernelParams
    inputs: tuple[str, ...]
    output: str
    expr: Expr | None
    views: tuple[View | None, ...] = field(default=())
    shape: tuple[int, ...] | None = None  # for kernels without an expression ("Node")

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UnsupportedError(f"unknown kernel kind '{self.kind}' "
                                   f"(known: {', '.join(KINDS)})")
        kind = KernelKind(self.kind)
        object.__setattr__(self, "kind", kind)
        params: Mapping[str, object] = self.params
        if type(params) is not PARAMS[kind]:
            object.__setattr__(self, "params", make_params(kind, params))

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every tensor the kernel defines: ``output``, then a multi-output graph node's other
        outputs (a ``Node`` kernel of, e.g., a split)."""
        p = self.params
        node = p.node if isinstance(p, NodeParams) else None
        return (self.output, *getattr(node, "outputs", ())[1:])

    @property
    def output_shape(self) -> tuple[int, ...]:
        if self.expr is None:
            assert self.shape is not None
            return self.shape
        return self.expr.shape

    def without_activation(self) -> Kernel:
        """The kernel without its fused ``activation`` parameter (and, for kernels with an
        expression ``f(inner)``, computing ``inner``)."""
        if self.params.activation is None:
            return self
        params = replace(self.params, activation=None)
        expr = self.expr
        if expr is not None:
            from ollie.ir import Call, Scope

            body = expr.root.body
            assert isinstance(body, Call), "a fused activation is the expression's root call"
            expr = Expr(expr.decls, Scope(expr.root.traversal, expr.root.summation,
                                          body.args[0]))
        return Kernel(self.kind, params, self.inputs, self.output, expr, self.views,
                      self.shape)

    def to_json(self) -> dict:
        """The kernel as API.md's JSON: kind and params (eOp params hold the expression text)."""
        return {"kind": self.kind.value, "params": dict(self.params)}
