"""The frontends' checks before anything is optimised: tracing with aliased example inputs, the
imported graph against its module (``check_import``), float32 models only
(``float32_problem``), and an ONNX model's symbolic dimensions fixed by example inputs
(``example_shapes``)."""

from __future__ import annotations

import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from ollie.errors import OllieError, ShapeError
from ollie.frontend import from_onnx, from_torch, onnx_import, torch_check
from ollie.graph import run_graph
from ollie.testing.programs import TwoInputs


def test_one_tensor_as_two_example_inputs_traces_both_inputs() -> None:
    # torch.export given one tensor twice traces f(a, b) as f(b, b)
    model = TwoInputs().eval()
    x = torch.randn(1, 3, 5, 5)
    graph = from_torch(model, (x, x))
    a, b = torch.randn(1, 3, 5, 5), torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        want = model(a, b)
    torch.testing.assert_close(run_graph(graph, [a, b])[graph.outputs[0]], want)
    torch_check.check_import(graph, model, (x, x))


def test_check_import_refuses_a_graph_that_is_not_the_modules() -> None:
    model = TwoInputs().eval()
    x = torch.randn(1, 3, 5, 5)
    graph = from_torch(model, (x, x.clone()))
    other = TwoInputs().eval()
    with torch.no_grad():
        other.conv.weight.mul_(2)
    with pytest.raises(OllieError, match=r"disagrees with the module on output 0.*conversion bug"):
        torch_check.check_import(graph, other, (x, x))


class Doubled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


class Cancelling(nn.Module):
    """``2x`` computed through ``x + 3e5``: in float32 every value is rounded to a multiple
    of 1/32 first, in float64 nearly exact."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x + 3e5) - 3e5) * 2.0


def test_check_import_blames_a_module_ill_conditioned_in_float32() -> None:
    # the graph computes 2x exactly; the module's own float32 output is as far from it as
    # from the module's float64 output: its numerics are to blame, not a conversion
    x = torch.randn(2, 64)
    graph = from_torch(Doubled().eval(), (x,))
    with pytest.raises(OllieError, match=r"own float32 output differs from its float64 "
                                         r"output by \d\.\d+e-0[23]"):
        torch_check.check_import(graph, Cancelling().eval(), (x,))


def test_float32_problem_names_the_tensor_and_the_fix() -> None:
    conv = nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 6, 6)
    assert torch_check.float32_problem(conv, (x,)) is None
    msg = torch_check.float32_problem(conv.double(), (x.double(),))
    assert "example input 0 is torch.float64" in msg and "x.float()" in msg
    msg = torch_check.float32_problem(conv, (x.half(),))
    assert "torch.float16" in msg and "model.float()" in msg
    msg = torch_check.float32_problem(nn.Conv2d(3, 4, 3).half(), (x,))
    assert "parameter 'weight' is torch.float16" in msg and "model.float()" in msg
    msg = torch_check.float32_problem(nn.Embedding(4, 2), (torch.zeros(2, dtype=torch.long),))
    assert "torch.int64" in msg and "float32 tensors only" in msg
    assert "backend='ollie'" in msg  # where token ids can go instead


def batch_model(elem: int = TensorProto.FLOAT, batch: int | str = "batch"):
    """An ONNX Conv + Relu whose input 'x.1' is ``[batch, 3, 6, 6]``."""
    w = numpy_helper.from_array(torch.randn(4, 3, 3, 3).numpy(), "w")
    nodes = [helper.make_node("Conv", ["x.1", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "batch", [helper.make_tensor_value_info(
        "x.1", elem, [batch, 3, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [batch, 4, 6, 6])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_symbolic_dimension_error_says_what_to_pass() -> None:
    with pytest.raises(ShapeError, match=r"dynamic dimension 0 \('batch'\)") as info:
        from_onnx(batch_model())
    assert "ollie.optimize(model, (x,))" in str(info.value)
    assert "input_shapes={'x.1'" in str(info.value)


def test_example_shapes_fix_symbolic_dimensions_and_check_the_fixed_ones() -> None:
    proto = batch_model()
    x = torch.randn(3, 3, 6, 6)
    assert onnx_import.example_shapes(proto, "m", (x,)) == {"x.1": (3, 3, 6, 6)}
    graph = from_onnx(proto, onnx_import.example_shapes(proto, "m", (x,)))
    assert graph.inputs[0][1] == (3, 3, 6, 6)
    with pytest.raises(ShapeError, match=r"example input 0 has shape \[3, 3, 7, 6\]"):
        onnx_import.example_shapes(proto, "m", (torch.randn(3, 3, 7, 6),))
    with pytest.raises(ShapeError, match=r"1 input\(s\) \(x\.1\), got 2"):
        onnx_import.example_shapes(proto, "m", (x, x))
    with pytest.raises(ShapeError, match="is a NoneType"):
        onnx_import.example_shapes(proto, "m", (None,))


def test_onnx_float32_problem() -> None:
    assert onnx_import.float32_problem(batch_model(), "m") is None
    msg = onnx_import.float32_problem(batch_model(TensorProto.DOUBLE), "m")
    assert "input 'x.1' is float64" in msg and "float32" in msg
