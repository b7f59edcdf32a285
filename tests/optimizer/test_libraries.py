"""Program-level choice of the convolution library: the uniform variant is exact and only kept
when it matches the reference, the choice survives save / load and is reused from the cost
cache (the preferred implementation it relies on: tests/libs/test_onednn.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.exec.executor import CompiledProgram
from ollie.graph import run_graph
from ollie.libs import onednn
from ollie.optimizer.final import libraries as _libraries
from ollie.optimizer.libraries import (
    CHOICES,
    PER_OPERATOR,
    UNIFORM,
    LibraryDecision,
    alternative_of,
    choose_libraries,
    is_library_conv,
    with_library,
)
from ollie.optimizer.model import OptimizeConfig, OptimizedModel, to_graph
from ollie.program.program import Program
from ollie.testing.programs import original_program
from ollie.tune.cache import CostCache

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="torch built without oneDNN")


def _original_program() -> tuple[nn.Module, torch.Tensor, Program, dict, dict]:
    """A model with two convolutions, its program of original operators (what Ollie keeps when
    no rewrite wins), feeds and the reference outputs."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
                      nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1), nn.Tanh()).eval()
    x = torch.randn(1, 4, 12, 12)
    prog, feeds, want = original_program(m, x)
    return m, x, prog, feeds, want


@needs_onednn
def test_uniform_library_variant_is_exact_and_kept_through_save_and_load(tmp_path):
    m, x, prog, _, _ = _original_program()
    convs = [k for k in prog.kernels if is_library_conv(k)]
    assert len(convs) == 2
    with torch.inference_mode():
        want = m(x)
    uniform = with_library(prog, UNIFORM[0])
    assert all(k.params["library"] == UNIFORM[0] for k in uniform.kernels
               if is_library_conv(k))
    assert all("library" not in k.params for k in uniform.kernels if not is_library_conv(k))
    torch.testing.assert_close(CompiledProgram(uniform)(x), want, rtol=1e-3, atol=1e-4)
    OptimizedModel(uniform, input_names=tuple(n for n, _ in uniform.inputs)).save(tmp_path)
    loaded = ollie.load(tmp_path)
    assert [k.params.get("library") for k in loaded.program.kernels] == \
        [k.params.get("library") for k in uniform.kernels]
    torch.testing.assert_close(loaded(x), want, rtol=1e-3, atol=1e-4)


@needs_onednn
def test_a_variant_that_disagrees_with_the_reference_is_not_kept():
    _, _, prog, feeds, want = _original_program()
    kept, decision, note = choose_libraries(prog, feeds, want, 1e-3, settle=0.0)
    assert decision is not None and decision.alternative is None and \
        decision.choice in (PER_OPERATOR, *CHOICES)
    assert note is not None and note.startswith("convolution libraries:") and "ms" in note
    wrong = {n: t + 1.0 for n, t in want.items()}  # no variant can match this
    kept, decision, note = choose_libraries(prog, feeds, wrong, 1e-3)
    assert kept is prog and decision is None and note is None
    # a decision made before is applied without timing, a uniform one still checked
    kept, decision, note = choose_libraries(prog, feeds, want, 1e-3, decided=UNIFORM[0])
    assert decision == LibraryDecision(UNIFORM[0]) and note.endswith("(cached)")
    assert all(k.params["library"] == UNIFORM[0] for k in kept.kernels if is_library_conv(k))
    kept, decision, note = choose_libraries(prog, feeds, wrong, 1e-3, decided=UNIFORM[0])
    assert kept is prog and decision is None


@needs_onednn
def test_a_variant_that_fails_to_run_is_skipped(monkeypatch):
    _, _, prog, feeds, want = _original_program()
    real_run = CompiledProgram.run

    def failing(self, inputs):
        if any(k.params.get("library") or "region" in k.params for k in self.program.kernels):
            raise RuntimeError("no such primitive")
        return real_run(self, inputs)

    monkeypatch.setattr(CompiledProgram, "run", failing)
    kept, decision, note = choose_libraries(prog, feeds, want, 1e-3)
    assert kept is prog and decision is None and note is None


@needs_onednn
def test_the_decision_is_stored_in_and_reused_from_the_cost_cache(tmp_path):
    _, _, prog, feeds, want = _original_program()
    cache = CostCache(tmp_path / "costs.sqlite")
    cfg = OptimizeConfig(settle=0.0)
    notes1: list[str] = []
    first, decision = _libraries(prog, feeds, want, cfg, notes1, cache)
    assert decision is not None and alternative_of(decision) is None
    notes2: list[str] = []
    second, _ = _libraries(prog, feeds, want, cfg, notes2, cache)
    assert "ms" in notes1[-1] and notes2[-1].endswith("(cached)")
    assert [k.params.get("library") for k in first.kernels] == \
        [k.params.get("library") for k in second.kernels]
    off: list[str] = []
    assert _libraries(prog, feeds, want, OptimizeConfig(choose_libraries=False), off,
                      cache) == (prog, None) and not off


@needs_onednn
def test_the_settle_setting_reaches_the_comparison(ollie_settings):
    """``OptimizeConfig.settle``: the cores idle that long before the samples around a variant
    whose ONNX Runtime session spins; 0 never pauses."""
    _, _, prog, feeds, want = _original_program()
    slept: list[float] = []
    ollie_settings(sleep=slept.append)
    _libraries(prog, feeds, want, OptimizeConfig(settle=0.0), [], None)
    assert slept == []
    _, decision = _libraries(prog, feeds, want, OptimizeConfig(settle=0.125), [], None)
    assert decision is not None and slept and set(slept) == {0.125}


def test_programs_with_fewer_than_two_convolutions_are_left_alone():
    """(The program is the model's own operators, derivation off: a rewrite chosen by timing
    could differ with the machine's load.)"""
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(1, 2, 6, 6)
    graph = to_graph(m, (x,))
    prog = ollie.optimize(m, (x,), "cpu", time_budget=2.0, max_depth=0, use_cache=False,
                          choose_libraries=False, derivation=False).program
    assert all("library" not in k.params for k in prog.kernels)
    feeds = {graph.inputs[0][0]: x}
    kept, decision, note = choose_libraries(prog, feeds, run_graph(graph, feeds), 1e-3)
    assert kept is prog and decision is None and note is None


@needs_onednn
def test_the_original_operators_are_an_alternative_timed_and_checked():
    """A program that computes the model differently (here: its convolutions swapped for
    plain-torch ones) against the original operators: both with their variants, each
    checked; a decided alternative is applied and still checked."""
    _, _, prog, feeds, want = _original_program()
    other = with_library(prog, "torch")
    kept, decision, note = choose_libraries(other, feeds, want, 1e-3,
                                            alternatives={"original operators": prog},
                                            settle=0.0)
    assert decision is not None and "original operators: per operator" in note
    assert alternative_of(decision) in (None, "original operators")
    kept, decision, note = choose_libraries(
        other, feeds, want, 1e-3, decided=LibraryDecision(PER_OPERATOR, "original operators"),
        alternatives={"original operators": prog})
    assert kept is prog and note.endswith("(cached)")
    assert alternative_of(decision) == "original operators"
    # an alternative that disagrees with the reference is never kept
    wrong_prog = Program(prog.inputs, prog.outputs, prog.kernels,
                         {n: v * 2 for n, v in prog.constants.items()})
    for _ in range(2):
        kept, decision, _ = choose_libraries(other, feeds, want, 1e-3,
                                             alternatives={"original operators": wrong_prog})
        assert alternative_of(decision) is None


@needs_onednn
def test_a_program_within_the_margin_of_the_alternative_is_not_kept(monkeypatch):
    """The alternative (the original operators) is kept unless the program is measurably
    faster: by more than ALTERNATIVE_MARGIN of its time."""
    import importlib

    from ollie.optimizer import libraries

    measure = importlib.import_module("ollie.tune.measure")  # the package exports a function

    _, _, prog, feeds, want = _original_program()
    other = with_library(prog, "torch")
    for gain, expect in ((0.5 * libraries.ALTERNATIVE_MARGIN, "original operators"),
                         (2 * libraries.ALTERNATIVE_MARGIN, None)):
        def fake(fns, *args, gain=gain, **kwargs):
            return {n: 1.0 if n.startswith("original operators") else 1.0 - gain
                    for n in fns}

        monkeypatch.setattr(measure, "measure_alternating", fake)
        _, decision, _ = choose_libraries(other, feeds, want, 1e-3,
                                          alternatives={"original operators": prog})
        assert alternative_of(decision) == expect


def _originals(graph, cfg) -> Program:
    """The program ``optimize`` builds for ``graph`` when no subprogram is rewritten."""
    from ollie.optimizer.model import _Optimizer

    opt = _Optimizer(graph, cfg, None)
    opt.compute_node = opt.node_kernel
    return opt.run()


def test_optimize_offers_and_reports_the_original_operators(monkeypatch):
    """With a rewritten subprogram, the original operators (post-processed) are offered as
    an alternative program; when they win, ``optimize`` keeps them and its report says so."""
    from ollie.optimizer import final
    from ollie.optimizer import model as model_mod
    from ollie.passes.postprocess import postprocess

    torch.manual_seed(2)
    m = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.ReLU(),
                      nn.Conv2d(4, 4, 3, padding=1)).eval()
    x = torch.randn(1, 8, 6, 6)
    with torch.inference_mode():
        want = m(x)
    graph = to_graph(m, (x,))
    cfg = OptimizeConfig(use_cache=False, settle=0.0)
    originals = _originals(graph, cfg)
    seen = {}

    def originals_win(prog, feeds, want, rtol, decided=None, alternatives=None, settle=0.0,
                      build=None):
        seen.update(alternatives or {})
        return alternatives["original operators"], \
            LibraryDecision(PER_OPERATOR, "original operators"), \
            "convolution libraries: original operators, chosen per operator (test)"

    monkeypatch.setattr(final, "choose_libraries", originals_win)
    notes: list[str] = []
    kept, decision, which = final.checked(graph, originals, originals, cfg, notes, None,
                                          postprocess(originals))
    assert alternative_of(decision) == "original operators" and which == "optimised"
    assert kept is seen["original operators"]
    assert [k.kind for k in kept.kernels] == ["Node", "Node"]  # ReLU folded
    assert len(kept.kernels) < len(originals.kernels)
    assert kept.kernels == postprocess(originals).kernels
    torch.testing.assert_close(CompiledProgram(kept)(x), want, rtol=1e-4, atol=1e-4)
    # without a rewrite there is no alternative
    seen.clear()
    monkeypatch.setattr(final, "choose_libraries", lambda prog, *a, **k: (prog, None, None))
    assert final.checked(graph, originals, originals, cfg, [], None, None)[1] is None

    # the report of a program that kept the original operators
    def checked(graph, prog, raw, cfg, notes, cache=None, originals=None, ref=None,
                timed=True):
        return (originals if originals is not None else postprocess(raw),
                LibraryDecision(PER_OPERATOR, "original operators"), "optimised")

    monkeypatch.setattr(model_mod, "checked", checked)
    opt = ollie.optimize(m, (x,), "cpu", time_budget=5.0, use_cache=False, context=False,
                         settle=0.0)
    assert opt.report and all(r.chosen == "original operator" and not r.derivation and
                              r.optimized_ms == r.original_ms for r in opt.report)
    assert any("kept the original operators" in n for n in opt.notes)
    with torch.inference_mode():
        torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-4)


def test_report_of_kept_originals_records_the_rewrites_not_kept():
    from ollie.optimizer.model import OptimizedModel, SubprogramReport, kept_originals

    rows = [SubprogramReport("a", "ConvTranspose2d", "ConvTranspose2d", "Conv -> eOp[1, 4]",
                             ["rule one", "rule two"], 0.5, 0.3, candidates=3),
            SubprogramReport("b", "Conv2d", "Conv2d", "original operator", [], 0.2, 0.2)]
    kept = kept_originals(rows)
    assert [r.chosen for r in kept] == ["original operator"] * 2
    assert [r.optimized_ms for r in kept] == [0.5, 0.2] and not any(r.derivation for r in kept)
    assert kept[0].not_kept == {"program": "Conv -> eOp[1, 4]", "ms": 0.3,
                                "derivation": ["rule one", "rule two"]}
    assert kept[1].not_kept is None
    assert rows[0].chosen == "Conv -> eOp[1, 4]"  # the input report is left as it was
    text = OptimizedModel.summary(type("M", (), {"report": kept, "notes": []})())
    assert "derived Conv -> eOp[1, 4], 0.300ms alone: not kept" in text
    assert text.count("not kept") == 1
    # saved and loaded with the report
    assert SubprogramReport(**kept[0].to_json()) == kept[0]


@needs_onednn
def test_the_winograd_variant_applies_to_three_by_three_and_gan_layers_only(monkeypatch):
    from ollie.exec import conv
    from ollie.optimizer.libraries import ONEDNN_WINOGRAD, WINOGRAD_ALL, variant, winograd_applies

    m, x, prog, _, _ = _original_program()   # a 3x3 Conv2d and a 4x4 stride-2 ConvTranspose2d
    convs = [k for k in prog.kernels if is_library_conv(k)]
    # too small for Winograd to pay back its transforms: best_conv would not offer it
    assert not any(winograd_applies(k, prog) for k in convs)
    assert variant(prog, ONEDNN_WINOGRAD) is None
    monkeypatch.setattr(conv, "WINOGRAD_MIN_FLOPS", 0)
    assert [winograd_applies(k, prog) for k in convs] == [True, True]
    v = variant(prog, ONEDNN_WINOGRAD)
    assert v is not None and all(k.params["library"] == ONEDNN_WINOGRAD
                                 for k in v.kernels if is_library_conv(k))
    with torch.inference_mode():
        want = m(x)
    torch.testing.assert_close(CompiledProgram(v)(x), want, rtol=1e-3, atol=1e-4)
    # 1x1 and strided convolutions have no Winograd form: the variant is not offered
    torch.manual_seed(6)
    plain = nn.Sequential(nn.Conv2d(4, 8, 1), nn.ReLU(), nn.Conv2d(8, 3, 3, stride=2)).eval()
    prog2, _, _ = original_program(plain, x)
    assert not any(winograd_applies(k, prog2) for k in prog2.kernels if is_library_conv(k))
    assert variant(prog2, ONEDNN_WINOGRAD) is None
    assert variant(prog2, WINOGRAD_ALL) is None


@needs_onednn
def test_winograd_wherever_it_applies_puts_the_others_on_onednn(monkeypatch):
    from ollie.exec import conv
    from ollie.exec.conv import WINOGRAD
    from ollie.optimizer.libraries import WINOGRAD_ALL, variant, winograd_applies

    monkeypatch.setattr(conv, "WINOGRAD_MIN_FLOPS", 0)
    torch.manual_seed(7)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 1), nn.ReLU(),
                      nn.ConvTranspose2d(6, 3, 4, 2, 1)).eval()
    x = torch.randn(2, 4, 9, 9)
    prog, _, _ = original_program(m, x)
    v = variant(prog, WINOGRAD_ALL)
    assert v is not None
    libs = [(winograd_applies(k, prog), k.params["library"]) for k in v.kernels
            if is_library_conv(k)]
    assert libs == [(True, WINOGRAD), (False, "oneDNN packed"), (True, WINOGRAD)]
    with torch.inference_mode():
        want = m(x)
    torch.testing.assert_close(CompiledProgram(v)(x), want, rtol=1e-3, atol=1e-4)
