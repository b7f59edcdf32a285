"""Malformed ONNX models through ``ollie.optimize``: a byte-level or structural mutation of a
valid model either gives a clear ``OllieError`` or a program that agrees with ONNX Runtime on
the same model; never another exception (a crash) and never a wrong output."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from fuzz_util import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ollie

FAST = {"time_budget": 0.3, "max_depth": 1, "context": False, "settle": 0.0,
        "choose_libraries": False, "max_candidates": 1, "use_cache": False}


def _model() -> onnx.ModelProto:
    """Conv -> Relu -> Add(bias) -> Reshape -> MatMul, on a [1, 2, 5, 5] input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((1, 3, 1, 1)).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([1, 75], np.int64), "shape")
    m = numpy_helper.from_array(rng.standard_normal((75, 4)).astype(np.float32), "m")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "b"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, b, shape, m])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


X = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)


def _ort(data: bytes) -> np.ndarray | None:
    """ONNX Runtime's output for ``X``, or None when it refuses the model."""
    import onnxruntime as ort

    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        return sess.run(None, {sess.get_inputs()[0].name: X})[0]
    except Exception:  # refused or failed: nothing to compare with
        return None


def _check(data: bytes, tmp_path) -> str:
    """Optimise the model ``data``: 'refused' (an OllieError) or 'ok' (checked against ONNX
    Runtime, which must accept the model too); anything else fails the test."""
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    try:
        prog = ollie.optimize(str(path), (torch.from_numpy(X),), **FAST)
    except ollie.OllieError:
        return "refused"
    want = _ort(data)
    assert want is not None, "Ollie optimised a model ONNX Runtime refuses"
    got = prog(torch.from_numpy(X))
    got = (got[0] if isinstance(got, tuple) else got).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    return "ok"


def test_the_valid_model_is_optimised(tmp_path):
    assert _check(_model().SerializeToString(), tmp_path) == "ok"


@fuzz_settings(12)
@given(st.data())
def test_byte_mutations_never_crash(tmp_path_factory, data):
    raw = bytearray(_model().SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "delete", "insert"]))
        i = data.draw(st.integers(0, len(raw) - 1))
        if kind == "flip":
            raw[i] ^= data.draw(st.integers(1, 255))
        elif kind == "truncate":
            del raw[i:]
        elif kind == "delete":
            del raw[i:i + data.draw(st.integers(1, 16))]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        if not raw:
            raw = bytearray(b"\x00")
    _check(bytes(raw), tmp_path_factory.mktemp("m"))


def _structural(model: onnx.ModelProto, kind: str, k: int) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    node = g.node[k % len(g.node)]
    if kind == "drop_initializer":
        del g.initializer[k % len(g.initializer)]
    elif kind == "unknown_op":
        node.op_type = "NoSuchOperator"
    elif kind == "custom_domain":
        node.domain = "com.example.evil"
    elif kind == "rename_input":
        node.input[0] = "undefined_tensor"
    elif kind == "duplicate_output":
        node.output[0] = g.node[(k + 1) % len(g.node)].output[0]
    elif kind == "cycle":
        g.node[0].input[0] = g.node[-1].output[0]
    elif kind == "bad_attribute":
        node.attribute.append(helper.make_attribute("pads", [-5, 99]))
    elif kind == "string_weight":
        g.initializer[k % len(g.initializer)].data_type = TensorProto.STRING
    elif kind == "wrong_dims":
        init = g.initializer[k % len(g.initializer)]
        init.dims[0] = init.dims[0] + 3
    elif kind == "input_shape":
        dim = g.input[0].type.tensor_type.shape.dim[k % 4]
        dim.dim_value = dim.dim_value + 1
    elif kind == "no_outputs":
        del g.output[:]
    elif kind == "opset":
        m.opset_import[0].version = 99
    return m


KINDS = ["drop_initializer", "unknown_op", "custom_domain", "rename_input", "duplicate_output",
         "cycle", "bad_attribute", "string_weight", "wrong_dims", "input_shape", "no_outputs",
         "opset"]


@pytest.mark.parametrize("kind", KINDS)
def test_structural_mutations_never_crash(tmp_path, kind):
    for k in range(2):
        m = _structural(_model(), kind, k)
        buf = io.BytesIO()
        buf.write(m.SerializeToString())
        _check(buf.getvalue(), tmp_path)
