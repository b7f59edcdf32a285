"""``torch.compile(model, backend="ollie")``: registered when ``ollie`` is imported.

Dynamo hands the backend an FX graph module and example inputs; Ollie optimises it like any
module and returns a callable with the graph's output structure. The backend never takes a
user's model down: whatever Ollie cannot or does not handle runs as the graph module itself
(the default path), with one warning naming the cause:

* a graph that needs gradients (grad mode on and an input or parameter that requires grad:
  training): Ollie's programs are inference programs, which autograd cannot differentiate;
* graph inputs that are not tensors (symbolic sizes of a dynamic-shape graph), or tensors on
  more than one device;
* any error while optimising (an unsupported operator, a corrupt cache, a bug in Ollie);
* an error of the optimised program when it is called (the graph module then serves this and
  every later call).

Settings: :data:`BACKEND_CONFIG` (its ``device`` is replaced by the example inputs' device).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from ollie.optimizer.model import OptimizeConfig, optimize

log = logging.getLogger(__name__)
BACKEND_CONFIG = OptimizeConfig(time_budget=10.0)
"""Used by the torch.compile backend (replace it to change budgets)."""


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> str | None:
    """Why this graph runs on the default path, or None when Ollie takes it."""
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        kinds = sorted({type(x).__name__ for x in example_inputs
                        if not isinstance(x, torch.Tensor)})
        return f"non-tensor graph inputs ({', '.join(kinds)})"
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if torch.is_grad_enabled() and (
            any(x.requires_grad for x in tensors)
            or any(p.requires_grad for p in gm.parameters())):
        return ("the graph needs gradients (training); Ollie optimises inference graphs: "
                "call the model under torch.no_grad() / torch.inference_mode() or in eval "
                "with parameters frozen to use it")
    devices = {x.device.type for x in tensors}
    if len(devices) > 1 or devices - {"cpu", "cuda"}:
        return f"inputs on devices {sorted(devices)}"
    return None


def ollie_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable:
    """The ``"ollie"`` torch.compile backend (see the module docstring)."""
    why = _refusal(gm, example_inputs)
    if why is not None:
        log.warning("ollie backend: running the graph unchanged: %s", why)
        return gm.forward
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    device = tensors[0].device.type if tensors else BACKEND_CONFIG.device
    try:
        with torch.no_grad():
            ref = gm(*example_inputs)
        opt = optimize(gm, tensors, device=device, config=replace(BACKEND_CONFIG,
                                                                   device=device))
    except Exception as exc:  # never fail the user's compilation because of Ollie
        log.warning("ollie backend: running the graph unchanged: %s", _cause(exc))
        log.debug("ollie backend failure", exc_info=True)
        return gm.forward
    state: dict[str, Callable] = {}

    def run(*args: torch.Tensor) -> object:
        fallback = state.get("fallback")
        if fallback is not None:
            return fallback(*args)
        try:
            out = opt(*args)
        except Exception as exc:  # the program failed: the graph module from now on
            log.warning("ollie backend: the optimised program failed (%s); running the graph "
                        "unchanged from now on", _cause(exc))
            state["fallback"] = gm.forward
            return gm.forward(*args)
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
