"""Shared pieces of the operator lowerings: the :class:`Lowered` result, input and attribute
checks, and small builders of iterators, reads and scopes.

Every lowering takes ``inputs`` (a sequence of ``(name, shape)`` pairs, in the operator's input
order) plus keyword attributes and returns a :class:`Lowered`. Errors follow one convention:

* a wrong number of inputs, a wrong rank or incompatible shapes -> :class:`ShapeError`
  naming the operator, the input and the shapes;
* an attribute value or combination the lowering does not handle -> :class:`UnsupportedError`
  naming the operator and the attribute.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ollie.errors import ShapeError, UnsupportedError
from ollie.ir import Access, Expr, Iter, Node, Scope, as_affine, make_expr, var, verify
from ollie.ir.index import IndexLike
from ollie.ir.nodes import FUNC_ARITY

Shape = tuple[int, ...]
Input = tuple[str, Shape]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = frozenset({"L", "Sum", *FUNC_ARITY})


@dataclass(frozen=True, eq=False)
class Lowered:
    """The expression of one operator.

    ``expr`` declares exactly the operator's named inputs (each once) plus the constant
    tensors in ``consts``; evaluate it with ``interpret(expr, {**inputs, **consts})``.
    """

    expr: Expr
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    output_shape: Shape = ()


# --------------------------------------------------------------------- inputs
def normalize_inputs(op: str, inputs: Sequence[Input]) -> list[Input]:
    """Check names and shapes of ``inputs``; shapes become tuples of Python ints."""
    out: list[Input] = []
    seen: dict[str, Shape] = {}
    for item in inputs:
        try:
            name, shape = item
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ShapeError(f"{op}: input {item!r} is not a (name, shape) pair") from None
        if not isinstance(name, str) or not _NAME.match(name) or name in _RESERVED:
            raise ShapeError(f"{op}: input name {name!r} is not a valid tensor name")
        if not dims:
            raise ShapeError(f"{op}: input '{name}' has rank 0; rank-0 tensors are not "
                             "supported (use shape (1,))")
        if any(d <= 0 for d in dims):
            raise ShapeError(f"{op}: input '{name}' has a non-positive dimension in "
                             f"{list(dims)}")
        if seen.setdefault(name, dims) != dims:
            raise ShapeError(f"{op}: input '{name}' is given twice with different shapes "
                             f"{list(seen[name])} and {list(dims)}")
        out.append((name, dims))
    return out


def take_inputs(op: str, inputs: Sequence[Input], required: Sequence[str],
                optional: Sequence[str] = ()) -> list[Input | None]:
    """Split ``inputs`` into the required ones and the optional ones (None when absent)."""
    n_min, n_max = len(required), len(required) + len(optional)
    if not n_min <= len(inputs) <= n_max:
        want = str(n_min) if n_min == n_max else f"{n_min} to {n_max}"
        roles = ", ".join([*required, *(f"[{o}]" for o in optional)])
        raise ShapeError(f"{op}: expected {want} input(s) ({roles}), got {len(inputs)}")
    got: list[Input | None] = list(inputs)
    return got + [None] * (n_max - len(got))


def check_rank(op: str, role: str, inp: Input, rank: int | Iterable[int]) -> Shape:
    """The shape of ``inp`` after checking its rank (one value or a set of allowed ranks)."""
    name, shape = inp
    ranks = {rank} if isinstance(rank, int) else set(rank)
    if len(shape) not in ranks:
        want = " or ".join(str(r) for r in sorted(ranks))
        raise ShapeError(f"{op}: input {role} '{name}' must have rank {want}, got shape "
                         f"{list(shape)}")
    return shape


def shape_error(op: str, message: str, **shapes: Input | Shape) -> ShapeError:
    """A ShapeError naming the operator and listing the inputs (role, name and shape) or
    plain shapes involved."""
    parts = []
    for role, v in shapes.items():
        if len(v) == 2 and isinstance(v[0], str):
            parts.append(f"{role} '{v[0]}' {list(v[1])}")  # type: ignore[arg-type]
        else:
            parts.append(f"{role} {list(v)}")
    listed = ", ".join(parts)
    return ShapeError(f"{op}: {message}" + (f" (shapes: {listed})" if listed else ""))


# --------------------------------------------------------------------- attributes
def int_tuple(op: str, attr: str, value: object, n: int, *, minimum: int = 1,
              allowed_lengths: Sequence[int] | None = None) -> tuple[int, ...]:
    """Normalise an int or a sequence of ints to a tuple; an int is repeated ``n`` times.

    ``allowed_lengths`` lists the accepted sequence lengths (default: just ``n``).
    """
    lengths = tuple(allowed_lengths) if allowed_lengths is not None else (n,)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        vals: tuple[int, ...] = (int(value),) * n
    else:
        try:
            vals = tuple(int(v) for v in value)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise UnsupportedError(f"{op}: attribute '{attr}' must be an int or a sequence of "
                                   f"ints, got {value!r}") from None
        if len(vals) not in lengths:
            raise UnsupportedError(f"{op}: attribute '{attr}' must have "
                                   f"{' or '.join(map(str, lengths))} value(s), got {value!r}")
    if any(v < minimum for v in vals):
        raise UnsupportedError(f"{op}: attribute '{attr}' values must be >= {minimum}, "
                               f"got {value!r}")
    return vals


def padding4(op: str, value: object, attr: str = "padding") -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, (ph, pw) or (top, left, bottom, right)."""
    vals = int_tuple(op, attr, value, 2, minimum=0, allowed_lengths=(2, 4))
    if len(vals) == 2:
        return (vals[0], vals[1], vals[0], vals[1])
    return (vals[0], vals[1], vals[2], vals[3])


def axis_index(op: str, attr: str, axis: object, rank: int, *, inclusive: bool = False) -> int:
    """Normalise a possibly negative axis (``-1`` is the last dimension); ``inclusive``
    allows ``axis == rank`` (ONNX Flatten's range ``[-rank, rank]``)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise UnsupportedError(f"{op}: attribute '{attr}' must be an int, got {axis!r}")
    top = rank + 1 if inclusive else rank
    a = int(axis) + (rank if axis < 0 else 0)
    if not 0 <= a < top:
        raise UnsupportedError(f"{op}: attribute '{attr}'={axis} out of range for rank {rank}")
    return a


# --------------------------------------------------------------------- builders
def iters(names: Sequence[str], shape: Sequence[int]) -> tuple[Iter, ...]:
    """Iterators ``name=0:size``."""
    return tuple(Iter(n, 0, int(s)) for n, s in zip(names, shape, strict=True))


def generic_names(rank: int, prefix: str = "i") -> tuple[str, ...]:
    """``i0, i1, ...`` for rank-generic operators; NCHW-like ranks get conventional names."""
    if prefix == "i" and rank == 4:
        return ("n", "c", "h", "w")
    return tuple(f"{prefix}{k}" for k in range(rank))


def read(source: str | Scope, indices: Iterable[IndexLike]) -> Access:
    """A read of tensor (or scope) ``source`` at ``indices``."""
    return Access(source, tuple(as_affine(i) for i in indices))


def read_scope(scope: Scope, it: Sequence[Iter]) -> Access:
    """Read a nested scope at the values of iterators ``it`` (one per traversal dimension)."""
    return read(scope, (var(i.name) for i in it))


def scope(traversal: Sequence[Iter], summation: Sequence[Iter], body: Node) -> Scope:
    return Scope(tuple(traversal), tuple(summation), body)


def broadcast_shapes(op: str, shapes: Mapping[str, Input | Shape]) -> Shape:
    """Numpy broadcasting of several shapes (plain or of ``(name, shape)`` inputs); ShapeError
    naming them when incompatible."""
    plain = [v[1] if len(v) == 2 and isinstance(v[0], str) else v for v in shapes.values()]
    rank = max(len(s) for s in plain)
    out = [1] * rank
    for s in plain:
        for k, d in enumerate(s):
            pos = rank - len(s) + k
            if d != 1:
                if out[pos] not in (1, d):
                    raise shape_error(op, "shapes do not broadcast", **shapes)
                out[pos] = d
    return tuple(out)


def broadcast_indices(shape: Shape, out_idx: Sequence[IndexLike]) -> tuple[IndexLike, ...]:
    """Indices reading an input of ``shape`` broadcast to the (right-aligned) output
    positions ``out_idx``: dimensions of size 1 read index 0."""
    lead = len(out_idx) - len(shape)
    return tuple(0 if d == 1 else out_idx[lead + k] for k, d in enumerate(shape))


def unique_name(base: str, taken: Iterable[str]) -> str:
    """``base`` or ``base_1``, ``base_2``, ... whichever is not in ``taken``."""
    used = set(taken)
    if base not in used:
        return base
    k = 1
    while f"{base}_{k}" in used:
        k += 1
    return f"{base}_{k}"


def finish(op: str, inputs: Sequence[Input | None], root: Scope,
           consts: Mapping[str, np.ndarray] | None = None) -> Lowered:
    """Declare the (distinct) inputs and the constants, verify, and wrap up."""
    decls: dict[str, Shape] = {}
    for inp in inputs:
        if inp is None:
            continue
        name, shape = inp
        if name in decls and decls[name] != shape:
            raise ShapeError(f"{op}: input '{name}' is given twice with different shapes "
                             f"{list(decls[name])} and {list(shape)}")
        decls[name] = shape
    const_arrays: dict[str, np.ndarray] = {}
    for name, arr in (consts or {}).items():
        if name in decls:
            raise ShapeError(f"{op}: constant '{name}' clashes with an input name")
        a = np.ascontiguousarray(arr, dtype=np.float32)
        decls[name] = tuple(int(d) for d in a.shape)
        const_arrays[name] = a
    expr = verify(make_expr(decls, root))
    return Lowered(expr, const_arrays, root.shape)
