"""Concatenations inside eOperators (:mod:`ollie.exec.concat`): found only where the terms
tile one axis with whole tensors; run as ``torch.cat`` then the rest's generated code, equal to
the reference interpreter on random inputs in any layout; ahead-of-time compilation compiles
the rest, one pattern for concatenations of different arity."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ollie
from ollie.exec import dispatch
from ollie.exec.concat import split_concat
from ollie.program.kernel import Kernel


def _concat_text(sizes: list[int], axis: int, wrap: str | None, h: int = 3, w: int = 2) -> str:
    """A fused ``Concat`` (then ``wrap``: ``bn`` scale, shift and relu) of tensors ``T0..``
    with ``sizes`` along ``axis`` (0: channels, 1: rows) of ``[1, C, h, w]`` maps."""
    total = sum(sizes)
    dims = [1, total, h, w] if axis == 0 else [1, sizes[0], total, w]
    decls, terms, edge = [], [], 0
    for i, n in enumerate(sizes):
        shape = [1, n, h, w] if axis == 0 else [1, sizes[0], n, w]
        decls.append(f"T{i}: {shape}")
        if axis == 0:
            terms.append(f"T{i}[n, c - {edge}, y, x]" if edge else f"T{i}[n, c, y, x]")
        else:
            terms.append(f"T{i}[n, c, y - {edge}, x]" if edge else f"T{i}[n, c, y, x]")
        edge += n
    iters = f"n=0:1, c=0:{dims[1]}, y=0:{dims[2]}, x=0:{dims[3]}"
    cat = f"L<{iters}> " + " + ".join(terms)
    if wrap is None:
        return "\n".join(decls) + "\n" + cat
    decls += [f"S: [{dims[1]}]", f"B: [{dims[1]}]"]
    return "\n".join(decls) + f"\nL<{iters}> relu({{ {cat} }}[n, c, y, x] * S[c] + B[c])"


def test_what_is_a_concatenation():
    split = split_concat(ollie.parse(_concat_text([2, 3, 1], 0, None)))
    assert split is not None and split.rest is None
    assert split.parts == ("T0", "T1", "T2") and split.axis == 1 and split.shape == (1, 6, 3, 2)
    split = split_concat(ollie.parse(_concat_text([2, 3], 1, "bn")))
    assert split is not None and split.axis == 2 and split.parts == ("T0", "T1")
    assert split.rest is not None and set(split.rest.inputs) == {split.name, "S", "B"}
    gap = "A: [1, 2]\nB: [1, 2]\nL<n=0:1, c=0:5> A[n, c] + B[n, c - 3]"
    overlap = "A: [1, 3]\nB: [1, 3]\nL<n=0:1, c=0:5> A[n, c] + B[n, c - 2]"
    two_axes = "A: [2, 2]\nB: [2, 2]\nL<n=0:4, c=0:4> A[n, c] + B[n - 2, c - 2]"
    summed = "A: [2, 2]\nB: [2, 2]\nL<n=0:4> Sum<c=0:2> A[n, c] + B[n - 2, c]"
    scaled = "A: [2]\nB: [2]\nL<c=0:4> A[c] + 2 * B[c - 2]"
    for text in (gap, overlap, two_axes, summed, scaled):
        assert split_concat(ollie.parse(text)) is None, text


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=5), axis=st.sampled_from([0, 1]),
       wrap=st.sampled_from([None, "bn"]), channels_last=st.booleans(), seed=st.integers(0, 99))
def test_a_concatenation_eoperator_matches_the_interpreter(sizes, axis, wrap, channels_last,
                                                            seed):
    expr = ollie.parse(_concat_text(sizes, axis, wrap))
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in expr.decls}
    want = ollie.interpret(expr, feeds)
    k = Kernel("eOp", {"expr": str(expr)}, tuple(n for n, _ in expr.decls), "out", expr)
    env = {n: torch.from_numpy(a) for n, a in feeds.items()}
    if channels_last:  # inputs read in another layout (a channels-last convolution output)
        env = {n: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
               for n, t in env.items()}
    got = dispatch.compile_kernel(k)(env, None)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    out = torch.empty(tuple(expr.shape))
    assert dispatch.compile_kernel(k)(env, out).data_ptr() == out.data_ptr()


def test_ahead_of_time_compilation_compiles_one_rest_for_every_arity(monkeypatch):
    compiled: list = []
    monkeypatch.setattr("ollie.codegen.precompile.precompile",
                        lambda exprs: compiled.extend(exprs) or len(exprs))
    kernels = []
    for i, sizes in enumerate(([2, 2], [2, 2, 2], [2, 2, 2, 2])):
        expr = ollie.parse(_concat_text(sizes, 0, "bn"))
        kernels.append(Kernel("eOp", {"expr": str(expr)}, tuple(n for n, _ in expr.decls),
                              f"y{i}", expr))
    plain = ollie.parse(_concat_text([3, 1], 0, None))
    kernels.append(Kernel("eOp", {"expr": str(plain)}, ("T0", "T1"), "y9", plain))
    dispatch.precompile_programs([SimpleNamespace(kernels=kernels)])
    assert len(compiled) == 3  # the pure concatenation needs no code
    bodies = {str(e.root.body) for e in compiled}
    assert len(bodies) == 1, bodies  # the same rest: one pattern


@pytest.mark.parametrize("wrap", [None, "bn"])
def test_a_program_with_concatenations_runs_them_by_torch_cat(wrap, monkeypatch):
    calls: list = []
    real = torch.cat
    monkeypatch.setattr(torch, "cat", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    expr = ollie.parse(_concat_text([2, 3], 0, wrap))
    k = Kernel("eOp", {"expr": str(expr)}, tuple(n for n, _ in expr.decls), "out", expr)
    rng = np.random.default_rng(0)
    feeds = {n: torch.from_numpy(rng.standard_normal(s).astype(np.float32))
             for n, s in expr.decls}
    got = dispatch.compile_kernel(k)(feeds, None)
    np.testing.assert_allclose(got.numpy(), ollie.interpret(
        expr, {n: t.numpy() for n, t in feeds.items()}), rtol=1e-5, atol=1e-6)
    assert calls
