"""Executing kernels: library operators through PyTorch, eOperators through the interpreter."""

from ollie.runtime.library import run_kernel, run_kernels

__all__ = ["run_kernel", "run_kernels"]
