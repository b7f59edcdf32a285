"""Variable substitution.

Paper: ``L_x f(T[tau(x)])  =>  L_x { L_{y in Phi(X)} f(T[tau(Phi^-1(y))]) }[Phi(x)]`` with a
bijective ``Phi`` on the traversal iterators. The summation (if any) moves into the new inner
scope; the outer scope only reads it.

:func:`substitute` applies any ``Phi`` given as its forward map (one index expression of the
old iterators per new iterator) and inverse map (old iterator -> index expression of the new
ones) and *checks* it: ``Phi^-1(Phi(x)) == x`` symbolically (range-aware), ``Phi(X)`` inside
the new box, and (for merge and divisible split) equal cardinalities, i.e. bijective onto
the box; a shear (shift) is bijective onto its image, a parallelogram inside the new box, and
the inner scope's extra elements are never read. The explorative rule proposes,
from the expression's structure alone:

* **shift**: a linear combination of traversal iterators that some index uses (``h + r``)
  becomes one iterator ``t`` replacing one of them (the conv example);
* **merge**: iterators ``x, y`` used as ``a*x + b*y`` with ``a == b*|y|`` fuse into one;
* **split**: an iterator is split into quotient/remainder by a factor ``k`` that appears as a
  divisor or as a coefficient next to it in an index (``i + 4*j`` suggests ``k = 4``).

Before / after (shift ``t = h + r``, replacing ``h``)::

    L<r=0:3, h=0:5> A[h + r]
    L<r=0:3, h=0:5> { L<r=0:3, t=0:7> A[t] }[r, h + r]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from ollie.errors import ExprError
from ollie.ir import Access, Affine, Expr, FloorDiv, Iter, Mod, Scope, accesses, var
from ollie.rules.base import Derived, Path, derive_each_scope, fresh_name, register
from ollie.rules.common import iter_names, subst_body


def substitute(scope: Scope, new_iters: Sequence[Iter], forward: Sequence[Affine],
               inverse: Mapping[str, Affine], exact_box: bool = True) -> Scope:
    """Apply ``Phi`` to ``scope``'s traversal iterators (raises ExprError when not valid).

    ``forward[i]`` (over the old traversal iterators) is the value of ``new_iters[i]``;
    ``inverse[x]`` (over the new iterators) gives each old traversal iterator back.
    With ``exact_box`` the new box must have as many points as the old one (bijective).
    """
    old = {it.name: it.range for it in scope.traversal}
    new_ranges = {it.name: it.range for it in new_iters}
    if set(inverse) != set(old):
        raise ExprError("variable substitution: the inverse map must give every traversal "
                        "iterator")
    if len(forward) != len(new_iters):
        raise ExprError("variable substitution: one forward expression per new iterator")
    clash = set(new_ranges) & {it.name for it in scope.summation}
    if clash:
        raise ExprError(f"variable substitution: new iterators {sorted(clash)} clash with "
                        "summation iterators")
    for it, f in zip(new_iters, forward, strict=True):
        lo, hi = f.bounds(old)
        if lo < it.lo or hi >= it.hi:
            raise ExprError(f"variable substitution: Phi maps outside {it.name}={it.lo}:{it.hi}")
    phi = {it.name: f for it, f in zip(new_iters, forward, strict=True)}
    for name, inv in inverse.items():
        if inv.subst(phi).simplify(old) != var(name):
            raise ExprError(f"variable substitution: Phi is not invertible on '{name}'")
    if exact_box:
        size_old = size_new = 1
        for lo, hi in old.values():
            size_old *= hi - lo
        for lo, hi in new_ranges.values():
            size_new *= hi - lo
        if size_old != size_new:
            raise ExprError("variable substitution: Phi is not onto the new box")
    ranges = {**new_ranges, **{it.name: it.range for it in scope.summation}}
    body = subst_body(scope.body, inverse, ranges)
    inner = Scope(tuple(new_iters), scope.summation, body)
    return Scope(scope.traversal, (), Access(inner, tuple(forward)))


# --------------------------------------------------------------------- proposals
def _shift_proposals(scope: Scope) -> list[tuple[str, str, Affine]]:
    trav = {it.name: it for it in scope.traversal}
    out, seen = [], set()
    for acc in accesses(scope.body):
        for idx in acc.indices:
            coefs = {n: c for n, c in idx.linear_coefs().items() if n in trav}
            if len(coefs) < 2:
                continue
            for name, c in coefs.items():
                if abs(c) != 1:
                    continue
                comb = Affine() + sum((var(n) * (k * c) for n, k in coefs.items()), Affine())
                key = (name, comb)
                if key in seen:
                    continue
                seen.add(key)
                out.append(("shift", name, comb))
    return out


def _merge_proposals(scope: Scope) -> list[tuple[str, str, str]]:
    trav = {it.name: it for it in scope.traversal}
    out = []
    for acc in accesses(scope.body):
        for idx in acc.indices:
            coefs = {n: c for n, c in idx.linear_coefs().items() if n in trav}
            for x, cx in coefs.items():
                for y, cy in coefs.items():
                    if x != y and cx == cy * trav[y].size and ("merge", x, y) not in out:
                        out.append(("merge", x, y))
    return out


def _split_proposals(scope: Scope) -> list[tuple[str, str, int]]:
    trav = {it.name: it for it in scope.traversal}
    out = []

    def add(name: str, k: int) -> None:
        if 1 < k < trav[name].size and ("split", name, k) not in out:
            out.append(("split", name, k))

    for acc in accesses(scope.body):
        for idx in acc.indices:
            names = [n for n in idx.vars() if n in trav]
            for atom, _ in idx.terms:
                if not isinstance(atom, (FloorDiv, Mod)):
                    continue
                for n in atom.arg.vars() & set(trav):
                    add(n, atom.k)
            coefs = idx.linear_coefs()
            for n in names:
                if coefs.get(n) in (1, -1):
                    for other, c in coefs.items():
                        if other != n:
                            add(n, abs(c))
    return out


def build_shift(scope: Scope, name: str, comb: Affine) -> Scope:
    """``t = comb`` replaces traversal iterator ``name`` (coefficient +1 in ``comb``)."""
    ranges = {it.name: it.range for it in scope.traversal}
    taken = iter_names(scope)
    t = fresh_name("t", taken)
    lo, hi = comb.bounds(ranges)
    new_iters = [Iter(t, lo, hi + 1) if it.name == name else it for it in scope.traversal]
    forward = [comb if it.name == name else var(it.name) for it in scope.traversal]
    inverse = {it.name: var(it.name) for it in scope.traversal}
    inverse[name] = var(t) - (comb - var(name))
    # a shear: bijective onto its image (a parallelogram); the inner box holds the image
    return substitute(scope, new_iters, forward, inverse, exact_box=False)


def build_merge(scope: Scope, x: str, y: str) -> Scope:
    """Fuse traversal iterators ``x`` (outer) and ``y`` (inner) into one at ``x``'s place."""
    it_x, it_y = scope.iter(x), scope.iter(y)
    taken = iter_names(scope)
    z = fresh_name(x + y, taken)
    sy = it_y.size
    zit = Iter(z, it_x.lo * sy, it_x.hi * sy)
    new_iters = [zit if it.name == x else it for it in scope.traversal if it.name != y]
    fz = var(x) * sy + var(y) - it_y.lo
    forward = [fz if it.name == x else var(it.name) for it in scope.traversal if it.name != y]
    inverse = {it.name: var(it.name) for it in scope.traversal}
    inverse[x] = var(z) // sy
    inverse[y] = var(z) % sy + it_y.lo
    return substitute(scope, new_iters, forward, inverse)


def build_split(scope: Scope, name: str, k: int) -> Scope:
    """Split traversal iterator ``name`` into ``(name - lo) / k`` and ``(name - lo) % k``."""
    it = scope.iter(name)
    taken = iter_names(scope)
    q, r = fresh_name(name + "q", taken), fresh_name(name + "r", taken)
    nq = -(-it.size // k)
    new_iters: list[Iter] = []
    forward: list[Affine] = []
    for t in scope.traversal:
        if t.name == name:
            new_iters += [Iter(q, 0, nq), Iter(r, 0, k)]
            forward += [(var(name) - it.lo) // k, (var(name) - it.lo) % k]
        else:
            new_iters.append(t)
            forward.append(var(t.name))
    inverse = {t.name: var(t.name) for t in scope.traversal}
    inverse[name] = var(q) * k + var(r) + it.lo
    return substitute(scope, new_iters, forward, inverse, exact_box=it.size % k == 0)


def _apply(scope: Scope, path: Path, expr: Expr) -> list[tuple[Scope, str]]:
    builds: list[tuple[Callable[[], Scope], str]] = [
        *((partial(build_shift, scope, a, comb), f"shift {a} -> {comb}")
          for _, a, comb in _shift_proposals(scope)),
        *((partial(build_merge, scope, a, b), f"merge {a},{b}")
          for _, a, b in _merge_proposals(scope)),
        *((partial(build_split, scope, a, k), f"split {a} by {k}")
          for _, a, k in _split_proposals(scope)),
    ]
    out = []
    for build, note in builds:
        try:
            out.append((build(), note))
        except ExprError:
            continue  # not valid here (checked, never assumed)
    return out


@register("variable_substitution")
def variable_substitution(expr: Expr) -> list[Derived]:
    """Shift, merge and split substitutions proposed by the expression's indices."""
    return derive_each_scope(expr, "variable_substitution", _apply)


def split_summation_iter(scope: Scope, name: str, k: int,
                         shapes: Mapping[str, tuple[int, ...]]) -> Scope:
    """``Sum_y f(y) == Sum_{yq, yr} f(k*yq + yr + lo)``: a bijection of the summation domain.

    When ``k`` does not divide ``|y|`` the domain grows to a multiple of ``k``; that is exact
    only if the body is provably zero on the added values (checked, else ExprError)."""
    return split_summation_iters(scope, name, k, shapes)[0]


def split_summation_iters(scope: Scope, name: str, k: int,
                          shapes: Mapping[str, tuple[int, ...]]) -> tuple[Scope, Iter, Iter]:
    """:func:`split_summation_iter`, and the new summation iterators ``(yq, yr)`` (the tile
    index and the offset within a tile)."""
    from ollie.rules.zeros import nonzero_interval

    it = scope.iter(name)
    if it not in scope.summation or not 1 < k < it.size:
        raise ExprError(f"cannot split summation iterator '{name}' by {k}")
    nq = -(-it.size // k)
    if nq * k != it.size:
        grown = {**scope.ranges, name: (it.lo, it.lo + nq * k)}
        lo, hi = nonzero_interval(scope.body, grown, name, shapes)
        if lo < hi and (lo < it.lo or hi > it.hi):
            raise ExprError(f"splitting '{name}' by {k} would add non-zero terms")
    taken = iter_names(scope)
    q, r = fresh_name(name + "q", taken), fresh_name(name + "r", taken)
    iq, ir = Iter(q, 0, nq), Iter(r, 0, k)
    new_sum: list[Iter] = []
    for t in scope.summation:
        new_sum += [iq, ir] if t.name == name else [t]
    ranges = {**{t.name: t.range for t in scope.traversal}, **{t.name: t.range for t in new_sum}}
    body = subst_body(scope.body, {name: var(q) * k + var(r) + it.lo}, ranges)
    return Scope(scope.traversal, tuple(new_sum), body), iq, ir
