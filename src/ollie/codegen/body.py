"""SSA statements of a loop nest's point: the body's nodes (equal sub-expressions shared),
its reads (bounds-checked where the range analysis says so, branch-free), unary functions
(``tanh`` by a vectorisable Pade form), and the module-level typed constants they use.
Used by :mod:`ollie.codegen.emit`, which owns the loops around a point.

Structural zeros (the semantics of :mod:`ollie.semantics.interpreter`). A checked read outside
its buffer is a structural zero, and so is a read that is never in bounds (``Read.zero``), a
product with a structural zero factor, a quotient with a structural zero numerator, the
negation of one and the sum or difference of two. A product or quotient is then exactly 0
whatever its other operand (NaN and infinities included): ``(a * b) if ok else 0`` with ``ok``
the conjunction of its factors' in-bounds conditions. A checked read loads its (clipped)
position unconditionally and is zeroed outside its condition only where its value is used as
such (a sum, a function, a divisor, the point's value): a read that is a factor of a product
costs no select of its own, the product's one select covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ollie.codegen.analysis import Read
from ollie.ir import Access, BinOp, Call, Const, Neg, Node

if TYPE_CHECKING:
    from ollie.codegen.emit import NestEmitter


_UNARY = {"exp": "np.exp({})", "log": "np.log({})", "sqrt": "np.sqrt({})",
          "abs": "np.abs({})"}

TANH_CLAMP = 9.0
"""``tanh`` of arguments beyond +-this is +-1 in float32 (``1 - tanh(9) ~ 3e-8``)."""
TANH_HALVINGS = 5
"""``tanh(x)`` is computed from ``t = tanh(x / 2**5)`` (:data:`TANH_PADE`, ``|x / 32| <=
0.29``) by the doubling formula ``tanh(2y) = 2t / (1 + t**2)`` applied 5 times, carried as a
fraction ``p / q`` (``(p, q) -> (2pq, q**2 + p**2)``) so that one division remains."""
TANH_PADE = ((1.0, 1 / 9, 1 / 945), (1.0, 4 / 9, 1 / 63))
"""Coefficients in ``u = y**2`` of the [5/4] Pade approximant ``tanh(y) ~ y (945 + 105u + u**2)
/ (945 + 420u + 15u**2)`` (Lambert's continued fraction truncated; both divided by 945): its
error is below 1e-12 for ``|y| <= 0.29``. Whole computation: at most 7.5 float32 ulps (2.7e-7
absolute) from ``tanh`` on 4.2 million points in [-12, 12] and out to +-1e30; NaN
stays NaN (comparisons with NaN are false, so the clamp passes it through), +-inf gives +-1,
-0.0 gives -0.0. Plain arithmetic and one division, so LLVM vectorises it: numba's
``np.tanh`` is a scalar libm call per element (measured:
docs/design/020-codegen-measurements.md)."""



class Consts:
    """Module-level typed float constants (``_F32_0 = np.float32(0.5)``)."""

    def __init__(self) -> None:
        self.names: dict[tuple[float, str], str] = {}

    def get(self, value: float, dtype: str) -> str:
        key = (float(value), dtype)
        name = self.names.get(key)
        if name is None:
            name = f"_F{dtype[-2:]}_{len(self.names)}"
            self.names[key] = name
        return name

    def lines(self) -> list[str]:
        return [f"{n} = np.{d}({v!r})" for (v, d), n in self.names.items()]


@dataclass(frozen=True, slots=True)
class _Zero:
    """Where a value is a structural zero: outside the in-bounds condition ``ok`` (a name;
    None: everywhere). ``clean``: the value there already is that zero (``+0``, or ``-0``
    for a negation); otherwise (a read of its clipped position) it is any value and
    :meth:`Body.clean` selects the zero, ``-0`` when ``negative``."""

    ok: str | None
    clean: bool
    negative: bool = False


class Body:
    """SSA statements evaluating a body at one point (interior or boundary variant)."""

    def __init__(self, em: NestEmitter, interior: bool, tag: str, masks: list[str]) -> None:
        self.em = em
        self.interior = interior
        self.tag = tag
        self.masks = masks  # conditions of masked summation loops (single-read bodies only)
        self.stmts: list[str] = []
        self.memo: dict[Node, str] = {}
        self.zeros: dict[str, _Zero] = {}  # values that are structural zeros somewhere
        self.cleaned: dict[str, str] = {}
        self.conds: dict[str, str] = {}  # condition text -> its name

    def run(self, body: Node) -> tuple[list[str], str]:
        """The statements and the name of the body's value (structural zeros as 0)."""
        return self.stmts, self.clean(self.node(body))

    def fresh(self, text: str) -> str:
        name = f"_v{self.tag}{len(self.stmts)}"
        self.stmts.append(f"{name} = {text}")
        return name

    def node(self, node: Node) -> str:
        hit = self.memo.get(node)
        if hit is not None:
            return hit
        em = self.em
        if isinstance(node, Const):
            out = em.consts.get(node.value, em.dtype)
        elif isinstance(node, Access):
            out = self.read(em.info.reads[node])
        elif isinstance(node, Neg):
            x = self.node(node.x)
            out = self.fresh(f"-{x}")
            z = self.zeros.get(x)
            if z is not None:
                self.zeros[out] = _Zero(z.ok, z.clean, not z.negative and not z.clean)
        elif isinstance(node, BinOp):
            out = self.binop(node.op, self.node(node.lhs), self.node(node.rhs))
        else:
            assert isinstance(node, Call), node
            out = self.call(node)
        self.memo[node] = out
        return out

    def cond(self, text: str) -> str:
        """The name of a boolean condition (one per distinct text)."""
        name = self.conds.get(text)
        if name is None:
            name = self.conds[text] = self.fresh(text)
        return name

    def clean(self, v: str) -> str:
        """``v`` with its structural zeros selected (the value it has as an operand of a sum,
        a function or a divisor, or as the point's value)."""
        z = self.zeros.get(v)
        if z is None or z.clean:
            return v
        out = self.cleaned.get(v)
        if out is None:
            zero = f"-{self.em.zero}" if z.negative else self.em.zero
            out = self.fresh(zero if z.ok is None else f"{v} if {z.ok} else {zero}")
            self.zeros[out] = _Zero(z.ok, True)
            self.cleaned[v] = out
        return out

    def structural_zero(self) -> str:
        """A value that is a structural zero everywhere (a read never in bounds)."""
        out = self.fresh(self.em.zero)
        self.zeros[out] = _Zero(None, True)
        return out

    def binop(self, op: str, a: str, b: str) -> str:
        """``a op b`` with structural zeros: a product with one, or a quotient of one, is 0
        wherever it is one, whatever the other operand; a sum or difference of two is one."""
        za, zb = self.zeros.get(a), self.zeros.get(b)
        if op in "+-":
            a, b = self.clean(a), self.clean(b)
            out = self.fresh(f"{a} {op} {b}")
            if za is not None and zb is not None:
                oks = [z.ok for z in (za, zb) if z.ok is not None]
                ok = oks[0] if len(oks) == 1 or (oks and oks[0] == oks[1]) else \
                    (self.cond(f"{oks[0]} | {oks[1]}") if oks else None)
                self.zeros[out] = _Zero(ok, True)
            return out
        if op == "/":
            b, zb = self.clean(b), None
        zs = [z for z in (za, zb) if z is not None]
        if not zs:
            return self.fresh(f"{a} {op} {b}")
        if any(z.ok is None for z in zs):
            return self.structural_zero()
        oks = sorted({z.ok for z in zs if z.ok is not None})
        ok = oks[0] if len(oks) == 1 else self.cond(" & ".join(oks))
        out = self.fresh(f"({a} {op} {b}) if {ok} else {self.em.zero}")
        self.zeros[out] = _Zero(ok, True)
        return out

    def call(self, node: Call) -> str:
        args = [self.clean(self.node(a)) for a in node.args]
        if len(args) == 1:
            return self.unary(node.fn, args[0])
        a, b = args
        cmp = ">=" if node.fn == "max" else "<="
        return self.fresh(f"{a} if ({a} {cmp} {b}) | ({a} != {a}) else {b}")

    def unary(self, fn: str, a: str) -> str:
        """The name holding ``fn(a)`` (statements appended)."""
        zero = self.em.zero
        if fn in _UNARY:
            return self.fresh(_UNARY[fn].format(a))
        if fn == "relu":
            return self.fresh(f"{a} if ({a} > {zero}) | ({a} != {a}) else {zero}")
        if fn == "tanh":
            return self.tanh(a)
        assert fn == "sigmoid", fn
        one = self.em.consts.get(1.0, self.em.dtype)
        return self.fresh(f"{one} / ({one} + np.exp(-{a}))")

    def tanh(self, a: str) -> str:
        """``tanh(a)`` by :data:`TANH_PADE` and :data:`TANH_HALVINGS` doublings."""
        c = self.em.consts
        dt = self.em.dtype
        hi, lo = c.get(TANH_CLAMP, dt), c.get(-TANH_CLAMP, dt)
        x = self.fresh(f"{hi} if {a} > {hi} else ({lo} if {a} < {lo} else {a})")
        y = self.fresh(f"{x} * {c.get(0.5 ** TANH_HALVINGS, dt)}")
        u = self.fresh(f"{y} * {y}")
        (p0, p1, p2), (q0, q1, q2) = (tuple(c.get(v, dt) for v in row) for row in TANH_PADE)
        p = self.fresh(f"{y} * ({p0} + {u} * ({p1} + {u} * {p2}))")
        q = self.fresh(f"{q0} + {u} * ({q1} + {u} * {q2})")
        two = c.get(2.0, dt)
        for _ in range(TANH_HALVINGS):
            p, q = self.fresh(f"{two} * {p} * {q}"), self.fresh(f"{q} * {q} + {p} * {p}")
        return self.fresh(f"{p} / {q}")

    def read(self, read: Read) -> str:
        """A read's value: unchecked where in bounds, else its clipped position loaded and
        marked a structural zero outside its condition (see :meth:`clean`)."""
        em = self.em
        if read.zero:
            return self.structural_zero()
        buf = read.buffer.ident
        flat = em.idx(read.flat)
        conds = list(self.masks)
        for d in read.dims:
            if not (em.info.checked(d, self.interior) or d.clamp in em.unclamped):
                continue
            q = em.idx(d.q)
            if d.bounds[0] < 0:
                conds.append(f"({q} >= 0)")
            if d.bounds[1] >= d.size:
                conds.append(f"({q} < {d.size})")
        wrap = "np.float64({})" if em.dtype == "float64" else "{}"
        if not conds:
            return self.fresh(wrap.format(f"{buf}[np.uint64({flat})]"))
        ok = self.cond(" & ".join(conds))
        v = self.fresh(wrap.format(f"{buf}[np.uint64({flat} if {ok} else 0)]"))
        self.zeros[v] = _Zero(ok, False)
        return v
