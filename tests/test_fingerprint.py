"""Tests of ollie.fingerprint: invariances, sensitivity, exactness and forced collisions."""

from __future__ import annotations

import importlib
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollie.ir import (
    Access,
    BinOp,
    Call,
    Const,
    Expr,
    Iter,
    Neg,
    Scope,
    accesses,
    neg,
    parse,
    var,
)

fpmod = importlib.import_module("ollie.fingerprint")  # (ollie.fingerprint may be the function)
canonical_form = fpmod.canonical_form
fingerprint = fpmod.fingerprint
FingerprintSet = fpmod.FingerprintSet

CONV = """
A: [1, 512, 7, 7]
K: [512, 512, 3, 3]
L<n=0:1, f=0:512, h=0:7, w=0:7> Sum<c=0:512, r=0:3, s=0:3>
    A[n, c, h+r-1, w+s-1] * K[f, c, r, s]
"""
DECLS = "A: [4, 4]\nB: [4]\nC: [2, 4, 4]\nT: [4, 4]\nU: [4, 4]\n"


def fp(text: str, defs: dict[str, str] | None = None) -> str:
    return fingerprint(parse(DECLS + text), defs)


def cf(text: str, defs: dict[str, str] | None = None) -> str:
    return canonical_form(parse(DECLS + text), defs)


# --------------------------------------------------------------------- examples
SAME = [
    # iterator renaming
    ("L<i=0:4, j=0:4> A[i, j]", "L<x=0:4, y=0:4> A[x, y]"),
    ("L<i=0:4> Sum<k=0:4> A[i, k] * B[k]", "L<q=0:4> Sum<z=0:4> A[q, z] * B[z]"),
    # summation order
    ("L<i=0:2> Sum<a=0:4, b=0:4> C[i, a, b] * A[a, b]",
     "L<i=0:2> Sum<b=0:4, a=0:4> C[i, a, b] * A[a, b]"),
    ("L<i=0:2> Sum<a=0:4, b=0:4> C[i, a, b] * B[b]",
     "L<i=0:2> Sum<a=0:4, b=0:4> C[i, b, a] * B[a]"),
    # operand order of + and *
    ("L<i=0:4> A[i, i] + B[i]", "L<i=0:4> B[i] + A[i, i]"),
    ("L<i=0:4> A[i, i] * B[i]", "L<i=0:4> B[i] * A[i, i]"),
    # reassociation
    ("L<i=0:4> (A[i, 0] + B[i]) + T[i, 1]", "L<i=0:4> A[i, 0] + (B[i] + T[i, 1])"),
    ("L<i=0:4> (A[i, 0] * B[i]) * 2", "L<i=0:4> B[i] * (2 * A[i, 0])"),
    ("L<i=0:4> A[i, 0] - B[i] + T[i, 1]", "L<i=0:4> T[i, 1] + -B[i] + A[i, 0]"),
    ("L<i=0:4> A[i, 0] - (B[i] - T[i, 1])", "L<i=0:4> T[i, 1] - B[i] + A[i, 0]"),
    ("L<i=0:4> -A[i, 0] * B[i]", "L<i=0:4> A[i, 0] * -B[i]"),
    ("L<i=0:4> max(A[i, 0], max(B[i], 1))", "L<i=0:4> max(max(1, A[i, 0]), B[i])"),
    # index term order
    ("L<h=0:4, w=0:4> Sum<s=0:3> A[h, w + s - 1]", "L<h=0:4, w=0:4> Sum<s=0:3> A[h, s - 1 + w]"),
    ("L<h=0:4, w=0:4> A[(h + 2*w) / 2, (w + h) % 3]",
     "L<h=0:4, w=0:4> A[(2*w + h) / 2, (h + w) % 3]"),
    # nested scopes: renaming inside
    ("L<i=0:4> { L<a=0:4, b=0:4> A[b, a] }[i, i]", "L<z=0:4> { L<p=0:4, q=0:4> A[q, p] }[z, z]"),
]

DIFFERENT = [
    # traversal order is layout
    ("L<i=0:4, j=0:4> A[i, j]", "L<j=0:4, i=0:4> A[i, j]"),
    # ranges, coefficients, offsets
    ("L<i=0:4> B[i]", "L<i=0:3> B[i]"),
    ("L<i=0:4> B[i]", "L<i=1:5> B[i]"),
    ("L<i=0:4> Sum<k=0:4> A[i, k]", "L<i=0:4> Sum<k=0:3> A[i, k]"),
    ("L<i=0:4> B[2*i]", "L<i=0:4> B[3*i]"),
    ("L<i=0:4> B[i + 1]", "L<i=0:4> B[i - 1]"),
    ("L<i=0:8> B[i / 2]", "L<i=0:8> B[i % 2]"),
    ("L<i=0:8> B[i / 2]", "L<i=0:8> B[i / 3]"),
    # constants, tensors, functions
    ("L<i=0:4> B[i] * 2", "L<i=0:4> B[i] * 3"),
    ("L<i=0:4> B[i] * 2", "L<i=0:4> B[i] * -2"),
    ("L<i=0:4> A[i, i]", "L<i=0:4> T[i, i]"),
    ("L<i=0:4> relu(B[i])", "L<i=0:4> tanh(B[i])"),
    ("L<i=0:4> max(B[i], 0)", "L<i=0:4> min(B[i], 0)"),
    # non-commutative operators
    ("L<i=0:4> A[i, 0] - B[i]", "L<i=0:4> B[i] - A[i, 0]"),
    ("L<i=0:4> A[i, 0] / B[i]", "L<i=0:4> B[i] / A[i, 0]"),
    ("L<i=0:4> A[i, 0] + B[i]", "L<i=0:4> A[i, 0] - B[i]"),
    ("L<i=0:4> A[i, 0] + B[i]", "L<i=0:4> A[i, 0] * B[i]"),
    # summation vs traversal
    ("L<i=0:4, k=0:4> A[i, k]", "L<i=0:4> Sum<k=0:4> A[i, k]"),
    # which iterator goes where, with equal ranges
    ("L<i=0:2> Sum<a=0:4, b=0:4> C[i, a, b] * B[a]",
     "L<i=0:2> Sum<a=0:4, b=0:4> C[i, a, b] * B[b]"),
    ("L<i=0:4, j=0:4> A[i, j] + T[i, j]", "L<i=0:4, j=0:4> A[i, j] + T[j, i]"),
    # nested scope ranges (reads by iterator value; outside the range gives 0)
    ("L<i=0:4> { L<a=0:4> B[a] }[i]", "L<i=0:4> { L<a=0:3> B[a] }[i]"),
    ("L<i=0:4> { L<a=0:4> B[a] }[i]", "L<i=0:4> { L<a=1:5> B[a] }[i]"),
    ("L<i=0:4> { L<a=0:4> Sum<k=0:4> A[a, k] }[i]", "L<i=0:4> { L<a=0:4> Sum<k=0:2> A[a, k] }[i]"),
    # nested scope layout
    ("L<i=0:4, j=0:4> { L<a=0:4, b=0:4> A[a, b] }[i, j]",
     "L<i=0:4, j=0:4> { L<b=0:4, a=0:4> A[a, b] }[i, j]"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_invariances(a: str, b: str) -> None:
    assert cf(a) == cf(b)
    assert fp(a) == fp(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_sensitivity(a: str, b: str) -> None:
    assert cf(a) != cf(b)
    assert fp(a) != fp(b)


def test_summation_iterator_roles_are_kept() -> None:
    a = "B: [4]\nC: [4, 4]\nL<i=0:2> Sum<s1=0:4, s2=0:4> B[s1] * C[s1, s2]"
    b = "B: [4]\nC: [4, 4]\nL<i=0:2> Sum<s1=0:4, s2=0:4> B[s2] * C[s1, s2]"
    assert canonical_form(parse(a)) != canonical_form(parse(b))
    c = "B: [4]\nC: [4, 4]\nL<i=0:2> Sum<u=0:4, v=0:4> C[v, u] * B[v]"
    assert canonical_form(parse(a)) == canonical_form(parse(c))


def test_conv_example() -> None:
    e = parse(CONV)
    renamed = parse(CONV.replace("Sum<c=0:512, r=0:3, s=0:3>", "Sum<s=0:3, r=0:3, c=0:512>")
                    .replace("A[n, c, h+r-1, w+s-1] * K[f, c, r, s]",
                             "K[f, c, r, s] * A[n, c, r - 1 + h, s + w - 1]"))
    assert fingerprint(e) == fingerprint(renamed)
    swapped_taps = parse(CONV.replace("K[f, c, r, s]", "K[f, c, s, r]"))
    assert fingerprint(e) != fingerprint(swapped_taps)
    assert len(fingerprint(e)) == 32 and int(fingerprint(e), 16) >= 0


def test_declared_shapes_count_and_unused_declarations_do_not() -> None:
    a = parse("A: [4, 4]\nL<i=0:4> A[i, i]")
    b = parse("A: [4, 5]\nL<i=0:4> A[i, i]")
    c = parse("A: [4, 4]\nZ: [9]\nL<i=0:4> A[i, i]")
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a) == fingerprint(c)


def test_scope_and_expr_inputs() -> None:
    e = parse(DECLS + "L<i=0:4> A[i, i] + B[i]")
    assert canonical_form(e.root) == canonical_form(parse(DECLS + "L<j=0:4> B[j] + A[j, j]").root)
    assert fingerprint(e.root) != fingerprint(e)  # an Expr also hashes declared shapes
    with pytest.raises(TypeError):
        canonical_form("L<i=0:4> B[i]")  # type: ignore[arg-type]


# --------------------------------------------------------------------- produced tensors
def test_defs_rename_produced_tensors() -> None:
    producer = fingerprint(parse("A: [4, 4]\nL<i=0:4, j=0:4> A[j, i] * 2"))
    a = parse("T: [4, 4]\nB: [4]\nL<i=0:4> Sum<k=0:4> T[i, k] * B[k]")
    b = parse("U: [4, 4]\nB: [4]\nL<i=0:4> Sum<k=0:4> B[k] * U[i, k]")
    assert fingerprint(a) != fingerprint(b)  # input tensors: by name
    assert fingerprint(a, {"T": producer}) == fingerprint(b, {"U": producer})
    other = fingerprint(parse("A: [4, 4]\nL<i=0:4, j=0:4> A[i, j] * 2"))
    assert fingerprint(a, {"T": producer}) != fingerprint(b, {"U": other})
    # defs for tensors the expression does not read change nothing
    assert fingerprint(a, {"T": producer, "Q": other}) == fingerprint(a, {"T": producer})


def test_defs_reach_nested_scopes() -> None:
    text = "T: [4, 4]\nL<i=0:4> { L<a=0:4> T[a, a] + 1 }[i] * 2"
    e, e2 = parse(text), parse(text.replace("T", "U"))
    assert fingerprint(e, {"T": "f1"}) == fingerprint(e2, {"U": "f1"})
    assert fingerprint(e, {"T": "f1"}) != fingerprint(e2, {"U": "f2"})
    assert fingerprint(e.root, {"T": "f1"}) != fingerprint(e.root)


# --------------------------------------------------------------------- FingerprintSet
def _distinct_exprs(n: int) -> list[Expr]:
    return [parse(DECLS + f"L<i=0:4> B[i] * {k} + A[i, {k % 4}]") for k in range(n)]


def test_fingerprint_set_basic() -> None:
    s = FingerprintSet()
    assert s.add(parse(DECLS + "L<i=0:4> A[i, i] + B[i]"))
    assert not s.add(parse(DECLS + "L<q=0:4> B[q] + A[q, q]"))
    assert s.add(parse(DECLS + "L<q=0:4> B[q] - A[q, q]"))
    assert len(s) == 2 and s.hits == 1 and s.collisions == 0
    assert parse(DECLS + "L<z=0:4> A[z, z] + B[z]") in s
    assert parse(DECLS + "L<z=0:4> A[z, z] * B[z]") not in s
    assert "not an expression" not in s


def test_forced_collisions_never_prune(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fpmod, "_digest", lambda text: "0" * 32)
    exprs = _distinct_exprs(40)
    assert len({fingerprint(e) for e in exprs}) == 1
    s = FingerprintSet()
    assert all(s.add(e) for e in exprs)  # nothing valid is pruned
    assert len(s) == 40 and s.collisions == 39 and s.hits == 0
    renamed = parse(DECLS + "L<zz=0:4> A[zz, 3] + 7 * B[zz]")  # == exprs[7]
    assert renamed in s
    assert not s.add(renamed)
    assert s.hits == 1 and len(s) == 40


def test_injected_digest_parameter() -> None:
    s = FingerprintSet(digest=lambda text: "x")
    exprs = _distinct_exprs(5)
    assert all(s.add(e) for e in exprs)
    assert not s.add(exprs[2])
    assert s.collisions == 4 and s.hits == 1


# --------------------------------------------------------------------- random expressions
RANGES = [(0, 2), (0, 3), (-1, 3), (0, 4)]
SUM_RANGES = [(0, 2), (0, 3), (0, 4)]
SHAPES = {"A": (4, 4), "B": (4,), "C": (2, 4, 4)}


@st.composite
def index_exprs(draw, names: list[str]) -> str:
    a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
    c = draw(st.integers(-2, 2))
    return draw(st.sampled_from([
        f"{a}", f"{a} + {b}", f"{a} - {b} + {c}", f"2*{a} + {c}", f"({a} + {c}) / 2",
        f"({a} + {b}) % 3", f"{c}",
    ]))


@st.composite
def scopes(draw, depth: int = 0) -> str:
    n_trav = draw(st.integers(1, 2))
    n_sum = draw(st.integers(0, 3))
    trav = [(f"t{k}", *draw(st.sampled_from(RANGES))) for k in range(n_trav)]
    summ = [(f"s{k}", *draw(st.sampled_from(SUM_RANGES))) for k in range(n_sum)]
    names = [n for n, _, _ in trav + summ]
    head = "L<" + ", ".join(f"{n}={lo}:{hi}" for n, lo, hi in trav) + ">"
    if summ:
        head += " Sum<" + ", ".join(f"{n}={lo}:{hi}" for n, lo, hi in summ) + ">"
    return f"{head} {draw(bodies(names, depth, 2))}"


@st.composite
def bodies(draw, names: list[str], depth: int, height: int) -> str:
    kind = draw(st.sampled_from(["read", "read", "const", "scope", "op", "op", "fn"]
                                if height > 0 else ["read", "read", "const", "scope"]))
    if kind == "const":
        return draw(st.sampled_from(["2", "0.5", "-1.5"]))
    if kind == "scope" and depth < 1:
        inner = draw(scopes(depth + 1))
        rank = inner.split(">")[0].count("=")
        idx = ", ".join(draw(index_exprs(names)) for _ in range(rank))
        return f"{{ {inner} }}[{idx}]"
    if kind in ("read", "scope"):
        t = draw(st.sampled_from(sorted(SHAPES)))
        idx = ", ".join(draw(index_exprs(names)) for _ in SHAPES[t])
        return f"{t}[{idx}]"
    sub = bodies(names, depth, height - 1)
    if kind == "fn":
        fn = draw(st.sampled_from(["relu", "tanh", "abs", "max", "min", "neg"]))
        if fn in ("max", "min"):
            return f"{fn}({draw(sub)}, {draw(sub)})"
        return f"-({draw(sub)})" if fn == "neg" else f"{fn}({draw(sub)})"
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    if op == "/":  # keep denominators away from zero
        return f"({draw(sub)}) / (abs({draw(sub)}) + 1)"
    return f"({draw(sub)}) {op} ({draw(sub)})"


def random_exprs() -> st.SearchStrategy[Expr]:
    decls = "".join(f"{n}: [{', '.join(map(str, s))}]\n" for n, s in SHAPES.items())
    return scopes().map(lambda text: parse(decls + text))


def transform(scope: Scope, rnd: random.Random) -> Scope:
    """An equivalent scope: fresh iterator names, shuffled Sum<>, swapped / reassociated
    operands of + * max min, ``a - b`` written as ``a + (-b)``."""
    fresh = [f"v{k}" for k in range(len(scope.iters))]
    rnd.shuffle(fresh)
    names = {it.name: f for it, f in zip(scope.iters, fresh, strict=True)}
    trav = tuple(Iter(names[it.name], it.lo, it.hi) for it in scope.traversal)
    summ = [Iter(names[it.name], it.lo, it.hi) for it in scope.summation]
    rnd.shuffle(summ)
    return Scope(trav, tuple(summ), _tnode(scope.body, names, rnd))


def _tnode(n, names: dict[str, str], rnd: random.Random):
    if isinstance(n, Access):
        src = transform(n.source, rnd) if isinstance(n.source, Scope) else n.source
        return Access(src, tuple(i.rename(names) for i in n.indices))
    if isinstance(n, Neg):
        return neg(_tnode(n.x, names, rnd))
    if isinstance(n, Call):
        args = [_tnode(a, names, rnd) for a in n.args]
        if n.fn in ("max", "min"):
            rnd.shuffle(args)
        return Call(n.fn, tuple(args))
    if isinstance(n, BinOp):
        lhs, rhs = _tnode(n.lhs, names, rnd), _tnode(n.rhs, names, rnd)
        op = n.op
        if op == "-" and rnd.random() < 0.5:
            op, rhs = "+", neg(rhs)
        if op in "+*":
            if rnd.random() < 0.5:
                lhs, rhs = rhs, lhs
            if isinstance(lhs, BinOp) and lhs.op == op and rnd.random() < 0.5:
                return BinOp(op, lhs.lhs, BinOp(op, lhs.rhs, rhs))
        return BinOp(op, lhs, rhs)
    return n


@given(random_exprs(), st.integers(0, 2**32 - 1))
def test_property_invariance(e: Expr, seed: int) -> None:
    t = Expr(e.decls, transform(e.root, random.Random(seed)))
    assert canonical_form(t) == canonical_form(e)
    assert fingerprint(t) == fingerprint(e)


MUTATIONS = 8


def mutate(scope: Scope, rnd: random.Random, choice: int) -> Scope:
    """A small change of kind ``choice`` (random where it picks); usually not an equivalence."""
    trav, summ, body = scope.traversal, scope.summation, scope.body
    if choice == 0 and len(trav) > 1:  # layout swap
        return Scope((trav[1], trav[0], *trav[2:]), summ, body)
    if choice == 1:  # range change
        t = list(scope.iters)
        k = rnd.randrange(len(t))
        t[k] = Iter(t[k].name, t[k].lo, t[k].hi + 1)
        return Scope(tuple(t[: len(trav)]), tuple(t[len(trav):]), body)
    if choice == 2 and len(scope.iters) > 1:  # two iterators swap roles in the whole body
        a, b = rnd.sample([it.name for it in scope.iters], 2)
        return Scope(trav, summ, _subst(body, {a: var(b), b: var(a)}))
    if choice == 3 and len(scope.iters) > 1:  # ... or in one read only
        a, b = rnd.sample([it.name for it in scope.iters], 2)
        swap = {a: var(b), b: var(a)}
        fn = lambda n: Access(n.source, tuple(i.subst(swap) for i in n.indices))  # noqa: E731
        return Scope(trav, summ, _rewrite_one(body, _is_access, fn, rnd))
    if choice == 4:  # operands of a non-commutative operator swapped
        fn = lambda n: BinOp(n.op, n.rhs, n.lhs)  # noqa: E731
        return Scope(trav, summ, _rewrite_one(body, _is_noncommutative, fn, rnd))
    if choice == 5:  # one read negated
        return Scope(trav, summ, _rewrite_one(body, _is_access, neg, rnd))
    if choice == 6:  # an index offset changed
        fn = lambda n: Access(n.source, (n.indices[0] + 1, *n.indices[1:]))  # noqa: E731
        return Scope(trav, summ, _rewrite_one(body, _is_access, fn, rnd))
    if choice == 7 and any(isinstance(a.source, Scope) for a in accesses(body)):
        def inner(n):  # mutate a nested scope
            return Access(mutate(n.source, rnd, rnd.randrange(MUTATIONS - 1)), n.indices)

        return Scope(trav, summ, _rewrite_one(body, _is_scope_read, inner, rnd))
    return Scope(trav, summ, BinOp("*", body, Const(2.0)))


def _is_scope_read(n) -> bool:
    return isinstance(n, Access) and isinstance(n.source, Scope)


def _is_access(n) -> bool:
    return isinstance(n, Access)


def _is_noncommutative(n) -> bool:
    return isinstance(n, BinOp) and n.op in "-/"


def _rewrite_one(body, pred, fn, rnd: random.Random):
    """Replace one random node satisfying ``pred`` (not inside nested scopes) by ``fn(node)``."""
    count = [0]

    def walk(n, target=None):
        if pred(n):
            if target is not None and count[0] == target:
                count[0] += 1
                return fn(n)
            count[0] += 1
        if isinstance(n, Neg):
            return neg(walk(n.x, target))
        if isinstance(n, Call):
            return Call(n.fn, tuple(walk(a, target) for a in n.args))
        if isinstance(n, BinOp):
            return BinOp(n.op, walk(n.lhs, target), walk(n.rhs, target))
        return n

    walk(body)
    if count[0] == 0:
        return body
    target, count[0] = rnd.randrange(count[0]), 0
    return walk(body, target)


def _subst(n, mapping):
    if isinstance(n, Access):
        return Access(n.source, tuple(i.subst(mapping) for i in n.indices))
    if isinstance(n, Neg):
        return neg(_subst(n.x, mapping))
    if isinstance(n, Call):
        return Call(n.fn, tuple(_subst(a, mapping) for a in n.args))
    if isinstance(n, BinOp):
        return BinOp(n.op, _subst(n.lhs, mapping), _subst(n.rhs, mapping))
    return n


# --------------------------------------------------------------------- reference evaluation
def _interpret(e: Expr, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """ollie.interpret when available, else a small float64 brute-force evaluator."""
    try:
        from ollie.semantics import interpret

        return np.asarray(interpret(e, inputs), dtype=np.float64)
    except NotImplementedError:
        return _eval_scope(e.root, inputs)


def _eval_scope(scope: Scope, inputs: dict[str, np.ndarray]) -> np.ndarray:
    its = scope.iters
    grids = np.meshgrid(*[np.arange(it.lo, it.hi) for it in its], indexing="ij")
    env = {it.name: g for it, g in zip(its, grids, strict=True)}
    val = np.broadcast_to(_eval_node(scope.body, env, inputs), grids[0].shape)
    return val.sum(axis=tuple(range(len(scope.traversal), len(its))))


def _eval_node(n, env, inputs):
    if isinstance(n, Const):
        return np.float64(n.value)
    if isinstance(n, Access):
        if isinstance(n.source, Scope):
            data = _eval_scope(n.source, inputs)
            los = [it.lo for it in n.source.traversal]
        else:
            data, los = inputs[n.source], [0] * inputs[n.source].ndim
        idx = [np.asarray(i.evaluate(env)) - lo for i, lo in zip(n.indices, los, strict=True)]
        ok = np.ones(np.broadcast(*idx).shape, dtype=bool)
        for k, i in enumerate(idx):
            ok &= (i >= 0) & (i < data.shape[k])
        safe = [np.where(ok, i, 0) for i in idx]
        return np.where(ok, data[tuple(safe)], 0.0)
    if isinstance(n, Neg):
        return -_eval_node(n.x, env, inputs)
    if isinstance(n, Call):
        args = [_eval_node(a, env, inputs) for a in n.args]
        fns = {"relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "abs": np.abs,
               "exp": np.exp, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "max": np.maximum,
               "min": np.minimum, "log": np.log, "sqrt": np.sqrt}
        return fns[n.fn](*args)
    a, b = _eval_node(n.lhs, env, inputs), _eval_node(n.rhs, env, inputs)
    return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[n.op](a, b)


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s) for n, s in SHAPES.items()}


def _same_values(x: Expr, y: Expr, seed: int) -> bool:
    if x.shape != y.shape:
        return False
    inputs = _inputs(seed)
    return bool(np.allclose(_interpret(x, inputs), _interpret(y, inputs), rtol=1e-4, atol=1e-4))


@settings(max_examples=200)
@given(random_exprs(), st.integers(0, 2**32 - 1))
def test_property_exactness(e: Expr, seed: int) -> None:
    """Equal canonical forms imply equal values: for equivalent rewrites (which must also
    have equal forms) and for mutations (whose forms may be equal only when the values are)."""
    rnd = random.Random(seed)
    t = Expr(e.decls, transform(e.root, rnd))
    assert _same_values(e, t, seed)
    for choice in range(MUTATIONS):
        m = Expr(e.decls, mutate(e.root, rnd, choice))
        if canonical_form(m) == canonical_form(e):
            assert _same_values(e, m, seed), (str(e), str(m))
        if m.shape != e.shape:
            assert canonical_form(m) != canonical_form(e)


@settings(max_examples=60)
@given(random_exprs(), random_exprs())
def test_property_pairs_equal_forms_mean_equal_values(a: Expr, b: Expr) -> None:
    if canonical_form(a) == canonical_form(b):
        assert _same_values(a, b, 0)


# --------------------------------------------------------------------- many summation iterators
def test_large_summation_groups_stay_exact() -> None:
    """Past the enumeration cap ties keep written order: still exact, never a false equal."""
    sums = ", ".join(f"s{k}=0:2" for k in range(8))
    prod = " * ".join(f"B[s{k}]" for k in range(8))
    a = parse(f"B: [2]\nL<i=0:1> Sum<{sums}> {prod}")
    rev = ", ".join(f"s{k}=0:2" for k in reversed(range(8)))
    b = parse(f"B: [2]\nL<i=0:1> Sum<{rev}> {prod}")
    assert canonical_form(a) == canonical_form(b)
    assert len(canonical_form(a)) < 200


def test_signature_refinement_keeps_roles() -> None:
    """8 equal-range summation iterators (8! orders): signatures split them into classes."""
    sums = ", ".join(f"s{k}=0:2" for k in range(8))
    chain = " * ".join(f"A[s{k}, s{k + 1}]" for k in range(7))
    a = parse(f"A: [2, 2]\nL<i=0:1> Sum<{sums}> {chain}")
    perm = [3, 6, 0, 7, 1, 5, 2, 4]  # rename s_k -> x_perm[k], declare in another order
    chain_b = " * ".join(f"A[x{perm[k]}, x{perm[k + 1]}]" for k in reversed(range(7)))
    sums_b = ", ".join(f"x{k}=0:2" for k in range(8))
    b = parse(f"A: [2, 2]\nL<i=0:1> Sum<{sums_b}> {chain_b}")
    assert canonical_form(a) == canonical_form(b)
    chain_c = chain.replace("A[s6, s7]", "A[s7, s6]")
    c = parse(f"A: [2, 2]\nL<i=0:1> Sum<{sums}> {chain_c}")
    assert canonical_form(a) != canonical_form(c)
