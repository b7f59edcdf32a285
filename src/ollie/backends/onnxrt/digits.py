"""Read plans without ``Gather`` for reads whose indices divide an iterator, take its
remainder, or combine several iterators in one dimension (:func:`plan_read`, used by
:class:`ollie.backends.onnxrt.reads.ScopeReads`).

An iterator ``x`` of range ``[0, n)`` read through ``x / k`` and ``x % k`` is cut into
mixed-radix *digits* at every such ``k`` (each cut dividing the next, ``n`` the last): ``x / 2``
and ``x % 2`` over ``[0, 116)`` are the digits ``x = 2*hi + lo``, ``hi`` in ``[0, 58)`` and
``lo`` in ``[0, 2)``. An iterator read whole is one digit of weight 1. Every index is then a
sum of digits with constant coefficients. A tensor dimension whose index sums several digits
(``64*h + d``) is split by a ``Reshape`` into one dimension per digit, when the coefficients
divide each other and each lower digit stays inside its part (no carry); then every dimension
is ``c*digit + d`` or a constant, the strided form ``Slice`` + ``Pad`` + ``Transpose`` +
``Reshape`` (+ ``Expand`` over the digits a read does not use) reads it. ViT's head split and
merge and ShuffleNet's channel shuffle read this way; anything else (two dimensions reading
one digit, a negative coefficient, a divided iterator not starting at 0, cuts that do not
divide each other) has no plan and is gathered. Quotients and remainders nest
(``x / 12 % 3``: the digits of weight 12 up to 36, over 12).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ollie.ir import Iter
from ollie.ir.index import Affine, Atom, FloorDiv, Var


@dataclass(frozen=True)
class Digit:
    """One digit of grid axis ``axis``: ``weight`` times its value, in ``[lo, lo + size)``,
    adds to the iterator."""

    axis: int
    weight: int
    lo: int
    size: int

    @property
    def order(self) -> tuple[int, int]:
        """Grid order: by axis, the heaviest digit first (the row-major layout of the axis)."""
        return (self.axis, -self.weight)


@dataclass(frozen=True)
class ReadPlan:
    """A read as the strided form: the source reshaped to ``shape`` (dimensions split), then
    per dimension ``(c, d, digit)``: position ``c*digit + d`` (``digit`` None: the constant
    ``d``; the source's offsets already subtracted). ``digits``: per grid axis the read uses,
    all of its digits, heaviest first."""

    shape: tuple[int, ...]
    dims: tuple[tuple[int, int, Digit | None], ...]
    digits: Mapping[int, tuple[Digit, ...]]


def plan_read(indices: Sequence[Affine], dims: Sequence[int], offsets: Sequence[int],
              iters: Sequence[Iter], axis: Mapping[str, int],
              fixed: Mapping[str, int]) -> ReadPlan | None:
    """The plan reading a tensor of shape ``dims`` (its first position at ``offsets``) at
    ``indices`` over a grid of ``iters`` (``axis``: an iterator's grid axis; ``fixed``:
    iterators replaced by their values), or None when some dimension needs a ``Gather``."""
    qs = [q.subst(fixed) if fixed and q.vars() & fixed.keys() else q for q in indices]
    digits = _digits(qs, iters, axis)
    if digits is None:
        return None
    shape: list[int] = []
    out: list[tuple[int, int, Digit | None]] = []
    seen: set[Digit] = set()
    for q, n, off in zip(qs, dims, offsets, strict=True):
        coefs = _coefficients(q, digits, iters, axis)
        if coefs is None:
            return None
        d = q.const - off
        terms = sorted(coefs.items(), key=lambda t: -t[1])
        if any(c <= 0 or g in seen for g, c in terms):
            return None
        seen.update(g for g, _ in terms)
        if len(terms) <= 1:
            shape.append(n)
            out.append((terms[0][1], d, terms[0][0]) if terms else (0, d, None))
            continue
        split = _split(terms, n, d)
        if split is None:
            return None
        shape.extend(s for s, _ in split)
        out.extend(p for _, p in split)
    used = {g.axis for g in seen} | {axis[v] for q in qs for v in q.vars()}
    full = {a: digits.get(a) or (Digit(a, 1, iters[a].lo, iters[a].size),) for a in used}
    return ReadPlan(tuple(shape), tuple(out), full)


Window = tuple[str, int, int | None, int]
"""An index atom as ``(x, lo, hi, div)``: the digits of iterator ``x`` whose weight lies in
``[lo, hi)`` (``hi`` None: unbounded), each times its weight divided by ``div``."""


def _window(atom: Atom, cuts: set[int] | None = None) -> Window | None:
    """The window of ``atom``, adding the cuts it needs to ``cuts``; None for a division or
    remainder of anything else than one iterator, a quotient or a remainder."""
    if isinstance(atom, Var):
        return (atom.name, 1, None, 1)
    arg = atom.arg
    if arg.const or len(arg.terms) != 1 or arg.terms[0][1] != 1:
        return None
    inner = _window(arg.terms[0][0], cuts)
    if inner is None:
        return None
    name, lo, hi, div = inner
    cut = div * atom.k
    if cuts is not None:
        cuts.add(cut)
    if isinstance(atom, FloorDiv):
        return (name, max(lo, cut), hi, cut)
    return (name, lo, cut if hi is None else min(hi, cut), div)


def _digits(qs: Sequence[Affine], iters: Sequence[Iter], axis: Mapping[str, int]
            ) -> dict[int, tuple[Digit, ...]] | None:
    """The digits of each divided iterator's axis, heaviest first; None when an iterator is
    divided but does not start at 0, its cuts do not divide each other, or a division is not
    of a window (:func:`_window`)."""
    cuts: dict[int, set[int]] = {}
    for q in qs:
        for atom, _ in q.terms:
            if isinstance(atom, Var):
                continue
            found: set[int] = set()
            window = _window(atom, found)
            if window is None or window[0] not in axis:
                return None
            cuts.setdefault(axis[window[0]], set()).update(found)
    out: dict[int, tuple[Digit, ...]] = {}
    for a, ks in cuts.items():
        it = iters[a]
        if it.lo != 0:
            return None
        bounds = sorted({1, it.size, *(k for k in ks if k < it.size)})
        if any(hi % lo for lo, hi in itertools.pairwise(bounds)):
            return None
        out[a] = tuple(Digit(a, lo, 0, hi // lo)
                       for lo, hi in reversed(list(itertools.pairwise(bounds))))
    return out


def _coefficients(q: Affine, digits: Mapping[int, tuple[Digit, ...]], iters: Sequence[Iter],
                  axis: Mapping[str, int]) -> dict[Digit, int] | None:
    """``q`` less its constant as a sum of digits, zero coefficients dropped."""
    coefs: dict[Digit, int] = {}
    for atom, c in q.terms:
        window = _window(atom)
        if window is None or window[0] not in axis:
            return None
        name, lo, hi, div = window
        a = axis[name]
        it = iters[a]
        ds = digits.get(a) or (Digit(a, 1, it.lo, it.size),)
        for g in ds:
            if lo <= g.weight and (hi is None or g.weight < hi):
                coefs[g] = coefs.get(g, 0) + c * (g.weight // div)
    return {g: c for g, c in coefs.items() if c != 0}


def _split(terms: Sequence[tuple[Digit, int]], n: int, d: int
           ) -> list[tuple[int, tuple[int, int, Digit | None]]] | None:
    """A dimension of size ``n`` read at ``sum(c * digit) + d`` (``terms`` by decreasing
    ``c``) as one dimension per digit, each ``(size, (1, d_part, digit))``, then the remainder
    dimension of size ``c_last`` read at a constant; None when a coefficient does not divide
    the one above (or ``n``) or a lower digit would carry into the next."""
    cs = [c for _, c in terms]
    if n % cs[0] or any(hi % lo for hi, lo in itertools.pairwise(cs)):
        return None
    top, rest = divmod(d, cs[0])
    out: list[tuple[int, tuple[int, int, Digit | None]]] = [(n // cs[0], (1, top, terms[0][0]))]
    for (g, c), above in zip(terms[1:], cs, strict=False):
        part, rest = divmod(rest, c)
        if g.lo + part < 0 or g.lo + g.size + part > above // c:
            return None
        out.append((above // c, (1, part, g)))
    if cs[-1] > 1:
        out.append((cs[-1], (0, rest, None)))
    return out


__all__ = ["Digit", "ReadPlan", "plan_read"]
