"""Expression fingerprints: a canonical text per expression, its digest, and an exact dedup set.

:func:`canonical_form` writes an expression so that two expressions get the same text iff they
differ only by

* iterator names (traversal iterators are named by position, ``i0, i1, ...``);
* the order of summation iterators (``j0, j1, ...`` are assigned by range, then by a usage
  signature, then by the lexicographically smallest body text over the remaining ties);
* operand order and association of ``+`` and ``*`` chains (``a - b`` is ``a + (-b)``; signs are
  pulled out of products and quotients) and of ``max`` / ``min``;
* term order in index arithmetic;
* names of tensors produced by scopes or kernels: ``defs`` maps such a name to the fingerprint
  of its producer, which is written instead of the name. Input tensors are written by name,
  and for an :class:`~ollie.ir.nodes.Expr` their declared shapes head the text.

Every renaming tried is a real renaming and every rewrite is an identity of real arithmetic, so
equal canonical forms always mean equivalent expressions; beyond :data:`ENUM_CAP` tied
permutations the converse may fail (never the other way). Nested scopes are closed and are
canonicalised on their own, once per scope object (an LRU cache keyed on the scope).

:func:`fingerprint` is the digest of the canonical form (``_digest``, a module-level function
that tests may replace). :class:`FingerprintSet` confirms every digest hit by comparing
canonical forms, so a collision never prunes a new expression.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from functools import lru_cache
from itertools import permutations, product
from math import factorial

from ollie.errors import ExprError
from ollie.ir.exprprogram import ExprProgram
from ollie.ir.index import Affine, FloorDiv, Var
from ollie.ir.nodes import Access, BinOp, Call, Const, Expr, Iter, Neg, Node, Scope

__all__ = ["ENUM_CAP", "FingerprintSet", "canonical_form", "clear_cache", "fingerprint",
           "program_fingerprint"]

ENUM_CAP = 720
"""Most summation-iterator permutations tried per scope; beyond it ties keep written order."""

_DIRECT = 6  # up to this many permutations: enumerate without computing usage signatures
_CACHE_SIZE = 1 << 16

DefsKey = tuple[tuple[str, str], ...]


def _digest(text: str) -> str:
    """Hex digest of a canonical form (replaceable, e.g. to force collisions in tests)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


# --------------------------------------------------------------------- public functions
def canonical_form(expr: Expr | Scope, defs: Mapping[str, str] | None = None) -> str:
    """Canonical text of ``expr``; ``defs`` maps produced-tensor names to producer fingerprints."""
    key: DefsKey = tuple(sorted(defs.items())) if defs else ()
    if isinstance(expr, Scope):
        return _scope_text(expr, _restrict(key, expr))
    if isinstance(expr, Expr):
        rkey = _restrict(key, expr.root)
        return _header(expr.decls, expr.root, rkey) + "|" + _scope_text(expr.root, rkey)
    raise TypeError(f"canonical_form expects an Expr or a Scope, got {type(expr).__name__}")


def fingerprint(expr: Expr | Scope, defs: Mapping[str, str] | None = None) -> str:
    """Hex digest of :func:`canonical_form` (see the module docstring for what it ignores)."""
    return _digest(canonical_form(expr, defs))


def program_fingerprint(program: ExprProgram) -> str:
    """A digest of an expression program (:class:`~ollie.ir.exprprogram.ExprProgram`), equal
    for programs computing the same outputs from the same inputs the same way up to the names
    of their defs and iterators: each def is fingerprinted with the earlier defs it reads
    written as their own fingerprints (``defs``), and the outputs' fingerprints are joined in
    output order."""
    fps: dict[str, str] = {}
    for name, expr in program.defs:
        fps[name] = fingerprint(expr, fps)
    return _digest("program|" + "|".join(fps[o] for o in program.outputs))


def clear_cache() -> None:
    """Drop the per-scope caches (they are bounded; this is for tests and benchmarks)."""
    _scope_text.cache_clear()
    _used_names.cache_clear()
    _header.cache_clear()


class FingerprintSet:
    """Exact dedup of expressions: a digest hit counts only when canonical forms are equal.

    ``digest`` overrides the module's ``_digest`` (looked up at call time otherwise).
    ``hits`` counts adds that found an equal form; ``collisions`` counts adds whose digest was
    present with only different canonical forms.
    """

    def __init__(self, digest: Callable[[str], str] | None = None) -> None:
        self._digest = digest
        self._forms: dict[str, list[str]] = {}
        self._ids: dict[str, int] = {}
        self._size = 0
        self.hits = 0
        self.collisions = 0

    def _key(self, expr: Expr | Scope, defs: Mapping[str, str] | None) -> tuple[str, str]:
        form = canonical_form(expr, defs)
        return (self._digest or _digest)(form), form

    def add(self, expr: Expr | Scope, defs: Mapping[str, str] | None = None) -> bool:
        """Record ``expr``; True when it was not seen before (up to the invariances)."""
        return self.add_index(expr, defs)[0]

    def add_index(self, expr: Expr | Scope, defs: Mapping[str, str] | None = None
                  ) -> tuple[bool, int]:
        """Record ``expr``: (True when new, the index of its class in insertion order)."""
        digest, form = self._key(expr, defs)
        bucket = self._forms.get(digest)
        if bucket is None:
            self._forms[digest] = [form]
        elif form in bucket:
            self.hits += 1
            return False, self._ids[form]
        else:
            self.collisions += 1
            bucket.append(form)
        self._ids[form] = self._size
        self._size += 1
        return True, self._size - 1

    def contains(self, expr: Expr | Scope, defs: Mapping[str, str] | None = None) -> bool:
        """True when an equivalent expression (same canonical form) was added."""
        digest, form = self._key(expr, defs)
        return form in self._forms.get(digest, ())

    def __contains__(self, expr: object) -> bool:
        if not isinstance(expr, (Expr, Scope)):
            return False
        return self.contains(expr)

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (f"FingerprintSet(size={self._size}, hits={self.hits}, "
                f"collisions={self.collisions})")


# --------------------------------------------------------------------- cached pieces
@lru_cache(maxsize=_CACHE_SIZE)
def _used_names(scope: Scope) -> frozenset[str]:
    """Input-tensor names read by ``scope``, nested scopes included."""
    out: set[str] = set()
    stack: list[Node] = [scope.body]
    while stack:
        node = stack.pop()
        if isinstance(node, Access):
            if isinstance(node.source, Scope):
                out |= _used_names(node.source)
            else:
                out.add(node.source)
        elif isinstance(node, BinOp):
            stack += (node.lhs, node.rhs)
        elif isinstance(node, Neg):
            stack.append(node.x)
        elif isinstance(node, Call):
            stack += node.args
    return frozenset(out)


def _restrict(key: DefsKey, scope: Scope) -> DefsKey:
    """The part of ``defs`` that ``scope`` reads (so unrelated defs keep cache hits)."""
    if not key:
        return key
    used = _used_names(scope)
    return tuple(p for p in key if p[0] in used)


def _def_label(fp: str) -> str:
    """How a produced tensor is written: its producer's fingerprint, length-prefixed."""
    return f"${len(fp)}:{fp}"


@lru_cache(maxsize=_CACHE_SIZE)
def _header(decls: tuple, root: Scope, key: DefsKey) -> str:
    """Declared shapes of the tensors ``root`` reads, produced tensors by their defs."""
    shapes = dict(decls)
    defs = dict(key)
    entries = set()
    for name in _used_names(root):
        if name not in shapes:
            raise ExprError(f"tensor '{name}' is read but not declared")
        label = _def_label(defs[name]) if name in defs else name
        entries.add(f"{label}:[{','.join(str(d) for d in shapes[name])}]")
    return ";".join(sorted(entries))


@lru_cache(maxsize=_CACHE_SIZE)
def _scope_text(scope: Scope, key: DefsKey) -> str:
    """Canonical text ``L<ranges>S<ranges>:body`` of one (closed) scope."""
    p = _Printer(key)
    base = {it.name: f"i{k}" for k, it in enumerate(scope.traversal)}
    head = "L<" + ",".join(f"{it.lo}:{it.hi}" for it in scope.traversal) + ">"
    if not scope.summation:
        p.names = base
        return head + "S<>:" + p.node(scope.body)
    classes = _classes(scope, p, base)
    head += "S<" + ",".join(f"{it.lo}:{it.hi}" for c in classes for it in c) + ">:"
    choices: list[list[tuple[Iter, ...]]] = []
    budget = ENUM_CAP
    for c in classes:
        f = factorial(len(c))
        if f > 1 and f <= budget:
            choices.append(list(permutations(c)))
            budget //= f
        else:  # a single iterator, or past the cap: keep the written order (still a renaming)
            choices.append([tuple(c)])
    best: str | None = None
    for combo in product(*choices):
        names = dict(base)
        k = 0
        for group in combo:
            for it in group:
                names[it.name] = f"j{k}"
                k += 1
        p.names = names
        text = p.node(scope.body)
        if best is None or text < best:
            best = text
    assert best is not None
    return head + best


def _classes(scope: Scope, p: _Printer, base: dict[str, str]) -> list[list[Iter]]:
    """Summation iterators in tie classes, ordered canonically (by range, then signature)."""
    groups: dict[tuple[int, int], list[Iter]] = {}
    for it in scope.summation:
        groups.setdefault((it.lo, it.hi), []).append(it)
    classes = [groups[r] for r in sorted(groups)]
    total = 1
    for c in classes:
        total *= factorial(len(c))
    if total <= _DIRECT:
        return classes
    # usage signature: the body with this iterator marked and the other summation iterators
    # anonymous; invariant under renaming, so refining by it keeps the form canonical
    anon = dict(base)
    for it in scope.summation:
        anon[it.name] = "?"
    refined: list[list[Iter]] = []
    for c in classes:
        if len(c) == 1:
            refined.append(c)
            continue
        by_sig: dict[str, list[Iter]] = {}
        for it in c:
            p.names = {**anon, it.name: "@"}
            by_sig.setdefault(p.node(scope.body), []).append(it)
        refined.extend(by_sig[s] for s in sorted(by_sig))
    return refined


# --------------------------------------------------------------------- printing
class _Printer:
    """Writes body nodes and index expressions under an iterator renaming ``names``."""

    __slots__ = ("defs", "key", "names")

    def __init__(self, key: DefsKey) -> None:
        self.key = key
        self.defs = {name: _def_label(fp) for name, fp in key}
        self.names: dict[str, str] = {}

    # ------------------------------------------------------------- index expressions
    def index(self, e: Affine) -> str:
        # terms ``c*atom`` in sorted order, then the constant (the one part without '*')
        terms = e.terms
        if not terms:
            return str(e.const)
        if len(terms) == 1:
            atom, c = terms[0]
            text = f"{c}*{self.atom(atom)}"
        else:
            text = "+".join(sorted([f"{c}*{self.atom(atom)}" for atom, c in terms]))
        return f"{text}+{e.const}" if e.const else text

    def atom(self, atom) -> str:
        if isinstance(atom, Var):
            try:
                return self.names[atom.name]
            except KeyError:
                raise ExprError(f"unbound iterator '{atom.name}' in a scope") from None
        op = "/" if isinstance(atom, FloorDiv) else "%"
        return f"({self.index(atom.arg)}){op}{atom.k}"

    # ------------------------------------------------------------- body
    def node(self, n: Node) -> str:
        neg, text = self.signed(n)
        return "-" + text if neg else text

    def signed(self, n: Node) -> tuple[bool, str]:
        """(negated, text of the magnitude): signs travel out of products and quotients."""
        if isinstance(n, Access):
            return False, self.access(n)
        if isinstance(n, BinOp):
            op = n.op
            if op == "+" or op == "-":
                return False, self.sum(n)
            if op == "*":
                factors: list[str] = []
                neg = self.factors(n, factors)
                factors.sort()
                return neg, "*(" + ",".join(factors) + ")"
            s1, t1 = self.signed(n.lhs)
            s2, t2 = self.signed(n.rhs)
            return s1 != s2, f"/({t1},{t2})"
        if isinstance(n, Const):
            v = float(n.value)
            if v < 0:
                return True, repr(-v)
            return False, repr(abs(v))  # -0.0 == 0.0 in the IR, so it prints as 0.0
        if isinstance(n, Neg):
            if isinstance(n.x, BinOp) and n.x.op in "+-":
                return False, self.sum(n)
            s, t = self.signed(n.x)
            return not s, t
        if isinstance(n, Call):
            return False, self.call(n)
        raise ExprError(f"not an expression node: {n!r}")

    def sum(self, n: Node) -> str:
        terms: list[str] = []
        self.terms(n, False, terms)
        terms.sort()
        return "+(" + ",".join(terms) + ")"

    def terms(self, n: Node, neg: bool, out: list[str]) -> None:
        if isinstance(n, BinOp) and (n.op == "+" or n.op == "-"):
            self.terms(n.lhs, neg, out)
            self.terms(n.rhs, neg != (n.op == "-"), out)
        elif isinstance(n, Neg):
            self.terms(n.x, not neg, out)
        else:
            s, t = self.signed(n)
            out.append("-" + t if s != neg else t)

    def factors(self, n: Node, out: list[str]) -> bool:
        """Collect the magnitudes of a ``*`` chain; return the chain's sign."""
        if isinstance(n, BinOp) and n.op == "*":
            return self.factors(n.lhs, out) != self.factors(n.rhs, out)
        s, t = self.signed(n)
        out.append(t)
        return s

    def call(self, n: Call) -> str:
        fn = n.fn
        if fn == "max" or fn == "min":  # commutative and associative: flatten and sort
            args: list[str] = []
            stack = list(n.args)
            while stack:
                a = stack.pop()
                if isinstance(a, Call) and a.fn == fn:
                    stack += a.args
                else:
                    args.append(self.node(a))
            args.sort()
            return f"{fn}(" + ",".join(args) + ")"
        return f"{fn}(" + ",".join(self.node(a) for a in n.args) + ")"

    def access(self, n: Access) -> str:
        src = n.source
        if isinstance(src, Scope):
            head = "{" + _scope_text(src, _restrict(self.key, src)) + "}"
        else:
            head = self.defs.get(src, src)
        return head + "[" + ",".join([self.index(i) for i in n.indices]) + "]"
