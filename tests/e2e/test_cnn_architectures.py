"""Common CNN architectures (:mod:`ollie.testing.cnns`) optimise end to end, from their ONNX
export and from the torch module, and the optimised programs match the models on new inputs
and survive save / load. Each brings operators the zoo lacks: ReLU6 / Clip, SiLU, Hardswish,
grouped and depthwise convolutions, channel split and shuffle, Resize, LayerNorm, GELU."""

import pickle

import numpy as np
import pytest
import torch

import ollie
from ollie.frontend import to_onnx
from ollie.graph.opaque import OpRef, torch_opaque_attrs
from ollie.program.kernel import Kernel
from ollie.program.program import Program, constant_array
from ollie.testing.cnns import ARCHITECTURES, build

SIZE = 16
# settle=0: no idle pauses around ONNX Runtime sessions in the whole-program comparisons;
# one candidate per subprogram, 0.5 s of search: subprograms still get a derived candidate,
# compiled, verified and timed (efficientnet 17 for its 17, googlenet 14 for 14). The numba
# compilation of their eOperators is most of these tests' time with a cold kernel cache:
# efficientnet, googlenet and mobilenetv2 from ONNX and torch, alone, fresh kernel cache,
# one run after the other: 265 s with 2 candidates and 1 s, 124 s so (2-core EPYC VM,
# 2026-11-25)
FAST = dict(time_budget=0.5, max_candidates=1, use_cache=False, settle=0.0)
# the ONNX exports without the whole-program context step (a fifth of such a test's time; its
# own tests: tests/optimizer/test_context.py); the torch modules keep it
NO_CONTEXT = dict(FAST, context=False)
# the torch frontend keeps some of their operators opaque (aten calls): chunk, upsample,
# layer_norm, gelu; others become element-wise nodes: hardtanh, silu, hardswish
TORCH_OPAQUE = ("mobilenetv2", "mobilenetv3", "efficientnet", "shufflenetv2", "unet_resize",
                "convnext")


def _check(model, opt, tmp_path):
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        want = model(x)
    got = opt(x)
    assert got.shape == want.shape
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-3, err
    # the optimised program itself passed the end-to-end check: no fallback hid a wrong one
    assert any("checked against the original model" in n for n in opt.notes), opt.notes
    assert not any("falling back" in n or "failed" in n or "disagrees" in n
                   for n in opt.notes), opt.notes
    opt.save(tmp_path / "prog")
    again = ollie.load(tmp_path / "prog")
    torch.testing.assert_close(again(x), got)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_onnx_export_optimises(name, tmp_path):
    model = build(name, w=8, size=SIZE)
    path = to_onnx(model, (torch.randn(1, 3, SIZE, SIZE),), tmp_path / f"{name}.onnx")
    _check(model, ollie.optimize(str(path), **NO_CONTEXT), tmp_path)


@pytest.mark.parametrize("name", TORCH_OPAQUE)
def test_torch_module_optimises(name, tmp_path):
    model = build(name, w=8, size=SIZE)
    opt = ollie.optimize(model, (torch.randn(1, 3, SIZE, SIZE),), **FAST)
    _check(model, opt, tmp_path)


def test_unknown_architecture_is_named():
    with pytest.raises(KeyError, match="resnet9000"):
        build("resnet9000")


def test_opaque_aten_operator_is_picklable_and_callable():
    attrs = torch_opaque_attrs(torch.ops.aten.hardtanh.default, (None, 0.0, 6.0), {},
                               [(3,)], ["float32"])
    ref = attrs["target"]
    assert isinstance(ref, OpRef) and attrs["op_type"] == "hardtanh"
    again = pickle.loads(pickle.dumps(ref))
    x = torch.tensor([-1.0, 3.0, 9.0])
    torch.testing.assert_close(again(x, 0.0, 6.0), torch.tensor([0.0, 3.0, 6.0]))
    assert str(OpRef.of(torch.ops.aten.upsample_nearest2d.vec)) == "aten::upsample_nearest2d.vec"
    with pytest.raises(ollie.errors.UnsupportedError, match="no_such_op"):
        OpRef("aten", "no_such_op", "default")(x)


def test_program_knows_multi_output_node_outputs():
    from ollie.graph.ir import Node

    node = Node("Opaque", ("x",), ("a", "b"), {"output_shapes": [(2,), (3,)]}, name="split")
    k = Kernel("Node", {"node": node}, ("x",), "a", None, shape=(2,))
    assert k.outputs == ("a", "b")
    prog = Program((("x", (5,)),), ("b",), [k])
    prog.check()  # 'b' is defined by the node's second output
    assert prog.tensor_shapes()["b"] == (3,)


def test_integer_constants_keep_their_dtype():
    assert constant_array(np.array([1, 2], np.int64)).dtype == np.int64
    assert constant_array(np.array([True])).dtype == np.bool_
    assert constant_array(np.array([1.5], np.float64)).dtype == np.float32


def test_lowered_constants_are_named_after_their_node():
    from torch import nn

    from ollie.frontend import from_torch

    model = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4)).eval()
    graph = from_torch(model, (torch.randn(1, 4, 3, 3),))
    bns = [n for n in graph.nodes if n.op == "BatchNorm"]
    assert len(bns) == 2
    names = [set(graph.lower_node(n).consts) for n in bns]
    assert names[0] and names[1] and not names[0] & names[1]
    for node, consts in zip(bns, names, strict=True):
        low = graph.lower_node(node)
        assert consts <= dict(low.expr.decls).keys()
        assert all(c.startswith(node.outputs[0]) for c in consts)


def test_views_returned_by_graph_nodes_keep_their_buffers():
    """A chunk run as it is returns views of its input: that input's buffer must not go back
    to the pool while the views live (a later kernel would overwrite them)."""
    from torch import nn

    class Split(nn.Module):
        def forward(self, x):
            a, b = (torch.relu(x) + 1.0).chunk(2, dim=1)
            return torch.cat([torch.relu(b * 2.0), a], 1) + torch.relu(a - 3.0).sum()

    model = Split().eval()
    x = torch.randn(1, 4, 5, 5)
    opt = ollie.optimize(model, (x,), **FAST)
    assert any("checked against the original model" in n for n in opt.notes), opt.notes
    for _ in range(2):
        x = torch.randn(1, 4, 5, 5)
        torch.testing.assert_close(opt(x), model(x))


def test_element_wise_products_are_eoperators():
    """x * sigmoid(x) matches a Matmul without a summation too; the program computes it as an
    eOperator (fused with its neighbours), never as a k = 1 matrix product."""
    from torch import nn

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    opt = ollie.optimize(model, (x,), **FAST)
    torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-5)
    assert not [k.output for k in opt.program.kernels
                if k.kind == "Matmul" and not k.expr.root.summation]
