"""Opaque torch operators inside ONNX Runtime regions (ollie.backends.onnxrt.opaque):
layer norm, GELU (exact and tanh) and unmasked scaled dot-product attention are expressed in
ONNX, so a transformer block is one region matching the module; arguments it does not express
(a mask) leave the operator outside the region, run by PyTorch."""

from __future__ import annotations

from dataclasses import replace

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


def _regions(m: nn.Module, x: torch.Tensor) -> tuple[Program, list[int], set[int]]:
    """``m``'s program with its regions marked, checked against ``m``; the positions of its
    opaque kernels, and of the kernels inside a region."""
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
    return marked, opaque, inside


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_transformer_block_is_one_region_with_its_opaque_operators(approximate):
    torch.manual_seed(0)
    _, opaque, inside = _regions(_Block(approximate=approximate), torch.randn(2, 5, 16))
    assert len(opaque) == 4  # two layer norms, the attention, the GELU
    assert set(opaque) <= inside


def test_a_masked_attention_stays_outside_the_region():
    torch.manual_seed(0)
    m = _Block(masked=True).eval()
    x = torch.randn(2, 5, 16)
    marked, opaque, inside = _regions(m, x)
    assert len(opaque) == 4
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


class _Biased(nn.Module):
    """Attention with a floating-point mask computed from a parameter (T5's position bias)."""

    def __init__(self, d: int = 16, n: int = 5) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.bias = nn.Parameter(torch.randn(1, n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.bias * 0.5 + x[:, :, :1]
        return F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), attn_mask=mask,
                                              scale=1.0)


def test_an_attention_with_a_float_mask_is_inside_the_region():
    torch.manual_seed(0)
    _, opaque, inside = _regions(_Biased(), torch.randn(2, 5, 16))
    assert len(opaque) == 1 and set(opaque) <= inside


class _Gated(nn.Module):
    """A product reading a boolean result of an opaque operator (``y > 0.1``): the frontend
    converts it to float32 with an opaque ``_to_copy``."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(y * torch.gt(y, 0.1) + y)


def test_a_kernel_reading_a_boolean_tensor_stays_outside_the_regions():
    torch.manual_seed(0)
    prog = _program(_Gated().eval(), torch.randn(2, 5, 16))
    cast = next(k for k in prog.kernels if getattr(k.params, "node", None) is not None
                and k.params.node.attrs.get("op_type") == "_to_copy")
    readers = [i for i, k in enumerate(prog.kernels) if cast.output in k.inputs]
    inside = {i for s, e in ort_region.spans(prog) for i in range(s, e)}
    assert readers and set(readers) <= inside  # a float32 result: read inside a region
    # the same operator declared to give booleans: its readers leave the regions
    node = cast.params.node
    boolean = replace(cast, params=replace(cast.params, node=replace(
        node, attrs={**node.attrs, "output_dtypes": ["bool"]})))
    marked = Program(prog.inputs, prog.outputs,
                     [boolean if k is cast else k for k in prog.kernels], prog.constants)
    inside = {i for s, e in ort_region.spans(marked) for i in range(s, e)}
    assert not inside.intersection(readers)


class _Masked(nn.Module):
    """Scores filled where a mask computed from the input is false (DeBERTa's form: the
    torch.compile backend passes the mask as 0.0 / 1.0 and casts it back with ``.bool()``;
    ``compare``: a comparison instead of the cast), then ``torch.where`` on the result
    (``where``), or the mask also read by ``torch.any``, which no region expresses
    (``outside``)."""

    def __init__(self, d: int = 16, compare: bool = False, where: bool = False,
                 outside: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.compare, self.where, self.outside = compare, where, outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.q(x)[:, None, :, 0]
        keep = h > 0.2 if self.compare else torch.relu(h - 0.2).bool()  # [b, 1, n]
        s = self.q(x) @ self.k(x).transpose(1, 2)
        s = s.masked_fill(~keep, torch.finfo(torch.float32).min)
        y = torch.softmax(s, dim=-1) @ self.v(x)
        if self.where:
            y = torch.where(self.v(x)[..., :1] > 0.0, y, 0.5)
        return y * torch.any(keep, dim=-1, keepdim=True) if self.outside else y


def _opaque_types(prog: Program) -> dict[str, int]:
    return {k.params.node.attrs["op_type"]: i for i, k in enumerate(prog.kernels)
            if getattr(k.params, "node", None) is not None and k.params.node.op == "Opaque"}


@pytest.mark.parametrize(("compare", "where"), [(False, False), (True, True)])
def test_a_boolean_mask_made_and_read_in_the_region_is_inside_it(compare, where):
    torch.manual_seed(0)
    m = _Masked(compare=compare, where=where).eval()
    x = torch.randn(2, 5, 16)
    marked, opaque, inside = _regions(m, x)
    types = _opaque_types(marked)
    made = "gt.Scalar" if compare else "to.dtype"
    assert {made, "bitwise_not", "masked_fill.Scalar"} <= set(types)
    assert ("where.ScalarOther" in types) == where
    assert set(opaque) <= inside


def test_a_boolean_mask_also_read_outside_keeps_its_operators_out_of_the_regions():
    torch.manual_seed(0)
    m = _Masked(outside=True).eval()
    x = torch.randn(2, 5, 16)
    marked, _, inside = _regions(m, x)
    types = _opaque_types(marked)
    assert types["to.dtype"] not in inside and types["bitwise_not"] not in inside
    assert types["masked_fill.Scalar"] not in inside
