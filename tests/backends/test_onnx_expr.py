"""eOperator expressions and strided views exported as ONNX nodes (ollie.backends.onnxrt.expr):
every emitted graph, run by ONNX Runtime, matches the reference interpreter (random
expressions) or ``torch.as_strided`` (random views); reads take the cheapest ONNX form that
fits them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ollie
from ollie.backends.onnxrt import expr as onnx_expr
from ollie.backends.onnxrt import views as onnx_views
from ollie.backends.onnxrt.build import Builder
from ollie.backends.onnxrt.region import needs_gather
from ollie.errors import UnsupportedError
from ollie.program.kernel import View
from ollie.semantics.check import random_inputs
from ollie.testing.strategies import exprs, inputs_with_specials, padded_products

pytest.importorskip("onnxruntime")


def _run(b: Builder, inputs: dict[str, np.ndarray], out: str) -> np.ndarray:
    """Run the builder's nodes (graph inputs ``inputs``, output ``out``) in ONNX Runtime."""
    from onnx import TensorProto, helper, numpy_helper

    from ollie.libs.ort_conv import session

    graph = helper.make_graph(
        b.nodes, "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape))
         for n, v in inputs.items()],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(b.shapes[out]))],
        [numpy_helper.from_array(v, n) for n, v in b.inits.items()])
    return session(graph).run(None, {n: v.astype(np.float32) for n, v in inputs.items()})[0]


def _emit(expr: ollie.Expr) -> tuple[Builder, str]:
    b = Builder({}, {n: tuple(s) for n, s in expr.decls})
    return b, onnx_expr.emit_scope(b, expr.root, {n: n for n, _ in expr.decls})


def _ops(b: Builder) -> list[str]:
    return [n.op_type for n in b.nodes]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exprs(depth=1, max_sum=2), st.integers(0, 2**31 - 1))
def test_random_expressions_match_the_interpreter(expr, seed):
    inputs = random_inputs(expr, seed=seed)
    try:
        b, out = _emit(expr)
    except UnsupportedError as err:  # the one refusal such small expressions meet
        assert "may read outside its tensor in a factor" in str(err), err
        return
    got = _run(b, inputs, out)
    want = ollie.interpret(expr, inputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (1 + np.abs(want).max()))


def _check(text: str) -> list[str]:
    expr = ollie.parse(text)
    inputs = random_inputs(expr, seed=0)
    b, out = _emit(expr)
    np.testing.assert_allclose(_run(b, inputs, out), ollie.interpret(expr, inputs),
                               rtol=1e-5, atol=1e-5)
    return _ops(b)


def test_reads_take_the_cheapest_form():
    # element-wise with a per-channel bias: reshapes only
    ops = _check("A: [2, 3, 4]\nB: [3]\nL<i=0:2, j=0:3, k=0:4> relu(A[i, j, k] + B[j])")
    assert "Gather" not in ops and "Slice" not in ops
    # a stride-2 subsample with a size-1 axis (ResNet's 1x1 stride-2 shortcut): a slice
    ops = _check("A: [1, 4, 6, 6]\nL<n=0:1, c=0:4, h=0:3, r=0:1, w=0:3> A[n, c, 2*h + r, 2*w]")
    assert "Slice" in ops and "Gather" not in ops
    # a transposed read: slice-free transpose
    ops = _check("A: [3, 5]\nL<i=0:5, j=0:3> A[j, i]")
    assert "Transpose" in ops and "Gather" not in ops
    # zero padding: a pad
    ops = _check("A: [5]\nL<i=0:7> A[i - 1] * 2.0")
    assert "Pad" in ops and "Gather" not in ops
    # two iterators in one index, outside the tensor at the ends: a gather masked by where
    ops = _check("A: [5]\nL<i=0:3, j=0:4> A[i + j - 1]")
    assert "Gather" in ops and "Where" in ops
    # an OffsetAdd: the small sum unrolled into shifted, padded slices
    expr = ollie.parse("A: [3, 2, 6]\nL<c=0:2, h=0:6> Sum<r=0:3> A[-r + 2, c, h + r - 1]")
    ops = _check(str(expr))
    assert "Gather" not in ops and ops.count("Add") == 2
    assert not needs_gather(expr)
    # a sum of shifted reads too long to unroll keeps its gather
    n = onnx_expr.UNROLL + 1
    expr = ollie.parse(f"A: [{n}, {n + 7}]\nL<h=0:8> Sum<y=0:{n}> A[y, h + y]")
    assert "Gather" in _check(str(expr)) and needs_gather(expr)
    # a selective add as long (a transposed convolution's columns summed into its image):
    # one Col2Im, no gather
    expr = ollie.parse(f"A: [{n}, 8]\nL<h=0:8> Sum<y=0:{n}> A[y, h - y]")
    ops = _check(str(expr))
    assert "Col2Im" in ops and "Gather" not in ops and not needs_gather(expr)
    # a global average pool: one GlobalAveragePool, also of an activation (post-processing
    # fuses it into the pool) or of part of a tensor (the read's slice, then the pool)
    for text in ("A: [2, 3, 4, 4]\nL<n=0:2, c=0:3> Sum<h=0:4, w=0:4> A[n, c, h, w] * 0.0625",
                 "A: [1, 3, 4, 2]\nL<n=0:1, c=0:3> Sum<r=0:4, s=0:2> relu(A[0, c, r, s]) * 0.125",
                 "A: [2, 3, 4, 4]\nL<n=0:2, c=0:3> Sum<h=0:2, w=0:4> A[n, c, h, w] * 0.125",
                 # pooled to [N, C, 1, 1] (squeeze-excitation): the same
                 "A: [1, 3, 4, 2]\nL<n=0:1, c=0:3, h=0:1, w=0:1> Sum<r=0:4, s=0:2> "
                 "A[n, c, r, s] * 0.125"):
        ops = _check(text)
        assert "GlobalAveragePool" in ops and "ReduceSum" not in ops
    # a k x k average pool of stride k over a whole tensor: one AveragePool
    ops = _check("A: [2, 3, 6, 4]\nL<n=0:2, c=0:3, h=0:3, w=0:2> Sum<r=0:2, s=0:2> "
                 "A[n, c, 2*h + r, 2*w + s] * 0.25")
    assert ops.count("AveragePool") == 1 and "ReduceSum" not in ops
    # another scale, or a grid that is not 4-D: a reduction
    for text in ("A: [2, 3, 4, 4]\nL<n=0:2, c=0:3> Sum<h=0:4, w=0:4> A[n, c, h, w] * 0.5",
                 "A: [3, 4, 4]\nL<c=0:3> Sum<h=0:4, w=0:4> A[c, h, w] * 0.0625",
                 "A: [1, 3, 4, 2]\nL<n=0:1, c=0:3, h=0:2, w=0:1> Sum<r=0:2, s=0:2> "
                 "A[n, c, 2*h + r, s] * 0.25"):
        ops = _check(text)
        assert "ReduceSum" in ops and "GlobalAveragePool" not in ops


def test_divided_and_combined_iterators_read_without_gather():
    # a head merge (ViT, BERT): one iterator read as quotient and remainder
    ops = _check("A: [1, 3, 5, 4]\nL<i0=0:1, i1=0:5, i2=0:12> A[i0, i2 / 4, i1, i2 % 4]")
    assert "Gather" not in ops and "Transpose" in ops
    # a head split: two iterators in one dimension
    ops = _check("A: [1, 5, 12]\nL<b=0:1, h=0:3, s=0:5, d=0:4> A[b, s, 4*h + d] * 2.0")
    assert "Gather" not in ops and "Transpose" in ops
    # a channel shuffle of two halves (ShuffleNet), each half read outside its tensor
    ops = _check("A: [1, 3, 2, 2]\nB: [1, 3, 2, 2]\nL<n=0:1, c=0:6, h=0:2, w=0:2> "
                 "A[0, c / 2 + 3*(c % 2), h, w] + B[0, c / 2 + 3*(c % 2) - 3, h, w]")
    assert "Gather" not in ops and "Concat" in ops and "Pad" not in ops
    # ... also under a function zero at zero; an overlap of the halves is a sum of pads
    ops = _check("A: [1, 3, 2, 2]\nB: [1, 3, 2, 2]\nL<n=0:1, c=0:6, h=0:2, w=0:2> "
                 "relu(A[0, c / 2 + 3*(c % 2), h, w]) + relu(B[0, c / 2 + 3*(c % 2) - 3, h, w])")
    assert "Gather" not in ops and "Concat" in ops and "Pad" not in ops
    ops = _check("A: [1, 3, 2, 2]\nB: [1, 3, 2, 2]\nL<n=0:1, c=0:6, h=0:2, w=0:2> "
                 "A[0, c / 2 + 3*(c % 2), h, w] + B[0, c / 2 + 3*(c % 2), h, w]")
    assert "Gather" not in ops and "Concat" not in ops and "Pad" in ops
    # nearest upsampling: a quotient alone is broadcast over the remainder
    ops = _check("A: [3, 4]\nL<i=0:6, j=0:8> A[i / 2, j / 2]")
    assert "Gather" not in ops and "Expand" in ops
    # a lower digit that would carry into the next, a divided iterator not starting at 0,
    # cuts that do not divide each other: gathered
    for text in ("A: [20]\nL<i=0:3, j=0:5> A[4*i + j]",
                 "A: [4, 2]\nL<i=1:7> A[i / 2, i % 2]",
                 "A: [4, 3]\nL<i=0:12> A[i / 3, i % 2]"):
        assert "Gather" in _check(text)


@given(st.lists(st.integers(1, 4), min_size=2, max_size=3), st.randoms(use_true_random=False))
@settings(max_examples=30, deadline=None)
def test_flattening_and_unflattening_reads_match_the_interpreter(sizes, rng):
    # a tensor read through a permuted flattening of its dimensions, and the flat tensor read
    # back through its digits: no gather where the plan applies, the interpreter's values
    names = [f"x{d}" for d in range(len(sizes))]
    order = list(range(len(sizes)))
    rng.shuffle(order)
    strides = {d: math.prod(sizes[e] for e in order[order.index(d) + 1:]) for d in order}
    total = math.prod(sizes)
    flat = " + ".join(f"{strides[d]}*{names[d]}" for d in order)
    grid = ", ".join(f"{n}=0:{k}" for n, k in zip(names, sizes, strict=True))
    ops = _check(f"F: [{total}]\nL<{grid}> F[{flat}]")
    assert "Gather" not in ops
    digits = ", ".join(f"f / {strides[d]} % {sizes[d]}" if order.index(d) else
                       f"f / {strides[d]}" for d in range(len(sizes)))
    assert "Gather" not in _check(f"A: {list(sizes)}\nL<f=0:{total}> A[{digits}]")


def test_per_channel_scale_and_shift_becomes_batch_normalization():
    # DenseNet's batch norm after a concatenation: one BatchNormalization, ReLU after it
    ops = _check("A: [2, 3, 4, 4]\nS: [3]\nB: [3]\nL<n=0:2, c=0:3, h=0:4, w=0:4> "
                 "relu(B[c] + S[c] * A[n, c, h, w])")
    assert "BatchNormalization" in ops and "Mul" not in ops
    # the channel elsewhere than axis 1, or a scale read at another index: Mul and Add
    for text in ("A: [3, 2, 4]\nS: [3]\nB: [3]\nL<c=0:3, n=0:2, h=0:4> A[c, n, h] * S[c] + B[c]",
                 "A: [2, 3, 4, 4]\nS: [4]\nB: [3]\nL<n=0:2, c=0:3, h=0:4, w=0:4> "
                 "A[n, c, h, w] * S[h] + B[c]"):
        assert "BatchNormalization" not in _check(text)


def test_clamps_become_clip():
    # min(max(x, lo), hi) with literal bounds, either nesting, or one bound alone: one Clip
    for text in ("A: [2, 5]\nL<i=0:2, j=0:5> min(max(A[i, j], -0.5), 0.5)",
                 "A: [2, 5]\nL<i=0:2, j=0:5> max(min(A[i, j], 0.5), -0.5)",
                 "A: [2, 5]\nL<i=0:2, j=0:5> max(0.25, A[i, j])"):
        assert _check(text) == ["Clip"]
    # lo > hi: max(min(x, hi), lo) is not one Clip (it is lo everywhere): the inner min
    # alone is, then a Max (values checked by _check)
    assert _check("A: [2, 5]\nL<i=0:2, j=0:5> max(min(A[i, j], -0.5), 0.5)") == ["Clip", "Max"]
    # clip(a x + b, 0, 1): HardSigmoid; x * hardsigmoid(x) with a = 1/6, b = 1/2: HardSwish
    assert _check("A: [2, 5]\nL<i=0:2, j=0:5> min(max(A[i, j] * 0.2 + 0.5, 0.0), 1.0)") == \
        ["HardSigmoid"]
    assert _check("A: [2, 5]\nL<i=0:2, j=0:5> "
                  "A[i, j] * min(max(0.5 + A[i, j] * 0.16666667, 0.0), 1.0)") == ["HardSwish"]
    # ... not when the gate is of another tensor, or its bounds are not [0, 1]
    ops = _check("A: [2, 5]\nB: [2, 5]\nL<i=0:2, j=0:5> "
                 "A[i, j] * min(max(B[i, j] * 0.16666667 + 0.5, 0.0), 1.0)")
    assert "HardSwish" not in ops and "HardSigmoid" in ops
    ops = _check("A: [2, 5]\nL<i=0:2, j=0:5> min(max(A[i, j] * 0.2 + 0.5, 0.0), 2.0)")
    assert ops[-1] == "Clip" and "HardSigmoid" not in ops
    # bounds read from one-element constants (a ReLU6 lowered from a graph)
    expr = ollie.parse("A: [2, 5]\nlo: [1]\nhi: [1]\n"
                       "L<i=0:2, j=0:5> min(max(A[i, j], lo[0]), hi[0])")
    b = Builder({"lo": torch.tensor([0.0]), "hi": torch.tensor([0.3])}, {"A": (2, 5)})
    out = onnx_expr.emit_scope(b, expr.root, {"A": "A", "lo": b.const("lo"), "hi": b.const("hi")})
    assert _ops(b) == ["Clip"]
    a = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(b, {"A": a}, out), np.clip(a, 0.0, 0.3))
    # a one-element constant read at a moving index is not a bound (0 outside it)
    expr = ollie.parse("A: [2, 5]\nc: [1]\nL<i=0:2, j=0:5> max(A[i, j], c[j])")
    b = Builder({"c": torch.tensor([0.3])}, {"A": (2, 5)})
    out = onnx_expr.emit_scope(b, expr.root, {"A": "A", "c": b.const("c")})
    assert "Clip" not in _ops(b)
    want = np.maximum(a, np.asarray([0.3, 0, 0, 0, 0], dtype=np.float32))
    np.testing.assert_allclose(_run(b, {"A": a}, out), want)


def test_concatenations_become_concat():
    # tensors laid end to end along one axis, in any term order: one Concat
    ops = _check("A: [1, 2, 3]\nB: [1, 4, 3]\nC: [1, 1, 3]\n"
                 "L<n=0:1, c=0:7, w=0:3> B[n, c - 2, w] + A[n, c, w] + C[n, c - 6, w]")
    assert ops == ["Concat"]
    # of activations (relu(0) = 0): each term's activation, then one Concat
    ops = _check("A: [2, 3]\nB: [2, 4]\nL<i=0:2, j=0:7> relu(A[i, j]) + tanh(B[i, j - 3])")
    assert ops == ["Relu", "Tanh", "Concat"]
    # of nested scopes (post-processing fuses the activations into the concatenation)
    ops = _check("A: [2, 3]\nB: [2, 4]\nL<i=0:2, j=0:7> { L<i=0:2, j=0:3> relu(A[i, j]) }"
                 "[i, j] + { L<i=0:2, j=0:4> relu(B[i, j]) }[i, j - 3]")
    assert ops == ["Relu", "Relu", "Concat"]
    # not concatenations: a gap, an overlap, a shifted second axis, a scaled term
    for text in ("A: [2, 3]\nB: [2, 3]\nL<i=0:2, j=0:7> A[i, j] + B[i, j - 4]",
                 "A: [2, 3]\nB: [2, 3]\nL<i=0:2, j=0:5> A[i, j] + B[i, j - 2]",
                 "A: [2, 3]\nB: [2, 3]\nL<i=0:2, j=0:6> A[i, j] + B[i - 1, j - 3]",
                 "A: [2, 3]\nB: [2, 3]\nL<i=0:2, j=0:6> A[i, j] + 2.0 * B[i, j - 3]",
                 # sigmoid(0) = 0.5: the first term is not zero outside A
                 "A: [2, 3]\nB: [2, 3]\nL<i=0:2, j=0:6> sigmoid(A[i, j]) + B[i, j - 3]"):
        assert "Concat" not in _check(text)


def test_nested_scopes_and_unread_iterators():
    _check("A: [2, 6]\nB: [6]\nL<i=0:2, j=0:6> relu(A[i, j] + "
           "{ L<p=0:2, q=1:7> Sum<s=0:1> A[p, q - 1 + s] }[i, j + 1] + B[j])")
    # an output axis that no read uses: broadcast by Expand
    ops = _check("A: [3]\nL<i=0:3, j=0:4> A[i] + 1.0")
    assert "Expand" in ops
    # a summation iterator that no read uses: a multiplication by its size
    _check("A: [3]\nL<i=0:3> Sum<s=0:5> A[i]")


def test_padding_is_of_the_read_not_of_the_tensor():
    # a small tensor read over a long range: slice what exists, pad that to the read
    expr = ollie.parse("A: [30, 4]\nL<i=0:40, j=0:4> A[i - 20, j]")
    _check(str(expr))
    b, _ = _emit(expr)
    assert max(math.prod(s) for s in b.shapes.values()) == 40 * 4
    assert _ops(b).index("Slice") < _ops(b).index("Pad")
    # a read entirely outside the tensor is zeros
    _check("A: [2]\nL<i=0:5> A[i + 10] + 1.0")


def test_nan_outside_the_read_positions_does_not_leak():
    expr = ollie.parse("A: [4]\nL<i=0:6> A[i - 1]")
    a = np.array([1.0, 2.0, 3.0, np.nan], dtype=np.float32)
    b, out = _emit(expr)
    got = _run(b, {"A": a}, out)
    np.testing.assert_array_equal(got[:4], [0.0, 1.0, 2.0, 3.0])
    assert np.isnan(got[4]) and got[5] == 0.0


def test_products_that_may_read_outside_are_refused():
    """A product with a factor that may read outside its tensor (a ``Pad`` / ``Where`` zero
    here, and ``0 * NaN`` is NaN in ONNX) ends the region; a finite constant operand, a sum,
    a function and a divisor need nothing."""
    refused = ("A: [4]\nB: [4]\nL<i=0:6> A[i - 1] * B[i - 2]",
               "A: [4]\nB: [4]\nL<i=0:5> A[i - 1] / B[i]",
               "A: [4]\nL<i=0:5> { L<t=0:5> A[t] }[i - 1] * A[i % 4]")
    for text in refused:
        with pytest.raises(UnsupportedError, match="may read outside its tensor"):
            _emit(ollie.parse(text))
    a = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    accepted = ("A: [4]\nL<i=0:6> A[i - 1] * 2",
                "A: [4]\nB: [4]\nL<i=0:6> (A[i - 1] + B[i - 2]) * 3 - A[i - 2] / 4",
                "A: [4]\nB: [4]\nL<i=0:4> B[i] / A[i - 1] + relu(A[i + 1]) * B[i]",
                "A: [4]\nB: [4]\nL<i=0:4> Sum<k=0:3> A[i + k - 1] + B[i] * B[3 - i]")
    for text in accepted:
        expr = ollie.parse(text)
        b, out = _emit(expr)
        inputs = {n: a[::-1].copy() if n == "B" else a for n, _ in expr.decls}
        got, want = _run(b, inputs, out), ollie.interpret(expr, inputs)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(padded_products(), exprs(depth=1, max_sum=2)), st.data())
def test_emitted_expressions_keep_nan_and_inf_where_the_interpreter_does(expr, data):
    """With NaN and infinities in the inputs, an emitted scope gives the interpreter's values,
    NaN positions and infinities included (what could not is refused)."""
    inputs = data.draw(inputs_with_specials(expr, max_specials=2))
    try:
        b, out = _emit(expr)
    except UnsupportedError as err:
        assert "may read outside its tensor in a factor" in str(err), err
        return
    got, want = _run(b, inputs, out), ollie.interpret(expr, inputs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str(expr))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (1 + np.nanmax(
        np.abs(np.where(np.isfinite(want), want, 0)), initial=0)), err_msg=str(expr))


@st.composite
def _views(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    numel = math.prod(shape)
    rank = draw(st.integers(1, 3))
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    strides = tuple(draw(st.sampled_from([0, 1, 2, 3, numel // 2 or 1])) for _ in sizes)
    reach = sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))
    if reach >= numel:
        strides = tuple(0 for _ in sizes)
        reach = 0
    offset = draw(st.integers(0, numel - 1 - reach))
    return shape, View(offset, sizes, strides)


@settings(max_examples=60, deadline=None)
@given(_views())
def test_views_match_as_strided(case):
    shape, view = case
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    b = Builder({}, {"x": shape})
    y = onnx_expr.view_read(b, "x", view)
    want = torch.as_strided(torch.from_numpy(x).reshape(-1), view.sizes, view.strides,
                            view.offset).numpy()
    np.testing.assert_array_equal(_run(b, {"x": x}, y), want)


def test_contiguous_permuted_and_broadcast_views_need_no_gather():
    b = Builder({}, {"w": (6, 4)})
    view = View(0, (3, 6, 4), (0, 4, 1))
    onnx_expr.view_read(b, "w", view)
    assert "Gather" not in _ops(b) and "Expand" in _ops(b)
    assert not onnx_expr.view_gathers(view, 24)
    # a transposed operand (trans_b): a transpose
    b = Builder({}, {"w": (6, 4)})
    view = View(0, (1, 4, 6), (0, 1, 4))
    y = onnx_expr.view_read(b, "w", view)
    assert "Transpose" in _ops(b) and "Gather" not in _ops(b)
    w = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.testing.assert_array_equal(_run(b, {"w": w}, y), w.T[None])
    assert not onnx_expr.view_gathers(view, 24)
    # every other row: a gather
    assert onnx_expr.view_gathers(View(0, (3, 4), (8, 1)), 24)


def test_oversized_grids_are_rejected(monkeypatch):
    monkeypatch.setattr(onnx_views, "MAX_ELEMENTS", 10)
    # a grid larger than the limit and than the result (a product reduced): refused
    with pytest.raises(UnsupportedError, match="exceeds"):
        _emit(ollie.parse("A: [4, 4]\nB: [4, 4]\nL<i=0:4, j=0:4> Sum<k=0:4> A[i, k] * B[k, j]"))
    # a gathered read larger than the limit: refused
    with pytest.raises(UnsupportedError, match="exceeds"):
        _emit(ollie.parse("A: [16]\nL<i=0:3, j=0:4> A[i + j]"))
    # an element-wise scope as large as its result (EfficientNet's SiLU at batch 8): emitted
    assert "Gather" not in _check("A: [4, 4]\nL<i=0:4, j=0:4> A[i, j] * sigmoid(A[i, j])")


@st.composite
def _selective_adds(draw):
    """A transposed convolution's selective add ``L<n, c, h...> Sum<y...> T[...]`` over one or
    two spatial dimensions: random stride, kernel, padding, block count and image size (up to
    the last position a block reaches), ``T``'s dimensions in a random order; the channel
    iterator may start past 0 (read shifted back)."""
    rank = draw(st.integers(1, 2))
    shift = draw(st.integers(0, 2))
    lead = [("n", draw(st.integers(1, 2)), 0), ("c", draw(st.integers(1, 3)), shift)]
    dims = [(size, f"{name} - {lo}" if lo else name) for name, size, lo in lead]
    spatial, sums = [], []
    for h, y in (("h", "y"), ("w", "x"))[:rank]:
        s, k = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        p, blocks = draw(st.integers(0, k - 1)), draw(st.integers(1, 3))
        size = draw(st.integers(1, (blocks - 1) * s + k - p))
        spatial.append(f"{h}=0:{size}")
        sums.append(f"{y}=0:{blocks}")
        dims += [(k, f"{h} - {s}*{y} + {p}"), (blocks, y)]
    dims = draw(st.permutations(dims))
    ranges = [f"{n}={lo}:{lo + size}" for n, size, lo in lead]
    ranges += spatial
    return (f"T: [{', '.join(str(n) for n, _ in dims)}]\n"
            f"L<{', '.join(ranges)}> Sum<{', '.join(sums)}> T[{', '.join(i for _, i in dims)}]")


@settings(max_examples=40, deadline=None)
@given(_selective_adds())
def test_selective_adds_become_col2im(text):
    assert "Col2Im" in _check(text)


_NESTED = {
    # a selective add of a nested scope whose kernel axes start at -1: its element t is at
    # t + 1 (one Col2Im for the sum; the inner scope is a shifted read)
    "nested scope": (
        "T: [1, 3, 4, 4, 5, 5]\nL<n=0:1, c=0:3, h=0:10, w=0:10> Sum<y=0:5, x=0:5> "
        "{ L<n=0:1, c=0:3, t1=-1:3, t=-1:3, y=0:5, x=0:5> T[n, c, t1 + 1, t + 1, y, x] }"
        "[n, c, h - 2*y, w - 2*x, y, x]", 1),
    # the two-stage form of a derived stride-2 transposed convolution (InfoGAN's last layer):
    # the stages merged (the nested scope inlined), one Col2Im
    "two stages, last layer": (
        "T: [1, 3, 4, 4, 5, 5]\nL<n=0:1, c=0:3, h=0:10, w=0:10> Sum<x=0:5> "
        "{ L<n=0:1, c=0:3, h=0:10, t=-1:3, x=0:5> Sum<y=0:5> "
        "{ L<n=0:1, c=0:3, t1=-1:3, t=-1:3, x=0:5, y=0:5> T[n, c, t1 + 1, t + 1, y, x] }"
        "[n, c, h - 2*y, t, x, y] }[n, c, h, w - 2*x, x]", 1),
    # InfoGAN's derived 448 -> 256 layer, smaller: the inner stage over w, the outer over h,
    # the inner kernel axis t from -1 (T's positions 0..3 exactly): merged, one Col2Im
    "two stages, product transposed": (
        "T: [2, 2, 1, 3, 4, 4]\nL<n=0:1, c=0:3, h=0:4, w=0:4> Sum<y=0:2> "
        "{ L<n=0:1, c=0:3, t=-1:3, w=0:4, y=0:2> Sum<x=0:2> "
        "T[y, x, n, c, t + 1, w - 2*x + 1] }[n, c, h - 2*y, w, y]", 1),
    # the nested scope covers only part of T's kernel axis (t from 0): reads at t = -1 are
    # zero there but not in T, so nothing is merged (and the values still match)
    "nested range narrower than T": (
        "T: [2, 2, 1, 3, 4, 4]\nL<n=0:1, c=0:3, h=0:4, w=0:4> Sum<y=0:2> "
        "{ L<n=0:1, c=0:3, t=0:3, w=0:4, y=0:2> Sum<x=0:2> "
        "T[y, x, n, c, t + 1, w - 2*x + 1] }[n, c, h - 2*y, w, y]", 0),
    # the inner sum named as the outer one: renamed, two different sums
    "clashing sum names": (
        "T: [2, 2, 3, 4, 4]\nL<c=0:3, h=0:4, w=0:4> Sum<x=0:2> "
        "{ L<c=0:3, t=-1:3, w=0:4, y=0:2> Sum<x=0:2> T[y, x, c, t + 1, w - 2*x + 1] }"
        "[c, h - 2*x, w, x]", 1),
}


@pytest.mark.parametrize("case", list(_NESTED))
def test_nested_and_two_stage_selective_adds(case):
    """Selective adds of nested scopes, merged into one ``Col2Im`` only where that keeps every
    value; all match the interpreter."""
    text, col2im = _NESTED[case]
    ops = _check(text)
    assert ops.count("Col2Im") == col2im
    assert not col2im or "Gather" not in ops


def test_what_is_not_a_selective_add():
    # a forward stride (+s*y), an iterator read twice, a kernel range that starts past a
    # block's first position (negative padding) and a summed iterator outside the kernel
    # positions are other sums: the general form, still matching the interpreter
    for text in ("T: [1, 4, 3]\nL<c=0:1, h=0:5> Sum<y=0:3> T[c, h + 1*y, y]",
                 "T: [2, 4, 2]\nL<c=0:2, h=0:5> Sum<y=0:2> T[c, h - 2*y + 1, c]",
                 "T: [1, 4, 2]\nL<c=0:1, h=0:5> Sum<y=0:2> T[c, h - 2*y - 1, y]",
                 "T: [3, 4, 2]\nL<c=0:1, h=0:4> Sum<y=0:2, z=0:3> T[z, h - 2*y + 1, y]"):
        assert "Col2Im" not in _check(text)


def test_a_products_constant_operand_is_what_its_view_reads():
    """A ``Matmul`` reading a constant through a view (here reversed by a negative stride)
    gets an initializer holding what the view reads; a batch-1 product is 2-D (ONNX Runtime
    prepacks only a 2-D constant right operand)."""
    from ollie.program.kernel import Kernel

    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((1, 2, 4)).astype(np.float32)
    expr = ollie.parse("x: [1, 2, 4]\nw: [4, 3]\n"
                       "L<b=0:1, i=0:2, j=0:3> Sum<k=0:4> x[b, i, k] * w[-k + 3, j]")
    k = Kernel("Matmul", {"b": 1, "m": 2, "n": 3, "k": 4}, ("x", "w"), "y", expr,
               (None, View(9, (1, 4, 3), (12, -3, 1))))
    b = Builder({"w": torch.from_numpy(w)}, {"x": (1, 2, 4)})
    y = b.add(k, ("x", "w"))
    np.testing.assert_allclose(_run(b, {"x": x}, y).reshape(1, 2, 3), x @ w[::-1],
                               rtol=1e-5, atol=1e-6)
    (matmul,) = [n for n in b.nodes if n.op_type == "MatMul"]
    assert b.inits[matmul.input[1]].shape == (4, 3)
    # outside the constant: refused (the kernel then ends the region)
    with pytest.raises(UnsupportedError):
        Builder({"w": torch.from_numpy(w)}, {"x": (1, 2, 4)}).add(
            Kernel("Matmul", k.params, k.inputs, "y", expr, (None, View(10, (1, 4, 3),
                                                                        (12, -3, 1)))),
            ("x", "w"))


def test_a_reshape_of_a_reshape_reshapes_the_original():
    """``Builder.reshape``: reshaping back gives the original tensor and a further reshape
    reads the original; ``Builder.live`` drops the reshape nobody reads."""
    b = Builder({}, {"x": (2, 3, 4)})
    y = b.reshape("x", (6, 4))
    assert b.reshape(y, (2, 3, 4)) == "x"
    z = b.reshape(y, (24,))
    assert [n.input[0] for n in b.nodes] == ["x", "x"]
    assert [n.output[0] for n in b.live([z])] == [z]
