"""Opaque torch operators inside ONNX Runtime regions (ollie.backends.onnxrt.opaque):
layer norm, GELU (exact and tanh) and unmasked scaled dot-product attention are expressed in
ONNX, so a transformer block is one region matching the module; arguments it does not express
(a mask) leave the operator outside the region, run by PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ollie
from ollie.backends.onnxrt import region as ort_region
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.libraries import REGIONS, variant
from ollie.program.program import Program

pytest.importorskip("onnxruntime")


class _Block(nn.Module):
    """A pre-norm transformer block with one head: layer norm, attention, layer norm, GELU
    MLP (no head split: its layout operators are another matter)."""

    def __init__(self, d: int = 16, approximate: str = "none", masked: bool = False) -> None:
        super().__init__()
        self.approximate, self.masked = approximate, masked
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d, elementwise_affine=False)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        n = x.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool).tril() if self.masked else None
        a = F.scaled_dot_product_attention(self.q(h), self.k(h), self.v(h), attn_mask=mask)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate=self.approximate))


def _program(m: nn.Module, x: torch.Tensor) -> Program:
    """``m`` optimised with its original operators kept (no candidate measured): layout
    operators as eOperators, products as ``Matmul`` kernels, the opaque operators as they
    are."""
    return ollie.optimize(m, (x,), "cpu", time_budget=3.0, max_depth=0, guided_depth=0,
                          max_candidates=0, use_cache=False, choose_libraries=False,
                          context=False).program


def _regions(m: nn.Module, x: torch.Tensor):
    prog = _program(m.eval(), x)
    marked = variant(prog, REGIONS)
    assert marked is not None
    got = CompiledProgram(marked)(x)
    assert isinstance(got, torch.Tensor)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-5)
    opaque = [i for i, k in enumerate(marked.kernels) if getattr(k.params, "node", None)
              is not None and k.params.node.op == "Opaque"]
    inside = {i for s, e in ort_region.groups(marked) for i in range(s, e)}
    return opaque, inside


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_transformer_block_is_one_region_with_its_opaque_operators(approximate):
    torch.manual_seed(0)
    opaque, inside = _regions(_Block(approximate=approximate), torch.randn(2, 5, 16))
    assert len(opaque) == 4  # two layer norms, the attention, the GELU
    assert set(opaque) <= inside


def test_a_masked_attention_stays_outside_the_region():
    torch.manual_seed(0)
    m = _Block(masked=True).eval()
    x = torch.randn(2, 5, 16)
    opaque, inside = _regions(m, x)
    marked = variant(_program(m, x), REGIONS)
    assert marked is not None and len(opaque) == 4
    outside = [marked.kernels[i].params.node.attrs["op_type"] for i in opaque
               if i not in inside]
    assert outside == ["scaled_dot_product_attention"]


class _Explicit(nn.Module):
    """Attention written out (BERT's form): products, a scale, a softmax; no convolution."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.q(x) @ self.k(x).transpose(1, 2) / 4.0
        return torch.softmax(s, dim=-1) @ self.v(x)


def test_products_and_softmax_without_a_convolution_form_a_region():
    torch.manual_seed(0)
    m = _Explicit().eval()
    x = torch.randn(2, 5, 16)
    marked = variant(_program(m, x), REGIONS)
    assert marked is not None
    softmax = [i for i, k in enumerate(marked.kernels)
               if getattr(k.params, "node", None) is not None and k.params.node.op == "Softmax"]
    inside = {i for s, e in ort_region.groups(marked) for i in range(s, e)}
    assert softmax and set(softmax) <= inside
    with torch.no_grad():
        torch.testing.assert_close(CompiledProgram(marked)(x), m(x), rtol=1e-4, atol=1e-5)
