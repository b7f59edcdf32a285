"""Program-context choice of rewrites (ollie.optimizer.context): switches that make the whole
program faster are kept, a switch that changes the result never is, and ``optimize`` reports
and caches the choice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.exec.executor import CompiledProgram
from ollie.optimizer import context
from ollie.optimizer.context import Group, refine
from ollie.optimizer.final import ORIGINAL
from ollie.testing.clock import FakeClock, stopped_clock
from ollie.testing.programs import marked_assembler, original_program

UNIT = 2.0 ** -9
"""Seconds a switch adds or saves in the timed programs below, on a fake clock."""


def _setup(monkeypatch, ollie_settings):
    """A two-convolution program; ``assemble(on)`` marks the groups in ``on`` on its first
    kernel; a call of the program (as the comparisons time it) takes time according to the
    marks (``slow``: +2 units, ``fast``: -1 unit, from 2 units), and its run (as the variants
    are checked) doubles its outputs for ``wrong``. The time is a fake clock's, which the
    comparisons (``measure_alternating``) read: what they measure depends on the marks
    alone."""
    clock = FakeClock()
    ollie_settings(measure_clock=clock)
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(8, 3, 3, padding=1)).eval()
    prog, feeds, want = original_program(m, torch.randn(1, 4, 8, 8))

    assemble = marked_assembler(prog)

    real_run, real_call = CompiledProgram.run, CompiledProgram.__call__

    def marks(prog: CompiledProgram) -> set[str]:
        return set(prog.program.kernels[0].params.get("test_on", ()))

    def run(self, inputs):  # as the variants are checked
        out = real_run(self, inputs)
        return {n: v * 2 for n, v in out.items()} if "wrong" in marks(self) else out

    def call(self, *args):  # as the variants are timed
        on = marks(self)
        clock.advance(UNIT * (2 + 2 * ("slow" in on) - ("fast" in on)))
        return real_call(self, *args)

    monkeypatch.setattr(CompiledProgram, "run", run)
    monkeypatch.setattr(CompiledProgram, "__call__", call)
    return assemble, feeds, want


def _groups(*keys: str) -> list[Group]:
    return [Group(k, (f"node_{k}",), 1e-3) for k in keys]


@pytest.mark.timing
def test_switches_that_help_in_the_program_are_kept_together(monkeypatch, ollie_settings):
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    groups = _groups("slow", "fast", "neutral")
    out = refine(assemble, groups, frozenset({"slow", "neutral"}), "per operator", feeds,
                 want, 1e-3)
    # switching "slow" off and "fast" on each win; together they win more
    assert out is not None and out.on == frozenset({"fast", "neutral"})
    assert "+node_fast" in out.note and "-node_slow" in out.note
    assert out.program.kernels[0].params["test_on"] == ["fast", "neutral"]


def test_a_step_stopped_by_the_budget_keeps_the_start_and_is_not_cached(
        monkeypatch, ollie_settings, tmp_path):
    """The total budget runs out while the variants are built (here after two checks: the
    step's ``stop``): none is timed, the start is returned marked incomplete, and
    ``cached_refine`` keeps no decision for the next run."""
    from ollie.optimizer.context import cached_refine
    from ollie.optimizer.final import Reference
    from ollie.tune.cache import CostCache

    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    checks = []
    real_run = CompiledProgram.run
    monkeypatch.setattr(CompiledProgram, "run",
                        lambda self, inputs: checks.append(1) or real_run(self, inputs))
    start = frozenset({"slow", "neutral"})
    out = refine(assemble, _groups("slow", "fast", "neutral"), start, "per operator", feeds,
                 want, 1e-3, stop=lambda: len(checks) >= 2)
    assert out is not None and out.on == start and not out.complete
    assert "stopped at the time budget after building 1 of 3" in out.note
    cache = CostCache(tmp_path / "costs.sqlite")
    checks.clear()
    out = cached_refine(assemble, _groups("slow", "fast", "neutral"), start, "per operator",
                        Reference(feeds, want, 1e-3), cache, "cpu", 0.0,
                        stop=lambda: len(checks) >= 2)
    assert out is not None and not out.complete
    assert cache.db.execute("SELECT count(*) FROM decisions").fetchone()[0] == 0
    # with the budget left, the same step times every switch and keeps its choice
    out = cached_refine(assemble, _groups("slow", "fast", "neutral"), start, "per operator",
                        Reference(feeds, want, 1e-3), cache, "cpu", 0.0)
    assert out is not None and out.complete and out.on == frozenset({"fast", "neutral"})
    assert cache.db.execute("SELECT count(*) FROM decisions").fetchone()[0] == 1


def test_comparisons_end_with_the_budget_and_change_nothing_unconfirmed(
        monkeypatch, ollie_settings, tmp_path):
    """The total budget runs out while the switches are timed (``left``, on the comparisons'
    fake clock): the comparison stops after its first rounds instead of going on for
    :data:`context.MAX_SECONDS`, nothing changes, and nothing is cached."""
    from ollie.optimizer.context import cached_refine
    from ollie.optimizer.final import Reference
    from ollie.settings import current
    from ollie.tune.cache import CostCache

    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    clock = current().measure_clock
    start, groups = frozenset({"slow", "neutral"}), _groups("slow", "fast", "neutral")
    t0 = clock()
    unbounded = refine(assemble, groups, start, "per operator", feeds, want, 1e-3)
    full = clock() - t0
    assert unbounded is not None and unbounded.on != start  # a switch wins, given the time
    t0 = clock()
    cache = CostCache(tmp_path / "costs.sqlite")
    out = cached_refine(assemble, groups, start, "per operator", Reference(feeds, want, 1e-3),
                        cache, "cpu", 0.0, left=lambda: t0 + 0.05 - clock())
    assert out is not None and out.on == start and not out.complete
    assert "stopped at the time budget, nothing confirmed" in out.note
    assert clock() - t0 < full / 3
    assert cache.db.execute("SELECT count(*) FROM decisions").fetchone()[0] == 0


@pytest.mark.timing
def test_a_switch_that_changes_the_result_is_never_kept(monkeypatch, ollie_settings):
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    # "wrong" doubles the outputs; its program is not even timed
    out = refine(assemble, _groups("wrong", "slow"), frozenset({"wrong", "slow"}),
                 "per operator", feeds, want, 1e-3)
    assert out is None  # the starting choice itself disagrees: nothing to refine
    out = refine(assemble, _groups("wrong", "slow"), frozenset({"slow"}), "per operator",
                 feeds, want, 1e-3)
    assert out is not None and out.on == frozenset()
    assert "+node_wrong" not in out.note


@pytest.mark.timing
def test_no_switch_within_the_margin(monkeypatch, ollie_settings):
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    out = refine(assemble, _groups("neutral"), frozenset({"neutral"}), "per operator", feeds,
                 want, 1e-3)
    assert out is not None and out.on == frozenset({"neutral"})
    assert out.note.startswith("program context: as chosen (")


def test_a_switch_is_kept_only_when_a_second_comparison_confirms_it(monkeypatch, ollie_settings):
    """Scripted timings: the first comparison has switching "a" on 10% faster; a second
    comparison within the margin leaves the choice as it was, one that agrees keeps it."""
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    start, on = frozenset(), frozenset({"a"})
    for second, kept in ((0.99, start), (0.90, on)):
        answers = iter([{start: 1.0, on: 0.90}, {start: 1.0, on: second}])
        calls = []

        def scripted(choices, runner, spinning=(), rounds=0, settle=0.0, max_seconds=0.0,
                     answers=answers, calls=calls):
            calls.append(list(choices))
            for c in choices:
                assert runner(c) is not None
            return next(answers)

        monkeypatch.setattr(context, "_time", scripted)
        out = refine(assemble, _groups("a"), start, "per operator", feeds, want, 1e-3)
        assert out is not None and out.on == kept
        assert calls == [[start, on], [start, on]]
        assert ("not confirmed" in out.note) == (kept == start)


def test_switches_each_within_the_noise_are_confirmed_together(monkeypatch, ollie_settings):
    """Scripted timings: "a" and "b" each measure within the margin ("b" 0.5% slower, within
    NOISE), "c" clearly slower; the second comparison times "a" (the best single) and "a"
    with "b" together, and keeps the pair when it wins by the margin."""
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    start = frozenset()
    a, b, c, ab = (frozenset(x) for x in ({"a"}, {"b"}, {"c"}, {"a", "b"}))
    answers = iter([{start: 1.0, a: 0.99, b: 1.005, c: 1.05}, {start: 1.0, a: 0.99, ab: 0.95}])
    calls = []

    def scripted(choices, runner, spinning=(), rounds=0, settle=0.0, max_seconds=0.0):
        calls.append((list(choices), rounds))
        assert settle == context.SETTLE_SECONDS  # refine's default, passed on
        # each variant is timed as called in use (``CompiledProgram.__call__``: a tensor)
        assert all(isinstance(runner(c)(), torch.Tensor) for c in choices)
        return next(answers)

    monkeypatch.setattr(context, "_time", scripted)
    out = refine(assemble, _groups("a", "b", "c"), start, "per operator", feeds, want, 1e-3)
    assert out is not None and out.on == ab
    assert calls[1] == ([start, a, ab], context.CONFIRM_ROUNDS)
    # only one switch within the noise and none past the margin: no second comparison
    answers = iter([{start: 1.0, a: 0.99, b: 1.02, c: 1.05}])
    calls.clear()
    out = refine(assemble, _groups("a", "b", "c"), start, "per operator", feeds, want, 1e-3)
    assert out is not None and out.on == start and len(calls) == 1


def test_a_decision_made_before_is_checked_and_applied_without_timing(monkeypatch, ollie_settings):
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    timed = []
    monkeypatch.setattr(context, "_time",
                        lambda choices, runner, spinning=(), rounds=0, settle=0.0,
                        max_seconds=0.0: timed.append(choices) or {})
    out = refine(assemble, _groups("slow", "fast"), frozenset({"slow"}), "per operator",
                 feeds, want, 1e-3, decided=frozenset({"fast"}))
    assert out is not None and out.on == frozenset({"fast"}) and out.note.endswith("(cached)")
    assert not timed
    # a cached decision that now disagrees with the model is not applied
    out = refine(assemble, _groups("slow", "wrong"), frozenset({"slow"}), "per operator",
                 feeds, want, 1e-3, decided=frozenset({"wrong"}))
    assert out is None and timed  # timed again (the stub times nothing)


def test_alternatives_of_one_subprogram_are_never_on_together(monkeypatch, ollie_settings):
    """Two alternatives of node "n" (its original won alone) and a rewrite of node "m": each
    switch measures faster; the second comparison times the best single switch and the
    compatible ones together (one alternative of "n", the faster), never both of "n"."""
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    groups = [Group("n1", ("n",), 0.0, "Matmul -> eOp"), Group("n2", ("n",), 0.0, "Conv -> eOp"),
              Group("m", ("m",), 1e-3)]
    start = frozenset({"m"})
    n1, n2, off = start | {"n1"}, start | {"n2"}, frozenset()
    both = frozenset({"n1"})
    answers = iter([{start: 1.0, n1: 0.90, n2: 0.92, off: 0.95}, {start: 1.0, n1: 0.9, both: 0.8}])
    calls = []

    def scripted(choices, runner, spinning=(), rounds=0, settle=0.0, max_seconds=0.0):
        calls.append(list(choices))
        assert all(runner(c) is not None for c in choices)
        return next(answers)

    monkeypatch.setattr(context, "_time", scripted)
    out = refine(assemble, groups, start, "per operator", feeds, want, 1e-3)
    assert calls[0] == [start, off, n1, n2]  # "-m", "+n as ...": one switch each
    assert calls[1] == [start, n1, both]     # n1 and "-m" together; n2 left out
    assert out is not None and out.on == both
    assert "+n as Matmul -> eOp" in out.note and "-m" in out.note


def test_selection_offers_alternatives_only_when_the_original_won():
    """``Selection.alternatives``: the fastest candidate of each program label measured
    within ALTERNATIVE_WITHIN of the original alone, when the original won; none when a
    candidate won."""
    from ollie.optimizer.select import ALTERNATIVE_WITHIN, Measured, Selection

    base = Measured("original", 1.0)

    def cand(label, t):
        return Measured(label, t, program=object(), candidate=object())

    slow = ALTERNATIVE_WITHIN * 1.01
    sel = Selection(base, [cand("Matmul -> eOp", 1.3), cand("Conv -> eOp", 1.1),
                           cand("Matmul -> eOp", 1.2), cand("eOp", slow)], margin=0.03)
    assert sel.best is base
    assert [(m.label, m.seconds) for m in sel.alternatives(limit=5)] == \
        [("Conv -> eOp", 1.1), ("Matmul -> eOp", 1.2)]
    assert [m.label for m in sel.alternatives(limit=1)] == ["Conv -> eOp"]
    won = Selection(base, [cand("Conv -> eOp", 0.5), cand("Matmul -> eOp", 1.1)], margin=0.03)
    assert won.best.label == "Conv -> eOp" and won.alternatives() == []


@pytest.mark.timing
def test_at_most_max_groups_switched_largest_saving_first(monkeypatch, ollie_settings):
    assemble, feeds, want = _setup(monkeypatch, ollie_settings)
    monkeypatch.setattr(context, "MAX_GROUPS", 1)
    groups = [Group("fast", ("a",), 1e-6), Group("neutral", ("b",), 1e-3)]
    out = refine(assemble, groups, frozenset(), "per operator", feeds, want, 1e-3)
    # only "neutral" (the larger saving) was switched: "fast" was not tried
    assert out is not None and out.on == frozenset()
    assert "+b" in out.note and "+a" not in out.note


def _search_without_deadline(ollie_settings) -> None:
    """``optimize``'s searches on a stopped clock: bounded by their depth and candidates alone,
    they find the same programs however busy the machine."""
    ollie_settings(search_clock=stopped_clock)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
def test_optimize_reports_and_caches_the_choice(monkeypatch, tmp_path, ollie_settings):
    """``optimize`` switches rewrites in the program: the report of a subprogram switched off
    records its rewrite as not kept, the program runs exactly, and a second optimisation with
    the cache applies the choice without timing."""
    ollie_settings(cache_dir=tmp_path, recall_programs=False)  # the decisions' path
    torch.manual_seed(3)
    # InfoGAN's first two layers: the first as a Matmul ran 2.2x faster alone (2-core VM)
    m = nn.Sequential(nn.ConvTranspose2d(228, 448, 2, bias=False), nn.ReLU(),
                      nn.ConvTranspose2d(448, 64, 4, stride=2, padding=1, bias=False)).eval()
    x = torch.randn(16, 228, 1, 1)
    with torch.inference_mode():
        want = m(x)
    seen = {}

    def all_off(assemble, groups, start, library, feeds, want, rtol, decided=None, settle=0.0,
                stop=None, left=None):
        seen["groups"] = groups
        seen["decided"] = decided
        prog = context.variant(context.postprocess(assemble(frozenset())), library)
        return context.Refined(frozenset(), prog, "program context: test")

    monkeypatch.setattr("ollie.optimizer.context.refine", all_off)
    _search_without_deadline(ollie_settings)
    # every subprogram with a verified candidate takes it (which one is faster alone is not
    # under test here): the context step has a switch for each
    from ollie.optimizer import select
    monkeypatch.setattr(select.Selection, "best", property(
        lambda self: min(self.measured, key=lambda m: m.seconds, default=self.baseline)))
    # two candidates per subprogram, no library choice and no hand-written kernel: none is
    # under test here, and each candidate's eOperators are compiled (most of this test's time
    # with a cold kernel cache; the original operators' Winograd forms were a third of it)
    cfg = dict(time_budget=5.0, max_depth=2, settle=0.0, max_candidates=2,
               choose_libraries=False, kernel_library=False)
    opt = ollie.optimize(m, (x,), "cpu", **cfg)
    rewritten = [r for r in opt.report if r.not_kept is not None]
    assert seen and rewritten, opt.summary()
    assert seen["decided"] is None
    # a switch per rewritten subprogram, and alternatives only for the others
    assert {n for g in seen["groups"] if not g.alternative for n in g.nodes} == \
        {r.node for r in rewritten}
    assert not {n for g in seen["groups"] if g.alternative for n in g.nodes} & \
        {r.node for r in rewritten}
    assert all(r.chosen == ORIGINAL for r in opt.report)
    assert any(n.startswith("program context: test; ") for n in opt.notes)
    kept = {k.params["node"].name for k in opt.program.kernels if k.kind == "Node"}
    assert {r.node for r in rewritten} <= kept  # each runs as its original operator
    with torch.inference_mode():
        torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-4)
    ollie.optimize(m, (x,), "cpu", **cfg)
    assert seen["decided"] == frozenset()  # from the cache


def test_an_alternative_switched_on_runs_and_is_reported(monkeypatch, tmp_path,
                                                          ollie_settings):
    """A subprogram whose original operator won alone offers its rewrite as an alternative
    (here every candidate is kept as one, and the original always wins alone); switched on
    by the context step, the program runs it, matches the model, and the report marks it kept
    for the whole program; the cached choice is applied again."""
    from ollie.optimizer import select

    ollie_settings(cache_dir=tmp_path, recall_programs=False)  # the decisions' path
    _search_without_deadline(ollie_settings)
    alternatives = select.Selection.alternatives
    monkeypatch.setattr(select.Selection, "alternatives",
                        lambda self, within=float("inf"), limit=select.ALTERNATIVES:
                        alternatives(self, within, limit))
    monkeypatch.setattr(select.Selection, "best", property(lambda self: self.baseline))
    torch.manual_seed(4)
    m = nn.Sequential(nn.ConvTranspose2d(24, 16, 4, stride=2, padding=1, bias=False),
                      nn.ReLU()).eval()
    x = torch.randn(1, 24, 4, 4)
    with torch.inference_mode():
        want = m(x)
    seen = {}

    def all_alternatives_on(assemble, groups, start, library, feeds, want, rtol,
                            decided=None, settle=0.0, stop=None, left=None):
        seen["decided"] = decided
        on = frozenset(g.key for g in groups if g.alternative)
        seen["on"] = on
        prog = context.variant(context.postprocess(assemble(on)), library)
        return context.Refined(on, prog, "program context: test")

    monkeypatch.setattr("ollie.optimizer.context.refine", all_alternatives_on)
    cfg = dict(time_budget=3.0, max_depth=2, settle=0.0, max_candidates=1,
               choose_libraries=False)
    opt = ollie.optimize(m, (x,), "cpu", **cfg)
    assert seen["decided"] is None and len(seen["on"]) == 1, opt.summary()
    (r,) = opt.report
    assert r.in_program and r.chosen != ORIGINAL and r.derivation
    assert "not faster alone; kept" in opt.summary()
    assert not any(k.kind == "Node" for k in opt.program.kernels)  # the rewrite runs
    with torch.inference_mode():
        torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-4)
    ollie.optimize(m, (x,), "cpu", **cfg)
    assert seen["decided"] == seen["on"]  # from the cache
