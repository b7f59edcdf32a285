"""Sibling merging end to end: the Q/K/V projections of an attention layer (the zoo
Longformer and a small hand-written attention module) are merged into one subprogram, checked
against the reference interpreter on every output, measured against the members as they run
alone, and kept only when faster; either way the optimised program computes what the module
does.

Measurement runs on a stopped clock (every time 0: the merge is then not faster, and not
kept); to test the kept path, the measured times of the merged programs are replaced after
the real selection (which did verify them), so no assertion depends on the machine's speed.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import ollie
from ollie.commands.optimize import add_arguments, explain
from ollie.graph.siblings import sibling_groups
from ollie.optimizer import region
from ollie.optimizer.importing import to_graph
from ollie.optimizer.report import load
from ollie.testing.clock import stopped_clock

FAST = dict(max_depth=0, time_budget=2.0, use_cache=False, context=False,
            choose_libraries=False, settle=0)
QKV = ["linear_mm", "linear_1_mm", "linear_2_mm"]


class _Attention(nn.Module):
    """Q/K/V projections of one input, scores, softmax, weighted values."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        return torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v


def _attention() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _Attention().eval(), torch.randn(1, 8, 16)


def _merge_times(monkeypatch, factor: float) -> None:
    """Selections of merged programs measure the fastest Matmul program at ``factor`` x the
    members' time, the others 1% slower each (in the search's order)."""
    real = region.select_program

    def timed(*args, **kwargs):
        sel = real(*args, **kwargs)
        # the scripted times replace the measured ones, their per-round samples included
        sel.baseline.seconds, sel.baseline.samples = 1e-3, []
        sel.unconfirmed = False
        ranked = sorted(sel.measured, key=lambda m: "Matmul" not in m.label)
        for i, m in enumerate(ranked):
            m.seconds, m.samples = factor * 1e-3 * (1 + 0.01 * i), []
        return sel

    monkeypatch.setattr(region, "select_program", timed)


def _close(opt, module, x) -> None:
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(opt(x), want, rtol=1e-4, atol=1e-5)


def test_sibling_groups_of_attention_and_longformer():
    m, x = _attention()
    assert [[n.name for n in g] for g in sibling_groups(to_graph(m, x))] == [QKV]
    lf, lx = ollie.zoo.get("longformer", seq=32, width=4, dilation=2)
    assert [[n.name for n in g] for g in sibling_groups(to_graph(lf, lx))] == [QKV]


def test_siblings_need_one_input_and_one_function():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 6)  # other weight shape
            self.c = nn.Linear(8, 4)  # reads another activation

        def forward(self, x):
            return self.a(x).sum() + self.b(x).sum() + self.c(torch.relu(x)).sum()

    m = Mixed().eval()
    assert sibling_groups(to_graph(m, torch.randn(2, 8))) == []


def test_merge_verified_but_not_faster_keeps_each_decision(ollie_settings):
    """On a stopped clock the merged programs are verified, measured no faster than the
    members, and not kept: every member keeps its own report entry and decision."""
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    m, x = _attention()
    opt = ollie.optimize(m, x, **FAST)
    assert [r.nodes for r in opt.report[:3]] == [[n] for n in QKV]
    note = next(n for n in opt.notes if n.startswith("siblings linear_mm"))
    assert "program(s) verified" in note and "not kept" in note, note
    assert "Matmul" in note
    _close(opt, m, x)


def test_merge_kept_when_faster(ollie_settings, monkeypatch, tmp_path):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _merge_times(monkeypatch, 0.5)
    m, x = _attention()
    opt = ollie.optimize(m, x, **FAST)
    merged = [r for r in opt.report if len(r.nodes) > 1]
    assert len(merged) == 1
    r = merged[0]
    assert r.nodes == QKV and r.node == QKV[0] and r.op == "MatMul x3"
    assert r.derivation[0] == "expression_merging"
    assert r.optimized_ms == pytest.approx(0.5) and r.original_ms == pytest.approx(1.0)
    assert not any(e.node in QKV[1:] for e in opt.report)
    assert "nodes: linear_mm, linear_1_mm, linear_2_mm" in opt.summary()
    lines = explain(opt.report).splitlines()
    at = lines.index("linear_mm (MatMul x3): nodes linear_mm, linear_1_mm, linear_2_mm")
    assert lines[at + 1] == "  inter-expression: expression_merging"
    assert lines[at + 2].startswith("  derivation: ")
    assert "expression_merging" not in lines[at + 2]
    assert any(n.startswith("checked against the original model") for n in opt.notes)
    _close(opt, m, x)
    # the report round-trips, and a report saved before `nodes` existed still loads
    opt.save(tmp_path)
    assert load(tmp_path).report[0].nodes == QKV
    doc = json.loads((tmp_path / "report.json").read_text())
    for e in doc["report"]:
        del e["nodes"]
    (tmp_path / "report.json").write_text(json.dumps(doc))
    assert load(tmp_path).report[0].nodes == [QKV[0]]


def test_merge_rejected_when_slower(ollie_settings, monkeypatch):
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _merge_times(monkeypatch, 2.0)
    m, x = _attention()
    opt = ollie.optimize(m, x, **FAST)
    assert all(len(r.nodes) == 1 for r in opt.report)
    assert any("not kept" in n for n in opt.notes)
    _close(opt, m, x)


def test_longformer_qkv_merged_into_one_subprogram(ollie_settings, monkeypatch):
    """The zoo Longformer (w 4, d 2, seq 32): the Q/K/V projections become one subprogram,
    one Matmul with n = 3 x 512, checked against the module with the whole program."""
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock)
    _merge_times(monkeypatch, 0.5)
    m, (x,) = ollie.zoo.get("longformer", seq=32, width=4, dilation=2)
    opt = ollie.optimize(m, (x,), **FAST)
    r = next(r for r in opt.report if len(r.nodes) > 1)
    assert r.nodes == QKV and r.op == "MatMul x3"
    assert r.derivation[0] == "expression_merging" and r.chosen.startswith("Matmul")
    assert any(n.startswith("checked against the original model") for n in opt.notes)
    assert not any("falling back" in n for n in opt.notes), opt.notes
    products = [k for k in opt.program.kernels if k.kind == "Matmul"]
    assert [k.params.n for k in products if k.params.n > 512] == [1536], \
        [k.params for k in products]
    _close(opt, m, x)


def test_cli_optimize_accepts_explain():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["zoo:longformer", "--explain"]).explain
    assert not p.parse_args(["zoo:longformer"]).explain


def test_merge_decision_cached(ollie_settings, monkeypatch, tmp_path):
    """A kept merge is reused from the decision cache: no search the second time."""
    ollie_settings(search_clock=stopped_clock, measure_clock=stopped_clock, cache_dir=tmp_path)
    _merge_times(monkeypatch, 0.5)
    m, x = _attention()
    cfg = {**FAST, "use_cache": True}
    first = ollie.optimize(m, x, **cfg)
    assert first.report[0].nodes == QKV

    def no_search(*args, **kwargs):
        raise AssertionError("searched again")

    monkeypatch.setattr(region, "derive", no_search)
    second = ollie.optimize(m, x, **cfg)
    assert second.report[0].nodes == QKV and second.report[0].chosen == first.report[0].chosen
    assert second.report[0].derivation[0] == "expression_merging"
    _close(second, m, x)


def test_select_program_checks_every_output():
    """A merged program is rejected when any one of its outputs disagrees with the reference
    interpreter (here the last two slices swapped), not only its first."""
    import numpy as np

    from ollie.ir import rename_expr
    from ollie.match.eop import make_eop
    from ollie.optimizer.select import select_program
    from ollie.passes.postprocess import postprocess
    from ollie.program.program import Program
    from ollie.rules.inter import merge_expressions

    text = "A: [4, 6]\n{w}: [6, 5]\nL<m=0:4, n=0:5> Sum<k=0:6> A[m, k] * {w}[k, n]"
    names = ("Wq", "Wk", "Wv")
    exprs = [ollie.parse(text.format(w=w)) for w in names]
    merged, slices = merge_expressions(exprs, [(w,) for w in names], "inner")
    cand = ollie.derive(merged, max_depth=0, time_budget=5, clock=stopped_clock).candidates[0]
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in merged.decls}
    ys = ("y0", "y1", "y2")

    def program(order):
        sliced = [make_eop(rename_expr(slices[j], {"merged": cand.output}).root,
                           {cand.output: merged.shape}, y) for y, j in zip(ys, order, strict=True)]
        prog = Program((("A", (4, 6)),), ys, [*cand.kernels, *sliced],
                       {w: inputs[w] for w in names})
        return cand, postprocess(prog)

    sel = select_program(dict(zip(ys, exprs, strict=True)),
                         [program((0, 1, 2)), program((0, 2, 1))],
                         lambda: None, inputs, clock=stopped_clock)
    assert len(sel.measured) == 1 and len(sel.rejected) == 1
    assert "error" in sel.rejected[0]
