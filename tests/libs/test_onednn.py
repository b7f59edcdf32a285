"""The packed oneDNN convolution (weights re-laid out once) agrees with conv2d, and programs
whose Conv kernels have constant weights use it and still match the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ollie
from ollie.exec import conv as conv_choice
from ollie.exec.executor import CompiledProgram
from ollie.libs import onednn
from ollie.optimizer.select import candidate_program
from ollie.semantics.check import random_inputs
from ollie.settings import using
from ollie.testing.clock import FakeClock, stopped_clock
from ollie.tune import choice

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize(("n", "c", "h", "w", "f", "r", "s", "stride", "pad", "dil"), [
    (1, 3, 9, 7, 4, 3, 3, (1, 1), (1, 1), (1, 1)),
    (2, 5, 11, 10, 6, 5, 3, (2, 1), (2, 0), (1, 1)),
    (1, 4, 12, 12, 3, 3, 3, (1, 1), (2, 2), (2, 2)),
    (3, 2, 6, 5, 7, 1, 1, (1, 1), (0, 0), (1, 1)),
])
def test_packed_conv_matches_conv2d(n, c, h, w, f, r, s, stride, pad, dil):
    torch.manual_seed(0)
    x, wt, b = torch.randn(n, c, h, w), torch.randn(f, c, r, s), torch.randn(f)
    conv = onednn.packed_conv2d(wt, (n, c, h, w), stride, pad, dil, bias=b)
    assert conv is not None
    want = F.conv2d(x, wt, b, stride=stride, padding=pad, dilation=dil)
    torch.testing.assert_close(conv(x), want, rtol=1e-4, atol=1e-4)
    # a non-contiguous input of the right shape is accepted
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)
    torch.testing.assert_close(conv(xt), want, rtol=1e-4, atol=1e-4)


def test_packed_conv_declines_what_it_cannot_run():
    assert onednn.packed_conv2d(torch.randn(2, 2, 3, 3, dtype=torch.float64), (1, 2, 5, 5),
                                (1, 1), (1, 1), (1, 1)) is None


@needs_onednn
def test_program_with_constant_conv_weight_uses_the_packed_path(monkeypatch):
    expr = ollie.parse("A: [2, 6, 9, 9]\nK: [5, 6, 3, 3]\n"
                       "L<n=0:2, f=0:5, h=0:9, w=0:9> Sum<c=0:6, r=0:3, s=0:3> "
                       "A[n, c, h+r-1, w+s-1] * K[f, c, r, s]")
    inputs = random_inputs(expr, seed=3)
    want = ollie.interpret(expr, inputs)
    res = ollie.derive(expr, max_depth=0, time_budget=20, clock=stopped_clock)
    convs = [c for c in res.candidates if any(k.kind == "Conv" for k in c.kernels)]
    assert convs
    built: list[tuple] = []
    real = onednn.packed_conv2d

    def spy(*args, **kwargs):
        conv = real(*args, **kwargs)
        built.append(args[1])
        return conv

    monkeypatch.setattr(onednn, "packed_conv2d", spy)
    for cand in convs:
        prog = candidate_program(cand, expr, {"K": inputs["K"]})
        got = CompiledProgram(prog).run({"A": inputs["A"]})[prog.outputs[0]].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    assert built  # at least one Conv kernel packed its constant weight


@needs_onednn
@pytest.mark.parametrize(("stride", "pad", "opad", "dil"), [
    ((2, 2), (1, 1), (0, 0), (1, 1)), ((3, 2), (0, 1), (1, 0), (1, 1)),
    ((1, 1), (2, 2), (0, 0), (2, 1))])
def test_packed_conv_transpose_matches_conv_transpose2d(stride, pad, opad, dil):
    torch.manual_seed(1)
    x, wt, b = torch.randn(2, 6, 5, 4), torch.randn(6, 3, 4, 3), torch.randn(3)
    conv = onednn.packed_conv_transpose2d(wt, tuple(x.shape), stride, pad, opad, dil, bias=b)
    assert conv is not None
    want = F.conv_transpose2d(x, wt, b, stride, pad, opad, 1, dil)
    torch.testing.assert_close(conv(x), want, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_node_runner_packs_per_input_shape_and_declines_other_nodes():
    torch.manual_seed(2)
    wt, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    attrs = {"padding": [1, 1, 1, 1], "stride": [1, 1], "dilation": [1, 1], "groups": 1}
    run = conv_choice.node_runner("Conv2d", attrs, wt, b)
    assert run is not None
    for shape in [(1, 3, 8, 8), (2, 3, 5, 7), (1, 3, 8, 8)]:
        x = torch.randn(shape)
        torch.testing.assert_close(run(x), F.conv2d(x, wt, b, padding=1), rtol=1e-4,
                                   atol=1e-4)
    assert conv_choice.node_runner("Relu", {}, wt, None) is None
    asym = {"padding": [1, 1, 0, 0]}
    assert conv_choice.node_runner("Conv2d", asym, wt, b) is None


@needs_onednn
def test_models_with_convolutions_still_match_after_optimisation():
    """End to end: the optimised program (whose original convolutions now run packed) agrees
    with the module."""
    from torch import nn

    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                      nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.Tanh()).eval()
    x = torch.randn(1, 3, 6, 6)
    prog = ollie.optimize(m, (x,), "cpu", time_budget=5.0, max_depth=0, guided_depth=2,
                          use_cache=False, settle=0.0)
    with torch.inference_mode():
        torch.testing.assert_close(prog(x), m(x), rtol=1e-3, atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid"])
def test_packed_convolutions_apply_activation_post_ops(act):
    torch.manual_seed(4)
    f = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[act]
    x, wt, b = torch.randn(2, 3, 7, 6), torch.randn(5, 3, 3, 3), torch.randn(5)
    conv = onednn.packed_conv2d(wt, tuple(x.shape), (1, 1), (1, 1), (1, 1), b,
                                activation=act)
    assert conv is not None
    torch.testing.assert_close(conv(x), f(F.conv2d(x, wt, b, padding=1)), rtol=1e-4,
                               atol=1e-4)
    wt2 = torch.randn(3, 4, 4, 4)
    convt = onednn.packed_conv_transpose2d(wt2, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                           (1, 1), None, activation=act)
    assert convt is not None
    torch.testing.assert_close(convt(x), f(F.conv_transpose2d(x, wt2, None, 2, 1)),
                               rtol=1e-4, atol=1e-4)
    assert onednn.packed_conv2d(wt, tuple(x.shape), (1, 1), (1, 1), (1, 1),
                                activation="gelu-ish") is None


@needs_onednn
@pytest.mark.parametrize("act,residual", [(None, False), ("relu", False), ("tanh", False),
                                          ("sigmoid", False), (None, True), ("relu", True)])
def test_packed_convolutions_keep_nan_and_infinities_where_torch_does(act, residual):
    """oneDNN's ReLU post-op gives 0 for NaN: the packed convolutions apply ReLU by torch
    after the primitive, so that a NaN in the input reaches the output as in the model."""
    torch.manual_seed(5)
    f = onednn.POST_OPS[act]
    x = onednn.with_nonfinite(torch.randn(2, 3, 7, 6))
    wt, b = torch.randn(5, 3, 3, 3), torch.randn(5)
    r = torch.randn(2, 5, 7, 6)
    conv = onednn.packed_conv2d(wt, tuple(x.shape), (1, 1), (1, 1), (1, 1), b,
                                activation=act, residual=residual)
    assert conv is not None
    y = F.conv2d(x, wt, b, padding=1)
    want = f(y + r) if residual else f(y)
    got = conv(x, r) if residual else conv(x)
    assert torch.isnan(want).any() and onednn.same_nonfinite(got, want)
    args = (x, r) if residual else (x,)
    if onednn.writes_into(conv):  # into a buffer too
        assert onednn.same_nonfinite(conv(*args, out=torch.full(want.shape, 7.0)), want)
    if not residual:
        wt2 = torch.randn(3, 4, 4, 4)
        convt = onednn.packed_conv_transpose2d(wt2, tuple(x.shape), (2, 2), (1, 1), (0, 0),
                                               (1, 1), None, activation=act)
        assert convt is not None
        assert onednn.same_nonfinite(convt(x), f(F.conv_transpose2d(x, wt2, None, 2, 1)))


def test_a_convolution_that_drops_nan_is_not_used():
    """The check each implementation passes when built runs it on an input holding NaN and
    infinities too: one that gives finite values there (oneDNN's own ReLU post-op) fails."""
    wt = torch.randn(4, 3, 3, 3)

    def ref(x):
        return torch.relu(F.conv2d(x, wt, padding=1))

    def drops(x):
        return torch.nan_to_num(ref(x), nan=0.0)

    assert onednn.checked(ref, ref, (1, 3, 6, 6)) is ref
    assert onednn.checked(drops, ref, (1, 3, 6, 6)) is None


def _kinds(prog):
    return [(k.kind, k.params.get("activation")) for k in prog.kernels]


def test_activation_eops_fold_into_the_convolutions_before_them():
    """With the original operators kept (no candidate measured), post-processing folds the
    ReLU / tanh after a Conv2d / ConvTranspose2d into it (a oneDNN post-op); the program still
    matches the module."""
    from torch import nn

    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                      nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.Tanh()).eval()
    x = torch.randn(1, 3, 6, 6)
    prog = ollie.optimize(m, (x,), "cpu", derivation=False,
                          use_cache=False, settle=0.0)
    with torch.inference_mode():
        torch.testing.assert_close(prog(x), m(x), rtol=1e-4, atol=1e-5)
    assert _kinds(prog.program) == [("Node", "relu"), ("Node", "tanh")]


def test_fuse_activations_on_a_conv_kernel_keeps_the_expression_exact():
    from ollie.passes.postprocess import activation_of, fuse_epilogues
    from ollie.program.kernel import Kernel
    from ollie.program.program import Program

    expr = ollie.parse("A: [1, 4, 6, 6]\nK: [5, 4, 3, 3]\n"
                       "L<n=0:1, f=0:5, h=0:6, w=0:6> Sum<c=0:4, r=0:3, s=0:3> "
                       "A[n, c, h+r-1, w+s-1] * K[f, c, r, s]")
    res = ollie.derive(expr, max_depth=0, time_budget=20, clock=stopped_clock)
    cand = next(c for c in res.candidates if [k.kind for k in c.kernels] == ["Conv"])
    conv = cand.kernels[0]
    relu = ollie.parse(f"{conv.output}: [1, 5, 6, 6]\n"
                       f"L<a=0:1, b=0:5, c=0:6, d=0:6> relu({conv.output}[a, b, c, d])")
    from ollie.match.eop import make_eop

    act = make_eop(relu.root, relu.inputs, "Y")
    assert activation_of(act, conv.output) == "relu"
    swapped = ollie.parse(f"{conv.output}: [1, 5, 6, 6]\n"
                          f"L<a=0:1, b=0:5, c=0:6, d=0:6> relu({conv.output}[a, b, d, c])")
    assert activation_of(make_eop(swapped.root, swapped.inputs, "Y"), conv.output) is None
    inputs = random_inputs(expr, seed=7)
    prog = Program((("A", (1, 4, 6, 6)),), ("Y",), [conv, act], {"K": inputs["K"]})
    fused = fuse_epilogues(prog)
    assert [(k.kind, k.params.get("activation")) for k in fused.kernels] == [("Conv", "relu")]
    k = fused.kernels[0]
    want = np.maximum(ollie.interpret(expr, inputs), 0)
    np.testing.assert_allclose(ollie.interpret(k.expr, inputs), want, rtol=1e-5, atol=1e-6)
    for consts in ({"K": inputs["K"]}, {}):  # packed oneDNN path, and conv2d + relu
        p = Program(tuple((n, s) for n, s in expr.decls if n not in consts), ("Y",),
                    [k], consts)
        feed = {n: inputs[n] for n, _ in p.inputs}
        got = CompiledProgram(p).run(feed)["Y"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert isinstance(k, Kernel) and k.without_activation().params.get("activation") is None


def _fake_timing(ollie_settings) -> FakeClock:
    """The measurements (``measure_alternating``) read a fake clock, returned: a function
    takes the time it advances the clock by."""
    clock = FakeClock()
    ollie_settings(measure_clock=clock)
    return clock


@pytest.mark.timing
def test_fastest_keeps_the_measured_fastest_callable_and_remembers_it(ollie_settings):
    clock = _fake_timing(ollie_settings)

    def slow(x):
        clock.advance(2.0 ** -9)
        return x + 1

    def quick(x):
        clock.advance(2.0 ** -12)
        return x + 1

    ollie_settings(choices={})
    shared = choice.shared()
    assert shared.fastest({"a": slow, "b": quick, "c": None}, (2, 2), key=("t", 1)) is quick
    assert shared.fastest({"a": quick, "b": slow}, (2, 2), key=("t", 2)) is quick
    # remembered per key by name: not measured again
    assert shared.fastest({"a": slow, "b": quick}, (2, 2), key=("t", 2)) is slow
    assert shared.fastest({"only": slow, "none": None}, (2, 2)) is slow


@needs_onednn
def test_packed_convolutions_chain_through_channels_last_outputs():
    torch.manual_seed(5)
    x = torch.randn(2, 6, 5, 5)
    w1, w2 = torch.randn(6, 8, 4, 4), torch.randn(4, 8, 3, 3)
    c1 = onednn.packed_conv_transpose2d(w1, tuple(x.shape), (2, 2), (1, 1), (0, 0), (1, 1),
                                        activation="relu")
    y = c1(x)
    c2 = onednn.packed_conv2d(w2, tuple(y.shape), (1, 1), (1, 1), (1, 1))
    want = F.conv2d(torch.relu(F.conv_transpose2d(x, w1, None, 2, 1)), w2, padding=1)
    torch.testing.assert_close(c2(y), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c2(y.contiguous(memory_format=torch.channels_last)), want,
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c2(y[:, :, :, :].transpose(2, 3).contiguous().transpose(2, 3)),
                               want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", [None, "relu", "tanh"])
def test_ort_convolutions_match_torch(act):
    from ollie.libs.ort_conv import ort_conv

    torch.manual_seed(6)
    f = onednn.POST_OPS[act]
    x, wt, b = torch.randn(2, 3, 7, 6), torch.randn(5, 3, 3, 3), torch.randn(5)
    conv = ort_conv("Conv2d", wt, b, tuple(x.shape), (1, 2), (1, 0), (1, 1), activation=act)
    assert conv is not None
    torch.testing.assert_close(conv(x), f(F.conv2d(x, wt, b, (1, 2), (1, 0))), rtol=1e-4,
                               atol=1e-4)
    wt2 = torch.randn(3, 4, 4, 4)
    convt = ort_conv("ConvTranspose2d", wt2, None, tuple(x.shape), (2, 2), (1, 1), (1, 1),
                     activation=act)
    assert convt is not None
    torch.testing.assert_close(convt(x), f(F.conv_transpose2d(x, wt2, None, 2, 1)),
                               rtol=1e-4, atol=1e-4)
    assert ort_conv("Conv2d", wt, b, tuple(x.shape), (1, 1), (1, 1), (1, 1),
                    activation="gelu") is None


def _recording(built: list[str]):
    """``builder(name, fn)``: a builder returning ``fn`` that records ``name`` in ``built``."""
    def builder(name, fn):
        def build():
            built.append(name)
            return fn
        return build
    return builder


@pytest.mark.timing
def test_fastest_of_builds_only_the_remembered_choice(ollie_settings):
    clock = _fake_timing(ollie_settings)
    built: list[str] = []
    builder = _recording(built)

    def slow(x):
        clock.advance(2.0 ** -9)
        return x

    def quick(x):
        clock.advance(2.0 ** -12)
        return x

    key = ("fastest_of", 1)
    b = {"slow": builder("slow", slow), "quick": builder("quick", quick),
         "none": builder("none", None)}
    assert choice.shared().fastest_of(b, (2,), key) is quick
    assert sorted(built) == ["none", "quick", "slow"]
    built.clear()
    assert choice.shared().fastest_of(b, (2,), key) is quick
    assert built == ["quick"]


def test_fastest_of_uses_a_preferred_implementation_without_measuring():
    built: list[str] = []
    builder = _recording(built)

    def a(x):
        return x

    def b(x):
        return x

    key = ("prefer", 1)
    assert choice.shared().fastest_of({"a": builder("a", a), "b": builder("b", b)}, (2,), key,
                             prefer="b") is b
    assert built == ["b"] and key not in choice.shared()
    # a preferred implementation that cannot be built: the measured choice
    built.clear()
    got = choice.shared().fastest_of({"a": builder("a", a), "b": builder("b", None)}, (2,), key,
                            prefer="b")
    assert got is a and set(built) == {"a", "b"}


@pytest.mark.parametrize("act", [None, "relu"])
def test_every_conv_implementation_adds_a_residual_before_its_activation(act):
    """oneDNN's binary add post-op, ONNX Runtime's fused Conv+Add and torch's conv + add_
    all compute f(conv(x) + r), whatever the memory formats of x and r."""
    from ollie.libs.ort_conv import ort_conv

    torch.manual_seed(8)
    f = onednn.POST_OPS[act]
    x, wt, b = torch.randn(2, 4, 7, 6), torch.randn(5, 4, 3, 3), torch.randn(5)
    r = torch.randn(2, 5, 7, 6)
    want = f(F.conv2d(x, wt, b, padding=1) + r)
    impls = {"ort": ort_conv("Conv2d", wt, b, tuple(x.shape), (1, 1), (1, 1), (1, 1),
                             activation=act, residual=True),
             "best": conv_choice.best_conv("Conv2d", wt, b, tuple(x.shape), (1, 1), (1, 1),
                                           (1, 1), activation=act, residual=True)}
    if onednn.available():
        impls["packed"] = onednn.packed_conv2d(wt, tuple(x.shape), (1, 1), (1, 1), (1, 1),
                                               bias=b, activation=act, residual=True)
    cl = torch.channels_last
    for name, conv in impls.items():
        assert conv is not None, name
        for xx, rr in [(x, r), (x.contiguous(memory_format=cl), r.contiguous(memory_format=cl))]:
            r_before = rr.clone()
            torch.testing.assert_close(conv(xx, rr), want, rtol=1e-4, atol=1e-4)
            assert torch.equal(rr, r_before), f"{name} wrote into its residual input"
    assert onednn.packed_conv_transpose2d(torch.randn(4, 3, 2, 2), (1, 4, 5, 5), (2, 2),
                                          (0, 0), (0, 0), (1, 1), residual=True) is None


def test_residual_blocks_fold_their_add_and_relu_into_the_second_convolution():
    """A ResNet basic block with the original operators kept: the skip addition and ReLU
    become the second convolution's residual input and post-op (one kernel fewer), the
    program still matches the module, and the saved program loads and runs the same."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(6, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.c2(torch.relu(self.c1(x))) + x)

    torch.manual_seed(4)
    m = Block().eval()
    x = torch.randn(2, 6, 9, 9)
    prog = ollie.optimize(m, (x,), "cpu", derivation=False,
                          use_cache=False, settle=0.0)
    with torch.inference_mode():
        want = m(x)
    torch.testing.assert_close(prog(x), want, rtol=1e-4, atol=1e-5)
    kinds = [(k.kind, k.params.get("activation"), bool(k.params.get("residual")))
             for k in prog.program.kernels]
    assert kinds == [("Node", "relu", False), ("Node", "relu", True)]
    assert prog.program.kernels[1].inputs[-1] == prog.program.inputs[0][0]
    assert any("1 residual epilogue(s) folded" in n for n in prog.notes), prog.notes
    ref = CompiledProgram(prog.program, backend="reference")
    torch.testing.assert_close(ref(x), want, rtol=1e-4, atol=1e-5)


def test_residual_of_recognises_only_whole_tensor_additions():
    from ollie.match.eop import make_eop
    from ollie.passes.postprocess import residual_of

    def eop(body: str):
        e = ollie.parse(f"C: [2, 3]\nR: [2, 3]\nL<i=0:2, j=0:3> {body}")
        return make_eop(e.root, e.inputs, "Y")

    assert residual_of(eop("relu(C[i, j] + R[i, j])"), "C") == ("R", "relu")
    assert residual_of(eop("R[i, j] + C[i, j]"), "C") == ("R", None)
    assert residual_of(eop("C[i, j] - R[i, j]"), "C") is None
    assert residual_of(eop("C[i, j] * R[i, j]"), "C") is None
    e = ollie.parse("C: [2, 3]\nR: [3, 2]\nL<i=0:2, j=0:3> C[i, j] + R[j, i]")
    assert residual_of(make_eop(e.root, e.inputs, "Y"), "C") is None


def test_bias_and_residual_fold_into_a_conv_kernel_and_stay_exact():
    """f(conv + bias[c] + r) after a Conv kernel with a constant weight becomes one kernel
    (bias and residual inputs, activation); its expression is the fused one (checked with the
    interpreter) and both runtime paths (library call with constants, plain conv2d without)
    agree with it. A bias that is not a constant keeps the eOperator."""
    from ollie.match.eop import make_eop
    from ollie.passes.postprocess import epilogue_of, fuse_epilogues
    from ollie.program.program import Program

    expr = ollie.parse("A: [2, 4, 6, 6]\nK: [5, 4, 3, 3]\n"
                       "L<n=0:2, f=0:5, h=0:6, w=0:6> Sum<c=0:4, r=0:3, s=0:3> "
                       "A[n, c, h+r-1, w+s-1] * K[f, c, r, s]")
    res = ollie.derive(expr, max_depth=0, time_budget=20, clock=stopped_clock)
    conv = next(c for c in res.candidates if [k.kind for k in c.kernels] == ["Conv"]).kernels[0]
    o = conv.output
    epi = ollie.parse(f"{o}: [2, 5, 6, 6]\nB: [5]\nR: [2, 5, 6, 6]\nB2: [5]\n"
                      f"L<a=0:2, b=0:5, c=0:6, d=0:6> "
                      f"relu(R[a, b, c, d] + {o}[a, b, c, d] + B[b] + B2[b])")
    tail = make_eop(epi.root, epi.inputs, "Y")
    assert epilogue_of(tail, o) == {"activation": "relu", "residual": "R", "bias": ["B", "B2"]}
    inputs = random_inputs(expr, seed=9)
    rng = np.random.default_rng(9)
    bias, bias2 = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5)
    bias2 = bias2.astype(np.float32)
    r = rng.standard_normal((2, 5, 6, 6)).astype(np.float32)
    pre = ollie.interpret(expr, inputs)
    want = np.maximum(pre + (bias + bias2)[None, :, None, None] + r, 0)
    prog = Program((("A", (2, 4, 6, 6)), ("R", (2, 5, 6, 6))), ("Y",), [conv, tail],
                   {"K": inputs["K"], "B": bias, "B2": bias2})
    fused = fuse_epilogues(prog)
    (k,) = fused.kernels
    assert k.kind == "Conv" and k.params["bias"] == 2 and k.params["residual"]
    assert k.params["activation"] == "relu" and k.inputs == (*conv.inputs, "B", "B2", "R")
    env = {"A": inputs["A"], "K": inputs["K"], "B": bias, "B2": bias2, "R": r}
    np.testing.assert_allclose(ollie.interpret(k.expr, env), want, rtol=1e-5, atol=1e-5)
    got = CompiledProgram(fused).run({"A": inputs["A"], "R": r})["Y"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    plain = Program((("A", (2, 4, 6, 6)), ("K", (5, 4, 3, 3)), ("B", (5,)), ("B2", (5,)),
                     ("R", r.shape)), ("Y",), [k], {})
    got = CompiledProgram(plain).run(env)["Y"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    not_const = Program((("A", (2, 4, 6, 6)), ("R", r.shape), ("B", (5,))), ("Y",),
                        [conv, tail], {"K": inputs["K"], "B2": bias2})
    assert len(fuse_epilogues(not_const).kernels) == 2


def test_node_runner_chooses_per_memory_format_and_matches_both(monkeypatch):
    """The implementation is chosen on the first call for each (shape, memory format): a
    channels-last input (a packed convolution's output) is timed as channels-last. (The
    choices asked for are counted, not those remembered: a choice measured while other work
    keeps the cores busy is not remembered.)"""
    torch.manual_seed(10)
    wt, b = torch.randn(6, 4, 3, 3), torch.randn(6)
    attrs = {"padding": [1, 1, 1, 1], "stride": [1, 1], "dilation": [1, 1], "groups": 1}
    run = conv_choice.node_runner("Conv2d", attrs, wt, b, activation="relu")
    x = torch.randn(2, 4, 7, 7)
    want = torch.relu(F.conv2d(x, wt, b, padding=1))
    asked: list = []
    real = choice.Choices.fastest_of

    def recording(self, builders, input_shape, key, *args, **kwargs):
        asked.append(key)
        return real(self, builders, input_shape, key, *args, **kwargs)

    monkeypatch.setattr(choice.Choices, "fastest_of", recording)
    with using(choices={}):  # none remembered yet
        for xx in (x, x.contiguous(memory_format=torch.channels_last)):
            torch.testing.assert_close(run(xx), want, rtol=1e-4, atol=1e-4)
    assert sorted(k[-1] for k in asked) == [False, True]  # one choice per memory format
    assert onednn.is_channels_last(x.contiguous(memory_format=torch.channels_last))
    assert not onednn.is_channels_last(x) and not onednn.is_channels_last(x[:, :1, :1])


def test_identity_views_keep_a_channels_last_input_as_it_is():
    """A library kernel reading its input through a view that only re-states the tensor's
    own shape gets the tensor itself (no NCHW copy of a channels-last convolution output);
    other views still read the logical element order."""
    from ollie.libs.tensors import kernel_input as _input
    from ollie.program.kernel import Kernel, View

    e = ollie.parse("A: [1, 4, 3, 3]\nL<n=0:1, c=0:4, h=0:3, w=0:3> A[n, c, h, w]")
    x = torch.randn(1, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    ident = View(0, (1, 4, 3, 3), (0, 9, 3, 1))
    conv = {"n": 1, "c": 4, "h": 3, "w": 3, "f": 4, "r": 1, "s": 1, "ph": 0, "pw": 0,
            "sh": 1, "sw": 1, "dh": 1, "dw": 1}  # (a Conv kernel's required parameters)
    k = Kernel("Conv", conv, ("A",), "Y", e, (ident,))
    assert _input(k, 0, {"A": x}) is x
    flip = View(0, (1, 4, 3, 3), (0, 9, 1, 3))  # transposed spatial dims
    k2 = Kernel("Conv", conv, ("A",), "Y", e, (flip,))
    torch.testing.assert_close(_input(k2, 0, {"A": x}), x.transpose(2, 3))


def test_selection_feeds_convolution_outputs_channels_last():
    """The model optimiser measures a subprogram whose input a kept convolution produces
    (through ReLU / Add / MaxPool) with that input channels-last, as the program will run
    it; the model's own input, and non-4-D tensors, stay as they are."""
    from torch import nn

    from ollie.optimizer.model import OptimizeConfig, _Optimizer, to_graph
    from ollie.optimizer.select import as_input

    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 1),
                      nn.Flatten(), nn.Linear(4 * 9, 2)).eval()
    g = to_graph(m, (torch.randn(1, 3, 8, 8),))
    opt = _Optimizer(g, OptimizeConfig(max_depth=0, max_candidates=0, use_cache=False,
                                       time_budget=2.0), None)
    opt.run()
    convs = [n for n in g.nodes if n.op == "Conv2d"]
    assert convs[0].inputs[0] not in opt.channels_last
    assert convs[1].inputs[0] in opt.channels_last
    assert all(len(g.shape(n)) == 4 for n in opt.channels_last)
    t = as_input(np.zeros((1, 4, 3, 3), np.float32), "cpu", True)
    assert onednn.is_channels_last(t)
    assert as_input(np.zeros((2, 3), np.float32), "cpu", True).is_contiguous()


@pytest.mark.parametrize("fn", ["tanh", "sigmoid"])
def test_transcendental_activation_after_an_eop_becomes_its_parameter(fn):
    """tanh / sigmoid after an eOperator become its ``activation`` parameter (torch applies
    sigmoid in place after the generated code; on the CPU the generated code computes tanh
    itself, ``ollie.exec.dispatch.GENERATED_ACTIVATIONS``); the kernel's expression stays
    f(inner) and the program matches it on both backends."""
    from ollie.match.eop import make_eop
    from ollie.passes.postprocess import fuse_eops
    from ollie.program.program import Program

    shift = ollie.parse("A: [3, 8]\nL<i=0:3, j=0:8> A[i, j - 1] + A[i, j + 1]")
    p = make_eop(shift.root, shift.inputs, "P")
    act = ollie.parse(f"P: [3, 8]\nL<i=0:3, j=0:8> {fn}(P[i, j])")
    c = make_eop(act.root, act.inputs, "Y")
    prog = fuse_eops(Program((("A", (3, 8)),), ("Y",), [p, c], {}))
    (k,) = prog.kernels
    assert k.kind == "eOp" and k.params["activation"] == fn
    a = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    ref = ollie.interpret(shift, {"A": a})
    want = np.tanh(ref) if fn == "tanh" else 1 / (1 + np.exp(-ref))
    np.testing.assert_allclose(ollie.interpret(k.expr, {"A": a}), want, rtol=1e-5, atol=1e-6)
    for backend in ("cpu", "reference"):
        got = CompiledProgram(prog, backend=backend).run({"A": a})["Y"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
