"""Derivation rules (the paper's Table 2), registered by name in :data:`RULES`."""

from ollie.rules import (  # noqa: F401  (importing registers the rules)
    boundary,
    layout,
    summation_splitting,
    traversal_merging,
    variable_substitution,
)
from ollie.rules.base import INTRA_RULES, RULES, Derived, apply_rule, scope_paths

__all__ = ["INTRA_RULES", "RULES", "Derived", "apply_rule", "scope_paths"]
