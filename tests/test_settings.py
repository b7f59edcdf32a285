"""Ollie's settings (ollie.settings): read from the environment once, changed for a block by
``using`` and restored after, seen only by the context that changed them, and followed by
every reader (cache directory, compiling ahead, CUDA graphs, Triton's interpreter, clocks,
the settle's sleep, the collector while timing; while searching: tests/test_caches.py)."""

from __future__ import annotations

import contextvars
import gc
import threading
from pathlib import Path

import pytest

from ollie import cachedir, settings
from ollie.settings import Settings, current, from_environ, using
from ollie.testing.clock import FakeClock, stopped_clock

pytestmark = pytest.mark.process_settings


def test_the_environment_sets_each_field_and_nothing_else():
    assert from_environ({}) == Settings()
    assert Settings().cache_root == Path.home() / ".cache" / "ollie"
    s = from_environ({"OLLIE_CACHE_DIR": "/some/where", "OLLIE_PRECOMPILE": "0",
                      "OLLIE_CUDA_GRAPHS": " Off ", "TRITON_INTERPRET": "1"})
    assert s == Settings(cache_dir=Path("/some/where"), precompile=False, cuda_graphs=False,
                         cuda_interpret=True)
    assert s.cache_root == Path("/some/where")
    assert from_environ({"OLLIE_CACHE_DIR": ""}).cache_dir is None  # empty: the default
    assert from_environ({"OLLIE_PRECOMPILE": "no"}).precompile  # only "0" turns it off
    for on in ("1", "true", "YES", " on "):
        assert from_environ({"TRITON_INTERPRET": on}).cuda_interpret
    assert not from_environ({"TRITON_INTERPRET": "0"}).cuda_interpret


def test_the_process_settings_are_read_once(monkeypatch):
    """Changing the environment afterwards changes nothing until :func:`settings.reset`
    (what a process that changed its environment on purpose calls)."""
    monkeypatch.setattr(settings, "_PROCESS", [])  # this test's own process settings
    monkeypatch.setenv("OLLIE_CUDA_GRAPHS", "0")
    assert settings.process_settings().cuda_graphs is False
    monkeypatch.setenv("OLLIE_CUDA_GRAPHS", "1")
    assert current().cuda_graphs is False
    settings.reset()
    assert current().cuda_graphs is True


def test_using_changes_a_block_and_restores_after(tmp_path):
    before = current()
    with using(cache_dir=tmp_path, precompile=False) as s:
        assert current() is s and s.cache_dir == tmp_path and not s.precompile
        assert s.cuda_graphs == before.cuda_graphs  # the rest as it was
        with using(precompile=True):
            assert current().precompile and current().cache_dir == tmp_path
        assert not current().precompile
    assert current() is before
    with pytest.raises(RuntimeError), using(cuda_graphs=False):
        raise RuntimeError("the block fails")
    assert current() is before
    with pytest.raises(TypeError), using(no_such_setting=1):
        pass


def test_using_is_seen_by_its_context_only(tmp_path):
    seen: list[Path | None] = []
    with using(cache_dir=tmp_path):
        ctx = contextvars.copy_context()
        t = threading.Thread(target=lambda: seen.append(current().cache_dir))
        t.start()
        t.join()
        ctx.run(lambda: seen.append(current().cache_dir))
    assert seen == [settings.process_settings().cache_dir, tmp_path]


def test_configure_replaces_the_process_settings(monkeypatch):
    monkeypatch.setattr(settings, "_PROCESS", [Settings()])
    new = settings.configure(precompile=False)
    assert settings.process_settings() is new and current() is new and not new.precompile
    with using(precompile=True):
        assert current().precompile


def test_the_cache_directory_follows_the_settings(tmp_path):
    cachedir.forget()
    try:
        with using(cache_dir=tmp_path / "a"):
            assert cachedir.configured_root() == tmp_path / "a"
            assert cachedir.cache_root() == tmp_path / "a"
        with using(cache_dir=tmp_path / "b"):
            assert cachedir.cache_root() == tmp_path / "b"
    finally:
        cachedir.forget()


def test_the_switches_follow_the_settings():
    from ollie.codegen import precompile
    from ollie.exec import cuda_graph

    for on in (True, False):
        with using(precompile=on, cuda_graphs=on):
            assert precompile.enabled() is on and cuda_graph.enabled() is on


def test_the_interpreter_mode_follows_the_settings():
    cuda = pytest.importorskip("ollie.codegen.cuda")
    for on in (True, False):
        with using(cuda_interpret=on):
            assert cuda.interpret_mode() is on


def test_measurements_read_the_clock_and_the_settle_wait_of_the_settings():
    from ollie.tune.measure import measure, measure_alternating

    clock = FakeClock()
    slept: list[float] = []
    with using(measure_clock=clock, sleep=slept.append):
        assert measure(clock.costing(0.25), warmup=1, repeats=3) == 0.25
        times = measure_alternating({"a": clock.costing(0.5), "b": clock.costing(0.125)},
                                    rounds=3, warmup=1, settle=0.0625)
    assert times == {"a": 0.5, "b": 0.125}
    assert slept and set(slept) == {0.0625}
    # an explicit clock wins over the settings'
    with using(measure_clock=stopped_clock):
        assert measure(clock.costing(0.5), warmup=1, repeats=3, clock=clock) == 0.5


def test_the_collector_while_timing_follows_the_settings():
    from ollie.tune.measure import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with using(pause_gc_while_timing=False), gc_paused():
        assert gc.isenabled()


def test_a_search_reads_the_settings_clock():
    """A search's budget is spent on the settings' search clock when its config names none:
    one that jumps past the budget at every reading stops it after its first step."""
    import ollie

    text = "A: [4, 4]\nB: [4, 4]\nL<i=0:4, j=0:4> Sum<k=0:4> A[i, k] * B[k, j]"
    with using(search_clock=FakeClock(tick=1000.0)):
        late = ollie.derive(ollie.parse(text), max_depth=3, time_budget=1.0)
    with using(search_clock=stopped_clock):
        full = ollie.derive(ollie.parse(text), max_depth=3, time_budget=1.0)
    assert late.stats["states_visited"] < full.stats["states_visited"]
    assert full.stats["seconds"] == 0.0


def test_a_cache_directory_given_as_text_is_a_path(tmp_path):
    with using(cache_dir=str(tmp_path)) as s:
        assert s.cache_dir == tmp_path and s.cache_root == tmp_path
        assert current().cache_root / "costs.sqlite" == tmp_path / "costs.sqlite"
