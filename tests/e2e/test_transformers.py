"""End to end: ``ollie.optimize`` on the transformer zoo models (a small BERT layer, and the
Longformer layer whose banded products are plain PyTorch) gives the module's output."""

from __future__ import annotations

import pytest
import torch

import ollie
import ollie.zoo as zoo
from ollie.optimizer.regions import RULE_ORDER

FAST = {"time_budget": 1.0, "max_candidates": 2, "max_depth": 1, "use_cache": False,
        "settle": 0.0, "context": False, "choose_libraries": False}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize(("name", "options"), [
    ("bert", {"seq": 32, "hidden": 64, "heads": 4, "ffn": 128}),
    ("longformer_plain", {"seq": 64, "width": 4, "dilation": 2}),
])
def test_optimized_transformer_matches_the_module(name: str, options: dict) -> None:
    module, (x,) = zoo.get(name, batch=1, **options)
    opt = ollie.optimize(module, (x,), **FAST)
    other = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for inp in (x, other):
            assert _rel(opt(inp), module(inp)) < 1e-4
    # every subprogram is a MatMul, a sibling merge of MatMuls (kept when it measures
    # faster: the Q/K/V projections), a fused chain ending in a sum (the plain banded
    # products, kept when faster), or a linear region derived by an inter-expression rule
    # (kept when faster)
    ops = {r.op for r in opt.report}
    assert {o for o in ops if not o.startswith("region of ")} <= \
        {"MatMul", "MatMul x3", "ReduceSum"}, ops
    first = {"ReduceSum": {"expression_fusion"}, "MatMul x3": {"expression_merging"}}
    merged = [r for r in opt.report if len(r.nodes) > 1]
    assert all(r.derivation[0] in first.get(r.op, RULE_ORDER) for r in merged), \
        [(r.op, r.derivation) for r in merged]
    if name == "bert":  # its Q/K/V projections are found as one group and verified
        assert merged or any(n.startswith("siblings ") for n in opt.notes), opt.notes
    assert any("checked against the original model" in n for n in opt.notes)
