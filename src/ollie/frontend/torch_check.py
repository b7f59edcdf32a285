"""Checks of a PyTorch module before and after its import (:mod:`ollie.frontend.torch_import`):
whether it is a float32 model Ollie can optimise (:func:`float32_problem`), and whether the
imported graph computes what the module computes (:func:`check_import`), telling a
conversion bug from a module too ill-conditioned in float32 to check anything against."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from ollie.errors import OllieError, ShapeError, UnsupportedError
from ollie.graph.ir import Graph


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def float32_problem(module: torch.nn.Module, example_inputs: Sequence[Any]) -> str | None:
    """Why Ollie cannot optimise ``module`` with ``example_inputs`` as a float32 model, and
    what to do (an example input that is a tensor of another dtype, a floating-point or
    complex parameter or buffer of another dtype), or None."""
    what = "Ollie optimizes float32 models (its programs compute in float32)"
    for k, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.dtype != torch.float32:
            if not x.is_floating_point():
                return (f"{what}; example input {k} is a {x.dtype} tensor, and the inputs of "
                        "an optimized program are float32 tensors only (token ids: "
                        "torch.compile(model, backend='ollie') runs their embedding lookups in "
                        "PyTorch and optimises the rest, or pass the embeddings)")
            return (f"{what}; example input {k} is {x.dtype}: pass float32 inputs "
                    "(x.float()) and call model.float()")
    for kind, named in (("parameter", module.named_parameters()),
                        ("buffer", module.named_buffers())):
        for name, t in named:
            if (t.is_floating_point() or t.is_complex()) and t.dtype != torch.float32:
                return (f"{what}; {kind} '{name}' is {t.dtype}: call model.float() and pass "
                        "float32 inputs")
    return None


IMPORT_RTOL = 1e-3
"""Largest relative error (largest absolute difference over the largest magnitude) of an
imported graph's outputs against the module's, in :func:`check_import`."""


def check_import(graph: Graph, module: torch.nn.Module, example_inputs: Sequence[Any],
                 seed: int = 0) -> None:
    """Raise :class:`~ollie.errors.OllieError` unless ``graph`` computes what ``module``
    computes: both run on new random inputs shaped like ``example_inputs`` (standard normal,
    one tensor per input, on their device, in full float32). Catches a graph that differs
    from the module it was imported from (a conversion bug, or a module whose output is not a
    function of its inputs: random sampling in eval mode) before anything is optimised; the
    error names the module's own float32 error instead when the disagreement is within
    :data:`ILL_CONDITIONED` times it (a module too ill-conditioned to check a rewrite against).
    Skipped for a module in training mode (its dropout and batch statistics are not what Ollie
    optimises) or one whose inputs are not all floating-point tensors."""
    from torch.utils._pytree import tree_leaves

    from ollie.exec.precision import full_fp32
    from ollie.graph.execute import run_graph

    if module.training or not all(isinstance(x, torch.Tensor) and x.is_floating_point()
                                  for x in example_inputs):
        return
    gen = torch.Generator().manual_seed(seed)
    feeds = [torch.randn(tuple(x.shape), generator=gen, dtype=x.dtype).to(x.device)
             for x in example_inputs]
    with torch.no_grad(), full_fp32():
        try:
            want = [t for t in tree_leaves(module(*feeds)) if isinstance(t, torch.Tensor)]
        except Exception as e:
            raise UnsupportedError(f"from_torch({graph.name}): the module fails on new inputs "
                                   f"of the example inputs' shapes ({_line(e)})") from e
        got = run_graph(graph, feeds)
    if len(want) != len(graph.outputs):
        raise ShapeError(f"from_torch({graph.name}): the module returns {len(want)} tensor(s), "
                         f"the imported graph {len(graph.outputs)} (conversion bug)")
    for k, (name, w) in enumerate(zip(graph.outputs, want, strict=True)):
        g = got[name]
        if tuple(g.shape) != tuple(w.shape):
            raise ShapeError(f"from_torch({graph.name}): output {k} has shape "
                             f"{list(w.shape)}, the imported graph's {list(g.shape)} "
                             "(conversion bug)")
        w64, g64 = w.detach().double(), g.double()
        same_nan = torch.equal(torch.isnan(w64), torch.isnan(g64))
        err = _relative_error(w64, g64)
        if not same_nan or err > IMPORT_RTOL:
            own = _float32_error(module, feeds, k, w64)
            why = ("a conversion bug, or a module whose output is not a function of its "
                   "inputs") if own is None or own * ILL_CONDITIONED < err else (
                f"the module's own float32 output differs from its float64 output by "
                f"{own:.2e} on these inputs: too ill-conditioned in float32 for a rewrite to "
                "be checked against it (random weights, or BatchNorm statistics that do not "
                "fit its inputs?)")
            raise OllieError(f"from_torch({graph.name}): the imported graph disagrees with the "
                             f"module on output {k} (relative error {err:.2e}"
                             f"{'' if same_nan else ', NaN elsewhere'}): {why}; Ollie does "
                             "not optimise it")


ILL_CONDITIONED = 10.0
""":func:`check_import` blames the module's float32 numerics, not the conversion, when the
imported graph's error is at most this many times the module's own float32 error (its output
against a float64 copy of it on the same inputs)."""


def _float32_error(module: torch.nn.Module, feeds: Sequence[torch.Tensor], k: int,
                   want: torch.Tensor) -> float | None:
    """The relative error of ``module``'s float32 output ``k`` (``want``, float64 values)
    against a float64 copy of the module on ``feeds``; None when the copy cannot be made or
    run (it is only a diagnosis)."""
    from torch.utils._pytree import tree_leaves

    try:
        with torch.no_grad():
            wide = copy.deepcopy(module).double()
            outs = [t for t in tree_leaves(wide(*[x.double() for x in feeds]))
                    if isinstance(t, torch.Tensor)]
        return _relative_error(outs[k].double(), want)
    except Exception:  # a module that cannot be copied or run in float64
        return None


def _relative_error(want: torch.Tensor, got: torch.Tensor) -> float:
    """The largest absolute difference over the largest magnitude of ``want``, where both
    are finite (0 where none is)."""
    fin = torch.isfinite(want) & torch.isfinite(got)
    if not fin.any():
        return 0.0
    scale = float(want[fin].abs().max())
    return float((want[fin] - got[fin]).abs().max()) / max(scale, 1e-30)
