"""Renaming tensors of kernels: a subprogram's kernels are found on canonical tensor names
(``x0, x1, ...``) and placed into the model's program under its real names, with the
subprogram's temporaries prefixed so that reused subprograms never clash."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import replace

from ollie.graph import Node
from ollie.ir import Expr, rename_expr
from ollie.program.kernel import Kernel
from ollie.program.params import KernelParams, NodeParams

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A tensor name of the expression syntax (EXPR_SYNTAX.md)."""


def name_prefix(name: str) -> str:
    """``name`` (a node's name) as the start of tensor names: itself when it is a tensor name,
    else (ONNX node names such as ``/head/head.0/Gemm``) its other characters replaced by
    ``_`` and a digest of ``name`` appended, so that two names differing only there stay
    apart."""
    if _IDENTIFIER.match(name):
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
    return f"n_{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{digest}"


def rename_kernels(kernels: list[Kernel], inputs: Mapping[str, str], output: str,
                   new_output: str, prefix: str) -> list[Kernel]:
    """Kernels reading ``inputs[name]`` for each canonical input, writing ``new_output``
    instead of ``output``, every other tensor they produce prefixed with ``prefix``
    (:func:`name_prefix`: a saved program's expressions must parse again)."""
    prefix = name_prefix(prefix)
    names = dict(inputs)
    for k in kernels:
        names.setdefault(k.output, new_output if k.output == output else f"{prefix}_{k.output}")
    out = []
    for k in kernels:
        out.append(Kernel(k.kind, _renamed_node(k.params, names),
                          tuple(names.get(n, n) for n in k.inputs),
                          names[k.output],
                          None if k.expr is None else rename_expr(k.expr, names),
                          k.views, k.shape))
    return out


def _renamed_node(params: KernelParams, names: Mapping[str, str]) -> KernelParams:
    """A graph operator's parameters with the tensors it reads and writes renamed as its
    kernel's (:meth:`ollie.program.program.Program.validate` checks they agree); other
    parameters as they are."""
    if not (isinstance(params, NodeParams) and isinstance(params.node, Node)):
        return params
    node = params.node
    moved = Node(node.op, tuple(names.get(n, n) if n else n for n in node.inputs),
                 tuple(names.get(n, n) for n in node.outputs), node.attrs, node.name)
    return replace(params, node=moved)


def canonical_names(expr: Expr) -> tuple[Expr, dict[str, str]]:
    """``expr`` with its declared tensors renamed ``x0, x1, ...`` in declaration order (so
    identical subprograms fingerprint alike), and the renaming."""
    names = {n: f"x{i}" for i, (n, _) in enumerate(expr.decls)}
    return rename_expr(expr, names), names
