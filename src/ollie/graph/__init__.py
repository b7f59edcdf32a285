"""The graph IR between the frontends and the optimizer.

:class:`Graph` (inputs, outputs, topologically ordered :class:`Node` list, initializers,
shapes) and the reference executor :func:`run_graph` (PyTorch, the oracle of whole-model
checks). ``Node.op`` is a key of ``ollie.lower.LOWERINGS`` or :data:`OPAQUE`.
"""

from ollie.graph.execute import OP_IMPLS, infer_shapes, run_graph, run_node
from ollie.graph.ir import COMPUTE_OPS, OPAQUE, Graph, GraphError, Node, sanitize
from ollie.graph.opaque import TensorRef, run_onnx_node

__all__ = [
    "COMPUTE_OPS", "OPAQUE", "OP_IMPLS", "Graph", "GraphError", "Node", "TensorRef", "infer_shapes",
    "run_graph", "run_node", "run_onnx_node", "sanitize",
]
