"""The hybrid derivation search: explorative BFS, guided derivation, instantiation."""

from ollie.search.candidate import Candidate, Step
from ollie.search.config import TARGETS, SearchConfig
from ollie.search.derive import DeriveResult, derive

__all__ = ["TARGETS", "Candidate", "DeriveResult", "SearchConfig", "Step", "derive"]
