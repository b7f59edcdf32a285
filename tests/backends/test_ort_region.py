"""ONNX Runtime regions: runs of library operators found and marked, exported to one session
that matches the module and the kernels it replaces, kept through save / load; a region that
cannot be built or disagrees runs kernel by kernel; what cannot be exported ends a run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import ollie
from ollie.backends.onnxrt import region as ort_region
from ollie.exec.dispatch import plain_kernel
from ollie.exec.executor import CompiledProgram
from ollie.optimizer.libraries import CHOICES, REGIONS, LibraryDecision, choose_libraries
from ollie.optimizer.model import OptimizedModel
from ollie.program.kernel import Kernel
from ollie.program.program import Program
from ollie.testing.clock import stopped_clock
from ollie.testing.programs import original_program
from ollie.tune import choice

pytest.importorskip("onnxruntime")


class _Block(nn.Module):
    """conv + BN + ReLU, conv + BN, a strided 1x1 shortcut, residual add, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                               nn.BatchNorm2d(cout), nn.ReLU(),
                               nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = nn.Conv2d(cin, cout, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x) + self.skip(x))


def _net() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(7)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      _Block(8, 16, 2), nn.AvgPool2d(2), nn.Flatten(),
                      nn.Linear(16 * 3 * 3, 10)).eval()
    for mod in m.modules():  # non-trivial BatchNorm statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m, torch.randn(2, 3, 24, 24)


def _optimized(m: nn.Module, x: torch.Tensor) -> Program:
    """``m`` optimised with its original operators kept (no candidate measured): graph
    operators with the activations, biases and residual additions post-processing fused."""
    return ollie.optimize(m, (x,), "cpu", derivation=False, use_cache=False,
                          choose_libraries=False).program


def test_regions_match_the_module_and_survive_save_and_load(tmp_path):
    m, x = _net()
    prog = _optimized(m, x)
    marked = ort_region.mark_regions(prog)
    assert marked is not None
    runs = ort_region.groups(marked)
    assert runs == ort_region.spans(prog)
    for start, end in runs:
        run = marked.kernels[start:end]
        assert len(run) >= ort_region.MIN_KERNELS
        assert all(k.params["region"] == run[0].params["region"] for k in run)
        assert all(k.kind in ("Node", "Conv", "Matmul", "eOp", "Alias") for k in run)
    compiled = CompiledProgram(marked)
    assert any(compiled.in_region)  # the sessions were built and checked
    # a call runs each region once, at its first kernel; the region's other kernels are skipped
    assert compiled.followers == {i for a, b in runs for i in range(a + 1, b)}
    assert len(compiled.steps) == len(marked.kernels) - len(compiled.followers)
    with torch.inference_mode():
        want = m(x)
    torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)
    # a second call reuses the environment's buffers correctly
    torch.testing.assert_close(compiled(x * 2), m(x * 2), rtol=1e-4, atol=1e-4)
    OptimizedModel(marked, input_names=tuple(n for n, _ in marked.inputs)).save(tmp_path)
    loaded = ollie.load(tmp_path)
    assert [k.params.get("region") for k in loaded.program.kernels] == \
        [k.params.get("region") for k in marked.kernels]
    torch.testing.assert_close(loaded(x), want, rtol=1e-4, atol=1e-4)


def _spins(session: object) -> bool:
    opts = session.get_session_options()
    return opts.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_a_region_spins_only_when_it_holds_all_of_the_programs_compute():
    """A session whose threads busy-wait between runs would take the cores from compute
    kernels that run outside it; with all the compute inside, it spins as ONNX Runtime does by
    default (a sleeping pool pays to wake at every parallel section)."""
    m, x = _net()
    plain = _optimized(m, x)
    marked = ort_region.mark_regions(plain)
    assert marked is not None
    compute = [i for i, k in enumerate(marked.kernels)
               if k.params.get("op") in ("Conv2d", "Gemm")]
    runs = ort_region.groups(marked)
    assert runs and len(compute) >= 3
    for a, b in runs:
        assert ort_region.holds_all_compute(marked, a, b) == all(a <= i < b for i in compute)
    assert ort_region.holds_all_compute(marked, 0, len(marked.kernels))
    assert not ort_region.holds_all_compute(marked, compute[0], compute[-1])
    # the network's convolutions without its classifier: one region holding all the compute
    a, b = runs[0]

    def head(p: Program) -> Program:
        return Program(p.inputs, (p.kernels[b - 1].output,), p.kernels[:b], p.constants)

    constants = CompiledProgram(marked).constants
    for prog, ref, spinning in ((marked, plain, ort_region.holds_all_compute(marked, a, b)),
                                (head(marked), head(plain), True)):
        region = ort_region.build_region(prog, a, b, constants, plain_kernel)
        assert region is not None and region.spinning is spinning
        assert _spins(region.session) is spinning
        compiled = CompiledProgram(prog)
        assert compiled.spins is spinning and any(compiled.in_region)
        # the same kernels run one by one
        torch.testing.assert_close(compiled(x), CompiledProgram(ref)(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers", [
    # grouped, dilated, strided, asymmetric sizes
    [nn.Conv2d(4, 8, 3, stride=2, padding=2, dilation=2, groups=2), nn.Sigmoid(),
     nn.Conv2d(8, 6, (1, 3), padding=(0, 1))],
    # transposed convolutions with output padding, tanh, average pooling without the padding
    [nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1), nn.Tanh(),
     nn.ConvTranspose2d(6, 3, 3, stride=2, padding=1, output_padding=1),
     nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)],
    # max pooling with ceil mode between convolutions
    [nn.Conv2d(4, 5, 3), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(5, 2, 1)],
])
def test_operator_attributes_are_exported_exactly(layers):
    torch.manual_seed(11)
    m = nn.Sequential(*layers).eval()
    prog, feeds, want = original_program(m, torch.randn(2, 4, 11, 9))
    marked = ort_region.mark_regions(prog)
    assert marked is not None and len(ort_region.groups(marked)) == 1
    compiled = CompiledProgram(marked)
    assert all(compiled.in_region)
    got = compiled.run(feeds)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-4, atol=1e-5)


def test_what_ends_a_run():
    m, x = _net()
    prog, _, _ = original_program(m, x)
    shapes = prog.tensor_shapes()
    conv = next(k for k in prog.kernels if k.params.get("op") == "Conv2d")
    assert ort_region.exportable(conv, prog.constants, shapes)
    # the same convolution with its weight computed at run time
    assert not ort_region.exportable(conv, {}, shapes)
    x_name, (n, c, h, w) = conv.inputs[0], shapes[conv.inputs[0]]
    expr = ollie.parse(f"{x_name}: [{n}, {c}, {h}, {w}]\n"
                       f"L<n=0:{n}, c=0:{c}, h=0:{h}, w=0:{w}> {x_name}[n, c, h, w] * 2.0")
    # a memory-bound eOperator is part of a run; a compute-bound one ends it when its sum
    # is a product over its grid reduced (a ReduceSum)
    assert ort_region.exportable(Kernel("eOp", {"bound": "memory"}, (x_name,), "y", expr),
                                 prog.constants, shapes)
    summed = ollie.parse(f"{x_name}: [{n}, {c}, {h}, {w}]\nL<n=0:{n}, c=0:{c}, h=0:{h}, "
                         f"w=0:{w}> Sum<r=0:{c}> {x_name}[n, r, h, w] * {x_name}[n, c, h, w]")
    assert not ort_region.exportable(Kernel("eOp", {"bound": "compute"}, (x_name,), "y",
                                            summed), prog.constants, shapes)
    band = Kernel("G2BMM", {"b": 1, "m": 4, "w": 1, "k": 2, "d": 1}, ("q", "k"), "y",
                  ollie.parse("q: [1, 4, 2]\nk: [1, 4, 2]\n"
                              "L<b=0:1, i=0:4, j=0:3> Sum<p=0:2> q[b, i, p] * k[b, i + j - 1, p]"))
    assert not ort_region.exportable(band, prog.constants, {"q": (1, 4, 2), "k": (1, 4, 2)})
    # a run of one kernel is no region
    assert ort_region.spans(Program(prog.inputs, (conv.output,), [conv], prog.constants)) == []


def test_derived_matmul_and_eoperators_are_part_of_a_region():
    """Conv3x3 derived into Matmul + OffsetAdd (an eOperator), followed by a graph
    convolution: one region, checked against the reference interpreter."""
    import numpy as np

    from ollie.graph.ir import Node
    from ollie.optimizer.select import candidate_program
    from ollie.semantics.check import random_inputs

    expr = ollie.parse("A: [2, 6, 9, 7]\nK: [5, 6, 3, 3]\n"
                       "L<n=0:2, f=0:5, h=0:9, w=0:7> Sum<c=0:6, r=0:3, s=0:3> "
                       "A[n, c, h+r-1, w+s-1] * K[f, c, r, s]")
    inputs = random_inputs(expr, seed=3)
    res = ollie.derive(expr, max_depth=3, time_budget=30, clock=stopped_clock, guided_depth=2)
    cand = next(c for c in res.candidates
                if {k.kind for k in c.kernels} == {"Matmul", "eOp"})
    first = candidate_program(cand, expr, {"K": inputs["K"]})
    y = first.outputs[0]
    w2 = np.random.default_rng(4).standard_normal((4, 5, 3, 3)).astype(np.float32)
    conv = Kernel("Node", {"node": Node("Conv2d", (y, "W2"), ("z",), {"padding": 1}),
                           "op": "Conv2d"}, (y, "W2"), "z", None, shape=(2, 4, 9, 7))
    prog = Program(first.inputs, ("z",), [*first.kernels, conv],
                   {**first.constants, "W2": w2})
    marked = ort_region.mark_regions(prog)
    assert marked is not None and ort_region.groups(marked) == [(0, len(prog.kernels))]
    compiled = CompiledProgram(marked)
    assert all(compiled.in_region)
    got = compiled.run({"A": inputs["A"]})["z"]
    want = torch.nn.functional.conv2d(torch.from_numpy(ollie.interpret(expr, inputs)),
                                      torch.from_numpy(w2), padding=1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_region_that_fails_or_disagrees_runs_kernel_by_kernel(monkeypatch, caplog):
    m, x = _net()
    prog = ort_region.mark_regions(_optimized(m, x))
    assert prog is not None
    with torch.inference_mode():
        want = m(x)
    real_run = ort_region.Region.run

    def wrong(self, env):
        real_run(self, env)
        for n in self.outputs:
            env[n] = env[n] + 1.0

    monkeypatch.setattr(ort_region.Region, "run", wrong)
    compiled = CompiledProgram(prog)
    assert not any(compiled.in_region)
    assert "disagrees" in caplog.text
    torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(ort_region.Region, "run", real_run)

    def broken(*args, **kwargs):
        raise RuntimeError("onnxruntime refused the model")

    monkeypatch.setattr(ort_region, "_session", broken)
    compiled = CompiledProgram(prog)
    assert not any(compiled.in_region)
    torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)


def test_the_library_choice_offers_regions_and_applies_a_decided_one():
    m, x = _net()
    prog = _optimized(m, x)
    assert REGIONS in CHOICES
    feeds = {prog.inputs[0][0]: x}
    with torch.inference_mode():
        want = {prog.outputs[0]: m(x)}
    kept, decision, note = choose_libraries(prog, feeds, want, 1e-3, decided=REGIONS)
    assert decision == LibraryDecision(REGIONS) and note.endswith("(cached)")
    assert any("region" in k.params for k in kept.kernels)
    wrong = {n: t + 1.0 for n, t in want.items()}
    kept, decision, _ = choose_libraries(prog, feeds, wrong, 1e-3, decided=REGIONS)
    assert kept is prog and decision is None


def test_a_library_conv_kernel_with_a_following_operator_is_a_region():
    """A ``Conv`` kernel of a derived candidate (constant weight) followed by a graph operator:
    exported from the kernel's parameters, checked against the reference interpreter."""
    import numpy as np

    from ollie.graph.ir import Node
    from ollie.optimizer.select import candidate_program
    from ollie.semantics.check import random_inputs

    expr = ollie.parse("A: [2, 6, 9, 7]\nK: [5, 6, 3, 3]\n"
                       "L<n=0:2, f=0:5, h=0:7, w=0:5> Sum<c=0:6, r=0:3, s=0:3> "
                       "A[n, c, h+r, w+s] * K[f, c, r, s]")
    inputs = random_inputs(expr, seed=2)
    res = ollie.derive(expr, max_depth=0, time_budget=20, clock=stopped_clock)
    cand = next(c for c in res.candidates if [k.kind for k in c.kernels] == ["Conv"])
    conv_prog = candidate_program(cand, expr, {"K": inputs["K"]})
    y = conv_prog.outputs[0]
    relu = Kernel("Node", {"node": Node("Relu", (y,), ("z",)), "op": "Relu"}, (y,), "z",
                  None, shape=tuple(expr.shape))
    prog = Program(conv_prog.inputs, ("z",), [*conv_prog.kernels, relu],
                   conv_prog.constants)
    marked = ort_region.mark_regions(prog)
    assert marked is not None and ort_region.groups(marked) == [(0, len(prog.kernels))]
    compiled = CompiledProgram(marked)
    assert all(compiled.in_region)
    got = compiled.run({"A": inputs["A"]})["z"].numpy()
    np.testing.assert_allclose(got, np.maximum(ollie.interpret(expr, inputs), 0), rtol=1e-4,
                               atol=1e-4)


def test_building_a_region_times_no_library_choice(monkeypatch):
    """The check of a region runs its kernels with PyTorch's plain operators: a warm
    re-optimisation that applies a cached region decision measures nothing."""

    m, x = _net()
    prog = ort_region.mark_regions(_optimized(m, x))
    assert prog is not None

    def no_timing(*args, **kwargs):
        raise AssertionError("a library choice was timed")

    monkeypatch.setattr(choice.Choices, "fastest", no_timing)
    start, end = ort_region.groups(prog)[0]
    consts = {n: torch.as_tensor(v) for n, v in prog.constants.items()}
    assert ort_region.build_region(prog, start, end, consts, plain_kernel) is not None


def test_regions_with_onednn_outside_only_when_a_convolution_is_outside():
    from ollie.optimizer.libraries import REGIONS_ONEDNN, is_library_conv, variant

    m, x = _net()
    prog = _optimized(m, x)
    assert variant(prog, REGIONS_ONEDNN) is None  # every convolution is in a region
    # a compute-bound eOperator (a product summed: here a copy, times halves added up)
    # between the convolutions leaves the first alone (a run of one kernel)
    first = next(i for i, k in enumerate(prog.kernels) if is_library_conv(k))
    k = prog.kernels[first]
    shape = k.output_shape
    dims = ", ".join(f"d{i}=0:{s}" for i, s in enumerate(shape))
    idx = ", ".join(f"d{i}" for i in range(len(shape)))
    copy = Kernel("eOp", {"bound": "compute"}, (k.output, "halves"), k.output + "_copy",
                  ollie.parse(f"{k.output}: {list(shape)}\nhalves: [2]\n"
                              f"L<{dims}> Sum<r=0:2> {k.output}[{idx}] * halves[r]"))
    rest = [kn if k.output not in kn.inputs else
            Kernel(kn.kind, kn.params, tuple(k.output + "_copy" if n == k.output else n
                                             for n in kn.inputs), kn.output, kn.expr,
                   kn.views, kn.shape) for kn in prog.kernels[first + 1:]]
    split = Program(prog.inputs, prog.outputs, [*prog.kernels[:first + 1], copy, *rest],
                    {**prog.constants, "halves": np.full(2, 0.5, dtype=np.float32)})
    varied = variant(split, REGIONS_ONEDNN)
    assert varied is not None
    outside = [kn for kn in varied.kernels if is_library_conv(kn) and "region" not in kn.params]
    assert outside and all(kn.params["library"] == "oneDNN packed" for kn in outside)
    with torch.inference_mode():
        torch.testing.assert_close(CompiledProgram(varied)(x), m(x), rtol=1e-4, atol=1e-4)


class _Halves(nn.Module):
    """A convolution's channels split in two (a view of each half), one half convolved
    again, the halves concatenated: ShuffleNet's unit without the shuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.c1(x).chunk(2, dim=1)
        return torch.cat([a, self.c2(b)], 1)


def test_a_view_of_part_of_a_tensor_is_a_step_of_a_region():
    torch.manual_seed(0)
    m, x = _Halves().eval(), torch.randn(1, 3, 8, 8)  # one image: a half is contiguous
    prog = _optimized(m, x)
    assert any(k.kind == "Alias" for k in prog.kernels)
    marked = ort_region.mark_regions(prog)
    assert marked is not None and ort_region.groups(marked) == [(0, len(prog.kernels))]
    compiled = CompiledProgram(marked)
    assert compiled.whole is not None
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)


def test_a_regions_io_binding_follows_new_inputs_and_never_overwrites_kept_results():
    """The session's I/O binding is kept across calls: a new input tensor (another pointer)
    is bound again, outputs go to reused buffers only once the caller dropped the previous
    ones, another thread gets its own binding, and an input of the wrong size is refused."""
    import threading

    from ollie.errors import ShapeError
    from ollie.exec.buffers import BufferCache

    m, x = _net()
    prog = _optimized(m, x)
    # an intermediate result is also a program output: the region has two outputs
    prog = Program(prog.inputs, (*prog.outputs, prog.kernels[1].output), prog.kernels,
                   prog.constants)
    marked = ort_region.mark_regions(prog)
    assert marked is not None
    a, b = ort_region.groups(marked)[0]
    constants = CompiledProgram(marked).constants
    region = ort_region.build_region(marked, a, b, constants, plain_kernel)
    assert region is not None and len(region.inputs) == 1 and len(region.outputs) >= 2
    (name,), outs = region.inputs, region.outputs
    shape = marked.tensor_shapes()[name]
    ref = CompiledProgram(Program(((name, tuple(shape)),), tuple(outs), marked.kernels[a:b],
                                  marked.constants))

    buffers = BufferCache()

    def call(t: torch.Tensor, cache: BufferCache | None = buffers) -> list[torch.Tensor]:
        env = {name: t}
        region.run(env, cache)
        return [env[o] for o in outs]

    def same(got: list[torch.Tensor], t: torch.Tensor) -> None:
        for g, w in zip(got, ref(t), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)

    with torch.inference_mode():
        xs = [torch.randn(shape) for _ in range(3)]
        kept = call(xs[0])
        same(kept, xs[0])
        # the caller keeps ``kept``: the next results go elsewhere and ``kept`` is unchanged
        second = call(xs[1])
        assert not {t.data_ptr() for t in second} & {t.data_ptr() for t in kept}
        same(second, xs[1])
        same(kept, xs[0])
        # dropped results' buffers are reused, and an input written in place is read again
        ptrs = [t.data_ptr() for t in second]
        del second
        xs[1].copy_(xs[2])
        third = call(xs[1])
        assert [t.data_ptr() for t in third] == ptrs
        same(third, xs[2])
        # a channels-last input is read in its logical order; without a cache, fresh outputs
        same(call(xs[2].to(memory_format=torch.channels_last)), xs[2])
        fresh = call(xs[0], None)
        same(fresh, xs[0])
        assert not {t.data_ptr() for t in fresh} & {t.data_ptr() for t in kept + third}
        with pytest.raises(ShapeError, match=name):
            region.run({name: torch.randn(2, *shape)})

    got: list[list[torch.Tensor]] = []
    worker = threading.Thread(target=lambda: got.append(call(xs[0], None)))
    worker.start()
    worker.join()
    same(got[0], xs[0])


def test_a_program_that_is_one_region_is_called_straight_through_its_session():
    """A program that is one region takes dense float32 CPU tensors of its input shapes
    straight to the session (not through ``run``); any other argument (channels-last,
    strided, float64, numpy, a Parameter) goes through the checked path; both match the
    module, and a kept result is never overwritten."""
    from ollie.errors import ShapeError

    torch.manual_seed(3)
    m = nn.Sequential(nn.ConvTranspose2d(6, 8, 4, 2, 1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 4, 3, padding=1), nn.Tanh()).eval()
    x = torch.randn(2, 6, 5, 5)
    prog = _optimized(m, x)
    assert CompiledProgram(prog).whole is None  # no region marked
    marked = ort_region.mark_regions(prog)
    assert marked is not None
    cp = CompiledProgram(marked)
    assert cp.whole is not None
    general = []
    run = cp.run
    cp.run = lambda inputs: general.append(1) or run(inputs)  # type: ignore[method-assign]
    with torch.no_grad():
        x2 = torch.randn_like(x)
        want, want2 = m(x), m(x2)
    kept = cp(x)
    torch.testing.assert_close(kept, want, rtol=1e-4, atol=1e-4)
    second = cp(x2)
    assert second.data_ptr() != kept.data_ptr() and not general
    torch.testing.assert_close(second, want2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kept, want, rtol=1e-4, atol=1e-4)
    strided = x.transpose(2, 3).contiguous().transpose(2, 3)
    for arg in (x.to(memory_format=torch.channels_last), strided, x.double(), x.numpy(),
                nn.Parameter(x.clone(), requires_grad=False)):
        torch.testing.assert_close(cp(arg), want, rtol=1e-4, atol=1e-4)
    assert len(general) == 5
    with pytest.raises(ShapeError, match="input"):
        cp(torch.randn(1, *x.shape[1:]))
    # a region that leaves kernels outside it (a softplus: not exportable) is not the whole
    # program
    m, x = _net()
    m = nn.Sequential(*list(m)[:3], nn.Softplus(), *list(m)[3:]).eval()
    net = ort_region.mark_regions(_optimized(m, x))
    assert net is not None and ort_region.groups(net) != [(0, len(net.kernels))]
    assert CompiledProgram(net).whole is None


def test_the_library_choice_times_programs_as_they_are_called(monkeypatch):
    """The comparisons time each variant through ``CompiledProgram.__call__``, as it runs in
    use: the regions variant that is one region goes straight through its session, never
    through ``run``; the others through ``run``."""
    import importlib

    measure = importlib.import_module("ollie.tune.measure")  # the module, not the function

    torch.manual_seed(3)
    m = nn.Sequential(nn.ConvTranspose2d(6, 8, 4, 2, 1), nn.ReLU(),
                      nn.Conv2d(8, 4, 3, padding=1), nn.Tanh()).eval()
    x = torch.randn(1, 6, 5, 5)
    prog = _optimized(m, x)
    feeds = {prog.inputs[0][0]: x}
    with torch.inference_mode():
        want = {prog.outputs[0]: m(x)}
    through_run: dict[str, int] = {}
    timing: list[str] = []
    real_run = CompiledProgram.run

    def counted(self, inputs):
        if timing:
            through_run[timing[-1]] = through_run.get(timing[-1], 0) + 1
        return real_run(self, inputs)

    def once(fns, *args, **kwargs):
        for name, fn in fns.items():
            timing.append(name)
            torch.testing.assert_close(fn(), want[prog.outputs[0]], rtol=1e-4, atol=1e-4)
        return {name: float(name != REGIONS) for name in fns}

    monkeypatch.setattr(CompiledProgram, "run", counted)
    monkeypatch.setattr(measure, "measure_alternating", once)
    kept, decision, _ = choose_libraries(prog, feeds, want, 1e-3, settle=0.0)
    assert decision == LibraryDecision(REGIONS) and REGIONS in timing and len(timing) > 1
    assert CompiledProgram(kept).whole is not None and REGIONS not in through_run
    assert set(through_run) == set(timing) - {REGIONS}


@pytest.mark.parametrize("bound", ["memory", "compute"])
def test_a_transposed_convolution_as_product_and_col2im_in_one_region(monkeypatch, bound):
    """A batch-1 transposed convolution as a derived product (the input read through a
    transposed view, a constant weight) and a selective add, then a 1x1 convolution: one
    region whose ``MatMul``
    reads the weight as a 2-D initializer (ONNX Runtime prepacks only those) and whose
    selective add is one ``Col2Im``, also when the selective add is classed compute-bound (a
    compute-bound eOperator that is a product ends a region: ``test_what_ends_a_run``); it
    matches ``conv_transpose2d`` + ``conv2d``."""
    import numpy as np

    from ollie.graph.ir import Node
    from ollie.libs import ort_conv
    from ollie.program.kernel import View

    c, f, h = 3, 5, 2  # stride 2, kernel 4, padding 1
    rng = np.random.default_rng(0)
    w = rng.standard_normal((c, f, 4, 4)).astype(np.float32)
    product = ollie.parse(f"X: [1, {c}, {h}, {h}]\nW: [{c}, {f}, 4, 4]\n"
                          f"L<y=0:{h}, x=0:{h}, n=0:1, o=0:{f}, r=0:4, s=0:4> Sum<k=0:{c}> "
                          "X[n, k, y, x] * W[k, o, r, s]")
    mm = Kernel("Matmul", {"b": 1, "m": h * h, "n": f * 16, "k": c, "trans_a": True,
                           "trans_b": False}, ("X", "W"), "cols", product,
                (View(0, (1, h * h, c), (c * h * h, 1, h * h)),
                 View(0, (1, c, f * 16), (c * f * 16, f * 16, 1))))
    add = ollie.parse(f"cols: [{h}, {h}, 1, {f}, 4, 4]\n"
                      f"L<n=0:1, o=0:{f}, a=0:{2 * h}, b=0:{2 * h}> Sum<y=0:{h}, x=0:{h}> "
                      "cols[y, x, n, o, a - 2*y + 1, b - 2*x + 1]")
    eop = Kernel("eOp", {"expr": str(add), "bound": bound}, ("cols",), "out", add)
    w2 = rng.standard_normal((2, f, 1, 1)).astype(np.float32)  # a region holds a convolution
    conv = Kernel("Node", {"node": Node("Conv2d", ("out", "W2"), ("z",), {}), "op": "Conv2d"},
                  ("out", "W2"), "z", None, shape=(1, 2, 2 * h, 2 * h))
    prog = Program((("X", (1, c, h, h)),), ("z",), [mm, eop, conv], {"W": w, "W2": w2})
    graphs = []
    session = ort_conv.session
    monkeypatch.setattr(ort_conv, "session",
                        lambda graph, spinning=False, weights=None: graphs.append(graph) or
                        session(graph, spinning, weights))
    marked = ort_region.mark_regions(prog)
    assert marked is not None and ort_region.groups(marked) == [(0, 3)]
    compiled = CompiledProgram(marked)
    assert compiled.whole is not None and graphs
    inits = {i.name: tuple(i.dims) for i in graphs[-1].initializer}
    ops = [n.op_type for n in graphs[-1].node]
    (matmul,) = [n for n in graphs[-1].node if n.op_type == "MatMul"]
    assert inits.get(matmul.input[1]) == (c, f * 16) and ops.count("Col2Im") == 1
    x = torch.randn(1, c, h, h)
    want = torch.nn.functional.conv2d(torch.nn.functional.conv_transpose2d(
        x, torch.from_numpy(w), stride=2, padding=1), torch.from_numpy(w2))
    torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)


def test_a_region_holds_only_the_constants_its_nodes_read(monkeypatch):
    """A clamp's bounds are program constants its eOperator reads but its ONNX form folds in;
    the region's ONNX graph leaves them out (ONNX Runtime warns about every unused
    initializer: a model of many clamps printed a wall of warnings)."""
    from ollie.libs import ort_conv

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU6(), nn.Conv2d(8, 8, 3, padding=1),
                      nn.Hardtanh(-0.5, 2.0), nn.Conv2d(8, 4, 1)).eval()
    prog = ort_region.mark_regions(_optimized(m, torch.randn(1, 3, 16, 16)))
    assert prog is not None
    graphs: list = []
    real = ort_conv.session

    def spy(graph, spinning=False, weights=None):
        graphs.append((graph, set(weights or ())))
        return real(graph, spinning, weights)

    monkeypatch.setattr(ort_conv, "session", spy)
    consts = {n: torch.as_tensor(v) for n, v in prog.constants.items()}
    built = [ort_region.build_region(prog, start, end, consts, plain_kernel)
             for start, end in ort_region.groups(prog)]
    assert built and all(r is not None for r in built) and graphs
    for graph, weights in graphs:
        read = {name for node in graph.node for name in node.input}
        held = {i.name for i in graph.initializer} | weights
        assert held and held <= read


def test_large_weights_travel_beside_the_serialized_model():
    """``ort_conv.session(graph, weights=...)``: weights not in the ONNX graph are given to
    ONNX Runtime as external initializers; the session computes what the inline model does,
    and a region's large weights take that path (its serialized graph stays small)."""
    from onnx import TensorProto, helper

    from ollie.libs import ort_conv

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 96)).astype(np.float32)
    w2 = rng.standard_normal((96, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [5, 64])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [5, 8])], [])
    sess = ort_conv.session(graph, weights={"w1": w1, "w2": w2})
    x = rng.standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x @ w1, 0) @ w2,
                               rtol=1e-4, atol=1e-4)
    broken = helper.make_graph([helper.make_node("MatMul", ["x", "w9"], ["y"])], "g",
                               graph.input, graph.output, [])
    with pytest.raises(Exception, match="w9"):  # still checked: an unknown name is named
        ort_conv.session(broken, weights={"w1": w1})
    big = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 8, 1)).eval()
    x = torch.randn(1, 16, 8, 8)
    prog = ort_region.mark_regions(_optimized(big, x))
    assert prog is not None
    seen: list = []
    real = ort_conv.session

    def spy(graph, spinning=False, weights=None):
        seen.append((graph.ByteSize(), dict(weights or {})))
        return real(graph, spinning, weights)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ort_conv, "session", spy)
        compiled = CompiledProgram(prog)
    assert compiled.whole is not None and seen
    ((size, weights),) = seen
    assert any(v.nbytes >= ort_conv.EXTERNAL_BYTES for v in weights.values())
    assert size < ort_conv.EXTERNAL_BYTES
    torch.testing.assert_close(compiled(x), big(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("start", "end", "step"), [(3, 8, 1), (0, None, 2), (-4, None, 1)])
def test_a_graph_slice_between_convolutions_stays_in_the_region(start, end, step):
    """A ``Slice`` graph operator kept as it is (ShuffleNet's ``chunk`` next to a kept chain)
    is a region step, so the region is not cut in two around it (two regions do not spin)."""
    from ollie.graph.ir import Node

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    c = len(range(8)[slice(start, end, step)])
    w2 = rng.standard_normal((4, c, 1, 1)).astype(np.float32)
    conv = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}
    kernels = [
        Kernel("Node", {"node": Node("Conv2d", ("x", "W1"), ("a",), conv), "op": "Conv2d"},
               ("x", "W1"), "a", None, shape=(1, 8, 6, 6)),
        Kernel("Node", {"node": Node("Slice", ("a",), ("b",), {
            "axis": 1, "start": start, "end": end, "step": step}), "op": "Slice"},
               ("a",), "b", None, shape=(1, c, 6, 6)),
        Kernel("Node", {"node": Node("Conv2d", ("b", "W2"), ("y",), {**conv, "padding": (0, 0)}),
                        "op": "Conv2d"}, ("b", "W2"), "y", None, shape=(1, 4, 6, 6))]
    prog = Program((("x", (1, 3, 6, 6)),), ("y",), kernels, {"W1": w1, "W2": w2})
    marked = ort_region.mark_regions(prog)
    assert marked is not None and ort_region.groups(marked) == [(0, 3)]
    compiled = CompiledProgram(marked)
    assert compiled.whole is not None
    x = torch.randn(1, 3, 6, 6)
    a = torch.nn.functional.conv2d(x, torch.from_numpy(w1), padding=1)
    want = torch.nn.functional.conv2d(a[:, start:end:step], torch.from_numpy(w2))
    torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-4)
