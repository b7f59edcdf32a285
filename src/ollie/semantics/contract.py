"""Contraction of labelled operands: the sum over shared axes of their product.

``contract(ops, labels, out)`` is ``np.einsum`` with integer axis labels: every operand's axes
are labelled (each label once per operand), and the result keeps the axes ``out`` in that order,
summing over every other label. Two operands go through :func:`np.matmul` (batch axes shared
by both and kept, contracted axes shared and summed, the rest kept on one side), which reaches
BLAS for convolution- and matmul-like products and stays fast for batched ones (G2BMM). More
operands follow the pairwise order of ``np.einsum_path`` (greedy, with an intermediate size
limit); when that limit forbids every pairwise step the remaining operands go to ``np.einsum``
in one call, which makes no intermediate. Beyond :data:`MAX_OPERANDS` operands (numpy's einsum
takes fewer than 64), operands over the same labels are multiplied element-wise first, then the
pair with the smallest result is contracted until few enough remain.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import numpy as np

from ollie.errors import UnsupportedError
from ollie.semantics.grid import MAX_ELEMENTS

Labels = Sequence[int]

MAX_OPERANDS = 32
"""Most operands contracted in one step (through ``np.einsum_path`` and ``np.einsum``)."""


def contract(ops: Sequence[np.ndarray], labels: Sequence[Labels], out: Labels,
             memory_limit: int = MAX_ELEMENTS) -> np.ndarray:
    """Sum over all labels not in ``out`` of the product of ``ops``; axes ordered as ``out``."""
    if len(ops) == 1:
        return _reduce(ops[0], list(labels[0]), list(out))
    if len(ops) == 2:
        return _pair(ops[0], list(labels[0]), ops[1], list(labels[1]), list(out))
    if len(ops) > MAX_OPERANDS:
        ops, labels = _fold(ops, labels, out, memory_limit)
        if len(ops) <= 2:
            return contract(ops, labels, out, memory_limit)
    path, _ = np.einsum_path(_subscripts(labels, out), *ops,
                             optimize=("greedy", memory_limit))
    items = [(op, list(lab)) for op, lab in zip(ops, labels, strict=True)]
    for step in path[1:]:
        picked = [items[i] for i in step]
        for i in sorted(step, reverse=True):
            del items[i]
        needed = set(out).union(*(lab for _, lab in items))
        step_out = sorted({x for _, lab in picked for x in lab} & needed)
        if len(picked) <= 2:
            res = contract([p for p, _ in picked], [lab for _, lab in picked], step_out)
        else:
            subs = _subscripts([lab for _, lab in picked], step_out)
            res = np.einsum(subs, *(p for p, _ in picked), optimize=False)
        items.append((res, step_out))
    (res, lab), = items
    return _reduce(res, lab, list(out))


def _fold(ops: Sequence[np.ndarray], labels: Sequence[Labels], out: Labels,
          memory_limit: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """At most :data:`MAX_OPERANDS` operands with the same contraction as ``ops``."""
    same: dict[tuple[int, ...], np.ndarray] = {}
    for op, lab in zip(ops, labels, strict=True):
        key = tuple(lab)
        same[key] = op if key not in same else same[key] * op
    items = [(op, list(lab)) for lab, op in same.items()]
    while len(items) > MAX_OPERANDS:
        size: dict[int, int] = {}
        for op, lab in items:
            size.update(zip(lab, op.shape, strict=True))
        pairs = [(i, j) for i in range(len(items)) for j in range(i + 1, len(items))]
        i, j = min(pairs, key=lambda p: math.prod(
            size[x] for x in set(items[p[0]][1]) | set(items[p[1]][1])))
        (a, la), (b, lb) = items[i], items[j]
        del items[j], items[i]
        needed = set(out).union(*(lab for _, lab in items))
        step_out = sorted((set(la) | set(lb)) & needed)
        items.append((contract([a, b], [la, lb], step_out, memory_limit), step_out))
    return [op for op, _ in items], [lab for _, lab in items]


def _subscripts(labels: Sequence[Labels], out: Labels) -> str:
    letters = string.ascii_letters
    if any(x >= len(letters) for lab in labels for x in lab):
        raise UnsupportedError(f"more than {len(letters)} iterators in one product")
    text = ",".join("".join(letters[x] for x in lab) for lab in labels)
    return text + "->" + "".join(letters[x] for x in out)


def _reduce(a: np.ndarray, la: list[int], out: list[int]) -> np.ndarray:
    """Sum ``a`` over labels not in ``out`` and order the rest as ``out``."""
    summed = tuple(i for i, x in enumerate(la) if x not in out)
    if summed:
        a = a.sum(axis=summed)
        la = [x for x in la if x in out]
    return a.transpose([la.index(x) for x in out])


def _pair(a: np.ndarray, la: list[int], b: np.ndarray, lb: list[int],
          out: list[int]) -> np.ndarray:
    # sum first over labels that only one side has and the result drops
    a_only = [x for x in la if x not in lb and x not in out]
    if a_only:
        a = _reduce(a, la, [x for x in la if x not in a_only])
        la = [x for x in la if x not in a_only]
    b_only = [x for x in lb if x not in la and x not in out]
    if b_only:
        b = _reduce(b, lb, [x for x in lb if x not in b_only])
        lb = [x for x in lb if x not in b_only]
    batch = [x for x in la if x in lb and x in out]
    summed = [x for x in la if x in lb and x not in out]
    keep_a = [x for x in la if x not in lb]
    keep_b = [x for x in lb if x not in la]
    if not summed:
        return np.einsum(_subscripts([la, lb], out), a, b)
    size_a = dict(zip(la, a.shape, strict=True))
    size_b = dict(zip(lb, b.shape, strict=True))
    bshape = [size_a[x] for x in batch]
    m = math.prod(size_a[x] for x in keep_a)
    k = math.prod(size_a[x] for x in summed)
    n = math.prod(size_b[x] for x in keep_b)
    at = a.transpose([la.index(x) for x in batch + keep_a + summed]).reshape([*bshape, m, k])
    bt = b.transpose([lb.index(x) for x in batch + summed + keep_b]).reshape([*bshape, k, n])
    res = np.matmul(at, bt).reshape(
        bshape + [size_a[x] for x in keep_a] + [size_b[x] for x in keep_b])
    lab = batch + keep_a + keep_b
    return res.transpose([lab.index(x) for x in out])
