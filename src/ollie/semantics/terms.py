"""Normalisation of a scope body into a sum of terms, and element-wise evaluation.

``Sum<y> (t1 + t2 + ...)`` is ``Sum<y> t1 + Sum<y> t2 + ...``, so the interpreter evaluates a
body term by term. A :class:`Term` is ``coef * f1 * f2 * ...`` where each :class:`Factor` is a
read (``Access``) or any other sub-expression evaluated element-wise over the iterators it uses
(a function call, a sum kept whole, a divisor as ``1 / x``). A term whose factors are all reads
is multilinear; the interpreter contracts the factors of any term with one einsum-like
contraction, so element-wise factors only cost a dense evaluation over their own iterators.

Normalisation distributes ``+`` and ``-`` over products, pulls ``Neg`` and constant factors into
``coef`` and turns ``x / c`` for a constant ``c != 0`` into ``x * (1/c)``. A side of a product
that is a sum whose terms all use the same iterators stays one element-wise factor (no blow-up,
same cost); distribution stops at :data:`MAX_TERMS` terms.

:func:`eval_node` evaluates a node element-wise with plain arithmetic (the fast path);
:func:`eval_written` evaluates it as written with structural zeros (a read outside its source
annihilates the products and quotients it is a factor or numerator of: the semantics of
:mod:`ollie.semantics.interpreter`), which the interpreter uses where plain evaluation gave a
non-finite result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ollie.ir.nodes import Access, BinOp, Call, Const, Neg, Node, accesses

MAX_TERMS = 16


@dataclass(frozen=True)
class Factor:
    """A read or an element-wise sub-expression (``1 / node`` when ``inverse``)."""

    node: Node
    inverse: bool = False
    iters: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        names: frozenset[str] = frozenset()
        for acc in accesses(self.node):
            for idx in acc.indices:
                names |= idx.vars()
        object.__setattr__(self, "iters", names)


@dataclass(frozen=True)
class Term:
    """``coef`` times the product of ``factors`` (an empty product is 1)."""

    coef: float
    factors: tuple[Factor, ...]

    @property
    def iters(self) -> frozenset[str]:
        return frozenset().union(*(f.iters for f in self.factors))


def expand(node: Node) -> list[Term]:
    """The body ``node`` as a list of terms whose sum equals it.

    The sum is equal up to float64 rounding for finite values. With inf or NaN, distributing a
    product over a sum (``(2 - 1) * inf`` is inf, ``2*inf - 1*inf`` is NaN) or factoring a
    constant out of a sum can differ from the body as written; the interpreter re-evaluates the
    body as written wherever its result is not finite.
    """
    if isinstance(node, Const):
        return [Term(float(node.value), ())]
    if isinstance(node, Access | Call):
        return [Term(1.0, (Factor(node),))]
    if isinstance(node, Neg):
        return [Term(-t.coef, t.factors) for t in expand(node.x)]
    assert isinstance(node, BinOp), node
    if node.op == "+":
        return expand(node.lhs) + expand(node.rhs)
    if node.op == "-":
        return expand(node.lhs) + [Term(-t.coef, t.factors) for t in expand(node.rhs)]
    lhs = expand(node.lhs)
    if node.op == "*":
        return _product(node.lhs, lhs, node.rhs, expand(node.rhs))
    rhs = expand(node.rhs)
    if len(rhs) == 1 and not rhs[0].factors and rhs[0].coef != 0.0:
        scale = 1.0 / rhs[0].coef
        return [Term(t.coef * scale, t.factors) for t in lhs]
    return _product(node.lhs, lhs, node.rhs, [Term(1.0, (Factor(node.rhs, inverse=True),))])


def _product(lnode: Node, lhs: list[Term], rnode: Node, rhs: list[Term]) -> list[Term]:
    if len(lhs) > 1 and len({t.iters for t in lhs}) == 1:
        lhs = _whole(lnode, lhs)
    if len(rhs) > 1 and len({t.iters for t in rhs}) == 1:
        rhs = _whole(rnode, rhs)
    if len(lhs) * len(rhs) > MAX_TERMS:
        lhs, rhs = _whole(lnode, lhs), _whole(rnode, rhs)
    return [Term(a.coef * b.coef, a.factors + b.factors) for a in lhs for b in rhs]


def _whole(node: Node, terms: list[Term]) -> list[Term]:
    return [Term(1.0, (Factor(node),))] if len(terms) > 1 else terms


# --------------------------------------------------------------------- element-wise evaluation
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


FUNCS: dict[str, Callable] = {
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "max": np.maximum,
    "min": np.minimum,
}

_BINOPS: dict[str, Callable] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
}


def eval_node(node: Node, read: Callable[[Access], np.ndarray]):
    """Element-wise float64 value of ``node``; reads go through ``read`` (broadcast form).

    Call under ``np.errstate(all="ignore")``: log/sqrt of negatives give NaN, as in numpy.
    """
    if isinstance(node, Const):
        return np.float64(node.value)
    if isinstance(node, Access):
        return read(node)
    if isinstance(node, Neg):
        return np.negative(eval_node(node.x, read))
    if isinstance(node, BinOp):
        return _BINOPS[node.op](eval_node(node.lhs, read), eval_node(node.rhs, read))
    assert isinstance(node, Call), node
    return FUNCS[node.fn](*(eval_node(a, read) for a in node.args))


InRange = np.ndarray | bool
"""Where a value is not a structural zero: True (everywhere), False (nowhere) or a boolean
array in broadcast form."""


def eval_written(node: Node, read: Callable[[Access], tuple[np.ndarray, InRange | None]]):
    """Element-wise float64 value of ``node`` as written, with structural zeros.

    ``read`` gives a read's values and where it lies inside its source (None: everywhere).
    A read outside its source is a *structural zero*, and so are a product with a structural
    zero factor, a quotient with a structural zero numerator, the negation of one and the sum
    or difference of two; a product or quotient that is a structural zero is exactly ``+0``
    whatever its other operand (NaN and infinities included). Functions of any value, and
    literals, are ordinary values. Call under ``np.errstate(all="ignore")``.
    """
    return _written(node, read)[0]


def _written(node: Node, read) -> tuple[np.ndarray, InRange]:
    if isinstance(node, Const):
        return np.float64(node.value), True
    if isinstance(node, Access):
        value, inside = read(node)
        return value, True if inside is None else inside
    if isinstance(node, Neg):
        value, ok = _written(node.x, read)
        return np.negative(value), ok
    if isinstance(node, Call):
        return FUNCS[node.fn](*(_written(a, read)[0] for a in node.args)), True
    assert isinstance(node, BinOp), node
    a, oka = _written(node.lhs, read)
    b, okb = _written(node.rhs, read)
    value = _BINOPS[node.op](a, b)
    if node.op in "+-":
        return value, _any(oka, okb)
    ok = _all(oka, okb) if node.op == "*" else oka
    if ok is not True:
        value = np.where(ok, value, 0.0)
    return value, ok


def _any(a: InRange, b: InRange) -> InRange:
    if a is True or b is True:
        return True
    if a is False:
        return b
    return a if b is False else np.logical_or(a, b)


def _all(a: InRange, b: InRange) -> InRange:
    if a is False or b is False:
        return False
    if a is True:
        return b
    return a if b is True else np.logical_and(a, b)


def eval_factor(factor: Factor, read: Callable[[Access], np.ndarray]):
    """Value of a factor (broadcast form, or a numpy scalar when it uses no iterator)."""
    value = eval_node(factor.node, read)
    return np.true_divide(1.0, value) if factor.inverse else value
