"""Post-processing of programs (paper section "Post-Processing").

* **Compile-time evaluation**: a kernel reading only constants (weights) is run once now and
  its output becomes a constant (e.g. a weight layout transformation).
* **eOperator fusion**: an eOperator whose output only one other eOperator reads is fused into
  it by expression fusion (the chain rule); the producer's scope is then inlined by traversal
  merging wherever that is exact, else it stays a nested scope computed inside the one kernel.
  Element-wise operators after an eOperator (bias, ReLU, ...) are eOperators too, so they
  fuse the same way; only a following tanh / sigmoid becomes the eOperator's ``activation``
  parameter instead: the runtime applies it to the computed values, by torch in place after
  the generated code (numba's ``np.tanh`` is a scalar libm call), or, for tanh on the CPU,
  inside the generated code by a vectorised approximation
  (:data:`ollie.exec.dispatch.GENERATED_ACTIVATIONS`; measured:
  docs/design/013-eoperator-kernels.md).
* **Epilogue fusion into convolutions**: an eOperator computing ``f(conv + bias[c] + r)``
  over the whole output of a convolution (a ``Conv`` kernel, or an original ``Conv2d`` /
  ``ConvTranspose2d`` operator kept as a ``Node``) that nothing else reads, every part but
  ``conv`` optional (``f`` ReLU, tanh or sigmoid; ``bias`` a per-channel constant, a folded
  BatchNorm; ``r`` a residual connection), folds into the convolution: one library call
  (oneDNN's bias, binary-add and eltwise post-ops while the output is in cache; ONNX Runtime's
  fused Conv+Add+activation) instead of a convolution and a memory-bound eOperator. A ``Conv``
  kernel's expression becomes the fused one, so it stays exact; bias and residual need a
  ``Conv`` kernel with a constant weight and symmetric padding (the library path), a node
  takes a residual and an activation.
* **Identity eOperator elimination**: an eOperator that only re-reads one tensor in the same
  flat order (a reshape, or a contiguous slice) becomes an ``Alias`` kernel: a zero-copy view.

Every pass keeps the program exact; :func:`postprocess` runs them to a fixpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TypedDict

import numpy as np
import torch

from ollie.activations import ACTIVATIONS as FUSED
from ollie.ir import Access, Affine, BinOp, Call, Expr, Scope, accesses, const
from ollie.match.eop import make_eop
from ollie.program.kernel import Kernel, as_int
from ollie.program.params import AliasParams, ConvParams, KernelKind, NodeParams
from ollie.program.program import Program
from ollie.rules.inter import expression_fusion
from ollie.rules.traversal_merging import inline

log = logging.getLogger(__name__)


def fold_constants(prog: Program, backend: str = "reference") -> Program:
    """Evaluate kernels whose inputs are all constants; their outputs become constants (eOps
    through the reference interpreter by default: exact, and nothing to compile)."""
    from ollie.exec.dispatch import compile_kernel

    constants = dict(prog.constants)
    kernels = []
    for k in prog.kernels:
        if k.kind is not KernelKind.NODE and k.inputs and \
                all(n in constants for n in k.inputs) and k.output not in prog.outputs:
            # (a read-only constant, e.g. a loaded program's, is copied: torch warns on it)
            env = {n: torch.as_tensor(c if c.flags.writeable else c.copy())
                   for n in k.inputs for c in (np.asarray(constants[n]),)}
            out = compile_kernel(k, backend)(env, None)
            constants[k.output] = np.ascontiguousarray(out.detach().cpu().numpy(),
                                                       dtype=np.float32)
            log.debug("folded %s -> %s at optimisation time", k.kind, k.output)
        else:
            kernels.append(k)
    used = {n for k in kernels for n in k.inputs} | set(prog.outputs)
    constants = {n: v for n, v in constants.items() if n in used}
    return Program(prog.inputs, prog.outputs, kernels, constants)


def inline_nested(expr: Expr) -> Expr:
    """Inline every nested scope of the root that traversal merging can inline exactly."""
    root = expr.root
    changed = True
    while changed:
        changed = False
        nested = [a for a in accesses(root.body) if isinstance(a.source, Scope)]
        for pos in range(len(nested)):
            new = inline(root, pos, expr.inputs)
            if new is not None:
                root, changed = new, True
                break
    return Expr(expr.decls, root)


def fuse_eops(prog: Program) -> Program:
    """Fuse an eOperator into its only consumer when that is an eOperator too."""
    kernels = list(prog.kernels)
    changed = True
    while changed:
        changed = False
        readers: dict[str, list[int]] = {}
        for i, k in enumerate(kernels):
            for n in set(k.inputs):
                readers.setdefault(n, []).append(i)
        for i, p in enumerate(kernels):
            users = readers.get(p.output, [])
            if p.kind is not KernelKind.EOP or p.output in prog.outputs or len(users) != 1:
                continue
            c = kernels[users[0]]
            if c.kind is not KernelKind.EOP:
                continue
            fn = activation_of(c, p.output)
            fused = inline_nested(expression_fusion(c.expr, p.output, p.expr))
            if fn in TORCH_ACTIVATIONS and p.params.activation is None:
                # f(p) with f applied by the runtime to p's values (torch in place, or the
                # generated code's vectorised tanh), not by numba's scalar libm call per
                # element (docs/design/013-eoperator-kernels.md)
                new = make_eop(fused.root, dict(fused.decls), c.output)
                kernels[users[0]] = Kernel(KernelKind.EOP, replace(new.params, activation=fn),
                                           new.inputs, c.output, new.expr, ())
                del kernels[i]
                changed = True
                break
            inputs = tuple(n for n, _ in fused.decls if _reads(fused.root, n))
            fused = Expr(tuple((n, s) for n, s in fused.decls if n in inputs), fused.root)
            new = make_eop(fused.root, fused.inputs, c.output)
            kernels[users[0]] = new
            del kernels[i]
            changed = True
            break
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


ACTIVATIONS = tuple(FUSED)
"""Element-wise functions a convolution kernel can apply to its output (oneDNN post-ops:
:data:`ollie.activations.ACTIVATIONS`)."""
TORCH_ACTIVATIONS = ("tanh", "sigmoid")
"""Activations an eOperator applies with torch after its generated loop nest (``activation``
parameter) instead of fusing them into it: transcendental, scalar and slow in numba."""
FUSIBLE_NODES = ("Conv2d", "ConvTranspose2d")


def _whole(k: Kernel, arg: object) -> str | None:
    """The tensor ``arg`` reads if it is an access to the whole of an input of eOperator
    ``k`` in the output's own order (same shape, every index the matching iterator, or 0 for
    an iterator of size 1)."""
    assert k.expr is not None
    root = k.expr.root
    if not isinstance(arg, Access) or not isinstance(arg.source, str):
        return None
    shape = dict(k.expr.decls).get(arg.source)
    if shape is None or tuple(shape) != tuple(it.size for it in root.traversal) or \
            any(it.lo != 0 for it in root.traversal):
        return None
    if len(arg.indices) != len(root.traversal):
        return None
    for idx, it in zip(arg.indices, root.traversal, strict=True):
        if not idx.is_linear:
            return None
        if it.size == 1 and not idx.vars() and idx.const == 0:
            continue
        if idx.const or idx.vars() != {it.name} or idx.coef(it.name) != 1:
            return None
    return arg.source


def _channel_bias(k: Kernel, arg: object) -> str | None:
    """The tensor if ``arg`` reads a 1-D input of ``k`` by the output's channel (second)
    iterator, over its whole range: a per-channel bias of an NCHW output."""
    assert k.expr is not None
    root = k.expr.root
    if not isinstance(arg, Access) or not isinstance(arg.source, str) or \
            len(root.traversal) != 4 or len(arg.indices) != 1:
        return None
    ch = root.traversal[1]
    shape = dict(k.expr.decls).get(arg.source)
    (idx,) = arg.indices
    if shape is None or tuple(shape) != (ch.size,) or ch.lo != 0 or not idx.is_linear or \
            idx.const or idx.vars() != {ch.name} or idx.coef(ch.name) != 1:
        return None
    return arg.source


def _terms(node: object) -> list[object]:
    if isinstance(node, BinOp) and node.op == "+":
        return _terms(node.lhs) + _terms(node.rhs)
    return [node]


class Epilogue(TypedDict, total=False):
    """What an eOperator does after a convolution's output (:func:`epilogue_of`): each key
    present only when it does that part."""

    activation: str  # f, one of ACTIVATIONS
    bias: list[str]  # per-channel bias tensors, in the order the eOperator adds them
    residual: str  # the tensor added to the whole output


def epilogue_of(k: Kernel, source: str) -> Epilogue | None:
    """What eOperator ``k`` does after ``source`` if it computes
    ``f(source[i...] + bias[c] + ... + r[i...])`` over the whole of ``source`` in its order,
    every part but the first optional (``f`` in :data:`ACTIVATIONS`, ``bias`` per-channel
    vectors of a 4-D output, ``r`` one whole tensor other than ``source``): a dict with the
    keys present among ``activation``, ``bias`` (a list of tensor names), ``residual`` (a
    tensor name); else None (also when it does nothing)."""
    if k.kind is not KernelKind.EOP or k.expr is None or source not in k.inputs:
        return None
    root = k.expr.root
    body, found = root.body, Epilogue()
    if root.summation:
        return None
    if isinstance(body, Call) and body.fn in ACTIVATIONS and len(body.args) == 1:
        found["activation"] = body.fn
        body = body.args[0]
    seen_source = False
    for term in _terms(body):
        whole, bias = _whole(k, term), _channel_bias(k, term)
        if whole == source and not seen_source:
            seen_source = True
        elif whole is not None and whole != source and "residual" not in found:
            found["residual"] = whole
        elif bias is not None and bias != source:
            found.setdefault("bias", []).append(bias)
        else:
            return None
    if not seen_source or not found:
        return None
    return found


def activation_of(k: Kernel, source: str) -> str | None:
    """The function if ``k`` is an eOperator computing ``f(source[i...])`` over the whole of
    ``source`` in its own order (``f`` in :data:`ACTIVATIONS`), else None."""
    found = epilogue_of(k, source)
    if found is None or set(found) != {"activation"}:
        return None
    return str(found["activation"])


def residual_of(k: Kernel, source: str) -> tuple[str, str | None] | None:
    """``(other, f)`` if ``k`` is an eOperator computing ``f(source[i...] + other[i...])``
    (either operand order; ``f`` in :data:`ACTIVATIONS` or ``None``: no function) over the
    whole of both tensors in the output's order, ``other`` a different tensor; else None."""
    found = epilogue_of(k, source)
    if found is None or "residual" not in found or "bias" in found:
        return None
    act = found.get("activation")
    return str(found["residual"]), None if act is None else str(act)


def _symmetric(p: Kernel) -> bool:
    q = p.params
    assert isinstance(q, ConvParams)
    return (q.ph_end is None or q.ph == q.ph_end) and (q.pw_end is None or q.pw == q.pw_end)


def _accepts(p: Kernel, epilogue: Epilogue, constants: Mapping[str, object]) -> bool:
    """Whether convolution kernel ``p`` can take ``epilogue``: an activation always; a bias
    (a constant) and a residual only on a ``Conv`` kernel with symmetric padding and a
    constant weight (one library call with a bias and a binary-add post-op), or (the
    residual) on an original convolution node."""
    q = p.params
    if q.activation is not None or q.residual is not None or q.bias is not None:
        return False
    if isinstance(q, NodeParams):
        return q.op in FUSIBLE_NODES and \
            len(getattr(q.node, "outputs", ())) == 1 and "bias" not in epilogue
    if p.kind is not KernelKind.CONV:
        return False
    if set(epilogue) == {"activation"}:
        return True
    biases = epilogue.get("bias", [])
    return _symmetric(p) and p.inputs[1] in constants and \
        all(b in constants for b in biases)


def _conv_output(p: Kernel) -> tuple[int, ...]:
    """The ``[n, f, ho, wo]`` output a library ``Conv`` kernel computes (its expression may
    view the same storage as another shape)."""
    q = {k: as_int(v) for k, v in p.params.items()
         if k in ("n", "f", "h", "w", "r", "s", "ph", "pw", "ph_end", "pw_end", "sh", "sw",
                  "dh", "dw")}
    ph_end, pw_end = q.get("ph_end", q["ph"]), q.get("pw_end", q["pw"])
    return (q["n"], q["f"], (q["h"] + q["ph"] + ph_end - q["dh"] * (q["r"] - 1) - 1) // q["sh"] + 1,
            (q["w"] + q["pw"] + pw_end - q["dw"] * (q["s"] - 1) - 1) // q["sw"] + 1)


def fuse_epilogues(prog: Program) -> Program:
    """Fold what an eOperator does after a convolution into it (see the module doc): ``f(conv
    + bias[c] + r)`` becomes the convolution's ``bias`` / ``residual`` inputs (in that order,
    after its own; ``bias`` is the number of bias inputs, which the runtime sums once) and
    ``activation`` parameter, run by the library in one call. The fused kernel takes the
    eOperator's place in the program (``r`` is computed by then); a ``Conv`` kernel's
    expression becomes the fused one, so it stays exact."""
    kernels = list(prog.kernels)
    constants = prog.constants
    shapes = prog.tensor_shapes()
    readers: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        for n in set(k.inputs):
            readers.setdefault(n, []).append(i)
    drop: set[int] = set()
    for i, p in enumerate(kernels):
        users = readers.get(p.output, [])
        if p.kind not in (KernelKind.CONV, KernelKind.NODE) or p.output in prog.outputs or \
                len(users) != 1 or users[0] in drop or i in drop:
            continue
        c = kernels[users[0]]
        epilogue = epilogue_of(c, p.output)
        if epilogue is None or not _accepts(p, epilogue, constants) or \
                tuple(c.output_shape) != tuple(p.output_shape):
            continue
        # a library convolution adds the residual as it is, to its own [n, f, ho, wo] output:
        # not one the eOperator reads as another shape of its storage (a linear layer's
        # [2, 196] input as the [2, 196, 1, 1] of a 1x1 convolution)
        if "residual" in epilogue and p.kind is KernelKind.CONV and \
                shapes.get(str(epilogue["residual"])) != _conv_output(p):
            continue
        params = p.params
        inputs = list(p.inputs)
        biases = list(epilogue.get("bias", []))
        if biases:
            # the runtime sums them once, when it is built
            params = replace(params, bias=len(biases))
            inputs += biases
        if "residual" in epilogue:
            params = replace(params, residual=True)
            inputs.append(str(epilogue["residual"]))
        if "activation" in epilogue:
            params = replace(params, activation=epilogue["activation"])
        expr = p.expr
        if expr is not None:
            expr = inline_nested(expression_fusion(c.expr, p.output, expr))
        kernels[users[0]] = Kernel(p.kind, params, tuple(inputs), c.output, expr, p.views,
                                   c.output_shape if p.kind is KernelKind.NODE else p.shape)
        drop.add(i)
    if not drop:
        return prog
    kept = [k for j, k in enumerate(kernels) if j not in drop]
    return Program(prog.inputs, prog.outputs, kept, prog.constants)


def _reads(scope: Scope, name: str) -> bool:
    for acc in accesses(scope.body):
        if acc.source == name or (isinstance(acc.source, Scope) and _reads(acc.source, name)):
            return True
    return False


def identity_view(k: Kernel) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """(offset, sizes, strides) when eOp ``k`` reads one tensor in flat order (a reshape or
    a contiguous slice, every read in bounds), else None."""
    if k.kind is not KernelKind.EOP or k.expr is None:
        return None
    root = k.expr.root
    acc = root.body
    if root.summation or not isinstance(acc, Access) or not isinstance(acc.source, str):
        return None
    shape = k.expr.inputs[acc.source]
    ranges = root.ranges
    flat: Affine = const(0)
    stride = 1
    for idx, dim in zip(reversed(acc.indices), reversed(shape), strict=True):
        lo, hi = idx.bounds(ranges)
        if lo < 0 or hi >= dim:
            return None  # padding: not a view
        flat = idx * stride + flat
        stride *= dim
    flat = flat.simplify(ranges)
    if not flat.is_linear:
        return None
    out_strides, s = [], 1
    for it in reversed(root.traversal):
        out_strides.append(s if it.size > 1 else 0)
        s *= it.size
    out_strides.reverse()
    for it, want in zip(root.traversal, out_strides, strict=True):
        if it.size > 1 and flat.coef(it.name) != want:
            return None
    offset = flat.const + sum(flat.coef(it.name) * it.lo for it in root.traversal)
    sizes = tuple(it.size for it in root.traversal)
    return offset, sizes, tuple(out_strides)


def eliminate_identities(prog: Program) -> Program:
    """Replace identity eOperators by zero-copy ``Alias`` kernels."""
    kernels = []
    for k in prog.kernels:
        view = identity_view(k)
        if view is None:
            kernels.append(k)
            continue
        kernels.append(Kernel(KernelKind.ALIAS,
                              AliasParams(view=[view[0], list(view[1]), list(view[2])]),
                              k.inputs, k.output, k.expr))
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


def postprocess(prog: Program) -> Program:
    """All passes: fold weights, fuse eOperators, fuse residual additions and activations
    into convolutions, eliminate identities, fold again."""
    prog = fold_constants(prog)
    prog = fuse_eops(prog)
    prog = fuse_epilogues(prog)
    prog = eliminate_identities(prog)
    prog = fold_constants(prog)
    prog.check()
    return prog


def describe(before: Program, after: Program) -> str:
    """One line saying what :func:`postprocess` changed (for an optimisation report)."""
    def count(prog: Program, key: str) -> int:
        return sum(1 for k in prog.kernels
                   if k.kind in (KernelKind.CONV, KernelKind.NODE) and k.params.get(key))

    fused = {key: count(after, key) - count(before, key)
             for key in ("activation", "bias", "residual")}
    parts = [f"{len(before.kernels)} -> {len(after.kernels)} kernels"]
    parts += [f"{n} {key} epilogue(s) folded into convolutions" for key, n in fused.items() if n]
    aliases = sum(k.kind is KernelKind.ALIAS for k in after.kernels) - \
        sum(k.kind is KernelKind.ALIAS for k in before.kernels)
    if aliases:
        parts.append(f"{aliases} identity eOperator(s) made views")
    return "post-processing: " + ", ".join(parts)
