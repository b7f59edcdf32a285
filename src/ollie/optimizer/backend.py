"""``torch.compile(model, backend="ollie")``: registered when ``ollie`` is imported.

Dynamo hands the backend an FX graph module and example inputs; Ollie optimises it like any
module and returns a callable with the graph's output structure. Anything Ollie cannot handle
(non-tensor inputs, an import error) falls back to the graph module itself, with a warning,
so compilation never fails because of Ollie. Settings: :data:`BACKEND_CONFIG`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from ollie.errors import OllieError
from ollie.optimizer.model import OptimizeConfig, optimize

log = logging.getLogger(__name__)
BACKEND_CONFIG = OptimizeConfig(time_budget=10.0)
"""Used by the torch.compile backend (replace it to change budgets or the device)."""


def ollie_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable:
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        log.warning("ollie backend: non-tensor graph inputs; running the graph unchanged")
        return gm.forward
    with torch.no_grad():
        ref = gm(*example_inputs)
    try:
        opt = optimize(gm, list(example_inputs), device=BACKEND_CONFIG.device,
                       config=BACKEND_CONFIG)
    except (OllieError, RuntimeError, NotImplementedError) as exc:
        log.warning("ollie backend: falling back to the graph module (%s)", exc)
        return gm.forward

    def run(*args: torch.Tensor) -> object:
        out = opt(*args)
        if isinstance(ref, (tuple, list)):
            outs = out if isinstance(out, tuple) else (out,)
            return type(ref)(outs)
        return out

    return run


def register() -> None:
    """Register the backend under the name ``"ollie"`` (idempotent)."""
    try:
        from torch._dynamo import list_backends, register_backend
    except ImportError:  # pragma: no cover - torch without dynamo
        return
    if "ollie" not in list_backends(exclude_tags=()):
        register_backend(name="ollie")(ollie_backend)
