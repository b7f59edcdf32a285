"""Matrix products through the fastest library (ollie.exec.linear): every implementation
agrees with torch.matmul, the choice is remembered per configuration, and a program's Matmul
kernel uses it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ollie.exec import linear
from ollie.testing.clock import FakeClock
from ollie.tune import choice

pytestmark = pytest.mark.skipif(not linear.available(), reason="no oneDNN matmul in this torch")


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 40),
       n=st.one_of(st.integers(1, 40), st.sampled_from([16, 32, 48])),
       batch=st.sampled_from([(), (1,), (3,)]), transposed=st.booleans(),
       bias=st.booleans(), act=st.sampled_from([None, "relu", "tanh"]),
       constant=st.sampled_from([(False, False), (False, True), (True, False)]))
def test_every_implementation_matches_torch(m, k, n, batch, transposed, bias, act, constant):
    a = torch.randn(*batch, m, k)
    b = torch.randn(n, k).t() if transposed else torch.randn(k, n)  # a strided operand too
    c = torch.randn(n) if bias else None
    want = torch.matmul(a, b) + (c if bias else 0)
    want = linear.ACTIVATIONS[act](want)
    impls = linear.implementations(a, b, c, act, constant)
    assert "MKL" in impls and "oneDNN" in impls
    assert ("oneDNN transposed" in impls) == (batch in ((), (1,)) and not bias)
    assert ("MKL transposed" in impls) == (batch in ((), (1,)))
    # a constant operand (a weight) is also offered packed once
    assert ("oneDNN packed" in impls) == constant[1]
    assert ("blocked" in impls) == (constant[1] and n % 16 == 0)
    assert ("oneDNN packed transposed" in impls) == \
        (constant[0] and batch in ((), (1,)) and not bias)
    for _ in range(2):  # the packed ones pack on their first call, then reuse it
        for name, fn in impls.items():
            got = fn(a, b).reshape(want.shape)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)


def test_a_packed_product_uses_the_constant_it_was_built_with():
    """The packed implementations read their constant operand once: they are offered only
    for an operand the caller declares constant (a weight), never for a computed one."""
    a, b = torch.randn(4, 8), torch.randn(8, 5)
    fn = linear.implementations(a, b, constant=(False, True))["oneDNN packed"]
    torch.testing.assert_close(fn(a, b), a @ b, rtol=1e-4, atol=1e-4)
    # the packed copy is what it multiplies by: another right operand is not read
    torch.testing.assert_close(fn(a, torch.zeros(8, 5)), a @ b, rtol=1e-4, atol=1e-4)
    assert "oneDNN packed" not in linear.implementations(a, b)


def test_batched_right_operand_only_runs_on_mkl():
    a, b = torch.randn(3, 5, 4), torch.randn(3, 4, 6)
    assert set(linear.implementations(a, b)) == {"MKL"}
    name, fn = linear.best_product(a, b)
    assert name == "MKL"
    torch.testing.assert_close(fn(a, b), a @ b)


def test_best_product_measures_once_and_remembers(monkeypatch, ollie_settings):
    # equal samples on a ticking fake clock: the measurement does not depend on the machine
    # (tests/conftest.py's QUIET settings also keep a spread from counting as load)
    ollie_settings(measure_clock=FakeClock(tick=2.0 ** -10))
    a, b = torch.randn(64, 96), torch.randn(96, 80)
    timed: list[int] = []
    real = choice.Choices.fastest

    def spy(self, impls, *args, **kw):
        timed.append(1)
        return real(self, impls, *args, **kw)

    monkeypatch.setattr(choice.Choices, "fastest", spy)
    name, fn = linear.best_product(a, b)
    torch.testing.assert_close(fn(a, b).reshape(64, 80), a @ b, rtol=1e-4, atol=1e-4)
    again, _ = linear.best_product(torch.randn(64, 96), torch.randn(96, 80))
    assert again == name and len(timed) == 1
    forced, _ = linear.best_product(a, b, prefer="MKL")
    assert forced == "MKL"


def test_a_wrong_implementation_is_never_chosen(monkeypatch):
    """An implementation that disagrees with torch.matmul is dropped before timing."""
    real = linear.implementations

    def broken(a, b, bias=None, activation=None, constant=(False, False), policy=None):
        impls = real(a, b, bias, activation, constant, policy)
        impls["oneDNN"] = lambda x, y: torch.matmul(x, y) + 1.0
        for name in ("oneDNN transposed", "MKL transposed"):
            impls.pop(name, None)
        return impls

    monkeypatch.setattr(linear, "implementations", broken)
    a, b = torch.randn(7, 33), torch.randn(33, 9)
    name, fn = linear.best_product(a, b)
    assert name == "MKL"
    torch.testing.assert_close(fn(a, b), a @ b)


def test_program_matmul_kernel_runs_through_best_product(monkeypatch):
    """A CPU Matmul kernel with a constant operand goes through best_product and still
    matches the reference interpreter."""
    import ollie
    from ollie.exec.executor import CompiledProgram
    from ollie.program.program import Program
    from ollie.semantics import interpret
    from ollie.testing.clock import stopped_clock

    used: list[str] = []
    real = linear.best_product

    def spy(a, b, *args, **kw):
        name, fn = real(a, b, *args, **kw)
        used.append(name)
        constant.append(kw.get("constant"))
        return name, fn

    constant: list[object] = []

    monkeypatch.setattr(linear, "best_product", spy)
    expr = ollie.parse("A: [12, 20]\nB: [20, 16]\nL<i=0:12, j=0:16> Sum<k=0:20> A[i, k] * B[k, j]")
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}
    res = ollie.derive(expr, max_depth=1, time_budget=5, clock=stopped_clock)
    cand = next(c for c in res.candidates if [k.kind for k in c.kernels] == ["Matmul"])
    prog = Program((("A", (12, 20)),), (cand.output,), list(cand.kernels), {"B": inputs["B"]})
    out = CompiledProgram(prog, "cpu").run({"A": inputs["A"]})[cand.output]
    np.testing.assert_allclose(out.numpy(), interpret(expr, inputs), rtol=1e-4, atol=1e-4)
    assert used
    assert constant == [(False, True)]  # B is a weight: it may be packed once


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias_shape", [None, (1,), (24,)])
@pytest.mark.parametrize("act,residual", [(None, False), ("relu", False), ("relu", True)])
def test_gemm_node_runner_matches_the_graph_executor(trans_b, bias_shape, act, residual):
    from ollie.graph.execute import _gemm

    attrs = {"alpha": 0.5, "beta": 2.0, "transA": 0, "transB": trans_b}
    w = torch.randn(24, 40) if trans_b else torch.randn(40, 24)
    b = torch.randn(bias_shape) if bias_shape else None
    run = linear.node_runner("Gemm", attrs, w, b, activation=act, residual=residual)
    assert run is not None
    x, r = torch.randn(6, 40), torch.randn(6, 24)
    want = _gemm([x, w] + ([b] if b is not None else []), attrs)[0]
    want = linear.ACTIVATIONS[act](want + r if residual else want)
    got = run(x, r) if residual else run(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_node_runner_declines_what_it_does_not_cover():
    w = torch.randn(8, 4)
    assert linear.node_runner("Conv2d", {}, w, None) is None
    assert linear.node_runner("Gemm", {"transA": 1}, w, None) is None
    assert linear.node_runner("Gemm", {}, w, torch.randn(3, 4)) is None  # full-matrix bias
    assert linear.node_runner("MatMul", {}, torch.randn(2, 8, 4), None) is None
    run = linear.node_runner("MatMul", {}, w, None)
    x = torch.randn(2, 5, 8)  # a batch of rows through a 2-D weight
    torch.testing.assert_close(run(x), x @ w, rtol=1e-4, atol=1e-4)


def test_operands_with_nan_fall_back_to_mkl_without_fixing_the_choice():
    """NaN operands make every other implementation fail its check against torch.matmul:
    MKL computes (NaN where torch puts it), and the configuration is not remembered."""
    a, b = torch.randn(33, 17), torch.randn(17, 29)
    a[3, 4] = float("nan")
    key = ("matmul", tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), True, None)
    choice.shared().forget(key)
    name, fn = linear.best_product(a, b)
    assert name == "MKL" and key not in choice.shared()
    torch.testing.assert_close(fn(a, b), a @ b, equal_nan=True)


@pytest.mark.parametrize("act", [None, "relu", "tanh", "sigmoid"])
def test_every_implementation_keeps_nan_and_infinities_where_torch_does(act):
    """oneDNN's ReLU post-op gives 0 for NaN; the products apply ReLU by torch instead."""
    torch.manual_seed(3)
    a, b, c = torch.randn(6, 7), torch.randn(7, 16), torch.randn(16)
    a[1, 2], a[3, 0], a[4, 5] = float("nan"), float("inf"), -float("inf")
    want = linear.ACTIVATIONS[act](torch.matmul(a, b) + c)
    assert torch.isnan(want).any()
    for name, fn in linear.implementations(a, b, c, act, (False, True)).items():
        got = fn(a, b).reshape(want.shape)
        for f in (torch.isnan, torch.isposinf, torch.isneginf):
            assert torch.equal(f(got), f(want)), (name, f.__name__)


def test_a_remembered_choice_computes_the_first_calls_product_once(monkeypatch,
                                                                    ollie_settings) -> None:
    """A runner's first call checks the remembered implementation against torch.matmul on
    its operands and returns that checked product: the chosen implementation runs once, not
    once for the check and again for the output. With the settings' ``check_choices`` off,
    nothing checks it."""
    table: dict = {}
    ollie_settings(choices=table, measure_clock=FakeClock(tick=2.0 ** -10))
    real = linear.implementations
    calls: Counter[str] = Counter()

    def counting(*args, **kwargs):
        def counted(name, fn):
            def run(x, y):
                calls[name] += 1
                return fn(x, y)
            return run
        return {n: counted(n, f) for n, f in real(*args, **kwargs).items()}

    monkeypatch.setattr(linear, "implementations", counting)
    torch.manual_seed(4)
    w, x = torch.randn(16, 32), torch.randn(5, 16)
    want = x @ w
    torch.testing.assert_close(linear.node_runner("MatMul", {}, w, None)(x), want,
                               rtol=1e-4, atol=1e-4)  # measured, then remembered
    (key,) = table
    other = next(n for n in calls if n != "MKL")
    table[key] = other
    calls.clear()
    run = linear.node_runner("MatMul", {}, w, None)
    torch.testing.assert_close(run(x), want, rtol=1e-4, atol=1e-4)
    assert calls == {"MKL": 1, other: 1}  # the check's reference, and the chosen one once
    torch.testing.assert_close(run(x), want, rtol=1e-4, atol=1e-4)
    assert calls == {"MKL": 1, other: 2}
    # with the settings' check_choices off (a recalled program's first run, whose outputs
    # are checked instead) a new runner uses the remembered implementation unchecked
    calls.clear()
    ollie_settings(check_choices=False)
    torch.testing.assert_close(linear.node_runner("MatMul", {}, w, None)(x), want,
                               rtol=1e-4, atol=1e-4)
    assert calls == {other: 1}
