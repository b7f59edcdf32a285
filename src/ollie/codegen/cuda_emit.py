"""Triton source of one eOperator kernel (text only: nothing here imports triton).

:class:`KernelWriter` writes one scope as a ``@triton.jit`` function
``kernel(out_ptr, p0, p1, ..., N, BLOCK)`` that stores the scope's ``N`` elements:

* one program per ``BLOCK`` output elements; the flat output index is split into traversal
  iterator values by div/mod of the output shape (size-1 dimensions become constants);
* summation iterators become loops (``tl.static_range`` for small extents, ``range``
  otherwise); an iterator the body does not use is not looped, the body is scaled instead;
* every value is emitted once (CSE by text) at the outermost loop level where all its inputs
  are defined, so address arithmetic, boundary checks and loads are hoisted out of inner loops;
* a read is ``tl.load(ptr + offset, mask=..., other=0.0)``: zero padding is the mask, and a
  bound that index ranges prove is never checked;
* floor division / modulo of an index whose lower bound is negative adds a multiple of the
  divisor first, so Triton's truncating ``//`` and ``%`` give Python's floor results;
* a nested scope without summation is inlined (its iterators substituted by the reading
  indices, composed exactly in :class:`~ollie.ir.index.Affine` form); reads outside its region
  give 0 through masks, or a ``tl.where`` when the body is not zero at zero inputs;
* structural zeros (the semantics of :mod:`ollie.semantics.interpreter`): every value carries
  where it is not one (a disjunction of conjunctions of boundary checks). A masked load is a
  structural zero where its mask fails, and so are a product with a structural zero factor, a
  quotient with a structural zero numerator, the negation of one and the sum of two. A product
  or quotient is ``tl.where(mask, a * b, 0.0)`` over its factors' masks, so it is 0 there even
  where the other operand is NaN or infinite (no select when that operand is a finite literal:
  the masked load's 0 times it is 0). An inlined scope's value is a structural zero only where
  the read leaves the scope's region (an element of a scope is an ordinary value).

Only builtin ``tl`` functions are used (no ``tl.sigmoid``/``tl.zeros``, which are themselves
``@jit`` functions), so kernels run the same under ``TRITON_INTERPRET=1`` whenever it was set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from ollie.ir.index import Affine, FloorDiv, Mod, Var, const
from ollie.ir.nodes import Access, BinOp, Call, Const, Neg, Node, Scope, accesses

STATIC_MAX_EXTENT = 8
"""A summation iterator of at most this extent may be unrolled with ``tl.static_range``..."""
STATIC_MAX_PRODUCT = 64
"""...as long as the product of all unrolled extents stays at most this."""
INT32_SAFE = 2**30
"""Index arithmetic is int64 when a buffer has more elements than this."""

_NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"
_UNARY: dict[str, Callable[[str], str]] = {
    "relu": lambda x: f"tl.maximum({x}, 0.0, {_NAN_ALL})",
    "abs": lambda x: f"tl.abs({x})",
    "exp": lambda x: f"tl.exp({x})",
    "log": lambda x: f"tl.log({x})",
    "sqrt": lambda x: f"tl.sqrt_rn({x})",
    "sigmoid": lambda x: f"1.0 / (1.0 + tl.exp(-{x}))",
    "tanh": lambda x: f"1.0 - 2.0 / (tl.exp(2.0 * {x}) + 1.0)",
}
_BINARY = {"max": "tl.maximum", "min": "tl.minimum"}
_FOLD: dict[str, Callable[..., float]] = {
    "relu": lambda x: np.maximum(x, 0.0), "abs": np.abs, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "max": np.maximum, "min": np.minimum,
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
}
_ZERO_AT_ZERO = frozenset({"relu", "abs", "sqrt", "tanh", "max", "min"})


# --------------------------------------------------------------------- kernel writer
@dataclass(frozen=True, slots=True)
class _V:
    """A generated value: its code (a name or literal), loop level, whether it is per-lane,
    and where it is not a structural zero: ``inside`` is a disjunction of conjunctions of
    checks (None: everywhere; empty: nowhere, the value is a structural zero)."""

    code: str
    level: int = 0
    block: bool = False
    lit: float | None = None
    inside: tuple[tuple[_Check, ...], ...] | None = None


def _int(v: int) -> _V:
    return _V(str(v), lit=v)


def _join(a: str, coef: int, b: str) -> str:
    term = b if abs(coef) == 1 else f"{b} * {abs(coef)}"
    if not a:
        return term if coef > 0 else f"-{term}"
    return f"{a} + {term}" if coef > 0 else f"{a} - {term}"


_Check = tuple[_V, str, int]
"""``(index value, ">=", "<" or "==", bound)``: one boundary condition."""


@dataclass(frozen=True)
class _Ctx:
    """Inlining context: substitution of the current body's iterators, and the conditions
    under which the inlined scopes being read are inside their regions."""

    sub: dict[str, Affine]
    masks: tuple[_Check, ...] = ()


class KernelWriter:
    """Writes the kernel of one scope. ``temps`` names the buffers of materialised nested
    scopes (any other nested scope is inlined); ``shapes`` gives every buffer's shape. After
    :meth:`source`, ``params`` lists the buffers read, in parameter order."""

    def __init__(self, name: str, scope: Scope, temps: Mapping[Scope, str],
                 shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.name, self.scope, self.temps, self.shapes = name, scope, temps, shapes
        self.params: list[str] = []
        self.ranges = scope.ranges
        self.i64 = max([math.prod(s) for s in shapes.values()]
                       + [math.prod(scope.shape)], default=0) > INT32_SAFE
        self.ity = "tl.int64" if self.i64 else "tl.int32"
        used = set()
        for acc in accesses(scope.body):
            for e in acc.indices:
                used |= e.vars()
        base: dict[str, Affine] = {}
        self.vars: dict[str, _V] = {}
        for it in scope.traversal:
            if it.size == 1:
                base[it.name] = const(it.lo)
        loops = [it for it in scope.summation if it.size > 1 and it.name in used]
        for it in scope.summation:
            if it.size == 1:
                base[it.name] = const(it.lo)
        self.scale = math.prod(it.size for it in scope.summation
                               if it.size > 1 and it.name not in used)
        static, prod = set(), 1
        for it in sorted(loops, key=lambda it: it.size):
            if it.size <= STATIC_MAX_EXTENT and prod * it.size <= STATIC_MAX_PRODUCT:
                static.add(it.name)
                prod *= it.size
        # unrolled loops outside: what depends on them only (boundary checks of kernel taps,
        # partial addresses) is then computed once per unrolled iteration, not per dynamic one
        self.loops = [it for it in loops if it.name in static] + \
                     [it for it in loops if it.name not in static]
        self.static = static
        self.base = base
        self.lines: list[list[str]] = [[] for _ in range(len(self.loops) + 1)]
        self.cse: dict[str, _V] = {}

    # ----------------------------------------------------------------- emission helpers
    def emit(self, code: str, level: int, block: bool) -> _V:
        v = self.cse.get(code)
        if v is None:
            v = _V(f"x{len(self.cse)}", level, block)
            self.cse[code] = v
            self.lines[level].append(f"{v.code} = {code}")
        return v

    def structural_zero(self) -> _V:
        """A structural zero everywhere (a read never inside its source)."""
        return replace(self.lit(0.0), inside=())

    def lit(self, value: float) -> _V:
        value = float(value)
        if math.isfinite(value):
            return _V(repr(value), lit=value)
        num = "0.0" if math.isnan(value) else ("1.0" if value > 0 else "-1.0")
        return self.emit(f"tl.full([], {num}, tl.float32) / 0.0", 0, False)

    def combine(self, op: str, parts: list[_V]) -> _V | None:
        """``a op b op ...`` emitted in level order (so partial results hoist)."""
        parts = sorted({p.code: p for p in parts}.values(), key=lambda v: v.level)
        if not parts:
            return None
        acc = parts[0]
        for p in parts[1:]:
            acc = self.emit(f"{acc.code} {op} {p.code}", max(acc.level, p.level),
                            acc.block or p.block)
        return acc

    def param(self, key: str) -> str:
        if key not in self.params:
            self.params.append(key)
        return f"p{self.params.index(key)}"

    # ----------------------------------------------------------------- index arithmetic
    def index(self, e: Affine) -> _V:
        """Integer value of an index over this stage's iterators (floor semantics)."""
        e = e.simplify(self.ranges)
        if e.is_const:
            return _int(e.const)
        by_level: dict[int, list[tuple[_V, int]]] = {}
        for atom, c in e.terms:
            v = self.atom(atom)
            by_level.setdefault(v.level, []).append((v, c))
        out: _V | None = None
        for level in sorted(by_level):
            terms = by_level[level]
            if out is None and e.const == 0 and len(terms) == 1 and terms[0][1] == 1:
                out = terms[0][0]
                continue
            code = out.code if out is not None else ""
            block = out is not None and out.block
            for v, c in terms:
                code = _join(code, c, v.code)
                block = block or v.block
            if out is None and e.const:
                code += f" + {e.const}" if e.const > 0 else f" - {-e.const}"
            out = self.emit(code, level, block)
        assert out is not None
        return out

    def atom(self, atom: Var | FloorDiv | Mod) -> _V:
        if isinstance(atom, Var):
            return self.vars[atom.name]
        arg = self.index(atom.arg)
        lo, _ = atom.arg.simplify(self.ranges).bounds(self.ranges)
        k = atom.k
        shift = -(lo // k) if lo < 0 else 0
        a = f"({arg.code} + {shift * k})" if shift else arg.code
        code = f"{a} // {k}" + (f" - {shift}" if shift else "") if isinstance(atom, FloorDiv) \
            else f"{a} % {k}"
        return self.emit(code, arg.level, arg.block)

    def checks(self, e: Affine, lo: int, hi: int) -> list[_Check] | None:
        """Conditions for ``lo <= e < hi`` that bounds do not prove; None when never true.

        Where one value of ``e``'s range passes, the condition is ``e == value``: one
        comparison instead of two, and it avoids a miscompilation seen on an H100 with Triton
        3.6: ``x % 2 < 1`` for ``x % 2`` in ``[0, 1]`` gave wrong lanes with ``BLOCK=128,
        num_warps=2`` (the ``transposed_conv_stride_divmod`` case), ``== 0`` did not
        (docs/design/020-codegen-measurements.md).
        """
        e = e.simplify(self.ranges)
        blo, bhi = e.bounds(self.ranges)
        if bhi < lo or blo >= hi:
            return None
        out: list[_Check] = []
        if blo < lo or bhi >= hi:
            v = self.index(e)
            first, last = max(blo, lo), min(bhi, hi - 1)
            if first == last:
                return [(v, "==", first)]
            if blo < lo:
                out.append((v, ">=", lo))
            if bhi >= hi:
                out.append((v, "<", hi))
        return out

    def mask(self, checks: list[_Check], block: bool, omask: bool = False) -> _V | None:
        """The conjunction of ``checks`` (and ``omask``), per lane when ``block``.

        A per-lane mask never mixes in a scalar condition: ``block & scalar_bool`` is
        mistyped by Triton's interpreter, so scalar indices are compared per lane there.
        """
        parts = [_V("omask", 0, True)] if omask else []
        for v, op, bound in checks:
            if block and not v.block:
                z = self.emit(f"tl.full([BLOCK], 0, {self.ity})", 0, True)
                parts.append(self.emit(f"{v.code} + {z.code} {op} {bound}", v.level, True))
            else:
                parts.append(self.emit(f"{v.code} {op} {bound}", v.level, v.block))
        return self.combine("&", parts)

    # ----------------------------------------------------------------- body
    def node(self, n: Node, ctx: _Ctx) -> _V:
        if isinstance(n, Const):
            return self.lit(n.value)
        if isinstance(n, Access):
            return self.access(n, ctx)
        if isinstance(n, Neg):
            x = self.node(n.x, ctx)
            v = self.lit(-x.lit) if x.lit is not None else \
                self.emit(f"-{x.code}", x.level, x.block)
            return replace(v, inside=x.inside)
        args = [self.node(a, ctx) for a in ((n.lhs, n.rhs) if isinstance(n, BinOp) else n.args)]
        if isinstance(n, BinOp):
            return self.binop(n.op, args[0], args[1])
        return self.plain(n.fn, args)

    def binop(self, op: str, a: _V, b: _V) -> _V:
        """``a op b`` with structural zeros: a product with one, or a quotient of one, is 0
        where it is one (``tl.where`` on the factors' load masks), whatever the other operand;
        a sum or difference of two is one."""
        if op in "+-":
            v = self.plain(op, [a, b])
            if a.inside is None or b.inside is None:
                return v
            return replace(v, inside=a.inside + b.inside)
        zs = [x.inside for x in ((a, b) if op == "*" else (a,)) if x.inside is not None]
        if not zs:
            return self.plain(op, [a, b])
        if any(not z for z in zs):
            return self.structural_zero()
        inside = zs[0] if len(zs) == 1 else \
            tuple(dict.fromkeys(p + q for p in zs[0] for q in zs[1]))
        v = self.plain(op, [a, b])
        other = b if a.inside is not None else a
        if len(zs) == 1 and other.lit is not None and math.isfinite(other.lit) and \
                (op == "*" or other.lit != 0.0):
            # a masked load is 0 outside: times (or over) a finite literal it stays 0
            return replace(v, inside=inside)
        m = self.combine("|", [self.mask(list(conj), v.block) for conj in inside])
        assert m is not None
        w = self.emit(f"tl.where({m.code}, {v.code}, 0.0)", max(v.level, m.level),
                      v.block or m.block)
        return replace(w, inside=inside)

    def plain(self, key: str, args: list[_V]) -> _V:
        """An operator (``key``: ``+ - * /``) or a function of ``args``, plain arithmetic."""
        if all(a.lit is not None for a in args):
            with np.errstate(all="ignore"):
                return self.lit(_FOLD[key](*(np.float64(a.lit) for a in args)))
        level = max(a.level for a in args)
        block = any(a.block for a in args)
        codes = [a.code if a.lit is None else f"tl.full([], {a.code}, tl.float32)"
                 for a in args]
        if key in "+-*/":
            code = f"{args[0].code} {key} {args[1].code}"
        elif key in _BINARY:
            code = f"{_BINARY[key]}({codes[0]}, {codes[1]}, {_NAN_ALL})"
        else:
            code = _UNARY[key](codes[0])
        return self.emit(code, level, block)

    def access(self, acc: Access, ctx: _Ctx) -> _V:
        idx = [e.subst(ctx.sub) for e in acc.indices]
        src = acc.source
        if isinstance(src, Scope) and src not in self.temps:
            return self.inline(src, idx, ctx)
        if isinstance(src, Scope):
            key, shape, los = self.temps[src], src.shape, [it.lo for it in src.traversal]
        else:
            key, shape, los = src, self.shapes[src], [0] * len(idx)
        conds: list[_Check] = []
        offset = const(0)
        stride = 1
        for e, n, lo in reversed(list(zip(idx, shape, los, strict=True))):
            c = self.checks(e, lo, lo + n)
            if c is None:
                return self.structural_zero()
            conds += c
            offset = offset + (e - lo) * stride
            stride *= n
        block = any(self.vars[v].block for e in idx for v in e.simplify(self.ranges).vars())
        off = self.index(offset)
        ptr = f"{self.param(key)} + {off.code}"
        if block and not off.block:
            ptr += f" + tl.full([BLOCK], 0, {self.ity})"
        lane = None
        if block:
            mask = self.mask(conds + list(ctx.masks), True, omask=True)
        else:
            mask = self.mask(conds + [c for c in ctx.masks if not c[0].block], False)
            lane = self.mask([c for c in ctx.masks if c[0].block], True)
        level = max(off.level, mask.level if mask else 0)
        load = f"tl.load({ptr}, mask={mask.code}, other=0.0)" if mask else f"tl.load({ptr})"
        v = self.emit(load, level, block)
        if lane is not None:
            v = self.emit(f"tl.where({lane.code}, {v.code}, 0.0)", max(level, lane.level), True)
        checks = (*conds, *ctx.masks)
        return replace(v, inside=(checks,)) if checks else v

    def inline(self, sub: Scope, idx: list[Affine], ctx: _Ctx) -> _V:
        conds: list[_Check] = []
        for e, it in zip(idx, sub.traversal, strict=True):
            c = self.checks(e, it.lo, it.hi)
            if c is None:
                return self.structural_zero()
            conds += c
        inner = _Ctx({it.name: e for it, e in zip(sub.traversal, idx, strict=True)},
                     ctx.masks + tuple(conds))
        v = self.node(sub.body, inner)
        if inner.masks and not _zero_at_zero(sub.body):
            block = v.block or any(c[0].block for c in inner.masks)
            m = self.mask(list(inner.masks), block)
            assert m is not None
            v = self.emit(f"tl.where({m.code}, {v.code}, 0.0)", max(v.level, m.level), block)
        # an element of the scope is an ordinary value: a structural zero only outside it
        return replace(v, inside=(inner.masks,) if inner.masks else None)

    # ----------------------------------------------------------------- assembly
    def source(self, decorators: tuple[str, ...] = ()) -> str:
        """The kernel's text: ``@triton.jit`` (after ``decorators``) and the function."""
        scope, ity = self.scope, self.ity
        pro = ["pid = tl.program_id(0)" + (".to(tl.int64)" if self.i64 else ""),
               "offs = pid * BLOCK + tl.arange(0, BLOCK)", "omask = offs < N"]
        stride = 1
        dims = list(enumerate(scope.traversal))
        for d, it in reversed(dims):
            if it.size > 1:
                code = "offs" if stride == 1 else f"offs // {stride}"
                if d > 0 and any(o.size > 1 for o in scope.traversal[:d]):
                    code = f"({code}) % {it.size}" if stride > 1 else f"{code} % {it.size}"
                if it.lo:
                    code = f"{code} + {it.lo}" if it.lo > 0 else f"{code} - {-it.lo}"
                pro.append(f"t{d} = {code}")
                self.vars[it.name] = _V(f"t{d}", 0, True)
            stride *= it.size
        for k, it in enumerate(self.loops):
            self.vars[it.name] = _V(f"s{k}", k + 1, False)
        body = self.node(scope.body, _Ctx(dict(self.base)))
        if self.scale > 1:
            body = self.lit(body.lit * self.scale) if body.lit is not None else \
                self.emit(f"{body.code} * {float(self.scale)!r}", body.level, body.block)
        zeros = "tl.full([BLOCK], 0.0, tl.float32)"
        lines = [f"    {x}" for x in pro + self.lines[0]]
        if not self.loops:
            lines.append(f"    acc = {body.code}" if body.block else
                         f"    acc = {zeros} + {body.code}")
        else:
            lines.append(f"    acc = {zeros}")
            for k, it in enumerate(self.loops):
                pad = "    " * (k + 1)
                if it.name in self.static:
                    lines.append(f"{pad}for s{k} in tl.static_range({it.lo}, {it.hi}):")
                elif self.i64:
                    lines.append(f"{pad}for s{k}_ in range({it.lo}, {it.hi}):")
                    lines.append(f"{pad}    s{k} = tl.cast(s{k}_, {ity})")
                else:
                    lines.append(f"{pad}for s{k} in range({it.lo}, {it.hi}):")
                lines += [f"{pad}    {x}" for x in self.lines[k + 1]]
            lines.append(f"{'    ' * (len(self.loops) + 1)}acc += {body.code}")
        lines.append("    tl.store(out_ptr + offs, acc, mask=omask)")
        params = "".join(f"p{i}, " for i in range(len(self.params)))
        head = [f"# {_doc(scope)}", *decorators, "@triton.jit",
                f"def {self.name}(out_ptr, {params}N, BLOCK: tl.constexpr):"]
        return "\n".join(head + lines) + "\n"


def _doc(scope: Scope) -> str:
    text = " ".join(str(scope).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _zero_at_zero(n: Node) -> bool:
    """True when ``n`` is exactly 0 whenever every read in it is 0."""
    if isinstance(n, Access):
        return True
    if isinstance(n, Const):
        return n.value == 0.0
    if isinstance(n, Neg):
        return _zero_at_zero(n.x)
    if isinstance(n, BinOp):
        lz, rz = _zero_at_zero(n.lhs), _zero_at_zero(n.rhs)
        if n.op in "+-":
            return lz and rz
        if n.op == "*":
            return (lz and (rz or isinstance(n.rhs, Const))) or (rz and isinstance(n.lhs, Const))
        return False
    assert isinstance(n, Call)
    return n.fn in _ZERO_AT_ZERO and all(_zero_at_zero(a) for a in n.args)
