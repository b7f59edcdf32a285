"""Executing a :class:`~ollie.program.program.Program`: each kernel compiled once into a
callable (:mod:`ollie.exec.dispatch`), run in order on torch tensors, intermediate buffers
reused; runs of kernels marked as an ONNX Runtime region (:mod:`ollie.backends.onnxrt.region`)
run as one ONNX Runtime session on the CPU; on CUDA the program replays as a CUDA graph
(:mod:`ollie.exec.cuda_graph`).

Buffer planning: an intermediate tensor's storage returns to a pool after its last reader ran
and is reused by a later eOperator output of the same size, so a program allocates about its
peak working set once instead of one buffer per kernel. On the CPU, those buffers and the
outputs of the other kernels that write into a given buffer come from a
:class:`~ollie.exec.buffers.BufferCache`: reused across calls once the caller has dropped
every tensor using them (no fresh page faults for large outputs on every call).
Convolutions (library ``Conv`` kernels and ``Conv2d`` nodes run through oneDNN) write into
such a buffer when their output is at least :data:`CONV_OUT_MIN_BYTES`, and a convolution
with a folded residual addition writes into the residual itself when that is the residual's
last use (:func:`ollie.libs.onednn.writes_into`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import numpy as np
import torch

from ollie.backends.onnxrt import region as ort_region
from ollie.errors import ShapeError
from ollie.exec.buffers import BufferCache
from ollie.exec.dispatch import OUT_KINDS, compile_kernel, plain_kernel
from ollie.exec.node import Env, KernelFn, writes_out
from ollie.libs.onednn import dense
from ollie.policy import Implementations
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind, NodeParams
from ollie.program.program import Program, constant_array
from ollie.settings import current

__all__ = ["PROFILE_CALLS", "CompiledProgram", "compile_kernel"]


PROFILE_CALLS = 20
"""Calls of a kernel captured in one CUDA graph by :meth:`CompiledProgram.profile`."""


VIEW_OPS = ("Opaque", "Reshape", "Flatten", "Transpose", "Identity", "Slice", "Expand",
            "Unfold")
"""Graph operators whose reference implementation may return a view of an input."""

CONV_OUT_MIN_BYTES = 8 << 20
"""Convolution outputs from this size on are written into a reused buffer (zeroed, then the
convolution added into it): a fresh output that large is page-faulted in on every call. Smaller
ones are left to the allocator, which mostly hands back memory still mapped from the previous
call. Why this size (measured): docs/design/003-library-kernels-on-the-cpu.md."""


def conv_takes_out(k: Kernel) -> bool:
    """Whether ``k`` is a convolution that may write into a given buffer (a library ``Conv``
    kernel, or a ``Conv2d`` graph node run as it is, with one output)."""
    if k.kind is KernelKind.CONV:
        return True
    p = k.params
    return isinstance(p, NodeParams) and p.node.op == "Conv2d" and len(p.node.outputs) == 1


def may_return_view(k: Kernel) -> bool:
    """Whether ``Node`` kernel ``k`` may return (a view of) one of its inputs."""
    p = k.params
    return isinstance(p, NodeParams) and p.node.op in VIEW_OPS and \
        not p.activation and not p.residual


def _constant(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A program constant on ``device``; on the CPU a writable, C-contiguous array is shared,
    not copied (a program's weights are read, never written, by its kernels)."""
    if device.type == "cpu" and a.flags.writeable and a.flags.c_contiguous and \
            a.dtype.isnative:
        return torch.from_numpy(a)
    return torch.tensor(a, device=device)


class CompiledProgram:
    """A program ready to run: ``compiled(*inputs)`` or ``compiled.run({name: tensor})``."""

    def __init__(self, program: Program, device: str = "cpu", backend: str | None = None,
                 cuda_graphs: bool | None = None, impls: Implementations | None = None,
                 check_regions: bool = True) -> None:
        """``cuda_graphs``: on a CUDA device, run the program as it is on its first call, capture
        it as a CUDA graph on its second and replay that from then on
        (:mod:`ollie.exec.cuda_graph`; default: on unless ``OLLIE_CUDA_GRAPHS=0``).
        ``impls``: the implementations its kernels may choose among (:mod:`ollie.policy`;
        default: the settings' in effect now, kept for every later call).
        ``check_regions``: each ONNX Runtime region is checked against its kernels run one by
        one before it is used (off only for a program about to be checked end to end, which
        then fails as a whole where a region disagrees)."""
        program.check()
        self.program = program
        self.impls = impls or current().implementations
        # the device with its index resolved ("cuda" -> "cuda:0"), as tensors on it report it
        self.device = torch.empty(0, device=device).device
        self.backend = backend or ("cuda" if self.device.type == "cuda" else "cpu")
        self.input_shapes = [(n, torch.Size(s)) for n, s in program.inputs]
        self.constants = {n: _constant(constant_array(v), self.device)
                          for n, v in program.constants.items()}
        self.spins = False  # an ONNX Runtime region's threads busy-wait after a run
        self.followers: set[int] = set()  # a region's kernels after its first: nothing to run
        self.regions: dict[int, ort_region.Region] = {}  # by first kernel
        self.check_regions = check_regions
        regions = self._regions()
        self.fns = [regions.get(i) or compile_kernel(k, self.backend, self.constants, self.impls)
                    for i, k in enumerate(program.kernels)]
        self.in_region = [i in regions for i in range(len(program.kernels))]
        self.buffers = BufferCache() if self.device.type == "cpu" else None
        self._plan()
        if cuda_graphs is None:
            from ollie.exec import cuda_graph

            cuda_graphs = cuda_graph.enabled()
        self.cuda_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self._graph: Callable[[], dict[str, torch.Tensor]] | None = None
        self._static: Env = {}
        self.whole = self._whole_region()

    def _whole_region(self) -> ort_region.Region | None:
        """The region that is the whole program, if one is: it runs every kernel, reads the
        program's inputs in their order and returns its outputs in theirs. A call then goes
        straight to :meth:`ort_region.Region.call` (when its arguments need no conversion)."""
        region = self.regions.get(0)
        if region is None or len(self.steps) != 1 or self.cuda_graphs or \
                region.inputs != [n for n, _ in self.program.inputs] or \
                region.outputs != list(self.program.outputs):
            return None
        return region

    def _regions(self) -> dict[int, KernelFn]:
        """Kernel functions of the program's ONNX Runtime regions
        (:mod:`ollie.backends.onnxrt.region`, CPU only): the first kernel of a region runs its
        session, which stores every output of the region in the environment; the region's
        other kernels only pass their output on (None: read only inside the region). A region
        that cannot be built runs kernel by kernel."""
        if self.backend != "cpu":
            return {}
        fns: dict[int, KernelFn] = {}
        check = functools.partial(plain_kernel, impls=self.impls) if self.check_regions else None
        for start, end in ort_region.groups(self.program):
            region = ort_region.build_region(self.program, start, end, self.constants, check)
            if region is None:
                continue
            self.spins |= region.spinning
            self.regions[start] = region

            def first(env: Env, out: torch.Tensor | None, r: ort_region.Region = region,
                      name: str = self.program.kernels[start].output) -> torch.Tensor:
                r.run(env, self.buffers)
                return env.get(name)  # type: ignore[return-value]

            fns[start] = first
            self.followers.update(range(start + 1, end))
            for i in range(start + 1, end):
                name = self.program.kernels[i].output
                fns[i] = lambda env, out, name=name: env.get(name)  # type: ignore[misc]
        return fns

    def _plan(self) -> None:
        """Which kernels write into a pooled buffer, and when buffers return to the pool."""
        kernels = self.program.kernels
        last_use: dict[str, int] = {}
        for i, k in enumerate(kernels):
            for n in k.inputs:
                last_use[n] = i
        keep = set(self.program.outputs) | {n for n, _ in self.program.inputs} | \
            set(self.constants)
        self.release: list[list[str]] = [[] for _ in kernels]
        for name, i in last_use.items():
            if name not in keep:
                self.release[i].append(name)
        # buffers of aliased tensors stay alive through their aliases: never pooled. A graph
        # node run as it is may return a view of its inputs (a reshape, a split, an opaque
        # operator): its inputs count as aliased
        aliased = {k.inputs[0] for k in kernels if k.kind is KernelKind.ALIAS} | \
            {n for k in kernels if may_return_view(k) for n in k.inputs}
        self.pooled = [k.kind in (KernelKind.EOP, KernelKind.MATMUL) and k.output not in keep and
                       k.output not in aliased and not r
                       for k, r in zip(kernels, self.in_region, strict=True)]
        # the other kernels that can write into a given buffer take one from the cache
        self.cached = [(k.kind in OUT_KINDS or writes_out(k)) and not p and not r
                       for k, p, r in zip(kernels, self.pooled, self.in_region, strict=True)]
        self.pooled_names = {k.output for k, p in zip(kernels, self.pooled, strict=True) if p}
        # output shapes and sizes, computed once (an expression's shape is derived per access)
        self.shapes = [tuple(k.output_shape) for k in kernels]
        self.numels = [math.prod(shape) for shape in self.shapes]
        self._plan_convs(keep, aliased)
        # what a call runs: a region's first kernel stores all of the region's outputs, so its
        # other kernels are skipped, their releases done after the step before them
        self.steps: list[tuple[str, KernelFn, bool, bool, list[str], tuple[int, ...], int,
                               str | None]] = []
        for i, k in enumerate(kernels):
            if i in self.followers and self.steps:
                self.steps[-1][4].extend(self.release[i])
                continue
            self.steps.append((k.output, self.fns[i], self.pooled[i], self.cached[i],
                               list(self.release[i]), self.shapes[i], self.numels[i],
                               self.into[i]))

    def _plan_convs(self, keep: set[str], aliased: set[str]) -> None:
        """Which convolutions write into their residual input (``into``: its name) or into a
        cached buffer (``cached``). A residual qualifies when this is its last use, it has the
        output's shape, and its storage is the program's alone: not an input, output or
        constant, not viewed by another tensor nor itself a view, not a pooled buffer."""
        kernels = self.program.kernels
        self.into: list[str | None] = [None] * len(kernels)
        if self.buffers is None:
            return
        shapes = self.program.tensor_shapes()
        shared = keep | aliased | self.pooled_names | \
            {k.output for k in kernels if k.kind is KernelKind.ALIAS or may_return_view(k)}
        for i, k in enumerate(kernels):
            if not conv_takes_out(k) or self.in_region[i]:
                continue
            r = k.inputs[-1] if k.params.residual else None
            if r is not None and r in self.release[i] and k.inputs.count(r) == 1 and \
                    tuple(shapes.get(r, ())) == self.shapes[i] and \
                    r not in shared:
                self.into[i] = r
            elif self.numels[i] * 4 >= CONV_OUT_MIN_BYTES:
                self.cached[i] = True

    def _new(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.buffers is not None:
            return self.buffers.get(shape)
        return torch.empty(shape, device=self.device)

    def run(self, inputs: Mapping[str, object]) -> dict[str, torch.Tensor]:
        """The program's outputs for ``inputs`` (``{name: tensor or array}``), fresh tensors.
        Inputs of another dtype are converted to float32, tensors on another device moved to
        the program's (a call, :meth:`__call__`, takes floating-point inputs on the
        program's device only); one that is missing, not a tensor or array, of another shape
        or without data (a meta tensor) raises :class:`~ollie.errors.ShapeError` naming
        it."""
        feed = self._feed(inputs)
        if not self.cuda_graphs:
            return self._execute(feed)
        from ollie.exec.cuda_graph import Graphed

        # the graph reads fixed input tensors: the caller's values are copied into them
        with torch.inference_mode():
            if self._graph is None:
                self._static = {n: t.clone() for n, t in feed.items()}
                self._graph = Graphed(lambda: self._execute(self._static),
                                      f"program {self.program.summary()}")
            else:
                for name, t in feed.items():
                    self._static[name].copy_(t)
            outs = self._graph()
        # the graph overwrites its outputs on the next call: the caller gets copies
        return {n: t.clone() for n, t in outs.items()}

    def _feed(self, inputs: Mapping[str, object]) -> Env:
        """The program's inputs as float32 tensors on the device (:meth:`_input`)."""
        env: Env = {}
        for name, shape in self.input_shapes:
            if name not in inputs:
                raise ShapeError(f"missing input '{name}' (expected shape {list(shape)})")
            # a channels-last input (a convolution's output, in a selection measurement) is
            # kept so: every kernel reads it correctly, library convolutions without a copy
            env[name] = dense(self._input(name, shape, inputs[name]))
        return env

    def _expected(self, shape: tuple[int, ...]) -> str:
        return f"a float32 tensor of shape {list(shape)} on {self.device}"

    def _input(self, name: str, shape: tuple[int, ...], value: object) -> torch.Tensor:
        """Input ``name`` (``value``: a torch tensor or a numpy array, with data) as a float32
        tensor of ``shape`` on the device: converted and moved there if need be, detached if
        it requires grad (the program computes no gradients). A float32 tensor on the device
        costs a few attribute reads, no copy. Anything else raises
        :class:`~ollie.errors.ShapeError` naming the input, what it expected and what it
        got."""
        t = value
        if type(t) is not torch.Tensor:
            t = self._tensor(name, shape, t)
        if t.device != self.device or t.dtype is not torch.float32:
            if t.device.type == "meta":
                raise ShapeError(f"input '{name}' is a meta tensor (it has no data), "
                                 f"expected {self._expected(shape)}")
            try:
                t = t.to(self.device, torch.float32)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ShapeError(f"input '{name}' ({t.dtype} on {t.device}) cannot be "
                                 f"converted to {self._expected(shape)} ({exc})") from None
        if t.shape != shape:
            raise ShapeError(f"input '{name}' has shape {list(t.shape)}, expected "
                             f"{self._expected(shape)}")
        return t.detach() if t.requires_grad else t

    def _tensor(self, name: str, shape: tuple[int, ...], value: object) -> torch.Tensor:
        """``value``, a tensor subclass or a numpy array, as a tensor (a CPU float32 array
        without a copy); anything else raises :class:`~ollie.errors.ShapeError`."""
        if isinstance(value, torch.Tensor):
            return value
        if not isinstance(value, np.ndarray):
            got = "None" if value is None else f"a {type(value).__name__}"
            raise ShapeError(f"input '{name}' is {got}, expected {self._expected(shape)}")
        try:
            return torch.as_tensor(value, dtype=torch.float32, device=self.device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ShapeError(f"input '{name}' is a numpy array of dtype {value.dtype}, "
                             f"expected {self._expected(shape)} ({exc})") from None

    def _check_call(self, args: tuple[object, ...]) -> None:
        """Raise :class:`~ollie.errors.ShapeError` for an argument of a call that is not a
        floating-point tensor (or numpy array) with data on the program's device: what a call
        refuses beyond :meth:`run`, which also converts integers and moves tensors. The
        shapes are checked by :meth:`_input`."""
        for (name, shape), x in zip(self.input_shapes, args, strict=True):
            if isinstance(x, np.ndarray):
                if x.dtype.kind != "f":
                    raise ShapeError(f"input '{name}' is a numpy array of dtype {x.dtype}, "
                                     f"expected {self._expected(shape)} (or a floating-point "
                                     "array)")
                continue
            if not isinstance(x, torch.Tensor):
                self._tensor(name, shape, x)  # raises, naming what it got
                continue
            if x.device != self.device:
                if x.device.type == "meta":
                    raise ShapeError(f"input '{name}' is a meta tensor (it has no data), "
                                     f"expected {self._expected(shape)}")
                raise ShapeError(f"input '{name}' is on {x.device}, expected "
                                 f"{self._expected(shape)}: the program was built for "
                                 f"{self.device}; move the input with .to('{self.device}')")
            if not x.is_floating_point():
                raise ShapeError(f"input '{name}' has dtype {x.dtype}, expected "
                                 f"{self._expected(shape)} (a floating-point tensor is "
                                 "converted): the program computes in float32")

    def _execute(self, feed: Env) -> dict[str, torch.Tensor]:
        """Run every kernel in order on the checked inputs ``feed``."""
        env: Env = dict(self.constants)
        env.update(feed)
        pool: dict[int, list[torch.Tensor]] = {}
        for output, fn, pooled, cached, release, shape, numel, into in self.steps:
            out = None
            if into is not None:
                out = env[into]
            elif pooled:
                free = pool.get(numel)
                out = free.pop().view(shape) if free else self._new(shape)
            elif cached and self.buffers is not None:
                out = self.buffers.get(shape)
            env[output] = fn(env, out)
            for name in release:
                t = env.pop(name, None)
                if t is not None and name in self.pooled_names:
                    pool.setdefault(t.numel(), []).append(t)
        return {n: env[n] for n in self.program.outputs}

    def profile(self, inputs: Mapping[str, object], repeats: int = 5) -> list[float]:
        """Median seconds of each kernel run on its own (inputs computed beforehand); a sample
        of a kernel faster than 1 ms times back-to-back calls (timer jitter). An ONNX Runtime
        region runs its whole session at its first kernel: that kernel's time is the region's,
        its other kernels' times are those of passing a tensor on. With CUDA graphs on, a
        sample replays a graph of :data:`PROFILE_CALLS` calls of the kernel: the kernel's time
        on the device, without the launch overhead a program's graph does not pay either."""
        with torch.inference_mode():   # as a call runs: kernels may reuse inference buffers
            return self._profile(inputs, repeats)

    def _profile(self, inputs: Mapping[str, object], repeats: int) -> list[float]:
        from ollie.exec.cuda_graph import Graphed
        from ollie.tune.measure import measure_alternating

        env = dict(self.constants)
        env.update({n: torch.as_tensor(inputs[n], dtype=torch.float32, device=self.device)
                    for n, _ in self.program.inputs})
        times = []
        for i, (k, fn) in enumerate(zip(self.program.kernels, self.fns, strict=True)):
            # a buffer where a call gives one (reused there: no first-touch page faults)
            out = torch.empty(self.shapes[i], device=self.device) \
                if self.pooled[i] or self.cached[i] else None
            into = self.into[i]
            kenv, out = self._residual_copy(env, into) if into is not None else (env, out)
            call, calls = (lambda f=fn, o=out, e=kenv: f(e, o)), 1
            if self.cuda_graphs:
                calls = PROFILE_CALLS
                call = Graphed(lambda f=fn, o=out: [f(env, o) for _ in range(PROFILE_CALLS)],
                               f"kernel -> {k.output}")
            times.append(measure_alternating({"k": call}, self.device.type, rounds=repeats,
                                             min_sample=1e-3)["k"] / calls)
            if into is not None:
                kenv, out = self._residual_copy(env, into)
            env[k.output] = fn(kenv, out)
        return times

    @staticmethod
    def _residual_copy(env: Env, into: str) -> tuple[Env, torch.Tensor]:
        """``env`` with a copy of the residual ``into``, and that copy: a convolution adding
        into its residual is profiled on it (the residual itself stays as the program
        computed it)."""
        copy = env[into].clone(memory_format=torch.preserve_format)
        return {**env, into: copy}, copy

    def __call__(self, *args: object) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The program's output (a tuple for several) for its inputs in order: floating-point
        tensors (or numpy arrays) of the input shapes on the program's device, in any layout
        (channels-last, strided views), converted to float32 where they are not. A wrong
        number of inputs, another shape, an integer, boolean or complex dtype, a tensor on
        another device, a meta tensor, None or anything else raises
        :class:`~ollie.errors.ShapeError` naming the input, what it expected and what it
        got. Dense float32 tensors of a program that is one ONNX Runtime region go straight to
        its session."""
        names = [n for n, _ in self.program.inputs]
        if len(args) != len(names):
            raise ShapeError(f"program takes {len(names)} input(s) ({', '.join(names)}), "
                             f"got {len(args)}")
        # a program that is one ONNX Runtime region, called with dense float32 CPU tensors of
        # the right shapes: straight to the session (anything else: checked and converted)
        direct = self.whole.call(args, self.buffers) if self.whole is not None else None
        if direct is not None:
            return direct[0] if len(direct) == 1 else tuple(direct)
        self._check_call(args)
        outs = self.run(dict(zip(names, args, strict=True)))
        res = tuple(outs[n] for n in self.program.outputs)
        return res[0] if len(res) == 1 else res
