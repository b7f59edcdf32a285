"""The ONNX nodes of a run of program kernels (:class:`Builder`): graph operators kept as they
are (convolutions with their fused bias / residual / activation, pooling, Gemm, element-wise
operators, the opaque torch operators of :mod:`ollie.backends.onnxrt.opaque`), library
``Conv`` kernels, and ``Matmul`` kernels and eOperators through
:mod:`ollie.backends.onnxrt.expr` / :mod:`ollie.backends.onnxrt.views`. Used by
:mod:`ollie.backends.onnxrt.region`, which decides which kernels form a region and runs the
session."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ollie.activations import ACTIVATIONS
from ollie.backends.onnxrt import opaque
from ollie.backends.onnxrt.views import int_array, out_node
from ollie.graph.execute import pad4, pair
from ollie.graph.ir import OPAQUE
from ollie.libs.tensors import kernel_input
from ollie.program.kernel import Kernel, View
from ollie.program.params import ConvParams, KernelKind, MatmulParams, NodeParams

ACT = {n: a.onnx for n, a in ACTIVATIONS.items()}
"""Fused activations (:data:`ollie.activations.ACTIVATIONS`) and their ONNX operators."""
CONVS = ("Conv2d", "ConvTranspose2d")
POOLS = ("MaxPool2d", "AvgPool2d")


def _pads(v: object) -> list[int]:
    """ONNX ``pads`` (top, left, bottom, right) from a graph attribute."""
    t, left, b, r = pad4(v)
    return [t, left, b, r]


def _pair(v: object) -> list[int]:
    return list(pair(v))


class Builder:
    """Accumulates the ONNX nodes and initializers of one region."""

    def __init__(self, constants: Mapping[str, torch.Tensor],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self.constants, self.shapes = constants, shapes
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.count = 0
        self.reshaped: dict[str, str] = {}  # a Reshape's output -> the tensor it reshapes
        # tensors holding booleans (a mask cast in the region): read only by the opaque
        # operators that take them (:data:`ollie.backends.onnxrt.opaque.BOOLEAN_READERS`)
        self.bools: set[str] = set()

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"_r{self.count}_{base}"

    def const(self, name: str, value: np.ndarray | None = None) -> str:
        """An initializer: the program constant ``name``, or ``value`` under a fresh name."""
        if value is None:
            self.inits[name] = np.ascontiguousarray(
                np.asarray(self.constants[name], dtype=np.float32))
            self.shapes[name] = tuple(self.inits[name].shape)
            return name
        fresh = self.fresh(name)
        self.inits[fresh] = value
        self.shapes[fresh] = tuple(value.shape)
        return fresh

    def node(self, op: str, inputs: Sequence[str], base: str, **attrs: object) -> str:
        from onnx import helper

        out = self.fresh(base)
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def reshape(self, name: str, shape: Sequence[int]) -> str:
        """``name`` as ``shape``; a reshape of a reshape reshapes the original (back to its
        own shape: the original itself), so no pair of them cancels in the graph: between
        two convolutions ONNX Runtime leaves its blocked layout for every ``Reshape``."""
        name = self.reshaped.get(name, name)
        if tuple(self.shapes.get(name, ())) == tuple(shape):
            return name
        target = self.const("shape", np.asarray(list(shape), dtype=np.int64))
        out = self.node("Reshape", [name, target], "reshaped")
        self.shapes[out] = tuple(shape)
        self.reshaped[out] = name
        return out

    def live(self, outputs: Sequence[str]) -> list:
        """The nodes ``outputs`` depend on, in order (a reshape folded away by
        :meth:`reshape` may have left its node unread)."""
        needed, kept = set(outputs), []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.output):
                kept.append(node)
                needed.update(node.input)
        return kept[::-1]

    def epilogue(self, y: str, k: Kernel, residual: str | None) -> str:
        if residual is not None:
            y = self.node("Add", [y, residual], "sum")
        act = k.params.activation
        return self.node(ACT[str(act)], [y], "act") if act else y

    def add(self, k: Kernel, original: Sequence[str] = ()) -> str:
        """The ONNX nodes of kernel ``k`` (its inputs under their ONNX names; ``original``:
        their program names, which an eOperator's expression declares); returns the name of
        its (natural-shape) result."""
        p = k.params
        if k.kind is KernelKind.CONV:
            return self._conv_kernel(k)
        if k.kind in (KernelKind.EOP, KernelKind.MATMUL, KernelKind.ALIAS):
            return self._expr_kernel(k, original or k.inputs)
        assert isinstance(p, NodeParams)
        node = p.node
        op, attrs = node.op, dict(node.attrs)
        ins = [self.const(n) if n in self.constants else n for n in k.inputs]
        residual = ins.pop() if p.residual else None
        if op in CONVS:
            w = self.inits[ins[1]]
            kw: dict[str, object] = dict(
                strides=_pair(attrs.get("stride", 1)), pads=_pads(attrs.get("padding", 0)),
                dilations=_pair(attrs.get("dilation", 1)), group=int(attrs.get("groups", 1)),
                kernel_shape=list(w.shape[2:]))
            if op == "ConvTranspose2d":
                kw["output_padding"] = _pair(attrs.get("output_padding", 0))
            y = self.node("Conv" if op == "Conv2d" else "ConvTranspose", ins, "conv", **kw)
        elif op in POOLS:
            kernel = _pair(attrs["kernel_size"])
            stride = kernel if attrs.get("stride") is None else _pair(attrs["stride"])
            kw = dict(kernel_shape=kernel, strides=stride, pads=_pads(attrs.get("padding", 0)),
                      ceil_mode=int(bool(attrs.get("ceil_mode", False))))
            if op == "MaxPool2d":
                kw["dilations"] = _pair(attrs.get("dilation", 1))
                y = self.node("MaxPool", ins, "pool", **kw)
            else:
                kw["count_include_pad"] = int(bool(attrs.get("count_include_pad", True)))
                y = self.node("AveragePool", ins, "pool", **kw)
        elif op == "Gemm":
            kw = {a: attrs[a] for a in ("transA", "transB") if a in attrs}
            kw.update({a: float(attrs[a]) for a in ("alpha", "beta") if a in attrs})
            y = self.node("Gemm", ins, "gemm", **kw)
        elif op == "Flatten":
            y = self.node("Flatten", ins, "flat", axis=int(attrs.get("axis", 1)))
        elif op == "Softmax":
            y = self.node("Softmax", ins, "softmax", axis=int(attrs.get("axis", -1)))
        elif op == "Slice":  # a step >= 1 (region.exportable): ONNX clamps as Python does
            end = attrs.get("end")
            bounds = (("starts", int(attrs.get("start", 0))),
                      ("ends", 2 ** 62 if end is None else int(end)),
                      ("axes", int(attrs["axis"])), ("steps", int(attrs.get("step", 1))))
            y = self.node("Slice", [ins[0], *(self.const(n, int_array([v])) for n, v in bounds)],
                          "slice")
        elif op == OPAQUE:
            emitted = opaque.emit(self, node, ins)
            if emitted is None:
                raise ValueError(f"opaque operator {node.name} is not expressible in ONNX")
            y = emitted
        else:
            y = self.node(op, ins, op.lower())
        y = self.epilogue(y, k, residual)
        self.shapes[y] = tuple(k.output_shape)
        return y

    def _matmul(self, k: Kernel, views: Sequence[View | None]) -> str:
        """A ``Matmul`` kernel over strided views of its operands. A constant operand becomes
        an initializer holding what its view reads, and with every batch size 1 the product
        is 2-D: ONNX Runtime prepacks a constant right operand only when it is a 2-D
        initializer (a batched product over reshapes of the weight was slower than the
        original operators: docs/design/009-onnx-runtime-regions.md)."""
        from ollie.backends.onnxrt.views import view_positions, view_read

        ops: list[np.ndarray | str] = []
        for n, v in zip(k.inputs, views, strict=True):
            if n not in self.constants:
                ops.append(view_read(self, n, v))
                continue
            value = np.ascontiguousarray(np.asarray(self.constants[n], dtype=np.float32))
            if v is not None:  # what the view reads (its size is bounded by the region)
                value = value.reshape(-1)[view_positions(v, value.size)]
            ops.append(value)
        a, w = (tuple(o.shape) if isinstance(o, np.ndarray) else self.shapes[o] for o in ops)
        shape = (*np.broadcast_shapes(a[:-2], w[:-2]), a[-2], w[-1])
        flat = all(d == 1 for d in a[:-2] + w[:-2])
        ins = []
        for o in ops:
            if isinstance(o, np.ndarray):
                ins.append(self.const("operand", o.reshape(o.shape[-2:]) if flat else o))
            else:
                ins.append(self.reshape(o, self.shapes[o][-2:]) if flat else o)
        y = out_node(self, "MatMul", ins, (a[-2], w[-1]) if flat else shape, "matmul")
        assert isinstance(k.params, MatmulParams)
        alpha = float(k.params.alpha)
        if alpha != 1.0:
            y = out_node(self, "Mul", [y, self.const("alpha", np.asarray(alpha, np.float32))],
                         self.shapes[y], "scaled")
        return self.reshape(y, shape)

    def _expr_kernel(self, k: Kernel, original: Sequence[str]) -> str:
        """An eOperator (its expression, any fused activation included) or a ``Matmul`` over
        strided views of its operands (:mod:`ollie.backends.onnxrt.expr`)."""
        from ollie.backends.onnxrt.expr import emit_scope
        from ollie.backends.onnxrt.views import view_read

        assert k.expr is not None
        views = list(k.views) + [None] * (len(k.inputs) - len(k.views))
        if k.kind is KernelKind.MATMUL:
            return self._matmul(k, views)
        ins = [view_read(self, self.const(n) if n in self.constants else n, v)
               for n, v in zip(k.inputs, views, strict=True)]
        decls = k.expr.inputs
        sources = {o: self.reshape(n, decls[o]) for o, n in zip(original, ins, strict=True)}
        return emit_scope(self, k.expr.root, sources)

    def _conv_kernel(self, k: Kernel) -> str:
        p = k.params
        assert isinstance(p, ConvParams)
        n, c, h, w, f = int(p.n), int(p.c), int(p.h), int(p.w), int(p.f)
        x = self.reshape(k.inputs[0], (n, c, h, w))
        weight = kernel_input(k, 1, self.constants).detach().float()
        alpha = float(p.alpha)
        if alpha != 1.0:
            weight = weight * alpha
        names = [x, self.const("weight", weight.reshape(f, c, int(p.r), int(p.s))
                               .contiguous().numpy())]
        biases = list(k.inputs[2:2 + int(p.bias or 0)])
        if biases:
            bias = sum(np.asarray(self.constants[b], dtype=np.float32).reshape(-1)
                       for b in biases)
            names.append(self.const("bias", np.asarray(bias, dtype=np.float32)))
        pads = [int(p.ph), int(p.pw), int(p.ph if p.ph_end is None else p.ph_end),
                int(p.pw if p.pw_end is None else p.pw_end)]
        y = self.node("Conv", names, "conv", strides=[int(p.sh), int(p.sw)], pads=pads,
                      dilations=[int(p.dh), int(p.dw)], group=1,
                      kernel_shape=[int(p.r), int(p.s)])
        ho = (h + pads[0] + pads[2] - int(p.dh) * (int(p.r) - 1) - 1) // int(p.sh) + 1
        wo = (w + pads[1] + pads[3] - int(p.dw) * (int(p.s) - 1) - 1) // int(p.sw) + 1
        natural = (n, f, ho, wo)
        self.shapes[y] = natural
        residual = k.inputs[-1] if p.residual else None
        if residual is not None and residual in self.constants:
            residual = self.const(residual)
        if residual is not None:  # read in the convolution's NCHW shape
            residual = self.reshape(residual, natural)
        y = self.epilogue(y, k, residual)
        self.shapes[y] = natural
        return y


__all__ = ["ACT", "CONVS", "POOLS", "Builder"]
