"""Stage planning for CUDA eOperators: which nested scopes get their own kernel.

An expression becomes a list of :class:`Stage` s, launched in order: every nested scope that is
not inlined (see :func:`should_inline`) is materialised by its own kernel into a temporary
buffer (``%t0``, ``%t1``, ...), innermost first; the root scope is the last stage and writes
the output (:data:`OUT`). Each stage carries its kernel text from
:class:`~ollie.codegen.cuda_emit.KernelWriter`, with a ``triton.autotune`` decorator over
:data:`AUTOTUNE_CONFIGS` when autotuning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ollie.codegen.cuda_emit import KernelWriter
from ollie.ir.nodes import Node, Scope, accesses

OUT = "%out"
"""Buffer key of the expression's output."""

AUTOTUNE_CONFIGS = ((128, 2), (128, 4), (256, 4), (512, 4), (512, 8), (1024, 4), (1024, 8))
"""``(BLOCK, num_warps)`` pairs tried on a GPU."""


def autotune_configs(numel: int) -> list[tuple[int, int]]:
    """The :data:`AUTOTUNE_CONFIGS` worth trying for ``numel`` outputs (no block much larger
    than the output)."""
    cap = max(128, 1 << max(numel - 1, 0).bit_length())
    return [(b, w) for b, w in AUTOTUNE_CONFIGS if b <= cap]


@dataclass(frozen=True)
class Stage:
    """One generated kernel ``name``: computes ``scope`` into buffer ``output``, reading the
    buffers ``args`` (input names or temporaries) as its pointer parameters."""

    name: str
    scope: Scope
    output: str
    args: tuple[str, ...] = ()
    source: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.scope.shape)


@dataclass
class Plan:
    """Stages in launch order, the temporary of every materialised scope, all buffer shapes."""

    stages: list[Stage] = field(default_factory=list)
    temps: dict[Scope, str] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def should_inline(reader: Scope, sub: Scope) -> bool:
    """Inline a nested scope into the kernel of ``reader`` (instead of materialising it)
    when it has no summation and inlining does not multiply its reads inside a loop."""
    if sub.summation:
        return False
    return not reader.summation or sum(1 for _ in accesses(sub.body)) <= 1


def plan_stages(root: Scope, decls: dict[str, tuple[int, ...]], *, autotune: bool) -> Plan:
    """All stages of an expression (nested materialised scopes first, the root last)."""
    plan = Plan(shapes=dict(decls))

    def add(scope: Scope, is_root: bool = False) -> None:
        visit(scope, scope.body)  # the scope's own temporaries first
        output = OUT if is_root else f"%t{len(plan.temps)}"
        if not is_root:
            plan.temps[scope] = output
        plan.shapes[output] = scope.shape
        name = f"ollie_k{len(plan.stages)}"
        writer = KernelWriter(name, scope, plan.temps, plan.shapes)
        decorators: tuple[str, ...] = ()
        if autotune:
            cfgs = ", ".join(f"triton.Config({{'BLOCK': {b}}}, num_warps={w})"
                             for b, w in autotune_configs(math.prod(scope.shape)))
            decorators = (f"@triton.autotune(configs=[{cfgs}], key=['N'])",)
        src = writer.source(decorators)
        plan.stages.append(Stage(name, scope, output, tuple(writer.params), src))

    def visit(reader: Scope, body: Node) -> None:
        for acc in accesses(body):
            sub = acc.source
            if not isinstance(sub, Scope) or sub in plan.temps:
                continue
            if should_inline(reader, sub):
                visit(reader, sub.body)
            else:
                add(sub)

    add(root, is_root=True)
    return plan
