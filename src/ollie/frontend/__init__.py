"""Frontends: PyTorch modules and ONNX models to :class:`ollie.graph.Graph`, and ONNX export of
the zoo models.

    graph = from_torch(module, example_inputs)
    graph = from_onnx("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    to_onnx(module, example_inputs, "model.onnx")
"""

from ollie.frontend.onnx_export import to_onnx, to_onnx_model
from ollie.frontend.onnx_import import from_onnx
from ollie.frontend.torch_import import from_torch

__all__ = ["from_onnx", "from_torch", "to_onnx", "to_onnx_model"]
