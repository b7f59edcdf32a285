"""Search configuration: a frozen :class:`SearchConfig` passed explicitly (never global)."""

from __future__ import annotations

from dataclasses import dataclass

from ollie.rules.base import INTRA_RULES

TARGETS = ("Matmul", "Conv", "G2BMM", "GBMM")


@dataclass(frozen=True)
class SearchConfig:
    """Budgets and switches of the hybrid derivation search.

    ``max_depth``: explorative derivation steps (guided steps do not count);
    ``time_budget``: seconds (the search stops within a few percent of it);
    ``max_states``: expanded states; ``fingerprint_pruning`` / ``guided``: ablation switches;
    ``guided_depth``: guided steps allowed per scope; ``keep``: completions kept per scope;
    ``verify_samples``: output positions compared per candidate (all when the output is
    smaller); ``rtol`` / ``atol``: verification tolerances; ``max_candidates``: reported.
    """

    max_depth: int = 7
    time_budget: float = 60.0
    max_states: int = 200_000
    fingerprint_pruning: bool = True
    guided: bool = True
    targets: tuple[str, ...] = TARGETS
    rules: tuple[str, ...] = INTRA_RULES
    guided_depth: int = 6
    keep: int = 3
    verify_samples: int = 512
    rtol: float = 1e-3
    atol: float = 1e-4
    max_candidates: int = 32
    seed: int = 0
    stop_when_found: tuple[str, ...] = ()
