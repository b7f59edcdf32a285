"""One kernel of a :class:`~ollie.program.program.Program` compiled into a callable
``fn(env, out) -> tensor`` (:func:`compile_kernel`), used by
:class:`~ollie.exec.executor.CompiledProgram`:

* library kernels: on the CPU a ``Matmul`` runs on the fastest matrix product for its
  operands (:mod:`ollie.exec.linear`) and a ``Conv`` with a constant weight on the fastest
  convolution for its configuration (:func:`ollie.exec.conv.best_conv`), each measured on
  its first call; on CUDA both go through PyTorch (cuBLAS / cuDNN); ``G2BMM`` / ``GBMM`` run
  the band kernels of :mod:`ollie.kernels.band`, or with those switched off
  (:data:`ollie.policy.BAND`) windowed ``torch.matmul`` products (:mod:`ollie.libs.torch_band`);
* eOperators run generated code: numba on CPU, Triton on CUDA (:mod:`ollie.codegen`), or the
  reference interpreter when asked (``backend="reference"``); on the CPU a concatenation
  inside one runs as ``torch.cat`` first (:mod:`ollie.exec.concat`);
* ``Alias`` kernels (identity eOperators found by post-processing) are zero-copy views;
* ``Node`` kernels run one graph operator as it is (:mod:`ollie.exec.node`; operators Ollie
  does not rewrite, e.g. max pooling or softmax).

``out``, when given, is a buffer the kernel may write its output into. Which of the
hand-written kernels may be chosen is an :class:`ollie.policy.Implementations` passed to
:func:`compile_kernel` (default: the settings').
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from ollie.errors import UnsupportedError
from ollie.exec import linear
from ollie.exec import reference as library
from ollie.exec.concat import ConcatSplit, split_concat
from ollie.exec.node import Env, KernelFn, node_fn
from ollie.ir import Expr
from ollie.libs.onednn import POST_OPS
from ollie.libs.tensors import kernel_input
from ollie.policy import BAND, Implementations
from ollie.program import params as kp
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind
from ollie.program.program import Program
from ollie.settings import current

OUT_KINDS = (KernelKind.EOP, KernelKind.MATMUL, KernelKind.G2BMM, KernelKind.GBMM)
"""Kernels that write into a given output buffer."""


def library_of(k: Kernel) -> str | None:
    """The convolution implementation a program-level choice fixed for kernel ``k``
    (``params["library"]``, see :mod:`ollie.optimizer.libraries`), or None: measured per
    configuration."""
    lib = k.params.library
    return str(lib) if lib else None


def _conv_fn(k: Kernel, constants: Mapping[str, torch.Tensor] | None = None,
             impls: Implementations | None = None) -> KernelFn:
    """Symmetric padding runs ``conv2d``; with a constant weight on the CPU, the fastest library
    implementation (:func:`ollie.exec.conv.best_conv`: the weight packed for oneDNN once,
    here, plain torch, ONNX Runtime or a Winograd convolution), with ``alpha`` folded into the
    weight. A fused
    epilogue (post-processing) adds the ``bias`` input per channel and the ``residual`` input,
    then applies ``activation``."""
    p = k.params
    assert isinstance(p, kp.ConvParams)
    symmetric = (p.ph_end is None or p.ph == p.ph_end) and (p.pw_end is None or p.pw == p.pw_end)
    stride, dil = (int(p.sh), int(p.sw)), (int(p.dh), int(p.dw))
    pad = (int(p.ph), int(p.pw))
    alpha = float(p.alpha)
    act = p.activation
    post = POST_OPS[str(act)] if act else None
    biases = list(k.inputs[2:2 + int(p.bias or 0)])
    skip = k.inputs[-1] if p.residual else None
    if symmetric and constants is not None and k.inputs[1] in constants and \
            k.inputs[0] not in constants and all(b in constants for b in biases):
        from ollie.exec.conv import best_conv
        from ollie.libs import onednn

        w = kernel_input(k, 1, constants)
        w = w * alpha if alpha != 1.0 else w
        bias = sum(constants[b].reshape(-1) for b in biases) if biases else None
        shape = (int(p.n), int(p.c), int(p.h), int(p.w))
        chosen: dict[bool, onednn.Conv] = {}  # per input memory format, on the first call
        made: onednn.Made = {}  # its output's shape and layout, per input memory format

        def run_library(env: Env, out: torch.Tensor | None) -> torch.Tensor:
            x = kernel_input(k, 0, env)
            fmt = onednn.is_channels_last(x)
            conv = chosen.get(fmt)
            if conv is None:
                conv = chosen[fmt] = best_conv(
                    "Conv2d", w, bias, shape, stride, pad, dil,
                    activation=str(act) if act else None, residual=skip is not None,
                    channels_last=fmt, prefer=library_of(k), impls=impls)
            args = (x,) if skip is None else (x, env[skip])
            return onednn.call_into(conv, args, out, made, fmt)

        return run_library
    if (biases or skip is not None) and not symmetric:
        raise UnsupportedError(f"Conv kernel -> {k.output}: a fused bias / residual needs "
                               "symmetric padding")

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        if not symmetric:
            y = library.run_kernel(k.without_activation(), env) if act else \
                library.run_kernel(k, env)
        else:
            x, w = kernel_input(k, 0, env), kernel_input(k, 1, env)
            y = F.conv2d(x, w, stride=stride, padding=pad, dilation=dil)
            y = y if alpha == 1.0 else y.mul_(alpha)
            for b in biases:
                y = y.add_(env[b].reshape(1, -1, 1, 1))
            if skip is not None:
                y = y.add_(env[skip].reshape(y.shape))
        return y if post is None else post(y)

    return run


def _matmul_fn(k: Kernel, constants: Mapping[str, torch.Tensor] | None = None,
               impls: Implementations | None = None) -> KernelFn:
    """``torch.matmul`` of the two inputs (read through their views) times ``alpha``; on the
    CPU (``constants`` given) the fastest library for the operands' shapes and strides
    (:func:`ollie.exec.linear.best_product`: MKL or oneDNN, either orientation, a constant
    operand packed for oneDNN or for the register-blocked kernel once), chosen on the first
    call for each shape and stride configuration."""
    assert isinstance(k.params, kp.MatmulParams)
    alpha = float(k.params.alpha)
    shape = tuple(k.output_shape)
    chosen: dict[tuple, tuple[str, linear.Product]] = {}

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        a, b = kernel_input(k, 0, env), kernel_input(k, 1, env)
        name = "MKL"
        if constants is not None:
            key = (a.shape, a.stride(), b.shape, b.stride())
            impl = chosen.get(key)
            if impl is None:
                impl = chosen[key] = linear.best_product(
                    a, b, constant=(k.inputs[0] in constants, k.inputs[1] in constants),
                    impls=impls)
            name, fn = impl
        if name != "MKL":
            y = fn(a, b)
        elif out is not None and a.dim() == b.dim():
            y = torch.matmul(a, b, out=out.view(*a.shape[:-1], b.shape[-1]))
        else:
            y = torch.matmul(a, b)
        y = y.reshape(shape)
        return y if alpha == 1.0 else y.mul_(alpha)

    return run


CUDA_CONFIGS = "cuda_configs"
"""An eOp kernel's parameter: each of its generated CUDA kernels' ``(BLOCK, num_warps)``,
recorded once the program was checked on a GPU (:func:`pin_cuda_configs`), so that the
program, saved and loaded elsewhere, runs the code it was checked with: Triton 3.6
miscompiled one kernel under one of the configurations the autotuner may pick, and the
autotuner picks by speed, so it may pick another one on another run."""


def pin_cuda_configs(kernels: Sequence[Kernel]) -> list[Kernel]:
    """``kernels`` with every eOp that ran on the GPU in this process given the launch
    configurations the autotuner chose for it (:data:`CUDA_CONFIGS`); the others as they
    are."""
    from ollie.codegen import compile_eop

    out = []
    for k in kernels:
        p = k.params
        if isinstance(p, kp.EOpParams) and k.expr is not None and p.cuda_configs is None:
            # on the GPU a fused activation runs in torch after the generated code for its
            # argument (_eop_fn)
            inner = k.without_activation().expr
            assert inner is not None
            fn = compile_eop(inner, backend="cuda")
            tuned = getattr(fn, "tuned_configs", lambda: None)()
            if tuned is not None:
                k = replace(k, params=replace(p, cuda_configs=[list(c) for c in tuned]))
        out.append(k)
    return out


GENERATED_ACTIVATIONS = ("tanh",)
"""Activation parameters of an eOperator that its generated CPU code computes itself
(:data:`ollie.codegen.body.TANH_PADE`: vectorised), faster than the generated code followed
by torch's in-place function. Sigmoid stays with torch (numba's ``np.exp`` is a scalar libm
call). Why (measured): docs/design/013-eoperator-kernels.md."""


def generated_kernel(k: Kernel, backend: str) -> Kernel:
    """The eOperator whose expression ``k``'s generated code computes: ``k`` without its
    ``activation`` parameter where torch applies that after the code (:func:`_eop_fn`)."""
    act = k.params.activation
    if act and not (backend == "cpu" and act in GENERATED_ACTIVATIONS):
        return k.without_activation()
    return k


def precompile_programs(programs: Sequence[Program]) -> int:
    """Compile ahead, side by side in one process per core (:func:`ollie.codegen.precompile.
    precompile`), the generated CPU code of every eOperator of ``programs`` (the code
    :func:`_eop_fn` compiles when the kernel is built). Returns how many module forms were
    compiled there."""
    from ollie.codegen.precompile import precompile

    exprs = [generated_kernel(k, "cpu").expr for prog in programs for k in prog.kernels
             if k.kind is KernelKind.EOP and k.expr is not None]
    return precompile([e for e in (_cpu_code(x) for x in exprs if x is not None)
                       if e is not None])


def _cpu_code(expr: Expr) -> Expr | None:
    """The expression the generated CPU code of an eOperator computing ``expr`` is compiled
    for: the rest after a concatenation (:func:`ollie.exec.concat.split_concat`; None when
    nothing is left), else ``expr``."""
    split = split_concat(expr)
    return expr if split is None else split.rest


_DISCOVERY = threading.local()


@contextmanager
def discovering() -> Iterator[list[Expr]]:
    """Within this context (in this thread), a generated CPU kernel given an input in a
    layout it has no code for yet (a channels-last convolution output, read in place by a
    variant of the kernel: :func:`~ollie.codegen.layout.permute_inputs`) does not compile
    that variant: it appends the variant's expression to the list this yields and computes
    its output from contiguous copies of its inputs (the same values). The variants can
    then be compiled ahead together (:func:`ollie.codegen.precompile.precompile`) before
    the programs are timed."""
    found: list[Expr] = []
    outer = getattr(_DISCOVERY, "found", None)
    _DISCOVERY.found = found
    try:
        yield found
    finally:
        _DISCOVERY.found = outer


def _eop_fn(k: Kernel, backend: str) -> KernelFn:
    """Generated code for the eOperator; one with an ``activation`` parameter (tanh, sigmoid:
    post-processing) runs the code for its argument, then the torch function in place, except
    for the activations of :data:`GENERATED_ACTIVATIONS` on the CPU, which the generated code
    applies as it stores each value."""
    code = generated_kernel(k, backend)
    if code is not k:
        inner = _eop_fn(code, backend)
        apply = linear.ACTIVATIONS[str(k.params.activation)]
        return lambda env, out: apply(inner(env, out))
    from ollie.codegen import compile_eop
    from ollie.codegen.layout import dense_permutation, permute_inputs

    split = split_concat(k.expr) if backend == "cpu" and k.expr is not None else None
    if split is not None:
        return _concat_fn(k, split)
    p = k.params
    assert isinstance(p, kp.EOpParams) and k.expr is not None
    pinned = p.cuda_configs if backend == "cuda" else None
    extra = {} if pinned is None else {"cuda_configs": pinned}
    fn = compile_eop(k.expr, backend=backend, **extra)
    names = k.inputs
    run_flat = getattr(fn, "run_flat", None)
    if run_flat is not None:
        # generated CPU code: flat numpy views of the tensors, no per-call checks (the
        # program's shapes were checked when it was built)
        order = fn.input_names
        shape = tuple(k.output_shape)
        variants: dict[tuple, Callable] = {(None,) * len(order): run_flat}

        def run_cpu(env: Env, out: torch.Tensor | None) -> torch.Tensor:
            flat, perms = [], []
            for n in order:
                t = env[n]
                perm = None
                if not t.is_contiguous():
                    # a permutation of a dense array (a channels-last conv output) is read in
                    # place by a kernel for the permuted declaration (ollie.codegen.layout)
                    perm = dense_permutation(t.shape, t.stride())
                    t = t.contiguous() if perm is None else t.permute(perm)
                perms.append(perm)
                flat.append(t.detach().numpy().reshape(-1))
            key = tuple(perms)
            run = variants.get(key)
            if run is None:
                rewritten = permute_inputs(k.expr, {n: p for n, p in zip(order, perms,
                                                                         strict=True) if p})
                found = getattr(_DISCOVERY, "found", None)
                if found is not None:  # recorded, not compiled (discovering())
                    found.append(rewritten)
                    run = run_flat
                    flat = [env[n].detach().contiguous().numpy().reshape(-1) for n in order]
                else:
                    run = variants[key] = compile_eop(rewritten, backend=backend).run_flat
            if out is None or not out.is_contiguous():
                out = torch.empty(shape)
            run(flat, out.numpy().reshape(-1))
            return out

        return run_cpu

    declared = k.expr.inputs

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        ins = {n: env[n] for n in names}
        if backend == "cuda":
            # a tensor read as a reshape of itself (a 0-d constant declared [1]), row-major as
            # the CPU code reads every tensor flat; the kernel checks the shapes it is given
            return fn({n: t if n not in declared or tuple(t.shape) == declared[n]
                       or t.numel() != math.prod(declared[n]) else t.reshape(declared[n])
                       for n, t in ins.items()}, out)
        arrays = {n: t.detach().contiguous().numpy() for n, t in ins.items()}
        res = fn(arrays, None if out is None else out.numpy())
        return out if out is not None else torch.from_numpy(res)

    return run


def _concat_fn(k: Kernel, split: ConcatSplit) -> KernelFn:
    """The eOperator ``k`` as ``torch.cat`` of the tensors it concatenates, then the generated
    code of the rest reading that (:mod:`ollie.exec.concat`)."""
    if split.rest is None:
        return lambda env, out: split.cat(env, out)
    rest = split.rest
    inner = _eop_fn(Kernel(KernelKind.EOP, {"expr": str(rest)}, tuple(n for n, _ in rest.decls),
                           k.output, rest), "cpu")
    names = [n for n, _ in rest.decls if n != split.name]

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        return inner({split.name: split.cat(env), **{n: env[n] for n in names}}, out)

    return run


def _band_fn(k: Kernel, impls: Implementations) -> KernelFn:
    """G2BMM / GBMM (:mod:`ollie.kernels.band`), into ``out`` when one is given; where
    ``impls`` leaves the band kernels out, the vendor path of :mod:`ollie.libs.torch_band`."""
    p = k.params
    if not impls.allows(BAND):
        return _vendor_band_fn(k)
    from ollie.kernels import band

    assert isinstance(p, kp.G2BMMParams | kp.GBMMParams)
    w, d = int(p.w), int(p.d)
    alpha = float(p.alpha)
    op = band.g2bmm if k.kind is KernelKind.G2BMM else band.gbmm

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        a, b = kernel_input(k, 0, env), kernel_input(k, 1, env)
        target = None
        if out is not None:
            want = (*a.shape[:2], 2 * w + 1) if k.kind is KernelKind.G2BMM else tuple(b.shape)
            if out.numel() == int(np.prod(want)):
                target = out.view(want)
        y = op(a, b, w, d, out=target)
        return y if alpha == 1.0 else y.mul_(alpha)

    return run


def _vendor_band_fn(k: Kernel) -> KernelFn:
    """G2BMM / GBMM as windowed ``torch.matmul`` products (:mod:`ollie.libs.torch_band`)."""
    from ollie.libs import torch_band

    p = k.params
    assert isinstance(p, kp.G2BMMParams | kp.GBMMParams)
    w, d = int(p.w), int(p.d)
    alpha = float(p.alpha)
    op = torch_band.g2bmm if k.kind is KernelKind.G2BMM else torch_band.gbmm

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        y = op(kernel_input(k, 0, env), kernel_input(k, 1, env), w, d)
        return y if alpha == 1.0 else y.mul_(alpha)

    return run


def _alias_fn(k: Kernel) -> KernelFn:
    assert isinstance(k.params, kp.AliasParams)
    offset, sizes, strides = k.params.view
    src = k.inputs[0]

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        flat = env[src].contiguous().reshape(-1)
        return torch.as_strided(flat, tuple(sizes), tuple(strides),
                                flat.storage_offset() + int(offset))

    return run


def compile_kernel(k: Kernel, backend: str = "cpu",
                   constants: Mapping[str, torch.Tensor] | None = None,
                   impls: Implementations | None = None) -> KernelFn:
    """A callable ``(env, out) -> tensor`` executing ``k``; the result has the shape of the
    kernel's expression (library operators compute it in a compatible flat layout).
    ``constants``: the program's constant tensors, which a kernel may pre-process once (a
    convolution's weight packed for oneDNN). ``impls``: the implementations it may choose
    among (:mod:`ollie.policy`; default the settings')."""
    fn = _compile(k, backend, constants, impls or current().implementations)
    shape = tuple(k.output_shape)

    def run(env: Env, out: torch.Tensor | None) -> torch.Tensor:
        y = fn(env, out)
        return y if tuple(y.shape) == shape else y.reshape(shape)

    return run


def plain_kernel(k: Kernel, impls: Implementations | None = None) -> KernelFn:
    """``k`` run on the CPU with PyTorch's plain operators (:func:`compile_kernel` without
    constants: no library choice timed; ``impls`` as there): what an ONNX Runtime region is
    checked against (:func:`ollie.backends.onnxrt.region.build_region`)."""
    return compile_kernel(k, "cpu", None, impls)


def _compile(k: Kernel, backend: str, constants: Mapping[str, torch.Tensor] | None,
             impls: Implementations) -> KernelFn:
    if k.kind is KernelKind.EOP:
        return _eop_fn(k, backend)
    if k.kind is KernelKind.CONV:
        return _conv_fn(k, constants if backend == "cpu" else None, impls)
    if k.kind is KernelKind.MATMUL:
        return _matmul_fn(k, constants if backend == "cpu" else None, impls)
    if k.kind is KernelKind.ALIAS:
        return _alias_fn(k)
    if k.kind is KernelKind.NODE:
        return node_fn(k, constants if backend == "cpu" else None, library_of(k), impls)
    if k.kind in kp.BAND_KINDS:
        return _band_fn(k, impls)
    if k.kind in library.RUNNERS:
        return lambda env, out: library.run_kernel(k, env)
    raise UnsupportedError(f"no runtime for kernel kind '{k.kind}'")
