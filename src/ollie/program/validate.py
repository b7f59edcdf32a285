"""Validation of a whole program's shapes: what a loaded program must pass before it runs.

The generated CPU kernels and the hand-written kernel library index their operands without
per-element bounds checks, trusting the shapes a kernel declares. A program built by the
optimizer declares them correctly; a program read from disk may not. :func:`validate_program`
checks, for every kernel in order (tensor shapes: the program's inputs, its constants'
arrays, each earlier kernel's output):

* a kernel with an expression reads exactly the tensors its expression declares, each of the
  declared shape (a rank-0 tensor may stand for a declared ``[1]``);
* a view (offset and strides into an operand's flat storage) lies within that operand;
* a ``Conv`` kernel's shape parameters (``n, c, h, w, f, r, s``, strides, dilations) are the
  shapes of the operands it reads; a ``G2BMM`` / ``GBMM`` kernel's band is non-negative;
* an ``Alias`` kernel reads one tensor, and its view (offset, sizes, strides: a reshape, or a
  contiguous block such as a slice) lies within that tensor and has the kernel's shape;
* a graph operator run as it is (``Node``) computes the output shape it declares (inferred on
  meta tensors; an opaque operator's declared shapes are checked when it runs,
  :func:`ollie.exec.dispatch.compile_kernel`), and its residual input has that shape;
* no tensor holds more than :data:`MAX_ELEMENTS` elements.

Any violation raises :class:`~ollie.errors.ShapeError` naming the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ollie.errors import OllieError, ShapeError
from ollie.program.kernel import Kernel, View, as_int
from ollie.program.params import G2BMMParams, GBMMParams, KernelKind, NodeParams

if TYPE_CHECKING:
    from ollie.program.program import Program

Shape = tuple[int, ...]

MAX_ELEMENTS = 1 << 34
"""Largest number of elements of any tensor of a program (64 GiB of float32)."""


def validate_program(prog: Program) -> None:
    """Check ``prog``'s shapes as the module docstring says (``prog.check()`` first: every
    tensor read is defined)."""
    shapes: dict[str, Shape] = {}
    for name, shape in prog.inputs:
        shapes[name] = _sized(tuple(shape), f"input '{name}'")
    for name, value in prog.constants.items():
        shapes[name] = tuple(value.shape)
    for i, k in enumerate(prog.kernels):
        where = f"kernel {i} ({k.kind} -> {k.output})"
        out = _sized(tuple(k.output_shape), where)
        try:
            extra = _check_kernel(k, shapes, out, where)
        except ShapeError:
            raise
        except (OllieError, ValueError, TypeError, KeyError, IndexError) as e:
            raise ShapeError(f"{where}: {e}") from None
        shapes[k.output] = out
        shapes.update(extra)


def _sized(shape: Shape, where: str) -> Shape:
    if any(d < 0 for d in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise ShapeError(f"{where}: shape {list(shape)} is negative or larger than "
                         f"{MAX_ELEMENTS} elements")
    return shape


def _check_kernel(k: Kernel, shapes: Mapping[str, Shape], out: Shape, where: str
                  ) -> dict[str, Shape]:
    """Check one kernel; the shapes of its outputs after the first (a multi-output node)."""
    if k.expr is not None:
        _check_declared(k, shapes, where)
    operands = _operands(k, shapes, where)
    p = k.params
    if k.kind is KernelKind.CONV:
        _check_conv(k, operands, where)
    elif isinstance(p, G2BMMParams | GBMMParams):
        if as_int(p.w) < 0 or as_int(p.d) < 1:
            raise ShapeError(f"{where}: band width must be >= 0 and dilation >= 1")
    elif k.kind is KernelKind.ALIAS:
        _check_alias(k, shapes, out, where)
    elif k.kind is KernelKind.NODE:
        return _check_node(k, shapes, out, where)
    return {}


def _check_declared(k: Kernel, shapes: Mapping[str, Shape], where: str) -> None:
    assert k.expr is not None
    declared = dict(k.expr.decls)
    if set(declared) != set(k.inputs):
        raise ShapeError(f"{where}: reads {sorted(set(k.inputs))} but its expression declares "
                         f"{sorted(declared)}")
    for name, want in declared.items():
        got = shapes[name]
        if tuple(got) != tuple(want) and not (got == () and tuple(want) == (1,)):
            raise ShapeError(f"{where}: input '{name}' has shape {list(got)}, its expression "
                             f"declares {list(want)}")


def _operands(k: Kernel, shapes: Mapping[str, Shape], where: str) -> list[Shape]:
    """The shapes the kernel reads its inputs as: a view's sizes where it has one (the view
    checked to lie within the operand), else the tensor's shape."""
    if len(k.views) > len(k.inputs):
        raise ShapeError(f"{where}: {len(k.views)} views for {len(k.inputs)} inputs")
    out = []
    for i, name in enumerate(k.inputs):
        view = k.views[i] if i < len(k.views) else None
        shape = shapes[name]
        if view is not None:
            _check_view(view, math.prod(shape), f"{where}: view of input '{name}'")
            shape = tuple(view.sizes)
        out.append(shape)
    return out


def _check_alias(k: Kernel, shapes: Mapping[str, Shape], out: Shape, where: str) -> None:
    if len(k.inputs) != 1:
        raise ShapeError(f"{where}: an alias must read exactly one tensor")
    try:
        offset, sizes, strides = k.params.view  # type: ignore[attr-defined]
        view = View(int(offset), tuple(int(d) for d in sizes), tuple(int(d) for d in strides))
    except (TypeError, ValueError):
        raise ShapeError(f"{where}: an alias view must be [offset, sizes, strides]") from None
    if math.prod(view.sizes) != math.prod(out):
        raise ShapeError(f"{where}: an alias view of sizes {list(view.sizes)} for an output of "
                         f"shape {list(out)}")
    _check_view(view, math.prod(shapes[k.inputs[0]]), f"{where}: alias of '{k.inputs[0]}'")


def _check_view(view: View, numel: int, where: str) -> None:
    if len(view.sizes) != len(view.strides):
        raise ShapeError(f"{where}: {len(view.sizes)} sizes but {len(view.strides)} strides")
    if view.offset < 0 or any(s < 0 for s in view.sizes) or any(s < 0 for s in view.strides):
        raise ShapeError(f"{where}: negative offset, size or stride")
    if math.prod(view.sizes) == 0:
        return
    last = view.offset + sum((n - 1) * s for n, s in zip(view.sizes, view.strides, strict=True))
    if last >= numel:
        raise ShapeError(f"{where}: reads element {last} of a tensor of {numel} elements")


def _check_conv(k: Kernel, operands: list[Shape], where: str) -> None:
    p = {key: as_int(v) for key, v in k.params.items()
         if key in ("n", "c", "h", "w", "f", "r", "s", "sh", "sw", "dh", "dw", "groups")}
    groups = p.get("groups", 1)
    if len(operands) < 2 or min(p.get(key, 0) for key in ("sh", "sw", "dh", "dw")) < 1 or \
            groups < 1:
        raise ShapeError(f"{where}: needs two operands, strides and dilations >= 1")
    x, w = operands[0], operands[1]
    want_x = (p["n"], p["c"], p["h"], p["w"])
    if tuple(x) != want_x or len(w) != 4 or w[0] != p["f"] or tuple(w[2:]) != (p["r"], p["s"]) \
            or w[1] * groups != p["c"]:
        raise ShapeError(f"{where}: operands of shapes {list(x)} and {list(w)} do not match its "
                         f"parameters {p}")


def _check_node(k: Kernel, shapes: Mapping[str, Shape], out: Shape, where: str
                ) -> dict[str, Shape]:
    """A graph operator: its inputs, output shape (inferred where it has an expression) and
    residual."""
    import torch

    from ollie.graph import OPAQUE, Node, run_node

    assert isinstance(k.params, NodeParams)
    node = k.params.node
    if not isinstance(node, Node):
        raise TypeError(f"its 'node' parameter is a {type(node).__name__}, not a graph operator")
    residual = bool(k.params.residual)
    ins = list(k.inputs[:-1] if residual else k.inputs)
    if [n for n in node.inputs if n] != ins or not node.outputs:
        raise ShapeError(f"{where}: its operator reads {list(node.inputs)}, the kernel {ins}")
    if residual and tuple(shapes[k.inputs[-1]]) != out:
        raise ShapeError(f"{where}: residual input '{k.inputs[-1]}' has shape "
                         f"{list(shapes[k.inputs[-1]])}, the output {list(out)}")
    declared = [tuple(int(d) for d in s) for s in node.attrs.get("output_shapes") or ()]
    if node.op == OPAQUE:
        if len(declared) != len(node.outputs):
            raise ShapeError(f"{where}: an opaque operator declares the shapes of its "
                             f"{len(node.outputs)} output(s)")
        got = declared
    else:
        metas = [torch.empty(shapes[n], device="meta") for n in ins]
        got = [tuple(t.shape) for t in run_node(node, metas, meta=True)]
    if got[0] != out and not (math.prod(got[0]) == math.prod(out) and
                              {len(got[0]), len(out)} <= {0, 1}):
        raise ShapeError(f"{where}: its operator computes shape {list(got[0])}, the kernel "
                         f"declares {list(out)}")
    return {name: _sized(tuple(s), f"{where}: output '{name}'")
            for name, s in zip(node.outputs[1:], got[1:], strict=False)}


__all__ = ["MAX_ELEMENTS", "validate_program"]
