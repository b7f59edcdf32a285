"""Hypothesis strategies of small torch models built from the operators Ollie supports, for the
graph fuzzing suite (``test_fuzz_graphs.py``).

A drawn :class:`Case` is a chain of 2-5 operators on a tiny input (or on two inputs added,
multiplied or concatenated first): convolutions (any kernel
size, stride, padding, dilation and grouping, depthwise included, with or without bias),
transposed convolutions, linear layers and matrix products, inference BatchNorm, activations,
residual additions and concatenations of two branches, pooling, flatten / reshape / permute
and chunking. Shapes stay small (at most :data:`MAX_DIM` per dimension) so that each case
optimises in a few seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import nn

MAX_DIM = 16
"""Largest channel count / spatial size a drawn operator produces (transposed convolutions
may reach :data:`MAX_GROWN`)."""
MAX_GROWN = 16
MAX_FEATURES = 256
"""Largest flattened feature count a ``Flatten`` produces."""

Shape = tuple[int, ...]
Draw = Callable[[st.SearchStrategy], object]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU, "silu": nn.SiLU}


class MatMul(nn.Module):
    """``x @ W`` with a weight ``W`` of shape ``[k, n]`` (batched over ``x``'s leading dims)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / math.sqrt(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight)

    def extra_repr(self) -> str:
        return f"k={self.weight.shape[0]}, n={self.weight.shape[1]}"


class SelfMatMul(nn.Module):
    """``x @ x^T`` over the last two dimensions (a product of two activations)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, x.transpose(-1, -2))


class Residual(nn.Module):
    """``a(x) + b(x)``."""

    def __init__(self, a: nn.Module, b: nn.Module) -> None:
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


class Cat(nn.Module):
    """``torch.cat([a(x), b(x)], dim)``."""

    def __init__(self, a: nn.Module, b: nn.Module, dim: int) -> None:
        super().__init__()
        self.a, self.b, self.dim = a, b, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Chunk(nn.Module):
    """``x.chunk(chunks, dim)``, then the first part, the parts concatenated in reverse order,
    or their sum (``mode``: ``first``, ``reverse``, ``sum``; the sum needs equal parts)."""

    def __init__(self, chunks: int, dim: int, mode: str) -> None:
        super().__init__()
        self.chunks, self.dim, self.mode = chunks, dim, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.chunk(self.chunks, self.dim)
        if self.mode == "first":
            return parts[0]
        if self.mode == "reverse":
            return torch.cat(parts[::-1], self.dim)
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out

    def extra_repr(self) -> str:
        return f"chunks={self.chunks}, dim={self.dim}, mode={self.mode}"


class Permute(nn.Module):
    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)

    def extra_repr(self) -> str:
        return f"dims={self.dims}"


class Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


class Net(nn.Module):
    """``body(x)`` of one input, or of two inputs of one shape combined first
    (``combine``: ``add``, ``mul`` or ``cat`` along the channels)."""

    def __init__(self, body: nn.Module, combine: str | None = None) -> None:
        super().__init__()
        self.body, self.combine = body, combine

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        if self.combine is None:
            (h,) = xs
        elif self.combine == "add":
            h = xs[0] + xs[1]
        elif self.combine == "mul":
            h = xs[0] * xs[1]
        else:
            h = torch.cat(xs, 1)
        return self.body(h)

    def extra_repr(self) -> str:
        return f"combine={self.combine}"


@dataclass
class Case:
    """A drawn model (eval mode, float32), its inputs' shape and count, and the shape of its
    output. ``aliased``: a two-input model is optimised with one tensor as both example
    inputs (tracing must not assume they alias)."""

    model: nn.Module
    shape: Shape
    seed: int
    out_shape: Shape
    n_inputs: int = 1
    aliased: bool = False

    def inputs(self, seed_offset: int = 0) -> tuple[torch.Tensor, ...]:
        """Standard normal inputs of :attr:`shape` (seeded, distinct)."""
        gen = torch.Generator().manual_seed(self.seed + 1 + seed_offset)
        return tuple(torch.randn(self.shape, generator=gen) for _ in range(self.n_inputs))

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """What ``ollie.optimize`` is given: :meth:`inputs`, or one tensor repeated when
        :attr:`aliased`."""
        xs = self.inputs()
        return (xs[0],) * len(xs) if self.aliased else xs

    def __repr__(self) -> str:
        return (f"Case(shape={self.shape}, inputs={self.n_inputs}, aliased={self.aliased}, "
                f"seed={self.seed}, model={self.model})")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _activation(draw: Draw) -> nn.Module:
    return ACTIVATIONS[draw(st.sampled_from(sorted(ACTIVATIONS)))]()


def conv(draw: Draw, shape: Shape, same: bool = False) -> tuple[nn.Module, Shape]:
    """A ``Conv2d`` on ``[N, C, H, W]``; ``same``: output of the input's shape."""
    n, c, h, w = shape
    groups = draw(st.sampled_from(_divisors(c)))
    if same:
        k = draw(st.sampled_from([1, 3, 5]))
        d = draw(st.integers(1, 2))
        s, out = 1, c
        pad: int | str = draw(st.sampled_from([d * (k - 1) // 2, "same"]))
    else:
        out = groups * draw(st.integers(1, max(1, MAX_DIM // groups)))
        k = draw(st.integers(1, 5))
        s = draw(st.integers(1, 3))
        d = draw(st.integers(1, 3))
        p = draw(st.integers(0, 2))
        # the effective kernel must fit in the padded input
        while d > 1 and d * (k - 1) + 1 > min(h, w) + 2 * p:
            d -= 1
        k = min(k, min(h, w) + 2 * p)
        pad = "same" if s == 1 and draw(st.booleans()) and draw(st.booleans()) else p
    bias = draw(st.booleans())
    m = nn.Conv2d(c, out, k, stride=s, padding=pad, dilation=d, groups=groups, bias=bias)
    if pad == "same":
        return m, (n, out, h, w)
    p = int(pad)
    return m, (n, out, _conv_out(h, k, s, p, d), _conv_out(w, k, s, p, d))


def conv_transpose(draw: Draw, shape: Shape) -> tuple[nn.Module, Shape]:
    """A ``ConvTranspose2d`` on ``[N, C, H, W]`` (output at most :data:`MAX_GROWN` wide)."""
    n, c, h, w = shape
    groups = draw(st.sampled_from(_divisors(c)))
    out = groups * draw(st.integers(1, max(1, 8 // groups)))
    k = draw(st.integers(1, 4))
    s = draw(st.integers(1, 3))
    d = draw(st.integers(1, 2))
    p = draw(st.integers(0, max(0, d * (k - 1))))
    op = draw(st.integers(0, max(s, d) - 1))

    def size(x: int) -> int:
        return (x - 1) * s - 2 * p + d * (k - 1) + op + 1

    # keep the output small and non-empty: shrink the stride, then the padding
    while s > 1 and max(size(h), size(w)) > MAX_GROWN:
        s -= 1
        op = min(op, max(s, d) - 1)
    while p > 0 and min(size(h), size(w)) < 1:
        p -= 1
    if min(size(h), size(w)) < 1 or max(size(h), size(w)) > MAX_GROWN:
        k, s, d, p, op = 1, 1, 1, 0, 0
    m = nn.ConvTranspose2d(c, out, k, stride=s, padding=p, output_padding=op, groups=groups,
                           bias=draw(st.booleans()), dilation=d)
    return m, (n, out, size(h), size(w))


def batch_norm(draw: Draw, shape: Shape) -> tuple[nn.Module, Shape]:
    """An inference ``BatchNorm2d`` with random statistics and affine parameters."""
    c = shape[1]
    m = nn.BatchNorm2d(c, affine=draw(st.booleans()))
    m.running_mean.copy_(torch.randn(c) * 0.5)
    m.running_var.copy_(torch.rand(c) + 0.5)
    if m.affine:
        with torch.no_grad():
            m.weight.copy_(torch.rand(c) + 0.5)
            m.bias.copy_(torch.randn(c) * 0.5)
    return m, shape


def pool(draw: Draw, shape: Shape) -> tuple[nn.Module, Shape]:
    """Max, average or adaptive average pooling of ``[N, C, H, W]``."""
    n, c, h, w = shape
    kind = draw(st.sampled_from(["max", "avg", "adaptive"]))
    if kind == "adaptive":
        oh = draw(st.sampled_from(_divisors(h)))
        ow = draw(st.sampled_from(_divisors(w)))
        return nn.AdaptiveAvgPool2d((oh, ow)), (n, c, oh, ow)
    k = draw(st.integers(1, min(3, h, w)))
    s = draw(st.integers(1, k))
    p = draw(st.integers(0, k // 2))
    ceil = draw(st.booleans())
    d = draw(st.integers(1, 2)) if kind == "max" else 1
    if d * (k - 1) + 1 > min(h, w) + 2 * p:
        d = 1

    def size(x: int) -> int:
        span = x + 2 * p - d * (k - 1) - 1
        out = (-(-span // s) if ceil else span // s) + 1
        # the last window must start inside the input or its left padding
        if ceil and (out - 1) * s >= x + p:
            out -= 1
        return out

    if kind == "max":
        m: nn.Module = nn.MaxPool2d(k, s, p, dilation=d, ceil_mode=ceil)
    else:
        m = nn.AvgPool2d(k, s, p, ceil_mode=ceil, count_include_pad=draw(st.booleans()))
    return m, (n, c, size(h), size(w))


def branch(draw: Draw, shape: Shape, same: bool) -> tuple[nn.Module, Shape]:
    """One branch of a residual addition (``same``: keeps the shape) or of a concatenation."""
    kinds = ["identity", "act", "conv" if len(shape) == 4 else "linear"]
    kind = draw(st.sampled_from(kinds))
    if kind == "identity":
        return nn.Identity(), shape
    if kind == "act":
        return _activation(draw), shape
    if kind == "conv":
        if same:
            return conv(draw, shape, same=True)
        out = draw(st.integers(1, MAX_DIM))
        return nn.Conv2d(shape[1], out, 1, bias=draw(st.booleans())), (*shape[:1], out,
                                                                       *shape[2:])
    f = shape[1]
    out = f if same else draw(st.integers(1, 16))
    return nn.Linear(f, out, bias=draw(st.booleans())), (shape[0], out)


def chunk(draw: Draw, shape: Shape) -> tuple[nn.Module, Shape] | None:
    dims = [d for d in range(1, len(shape)) if shape[d] >= 2]
    if not dims:
        return None
    dim = draw(st.sampled_from(dims))
    chunks = draw(st.integers(2, min(3, shape[dim])))
    per = -(-shape[dim] // chunks)
    sizes = [min(per, shape[dim] - i * per) for i in range(-(-shape[dim] // per))]
    modes = ["first", "reverse"] + (["sum"] if len(set(sizes)) == 1 else [])
    mode = draw(st.sampled_from(modes))
    out = list(shape)
    if mode != "reverse":
        out[dim] = sizes[0]
    return Chunk(chunks, dim, mode), tuple(out)


def step(draw: Draw, shape: Shape) -> tuple[nn.Module, Shape]:
    """One operator applied to a tensor of ``shape`` (rank 4 or 2)."""
    if len(shape) == 4:
        kinds = ["conv", "conv", "conv_transpose", "batch_norm", "act", "residual", "cat",
                 "pool", "permute", "reshape", "chunk", "matmul", "self_matmul"]
        if math.prod(shape[1:]) <= MAX_FEATURES:
            kinds.append("flatten")
    else:
        kinds = ["linear", "linear", "matmul", "act", "residual", "cat", "chunk", "unflatten"]
    kind = draw(st.sampled_from(kinds))
    if kind == "conv":
        return conv(draw, shape)
    if kind == "conv_transpose":
        return conv_transpose(draw, shape)
    if kind == "batch_norm":
        return batch_norm(draw, shape)
    if kind == "act":
        return _activation(draw), shape
    if kind == "pool":
        return pool(draw, shape)
    if kind == "residual":
        a, sa = branch(draw, shape, same=True)
        b, sb = branch(draw, shape, same=True)
        assert sa == sb == shape
        return Residual(a, b), shape
    if kind == "cat":
        a, sa = branch(draw, shape, same=False)
        b, sb = branch(draw, shape, same=False)
        return Cat(a, b, 1), (shape[0], sa[1] + sb[1], *shape[2:])
    if kind == "chunk":
        got = chunk(draw, shape)
        if got is not None:
            return got
        return _activation(draw), shape
    if kind == "permute":
        rest = draw(st.permutations([1, 2, 3]))
        return Permute((0, *rest)), (shape[0], *(shape[d] for d in rest))
    if kind == "reshape":
        rest = draw(st.permutations(list(shape[1:])))
        return Reshape((shape[0], *rest)), (shape[0], *rest)
    if kind == "flatten":
        return nn.Flatten(), (shape[0], math.prod(shape[1:]))
    if kind == "unflatten":
        f = shape[1]
        h = draw(st.sampled_from([d for d in _divisors(f) if d <= MAX_DIM]))
        w = draw(st.sampled_from([d for d in _divisors(f // h) if d <= MAX_DIM]))
        new = (shape[0], f // (h * w), h, w)
        return Reshape(new), new
    if kind == "linear":
        out = draw(st.integers(1, 16))
        return nn.Linear(shape[1], out, bias=draw(st.booleans())), (shape[0], out)
    if kind == "matmul":
        out = draw(st.integers(1, MAX_DIM))
        return MatMul(shape[-1], out), (*shape[:-1], out)
    assert kind == "self_matmul"
    return SelfMatMul(), (*shape[:-1], shape[-2])


@st.composite
def cases(draw: Draw, min_ops: int = 2, max_ops: int = 5) -> Case:
    """A :class:`Case`: ``min_ops`` to ``max_ops`` operators on a ``[N, C, H, W]`` input."""
    seed = draw(st.integers(0, 2**16))
    shape: Shape = (draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
                    draw(st.integers(3, 10)), draw(st.integers(3, 10)))
    first = shape
    n_inputs = draw(st.sampled_from([1, 1, 1, 2]))
    combine = draw(st.sampled_from(["add", "mul", "cat"])) if n_inputs == 2 else None
    if combine == "cat":
        shape = (shape[0], 2 * shape[1], *shape[2:])
    layers: list[nn.Module] = []
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for _ in range(draw(st.integers(min_ops, max_ops))):
            layer, shape = step(draw, shape)
            layers.append(layer)
    return Case(Net(nn.Sequential(*layers), combine).eval(), first, seed, shape, n_inputs,
                n_inputs == 2 and draw(st.booleans()))
