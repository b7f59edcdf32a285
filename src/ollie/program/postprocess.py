"""Post-processing of programs (paper section "Post-Processing").

* **Compile-time evaluation**: a kernel reading only constants (weights) is run once now and
  its output becomes a constant (e.g. a weight layout transformation).
* **eOperator fusion**: an eOperator whose output only one other eOperator reads is fused into
  it by expression fusion (the chain rule); the producer's scope is then inlined by traversal
  merging wherever that is exact, else it stays a nested scope computed inside the one kernel.
  Element-wise operators after an eOperator (bias, ReLU, ...) are eOperators too, so they
  fuse the same way.
* **Activation fusion into convolutions**: an eOperator that only applies ReLU, tanh or
  sigmoid element-wise to the output of a convolution (a ``Conv`` kernel, or an original
  ``Conv2d`` / ``ConvTranspose2d`` operator kept as a ``Node``) that nothing else reads becomes
  the convolution's ``activation`` parameter: oneDNN applies it as a post-op while the output
  is still in cache (a ``Conv`` kernel's expression becomes ``f(conv)``, so it stays exact).
* **Residual fusion into convolutions**: an eOperator computing ``f(conv + r)`` (a residual
  connection, then maybe an activation) over the whole output of an original ``Conv2d`` kept
  as a ``Node`` that nothing else reads becomes that node's ``residual`` input (and
  ``activation``): one library call with oneDNN's binary add post-op instead of a convolution
  and a memory-bound eOperator.
* **Identity eOperator elimination**: an eOperator that only re-reads one tensor in the same
  flat order (a reshape, or a contiguous slice) becomes an ``Alias`` kernel: a zero-copy view.

Every pass keeps the program exact; :func:`postprocess` runs them to a fixpoint.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ollie.ir import Access, BinOp, Call, Expr, Scope, accesses
from ollie.match.eop import make_eop
from ollie.program.kernel import Kernel
from ollie.program.program import Program
from ollie.rules.inter import expression_fusion
from ollie.rules.traversal_merging import inline

log = logging.getLogger(__name__)


def fold_constants(prog: Program, backend: str = "reference") -> Program:
    """Evaluate kernels whose inputs are all constants; their outputs become constants (eOps
    through the reference interpreter by default: exact, and nothing to compile)."""
    from ollie.runtime.executor import compile_kernel

    constants = dict(prog.constants)
    kernels = []
    for k in prog.kernels:
        if k.kind != "Node" and k.inputs and all(n in constants for n in k.inputs) and \
                k.output not in prog.outputs:
            env = {n: torch.as_tensor(constants[n]) for n in k.inputs}
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
            new = inline(root, pos)
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
            if p.kind != "eOp" or p.output in prog.outputs or len(users) != 1:
                continue
            c = kernels[users[0]]
            if c.kind != "eOp":
                continue
            fused = inline_nested(expression_fusion(c.expr, p.output, p.expr))
            inputs = tuple(n for n, _ in fused.decls if _reads(fused.root, n))
            fused = Expr(tuple((n, s) for n, s in fused.decls if n in inputs), fused.root)
            new = make_eop(fused.root, fused.inputs, c.output)
            kernels[users[0]] = new
            del kernels[i]
            changed = True
            break
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


ACTIVATIONS = ("relu", "tanh", "sigmoid")
"""Element-wise functions a convolution kernel can apply to its output (oneDNN post-ops)."""
FUSIBLE_NODES = ("Conv2d", "ConvTranspose2d")


def _whole(k: Kernel, arg: object) -> str | None:
    """The tensor ``arg`` reads if it is an access to the whole of an input of eOperator
    ``k`` in the output's own order (same shape, every index the matching iterator)."""
    assert k.expr is not None
    root = k.expr.root
    if not isinstance(arg, Access) or not isinstance(arg.source, str):
        return None
    shape = dict(k.expr.decls).get(arg.source)
    if shape is None or tuple(shape) != tuple(it.size for it in root.traversal) or \
            any(it.lo != 0 for it in root.traversal):
        return None
    order = tuple(it.name for it in root.traversal)
    if len(arg.indices) != len(order) or any(
            not idx.is_linear or idx.const or idx.vars() != {n} or idx.coef(n) != 1
            for idx, n in zip(arg.indices, order, strict=True)):
        return None
    return arg.source


def activation_of(k: Kernel, source: str) -> str | None:
    """The function if ``k`` is an eOperator computing ``f(source[i...])`` over the whole of
    ``source`` in its own order (``f`` in :data:`ACTIVATIONS`), else None."""
    if k.kind != "eOp" or k.expr is None or k.inputs != (source,):
        return None
    root = k.expr.root
    body = root.body
    if root.summation or not isinstance(body, Call) or body.fn not in ACTIVATIONS:
        return None
    (arg,) = body.args
    return body.fn if _whole(k, arg) == source else None


def residual_of(k: Kernel, source: str) -> tuple[str, str | None] | None:
    """``(other, f)`` if ``k`` is an eOperator computing ``f(source[i...] + other[i...])``
    (either operand order; ``f`` in :data:`ACTIVATIONS` or ``None``: no function) over the
    whole of both tensors in the output's order, ``other`` a different tensor; else None."""
    if k.kind != "eOp" or k.expr is None or len(k.inputs) != 2 or source not in k.inputs:
        return None
    root = k.expr.root
    body, fn = root.body, None
    if isinstance(body, Call) and body.fn in ACTIVATIONS and len(body.args) == 1:
        body, fn = body.args[0], body.fn
    if root.summation or not isinstance(body, BinOp) or body.op != "+":
        return None
    reads = (_whole(k, body.lhs), _whole(k, body.rhs))
    other = reads[1] if reads[0] == source else reads[0] if reads[1] == source else None
    if other is None or other == source:
        return None
    return other, fn


def _fusible_producer(k: Kernel) -> bool:
    if "activation" in k.params or "residual" in k.params:
        return False
    if k.kind == "Conv":
        return True
    node = k.params.get("node")
    return k.kind == "Node" and k.params.get("op") in FUSIBLE_NODES and \
        len(getattr(node, "outputs", ())) == 1


def fuse_activations(prog: Program) -> Program:
    """Fold activation eOperators into the convolution before them (see the module doc)."""
    kernels = list(prog.kernels)
    readers: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        for n in set(k.inputs):
            readers.setdefault(n, []).append(i)
    drop: set[int] = set()
    for i, p in enumerate(kernels):
        users = readers.get(p.output, [])
        if not _fusible_producer(p) or p.output in prog.outputs or len(users) != 1:
            continue
        c = kernels[users[0]]
        fn = activation_of(c, p.output)
        if fn is None:
            continue
        expr = p.expr
        if expr is not None:
            expr = inline_nested(expression_fusion(c.expr, p.output, expr))
        kernels[i] = Kernel(p.kind, {**p.params, "activation": fn}, p.inputs, c.output, expr,
                            p.views, c.output_shape if p.kind == "Node" else p.shape)
        drop.add(users[0])
    if not drop:
        return prog
    kept = [k for j, k in enumerate(kernels) if j not in drop]
    return Program(prog.inputs, prog.outputs, kept, prog.constants)


RESIDUAL_NODES = ("Conv2d",)
"""Graph convolutions a following residual addition folds into."""


def fuse_residuals(prog: Program) -> Program:
    """Fold ``f(conv + r)`` eOperators (a residual connection, then maybe an activation) into
    the original convolution node before them when nothing else reads its output: the node
    gets ``residual`` (its last input is ``r``) and ``activation`` parameters and runs as one
    library call (oneDNN's binary add post-op, or ONNX Runtime's fused Conv+Add). The fused
    kernel takes the eOperator's place in the program (``r`` is computed by then)."""
    kernels = list(prog.kernels)
    readers: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        for n in set(k.inputs):
            readers.setdefault(n, []).append(i)
    drop: set[int] = set()
    for i, p in enumerate(kernels):
        users = readers.get(p.output, [])
        if not _fusible_producer(p) or p.kind != "Node" or \
                p.params.get("op") not in RESIDUAL_NODES or p.output in prog.outputs or \
                len(users) != 1 or users[0] in drop:
            continue
        c = kernels[users[0]]
        found = residual_of(c, p.output)
        if found is None:
            continue
        other, fn = found
        params = {**p.params, "residual": True}
        if fn is not None:
            params["activation"] = fn
        kernels[users[0]] = Kernel("Node", params, (*p.inputs, other), c.output, None, p.views,
                                   c.output_shape)
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
    if k.kind != "eOp" or k.expr is None:
        return None
    root = k.expr.root
    if root.summation or not isinstance(root.body, Access) or \
            not isinstance(root.body.source, str):
        return None
    acc = root.body
    shape = k.expr.inputs[acc.source]
    ranges = root.ranges
    flat = 0
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
        kernels.append(Kernel("Alias", {"view": [view[0], list(view[1]), list(view[2])]},
                              k.inputs, k.output, k.expr))
    return Program(prog.inputs, prog.outputs, kernels, prog.constants)


def postprocess(prog: Program) -> Program:
    """All passes: fold weights, fuse eOperators, fuse residual additions and activations
    into convolutions, eliminate identities, fold again."""
    prog = fold_constants(prog)
    prog = fuse_eops(prog)
    prog = fuse_residuals(prog)
    prog = fuse_activations(prog)
    prog = eliminate_identities(prog)
    prog = fold_constants(prog)
    prog.check()
    return prog
