"""Helpers of the frontend tests: cached zoo models (small Longformer; GCN, which is fully
convolutional, on a 64 x 64 input to keep the suite fast: its graph is the same, only the
spatial sizes change), their ONNX exports, and the relative error of whole-model checks."""

from __future__ import annotations

from functools import cache

import torch

import ollie.zoo as zoo
from ollie.frontend import to_onnx_model

SMALL = {"longformer": {"seq": 256, "width": 16}}
REL_TOL = 1e-4


@cache
def model(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """(module, example input, reference output) of a zoo model at batch 1."""
    module, (x,) = zoo.get(name, batch=1, **SMALL.get(name, {}))
    if name == "gcn":
        x = x[:, :, 80:144, 80:144].contiguous()
    with torch.no_grad():
        y = module(x)
    return module, x, y


@cache
def onnx_model(name: str) -> object:
    module, x, _ = model(name)
    return to_onnx_model(module, (x,))


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    return float((got.double() - want.double()).norm() / want.double().norm())
