"""Fuzzing ``ollie.optimize`` on generated models (issue: safe to run).

Small models of the supported operators (:mod:`fuzz_models`) are optimised as torch modules and
compared with eager PyTorch, and exported to ONNX and compared with ONNX Runtime. A case
passes when Ollie returns a program whose output is within :data:`RTOL` of the reference on a
new input, and has NaN and infinities exactly where the reference has them on an input holding
some (:func:`with_nonfinite`, :func:`check`),
or refuses the model with an :class:`ollie.OllieError`; any other exception (a crash) or a
wrong output fails. So does an optimised program that Ollie's own end-to-end check
caught disagreeing with the model: the fallback saved the user, but a rewrite was wrong.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from fuzz_models import Case, cases
from fuzz_util import fuzz_settings
from hypothesis import given, reject
from hypothesis import strategies as st

import ollie

RTOL = 1e-3
"""Largest relative error (max abs difference over max magnitude) of an optimised output."""

OPTIMIZE = dict(device="cpu", time_budget=0.5, max_depth=1, max_candidates=2, use_cache=False,
                context=False, settle=0.0)
"""Small settings: every step of the optimizer runs (search, selection, post-processing, the
end-to-end check, the library choice), each briefly."""


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def optimized(model: object, example_inputs: tuple[torch.Tensor, ...]
              ) -> ollie.OptimizedModel | None:
    """``ollie.optimize(model, example_inputs)``, or None when Ollie refused the model with an
    OllieError that says why. A crash wrapped as an OllieError (an ``InternalError``, a
    subprogram "kept as is" because its search failed) fails, like an optimised program the
    end-to-end check caught disagreeing with the model."""
    try:
        prog = ollie.optimize(model, example_inputs, **OPTIMIZE)
    except ollie.OllieError as exc:
        assert type(exc).__name__ != "InternalError", f"crash inside optimize: {exc!r}"
        assert str(exc), "an OllieError must say why"
        return None
    hidden = [n for n in prog.notes
              if any(w in n for w in ("disagrees", "failed to run", "search failed",
                                      "step skipped"))]
    assert not hidden, f"a failure hidden by a fallback: {hidden}"
    return prog


def check(prog: ollie.OptimizedModel, xs: tuple[torch.Tensor, ...], want: torch.Tensor) -> None:
    """``prog(*xs)`` is ``want``: NaN exactly where the reference has NaN, its infinities
    exactly, and the values finite in both within :data:`RTOL` of the largest finite
    magnitude (a read out of bounds annihilates the products it is a factor of, as padding
    does in the model's operators: structural zeros, ``ollie.semantics.interpreter``)."""
    got = prog(*xs)
    assert isinstance(got, torch.Tensor), type(got)
    assert got.shape == want.shape, f"wrong output: shape {list(got.shape)}"
    nan = torch.isnan(got)
    assert not (torch.isnan(want) & ~nan).any(), "wrong output: NaN lost"
    assert not extra_nan(got, want), "wrong output: NaN where the reference has none"
    inf = torch.isinf(want)
    assert torch.equal(got[inf], want[inf]), "wrong output: infinities lost"
    assert not (torch.isinf(got) & ~torch.isinf(want)).any(), "wrong output: infinities added"
    fin = torch.isfinite(want) & torch.isfinite(got)
    err = rel_err(got[fin], want[fin]) if fin.any() else 0.0
    assert err < RTOL, f"wrong output: relative error {err:.3e}"


def extra_nan(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether ``got`` has NaN where ``want`` has none."""
    return bool((torch.isnan(got) & ~torch.isnan(want)).any())


def with_nonfinite(xs: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, ...]:
    """``xs`` with one element of the first input NaN and another +-infinity."""
    x = xs[0].clone()
    flat = x.view(-1)
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, flat.numel(), (2,), generator=gen)
    flat[picks[0]] = float("nan")
    flat[picks[1]] = float("inf") if seed % 2 else -float("inf")
    return (x, *xs[1:])


@fuzz_settings(14)
@given(case=cases())
def test_torch_module_matches_eager(case: Case) -> None:
    with torch.no_grad():
        assert tuple(case.model(*case.inputs()).shape) == case.out_shape
    prog = optimized(case.model, case.example_inputs())
    if prog is None:
        return
    for xs in (case.inputs(seed_offset=1), with_nonfinite(case.inputs(2), case.seed)):
        with torch.no_grad():
            want = case.model(*xs)
        check(prog, xs, want)


def to_onnx(case: Case, names: list[str] | None, fold: bool) -> onnx.ModelProto:
    """The model exported by PyTorch's TorchScript exporter (``names``: its inputs' names;
    None: the exporter's, such as ``input.1``); a model it cannot export is rejected."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(case.model, case.inputs(), buf, dynamo=False, opset_version=17,
                              input_names=names, do_constant_folding=fold)
        except Exception:  # a model PyTorch's exporter cannot export: not Ollie's case
            reject()
    return onnx.load_from_string(buf.getvalue())


@fuzz_settings(14)
@given(case=cases(), named=st.booleans(), fold=st.booleans())
def test_onnx_export_matches_onnxruntime(case: Case, named: bool, fold: bool) -> None:
    names = [f"x{k}" for k in range(case.n_inputs)] if named else None
    proto = to_onnx(case, names, fold)
    feeds = [case.inputs(seed_offset=1), with_nonfinite(case.inputs(2), case.seed)]
    try:
        sess = ort.InferenceSession(proto.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        wants = [torch.from_numpy(np.asarray(sess.run(None, {
            i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs, strict=True)})[0]))
            for xs in feeds]
    except Exception:
        # no reference: ONNX Runtime cannot run it (a ConvTranspose whose output padding is
        # not below its stride, which PyTorch allows when the dilation is larger)
        reject()
    prog = optimized(proto, case.example_inputs())
    if prog is not None:
        for xs, want in zip(feeds, wants, strict=True):
            check(prog, xs, want)
