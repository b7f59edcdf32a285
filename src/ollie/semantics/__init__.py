"""The reference interpreter: the one definition of what an expression means.

:func:`interpret` evaluates an expression (fully, or at sampled output positions with ``at=``),
:func:`interpret_program` an expression program (several named outputs);
:mod:`ollie.semantics.check` holds the helpers that compare two expressions on random inputs.
"""

from ollie.semantics.check import (
    Comparison,
    assert_equivalent,
    compare,
    random_inputs,
    sample_positions,
)
from ollie.semantics.interpreter import interpret
from ollie.semantics.program import interpret_program

__all__ = [
    "Comparison", "assert_equivalent", "compare", "interpret", "interpret_program",
    "random_inputs", "sample_positions",
]
