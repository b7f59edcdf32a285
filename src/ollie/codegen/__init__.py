"""eOperator code generation: compiled kernels computing an expression exactly.

``compile_eop(expr, backend)`` returns a :class:`~ollie.codegen.kernel.CompiledKernel`, called as
``kernel(inputs, out=None) -> np.ndarray``. Backends:

``"cpu"``        numba loop nests (:func:`ollie.codegen.cpu.compile_cpu`), cached on disk;
``"reference"``  the reference interpreter (:func:`ollie.codegen.reference.compile_reference`);
``"cuda"``       Triton kernels (``ollie.codegen.cuda.compile_cuda``, imported lazily; raises
                 :class:`~ollie.errors.UnsupportedError` when unavailable).
"""

from __future__ import annotations

from collections.abc import Sequence

from ollie.codegen.kernel import CompiledKernel
from ollie.codegen.reference import compile_reference
from ollie.errors import UnsupportedError
from ollie.ir import Expr, parse

BACKENDS = ("cpu", "reference", "cuda")


def compile_eop(expr: Expr | str, backend: str = "cpu",
                cuda_configs: Sequence[tuple[int, int]] | None = None) -> CompiledKernel:
    """Compile ``expr`` with ``backend`` (one of :data:`BACKENDS`); ``cuda_configs``: on
    ``"cuda"``, each generated kernel's fixed ``(BLOCK, num_warps)`` instead of autotuning
    (ignored by Triton's interpreter and the other backends, which have no launch
    configuration)."""
    if isinstance(expr, str):
        expr = parse(expr)
    if backend == "cpu":
        from ollie.codegen.cpu import compile_cpu

        return compile_cpu(expr)
    if backend == "reference":
        return compile_reference(expr)
    if backend == "cuda":
        try:
            from ollie.codegen.cuda import compile_cuda
        except ImportError as exc:
            raise UnsupportedError(f"the cuda eOp backend is unavailable: {exc}") from exc
        from ollie.codegen.cuda import interpret_mode

        if cuda_configs is not None and not interpret_mode():
            return compile_cuda(expr, configs=[tuple(c) for c in cuda_configs])
        return compile_cuda(expr)
    raise UnsupportedError(f"unknown eOp backend {backend!r}; expected one of {BACKENDS}")


__all__ = ["BACKENDS", "CompiledKernel", "compile_eop", "compile_reference"]
