"""Linear regions as subprograms end to end (:mod:`ollie.optimizer.regions`): GCN's
global-convolution block is lowered as one program, its ``left2 + right2`` merged by the sum
mode of expression merging into one convolution, derived, checked against the interpreter
and the module, and kept only when faster than its nodes decided alone.

Searches and measurements run on a stopped clock; to test the kept path the measured times
are replaced after the real selection (which did verify the programs), so no assertion
depends on the machine's speed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ollie
from ollie.commands.optimize import explain
from ollie.graph.partition import multi_compute, partition
from ollie.ir import parse_program
from ollie.ir.exprprogram import ExprProgram
from ollie.optimizer import regions
from ollie.optimizer.importing import to_graph
from ollie.program.kernel import Kernel
from ollie.program.params import KernelKind
from ollie.program.serialize import FormatError
from ollie.rules.base import assume_finite_inputs
from ollie.rules.inter_program import apply_program_rules
from ollie.testing.clock import stopped_clock
from ollie.zoo.gcn import GCNBlock

# two guided steps per scope: on the stopped clock each search runs to its end (the default
# six: about 35 s per optimisation here, two: about 3 s); the merge is found at either
FAST = dict(max_depth=1, guided_depth=2, time_budget=2.0, use_cache=False, context=False,
            choose_libraries=False, settle=0, merge_siblings=False, kernel_library=False)


def _script(monkeypatch, factor: float) -> list[list[str]]:
    """Region selections measure the programs derived by a merge at ``factor`` x the nodes'
    time, every other program slower; returns each selection's candidates' derivations."""
    real = regions.select_program
    seen: list[list[str]] = []

    def timed(*args, **kwargs):
        sel = real(*args, **kwargs)
        sel.baseline.seconds, sel.baseline.samples = 1e-3, []
        sel.unconfirmed = False
        for m in sel.measured:
            merged = m.candidate is not None and \
                m.candidate.derivation[:1] == ["expression_merging"]
            m.seconds, m.samples = (factor if merged else 3.0) * 1e-3, []
            seen.append(m.candidate.derivation if m.candidate is not None else [])
        return sel

    monkeypatch.setattr(regions, "select_program", timed)
    return seen


def _block():
    torch.manual_seed(0)
    return GCNBlock(32, 4, 3).eval(), torch.randn(1, 32, 8, 8)


def _close(opt, m, x) -> None:
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-5)


def test_gcn_block_is_sum_merged_into_one_convolution(ollie_settings, monkeypatch):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    seen = _script(monkeypatch, 0.5)
    m, x = _block()
    opt = ollie.optimize(m, x, **FAST)
    assert any(d[:1] == ["expression_merging"] for d in seen)  # verified, then measured
    (entry,) = [r for r in opt.report if len(r.nodes) > 1]
    assert entry.nodes == ["conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "add"]
    assert entry.derivation[0] == "expression_merging"
    assert entry.optimized_ms == pytest.approx(0.5) and entry.original_ms == pytest.approx(1.0)
    assert [r.nodes for r in opt.report] == [entry.nodes]  # the members' entries replaced
    convs = [k for k in opt.program.kernels if k.kind is KernelKind.CONV]
    merged = [k for k in convs if k.params["c"] == 8]  # 4 + 4 channels joined
    assert merged and (merged[0].params["r"], merged[0].params["s"]) == (3, 3)
    assert any(n.startswith("region conv2d") and "kept" in n and "sum" in n
               for n in opt.notes)
    assert any(n.startswith("checked against the original model") for n in opt.notes)
    _close(opt, m, x)
    assert "[nodes: conv2d, conv2d_1, conv2d_2, conv2d_3, add]" in opt.summary()
    assert "inter-expression: expression_merging" in explain(opt.report)


def test_slower_regions_keep_their_nodes(ollie_settings, monkeypatch):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _script(monkeypatch, 2.0)
    m, x = _block()
    opt = ollie.optimize(m, x, **FAST)
    assert all(len(r.nodes) == 1 for r in opt.report)
    assert len(opt.report) == 4  # the four convolutions, decided alone
    assert any(n.startswith("region conv2d") and "not kept" in n for n in opt.notes)
    assert not any(k.kind is KernelKind.CONV and k.params["c"] == 8
                   for k in opt.program.kernels)
    _close(opt, m, x)


def test_derive_regions_off_decides_nodes_alone(ollie_settings, monkeypatch):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    seen = _script(monkeypatch, 0.5)
    m, x = _block()
    opt = ollie.optimize(m, x, **FAST, derive_regions=False)
    assert seen == [] and not any(n.startswith("region ") for n in opt.notes)
    assert all(len(r.nodes) == 1 for r in opt.report)
    _close(opt, m, x)


def _lowered():
    m, x = _block()
    graph = to_graph(m, (x,))
    (region,) = multi_compute(partition(graph))
    consts = {n: np.asarray(v) for n, v in graph.initializers.items()}
    lowered = regions.lower_region(graph, region, consts)
    assert lowered is not None
    return graph, region, lowered, consts


def test_region_programs_rank_the_sum_merge_first_within_the_bounds():
    _, _, (ep, names, _), _ = _lowered()
    assert isinstance(ep, ExprProgram) and ep.outputs == (names["add"],)
    programs = regions.derived_programs(ep)
    assert 1 <= len(programs) <= regions.MAX_PROGRAMS
    assert programs[0][1].rule == "expression_merging" and "sum" in programs[0][1].note
    refs = regions.output_exprs(ep)
    assert set(refs) == set(ep.outputs)


def test_cached_region_decisions_are_checked_to_fit():
    _, _, (ep, names, _), consts = _lowered()
    canon = {c: consts[m] for m, c in names.items() if m in consts}
    out = regions.RegionOutcome(None, ep.outputs, "its nodes alone", [], 1e-3, 1e-3, 0, [],
                                ["expression_merging: sum"])
    back = regions.RegionOutcome.from_json(out.to_json(), ep, canon)
    assert back == out
    wrong = regions.RegionOutcome(None, ("y9",), "x", [], 1.0, 1.0, 0, [], [])
    with pytest.raises(FormatError):
        regions.RegionOutcome.from_json(wrong.to_json(), ep, canon)
    bad = Kernel(KernelKind.EOP, {}, ("x0",), ep.outputs[0], None, (), (1, 2))
    broken = regions.RegionOutcome([bad], ep.outputs, "x", [], 1.0, 1.0, 0, [], [])
    with pytest.raises((FormatError, ValueError, TypeError, KeyError)):
        regions.RegionOutcome.from_json(broken.to_json(), ep, canon)


def test_a_kept_region_is_one_switch_of_the_context_step(ollie_settings, monkeypatch):
    """The whole-program steps switch a kept region by its decision key: on, the program
    runs the merged kernels; off, every node of the region runs as its original operator."""
    from ollie.exec.executor import CompiledProgram
    from ollie.optimizer.config import OptimizeConfig
    from ollie.optimizer.model import _Optimizer
    from ollie.passes.postprocess import postprocess

    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _script(monkeypatch, 0.5)
    m, x = _block()
    graph = to_graph(m, (x,))
    opt = _Optimizer(graph, OptimizeConfig(**FAST), None)
    opt.run()
    (group,) = [g for g in opt.groups() if len(g.nodes) > 1]
    assert group.nodes == ("conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "add")
    assert group.key.startswith("region|") and group.saving_s == pytest.approx(0.5e-3)
    with torch.no_grad():
        want = m(x)
    feed = {graph.input_names[0]: x}
    for on, merged in ((frozenset({group.key}), True), (frozenset(), False)):
        prog = postprocess(opt.assemble(on))
        got = CompiledProgram(prog).run(feed)[graph.outputs[0]]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        joined = [k for k in prog.kernels if k.kind is KernelKind.CONV and k.params["c"] == 8]
        assert bool(joined) == merged


def test_split_parts_with_offset_ranges_are_not_materialised() -> None:
    """Kernels store every tensor from index 0: a split def's upper part (``L<i=2:4>``) as a
    tensor of its own would be read out of bounds, so no such program is derived."""
    ep = parse_program("""x0: [4, 6]
x1: [6, 5]
x2: [5, 3]
y0 = L<i=0:4, j=0:5> Sum<k=0:6> x0[i, k] * x1[k, j]
y1 = L<i=0:4, j=0:3> Sum<k=0:5> y0[i, k] * x2[k, j]
out y1""")
    with assume_finite_inputs():
        steps = apply_program_rules(regions.normalized(ep), regions.RULE_ORDER)
    assert any(it.lo for d in steps for _, e in d.program.defs for it in e.root.traversal)
    for prog, _ in regions.derived_programs(ep):
        assert all(it.lo == 0 for _, e in prog.defs for it in e.root.traversal)


def test_a_region_decision_is_reused_whatever_share_of_the_budget_it_had(
        ollie_settings, monkeypatch, tmp_path):
    """A region's cached decision is keyed by the configured search budget, not by the share
    of a total budget it was derived in (which differs between a cold and a warm run)."""
    from ollie.optimizer.budget import Budget

    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock, cache_dir=tmp_path)
    _script(monkeypatch, 2.0)
    decided: list[float] = []
    real = regions._decide

    def counting(*args, **kwargs):
        decided.append(args[8].seconds)  # its time budget
        return real(*args, **kwargs)

    monkeypatch.setattr(regions, "_decide", counting)
    share = [1.0]
    monkeypatch.setattr(Budget, "share", lambda self: share[0])
    m, x = _block()
    cfg = {**FAST, "use_cache": True, "total_budget": 1000.0}
    ollie.optimize(m, x, **cfg)
    assert decided and set(decided) == {1.0}
    share[0] = 1.5  # another share of the total, as in a warm run
    again = ollie.optimize(m, x, **cfg)
    assert set(decided) == {1.0}  # nothing decided again
    assert any(n.startswith("region conv2d") for n in again.notes)
    _close(again, m, x)


class GatedPair(torch.nn.Module):
    """Two 1x1 convolutions around a residual add, then hardswish (MobileNetV3's pattern):
    the hardswish gate's scale and shift are 0-d constants of the model, and [1] tensors in
    the region's expressions."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(8, 8, 1), torch.nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.hardswish(self.b(self.a(x) + x))


def test_a_region_reading_scalar_constants_is_derived(ollie_settings):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    torch.manual_seed(0)
    m, x = GatedPair().eval(), torch.randn(1, 8, 6, 6)
    opt = ollie.optimize(m, x, **FAST)
    notes = [n for n in opt.notes if n.startswith("region ")]
    assert notes and not any("Error" in n for n in notes), opt.notes
    with torch.no_grad():
        torch.testing.assert_close(opt(x), m(x), rtol=1e-4, atol=1e-5)
