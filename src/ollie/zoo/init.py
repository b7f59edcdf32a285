"""Deterministic, data-dependent initialisation of the zoo models.

No weights are downloaded: every model is built under ``torch.manual_seed(seed)`` (inside
``torch.random.fork_rng`` so the caller's random state is untouched), its weights drawn from
the default PyTorch initialisers, and then *calibrated* with one forward pass on a fixed random
batch so that activations stay O(1) through the whole network:

* every ``Conv2d`` / ``ConvTranspose2d`` / ``Linear`` **not followed by a BatchNorm** gets its
  weight and bias scaled so that its output has unit standard deviation on the calibration
  batch (layer-sequential unit-variance init, done in a single pass: each hook rescales the
  layer and the output the next layer sees);
* every ``BatchNorm2d`` gets running statistics equal to its input's batch statistics, and
  random affine parameters (``gamma ~ U(0.5, 1)``, ``beta ~ N(0, 0.1)``) so that folding the
  normalisation into convolutions is not a no-op. A BatchNorm that ends a residual branch
  (attribute ``residual_end = True``, set by the zoo's ResNet blocks, and for torchvision models by
  :func:`ollie.zoo.external.mark_residual_ends`) gets ``gamma ~ U(0.2, 0.4)``,
  as in trained ResNets: with full-size residual branches a random ResNet-50 amplifies
  float32 rounding ~1000x (5e-5 relative output error), with these ~100x less.

The calibration batch does not depend on the batch size asked for, so the weights of a model
are the same for every batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise

import torch
from torch import nn

_SCALED = (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block under ``torch.manual_seed(seed)`` without disturbing the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _followed_by_bn(module: nn.Module) -> set[int]:
    """ids of layers that a BatchNorm normalises anyway (next sibling in declaration order, or
    the layer named ``convN`` / ``0`` next to ``bnN`` / ``1``)."""
    out: set[int] = set()
    for parent in module.modules():
        children = list(parent.named_children())
        for (_, a), (_, b) in pairwise(children):
            if isinstance(a, _SCALED) and isinstance(b, nn.BatchNorm2d):
                out.add(id(a))
    return out


@torch.no_grad()
def calibrate(module: nn.Module, make_input: Callable[[], tuple[torch.Tensor, ...]]) -> None:
    """Rescale ``module``'s layers in place as described in the module docstring."""
    skip = _followed_by_bn(module)
    hooks = []

    def scale_output(layer: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
        std = float(out.std())
        if not std > 0.0 or not torch.isfinite(out).all():
            return out
        layer.weight.mul_(1.0 / std)
        if getattr(layer, "bias", None) is not None:
            layer.bias.mul_(1.0 / std)
        return out / std

    def set_stats(layer: nn.BatchNorm2d, args: tuple) -> None:
        x = args[0]
        layer.running_mean.copy_(x.mean(dim=(0, 2, 3)))
        layer.running_var.copy_(x.var(dim=(0, 2, 3), unbiased=False) + 1e-3)
        if layer.affine:
            lo, hi = (0.2, 0.4) if getattr(layer, "residual_end", False) else (0.5, 1.0)
            layer.weight.uniform_(lo, hi)
            layer.bias.normal_(0.0, 0.1)

    for m in module.modules():
        if isinstance(m, _SCALED) and id(m) not in skip:
            hooks.append(m.register_forward_hook(scale_output))
        elif isinstance(m, nn.BatchNorm2d):
            hooks.append(m.register_forward_pre_hook(set_stats))
    try:
        module.eval()
        module(*make_input())
    finally:
        for h in hooks:
            h.remove()
    module.eval()
