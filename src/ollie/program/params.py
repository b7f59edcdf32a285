"""Kernel kinds and their typed parameters.

:class:`KernelKind` is a ``str``-valued enum: ``KernelKind.MATMUL == "Matmul"``, it prints and
serialises as its value, and a kernel's ``kind`` compares equal to the strings of API.md.

Each kind has one frozen parameter class (:data:`PARAMS`) with typed fields, built by keyword.
A parameter object is also a read-only ``Mapping[str, object]`` of its fields, so
``kernel.params["m"]``, ``kernel.params.get("activation")``, ``dict(kernel.params)`` and the
JSON form of API.md keep working: a field whose value is ``None`` is absent from the mapping
(an annotation not set), every other field is present under its own name, kind-specific
fields first, then the annotations shared by every kind, then :attr:`KernelParams.extra`.

``extra`` keeps parameters Ollie does not know (a hand-built kernel's, a saved program's from
another version): they are carried, saved and shown, never read by Ollie.

:func:`make_params` builds a kind's parameter object from any mapping (a dict, another kind's
parameters); a mapping that lacks a required parameter of the kind raises
:class:`ParamsError`. Field values are taken as given (no conversion): the types are what
Ollie's matchers and passes store.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ollie.errors import OllieError

if TYPE_CHECKING:
    from ollie.graph.ir import Node


class KernelKind(StrEnum):
    """What a kernel runs: a library operator, an eOperator, a zero-copy view of its input
    (``Alias``) or one graph operator run as it is (``Node``)."""

    MATMUL = "Matmul"
    CONV = "Conv"
    G2BMM = "G2BMM"
    GBMM = "GBMM"
    EOP = "eOp"
    ALIAS = "Alias"
    NODE = "Node"


LIBRARY_KINDS = frozenset({KernelKind.MATMUL, KernelKind.CONV, KernelKind.G2BMM,
                           KernelKind.GBMM})
"""The library operators (a kernel of one of these kinds calls a library, not an eOperator)."""

BAND_KINDS = frozenset({KernelKind.G2BMM, KernelKind.GBMM})
"""The band (Longformer-style) matrix products."""


class ParamsError(OllieError, ValueError):
    """Parameters that do not fit a kernel kind (a required parameter missing)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class KernelParams(Mapping[str, object]):
    """Annotations any kernel may carry (all optional), and the mapping view of a kernel's
    parameters. Equality is the mapping's: equal to any mapping of the same items."""

    activation: str | None = None
    """An activation fused into the kernel's output (``"relu"``, ...)."""
    residual: bool | None = None
    """The kernel adds its last input to its output (a fused residual addition)."""
    bias: int | None = None
    """The number of bias inputs the kernel adds to its output (fused), after its operands."""
    library: str | None = None
    """The library implementation chosen for the kernel (see ollie.optimizer.libraries)."""
    region: int | None = None
    """The ONNX Runtime region the kernel runs in."""
    extra: Mapping[str, object] = field(default_factory=dict)
    """Parameters Ollie does not know, kept as given."""

    def __getitem__(self, key: str) -> object:
        if key != "extra" and key in _names(type(self)):
            value = getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        return self.extra[key]

    def __iter__(self) -> Iterator[str]:
        for name in _names(type(self)):
            if getattr(self, name) is not None:
                yield name
        yield from self.extra

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class MatmulParams(KernelParams):
    """``C[b] = alpha * op(A[b]) @ op(B[b])``, ``C[b]`` of ``m x n``, reduction ``k``."""

    b: int
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    transposed: bool | None = None
    """The kernel computes its product transposed (its output holds ``C^T``)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ConvParams(KernelParams):
    """A 2-D convolution: NCHW input ``n x c x h x w``, FCRS weight ``f x c x r x s``,
    padding ``ph, pw`` (``ph_end, pw_end`` at the far ends when they differ), strides
    ``sh, sw``, dilations ``dh, dw``, scale ``alpha``."""

    n: int
    c: int
    h: int
    w: int
    f: int
    r: int
    s: int
    ph: int
    pw: int
    ph_end: int | None = None
    pw_end: int | None = None
    sh: int
    sw: int
    dh: int
    dw: int
    groups: int | None = None
    alpha: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class G2BMMParams(KernelParams):
    """General-to-band product: output ``[b, m, 2w+1]``, reduction ``k``, dilation ``d``."""

    b: int
    m: int
    w: int
    k: int
    d: int
    alpha: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class GBMMParams(KernelParams):
    """Band-to-general product: band operand ``[b, m, 2w+1]``, output ``[b, m, n]``."""

    b: int
    m: int
    w: int
    n: int
    d: int
    alpha: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EOpParams(KernelParams):
    """An eOperator's description (its expression is the kernel's ``expr``; these fields
    restate it for readers of API.md's JSON and the cost model)."""

    expr: str | None = None
    inputs: list[str] | None = None
    output_shape: list[int] | None = None
    bound: str | None = None
    """``"compute"`` or ``"memory"``: which of the two limits the eOperator."""
    flops: int | None = None
    bytes: int | None = None
    intensity: float | None = None
    cuda_configs: list[list[int]] | None = None
    """The CUDA launch configuration of each stage, pinned when the program was tuned."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class AliasParams(KernelParams):
    """A zero-copy view of the kernel's input: ``[offset, sizes, strides]``."""

    view: list[Any]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class NodeParams(KernelParams):
    """One graph operator run as it is, and its operator name."""

    node: Node
    op: str | None = None


PARAMS: dict[KernelKind, type[KernelParams]] = {
    KernelKind.MATMUL: MatmulParams, KernelKind.CONV: ConvParams,
    KernelKind.G2BMM: G2BMMParams, KernelKind.GBMM: GBMMParams, KernelKind.EOP: EOpParams,
    KernelKind.ALIAS: AliasParams, KernelKind.NODE: NodeParams}
"""The parameter class of each kind."""

_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    """The mapping keys of ``cls``'s fields, in mapping order (``extra`` excluded)."""
    names = _NAMES.get(cls)
    if names is None:
        shared = {f.name for f in fields(KernelParams)}
        own = [f.name for f in fields(cls) if f.name not in shared]
        names = (*own, *(f.name for f in fields(KernelParams) if f.name != "extra"))
        _NAMES[cls] = names
    return names


def make_params(kind: KernelKind | str, values: Mapping[str, object]) -> KernelParams:
    """The parameters of a ``kind`` kernel holding ``values`` (keys that are no field of the
    kind go to ``extra``; ``None`` values are absent). :class:`ParamsError` when a required
    parameter is missing."""
    kind = KernelKind(kind)
    cls = PARAMS[kind]
    names = set(_names(cls))
    known: dict[str, Any] = {k: v for k, v in values.items() if k in names and v is not None}
    extra = {k: v for k, v in values.items() if k not in names}
    missing = [f.name for f in fields(cls) if f.name not in known and f.name != "extra"
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ParamsError(f"a {kind} kernel needs parameter(s) {', '.join(missing)}")
    return cls(**known, extra=extra)
