"""``torch.compile(model, backend="ollie")``: registered when ``ollie`` is imported.

Dynamo hands the backend an FX graph module and example inputs; Ollie optimises it like any
module and returns a callable with the graph's output structure (a graph break gives several
graphs, each handed over on its own). The backend never takes a user's model down: whatever
Ollie cannot or does not handle runs as the graph module itself (the default path), with one
warning naming the cause:

* a graph that needs gradients (grad mode on and an input or parameter that requires grad:
  training): Ollie's programs are inference programs, which autograd cannot differentiate;
* graph inputs that are neither tensors nor numbers, or tensors on more than one device;
* any error while optimising (an unsupported operator, a corrupt cache, a bug in Ollie), or
  a program that, called on the graph's example inputs, disagrees with the graph module
  beyond ``check_rtol`` (e.g. the original operators Ollie falls back to when its checks
  fail, for a model too ill-conditioned in float32 for any other float32 computation to
  match it);
* an error of the optimised program when it is called (the graph module then serves this and
  every later call).

Parameters and buffers: dynamo passes a module's parameters and buffers to the backend as
graph inputs (marked static); Ollie optimises the graph with them as constants (folded,
pre-packed, integer buffers such as BERT's position ids included), and the program takes the
other inputs. A call whose parameters or buffers are other tensors, or were written since
(``load_state_dict``, an optimiser step), runs the graph module. Integer and boolean tensor
inputs (token ids, attention masks), which a float32 program cannot take: the nodes that turn
them into floating-point tensors (embedding lookups, mask casts) are cut off and run in
PyTorch, and the rest of the graph is optimised on their floating-point results
(:mod:`ollie.optimizer.int_inputs`), so the program serves any ids. Where nothing can be cut
off so (the integers meet the floats in one operator: ``masked_fill`` of the scores with a
mask passed in), the integers are constants of the program: a call with other values in
them runs the graph module.

Dynamic shapes: when a model is called with a second batch size, dynamo recompiles the graph
with symbolic sizes (its "automatic dynamic" shapes), and the graph's inputs then include the
sizes as numbers. Ollie's programs are specialised to shapes, so such a graph is optimised
lazily, once per distinct set of concrete input shapes and numbers met at call time (as
``torch.compile(..., dynamic=False)`` recompiles per shape), at most
:data:`MAX_SPECIALISATIONS` of them; later new shapes run the graph module.

Settings: :data:`BACKEND_CONFIG` (its ``device`` is replaced by the inputs' device).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from ollie.errors import UnsupportedError
from ollie.exec.precision import full_fp32
from ollie.optimizer.int_inputs import split_at_floats, static_input
from ollie.optimizer.libraries import rel_err
from ollie.optimizer.model import OptimizeConfig, optimize

log = logging.getLogger(__name__)
BACKEND_CONFIG = OptimizeConfig()
"""Used by the torch.compile backend (replace it to change budgets): the defaults of
:func:`ollie.optimize` (the default total budget of each graph,
:data:`ollie.optimizer.budget.AUTO`), so that the decisions cached by ``ollie.optimize`` of a
model serve ``torch.compile`` of it, and the reverse: cached decisions are keyed by the
search settings (:func:`ollie.optimizer.budget.search_key`)."""
MAX_SPECIALISATIONS = 8
"""Concrete shape sets optimised per dynamic-shape graph; beyond them it runs unchanged."""

_NUMBERS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _refusal(gm: torch.fx.GraphModule, inputs: Sequence[object]) -> str | None:
    """Why this graph runs on the default path, or None when Ollie takes it."""
    odd = sorted({type(x).__name__ for x in inputs
                  if not isinstance(x, (torch.Tensor, *_NUMBERS))})
    if odd:
        return f"graph inputs of types {', '.join(odd)}"
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors:
        return "a graph without tensor inputs"
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


def _symbolic(inputs: Sequence[object]) -> bool:
    """Whether the graph was traced with symbolic sizes (dynamic shapes)."""
    for x in inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(x, torch.Tensor) and any(
                isinstance(d, torch.SymInt) for d in x.shape):
            return True
    return False


def _fixed(x: object) -> bool:
    """Whether graph input ``x`` is a constant of the program: a parameter or buffer, or an
    integer or boolean tensor (ids, masks), which a float32 program does not take."""
    return isinstance(x, torch.Tensor) and (static_input(x) or not x.is_floating_point())


class _Bound(torch.nn.Module):
    """The graph module with its number inputs and its :func:`_fixed` tensor inputs fixed,
    and only its tensor outputs: a module of the other tensors to tensors (the numbers a graph
    returns are sizes, fixed by its inputs). The fixed tensors are buffers of this module, so
    the optimiser sees them as constants."""

    def __init__(self, gm: torch.fx.GraphModule, inputs: Sequence[object],
                 tensor_outputs: Sequence[int]) -> None:
        super().__init__()
        self.gm = gm
        self.numbers = {i: x for i, x in enumerate(inputs) if not isinstance(x, torch.Tensor)}
        self.statics = [i for i, x in enumerate(inputs) if _fixed(x)]
        for i in self.statics:
            x = inputs[i]
            assert isinstance(x, torch.Tensor)
            self.register_buffer(f"static_{i}", x.detach(), persistent=False)
        self.arity = len(inputs)
        self.tensor_outputs = tuple(tensor_outputs)

    def forward(self, *tensors: torch.Tensor) -> tuple[object, ...]:
        it = iter(tensors)
        args = [self.numbers[i] if i in self.numbers else
                getattr(self, f"static_{i}") if i in self.statics else next(it)
                for i in range(self.arity)]
        outs = _flat(self.gm(*args))
        return tuple(outs[i] for i in self.tensor_outputs)


Stamp = list[tuple[int, torch.Tensor, int, torch.Tensor | None]]


def _stamp(inputs: Sequence[object]) -> Stamp:
    """(position, tensor, version, copy of the values or None) of each :func:`_fixed` tensor
    input. The program holds them as constants, so it serves only a call that passes the same
    parameters and buffers, not written since (``load_state_dict``, an optimiser step), and
    integer / boolean inputs of the same values."""
    return [(i, x, x._version, None if static_input(x) else x.detach().clone())
            for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and _fixed(x)]


def _same_fixed(stamp: Stamp, args: Sequence[object]) -> bool:
    for i, x, version, values in stamp:
        a = args[i] if i < len(args) else None
        if values is None:
            if a is not x or x._version != version:
                return False
        elif not (isinstance(a, torch.Tensor) and a.dtype == values.dtype
                  and a.shape == values.shape and torch.equal(a, values)):
            return False
    return True


def _flat(out: object) -> tuple[object, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _concrete(gm: torch.fx.GraphModule, inputs: Sequence[object], cut: bool = True
              ) -> Callable:
    """Optimise ``gm`` for these concrete inputs; the graph module on refusal or failure.
    ``cut``: a graph with varying integer inputs is first split (:func:`_cut_integers`)."""
    why = _refusal(gm, inputs)
    if why is not None:
        log.warning("ollie backend: running the graph unchanged: %s", why)
        return gm.forward
    split = _cut_integers(gm, inputs) if cut else None
    if split is not None:
        return split
    tensors = [x for x in inputs if isinstance(x, torch.Tensor) and not _fixed(x)]
    device = next(x for x in inputs if isinstance(x, torch.Tensor)).device.type
    stamp = _stamp(inputs)
    try:
        if not tensors:
            raise UnsupportedError("a graph whose tensor inputs are all parameters, buffers "
                                   "or integer / boolean tensors")
        with torch.no_grad(), full_fp32():  # no TF32: the reference of the check below
            ref = gm(*inputs)
        refs = _flat(ref)
        slots = [i for i, o in enumerate(refs) if isinstance(o, torch.Tensor)]
        bound = len(tensors) < len(inputs) or len(slots) < len(refs)
        model = _Bound(gm, inputs, slots) if bound else gm
        cfg = replace(BACKEND_CONFIG, device=device)
        opt = optimize(model, tensors, device=device, config=cfg)
        with torch.no_grad():
            outs = _flat(opt(*tensors))
        err = max((rel_err(o, r) for o, i in zip(outs, slots, strict=True)
                   if isinstance(r := refs[i], torch.Tensor)), default=0.0)
        if not err <= cfg.check_rtol:  # NaN included
            raise UnsupportedError(f"the program Ollie returned disagrees with the graph on "
                                   f"the example inputs (relative error {err:.2e})")
    except Exception as exc:  # never fail the user's compilation because of Ollie
        log.warning("ollie backend: running the graph unchanged: %s", _cause(exc))
        log.debug("ollie backend failure", exc_info=True)
        return gm.forward
    state: dict[str, Callable] = {}

    def run(*args: object) -> object:
        fallback = state.get("fallback")
        if fallback is not None:
            return fallback(*args)
        if not _same_fixed(stamp, args):
            if "stale" not in state:
                state["stale"] = gm.forward
                log.warning("ollie backend: a parameter or buffer changed since the graph was "
                            "optimised, or an integer / boolean input has other values; such "
                            "calls run the graph unchanged")
            return gm.forward(*args)
        try:
            out = opt(*[a for a in args if isinstance(a, torch.Tensor) and not _fixed(a)])
        except Exception as exc:  # the program failed: the graph module from now on
            log.warning("ollie backend: the optimised program failed (%s); running the graph "
                        "unchanged from now on", _cause(exc))
            state["fallback"] = gm.forward
            return gm.forward(*args)
        if not isinstance(ref, (tuple, list)):
            return _flat(out)[0]
        got = iter(_flat(out))
        return type(ref)(next(got) if i in slots else refs[i] for i in range(len(refs)))

    return run


def _cut_integers(gm: torch.fx.GraphModule, inputs: Sequence[object]) -> Callable | None:
    """``gm`` with the part that turns its varying integer inputs into floating-point
    tensors cut off (:func:`~ollie.optimizer.int_inputs.split_at_floats`: it runs in PyTorch)
    and the rest optimised for the floating-point tensors it reads (:func:`_concrete`); None
    where there is no such part or the split fails (the integers are then constants)."""
    try:
        split = split_at_floats(gm, inputs)
        if split is None:
            return None
        args = split.rest_inputs(inputs)
    except Exception as exc:  # optional: the integers stay constants of the program
        log.info("ollie backend: integer inputs not cut off: %s", _cause(exc))
        return None
    return split.joined(_concrete(split.rest, args, cut=False))


def _call_key(args: Sequence[object]) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.device.type, a.requires_grad)
                 if isinstance(a, torch.Tensor) else (type(a).__name__, a) for a in args)


def _specialising(gm: torch.fx.GraphModule) -> Callable:
    """A dynamic-shape graph: optimised per concrete call signature, lazily."""
    programs: dict[tuple, Callable] = {}

    def run(*args: object) -> object:
        key = _call_key(args)
        fn = programs.get(key)
        if fn is None:
            if len(programs) >= MAX_SPECIALISATIONS:
                if ("",) not in programs:
                    log.warning("ollie backend: more than %d input shapes for one graph; new "
                                "shapes run the graph unchanged", MAX_SPECIALISATIONS)
                    programs[("",)] = gm.forward
                fn = gm.forward
            else:
                fn = programs[key] = _concrete(gm, args)
        return fn(*args)

    return run


def ollie_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Callable:
    """The ``"ollie"`` torch.compile backend (see the module docstring)."""
    if _symbolic(example_inputs):
        why = _refusal(gm, example_inputs)
        if why is not None and "gradients" not in why:
            log.warning("ollie backend: running the graph unchanged: %s", why)
            return gm.forward
        return _specialising(gm)
    return _concrete(gm, example_inputs)


def register() -> None:
    """Register the backend under the name ``"ollie"`` (idempotent)."""
    try:
        from torch._dynamo import list_backends, register_backend
    except ImportError:  # pragma: no cover - torch without dynamo
        return
    if "ollie" not in list_backends(exclude_tags=()):
        register_backend(name="ollie")(ollie_backend)
