"""Operator lowering: one function per operator kind returning its tensor algebra expression.

``lower(kind, inputs, **attrs)`` dispatches through the single table ``LOWERINGS``; the result
is a :class:`Lowered` (expression, constant tensors, output shape). ``OPAQUE_OPS`` lists the
operators kept opaque (no expression).
"""

from ollie.lower.common import Lowered
from ollie.lower.pool import OPAQUE_OPS
from ollie.lower.registry import LOWERINGS, lower

__all__ = ["LOWERINGS", "OPAQUE_OPS", "Lowered", "lower"]
