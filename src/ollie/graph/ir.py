"""The graph IR: :class:`Node` and :class:`Graph`.

A graph is a list of nodes in topological order over named tensors. Tensor names are valid
expression identifiers (``[A-Za-z_][A-Za-z0-9_]*``, not a keyword or function name of the
expression language), so a node's inputs can be passed to ``ollie.lower.lower`` unchanged;
the frontends rename (:func:`sanitize`) and keep the original names of the graph inputs and
outputs in ``Graph.original_names``.

``Node.op`` is a key of ``ollie.lower.LOWERINGS`` or ``"Opaque"``. The attributes of a lowerable
node are exactly the keyword attributes of its lowering, except ``BatchNorm`` whose statistics
are inputs (``X, gamma, beta, mean, var``, initializers) and become attributes in
:meth:`Graph.lower_node`. Opaque nodes carry what is needed to run them (see
:mod:`ollie.graph.opaque`) and ``output_shapes``.

Shapes: :meth:`Graph.infer_shapes` fills ``Graph.shapes`` / ``Graph.dtypes`` by running every
node of the reference executor on meta tensors (opaque nodes use their ``output_shapes``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ollie.errors import OllieError, ShapeError, UnsupportedError
from ollie.ir.nodes import FUNC_ARITY, rename_expr
from ollie.lower import LOWERINGS, OPAQUE_OPS, Lowered, lower

Shape = tuple[int, ...]
OPAQUE = "Opaque"
COMPUTE_OPS = ("Conv2d", "ConvTranspose2d", "MatMul", "Gemm", "BatchMatMul", "G2BMM", "GBMM")
"""Operators that are compute operators (the subprograms the optimizer derives)."""
RESERVED_NAMES = frozenset({"L", "Sum", *FUNC_ARITY})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class GraphError(OllieError):
    """A malformed graph (undefined tensor, duplicate definition, unknown operator)."""


def prefixed(e: OllieError, prefix: str) -> OllieError:
    """``e`` again (same class when possible) with ``prefix: `` in front of its message."""
    msg = f"{prefix}: {e}"
    try:
        return type(e)(msg)
    except TypeError:
        return OllieError(msg)


def sanitize(name: str, taken: set[str]) -> str:
    """A valid, unused tensor name derived from ``name`` (added to ``taken``)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "t"
    if not _NAME.match(base):
        base = f"t_{base}"
    cand = base
    k = 1
    while cand in taken or cand in RESERVED_NAMES:
        cand = f"{base}_{k}"
        k += 1
    taken.add(cand)
    return cand


@dataclass(eq=False)
class Node:
    """One operator application: ``outputs = op(inputs, **attrs)``."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        self.inputs = tuple(self.inputs)
        self.outputs = tuple(self.outputs)
        if not self.name:
            self.name = self.outputs[0] if self.outputs else self.op

    @property
    def opaque(self) -> bool:
        """True for ``Opaque`` nodes and for kinds the lowering keeps opaque (``OPAQUE_OPS``)."""
        return self.op == OPAQUE or self.op in OPAQUE_OPS

    def describe(self) -> str:
        kind = self.attrs.get("op_type", "") if self.op == OPAQUE else ""
        return f"{self.op}{f'[{kind}]' if kind else ''} '{self.name}'"

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.attrs.items() if k in _SHOWN or self.op != OPAQUE}
        return (f"Node({self.op}, {list(self.inputs)} -> {list(self.outputs)}"
                f"{', ' + repr(shown) if shown else ''})")


_SHOWN = ("op_type", "target", "output_shapes")


@dataclass(eq=False)
class Graph:
    """A dataflow graph of operators (see the module docstring)."""

    inputs: list[tuple[str, Shape]]
    outputs: list[str]
    nodes: list[Node]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "graph"
    original_names: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------- structure
    @property
    def input_names(self) -> list[str]:
        return [n for n, _ in self.inputs]

    def producers(self) -> dict[str, Node]:
        """Tensor name -> the node that produces it."""
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """Tensor name -> the nodes that read it (in order)."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                out.setdefault(i, []).append(n)
        return out

    def op_counts(self) -> dict[str, int]:
        """Number of nodes per operator (opaque nodes as ``Opaque[op_type]``)."""
        c = Counter(n.describe().split(" ")[0] for n in self.nodes)
        return dict(sorted(c.items()))

    def validate(self) -> Graph:
        """Check names, definitions before use, known operators; GraphError otherwise."""
        defined: set[str] = set()
        for name, shape in self.inputs:
            self._define(name, defined, "graph input")
            if any(int(d) < 0 for d in shape):
                raise GraphError(f"graph '{self.name}': input '{name}' has shape {list(shape)}")
        for name in self.initializers:
            self._define(name, defined, "initializer")
        for node in self.nodes:
            if node.op != OPAQUE and node.op not in LOWERINGS:
                raise GraphError(f"graph '{self.name}': node '{node.name}' has unknown operator "
                                 f"'{node.op}'")
            for i in node.inputs:
                if i not in defined:
                    raise GraphError(f"graph '{self.name}': node {node.describe()} reads "
                                     f"undefined tensor '{i}'")
            for o in node.outputs:
                self._define(o, defined, f"output of node {node.describe()}")
        for o in self.outputs:
            if o not in defined:
                raise GraphError(f"graph '{self.name}': output '{o}' is not defined")
        return self

    def _define(self, name: str, defined: set[str], what: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED_NAMES:
            raise GraphError(f"graph '{self.name}': {what} has an invalid name {name!r}")
        if name in defined:
            raise GraphError(f"graph '{self.name}': tensor '{name}' ({what}) is defined twice")
        defined.add(name)

    # ----------------------------------------------------------------- shapes
    def infer_shapes(self) -> Graph:
        """Validate and fill ``shapes`` / ``dtypes`` for every tensor; returns ``self``."""
        from ollie.graph.execute import infer_shapes

        self.validate()
        self.shapes, self.dtypes = infer_shapes(self)
        return self

    def shape(self, name: str) -> Shape:
        if not self.shapes:
            self.infer_shapes()
        try:
            return self.shapes[name]
        except KeyError:
            raise GraphError(f"graph '{self.name}': no tensor named '{name}'") from None

    # ----------------------------------------------------------------- lowering
    def lower_node(self, node: Node) -> Lowered:
        """``ollie.lower.lower`` of ``node`` with its input shapes; BatchNorm statistics come
        from the initializers. Opaque nodes raise :class:`UnsupportedError`."""
        if node.op == OPAQUE:
            raise UnsupportedError(f"node {node.describe()} is opaque and has no expression")
        attrs = dict(node.attrs)
        names = list(node.inputs)
        if node.op == "BatchNorm":
            attrs.update(self._bn_stats(node))
            names = names[:1]
        inputs = [(n, self.shape(n) or (1,)) for n in names]
        try:
            low = lower(node.op, inputs, **attrs)
        except OllieError as e:
            raise prefixed(e, f"node '{node.name}'") from e
        if not low.consts:
            return low
        # constants the lowering made (BatchNorm's scale / shift, ...) are named after the
        # node, so that two nodes' constants never share a name in one program
        taken = {*self.shapes, *self.initializers, *names, *node.outputs}
        new = {c: sanitize(f"{node.outputs[0]}_{c}", taken) for c in low.consts}
        return replace(low, expr=rename_expr(low.expr, new),
                       consts={new[c]: v for c, v in low.consts.items()})

    def _bn_stats(self, node: Node) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for role, tensor in zip(("gamma", "beta", "mean", "var"), node.inputs[1:], strict=False):
            if tensor not in self.initializers:
                raise UnsupportedError(f"node '{node.name}': BatchNorm {role} '{tensor}' is not "
                                       "an initializer")
            out[role] = np.asarray(self.initializers[tensor], dtype=np.float64)
        return out

    def lowerable_nodes(self) -> list[Node]:
        """The nodes that have an expression (not Opaque, not in ``OPAQUE_OPS``)."""
        return [n for n in self.nodes if not n.opaque]

    # ----------------------------------------------------------------- misc
    def check_shape(self, name: str, shape: Iterable[int]) -> None:
        want = self.shape(name)
        got = tuple(int(d) for d in shape)
        if got != want:
            raise ShapeError(f"graph '{self.name}': tensor '{name}' has shape {list(got)}, "
                             f"expected {list(want)}")

    def summary(self) -> str:
        """A short multi-line description (inputs, outputs, operator counts)."""
        ins = ", ".join(f"{n}{list(s)}" for n, s in self.inputs)
        outs = ", ".join(f"{o}{list(self.shapes.get(o, ()))}" for o in self.outputs)
        ops = ", ".join(f"{k} x{v}" for k, v in self.op_counts().items())
        return (f"graph '{self.name}': {len(self.nodes)} nodes, "
                f"{len(self.initializers)} initializers\n  inputs: {ins}\n  outputs: {outs}\n"
                f"  ops: {ops}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph with the reference executor: positional tensors in input order or
        keyword tensors by name; one output returns a tensor, several a tuple."""
        from ollie.graph.execute import run_graph

        feeds = dict(zip(self.input_names, args, strict=False))
        feeds.update(kwargs)
        out = run_graph(self, feeds)
        vals = [out[o] for o in self.outputs]
        return vals[0] if len(vals) == 1 else tuple(vals)
