"""An optimised program returns what the module returns (:mod:`ollie.optimizer.structure`):
the dict of a torchvision segmentation model, a 1-tuple, constants beside the tensors; after
``save`` / ``load`` (where the containers can be saved) and from the whole-model cache; a
saved structure is data, read only into container types registered in the process."""

from __future__ import annotations

import collections
import json
import logging

import pytest
import torch
from torch import nn

import ollie
from ollie import cli
from ollie.errors import OllieError
from ollie.optimizer import model as optimizer_model
from ollie.optimizer.structure import OutputStructure

FAST = dict(max_depth=1, guided_depth=2, max_candidates=1, settle=0.0, context=False,
            time_budget=5.0, total_budget=None)
Pair = collections.namedtuple("Pair", "low high")


class Heads(nn.Module):
    """A convolution and two heads, returned as ``kind`` says."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.body = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> object:
        y = torch.relu(self.body(x))
        z = self.head(y)
        if self.kind == "segmentation":  # torchvision's segmentation models
            return collections.OrderedDict(out=z, aux=None)
        if self.kind == "one-tuple":
            return (z,)
        if self.kind == "nested":
            return {"heads": [z, y], "scale": 2, "name": "heads"}
        if self.kind == "namedtuple":
            return Pair(z, y)
        return z, y


def _same(got: object, want: object) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same(got[k], want[k])
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        assert got == want


@pytest.mark.parametrize("kind", ["segmentation", "one-tuple", "nested", "namedtuple", "pair"])
def test_the_program_returns_what_the_module_returns(kind, tmp_path, capsys):
    torch.manual_seed(0)
    m, x = Heads(kind).eval(), torch.randn(1, 3, 8, 8)
    prog = ollie.optimize(m, (x,), use_cache=False, **FAST)
    with torch.no_grad():
        want = m(x)
    _same(prog(x), want)
    prog.save(tmp_path / "p")
    loaded = ollie.load(tmp_path / "p")
    if kind == "namedtuple":  # not registered with torch: kept in this process only
        _same(loaded(x), tuple(want))
        assert "outputs" not in json.loads((tmp_path / "p" / "report.json").read_text())
    else:
        _same(loaded(x), want)
    if kind == "nested":  # `ollie run` prints the shapes of the tensors in the containers
        assert cli.main(["run", str(tmp_path / "p"), "--repeats", "2"]) == 0
        assert "output [1, 2, 8, 8], [1, 4, 8, 8];" in capsys.readouterr().out


def test_a_recalled_program_returns_what_the_module_returns(ollie_settings, tmp_path,
                                                            monkeypatch):
    ollie_settings(cache_dir=tmp_path, choices={}, sleep=lambda s: None, load=lambda: 0.0)
    torch.manual_seed(0)
    m, x = Heads("segmentation").eval(), torch.randn(1, 3, 8, 8)
    ollie.optimize(m, (x,), **FAST)

    def fail(*args, **kwargs):
        raise AssertionError("the model was optimised again")

    monkeypatch.setattr(optimizer_model, "_optimize_graph", fail)
    warm = ollie.optimize(m, (x,), **FAST)
    assert any("from the cache" in n for n in warm.notes)
    with torch.no_grad():
        _same(warm(x), m(x))


def test_a_saved_structure_is_checked_and_never_imports(tmp_path, caplog):
    torch.manual_seed(0)
    m, x = Heads("segmentation").eval(), torch.randn(1, 3, 8, 8)
    prog = ollie.optimize(m, (x,), use_cache=False, **FAST)
    prog.save(tmp_path / "p")
    report = tmp_path / "p" / "report.json"
    doc = json.loads(report.read_text())
    saved = doc["outputs"]
    # a type name nobody registered (here: a module's function) is refused, not imported
    bad_spec = json.loads(saved["spec"])
    bad_spec[1]["type"] = "os.system"
    for bad in ({**saved, "spec": json.dumps(bad_spec)},
                {**saved, "leaves": [["output", 1], ["value", None]]},
                {**saved, "leaves": [["output", 0]]},
                {**saved, "leaves": [["output", 0], ["value", [1]]]},
                {"spec": 3, "leaves": []}, "text"):
        with pytest.raises(OllieError):
            OutputStructure.from_json(bad, 1)
        report.write_text(json.dumps({**doc, "outputs": bad}))
        with caplog.at_level(logging.WARNING, logger="ollie"):
            loaded = ollie.load(tmp_path / "p")
        assert any("output containers not read" in r.getMessage() for r in caplog.records)
        caplog.clear()
        torch.testing.assert_close(loaded(x), prog(x)["out"])  # the outputs as they are


def test_plain_outputs_keep_no_structure():
    t = torch.zeros(1)
    assert OutputStructure.of(t, 1).spec is None
    assert OutputStructure.of((t, t), 2).spec is None
    assert OutputStructure.of((t,), 1).spec is not None
    assert OutputStructure.of((t, (t,)), 2).spec is not None  # nested: not the flat tuple
    assert OutputStructure.of({"a": t, "f": lambda: 0}, 1).spec is None  # not a constant
    assert OutputStructure.of([t, t], 1).spec is None  # not the program's outputs


def test_a_module_returning_no_tensor_is_refused():
    class Nothing(nn.Module):
        def forward(self, x: torch.Tensor) -> object:
            return None

    with pytest.raises(ollie.UnsupportedError, match="returns no tensor"):
        ollie.optimize(Nothing().eval(), (torch.randn(2, 3),), use_cache=False, **FAST)
