"""The whole-model result cache (:mod:`ollie.optimizer.recall`): a second optimisation of the
same model with the same settings returns the first one's program, checked again (against
the module itself), without optimising; another weight or setting is another entry; an entry
that disagrees with the model or is malformed is removed; the least recently used entries
go; a torch module's entry is found by the module's own key without importing it."""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import ollie
from ollie.frontend import torch_check
from ollie.optimizer import final, recall
from ollie.optimizer import model as optimizer_model
from ollie.optimizer import module_key as module_key_module
from ollie.optimizer.config import OptimizeConfig
from ollie.optimizer.importing import to_graph
from ollie.optimizer.libraries import REGIONS, variant
from ollie.optimizer.module_key import module_key
from ollie.program.program import Program, program_digest
from ollie.settings import current, using

# two guided steps per scope: the searches end when done, well before their budget
FAST = dict(max_depth=1, guided_depth=2, max_candidates=1, settle=0.0, context=False,
            time_budget=5.0, total_budget=None)


def _model(seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1),
                      nn.Sigmoid()).eval()
    return m, torch.randn(1, 4, 10, 10)


def _entries(root) -> list[str]:
    folder = root / recall.FOLDER
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _no_optimising(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("the model was optimised again")

    monkeypatch.setattr(optimizer_model, "_optimize_graph", fail)


def test_a_second_run_returns_the_first_runs_program_checked_without_optimising(
        ollie_settings, tmp_path, monkeypatch):
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    cold = ollie.optimize(m, (x,), **FAST)
    assert len(_entries(tmp_path)) == 1
    _no_optimising(monkeypatch)

    def no_graph_run(*args, **kwargs):
        raise AssertionError("the graph was run: the module is the warm check's reference")

    # the recalled program is checked against the module itself, not through its graph
    monkeypatch.setattr(torch_check, "check_import", no_graph_run)
    monkeypatch.setattr(final, "run_graph", no_graph_run)
    warm = ollie.optimize(m, (x,), **FAST)
    assert program_digest(warm.program) == program_digest(cold.program)
    assert [(r.node, r.chosen) for r in warm.report] == [(r.node, r.chosen) for r in cold.report]
    assert "from the cache" in warm.notes[-2] and warm.notes[-1].endswith("s (this run)")
    assert warm.notes[:-2] == [n + (" (the run that made this program)"
                                    if n.startswith("optimised in") else "")
                               for n in cold.notes]
    with torch.no_grad():
        torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)


def test_another_weight_or_setting_is_another_entry(ollie_settings, tmp_path):
    ollie_settings(cache_dir=tmp_path)
    m, x = _model()
    cfg = OptimizeConfig(**FAST)
    graph = to_graph(m, (x,))
    key = recall.model_key(graph, cfg)
    assert recall.model_key(to_graph(m, (x,)), cfg) == key  # the same model imported again
    assert recall.model_key(graph, replace(cfg, time_budget=6.0)) != key
    assert recall.model_key(graph, replace(cfg, kernel_library=False)) != key
    with torch.no_grad():
        m[2].weight[0, 0, 0, 0] += 1e-3
    assert recall.model_key(to_graph(m, (x,)), cfg) != key
    assert recall.model_key(to_graph(m, (torch.randn(2, 4, 10, 10),)), cfg) != key


def test_an_entry_that_disagrees_with_the_model_is_removed_and_the_model_optimised_again(
        ollie_settings, tmp_path, caplog):
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    cold = ollie.optimize(m, (x,), **FAST)
    (key,) = _entries(tmp_path)
    entry = tmp_path / recall.FOLDER / key
    prog = Program.load(entry)
    name = max(prog.constants, key=lambda n: np.asarray(prog.constants[n]).size)
    constants = {**prog.constants, name: np.asarray(prog.constants[name]) * 2}
    Program(prog.inputs, prog.outputs, prog.kernels, constants).save(entry)  # tampered
    with caplog.at_level(logging.WARNING):
        again = ollie.optimize(m, (x,), **FAST)
    assert "the cached program disagrees with the model" in caplog.text
    assert not any("from the cache" in n for n in again.notes)
    assert program_digest(again.program) == program_digest(cold.program)
    with torch.no_grad():
        torch.testing.assert_close(again(x), m(x), rtol=1e-4, atol=1e-5)
    # the entry was replaced by the program made again
    restored = Program.load(entry)
    assert np.array_equal(np.asarray(restored.constants[name]),
                          np.asarray(cold.program.constants[name]))


def test_a_malformed_entry_is_removed_and_a_disabled_cache_keeps_nothing(
        ollie_settings, tmp_path, caplog):
    ollie_settings(cache_dir=tmp_path)
    m, x = _model()
    key = recall.model_key(to_graph(m, (x,)), OptimizeConfig(**FAST))
    entry = tmp_path / recall.FOLDER / key
    entry.mkdir(parents=True)
    (entry / "program.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert recall.recall(key) is None
    assert "not used" in caplog.text and not entry.exists()
    ollie.optimize(m, (x,), **{**FAST, "use_cache": False})
    assert _entries(tmp_path) == []


def test_the_least_recently_used_entries_go(ollie_settings, tmp_path, monkeypatch):
    ollie_settings(cache_dir=tmp_path)
    m, x = _model()
    made = ollie.optimize(m, (x,), **{**FAST, "use_cache": False})
    monkeypatch.setattr(recall, "MAX_ENTRIES", 2)
    for i, key in enumerate(("a" * 40, "b" * 40, "c" * 40)):
        recall.store(key, made)
        os.utime(tmp_path / recall.FOLDER / key, (1000.0 + i, 1000.0 + i))
    assert _entries(tmp_path) == ["b" * 40, "c" * 40]
    assert recall.recall("b" * 40) is not None  # used now: the most recent
    recall.store("d" * 40, made)
    assert _entries(tmp_path) == ["b" * 40, "d" * 40]
    monkeypatch.setattr(recall, "MAX_BYTES", 1)  # the newest entry stays, whatever its size
    recall.store("e" * 40, made)
    assert _entries(tmp_path) == ["e" * 40]


def test_the_module_reference_is_the_modules_output_or_none():
    """``final.module_reference``: the module's own outputs on the check's random and example
    inputs, allowing the import check's error more; None (the graph is then the reference)
    for a module in training mode or one that fails on the graph's inputs."""
    m, x = _model()
    cfg = OptimizeConfig(**FAST)
    graph = to_graph(m, (x,))
    ref = final.module_reference(m, graph, cfg, (x,), import_rtol=1e-3)
    assert ref is not None and ref.rtol == cfg.check_rtol + 1e-3
    graph_ref = final.reference(graph, cfg, [], (x,))
    (out,) = graph.outputs
    torch.testing.assert_close(ref.want[out], graph_ref.want[out], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ref.example_want[out], m(x).detach())
    assert final.module_reference(m.train(), graph, cfg, (x,)) is None
    m.eval()

    class Broken(nn.Module):
        def forward(self, a):
            raise RuntimeError("not these inputs")

    assert final.module_reference(Broken(), graph, cfg, (x,)) is None


def test_a_warm_run_finds_the_program_by_the_modules_key_without_importing_it(
        ollie_settings, tmp_path, monkeypatch):
    """:func:`recall.recalled_module`: the entry records the module's key; a second run finds
    it by that key, checks it against the module and never imports the module again."""
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    cold = ollie.optimize(m, (x,), **FAST)
    (key,) = _entries(tmp_path)
    mkey = module_key(m, (x,), OptimizeConfig(**FAST))
    assert (tmp_path / recall.FOLDER / key / recall.MODULE_KEY).read_text() == mkey
    _no_optimising(monkeypatch)

    def no_import(*args, **kwargs):
        raise AssertionError("the module was imported again")

    monkeypatch.setattr(optimizer_model, "to_graph", no_import)
    warm = ollie.optimize(m, (x,), **FAST)
    assert program_digest(warm.program) == program_digest(cold.program)
    assert warm.input_names == cold.input_names
    assert "found by the module's own key" in warm.notes[-2]
    with torch.no_grad():
        torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)
        # another module of the same shapes is not found by this key: it is imported
        other, _ = _model(seed=1)
    with pytest.raises(ollie.OllieError, match="imported again"):
        ollie.optimize(other, (x,), **FAST)


def test_an_entry_found_by_an_older_graph_key_records_the_module_key(
        ollie_settings, tmp_path):
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    ollie.optimize(m, (x,), **FAST)
    (key,) = _entries(tmp_path)
    marker = tmp_path / recall.FOLDER / key / recall.MODULE_KEY
    marker.unlink()  # an entry stored before module keys were recorded
    warm = ollie.optimize(m, (x,), **FAST)
    assert "found by the module's own key" not in warm.notes[-2]
    assert marker.read_text() == module_key(m, (x,), OptimizeConfig(**FAST))


def test_the_module_key_changes_with_what_the_module_computes(monkeypatch):
    m, x = _model()
    cfg = OptimizeConfig(**FAST)
    key = module_key(m, (x,), cfg)
    assert key is not None and module_key(m, x, cfg) == key  # a lone tensor is one input
    assert module_key(_model()[0], (x,), cfg) == key  # the same module built again
    with monkeypatch.context() as patch:  # the weights digested one after another: the same
        patch.setattr(module_key_module, "ThreadPoolExecutor",  # key as on several threads
                      lambda workers, **kw: ThreadPoolExecutor(1, **kw))
        assert module_key(m, (x,), cfg) == key
    assert module_key(m, (x,), replace(cfg, time_budget=6.0)) != key
    assert module_key(m, (torch.randn(2, 4, 10, 10),), cfg) != key
    assert module_key(m, (x.double(),), cfg) != key
    swapped, _ = _model()
    swapped[3] = nn.Tanh()  # another class, no weights
    assert module_key(swapped, (x,), cfg) != key
    strided, _ = _model()
    strided[2].stride = (2, 2)  # an attribute, no weights
    assert module_key(strided, (x,), cfg) != key
    with torch.no_grad():
        m[2].weight[0, 0, 0, 0] += 1e-3
    assert module_key(m, (x,), cfg) != key
    # no key where it could name the wrong thing
    assert module_key(m.train(), (x,), cfg) is None
    m.eval()
    handle = m[1].register_forward_hook(lambda mod, a, out: out * 2)
    assert module_key(m, (x,), cfg) is None
    handle.remove()
    assert module_key(m, (x, 3.0), cfg) is None and module_key(m, None, cfg) is None


def test_the_module_key_does_not_depend_on_a_sets_iteration_order():
    # 8 and 16 share a slot of a small set's table, so the order they were added in is the
    # order they come out in; strings behave so across processes (PYTHONHASHSEED), and
    # transformers' models hold sets of strings (_no_split_modules)
    assert list({8, 16}) != list(set([16, 8]))
    cfg = OptimizeConfig(**FAST)
    keys = []
    for order in ([8, 16], [16, 8]):
        m, x = _model()
        m[2].kinds = set(order)
        keys.append(module_key(m, (x,), cfg))
    assert keys[0] == keys[1] is not None


def test_the_module_key_ignores_the_marks_torch_compile_leaves():
    cfg = OptimizeConfig(**FAST)
    m, x = _model()
    key = module_key(m, (x,), cfg)
    torch.compile(m)  # marks m itself (_is_torch_compile)
    m[0].compile()    # _compiled_call_impl
    assert module_key(m, (x,), cfg) == key


def test_the_module_key_does_not_depend_on_who_else_holds_the_forwards_code():
    # marshal marks objects referenced more than once, so its bytes for a code object change
    # when something (torch.compile's tracing) keeps its names or constants; the key must not
    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.relu() * 1.23456 + 7.5

    cfg = OptimizeConfig(**FAST)
    m, x = Scaled().eval(), torch.randn(1, 4, 10, 10)
    key = module_key(m, (x,), cfg)
    code = Scaled.forward.__code__
    held = (code.co_names, code.co_varnames, code.co_consts, code.co_linetable)
    assert module_key(m, (x,), cfg) == key and held


def test_the_module_key_does_not_depend_on_a_constant_sets_order_in_the_forward():
    # `k in {8, 16}` compiles to a frozenset constant whose order is the literal's (8 and 16
    # share a slot); a constant set of strings differs so from one process to the next
    def gate(literal: str) -> nn.Module:
        src = ("class Gate(nn.Module):\n"
               "    def forward(self, x):\n"
               f"        return x * 2 if x.shape[1] in {literal} else x\n")
        scope: dict = {"nn": nn, "__name__": __name__}
        exec(src, scope)
        return scope["Gate"]().eval()

    cfg, x = OptimizeConfig(**FAST), torch.randn(1, 4, 10, 10)
    a, b = gate("{8, 16}"), gate("{16, 8}")
    consts = [c for m in (a, b) for c in type(m).forward.__code__.co_consts
              if isinstance(c, frozenset)]
    assert list(consts[0]) != list(consts[1])  # the two constants do differ in order
    assert module_key(a, (x,), cfg) == module_key(b, (x,), cfg) is not None


def test_a_program_found_by_the_modules_key_runs_with_the_stored_choices(
        ollie_settings, tmp_path, monkeypatch):
    """The lookup by the module's key, which builds and runs the recalled program, runs where
    the choices among implementations are read from the cache (``Settings.choice_store``), as
    the lookup by the graph's key does: a new process does not measure them again."""
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    ollie.optimize(m, (x,), **FAST)
    stores: list[object] = []
    real = recall.recalled_module

    def seeing(*args, **kwargs):
        stores.append(current().choice_store)
        return real(*args, **kwargs)

    monkeypatch.setattr(optimizer_model, "recalled_module", seeing)
    with using(choices={}):  # what a new process has: an empty table
        warm = ollie.optimize(m, (x,), **FAST)
    assert "found by the module's own key" in warm.notes[-2]
    assert len(stores) == 1 and stores[0] is not None


def test_a_recalled_programs_first_run_checks_its_outputs_not_each_product(
        ollie_settings, tmp_path, monkeypatch):
    """The recalled program's first run (on the check's random inputs) chooses its matrix
    products with ``check_choices`` off: its outputs are checked against the module, each
    remembered implementation is not checked against torch.matmul again. Outside that run the
    setting is back on."""
    from ollie.exec import linear

    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh()).eval()
    x = torch.randn(8, 16)
    # the original operators, one by one: each product runs through ``chosen_product``
    config = dict(FAST, choose_libraries=False, derivation=False)
    ollie.optimize(m, (x,), **config)
    seen: list[bool] = []
    real = linear.chosen_product

    def recording(*args, **kwargs):
        seen.append(current().check_choices)
        return real(*args, **kwargs)

    monkeypatch.setattr(linear, "chosen_product", recording)
    _no_optimising(monkeypatch)
    warm = ollie.optimize(m, (x,), **config)
    assert "from the cache" in warm.notes[-2]
    assert seen and not any(seen) and current().check_choices
    with torch.no_grad():
        torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_recalled_programs_reference_runs_while_the_program_builds(
        ollie_settings, tmp_path, monkeypatch):
    """On the CPU the check's reference (the module run on the check's inputs) is made on a
    worker thread, in the caller's settings, while this thread builds the recalled program:
    making it waits for the build to finish, which it could not if the two ran one after the
    other on one thread."""
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    config = dict(FAST, choose_libraries=False)  # kernels of its own, no regions
    cold = ollie.optimize(m, (x,), **config)
    _no_optimising(monkeypatch)
    built = threading.Event()
    real_build, real_reference = recall._build, recall.module_reference

    def building(*args, **kwargs):
        out = real_build(*args, **kwargs)
        built.set()
        return out

    table: dict = {}
    seen: list[tuple[bool, bool, bool]] = []

    def reference(*args, **kwargs):
        seen.append((threading.current_thread() is threading.main_thread(),
                     built.wait(timeout=60), current().choices is table))
        return real_reference(*args, **kwargs)

    monkeypatch.setattr(recall, "_build", building)
    monkeypatch.setattr(recall, "module_reference", reference)
    with using(choices=table):
        warm = ollie.optimize(m, (x,), **config)
    assert "found by the module's own key" in warm.notes[-2]
    assert program_digest(warm.program) == program_digest(cold.program)
    assert seen == [(False, True, True)]
    with torch.no_grad():
        torch.testing.assert_close(warm(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_program_of_regions_only_is_built_after_its_reference(ollie_settings, tmp_path):
    """ONNX Runtime sessions compute on the cores the reference needs: a program whose
    kernels all run in regions is built after its reference, both on this thread; one with
    kernels of its own is built beside it."""
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    m, x = _model()
    # the original operators (no search): which candidate a search keeps is measured, and
    # one ONNX Runtime cannot express would stay outside the regions variant
    settings = dict(FAST, choose_libraries=False, derivation=False)
    cfg = OptimizeConfig(**settings)
    own = ollie.optimize(m, (x,), **settings).program
    regions = variant(own, REGIONS)
    assert regions is not None and all(k.params.region is not None for k in regions.kernels)
    marker = object()
    for prog, beside in ((regions, False), (own, True)):
        threads: list[bool] = []

        def reference(seen: list[bool] = threads) -> object:
            seen.append(threading.current_thread() is not threading.main_thread())
            return marker

        ref, built = recall._beside_build(prog, cfg, reference)
        assert ref is marker and threads == [beside]
        assert built is not None and built.program is prog
    # no reference (the module cannot be run as one): a regions-only program is not built
    assert recall._beside_build(regions, cfg, lambda: None) == (None, None)


def test_overlapping_short_switch_intervals_restore_the_first_ones_interval():
    """Optimisations on several threads may each shorten the switch interval: the interval
    from before the first is back once the last ends, whichever order they end in."""
    before = sys.getswitchinterval()
    first, second = recall.short_switch_interval(), recall.short_switch_interval()
    first.__enter__()
    short = pytest.approx(min(before, recall.SWITCH_INTERVAL_S))  # kept in microseconds
    assert sys.getswitchinterval() == short
    second.__enter__()
    first.__exit__(None, None, None)  # the first ends while the second runs: still short
    assert sys.getswitchinterval() == short
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
