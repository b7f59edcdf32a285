"""Saved programs are data: ``ollie.load`` never executes anything from the folder, validates
every field it reads, and refuses a tampered or unknown program with an ``OllieError`` naming
the file; clean programs round-trip (graph operators of torch and ONNX included)."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ollie
from ollie.optimizer.report import OptimizedModel
from ollie.program.kernel import Kernel
from ollie.program.program import Program
from ollie.testing.programs import original_program


class _Payload:
    """Unpickling this writes a file: proof that something ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "ran"))


class _OpaqueModel(nn.Module):
    """A convolution, max pooling and an operator Ollie keeps opaque (cumsum)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return torch.cumsum(y, dim=1).softmax(-1)


def _saved(tmp_path: Path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = _OpaqueModel().eval()
    x = torch.randn(1, 3, 8, 8)
    prog, _, _ = original_program(m, x)
    assert any(k.kind == "Node" and k.params["node"].op == "Opaque" for k in prog.kernels)
    OptimizedModel(prog, input_names=tuple(n for n, _ in prog.inputs)).save(tmp_path)
    with torch.no_grad():
        want = m(x)
    return tmp_path, x, want


def _edit(path: Path, fn) -> None:
    doc = json.loads((path / "program.json").read_text())
    fn(doc)
    (path / "program.json").write_text(json.dumps(doc))


def _node_kernel(doc: dict, op: str) -> dict:
    return next(k for k in doc["kernels"] if k["kind"] == "Node" and k["params"]["op"] == op)


def test_graph_operators_round_trip_as_data(tmp_path):
    path, x, want = _saved(tmp_path)
    text = (path / "program.json").read_text()
    assert '"$op": "aten::cumsum.default"' in text  # an operator by name, not a pickle
    loaded = ollie.load(path)
    assert torch.allclose(loaded(x), want, rtol=1e-5, atol=1e-6)


def test_an_onnx_operator_round_trips(tmp_path):
    from onnx import TensorProto, helper

    node = helper.make_node("CumSum", ["X", "axis"], ["Y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    from ollie.optimizer.final import all_nodes
    from ollie.optimizer.model import to_graph

    g = to_graph(model, None)
    prog = all_nodes(g)
    OptimizedModel(prog, input_names=tuple(n for n, _ in prog.inputs)).save(tmp_path)
    assert '"$onnx"' in (tmp_path / "program.json").read_text()
    x = torch.randn(2, 5)
    assert torch.allclose(ollie.load(tmp_path)(x), torch.cumsum(x, 1), atol=1e-6)


def test_a_pickle_payload_is_never_run(tmp_path):
    path, _, _ = _saved(tmp_path)
    marker = tmp_path / "ran.txt"
    payload = base64.b64encode(pickle.dumps(_Payload(marker))).decode()

    def plant(doc: dict) -> None:
        _node_kernel(doc, "Opaque")["node"] = payload  # what a format 1 program held

    _edit(path, plant)
    messages = []
    for version in (1, 2):  # format 1 programs held pickles: refused, saying how to re-save
        _edit(path, lambda doc, v=version: doc.update(format=v))
        try:
            ollie.load(path)
            messages.append(None)
        except ollie.OllieError as e:
            messages.append(str(e))
        except Exception as e:  # a crash: fails below, after the check that matters most
            messages.append(f"crashed: {type(e).__name__}")
        assert not marker.exists(), "loading the program ran the pickle"
    assert all(m is not None and "program.json" in m for m in messages)
    assert "optimize the model again" in messages[0]


@pytest.mark.parametrize("edit, message", [
    (lambda d: _node_kernel(d, "Opaque")["node"]["attrs"].update(
        target={"$op": "os::system.default"}), "namespaces"),
    (lambda d: _node_kernel(d, "Opaque")["node"]["attrs"].update(
        target={"$callable": "builtins.eval"}), "unknown function"),
    (lambda d: _node_kernel(d, "Opaque")["node"]["attrs"].update(
        args={"$pickle": "gASVAAAAAA=="}), "unknown value type"),
    (lambda d: d["kernels"][0].update(inputs=["nowhere"]), "nowhere"),
    (lambda d: d["kernels"][0].update(kind="Shell"), "unknown kernel kind"),
    (lambda d: d.update(format=99), "unsupported program format"),
    (lambda d: _node_kernel(d, "MaxPool2d").update(shape=[1, 4, 9, 9]),
     "computes shape"),
    (lambda d: d["inputs"][0].__setitem__(1, [1, 3, 9, 9]), "shape"),
    (lambda d: d["kernels"][0]["node"].update(op="Exec"), "unknown operator"),
])
def test_a_tampered_program_is_refused(tmp_path, edit, message):
    path, _, _ = _saved(tmp_path)
    _edit(path, edit)
    with pytest.raises(ollie.OllieError, match=message):
        ollie.load(path)


def test_an_eop_declaring_a_larger_input_is_refused(tmp_path):
    """An eOp that declares 1000 elements of a 768-element tensor would read past it."""
    e = ollie.parse("A: [768]\nL<i=0:768> A[i] * 2.0")
    prog = Program((("A", (768,)),), ("y",), [Kernel("eOp", {}, ("A",), "y", e)])
    prog.save(tmp_path)
    a = torch.randn(768)
    assert torch.allclose(ollie.load(tmp_path)(a), a * 2)

    def grow(doc: dict) -> None:
        doc["kernels"][0]["expr"] = "A: [1000]\nL<i=0:1000> A[i] * 2.0"

    _edit(tmp_path, grow)
    with pytest.raises(ollie.OllieError, match="declares"):
        ollie.load(tmp_path)


def test_a_view_past_its_operand_is_refused(tmp_path):
    e = ollie.parse("A: [4, 6]\nB: [6, 5]\nL<m=0:4, n=0:5> Sum<k=0:6> A[m, k] * B[k, n]")
    from ollie.program.kernel import View

    kernel = Kernel("Matmul", {"b": 1, "m": 4, "n": 5, "k": 6}, ("A", "B"), "y", e,
                    (View(0, (4, 6), (6, 1)), View(0, (6, 5), (5, 1))))
    prog = Program((("A", (4, 6)), ("B", (6, 5))), ("y",), [kernel])
    prog.save(tmp_path)
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    assert torch.allclose(ollie.load(tmp_path)(a, b), a @ b, atol=1e-5)
    _edit(tmp_path, lambda d: d["kernels"][0]["views"][1].__setitem__(0, 20))
    with pytest.raises(ollie.OllieError, match="reads element"):
        ollie.load(tmp_path)


def test_a_slice_alias_round_trips_and_one_past_its_operand_is_refused(tmp_path):
    """A slice that is a contiguous block of its input is a zero-copy Alias with fewer
    elements than the input; its view must lie within the input."""
    e = ollie.parse("A: [3, 4]\nL<i0=0:2, i1=0:4> A[i0 + 1, i1]")
    kernel = Kernel("Alias", {"view": [4, [2, 4], [4, 1]]}, ("A",), "y", e)
    Program((("A", (3, 4)),), ("y",), [kernel]).save(tmp_path)
    a = torch.randn(3, 4)
    assert torch.equal(ollie.load(tmp_path)(a), a[1:])
    _edit(tmp_path, lambda d: d["kernels"][0]["params"]["view"].__setitem__(0, 5))
    with pytest.raises(ollie.OllieError, match="reads element 12"):
        ollie.load(tmp_path)
    _edit(tmp_path, lambda d: d["kernels"][0]["params"]["view"].__setitem__(1, [1, 4]))
    with pytest.raises(ollie.OllieError, match="alias view of sizes"):
        ollie.load(tmp_path)


def test_truncated_or_foreign_files_are_refused(tmp_path):
    path, _, _ = _saved(tmp_path)
    (path / "program.json").write_text((path / "program.json").read_text()[:100])
    with pytest.raises(ollie.OllieError, match="not valid JSON"):
        ollie.load(path)
    path2, _, _ = _saved(tmp_path / "b")
    (path2 / "constants.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ollie.OllieError, match="constants"):
        ollie.load(path2)
    # an object array in the constants would need pickle: refused
    path3, _, _ = _saved(tmp_path / "c")
    np.savez(path3 / "constants.npz", w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ollie.OllieError, match="constants"):
        ollie.load(path3)
    with pytest.raises(ollie.OllieError, match="not a saved Ollie program"):
        ollie.load(tmp_path / "missing")


def test_a_report_with_unknown_or_malformed_fields_still_loads(tmp_path):
    path, x, want = _saved(tmp_path)
    (path / "report.json").write_text(json.dumps({
        "report": [{"node": "conv2d", "op": "Conv2d", "original": "Conv2d",
                    "chosen": "original operator", "derivation": [], "original_ms": 1.0,
                    "optimized_ms": 1.0, "from_a_later_version": True}],
        "notes": ["n"], "also_new": 1}))
    loaded = ollie.load(path)
    assert loaded.report[0].node == "conv2d" and loaded.notes == ["n"]
    (path / "report.json").write_text('{"report": [{"node": 3}]}')
    loaded = ollie.load(path)
    assert loaded.report == [] and torch.allclose(loaded(x), want, rtol=1e-5, atol=1e-6)


def test_a_value_ollie_cannot_save_is_named(tmp_path):
    from ollie.graph import OPAQUE, Node

    node = Node(OPAQUE, ("A",), ("y",), {"backend": "torch", "target": lambda t: t,
                                         "args": (), "kwargs": {}, "output_shapes": [(2,)],
                                         "output_dtypes": ["float32"]})
    prog = Program((("A", (2,)),), ("y",), [Kernel("Node", {"node": node, "op": OPAQUE},
                                                   ("A",), "y", None, (), (2,))])
    with pytest.raises(ollie.OllieError, match=r"attribute 'target'.*function"):
        prog.save(tmp_path)


DATA = Path(__file__).parent / "data"
"""Programs saved by Ollie at fa34003 (format 1): a derived 3x3 convolution (Matmul and
eOperators, no graph operator) and a program of graph operators (pickled in format 1)."""


def test_a_format_1_program_without_graph_operators_still_loads():
    loaded = ollie.load(DATA / "format1_derived")
    a = torch.randn(1, 4, 5, 5)
    k = torch.from_numpy(loaded.program.constants["K"])
    want = torch.nn.functional.conv2d(a, k, padding=1)
    assert torch.allclose(loaded(a), want, rtol=1e-4, atol=1e-5)


def test_a_format_1_program_with_graph_operators_is_refused_saying_how_to_resave():
    with pytest.raises(ollie.OllieError, match="optimize the model again"):
        ollie.load(DATA / "format1_nodes")
