"""Constant folding for the ONNX frontend: evaluating a node whose inputs are all known values
(weights, shape computations such as ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``).

:func:`fold_node` tries, in order: a few numpy fast paths (``Constant``, ``Identity``,
``Shape`` is handled by the importer since it needs only the input shape), ONNX's reference
evaluator (``onnx.reference``, exact ONNX semantics in numpy) on a single-node model, and
onnxruntime. Non-deterministic operators are never folded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ollie.errors import UnsupportedError
from ollie.graph.opaque import run_onnx_node, single_node

NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def constant_value(node: Any) -> np.ndarray:
    """The value of a ``Constant`` node."""
    from onnx import helper, numpy_helper

    for attr in node.attribute:
        v = helper.get_attribute_value(attr)
        if attr.name == "value":
            return numpy_helper.to_array(v)
        if attr.name == "value_float":
            return np.asarray(v, dtype=np.float32)
        if attr.name == "value_floats":
            return np.asarray(list(v), dtype=np.float32)
        if attr.name == "value_int":
            return np.asarray(v, dtype=np.int64)
        if attr.name == "value_ints":
            return np.asarray(list(v), dtype=np.int64)
    raise UnsupportedError(f"Constant node '{node.name}' has no supported value attribute")


def _reference(node: Any, opsets: Sequence[tuple[str, int]],
               arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    proto, feeds, infos = single_node(node, arrays)
    outs = [helper.make_value_info(f"out{k}", onnx.TypeProto())
            for k in range(len(node.output)) if node.output[k]]
    graph = helper.make_graph([proto], "fold", infos, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                    for d, v in opsets])
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def fold_node(node: Any, opsets: Sequence[tuple[str, int]],
              arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """Values of ``node``'s outputs from the values of its non-empty inputs (in order), or
    None when it must not or cannot be folded."""
    if node.op_type in NONDETERMINISTIC and node.domain in ("", "ai.onnx"):
        return None
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Constant":
        return [constant_value(node)]
    if node.op_type == "Identity":
        return [np.asarray(arrays[0])]
    if any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):
        return None  # control flow: keep it
    try:
        return _reference(node, opsets, arrays)
    except Exception:
        pass
    try:
        return run_onnx_node(node, opsets, arrays)
    except Exception:
        return None
