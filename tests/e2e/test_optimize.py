"""End to end: ollie.optimize on small models (torch and ONNX), the report, save/load, the
torch.compile backend, and the CLI."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import ollie
from ollie.errors import OllieError
from ollie.optimizer.select import ALTERNATIVE_WITHIN


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.up = nn.ConvTranspose2d(16, 4, 4, stride=2, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return torch.tanh(self.pool(self.up(y)) + 1.0)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    torch.manual_seed(0)
    m = Small().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 6, 6)
    opt = ollie.optimize(m, (x,), time_budget=4.0, max_candidates=4, use_cache=False,
                         settle=0.0)
    return m, x, opt


def test_optimized_model_matches_and_reports(small):
    m, x, opt = small
    with torch.no_grad():
        want = m(x)
    got = opt(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    ops = {r.op for r in opt.report}
    assert ops == {"Conv2d", "ConvTranspose2d"}
    for r in opt.report:
        assert r.original_ms > 0 and r.optimized_ms > 0
        if r.in_program:  # slower alone, switched on: the whole program was faster with it
            assert r.optimized_ms <= r.original_ms * ALTERNATIVE_WITHIN
            assert any(n.startswith("program context: ") for n in opt.notes)
        elif r.eager_ms is not None and r.optimized_ms == r.eager_ms:
            # kept as the framework runs it (PyTorch's implementation): what a choice
            # measured with a wide spread falls back to (Selection.best, unconfirmed)
            assert r.chosen == "original operator"
        else:
            assert r.optimized_ms <= r.original_ms * 1.0001  # never slower than the original
    assert any("checked against the original model" in n for n in opt.notes)
    assert "subprogram" in opt.summary()
    # other inputs too, not only the ones it was checked on
    x2 = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(opt(x2), m(x2), rtol=1e-3, atol=1e-4)


def test_save_and_load(small, tmp_path):
    _, x, opt = small
    opt.save(tmp_path / "prog")
    again = ollie.load(tmp_path / "prog")
    torch.testing.assert_close(again(x), opt(x))
    assert [r.node for r in again.report] == [r.node for r in opt.report]


def test_onnx_model(tmp_path):
    from ollie.frontend import to_onnx

    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    path = to_onnx(m, (x,), tmp_path / "m.onnx")
    opt = ollie.optimize(str(path), time_budget=3.0, max_candidates=3, use_cache=False,
                         settle=0.0)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), m(x), rtol=1e-3, atol=1e-4)


def test_bad_inputs_raise_ollie_errors(tmp_path):
    with pytest.raises(OllieError, match="example inputs"):
        ollie.optimize(nn.ReLU())
    with pytest.raises(OllieError):
        ollie.optimize(42)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(OllieError):
        ollie.optimize(str(bad))


@pytest.mark.parametrize("setting, value", [
    ("time_budget", 0.0), ("time_budget", -1.0), ("max_depth", -1), ("guided_depth", -1),
    ("max_candidates", -2), ("check_rtol", 0.0), ("settle", -0.1)])
def test_settings_out_of_range_are_named(setting, value):
    """A setting outside its range is a ``ConfigError`` (an ``OllieError`` and a ``ValueError``)
    naming the setting and the value, raised before any work; the ranges' edges are valid."""
    from ollie.errors import ConfigError
    from ollie.optimizer.model import OptimizeConfig
    from ollie.search import SearchConfig

    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU()).eval()
    with pytest.raises(ConfigError, match=f"OptimizeConfig.{setting} must be .*got {value}"):
        ollie.optimize(m, (torch.randn(1, 2, 6, 6),), **{setting: value})
    assert issubclass(ConfigError, OllieError) and issubclass(ConfigError, ValueError)
    OptimizeConfig(max_depth=0, guided_depth=0, max_candidates=0, settle=0.0)
    if setting in ("time_budget", "max_depth", "max_candidates"):
        with pytest.raises(ConfigError, match=f"SearchConfig.{setting} must be"):
            SearchConfig(**{setting: value})


@pytest.mark.parametrize("setting, value", [
    ("max_states", 0), ("guided_depth", -1), ("keep", 0), ("verify_samples", 0), ("rtol", 0.0),
    ("atol", -1e-6), ("max_tensor_bytes", 0)])
def test_search_settings_out_of_range_are_named(setting, value):
    from ollie.errors import ConfigError
    from ollie.search import SearchConfig

    with pytest.raises(ConfigError, match=f"SearchConfig.{setting} must be .*got {value}"):
        SearchConfig(**{setting: value})
    expr = ollie.parse("A: [4, 3]\nB: [3]\nL<i=0:4> Sum<k=0:3> A[i, k] * B[k]")
    with pytest.raises(ConfigError, match=setting):
        ollie.derive(expr, max_depth=0, time_budget=1.0, **{setting: value})
    SearchConfig(guided_depth=0, atol=0.0, max_tensor_bytes=None)


def test_torch_compile_backend():
    import ollie.optimizer.backend as backend
    from ollie.optimizer.model import OptimizeConfig

    old = backend.BACKEND_CONFIG
    backend.BACKEND_CONFIG = OptimizeConfig(time_budget=2.0, max_candidates=2, use_cache=False,
                                            settle=0.0)
    try:
        torch._dynamo.reset()
        m = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()).eval()
        x = torch.randn(1, 4, 6, 6)
        compiled = torch.compile(m, backend="ollie")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-3, atol=1e-4)
    finally:
        backend.BACKEND_CONFIG = old


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "ollie", *args], capture_output=True,
                          text=True, timeout=600, **kw)


def test_cli_derive(tmp_path):
    f = tmp_path / "mm.expr"
    f.write_text("A: [32, 64]\nB: [48, 32]\nL<m=0:64, n=0:48> Sum<k=0:32> A[k, m] * B[n, k]\n")
    r = _cli("derive", str(f), "--max-depth", "1", "--time-budget", "5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["stats"]) >= {"states_visited", "states_pruned", "candidates", "seconds",
                                 "max_depth"}
    assert doc["candidates"] and all(c["verified"] for c in doc["candidates"])
    assert doc["candidates"][0]["kernels"][0]["kind"] in ("Matmul", "Conv", "eOp")
    r = _cli("derive", str(f), "--max-depth", "0", "--time-budget", "5", "--explain")
    assert r.returncode == 0 and "operator_matching" in r.stdout
    bad = tmp_path / "bad.expr"
    bad.write_text("A: [3]\nL<i=0:3> B[i]\n")
    r = _cli("derive", str(bad))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"ollie: error: {bad}:2:10: tensor 'B' is not declared"]
    r = _cli("derive", str(tmp_path / "missing.expr"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_cli_zoo_optimize_run(tmp_path):
    r = _cli("zoo")
    assert r.returncode == 0 and "infogan" in r.stdout and "longformer" in r.stdout
    r = _cli("optimize", "zoo:nonexistent")
    assert r.returncode == 2 and "unknown zoo model" in r.stderr


def test_tf32_check_uses_a_full_float32_reference(monkeypatch):
    """Where TF32 is on (pretended here, on the CPU), the end-to-end check compares with the
    model run in full float32, allows a multiple of the model's own error, and restores the
    precision flags."""
    from ollie.optimizer import final

    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    seen = []
    real = final.run_graph

    def spy(graph, feeds):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return real(graph, feeds)

    monkeypatch.setattr(final, "tf32", lambda device: True)
    monkeypatch.setattr(final, "run_graph", spy)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    opt = ollie.optimize(m, (x,), time_budget=2.0, max_candidates=2, use_cache=False,
                         settle=0.0)
    assert seen[:2] == [(False, False), before]  # float32 reference, then the model as run
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    note = next(n for n in opt.notes if n.startswith("TensorFloat-32 is on"))
    # on the CPU the model is exactly float32 (own error 0): check_rtol is the floor
    assert "within 0.00e+00 of float32" in note and "allows 1.00e-03" in note
    assert any("checked against the original model" in n for n in opt.notes)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), m(x), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("node_name", ["/head/head.0/Gemm", "0", "conv_1"])
def test_subprogram_temporaries_get_parseable_names_from_any_node_name(node_name, tmp_path):
    """A rewrite's temporaries are named after their node; ONNX node names (``/a/b.0/Gemm``)
    are not tensor names, and a saved program's expressions must parse again."""
    import numpy as np

    from ollie.ir import parse
    from ollie.optimizer.rename import name_prefix, rename_kernels
    from ollie.program.kernel import Kernel
    from ollie.program.program import Program

    inner = parse("x0: [2, 3]\nL<i=0:2, j=0:3> x0[i, j] * 2.0")
    outer = parse("t9: [2, 3]\nL<i=0:2, j=0:3> relu(t9[i, j] + 1.0)")
    kernels = [Kernel("eOp", {}, ("x0",), "t9", inner, (None,), (2, 3)),
               Kernel("eOp", {}, ("t9",), "y", outer, (None,), (2, 3))]
    renamed = rename_kernels(kernels, {"x0": "inp"}, "y", "out", prefix=node_name)
    temp = renamed[0].output
    assert temp.startswith(name_prefix(node_name)) and temp != "t9"
    assert name_prefix("/a/b") != name_prefix("_a_b") != name_prefix("/a.b")
    prog = Program((("inp", (2, 3)),), ("out",), renamed)
    prog.save(tmp_path / "p")
    again = Program.load(tmp_path / "p")
    assert [k.output for k in again.kernels] == [temp, "out"]
    x = torch.randn(2, 3)
    want = torch.relu(x * 2 + 1)
    for p in (prog, again):
        got = ollie.optimizer.model.OptimizedModel(p)(x)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
