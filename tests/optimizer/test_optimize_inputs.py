"""``ollie.optimize`` and the models' inputs: ONNX models with a symbolic batch dimension or
exporter-named inputs (``input.1``) with example inputs, models in float16 / float64 (refused,
saying what to do), and one tensor given as two example inputs."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import ollie
from ollie.testing.programs import TwoInputs

FAST = dict(time_budget=0.5, max_depth=1, max_candidates=1, use_cache=False, context=False,
            settle=0.0)


def batch_model() -> onnx.ModelProto:
    """Conv + Relu on ``x`` of shape ``["batch", 3, 6, 6]``."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "batch", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       ["batch", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 6, 6])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def onnx_runtime(proto: onnx.ModelProto, *xs: torch.Tensor) -> torch.Tensor:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs, strict=True)}
    return torch.from_numpy(sess.run(None, feed)[0])


@pytest.mark.parametrize("batch", [1, 3])
def test_symbolic_batch_fixed_by_the_example_inputs(tmp_path, batch) -> None:
    proto = batch_model()
    path = tmp_path / "batch.onnx"
    onnx.save(proto, str(path))
    prog = ollie.optimize(str(path), (torch.randn(batch, 3, 6, 6),), **FAST)
    x = torch.randn(batch, 3, 6, 6)
    torch.testing.assert_close(prog(x), onnx_runtime(proto, x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ollie.ShapeError, match=rf"\[{batch + 1}, 3, 6, 6\]"):
        prog(torch.randn(batch + 1, 3, 6, 6))


def test_symbolic_batch_without_example_inputs_says_what_to_pass(tmp_path) -> None:
    path = tmp_path / "batch.onnx"
    onnx.save(batch_model(), str(path))
    with pytest.raises(ollie.ShapeError, match=r"'batch'") as info:
        ollie.optimize(str(path), **FAST)
    assert "ollie.optimize(model, (x,))" in str(info.value)
    assert "batch.onnx" in str(info.value)


def test_example_inputs_must_match_the_fixed_dimensions() -> None:
    with pytest.raises(ollie.ShapeError, match=r"\[2, 3, 5, 6\].*'batch', 3, 6, 6"):
        ollie.optimize(batch_model(), (torch.randn(2, 3, 5, 6),), **FAST)


def test_exporter_named_inputs_with_example_inputs() -> None:
    # torch.onnx.export names the input 'input.1', the graph 'input_1'
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(1, 3, 6, 6)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buf.getvalue())
    assert "." in proto.graph.input[0].name
    prog = ollie.optimize(proto, (x,), **FAST)
    torch.testing.assert_close(prog(x), onnx_runtime(proto, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_models_of_other_dtypes_are_refused_saying_what_to_do(dtype) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval().to(dtype)
    with pytest.raises(ollie.UnsupportedError, match=r"float32 models.*model\.float\(\)"):
        ollie.optimize(model, (torch.randn(1, 3, 6, 6, dtype=dtype),), **FAST)
    # float32 inputs to a model with parameters of another dtype: the parameter is named
    with pytest.raises(ollie.UnsupportedError, match=rf"parameter '0.weight' is {dtype}"):
        ollie.optimize(model, (torch.randn(1, 3, 6, 6),), **FAST)


def test_onnx_model_of_another_dtype_is_refused() -> None:
    model = batch_model()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    with pytest.raises(ollie.UnsupportedError, match="input 'x' is float64"):
        ollie.optimize(model, (torch.randn(1, 3, 6, 6, dtype=torch.float64),), **FAST)


def test_one_tensor_as_both_example_inputs() -> None:
    model = TwoInputs().eval()
    x = torch.randn(1, 3, 5, 5)
    prog = ollie.optimize(model, (x, x), **FAST)
    a, b = torch.randn(1, 3, 5, 5), torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        want = model(a, b)
    torch.testing.assert_close(prog(a, b), want, rtol=1e-4, atol=1e-4)


def test_a_lone_tensor_is_one_example_input() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    prog = ollie.optimize(model, x, **FAST)
    with torch.no_grad():
        torch.testing.assert_close(prog(x), model(x), rtol=1e-4, atol=1e-4)
