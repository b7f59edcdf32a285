"""from_onnx on small hand-built models: each operator against onnxruntime, constant folding,
opaque fallback, custom domain, and the errors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ollie.errors import OllieError
from ollie.frontend import from_onnx
from ollie.graph import run_graph
from ollie.zoo.ops import g2bmm_reference, gbmm_reference

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def make(nodes: Sequence, inputs: dict[str, Sequence], outputs: Sequence[str],
         inits: dict[str, np.ndarray] | None = None, opset: int = 17,
         extra: Sequence[tuple[str, int]] = ()) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    tensors = [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(list(nodes), "test", ins, outs, tensors)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], ops: dict[str, int] | None = None,
          **kw: object) -> object:
    graph = from_onnx(model, **kw)
    if ops is not None:
        assert graph.op_counts() == ops
    want = ort_run(model, feeds)
    got = run_graph(graph, {k: torch.from_numpy(v) for k, v in feeds.items()})
    for name, w in zip(graph.outputs, want, strict=True):
        np.testing.assert_allclose(got[name].numpy(), w, rtol=1e-4, atol=1e-5)
    for node in graph.lowerable_nodes():
        low = graph.lower_node(node)
        assert tuple(low.output_shape) == graph.shapes[node.outputs[0]]
    return graph


N = helper.make_node

CASES = {
    "conv_same_upper_stride2": (
        [N("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
        {"x": (1, 3, 9, 8)}, {"w": rand(4, 3, 3, 3), "b": rand(4)}, {"Conv2d": 1}),
    "conv_asymmetric_pads_groups": (
        [N("Conv", ["x", "w"], ["y"], pads=[0, 1, 2, 1], group=2, dilations=[2, 1])],
        {"x": (1, 4, 7, 7)}, {"w": rand(6, 2, 3, 2)}, {"Conv2d": 1}),
    "conv_transpose_output_shape": (
        [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], output_shape=[9, 10])],
        {"x": (2, 3, 4, 5)}, {"w": rand(3, 2, 3, 3), "b": rand(2)}, {"ConvTranspose2d": 1}),
    "conv_transpose_asym_pads": (
        [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 1], pads=[1, 0, 0, 2],
           output_padding=[1, 0])],
        {"x": (1, 3, 4, 5)}, {"w": rand(3, 2, 4, 3)}, {"ConvTranspose2d": 1}),
    "batchnorm_leaky": (
        [N("BatchNormalization", ["x", "g", "b", "m", "v"], ["t"], epsilon=1e-3),
         N("LeakyRelu", ["t"], ["y"], alpha=0.2)],
        {"x": (2, 3, 4, 4)},
        {"g": rand(3), "b": rand(3), "m": rand(3),
         "v": np.abs(rand(3)) + 0.5}, {"BatchNorm": 1, "LeakyRelu": 1}),
    "maxpool_asym_avgpool_exclude_pad": (
        [N("MaxPool", ["x"], ["t"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
         N("AveragePool", ["t"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        {"x": (1, 2, 9, 9)}, {}, {"MaxPool2d": 1, "AvgPool2d": 1}),
    "avgpool_include_pad_ceil": (
        [N("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
           count_include_pad=1, ceil_mode=1)],
        {"x": (1, 2, 6, 6)}, {}, {"AvgPool2d": 1}),
    "gap_flatten_gemm_softmax": (
        [N("GlobalAveragePool", ["x"], ["p"]), N("Flatten", ["p"], ["f"]),
         N("Gemm", ["f", "w", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
         N("Softmax", ["g"], ["y"], axis=-1)],
        {"x": (3, 4, 5, 5)}, {"w": rand(6, 4), "c": rand(6)},
        {"GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1, "Softmax": 1}),
    "gemm_scalar_c_transa": (
        [N("Gemm", ["a", "w", "c"], ["y"], transA=1)],
        {"a": (4, 3)}, {"w": rand(4, 5), "c": np.asarray(0.25, dtype=np.float32)}, {"Gemm": 1}),
    "elementwise_broadcast": (
        [N("Sum", ["x", "b", "x"], ["s"]), N("Mul", ["s", "k"], ["m"]),
         N("Sub", ["m", "x"], ["d"]), N("Div", ["d", "v"], ["q"]), N("Sigmoid", ["q"], ["e"]),
         N("Tanh", ["e"], ["t"]), N("Relu", ["t"], ["y"])],
        {"x": (2, 3, 4)},
        {"b": rand(4), "k": np.asarray(1.5, dtype=np.float32), "v": np.abs(rand(3, 1)) + 1},
        {"Add": 2, "Mul": 1, "Sub": 1, "Div": 1, "Sigmoid": 1, "Tanh": 1, "Relu": 1}),
    "clip_hardsigmoid_hardswish": (
        [N("Clip", ["x", "lo", "hi"], ["c"]), N("Clip", ["c", "", "hi"], ["c2"]),
         N("HardSigmoid", ["c2"], ["s"], alpha=0.3, beta=0.4), N("HardSwish", ["x"], ["w"]),
         N("Add", ["s", "w"], ["y"])],
        {"x": (2, 3, 4)},
        {"lo": np.asarray(-0.5, dtype=np.float32), "hi": np.asarray(0.25, dtype=np.float32)},
        {"Max": 3, "Min": 4, "Mul": 3, "Add": 3}),
    "matmul_transpose_concat": (
        [N("MatMul", ["x", "w"], ["m"]), N("Transpose", ["m"], ["t"], perm=[0, 2, 1]),
         N("Concat", ["t", "c"], ["y"], axis=-1)],
        {"x": (2, 5, 3)}, {"w": rand(3, 4), "c": rand(2, 4, 2)},
        {"MatMul": 1, "Transpose": 1, "Concat": 1}),
    "pow_reciprocal": (  # GPT-2's cube, T5's square, a reciprocal square root
        [N("Pow", ["x", "three"], ["c"]), N("Pow", ["x", "two"], ["q"]),
         N("Add", ["q", "one"], ["p"]), N("Pow", ["p", "neg_half"], ["r"]),
         N("Reciprocal", ["p"], ["i"]), N("Sum", ["c", "r", "i"], ["y"])],
        {"x": (2, 3, 4)},
        {"three": np.asarray(3.0, np.float32), "two": np.asarray(2.0, np.float32),
         "one": np.asarray(1.0, np.float32), "neg_half": np.asarray(-0.5, np.float32)},
        {"Mul": 3, "Add": 3, "Sqrt": 1, "Div": 2}),
    "squeeze_unsqueeze_dropout_identity": (
        [N("Unsqueeze", ["x", "ax"], ["u"]), N("Dropout", ["u"], ["d"]),
         N("Identity", ["d"], ["i"]), N("Squeeze", ["i", "ax"], ["s"]), N("Relu", ["s"], ["y"])],
        {"x": (2, 3)}, {"ax": np.asarray([1], dtype=np.int64)}, {"Reshape": 2, "Relu": 1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_operator(case: str) -> None:
    nodes, inputs, inits, ops = CASES[case]
    model = make(nodes, inputs, ["y"], inits)
    check(model, {k: rand(*s) for k, s in inputs.items()}, ops)


def test_old_opset_squeeze_and_softmax() -> None:
    nodes = [N("Squeeze", ["x"], ["s"], axes=[1]), N("Softmax", ["s"], ["y"], axis=1)]
    check(make(nodes, {"x": (4, 1, 6)}, ["y"], opset=11), {"x": rand(4, 1, 6)}, {"Softmax": 1,
                                                                              "Reshape": 1})
    # opset < 13 softmax over several axes has other semantics: kept opaque, still correct
    nodes = [N("Softmax", ["x"], ["y"], axis=1)]
    graph = check(make(nodes, {"x": (2, 3, 4)}, ["y"], opset=11), {"x": rand(2, 3, 4)})
    assert graph.op_counts() == {"Opaque[Softmax]": 1}


def test_shape_chain_is_folded() -> None:
    nodes = [
        N("Shape", ["x"], ["shp"]),
        N("Gather", ["shp", "zero"], ["n"], axis=0),
        N("Unsqueeze", ["n", "ax0"], ["n1"]),
        N("Concat", ["n1", "minus1"], ["target"], axis=0),
        N("Reshape", ["x", "target"], ["r"]),
        N("ConstantOfShape", ["wshape"], ["half"],
          value=numpy_helper.from_array(np.asarray([0.5], dtype=np.float32))),
        N("Constant", [], ["delta"], value_float=0.25),
        N("Add", ["half", "delta"], ["w"]),
        N("MatMul", ["r", "w"], ["y"]),
    ]
    inits = {"zero": np.asarray(0, dtype=np.int64), "ax0": np.asarray([0], dtype=np.int64),
             "minus1": np.asarray([-1], dtype=np.int64),
             "wshape": np.asarray([60, 7], dtype=np.int64)}
    graph = check(make(nodes, {"x": (2, 3, 4, 5)}, ["y"], inits), {"x": rand(2, 3, 4, 5)},
                  {"Reshape": 1, "MatMul": 1})
    (w,) = [v for v in graph.initializers.values() if v.shape == (60, 7)]
    assert np.all(w == 0.75)
    assert graph.nodes[0].attrs == {"shape": (2, 60)}


@pytest.mark.parametrize("op", ["Celu", "Erf", "Softplus"])
def test_unsupported_operator_is_opaque(op: str) -> None:
    nodes = [N("Relu", ["x"], ["r"]), N(op, ["r"], ["o"], name="the_odd_one"),
             N("Add", ["o", "x"], ["y"])]
    graph = check(make(nodes, {"x": (2, 5)}, ["y"]), {"x": rand(2, 5)},
                  {"Relu": 1, f"Opaque[{op}]": 1, "Add": 1})
    node = next(n for n in graph.nodes if n.op == "Opaque")
    assert node.name == "the_odd_one" and node.attrs["output_shapes"] == [(2, 5)]
    with pytest.raises(OllieError, match="opaque"):
        graph.lower_node(node)


def test_opaque_with_constant_and_integer_inputs() -> None:
    nodes = [N("Pad", ["x", "pads", "v"], ["p"], mode="constant"), N("Relu", ["p"], ["y"])]
    inits = {"pads": np.asarray([0, 1, 0, 2], dtype=np.int64),
             "v": np.asarray(0.5, dtype=np.float32)}
    graph = check(make(nodes, {"x": (2, 3)}, ["y"], inits), {"x": rand(2, 3)})
    assert graph.shapes[graph.outputs[0]] == (2, 6)


def test_custom_domain_band_ops() -> None:
    nodes = [N("G2BMM", ["q", "k"], ["s"], domain="ollie", width=2, dilation=3),
             N("Softmax", ["s"], ["p"], axis=-1),
             N("GBMM", ["p", "k"], ["y"], domain="ollie", width=2, dilation=3)]
    model = make(nodes, {"q": (2, 11, 4), "k": (2, 11, 4)}, ["y"], extra=[("ollie", 1)])
    graph = from_onnx(model)
    assert graph.op_counts() == {"G2BMM": 1, "Softmax": 1, "GBMM": 1}
    q, k = torch.randn(2, 11, 4), torch.randn(2, 11, 4)
    want = gbmm_reference(torch.softmax(g2bmm_reference(q, k, 2, 3), -1), k, 2, 3)
    torch.testing.assert_close(graph(q, k), want, rtol=1e-5, atol=1e-5)
    for node in graph.lowerable_nodes():
        graph.lower_node(node)


def test_outputs_that_are_inputs_or_constants() -> None:
    nodes = [N("Identity", ["x"], ["y1"]), N("Identity", ["c"], ["y2"]),
             N("Relu", ["x"], ["y3"])]
    model = make(nodes, {"x": (3,)}, ["y1", "y2", "y3"], {"c": rand(2)})
    graph = from_onnx(model)
    x = rand(3)
    out = run_graph(graph, {"x": torch.from_numpy(x)})
    got = [out[o].numpy() for o in graph.outputs]
    for g, w in zip(got, ort_run(model, {"x": x}), strict=True):
        np.testing.assert_allclose(g, w)


def test_dynamic_dims_and_input_shapes() -> None:
    ins = [helper.make_tensor_value_info("x.in", TensorProto.FLOAT, ["N", 4])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    model = helper.make_model(
        helper.make_graph([N("Relu", ["x.in"], ["y"])], "dyn", ins, outs),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(OllieError, match=r"input 'x\.in' has dynamic dimension 0 \('N'\)"):
        from_onnx(model)
    graph = from_onnx(model, input_shapes={"x.in": (5, 4)})
    assert graph.inputs == [("x_in", (5, 4))]
    assert graph.original_names["x_in"] == "x.in"
    x = torch.randn(5, 4)
    torch.testing.assert_close(run_graph(graph, {"x.in": x})[graph.outputs[0]], x.relu())
    with pytest.raises(OllieError, match="'nope'"):
        from_onnx(model, input_shapes={"nope": (1,)})


def test_bad_files(tmp_path) -> None:
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not protobuf \xff\xfe" * 10)
    with pytest.raises(OllieError, match=r"corrupt\.onnx"):
        from_onnx(bad)
    with pytest.raises(OllieError, match=r"missing\.onnx"):
        from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(OllieError):
        from_onnx(12)  # type: ignore[arg-type]


def test_impossible_models() -> None:
    nodes = [N("Conv", ["x", "w"], ["y"], name="bad_conv")]
    with pytest.raises(OllieError, match="bad_conv"):
        from_onnx(make(nodes, {"x": (1, 3, 8, 8)}, ["y"], {"w": rand(4, 5, 3, 3)}))
    nodes = [N("Relu", ["nope"], ["y"], name="lost")]
    with pytest.raises(OllieError, match="'nope'"):
        from_onnx(make(nodes, {"x": (2,)}, ["y"]))
    nodes = [N("Reshape", ["x", "s"], ["y"], name="bad_reshape")]
    with pytest.raises(OllieError, match="bad_reshape"):
        from_onnx(make(nodes, {"x": (2, 3)}, ["y"], {"s": np.asarray([4, 2], dtype=np.int64)}))


def test_unknown_domain_operator_fails_with_its_name() -> None:
    nodes = [N("Frobnicate", ["x"], ["y"], domain="acme", name="frob")]
    with pytest.raises(OllieError, match="frob"):
        from_onnx(make(nodes, {"x": (2,)}, ["y"], extra=[("acme", 1)]))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_export_with_dynamic_batch(tmp_path) -> None:
    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(12, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.view(x.size(0), -1).relu())

    module = Head().eval()
    path = tmp_path / "head.onnx"
    torch.onnx.export(module, (torch.randn(2, 3, 4),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    with pytest.raises(OllieError, match="batch"):
        from_onnx(path)
    graph = from_onnx(path, input_shapes={"x": (5, 3, 4)})
    assert "Opaque" not in " ".join(graph.op_counts())
    x = torch.randn(5, 3, 4)
    with torch.no_grad():
        torch.testing.assert_close(graph(x), module(x))


# --------------------------------------------------------------------- slicing, padding, reductions
def _i64(*v: int) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


VIEW_CASES = {
    "slice_two_axes_step": ([N("Slice", ["x", "s", "e", "a", "st"], ["y"])],
                            {"s": _i64(1, -4), "e": _i64(6, 100), "a": _i64(1, -1),
                             "st": _i64(2, 1)}, {"Slice": 2}),
    "slice_full_axis": ([N("Slice", ["x", "s", "e"], ["y"])],
                        {"s": _i64(0, 1), "e": _i64(9, 3)}, {"Slice": 1}),
    "split_unequal": ([N("Split", ["x", "sp"], ["y", "z"], axis=-1)], {"sp": _i64(2, 4)},
                      {"Slice": 2}),
    "split_even": ([N("Split", ["x"], ["y", "z", "w"], axis=1)], {}, {"Slice": 3}),
    "pad": ([N("Pad", ["x", "p"], ["y"])], {"p": _i64(0, 1, 2, 1, 0, 3)}, {"Pad": 1}),
    "expand": ([N("ReduceSum", ["x", "ax"], ["r"], keepdims=1),
                N("Expand", ["r", "shp"], ["y"])],
               {"ax": _i64(1), "shp": _i64(2, 1, 1, 1)}, {"ReduceSum": 1, "Expand": 1}),
    "reduce_sum": ([N("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], {"ax": _i64(0, -1)},
                   {"ReduceSum": 1}),
    "reduce_mean": ([N("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)], {},
                    {"ReduceMean": 1}),
    "reduce_mean_spatial": ([N("ReduceMean", ["x"], ["y"], axes=[-1], keepdims=0)], {},
                            {"GlobalAveragePool": 1, "Reshape": 1}),
    "reduce_mean_spatial_keep": ([N("ReduceMean", ["x"], ["y"], axes=[2], keepdims=1)], {},
                                 {"GlobalAveragePool": 1}),
}


@pytest.mark.parametrize("name", list(VIEW_CASES))
def test_view_and_reduction_operators(name: str) -> None:
    nodes, inits, ops = VIEW_CASES[name]
    outs = [o for o in nodes[-1].output]
    x = rand(2, 6, 6)
    check(make(nodes, {"x": (2, 6, 6)}, outs, inits), {"x": x}, ops)


def test_pad_with_a_value_stays_opaque() -> None:
    nodes = [N("Pad", ["x", "p", "v"], ["y"])]
    inits = {"p": _i64(1, 1), "v": np.asarray(2.0, dtype=np.float32)}
    check(make(nodes, {"x": (4,)}, ["y"], inits), {"x": rand(4)}, {"Opaque[Pad]": 1})


def test_pow_of_another_exponent_stays_opaque() -> None:
    nodes = [N("Pow", ["x", "e"], ["y"])]
    graph = check(make(nodes, {"x": (2, 5)}, ["y"], {"e": np.asarray(1.7, np.float32)}),
                  {"x": np.abs(rand(2, 5)) + 0.1}, {"Opaque[Pow]": 1})
    assert graph.nodes[0].op == "Opaque"
