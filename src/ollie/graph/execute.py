"""The reference executor of graphs: every node run with PyTorch (``torch.nn.functional`` and the
``ollie`` G2BMM / GBMM custom ops); opaque nodes with their own backend. It is the oracle of
whole-model checks.

``OP_IMPLS[op](inputs, attrs) -> list[Tensor]`` follows the semantics of the lowering of the
same kind (``ollie.lower``): padding as an int, ``(ph, pw)`` or ``(top, left, bottom, right)``;
pooling output sizes and average divisors by PyTorch's rule; Reshape ``0`` copies the input
dimension and one ``-1`` is inferred.

:func:`infer_shapes` runs the same implementations on ``meta`` tensors.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import ollie.zoo.ops  # noqa: F401 - registers torch.ops.ollie.g2bmm / gbmm
from ollie.errors import OllieError, ShapeError, UnsupportedError
from ollie.graph.ir import OPAQUE, Graph, Node, Shape, prefixed
from ollie.graph.opaque import dtype_name, meta_outputs, run_opaque, torch_dtype

Tensor = torch.Tensor
Impl = Callable[[list[Tensor], dict[str, Any]], list[Tensor]]


# --------------------------------------------------------------------- attribute helpers
def pair(v: Any) -> tuple[int, int]:
    """A graph attribute (an int, or a sequence of one or two ints) as ``(height, width)``."""
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v))
    t = tuple(int(x) for x in v)
    return (t[0], t[0]) if len(t) == 1 else (t[0], t[1])


def pad4(v: Any) -> tuple[int, int, int, int]:
    """A ``padding`` graph attribute (an int, or one, two or four ints) as (top, left, bottom,
    right)."""
    if isinstance(v, (int, np.integer)):
        return (int(v),) * 4  # type: ignore[return-value]
    t = tuple(int(x) for x in v)
    if len(t) == 1:
        return (t[0],) * 4  # type: ignore[return-value]
    if len(t) == 2:
        return (t[0], t[1], t[0], t[1])
    return (t[0], t[1], t[2], t[3])


def _pool_out(size: int, k: int, s: int, lo: int, hi: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (``k`` is the effective, dilated, kernel extent)."""
    span = size + lo + hi - k
    if span < 0:
        return 0
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + lo:
        out -= 1
    return out


def _window(x: Tensor, dim: int, start: int, length: int, fill: float = 0.0) -> Tensor:
    """``length`` entries of ``x`` along ``dim`` from ``start`` (``fill`` outside)."""
    size = x.shape[dim]
    lo, hi = max(start, 0), min(start + length, size)
    y = x.narrow(dim, lo, max(hi - lo, 0))
    before, after = lo - start, start + length - max(hi, lo)
    if before or after:
        pads = [0, 0] * (x.dim() - 1 - dim) + [before, after]
        y = F.pad(y, pads, value=fill)
    return y


# --------------------------------------------------------------------- implementations
def _conv2d(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x, w = xs[0], xs[1]
    b = xs[2] if len(xs) > 2 else None
    pt, pl, pb, pr = pad4(a.get("padding", 0))
    kw = dict(stride=pair(a.get("stride", 1)), dilation=pair(a.get("dilation", 1)),
              groups=int(a.get("groups", 1)))
    if (pt, pl) == (pb, pr):
        return [F.conv2d(x, w, b, padding=(pt, pl), **kw)]
    return [F.conv2d(F.pad(x, (pl, pr, pt, pb)), w, b, **kw)]


def _conv_transpose2d(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x, w = xs[0], xs[1]
    b = xs[2] if len(xs) > 2 else None
    pt, pl, pb, pr = pad4(a.get("padding", 0))
    oph, opw = pair(a.get("output_padding", 0))
    kw = dict(stride=pair(a.get("stride", 1)), dilation=pair(a.get("dilation", 1)),
              groups=int(a.get("groups", 1)))
    if (pt, pl) == (pb, pr):
        return [F.conv_transpose2d(x, w, b, padding=(pt, pl), output_padding=(oph, opw), **kw)]
    (sh, sw), (dh, dw) = kw["stride"], kw["dilation"]
    ho = (x.shape[2] - 1) * sh - pt - pb + dh * (w.shape[2] - 1) + oph + 1
    wo = (x.shape[3] - 1) * sw - pl - pr + dw * (w.shape[3] - 1) + opw + 1
    y = F.conv_transpose2d(x, w, None, **kw)
    y = _window(_window(y, 2, pt, ho), 3, pl, wo)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return [y]


def _gemm(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    A = xs[0].t() if a.get("transA", 0) else xs[0]
    B = xs[1].t() if a.get("transB", 0) else xs[1]
    y = A @ B
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if len(xs) > 2 and beta != 0.0:
        y = y + (xs[2] if beta == 1.0 else xs[2] * beta)
    return [y]


def _g2bmm(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    return [torch.ops.ollie.g2bmm(xs[0], xs[1], int(a["width"]), int(a.get("dilation", 1)))]


def _gbmm(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    w = a.get("width")
    w = (xs[0].shape[2] - 1) // 2 if w is None else int(w)
    return [torch.ops.ollie.gbmm(xs[0], xs[1], w, int(a.get("dilation", 1)))]


def _batch_norm(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x, gamma, beta, mean, var = (*xs, None, None, None, None)[:5]
    return [F.batch_norm(x, mean, var, gamma, beta, training=False,
                         eps=float(a.get("eps", 1e-5)))]


def _reshape(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    shape = [x.shape[k] if int(d) == 0 else int(d) for k, d in enumerate(a["shape"])]
    return [x.reshape(shape)]


def _flatten(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    ax = int(a.get("axis", 1))
    ax = ax + x.dim() if ax < 0 else ax
    return [x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))]


def _transpose(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    perm = a.get("perm")
    perm = list(range(xs[0].dim()))[::-1] if perm is None else [int(p) for p in perm]
    return [xs[0].permute(perm)]


def _avg_pool2d(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    kh, kw = pair(a["kernel_size"])
    stride = a.get("stride")
    sh, sw = (kh, kw) if stride is None else pair(stride)
    pt, pl, pb, pr = pad4(a.get("padding", 0))
    ceil_mode = bool(a.get("ceil_mode", False))
    include = bool(a.get("count_include_pad", True))
    if (pt, pl) == (pb, pr) and 2 * pt <= kh and 2 * pl <= kw:
        return [F.avg_pool2d(x, (kh, kw), (sh, sw), (pt, pl), ceil_mode, include)]
    h, w = x.shape[2], x.shape[3]
    ho = _pool_out(h, kh, sh, pt, pb, ceil_mode)
    wo = _pool_out(w, kw, sw, pl, pr, ceil_mode)
    xp = _window(_window(x, 2, -pt, (ho - 1) * sh + kh), 3, -pl, (wo - 1) * sw + kw)
    sums = F.avg_pool2d(xp, (kh, kw), (sh, sw)) * (kh * kw)
    div = np.outer(_divisors(h, ho, kh, sh, pt, pb, include),
                   _divisors(w, wo, kw, sw, pl, pr, include))
    return [sums / torch.from_numpy(np.maximum(div, 1).astype(np.float32)).to(x.device)]


def _divisors(size: int, out: int, k: int, s: int, lo: int, hi: int,
              include: bool) -> np.ndarray:
    d = np.empty(out, dtype=np.int64)
    for o in range(out):
        start = o * s - lo
        end = min(start + k, size + hi)
        pool = end - start
        d[o] = pool if include else min(end, size) - max(start, 0)
    return d


def _max_pool2d(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    kh, kw = pair(a["kernel_size"])
    stride = a.get("stride")
    sh, sw = (kh, kw) if stride is None else pair(stride)
    dh, dw = pair(a.get("dilation", 1))
    pt, pl, pb, pr = pad4(a.get("padding", 0))
    ceil_mode = bool(a.get("ceil_mode", False))
    if (pt, pl) == (pb, pr) and 2 * pt <= kh and 2 * pl <= kw:
        return [F.max_pool2d(x, (kh, kw), (sh, sw), (pt, pl), (dh, dw), ceil_mode)]
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    ho = _pool_out(x.shape[2], eh, sh, pt, pb, ceil_mode)
    wo = _pool_out(x.shape[3], ew, sw, pl, pr, ceil_mode)
    ninf = float("-inf")
    xp = _window(_window(x, 2, -pt, (ho - 1) * sh + eh, ninf), 3, -pl, (wo - 1) * sw + ew, ninf)
    return [F.max_pool2d(xp, (kh, kw), (sh, sw), 0, (dh, dw))]


def _concat(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    return [torch.cat(xs, dim=int(a["axis"]))]


def _slice(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    ax = int(a["axis"])
    ax = ax + x.dim() if ax < 0 else ax
    end = a.get("end")
    sl = slice(int(a.get("start", 0)), None if end is None else int(end), int(a.get("step", 1)))
    return [x[(slice(None),) * ax + (sl,)].contiguous()]


def _pad(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    p = [int(v) for v in a["pads"]]
    r = len(p) // 2
    pads: list[int] = []
    for k in reversed(range(r)):  # F.pad lists the last dimension first
        pads += [p[k], p[r + k]]
    return [F.pad(xs[0], pads)]


def _expand(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    shape = torch.broadcast_shapes(tuple(x.shape), tuple(int(d) for d in a["shape"]))
    return [x.expand(shape).contiguous()]


def _unfold(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    return [xs[0].unfold(int(a["axis"]), int(a["size"]), int(a["step"])).contiguous()]


def _reduce(mean: bool) -> Impl:
    def impl(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
        axes = a["axes"]
        dims = [int(v) for v in (axes if isinstance(axes, (list, tuple)) else [axes])]
        keep = bool(a.get("keepdims", 1))
        fn = torch.mean if mean else torch.sum
        return [fn(xs[0], dim=dims, keepdim=keep)]

    return impl


def _softmax(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    return [torch.softmax(xs[0], dim=int(a.get("axis", -1)))]


def _global_average_pool(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x = xs[0]
    return [x.mean(dim=tuple(range(2, x.dim())), keepdim=True)]


def _leaky_relu(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    return [F.leaky_relu(xs[0], float(a.get("alpha", 0.01)))]


def _bias_add(xs: list[Tensor], a: dict[str, Any]) -> list[Tensor]:
    x, b = xs
    return [x + b.reshape(1, -1, *([1] * (x.dim() - 2)))]


def _unary(fn: Callable[[Tensor], Tensor]) -> Impl:
    return lambda xs, a: [fn(xs[0])]


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> Impl:
    return lambda xs, a: [fn(xs[0], xs[1])]


OP_IMPLS: dict[str, Impl] = {
    "Conv2d": _conv2d,
    "ConvTranspose2d": _conv_transpose2d,
    "MatMul": _binary(torch.matmul),
    "BatchMatMul": _binary(torch.matmul),
    "Gemm": _gemm,
    "G2BMM": _g2bmm,
    "GBMM": _gbmm,
    "Relu": _unary(torch.relu),
    "Tanh": _unary(torch.tanh),
    "Sigmoid": _unary(torch.sigmoid),
    "Exp": _unary(torch.exp),
    "Log": _unary(torch.log),
    "Sqrt": _unary(torch.sqrt),
    "Abs": _unary(torch.abs),
    "Neg": _unary(torch.neg),
    "Identity": _unary(lambda x: x),
    "LeakyRelu": _leaky_relu,
    "Add": _binary(torch.add),
    "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul),
    "Div": _binary(torch.div),
    "Max": _binary(torch.maximum),
    "Min": _binary(torch.minimum),
    "BiasAdd": _bias_add,
    "BatchNorm": _batch_norm,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Concat": _concat,
    "Slice": _slice,
    "Pad": _pad,
    "Expand": _expand,
    "Unfold": _unfold,
    "ReduceSum": _reduce(mean=False),
    "ReduceMean": _reduce(mean=True),
    "AvgPool2d": _avg_pool2d,
    "GlobalAveragePool": _global_average_pool,
    "MaxPool2d": _max_pool2d,
    "Softmax": _softmax,
}


_SAME_SHAPE = frozenset({"Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Abs", "Neg",
                         "Identity", "LeakyRelu", "Softmax", "BatchNorm"})


# --------------------------------------------------------------------- running nodes
def run_node(node: Node, tensors: list[Tensor], meta: bool = False) -> list[Tensor]:
    """Run one node on its input tensors (``meta``: on meta tensors, for shapes only; opaque
    nodes then return their declared outputs); errors name the node."""
    try:
        if node.op == OPAQUE:
            declared = meta_outputs(node) if meta else None
            outs = declared if declared is not None else run_opaque(node, tensors)
        else:
            impl = OP_IMPLS.get(node.op)
            if meta and node.op in _SAME_SHAPE and len(tensors) == 1:
                return [torch.empty_like(tensors[0])]
            if impl is None:
                raise UnsupportedError(f"no reference implementation of operator '{node.op}'")
            outs = impl(tensors, node.attrs)
    except OllieError as e:
        if node.name in str(e):
            raise
        raise prefixed(e, f"node {node.describe()}") from e
    except Exception as e:
        shapes = ", ".join(str(list(t.shape)) for t in tensors)
        raise ShapeError(f"node {node.describe()} failed on inputs of shapes [{shapes}]: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r}") from e
    if len(outs) < len(node.outputs):
        raise ShapeError(f"node {node.describe()} produced {len(outs)} outputs, expected "
                         f"{len(node.outputs)}")
    return list(outs[:len(node.outputs)])


_CACHE: weakref.WeakKeyDictionary[Graph, dict[tuple[str, str], tuple[int, Tensor]]] = \
    weakref.WeakKeyDictionary()


def _initializer(graph: Graph, name: str, device: torch.device | None = None) -> Tensor:
    """Initializer ``name`` as a tensor on ``device`` (cached per graph and device)."""
    dev = torch.device("cpu") if device is None else device
    cache = _CACHE.setdefault(graph, {})
    arr = graph.initializers[name]
    hit = cache.get((name, str(dev)))
    if hit is not None and hit[0] == id(arr):
        return hit[1]
    t = torch.from_numpy(np.array(arr, copy=True)).to(dev)
    cache[(name, str(dev))] = (id(arr), t)
    return t


def _resolve_feeds(graph: Graph, inputs: Mapping[str, Any] | Sequence[Any]
                   ) -> dict[str, Tensor]:
    if not isinstance(inputs, Mapping):
        inputs = dict(zip(graph.input_names, inputs, strict=False))
    by_original = {v: k for k, v in graph.original_names.items()}
    env: dict[str, Tensor] = {}
    for key, value in inputs.items():
        name = key if key in dict(graph.inputs) else by_original.get(key, key)
        t = value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
        env[name] = t
    for name, shape in graph.inputs:
        if name not in env:
            raise ShapeError(f"graph '{graph.name}': missing input '{name}' "
                             f"(expected shape {list(shape)})")
        if tuple(env[name].shape) != tuple(shape):
            raise ShapeError(f"graph '{graph.name}': input '{name}' has shape "
                             f"{list(env[name].shape)}, expected {list(shape)}")
    return env


@torch.no_grad()
def run_graph(graph: Graph, inputs: Mapping[str, Any] | Sequence[Any]) -> dict[str, Tensor]:
    """Execute ``graph`` on ``inputs`` (by tensor name or original name, or a sequence in
    input order); returns ``{output name: tensor}``. Runs on the device of the first input
    (initializers and opaque onnxruntime results are moved there)."""
    env = _resolve_feeds(graph, inputs)
    device = env[graph.inputs[0][0]].device if graph.inputs else torch.device("cpu")
    last_use: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            last_use[i] = k
    keep = set(graph.outputs)
    for k, node in enumerate(graph.nodes):
        args = []
        for i in node.inputs:
            t = env.get(i)
            if t is None:
                if i not in graph.initializers:
                    raise ShapeError(f"graph '{graph.name}': node {node.describe()} reads "
                                     f"undefined tensor '{i}'")
                t = _initializer(graph, i, device)
            args.append(t)
        for name, t in zip(node.outputs, run_node(node, args), strict=True):
            env[name] = t if t.device == device else t.to(device)
        for i in dict.fromkeys(node.inputs):
            if last_use.get(i) == k and i not in keep:
                env.pop(i, None)
    out = {}
    for o in graph.outputs:
        out[o] = env[o] if o in env else _initializer(graph, o, device)
    return out


def infer_shapes(graph: Graph) -> tuple[dict[str, Shape], dict[str, str]]:
    """Shapes and dtypes of every tensor, by running the nodes on meta tensors."""
    env: dict[str, Tensor] = {}
    for name, shape in graph.inputs:
        dt = torch_dtype(graph.dtypes.get(name, "float32"))
        env[name] = torch.empty(tuple(shape), dtype=dt, device="meta")
    for name, arr in graph.initializers.items():
        a = np.asarray(arr)
        env[name] = torch.empty(a.shape, dtype=torch_dtype(str(a.dtype)), device="meta")
    with torch.no_grad():
        for node in graph.nodes:
            outs = run_node(node, [env[i] for i in node.inputs], meta=True)
            for name, t in zip(node.outputs, outs, strict=True):
                env[name] = t if t.device.type == "meta" else t.to("meta")
    shapes = {n: tuple(int(d) for d in t.shape) for n, t in env.items()}
    dtypes = {n: dtype_name(t.dtype) for n, t in env.items()}
    return shapes, dtypes
