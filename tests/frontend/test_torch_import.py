"""from_torch on small modules: operator coverage, constants, opaque fallback, outputs, and the
make_fx fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ollie.errors import OllieError
from ollie.frontend import from_torch
from ollie.graph import run_graph


def check(module: nn.Module, *inputs: torch.Tensor, ops: dict[str, int] | None = None):
    module.eval()
    graph = from_torch(module, inputs)
    if ops is not None:
        assert graph.op_counts() == ops
    with torch.no_grad():
        want = module(*inputs)
    got = graph(*inputs)
    if isinstance(want, torch.Tensor):
        want, got = (want,), (got,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    for node in graph.lowerable_nodes():
        assert tuple(graph.lower_node(node).output_shape) == graph.shapes[node.outputs[0]]
    return graph


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, groups=1)
        self.bn = nn.BatchNorm2d(4)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 1.5)
        self.deconv = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.leaky_relu(self.bn(self.conv(x)), 0.1)
        y = F.avg_pool2d(F.max_pool2d(y, 2, ceil_mode=True), 1)
        y = torch.sigmoid(self.deconv(y)) * 2.0 + 1.0 - y.mean(dim=(2, 3), keepdim=True)[:, :2]
        y = F.adaptive_avg_pool2d(y, (2, 2))
        y = torch.flatten(y, 1)
        return torch.softmax(self.fc(y), dim=-1)


def test_mixed_cnn() -> None:
    graph = check(Mixed(), torch.randn(2, 3, 16, 16))
    counts = graph.op_counts()
    for op in ("Conv2d", "BatchNorm", "LeakyRelu", "MaxPool2d", "AvgPool2d", "ConvTranspose2d",
               "Sigmoid", "Mul", "Add", "Sub", "GlobalAveragePool", "Reshape", "Gemm",
               "Softmax"):
        assert op in counts, op


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 4))
        self.lin = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.w.t() * 0.5  # a constant subgraph: folded into an initializer
        s = torch.bmm(x, x.transpose(1, 2)) / 2.0
        a = torch.cat([torch.softmax(s, -1) @ x, self.lin(x)], dim=-1)
        h = torch.matmul(a.permute(0, 2, 1).contiguous().reshape(2, -1, 4), w)
        return torch.tanh(h).exp().unsqueeze(1).squeeze(1), z


def test_attention_like_and_multiple_outputs() -> None:
    graph = check(Attention(), torch.randn(2, 3, 4), torch.randn(5))
    counts = graph.op_counts()
    assert counts["MatMul"] == 4 and counts["Concat"] == 1 and counts["Identity"] == 1
    assert "Opaque" not in " ".join(counts)
    assert any(v.shape == (4, 6) for v in graph.initializers.values())  # folded w.t() * 0.5


class Odd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(x) + F.softplus(x)
        y = F.pad(y, (1, 2))
        return torch.cumsum(y, dim=-1).relu()


def test_unknown_ops_are_opaque() -> None:
    graph = check(Odd(), torch.randn(2, 3, 5))
    kinds = {n.attrs.get("op_type") for n in graph.nodes if n.op == "Opaque"}
    assert {"gelu", "softplus", "cumsum"} <= kinds
    with pytest.raises(OllieError, match="opaque"):
        graph.lower_node(next(n for n in graph.nodes if n.op == "Opaque"))


class Activations(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(x * 4.0) + F.hardswish(x) - F.hardsigmoid(x) * F.silu(x)
        return torch.clamp(y, min=-0.5) + F.hardtanh(x, -0.25, 0.75) + x.clamp(max=0.1)


def test_composite_activations_are_element_wise_operators() -> None:
    """ReLU6 / hardtanh / clamp, hardswish, hardsigmoid and SiLU become Max / Min / Mul / Add /
    Sigmoid nodes (eOperators later), not opaque calls."""
    graph = check(Activations(), torch.randn(2, 3, 5) * 4)
    counts = graph.op_counts()
    assert "Opaque" not in " ".join(counts)
    assert counts["Max"] >= 4 and counts["Min"] >= 4 and counts["Sigmoid"] == 1


def test_scalar_arithmetic_and_alpha() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.add(x, x * 3.0, alpha=0.5) - 1.0

    graph = check(M(), torch.randn(4))
    assert graph.op_counts() == {"Add": 1, "Mul": 2, "Sub": 1}


def test_identity_module_output_is_input() -> None:
    graph = check(nn.Identity(), torch.randn(2, 2), ops={"Identity": 1})
    assert graph.outputs[0] != graph.input_names[0]


def test_make_fx_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("export unavailable")

    monkeypatch.setattr(torch.export, "export", broken)
    module = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 2))
    graph = check(module, torch.randn(1, 2, 4, 4))
    assert graph.op_counts()["Conv2d"] == 1 and "Relu" in graph.op_counts()


def test_errors() -> None:
    with pytest.raises(OllieError, match=r"torch\.nn\.Module"):
        from_torch(lambda x: x, (torch.randn(1),))  # type: ignore[arg-type]
    graph = from_torch(nn.ReLU(), (torch.randn(2, 3),))
    with pytest.raises(OllieError, match="shape"):
        run_graph(graph, {graph.input_names[0]: torch.randn(3, 3)})
    with pytest.raises(OllieError, match="missing input"):
        run_graph(graph, {})


def test_factory_constants_are_folded() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ramp = torch.arange(4, dtype=torch.float32) * 0.5
            return x * ramp + torch.ones(4)

    graph = check(M(), torch.randn(3, 4), ops={"Mul": 1, "Add": 1})
    assert any(np.allclose(v, [0, 0.5, 1, 1.5]) for v in graph.initializers.values())


# --------------------------------------------------------------------- slicing, padding, reductions
class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor):
        return self.fn(*xs)


def _no_opaque(graph) -> None:
    assert not [n.describe() for n in graph.nodes if n.opaque]


@pytest.mark.parametrize(("name", "fn", "op"), [
    ("split_sizes", lambda x: x.split([3, 1, 2], dim=-1), "Slice"),
    ("split_int_unequal", lambda x: torch.split(x, 4, dim=2), "Slice"),
    ("chunk_unequal", lambda x: x.chunk(4, dim=1), "Slice"),
    ("chunk_neg_dim", lambda x: torch.chunk(x, 2, dim=-2), "Slice"),
    ("unbind", lambda x: x.unbind(1), "Slice"),
    ("select_neg", lambda x: x.select(-1, -2) * 2, "Slice"),
    ("select_first", lambda x: x[:, 0] + 1, "Slice"),
    ("slice_step", lambda x: x[:, 1:5:2, ::3], "Slice"),
    ("slice_neg", lambda x: x[..., -4:-1], "Slice"),
    ("narrow", lambda x: x.narrow(-1, 2, 3), "Slice"),
    ("unflatten", lambda x: x.unflatten(-1, (3, 2)) * 2, "Reshape"),
    ("unsqueeze_squeeze", lambda x: x.unsqueeze(-2).relu().squeeze(-2), "Reshape"),
    ("expand", lambda x: x[:, :1].expand(2, 5, 6) + 0, "Expand"),
    ("expand_new_dims", lambda x: x.mean(1).unsqueeze(1).expand(-1, 5, -1) * x, "Expand"),
    ("pad", lambda x: F.pad(x, (1, 2, 0, 3)), "Pad"),
    ("constant_pad_nd", lambda x: torch.constant_pad_nd(x, [2, 0]), "Pad"),
    ("unfold", lambda x: x.unfold(1, 2, 2).relu(), "Unfold"),
    ("unfold_neg_dim", lambda x: x.unfold(-1, 3, 1) * 2, "Unfold"),
    ("sum", lambda x: x.sum(-1), "ReduceSum"),
    ("sum_keep", lambda x: x.sum(dim=(0, 2), keepdim=True), "ReduceSum"),
    ("mean", lambda x: x.mean(dim=1, keepdim=True), "ReduceMean"),
    ("mean_spatial", lambda x: x.mean(dim=-1), "GlobalAveragePool"),
    ("mean_two", lambda x: x.mean(dim=(-1, 0)), "ReduceMean"),
    ("roll", lambda x: torch.roll(x, shifts=(-2, 3), dims=(1, 2)), "Concat"),
    ("roll_neg_dim", lambda x: x.roll(8, -1) * 2, "Concat"),
    ("roll_whole", lambda x: x.roll(5, 1) + 1, "Add"),
])
def test_view_and_reduction_ops(name: str, fn, op: str) -> None:
    graph = check(Lambda(fn), torch.randn(2, 5, 6))
    _no_opaque(graph)
    assert op in graph.op_counts(), graph.op_counts()


def test_split_emits_only_the_used_pieces() -> None:
    graph = check(Lambda(lambda x: x.chunk(3, dim=-1)[1] * 2), torch.randn(2, 5, 6))
    assert graph.op_counts() == {"Mul": 1, "Slice": 1}


def test_full_slices_and_zero_pads_are_the_input() -> None:
    graph = check(Lambda(lambda x: F.pad(x[:, :, 0:100], (0, 0)).expand(2, 5, 6).relu()),
                  torch.randn(2, 5, 6))
    assert graph.op_counts() == {"Relu": 1}


@pytest.mark.parametrize("fn", [
    lambda x: F.pad(x, (1, 1), value=1.0),
    lambda x: F.pad(x, (-1, 1)),
    lambda x: F.pad(x, (1, 1), mode="reflect"),
    lambda x: x.sum(),
    lambda x: torch.roll(x, 3),
])
def test_unsupported_forms_stay_opaque(fn) -> None:
    graph = check(Lambda(fn), torch.randn(2, 5, 6))
    assert any(n.op == "Opaque" for n in graph.nodes)


def test_dilated_window_attention_in_plain_torch() -> None:
    def band(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        w, d = 2, 2
        kp = F.pad(k, (0, 0, w * d, w * d))
        kw = kp.unfold(1, 2 * w * d + 1, 1)[..., ::d]  # [b, m, c, 2w+1]
        return (q.unsqueeze(-1) * kw).sum(-2)

    graph = check(Lambda(band), torch.randn(2, 9, 4), torch.randn(2, 9, 4))
    _no_opaque(graph)
    assert {"Pad", "Unfold", "Slice", "ReduceSum"} <= set(graph.op_counts())


def test_multihead_attention_block_keeps_only_its_boundaries_opaque() -> None:
    from vit_block import ViTBlock

    graph = check(ViTBlock(dim=16, heads=2, mlp=32), torch.randn(2, 5, 16))
    kinds = sorted(n.attrs.get("op_type", n.op) for n in graph.nodes if n.opaque)
    assert set(kinds) <= {"gelu", "layer_norm", "scaled_dot_product_attention"}, kinds


def test_powers_and_reciprocals_are_element_wise_operators() -> None:
    """GPT-2's ``x ** 3``, T5's ``x.pow(2)`` and ``rsqrt``: Mul / Sqrt / Div nodes (fused into
    eOperators later) with the values PyTorch computes; another exponent stays opaque."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        p = x.pow(2) + 1.0
        return torch.pow(x, 3) + torch.rsqrt(p) + p.reciprocal() + p ** 0.5 + p.pow(-2) \
            + x.pow(1) - p.pow(-1)

    graph = check(Lambda(fn), torch.randn(2, 5, 6))
    _no_opaque(graph)
    assert graph.op_counts()["Sqrt"] == 2
    graph = check(Lambda(lambda x: (x.abs() + 0.5).pow(1.7)), torch.randn(2, 5, 6))
    assert [n.attrs.get("op_type") for n in graph.nodes if n.opaque] == ["pow.Tensor_Scalar"]


def test_integer_and_boolean_operands_become_float32() -> None:
    """``y * (y > 0)``, a boolean constant and an integer constant as operands of element-wise
    operators: converted to float32 (an opaque ``_to_copy`` for the computed mask, constants
    at import), as PyTorch promotes them."""
    keep = torch.tensor([True, False, True, True, False, True])
    steps = torch.arange(6)

    def fn(x: torch.Tensor) -> torch.Tensor:
        count = (x > 0).sum(-1, keepdim=True)  # an integer tensor
        return x * (x > 0.1) + x * keep - steps + torch.sqrt(steps) + count.pow(0.5) \
            + torch.rsqrt(count + 1)

    graph = check(Lambda(fn), torch.randn(2, 5, 6))
    opaque = sorted(str(n.attrs.get("op_type")) for n in graph.nodes if n.opaque)
    assert opaque.count("_to_copy") == 3, opaque


def test_factories_of_a_computed_tensors_shape_are_constants() -> None:
    """``x.new_zeros(...)``, ``torch.full_like(x, v)`` and a mask built from them (Swin's
    attention mask: slices filled, compared, ``masked_fill``) depend on ``x``'s shape only:
    folded into constants, nothing opaque."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros((5, 6))
        mask[:2, 3:] = 1.0
        mask = mask.masked_fill(mask != 0, -100.0)
        return x + mask + torch.full_like(x, 0.5) * torch.ones_like(x) + x.new_ones(6)

    graph = check(Lambda(fn), torch.randn(2, 5, 6))
    _no_opaque(graph)
