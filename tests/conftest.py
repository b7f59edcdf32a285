"""Test-suite wide settings: GPU tests skip without CUDA; hypothesis profiles; the
``cpu_hog`` fixture and the ``timing`` marker; the ``ollie_settings`` fixture.

Hypothesis profile "ci" (deterministic, 50 examples, no deadline) is the default;
set ``HYPOTHESIS_PROFILE=dev`` for 200 examples per property.

No test may assert what a wall clock allows: a test of a time budget or a measurement injects
a fake clock (:mod:`ollie.testing.clock`) or counts calls and steps. Such tests are marked
``@pytest.mark.timing`` and run with :func:`cpu_hog`, every core kept busy, which shows in
every ``make test`` that their outcome does not depend on how busy the machine is.

Every test, and every fixture wider than one test, keeps generated kernels in one kernel
directory (:data:`SUITE_DIRS`: the one the process's settings name, ``~/.cache/ollie/kernels``
by default), also when it keeps its decisions in a cache directory of its own: kernels are
keyed by their text, so a kernel one test generated is not compiled again by another (the
Winograd transforms take seconds each to compile). A test of where kernels are kept sets
``kernel_dir=None`` (kernels under its cache directory) with :func:`ollie_settings`.

Every test, and every fixture wider than one test, sees a quiet machine (``Settings.load`` 0
and no sample spread counted as load: :data:`QUIET`, :func:`_quiet_machine`,
:func:`pytest_fixture_setup`), so whether a choice is re-measured before it is cached does
not depend on the machine's real load.

A test that needs other settings of Ollie (a cache directory of its own, compiling ahead off,
Triton's interpreter, a clock or a sleep that only records) changes them with
:func:`ollie.settings.using` or the :func:`ollie_settings` fixture, never through the
environment or a module's globals: the settings are read from the environment once.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from ollie.settings import Settings, process_settings, using
from ollie.testing.clock import stopped_clock

CPU_HOG = Path(__file__).resolve().parent.parent / "tools" / "cpu_hog.py"

QUIET = {"load": lambda: 0.0, "busy_spread": math.inf, "budget_clock": stopped_clock}
"""The settings of a quiet machine that every test starts from (:func:`_quiet_machine`)."""

SUITE_DIRS: dict[str, Path] = {}
"""The ``kernel_dir`` of every test (see the module docstring), set when the suite is
configured."""

settings.register_profile("ci", deadline=None, max_examples=50, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is available."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip_gpu)


def pytest_configure(config: pytest.Config) -> None:
    SUITE_DIRS["kernel_dir"] = process_settings().cache_root / "kernels"
    config.addinivalue_line(
        "markers", "timing: tests a time budget or a measurement (with a fake clock or by "
        "counting); runs with the cpu_hog fixture: every core kept busy")
    config.addinivalue_line(
        "markers", "process_settings: tests of the process's settings, run without the "
        "suite's quiet-machine override")


@pytest.fixture
def cpu_hog() -> Iterator[int]:
    """Every core kept busy for the duration of the test: ``tools/cpu_hog.py`` runs one
    busy-looping process per core (yields their number). Stopped when the test ends, passed or
    failed; its processes also exit by themselves if this one dies."""
    hog = subprocess.Popen([sys.executable, str(CPU_HOG)], stdout=subprocess.PIPE, text=True,
                           stdin=subprocess.DEVNULL)
    try:
        assert hog.stdout is not None
        line = hog.stdout.readline().split()
        assert line[:1] == ["ready"], f"{CPU_HOG} did not start: {line}"
        yield int(line[1])
    finally:
        hog.send_signal(signal.SIGTERM)
        try:
            hog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            hog.kill()  # its children exit when it is gone
            hog.wait()
        if hog.stdout is not None:
            hog.stdout.close()


@pytest.fixture(autouse=True)
def _timing_under_load(request: pytest.FixtureRequest) -> None:
    """Tests marked ``timing`` get :func:`cpu_hog`."""
    if request.node.get_closest_marker("timing") is not None:
        request.getfixturevalue("cpu_hog")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """Fixtures of a wider scope than one test (a module's optimised model) are set up on a
    quiet machine too, with a stopped total-budget clock: they are made before
    :func:`_quiet_machine` applies to the first test that uses them."""
    if fixturedef.scope == "function":
        return (yield)
    with using(**QUIET, **SUITE_DIRS):
        return (yield)


@pytest.fixture(autouse=True)
def _quiet_machine(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test sees a quiet machine (load 0, and no spread of samples counts as busy):
    whether a measurement is re-checked before it is cached (:func:`ollie.tune.decide.busy`)
    does not depend on what else runs; and a stopped total-budget clock (``budget_clock``):
    what ``ollie.optimize``'s default budget leaves unsearched does not depend on how busy
    the machine is. Tests of the behaviour under load set ``load`` or ``busy_spread``, tests
    of the budget ``budget_clock``, with :func:`ollie_settings`; tests marked
    ``process_settings`` (of the process's settings themselves) run without the override."""
    if request.node.get_closest_marker("process_settings") is not None:
        yield
        return
    with using(**QUIET, **SUITE_DIRS):
        yield


@pytest.fixture
def ollie_settings() -> Iterator[Callable[..., Settings]]:
    """``ollie_settings(**changes)``: Ollie's settings changed for the rest of the test
    (:func:`ollie.settings.using`; fields of :class:`ollie.settings.Settings`), restored when
    it ends; returns the settings in effect."""
    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(using(**changes))


@pytest.fixture
def optimize_cli_kwargs(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], dict]:
    """``kwargs(argv)``: the keyword arguments ``ollie`` ``argv`` (an ``optimize`` command
    line) passes to :func:`ollie.optimizer.model.optimize`, which is replaced so that nothing
    is loaded or optimised."""
    from ollie.cli import build_parser
    from ollie.commands import optimize as command
    from ollie.optimizer import model as optimizer_model

    class Stop(Exception):
        pass

    seen: dict = {}

    def fake(model: object, inputs: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(optimizer_model, "optimize", fake)
    monkeypatch.setattr(command, "load_model", lambda spec, batch: (None, None, "m"))

    def kwargs(argv: list[str]) -> dict:
        seen.clear()
        with pytest.raises(Stop):
            command.run(build_parser().parse_args(argv))
        return dict(seen)

    return kwargs
