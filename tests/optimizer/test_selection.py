"""Confident selection in the optimiser (ollie.optimizer.select, ollie.optimizer.baseline): a
candidate must beat the original both as Ollie and as PyTorch run it; a kept original that
PyTorch runs faster runs PyTorch's implementation; a choice made on a busy machine is cached
only when measured again alike. Every time is read from a fake clock."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import ollie
from ollie.exec.conv import TORCH
from ollie.optimizer import model as model_mod
from ollie.optimizer.final import ORIGINAL
from ollie.optimizer.select import Measured, Selection, recheck
from ollie.program.params import KernelKind
from ollie.testing.clock import FakeClock

UNIT = 2.0 ** -10


def _m(label: str, t: float, n: int = 9, program: object = None) -> Measured:
    return Measured(label, t, program=program, candidate=program, samples=[t] * n)


def test_a_candidate_must_beat_the_original_as_pytorch_runs_it_too():
    prog = object()
    base, eager = _m("original", 1.0), _m("eager", 0.6)
    sel = Selection(base, [_m("Conv -> eOp", 0.8, program=prog)], margin=0.03, eager=eager)
    assert sel.original is eager and sel.best is eager  # 20% faster than Ollie's: not enough
    sel = Selection(base, [_m("Conv -> eOp", 0.5, program=prog)], margin=0.03, eager=eager)
    assert sel.best.label == "Conv -> eOp"
    assert sel.original is eager  # what runs if the rewrite is switched off later
    # eager within the margin of Ollie's original: Ollie's is kept
    sel = Selection(base, [], margin=0.03, eager=_m("eager", 0.99))
    assert sel.original is base and sel.best is base


def test_an_unconfirmed_selection_keeps_the_framework_original():
    prog = object()
    sel = Selection(_m("original", 1.0), [_m("Conv -> eOp", 0.5, program=prog)], margin=0.03,
                    eager=_m("eager", 1.0))
    assert sel.best.label == "Conv -> eOp"
    sel.unconfirmed = True
    assert sel.best is sel.eager and sel.alternatives() == []


@pytest.mark.parametrize("flip, agrees", [(False, True), (True, False)])
def test_recheck_confirms_or_marks_unconfirmed(ollie_settings, flip, agrees):
    """The choice is measured again after a settle (the settings' sleep); when the second
    measurement picks another, the selection is unconfirmed."""
    clock = FakeClock()
    costs = {"base": UNIT, "eager": UNIT, "cand": UNIT / 2}

    def settle(seconds: float) -> None:
        if flip:
            costs["cand"] = 2 * UNIT

    ollie_settings(measure_clock=clock, sleep=settle)
    fns = {k: (lambda k=k: clock.advance(costs[k])) for k in costs}
    prog = object()
    by_key = {"base": _m("original", UNIT), "eager": _m("eager", UNIT),
              "cand": _m("Conv -> eOp", UNIT / 2, program=prog)}
    sel = Selection(by_key["base"], [by_key["cand"]], margin=0.03, eager=by_key["eager"])
    assert sel.best is by_key["cand"]
    assert recheck(sel, fns, by_key) is agrees
    assert sel.unconfirmed is not agrees
    assert (sel.best is by_key["cand"]) is agrees


def _conv_model():
    torch.manual_seed(2)
    # a GCN-style 1x7 convolution
    return nn.Sequential(nn.Conv2d(4, 6, (1, 7), padding=(0, 3))).eval(), \
        torch.randn(1, 4, 8, 8)


FAST = dict(max_depth=0, guided_depth=0, max_candidates=0, time_budget=1.0, choose_libraries=False,
            context=False, settle=0.0)


def _scripted_originals(monkeypatch, clock: FakeClock, costs: dict[str, float]) -> list[int]:
    """Ollie's original and the eager original each take ``costs[name]`` on ``clock`` (both
    computed by PyTorch: Ollie's own, patched slow or fast, never chooses a library while
    timed); returns a list that counts the selections run."""
    real_eager, real_select = model_mod.eager_runner, model_mod.select
    selections: list[int] = []

    def runner(name):
        def make(*args):
            fn = real_eager(*args)

            def run():
                clock.advance(costs[name])  # read at each call: a test may change it
                return fn()
            return run
        return make

    def counting_select(*args, **kwargs):
        selections.append(1)
        return real_select(*args, **kwargs)

    monkeypatch.setattr(model_mod, "original_runner", runner("original"))
    monkeypatch.setattr(model_mod, "eager_runner", runner("eager"))
    monkeypatch.setattr(model_mod, "select", counting_select)
    return selections


def test_where_eager_beats_the_node_kernel_the_kept_original_runs_torch(
        monkeypatch, ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(cache_dir=tmp_path, measure_clock=clock, load=lambda: 0.0,
                   sleep=lambda s: None)
    _scripted_originals(monkeypatch, clock, {"original": 2 * UNIT, "eager": UNIT})
    m, x = _conv_model()
    opt = ollie.optimize(m, (x,), "cpu", **FAST)
    (r,) = opt.report
    assert r.chosen == ORIGINAL and r.eager_ms == pytest.approx(UNIT * 1e3)
    assert r.original_ms == pytest.approx(2 * UNIT * 1e3)
    (k,) = [k for k in opt.program.kernels if k.kind is KernelKind.NODE]
    assert k.params.library == TORCH
    with torch.inference_mode():
        torch.testing.assert_close(opt(x), m(x), rtol=1e-4, atol=1e-5)
    assert "(eager " in opt.summary()
    # saved and loaded, the report keeps eager_ms; a report saved before it existed loads
    opt.save(tmp_path / "saved")
    assert ollie.load(tmp_path / "saved").report[0].eager_ms == pytest.approx(UNIT * 1e3)
    path = tmp_path / "saved" / "report.json"
    doc = json.loads(path.read_text())
    del doc["report"][0]["eager_ms"]
    path.write_text(json.dumps(doc))
    assert ollie.load(tmp_path / "saved").report[0].eager_ms is None


def test_eager_slower_keeps_ollies_original(monkeypatch, ollie_settings, tmp_path):
    clock = FakeClock()
    ollie_settings(cache_dir=tmp_path, measure_clock=clock, load=lambda: 0.0,
                   sleep=lambda s: None)
    _scripted_originals(monkeypatch, clock, {"original": UNIT, "eager": 2 * UNIT})
    m, x = _conv_model()
    opt = ollie.optimize(m, (x,), "cpu", use_cache=False, **FAST)
    (k,) = [k for k in opt.program.kernels if k.kind is KernelKind.NODE]
    assert k.params.library is None and opt.report[0].eager_ms == pytest.approx(2 * UNIT * 1e3)


@pytest.mark.parametrize("flip", [False, True])
def test_a_decision_made_under_load_is_cached_only_when_measured_again_alike(
        monkeypatch, ollie_settings, tmp_path, flip):
    """A busy machine (the settings' load): the selection is measured again after a settle;
    where the second measurement disagrees (here the costs swap during the settle), the
    decision is not cached (the next optimisation selects again), the report says so and the
    framework's original is kept."""
    clock = FakeClock()
    costs = {"original": 2 * UNIT, "eager": UNIT}

    def settle(seconds: float) -> None:
        if flip:
            costs.update(original=UNIT / 2)

    ollie_settings(cache_dir=tmp_path, measure_clock=clock, load=lambda: 1e6, sleep=settle)
    selections = _scripted_originals(monkeypatch, clock, costs)
    m, x = _conv_model()
    opt = ollie.optimize(m, (x,), "cpu", **FAST)
    noted = any("measured under load; not cached" in n for n in opt.notes)
    assert noted is flip and len(selections) == 1
    (k,) = [k for k in opt.program.kernels if k.kind is KernelKind.NODE]
    assert k.params.library == TORCH  # first eager, then unconfirmed: the framework's
    costs.update(original=2 * UNIT)
    ollie.optimize(m, (x,), "cpu", **FAST)
    assert len(selections) == (2 if flip else 1)  # cached only when confirmed
