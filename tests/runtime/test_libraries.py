"""Program-level choice of the convolution library: a preferred implementation is used without
measuring, the uniform variant is only kept when it matches the reference, the choice survives
save / load, and the optimised model still matches the module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ollie
from ollie.graph import run_graph
from ollie.optimizer.libraries import UNIFORM, choose_libraries, is_library_conv, with_library
from ollie.optimizer.model import to_graph
from ollie.runtime import onednn
from ollie.runtime.executor import CompiledProgram

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="torch built without oneDNN")


def _two_convs() -> tuple[nn.Module, torch.Tensor]:
    """A model whose optimised program keeps two library convolutions."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()).eval()
    return m, torch.randn(1, 4, 12, 12)


def test_fastest_of_uses_a_preferred_implementation_without_measuring():
    built: list[str] = []

    def builder(name, fn):
        def build():
            built.append(name)
            return fn
        return build

    def a(x):
        return x

    def b(x):
        return x

    key = ("prefer", 1)
    assert onednn.fastest_of({"a": builder("a", a), "b": builder("b", b)}, (2,), key,
                             prefer="b") is b
    assert built == ["b"] and key not in onednn._CHOICES
    # a preferred implementation that cannot be built: the measured choice
    built.clear()
    got = onednn.fastest_of({"a": builder("a", a), "b": builder("b", None)}, (2,), key,
                            prefer="b")
    assert got is a and set(built) == {"a", "b"}


@needs_onednn
def test_uniform_library_variant_is_exact_and_kept_through_save_and_load(tmp_path):
    m, x = _two_convs()
    prog = ollie.optimize(m, (x,), "cpu", time_budget=2.0, max_depth=0, use_cache=False)
    convs = [k for k in prog.program.kernels if is_library_conv(k)]
    assert len(convs) >= 2
    assert any("convolution libraries:" in n for n in prog.notes)
    with torch.inference_mode():
        want = m(x)
    torch.testing.assert_close(prog(x), want, rtol=1e-3, atol=1e-4)
    uniform = with_library(prog.program, UNIFORM[0])
    assert all(k.params["library"] == UNIFORM[0] for k in uniform.kernels
               if is_library_conv(k))
    assert all("library" not in k.params for k in uniform.kernels if not is_library_conv(k))
    torch.testing.assert_close(CompiledProgram(uniform)(x), want, rtol=1e-3, atol=1e-4)
    prog.save(tmp_path / "p")
    loaded = ollie.load(tmp_path / "p")
    libs = {k.params.get("library") for k in loaded.program.kernels if is_library_conv(k)}
    assert libs == {k.params.get("library") for k in convs}
    torch.testing.assert_close(loaded(x), want, rtol=1e-3, atol=1e-4)


@needs_onednn
def test_a_variant_that_disagrees_with_the_reference_is_not_kept():
    m, x = _two_convs()
    graph = to_graph(m, (x,))
    prog = ollie.optimize(m, (x,), "cpu", time_budget=2.0, max_depth=0, use_cache=False,
                          choose_libraries=False).program
    assert all("library" not in k.params for k in prog.kernels)
    feeds = {graph.inputs[0][0]: x}
    want = run_graph(graph, feeds)
    kept, note = choose_libraries(prog, feeds, want, 1e-3)
    assert note is not None and note.startswith("convolution libraries:")
    wrong = {n: t + 1.0 for n, t in want.items()}  # no variant can match this
    kept, note = choose_libraries(prog, feeds, wrong, 1e-3)
    assert kept is prog and note is None


def test_programs_with_fewer_than_two_convolutions_are_left_alone():
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(1, 2, 6, 6)
    graph = to_graph(m, (x,))
    prog = ollie.optimize(m, (x,), "cpu", time_budget=2.0, max_depth=0, use_cache=False,
                          choose_libraries=False).program
    feeds = {graph.inputs[0][0]: x}
    kept, note = choose_libraries(prog, feeds, run_graph(graph, feeds), 1e-3)
    assert kept is prog and note is None
