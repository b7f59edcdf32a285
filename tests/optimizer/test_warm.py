"""A warm optimisation (the cache of an earlier one, in a new process): no choice among
implementations measured again (:func:`ollie.tune.cache.choice_store`), one compiled program
for the check and the result (:meth:`ollie.optimizer.final.Reference.compiled`), and a library
choice read from the cache checked on random inputs before it is used
(:func:`ollie.optimizer.final.agrees`)."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

import ollie
from ollie.exec.executor import CompiledProgram
from ollie.libs import onednn
from ollie.optimizer import recall
from ollie.optimizer.final import Reference, agrees
from ollie.optimizer.report import OptimizedModel
from ollie.settings import using
from ollie.tune import choice
from ollie.tune.cache import CostCache

# two guided steps per scope: the searches end when done, well before their budget
FAST = dict(max_depth=1, guided_depth=2, max_candidates=1, settle=0.0, context=False,
            time_budget=5.0, total_budget=None)


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                      nn.ReLU()).eval()
    return m, torch.randn(1, 8, 12, 12)


@pytest.mark.skipif(not onednn.available(), reason="torch built without oneDNN")
def test_a_warm_optimisation_measures_no_choice_made_by_an_earlier_process(
        ollie_settings, tmp_path, monkeypatch):
    m, x = _model()
    probes: list[tuple[str, ...]] = []
    real = choice.probe

    def counting(impls, args, rounds=choice.PROBE_ROUNDS):
        probes.append(tuple(impls))
        return real(impls, args, rounds)

    monkeypatch.setattr(choice, "probe", counting)
    # a quiet machine whatever else runs: a choice measured under load is not stored
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    cold = ollie.optimize(m, (x,), **FAST)
    assert probes, "the cold optimisation measured its convolutions' implementations"
    stored = CostCache(tmp_path / "costs.sqlite").db.execute(
        "SELECT count(*) FROM decisions WHERE key LIKE 'choice|%'").fetchone()[0]
    assert stored >= 1
    probes.clear()
    shutil.rmtree(tmp_path / recall.FOLDER)  # the program is made again, from the decisions
    with using(choices={}):  # what a new process has: an empty table
        warm = ollie.optimize(m, (x,), **FAST)
    assert probes == []
    with torch.no_grad():
        torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(warm(x), cold(x), rtol=1e-5, atol=1e-6)


def test_the_check_and_the_result_share_one_compiled_program(ollie_settings, tmp_path):
    ollie_settings(cache_dir=tmp_path)
    m, x = _model()
    built: list[object] = []  # the programs themselves: an id of a freed one may be reused
    real_init = CompiledProgram.__init__

    def init(self, program, *args, **kwargs):
        built.append(program)
        real_init(self, program, *args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(CompiledProgram, "__init__", init)
    try:
        # the original operators, whatever is measured: a rewrite kept would offer them as an
        # alternative, and comparing the two compiles the program once more
        prog = ollie.optimize(m, (x,), **{**FAST, "choose_libraries": False,
                                          "derivation": False})
    finally:
        mp.undo()
    # the returned program was compiled once, for the check, and not again
    assert sum(p is prog.program for p in built) == 1
    assert prog._compiled.program is prog.program
    # a compiled program of another program is not taken
    other = OptimizedModel(prog.program, compiled=CompiledProgram(
        ollie.optimize(m, (x,), **{**FAST, "choose_libraries": False}).program))
    assert other._compiled.program is other.program


def test_a_program_that_disagrees_on_random_inputs_is_not_agreed(ollie_settings, tmp_path):
    ollie_settings(cache_dir=tmp_path)
    m, x = _model()
    prog = ollie.optimize(m, (x,), **{**FAST, "choose_libraries": False})
    feeds = {prog.program.inputs[0][0]: torch.randn(1, 8, 12, 12)}
    with torch.no_grad():
        want = {prog.program.outputs[0]: m(feeds[prog.program.inputs[0][0]])}
    cfg = ollie.OptimizeConfig()
    notes: list[str] = []
    assert agrees(prog.program, Reference(feeds, want, 1e-4), cfg, "test", notes)
    assert notes == []
    wrong = {k: v + 1.0 for k, v in want.items()}
    assert not agrees(prog.program, Reference(feeds, wrong, 1e-4), cfg, "test", notes)
    assert len(notes) == 1 and "disagrees with the model on random inputs" in notes[0]


def test_the_library_comparison_times_the_program_the_check_compiled(ollie_settings, tmp_path,
                                                                     monkeypatch):
    """The checked program's per-operator variant is the program itself: the comparison of
    its library variants times the compiled program the check built, not a second one."""
    from ollie.optimizer import final

    ollie_settings(cache_dir=tmp_path)
    m, x = _model()
    compared: list[object] = []
    real_choose = final.choose_libraries

    def choose(prog, *args, **kwargs):
        compared.append(prog)
        return real_choose(prog, *args, **kwargs)

    built: list[object] = []
    real_init = CompiledProgram.__init__

    def init(self, program, *args, **kwargs):
        built.append(program)
        real_init(self, program, *args, **kwargs)

    monkeypatch.setattr(final, "choose_libraries", choose)
    monkeypatch.setattr(CompiledProgram, "__init__", init)
    opt = ollie.optimize(m, (x,), **{**FAST, "derivation": False})  # two convolutions
    monkeypatch.undo()
    (prog,) = compared
    assert sum(p is prog for p in built) == 1
    assert any(n.startswith("convolution libraries: ") for n in opt.notes), opt.notes
    with torch.no_grad():
        torch.testing.assert_close(opt(x), m(x), rtol=1e-4, atol=1e-5)
