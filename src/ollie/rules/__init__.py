"""Derivation rules (the paper's Table 2), registered by name in :data:`RULES`; the
inter-expression rules on expression programs in :data:`PROGRAM_RULES`."""

from ollie.rules import (  # noqa: F401  (importing registers the rules)
    boundary,
    layout,
    summation_splitting,
    traversal_merging,
    variable_substitution,
)
from ollie.rules.base import INTRA_RULES, RULES, Derived, apply_rule, scope_paths
from ollie.rules.inter_program import PROGRAM_RULES, DerivedProgram, normalize_program

__all__ = ["INTRA_RULES", "PROGRAM_RULES", "RULES", "Derived", "DerivedProgram", "apply_rule",
           "normalize_program", "scope_paths"]
