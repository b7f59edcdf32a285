"""``GraphBuilder``: the incremental graph construction shared by the frontends (unique,
valid tensor names; initializers; node emission; final shape inference)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ollie.graph.execute import run_node
from ollie.graph.ir import Graph, Node, Shape, sanitize
from ollie.graph.opaque import dtype_name, torch_dtype

POWERS = (1, 2, 3, 0.5, -0.5, -1, -2)
"""The exponents :meth:`GraphBuilder.power` expresses as element-wise graph operators."""


class GraphBuilder:
    """``track_shapes``: keep a meta tensor per tensor (``self.meta``), running each emitted
    node on meta tensors at once (errors name the node)."""

    def __init__(self, name: str, track_shapes: bool = False) -> None:
        self.name = name
        self.track = track_shapes
        self.meta: dict[str, torch.Tensor] = {}
        self.taken: set[str] = set()
        self.inputs: list[tuple[str, Shape]] = []
        self.input_dtypes: dict[str, str] = {}
        self.outputs: list[str] = []
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.original_names: dict[str, str] = {}

    def fresh(self, hint: str) -> str:
        return sanitize(hint, self.taken)

    def add_input(self, original: str, shape: Sequence[int], dtype: str = "float32") -> str:
        name = self.fresh(original)
        self.inputs.append((name, tuple(int(d) for d in shape)))
        self.input_dtypes[name] = dtype
        if self.track:
            self.meta[name] = torch.empty(self.inputs[-1][1], dtype=torch_dtype(dtype),
                                          device="meta")
        if name != original:
            self.original_names[name] = original
        return name

    def add_const(self, value: Any, hint: str = "const", dtype: Any = None) -> str:
        arr = np.asarray(value, dtype=dtype)
        if dtype is None and arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        name = self.fresh(hint)
        self._set_const(name, arr)
        return name

    def _set_const(self, name: str, arr: np.ndarray) -> None:
        self.initializers[name] = arr
        if self.track:
            self.meta[name] = torch.empty(arr.shape, dtype=torch_dtype(str(arr.dtype)),
                                          device="meta")

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
             hint: str = "t", n_outputs: int = 1, name: str | None = None) -> list[str]:
        outs = [self.fresh(hint if n_outputs == 1 else f"{hint}_{k}") for k in range(n_outputs)]
        node = Node(op, tuple(inputs), tuple(outs), dict(attrs or {}), name or outs[0])
        if self.track:
            metas = run_node(node, [self.meta[i] for i in node.inputs], meta=True)
            self.meta.update(zip(outs, metas, strict=True))
        self.nodes.append(node)
        return outs

    # ------------------------------------------------------------------ composite activations
    # (element-wise graph operators, so that they become eOperators fused with their
    # neighbours instead of opaque calls; shared by the ONNX and torch frontends)
    def clip(self, x: str, lo: float | None, hi: float | None, hint: str) -> str:
        """``x`` clamped to ``[lo, hi]`` (a None bound: none) as ``Max`` / ``Min`` with scalar
        constants; ReLU6 is ``clip(x, 0, 6)``."""
        y = x
        if lo is not None:
            y = self.emit1("Max", [y, self.add_const(np.float32(lo), f"{hint}_lo")],
                           hint=hint if hi is None else f"{hint}_max")
        if hi is not None:
            y = self.emit1("Min", [y, self.add_const(np.float32(hi), f"{hint}_hi")], hint=hint)
        return y if y != x else self.emit1("Identity", [x], hint=hint)

    def hard_sigmoid(self, x: str, alpha: float, beta: float, hint: str) -> str:
        """``clip(alpha * x + beta, 0, 1)``."""
        y = self.emit1("Mul", [x, self.add_const(np.float32(alpha), f"{hint}_alpha")],
                       hint=f"{hint}_scaled")
        y = self.emit1("Add", [y, self.add_const(np.float32(beta), f"{hint}_beta")],
                       hint=f"{hint}_shifted")
        return self.clip(y, 0.0, 1.0, hint)

    def hard_swish(self, x: str, hint: str) -> str:
        """``x * hard_sigmoid(x, 1/6, 1/2)``."""
        gate = self.hard_sigmoid(x, 1.0 / 6.0, 0.5, f"{hint}_gate")
        return self.emit1("Mul", [x, gate], hint=hint)

    def silu(self, x: str, hint: str) -> str:
        """``x * sigmoid(x)`` (SiLU, Swish)."""
        return self.emit1("Mul", [x, self.emit1("Sigmoid", [x], hint=f"{hint}_gate")],
                          hint=hint)

    def power(self, x: str, exponent: float, hint: str) -> str | None:
        """``x ** exponent`` as element-wise graph operators for the exponents models use
        (:data:`POWERS`: a square, a cube, square roots and reciprocals, as in GPT-2's GELU and
        T5's RMS norm), None for any other exponent (the caller keeps its node opaque)."""
        if exponent not in POWERS:
            return None
        if exponent == 1:
            return self.emit1("Identity", [x], hint=hint)
        if exponent in (0.5, -0.5):
            root = self.emit1("Sqrt", [x], hint=hint if exponent > 0 else f"{hint}_sqrt")
            return root if exponent > 0 else self.reciprocal(root, hint)
        if exponent < 0:
            return self.reciprocal(x if exponent == -1 else self.power(x, -exponent,
                                                                      f"{hint}_pos"), hint)
        y = self.emit1("Mul", [x, x], hint=hint if exponent == 2 else f"{hint}_sq")
        return y if exponent == 2 else self.emit1("Mul", [y, x], hint=hint)

    def reciprocal(self, x: str, hint: str) -> str:
        """``1 / x``."""
        return self.emit1("Div", [self.add_const(np.float32(1.0), f"{hint}_one"), x],
                          hint=hint)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of a tracked tensor."""
        return tuple(int(d) for d in self.meta[name].shape)

    def dtype(self, name: str) -> str:
        return dtype_name(self.meta[name].dtype)

    def emit1(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
              hint: str = "t") -> str:
        return self.emit(op, inputs, attrs, hint)[0]

    def add_output(self, tensor: str, original: str | None = None) -> str:
        """Mark ``tensor`` as a graph output (through an Identity node when it is a graph
        input, an initializer or already an output)."""
        if (tensor in dict(self.inputs) or tensor in self.initializers
                or tensor in self.outputs):
            tensor = self.emit1("Identity", [tensor], hint=original or f"{tensor}_out")
        self.outputs.append(tensor)
        if original is not None and original != tensor:
            self.original_names[tensor] = original
        return tensor

    def finish(self) -> Graph:
        """Drop nodes that feed no output, drop unused initializers, infer shapes."""
        used = set(self.outputs)
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if any(o in used for o in node.outputs):
                kept.append(node)
                used.update(node.inputs)
        kept.reverse()
        inits = {k: v for k, v in self.initializers.items() if k in used}
        graph = Graph(list(self.inputs), list(self.outputs), kept, inits, self.name,
                      dict(self.original_names), dtypes=dict(self.input_dtypes))
        return graph.infer_shapes()
