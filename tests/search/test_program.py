"""Candidates become programs: post-processing keeps them exact, the executor runs them with
pooled buffers, programs save and load, measured selection keeps the fastest."""

import numpy as np
import pytest
import torch

import ollie
from ollie.bench.cases import CASES
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.select import candidate_program, select
from ollie.passes.postprocess import eliminate_identities, fuse_eops, identity_view
from ollie.program.program import Program
from ollie.semantics.check import random_inputs
from ollie.testing.clock import FakeClock, stopped_clock
from ollie.tune.cache import CostCache

UNIT = 2.0 ** -10
"""Seconds a timed call takes on the fake clocks below (a binary fraction: sums are exact)."""


@pytest.fixture(scope="module")
def conv_result():
    """The conv3x3 case's candidates to depth 1 (a stopped clock: the depth alone bounds the
    search, however busy the machine)."""
    expr = ollie.parse(CASES["conv3x3"].small)
    return expr, ollie.derive(expr, max_depth=1, time_budget=30.0, max_candidates=12,
                              clock=stopped_clock)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_postprocessed_candidates_stay_exact(conv_result, backend, tmp_path):
    expr, res = conv_result
    inputs = random_inputs(expr, seed=3)
    want = ollie.interpret(expr, inputs)
    for cand in res.candidates:
        prog = candidate_program(cand, expr, {"K": inputs["K"]})
        assert "K" not in dict(prog.inputs)  # the weight is a constant now
        # weight-only kernels were evaluated at optimisation time
        assert all(not set(k.inputs) <= set(prog.constants) for k in prog.kernels)
        got = CompiledProgram(prog, backend=backend).run({"A": inputs["A"]})[prog.outputs[0]]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
        prog.save(tmp_path / "p")
        again = Program.load(tmp_path / "p")
        got2 = CompiledProgram(again, backend=backend).run({"A": inputs["A"]})
        np.testing.assert_allclose(got2[again.outputs[0]].numpy(), want, rtol=1e-4, atol=1e-4)


def test_eop_fusion_and_identity_elimination():
    from ollie.match.eop import make_eop

    a = ollie.parse("A: [4, 6]\nL<i=0:4, j=0:6> A[i, j] * 2").root
    b = ollie.parse("T: [4, 6]\nL<x=0:24> T[x / 6, x % 6]").root     # a reshape: identity
    c = ollie.parse("U: [24]\nL<x=0:24> relu(U[x] + 1)").root
    k1 = make_eop(a, {"A": (4, 6)}, "T")
    k2 = make_eop(b, {"T": (4, 6)}, "U")
    k3 = make_eop(c, {"U": (24,)}, "V")
    assert identity_view(k2) == (0, (24,), (1,))
    prog = Program((("A", (4, 6)),), ("V",), [k1, k2, k3])
    fused = fuse_eops(prog)
    assert len(fused.kernels) == 1 and fused.kernels[0].kind == "eOp"
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    want = np.maximum(x.reshape(-1) * 2 + 1, 0)
    got = CompiledProgram(fused, backend="reference").run({"A": x})["V"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # without fusion, the reshape becomes a zero-copy alias
    aliased = eliminate_identities(Program((("A", (4, 6)),), ("V",), [k1, k2, k3]))
    assert [k.kind for k in aliased.kernels] == ["eOp", "Alias", "eOp"]
    got = CompiledProgram(aliased, backend="reference").run({"A": x})["V"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_select_measures_and_caches(conv_result, tmp_path, ollie_settings):
    # a quiet machine whose every reading moves the clock on alike: a choice that holds
    # (one made on a busy machine is cached only when measured again alike:
    # tests/optimizer/test_selection.py)
    ollie_settings(load=lambda: 0.0, measure_clock=FakeClock(tick=2.0 ** -12))
    expr, res = conv_result
    inputs = random_inputs(expr, seed=4)
    a, k = torch.as_tensor(inputs["A"]), torch.as_tensor(inputs["K"])
    cache = CostCache(tmp_path / "c.sqlite")

    def baseline():
        return torch.nn.functional.conv2d(a, k, padding=1)

    sel = select(expr, res.candidates, baseline, inputs, {"K": inputs["K"]}, cache=cache,
                 limit=4)
    assert sel.measured and sel.best.seconds <= sel.baseline.seconds
    assert not sel.rejected
    again = select(expr, res.candidates, baseline, inputs, {"K": inputs["K"]}, cache=cache,
                   limit=4)
    assert again.baseline.cached and all(m.cached for m in again.measured)
    assert [m.seconds for m in again.measured] == [m.seconds for m in sel.measured]


def _samples(calls: list, sizes: list[int]) -> list:
    """``calls`` cut into consecutive blocks of ``sizes`` calls, each of one function: the
    function of each block."""
    out, at = [], 0
    for size in sizes:
        block = calls[at:at + size]
        assert len(block) == size and len(set(block)) == 1, (at, block)
        out.append(block[0])
        at += size
    assert at == len(calls), calls[at:]
    return out


@pytest.mark.timing
def test_select_times_original_and_candidates_interleaved(conv_result, monkeypatch,
                                                           ollie_settings):
    """The original and the candidates are timed in alternating rounds (one load affects all
    alike): each is warmed up, then each round has one sample of every one of them (its lead
    call, then the calls of one sample); a candidate must beat the original by the margin to
    be chosen. On a fake clock the original takes ``UNIT`` per call and every candidate
    program ``1 - 2**-6`` of it (1.6% faster: within ``MARGIN``); the real work takes no
    time."""
    from ollie.optimizer import select as select_module
    from ollie.optimizer.select import MARGIN

    expr, res = conv_result
    inputs = random_inputs(expr, seed=5)
    a, k = torch.as_tensor(inputs["A"]), torch.as_tensor(inputs["K"])
    cand_cost = UNIT * (1 - 2.0 ** -6)
    calls: list[object] = []
    clock = FakeClock()
    real_run, real_measure = CompiledProgram.run, select_module.measure_rounds

    def run(self, feed):  # a candidate program: logged, and takes cand_cost on the clock
        calls.append(id(self))
        clock.advance(cand_cost)
        return real_run(self, feed)

    def baseline():
        calls.append("original")
        clock.advance(cost["original"])
        return torch.nn.functional.conv2d(a, k, padding=1)

    def measuring(fns, *args, **kwargs):  # from here on, only the timing's calls are logged
        assert kwargs["clock"] is clock
        calls.clear()
        return real_measure(fns, *args, **kwargs)

    monkeypatch.setattr(CompiledProgram, "run", run)
    monkeypatch.setattr(select_module, "measure_rounds", measuring)
    ollie_settings(load=lambda: 0.0)  # a quiet machine: no second measurement
    cost = {"original": UNIT}
    rounds = 4
    sel = select(expr, res.candidates, baseline, inputs, {"K": inputs["K"]}, limit=2,
                 rounds=rounds, clock=clock)
    timed = 1 + len(sel.measured)  # the original and every verified candidate
    assert len(sel.measured) >= 1 and not sel.rejected
    # warm-up: 2 calls and the one judging hopelessness, each function in turn, the original
    # first; then per round one sample of each: a lead call and int(min_sample / UNIT) = 10
    warm = _samples(calls[:3 * timed], [3] * timed)
    assert warm[0] == "original" and len(set(warm)) == timed
    per_round = _samples(calls[3 * timed:], [1 + 10] * (rounds * timed))
    assert [set(per_round[r * timed:(r + 1) * timed]) for r in range(rounds)] == \
        [set(warm)] * rounds
    assert calls.count("original") == 3 + rounds * 11
    # the medians, exactly what the clock says
    assert sel.baseline.seconds == UNIT
    assert all(m.seconds == cand_cost for m in sel.measured)
    # a candidate only marginally faster does not replace the original; past the margin it does
    assert sel.margin == MARGIN and sel.best is sel.baseline
    sel.margin = 0.01
    assert sel.best is not sel.baseline and sel.best.seconds == cand_cost
    sel.margin = 0.0
    assert sel.best.seconds == min(m.seconds for m in [sel.baseline, *sel.measured])
    # an original far faster than any program (4x, timed in rounds all the same) is never
    # replaced, whatever the margin
    cost["original"] = UNIT / 4
    fast = select(expr, res.candidates, baseline, inputs, {"K": inputs["K"]}, limit=2,
                  rounds=3, margin=0.0, clock=clock)
    assert calls.count("original") == 3 + 3 * (1 + 40)  # int(0.01 / (UNIT / 4)) per sample
    assert fast.baseline.seconds == UNIT / 4
    assert fast.best is fast.baseline and fast.best.program is None


@pytest.mark.timing
def test_measure_alternating_interleaves_and_batches_fast_calls():
    """Rounds alternate the functions; a sample of a function faster than ``min_sample`` is
    that many back-to-back calls over the warm-up's time per call (a fake clock: each call of
    ``tiny`` takes 2**-14 s, so a 1 ms sample is int(1e-3 * 2**14) = 16 calls)."""
    from ollie.tune.measure import measure_alternating

    order: list[str] = []
    res = measure_alternating({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                              rounds=3, warmup=1, min_sample=0.0, shuffle=False,
                              clock=FakeClock())
    assert order == ["a", "b"] + ["a", "b"] * 3
    assert res == {"a": 0.0, "b": 0.0}
    counts = {"a": 0}

    def tiny():
        counts["a"] += 1

    clock = FakeClock()
    res = measure_alternating({"a": clock.costing(2.0 ** -14, tiny)}, rounds=3, warmup=1,
                              min_sample=1e-3, clock=clock)
    assert counts["a"] == 1 + 3 * 16  # 16 calls per sample for a 61 us function
    assert res == {"a": 2.0 ** -14}
    clock = FakeClock()
    counts["a"] = 0
    measure_alternating({"a": clock.costing(2.0 ** -30, tiny)}, rounds=3, warmup=1,
                        min_sample=1e-3, clock=clock)
    assert counts["a"] == 1 + 3 * 1000  # at most 1000 calls per sample


@pytest.mark.timing
def test_measure_repeats_within_its_time_limits():
    """``measure``: the median of ``repeats`` runs after the warm-up; more runs while
    ``min_seconds`` have not passed, fewer (at least 3) when the warm-up says ``repeats``
    would take more than ``max_seconds`` (every time from a fake clock)."""
    from ollie.tune.measure import measure

    def timed(costs: list[float], **kwargs) -> tuple[float, int]:
        clock, calls = FakeClock(), []

        def fn():
            clock.advance(costs[len(calls) % len(costs)])
            calls.append(1)

        return measure(fn, clock=clock, **kwargs), len(calls)

    assert timed([UNIT], warmup=2, repeats=7) == (UNIT, 2 + 7)
    assert timed([UNIT, 3 * UNIT, 2 * UNIT], warmup=0, repeats=3) == (2 * UNIT, 3)  # median
    assert timed([UNIT], warmup=2, repeats=7, min_seconds=20 * UNIT) == (UNIT, 2 + 20)
    assert timed([1.0], warmup=1, repeats=7, max_seconds=4.0) == (1.0, 1 + 4)
    assert timed([1.0], warmup=1, repeats=7, max_seconds=1.0) == (1.0, 1 + 3)


def test_measure_alternating_prepares_every_sample_outside_the_timing():
    """With ``prepare`` (e.g. evicting the caches), every sample is one call preceded by one
    prepare call, even for functions fast enough to be batched otherwise."""
    from ollie.tune.measure import (
        _SCRATCH,
        EVICT_MAX_BYTES,
        evict_caches,
        llc_bytes,
        measure_alternating,
    )

    log: list[str] = []
    measure_alternating({"a": lambda: log.append("a"), "b": lambda: log.append("b")},
                        rounds=4, warmup=1, min_sample=1e-3, shuffle=False,
                        prepare=lambda: log.append("p"), clock=stopped_clock)
    assert log == ["a", "b"] + ["p", "a", "p", "b"] * 4
    evict_caches()  # allocates its scratch once and writes it
    assert _SCRATCH and _SCRATCH[0].nbytes >= min(llc_bytes(), EVICT_MAX_BYTES)
    # a host's whole last-level cache reported to a VM (480 MiB here) is not written each time
    assert _SCRATCH[0].nbytes <= EVICT_MAX_BYTES


def test_measure_alternating_shuffles_the_order_of_each_round():
    from ollie.tune.measure import measure_alternating

    order: list[str] = []
    fns = {c: (lambda c=c: order.append(c)) for c in "abcd"}
    measure_alternating(fns, rounds=8, warmup=0, seed=1, clock=stopped_clock)
    rounds = [tuple(order[i:i + 4]) for i in range(0, len(order), 4)]
    assert len(rounds) == 8 and all(sorted(r) == list("abcd") for r in rounds)
    assert len(set(rounds)) > 1  # not the same order every round


@pytest.mark.timing
def test_measure_alternating_stops_rounds_after_max_seconds():
    """At least 3 rounds run; a later round starts only while at most ``max_seconds`` have
    passed since the rounds began (a fake clock: each call takes 1 s, so a round of the two
    functions takes 2 s)."""
    from ollie.tune.measure import measure_alternating

    for max_seconds, rounds in ((0.5, 3), (5.5, 3), (6.0, 4), (6.5, 4), (100.0, 10)):
        clock = FakeClock()
        order: list[str] = []
        fns = {c: clock.costing(1.0, lambda c=c, o=order: o.append(c)) for c in "ab"}
        res = measure_alternating(fns, rounds=10, warmup=1, shuffle=False,
                                  max_seconds=max_seconds, clock=clock)
        assert order == ["a", "b"] + ["a", "b"] * rounds, max_seconds
        assert res == {"a": 1.0, "b": 1.0}


def test_measure_alternating_lead_calls_run_untimed_before_each_sample():
    """``lead_calls``: that many untimed calls of the same function directly before each of its
    samples (steady-state timing), after ``prepare``."""
    from ollie.tune.measure import measure_alternating

    log: list[str] = []
    measure_alternating({"a": lambda: log.append("a"), "b": lambda: log.append("b")},
                        rounds=2, warmup=1, shuffle=False, lead_calls=2,
                        prepare=lambda: log.append("p"), clock=stopped_clock)
    assert log == ["a", "b"] + ["p", "a", "a", "a", "p", "b", "b", "b"] * 2


def test_measure_alternating_settles_before_each_sample_and_its_lead_calls(ollie_settings):
    """``settle``: the given idle time before every sample, ahead of its lead calls (so that
    threads the previous function left spinning are idle), not inside the timed region."""
    import importlib

    measure = importlib.import_module("ollie.tune.measure")
    log: list[str] = []
    ollie_settings(sleep=lambda s: log.append(f"s{s:g}"))
    measure.measure_alternating({"a": lambda: log.append("a"), "b": lambda: log.append("b")},
                                rounds=2, warmup=1, shuffle=False, lead_calls=1, settle=0.2,
                                clock=stopped_clock)
    assert log == ["a", "b"] + ["s0.2", "a", "a", "s0.2", "b", "b"] * 2
    log.clear()
    # settle_around: a sample of "a" (whose threads spin) and the one following it settle,
    # not "c" after "b"
    measure.measure_alternating({f: (lambda f=f: log.append(f)) for f in "abc"},
                                rounds=2, warmup=1, shuffle=False, lead_calls=1, settle=0.2,
                                settle_around={"a"}, clock=stopped_clock)
    assert log == ["a", "b", "c"] + ["s0.2", "a", "a", "s0.2", "b", "b", "c", "c"] * 2
    log.clear()
    measure.measure_alternating({"a": lambda: log.append("a")}, rounds=3, warmup=0,
                                clock=stopped_clock)
    assert log == ["a"] * 3  # no settle by default


def test_measure_rounds_without_a_warm_up_times_one_call_per_sample(ollie_settings):
    """No warm-up, no estimate of a call's time: a sample is one call and the lead calls are
    ``lead_calls``, whatever ``min_sample`` and ``lead_seconds`` ask (a ticking clock would
    otherwise make an empty warm-up look like a microsecond function, timed a thousand times
    a sample)."""
    import importlib

    measure = importlib.import_module("ollie.tune.measure")
    ollie_settings(sleep=lambda s: None)
    log: list[str] = []
    timed = measure.measure_rounds({"a": lambda: log.append("a")}, rounds=3, warmup=0,
                                   min_sample=0.02, lead_calls=0, settle=0.2,
                                   lead_seconds=0.05, clock=FakeClock(2.0**-20))
    assert log == ["a"] * 3 and len(timed.samples["a"]) == 3


@pytest.mark.timing
def test_measure_alternating_lead_seconds_sets_the_untimed_calls_from_the_warm_up(
        ollie_settings):
    """``lead_seconds``: after a settle, untimed calls before the sample for at least that long,
    their count from the warm-up's time per call (a fake clock: each call takes ``UNIT``);
    a sample without a settle keeps ``lead_calls``."""
    import importlib

    measure = importlib.import_module("ollie.tune.measure")
    ollie_settings(sleep=lambda s: None)
    clock = FakeClock()
    log: list[str] = []
    measure.measure_alternating({f: clock.costing(UNIT, lambda f=f: log.append(f))
                                 for f in "abc"},
                                rounds=2, warmup=1, shuffle=False, lead_calls=1, settle=0.1,
                                lead_seconds=5 * UNIT, settle_around={"b"}, clock=clock)
    # "b" and "c" (after "b") settle: 5 lead calls; "a" (after "c") one lead call
    assert log == ["a", "b", "c"] + (["a"] * 2 + ["b"] * 6 + ["c"] * 6) * 2


@pytest.mark.timing
def test_measure_alternating_skips_hopeless_functions_after_warm_up():
    """``hopeless``: a function whose call after its warm-up is that many times slower than the
    fastest one gets no rounds and is reported at that call's time; the first warm-up call
    (which may build things) does not count. A fake clock: "fast" takes 1 unit per call,
    "slow" 20, "builds" 50 on its first call and 1 after."""
    from ollie.tune.measure import measure_alternating

    clock = FakeClock()
    calls = {"fast": 0, "slow": 0, "builds": 0}

    def fast():
        calls["fast"] += 1
        clock.advance(UNIT)

    def slow():
        calls["slow"] += 1
        clock.advance(20 * UNIT)

    def builds():  # slow only on its first call
        calls["builds"] += 1
        clock.advance((50 if calls["builds"] == 1 else 1) * UNIT)

    res = measure_alternating({"fast": fast, "slow": slow, "builds": builds}, rounds=3,
                              warmup=2, hopeless=10.0, clock=clock)
    assert calls["slow"] == 3  # two warm-up calls and the one that judged it: no rounds
    assert res["slow"] == 20 * UNIT
    assert calls["builds"] == 3 + 3 and res["builds"] == UNIT  # timed in every round
    assert calls["fast"] == 3 + 3 and res["fast"] == UNIT
    # 9.5x the fastest is not hopeless: timed in rounds too
    clock = FakeClock()
    calls = {"fast": 0, "slow": 0, "builds": 0}
    res = measure_alternating({"fast": fast, "slower": clock.costing(9.5 * UNIT)}, rounds=3,
                              warmup=2, hopeless=10.0, clock=clock)
    assert calls["fast"] == 3 + 3 and res == {"fast": UNIT, "slower": 9.5 * UNIT}


def test_select_library_variants(conv_result):
    """With ``library_variants``, each candidate with library convolutions is also measured
    (and checked) with all of them fixed to a uniform library; without, it is not."""
    from ollie.optimizer.libraries import UNIFORM, is_library_conv

    expr, res = conv_result
    inputs = random_inputs(expr, seed=6)
    a, k = torch.as_tensor(inputs["A"]), torch.as_tensor(inputs["K"])

    def baseline():
        return torch.nn.functional.conv2d(a, k, padding=1)

    with_conv = [c for c in res.candidates[:6]
                 if any(is_library_conv(kn) for kn in c.kernels)]
    assert with_conv  # the conv3x3 case has library-conv candidates (the Conv itself, ...)
    plain = select(expr, res.candidates, baseline, inputs, {"K": inputs["K"]}, limit=6,
                   rounds=3)
    both = select(expr, res.candidates, baseline, inputs, {"K": inputs["K"]}, limit=6,
                  rounds=3, library_variants=True)
    suffix = f" [{UNIFORM[0]}]"
    assert not any(m.label.endswith(suffix) for m in plain.measured)
    fixed = [m for m in both.measured if m.label.endswith(suffix)]
    assert len(fixed) >= 1 and len(both.measured) == len(plain.measured) + len(fixed)
    for m in fixed:
        convs = [kn for kn in m.program.kernels if is_library_conv(kn)]
        assert convs and all(kn.params["library"] == UNIFORM[0] for kn in convs)
        out = CompiledProgram(m.program).run({"A": inputs["A"]})[m.program.outputs[0]]
        np.testing.assert_allclose(out.numpy(), ollie.interpret(expr, inputs), rtol=1e-3,
                                   atol=1e-3)


def test_measure_alternating_pauses_the_garbage_collector_while_timing():
    """The cyclic collector is off during every call (warm-up, lead and timed ones) and back on
    afterwards; left off when it was off before, and on again after an exception."""
    import gc

    from ollie.tune.measure import gc_paused, measure_alternating

    seen: list[bool] = []
    measure_alternating({"a": lambda: seen.append(gc.isenabled())}, rounds=3, warmup=1,
                        lead_calls=1)
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("in the block")
    assert gc.isenabled()
