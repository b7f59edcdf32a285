"""Candidate programs: kernels (library operators and eOperators) and their composition."""

from ollie.program.kernel import Kernel, View

__all__ = ["Kernel", "View"]
