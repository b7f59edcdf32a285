"""A brute-force evaluator: pure Python loops over every point, straight from EXPR_SYNTAX.md
and the structural zeros of :mod:`ollie.semantics.interpreter` (a read outside its source
annihilates the products and quotients it is a factor or numerator of).

Far too slow for real sizes; it exists as an independent second reading of the semantics,
to test the vectorised interpreter (and rules, on tiny expressions) against.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np

from ollie.ir import Access, BinOp, Call, Const, Expr, Neg, Node, Scope

_FUNCS = {
    "relu": lambda x: max(x, 0.0), "tanh": math.tanh, "abs": abs,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)), "exp": math.exp,
    "log": lambda x: math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan),
    "sqrt": lambda x: math.sqrt(x) if x >= 0 else math.nan,
    "max": max, "min": min,
}


def brute_force(expr: Expr, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Evaluate ``expr`` point by point (float64 arithmetic, float32 result)."""
    tensors = {n: np.asarray(inputs[n], dtype=np.float64) for n, _ in expr.decls}
    return _scope(expr.root, tensors, {}).astype(np.float32)


def _scope(scope: Scope, tensors, cache) -> np.ndarray:
    key = id(scope)
    if key in cache:
        return cache[key][1]
    out = np.zeros(scope.shape, dtype=np.float64)
    for point in itertools.product(*(range(it.lo, it.hi) for it in scope.traversal)):
        env = {it.name: v for it, v in zip(scope.traversal, point, strict=True)}
        total = 0.0
        for spoint in itertools.product(*(range(it.lo, it.hi) for it in scope.summation)):
            env.update({it.name: v for it, v in zip(scope.summation, spoint, strict=True)})
            total += _eval(scope.body, env, tensors, cache)
        pos = tuple(v - it.lo for v, it in zip(point, scope.traversal, strict=True))
        out[pos] = total
    cache[key] = (scope, out)
    return out


def _eval(node: Node, env, tensors, cache) -> float:
    return _eval_z(node, env, tensors, cache)[0]


def _eval_z(node: Node, env, tensors, cache) -> tuple[float, bool]:
    """Value and whether it is a structural zero (a read outside its source, a product with
    such a factor or a quotient with such a numerator, a negation of one, a sum of two)."""
    if isinstance(node, Const):
        return node.value, False
    if isinstance(node, Access):
        idx = [int(i.evaluate(env)) for i in node.indices]
        if isinstance(node.source, Scope):
            arr = _scope(node.source, tensors, cache)
            idx = [v - it.lo for v, it in zip(idx, node.source.traversal, strict=True)]
        else:
            arr = tensors[node.source]
        if all(0 <= v < d for v, d in zip(idx, arr.shape, strict=True)):
            return float(arr[tuple(idx)]), False
        return 0.0, True
    if isinstance(node, Neg):
        v, z = _eval_z(node.x, env, tensors, cache)
        return -v, z
    if isinstance(node, BinOp):
        a, za = _eval_z(node.lhs, env, tensors, cache)
        b, zb = _eval_z(node.rhs, env, tensors, cache)
        if node.op == "+":
            return a + b, za and zb
        if node.op == "-":
            return a - b, za and zb
        if node.op == "*":
            return (0.0, True) if za or zb else (a * b, False)
        if za:
            return 0.0, True
        return (a / b if b != 0 else (math.copysign(math.inf, a) if a != 0 else math.nan)), False
    assert isinstance(node, Call)
    return _FUNCS[node.fn](*(_eval_z(a, env, tensors, cache)[0] for a in node.args)), False
