"""Results of operator matching: :class:`MatchResult` (the kernels) and :class:`Mismatch`.

A matcher returns either a :class:`MatchResult` — the library kernel plus the layout
eOperators its operands or its output need, in execution order, and the name of the final
tensor, whose layout is exactly the matched scope's output — or a :class:`Mismatch`: a
structured list of :class:`Issue` objects that guided derivation can act on (which iterator
group has too many or too few iterators, which dimension mixes groups, which coefficient,
offset or range differs, which layout cannot be read as a view).

``MatchResult`` is truthy and ``Mismatch`` is falsy, so ``if res := match_matmul(...)`` works.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, KernelParams

# Issue kinds (``Issue.kind``).
BODY = "body"              # the body is not (a constant times) a product of two tensor reads
GROUP = "group"            # an iterator group holds too many / too few iterators
MIXED = "mixed"            # one index dimension combines iterators of different groups
NONAFFINE = "nonaffine"    # a dimension needs a linear index but has div/mod
COEFFICIENT = "coefficient"  # a coefficient (stride, dilation) is not the operator's
OFFSET = "offset"          # a constant offset is not the operator's
RANGE = "range"            # an iterator range does not fit (e.g. band width must be odd)
LAYOUT = "layout"          # an operand or the output is not a strided view (copy needed)

# Hints: the derivation rule (paper names, snake_case) that may remove the issue.
SUBSTITUTION = "variable_substitution"
LAYOUT_TRANSFORM = "layout_transformation"
SUM_SPLIT = "summation_splitting"
RELAX = "boundary_relaxing"
TIGHTEN = "boundary_tightening"


@dataclass(frozen=True)
class Issue:
    """One reason why a scope does not match an operator (or needed a layout eOperator)."""

    kind: str
    message: str
    group: str | None = None
    iterators: tuple[str, ...] = ()
    tensor: str | None = None
    dim: int | None = None
    expected: object = None
    actual: object = None
    hint: str | None = None

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


@dataclass(frozen=True)
class Mismatch:
    """Why ``op`` does not match; ``issues`` are ordered most fundamental first."""

    op: str
    issues: tuple[Issue, ...]

    def __bool__(self) -> bool:
        return False

    def of_kind(self, kind: str) -> list[Issue]:
        return [i for i in self.issues if i.kind == kind]

    @property
    def kinds(self) -> set[str]:
        return {i.kind for i in self.issues}

    @property
    def hints(self) -> set[str]:
        return {i.hint for i in self.issues if i.hint}

    def __str__(self) -> str:
        lines = [f"{self.op}: no match"]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)


@dataclass(frozen=True)
class MatchResult:
    """Kernels (layout eOps, the library kernel, an output eOp) computing a matched scope.

    ``output`` names the final tensor: shape ``scope.shape``, position ``p`` holding the scope's
    value at iterator values ``p + lo``. ``mapping`` gives the operator's iterator groups
    (e.g. ``{"m": ("t1", "t2"), ...}``); ``notes`` lists the layout eOperators inserted and why.
    """

    op: str
    kernels: tuple[Kernel, ...]
    output: str
    mapping: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    notes: tuple[Issue, ...] = ()

    def __bool__(self) -> bool:
        return True

    @property
    def library(self) -> Kernel:
        """The library kernel (the one kernel whose kind is not ``eOp``)."""
        return next(k for k in self.kernels if k.kind is not KernelKind.EOP)

    @property
    def params(self) -> KernelParams:
        return self.library.params

    @property
    def eops(self) -> tuple[Kernel, ...]:
        return tuple(k for k in self.kernels if k.kind is KernelKind.EOP)

    def __str__(self) -> str:
        groups = "; ".join(f"{g}: {' '.join(its) or '-'}" for g, its in self.mapping.items())
        lines = [f"{self.op} match ({groups}) -> {self.output}"]
        for k in self.kernels:
            shown = {p: v for p, v in k.params.items() if p != "expr"}
            lines.append(f"  {k.kind} {k.output} <- {', '.join(k.inputs)}  {shown}")
        lines += [f"  note {n}" for n in self.notes]
        return "\n".join(lines)


def fresh_name(base: str, taken: Iterable[str]) -> str:
    """``base`` or ``base_1``, ``base_2``, ... whichever is not in ``taken``."""
    used = set(taken)
    if base not in used:
        return base
    k = 1
    while f"{base}_{k}" in used:
        k += 1
    return f"{base}_{k}"


def mismatch(op: str, issues: Iterable[Issue]) -> Mismatch:
    return Mismatch(op, tuple(issues))
