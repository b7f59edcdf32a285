"""The iterator mapping table of a scope whose body is (a constant times) a product of two
tensor reads ``X[tX] * Y[tY]`` (the paper's "Itab").

Every iterator of the scope (traversal and summation) goes to the *group* named by the set of
places it appears in: ``X`` and ``Y`` (the two reads, in body order) and ``O`` (it is a
traversal iterator, i.e. an output dimension). Group labels are ``"XYO"``, ``"XO"``, ``"YO"``,
``"XY"``, ``"X"``, ``"Y"``, ``"O"`` and ``"-"`` (appears nowhere). Per tensor and dimension
the table records the index, the coefficient of each iterator, whether the index is affine
(no div/mod) and whether the dimension is *mixed* (combines iterators of different groups,
like ``h + r`` in a convolution).

Example (the paper's worked example after derivation)::

    >>> e = parse("A: [8, 5, 5]\\nK: [3, 3, 6, 8]\\n"
    ...           "L<t1=0:5, t2=0:5, r=0:3, s=0:3, f=0:6> Sum<c=0:8> A[c, t1, t2] * K[r, s, f, c]")
    >>> print(build_table(e.root, e.inputs))   # groups: XO t1 t2 | YO r s f | XY c
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ollie.ir import Access, Affine, BinOp, Const, Neg, Node, Scope
from ollie.ir.printer import format_index, format_scope
from ollie.match.result import BODY, Issue, Mismatch

PLACES = ("X", "Y", "O")
GROUP_ORDER = ("XYO", "XO", "YO", "XY", "X", "Y", "O", "-")


def group_label(places: frozenset[str] | set[str]) -> str:
    """``"XYO"``-style label of a set of places (``"-"`` when empty)."""
    return "".join(p for p in PLACES if p in places) or "-"


@dataclass(frozen=True)
class Operand:
    """One tensor read of the body, in its role ``X`` or ``Y``."""

    role: str
    name: str
    shape: tuple[int, ...]
    access: Access

    @property
    def indices(self) -> tuple[Affine, ...]:
        return self.access.indices

    def vars(self) -> frozenset[str]:
        out: set[str] = set()
        for idx in self.indices:
            out |= idx.vars()
        return frozenset(out)


@dataclass(frozen=True)
class DimInfo:
    """One dimension of one operand: its index and what the table knows about it."""

    role: str
    tensor: str
    dim: int
    index: Affine
    size: int
    groups: tuple[str, ...]   # labels of the groups of the iterators it uses, sorted

    @property
    def affine(self) -> bool:
        return self.index.is_linear

    @property
    def coefs(self) -> dict[str, int]:
        return self.index.linear_coefs()

    @property
    def const(self) -> int:
        return self.index.const

    @property
    def vars(self) -> frozenset[str]:
        return self.index.vars()

    @property
    def mixed(self) -> bool:
        return len(self.groups) > 1


@dataclass(frozen=True)
class IterTable:
    """Iterator mapping table of one product-of-two-reads scope (see the module doc)."""

    scope: Scope
    scale: float
    x: Operand
    y: Operand
    places: Mapping[str, frozenset[str]]   # iterator name -> places it appears in
    dims: tuple[DimInfo, ...]              # X's dimensions, then Y's

    # ------------------------------------------------------------- queries
    def operand(self, role: str) -> Operand:
        return self.x if role == "X" else self.y

    def label(self, it: str) -> str:
        return group_label(self.places[it])

    def group(self, label: str) -> tuple[str, ...]:
        """Iterators of the group ``label`` in scope order (traversal, then summation)."""
        return tuple(it.name for it in self.scope.iters if self.label(it.name) == label)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Non-empty groups, in :data:`GROUP_ORDER`."""
        out = {g: self.group(g) for g in GROUP_ORDER}
        return {g: its for g, its in out.items() if its}

    def dims_of(self, role: str) -> tuple[DimInfo, ...]:
        return tuple(d for d in self.dims if d.role == role)

    def mixed(self) -> tuple[DimInfo, ...]:
        return tuple(d for d in self.dims if d.mixed)

    def nonaffine(self) -> tuple[DimInfo, ...]:
        return tuple(d for d in self.dims if not d.affine)

    def size(self, it: str) -> int:
        return self.scope.iter(it).size

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return self.scope.ranges

    @property
    def traversal(self) -> tuple[str, ...]:
        return tuple(it.name for it in self.scope.traversal)

    # ------------------------------------------------------------- printing
    def __str__(self) -> str:
        order = {it.name: i for i, it in enumerate(self.scope.iters)}
        lines = [f"iterator mapping table of: {format_scope(self.scope)}",
                 f"  X = {self.x.name}{list(self.x.shape)}, Y = {self.y.name}"
                 f"{list(self.y.shape)}, scale {self.scale:g}",
                 "  group | iterators (range)"]
        for label, its in self.groups().items():
            shown = ", ".join(f"{n}={self.scope.iter(n).lo}:{self.scope.iter(n).hi}"
                              for n in its)
            lines.append(f"  {label:<5} | {shown}")
        lines.append("  tensor dim | index | coefficients | groups")
        for d in self.dims:
            coefs = " ".join(f"{n}:{c}" for n, c in sorted(d.coefs.items(),
                                                           key=lambda t: order[t[0]]))
            flags = ("" if d.affine else " non-affine") + (" MIXED" if d.mixed else "")
            lines.append(f"  {d.role}:{d.tensor}[{d.dim}] | {format_index(d.index, order)} | "
                         f"{coefs or '-'} | {','.join(d.groups) or 'const'}{flags}")
        return "\n".join(lines)


# --------------------------------------------------------------------- construction
def _factors(node: Node, out: list[Node]) -> float | None:
    """Flatten a product tree into ``out``; returns the constant factor (None: not a product)."""
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Access):
        out.append(node)
        return 1.0
    if isinstance(node, Neg):
        s = _factors(node.x, out)
        return None if s is None else -s
    if isinstance(node, BinOp) and node.op == "*":
        a = _factors(node.lhs, out)
        b = _factors(node.rhs, out)
        return None if a is None or b is None else a * b
    if isinstance(node, BinOp) and node.op == "/" and isinstance(node.rhs, Const):
        a = _factors(node.lhs, out)
        return None if a is None or node.rhs.value == 0 else a / node.rhs.value
    return None


def body_operands(scope: Scope) -> tuple[float, list[Access]] | Issue:
    """``(scale, [reads])`` when the body is a constant times a product of reads."""
    reads: list[Node] = []
    scale = _factors(scope.body, reads)
    if scale is None:
        return Issue(BODY, "body is not a product of tensor reads (times a constant)")
    accs = [r for r in reads if isinstance(r, Access)]
    return scale, accs


def build_table(scope: Scope, decls: Mapping[str, tuple[int, ...]]) -> IterTable | Mismatch:
    """The iterator mapping table of ``scope``, or a Mismatch (op ``"table"``) when the body is
    not (a constant times) a product of exactly two reads of declared tensors."""
    got = body_operands(scope)
    if isinstance(got, Issue):
        return Mismatch("table", (got,))
    scale, accs = got
    if len(accs) != 2:
        return Mismatch("table", (Issue(BODY, f"body reads {len(accs)} tensor(s); the table "
                                        "needs a product of exactly two reads",
                                        expected=2, actual=len(accs)),))
    for acc in accs:
        if isinstance(acc.source, Scope):
            return Mismatch("table", (Issue(BODY, "body reads a nested scope; instantiate it "
                                            "first"),))
        if acc.source not in decls:
            return Mismatch("table", (Issue(BODY, f"tensor '{acc.source}' is not declared",
                                            tensor=acc.source),))
    ops = [Operand(role, str(acc.source), tuple(decls[str(acc.source)]), acc)
           for role, acc in zip(("X", "Y"), accs, strict=True)]
    trav = {it.name for it in scope.traversal}
    places: dict[str, frozenset[str]] = {}
    for it in scope.iters:
        p = {op.role for op in ops if it.name in op.vars()}
        if it.name in trav:
            p.add("O")
        places[it.name] = frozenset(p)
    dims = []
    for op in ops:
        for d, idx in enumerate(op.indices):
            labels = sorted({group_label(places[v]) for v in idx.vars()},
                            key=GROUP_ORDER.index)
            dims.append(DimInfo(op.role, op.name, d, idx, op.shape[d], tuple(labels)))
    return IterTable(scope, float(scale), ops[0], ops[1], places, tuple(dims))
