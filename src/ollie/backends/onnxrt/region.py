"""Runs of library operators executed as one ONNX Runtime session ("ONNX Runtime regions").

A library convolution run by ONNX Runtime on its own (:mod:`ollie.libs.ort_conv`) converts
its NCHW input into MLAS's blocked layout and its output back on every call. ONNX Runtime run
on a whole graph keeps the blocked layout from one convolution to the next (its NCHWc layout
transformer), which on some CPUs is what makes it faster than oneDNN called per operator
(measured: docs/design/009-onnx-runtime-regions.md).

This module finds maximal runs of consecutive program kernels that ONNX can express
(:func:`exportable`: graph operators kept as ``Node`` kernels such as convolutions with their
fused bias / residual / activation, pooling, Gemm and element-wise operators; library ``Conv``
kernels with a constant weight; ``Matmul`` kernels and memory-bound generated eOperators,
through :mod:`ollie.backends.onnxrt.expr`), marks them in ``params["region"]``
(:func:`mark_regions`), and builds for each run a session over a small ONNX model
(:func:`build_region`; its nodes from :class:`ollie.backends.onnxrt.build.Builder`): the run's
inputs are the tensors it reads that earlier kernels (or the caller) produced, its constants
are initializers, its outputs are the tensors later kernels or the program's caller read.
Banded ``G2BMM`` / ``GBMM`` kernels and compute-bound eOperators end a run: they stay
Ollie's own kernels (except a selective add emitted as one ``Col2Im``). With the eOperators
inside, a whole network can be one session (ResNet-18: the derived shortcut layouts, the last
residual + ReLU + global pool), so that no OpenMP thread pool of another runtime sits between
its parts.

Whether regions pay off is measured, not assumed: :func:`ollie.optimizer.libraries.
choose_libraries` times the program with regions against the other library choices and
checks it against the reference outputs. :class:`Region` is also checked when it is built
against the kernels it replaces, run one by one by Ollie's executor with PyTorch's plain
operators on random inputs; a region that cannot be built or disagrees is not used (its
kernels run one by one). Why regions, and the figures behind their calling conventions:
docs/design/009-onnx-runtime-regions.md.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np
import torch

from ollie.backends.onnxrt import opaque
from ollie.backends.onnxrt.booleans import booleans, confined
from ollie.backends.onnxrt.build import ACT as _ACT
from ollie.backends.onnxrt.build import CONVS as _CONVS
from ollie.backends.onnxrt.build import POOLS as _POOLS
from ollie.backends.onnxrt.build import Builder
from ollie.errors import ShapeError
from ollie.graph import COMPUTE_OPS
from ollie.graph.ir import OPAQUE
from ollie.ir import Expr
from ollie.libs.tensors import flat_identity
from ollie.program.kernel import Kernel, View
from ollie.program.params import ConvParams, EOpParams, KernelKind, NodeParams
from ollie.program.program import Program

log = logging.getLogger(__name__)


class BufferCache(Protocol):
    """Output buffers a region may write its results into
    (:class:`ollie.exec.buffers.BufferCache`)."""

    def get(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A float32 tensor of ``shape`` whose contents are meaningless."""
        ...


KernelRunner = Callable[[Kernel], Callable[[dict[str, torch.Tensor], torch.Tensor | None],
                                           torch.Tensor]]
"""A kernel made runnable, ``(env, out) -> tensor``, with PyTorch's plain operators
(:func:`ollie.exec.dispatch.plain_kernel`): what a region is checked against."""

LIBRARY = "ONNX Runtime regions"
"""The name of this choice in :mod:`ollie.optimizer.libraries` and in reports."""

_SIMPLE = ("Relu", "Tanh", "Sigmoid", "Add", "Sub", "Mul", "Identity", "GlobalAveragePool")
"""Graph operators that are the ONNX operator of the same name, without attributes."""
MIN_KERNELS = 2
"""A region has at least this many kernels (one convolution alone is a per-operator choice of
:func:`ollie.exec.conv.best_conv` already)."""


def _flat(view: View | None, numel: int) -> bool:
    return view is None or flat_identity(view, numel)


def exportable(k: Kernel, constants: Mapping[str, object],
               shapes: Mapping[str, tuple[int, ...]],
               bools: frozenset[str] = frozenset()) -> bool:
    """Whether kernel ``k`` can be one step of an ONNX Runtime region; ``bools``: the
    program's computed tensors that hold booleans, which only some opaque operators read
    (:data:`ollie.backends.onnxrt.opaque.BOOLEAN_READERS`)."""
    p = k.params
    act = p.activation
    if act and act not in _ACT:
        return False
    if bools.intersection(k.inputs) and \
            not (isinstance(p, NodeParams) and p.node.op == OPAQUE):
        return False
    if isinstance(p, NodeParams):
        op = p.node.op
        if len(p.node.outputs) != 1:
            return False
        ins = list(k.inputs[:-1] if p.residual else k.inputs)
        if op in _CONVS:
            return len(ins) in (2, 3) and all(n in constants for n in ins[1:]) and \
                ins[0] not in constants
        if p.residual:
            return False
        if op == OPAQUE:
            return _opaque_expressible(k, constants, shapes, bools)
        if op == "MatMul":  # torch.matmul and ONNX MatMul broadcast alike
            return len(ins) == 2
        if op == "Slice":
            return int(p.node.attrs.get("step", 1)) >= 1
        return op in _SIMPLE or op in _POOLS or op == "Gemm" or \
            (op in ("Flatten", "Softmax") and not act)
    if k.kind in (KernelKind.EOP, KernelKind.MATMUL, KernelKind.ALIAS):
        return _expressible(k, constants, shapes)
    if isinstance(p, ConvParams):
        biases = int(p.bias or 0)
        if k.inputs[1] not in constants or k.inputs[0] in constants or \
                any(b not in constants for b in k.inputs[2:2 + biases]):
            return False
        ends = (p.ph if p.ph_end is None else p.ph_end, p.pw if p.pw_end is None else p.pw_end)
        if min(int(a) for a in (p.ph, p.pw, *ends)) < 0:
            return False  # a crop: ONNX pads are non-negative
        views = list(k.views) + [None] * (len(k.inputs) - len(k.views))
        return _flat(views[0], int(np.prod(shapes[k.inputs[0]]))) and \
            all(v is None for v in views[2:])
    return False


def _opaque_expressible(k: Kernel, constants: Mapping[str, object],
                        shapes: Mapping[str, tuple[int, ...]], bools: frozenset[str]) -> bool:
    """An opaque torch operator :mod:`ollie.backends.onnxrt.opaque` expresses with these
    arguments (tried in a scratch :class:`Builder`; ``bools``: as :func:`exportable`'s)."""
    p = k.params
    assert isinstance(p, NodeParams)
    if not opaque.supported(p.node):
        return False
    scratch = Builder(constants, dict(shapes))  # type: ignore[arg-type]
    scratch.bools.update(bools.intersection(k.inputs))
    try:
        ins = [scratch.const(n) if n in constants else n for n in k.inputs]
        return opaque.emit(scratch, p.node, ins) is not None
    except (KeyError, TypeError, ValueError):
        return False


def _expressible(k: Kernel, constants: Mapping[str, object],
                 shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """A memory-bound eOperator whose reads need no ``Gather`` (:func:`_cheap`), or a
    ``Matmul`` whose computed operands need none either, with grids and views within
    :data:`ollie.backends.onnxrt.views.MAX_ELEMENTS` (the emission itself may still reject the
    kernel, and then the region is not built). A compute-bound eOperator (its ``bound``
    parameter, :mod:`ollie.match.eop`) stays Ollie's generated loop nest: as ONNX it would be
    an element-wise product over its whole grid followed by a ``ReduceSum``; unless its sum
    is a ``Col2Im`` or a ``GlobalAveragePool`` (:func:`_cheap`)."""
    from ollie.backends.onnxrt.views import MAX_ELEMENTS, view_gathers
    from ollie.ir.nodes import nested_scopes

    if k.expr is None or (k.params.get("bound") == "compute" and k.kind is not KernelKind.EOP):
        return False
    if any(v is not None and math.prod(v.sizes) > MAX_ELEMENTS for v in k.views):
        return False
    if k.kind is KernelKind.MATMUL:
        # a gathered view of a computed operand would copy it element by element on every
        # run (a constant one is folded by ONNX Runtime when the session is built)
        views = list(k.views) + [None] * (len(k.inputs) - len(k.views))
        return all(len(v.sizes if v is not None else shapes[n]) >= 2 and
                   (n in constants or not view_gathers(v, math.prod(shapes[n])))
                   for n, v in zip(k.inputs, views, strict=True))
    root = k.expr.root
    return all(math.prod(it.size for it in s.iters) <= max(MAX_ELEMENTS, math.prod(s.shape))
               for s in (root, *nested_scopes(root))) and \
        _cheap(k.expr, isinstance(k.params, EOpParams) and k.params.bound == "compute")


def needs_gather(expr: Expr) -> bool:
    """Whether :func:`ollie.backends.onnxrt.expr.emit_scope` reads some tensor of ``expr``
    through a ``Gather`` (an index tensor as large as the read); raises UnsupportedError as
    the emission does."""
    return "Gather" in emitted_ops(expr)


def emitted_ops(expr: Expr) -> list[str]:
    """The ONNX operator types :func:`ollie.backends.onnxrt.expr.emit_scope` emits for ``expr``,
    in order; raises UnsupportedError as the emission does."""
    from ollie.backends.onnxrt.expr import emit_scope

    b = Builder({}, {n: tuple(s) for n, s in expr.decls})
    emit_scope(b, expr.root, {n: n for n, _ in expr.decls})
    return [node.op_type for node in b.nodes]


@functools.lru_cache(maxsize=1024)
def _cheap(expr: Expr, compute: bool = False) -> bool:
    """Whether ``expr`` becomes ONNX operators without a ``Gather`` (a scatter-like selective
    add would gather its whole iteration grid: slower in ONNX Runtime than the generated
    kernel, measured on GCN). ``compute``: an eOperator classed compute-bound, accepted only
    when its sum needs no ``ReduceSum`` over a grid: a ``Col2Im`` (a derived transposed
    convolution's selective add, whose unmerged grid counts as many additions as a product:
    DCGAN's last layer) or a ``GlobalAveragePool`` (DenseNet's last batch norm, ReLU and
    pooling over its concatenated features)."""
    from ollie.errors import UnsupportedError

    try:
        ops = emitted_ops(expr)
    except UnsupportedError:
        return False
    if compute and "ReduceSum" in ops:
        return False
    return "Gather" not in ops


def _is_anchor(k: Kernel) -> bool:
    """A convolution or a matrix product: what makes a run worth a session."""
    p = k.params
    return k.kind in (KernelKind.CONV, KernelKind.MATMUL) or \
        (isinstance(p, NodeParams) and (p.op in _CONVS or p.op in ("MatMul", "Gemm")))


def spans(prog: Program) -> list[tuple[int, int]]:
    """Maximal runs ``[start, end)`` of exportable kernels holding a convolution or a matrix
    product and at least :data:`MIN_KERNELS` kernels; an opaque operator's boolean or integer
    result is produced and read within one run or outside every run
    (:func:`ollie.backends.onnxrt.booleans.confined`)."""
    shapes = prog.tensor_shapes()
    found = booleans(prog)
    flags = confined(prog, [exportable(k, prog.constants, shapes, found)
                            for k in prog.kernels], found)
    out, start = [], None
    for i, ok in enumerate([*flags, False]):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            run = prog.kernels[start:i]
            if len(run) >= MIN_KERNELS and any(_is_anchor(k) for k in run):
                out.append((start, i))
            start = None
    return out


def mark_regions(prog: Program) -> Program | None:
    """``prog`` with the kernels of each run of :func:`spans` marked ``params["region"] = n``
    (the run's number), or None when there is no run."""
    runs = spans(prog)
    if not runs:
        return None
    region = {i: n for n, (a, b) in enumerate(runs) for i in range(a, b)}
    kernels = [Kernel(k.kind, replace(k.params, region=region[i]), k.inputs, k.output, k.expr,
                      k.views, k.shape) if i in region else k
               for i, k in enumerate(prog.kernels)]
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


def groups(prog: Program) -> list[tuple[int, int]]:
    """The marked regions of ``prog``: runs ``[start, end)`` of consecutive kernels with the
    same ``params["region"]``."""
    out: list[tuple[int, int]] = []
    current, start = None, 0
    marks = [k.params.region for k in prog.kernels] + [None]
    for i, mark in enumerate(marks):
        if mark != current:
            if current is not None:
                out.append((start, i))
            current, start = mark, i
    return out


def _slot(i: int) -> str:
    """The ONNX name of a region's input ``i`` (apart from the program's tensor names)."""
    return f"_region_in{i}"


class Region:
    """One ONNX Runtime session running kernels ``[start, end)`` of a program: ``run(env)``
    reads the region's inputs from ``env`` and stores its outputs there. ``spinning``: the
    session's threads busy-wait for work (see :func:`holds_all_compute`).

    The session reads its inputs where the program's tensors are and writes its outputs into
    tensors given to it, through an I/O binding kept from one call to the next (one per
    thread): a pointer is bound again only when it changed, which saves ``run``'s conversion
    of the feed and allocation of the outputs (measured:
    docs/design/009-onnx-runtime-regions.md)."""

    def __init__(self, session: object, inputs: list[str], outputs: list[str],
                 shapes: Mapping[str, tuple[int, ...]], spinning: bool = False) -> None:
        """``shapes``: the shapes of the region's inputs and outputs, by program name."""
        self.session, self.inputs, self.outputs = session, inputs, outputs
        self.spinning = spinning
        self._names = [_slot(i) for i in range(len(inputs))]
        self._out_names = [o.name for o in session.get_outputs()]  # type: ignore[attr-defined]
        self._in_shapes = [list(shapes[n]) for n in inputs]
        self._sizes = [torch.Size(shapes[n]) for n in inputs]
        self._out_shapes = [tuple(shapes[n]) for n in outputs]
        self._local = threading.local()

    def _binding(self) -> _Binding:
        b = getattr(self._local, "binding", None)
        if b is None:
            b = self._local.binding = _Binding(
                self.session.io_binding(),  # type: ignore[attr-defined]
                [0] * len(self.inputs), [0] * len(self.outputs))
        return b

    def run(self, env: dict[str, torch.Tensor], buffers: BufferCache | None = None) -> None:
        """Run the session on ``env``'s tensors; its outputs come from ``buffers`` (fresh
        tensors without)."""
        xs = [env[n].detach().contiguous() for n in self.inputs]  # alive through the run
        for i, x in enumerate(xs):
            if x.numel() != self._sizes[i].numel() or x.dtype != torch.float32:
                raise ShapeError(f"ONNX Runtime region input '{self.inputs[i]}' is "
                                 f"{x.dtype} {list(x.shape)}, expected float32 "
                                 f"{self._in_shapes[i]}")
        for name, y in zip(self.outputs, self._run_bound(xs, buffers), strict=True):
            env[name] = y

    def call(self, xs: Sequence[object], buffers: BufferCache | None = None
             ) -> list[torch.Tensor] | None:
        """The region's outputs for its inputs ``xs`` given in order, when each is a plain
        float32 CPU tensor of its expected shape, dense (None otherwise: the caller converts
        them and calls :meth:`run`). A program that is one region runs through this
        (:class:`ollie.exec.executor.CompiledProgram`): each operation on a tensor between
        two runs of a session costs microseconds in a serving loop (the session's run leaves
        the caches cold), so this path does the fewest (measured:
        docs/design/009-onnx-runtime-regions.md)."""
        if len(xs) != len(self._sizes):
            return None
        for x, size in zip(xs, self._sizes, strict=True):
            if type(x) is not torch.Tensor or x.dtype is not torch.float32 or \
                    not x.is_cpu or x.shape != size or not x.is_contiguous():
                return None
        return self._run_bound(xs, buffers)  # type: ignore[arg-type]

    def _run_bound(self, xs: Sequence[torch.Tensor], buffers: BufferCache | None
                   ) -> list[torch.Tensor]:
        """Run the session through this thread's binding on the dense float32 inputs ``xs``
        (of the expected sizes), into outputs from ``buffers``."""
        b = self._binding()
        io = b.io
        for i, x in enumerate(xs):
            ptr = x.data_ptr()
            if ptr != b.inputs[i]:
                io.bind_input(self._names[i], "cpu", 0, np.float32, self._in_shapes[i], ptr)
                b.inputs[i] = ptr
        ys = [buffers.get(s) if buffers is not None else torch.empty(s)
              for s in self._out_shapes]
        for i, y in enumerate(ys):
            ptr = y.data_ptr()
            if ptr != b.outputs[i]:
                io.bind_output(self._out_names[i], "cpu", 0, np.float32, list(y.shape), ptr)
                b.outputs[i] = ptr
        self.session.run_with_iobinding(io)  # type: ignore[attr-defined]
        return ys


class _Binding:
    """A region's I/O binding and the data pointers bound to its inputs and outputs."""

    __slots__ = ("inputs", "io", "outputs")

    def __init__(self, io: object, inputs: list[int], outputs: list[int]) -> None:
        self.io, self.inputs, self.outputs = io, inputs, outputs


COMPUTE_KINDS = (KernelKind.CONV, KernelKind.MATMUL, KernelKind.G2BMM, KernelKind.GBMM)
"""Kernel kinds that run a library or banded compute operator."""


def _compute(k: Kernel) -> bool:
    p = k.params
    if k.kind in COMPUTE_KINDS:
        return True
    if isinstance(p, NodeParams):
        return p.op in COMPUTE_OPS
    return isinstance(p, EOpParams) and p.bound == "compute"


def holds_all_compute(prog: Program, start: int, end: int) -> bool:
    """Whether ``prog.kernels[start:end]`` holds every compute kernel of the program (only
    memory-bound kernels run outside it). Such a region's session spins, as ONNX Runtime does
    by default: between its runs only cheap kernels compete for the cores, and a session whose
    threads sleep pays to wake them at every parallel section (measured:
    docs/design/002-measurement-protocol.md)."""
    return not any(_compute(k) for i, k in enumerate(prog.kernels) if not start <= i < end)


def build_region(prog: Program, start: int, end: int, constants: Mapping[str, torch.Tensor],
                 reference: KernelRunner | None = None) -> Region | None:
    """The session running ``prog.kernels[start:end]``, or None when ONNX Runtime is missing,
    rejects the model, or the session disagrees with the kernels run one by one by
    ``reference`` (the executor passes :func:`ollie.exec.dispatch.plain_kernel`; None: not
    checked). The session spins when the region holds all of the program's compute
    (:func:`holds_all_compute`)."""
    kernels = prog.kernels[start:end]
    shapes = prog.tensor_shapes()
    produced = {k.output for k in kernels}
    inputs: list[str] = []
    for k in kernels:
        for n in k.inputs:
            if n not in produced and n not in constants and n not in inputs:
                inputs.append(n)
    later = {n for k in prog.kernels[end:] for n in k.inputs} | set(prog.outputs)
    outputs = [k.output for k in kernels if k.output in later]
    if not outputs:
        return None
    spinning = holds_all_compute(prog, start, end)
    try:
        session = _session(kernels, constants, shapes, inputs, outputs, spinning)
    except Exception as exc:  # an optional backend: the kernels then run one by one
        log.info("no ONNX Runtime region for kernels %d..%d: %s", start, end - 1, exc)
        return None
    region = Region(session, inputs, outputs, shapes, spinning)
    if reference is not None and not _agrees(region, prog, start, end, constants, shapes,
                                             reference):
        log.warning("an ONNX Runtime region (kernels %d..%d) disagrees with its kernels; "
                    "not used", start, end - 1)
        return None
    return region


def _session(kernels: Sequence[Kernel], constants: Mapping[str, torch.Tensor],
             shapes: Mapping[str, tuple[int, ...]], inputs: list[str],
             outputs: list[str], spinning: bool = False) -> object:
    from onnx import TensorProto, helper, numpy_helper

    rename: dict[str, str] = {n: _slot(i) for i, n in enumerate(inputs)}
    b = Builder(constants, {rename[n]: tuple(shapes[n]) for n in inputs})
    for k in kernels:
        # each kernel reads region inputs and earlier results under their ONNX names
        y = b.add(Kernel(k.kind, k.params, tuple(rename.get(n, n) for n in k.inputs),
                         k.output, k.expr, k.views, k.shape), k.inputs)
        rename[k.output] = b.reshape(y, tuple(k.output_shape))
    graph_outputs = [helper.make_tensor_value_info(rename[n], TensorProto.FLOAT,
                                                   list(shapes[n])) for n in outputs]
    from ollie.libs.ort_conv import EXTERNAL_BYTES, session

    # only the constants a node reads (a kernel may read a constant its ONNX form folds in,
    # e.g. a clamp's bounds): ONNX Runtime warns about every unused initializer
    nodes = b.live([rename[n] for n in outputs])
    used = {name for node in nodes for name in node.input} | set(rename[n] for n in outputs)
    inits = {n: v for n, v in b.inits.items() if n in used}
    # large weights travel beside the model, not through protobuf (EXTERNAL_BYTES)
    weights = {n: v for n, v in inits.items()
               if v.dtype == np.float32 and v.nbytes >= EXTERNAL_BYTES}
    graph = helper.make_graph(
        nodes, "ollie_region",
        [helper.make_tensor_value_info(rename[n], TensorProto.FLOAT, list(shapes[n]))
         for n in inputs],
        graph_outputs, [numpy_helper.from_array(v, n) for n, v in inits.items()
                        if n not in weights])
    return session(graph, spinning, weights)


def _agrees(region: Region, prog: Program, start: int, end: int,
            constants: Mapping[str, torch.Tensor],
            shapes: Mapping[str, tuple[int, ...]], reference: KernelRunner) -> bool:
    """Whether ``region`` computes what Ollie's executor computes for the same kernels run one
    by one with PyTorch's plain operators (``reference``), on random inputs (relative error
    1e-3 of each output's largest magnitude)."""

    gen = torch.Generator().manual_seed(0)
    env: dict[str, torch.Tensor] = dict(constants)
    for n in region.inputs:
        env[n] = torch.randn(shapes[n], generator=gen)
    ref = dict(env)
    with torch.inference_mode():
        for k in prog.kernels[start:end]:
            plain = Kernel(k.kind, replace(k.params, region=None),
                           k.inputs, k.output, k.expr, k.views, k.shape)
            # without ``constants``: torch's plain operators, no library choice timed
            ref[k.output] = reference(plain)(ref, None)
        region.run(env)
    for n in region.outputs:
        want, got = ref[n].double(), env[n].double()
        scale = float(want.abs().max()) + 1e-6
        if got.shape != want.shape or float((got - want).abs().max()) > 1e-3 * scale:
            return False
    return True


__all__ = ["LIBRARY", "Region", "build_region", "emitted_ops", "exportable", "groups",
           "holds_all_compute", "mark_regions", "needs_gather", "spans"]
