"""Integer index expressions in canonical form, with substitution and range analysis.

Every index expression is an :class:`Affine`: a sum of ``coef * atom`` terms plus a constant.
An atom is an iterator (:class:`Var`), a floor division (:class:`FloorDiv`) or a modulo
(:class:`Mod`) of an affine expression by a positive constant. Construction always goes through
:func:`affine`, which keeps the form canonical, so structurally equal expressions are equal
values:

* terms are sorted by a total order on atoms, have non-zero coefficients, appear once;
* ``(k*a + b) / k`` becomes ``a + b / k``, ``(g*a) / (g*k)`` becomes ``a / k``,
  ``(a / p) / q`` becomes ``a / (p*q)``;
* ``(k*a + b) % k`` becomes ``b % k``; coefficients inside ``% k`` are reduced modulo ``k``;
  ``(a % (q*k)) % k`` becomes ``a % k``; ``(g*a) % (g*k)`` becomes ``g*(a % k)``;
* ``c*k*(e / k) + c*(e % k)`` becomes ``c*e``.

These rewrites hold for all integer values. Rewrites that need iterator ranges (for example
``x / 8 == 0`` when ``0 <= x < 8``) live in :meth:`Affine.simplify`.

Floor division and modulo follow Python: ``-1 / 2 == -1`` and ``-1 % 2 == 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from math import gcd
from typing import Union

import numpy as np
import numpy.typing as npt

from ollie.errors import ExprError

Bounds = tuple[int, int]
"""Closed interval ``(min, max)`` of integer values."""


@dataclass(frozen=True, slots=True)
class Var:
    """An iterator, referenced by name inside the scope that binds it."""

    name: str

    def key(self) -> tuple:
        return (0, self.name)


@dataclass(frozen=True, slots=True)
class FloorDiv:
    """``floor(arg / k)`` with ``k > 1``; built only through :func:`affine` operations."""

    arg: Affine
    k: int

    def key(self) -> tuple:
        return (1, self.k, self.arg.key())


@dataclass(frozen=True, slots=True)
class Mod:
    """``arg mod k`` in ``[0, k)`` with ``k > 1``; built only through :func:`affine` operations."""

    arg: Affine
    k: int

    def key(self) -> tuple:
        return (2, self.k, self.arg.key())


Atom = Union[Var, FloorDiv, Mod]  # noqa: UP007  (a runtime alias used in isinstance checks)
IndexLike = Union["Affine", int]
IndexValue = int | np.integer | npt.NDArray[np.integer]
"""The value of an index expression, or of an iterator, in :meth:`Affine.evaluate`: an integer
(Python or numpy) at one point, an integer array at many points at once."""


@dataclass(frozen=True, slots=True)
class Affine:
    """Canonical ``sum(coef * atom) + const``. Use :func:`affine`, :func:`var` and operators."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # ----------------------------------------------------------------- structure
    def key(self) -> tuple:
        """A total-order key (used to sort atoms canonically)."""
        return (tuple((a.key(), c) for a, c in self.terms), self.const)

    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def is_linear(self) -> bool:
        """True when the expression has no floor-div or mod atom."""
        return all(isinstance(a, Var) for a, _ in self.terms)

    def as_var(self) -> str | None:
        """The iterator name when this is exactly one iterator with coefficient 1."""
        if self.const == 0 and len(self.terms) == 1:
            atom, coef = self.terms[0]
            if coef == 1 and isinstance(atom, Var):
                return atom.name
        return None

    def coef(self, name: str) -> int:
        """Coefficient of iterator ``name`` as a top-level term (0 when absent)."""
        for atom, c in self.terms:
            if isinstance(atom, Var) and atom.name == name:
                return c
        return 0

    def linear_coefs(self) -> dict[str, int]:
        """Top-level iterator coefficients (ignores div/mod atoms)."""
        return {a.name: c for a, c in self.terms if isinstance(a, Var)}

    def vars(self) -> frozenset[str]:
        """Names of all iterators the expression depends on, inside div/mod too."""
        out: set[str] = set()
        for atom, _ in self.terms:
            if isinstance(atom, Var):
                out.add(atom.name)
            else:
                out |= atom.arg.vars()
        return frozenset(out)

    # ----------------------------------------------------------------- arithmetic
    def __add__(self, other: IndexLike) -> Affine:
        o = as_affine(other)
        return _build(_merge(self.terms, o.terms), self.const + o.const)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(tuple((a, -c) for a, c in self.terms), -self.const)

    def __sub__(self, other: IndexLike) -> Affine:
        return self + (-as_affine(other))

    def __rsub__(self, other: IndexLike) -> Affine:
        return as_affine(other) - self

    def __mul__(self, other: IndexLike) -> Affine:
        o = as_affine(other)
        if o.is_const:
            k = o.const
        elif self.is_const:
            return o * self.const
        else:
            raise ExprError(f"index product of two non-constants: ({self}) * ({o})")
        if k == 0:
            return Affine()
        return Affine(tuple((a, c * k) for a, c in self.terms), self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> Affine:
        return _make_div(self, _positive(k, "/"))

    def __mod__(self, k: int) -> Affine:
        return _make_mod(self, _positive(k, "%"))

    # ----------------------------------------------------------------- rewriting
    def subst(self, mapping: Mapping[str, IndexLike]) -> Affine:
        """Replace iterators by index expressions (simultaneously); result is canonical."""
        out = Affine((), self.const)
        for atom, c in self.terms:
            out = out + _atom_subst(atom, mapping) * c
        return out

    def rename(self, names: Mapping[str, str]) -> Affine:
        """Rename iterators."""
        return self.subst({old: var(new) for old, new in names.items()})

    def bounds(self, ranges: Mapping[str, tuple[int, int]]) -> Bounds:
        """Closed interval of values given half-open iterator ranges ``{name: (lo, hi)}``."""
        lo = hi = self.const
        for atom, c in self.terms:
            alo, ahi = _atom_bounds(atom, ranges)
            if c > 0:
                lo += c * alo
                hi += c * ahi
            else:
                lo += c * ahi
                hi += c * alo
        return lo, hi

    def simplify(self, ranges: Mapping[str, tuple[int, int]]) -> Affine:
        """Range-aware simplification: a div/mod whose argument stays within one period
        of its divisor is replaced by an affine expression."""
        out = Affine((), self.const)
        for atom, c in self.terms:
            out = out + _atom_simplify(atom, ranges) * c
        return out

    def evaluate(self, env: Mapping[str, IndexValue]) -> IndexValue:
        """Evaluate with iterator values from ``env`` (ints or numpy integer arrays)."""
        total: IndexValue = self.const
        for atom, c in self.terms:
            v: IndexValue
            if isinstance(atom, Var):
                try:
                    v = env[atom.name]
                except KeyError:
                    raise ExprError(f"unbound iterator '{atom.name}'") from None
            elif isinstance(atom, FloorDiv):
                v = np.floor_divide(atom.arg.evaluate(env), atom.k)
            else:
                v = np.mod(atom.arg.evaluate(env), atom.k)
            total = total + (v if c == 1 else v * c)
        return total

    def __str__(self) -> str:
        from ollie.ir.printer import format_index

        return format_index(self)


# --------------------------------------------------------------------- constructors
def var(name: str) -> Affine:
    """The index expression made of one iterator."""
    return Affine(((Var(name), 1),), 0)


def const(value: int) -> Affine:
    """A constant index expression."""
    return Affine((), int(value))


def as_affine(x: IndexLike) -> Affine:
    """Coerce an int to a constant :class:`Affine`."""
    if isinstance(x, Affine):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return Affine((), int(x))
    raise ExprError(f"not an index expression: {x!r}")


def affine(terms: Iterable[tuple[Atom, int]] = (), constant: int = 0) -> Affine:
    """Build a canonical affine expression from raw ``(atom, coef)`` terms."""
    return _build(_merge((), tuple(terms)), constant)


def _positive(k: int, op: str) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
        raise ExprError(f"index '{op}' needs a positive integer constant, got {k!r}")
    return int(k)


def _merge(a: tuple[tuple[Atom, int], ...], b: tuple[tuple[Atom, int], ...]) -> dict:
    acc: dict[Atom, int] = {}
    for atom, c in a + b:
        acc[atom] = acc.get(atom, 0) + c
    return acc


def _build(acc: dict[Atom, int], constant: int) -> Affine:
    """Canonicalise: recombine ``k*(e/k) + (e%k)`` into ``e``, drop zeros, sort."""
    changed = True
    while changed:
        changed = False
        for atom, c in list(acc.items()):
            if not isinstance(atom, Mod) or c == 0:
                continue
            partner = FloorDiv(atom.arg, atom.k)
            pc = acc.get(partner, 0)
            if pc != 0 and pc == c * atom.k:
                del acc[atom]
                del acc[partner]
                for a2, c2 in atom.arg.terms:
                    acc[a2] = acc.get(a2, 0) + c2 * c
                constant += atom.arg.const * c
                changed = True
                break
    terms = tuple(sorted(((a, c) for a, c in acc.items() if c != 0), key=lambda t: t[0].key()))
    return Affine(terms, int(constant))


def _atom(atom: Atom) -> Affine:
    return Affine(((atom, 1),), 0)


def _make_div(arg: Affine, k: int) -> Affine:
    if k == 1:
        return arg
    q, r = divmod(arg.const, k)
    pulled: list[tuple[Atom, int]] = []
    rest: list[tuple[Atom, int]] = []
    for atom, c in arg.terms:
        (pulled if c % k == 0 else rest).append((atom, c // k if c % k == 0 else c))
    base = affine(pulled, q)
    if not rest:
        return base
    # (a / p) / q == a / (p*q)
    if r == 0 and len(rest) == 1 and rest[0][1] == 1 and isinstance(rest[0][0], FloorDiv):
        inner = rest[0][0]
        return base + _make_div(inner.arg, inner.k * k)
    g = k
    for _, c in rest:
        g = gcd(g, c)
    g = gcd(g, r)
    if g > 1:  # (g*a + g*r) / (g*k) == (a + r) / k, which may simplify further
        return base + _make_div(affine([(a, c // g) for a, c in rest], r // g), k // g)
    return base + _atom(FloorDiv(affine(rest, r), k))


def _make_mod(arg: Affine, k: int) -> Affine:
    if k == 1:
        return Affine()
    acc: dict[Atom, int] = {}
    constant = arg.const % k
    for atom, c in arg.terms:
        # (a % (q*k)) == a (mod k): drop the inner modulo
        if isinstance(atom, Mod) and atom.k % k == 0:
            for a2, c2 in atom.arg.terms:
                acc[a2] = acc.get(a2, 0) + c * c2
            constant = (constant + c * atom.arg.const) % k
        else:
            acc[atom] = acc.get(atom, 0) + c
    rest = [(a, c % k) for a, c in acc.items() if c % k != 0]
    if not rest:
        return Affine((), constant)
    g = k
    for _, c in rest:
        g = gcd(g, c)
    g = gcd(g, constant)
    if g > 1:
        inner = _make_mod(affine([(a, c // g) for a, c in rest], constant // g), k // g)
        return inner * g
    return _atom(Mod(affine(rest, constant), k))


def _atom_subst(atom: Atom, mapping: Mapping[str, IndexLike]) -> Affine:
    if isinstance(atom, Var):
        rep = mapping.get(atom.name)
        return _atom(atom) if rep is None else as_affine(rep)
    inner = atom.arg.subst(mapping)
    return inner // atom.k if isinstance(atom, FloorDiv) else inner % atom.k


def _atom_bounds(atom: Atom, ranges: Mapping[str, tuple[int, int]]) -> Bounds:
    if isinstance(atom, Var):
        try:
            lo, hi = ranges[atom.name]
        except KeyError:
            raise ExprError(f"unbound iterator '{atom.name}'") from None
        return lo, hi - 1
    alo, ahi = atom.arg.bounds(ranges)
    if isinstance(atom, FloorDiv):
        return alo // atom.k, ahi // atom.k
    if alo // atom.k == ahi // atom.k:
        return alo % atom.k, ahi % atom.k
    return 0, atom.k - 1


def _atom_simplify(atom: Atom, ranges: Mapping[str, tuple[int, int]]) -> Affine:
    if isinstance(atom, Var):
        return _atom(atom)
    arg = atom.arg.simplify(ranges)
    lo, hi = arg.bounds(ranges)
    same_period = lo // atom.k == hi // atom.k
    if isinstance(atom, FloorDiv):
        return const(lo // atom.k) if same_period else arg // atom.k
    return arg - (lo // atom.k) * atom.k if same_period else arg % atom.k


def map_atoms(e: Affine, fn: Callable[[Atom], Affine | None]) -> Affine:
    """Rebuild ``e`` replacing each top-level atom by ``fn(atom)`` when it is not None."""
    out = Affine((), e.const)
    for atom, c in e.terms:
        rep = fn(atom)
        out = out + (_atom(atom) if rep is None else rep) * c
    return out
