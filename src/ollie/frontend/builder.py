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
